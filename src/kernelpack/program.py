"""A program of a loaded pack: its summary decoded on first use, its planner, and the call
that launches it on the GPU.

Split from :mod:`kernelpack.loader` (which opens and verifies the file and indexes what it
holds): a :class:`Program` is what users hold and call, and its call path is the one the C
extension's ``CallBase`` speeds up, so it lives on its own. A program reads its pack's buffer
(summary bytes, module index) and is made only by :class:`~kernelpack.loader.Pack`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from ._decode import decode_program
from .errors import FormatError
from .planner import Plan, Planner
from .summary import Compiled, KernelSummary, Module

if TYPE_CHECKING:
    from .loader import ModuleInfo, Pack

__all__ = ["Program"]


class _PythonCall:
    """How a :class:`Program` is called without the C extension; with it, the extension's
    ``CallBase`` does the same in C (about 0.4 µs less per call: no ``*args``/``**kwargs``
    frame before the runtime's fast path)."""

    _kp_bound: Any = None

    if TYPE_CHECKING:  # Program's (the subclass), which __call__ falls back to
        def _kp_general_call(self, *args: Any, out: Any = None, stream: Any = None,
                             **kwargs: Any) -> Any: ...

    def __call__(self, *args: Any, out: Any = None, stream: Any = None, **kwargs: Any) -> Any:
        """Launch on the GPU (see :func:`kernelpack.runtime.call_program`)."""
        bound = self._kp_bound
        if bound is not None and not kwargs:
            return bound.call(args, out, stream)
        return self._kp_general_call(*args, out=out, stream=stream, **kwargs)


def _call_base() -> type:
    try:  # a C module that imports nothing (no CUDA): fine on the load path
        from .runtime._launch import CallBase
    except ImportError:
        return _PythonCall
    return CallBase  # type: ignore[no-any-return]


class Program(_call_base()):  # type: ignore[misc]
    """A program of a loaded pack: ``.summary`` (decoded on first use), ``.plan(...)``, and
    calling it launches on the GPU through :mod:`kernelpack.runtime`. Made by :class:`Pack`.

    ``program(*args, out=None, stream=None, **named)``: once bound (first call), a call with
    only ``out=``/``stream=`` keywords goes straight to ``self._kp_bound.call(args, out,
    stream)``; anything else to :meth:`_kp_general_call`."""

    def __init__(self, pack: "Pack", name: str, index: int) -> None:
        # What it reads of its pack, not the pack itself: the pack keeps its programs (one
        # binding each), and a program keeping the pack made a cycle that held a dropped
        # pack's file descriptors and map until the garbage collector ran (a reload loop
        # under a low descriptor limit died of EMFILE).
        self._tables = pack._programs
        self._pack_modules = pack._modules
        self._signed = pack._signed
        self.name = name
        self._index = index
        self._summary: KernelSummary | None = None
        self._used: dict[str, ModuleInfo] = {}  # the modules the launches use (with _summary)
        self._planner: Any = None

    @property
    def summary(self) -> KernelSummary:
        """The decoded summary. Decoding checks that every launch's module and kernel exist
        (docs/FORMAT.md §3, 8): a summary naming code the file lacks would otherwise plan,
        inspect and evaluate as if it could run. FormatError when one is missing."""
        if self._summary is None:
            summary = decode_program(self._tables[self._index])
            if summary.name != self.name:  # pragma: no cover - same bytes, same name
                raise FormatError(f"program {self.name!r} decodes as {summary.name!r}")
            self._used = self._launch_modules(summary)
            self._summary = summary
        return self._summary

    def _launch_modules(self, summary: KernelSummary) -> dict[str, ModuleInfo]:
        """The modules ``summary``'s launches use; FormatError if a module or kernel is
        missing."""
        out: dict[str, ModuleInfo] = {}
        for vi, variant in enumerate(summary.variants):
            for launch in variant.launches:
                info = self._pack_modules.get(launch.module)
                if info is None:
                    raise FormatError(f"program {self.name!r} variant {vi}: launch of "
                                      f"{launch.kernel!r} uses module {launch.module!r}, which "
                                      f"the file does not contain")
                if launch.kernel not in info.kernels:
                    raise FormatError(f"program {self.name!r}: module {launch.module!r} has no "
                                      f"kernel {launch.kernel!r} (has {list(info.kernels)})")
                out[info.name] = info
        return out

    @property
    def planner(self) -> Planner:
        """The compiled :class:`~kernelpack.planner.Planner` (built once)."""
        if self._planner is None:
            planner = Planner(self.summary)
            self.plan = planner.plan  # type: ignore[method-assign]  # later calls skip this layer
            self._planner = planner
        return self._planner

    @property
    def modules(self) -> dict[str, ModuleInfo]:
        """The modules this program's launches use; FormatError if one is missing (checked
        and collected once, when the summary is decoded)."""
        if self._summary is None:
            self.summary  # noqa: B018 - decodes, checks and collects them
        return dict(self._used)

    def plan(self, *args: Any, **kwargs: Any) -> Plan:
        """Evaluate the summary for these shapes and scalars → :class:`~kernelpack.planner.Plan`.
        Tensors are shapes (tuples) or objects with ``.shape``. Raises ConstraintError."""
        return self.planner.plan(*args, **kwargs)

    # Set by kernelpack.runtime on first call: the bound launcher (parameter block, compiled
    # plan, loaded kernels). Checked here first so a warm call skips the runtime's entry layer.
    _kp_bound: Any = None

    def _kp_general_call(self, *args: Any, out: Any = None, stream: Any = None,
                         **kwargs: Any) -> Any:
        """Launch on the GPU (see :func:`kernelpack.runtime.call_program`)."""
        from .runtime import call_program

        return call_program(self, *args, out=out, stream=stream, **kwargs)

    def compiled(self, *, origin: str = "disk") -> Compiled:
        """This program as a :class:`~kernelpack.summary.Compiled` (``pack.compiled(name)``),
        e.g. to save it again. Every image's stored bytes are checked against their digest
        now. Raises IntegrityError / FormatError.

        From a pack of several programs, a module shared with others leaves out the kernels
        only the other programs launch: their entries were merged in when the programs were
        saved together, and saving this program alone gave other bytes than saving it as it
        was built (review 33: a release job splitting one artifact per program). A kernel no
        program launches stays (saving the whole pack again gives back its bytes)."""
        summary = self.summary
        modules = tuple(info.module() for info in self.modules.values())
        if len(self._tables) > 1:
            mine = _launched(summary)
            if any((m.name, k) not in mine for m in modules for k in m.kernels):
                others: set[tuple[str, str]] = set()
                for index, table in enumerate(self._tables):
                    if index != self._index:
                        others |= _launched(decode_program(table))
                drop = others - mine
                modules = tuple(
                    Module(m.name, tuple(k for k in m.kernels if (m.name, k) not in drop),
                           m.images)
                    if any((m.name, k) in drop for k in m.kernels) else m
                    for m in modules)
        return Compiled(summary, modules, origin=origin)

    def check_signature_intact(self) -> None:
        """Check the signature of the pack this program was read from under the key it names
        (:meth:`Pack.check_signature_intact <kernelpack.loader.Pack.check_signature_intact>`):
        ``kp.save(program, sign_with=...)`` must not sign what a broken signature covers."""
        from .loader import check_intact

        check_intact(self._signed)

    def warmup(self, devices: Iterable[int] | None = None) -> None:
        """Load this program's modules on ``devices`` (default: the current device) now."""
        from .runtime import warmup

        warmup(self, devices)

    def __repr__(self) -> str:
        return f"<kernelpack Program {self.name!r}>"

    def __reduce__(self) -> Any:
        raise TypeError(f"a loaded Program ({self.name!r}) cannot be pickled or copied: it is "
                        f"bound to its pack's buffer and this process's GPU state; send the "
                        f"artifact (its path or bytes) or pack.compiled({self.name!r}) instead")


def _launched(summary: KernelSummary) -> set[tuple[str, str]]:
    """The (module, kernel) pairs ``summary``'s launches use."""
    return {(launch.module, launch.kernel)
            for variant in summary.variants for launch in variant.launches}
