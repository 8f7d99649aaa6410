"""Objects crossing process boundaries: pickled expressions, summaries and Compiled stay equal
(and hash equal) in a process with another hash seed (a spawned worker), immutable records
pickle and copy, and a loaded pack's views refuse pickling with a TypeError saying what to send.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack._records import FrozenRecord
from kernelpack.loader import SignatureInfo

sys.path.insert(0, str(Path(__file__).parent))
from kp_samples import axpy, rich  # noqa: E402

_CHILD = """
import pickle, sys
sys.path.insert(0, sys.argv[1])
import kernelpack as kp
from kp_samples import axpy, rich
sent = pickle.loads(sys.stdin.buffer.read())
pack = kp.load(kp.save([axpy(), rich()]))
mine = [kp.cdiv(kp.sym("n"), 256) + kp.sym("m"), axpy(), rich(), rich().summary,
        pack.compiled("rowsum")]
for a, b in zip(sent, mine):
    assert a == b and hash(a) == hash(b) and {b: 1}.get(a) == 1, (a, b)
assert kp.save(sent[1:3]) == kp.save(mine[1:3])
print("ok")
"""


def test_pickled_objects_equal_in_a_process_with_another_hash_seed() -> None:
    pack = kp.load(kp.save([axpy(), rich()]))
    sent = [kp.cdiv(kp.sym("n"), 256) + kp.sym("m"), axpy(), rich(), rich().summary,
            pack.compiled("rowsum")]
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    env = dict(os.environ, PYTHONHASHSEED=seed)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).parent)],
                          input=pickle.dumps(sent), capture_output=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == b"ok", done.stderr.decode()[-2000:]


def test_expr_round_trips_recompute_hash_and_depth() -> None:
    e = kp.select(kp.sym("n") < 4, kp.sym("n") * 2, kp.cdiv(kp.sym("n"), 3))
    back = pickle.loads(pickle.dumps(e))
    assert back == e and hash(back) == hash(e) and back._depth == e._depth
    assert copy.copy(e) is e and copy.deepcopy(e) is e
    assert copy.deepcopy({"k": [e]})["k"][0] == e


@pytest.mark.parametrize("how", [lambda o: pickle.loads(pickle.dumps(o)), copy.copy,
                                 copy.deepcopy])
def test_frozen_records_pickle_and_copy(how) -> None:
    info = SignatureInfo("abcd", "00" * 32, True)
    back = how(info)
    assert back == info and hash(back) == hash(info) and type(back) is SignatureInfo
    with pytest.raises(AttributeError, match="immutable"):
        back.verified = False  # still frozen
    from kernelpack.runtime.selection import Selection

    image = axpy().modules[0].images[0]
    sel = Selection(image, image.arch, 13000, [(image, "exact")])
    assert how(sel) == sel


def test_rebuild_refuses_what_is_not_a_record() -> None:
    from kernelpack._records import _rebuild

    with pytest.raises(TypeError, match="cannot rebuild"):
        _rebuild(dict, ())
    with pytest.raises(TypeError, match="SignatureInfo has 3 fields"):
        _rebuild(SignatureInfo, ("a",))
    assert issubclass(SignatureInfo, FrozenRecord)


def test_loaded_module_info_refuses_pickle_and_says_what_to_send() -> None:
    pack = kp.load(kp.save([axpy()]))
    info = pack.modules["axpy"]
    for how in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match=r"ModuleInfo \('axpy'\).*\.module\(\)"):
            how(info)
    module = pickle.loads(pickle.dumps(info.module()))
    assert module == axpy().modules[0]


def test_threads_asking_a_pack_at_once_get_one_program(monkeypatch) -> None:
    import threading

    from kernelpack import loader

    pack = kp.load(kp.save([axpy()]))
    barrier = threading.Barrier(2)

    class Slow(loader.Program):
        def __init__(self, *args) -> None:
            barrier.wait(10)  # both threads are inside pack["axpy"] before either stores
            super().__init__(*args)

    monkeypatch.setattr(loader, "Program", Slow)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(pack["axpy"])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(got) == 2 and got[0] is got[1] is pack["axpy"]
