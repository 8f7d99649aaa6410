"""benchmarks/row_configs.py without a GPU: the configurations and their registers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "benchmarks" / "row_configs.py")

pytest.importorskip("llvmlite", reason="the lowering (kernelpack[compile]) is not installed")
pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=600)


def test_list_names_every_configuration() -> None:
    out = _run("--list")
    assert out.returncode == 0, out.stderr
    names = [line.split(":")[0] for line in out.stdout.splitlines()]
    assert names[0] == "current" and "softmax-8192-at-512" in names and len(names) >= 5


def test_registers_show_what_a_configuration_changes() -> None:
    """The 8192 group bounded for 768 resident threads (as it is) fits 85 registers without
    spills; bounded for 512, as before session 51, ptxas takes more."""
    out = _run("--registers", "--workloads", "softmax", "--config", "current",
               "--config", "softmax-8192-at-512")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [line.split(" | ")[:2] for line in lines] == [["this tree", "current"],
                                                        ["this tree", "softmax-8192-at-512"]]
    regs = [re.search(r"rowblock256x32=(\d+)( \(spills)?", line) for line in lines]
    assert regs[0] and regs[1] and not regs[0].group(2), lines
    assert int(regs[0].group(1)) * 768 <= 65536 < int(regs[1].group(1)) * 768, lines


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    out = _run("--config", "nope")
    assert out.returncode == 2 and "unknown --config 'nope'" in out.stderr
    out = _run("--against", str(tmp_path))
    assert out.returncode == 2 and "no kernelpack package" in out.stderr
    out = _run("--cells", "8x")
    assert out.returncode == 2 and "--cells" in out.stderr
    out = _run("--workloads", "gelu")
    assert out.returncode == 2 and "--workloads" in out.stderr


# ncu's raw page as --ncu reads it: the collected columns of four kernels Nsight Compute
# profiled on an H200 in session 52 (layernorm 65536x1024: kernelpack's, Triton's, twice)
NCU_CSV = '''==PROF== Connected to process 519 (/usr/bin/python3.12)
"ID","Kernel Name","launch__grid_size","launch__block_size","launch__registers_per_thread",\
"launch__occupancy_limit_registers","sm__warps_active.avg.pct_of_peak_sustained_active",\
"dram__bytes.sum.per_second","smsp__inst_executed.sum","gpu__time_duration.sum"
"","","","","register/thread","block","%","Tbyte/s","inst","us"
"0","layernorm_float32_0_rowwarp32","8,192","256","128","2.000000","20.358021","4.056413",\
"36962304.000000","126.368000"
"1","_t_layernorm","65,536","128","32","16.000000","95.143220","4.104224","46661632.000000",\
"124.768000"
"2","layernorm_float32_0_rowwarp32","8,192","256","128","2.000000","20.856317","4.082237",\
"36962304.000000","125.536000"
"3","_t_layernorm","65,536","128","32","16.000000","93.669072","4.120635","46661632.000000",\
"124.256000"
==PROF== Disconnected from process 519
'''.replace("\\\n", "")


def _module():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import row_configs
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return row_configs


def test_ncu_rows_name_each_kernel_and_the_ratio_of_the_last_launches() -> None:
    rc = _module()
    kernels = rc.parse_ncu_csv(NCU_CSV)
    assert [k["Kernel Name"][0] for k in kernels] == ["layernorm_float32_0_rowwarp32",
                                                      "_t_layernorm"] * 2
    assert kernels[1]["launch__registers_per_thread"] == ("32", "register/thread")
    order = [["layernorm 65536x1024", "kp"], ["layernorm 65536x1024", "triton"]] * 2
    found = rc.attribute(order, kernels, ["layernorm"])
    assert found[("layernorm 65536x1024", "kp")] == [kernels[2]]  # the second launch's
    rows = rc.ncu_rows("this tree", "current", found)
    assert rows[0].startswith("| this tree | current | layernorm 65536x1024 | kp | "
                              "layernorm_float32_0_rowwarp32 | 8,192 | 256 | "
                              "128 register/thread | 2.000000 block |"), rows[0]
    assert rows[-1].endswith(f"| {125.536 / 124.256:.3f} |"), rows[-1]
    assert len(rows[-1].split("|")) == len(rows[0].split("|"))


def test_ncu_launches_that_do_not_match_the_profile_are_refused() -> None:
    rc = _module()
    kernels = rc.parse_ncu_csv(NCU_CSV)
    with pytest.raises(ValueError, match="past the last launch"):
        rc.attribute([["layernorm 65536x1024", "kp"], ["layernorm 65536x1024", "triton"]],
                     kernels, ["layernorm"])
    with pytest.raises(ValueError, match="no profiled kernel for layernorm 65536x1024 triton"):
        rc.attribute([["layernorm 65536x1024", "kp"], ["layernorm 65536x1024", "triton"]] * 2,
                     kernels[:3], ["layernorm"])
    with pytest.raises(ValueError, match="belongs to no launch"):
        rc.attribute([["softmax 1x1", "kp"]], kernels, ["softmax"])
    with pytest.raises(ValueError, match="units row"):
        rc.parse_ncu_csv(NCU_CSV.replace('"","","","","register/thread"', '"9","x","","","r"'))
    assert rc.parse_ncu_csv("==PROF== No kernels were profiled.\n") == []


def test_ncu_that_is_not_there_is_named() -> None:
    out = _run("--ncu", "/nonexistent/ncu")
    assert out.returncode == 2 and "--ncu: no program '/nonexistent/ncu'" in out.stderr
