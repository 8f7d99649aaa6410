"""``cache._once.WarnedOnce``: each thing warned about once, within a bound."""

from __future__ import annotations

from kernelpack.cache._once import WarnedOnce


def test_first_is_true_once_per_item() -> None:
    once = WarnedOnce()
    assert once.first(("revoked", "ab")) and not once.first(("revoked", "ab"))
    assert once.first(("too large", "ab")) and once.first("cd") and not once.first("cd")


def test_past_the_limit_everything_is_forgotten() -> None:
    once = WarnedOnce(limit=2)
    assert once.first("a") and once.first("b")
    assert once.first("c")  # the memory was full: cleared, then "c" recorded
    assert once.first("a") and not once.first("c")
