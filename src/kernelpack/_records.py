"""Plain records with ``__slots__``: the load path's and the runtime's small value types.

Not dataclasses: building a dataclass costs a few hundred microseconds at import, inside the
clock of a process's first load or launch. A :class:`Record` only prints its fields; a
:class:`FrozenRecord` is also immutable and compares (and hashes) by its fields, as a frozen
dataclass would.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Record", "FrozenRecord"]


class Record:
    """``repr`` from the public names in ``__slots__``, in order."""

    __slots__: tuple[str, ...] = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__
                           if not n.startswith("_"))
        return f"{type(self).__name__}({fields})"


class FrozenRecord(Record):
    """Fields set once by :meth:`_set` (from ``__init__``), never assigned or deleted after;
    equal to a record of the same class with equal fields."""

    __slots__: tuple[str, ...] = ()

    def _set(self, **fields: Any) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def _fields(self) -> tuple:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of an immutable "
                             f"{type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of an immutable "
                             f"{type(self).__name__}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._fields())

    def __reduce__(self) -> tuple:
        """Pickle and copy by fields: the default restores slots with ``setattr``, which
        :meth:`__setattr__` refuses (``copy.copy(pack.signature)`` raised AttributeError)."""
        return (_rebuild, (self.__class__, self._fields()))


def _rebuild(cls: type, values: tuple) -> FrozenRecord:
    """A :class:`FrozenRecord` of class ``cls`` with ``values`` in ``__slots__`` order, made
    without ``__init__`` (whose parameters differ from class to class)."""
    if not (isinstance(cls, type) and issubclass(cls, FrozenRecord)):
        raise TypeError(f"cannot rebuild a FrozenRecord as {cls!r}")
    if len(values) != len(cls.__slots__):
        raise TypeError(f"{cls.__name__} has {len(cls.__slots__)} fields "
                        f"{list(cls.__slots__)} (got {len(values)} values)")
    record = object.__new__(cls)
    record._set(**dict(zip(cls.__slots__, values)))
    return record
