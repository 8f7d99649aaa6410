"""Checks of :class:`kernelpack.Cache`'s constructor arguments, each naming its parameter.

Why at construction: a bad value found at the first miss (a zero lock lifetime that Redis
refuses, a non-numeric timeout) would only show as a :class:`~kernelpack.cache.CacheWarning`
and a remote that is silently skipped, far from the line that caused it. Values are checked
whether or not a remote is configured, so a program behaves the same with and without one.
"""

from __future__ import annotations

import contextlib
import re
import math
import os
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from .. import config
from ..errors import CacheError
from ..limits import shown_int

__all__ = ["flag", "from_env", "key_list", "maintenance", "positive_int", "redact_url",
           "remote_name", "seconds"]

T = TypeVar("T")


def from_env(variable: str | None, make: Callable[[], T]) -> T:
    """``make()``, whose ValueError names ``$variable`` when that variable is set: a value the
    program never passed (a fleet's environment) must say where it came from."""
    try:
        return make()
    except ValueError as exc:
        if variable is None or not config.get(variable):
            raise
        raise ValueError(f"${variable}: {exc}") from None


def key_list(trusted_keys: object) -> list[object] | None:
    """``trusted_keys`` as a list, the way ``kp.load`` takes it: one key given bare (a path,
    hex text, 32 bytes, a key object) is one key, not a sequence of characters or byte values."""
    if trusted_keys is None:
        return None
    if isinstance(trusted_keys, (str, bytes, bytearray, os.PathLike)):
        return [trusted_keys]
    if not hasattr(trusted_keys, "__iter__"):
        if type(trusted_keys).__name__.endswith("PublicKey"):  # a cryptography key object
            return [trusted_keys]
        raise TypeError(f"trusted_keys must be a list of public keys (paths, hex, 32 bytes "
                        f"or key objects) or None (got {type(trusted_keys).__name__})")
    return list(trusted_keys)


def flag(param: str, value: object) -> bool:
    """``value`` as a bool, refusing anything else: ``bool("false")`` is True, so a flag read
    from a config file as text would silently mean the opposite of what it says."""
    if not isinstance(value, bool):
        from ..dtypes import is_numpy_bool

        if is_numpy_bool(value):  # np.True_: a bool in all but its type
            return bool(value)
        raise TypeError(f"{param} must be True or False (got {type(value).__name__}: "
                        f"{value!r:.60})")
    return value


def positive_int(param: str, value: object, unit: str, maximum: int | None = None) -> int:
    """``value`` as an int >= 1, and at most ``maximum`` (a bool is refused: ``True`` is no
    size or lifetime)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{param} must be an int ({unit}) (got {type(value).__name__}: "
                        f"{value!r:.60})")
    if value < 1:
        raise ValueError(f"{param} must be a positive number of {unit} (got "
                         f"{shown_int(value)})")
    if maximum is not None and value > maximum:
        raise ValueError(f"{param} must be at most {maximum} {unit} (got {shown_int(value)})")
    return value


def seconds(param: str, value: object, minimum: float, inclusive: bool = True) -> float:
    """``value`` as a finite float of seconds, at least ``minimum`` (above it when not
    ``inclusive``); TypeError for a non-number, ValueError out of range (NaN included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{param} must be a number of seconds (got {type(value).__name__}: "
                        f"{value!r:.60})")
    try:
        number = float(value)
    except OverflowError:  # an int past float's range: no finite number of seconds
        number = math.inf
    ok = number >= minimum if inclusive else number > minimum
    if not (ok and math.isfinite(number)):
        bound = f"at least {minimum:g}" if inclusive else f"more than {minimum:g}"
        shown = shown_int(value) if isinstance(value, int) else repr(value)
        raise ValueError(f"{param} must be a finite number of seconds, {bound} (got {shown})")
    return number


@contextlib.contextmanager
def maintenance(what: str, root: Path) -> Iterator[None]:
    """An explicit ``prune``/``clear`` that the filesystem refuses is a CacheError naming the
    cache directory (the documented error of a cache operation), not a bare OSError."""
    try:
        yield
    except OSError as exc:  # naming the file or directory inside that refused, if another
        inner = exc.filename if exc.filename not in (None, str(root)) else None
        where = f"{inner}: " if inner is not None else ""
        raise CacheError(f"cannot {what} the disk cache {str(root)!r}: {where}"
                         f"{exc.strerror or exc}") from exc


def remote_name(remote: object) -> str:
    """A remote store as warnings name it: its URL with the password hidden, or the store's
    type (an operator must know which server of a fleet's config failed)."""
    url = getattr(remote, "url", None)
    return redact_url(url) if isinstance(url, str) else type(remote).__name__


def redact_url(url: object) -> str:
    """``url`` with any password replaced by ``***``: URLs end up in reprs, warnings, logs and
    exception messages, and a Redis password must not (``redis://user:***@host:port/db``, and
    a ``password=`` query parameter, which redis-py also reads)."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:  # not a URL at all (a typo): hide whatever stands between ':' and '@'
        return re.sub(r":[^:@/]*@", ":***@", text)
    userinfo, at, after = rest.rpartition("@")  # the last '@': a password may hold '/'
    if at and ":" in userinfo:  # user:password@ (a bare user@ is a user name, kept)
        rest = f"{userinfo.partition(':')[0]}:***@{after}"
    # the query and the fragment: a password= option (redis-py reads it), with or without a
    # path before it
    rest = re.sub(r"(?i)((?:[?&#])password=)[^&#]*", r"\1***", rest)
    return f"{scheme}://{rest}"
