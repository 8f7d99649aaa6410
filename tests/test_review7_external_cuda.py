"""Review 7, kp.external as a user bringing CUDA C / PTX: the "ptx" fallback of arch-specific
targets, sources with a UTF-8 byte order mark, one-line ``#include`` sources, headers given as
text (``headers=``), and ``nvrtc_options=None``. NVRTC and nvJitLink need no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import CompileError
from kernelpack.targets import Arch

pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings' NVRTC module missing")


def _nvrtc_or_skip() -> None:
    from kernelpack.toolchain import nvrtc

    try:
        nvrtc.toolchain_id()
    except CompileError as exc:
        pytest.skip(f"NVRTC missing (kernelpack[compile]): {exc}", allow_module_level=True)


_nvrtc_or_skip()

SRC = 'extern "C" __global__ void k(float* x, unsigned n) { if (threadIdx.x < n) x[0] = 1; }\n'
USES_HEADER = ('#include "defs.h"\n'
               'extern "C" __global__ void k(float* x, unsigned n) { x[0] = SCALE; }\n')


def _params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"], role="inout"), kp.Scalar("n32", kp.u32, value="n")]


def _k(**kw: object) -> kp.Compiled:
    kw.setdefault("targets", ["sm_80"])
    return kp.external("p", "k", _params(), kp.cdiv("n", 128), 128, **kw)  # type: ignore[arg-type]


def test_ptx_fallback_of_an_arch_specific_lowest_target_runs_on_newer_gpus() -> None:
    # PTX for compute_90a JIT-compiles on an sm_90 only: as the "ptx" fallback of targets
    # that also name sm_100 it must be compute_90, as llvm_ir= already made it.
    images = _k(cuda=SRC, targets=["sm_90a", "sm_100", "ptx"]).modules[0].images
    (ptx,) = [i for i in images if i.kind == "ptx"]
    assert ptx.arch == Arch(9, 0) and b".target sm_90\n" in ptx.data
    assert sorted(i.arch.sm for i in images if i.kind == "cubin") == ["sm_100", "sm_90a"]
    # one architecture, asked for with its suffix: the PTX keeps it (nothing else to run on)
    (only,) = [i for i in _k(cuda=SRC, targets=["sm_90a", "ptx"]).modules[0].images
               if i.kind == "ptx"]
    assert only.arch == Arch(9, 0, "a")


def test_sources_with_a_utf8_byte_order_mark_compile(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    plain = _k(cuda=SRC, targets=["sm_80", "ptx"])
    path = tmp_path / "k.cu"
    path.write_bytes(bom + SRC.encode())
    for source in (bom + SRC.encode(), "\ufeff" + SRC, path):
        assert _k(cuda=source, targets=["sm_80", "ptx"]).modules == plain.modules
    ptx = plain.modules[0].images[-1].data
    from_ptx = _k(ptx=bom + ptx, targets=["sm_80", "ptx"])
    assert from_ptx.modules[0].images[-1].data == ptx  # the mark is not stored either


def test_a_one_line_include_is_source_text_not_a_path(tmp_path: Path) -> None:
    (tmp_path / "defs.h").write_text("#define SCALE 2\n" + SRC)
    c = _k(cuda='#include "defs.h"', nvrtc_options=[f"-I{tmp_path}"])
    assert c.modules[0].kernels == ("k",)


def test_headers_given_as_text() -> None:
    c2 = _k(cuda=USES_HEADER, headers={"defs.h": "#define SCALE 2.0f\n"}, targets=["sm_80", "ptx"])
    c3 = _k(cuda=USES_HEADER, headers={"defs.h": b"#define SCALE 3.0f\n"},
            targets=["sm_80", "ptx"])
    assert c2.modules[0].images[-1].data != c3.modules[0].images[-1].data
    # several headers, in any dict order: the same bytes
    src = '#include "a.h"\n' + USES_HEADER
    one = _k(cuda=src, headers={"a.h": "// a\n", "defs.h": "#define SCALE 2.0f\n"})
    two = _k(cuda=src, headers={"defs.h": "#define SCALE 2.0f\n", "a.h": "// a\n"})
    assert kp.save([one]) == kp.save([two])
    with pytest.raises(CompileError, match=r"defs\.h") as info:  # without it: NVRTC's log
        _k(cuda=USES_HEADER)
    assert "p.cu(1)" in str(info.value)  # the line number reaches the user


@pytest.mark.parametrize("headers, exc, match", [
    ("defs.h", TypeError, r"headers must be a dict"),
    ({1: "x"}, TypeError, r"headers: names must be strings"),
    ({" ": "x"}, ValueError, r"headers: ' ' is not a usable include name"),
    ({"d.h": 5}, TypeError, r"headers\['d\.h'\] must be text"),
    ({"d.h": "a\0b"}, ValueError, r"headers\['d\.h'\] contains a NUL byte"),
])
def test_bad_headers_are_named(headers: object, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _k(cuda=USES_HEADER, headers=headers)


def test_headers_need_cuda() -> None:
    with pytest.raises(TypeError, match=r"headers= applies only to cuda= \(got it with ptx=\)"):
        _k(ptx=".version 8.0\n.target sm_80\n", headers={"d.h": ""})


def test_cache_key_covers_header_text(tmp_path: Path) -> None:
    cache = kp.Cache(path=tmp_path / "cache")
    args = ("p", "k", _params(), 1, 128)
    a = cache.external(*args, cuda=USES_HEADER, headers={"defs.h": "#define SCALE 2.0f\n"},
                       targets=["sm_80"])
    b = cache.external(*args, cuda=USES_HEADER, headers={"defs.h": "#define SCALE 3.0f\n"},
                       targets=["sm_80"])
    assert a.origin == b.origin == "compiled"  # a changed header is no stale hit
    assert a.modules[0].images != b.modules[0].images


@pytest.mark.parametrize("options", [None, 3])
def test_nvrtc_options_that_are_not_a_list_are_named(options: object) -> None:
    with pytest.raises(TypeError, match=r"nvrtc_options must be a list of flags"):
        _k(cuda=SRC, nvrtc_options=options)


@pytest.mark.parametrize("flag", ["-lineinfo", "--generate-line-info"])
def test_line_info_does_not_record_the_current_directory(
        flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # NVRTC prefixed the relative program name with the cwd (.file 1 "/home/me/p.cu"), so
    # the same call gave other bytes in another directory
    saved = []
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        c = _k(cuda=SRC, nvrtc_options=[flag], targets=["sm_80", "ptx"])
        assert str(tmp_path).encode() not in c.modules[0].images[-1].data
        saved.append(kp.save([c]))
    assert saved[0] == saved[1]
    assert b'.file\t1 "/p.cu"' in _k(cuda=SRC, nvrtc_options=[flag], targets=["compute_80"]
                                     ).modules[0].images[0].data
