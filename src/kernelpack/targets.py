"""GPU architecture targets: ``sm_90``, ``sm_90a``, ``sm_100f``, ``compute_80`` (PTX).

A target names what an image runs on. Parsing is strict so that a typo is an error at compile
time, not a silent "no image for this device" in production.
"""

from __future__ import annotations

import re
from typing import Iterable

from ._frozen import frozen_dataclass

__all__ = ["Arch", "parse_arch", "parse_target_list", "portable_lowest"]

# re.ASCII: without it \d also matches other scripts' digits ("sm_\u0669\u0660" would be sm_90).
_ARCH_RE = re.compile(r"^(sm|compute)_(\d{1,2})(\d)([af]?)$", re.ASCII)


@frozen_dataclass(order=True)
class Arch:
    """A compute capability with an optional suffix: ``a`` (this exact chip only) or ``f``
    (this family: same major, minor at least this)."""

    major: int
    minor: int
    suffix: str = ""

    def __init__(self, major: int, minor: int, suffix: str = "") -> None:
        object.__setattr__(self, "major", major)
        object.__setattr__(self, "minor", minor)
        object.__setattr__(self, "suffix", suffix)
        self.__post_init__()

    def __post_init__(self) -> None:
        if not (0 < self.major < 100 and 0 <= self.minor < 10 and self.suffix in ("", "a", "f")):
            raise ValueError(f"bad architecture {self.major}.{self.minor}{self.suffix!r}")

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def compute(self) -> str:
        return f"compute_{self.major}{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return self.sm


def parse_arch(text: str) -> Arch:
    """Parse ``sm_XY[a|f]`` or ``compute_XY[a|f]``; raises ValueError naming the text."""
    match = _ARCH_RE.match(text.strip().lower()) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"not a GPU architecture: expected sm_XY, sm_XYa, sm_XYf or compute_XY "
                         f"(got {text!r:.80})")
    try:
        arch = Arch(int(match.group(2)), int(match.group(3)), match.group(4))
    except ValueError:  # sm_00, sm_05: the pattern's shape, but no compute capability
        raise ValueError(f"not a GPU architecture: {text!r} has major version "
                         f"{int(match.group(2))} (sm_XY needs X of 1 or more)") from None
    first = _FIRST_WITH_SUFFIX.get(arch.suffix)
    if first is not None and arch.major < first:  # LLVM warned on stderr, then ptxas failed
        raise ValueError(f"not a GPU architecture: {text!r}: {arch.suffix!r} variants exist "
                         f"from sm_{first}0{arch.suffix} on")
    return arch


# The first major version with each suffix (CUDA 12.0: sm_90a; CUDA 12.9: family sm_100f).
_FIRST_WITH_SUFFIX = {"a": 9, "f": 10}


def parse_target_list(targets: Iterable[str]) -> tuple[list[Arch], bool]:
    """Split a user's ``targets=[...]`` into cubin architectures and whether PTX is wanted.

    ``"ptx"`` asks for PTX. ``compute_XY`` also asks for PTX *and* lists XY among the
    returned architectures: ``kp.compile`` builds a cubin for every returned architecture and
    one PTX, for the lowest of them (``["sm_80", "compute_90"]`` gives sm_80 and sm_90 cubins
    and compute_80 PTX); ``kp.external`` skips the cubin of a ``compute_XY`` named without
    its ``sm_XY`` and keeps the PTX for the source's own ``.target``. At least one
    architecture must be named: ``["ptx"]`` alone is a ValueError.
    """
    if isinstance(targets, (str, bytes)) or not hasattr(targets, "__iter__"):
        raise TypeError(f"targets must be a list such as ['sm_80', 'sm_90', 'ptx'] "
                        f"(got {targets!r:.80})")
    targets = tuple(targets)
    for item in targets:
        if not isinstance(item, str):
            raise TypeError(f"targets must be strings such as 'sm_90' (got {item!r} in "
                            f"{list(targets)!r})")
    cubins: list[Arch] = []
    want_ptx = False
    for item in targets:
        if item.strip().lower() == "ptx":  # spelled as freely as "SM_90" is
            want_ptx = True
            continue
        try:
            arch = parse_arch(item)
        except ValueError as exc:
            raise ValueError(f"targets: {exc}") from None
        if item.strip().lower().startswith("compute_"):
            want_ptx = True
        cubins.append(arch)
    if not cubins:
        raise ValueError(f"targets name no architecture (got {list(targets)!r})")
    return sorted(set(cubins)), want_ptx


def portable_lowest(archs: Iterable[Arch]) -> Arch:
    """The architecture one PTX serves every target from: the lowest of ``archs``, without its
    ``a``/``f`` suffix when they span several architectures (PTX for ``sm_90a`` runs on an
    sm_90 only and cannot be built for ``sm_100``; PTX for ``sm_90`` builds both)."""
    archs = list(archs)
    lowest = min(archs)
    if any((a.major, a.minor) != (lowest.major, lowest.minor) for a in archs):
        lowest = Arch(lowest.major, lowest.minor)
    return lowest
