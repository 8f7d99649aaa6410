"""Review round 11: the C verifier (``_verify.c``) under hostile callers and small stacks.

Each test pins one finding of the review: Python code run in the middle of ``verify_fast``
(an ``__index__`` of a description item, a buffer exporter's ``__buffer__``) could replace the
cached description and made the C side write or read past its arrays; subclasses of bytes
were read as bytes by C but through their own ``__len__``/``__ne__`` by the Python walker, so
C accepted what Python rejected; and the recursion was bounded only by the caller's
``max_depth``. The stack tests run in a subprocess, so that a crash is a failure, not the end
of the test run.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelpack import _verify_native, verify
from kernelpack.errors import FormatError
from kernelpack.limits import FILE_IDENTIFIER, MAX_NAME_LENGTH

import kp_handwritten

FAST = _verify_native.load() if _verify_native.walker is None else _verify_native.walker
pytestmark = pytest.mark.skipif(not FAST, reason="kernelpack.runtime._launch built without "
                                                 "_verify.c (python setup.py build_ext)")
LIMITS = (verify.MAX_TABLE_DEPTH, MAX_NAME_LENGTH, verify.MAX_FILE_SIZE, verify.BODY_ALIGNMENT)
SRC = str(Path(verify.__file__).resolve().parents[1])
TESTS = str(Path(__file__).resolve().parent)


def described() -> tuple[dict[str, int], tuple]:
    _, index, tables = _verify_native.tables(verify._PLANS)
    return index, tables


def c_verdict(buf: object, root_type: str, ident: object, tables: object = None) -> int:
    index, real = described()
    return FAST(buf, index[root_type], ident, real if tables is None else tables, *LIMITS)


def py_verdict(buf: object, root_type: str, ident: bytes | None) -> int | None:
    try:
        return verify.verify_buffer(buf, root_type, identifier=ident,  # type: ignore[arg-type]
                                    _use_c=False)
    except FormatError:
        return None


# ---- Python code run inside verify_fast cannot corrupt the cached description -------------
OTHER = (((0, 4, 4, 0, 0),),)  # a one-table, one-field description


def test_an_index_method_in_the_description_cannot_swap_it_mid_conversion() -> None:
    # Before: PyLong_AsLongLong called __index__, which replaced the cached description with
    # OTHER; the conversion went on writing tables[3]'s fields into OTHER's 1-entry array
    # (AddressSanitizer: heap-buffer-overflow in load_desc).
    data = kp_handwritten.artifact()
    index, tables = described()

    class Sneaky:
        def __index__(self) -> int:
            FAST(b"\0" * 16, 0, None, OTHER, *LIMITS)
            return 5

    hostile = tuple(tuple(f if (ti, fi) != (3, 1) else f[:4] + (Sneaky(),)
                          for fi, f in enumerate(t)) for ti, t in enumerate(tables))
    with pytest.raises(TypeError, match=r"tables\[3\]\[1\]\[4\] must be an int"):
        FAST(data, index["Pack"], FILE_IDENTIFIER, hostile, *LIMITS)
    assert c_verdict(data, "Pack", FILE_IDENTIFIER) == py_verdict(data, "Pack", FILE_IDENTIFIER)


def test_a_repr_in_an_error_message_cannot_swap_the_description() -> None:
    # A guard for the conversion built in locals: the error message's %R runs __repr__,
    # which converts OTHER (and so replaces the cache) while the failing conversion still
    # holds its own half-built arrays; those must be freed, not the new cache.
    data = kp_handwritten.artifact()
    index, tables = described()
    calls = []

    class Loud:
        def __repr__(self) -> str:
            calls.append(FAST(b"\0" * 16, 0, None, OTHER, *LIMITS))
            return "Loud()"

    with pytest.raises(TypeError, match=r"tables\[1\] must be a tuple \(got Loud\(\)\)"):
        FAST(data, index["Pack"], FILE_IDENTIFIER, (tables[0], Loud()) + tables[2:], *LIMITS)
    assert calls == [-1]  # the inner call ran, with OTHER
    # the cache now holds OTHER (the inner call's): the real description is converted again
    assert c_verdict(data, "Pack", FILE_IDENTIFIER) == py_verdict(data, "Pack", FILE_IDENTIFIER)
    # and a failed conversion leaves the cached one in place: still answered the same
    with pytest.raises(ValueError, match="inconsistent"):
        FAST(data, index["Pack"], FILE_IDENTIFIER, (((8, 4, 4, 5, 0),),), *LIMITS)
    assert c_verdict(data, "Pack", FILE_IDENTIFIER) == py_verdict(data, "Pack", FILE_IDENTIFIER)


# ---- only exact bytes / bytearray / memoryview are read by C -------------------------------
class ShortBytes(bytes):
    def __len__(self) -> int:
        return 3


class ShortBytearray(bytearray):
    def __len__(self) -> int:
        return 3


class NeverEqual(bytes):
    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = bytes.__hash__


class Exporter:
    """A buffer whose export runs Python code (3.12's __buffer__): it replaces the cached
    description between the C side's check of root_table and its walk."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __buffer__(self, flags: int) -> memoryview:
        FAST(b"\0" * 16, 0, None, OTHER, *LIMITS)
        return memoryview(self.data)

    def __release_buffer__(self, view: memoryview) -> None:
        pass


def test_subclasses_are_left_to_the_python_walker() -> None:
    # Before: C read the bytes and accepted (24); the Python walker saw len() == 3 or an
    # identifier that never compares equal, and rejected.
    data = kp_handwritten.artifact()
    root = py_verdict(data, "Pack", FILE_IDENTIFIER)
    assert root is not None
    for buf in (ShortBytes(data), ShortBytearray(data)):
        assert c_verdict(buf, "Pack", FILE_IDENTIFIER) == -2
        with pytest.raises(FormatError, match="3 bytes, expected at least 8"):
            verify.verify_buffer(buf, "Pack", identifier=FILE_IDENTIFIER)
    assert c_verdict(data, "Pack", NeverEqual(FILE_IDENTIFIER)) == -2
    with pytest.raises(FormatError, match="file identifier"):
        verify.verify_buffer(data, "Pack", identifier=NeverEqual(FILE_IDENTIFIER))
    # the exporter: -2 before any of its code runs (3.12: the walk used OTHER with
    # root_table 0..12 checked against the real description: heap-buffer-overflow)
    assert c_verdict(Exporter(data), "Pack", FILE_IDENTIFIER) == -2
    assert c_verdict(data, "Pack", FILE_IDENTIFIER) == root
    # the types kp.load passes are still answered by C
    for buf in (data, bytearray(data), memoryview(data), memoryview(bytearray(data)),
                memoryview(ShortBytes(data))):  # a view's len() is its buffer's
        assert c_verdict(buf, "Pack", FILE_IDENTIFIER) == root


# ---- C stack: bounded recursion, small thread stacks ---------------------------------------
def run_isolated(code: str) -> str:
    """Run ``code`` in a fresh interpreter: a stack overflow there is a failed test here."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120,
                          env={"PYTHONPATH": f"{SRC}:{TESTS}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout


def chain(levels: int) -> bytes:
    """``levels`` tables of a self-nesting type (one field: a table of the same type), each
    the child of the one before, as a root-at-4 buffer. The C side's description may nest
    recursively; the schema's does not, so only the C walker is asked."""
    head = struct.pack("<I", 16)                         # root table at 16
    vtables = struct.pack("<HHH", 6, 8, 4) + struct.pack("<HHH", 4, 4, 0)  # at 4 and 10
    body = bytearray()
    for i in range(levels):
        pos = 16 + 8 * i
        if i + 1 < levels:
            body += struct.pack("<iI", pos - 4, 4)       # vtable at 4, child right after
        else:
            body += struct.pack("<i", pos - 10) + bytes(4)  # leaf: vtable at 10, no field
    return head + vtables + bytes(body)


def test_recursion_is_bounded_whatever_max_depth_is_passed() -> None:
    # Before: with a self-nesting description and a huge max_depth the recursion followed
    # the buffer (one level per 8 bytes, ~200 bytes of C stack each): a 1.6 MB buffer
    # overflowed an 8 MiB stack, 2000 levels a 256 KiB thread stack.
    out = run_isolated("""
        import threading
        from test_review11_verify_c import FAST, chain
        REC = (((8, 4, 4, 0, 0),),)
        verdicts = {}
        def ask(levels):
            verdicts[levels] = FAST(chain(levels), 0, None, REC, 10**9, 1024, 2**31 - 1, 8)
        threading.stack_size(256 * 1024)
        for levels in (1, 33, 34, 2000):
            t = threading.Thread(target=ask, args=(levels,))
            t.start()
            t.join()
        ask(200_000)  # the main thread's stack
        print(verdicts)
    """)
    # depth 0..32 are walked (root at depth 0); deeper is rejected, i.e. left to Python
    assert out.strip() == "{1: 16, 33: 16, 34: -1, 2000: -1, 200000: -1}"


def test_verification_in_threads_with_small_stacks() -> None:
    # The walk's C stack: a 4 KiB bitmap for buffers up to 128 KiB (the heap above), ~200
    # bytes per table level. 32 KiB is the smallest stack threading allows (52 KiB from 3.14).
    out = run_isolated("""
        import threading
        from kernelpack import verify
        from kernelpack.limits import FILE_IDENTIFIER
        import kp_handwritten
        from test_review11_verify_c import c_verdict, py_verdict
        sizes = {}
        for kernels, pad in ((1, 0), (3000, 20), (3000, 30), (4000, 200)):
            # both sides of 128 KiB, and ~1 MB
            data = kp_handwritten.artifact(launch_kernel="k00000" + "x" * pad, kernels=tuple(
                f"k{i:05d}" + "x" * pad for i in range(kernels)))
            sizes[len(data)] = data
        results = []
        def work(data):
            results.append(c_verdict(data, "Pack", FILE_IDENTIFIER)
                           == py_verdict(data, "Pack", FILE_IDENTIFIER) > 0)
        for kib in (32, 64, 128, 256):
            try:
                threading.stack_size(kib * 1024)
            except ValueError:  # Python 3.14's smallest is 52 KiB (53248 bytes) on Linux
                threading.stack_size(52 * 1024)
            for data in sizes.values():
                t = threading.Thread(target=work, args=(data,))
                t.start()
                t.join()
        print(sorted(sizes), all(results), len(results))
    """)
    sizes, ok, count = out.rsplit(" ", 2)
    assert (ok, count.strip()) == ("True", "16")
    lengths = eval(sizes)  # noqa: S307 - our own subprocess's list of ints
    assert min(lengths) < 128 * 1024 < max(lengths) and max(lengths) > 512 * 1024
