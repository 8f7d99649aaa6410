"""toolchain/nvjitlink.py: assembling one PTX for several architectures side by side."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.targets import parse_arch
from kernelpack.toolchain import nvjitlink

AXPY_PTX = (Path(__file__).resolve().parents[1] / "examples" / "axpy.ptx").read_bytes()
ARCHS = [parse_arch(a) for a in ("sm_80", "sm_86", "sm_90")]


@pytest.fixture
def real_linker() -> None:
    try:
        nvjitlink.version()
    except kp.CompileError as exc:
        pytest.skip(f"nvJitLink is not available: {exc}")


def test_cubins_are_the_bytes_of_one_at_a_time(real_linker: None) -> None:
    one_by_one = [nvjitlink.ptx_to_cubin(AXPY_PTX, a, name="axpy.ptx") for a in ARCHS]
    assert nvjitlink.ptx_to_cubins(AXPY_PTX, ARCHS, name="axpy.ptx") == one_by_one
    assert len(set(one_by_one)) == len(ARCHS)  # each architecture its own cubin
    assert nvjitlink.ptx_to_cubins(AXPY_PTX, []) == []


def test_a_compile_runs_its_architectures_on_threads(real_linker: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """kp.compile goes through ptx_to_cubins: with two CPUs, two architectures overlap."""
    monkeypatch.setattr(nvjitlink, "_cpus", lambda: 2)
    real = nvjitlink.ptx_to_cubin
    running, peak, lock = [0], [0], threading.Lock()

    def counted(*args, **kwargs):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            time.sleep(0.05)  # long enough for the other thread to be inside too
            return real(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(nvjitlink, "ptx_to_cubin", counted)

    @kp.fusion
    def scale(x: kp.Tensor[kp.f32, "n"], a: kp.f32):
        return x * a

    c = kp.compile(scale, targets=["sm_80", "sm_90"])
    assert peak[0] == 2
    cubins = [i for m in c.modules for i in m.images if i.kind == "cubin"]
    assert [i.arch.sm for i in cubins] == ["sm_80", "sm_90"]
    monkeypatch.setattr(nvjitlink, "ptx_to_cubin", real)
    again = kp.compile(scale, targets=["sm_80", "sm_90"])
    assert again == c  # same bytes as without the threads' interleaving


def test_the_first_failing_architecture_in_order_is_raised_after_all_finish(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvjitlink, "_cpus", lambda: 4)
    finished: list[str] = []

    def fake(ptx, arch, *, name="kernel.ptx"):
        # the later architecture fails first in time; the earlier one fails after it
        time.sleep(0.1 if arch.sm == "sm_80" else 0.0)
        finished.append(arch.sm)
        if arch.sm in ("sm_80", "sm_90"):
            raise kp.CompileError(f"ptxas said no for {arch.sm}")
        return arch.sm.encode()

    monkeypatch.setattr(nvjitlink, "ptx_to_cubin", fake)
    with pytest.raises(kp.CompileError, match="for sm_80"):
        nvjitlink.ptx_to_cubins(b"ptx", ARCHS)
    assert sorted(finished) == ["sm_80", "sm_86", "sm_90"]  # nothing left running
    assert not [t for t in threading.enumerate() if t.name.startswith("kernelpack-ptxas")]


def test_one_cpu_assembles_in_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvjitlink, "_cpus", lambda: 1)
    callers: list[str] = []

    def fake(ptx, arch, *, name="kernel.ptx"):
        callers.append(threading.current_thread().name)
        return arch.sm.encode() + name.encode()

    monkeypatch.setattr(nvjitlink, "ptx_to_cubin", fake)
    assert nvjitlink.ptx_to_cubins(b"ptx", ARCHS, name="k.ptx") == [
        b"sm_80k.ptx", b"sm_86k.ptx", b"sm_90k.ptx"]
    assert set(callers) == {threading.current_thread().name}


def test_cpus_is_at_least_one() -> None:
    assert nvjitlink._cpus() >= 1


def test_no_thread_to_be_had_assembles_in_the_calling_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvjitlink, "_cpus", lambda: 4)
    monkeypatch.setattr(nvjitlink, "ptx_to_cubin", lambda ptx, arch, *, name: arch.sm.encode())

    class NoThreads:
        def __init__(self, *a, **k) -> None:
            self.message = "can't start new thread"

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

        def submit(self, *a, **k):
            raise RuntimeError(self.message)

    monkeypatch.setattr(nvjitlink, "ThreadPoolExecutor", NoThreads)
    assert nvjitlink.ptx_to_cubins(b"ptx", ARCHS) == [b"sm_80", b"sm_86", b"sm_90"]

    class Broken(NoThreads):
        def __init__(self, *a, **k) -> None:
            self.message = "something else went wrong"

    monkeypatch.setattr(nvjitlink, "ThreadPoolExecutor", Broken)
    with pytest.raises(RuntimeError, match="something else"):
        nvjitlink.ptx_to_cubins(b"ptx", ARCHS)


def test_a_compile_at_interpreter_exit_still_assembles(real_linker: None, tmp_path: Path) -> None:
    """atexit handlers run after the thread pools refuse new work ("cannot schedule new
    futures after interpreter shutdown"): the cubins are then assembled one at a time."""
    import subprocess
    import sys

    script = tmp_path / "at_exit.py"
    script.write_text(
        "import atexit\n"
        "from pathlib import Path\n"
        "from kernelpack.targets import parse_arch\n"
        "from kernelpack.toolchain import nvjitlink\n"
        f"ptx = Path({str(Path(__file__).resolve().parents[1] / 'examples' / 'axpy.ptx')!r})"
        ".read_bytes()\n"
        "nvjitlink._cpus = lambda: 2\n"
        "def late():\n"
        "    cubins = nvjitlink.ptx_to_cubins(ptx, [parse_arch('sm_80'), parse_arch('sm_90')])\n"
        "    print('assembled', [len(c) > 0 for c in cubins])\n"
        "atexit.register(late)\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "assembled [True, True]" in r.stdout


def test_resource_usage_reports_each_entry(real_linker: None) -> None:
    """Registers and spill bytes per entry from ptxas's report: axpy's one entry spills
    nothing; a kernel held to 16 registers (`.maxnreg`) with more values live than that
    spills, and a second entry of the same module is reported on its own."""
    used = nvjitlink.resource_usage(AXPY_PTX, parse_arch("sm_90"))
    assert list(used) == ["axpy"] and 0 < used["axpy"][0] <= 255 and used["axpy"][1] == 0
    loads = "\n".join(f"  ld.global.f32 f{i}, [rd1+{4 * i}];" for i in range(48))
    total = "\n".join(f"  add.f32 f0, f0, f{i};" for i in range(1, 48))
    squeezed = f""".version 8.0
.target sm_80
.address_size 64
.visible .entry tight(.param .u64 p) .maxnreg 16
{{
  .reg .b64 rd<2>; .reg .f32 f<48>;
  ld.param.u64 rd1, [p];
{loads}
  membar.gl;
{total}
  st.global.f32 [rd1], f0;
  ret;
}}
.visible .entry roomy(.param .u64 p)
{{
  .reg .b64 rd<2>; .reg .f32 f<2>;
  ld.param.u64 rd1, [p]; ld.global.f32 f1, [rd1]; st.global.f32 [rd1+4], f1;
  ret;
}}
"""
    used = nvjitlink.resource_usage(squeezed, parse_arch("sm_90"))
    assert set(used) == {"tight", "roomy"}
    assert used["tight"][1] > 0 and used["tight"][0] < 48, used  # (ptxas floors the cap)
    assert used["roomy"][1] == 0, used
    with pytest.raises(kp.CompileError, match="sm_90"):
        nvjitlink.resource_usage(b".version 8.0\n.target sm_80\nnot ptx", parse_arch("sm_90"))
