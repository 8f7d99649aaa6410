"""Second adversarial review: what kp.save writes must load (writers refuse what readers
refuse), kp.load's trusted_keys given one bare key, and kp.external's cubin reader on hostile
ELF files (linear work, bounded names)."""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import CompileError
from kernelpack.external import cubin_entries
from kernelpack.summary import (Arg, Compiled, Constraint, Image, KernelSummary, Launch, Module,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent))
import kp_samples  # noqa: E402


def one(program: str = "p", tensor: str = "x", module: str = "m", kernel: str = "k",
        extra_kernels: tuple[str, ...] = (), message: str = "", toolchain: str = "t",
        images: tuple[Image, ...] | None = None) -> Compiled:
    s = KernelSummary(program, (Tensor(tensor, kp.f32, ("n",)),),
                      (Variant((Launch(kernel, module, (1,), (1,), (Arg.buffer(tensor),)),)),),
                      (Constraint(kp.sym("n") >= 0, message),))
    images = images or (Image("cubin", "sm_80", b"\x7fELF", toolchain),)
    return Compiled(s, (Module(module, (*extra_kernels, kernel), images),))


@pytest.mark.parametrize("compiled, match", [
    # a module's other kernels, its image count and free text had no check at all
    (one(extra_kernels=("a" * 2000,)), r"Body\.modules\[0\] \(module 'm'\)\.kernels\[0\]: "
                                       r"string of 2000 bytes"),
    (one(extra_kernels=tuple(f"k{i}" for i in range(4096))),
     r"\.kernels: vector of 4097 elements exceeds the limit 4096"),
    (one(extra_kernels=("",)), r"module 'm': kernel names must be non-empty"),
    (one(images=tuple(Image("cubin", f"sm_{major}{minor}", b"\x7fELF")
                      for major in range(10, 17) for minor in range(10))),
     r"\.images: vector of 70 elements exceeds the limit 64"),
    (one(message="m" * 70_000), r"\.constraints\[0\]\.message: string of 70000 bytes exceeds "
                                r"the limit 65536"),
    (one(toolchain="t" * 70_000), r"\.images\[0\]\.toolchain: string of 70000 bytes"),
])
def test_save_refuses_what_load_would_refuse(compiled: Compiled, match: str,
                                             tmp_path: Path) -> None:
    """Was: each of these was written, and every reader then refused the file."""
    path = tmp_path / "out.kpack"
    with pytest.raises(ValueError, match="the artifact would not load, so it is not written: "
                                         ".*" + match):
        kp.save([compiled], path)
    assert not path.exists()


@pytest.mark.parametrize("field", ["tensor", "program", "module", "kernel"])
def test_names_over_the_format_limit_in_utf8_bytes_are_refused_where_given(field: str) -> None:
    """The format limits names in UTF-8 bytes; the summary checked characters until review 27,
    so 600 "é" (1200 bytes) were taken and only kp.save refused them (it still would)."""
    with pytest.raises(ValueError, match="at most 1024 UTF-8 bytes"):
        one(**{field: "é" * 600})
    one(**{field: "é" * 512})  # 1024 bytes: at the limit


def test_save_at_the_limits_still_loads() -> None:
    """The check refuses only what a reader refuses: 1024-byte names, 4096 kernels, 64 images."""
    c = one(tensor="x" * 1024, extra_kernels=tuple(f"k{i}" for i in range(4095)),
            images=tuple(Image("cubin", f"sm_{major}{minor}", b"\x7fELF")
                         for major in range(10, 17) for minor in range(10))[:64])
    pack = kp.load(kp.save(c))
    pack.verify()
    assert len(pack.modules["m"].kernels) == 4096 and len(pack.modules["m"].images) == 64


# ---- trusted_keys ------------------------------------------------------------------------------
def test_trusted_keys_takes_one_bare_key_object() -> None:
    """Was: TypeError 'Ed25519PublicKey' object is not iterable."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    data = kp.save(kp_samples.tiny(), sign_with=key)
    assert kp.load(data, trusted_keys=key.public_key()).signature.verified
    with pytest.raises(ValueError, match=r"not an ed25519 public key: .*\(got 123\)"):
        kp.load(data, trusted_keys=123)
    with pytest.raises(ValueError, match=r"a private key was given where a public key is "
                                         r"trusted: pass key\.public_key\(\)"):
        kp.load(data, trusted_keys=[key])


# ---- kp.external's cubin reader ----------------------------------------------------------------
def _elf(sections: list[tuple], blob: bytes) -> bytes:
    """A 64-bit little-endian CUDA ELF (sm_90): header, ``blob`` at 64, section headers."""
    header = bytearray(64)
    header[:4], header[4], header[5], header[8] = b"\x7fELF", 2, 1, 8
    struct.pack_into("<H", header, 18, 190)
    struct.pack_into("<Q", header, 40, 64 + len(blob))
    struct.pack_into("<I", header, 48, 90 << 8)
    struct.pack_into("<HH", header, 58, 64, len(sections))
    return bytes(header) + blob + b"".join(struct.pack("<IIQQQQIIQQ", *s) for s in sections)


def _symbol(name_offset: int) -> bytes:
    return struct.pack("<IBBHQQ", name_offset, 2, 0x10, 0, 0, 0)  # FUNC, CUDA entry


def test_cubin_symbol_tables_may_not_overlap() -> None:
    """Was: 1000 section headers naming one 240 KB symbol table took 0.7 s (quadratic)."""
    strtab, symtab = b"\0k\0\0", _symbol(1) + bytes(24 * 9999)
    sections = [(0, 3, 0, 0, 64, len(strtab), 0, 0, 1, 0)]
    sections += [(0, 2, 0, 0, 64 + len(strtab), len(symtab), 0, 0, 8, 24)] * 1000
    data = _elf(sections, strtab + symtab)
    start = time.perf_counter()
    with pytest.raises(CompileError, match="symbol tables overlap"):
        cubin_entries(data)
    assert time.perf_counter() - start < 0.1
    assert cubin_entries(_elf(sections[:2], strtab + symtab)) == ["k"]


def test_cubin_entry_names_are_read_up_to_the_name_limit() -> None:
    """Was: 2000 symbols naming one 500 KB string made 1 GB of names. A name longer than any
    entry kp.external can launch is skipped; the others are still found."""
    strtab = b"\0" + b"a" * 500_000 + b"\0ok\0"
    symtab = _symbol(1) * 2000 + _symbol(len(strtab) - 3)
    sections = [(0, 3, 0, 0, 64, len(strtab), 0, 0, 1, 0),
                (0, 2, 0, 0, 64 + len(strtab), len(symtab), 0, 0, 8, 24)]
    start = time.perf_counter()
    assert cubin_entries(_elf(sections, strtab + symtab)) == ["ok"]
    assert time.perf_counter() - start < 0.5
    unterminated = b"\0" + b"a" * 100
    sections = [(0, 3, 0, 0, 64, len(unterminated), 0, 0, 1, 0),
                (0, 2, 0, 0, 64 + len(unterminated), 24, 0, 0, 8, 24)]
    with pytest.raises(CompileError, match="unterminated symbol name"):
        cubin_entries(_elf(sections, unterminated + _symbol(1)))


@pytest.mark.parametrize("field, value, match", [
    ("toolchain", None, r"toolchain must be a str \(got None\)"),
    ("cuda_version", 12.5, r"cuda_version must be an int such as 12080 \(got 12\.5\)"),
    ("cuda_version", True, r"cuda_version must be an int such as 12080 \(got True\)"),
    ("ptx_isa", (8,), r"ptx_isa must be None or \(major, minor\) ints \(got \(8,\)\)"),
    ("ptx_isa", (8.0, 0), r"ptx_isa must be None or \(major, minor\) ints"),
])
def test_save_names_an_image_field_of_the_wrong_type(field: str, value: object,
                                                     match: str) -> None:
    """Was: "non-string passed to CreateString", struct's "required argument is not an
    integer" or a missing CreateVersion argument, naming neither the image nor the field."""
    image = Image("cubin", "sm_80", b"\x7fELF", **{field: value})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"module 'm' image sm_80: " + match):
        kp.save([one(images=(image,))])


def test_a_source_path_must_be_a_regular_file(tmp_path: Path) -> None:
    """Was: ptx="/dev/zero" read forever (memory exhaustion); a FIFO blocked for a writer."""
    import os

    from kernelpack.external_images import read_source

    fifo = tmp_path / "kernel.ptx"
    os.mkfifo(fifo)
    # the directory first: where this check is missing it fails at once, before the FIFO blocks
    for path in (tmp_path, fifo, Path("/dev/zero")):
        with pytest.raises(ValueError, match=r"ptx: '.*' is not a regular file"):
            read_source(path, "ptx")
    real = tmp_path / "real.ptx"
    real.write_bytes(b".version 8.0\n\0\0")
    assert read_source(real, "ptx") == b".version 8.0\n"


@pytest.mark.parametrize("count, loop", [(-1, "i"), ((1 << 20) + 1, "i"), (1 << 40, "")])
def test_external_refuses_a_constant_count_no_plan_accepts(count: int, loop: str) -> None:
    """Was: accepted, saved, and then every plan failed ("count = -1, expected 0..1048576"),
    where constant grids, blocks and shared memory are refused at declaration."""
    ptx = (Path(__file__).resolve().parents[1] / "examples" / "axpy.ptx").read_text()
    with pytest.raises(ValueError, match=rf"count = {count}: expected 0\.\.1048576 repeats"):
        kp.external("axpy", "axpy", params=[kp.Tensor("x", kp.f32, ["n"])], grid=1, block=1,
                    ptx=ptx, targets=["sm_80"], args=["x"], count=count, loop=loop)
