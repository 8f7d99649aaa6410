"""Does a cache hit hold what its key asked for?

A disk entry is the artifact itself (one file, no envelope), so nothing in it names the key it
was stored under: a file copied or renamed from key A's name to key B's would be served for B.
Remote entries are bound by their signed envelope; disk entries are checked here instead, with
the facts an artifact does record and a request does know, so the check is cheap (metadata of
an already decoded hit, no image bytes) and never refuses an entry its own key produced:

- the program's **name**, when the caller says which program it expects (``kp.external``
  through :meth:`Cache.external`; ``fetch_or_compile(..., name=...)``);
- for ``kind="fusion"`` keys, the **image set**: the lowering builds exactly one cubin per
  architecture of the target list and one PTX when it asks for PTX
  (:func:`kernelpack.targets.parse_target_list`), so an entry of another target list is not
  this key's.

This is not a proof of binding (two kernels with one name and one target list are told apart
by nothing the artifact records); it catches the mix-ups that happen, cheaply.
"""

from __future__ import annotations

from ..compiled import Compiled
from ..errors import CacheError
from .keys import CacheKey

__all__ = ["check_binding"]


def check_binding(compiled: Compiled, key: object, name: str | None) -> None:
    """Raise :class:`CacheError` when ``compiled`` cannot be the entry of ``key`` (a
    :class:`CacheKey`, or a bare digest, which carries nothing to check) for program
    ``name`` (None: any)."""
    if name is not None and compiled.name != name:
        raise CacheError(f"entry holds program {compiled.name!r}, not the requested {name!r} "
                         f"(a file stored under another key's name?)")
    if not isinstance(key, CacheKey):
        return
    try:
        kind, targets = key.part("kind"), key.part("targets")
    except KeyError:
        return
    if kind != "fusion" or not targets:
        return
    from ..targets import parse_target_list

    try:
        archs, want_ptx = parse_target_list(targets.split(","))
    except ValueError:  # a hand-made key (make_key) whose targets the lowering never took
        return
    cubins = sorted({img.arch.sm for m in compiled.modules for img in m.images
                     if img.kind == "cubin"})
    has_ptx = any(img.kind == "ptx" for m in compiled.modules for img in m.images)
    expected = sorted({a.sm for a in archs})
    if cubins != expected or has_ptx != want_ptx:
        raise CacheError(f"entry has cubins {cubins} and {'a' if has_ptx else 'no'} PTX image, "
                         f"but key targets {targets!r} ask for cubins {expected} and "
                         f"{'a' if want_ptx else 'no'} PTX image (a file stored under another "
                         f"key's name?)")
