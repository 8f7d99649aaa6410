"""Review 28 (round 4): image selection as `kernelpack inspect --device/--driver` explains it.

Black box: artifacts are built with kp.external (PTX text written here, assembled by the
installed nvJitLink) or by hand with kp.Image (images the toolchain cannot make: cubins of other
toolkits, PTX of other ISAs and targets), then `kernelpack inspect` (text and --json) is run over
a grid of devices and drivers and compared with an oracle written from issue 4 item 1 and
../shared/references/cuda-loading.md (a):

* drop images whose toolkit needs a newer driver (cubin: the toolkit's major above the driver's;
  PTX: its ISA above what the driver accepts, by NVIDIA's PTX ISA release table, as
  cuda.bindings.utils.get_minimal_required_cuda_ver_from_ptx_ver gives it);
* cubins: `a` only on the exact CC, plain and `f` on the same major with minor <= the device's;
  exact `a` > exact plain/f > highest lower minor;
* then PTX: plain if its target <= device, `f` same major minor <=, `a` exact; highest target;
* else an error naming the device, the driver and every image.

Nothing here reads src/; the CLI runs in-process through kernelpack.cli.main.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import kernelpack as kp
from kernelpack.cli import main

get_min_cuda = pytest.importorskip("cuda.bindings.utils").get_minimal_required_cuda_ver_from_ptx_ver

DEVICES = ["sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110",
           "sm_120", "sm_121"]
DRIVERS = ["12.0", "12.4", "12.8", "13.0", None]   # the grid the runtime can load on (>= 12.0)

ELF = b"\x7fELF" + bytes(60)   # a stand-in cubin: inspect reads the manifest only


def ptx_text(isa: str, target: str) -> str:
    return (f".version {isa}\n.target {target}\n.address_size 64\n"
            ".visible .entry k(.param .u64 x)\n{\n  ret;\n}\n")


def external(name: str, isa: str, target: str, targets: list[str]) -> kp.Compiled:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kp.external(name, "k", params=[kp.Tensor("x", kp.f32, ["n"])], grid=1, block=32,
                           ptx=ptx_text(isa, target), targets=targets)


def by_hand(images: list[kp.Image], module: str = "m") -> kp.Compiled:
    launch = kp.Launch("k", module, (1,), (32,), [kp.Arg("buffer", "x")])
    summary = kp.KernelSummary("p", params=[kp.Tensor("x", kp.f32, ["n"])],
                               variants=[kp.Variant([launch])])
    return kp.Compiled(summary, [kp.Module(module, ["k"], images)])


def cubin(arch: str, cuda: int) -> kp.Image:
    return kp.Image("cubin", arch, ELF, "by hand", cuda)


def ptx(arch: str, isa: str, cuda: int = 0) -> kp.Image:
    major, minor = map(int, isa.split("."))
    return kp.Image("ptx", arch, ptx_text(isa, arch).encode(), "by hand", cuda, (major, minor))


def run(*argv: object) -> tuple[int, str, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def selection(path: Path, device: str, driver: str | None = None) -> list[dict[str, Any]]:
    argv: list[object] = ["inspect", path, "--json", "--device", device]
    if driver is not None:
        argv += ["--driver", driver]
    code, out, err = run(*argv)
    assert code == 0, err
    return [m["selection"] for m in json.loads(out)["modules"]]


# ---- the oracle ------------------------------------------------------------------------------

def parse(target: str) -> tuple[str, int, int, str]:
    kind = "ptx" if target.startswith("compute_") else "cubin"
    digits = target.split("_", 1)[1]
    suffix = digits[-1] if digits[-1] in "af" else ""
    digits = digits.rstrip("af")
    return kind, int(digits[:-1]), int(digits[-1]), suffix


def driver_int(driver: str) -> int:
    major, minor = map(int, driver.split("."))
    return 1000 * major + 10 * minor


def usable(img: dict[str, Any], dev: tuple[int, int], driver: str | None) -> bool:
    kind, major, minor, suffix = parse(img["target"])
    if driver is not None:
        drv = driver_int(driver)
        if kind == "ptx" and img["ptx_isa"]:
            if get_min_cuda(img["ptx_isa"]) > drv:
                return False
        elif img["cuda_version"] and img["cuda_version"] // 1000 > drv // 1000:
            return False
    if suffix == "a":
        return (major, minor) == dev
    if kind == "cubin" or suffix == "f":
        return major == dev[0] and minor <= dev[1]
    return (major, minor) <= dev


def expected(images: list[dict[str, Any]], device: str, driver: str | None) -> set[str] | None:
    """The images the rules allow as the choice (ties left open), or None: nothing fits."""
    _, dmaj, dmin, _ = parse(device)
    ok = [i for i in images if i["kind"] in ("cubin", "ptx") and usable(i, (dmaj, dmin), driver)]
    cubins = [i for i in ok if i["kind"] == "cubin"]
    if cubins:
        key = {id(i): (parse(i["target"])[2], parse(i["target"])[3] == "a") for i in cubins}
        best = max(key.values())
        return {f"cubin {i['target']}" for i in cubins if key[id(i)] == best}
    ptxs = [i for i in ok if i["kind"] == "ptx"]
    if ptxs:
        best = max(parse(i["target"])[1:3] for i in ptxs)
        return {f"ptx {i['target']}" for i in ptxs if parse(i["target"])[1:3] == best}
    return None


def images_of(path: Path) -> list[list[dict[str, Any]]]:
    code, out, err = run("inspect", path, "--json")
    assert code == 0, err
    return [m["images"] for m in json.loads(out)["modules"]]


def check_grid(path: Path, drivers: list[str | None] = DRIVERS) -> list[str]:
    wrong: list[str] = []
    modules = images_of(path)
    for device in DEVICES:
        for driver in drivers:
            for images, sel in zip(modules, selection(path, device, driver)):
                want = expected(images, device, driver)
                got = sel["chosen"]
                if want is None:
                    if got is not None or not sel["error"]:
                        wrong.append(f"{device} {driver}: chose {got}, expected an error")
                elif got is None or not any(got == w or got.startswith(w + " ") for w in want):
                    wrong.append(f"{device} {driver}: chose {got}, expected one of {sorted(want)}")
                # every image gets a reason
                assert len(sel["reasons"]) == len(images), (device, driver, sel)
    return wrong


# ---- artifacts -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def arts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("sel")
    made = {
        # everything the installed toolchain makes from one sm_80 PTX (nvJitLink 13.5)
        "toolchain": [external("p", "8.0", "sm_80",
                               ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100",
                                "sm_100a", "sm_100f", "sm_103f", "sm_120", "sm_121", "ptx"])],
        # arch-specific and family cubins of CUDA 12 toolkits
        "af": [by_hand([cubin("sm_90a", 12080), cubin("sm_100a", 12080),
                        cubin("sm_100f", 12090), cubin("sm_103f", 12090),
                        cubin("sm_120f", 12090), cubin("sm_121a", 12090),
                        cubin("sm_86", 11080)])],
        # PTX only, several ISAs, plain / a / f targets
        "ptx_only": [by_hand([ptx("sm_75", "7.8", 11080), ptx("sm_86", "7.8", 11080),
                              ptx("sm_90a", "8.0", 12000), ptx("sm_100a", "8.7", 12080),
                              ptx("sm_100f", "8.8", 12090), ptx("sm_120", "8.7", 12080)])],
        # ties: plain vs f cubins, plain vs f PTX of one target
        "ties": [by_hand([cubin("sm_100", 12080), cubin("sm_100f", 12090),
                          ptx("sm_100", "8.6", 12080), ptx("sm_100f", "8.8", 12090),
                          ptx("sm_80", "8.0", 12000), ptx("sm_86", "8.0", 12000)])],
        # toolkit majors against the driver (minor-version compatibility)
        "mvc": [by_hand([cubin("sm_90", 13050), cubin("sm_80", 12080),
                         ptx("sm_80", "7.8", 13050)])],
        # two modules in one file, chosen independently
        "two": [external("pa", "8.0", "sm_80", ["sm_80", "ptx"]),
                external("pb", "9.0", "sm_90a", ["sm_90a", "ptx"])],
    }
    paths = {}
    for name, compiled in made.items():
        paths[name] = d / f"{name}.kpack"
        kp.save(compiled, paths[name])
    return paths


# ---- the grid (passes) -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["toolchain", "af", "ptx_only", "ties", "mvc", "two"])
def test_grid_matches_the_rules(arts: dict[str, Path], name: str) -> None:
    assert check_grid(arts[name]) == []


def test_text_and_json_agree(arts: dict[str, Path]) -> None:
    for device in ("sm_86", "sm_90", "sm_103", "sm_121"):
        for driver in ("12.4", "13.0"):
            code, out, _ = run("inspect", arts["toolchain"], "--device", device,
                               "--driver", driver)
            assert code == 0
            (sel,) = selection(arts["toolchain"], device, driver)
            head = f"on {device} (driver CUDA {driver}): loads {sel['chosen']}"
            assert head in out, out[-600:]
            for r in sel["reasons"]:
                assert f"  {r['image']}: {r['reason']}" in out


def test_arch_specific_cubins_only_on_their_exact_chip(arts: dict[str, Path]) -> None:
    reasons = {r["image"]: r["reason"] for r in selection(arts["af"], "sm_103")[0]["reasons"]}
    assert "exactly 10.0" in reasons["cubin sm_100a"]
    reasons = {r["image"]: r["reason"] for r in selection(arts["af"], "sm_120")[0]["reasons"]}
    assert reasons["cubin sm_121a"].startswith("rejected") and "12.1" in reasons["cubin sm_121a"]
    assert selection(arts["af"], "sm_121")[0]["chosen"] == "cubin sm_121a"


def test_family_cubins_cross_minors_upward_only(arts: dict[str, Path]) -> None:
    sel = selection(arts["af"], "sm_103")[0]
    assert sel["chosen"] == "cubin sm_103f"
    reasons = {r["image"]: r["reason"] for r in sel["reasons"]}
    assert reasons["cubin sm_100f"].startswith("usable")
    reasons = {r["image"]: r["reason"] for r in selection(arts["af"], "sm_100")[0]["reasons"]}
    assert reasons["cubin sm_103f"].startswith("rejected") and "10.3" in reasons["cubin sm_103f"]
    # sm_100f does not reach another major (11.0, 12.0)
    for device in ("sm_110", "sm_120"):
        reasons = {r["image"]: r["reason"] for r in selection(arts["af"], device)[0]["reasons"]}
        assert reasons["cubin sm_100f"].startswith("rejected")


def test_ptx_above_the_device_and_arch_specific_ptx(arts: dict[str, Path]) -> None:
    sel = selection(arts["ptx_only"], "sm_103", "12.8")[0]
    assert sel["chosen"].startswith("ptx compute_86")
    reasons = {r["image"].split(" (")[0]: r["reason"] for r in sel["reasons"]}
    assert "newer than the device" in reasons["ptx compute_120"]
    assert "exactly 10.0" in reasons["ptx compute_100a"]
    assert "ISA 8.8" in reasons["ptx compute_100f"] and "12.8" in reasons["ptx compute_100f"]
    assert selection(arts["ptx_only"], "sm_103", "13.0")[0]["chosen"].startswith(
        "ptx compute_100f")


def test_ptx_isa_table_for_released_drivers(tmp_path: Path) -> None:
    """PTX ISA -> CUDA: 8.0 12.0 ... 8.5 12.5 (12.6 stays at 8.5), 8.7 12.8, 8.8 12.9, 9.0 13.0,
    9.1 13.1 (PTX ISA release notes; cuda.bindings.utils table)."""
    wrong = []
    for isa in ("7.8", "8.0", "8.4", "8.5", "8.6", "8.7", "8.8", "9.0", "9.1"):
        path = tmp_path / f"isa{isa}.kpack"
        kp.save([by_hand([ptx("sm_80", isa)])], path)
        for driver in ("11.8", "12.0", "12.4", "12.5", "12.6", "12.8", "12.9", "13.0", "13.1"):
            if driver == "11.8":
                continue   # see test_driver_before_12_0_loads_nothing
            ok = selection(path, "sm_80", driver)[0]["chosen"] is not None
            if ok != (get_min_cuda(isa) <= driver_int(driver)):
                wrong.append((isa, driver, ok))
    assert wrong == []


def test_minor_version_compatibility_of_cubins(arts: dict[str, Path]) -> None:
    assert selection(arts["mvc"], "sm_90", "13.0")[0]["chosen"] == "cubin sm_90"   # 13.5 on 13.0
    sel = selection(arts["mvc"], "sm_90", "12.4")[0]
    reasons = {r["image"].split(" (")[0]: r["reason"] for r in sel["reasons"]}
    assert sel["chosen"].startswith("ptx compute_80")   # PTX gated by its ISA, not 13.5
    assert "13.5" in reasons["cubin sm_90"] and "12.4" in reasons["cubin sm_90"]
    assert selection(arts["mvc"], "sm_86", "12.0")[0]["chosen"] == "cubin sm_80"   # 12.8 on 12.0


def test_no_image_fits_names_device_driver_and_every_image(arts: dict[str, Path]) -> None:
    for driver in ("12.4", None):
        sel = selection(arts["af"], "sm_80", driver)[0]
        assert sel["chosen"] is None
        err = sel["error"]
        assert "sm_80" in err and "8.0" in err
        assert ("12.4" in err) if driver else ("driver not given" in err)
        for target in ("sm_86", "sm_90a", "sm_100a", "sm_100f", "sm_103f", "sm_120f", "sm_121a"):
            assert f"cubin {target}:" in err
    code, out, _ = run("inspect", arts["two"], "--device", "sm_86")
    assert code == 0 and "on sm_86: loads cubin sm_80" in out and "on sm_86: no usable image" in out


@pytest.mark.parametrize("device", ["sm86", "86", "8.6", "sm_8", "sm_1000", "sm_00", "", "sm_86.0"])
def test_malformed_device_is_a_usage_error(arts: dict[str, Path], device: str) -> None:
    code, out, err = run("inspect", arts["af"], "--device", device)
    assert code == 2 and out == "" and "--device" in err


@pytest.mark.parametrize("driver", ["12", "12.4.1", "twelve", "-1", "12040", "1.2e1", "nan", ""])
def test_malformed_driver_is_a_usage_error(arts: dict[str, Path], driver: str) -> None:
    code, out, err = run("inspect", arts["af"], "--device", "sm_86", "--driver", driver)
    assert code == 2 and out == "" and "--driver" in err


# ---- bugs (fail now) -------------------------------------------------------------------------

@pytest.mark.parametrize("isa, driver", [("9.2", "13.2"), ("9.3", "13.3"), ("9.4", "13.4"),
                                         ("9.5", "13.5"), ("9.5", "14.0")])
def test_ptx_isa_of_cuda_13_2_and_later_is_accepted_by_its_driver(
        tmp_path: Path, isa: str, driver: str) -> None:
    """PTX ISA 9.2..9.5 come with CUDA 13.2..13.5 (get_minimal_required_cuda_ver_from_ptx_ver of
    the installed cuda-bindings 13.5; nvJitLink 13.5 here assembles .version 9.5 and refuses 9.6).
    A driver accepts the PTX of its own and every older toolkit."""
    path = tmp_path / "a.kpack"
    kp.save([by_hand([ptx("sm_80", isa)])], path)
    sel = selection(path, "sm_86", driver)[0]
    assert sel["chosen"] == f"ptx compute_80 (ISA {isa})", sel["reasons"]


def test_this_toolchains_isa_9_5_ptx_is_chosen_on_a_13_5_driver(tmp_path: Path) -> None:
    """kp.external of `.version 9.5` PTX (accepted by the installed nvJitLink 13.5): on an sm_120
    under a CUDA 13.5 driver the sm_80 cubin cannot run, and the PTX must be chosen."""
    path = tmp_path / "a.kpack"
    kp.save([external("p", "9.5", "sm_80", ["sm_80", "ptx"])], path)
    sel = selection(path, "sm_120", "13.5")[0]
    assert sel["chosen"] == "ptx compute_80 (ISA 9.5)", sel["reasons"]


def test_driver_before_12_0_loads_nothing(tmp_path: Path) -> None:
    """The runtime loads with cuLibraryLoadData (issue 4 item 2), which CUDA 12.0 introduced
    (cuda-loading.md (a)); a CUDA 11.8 driver has no such entry point, so inspect must not claim
    an image loads there: the answer is the no-image error naming the driver."""
    path = tmp_path / "a.kpack"
    kp.save([by_hand([cubin("sm_86", 11080), ptx("sm_80", "7.8", 11080)])], path)
    sel = selection(path, "sm_86", "11.8")[0]
    assert sel["chosen"] is None and "11.8" in sel["error"], sel


@pytest.mark.parametrize("device", ["sm_100f", "sm_120f"])
def test_family_name_as_device_is_refused_or_normalised(arts: dict[str, Path],
                                                        device: str) -> None:
    """A device is a compute capability; `--device sm_100f` printed "on sm_100f: loads cubin
    sm_100a" (a family target cannot load an arch-specific cubin). compute_103 is already
    normalised to sm_103; a family suffix must be a usage error or normalised the same way."""
    code, out, err = run("inspect", arts["af"], "--device", device, "--json")
    if code == 2:
        assert "--device" in err
        return
    assert code == 0
    assert json.loads(out)["modules"][0]["selection"]["device"] == device[:-1]
