"""kernelpack's GPU side: the only package that reaches the CUDA driver.

``call_program`` launches a loaded program (what ``pack["name"](...)`` does); ``warmup``
loads a pack's modules onto devices ahead of the first call. Image selection
(:mod:`.selection`) is pure Python and usable without a GPU. ``import kernelpack`` imports
these modules (so that a first call imports nothing), but never ``cuda.bindings``, and opens
no driver: the first launch or ``warmup`` does, through ctypes over ``libcuda.so.1`` on Linux
(:mod:`.libcuda`), or ``cuda.bindings.driver`` elsewhere and with
``KERNELPACK_DRIVER=cuda-bindings`` (:mod:`.driver`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from ..dtypes import strict_index

from .selection import PTX_ISA_BY_CUDA, Selection, explain, max_ptx_isa, select_image

if TYPE_CHECKING:  # imported on first use (see __getattr__)
    from .buffer import DeviceBuffer

__all__ = ["call_program", "warmup", "select_image", "explain", "Selection", "max_ptx_isa",
           "PTX_ISA_BY_CUDA", "DeviceBuffer"]


def call_program(program: Any, *args: Any, out: Any = None, stream: Any = None,
                 **kwargs: Any) -> Any:
    """Launch ``program`` (a loaded ``Program`` or a ``kp.Compiled``) on the device of its
    tensor arguments.

    Parameters
    ----------
    program:
        What ``pack[name]`` returns (or a :class:`kernelpack.Compiled`).
    *args, **kwargs:
        The program's inputs in ``summary.inputs`` order (or by name): torch tensors, cupy
        arrays, objects with ``__cuda_array_interface__``/``__dlpack__``, and Python scalars.
    out:
        Preallocated outputs: one array, a tuple/list in output order, or ``{name: array}``.
    stream:
        A torch/cupy stream, a ``CUstream`` or an int handle; default: the current stream of
        the caller's framework (the NULL stream without one).

    Returns
    -------
    The output (one), a tuple (several), or None (none), in the inputs' framework: torch in,
    torch out; cupy in, cupy out; otherwise :class:`DeviceBuffer`.

    Raises
    ------
    LaunchError
        Wrong dtype, rank, device or layout of an argument (message names it), or a driver
        failure (chained to the CUresult). DeviceError when there is no GPU or driver, or
        when an argument names a device this process cannot see (the message names it).
    ConstraintError
        Shapes or scalars violate the summary.
    CompatibilityError
        No image of a module fits this device and driver.
    """
    bound = getattr(program, "_kp_bound", None)
    if bound is None:
        from .launcher import bind

        bound = bind(program)
    if kwargs:
        args = _merge_kwargs(bound, args, kwargs)
    return bound.call(args, out, stream)


def _merge_kwargs(bound: Any, args: tuple, kwargs: dict) -> tuple:
    from .._plan_types import merge_inputs

    for key in kwargs:
        if key not in bound._input_names:
            _not_an_input(bound, key)
    return tuple(merge_inputs(bound.name, bound._input_names, args, kwargs))


def _not_an_input(bound: Any, key: str) -> None:
    """TypeError for a keyword naming an output (``z=buf`` where ``out=`` was meant) or a
    computed scalar, saying which it is, as ``plan()`` does; other names are left to
    ``merge_inputs`` ("has no input")."""
    from ..summary import Tensor

    for p in bound.bound.summary.params:
        if p.name != key:
            continue
        what = (f"an output: kernelpack allocates it, or pass your array as out= "
                f"(out={{{key!r}: array}})" if isinstance(p, Tensor)
                else "computed from the shapes, never passed")
        raise TypeError(f"{bound.name}: {key!r} is not an input, it is {what} "
                        f"(inputs: {list(bound._input_names)})")


def warmup(pack: Any, devices: Iterable[int] | None = None) -> None:
    """Load every program's modules of ``pack`` onto ``devices`` now (default: the device of
    the calling thread's current context, else 0), including the per-context function load,
    so that the first call pays no loading cost. ``pack`` is a loaded ``Pack``, a single
    program, or an iterable of programs / ``kp.Compiled``.

    Raises CompatibilityError, CompileError, LaunchError or DeviceError as a call would.
    """
    from .device import check_ordinal, current_device_ordinal, get_device
    from .launcher import bind

    devices = _device_list(devices)
    if hasattr(pack, "programs") and hasattr(pack, "__getitem__") and \
            isinstance(getattr(pack, "programs"), list):
        programs = [pack[name] for name in pack.programs]
    elif hasattr(pack, "summary"):
        programs = [pack]
    else:
        try:
            programs = list(pack)
        except TypeError:
            raise TypeError(f"warmup takes a Pack, a program or an iterable of programs "
                            f"(got {type(pack).__name__})") from None
        for program in programs:
            if not hasattr(program, "summary"):
                raise TypeError(f"warmup: {program!r} is not a program (pass pack[name] or a "
                                f"kp.Compiled)")
    if devices is None:
        devices = [current_device_ordinal()]
    for ordinal in devices:  # every device checked before any program loads on one
        check_ordinal(ordinal, "warmup(devices=...)")
        get_device(ordinal)
    for program in programs:
        bound = bind(program)
        for ordinal in devices:
            bound.warmup(ordinal)


def _device_list(devices: Iterable[int] | None) -> list[int] | None:
    """``devices=`` as a list of ordinals, checked before anything loads: ``int(d)`` would
    turn ``1.5`` or ``True`` into device 1 and ``"01"`` into devices 0 and 1."""
    if devices is None:
        return None
    if isinstance(devices, (int, str, bytes)):
        raise TypeError(f"warmup: devices= takes a list of device ordinals, e.g. [0] "
                        f"(got {type(devices).__name__} {devices!r})")
    out = []
    for d in devices:
        try:
            out.append(strict_index(d))  # a bool, Python's or NumPy's, is no ordinal
        except TypeError:
            raise TypeError(f"warmup: devices= holds {d!r} ({type(d).__name__}), expected an "
                            f"int device ordinal") from None
    return out


def __getattr__(name: str) -> Any:
    if name == "DeviceBuffer":  # lazily: it pulls in the driver module (not the bindings)
        from .buffer import DeviceBuffer

        return DeviceBuffer
    raise AttributeError(name)
