"""Review 32: kernelpack installed the way a user installs it (wheel, sdist, fresh venvs).

Everything else in the suite runs from the editable install in ``.venv``. These tests build
the wheel and the sdist from a copy of the checkout (an in-tree build would write ``build/``
and ``*.egg-info`` into the working tree), install them into fresh virtual environments with
their dependencies from the package index, and run the README's journeys from a directory
outside the checkout, so ``src/`` is never importable.

Every test here builds or installs something: all are ``slow``. The wheel and the sdist are
built once per run (shared between pytest-xdist workers under a file lock); each venv is
removed when its test (or the session, for the shared base venv) ends.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from filelock import FileLock
from kp_redis_helpers import RedisServer
from packaging.requirements import Requirement

# Builds, downloads and installs (~2 minutes, a few hundred MB from the package index): on
# request only (README, "Run the tests"), so that the suite needs no network.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.environ.get("KP_INSTALL_TESTS") != "1",
    reason="installs wheels from the package index: set KP_INSTALL_TESTS=1")]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
HEAVY = ("llvmlite", "numpy", "torch", "cupy", "cuda.bindings.driver", "kernelpack.lowering")


# ----------------------------------------------------------------------------- helpers


def _env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing that points back into the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP",
                        "PIP_REQUIRE_VIRTUALENV", "PYTHONSAFEPATH")
           and not k.startswith("KERNELPACK_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path, *, env: dict[str, str] | None = None, timeout: float = 240,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], cwd=str(cwd), env=env or _env(), check=False,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                    f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return proc


def _copy_checkout(dest: Path) -> None:
    """Copy what a clean clone of the checkout holds (tracked + untracked, not ignored)."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, check=True, timeout=60).stdout
        names = [n.decode() for n in out.split(b"\0") if n]
    except (OSError, subprocess.SubprocessError):
        names = []
    if not names:
        shutil.copytree(ROOT, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "__pycache__", "*.egg-info", "*.so", ".hypothesis", ".gpu"))
        return
    for name in names:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _make_venv(path: Path, *pip_args: str, env: dict[str, str] | None = None) -> Path:
    """A fresh venv at ``path`` with ``pip install pip_args``; returns its bin directory."""
    _run([sys.executable, "-m", "venv", path], ROOT.parent)
    bindir = path / "bin"
    if pip_args:
        _run([bindir / "python", "-m", "pip", "install", "-q", *pip_args], path, env=env,
             timeout=540)
    return bindir


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(name).decode()


def _requirement(wheel: Path, name: str) -> Requirement:
    for line in _metadata(wheel).splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.name.lower() == name:
                return req
    pytest.fail(f"the wheel's METADATA declares no requirement on {name}")


def _floor(req: Requirement) -> str:
    floors = [s.version for s in req.specifier if s.operator in (">=", "==", "~=")]
    assert floors, f"{req} has no lower bound: a user may get any version"
    return max(floors, key=lambda v: tuple(int(p) for p in re.findall(r"\d+", v)))


def _version(wheel: Path) -> str:
    return re.search(r"^Version: (\S+)$", _metadata(wheel), re.MULTILINE).group(1)


def _user_dir(tmp: Path) -> Path:
    """A working directory outside the checkout holding a copy of examples/."""
    work = tmp / "work"
    shutil.copytree(EXAMPLES, work, ignore=shutil.ignore_patterns("__pycache__"))
    return work


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory per test run, shared by every xdist worker of that run."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    base = tmp_path_factory.getbasetemp()
    d = base.parent / f"review32-{uid}" if uid else base / "review32"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _once(shared: Path, name: str, make) -> Path:
    target = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not (target / ".done").exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            make(target)
            (target / ".done").touch()
    return target


@pytest.fixture(scope="session")
def tree(shared: Path) -> Path:
    return _once(shared, "tree", lambda d: _copy_checkout(d / "src")) / "src"


@pytest.fixture(scope="session")
def wheel(shared: Path, tree: Path) -> Path:
    def make(d: Path) -> None:
        with FileLock(str(shared / "tree-build.lock")):  # the wheel builds inside the tree
            _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", d, tree], tree,
                 timeout=540)
    d = _once(shared, "wheel", make)
    (whl,) = d.glob("kernelpack-*.whl")
    return whl


@pytest.fixture(scope="session")
def sdist(shared: Path, tree: Path) -> Path:
    def make(d: Path) -> None:
        bindir = _make_venv(d / "tools", "build")
        with FileLock(str(shared / "tree-build.lock")):
            _run([bindir / "python", "-m", "build", "--sdist", "--outdir", d / "dist", tree],
                 tree, timeout=540)
    d = _once(shared, "sdist", make)
    (sd,) = (d / "dist").glob("kernelpack-*.tar.gz")
    return sd


@pytest.fixture(scope="session")
def base_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path):
    """The wheel and its base dependencies (no extras), this worker's own."""
    path = tmp_path_factory.mktemp("venv-base")
    yield _make_venv(path / "v", str(wheel))
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def own_venv(tmp_path: Path):
    """A directory for a venv that is removed when the test ends (compile venvs are ~700 MB)."""
    yield tmp_path / "v"
    shutil.rmtree(tmp_path / "v", ignore_errors=True)


@pytest.fixture(scope="session")
def axpy_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """example.kpack made by the checkout's own kernelpack (the dev env has nvJitLink)."""
    import kernelpack as kp

    out = tmp_path_factory.mktemp("artifact") / "example.kpack"
    c = kp.external(
        "axpy", "axpy",
        params=[kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv("n", 256), block=256, ptx=EXAMPLES / "axpy.ptx",
        targets=["sm_80", "sm_90", "ptx"])
    kp.save([c], out)
    return out


LOAD_CHECK = r"""
import sys, json
import kernelpack as kp
pack = kp.load(sys.argv[1])
pack.verify()
plan = pack["axpy"].plan(x=(1_000_000,), y=(1_000_000,), a=0.5)
print(json.dumps({"programs": list(pack.programs), "grid": list(plan.launches[0].grid)}))
"""


def _check_load_path(bindir: Path, work: Path, artifact: Path) -> None:
    """Load, verify, plan, inspect, eval: what every install must do without a compiler."""
    out = json.loads(_run([bindir / "python", "-c", LOAD_CHECK, artifact], work).stdout)
    assert out == {"programs": ["axpy"], "grid": [3907, 1, 1]}
    kp_cli = bindir / "kernelpack"
    assert "OK:" in _run([kp_cli, "verify", artifact], work).stdout
    facts = json.loads(_run([kp_cli, "inspect", artifact, "--json"], work).stdout)
    assert facts["format_version"] == "1.0"
    assert "(3907, 1, 1)" in _run([kp_cli, "eval", artifact, "axpy", "x=1000000", "y=1000000",
                                   "a=0.5"], work).stdout


# ----------------------------------------------------------------------------- the wheel


def test_wheel_holds_every_module_the_extension_and_correct_metadata(wheel: Path,
                                                                     tree: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    src = tree / "src"
    modules = {p.relative_to(src).as_posix() for p in (src / "kernelpack").rglob("*.py")}
    assert modules, "the copied checkout has no modules"
    assert not modules - names, f"modules missing from the wheel: {sorted(modules - names)}"
    assert "kernelpack/py.typed" in names
    assert any(n.startswith("kernelpack/_generated/") and n.endswith(".py") for n in names)
    if sys.version_info >= (3, 11):
        assert any(re.fullmatch(r"kernelpack/runtime/_launch\..*\.so", n) for n in names), (
            "the optional C extension was not built into the wheel on this Python")
    meta = _metadata(wheel)
    assert re.search(r"^Name: kernelpack$", meta, re.MULTILINE)
    # README: Python 3.10 or newer
    assert re.search(r"^Requires-Python: >=3\.10$", meta, re.MULTILINE)
    assert re.search(r"^License-Expression: Apache-2\.0$", meta, re.MULTILINE)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    with zipfile.ZipFile(wheel) as z:
        ep = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert re.search(r"^kernelpack = kernelpack\.cli:main$", ep, re.MULTILINE)


def test_base_install_outside_checkout_loads_inspects_and_stays_light(
        base_venv: Path, wheel: Path, axpy_artifact: Path, tmp_path: Path) -> None:
    work = _user_dir(tmp_path)
    code = ("import sys, json, kernelpack\n"
            f"print(json.dumps([kernelpack.__file__, kernelpack.__version__, "
            f"[m for m in {HEAVY!r} if m in sys.modules]]))")
    probe = _run([base_venv / "python", "-c", code], work).stdout
    where, version, heavy = json.loads(probe)
    assert Path(where).is_relative_to(base_venv.parent), f"imported from {where}"
    assert heavy == []
    assert version == _version(wheel)
    assert _run([base_venv / "kernelpack", "--version"], work).stdout.strip() == \
        f"kernelpack {_version(wheel)}"
    helptext = _run([base_venv / "python", "-m", "kernelpack", "--help"], work).stdout
    assert "inspect" in helptext and "build" in helptext
    if sys.version_info >= (3, 11):
        _run([base_venv / "python", "-c", "import kernelpack.runtime._launch"], work)
    _check_load_path(base_venv, work, axpy_artifact)


def test_base_install_compile_without_the_extra_says_to_install_it(
        base_venv: Path, tmp_path: Path) -> None:
    """README: ``pip install '.[compile]'`` adds llvmlite etc. for kp.compile. A base install
    that calls kp.compile (or builds examples/fusions.py, whose module calls it) should say
    so, as NVRTC, ``llvm_ir=`` and ``kernelpack build``'s own compile already do; it got a
    bare ``ModuleNotFoundError: No module named 'llvmlite'``."""
    work = _user_dir(tmp_path)
    script = ("import kernelpack as kp\n"
              "@kp.fusion\n"
              "def twice(x: kp.Tensor[kp.f32, 'n']):\n"
              "    return x * 2\n"
              "try:\n"
              "    kp.compile(twice, targets=['sm_80'])\n"
              "except Exception as e:\n"
              "    print(type(e).__name__ + ': ' + str(e))\n"
              "else:\n"
              "    print('compiled')\n")
    said = _run([base_venv / "python", "-c", script], work).stdout
    assert "kernelpack[compile]" in said, f"kp.compile in a base install said: {said!r}"
    proc = _run([base_venv / "kernelpack", "build", "fusions.py", "-o", "model.kpack"], work,
                check=False)
    assert proc.returncode == 1
    assert "kernelpack[compile]" in proc.stderr, (
        f"README's `kernelpack build examples/fusions.py` in a base install said: "
        f"{proc.stderr!r}")
    assert not (work / "model.kpack").exists()


def test_base_install_external_ptx_without_nvjitlink_says_to_install_it(
        base_venv: Path, tmp_path: Path) -> None:
    """README's first main job (build_example.py: PTX -> sm_80/sm_90 cubins) in a base
    install: nvJitLink is part of ``[compile]``; the error named only a missing
    ``libnvJitLink.so.13``, while NVRTC's says ``pip install nvidia-cuda-nvrtc (or
    kernelpack[compile])``."""
    work = _user_dir(tmp_path)
    proc = _run([base_venv / "python", "build_example.py"], work, check=False)
    assert proc.returncode != 0
    assert "kernelpack.errors." in proc.stderr, proc.stderr[-2000:]
    said = proc.stderr[proc.stderr.rindex("kernelpack.errors."):]
    assert "kernelpack[compile]" in said or "nvidia-nvjitlink" in said, said


def test_compile_install_runs_the_readme_main_job(own_venv: Path, wheel: Path,
                                                  tmp_path: Path) -> None:
    bindir = _make_venv(own_venv, f"{wheel}[compile]")
    work = _user_dir(tmp_path)
    env = _env(KERNELPACK_CACHE_DIR=str(tmp_path / "kcache"))
    heavy = _run([bindir / "python", "-c",
                  f"import sys, kernelpack; print([m for m in {HEAVY!r} if m in sys.modules])"],
                 work, env=env).stdout.strip()
    assert heavy == "[]", f"import kernelpack imported {heavy} (llvmlite is installed here)"
    # README, fresh machine, command 1 and its second half
    _run([bindir / "python", "build_example.py"], work, env=env)
    shown = _run([bindir / "kernelpack", "inspect", "example.kpack"], work, env=env).stdout
    assert all(t in shown for t in ("sm_80", "sm_90", "compute_80"))
    _run([bindir / "kernelpack", "build", "fusions.py", "-o", "model.kpack"], work, env=env)
    _run([bindir / "kernelpack", "verify", "model.kpack"], work, env=env)
    _run([bindir / "kernelpack", "eval", "model.kpack", "scaled_softmax", "x=4096,1000",
          "s=0.5"], work, env=env)
    _check_load_path(bindir, work, work / "example.kpack")
    script = ("import json, kernelpack as kp\n"
              "@kp.fusion\n"
              "def axpby(x: kp.Tensor[kp.f32, 'n'], y: kp.Tensor[kp.f32, 'n'], a: kp.f32):\n"
              "    return a * x + y\n"
              "c = kp.compile(axpby, targets=['sm_80', 'ptx'])\n"
              "kp.save([c], 'mine.kpack')\n"
              "p = kp.load('mine.kpack'); p.verify()\n"
              "pl = p['axpby'].plan(x=(1000,), y=(1000,), a=2.0)\n"
              "print(json.dumps([list(p.programs), [t.name for t in p['axpby'].summary.outputs],"
              " len(pl.launches)]))\n")
    programs, outputs, launches = json.loads(_run([bindir / "python", "-c", script], work,
                                                  env=env).stdout)
    assert programs == ["axpby"] and len(outputs) == 1 and launches >= 1
    _run([bindir / "kernelpack", "eval", "mine.kpack", "axpby", "x=1000", "y=1000", "a=2"],
         work, env=env)


def test_lowest_llvmlite_the_wheel_allows_can_compile(own_venv: Path, wheel: Path,
                                                      tmp_path: Path) -> None:
    """pyproject's ``llvmlite>=0.44`` lets pip keep llvmlite 0.44.0 (LLVM 15, typed
    pointers); with it every kp.compile fails: a pointwise fusion with ``CompileError: LLVM
    rejected the generated IR`` (``ptr type is only supported in -opaque-pointers mode``), a
    softmax with a bare ``TypeError: cannot store float to [66 x i64] addrspace(3)*``.
    0.45.0 works. The floor must be one that works."""
    floor = _floor(_requirement(wheel, "llvmlite"))
    bindir = _make_venv(own_venv, f"{wheel}[compile]", f"llvmlite=={floor}")
    work = _user_dir(tmp_path)
    script = ("import kernelpack as kp\n"
              "@kp.fusion\n"
              "def twice(x: kp.Tensor[kp.f32, 'n']):\n"
              "    return x * 2\n"
              "@kp.fusion\n"
              "def softmax(x: kp.Tensor[kp.f32, 'b', 'n']):\n"
              "    e = kp.exp(x - x.max(axis=1, keepdims=True))\n"
              "    return e / e.sum(axis=1, keepdims=True)\n"
              "for f in (twice, softmax):\n"
              "    try:\n"
              "        kp.compile(f, targets=['sm_80'])\n"
              "        print('ok')\n"
              "    except Exception as e:\n"
              "        print(type(e).__name__ + ': ' + str(e).splitlines()[0])\n")
    said = _run([bindir / "python", "-c", script], work,
                env=_env(KERNELPACK_CACHE_DIR=str(tmp_path / "kcache"))).stdout.split("\n")
    assert said[:2] == ["ok", "ok"], f"with llvmlite=={floor}: {said[:2]}"


# cuda-bindings releases inside ``>=12.8`` that cannot open nvJitLink without a CUDA driver
# ("CUDA driver is not found (libcuda.so.1 ...)"); 12.8.0 and 12.9.0 cannot open the
# nvidia-cuda-nvrtc 13 that [compile] installs either. 12.9.3+ and 13.0.2+ can.
BROKEN_CUDA_BINDINGS = ("12.8.0", "12.9.2", "13.0.1")

EXTERNALS = r"""
import kernelpack as kp
P = [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
     kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]
for kw in (dict(ptx="axpy.ptx"),
           dict(cuda='extern "C" __global__ void axpy(const float* x, float* y, float a, '
                     'unsigned n) { unsigned i = blockIdx.x * blockDim.x + threadIdx.x; '
                     'if (i < n) y[i] += a * x[i]; }')):
    try:
        kp.external("axpy", "axpy", params=P, grid=kp.cdiv("n", 256), block=256,
                    targets=["sm_80", "sm_90", "ptx"], **kw)
        print("ok")
    except Exception as e:
        print(type(e).__name__ + ": " + str(e).splitlines()[0])
"""


def test_cuda_bindings_the_wheel_allows_assemble_ptx_without_a_gpu(own_venv: Path, wheel: Path,
                                                                  tmp_path: Path) -> None:
    """README: 'No GPU is needed for either command' (build_example.py: nvJitLink). Every
    cuda-bindings version the wheel's ``Requires-Dist`` admits must do it on a machine
    without a driver, or be excluded there."""
    spec = _requirement(wheel, "cuda-bindings").specifier
    allowed = [v for v in BROKEN_CUDA_BINDINGS if spec.contains(v)]
    if not allowed:
        return
    bindir = _make_venv(own_venv, f"{wheel}[compile]")
    work = _user_dir(tmp_path)
    failures = {}
    for version in allowed:
        _run([bindir / "python", "-m", "pip", "install", "-q", f"cuda-bindings=={version}"],
             work, timeout=300)
        said = _run([bindir / "python", "-c", EXTERNALS], work).stdout.strip().splitlines()
        if said != ["ok", "ok"]:
            failures[version] = said
    assert not failures, f"cuda-bindings {spec} admits versions that fail: {failures}"


# ----------------------------------------------------------------------------- the sdist


def _sdist_names(sdist: Path) -> tuple[str, set[str]]:
    with tarfile.open(sdist) as t:
        names = [m.name for m in t.getmembers() if m.isfile()]
    top = names[0].split("/")[0]
    return top, {n.split("/", 1)[1] for n in names if "/" in n}


def test_sdist_holds_the_c_sources_and_builds_the_extension(sdist: Path, tmp_path: Path) -> None:
    _, names = _sdist_names(sdist)
    manifest = (ROOT / "MANIFEST.in").read_text()
    listed = re.findall(r"^include\s+(\S+)$", manifest, re.MULTILINE)
    assert listed, "MANIFEST.in lists nothing"
    assert not set(listed) - names, f"sdist lacks {sorted(set(listed) - names)}"
    for must in ("pyproject.toml", "setup.py", "LICENSE", "README.md",
                 "src/kernelpack/_generated/Pack.py", "src/kernelpack/py.typed"):
        assert must in names, must
    out = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, sdist], tmp_path,
         timeout=540)
    (whl,) = out.glob("*.whl")
    if sys.version_info >= (3, 11):
        with zipfile.ZipFile(whl) as z:
            assert any(re.fullmatch(r"kernelpack/runtime/_launch\..*\.so", n)
                       for n in z.namelist())


def test_sdist_without_a_c_compiler_installs_the_pure_python_paths(
        sdist: Path, own_venv: Path, axpy_artifact: Path, tmp_path: Path) -> None:
    """README: 'Without a C compiler ... the build skips the extension and kernelpack runs the
    same logic in Python'."""
    bindir = _make_venv(own_venv, "--no-cache-dir", str(sdist), env=_env(CC="false"))
    site = next(own_venv.glob("lib/python3*/site-packages/kernelpack"))
    assert not list(site.rglob("*.so")), "CC=false still produced an extension?"
    work = _user_dir(tmp_path)
    _check_load_path(bindir, work, axpy_artifact)


def test_sdist_tests_are_complete_or_absent(sdist: Path) -> None:
    """The sdist ships 100+ ``tests/test_*.py`` (setuptools' default) but not
    ``tests/conftest.py``, ``kp_samples.py`` and the other helper modules and data they
    import: ``pytest`` in an unpacked sdist cannot collect a third of them. Ship the suite
    whole, or leave it out."""
    _, names = _sdist_names(sdist)
    shipped = sorted(n for n in names if n.startswith("tests/") and n.endswith(".py"))
    if not shipped:
        return
    helpers = {p.stem for p in (ROOT / "tests").glob("*.py") if not p.stem.startswith("test_")}
    helpers |= {p.name for p in (ROOT / "tests").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    needed = {"tests/conftest.py"} if (ROOT / "tests/conftest.py").exists() else set()
    for name in shipped:
        text = (ROOT / name).read_text(encoding="utf-8") if (ROOT / name).exists() else ""
        for mod in re.findall(r"^\s*(?:import|from)\s+(\w+)", text, re.MULTILINE):
            if mod in helpers:
                needed.add(f"tests/{mod}.py" if (ROOT / f"tests/{mod}.py").exists()
                           else f"tests/{mod}/__init__.py")
    missing = sorted(needed - names)
    assert not missing, (f"the sdist ships {len(shipped)} test files but not what they "
                         f"import: {missing}")


def test_sdist_holds_the_files_its_readme_points_to(sdist: Path) -> None:
    """The README inside the sdist (and on the package index page) sends the reader to
    ``docs/FORMAT.md`` for the format and runs ``examples/build_example.py`` (with
    ``examples/axpy.ptx``) and ``examples/fusions.py``; none of them is in the sdist."""
    _, names = _sdist_names(sdist)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    wanted = [p for p in ("docs/FORMAT.md", "examples/build_example.py", "examples/axpy.ptx",
                          "examples/fusions.py") if p in readme and (ROOT / p).exists()]
    assert wanted, "the README names none of these files any more"
    missing = [p for p in wanted if p not in names]
    assert not missing, f"the sdist's README points to files it does not hold: {missing}"


# ----------------------------------------------------------------------------- versions


@pytest.fixture(scope="session")
def bumped_wheel(shared: Path, tree: Path) -> tuple[Path, str]:
    """The wheel of the checkout after a release bumps the version where pyproject keeps it."""
    new = "99.0.0"

    def make(d: Path) -> None:
        copy = d / "src"
        with FileLock(str(shared / "tree-build.lock")):
            shutil.copytree(tree, copy, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        pyproject = copy / "pyproject.toml"
        text = pyproject.read_text()
        # a static [project] version is bumped in pyproject; a dynamic one where it points
        text, n = re.subn(r'(?m)^version\s*=\s*"[^"]*"', f'version = "{new}"', text, count=1)
        if n:
            pyproject.write_text(text)
        else:
            attr = re.search(r'(?m)^version\s*=\s*\{\s*attr\s*=\s*"([\w.]+)"', text)
            assert attr, "pyproject.toml keeps its version neither statically nor by attr"
            module = attr.group(1).rsplit(".", 1)[0].split(".")
            source = copy / "src" / Path(*module)
            source = source / "__init__.py" if source.is_dir() else source.with_suffix(".py")
            code, n = re.subn(r'(?m)^__version__\s*=\s*["\'][^"\']*["\']',
                              f'__version__ = "{new}"', source.read_text())
            assert n == 1, f"no __version__ = '...' line in {source}"
            source.write_text(code)
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", d / "dist", copy],
             copy, timeout=540)

    d = _once(shared, "bumped", make)
    (whl,) = (d / "dist").glob("kernelpack-*.whl")
    return whl, new


def test_version_bump_in_pyproject_reaches_the_cli_and_the_artifacts(
        bumped_wheel: tuple[Path, str], tmp_path: Path) -> None:
    """``kernelpack --version``, ``kp.__version__``, the generator recorded in every saved
    artifact and the compile cache's key all say 0.1.0 whatever pyproject's version is: the
    package keeps a second copy of its version. A wheel built after a release bump
    (pyproject 99.0.0) reported ``kernelpack 0.1.0`` while ``pip list`` said 99.0.0."""
    whl, new = bumped_wheel
    assert _version(whl) == new
    target = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, whl],
         tmp_path)
    work = _user_dir(tmp_path)
    env = _env(PYTHONPATH=str(target))
    where = _run([sys.executable, "-c", "import kernelpack; print(kernelpack.__file__)"], work,
                 env=env).stdout.strip()
    assert Path(where).is_relative_to(target)
    said = _run([sys.executable, "-m", "kernelpack", "--version"], work, env=env).stdout.strip()
    version = _run([sys.executable, "-c", "import kernelpack; print(kernelpack.__version__)"],
                   work, env=env).stdout.strip()
    made = work / "made.kpack"
    code = ("import sys, kernelpack as kp\n"
            "c = kp.external('axpy', 'axpy', params=[kp.Tensor('x', kp.f32, ['n']),\n"
            "    kp.Tensor('y', kp.f32, ['n'], role='inout'), kp.Scalar('a', kp.f32),\n"
            "    kp.Scalar('n32', kp.u32, value='n')], grid=kp.cdiv('n', 256), block=256,\n"
            "    ptx='axpy.ptx', targets=['sm_80'])\n"
            "kp.save([c], sys.argv[1])")
    _run([sys.executable, "-c", code, made], work, env=env)
    generator = json.loads(_run([sys.executable, "-m", "kernelpack", "inspect", made,
                                 "--json"], work, env=env).stdout)["generator"]
    assert (said, version, generator) == (f"kernelpack {new}", new, f"kernelpack {new}")


def test_upgrade_over_an_older_install_and_uninstall_leave_nothing(
        wheel: Path, bumped_wheel: tuple[Path, str], own_venv: Path, tmp_path: Path) -> None:
    newer, new = bumped_wheel
    bindir = _make_venv(own_venv)
    pip = [bindir / "python", "-m", "pip"]
    _run([*pip, "install", "-q", "--no-deps", wheel], tmp_path)
    _run([*pip, "install", "-q", "--no-deps", newer], tmp_path)
    shown = _run([*pip, "show", "kernelpack"], tmp_path).stdout
    assert re.search(rf"^Version: {re.escape(new)}$", shown, re.MULTILINE)
    site = next(own_venv.glob("lib/python3*/site-packages"))
    dist_infos = sorted(p.name for p in site.glob("kernelpack-*.dist-info"))
    assert dist_infos == [f"kernelpack-{new}.dist-info"]
    _run([*pip, "uninstall", "-y", "kernelpack"], tmp_path)
    left = sorted(str(p.relative_to(own_venv)) for p in own_venv.rglob("*kernelpack*"))
    assert left == [], f"pip uninstall left {left}"


# ----------------------------------------------------------------------------- extras

REDIS_ROUND_TRIP = r"""
import sys, json, kernelpack as kp
art, key, sk, d1, d2, url = sys.argv[1:]
kp.Cache(d1, remote=url, sign_with=sk).put(key, open(art, "rb").read())
b = kp.Cache(d2, remote=url, trusted_keys=[sk + ".pub"])
got = b.get(key)
print(json.dumps([got is not None and list(kp.load(got).programs) == ["axpy"],
                  b.stats()["remote_hits"], "redis" in sys.modules]))
"""


@pytest.fixture
def redis_url(tmp_path: Path):
    sock = tmp_path / "redis.sock"
    with RedisServer(tmp_path, extra_args=("--unixsocket", str(sock), "--unixsocketperm", "700"),
                     needs_redis_py=False) as server:
        assert sock.exists(), "redis-server answered but made no unix socket"
        yield server.url, f"unix://{sock}"


def test_redis_extra_enables_what_the_readme_says(own_venv: Path, wheel: Path, redis_url: tuple,
                                                  axpy_artifact: Path, tmp_path: Path) -> None:
    """README's Install table (lead, after review 32 found that it claimed the whole Redis
    tier for the extra): ``[redis]`` adds redis-py, for ``rediss://`` and ``unix://`` remote
    caches; ``redis://`` needs nothing (kernelpack's own client). With the extra, an entry is
    shared through a unix socket (redis-py imported) and through TCP (redis-py not
    imported)."""
    bindir = _make_venv(own_venv, f"{wheel}[redis]")
    assert 'extra == "redis"' in _metadata(wheel)
    _run([bindir / "kernelpack", "keygen", "-o", tmp_path / "team"], tmp_path)
    for url, redis_py in zip(redis_url, (False, True)):
        d = tmp_path / ("tcp" if not redis_py else "unix")
        ok, hits, imported = json.loads(_run(
            [bindir / "python", "-c", REDIS_ROUND_TRIP, axpy_artifact, "ab" * 32,
             tmp_path / "team", d / "1", d / "2", url], tmp_path).stdout)
        assert ok and hits == 1, f"the Redis tier did not share the entry through {url}"
        assert imported == redis_py, f"{url}: redis-py imported: {imported}"
