"""kp.load and the Pack / Program / ModuleInfo / ImageInfo handles."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import loader
from kernelpack.errors import FormatError, IntegrityError
from kernelpack.targets import Arch

import kp_samples


@pytest.fixture(scope="module")
def data() -> bytes:
    return kp.save([kp_samples.axpy(), kp_samples.rich()])


def test_sources(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "a.kpack"
    path.write_bytes(data)
    for source in (data, bytearray(data), memoryview(data), path, str(path)):
        pack = kp.load(source)
        assert pack.programs == ["axpy", "rowsum"] and pack.nbytes == len(data)
    with pytest.raises(TypeError, match="path or bytes"):
        kp.load(12)


@pytest.mark.parametrize("read_limit", [0, 1 << 20])
def test_large_files_are_mapped_small_ones_read(data: bytes, tmp_path: Path, read_limit: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.kpack"
    path.write_bytes(data)
    monkeypatch.setattr(loader, "_READ_LIMIT", read_limit)
    pack = kp.load(path)
    assert pack.compiled("axpy") == kp.load(data).compiled("axpy")
    assert isinstance(pack._buf.obj, bytes) == (read_limit > 0)  # else an mmap


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "e.kpack").write_bytes(b"")
    with pytest.raises(FormatError, match="0 bytes"):
        kp.load(tmp_path / "e.kpack")


def test_file_size_checked_before_mapping(data: bytes, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.kpack"
    path.write_bytes(data)
    monkeypatch.setattr(loader, "MAX_FILE_SIZE", 100)
    with pytest.raises(FormatError, match=f"{len(data)} bytes exceed MAX_FILE_SIZE 100"):
        kp.load(path)
    with pytest.raises(FormatError, match="exceed MAX_FILE_SIZE"):
        kp.load(data)


def test_mapping_interface(data: bytes) -> None:
    pack = kp.load(data)
    assert len(pack) == 2 and "axpy" in pack and "nope" not in pack
    assert list(pack) == pack.programs
    assert pack["axpy"] is pack["axpy"]
    with pytest.raises(KeyError, match="no program 'nope' in this pack \\(has: axpy, rowsum\\)"):
        pack["nope"]
    assert pack.format_version == (1, 0)
    assert pack.generator == f"kernelpack {kp.__version__}"
    assert pack.signature is None
    assert "2 programs" in repr(pack)


def test_program_handle(data: bytes) -> None:
    pack = kp.load(data)
    program = pack["rowsum"]
    assert program._summary is None  # decoded lazily
    assert program.summary == kp_samples.rich().summary
    assert program.name == "rowsum"
    assert list(program.modules) == ["red"]
    plan = program.plan(x=(3, 7), m=7, scale=0.5)
    assert isinstance(plan, kp.Plan) and plan.allocations["out"].shape == (3,)


def test_modules_and_images(data: bytes) -> None:
    pack = kp.load(data)
    module = pack.modules["axpy"]
    assert module.name == "axpy" and module.kernels == ("axpy",)
    assert [i.target for i in module.images] == ["sm_80", "sm_90", "compute_80"]
    cubin, _, ptx = module.images
    source = {i.target: i for i in kp_samples.axpy().modules[0].images}
    assert cubin.kind == "cubin" and cubin.arch == Arch(8, 0) and cubin.codec == "zstd"
    assert cubin.raw_size == len(source["sm_80"].data) and cubin.stored_size < cubin.raw_size
    assert cubin.raw_digest == hashlib.sha256(source["sm_80"].data).hexdigest()
    assert (cubin.toolchain, cubin.cuda_version, cubin.ptx_isa) == ("fake-toolchain 1.0", 12080,
                                                                    None)
    assert ptx.kind == "ptx" and ptx.ptx_isa == (8, 0)
    assert cubin.read() == source["sm_80"].data
    assert cubin.read() is cubin.read()  # cached
    assert pack.modules["red"].images[1].arch == Arch(9, 0, "a")


def test_compiled_round_trip(data: bytes) -> None:
    pack = kp.load(data)
    compiled = pack.compiled("axpy")
    assert compiled.summary == kp_samples.axpy().summary
    assert compiled.modules == kp_samples.axpy().modules
    assert compiled.origin == "disk"


def test_verify_reads_every_image(data: bytes) -> None:
    pack = kp.load(data)
    pack.verify()
    assert all(i._data is not None for m in pack.modules.values() for i in m.images)


def test_image_corruption_is_lazy(data: bytes) -> None:
    from kernelpack._fbread import Table
    bad = bytearray(data)
    blob = Table.root(data, "Pack").get("blobs")[0]
    bad[blob.target("data") + 8] ^= 0x40
    pack = kp.load(bytes(bad))  # metadata is intact: load succeeds
    assert pack["axpy"].summary is not None
    with pytest.raises(IntegrityError, match="module 'axpy' image sm_80: stored bytes"):
        pack.modules["axpy"].images[0].read()
    with pytest.raises(IntegrityError):
        pack.verify()


def test_call_delegates_to_the_runtime(data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    fake = types.ModuleType("kernelpack.runtime")
    fake.call_program = lambda program, *a, **k: seen.append((program.name, a, k)) or "done"
    monkeypatch.setitem(sys.modules, "kernelpack.runtime", fake)
    pack = kp.load(data)
    assert pack["axpy"](1, 2, a=3) == "done"
    assert seen == [("axpy", (1, 2), {"a": 3, "out": None, "stream": None})]


def test_warm_call_goes_straight_to_the_bound_launcher(data: bytes) -> None:
    calls = []

    class Bound:
        def call(self, args, out, stream):  # the runtime's BoundProgram.call signature
            calls.append((args, out, stream))
            return "launched"

    program = kp.load(data)["axpy"]
    program._kp_bound = Bound()
    assert program(1, 2, 3, out="o", stream=7) == "launched"
    assert calls == [((1, 2, 3), "o", 7)]


def test_loading_stays_light(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "a.kpack"
    path.write_bytes(data)
    code = (f"import sys, json, kernelpack as kp\np = kp.load({str(path)!r})\n"
            "p.verify(); p['rowsum'].plan((2, 3), 3, 1.0)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    modules = json.loads(out.splitlines()[-1])
    heavy = [m for m in modules if m.split(".")[0] in ("numpy", "flatbuffers", "cryptography",
                                                      "llvmlite", "torch")]
    assert heavy == []


def test_errors_about_a_path_name_it(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "bad.kpack"
    path.write_bytes(data[:100])
    with pytest.raises(FormatError) as info:
        kp.load(path)
    assert str(info.value).startswith(f"{path}: Pack.body")  # not the generic "file: ..."
    with pytest.raises(FormatError, match=r"^file: Pack\.body"):
        kp.load(data[:100])  # bytes have no name
    signed = tmp_path / "signed.kpack"
    signed.write_bytes(data)
    with pytest.raises(kp.SignatureError, match=f"^{signed}: artifact is unsigned"):
        kp.load(str(signed), trusted_keys=[bytes(range(1, 33))])


def test_both_call_bases_dispatch_alike() -> None:
    """Program's base: the extension's CallBase when built, else _PythonCall; same rules."""
    from kernelpack import program

    bases = [program._PythonCall]
    try:
        from kernelpack.runtime._launch import CallBase
    except ImportError:
        pass
    else:
        from kernelpack.runtime import _launch

        bases.append(CallBase)
        assert program.Program.__mro__[1] is CallBase
        if _launch.CALL_VECTORCALL:  # built with 3.12's limited API: Program inherits it
            assert program.Program.__flags__ & (1 << 11)  # Py_TPFLAGS_HAVE_VECTORCALL
    for base in bases:
        class Prog(base):  # type: ignore[misc, valid-type]
            _kp_bound = None

            def _kp_general_call(self, *args, **kwargs):
                return ("general", args, kwargs)

        class Bound:
            def call(self, args, out, stream):
                return ("fast", args, out, stream)

        p = Prog()
        assert p(1, out=2) in (("general", (1,), {"out": 2}),
                               ("general", (1,), {"out": 2, "stream": None}))
        p._kp_bound = Bound()
        assert p(1, 2) == ("fast", (1, 2), None, None)
        assert p(out=3, stream=4) == ("fast", (), 3, 4)
        assert p(1, a=2)[0] == "general" and p(1, a=2)[2]["a"] == 2


def test_load_reads_a_private_copy_of_writable_or_strided_buffers() -> None:
    """What was verified is what is decoded later: a bytearray changed after kp.load does not
    change the pack, and a strided memoryview loads like its bytes."""
    data = kp.save([kp_samples.axpy()])
    buf = bytearray(data)
    pack = kp.load(buf)
    buf[:] = bytes(len(buf))  # the caller reuses its buffer
    assert pack.programs == ["axpy"] and pack["axpy"].summary.name == "axpy"
    strided = memoryview(bytes(b for byte in data for b in (byte, 0)))[::2]
    assert kp.load(strided).programs == ["axpy"]
    assert kp.load(memoryview(data)).nbytes == len(data)


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run([sys.executable, "-m", "kernelpack", "--help"], capture_output=True,
                          text=True, timeout=60)  # noqa: S603
    assert done.returncode == 0 and "inspect" in done.stdout


def test_a_loaded_pack_or_program_is_not_pickled_but_says_what_to_send() -> None:
    import pickle

    pack = kp.load(kp.save([kp_samples.axpy()]))
    with pytest.raises(TypeError, match="send the artifact's path or bytes"):
        pickle.dumps(pack)
    with pytest.raises(TypeError, match=r"pack.compiled\('axpy'\)"):
        pickle.dumps(pack["axpy"])
    assert pickle.loads(pickle.dumps(pack.compiled("axpy"))).summary == pack["axpy"].summary


def test_a_failed_load_leaves_the_callers_frames_alone(tmp_path) -> None:
    """A failed load clears kernelpack's own finished frames of the error (review 39: they held
    a large file open), never a frame of the caller's: here the exception being handled when
    load was called, which the load's error chains as its __context__."""
    import kernelpack as kp

    bad = tmp_path / "bad.kpack"
    bad.write_bytes(b"not an artifact at all" * 100)

    def users_code() -> None:
        precious = "kept"  # noqa: F841 (read back through the traceback below)
        raise ValueError("the caller's own error")

    try:
        users_code()
    except ValueError:
        try:
            kp.load(bad)
        except kp.KernelPackError as exc:
            caught = exc
    context = caught.__context__
    assert isinstance(context, ValueError)
    tb = context.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_locals.get("precious") == "kept"
