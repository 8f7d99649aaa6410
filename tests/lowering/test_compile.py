"""kp.compile on CPU: images nvJitLink accepts, a derived summary that plans right, determinism."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import kernelpack as kp
from kernelpack.external import cubin_entries
from kernelpack.expr import cdiv, emin, ge, land, le, shl, sym
from kernelpack.lowering import pipeline
from kernelpack.lowering.tuning import CHUNK
from kernelpack.lowering.workloads import make

T = kp.Tensor
F32 = make(kp.float32)
F64 = make(kp.float64)


@kp.fusion
def axpy(x: T[kp.f32, "n"], y: T[kp.f32, "n"], a: kp.f32):
    return a * x + y


@pytest.fixture(scope="module")
def axpy_compiled() -> kp.Compiled:
    return kp.compile(axpy, targets=["sm_80", "sm_90", "ptx"])


def test_axpy_images_and_provenance(axpy_compiled):
    (module,) = axpy_compiled.modules
    assert axpy_compiled.origin == "compiled"
    assert [i.target for i in module.images] == ["sm_80", "sm_90", "compute_80"]
    for image in module.images:
        assert "LLVM " in image.toolchain and "nvJitLink " in image.toolchain
        assert image.cuda_version >= 12000
    ptx = module.images[-1]
    assert ptx.kind == "ptx" and ptx.ptx_isa == (8, 0)
    for cubin in module.images[:2]:
        assert cubin_entries(cubin.data) == ["axpy_0_pointwise"]


def test_axpy_summary_is_derived(axpy_compiled):
    s = axpy_compiled.summary
    assert [p.name for p in s.inputs] == ["x", "y", "a"]
    (out,) = s.outputs
    assert out.shape == (sym("n"),) and out.dtype == kp.f32
    (variant,) = s.variants
    (launch,) = variant.launches
    assert launch.grid[0] == emin(cdiv("n", 1024), 65535)  # 4 floats (16 bytes) per thread
    assert launch.args[-1] == kp.Arg.of("n", kp.i64)


@pytest.mark.parametrize("n,grid", [(0, 0), (1, 1), (1000, 1), (4097, 5), (65537, 65), (1 << 40, 65535)])
def test_axpy_plans_through_save_and_load(axpy_compiled, n, grid):
    pack = kp.load(kp.save([axpy_compiled]))
    plan = pack["axpy"].plan(x=(n,), y=(n,), a=2.0)
    assert plan.launches[0].grid == (grid, 1, 1)
    assert plan.allocations["out"].shape == (n,)
    assert plan.allocations["out"].nbytes == 4 * n


def test_pointwise_loads_and_stores_16_bytes_at_a_time():
    b = pipeline.run(pipeline.new_build(F32["gelu"], ["sm_80"], None, {}), stop="ptx")
    text = b.ptx.decode()
    assert "ld.global.v4.b32" in text and "st.global.v4.b32" in text
    b = pipeline.run(pipeline.new_build(F64["axpy"], ["sm_80"], None, {}), stop="ptx")
    assert "ld.global.v2.b64" in b.ptx.decode() or "ld.global.nc.v2.b64" in b.ptx.decode()


def _entry(ptx: str, name: str) -> str:
    body = ptx[ptx.index(f".entry {name}("):]
    return body[:body.index("\n}\n")]


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=["f32", "f64"])
def test_encoding_thread_rows_have_no_per_term_conversions(dt):
    """phase: one sincos, one vector store of the complex amplitude, and per term k no 64-bit
    conversion (the bit is a select of 0/1, float32 sums of <= 32 terms stay float32)."""
    ws = F32 if dt == kp.float32 else F64
    t = "f32" if dt == kp.float32 else "f64"
    b = pipeline.run(pipeline.new_build(ws["phase"], ["sm_90"], None, {}), stop="ptx")
    body = _entry(b.ptx.decode(), f"phase_{dt.name}_0_rowthread")
    assert body.count("cvt.rni.s32") == 1  # one argument reduction: one sincos
    assert body.count(f"st.global.v2.b{t[1:]}") == 1
    for conv in ("cvt.rn.f32.u64", "cvt.rn.f64.u64", "cvt.f64.f32", "cvt.rn.f32.u32",
                 "cvt.rn.f64.u32"):
        assert conv not in body, conv
    assert f"selp.{t}" in body
    # per term: no shift-count guard (k < n <= 63: n is the count of the shape `1 << n`), and
    # the 0/1 bit times x_k accumulated by one fma (no separate mul.rn and add.rn)
    assert "min.u64" not in body and "max.u64" not in body
    bits = re.findall(rf"selp\.{t}\s+(%\w+), 0[df]3F[F8]0+, 0[df]0+,", body)
    assert bits and all(re.search(rf"fma\.rn\.{t}\s+%\w+, %\w+, {re.escape(r)},", body)
                        for r in bits), bits
    b = pipeline.run(pipeline.new_build(ws["angle"], ["sm_90"], None, {}), stop="ptx")
    body = _entry(b.ptx.decode(), f"angle_{dt.name}_0_rowthread")
    assert "cvt.f64.f32" not in body and f"mul.rn.{t}" in body


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=["f32", "f64"])
def test_encoding_terms_share_one_shift_per_group(dt):
    """Thread rows reduce in unrolled groups of 8 (lowering/threadrows.py): the amplitude index
    is shifted once per group (by the group's first k) and each term tests a constant bit,
    instead of a shift by k per term."""
    ws = F32 if dt == kp.float32 else F64
    b = pipeline.run(pipeline.new_build(ws["phase"], ["sm_90"], None, {}), stop="ptx")
    body = _entry(b.ptx.decode(), f"phase_{dt.name}_0_rowthread")
    tests: dict[str, set[int]] = {}
    for reg, mask in re.findall(r"and\.b64\s+%rd\d+, (%rd\d+), (\d+);", body):
        tests.setdefault(reg, set()).add(int(mask))
    assert any({1 << u for u in range(8)} <= masks for masks in tests.values()), tests
    assert body.count("shr.u64") + body.count("shr.s64") <= 3  # was 10: one per unrolled term


def test_float64_light_thread_rows_have_a_one_row_per_thread_variant():
    """phase float64 (a sum of light terms): a first variant for launches where each thread owns
    one row (rows <= GRID_CAP x 256), whose kernel is bounded for 2048 resident threads per SM
    (`.minnctapersm 8`); the row-loop kernel, unbounded, stays for larger launches. Angle (a
    sincos per term), masked_mean (no transcendental per row: memory-bound terms were slower
    bounded) and float32 kernels keep one thread-row kernel."""
    c = kp.compile(F64["phase"], targets=["sm_90", "ptx"])
    rows, short = sym("b") * shl(1, "n"), le("n", 32)
    assert [v.predicate for v in c.summary.variants] == [
        land(short, le(rows, 65535 * 256)), short, le("n", 2048), None]
    assert [v.launches[0].kernel.rsplit("_", 1)[1] for v in c.summary.variants] == [
        "rowthread1", "rowthread", "rowwarpt4", "rowblock256t4"]
    prog = kp.load(kp.save([c]))["phase_float64"]
    for shape, variant, grid in (((128, 14), 0, 8192), ((128, 16), 0, 32768),
                                 ((65535, 8), 0, 65535), ((65536, 8), 1, 65535),
                                 ((128, 17), 1, 65535), ((1, 33), 2, 65535)):
        plan = prog.plan(x=shape)
        assert (plan.variant, plan.launches[0].grid[0]) == (variant, grid), shape
    ptx = next(i.data for i in c.modules[0].images if i.kind == "ptx").decode()
    one = _entry(ptx, "phase_float64_0_rowthread1")
    loop = _entry(ptx, "phase_float64_0_rowthread")
    assert ".maxntid 256" in one and ".minnctapersm 8" in one
    assert ".maxntid 256" in loop and ".minnctapersm" not in loop
    # the same code otherwise: one sincos, one vector store, the grid-stride row loop
    assert one.count("cvt.rni.s32") == loop.count("cvt.rni.s32") == 1
    assert one.count("st.global.v2.b64") == loop.count("st.global.v2.b64") == 1
    for other in (F64["angle"], F64["masked_mean"], F32["phase"], F32["angle"]):
        kernels = [v.launches[0].kernel.rsplit("_", 1)[1]
                   for v in kp.compile(other, targets=["sm_90"]).summary.variants]
        # (angle, masked_mean: a row split first, lowering/rowsplit.py; phase's rows are n
        # <= 63 terms long, so it has none)
        kernels = [k for k in kernels if k != "partial0"]
        assert kernels[0] == "rowthread" and "rowthread1" not in kernels, kernels


@pytest.mark.parametrize("dt", ["float32", "float64"])
def test_heavy_terms_take_plain_row_loops_not_tiles(dt):
    """Tiles (several 16-byte chunks per lane in flight) are for memory-bound terms: phase's
    light terms get them for rows past 32; angle's sin/cos per term is bound by that work, and
    tiling it would unroll it per chunk (the PTX grew 5-fold), so its long rows take the plain
    warp/block loops."""
    fs = F32 if dt == "float32" else F64
    names = {w: [v.launches[0].kernel.rsplit("_", 1)[1]
                 for v in kp.compile(fs[w], targets=["sm_90"]).summary.variants]
             for w in ("angle", "phase")}
    assert names["angle"] == ["rowthread", "rowwarp", "rowblock"], names
    assert any("t" in k[len("rowwarp"):] for k in names["phase"] if k.startswith("rowwarp"))


def test_one_row_variant_artifacts_are_deterministic():
    first, second = kp.compile(F64["phase"]), kp.compile(F64["phase"])
    assert [i.data for i in first.modules[0].images] == [i.data for i in second.modules[0].images]
    assert kp.save([first]) == kp.save([second])


def test_math_links_only_what_it_uses():
    b = pipeline.run(pipeline.new_build(F32["gelu"], ["sm_80"], None, {}), stop="ptx")
    text = b.ptx.decode()
    assert b.libdevice and "__nvvm_reflect" not in text and ".extern" not in text
    assert text.count(".func") <= 1 and len(b.ptx) < 16_000
    plain = pipeline.run(pipeline.new_build(axpy, ["sm_80"], None, {}), stop="ptx")
    assert not plain.libdevice and ".func" not in plain.ptx.decode()


def test_compile_is_deterministic():
    first = kp.compile(F32["softmax"])
    second = kp.compile(F32["softmax"])
    assert [i.data for i in first.modules[0].images] == [i.data for i in second.modules[0].images]
    assert kp.save([first]) == kp.save([second])


def test_row_reduction_variants_and_predicates():
    c = kp.compile(F32["softmax"], targets=["sm_90"])
    s = c.summary
    caps = [128, 256, 512, 1024, 2048, 4096, 8192]
    # first: few, long rows split across blocks (lowering/rowsplit.py)
    assert [v.predicate for v in s.variants] == [land(ge("n", 65536), le("b", 256))] + [
        land(ge("n", 1), le("n", k)) for k in caps] + [None]
    assert [int(v.launches[0].block[0]) for v in s.variants] == [256, 256, 256, 64, 128, 128,
                                                                  256, 256, 512]
    assert [v.launches[0].kernel.rsplit("_", 1)[1] for v in s.variants] == [
        "partial0", "rowwarp4", "rowwarp8", "rowblock64x8", "rowblock128x8", "rowblock128x16",
        "rowblock256x16", "rowblock256x32", "rowblock"]
    prog = kp.load(kp.save([c]))["softmax_float32"]
    assert prog.plan(x=(4096, 100)).variant == 1
    assert prog.plan(x=(4096, 100)).launches[0].grid == (512, 1, 1)   # 8 rows (warps) per block
    assert prog.plan(x=(4096, 1000)).variant == 4
    assert prog.plan(x=(4096, 1000)).launches[0].grid == (4096, 1, 1)
    assert prog.plan(x=(7, 100_000)).variant == 0  # 25 chunks of 4096 per row
    assert prog.plan(x=(7, 100_000)).launches[0].grid == (175, 1, 1)
    assert prog.plan(x=(300, 100_000)).variant == 8  # too many rows to split
    assert prog.plan(x=(300, 100_000)).launches[0].grid == (300, 1, 1)
    assert prog.plan(x=(7, 0)).variant == 8  # empty rows: nothing to hold in registers


def test_register_rows_use_16_byte_accesses_without_local_memory():
    b = pipeline.run(pipeline.new_build(F32["softmax"], ["sm_90"], None, {}), stop="ptx")
    ptx = b.ptx.decode()
    body = ptx[ptx.index(".entry softmax_float32_0_rowblock128x8"):]
    body = body[:body.index("\n}\n")]
    assert ".local" not in body and "ld.local" not in body
    assert body.count("ld.global.v4.b32") == 2 and body.count("st.global.v4.b32") >= 2
    assert ".maxntid 128" in body and ".minnctapersm 12" in body  # 1536 threads per SM
    # e / sum: one reciprocal per row, then multiplies (the exact division stays for rows
    # whose 1/sum would not be a normal float): 8 divisions per body, not 16
    assert body.count("div.rn.f32") == 16


def test_rows_without_per_element_transcendentals_hold_more_per_thread():
    s = kp.compile(F32["layernorm"], targets=["sm_90"]).summary
    kernels = [v.launches[0].kernel.rsplit("_", 1)[1] for v in s.variants]
    assert kernels == ["partial0", "rowwarp4", "rowwarp8", "rowblock64x8", "rowwarp32",
                       "rowblock64x32", "rowblock128x32", "rowblock256x32", "rowblock"]


def test_reduce_only_rows_pick_thread_warp_or_block():
    s = kp.compile(F32["masked_mean"], targets=["sm_90"]).summary
    assert [v.predicate for v in s.variants] == [
        land(ge("n", 262144), le("b", 32)), le("n", 32), le("n", 2048), None]
    assert [v.launches[0].kernel.rsplit("_", 1)[1] for v in s.variants] == [
        "partial0", "rowthread", "rowwarpt16", "rowblock256t16"]
    assert [int(v.launches[0].block[0]) for v in s.variants] == [256, 256, 256, 256]


def test_reduce_only_rows_read_tiles_of_16_byte_chunks():
    """A masked mean's warp/block rows: each lane has 4 x 16-byte loads of x and 4 of the mask
    in flight per iteration (the plain loop had ~4 scalar loads), no local memory, no guard in
    the whole-tile loop, and a bool turned float by a select (no integer conversion)."""
    b = pipeline.run(pipeline.new_build(F32["masked_mean"], ["sm_90"], None, {}), stop="ptx")
    ptx = b.ptx.decode()
    for kernel in ("rowwarpt16", "rowblock256t16"):
        body = ptx[ptx.index(f".entry masked_mean_float32_0_{kernel}"):]
        body = body[:body.index("\n}\n")]
        assert ".local" not in body
        assert body.count("ld.global.v4.b32") >= 4 + 1   # a whole tile + the one-chunk tail
        assert "cvt.rn.f64.u32" not in body and "cvt.rn.f32.u32" not in body


def test_full_reduction_uses_two_launches_and_a_workspace():
    c = kp.compile(F64["total"], targets=["sm_80"])
    (variant,) = c.summary.variants
    assert len(variant.launches) == 2
    (ws,) = variant.scratch
    assert ws.shape == (cdiv("n", CHUNK),) and ws.dtype == kp.f64
    plan = kp.load(kp.save([c]))["total_float64"].plan(x=(40_000,))
    partials = -(-40_000 // CHUNK)
    assert [l.grid[0] for l in plan.launches] == [partials, 1]
    assert plan.allocations[ws.name].shape == (partials,)
    assert plan.allocations["out"].shape == ()
    assert kp.load(kp.save([c]))["total_float64"].plan(x=(0,)).launches[0].grid[0] == 0


def test_quantum_encodings_have_exponential_output_dims():
    pack = kp.load(kp.save([kp.compile(F32[n], targets=["sm_90"])
                            for n in ("phase", "angle", "basis", "amplitude")]))
    for name in ("phase", "angle"):
        prog = pack[f"{name}_float32"]
        assert prog.summary.outputs[0].shape == (sym("b"), shl(1, "n"))
        plan = prog.plan(x=(128, 14))
        assert plan.allocations["out"].shape == (128, 1 << 14)
        assert plan.variant == 0 and plan.launches[0].grid == (8192, 1, 1)
    assert pack["phase_float32"].summary.outputs[0].dtype == kp.complex64
    assert pack["angle_float32"].summary.outputs[0].dtype == kp.float32
    assert pack["basis_float32"].plan(j=(3,), n=20).allocations["out"].nbytes == 3 * 8 << 20
    assert pack["amplitude_float32"].plan(v=(2, 1000), n=10).allocations["out"].shape == (2, 1024)


@pytest.mark.parametrize("name", sorted(F64))
def test_every_workload_compiles_for_sm80_sm90_and_ptx(name):
    c = kp.compile(F64[name])
    kinds = sorted(i.target for i in c.modules[0].images)
    assert kinds == ["compute_80", "sm_80", "sm_90"]
    for image in c.modules[0].images:
        if image.kind == "cubin":
            assert set(cubin_entries(image.data)) == set(c.modules[0].kernels)


def test_reduction_read_across_rows_is_a_workspace():
    """The row kernel cannot keep a row sum read at another row: the sums go to a workspace
    (a row stage of their own), which a pointwise kernel reads; the general schedule this
    fell back to before summed a whole row per element."""
    @kp.fusion
    def cross(x: T[kp.f32, "n", "n"]):
        return x * x.sum(axis=1)[None, :]

    c = kp.compile(cross, targets=["sm_80"])
    for variant in c.summary.variants:
        assert "cross_m0" in [w.name for w in variant.scratch]
        *sums, last = [l.kernel for l in variant.launches]
        assert last == "cross_1_pointwise" and sums
        assert all(k.startswith("cross_0_") and not k.endswith("_pointwise") for k in sums)


def test_unbound_dim_is_a_trace_error():
    @kp.fusion
    def bad(x: T[kp.f32, "n"]):
        return kp.arange(sym("m")).astype(kp.f32)

    with pytest.raises(kp.TraceError, match="unbound symbol"):
        kp.compile(bad, targets=["sm_80"])


def test_bad_options_and_targets():
    with pytest.raises(TypeError, match="unknown kp.compile option"):
        kp.compile(axpy, targets=["sm_80"], bogus=1)
    with pytest.raises(ValueError, match="not a GPU architecture"):
        kp.compile(axpy, targets=["sm80"])
    with pytest.raises(TypeError, match="@kp.fusion"):
        kp.compile(lambda x: x)


def test_pipeline_stages_are_an_ordered_list():
    assert [n for n, _ in pipeline.STAGES] == ["trace", "schedule", "llvm_ir", "ptx", "images",
                                               "summary"]
    b = pipeline.run(pipeline.new_build(axpy, ["sm_80"], None, {}), stop="llvm_ir")
    assert "define ptx_kernel void @\"axpy_0_pointwise\"" in b.ir and not b.ptx
    done = pipeline.run(b, start="ptx")
    assert done.summary is not None and b".entry axpy_0_pointwise" in done.ptx


def test_static_dims_specialize_the_code():
    c = kp.compile(axpy, targets=["sm_80"], static={"n": 1000})
    assert c.summary.inputs[0].shape == (kp.Expr("const", (), 1000),)
    assert c.summary.variants[0].launches[0].grid[0] == kp.Expr("const", (), 1)


def test_cache_round_trip(tmp_path):
    cache = kp.Cache(path=tmp_path)
    first = kp.compile(axpy, targets=["sm_80"], cache=cache)
    again = kp.compile(axpy, targets=["sm_80"], cache=cache)
    assert first.origin == "compiled" and again.origin in ("disk", "memory")
    assert again.modules[0].images[0].data == first.modules[0].images[0].data


def test_llvm_failures_are_compile_errors_with_the_log():
    from kernelpack.toolchain.llvm import emit_ptx

    bad = 'define ptx_kernel void @k(ptr %p) {\n  store i32 1, ptr %q\n  ret void\n}\n'
    with pytest.raises(kp.CompileError, match="LLVM rejected the generated IR") as info:
        emit_ptx(bad, "sm_80", ("k",), libdevice=False)
    assert "%q" in info.value.log


def test_libdevice_is_found_and_recorded():
    from kernelpack.toolchain import libdevice

    assert libdevice.find().name == "libdevice.10.bc"
    assert libdevice.digest().startswith("sha256:") and len(libdevice.digest()) == 71
    c = kp.compile(F32["gelu"], targets=["sm_80"])
    assert libdevice.digest() in c.modules[0].images[0].toolchain


def test_float64_trig_compiles_to_the_same_bytes_twice_in_one_process():
    """LLVM numbers call sequences in PTX comments with a per-process counter; float64 sin/cos
    call their slow path, so without stripping those comments a second compile differed."""
    first, second = kp.compile(F64["phase"]), kp.compile(F64["phase"])
    assert kp.save([first]) == kp.save([second])
    assert b"callseq" not in first.modules[0].images[-1].data


@pytest.mark.parametrize("targets,isa", [(["sm_100", "ptx"], (8, 6)), (["sm_120", "ptx"], (8, 7)),
                                         (["sm_100f", "ptx"], (8, 8)), (["sm_110", "ptx"], (9, 0))])
def test_newer_architectures_get_the_ptx_isa_that_knows_them(targets, isa):
    """With only Blackwell-class targets the PTX is emitted for them, at the first PTX ISA that
    has them (LLVM aborts the whole process for an older ISA: run in a child process)."""
    code = ("import kernelpack as kp, sys\n"
            "from kernelpack.lowering.workloads import make\n"
            f"c = kp.compile(make(kp.float32)['softmax'], targets={targets!r})\n"
            "print([(im.kind, str(im.arch), im.ptx_isa) for im in c.modules[0].images])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    arch = targets[0]
    assert out.stdout.strip() == repr([("cubin", arch, None), ("ptx", arch, isa)])


def test_bfloat16_rounds_with_the_devices_conversion_from_sm_80():
    """A bfloat16 result is rounded by one ``cvt.rn.bf16.f32`` where the PTX's architecture
    has it (sm_80 on), by integer arithmetic below it (sm_75); the values are the same
    (tests/gpu/test_workloads.py checks them on a device, the emulator through the integer
    rounding)."""
    @kp.fusion
    def bgelu(x: kp.Tensor[kp.bf16, "n"]):
        return 0.5 * x * (1.0 + kp.tanh(0.79788456 * (x + 0.044715 * x * x * x)))

    def ptx(targets):
        c = kp.compile(bgelu, targets=targets)
        return next(bytes(i.data).decode() for m in c.modules for i in m.images
                    if i.kind == "ptx")

    new = ptx(["sm_80", "ptx"])
    assert "cvt.rn.bf16.f32" in new and "bfe.u32" not in new
    old = ptx(["sm_75", "ptx"])
    assert "cvt.rn.bf16.f32" not in old and "bfe.u32" in old


def test_a_repeated_compile_is_a_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLVM keeps native memory per compile (README, "Compile services"; review 30 measured
    ~200 KB per kp.compile of one fusion, for ever): a repeat of one of the process's last
    compiles returns that result, frozen and equal, without compiling; anything in the key
    (targets, options, static=) compiles afresh; at most _RECENT_SIZE are kept."""
    from kernelpack import compile_entry
    from kernelpack.lowering import pipeline

    calls = []
    real = pipeline.compile_traced

    def counted(*args, **kwargs):
        calls.append(args[2])  # (fusion, its trace, targets, static, options)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "compile_traced", counted)
    monkeypatch.setattr(compile_entry, "_RECENT", compile_entry.OrderedDict())
    monkeypatch.setattr(compile_entry, "_RECENT_SIZE", 2)

    @kp.fusion
    def triple(x: T[kp.f32, "n"]):
        return x * 3.0

    first = kp.compile(triple, targets=["sm_80"])
    assert kp.compile(triple, targets=("sm_80",)) is first and len(calls) == 1
    assert kp.compile(triple, targets=["sm_90"]) is not first and len(calls) == 2
    kp.compile(triple, targets=["sm_80"], opt=2)  # another key (its code may be the same)
    assert len(calls) == 3
    assert kp.compile(triple, targets=["sm_80"]) == first and len(calls) == 4  # evicted (2 kept)
    with pytest.raises(ValueError, match="opt must be an integer"):
        kp.compile(triple, targets=["sm_80"], opt=7)
