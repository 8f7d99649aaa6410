"""Caller scalars → the values a kernel parameter slot takes.

Python ``int``/``float`` (and anything with ``__index__``/``__float__``, such as NumPy scalars)
are converted to the parameter's dtype with range checks, so a value that does not fit is a
:class:`~kernelpack.errors.ConstraintError` naming the parameter instead of a silently wrapped
integer. A float given for an integer parameter is a TypeError: truncating it is a bug.
"""

from __future__ import annotations

import math
import operator
import struct
from typing import Any

from ..dtypes import DType, is_numpy_bool
from ..errors import ConstraintError

__all__ = ["convert_scalar", "bfloat16_bits"]

_F32_MAX = 3.4028234663852886e38
_F16_MAX = 65504.0
_BF16_MAX = 3.3895313892515355e38
#: NumPy dtype kinds whose values are no real number: complex, timedelta, datetime
_NOT_REAL = ("c", "m", "M")
_f32 = struct.Struct("<f")
_f16 = struct.Struct("<e")
_u32 = struct.Struct("<I")


def bfloat16_bits(value: float) -> int:
    """The bfloat16 bit pattern of ``value`` (round to nearest even, NaN kept quiet)."""
    if math.isnan(value):
        return 0x7FC0
    bits = _u32.unpack(_f32.pack(value))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _shown(v: int) -> str:
    """``v`` for a message: its digits, or its bit length when it is too long to print
    (``str()`` of an int past 4300 digits raises ValueError in Python 3.11+)."""
    if v.bit_length() > 256:
        return f"an int of {v.bit_length()} bits{' (negative)' if v < 0 else ''}"
    return str(v)


def _overflowed(value: Any, v: float) -> bool:
    """Whether ``float(value)`` gave ``v = ±inf`` for a finite ``value`` (a ``np.longdouble``
    or ``Decimal`` beyond float64 converts to inf without an error)."""
    if not math.isinf(v) or value.__class__ is float:
        return False
    try:
        # (the class's own __eq__, called unbound: mypy binds type's to the class)
        same = type(value).__eq__(value, v)  # type: ignore[call-arg]
        if same is NotImplemented:
            same = float.__eq__(v, value)
        if same is NotImplemented:  # a type that does not compare with floats: trust float()
            return False
        return not bool(same)
    except Exception:  # noqa: BLE001 - a comparison that fails: trust float() as before
        return False


def _text(value: Any) -> str:
    """A short ``str(value)`` for a message."""
    try:
        text = str(value)
    except Exception:  # noqa: BLE001
        text = f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def _narrow(v: float, dtype: DType, name: str, program: str) -> float | int:
    """``v`` for a float16/float32/bfloat16 parameter. Rounding is to nearest (as NumPy's
    casts and the C fast path's ``(float)x`` do), so a value just above the largest finite
    number that rounds down to it is accepted, and only a finite value that would round to
    inf is refused."""
    try:
        if dtype.name == "float32":
            if abs(v) > _F32_MAX and math.isfinite(v):
                _f32.pack(v)  # OverflowError when it rounds to inf
        elif dtype.name == "float16":
            if abs(v) > _F16_MAX and math.isfinite(v):
                _f16.pack(v)
        elif dtype.name == "bfloat16":
            if abs(v) > _BF16_MAX and math.isfinite(v):
                _f32.pack(v)
                if bfloat16_bits(v) & 0x7FFF == 0x7F80:
                    raise OverflowError
            return bfloat16_bits(v)
    except OverflowError:
        raise ConstraintError(f"{program}: scalar {name!r} = {v} overflows {dtype}") from None
    return v


def convert_scalar(value: Any, dtype: DType, rng: tuple[int, int] | None, name: str,
                   program: str) -> Any:
    """Convert ``value`` for a scalar parameter ``name`` of ``dtype``; ``rng`` is the integer
    range (None for floating types). Returns an int or a float (bfloat16: its bit pattern)."""
    v: float  # an int for an integer dtype
    if rng is not None:
        if value.__class__ is int:
            v = value
        elif is_numpy_bool(value):  # plan() takes it as 0/1, so a call must too
            v = 1 if value else 0
        else:
            if isinstance(value, float) or (not hasattr(value, "__index__")
                                            and hasattr(value, "__float__")):
                raise TypeError(f"{program}: scalar {name!r} is {dtype}; pass an integer "
                                f"(got {type(value).__name__} {value!r})")
            try:
                v = operator.index(value)
            except TypeError:
                raise TypeError(f"{program}: scalar {name!r} is {dtype}; pass an integer "
                                f"(got {type(value).__name__})") from None
        if not rng[0] <= v <= rng[1]:
            raise ConstraintError(f"{program}: scalar {name!r} = {_shown(v)} does not fit "
                                  f"{dtype} ({rng[0]}..{rng[1]})")
        return v
    if value.__class__ is float:
        v = value
    else:
        # float() parses text ("2.0", b"nan"): a string where a number belongs is a bug in the
        # caller, not a value to convert
        if isinstance(value, (str, bytes, bytearray, memoryview)):
            raise TypeError(f"{program}: scalar {name!r} is {dtype}; pass a number "
                            f"(got {type(value).__name__} {value!r})")
        # float() of a NumPy complex drops the imaginary part (a ComplexWarning, which is
        # easily filtered), and of a unitless timedelta64 gives its count: refused as a Python
        # complex is, by the NumPy dtype kind (complex, timedelta, datetime)
        if getattr(getattr(value, "dtype", None), "kind", None) in _NOT_REAL:
            raise TypeError(f"{program}: scalar {name!r} is {dtype}; pass a number "
                            f"(got {type(value).__name__})")
        try:
            v = float(value)
        except OverflowError:  # an int beyond any float (10**400)
            bits = value.bit_length() if isinstance(value, int) else None
            # (str() of an int past 4300 digits raises in Python 3.11+)
            shown = f"an int of {bits} bits" if bits else f"a {type(value).__name__}"
            raise ConstraintError(f"{program}: scalar {name!r} = {shown} overflows "
                                  f"{dtype}") from None
        except (TypeError, ValueError):
            raise TypeError(f"{program}: scalar {name!r} is {dtype}; pass a number "
                            f"(got {type(value).__name__})") from None
        if _overflowed(value, v):
            raise ConstraintError(f"{program}: scalar {name!r} = {_text(value)} "
                                  f"({type(value).__name__}) overflows {dtype}")
    if dtype.name == "float64":
        return v
    return _narrow(v, dtype, name, program)
