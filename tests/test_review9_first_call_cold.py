"""Cold costs taken off a fresh process's ``kp.load`` + first call (review 9), pinned by what
the code does rather than by timings: an unsigned load never asks the ``Iterable`` ABC about
``None`` (a cold negative ABC check walks every class registered with it), the image module
builds no ``typing.Union`` at import, the ctypes driver door creates no ctypes class per
signature (nor a ``c_char * n`` for the device name) while converting each entry point's
arguments as before, and images naming one blob share its view."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import loader
from kernelpack.compiled import Compiled, Image, Module
from kernelpack.summary import Arg, KernelSummary, Launch, Variant

sys.path.insert(0, str(Path(__file__).parent / "runtime"))
from c_fake_driver import CFakeLibcuda  # noqa: E402
from fake_driver import FakeDriver  # noqa: E402


def _artifact() -> bytes:
    summary = KernelSummary("p", (kp.Tensor("x", kp.f32, ("n",)),),
                            (Variant((Launch("k", "m", (1,), (1,), (Arg.buffer("x"),)),)),))
    image = Image("cubin", "sm_90", b"\x7fELF" + bytes(60), "test", 13000)
    return kp.save(Compiled(summary, (Module("m", ("k",), (image,)),)))


class _Watching(type):
    """Stands in for ``typing.Iterable`` in the loader: records what it is asked about."""

    asked: list[object] = []

    def __instancecheck__(cls, obj: object) -> bool:
        cls.asked.append(obj)
        return hasattr(obj, "__iter__")


class _Iterable(metaclass=_Watching):
    pass


def test_unsigned_load_does_not_ask_the_iterable_abc_about_none(monkeypatch) -> None:
    data = _artifact()
    _Watching.asked = []
    monkeypatch.setattr(loader, "Iterable", _Iterable)
    pack = kp.load(data)
    assert pack.signature is None and list(pack) == ["p"]
    assert _Watching.asked == []
    kp.load(data, trusted_keys=None)
    assert _Watching.asked == []


@pytest.mark.parametrize("keys", [[], ()])
def test_trusted_keys_still_go_through_the_iterable_check(monkeypatch, keys) -> None:
    # an empty list of keys is "trust nobody": the unsigned artifact is refused, as before
    _Watching.asked = []
    monkeypatch.setattr(loader, "Iterable", _Iterable)
    with pytest.raises(kp.SignatureError, match="unsigned, but trusted_keys were given"):
        kp.load(_artifact(), trusted_keys=keys)
    assert _Watching.asked == [keys]


def test_keys_from_a_generator_or_a_set_are_still_read_once() -> None:
    from kernelpack import signing

    key = signing.generate_private_key()
    pub = signing.public_key_bytes(key)
    other = signing.public_key_bytes(signing.generate_private_key())
    signed = kp.save(kp.load(_artifact()).compiled("p"), sign_with=key)
    assert kp.load(signed, trusted_keys=(k for k in (other, pub))).signature.verified
    assert kp.load(signed, trusted_keys={pub}).signature.verified
    with pytest.raises(kp.SignatureError, match="not trusted"):
        kp.load(signed, trusted_keys=iter([other]))


def test_a_bare_non_iterable_key_is_still_one_key() -> None:
    with pytest.raises(ValueError, match="not an ed25519 public key.*got 12345"):
        kp.load(_artifact(), trusted_keys=12345)


def test_images_module_builds_no_typing_union_at_import() -> None:
    code = ("import typing, sys\n"
            "made = []\n"
            "orig = typing._SpecialForm.__getitem__\n"
            "def spy(self, params):\n"
            "    if self._name == 'Union':\n"
            "        made.append(sys._getframe(1).f_globals.get('__name__'))\n"
            "    return orig(self, params)\n"
            "typing._SpecialForm.__getitem__ = spy\n"
            "import kernelpack._images\n"
            "print([m for m in made if m and m.startswith('kernelpack._images')])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_libcuda_entry_points_share_one_function_type() -> None:
    from kernelpack.runtime import libcuda

    fake = FakeDriver()
    drv = libcuda.LibCuda(CFakeLibcuda(fake).get_proc_address, per_thread=False, native=False)
    types_before = dict(ctypes._c_functype_cache)
    fns = {name: drv._fn(name) for name in libcuda._SPECS}
    assert ctypes._c_functype_cache == types_before  # no CFUNCTYPE made per signature
    assert len({type(fn) for fn in fns.values()}) == 1
    for name, fn in fns.items():
        assert tuple(fn.argtypes) == libcuda._SPECS[name], name
        assert fn.restype is ctypes.c_int, name
    # the argument types still convert: a 64-bit handle and an output pointer round-trip
    err, count = drv.cuDeviceGetCount()
    assert (err, count) == (0, fake.cuDeviceGetCount()[1])
    assert drv.cuInit(0) == (0,)


def test_open_driver_types_the_library_function_in_place(monkeypatch) -> None:
    import types

    from kernelpack.runtime import libcuda

    fake = FakeDriver()
    c = CFakeLibcuda(fake)
    entry = libcuda._ENTRY(ctypes.cast(c.get_proc_address, ctypes.c_void_p).value)
    opened = []

    def cdll(name: str) -> object:
        opened.append(name)
        return types.SimpleNamespace(cuGetProcAddress_v2=entry)

    monkeypatch.setattr(libcuda.ctypes, "CDLL", cdll)
    monkeypatch.setattr(libcuda, "_native_caller", lambda: None)  # the ctypes door
    types_before = dict(ctypes._c_functype_cache)
    drv = libcuda.open_driver(per_thread=False)
    assert opened == ["libcuda.so.1"] and drv._get is entry
    assert tuple(entry.argtypes) == libcuda._GET_PROC_ADDRESS_ARGS
    assert entry.restype is ctypes.c_int
    assert drv.cuInit(0) == (0,) and drv.cuDriverGetVersion() == (0, fake.cuDriverGetVersion()[1])
    assert ctypes._c_functype_cache == types_before
    assert [name for name, _, _ in c.lookups] == ["cuInit", "cuDriverGetVersion"]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("length", [256, 5, 0])
def test_device_name_is_read_without_a_new_array_type(monkeypatch, length, native) -> None:
    from kernelpack.runtime import libcuda

    fake = FakeDriver()
    drv = libcuda.LibCuda(CFakeLibcuda(fake).get_proc_address, per_thread=False, native=native)

    def no_new_array_type(*args: object) -> None:
        raise AssertionError("create_string_buffer makes a c_char * n class per length")

    monkeypatch.setattr(libcuda.ctypes, "create_string_buffer", no_new_array_type)
    err, raw = drv.cuDeviceGetName(length, 0)
    expected = fake.cuDeviceGetName(length, 0)[1]
    assert err == 0 and len(raw) == length and raw == bytes(expected[:length]).ljust(length, b"\0")


def test_images_naming_one_blob_share_its_view() -> None:
    """The same cubin in two modules is one blob: load makes its view once."""
    image = Image("cubin", "sm_90", b"\x7fELF" + bytes(60), "test", 13000)
    programs = []
    for i in range(2):
        summary = KernelSummary(f"p{i}", (kp.Tensor("x", kp.f32, ("n",)),),
                                (Variant((Launch("k", f"m{i}", (1,), (1,),
                                                 (Arg.buffer("x"),)),)),))
        programs.append(Compiled(summary, (Module(f"m{i}", ("k",), (image,)),)))
    pack = kp.load(kp.save(programs))
    a, b = (pack.modules[f"m{i}"].images[0] for i in range(2))
    assert a.blob == b.blob and a._stored is b._stored
    assert a.read() == b.read() == image.data
    from kernelpack._fbread import Table

    buf = memoryview(kp.save(programs))
    blobs = Table.root(buf, "Pack").byte_views("blobs")
    assert len(blobs) == 1 and blobs[0] is blobs[0] and bytes(blobs[0]) == bytes(a._stored)
    with pytest.raises(IndexError):
        blobs[1]
    with pytest.raises(IndexError):
        blobs[-1]
