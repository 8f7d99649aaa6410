"""``@frozen_dataclass``: a frozen dataclass whose methods are not generated with ``exec``.

Why: ``@dataclass(frozen=True)`` writes ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` as source text and compiles each with ``exec`` while the
class is created, ~0.6-1 ms a class before Python 3.13. The data model's 15 classes and the
cache's 3 took 21.6 ms of a warm start's imports on the H200 host (12.8 ms of ``import
kernelpack`` on the 2-CPU box), inside the clock of every process's first load or launch.
Here the methods are functions closed over ``operator.attrgetter`` of the field names, made
without ``exec``: 1.25 ms for the 18 classes there. ``import kernelpack`` after ``import
torch``, H200 host, median of 15: 33.4 -> 21.5 ms (session 49, notes/warmstart-perf.md).

The class stays a dataclass in every observable way: ``dataclasses.fields``/``replace``/
``asdict``/``is_dataclass``, ``__match_args__``, ``__dataclass_params__`` (reported as the
``frozen=True`` dataclass it behaves as, so a user's ``@dataclass(frozen=True)`` subclass is
allowed), assignment raising :class:`dataclasses.FrozenInstanceError`, equality only with the
same class, the hash of the compared fields' tuple and the same ``repr``, as the generated
methods of Python 3.11/3.12 give (tests/test_frozen.py compares them on every class).

Each class must write its own ``__init__`` (the data model's do: their parameters say what a
caller may pass, see :mod:`kernelpack._fields`) and set its fields with
``object.__setattr__``. A method the class defines itself (``DType.__eq__``) is kept.
"""

from __future__ import annotations

import dataclasses
import reprlib
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, TypeVar, overload

__all__ = ["frozen_dataclass"]

T = TypeVar("T", bound=type)

if TYPE_CHECKING:  # type checkers see a frozen dataclass (PEP 681); typing has it from 3.11
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Callable[[T], T]:
        return lambda function: function


@overload
def frozen_dataclass(cls: T, /) -> T: ...
@overload
def frozen_dataclass(*, order: bool = False) -> Callable[[T], T]: ...


@dataclass_transform(frozen_default=True)
def frozen_dataclass(cls: T | None = None, /, *, order: bool = False) -> Any:
    """``@dataclass(frozen=True[, order=True])`` for a class that writes its ``__init__``."""
    if cls is None:
        return lambda c: _build(c, order)
    return _build(cls, order)


def _values_of(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """The tuple of the named fields of an instance (attrgetter of one name returns the value
    itself, not a 1-tuple)."""
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda self: (one(self),)
    if not names:
        return lambda self: ()
    return attrgetter(*names)


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _build(cls: T, order: bool) -> T:
    if "__init__" not in cls.__dict__:
        raise TypeError(f"@frozen_dataclass: {cls.__name__} must define __init__")
    for name in ("__setattr__", "__delattr__"):
        if name in cls.__dict__:
            raise TypeError(f"@frozen_dataclass: {cls.__name__} may not define {name}")
    cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False)  # type: ignore[assignment]
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    compared = _values_of(tuple(f.name for f in fields if f.compare))
    hashed = _values_of(tuple(f.name for f in fields
                              if (f.compare if f.hash is None else f.hash)))
    shown = tuple(f.name for f in fields if f.repr)
    own = cls.__dict__

    if "__repr__" not in own:
        def __repr__(self: Any) -> str:
            return (f"{self.__class__.__qualname__}("
                    + ", ".join(f"{n}={getattr(self, n)!r}" for n in shown) + ")")
        _install(cls, "__repr__", reprlib.recursive_repr()(__repr__))
    if "__eq__" not in own:
        def __eq__(self: Any, other: object) -> bool:
            if other.__class__ is self.__class__:
                return compared(self) == compared(other)  # type: ignore[no-any-return]
            return NotImplemented
        _install(cls, "__eq__", __eq__)
    # A class-defined __eq__ without __hash__ leaves __hash__ None; frozen=True, eq=True
    # dataclasses then hash their fields all the same (DType does: see its __eq__).
    if own.get("__hash__") is None:
        def __hash__(self: Any) -> int:
            return hash(hashed(self))
        _install(cls, "__hash__", __hash__)
    cls.__setattr__ = _frozen_setattr  # type: ignore[assignment]
    cls.__delattr__ = _frozen_delattr  # type: ignore[assignment]
    if order:
        for name, test in (("__lt__", tuple.__lt__), ("__le__", tuple.__le__),
                           ("__gt__", tuple.__gt__), ("__ge__", tuple.__ge__)):
            if name in own:
                raise TypeError(f"@frozen_dataclass(order=True): {cls.__name__} defines {name}")
            _install(cls, name, _comparison(name, test, compared))
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    params.init = params.repr = params.eq = params.frozen = True
    params.order = order
    return cls


def _comparison(name: str, test: Callable[[tuple, tuple], bool],
                compared: Callable[[Any], tuple]) -> Callable[[Any, object], bool]:
    def compare(self: Any, other: object) -> bool:
        if other.__class__ is self.__class__:
            return test(compared(self), compared(other))
        return NotImplemented
    compare.__name__ = name
    return compare


def _install(cls: type, name: str, function: Callable) -> None:
    function.__name__ = name
    function.__qualname__ = f"{cls.__qualname__}.{name}"
    setattr(cls, name, function)
