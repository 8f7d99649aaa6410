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
allowed), assignment raising :class:`dataclasses.FrozenInstanceError` (a plain subclass may
still set attributes that are not fields), equality only with the same class (3.13's field by
field comparison there, tuples before), the hash of the compared fields' tuple and the same
``repr``, as the generated methods give (tests/test_frozen.py compares them on every class;
review 67, tests/test_review67_frozen.py, compared the old and new trees black-box). A
dataclass base is refused.

Each class must write its own ``__init__`` (the data model's do: their parameters say what a
caller may pass, see :mod:`kernelpack._fields`) and set its fields with
``object.__setattr__``. A method the class defines itself (``DType.__eq__``) is kept.
"""

from __future__ import annotations

import dataclasses
import reprlib
import sys
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


# Python 3.13's generated __eq__ answers True for the same object, then compares field by
# field (a NaN field is unequal to itself there); before 3.13 it compared the fields' tuples.
_FIELDWISE_EQ = sys.version_info >= (3, 13)
_ORDERINGS = {"__lt__": tuple.__lt__, "__le__": tuple.__le__, "__gt__": tuple.__gt__,
              "__ge__": tuple.__ge__}


def _build(cls: T, order: bool) -> T:
    own = cls.__dict__
    if "__init__" not in own:
        raise TypeError(f"@frozen_dataclass: {cls.__name__} must define __init__")
    for name in ("__setattr__", "__delattr__"):
        if name in own:
            raise TypeError(f"@frozen_dataclass: {cls.__name__} may not define {name}")
    clash = [name for name in _ORDERINGS if name in own] if order else []
    if clash:
        raise TypeError(f"@frozen_dataclass(order=True): {cls.__name__} defines {clash[0]}")
    if any(hasattr(base, "__dataclass_fields__") for base in cls.__mro__[1:]):
        # dataclass(frozen=True) takes frozen dataclass bases only; this build (frozen=False
        # underneath) could not tell them apart. The data model has no dataclass bases.
        raise TypeError(f"@frozen_dataclass: {cls.__name__} may not derive from a dataclass")
    # A class-defined __eq__ without __hash__ leaves __hash__ None; frozen=True, eq=True
    # dataclasses then hash their fields all the same (DType does: see its __eq__). A
    # __hash__ the class sets itself, None included, is kept.
    class_hash = own.get("__hash__", dataclasses.MISSING)
    add_hash = class_hash is dataclasses.MISSING or (class_hash is None and "__eq__" in own)
    cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False)  # type: ignore[assignment]
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    compared_names = tuple(f.name for f in fields if f.compare)
    compared = _values_of(compared_names)
    hashed = _values_of(tuple(f.name for f in fields
                              if (f.compare if f.hash is None else f.hash)))
    shown = tuple(f.name for f in fields if f.repr)

    if "__repr__" not in own:
        def __repr__(self: Any) -> str:
            return (f"{self.__class__.__qualname__}("
                    + ", ".join(f"{n}={getattr(self, n)!r}" for n in shown) + ")")
        _install(cls, "__repr__", reprlib.recursive_repr()(__repr__))
    if "__eq__" not in own:
        _install(cls, "__eq__", _fieldwise_eq(compared_names) if _FIELDWISE_EQ
                 else _comparison(tuple.__eq__, compared))
    if add_hash:
        def __hash__(self: Any) -> int:
            return hash(hashed(self))
        _install(cls, "__hash__", __hash__)
    _install_frozen(cls, frozenset(f.name for f in fields))
    if order:
        for name, test in _ORDERINGS.items():
            _install(cls, name, _comparison(test, compared))
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    params.init = params.repr = params.eq = params.frozen = True
    params.order = order
    _return_none(own["__init__"])
    return cls


def _return_none(init: Callable) -> None:
    """A written ``__init__`` under ``from __future__ import annotations`` is annotated
    ``-> 'None'`` (a string); the generated one returns ``None`` itself, which
    ``inspect.signature`` shows as ``-> None`` (review 67 #3)."""
    annotations = getattr(init, "__annotations__", None)
    if isinstance(annotations, dict) and annotations.get("return") == "None":
        annotations["return"] = None


def _fieldwise_eq(names: tuple[str, ...]) -> Callable[[Any, object], Any]:
    getters = tuple(attrgetter(n) for n in names)

    def __eq__(self: Any, other: object) -> Any:
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        result: Any = True
        for get in getters:  # `a == b and c == d ...`: the first false result, or the last
            result = get(self) == get(other)
            if not result:
                return result
        return result
    return __eq__


def _install_frozen(cls: type, names: frozenset[str]) -> None:
    """Assignment and deletion refused as dataclass(frozen=True) refuses them: any name on
    an instance of ``cls`` itself, the fields on a subclass's (whose own attributes, a
    ``cached_property`` or a mixin's state, go through as usual)."""
    owner: Any = cls

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is owner or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(owner, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is owner or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(owner, self).__delattr__(name)
    _install(cls, "__setattr__", __setattr__)
    _install(cls, "__delattr__", __delattr__)


def _comparison(test: Callable[[tuple, tuple], bool],
                compared: Callable[[Any], tuple]) -> Callable[[Any, object], bool]:
    """``test`` of the compared fields' tuples, for another instance of the same class only
    (3.10-3.12's generated ``__eq__`` and, on every version, the orderings)."""
    def compare(self: Any, other: object) -> bool:
        if other.__class__ is self.__class__:
            return test(compared(self), compared(other))
        return NotImplemented
    return compare


def _install(cls: type, name: str, function: Callable) -> None:
    function.__name__ = name
    function.__qualname__ = f"{cls.__qualname__}.{name}"
    function.__module__ = cls.__module__
    setattr(cls, name, function)
