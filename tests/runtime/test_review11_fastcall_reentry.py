"""Eleventh review of the C fast path (``_launch.FastCall``): Python code that runs in the
middle of a call (a tensor's ``shape``, a finalizer, a hook, a comparison or hash, the driver's
launch while the GIL is released) and calls again, empties the plan-entry cache or the device
states must not leave the call using freed memory.

Each test drives a FastCall directly, launching through a ctypes stand-in for the driver's
``cuLaunchKernel`` that records each launch's parameter block (and may run Python, as another
thread could while the GIL is released). Against the pre-fix code, under
``-fsanitize=address``, the first three report a use-after-free or a double free (without the
sanitizer they see the freed entry or state through finalizers, or crash); the others guard
paths that were already safe (what the call holds across each callback)."""

from __future__ import annotations

import ctypes
import gc
import struct
from typing import Any, Callable

import pytest

_launch = pytest.importorskip("kernelpack.runtime._launch",
                              reason="the C extension kernelpack.runtime._launch is not built")

FUNC = 0x5150  # the function handle of every launch here
F32 = object()  # the tensors' dtype (compared by identity, as torch's are)
BLOCK = 24      # x pointer (Q), z pointer (Q), the float scalar or a template value (f)

_PROTO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7),
                          ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class Driver:
    """What the driver's cuLaunchKernel receives: each launch's (function, grid x, stream,
    (x pointer, z pointer, float)), and ``during``: Python run inside the launch, where the
    real driver lets other threads run (the GIL is released)."""

    def __init__(self) -> None:
        self.launches: list[tuple] = []
        self.during: Callable[[], None] | None = None
        self.error = 0  # the CUresult every launch answers
        self.entry = _PROTO(self._launch)
        _launch.bind(ctypes.cast(self.entry, ctypes.c_void_p).value)

    def _launch(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra) -> int:
        x, z = (struct.unpack("<Q", ctypes.string_at(params[k], 8))[0] for k in (0, 1))
        value = struct.unpack("<f", ctypes.string_at(params[2], 4))[0]
        self.launches.append((f, gx, stream or 0, (x, z, value)))
        during, self.during = self.during, None
        if during is not None:
            during()
        return self.error


_drivers: list[Driver] = []  # bound callbacks stay alive: another test may launch later


@pytest.fixture
def driver() -> Driver:
    d = Driver()
    _drivers.append(d)
    _launch.forget_contexts()  # each test's first default-stream launch asks for the context
    return d


class Tensor:
    """A torch-like tensor over host memory whose ``shape`` is a new object per read (as
    torch.Size is), of ``shape_type``."""

    shape_type: type = tuple

    def __init__(self, n: int, device: Any = 0) -> None:
        self.n = n
        self.buf = ctypes.create_string_buffer(4 * max(n, 1))
        self.device = device
        self.dtype = F32

    @property
    def shape(self) -> tuple:
        return self.shape_type((self.n,))

    def data_ptr(self) -> Any:
        return ctypes.addressof(self.buf)

    def get_device(self) -> Any:
        return self.device

    def is_contiguous(self) -> bool:
        return True


class State:
    """A device state: ``flat`` is its function handles; ``on_del`` runs when it is freed."""

    def __init__(self, on_del: Callable[[], None] | None = None) -> None:
        self.flat = [FUNC]
        self.on_del = on_del

    def __del__(self) -> None:
        if self.on_del is not None:
            self.on_del()


class Hooks:
    """fast_native.Hooks' protocol with one launch per key: the output shaped like x,
    allocated like it, the float from the call (slot 2) or, with ``template``, from the
    entry's parameter block template."""

    def __init__(self, template: float | None = None, launches: int = 1) -> None:
        self.template = template
        self.launches = launches
        self.entries: list[tuple] = []
        self.slow_calls: list[tuple] = []
        self.lost: list[Any] = []
        self.marker: Callable[[], Any] | None = None

    def entry(self, key: tuple) -> tuple:
        self.entries.append(key)
        (n,), = key
        block = struct.pack("<QQf4x", 0, 0, self.template or 0.0)
        shapes = ((n,),) if self.marker is None else (self.marker(),)
        return (shapes, (0,), tuple((0, n, 1, 1, 1, 1, 1, 0, block)
                                    for _ in range(self.launches)), (), False, (0, ()), None)

    def slow(self, args, out, stream) -> str:
        self.slow_calls.append(args)
        return "slow"

    def context_was_lost(self, st) -> bool:
        self.lost.append(id(st))  # not st: the tests watch when states are freed
        return False

    def stream_handle(self, stream) -> int:
        return int(stream)

    def launch_failed(self, *args) -> None:
        raise RuntimeError(f"launch failed {args}")


def fast_call(hooks: Hooks, states: dict, tensor_type: type = Tensor,
              empty_like: Callable | None = None, from_template: bool = False) -> Any:
    """FastCall for (x: tensor, a: float) -> z shaped like x; the float parameter is read
    from the call (slot 2) or, ``from_template``, taken from each entry's template."""
    dyn = ((0, "Q", 0), (8, "Q", 1)) + (() if from_template else ((16, "f", 2),))
    return _launch.FastCall(tensor_type, empty_like or (lambda t: tensor_type(t.n)),
                            lambda device: 0, hooks, states, 2, ((0, 0, F32),), ((1, 2),), (),
                            ((1, F32),), 3, ((BLOCK, (0, 8, 16), dyn),), True)


# ---- the entry cache emptied while an entry is in use --------------------------------------
class Marked(tuple):
    """An entry's output shape that records its release: the entry was freed with it."""

    freed: list = []

    def __del__(self) -> None:
        Marked.freed.append(tuple(self))


class ShapeDel(tuple):
    """A shape whose release (the end of the key holding it) runs ``armed`` once."""

    armed: Callable[[], None] | None = None

    def __del__(self) -> None:
        run, ShapeDel.armed = ShapeDel.armed, None
        if run is not None:
            run()


class ShapeDelTensor(Tensor):
    shape_type = ShapeDel


def test_an_entry_evicted_by_the_keys_release_stays_alive(driver) -> None:
    """The key's shape is released right after the entry is looked up; its finalizer calls
    300 other shapes, which fill the cache past its 256 entries and clear it. The call's
    entry (a borrowed reference before the fix) was freed and then used."""
    hooks, state = Hooks(), State()
    fc = fast_call(hooks, {0: state}, tensor_type=ShapeDelTensor)
    hooks.marker = lambda: Marked((7,))
    x = ShapeDelTensor(7)
    z = fc.call((x, 1.5), None, None)  # the entry for (7,)
    hooks.marker = None
    Marked.freed.clear()
    seen: list = []

    def flood() -> None:
        for n in range(100, 400):
            fc.call((ShapeDelTensor(n), 0.5), None, None)
        seen.append(list(Marked.freed))

    ShapeDel.armed = flood
    z = fc.call((x, 2.5), None, None)  # a cache hit, then the flood
    assert seen == [[]]  # the entry in use was not freed by the flood
    assert Marked.freed == [(7,)]  # ... but once the call was done with it
    assert driver.launches[-1][3] == (x.data_ptr(), z.data_ptr(), 2.5)
    assert driver.launches[-1][1] == 7 and len(driver.launches) == 302
    assert fc.entries == 300 - 255 and fc.fast_calls == 302  # cleared at 256


def test_the_device_state_outlives_hooks_that_drop_it(driver) -> None:
    """hooks.entry (and a shape's __hash__) run Python between the state's lookup and its
    use: one that empties the states freed the state the call then launched on."""
    freed: list = []
    states = {0: State(on_del=lambda: freed.append(True))}
    state_id = id(states[0])
    hooks = Hooks()
    original = hooks.entry

    def entry(key):
        states.clear()  # the only other reference to the device state
        assert not freed  # the call still holds it
        return original(key)

    hooks.entry = entry
    fc = fast_call(hooks, states)
    x = Tensor(3)
    z = fc.call((x, 1.0), None, None)
    assert driver.launches == [(FUNC, 3, 0, (x.data_ptr(), z.data_ptr(), 1.0))]
    assert hooks.lost == [state_id]  # the context was checked on the state looked up
    assert fc.call((x, 1.0), None, None) == "slow"  # no state any more: the general path
    assert not freed  # the FastCall remembers the state's handles (and holds it)
    del fc
    gc.collect()
    assert freed == [True]


def test_a_replaced_state_whose_release_calls_again(driver) -> None:
    """The remembered device state's function handles are replaced when the state changes;
    the old state's release ran Python that called again, which freed the old handle array a
    second time (and the old state too) before the fix."""
    hooks = Hooks()
    calls: list = []
    states: dict = {}
    fc = fast_call(hooks, states)
    x = Tensor(4)

    def again() -> None:
        calls.append(fc.call((x, 3.0), None, None))

    states[0] = State(on_del=again)
    fc.call((x, 1.0), None, None)  # remembers the state's handles
    states[0] = State()            # the old one is held by the FastCall alone now
    z = fc.call((x, 2.0), None, None)
    assert len(calls) == 1 and calls[0] is not z
    assert [launch[3][2] for launch in driver.launches] == [1.0, 3.0, 2.0]
    assert driver.launches[-1][3][:2] == (x.data_ptr(), z.data_ptr())
    assert fc.fast_calls == 3


def test_the_cache_cleared_during_a_launch_leaves_the_entry_whole(driver) -> None:
    """Between launches of one entry the GIL is released; another thread (here the launch
    itself) may clear the cache and replace the device state: the remaining launches keep
    the entry's templates and the handles they started with."""
    hooks = Hooks(template=4.25, launches=3)
    states = {0: State()}
    fc = fast_call(hooks, states, from_template=True)
    x = Tensor(5)
    fc.call((x, 0.0), None, None)

    def flood() -> None:
        states[0] = State()  # the remembered state's handles are replaced by the next call
        states[0].flat = [FUNC + 1]
        for n in range(100, 400):
            fc.call((Tensor(n), 0.0), None, None)

    driver.launches.clear()
    driver.during = flood
    z = fc.call((x, 0.0), None, None)
    ours = [launch for launch in driver.launches if launch[1] == 5]
    assert [launch[0] for launch in ours] == [FUNC] * 3
    assert all(launch[3] == (x.data_ptr(), z.data_ptr(), 4.25) for launch in ours)
    assert len(driver.launches) == 3 + 3 * 300


class HashFlood(tuple):
    """A shape whose hashing (the cache lookup of the key holding it) runs ``armed`` once."""

    armed: Callable[[], None] | None = None

    def __hash__(self) -> int:
        run, HashFlood.armed = HashFlood.armed, None
        if run is not None:
            run()
        return tuple.__hash__(self)


class HashFloodTensor(Tensor):
    shape_type = HashFlood


def test_a_lookup_that_calls_again_and_clears_the_cache(driver) -> None:
    """The key's hashing calls 300 other shapes (the cache is cleared under the lookup) and
    drops the device state the call looked up; the call then plans its own key."""
    hooks = Hooks()
    states = {0: State()}
    fc = fast_call(hooks, states, tensor_type=HashFloodTensor)
    x = HashFloodTensor(9)

    def flood() -> None:
        for n in range(100, 400):
            fc.call((HashFloodTensor(n), 0.5), None, None)
        states[0] = State()

    HashFlood.armed = flood
    z = fc.call((x, 2.0), None, None)
    assert driver.launches[-1] == (FUNC, 9, 0, (x.data_ptr(), z.data_ptr(), 2.0))
    assert hooks.entries[-1] == ((9,),) and len(driver.launches) == 301


def test_hooks_entry_calling_again_with_the_same_key(driver) -> None:
    """A nested call stores the key first; the outer call's entry then replaces it (freeing
    the nested one, which is done) and launches its own values."""
    hooks = Hooks()
    fc = fast_call(hooks, {0: State()})
    x, inner = Tensor(6), []
    original = hooks.entry

    def entry(key):
        if not inner:
            inner.append(None)
            inner[0] = fc.call((x, 9.0), None, None)
        return original(key)

    hooks.entry = entry
    z = fc.call((x, 1.0), None, None)
    assert [launch[3] for launch in driver.launches] == [
        (x.data_ptr(), inner[0].data_ptr(), 9.0), (x.data_ptr(), z.data_ptr(), 1.0)]
    assert fc.entries == 1 and len(hooks.entries) == 2
    fc.call((x, 1.0), None, None)
    assert len(hooks.entries) == 2  # the stored entry is used


class EqFlood(tuple):
    """out='s shape, whose comparison with the entry's runs ``armed`` once."""

    armed: Callable[[], None] | None = None

    def __eq__(self, other: object) -> bool:
        run, EqFlood.armed = EqFlood.armed, None
        if run is not None:
            run()
        return tuple.__eq__(self, other)

    __hash__ = tuple.__hash__


class EqFloodTensor(Tensor):
    shape_type = EqFlood


def test_an_out_whose_shape_comparison_calls_again(driver) -> None:
    """out='s shape is compared with the entry's while the call holds the entry and the
    state: the comparison evicts every entry and replaces the state."""
    hooks, states = Hooks(), {0: State()}
    fc = fast_call(hooks, states, tensor_type=EqFloodTensor)
    x, out = EqFloodTensor(8), EqFloodTensor(8)
    fc.call((x, 1.0), None, None)

    def flood() -> None:
        for n in range(100, 400):
            fc.call((EqFloodTensor(n), 0.5), None, None)
        states[0] = State()

    EqFlood.armed = flood
    assert fc.call((x, 3.0), out, None) is out
    assert driver.launches[-1] == (FUNC, 8, 0, (x.data_ptr(), out.data_ptr(), 3.0))


class LoudFloat(float):
    def __float__(self) -> float:  # never asked: a float subclass goes to the general path
        raise AssertionError("__float__ called")


def test_scalar_subclasses_are_not_converted_here(driver) -> None:
    hooks = Hooks()
    fc = fast_call(hooks, {0: State()})
    assert fc.call((Tensor(2), LoudFloat(1.0)), None, None) == "slow"
    assert not driver.launches and not hooks.entries
