"""Review 28 (round 6): README claims edited today, checked from the outside.

Failing tests are README statements that do not hold; passing ones are claims verified.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
KP = str(ROOT / ".venv" / "bin" / "kernelpack")
T = kp.Tensor


def _out_dtypes(f: kp.fusion) -> list[str]:
    g = f.trace()
    return [g.nodes[nid].dtype.name for _, nid in g.outputs]


# ---- NumPy scalars (README lines 311-317) ------------------------------------------------------
def test_readme_numpy2_parenthetical_matches_numpy() -> None:
    """README 314: "(NumPy 2 types NumPy scalars: float32, float32 and float32 there)" for
    `x_f32 * np.sqrt(2.0)`, `x_f16 * np.float32(0.1)`, `x_i8 * np.float32(0.5)`. np.sqrt(2.0)
    is a float64 scalar, so NumPy 2 gives float64 for the first."""
    m = re.search(r"NumPy 2 types NumPy scalars: (\w+), (\w+) and (\w+) there", README)
    assert m, "the parenthetical moved; update this test"
    actual = [
        (np.ones(2, np.float32) * np.sqrt(2.0)).dtype.name,
        (np.ones(2, np.float16) * np.float32(0.1)).dtype.name,
        (np.ones(2, np.int8) * np.float32(0.5)).dtype.name,
    ]
    assert list(m.groups()) == actual


def test_numpy_scalars_are_weak_in_the_dsl() -> None:
    @kp.fusion
    def a(x: T[kp.f32, "n"]):
        return x * np.sqrt(2.0)

    @kp.fusion
    def b(x: T[kp.f16, "n"]):
        return x * np.float32(0.1)

    @kp.fusion
    def c(x: T[kp.i8, "n"]):
        return x * np.float32(0.5)

    @kp.fusion
    def c2(x: T[kp.i8, "n"]):
        return x * 0.5

    @kp.fusion
    def z(x: T[kp.f32, "n"]):
        return x * np.array(2.0)

    assert [_out_dtypes(f)[0] for f in (a, b, c, c2, z)] == [
        "float32", "float16", "float64", "float64", "float32"]

    @kp.fusion
    def d(x: T[kp.i8, "n"]):
        return x + np.int16(1000)

    with pytest.raises(kp.TraceError):
        d.trace()

    from lowering.simt import run_fusion

    @kp.fusion
    def e(x: T[kp.i8, "n"]):
        return x < np.int16(1000)

    (got,) = run_fusion(e, np.array([-128, 5, 127], np.int8))
    assert got.tolist() == [True, True, True]


# ---- kp.where / kp.pad (231-237) ---------------------------------------------------------------
def test_where_condition_of_any_dtype_nonzero_is_true() -> None:
    from lowering.simt import run_fusion

    @kp.fusion
    def w(c: T[kp.f32, "n"], x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
        return kp.where(c, x, y)

    cond = np.array([0, -0.0, np.nan, 2, -1e-30], np.float32)
    (got,) = run_fusion(w, cond, np.ones(5, np.float32), np.zeros(5, np.float32))
    assert got.tolist() == np.where(cond, 1.0, 0.0).tolist()

    @kp.fusion
    def wc(c: T[kp.c64, "n"], x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
        return kp.where(c, x, y)

    cc = np.array([0, 1j, 0], np.complex64)
    (got,) = run_fusion(wc, cc, np.ones(3, np.float32), np.zeros(3, np.float32))
    assert got.tolist() == [0.0, 1.0, 0.0]
    assert kp.where(True, 1.0, 0.5) == 1.0 and isinstance(kp.where(True, 1.0, 0.5), float)


def test_pad_appends_zeros_and_short_size_is_constraint_error_at_plan(tmp_path) -> None:
    from lowering.simt import run_fusion

    @kp.fusion
    def p(x: T[kp.f32, "n"], k: T[kp.f32, "k"]):
        return kp.pad(x, 1 << k.shape[0])

    (got,) = run_fusion(p, np.arange(3, dtype=np.float32), np.zeros(2, np.float32))
    assert got.tolist() == [0.0, 1.0, 2.0, 0.0]
    kp.save([kp.compile(p, targets=["sm_90"])], tmp_path / "p.kpack")
    prog = kp.load(tmp_path / "p.kpack")["p"]
    prog.plan(x=(4,), k=(2,))
    with pytest.raises(kp.ConstraintError):
        prog.plan(x=(5,), k=(2,))


# ---- fusion parameters (243-249) ---------------------------------------------------------------
def test_fusion_parameter_rules() -> None:
    with pytest.raises(kp.TraceError, match="default"):
        @kp.fusion
        def f1(x: T[kp.f32, "n"], s: kp.f32 = 2.0):
            return x * s
    for bad in ("out", "stream"):
        ns: dict = {"kp": kp, "T": T}
        with pytest.raises(kp.TraceError, match=bad):
            exec(f"@kp.fusion\ndef f(x: T[kp.f32, 'n'], {bad}: kp.f32):\n    return x\n", ns)

    @kp.fusion
    def inner(x: T[kp.f32, "n"], s: kp.f32):
        return x * s

    @kp.fusion
    def bad_dtype(x: T[kp.f64, "n"]):
        return inner(x, 2.0)

    @kp.fusion
    def bad_scalar(x: T[kp.f32, "n"]):
        return inner(x, x)

    @kp.fusion
    def rec(x: T[kp.f32, "n"]):
        return rec(x) + 1

    for f in (bad_dtype, bad_scalar, rec):
        with pytest.raises(kp.TraceError):
            f.trace()


def test_string_annotations_read_where_defined(tmp_path) -> None:
    mod = tmp_path / "r28_strann.py"
    mod.write_text(textwrap.dedent("""
        from __future__ import annotations
        import kernelpack as kp
        D = kp.f32
        def make():
            L = kp.f16
            @kp.fusion
            def f(x: kp.Tensor[D, "n"], y: kp.Tensor[L, "n"]):
                return x + y.astype(kp.f32)
            return f
    """))
    sys.path.insert(0, str(tmp_path))
    try:
        import r28_strann
        assert _out_dtypes(r28_strann.make()) == ["float32"]
    finally:
        sys.path.remove(str(tmp_path))


# ---- kp.external thread limit (139-143) --------------------------------------------------------
def _axpy(ptx: str, block: int):
    return kp.external(
        "axpy", "axpy",
        params=[kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv("n", 256), block=block, ptx=ptx, targets=["sm_90", "ptx"])


@pytest.mark.parametrize("directive", [".maxntid 128, 1, 1", ".reqntid 128"])
def test_external_block_checked_against_ptx_thread_limit(directive: str) -> None:
    src = (ROOT / "examples" / "axpy.ptx").read_text()
    head = ".param .u32 n)"
    assert head in src
    ptx = src.replace(head, head + " " + directive, 1)
    with pytest.raises(ValueError, match="128"):
        _axpy(ptx, 256)
    _axpy(ptx, 128)


# ---- warm-start cache (457-459) ----------------------------------------------------------------
@kp.fusion
def _r28_a(x: T[kp.f32, "n"]):
    return x * 2


@kp.fusion
def _r28_b(x: T[kp.f32, "n"]):
    return x * 3


def _two_compiles(root: Path) -> list[str]:
    cache = kp.Cache(root)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        kp.compile(_r28_a, targets=["sm_90"], cache=cache)
        kp.compile(_r28_b, targets=["sm_90"], cache=cache)
    return [str(x.message) for x in w]


def test_unwritable_disk_tier_under_a_file_warns_once(tmp_path) -> None:
    """README 458: "A disk tier that cannot be written ... warns once, naming the directory,
    and pauses its writes for 30 s". With the root below a regular file (ENOTDIR) two compiles
    give 8 warnings, and the second compile tries to write again."""
    (tmp_path / "afile").write_text("x")
    msgs = _two_compiles(tmp_path / "afile" / "cache")
    assert len(msgs) == 1, msgs
    assert sum("write" in m for m in msgs) <= 1, msgs


def test_unwritable_disk_tier_eperm_warns_once() -> None:
    if os.access("/sys", os.W_OK) and not Path("/sys").is_mount():
        pytest.skip("no unwritable directory to use")
    msgs = _two_compiles(Path("/sys/kernelpack_review28_cache"))
    assert len(msgs) == 1 and "/sys/kernelpack_review28_cache" in msgs[0], msgs


def test_future_dated_entry_is_evicted_first(tmp_path) -> None:
    cache = kp.Cache(tmp_path)
    kp.compile(_r28_a, targets=["sm_90"], cache=cache)
    kp.compile(_r28_b, targets=["sm_90"], cache=cache)
    entries = sorted((tmp_path / "entries").rglob("*.kpack"))
    assert len(entries) == 2
    future, old = entries
    for p in (future, *(tmp_path / "keys").rglob(future.stem + "*")):
        os.utime(p, (2e9, 2e9))
    for p in (old, *(tmp_path / "keys").rglob(old.stem + "*")):
        os.utime(p, (1.6e9, 1.6e9))
    env = {**os.environ, "KERNELPACK_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([KP, "cache", "prune", "--max-bytes", str(old.stat().st_size + 100)],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert old.exists() and not future.exists()


@pytest.mark.parametrize("value, expected", [("4096", "4096"), ("512M", "536870912"),
                                             ("10G", "10737418240"), ("0", "None"),
                                             ("none", "None")])
def test_cache_max_bytes_values(tmp_path, value: str, expected: str) -> None:
    env = {**os.environ, "KERNELPACK_CACHE_DIR": str(tmp_path), "KERNELPACK_CACHE_MAX_BYTES": value}
    r = subprocess.run([KP, "cache", "stats"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert re.search(rf"max_bytes\s+{expected}\b", r.stdout), r.stdout


def test_cache_max_bytes_bad_value_names_variable(tmp_path) -> None:
    env = {**os.environ, "KERNELPACK_CACHE_DIR": str(tmp_path), "KERNELPACK_CACHE_MAX_BYTES": "junk"}
    r = subprocess.run([KP, "cache", "stats"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "KERNELPACK_CACHE_MAX_BYTES" in r.stderr


# ---- extract naming (524) ----------------------------------------------------------------------
def test_extract_names_and_non_ascii_module(tmp_path) -> None:
    src = (ROOT / "examples" / "axpy.ptx").read_text()

    def mk(name: str, module: str):
        return kp.external(
            name, "axpy",
            params=[kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                    kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
            grid=kp.cdiv("n", 256), block=256, ptx=src, targets=["sm_90", "ptx"], module=module)

    kp.save([mk("a", "axpy"), mk("b", "ünïcodé")], tmp_path / "e.kpack")
    r = subprocess.run([KP, "extract", str(tmp_path / "e.kpack"), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert "axpy.sm_90.cubin" in names and "axpy.compute_80.ptx" in names
    odd = [n for n in names if not n.startswith("axpy.")]
    assert len(odd) == 2 and all(n.isascii() for n in odd)
    assert sum("ünïcodé" in line for line in r.stdout.splitlines()) == 2
    again = subprocess.run([KP, "extract", str(tmp_path / "e.kpack"), "-o", str(tmp_path / "o")],
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 1 and "--force" in again.stderr
