"""Flip every bit of a small artifact and truncate it at every length: each case must raise a
KernelPackError from load() or verify(), or still verify (a flip in unused padding or in a
field whose change is harmless). Anything else — IndexError, struct.error, a hang — fails.

Run with ``-s`` to print the figures (cases, errors by class, harmless).
"""

from __future__ import annotations

import collections
from typing import Callable

import kernelpack as kp
from kernelpack.errors import KernelPackError

import kp_samples


def outcome(data: bytes) -> str:
    """The class name of the KernelPackError raised, or "harmless"; other exceptions escape."""
    try:
        pack = kp.load(data)
        pack.verify()
        for name in pack.programs:  # a harmless flip must still give a usable program
            pack[name].planner
    except KernelPackError as exc:
        return type(exc).__name__
    return "harmless"


def sweep(data: bytes, cases: Callable[[bytes], list[bytes]]) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for case in cases(data):
        counts[outcome(case)] += 1  # a non-KernelPackError propagates and fails the test
    return counts


def bit_flips(data: bytes) -> list[bytes]:
    out = []
    for i in range(len(data)):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[i] ^= 1 << bit
            out.append(bytes(flipped))
    return out


def truncations(data: bytes) -> list[bytes]:
    return [data[:n] for n in range(len(data))]


def test_every_bit_flip() -> None:
    data = kp.save(kp_samples.tiny())
    assert len(data) < 1024  # keeps the sweep well under a minute
    counts = sweep(data, bit_flips)
    assert sum(counts.values()) == 8 * len(data)
    # Most bytes are metadata under the body digest or checked structure: harmless flips
    # (padding, unused vtable bytes) must stay a small minority.
    assert counts["harmless"] < 0.1 * sum(counts.values())
    print(f"\nbit flips of a {len(data)}-byte artifact: {dict(counts)}")


def test_every_truncation() -> None:
    data = kp.save(kp_samples.tiny())
    counts = sweep(data, truncations)
    assert counts["harmless"] == 0 and sum(counts.values()) == len(data)
    print(f"\ntruncations of a {len(data)}-byte artifact: {dict(counts)}")


def test_flips_in_a_signed_rich_artifact_sampled() -> None:
    # The rich program exercises every table; sample every 7th bit to stay fast.
    from kernelpack.signing import generate_private_key, public_key_bytes
    key = generate_private_key()
    data = kp.save(kp_samples.rich(), sign_with=key)
    counts: collections.Counter = collections.Counter()
    for i in range(0, 8 * len(data), 7):
        flipped = bytearray(data)
        flipped[i // 8] ^= 1 << (i % 8)
        try:
            kp.load(bytes(flipped), trusted_keys=[public_key_bytes(key)]).verify()
            counts["harmless"] += 1
        except KernelPackError as exc:
            counts[type(exc).__name__] += 1
    assert counts["SignatureError"] > 0 and counts["IntegrityError"] > 0
    print(f"\nsampled flips of a signed {len(data)}-byte artifact: {dict(counts)}")


def test_fuzz_target_smoke() -> None:
    import fuzz_load

    fuzz_load.run_hypothesis(200)
