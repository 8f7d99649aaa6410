"""Checked conversions of the fields a user gives the data model, each naming the field.

:mod:`kernelpack.summary` (and :mod:`kernelpack.launches`, :mod:`kernelpack.compiled`,
:mod:`kernelpack.external`) take names, dims, yes/no flags and lists from hand-written
summaries: a wrong value must fail where it is given, with a message that names the field and
what was got, never later inside the serializer or the loader with an error that names
nothing of the caller's. Each helper returns the canonical value (an identifier, an
:class:`~kernelpack.expr.Expr`, a bool, a tuple) or raises TypeError/ValueError.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Sequence

from .dtypes import DType, as_dtype, is_numpy_bool
from .expr import Expr, ExprLike, as_expr, const
from .limits import MAX_NAME_LENGTH, MAX_RANK, fits_name

__all__ = ["_name", "_dim", "_dtype", "_flag", "_shape", "_items", "_dim3", "_set", "DTypeLike"]

# A dtype as the data model takes it: a kp.DType, a name ("float32"), or a NumPy/torch dtype
DTypeLike = object
# Each class of the data model writes its __init__ (dataclass keeps one a class defines): its
# parameters say what a caller may pass (lists, dims as ints or names), which __post_init__
# normalizes into the fields' stored form with the helpers below. The generated one would
# announce the stored form (tuple[Expr, ...]) as the parameters' types, refusing to a type
# checker the README's own kp.Tensor("x", kp.f32, ["n"]) (review 37). Fields are set with:
_set = object.__setattr__


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.isidentifier() or not fits_name(value):
        raise ValueError(f"{what} must be an identifier of at most {MAX_NAME_LENGTH} UTF-8 "
                         f"bytes (got {value!r:.80})")
    return value


def _dim(value: object, what: str) -> Expr:
    """One dimension. A bool is refused: ``True`` would silently become 1."""
    if value.__class__ is Expr:  # what the decoder and the lowering pass
        return value  # type: ignore[return-value]
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, a symbol name or an expression (got {value!r})")
    try:
        return as_expr(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:  # "'2n' is not a symbol name" named no field
        raise type(exc)(f"{what}: {exc}") from None


def _dtype(value: object, what: str) -> DType:
    """A dtype field: "not a kernelpack dtype (got 'fp32')" named neither the tensor nor the
    scalar."""
    if value.__class__ is DType:  # the decoder's and the lowering's form
        return value  # type: ignore[return-value]
    try:
        return as_dtype(value)
    except TypeError as exc:
        raise TypeError(f"{what}: dtype: {exc}") from None


def _flag(value: object, what: str) -> bool:
    """A yes/no field: a bool, NumPy's, or the int 0/1 (stored as the bool). ``"no"`` would be
    truthy, and the serializer's FlatBuffers builder fails on anything but a bool or 0/1 with
    an error naming nothing of the caller's."""
    if value.__class__ is bool:
        return value  # type: ignore[return-value]
    if is_numpy_bool(value):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{what} must be a bool (got {value!r:.80})")


def _shape(shape: Iterable[ExprLike], what: str) -> tuple[Expr, ...]:
    if shape.__class__ is tuple and len(shape) <= MAX_RANK:  # type: ignore[arg-type]
        # the decoder's and the lowering's form: a tuple of Exprs, each made once; the same
        # checks as below, without making a message per dim
        for d in shape:
            if d.__class__ is not Expr or (d.op == "const" and (  # type: ignore[attr-defined]
                    d.value.__class__ is not int or d.value < 0)):  # type: ignore
                break
        else:
            return shape  # type: ignore[return-value]
    if isinstance(shape, (str, bytes, int, Expr)) or not isinstance(shape, Iterable):
        raise TypeError(f"{what}: shape must be a sequence of dims (got {shape!r})")
    dims = tuple(_dim(d, f"{what}: shape[{i}]") for i, d in enumerate(shape))
    if len(dims) > MAX_RANK:
        raise ValueError(f"{what}: rank {len(dims)} exceeds the limit {MAX_RANK}")
    for i, d in enumerate(dims):
        if d.is_const and int(d.value) < 0:  # type: ignore[arg-type]
            raise ValueError(f"{what}: shape[{i}] = {d.value} is negative")
    return dims


def _items(values: object, kinds: type | tuple[type, ...], what: str) -> tuple:
    """A list field as a tuple of ``kinds``: a str would be iterated into its letters, and a
    wrong item would fail later with an AttributeError naming nothing of the caller's."""
    def names() -> str:  # only for a message: a loaded summary calls this a dozen times
        return " or ".join(f"kp.{k.__name__}"
                           for k in (kinds if isinstance(kinds, tuple) else (kinds,)))

    if values.__class__ is tuple:
        items: tuple = values  # type: ignore[assignment]
    elif isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a list of {names()} (got {values!r:.80})")
    else:
        items = tuple(values)
    for i, item in enumerate(items):
        if not isinstance(item, kinds):
            raise TypeError(f"{what}[{i}] must be a {names()} (got {item!r:.80})")
    return items


def _dim3(values: ExprLike | Sequence[ExprLike], what: str) -> tuple[Expr, Expr, Expr]:
    if (values.__class__ is tuple and len(values) == 3  # type: ignore[arg-type]
            and values[0].__class__ is Expr and values[1].__class__ is Expr  # type: ignore
            and values[2].__class__ is Expr):  # type: ignore[index]
        return values  # type: ignore[return-value]
    if isinstance(values, (int, str, Expr)) or (
            not isinstance(values, Iterable) and hasattr(type(values), "__index__")):
        values = (values,)  # one dim: an int, NumPy's included (a bool is refused by _dim)
    elif isinstance(values, bytes) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be an int, a symbol name, an expression or a tuple of 1 "
                        f"to 3 of them (got {values!r})")
    dims = [_dim(v, what) for v in values]
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} takes 1 to 3 dimensions (got {len(dims)})")
    dims += [const(1)] * (3 - len(dims))
    return dims[0], dims[1], dims[2]
