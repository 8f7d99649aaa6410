"""How verify_buffer uses the C walker: it answers accepted buffers, the Python walker raises
every error (the same messages with the C walker on or off), a C walker stricter than the
Python one cannot make a valid file fail, and without the C walker everything still works."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

import kernelpack as kp
from kernelpack import _verify_native, verify
from kernelpack.errors import FormatError
from kernelpack.limits import FILE_IDENTIFIER

import kp_handwritten
import kp_samples

try:
    from kernelpack.runtime import _launch as _extension
except ImportError:  # no compiler, or Python 3.10
    _extension = None

needs_c = pytest.mark.skipif(not (_verify_native.walker if _verify_native.walker is not None
                                  else _verify_native.load()),
                             reason="kernelpack.runtime._launch built without _verify.c")


def outcome(buf: bytes, root_type: str, ident: bytes | None, **kw: Any) -> object:
    try:
        return verify.verify_buffer(buf, root_type, identifier=ident, **kw)
    except FormatError as exc:
        return f"FormatError: {exc}"


@needs_c
def test_accepted_buffers_are_answered_by_the_c_walker(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    fast = _verify_native.walker

    def spy(*args: Any) -> int:
        calls.append(fast(*args))
        return calls[-1]

    data = kp.save(kp_samples.rich())
    monkeypatch.setattr(_verify_native, "walker", spy)
    monkeypatch.setattr(verify, "_USE_C", True)
    pack = kp.load(data)
    assert pack["rowsum"].summary.name == "rowsum"
    assert len(calls) == 2 and min(calls) >= 0  # the file and its body, both accepted in C
    monkeypatch.setattr(verify, "_USE_C", False)
    kp.load(data)
    assert len(calls) == 2  # switched off: the Python walker alone


@needs_c
def test_error_messages_are_the_python_walkers_with_the_c_walker_on() -> None:
    from test_verify_c_differential import body_of

    rng = random.Random(5)
    data = kp.save(kp_samples.rich())
    errors = 0
    for i in range(800):
        root_type, ident, buf = (("Pack", FILE_IDENTIFIER, data) if i % 2 else
                                 ("Body", None, body_of(data)))
        b = bytearray(buf)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.5:
                b[rng.randrange(len(b))] = rng.randrange(256)
            else:
                p = rng.randrange(0, len(b) - 3, 4)
                struct.pack_into("<I", b, p, rng.choice((0, 1, 4, 0xFFFFFFFF, len(b))))
        on = outcome(bytes(b), root_type, ident)
        assert on == outcome(bytes(b), root_type, ident, _use_c=False)
        errors += isinstance(on, str)
    assert errors > 300, errors


def test_a_stricter_c_walker_cannot_fail_a_valid_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # the documented guard: on a C reject the Python walker decides, so a C bug that refuses
    # a valid file costs time, never a load (the differential tests show it does not happen)
    monkeypatch.setattr(_verify_native, "walker", lambda *args: -1)
    data = kp_handwritten.artifact()
    assert verify.verify_buffer(data, "Pack", identifier=FILE_IDENTIFIER) == \
        verify.verify_buffer(data, "Pack", identifier=FILE_IDENTIFIER, _use_c=False)
    assert kp.load(data).programs == ["t"]


def test_unknown_root_type_is_left_to_the_python_walker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_verify_native, "walker", lambda *args: pytest.fail("C walker called"))
    with pytest.raises(KeyError):
        verify.verify_buffer(kp_handwritten.artifact(), "NoSuchTable",
                             identifier=FILE_IDENTIFIER)


@pytest.mark.skipif(_extension is None, reason="the C extension is not built here")
def test_extension_without_the_c_walker_leaves_the_python_walker(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from kernelpack.runtime import _launch

    # an extension built without _verify.c: the module has no verify_fast
    monkeypatch.delattr(_launch, "verify_fast")
    monkeypatch.setattr(_verify_native, "walker", None)
    assert _verify_native.load() is False
    assert _verify_native.walker is False
    data = kp_handwritten.artifact()
    root = verify.verify_buffer(data, "Pack", identifier=FILE_IDENTIFIER)
    assert root == struct.unpack_from("<I", data, 0)[0]
    assert outcome(data[:-9], "Pack", FILE_IDENTIFIER).startswith("FormatError: file: ")


@needs_c
def test_a_new_plans_object_gets_a_new_description(monkeypatch: pytest.MonkeyPatch) -> None:
    # the description follows _PLANS by identity: a patched plan (here, Program.name's limit
    # lowered to 0) is what both walkers check
    from test_verify_c_differential import body_of

    body = body_of(kp_handwritten.artifact())
    assert outcome(body, "Body", None) == 4
    plans = dict(verify._PLANS)
    plans["Program"] = (("name", "str", 4, 4, None, 0),) + plans["Program"][1:]
    monkeypatch.setattr(verify, "_PLANS", plans)
    monkeypatch.setattr(verify, "_LAYOUTS", {})
    monkeypatch.setattr(verify, "_USE_C", True)
    got = outcome(body, "Body", None)
    assert "programs[0].name: string of 1 bytes exceeds the limit 0" in str(got)
    assert _verify_native._desc[0] is plans
    _, index, described = _verify_native._desc
    assert _verify_native.walker(body, index["Body"], None, described, 16, 1024,
                                 verify.MAX_FILE_SIZE, 8) == -1
