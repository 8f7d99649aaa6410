"""``kernelpack build``: a Python file or module of fusions -> one artifact (no GPU)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cli import main

pytest.importorskip("llvmlite", reason="the lowering (kernelpack[compile]) is not installed")
pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")

SOURCE = '''
import kernelpack as kp

@kp.fusion
def axpby(x: kp.Tensor[kp.f32, "n"], y: kp.Tensor[kp.f32, "n"], a: kp.f32):
    return a * x + y

@kp.fusion
def row_sum(x: kp.Tensor[kp.f32, "b", "n"]):
    return x.sum(axis=1)

@kp.fusion(name="halve")
def _halve(x: kp.Tensor[kp.f32, "n"]):
    return x * 0.5

also_axpby = axpby   # one object under two names: built once
'''


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_builds_every_public_fusion_with_progress(capsys, tmp_path) -> None:
    src, out = write(tmp_path, SOURCE, "kp_build_all"), tmp_path / "all.kpack"
    code, stdout, stderr = run(capsys, "build", src, "-o", out)
    assert code == 0, stderr
    pack = kp.load(out)
    assert pack.programs == ["axpby", "row_sum"]  # _halve is private, also_axpby the same
    lines = stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("[1/2] axpby: compiled in ")
    assert lines[1].startswith("[2/2] row_sum: compiled in ")
    assert stdout == f"wrote {out}: 2 programs, {out.stat().st_size} bytes\n"
    plan = pack["row_sum"].plan(x=(7, 1000))
    assert plan.allocations["out"].shape == (7,)
    targets = {i.target for m in pack.compiled("axpby").modules for i in m.images}
    assert targets == {"sm_80", "sm_90", "ptx"} or {"sm_80", "sm_90"} <= targets


def test_names_select_attributes_private_ones_included(capsys, tmp_path) -> None:
    src, out = write(tmp_path, SOURCE, "kp_build_named"), tmp_path / "named.kpack"
    code, _, stderr = run(capsys, "build", src, "_halve", "also_axpby", "-o", out,
                          "--targets", "sm_90", "--quiet")
    assert code == 0 and stderr == ""
    pack = kp.load(out)
    assert pack.programs == ["axpby", "halve"]
    assert [i.target for m in pack.compiled("halve").modules for i in m.images] == ["sm_90"]

    code, _, stderr = run(capsys, "build", src, "nope", "-o", tmp_path / "x.kpack")
    assert code == 2 and "has no fusion or kp.Compiled named nope" in stderr
    assert "_halve, also_axpby, axpby, row_sum" in stderr


def test_a_module_name_is_found_from_the_current_directory(capsys, tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "kp_build_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg, SOURCE, "kernels")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    code, _, stderr = run(capsys, "build", "kp_build_pkg.kernels", "row_sum", "-o", "m.kpack")
    assert code == 0, stderr
    assert kp.load(tmp_path / "m.kpack").programs == ["row_sum"]
    code, _, stderr = run(capsys, "build", "kp_build_pkg.missing", "-o", "m2.kpack")
    assert code == 1 and "kp_build_pkg.missing: no such module" in stderr


def test_compiled_objects_are_taken_as_they_are(capsys, tmp_path) -> None:
    src = write(tmp_path, SOURCE + '''
row_sum_64 = kp.compile(kp.fusion(row_sum.fn, name="row_sum_64"), targets=["sm_80"],
                        static={"n": 64})
''', "kp_build_static")
    out = tmp_path / "static.kpack"
    code, _, stderr = run(capsys, "build", src, "row_sum_64", "-o", out)
    assert code == 0, stderr
    assert "[1/1] row_sum_64: taken as it is (kp.Compiled)" in stderr
    program = kp.load(out)["row_sum_64"]
    with pytest.raises(kp.ConstraintError):
        program.plan(x=(3, 65))
    assert program.plan(x=(3, 64)).allocations["out"].shape == (3,)


def test_the_disk_cache_skips_unchanged_fusions(capsys, tmp_path) -> None:
    src, cache = write(tmp_path, SOURCE, "kp_build_cached"), tmp_path / "cache"
    first, second = tmp_path / "1.kpack", tmp_path / "2.kpack"
    assert run(capsys, "build", src, "-o", first, "--cache-dir", cache)[0] == 0
    code, _, stderr = run(capsys, "build", src, "-o", second, "--cache-dir", cache)
    assert code == 0
    assert [line.split(": ", 1)[1].split(" in ")[0] for line in stderr.splitlines()] == \
        ["from the disk cache"] * 2
    assert first.read_bytes() == second.read_bytes()


def test_signed_build_verifies_with_the_public_key(capsys, tmp_path) -> None:
    key, out = tmp_path / "key", tmp_path / "signed.kpack"
    assert run(capsys, "keygen", "-o", key)[0] == 0
    src = write(tmp_path, SOURCE, "kp_build_signed")
    assert run(capsys, "build", src, "axpby", "-o", out, "--sign-with", key, "-q")[0] == 0
    assert run(capsys, "verify", out, "--trusted-key", f"{key}.pub")[0] == 0
    assert kp.load(out, trusted_keys=[Path(f"{key}.pub")]).signature.verified


@pytest.mark.parametrize("text, message", [
    ("raise RuntimeError('no GPU budget today')",
     "kp_build_bad.py, line 1): RuntimeError: no GPU budget today"),
    ("import sys\nsys.exit(3)", "called sys.exit(3) while being imported"),
    ("x = 1", "defines no @kp.fusion function or kp.Compiled at module level"),
    (SOURCE + "\n@kp.fusion(name='axpby')\ndef other(x: kp.Tensor[kp.f32, 'n']):\n    return x\n",
     "attributes 'axpby' and 'other' both make a program named 'axpby'"),
])
def test_failures_name_the_cause_and_write_nothing(capsys, tmp_path, text, message) -> None:
    src, out = write(tmp_path, text, "kp_build_bad"), tmp_path / "out.kpack"
    out.write_bytes(b"an earlier artifact")
    code, stdout, stderr = run(capsys, "build", src, "-o", out)
    assert code == 1 and stdout == ""
    assert stderr.startswith("error: ") and message in stderr, stderr
    assert len(stderr.splitlines()) == 1
    assert out.read_bytes() == b"an earlier artifact"


def test_every_failing_fusion_is_reported_and_nothing_is_written(capsys, tmp_path) -> None:
    """The others still compile (one run shows every failure); the error line names each."""
    src = write(tmp_path, SOURCE + """
@kp.fusion
def broken(x: kp.Tensor[kp.f32, 'n'], y: kp.Tensor[kp.f32, 'm']):
    return x + y

@kp.fusion(name="worse")
def also_broken(x: kp.Tensor[kp.f32, 'n']):
    return x.reshape(2, -1)
""", "kp_build_trace")
    out = tmp_path / "o.kpack"
    code, stdout, stderr = run(capsys, "build", src, "-o", out, "--quiet")
    assert code == 1 and stdout == "" and not out.exists()
    lines = stderr.splitlines()
    assert lines[0] == ("[2/4] broken: FAILED: TraceError: add: shapes (n,) and (m,) do not "
                        "broadcast (axis 0: n vs m)")
    assert lines[1].startswith("[4/4] worse (also_broken): FAILED: TraceError: traced tensors "
                               "have no attribute 'reshape'")
    assert lines[2] == (f"error: {src}: 2 of 4 programs failed (broken, worse (also_broken)); "
                        f"{out} was not written")
    assert len(lines) == 3  # --quiet: the programs that compiled are not reported


@pytest.mark.parametrize("args, message", [
    (["--targets", "sm_80,bogus"], "--targets 'sm_80,bogus'"),
    (["--targets", "ptx"], "--targets 'ptx'"),
])
def test_bad_targets_are_usage_errors(capsys, tmp_path, args, message) -> None:
    src = write(tmp_path, SOURCE, "kp_build_targets")
    code, _, stderr = run(capsys, "build", src, "-o", tmp_path / "o.kpack", *args)
    assert code == 2 and message in stderr


def test_sources_that_are_not_python_modules(capsys, tmp_path) -> None:
    code, _, stderr = run(capsys, "build", tmp_path / "absent.py", "-o", tmp_path / "o.kpack")
    assert code == 1 and "absent.py: no such file" in stderr
    code, _, stderr = run(capsys, "build", tmp_path, "-o", tmp_path / "o.kpack")
    assert code == 1 and "a directory; give a .py file or a module name" in stderr
    code, _, stderr = run(capsys, "build", "not a-module", "-o", tmp_path / "o.kpack")
    assert code == 2 and "neither a .py file nor a module name" in stderr


def test_help_explains_the_command(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["build", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for words in ("@kp.fusion", "kp.Compiled", "--targets", "--cache", "--sign-with",
                  "Progress goes to stderr"):
        assert words in text
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "build     compile the fusions of a Python file or module" in capsys.readouterr().out


def test_the_readme_example_builds(capsys, tmp_path) -> None:
    """README's `kernelpack build examples/fusions.py -o model.kpack`."""
    example = Path(__file__).resolve().parents[1] / "examples" / "fusions.py"
    out = tmp_path / "model.kpack"
    code, _, stderr = run(capsys, "build", example, "-o", out)
    assert code == 0, stderr
    pack = kp.load(out)
    assert pack.programs == ["gelu", "rms_norm_4096", "scaled_softmax"]
    assert pack["rms_norm_4096"].plan(x=(8, 4096), w=(4096,)).allocations["out"].shape == (8, 4096)
    with pytest.raises(kp.ConstraintError):
        pack["rms_norm_4096"].plan(x=(8, 1000), w=(1000,))


def test_an_unwritable_output_fails_before_anything_compiles(capsys, tmp_path) -> None:
    src = write(tmp_path, SOURCE + "\nprint('imported')\n", "kp_build_output")
    for out, message in ((tmp_path / "missing" / "o.kpack", "does not exist"),
                         (tmp_path, "is a directory")):
        code, stdout, stderr = run(capsys, "build", src, "-o", out)
        assert code == 1 and message in stderr and stdout == ""  # the source was not imported


def test_fusions_without_the_lowering_installed(capsys, tmp_path, monkeypatch) -> None:
    """One line saying what to install, not a failure per fusion."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llvmlite" else real(name, *a))
    src = write(tmp_path, SOURCE, "kp_build_nollvm")
    code, _, stderr = run(capsys, "build", src, "-o", tmp_path / "o.kpack")
    assert code == 1
    assert stderr == ("error: compiling fusions needs the lowering (llvmlite, nvJitLink, "
                      "libdevice): pip install 'kernelpack[compile]'\n")


def test_a_failure_at_import_names_the_line_in_the_source(capsys, tmp_path) -> None:
    # the deepest frame in the source's directory, also when the failure is raised inside
    # kernelpack (a trace error in a module-level kp.compile) or a library it calls
    text = ("import json\nimport kernelpack as kp\n\n@kp.fusion\n"
            "def f(x: kp.Tensor[kp.f32, 'n']):\n    return x + 'a'\n\n"
            "c = kp.compile(f, targets=['sm_80'])\n")
    src = write(tmp_path, text, "kp_build_line")
    code, _, stderr = run(capsys, "build", src, "-o", tmp_path / "o.kpack")
    assert code == 1 and f"importing it failed (at {src}, line 6): TraceError" in stderr, stderr
    src = write(tmp_path, "import json\nx = 1\ny = json.loads('{')\n", "kp_build_line2")
    code, _, stderr = run(capsys, "build", src, "-o", tmp_path / "o.kpack")
    assert code == 1 and f"(at {src}, line 3): JSONDecodeError" in stderr, stderr
