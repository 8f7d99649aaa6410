"""Checks of :class:`kernelpack.Cache`'s constructor arguments, each naming its parameter.

Why at construction: a bad value found at the first miss (a zero lock lifetime that Redis
refuses, a non-numeric timeout) would only show as a :class:`~kernelpack.cache.CacheWarning`
and a remote that is silently skipped, far from the line that caused it. Values are checked
whether or not a remote is configured, so a program behaves the same with and without one.
"""

from __future__ import annotations

import math
import os

__all__ = ["key_list", "positive_int", "seconds"]


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


def positive_int(param: str, value: object, unit: str) -> int:
    """``value`` as an int >= 1 (a bool is refused: ``True`` is no size or lifetime)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{param} must be an int ({unit}) (got {type(value).__name__}: "
                        f"{value!r:.60})")
    if value < 1:
        raise ValueError(f"{param} must be a positive number of {unit} (got {value})")
    return value


def seconds(param: str, value: object, minimum: float, inclusive: bool = True) -> float:
    """``value`` as a finite float of seconds, at least ``minimum`` (above it when not
    ``inclusive``); TypeError for a non-number, ValueError out of range (NaN included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{param} must be a number of seconds (got {type(value).__name__}: "
                        f"{value!r:.60})")
    number = float(value)
    ok = number >= minimum if inclusive else number > minimum
    if not (ok and math.isfinite(number)):
        bound = f"at least {minimum:g}" if inclusive else f"more than {minimum:g}"
        raise ValueError(f"{param} must be a finite number of seconds, {bound} (got {value!r})")
    return number
