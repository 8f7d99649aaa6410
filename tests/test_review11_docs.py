"""README.md and the module docstrings against today's changes (review 11D).

Each check reads a claim the docs make and compares it with what decides it: the launch
numbers with the last four tables of ``benchmarks/RESULTS.md`` (the README quoted ranges of
older runs: 10-14%, 0.98-1.04x, 0.71-0.75x, 0.85-0.87x), the C verifier's place in the
extension and its independence from ``KERNELPACK_NATIVE_LAUNCH`` (the README said that knob
turned the whole extension off), ``2 ** n`` as a size and a called dtype's ``TypeError``, and
the runtime package's docstring (it said the first launch imports ``cuda.bindings``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _last_launch_runs(k: int = 4) -> list[str]:
    """The ``k`` newest "launch overhead" sections of RESULTS.md (by their header's date)."""
    parts = re.split(r"^### launch overhead — ", RESULTS, flags=re.M)[1:]
    dated = []
    for part in parts:
        m = re.match(r".*?(\d{4}-\d\d-\d\d \d\d:\d\d) UTC", part)
        assert m, part[:80]
        dated.append((m.group(1), part.split("\n## ")[0]))
    dated.sort(reverse=True)
    return [body for _, body in dated[:k]]


def _row(body: str, method: str) -> float:
    m = re.search(r"^\| " + re.escape(method) + r" \| ([\d.]+) \|", body, flags=re.M)
    assert m, f"no row {method!r}"
    return float(m.group(1))


def _ratio(body: str, label: str) -> float:
    # "label = 1.06 (...)", or since session 34 "label (target <= 1.3): **1.04** against ..."
    m = re.search(re.escape(label) + r"(?: = | \([^)]*\): \*\*)([\d.]+)", body)
    assert m, f"no ratio {label!r}"
    return float(m.group(1))


def _agrees(quoted: str, actual: float) -> bool:
    """``quoted`` is ``actual`` rounded to the digits the README prints."""
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(float(quoted) - actual) <= 0.5 * 10 ** -digits + 1e-9


def _check_range(lo: str, hi: str, values: list[float], what: str) -> None:
    assert _agrees(lo, min(values)) and _agrees(hi, max(values)), (
        f"README quotes {what} as {lo}-{hi}; the last four RESULTS.md runs give "
        f"{min(values):.3f}-{max(values):.3f}")


def test_launch_numbers_are_the_last_four_runs():
    runs = _last_launch_runs()
    assert len(runs) == 4
    text = _flat(README)
    m = re.search(r"costs (\d+)-(\d+)% \(([\d.]+)-([\d.]+) µs\) less per launch", text)
    assert m, "the README's C-extension saving sentence is gone or reworded"
    floors = [_row(r, "raw cuLaunchKernel (floor)") for r in runs]
    ext = [_row(r, "raw cuLaunchKernel via kernelpack's C extension") for r in runs]
    _check_range(m.group(1), m.group(2), [100 * (1 - e / f) for e, f in zip(ext, floors)],
                 "the extension's saving in %")
    _check_range(m.group(3), m.group(4), [f - e for e, f in zip(ext, floors)],
                 "the extension's saving in µs")
    m = re.search(r"`out=` launch at ([\d.]+)-([\d.]+)x a raw `cuLaunchKernel`", text)
    assert m, "the README's out= sentence is gone or reworded"
    _check_range(m.group(1), m.group(2), [_ratio(r, "kernelpack out= / floor") for r in runs],
                 "out= / floor")
    m = re.search(r"CuPy's `RawModule` \(([\d.]+)-([\d.]+)x\)", text)
    assert m, "the README's CuPy comparison is gone or reworded"
    _check_range(m.group(1), m.group(2),
                 [_ratio(r, "kernelpack out= / cupy RawModule kernel") for r in runs],
                 "out= / CuPy RawModule")
    m = re.search(r"\(([\d.]+)-([\d.]+)x `torch.add`", text)
    assert m, "the README's torch.add comparison is gone or reworded"
    _check_range(m.group(1), m.group(2),
                 [_ratio(r, "kernelpack allocating / torch op") for r in runs],
                 "allocating / torch.add")


def test_native_launch_knob_leaves_the_c_verifier():
    """README: the extension holds the verifier's walk, and KERNELPACK_NATIVE_LAUNCH=0 turns
    only its launches off."""
    text = _flat(README)
    assert "The extension also holds the artifact verifier's structural walk (`_verify.c`)" \
        in text
    assert ("`KERNELPACK_NATIVE_LAUNCH=0` turns the extension's launches off at run time "
            "(the verifier's walk stays") in text
    from kernelpack import _verify_native
    if not _verify_native.load():
        pytest.skip("the C extension (kernelpack.runtime._launch) is not built here")
    code = ("import kernelpack as kp, kernelpack._verify_native as v, sys\n"
            "kp.load(sys.argv[1])\n"
            "print(getattr(v.walker, '__name__', v.walker))\n")
    example = ROOT / "tests" / "golden" / "format-1.0.kpack"
    res = subprocess.run([sys.executable, "-c", code, str(example)], capture_output=True,
                         text=True, env={**os.environ, "KERNELPACK_NATIVE_LAUNCH": "0"},
                         check=True)
    assert res.stdout.strip() == "verify_fast"


def test_power_of_two_sizes_as_the_readme_says():
    """"`kp.arange(2 ** n)` ... `4 ** n` is `1 << 2n`, `3 ** n` a `TraceError`"."""
    text = _flat(README)
    assert "`kp.arange(1 << n)` or `kp.arange(2 ** n)` with a symbolic `n`" in text
    assert "`4 ** n` is `1 << 2n`, `3 ** n` a `TraceError`" in text

    def out_shape(base: int) -> tuple:
        @kp.fusion(name=f"pow{base}")
        def f(idx: kp.Tensor[kp.i64, "b"], n: kp.i64):
            return kp.arange(base ** n)[None, :] == idx[:, None]
        graph = f.trace()
        return graph.nodes[graph.outputs[0][1]].shape

    assert out_shape(2)[1] == kp.shl(1, kp.sym("n"))
    assert out_shape(4)[1] == kp.shl(1, kp.sym("n") * 2)
    with pytest.raises(kp.TraceError, match=r"power-of-two base"):
        out_shape(3)


def test_calling_a_dtype_says_what_to_write():
    assert "`kp.f32(1e-5)` is a `TypeError` saying what to write" in _flat(README)
    with pytest.raises(TypeError, match=r"number itself \(1e-05 .*x\.astype\(kp\.float32\)"):
        kp.f32(1e-5)


def test_runtime_docstring_names_the_driver_doors():
    """The runtime opens the driver through ctypes on Linux; its docstring said the first
    launch imports cuda.bindings."""
    import kernelpack.runtime as rt
    from kernelpack import config

    doc = _flat(rt.__doc__ or "")
    assert "the first launch does" not in doc
    assert "libcuda.so.1" in doc and "KERNELPACK_DRIVER=cuda-bindings" in doc
    assert "KERNELPACK_DRIVER" in config._REGISTRY  # noqa: SLF001 - the knob registry
    assert "kernelpack.runtime" in sys.modules  # "import kernelpack imports these modules"


def test_layout_names_modules_that_exist():
    """Every ``name.py``/``name.c`` the README's Layout block names under src/kernelpack."""
    layout = README.split("## Layout", 1)[1].split("schema/", 1)[0]
    names = set(re.findall(r"\b([a-z_]+\.(?:py|c))\b", layout))
    assert {"verify.py", "_verify.c"} <= names
    src = ROOT / "src" / "kernelpack"
    missing = sorted(n for n in names if not any(src.rglob(n)))
    assert not missing, f"README's Layout names files that do not exist: {missing}"


def test_benchmark_scripts_named_exist():
    section = README.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    names = set(re.findall(r"`([a-z_]+\.py)`", section))
    assert {"columns.py", "rowsplit.py", "amplitude.py"} <= names
    missing = sorted(n for n in names if not (ROOT / "benchmarks" / n).exists())
    assert not missing, f"README names benchmark scripts that do not exist: {missing}"
