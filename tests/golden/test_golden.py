"""The committed format-1.0 and format-1.1 artifacts keep loading, forever.

Never regenerate a golden .kpack to make this pass: a failure here means a reader change broke
compatibility with files already in the field. (A new format version adds a new golden file.)
1.1 differs from 1.0 in one launch's ``reads_elsewhere`` and ``stores_after_loads`` (the
fields 1.1 added).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

import kernelpack as kp

HERE = Path(__file__).parent
MINORS = (0, 1)
sys.path.insert(0, str(HERE))
from make_golden import summaries  # noqa: E402


def _facts(minor: int) -> dict:
    return json.loads((HERE / f"format-1.{minor}.json").read_text())


@pytest.fixture(scope="module", params=MINORS, ids=[f"format-1.{m}" for m in MINORS])
def minor(request: pytest.FixtureRequest) -> int:
    return request.param


@pytest.fixture(scope="module")
def pack(minor: int) -> kp.Pack:
    return kp.load(HERE / f"format-1.{minor}.kpack")


def test_file_is_the_committed_one(minor: int) -> None:
    data = (HERE / f"format-1.{minor}.kpack").read_bytes()
    assert hashlib.sha256(data).hexdigest() == _facts(minor)["sha256"]


def test_loads_and_verifies(pack: kp.Pack, minor: int) -> None:
    assert pack.format_version == (1, minor)
    assert pack.programs == _facts(minor)["programs"] == ["axpy", "features"]
    assert pack.signature is None
    assert pack.generator.startswith("kernelpack ")
    pack.verify()


def test_summaries(pack: kp.Pack, minor: int) -> None:
    axpy, features = summaries(minor)
    assert pack["axpy"].summary == axpy
    assert pack["features"].summary == features
    launch = pack["features"].summary.variants[0].launches[0]
    assert launch.reads_elsewhere == (("x",) if minor else ())
    assert launch.stores_after_loads is bool(minor)


def test_images_and_raw_digests(pack: kp.Pack, minor: int) -> None:
    images = {i.target: i for i in pack.modules["axpy"].images}
    facts = _facts(minor)["images"]
    assert sorted(images) == sorted(facts) == ["compute_80", "sm_80", "sm_90"]
    for target, fact in facts.items():
        info = images[target]
        data = info.read()
        assert hashlib.sha256(data).hexdigest() == info.raw_digest == fact["raw_digest"]
        assert (len(data), info.codec, info.toolchain, info.cuda_version) == (
            fact["raw_size"], fact["codec"], fact["toolchain"], fact["cuda_version"])
    assert images["compute_80"].read() == (HERE / "axpy.ptx").read_bytes()
    assert images["compute_80"].ptx_isa == (8, 0)
    assert images["sm_90"].read()[:4] == b"\x7fELF"


def test_plans(pack: kp.Pack) -> None:
    plan = pack["axpy"].plan(x=(1000,), y=(1000,), a=2.0)
    assert plan.launches[0].grid == (4, 1, 1) and plan.launches[0].block == (256, 1, 1)
    assert plan.symbols == {"n": 1000, "n32": 1000}
    with pytest.raises(kp.ConstraintError, match="y.shape\\[0\\] is 5 but n = 4 from x.shape\\[0\\]"):
        pack["axpy"].plan((4,), (5,), 1.0)
    small = pack["features"].plan((2, 100), 2, 1.0, (100,))
    assert small.variant == 0 and small.allocations["out"].nbytes == 2 * 200 * 8
    big = pack["features"].plan((2, 10000), 5, 1.0, (10000,))
    assert big.variant == 1 and big.allocations["ws"].shape == (5000,)
    assert [ln.grid[0] for ln in big.launches] == [40, 20, 10]
    assert [ln.args[3] for ln in big.launches] == [("value", v, kp.u32) for v in (6, 7, 9)]


def test_resaving_keeps_summaries_and_images(pack: kp.Pack) -> None:
    # Not byte equality: stored bytes depend on the zstd library's version, raw bytes do not.
    again = kp.load(kp.save(pack))
    assert again.format_version == pack.format_version  # the oldest version that holds it
    assert again.programs == pack.programs
    assert all(again[n].summary == pack[n].summary for n in pack.programs)
    assert [i.raw_digest for i in again.modules["axpy"].images] == \
        [i.raw_digest for i in pack.modules["axpy"].images]
