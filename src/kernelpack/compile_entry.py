"""``kp.compile``'s front door: validate the request, and with a cache, look it up *before*
importing the lowering.

The lowering package (pipeline, schedule, codegen, and llvmlite behind them) costs a process
several milliseconds to import, which a warm start, where every kernel is a cache hit, would
pay for nothing. The cache key needs only the fusion's canonical bytes, the normalized options
and the targets, all of which are computed here from light modules; the lowering is imported
only when the cache misses (or when there is no cache).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence

from ._frozen import frozen_dataclass
from .dtypes import strict_index
from .fusion import Fusion
from .graph import Graph
from .compiled import Compiled
from .targets import parse_target_list

__all__ = ["Options", "compile", "fusion_key"]


@frozen_dataclass
class Options:
    """Lowering options (all part of the cache key). ``opt``: LLVM optimization level."""

    opt: int = 3

    def __init__(self, opt: int = 3) -> None:
        object.__setattr__(self, "opt", opt)

    @staticmethod
    def parse(options: Mapping[str, object]) -> "Options":
        known = {f.name for f in dataclasses.fields(Options)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown kp.compile option(s) {unknown} (known: {sorted(known)})")
        given = options.get("opt", 3)
        # a bool is an int to Python: opt=True compiled at -O1 and keyed the cache as opt=True;
        # a NumPy int is the int it holds (and keys the cache as that int)
        try:
            opt = strict_index(given)
        except TypeError:
            opt = -1
        if not 0 <= opt <= 3:
            raise ValueError(f"opt must be an integer 0..3 (got {given!r})")
        return Options(opt=opt)

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _target_items(targets: Any) -> Any:
    """``targets`` as a tuple when it is an iterable other than a str/bytes (which
    :func:`parse_target_list` refuses, naming them): a generator is read once here, since the
    key and the build each iterate it, and the build saw it exhausted ("targets name no
    architecture (got [])") while the same call without a cache compiled."""
    if isinstance(targets, (str, bytes)) or not hasattr(targets, "__iter__"):
        return targets
    return tuple(targets)


def static_dims(f: Fusion, static: Mapping[str, int] | None) -> tuple[tuple[str, int], ...]:
    """``static=`` checked against ``f``'s dims (:meth:`Fusion.static_dims`), normalized:
    sorted ``(dim name, size)`` pairs."""
    return tuple(sorted(f.static_dims(static).items()))


def fusion_key(f: Fusion, targets: Sequence[str], static: Mapping[str, int] | None,
               options: Mapping[str, object]) -> Any:
    """The cache key of ``kp.compile(f, targets, static=static, **options)``; raises the same
    errors as the compile itself for a bad fusion, target list or option."""
    return _traced_key(f, targets, static, options)[0]


def _traced_key(f: Fusion, targets: Sequence[str], static: Mapping[str, int] | None,
                options: Mapping[str, object]) -> tuple[Any, Graph]:
    """The cache key and the one trace it was made from, which the compile lowers: tracing
    again for the code could read values changed since (a config reloaded by another thread
    during the remote lookup or a lock wait), and file that code under this key, for every
    process that shares the cache."""
    if not isinstance(f, Fusion):
        raise TypeError(f"kp.compile takes a @kp.fusion function (got {f!r})")
    targets = _target_items(targets)
    parse_target_list(targets)
    opts = Options.parse(options)
    from .cache import make_key

    graph = f.trace(f.static_dims(static))
    key = make_key(kind="fusion", source=f.canonical_bytes(static, graph=graph),
                   options=opts.as_dict(), targets=list(targets))
    return key, graph


# What this process compiled last, by cache key (frozen results, shared): LLVM's pass pipeline
# (through llvmlite) keeps ~70-200 KB of native memory per compile that nothing gives back, so
# a service calling kp.compile(f) per request grew without bound; a repeat is now a lookup.
_RECENT: "OrderedDict[str, Compiled]" = OrderedDict()
_RECENT_SIZE = 32
_RECENT_LOCK = threading.Lock()


def _compile_once(f: Fusion, targets: Any, static: Mapping[str, int] | None,
                  options: Mapping[str, object]) -> Compiled:
    """``compile_fusion`` unless this process compiled the same key (fusion, static dims,
    options, targets, toolchain, codegen environment: everything the disk cache keys on)
    among its last :data:`_RECENT_SIZE` compiles."""
    key, graph = _traced_key(f, targets, static, options)
    digest = key.digest
    with _RECENT_LOCK:
        done = _RECENT.get(digest)
        if done is not None:
            _RECENT.move_to_end(digest)
            return done
    from .lowering.pipeline import compile_traced

    done = compile_traced(f, graph, targets, static, options)
    with _RECENT_LOCK:
        _RECENT[digest] = done
        while len(_RECENT) > _RECENT_SIZE:
            _RECENT.popitem(last=False)
    return done


_LOWERING_FOUND = False  # llvmlite found once: a warm start's cache hits never import it,
# and find_spec of a module not imported scans sys.path at every kp.compile


def _require_lowering() -> None:
    """CompileError naming the extra to install where llvmlite is missing: a base install
    (``pip install kernelpack``: load and launch only) met ``kp.compile`` with a bare
    ``ModuleNotFoundError: No module named 'llvmlite'``, from the cache key (whose toolchain
    part is llvmlite's version) or the lowering."""
    global _LOWERING_FOUND
    if _LOWERING_FOUND:
        return
    import importlib.util

    _LOWERING_FOUND = importlib.util.find_spec("llvmlite") is not None
    if not _LOWERING_FOUND:
        from .errors import CompileError

        raise CompileError("kp.compile needs the lowering (llvmlite, nvJitLink, libdevice): "
                           "pip install 'kernelpack[compile]'")


def compile(f: Fusion, targets: Sequence[str] = ("sm_80", "sm_90", "ptx"), *,  # noqa: A001
            static: Mapping[str, int] | None = None, cache: Any = None,
            **options: object) -> Compiled:
    """See :func:`kernelpack.compile`: with ``cache``, a hit never imports the lowering."""
    _require_lowering()
    if cache is not None and not callable(getattr(cache, "fetch_or_compile", None)):
        raise TypeError(f"cache= takes a kp.Cache (got {type(cache).__name__}: {cache!r:.60}); "
                        f"kp.Cache(path) uses a directory")
    targets = _target_items(targets)
    if cache is None:
        return _compile_once(f, targets, static, options)
    key, graph = _traced_key(f, targets, static, options)

    def build() -> Compiled:
        from .lowering.pipeline import compile_traced

        return compile_traced(f, graph, targets, static, options)

    from .cache import Cache

    if isinstance(cache, Cache):  # a hit holding another program is not this key's entry
        return cache.fetch_or_compile(key, build, name=f.name)
    return cache.fetch_or_compile(key, build)  # type: ignore[no-any-return]
