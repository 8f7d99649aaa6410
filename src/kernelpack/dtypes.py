"""Element types known to kernelpack.

A :class:`DType` is a plain value: its ``code`` is what the artifact stores (the ``DType`` enum of
``schema/kernelpack.fbs``), its ``name`` matches NumPy/PyTorch spelling so interop needs no table
per framework. Complex types are stored interleaved (real, imag), as NumPy and PyTorch do.
"""

from __future__ import annotations

import operator
import sys
from ._frozen import frozen_dataclass

__all__ = [
    "DType",
    "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
    "c64", "c128",
    "ALL_DTYPES", "dtype_from_code", "as_dtype", "is_numpy_bool", "strict_index",
]


@frozen_dataclass
class DType:
    """An element type: ``kind`` is one of ``b`` (bool), ``i`` (signed), ``u`` (unsigned),
    ``f`` (float), ``c`` (complex)."""

    name: str
    code: int
    itemsize: int
    kind: str

    def __init__(self, name: str, code: int, itemsize: int, kind: str) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "itemsize", itemsize)
        object.__setattr__(self, "kind", kind)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_complex(self) -> bool:
        return self.kind == "c"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("i", "u")

    @property
    def is_signed(self) -> bool:
        return self.kind in ("i", "f", "c")

    @property
    def real(self) -> "DType":
        """The component type of a complex dtype (itself for real dtypes)."""
        if self.kind != "c":
            return self
        return float32 if self is complex64 else float64

    def __eq__(self, other: object) -> bool:
        """Equal to the same kernelpack dtype, and to NumPy's and PyTorch's spelling of it
        (``x.dtype == np.float32`` in a fusion written like NumPy code must not be silently
        False). Strings are not compared: ``"float"`` means float32 to PyTorch and float64
        to NumPy. The hash stays the dataclass's, as NumPy's dtypes do: mixed dict keys are
        told apart by hash, never conflated."""
        if isinstance(other, DType):
            return (self.name, self.code, self.itemsize, self.kind) == (
                other.name, other.code, other.itemsize, other.kind)
        module = (other if isinstance(other, type) else type(other)).__module__ or ""
        if module.partition(".")[0] not in ("numpy", "torch"):
            return NotImplemented  # type: ignore[return-value]
        if getattr(other, "byteorder", "=") == ">":  # a big-endian NumPy dtype
            return False
        try:
            return as_dtype(other) is self
        except TypeError:
            return False

    def __call__(self, value: object = None) -> object:
        """Refused with a pointer to what works: ``kp.f32(1e-5)`` reads like NumPy's
        ``np.float32(1e-5)``, but a kernelpack dtype is a type tag, not a scalar type (was
        "'DType' object is not callable")."""
        raise TypeError(f"kp.{self.name} is a dtype, not a scalar type: write the number "
                        f"itself ({value!r} takes the dtype of the tensor it meets, as a NumPy "
                        f"scalar does in a fusion), or x.astype(kp.{self.name}) to convert a "
                        f"tensor")

    def __repr__(self) -> str:
        return f"kp.{self.name}"

    def __str__(self) -> str:
        return self.name


# The codes are part of the file format: never renumber, only append.
bool_ = DType("bool", 1, 1, "b")
int8 = DType("int8", 2, 1, "i")
int16 = DType("int16", 3, 2, "i")
int32 = DType("int32", 4, 4, "i")
int64 = DType("int64", 5, 8, "i")
uint8 = DType("uint8", 6, 1, "u")
uint16 = DType("uint16", 7, 2, "u")
uint32 = DType("uint32", 8, 4, "u")
uint64 = DType("uint64", 9, 8, "u")
float16 = DType("float16", 10, 2, "f")
bfloat16 = DType("bfloat16", 11, 2, "f")
float32 = DType("float32", 12, 4, "f")
float64 = DType("float64", 13, 8, "f")
complex64 = DType("complex64", 14, 8, "c")
complex128 = DType("complex128", 15, 16, "c")

f16, bf16, f32, f64 = float16, bfloat16, float32, float64
i8, i16, i32, i64 = int8, int16, int32, int64
u8, u16, u32, u64 = uint8, uint16, uint32, uint64
c64, c128 = complex64, complex128

ALL_DTYPES: tuple[DType, ...] = (
    bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64,
    float16, bfloat16, float32, float64, complex64, complex128,
)
_BY_CODE = {d.code: d for d in ALL_DTYPES}
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NAME.update({"bool_": bool_, "f16": f16, "bf16": bf16, "f32": f32, "f64": f64, "i8": i8,
                 "i16": i16, "i32": i32, "i64": i64, "u8": u8, "u16": u16, "u32": u32, "u64": u64,
                 "c64": c64, "c128": c128, "half": float16, "float": float32, "double": float64})


def dtype_from_code(code: int) -> DType | None:
    """The dtype stored as ``code`` in an artifact, or None for an unknown code."""
    return _BY_CODE.get(code)


_SWAPPED = ">" if sys.byteorder == "little" else "<"  # a NumPy dtype's non-native byteorder


def as_dtype(value: object) -> DType:
    """Accept a :class:`DType`, a name (``"float32"``, ``"f32"``), or anything whose ``str()``
    or ``.name`` is such a name (NumPy dtypes, ``torch.float32``), or a NumPy scalar type
    (``np.float32``, ``np.bool_``: its ``__name__``)."""
    if isinstance(value, DType):
        return value
    if getattr(value, "byteorder", "=") == _SWAPPED:  # a NumPy dtype of the other byte order
        raise TypeError(f"not a kernelpack dtype: {value!r} is byte-swapped (the device reads "
                        f"native byte order; use the dtype's native form, e.g. "
                        f"dtype.newbyteorder('='))")
    if isinstance(value, type) and getattr(value, "__module__", None) == "numpy":
        name = value.__name__
        name = "bool" if name == "bool_" else name
    else:
        name = value if isinstance(value, str) else getattr(value, "name", None) or str(value)
    name = str(name).removeprefix("torch.")
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TypeError(f"not a kernelpack dtype (got {value!r})") from None


def is_numpy_bool(value: object) -> bool:
    """Whether ``value`` is a ``numpy.bool_`` (what a NumPy comparison gives for a flag),
    without importing NumPy. Integer checks refuse it (:func:`strict_index`); scalars, plans
    and yes/no fields take it as 0/1."""
    cls = value.__class__
    return cls.__name__ in ("bool_", "bool") and cls.__module__ == "numpy"  # NumPy 1 / 2


def strict_index(value: object) -> int:
    """``operator.index(value)`` for a size, an axis, a step or a device: TypeError for a
    bool, Python's or NumPy's, which is never the number a caller meant (a flag or a mask in
    the wrong place). NumPy before 2.3 gives ``np.bool_`` a deprecated ``__index__`` (that
    is every NumPy of Python 3.10), so without this check ``np.True_`` would be a size 1
    there and a TypeError on a newer NumPy."""
    if value.__class__ is bool or is_numpy_bool(value):
        raise TypeError(f"expected an integer, not a bool (got {value!r})")
    return operator.index(value)  # type: ignore[arg-type]
