"""Review 36: the fixes of reviews 35b/35c/35d (commits 809c8cd, 22c9dc1, 8f44f55), attacked.

Each finding is a fix that is incomplete (the same bug through another path), a regression
(behaviour that worked at 6948bd2 and broke), or a too-narrow bound. Every test here fails on
the code it was written against and passes once the bug is fixed; a few at the end pin down
what the fixes got right.

Redis tests start their own redis-server on a free loopback port, or point at a port where
nothing listens (a down Redis), or at a socket that accepts and never answers (a hung Redis).
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_review35_complexity import _repeated_launch_program
from kp_redis_helpers import HungServer, down_url, free_port, hung_server, redis_server
from kp_samples import axpy

import kernelpack as kp
from kernelpack.cache import CacheWarning
from kernelpack.signing import generate_private_key

KP_BIN = Path(sys.executable).with_name("kernelpack")
FAKE_CUBIN = b"\x7fELF" + bytes(120)
K1 = "a1" * 32


# ---- helpers --------------------------------------------------------------------------------
_free_port, _down_url, _HungServer = free_port, down_url, HungServer


@pytest.fixture()
def hung() -> Iterator[HungServer]:
    with hung_server() as server:
        yield server


@pytest.fixture()
def redis_port(tmp_path: Path) -> Iterator[int]:
    """A real redis-server on a free loopback port (its port)."""
    with redis_server(tmp_path) as port:
        yield port


def _where(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__} at {w.filename}:{w.lineno}: {str(w.message)[:150]}"
            for w in caught]


def _big_program(nbytes: int) -> kp.Compiled:
    """axpy with one incompressible cubin of ``nbytes``: an artifact of about that size."""
    image = kp.Image("cubin", "sm_80", b"\x7fELF" + os.urandom(nbytes), "t", 12080)
    return axpy(images=(image,))


# ---- ops.dim_expr: the depth check (22c9dc1) ------------------------------------------------
@pytest.mark.parametrize("op", ["arange", "pad"])
def test_size_from_a_long_chain_of_traced_steps_is_no_recursion_error(op: str) -> None:
    """BUG (fix incomplete): the new depth check in ops.dim_expr runs after _dim_expr, which
    still walks the traced graph recursively (two Python frames per op). A size computed from
    an integer parameter in 600 small steps (m = m + 1: the expression is just ``k + 600``,
    depth 2) dies with RecursionError in kp.arange / kp.pad instead of tracing."""
    @kp.fusion
    def r36_chain(x: kp.Tensor[kp.f32, "n"], k: kp.i64):
        m = k
        for _ in range(600):
            m = m + 1
        if op == "arange":
            return kp.arange(m).astype(kp.f32)
        return kp.pad(x, m)

    try:
        r36_chain.trace()
    except RecursionError as exc:
        pytest.fail(f"kp.{op} of k + 600 (built in 600 steps): RecursionError: {exc}")
    except kp.TraceError as exc:  # a refusal is acceptable if it is a named kernelpack error
        assert "r36_chain" in str(exc), str(exc)


def _size_of_depth(x: object, depth: int) -> kp.Expr:
    m = x.shape[0]  # type: ignore[attr-defined]
    while m._depth < depth:
        m = (m * 3) // 2 if m._depth + 2 <= depth else m * 3
    assert m._depth == depth
    return m


@pytest.mark.parametrize("depth", [255, 256])
def test_size_at_the_depth_limit_is_refused_at_trace_or_can_be_saved(depth: int) -> None:
    """BUG (fix incomplete): dim_expr refuses a size deeper than MAX_EXPR_DEPTH (256) "at the
    trace ... (kp.iota/kp.pad compiled what nothing could save)". A size of depth 255 or 256
    passes that check, but the summary wraps it (the grid's cdiv, a constraint), so
    kp.compile succeeds and kp.save refuses the result ('grid[0]: expression nested deeper
    than 256'): the same compiled-but-unsavable program, one level below the bound."""
    @kp.fusion
    def r36_edge(x: kp.Tensor[kp.f32, "n"]):
        return kp.arange(_size_of_depth(x, depth)).astype(kp.f32)

    try:
        r36_edge.trace()
    except kp.TraceError:
        return  # refused at the trace, by name: right
    compiled = kp.compile(r36_edge, targets=["sm_80"])
    try:
        kp.save([compiled])
    except ValueError as exc:
        pytest.fail(f"a size of depth {depth} traced and compiled, but kp.save refuses it: "
                    f"{exc}")


# ---- warnings as errors must not block a key for good (809c8cd) -----------------------------
def test_revoked_disk_signer_under_warnings_as_errors_does_not_block_the_key(
        tmp_path: Path) -> None:
    """BUG (fix incomplete): 809c8cd records a refused *remote* entry before warning, so that
    under simplefilter("error") the key is not blocked for good. The disk tier's refusal of an
    entry signed by a key no longer trusted (README: "refused too, recompiled and replaced")
    still warns first: every fetch_or_compile raises the CacheWarning before the compile that
    would replace the entry, at every call, for ever (refused 3, compiles 0)."""
    root = tmp_path / "c"
    old = kp.Cache(root, remote=False, sign_with=generate_private_key())
    assert old.fetch_or_compile(K1, axpy, name="axpy").origin == "compiled"
    cache = kp.Cache(root, remote=False, sign_with=generate_private_key())  # k1 revoked
    outcomes = []
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                outcomes.append(cache.fetch_or_compile(K1, axpy, name="axpy").origin)
            except CacheWarning as exc:
                outcomes.append(f"raised: {str(exc)[:80]}")
    assert outcomes[1:] == ["compiled", "disk"] or outcomes[1:] == ["disk", "disk"], (
        outcomes, cache.stats())


def test_over_cap_entry_under_warnings_as_errors_is_still_returned(tmp_path: Path) -> None:
    """BUG (fix incomplete): an entry larger than the disk cap is now counted as
    disk_too_large, "which are no failure" (Cache.stats), and remote_too_large is silent;
    but the disk skip still warns at every put, so under simplefilter("error")
    fetch_or_compile compiles, then raises instead of returning the program, at every call
    for ever (the key can never be served). The skip must not make the call fail: warn at
    most once (here: the later calls return the compiled program)."""
    big = _big_program(60_000)
    cache = kp.Cache(tmp_path / "c", remote=False, max_bytes=20_000)
    outcomes = []
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                outcomes.append(cache.fetch_or_compile(K1, lambda: big, name="axpy").origin)
            except CacheWarning as exc:
                outcomes.append(f"raised: {str(exc)[:80]}")
    assert outcomes[1:] == ["compiled", "compiled"], (outcomes, cache.stats())
    assert cache.stats()["disk_too_large"] == 3, cache.stats()


# ---- huge integers (22c9dc1) ------------------------------------------------------------------
def test_cache_max_bytes_huge_negative_names_the_parameter(tmp_path: Path) -> None:
    """BUG (fix incomplete): prune(max_bytes=-10**5000) now names max_bytes, but the
    constructor's max_bytes still formats the int: ValueError 'Exceeds the limit (4300 digits)
    for integer string conversion', naming nothing."""
    with pytest.raises((ValueError, TypeError)) as info:
        kp.Cache(tmp_path / "c", remote=False, max_bytes=-10 ** 5000)
    msg = str(info.value)
    assert "integer string conversion" not in msg and "max_bytes" in msg, msg[:200]


def test_env_max_bytes_past_30_digits_is_not_called_a_malformed_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BUG (regression): KERNELPACK_CACHE_MAX_BYTES of 36 digits worked at 6948bd2 (a cap
    larger than any disk); parse_size(max_digits=30) now refuses it with "must be a byte count
    such as 4096, 512M or 10G" - it *is* a byte count; the message must say that it is too
    large (or accept it)."""
    monkeypatch.setenv("KERNELPACK_CACHE_MAX_BYTES", "1" + "0" * 35)
    try:
        kp.Cache(tmp_path / "c", remote=False)
    except ValueError as exc:
        msg = str(exc)
        assert "KERNELPACK_CACHE_MAX_BYTES" in msg, msg
        assert any(w in msg for w in ("large", "digit", "at most", "too many", "exceed")), msg


def test_ttl_s_that_redis_refuses_is_caught_at_construction(tmp_path: Path,
                                                            redis_port: int) -> None:
    """BUG: kp.Cache checks "every number here", but ttl_s=2**62 is accepted; Redis then
    answers every GETEX/SET with 'invalid expire time', so every read fails and backs off and
    the remote is never used (a shared entry is compiled again). Refuse it by name (or cap it
    so the remote works)."""
    url = f"redis://127.0.0.1:{redis_port}/0"
    key = generate_private_key()
    writer = kp.Cache(tmp_path / "w", remote=url, sign_with=key)
    assert writer.fetch_or_compile(K1, axpy, name="axpy").origin == "compiled"
    try:
        reader = kp.Cache(tmp_path / "r", remote=url, sign_with=key, ttl_s=2 ** 62)
    except (ValueError, TypeError) as exc:
        assert "ttl_s" in str(exc), str(exc)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        origin = reader.fetch_or_compile(K1, axpy, name="axpy").origin
    assert origin == "remote", (origin, _where(caught), reader.stats())


# ---- the plan cache (22c9dc1) -----------------------------------------------------------------
@pytest.mark.parametrize("count", [65, 200])
def test_repeated_plan_of_a_few_hundred_launches_is_served_from_the_plan_cache(
        count: int) -> None:
    """BUG (regression): Planner.plan_shapes documents "recent plans are kept in a small cache
    ...: a repeated call costs one dict lookup. Plans are shared between such calls". Since
    22c9dc1 a plan of more than 64 launches is never kept: the same plan(x=(1000,), c=65) is
    planned again at every call (~100 us instead of ~2 us, 300 us for 200 launches). The
    bound that review 35 needed is on the memory held (2^17 launches in all), not on plans of
    a few dozen launches."""
    prog = kp.load(kp.save([_repeated_launch_program()]))["rep"]
    first = prog.plan(x=(1000,), c=count)
    assert len(first.launches) == count
    again = prog.plan(x=(1000,), c=count)
    assert again is first, f"a plan of {count} launches was planned again for the same shapes"


# ---- the RESP client's failure memo (809c8cd) -------------------------------------------------
def test_failed_remote_put_does_not_keep_the_entry_alive(tmp_path: Path,
                                                         hung: _HungServer) -> None:
    """BUG (regression): RespClient now keeps the last connection failure (``_failure``) to
    fail queued threads fast. That exception's traceback holds the frames of the failed
    command, whose locals hold the command's arguments: after a put to a hung Redis times
    out, three copies of the entry (artifact, re-signed artifact, envelope: 24 MB for an 8 MB
    entry here, ~190 MB at the default max_entry_bytes) stay alive until the next failure.
    At 6948bd2 nothing was held."""
    cache = kp.Cache(tmp_path / "c", remote=hung.url, sign_with=generate_private_key(),
                     timeout_s=0.2, max_bytes=None)
    data = kp.save([_big_program(8 << 20)])
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cache.put(K1, data)
        assert any("remote cache write failed" in str(w.message) for w in caught), \
            _where(caught)
        del data, caught
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held < 2 << 20, f"{held / 2**20:.1f} MB still held after the failed put"


# ---- key_record's warning (809c8cd) -----------------------------------------------------------
def test_key_record_warning_names_the_key(tmp_path: Path) -> None:
    """BUG (regression): at 6948bd2 cache.key_record / `kernelpack cache explain` with an
    unreachable remote warned "remote cache at URL could not be asked for the record of
    <key>"; it now goes through the lookup's failure message "remote cache record read failed
    (...) at URL; using the local cache and compiler for 30 s", which names no key (and
    promises a compiler to a `cache explain` that compiles nothing)."""
    cache = kp.Cache(tmp_path / "c", remote=_down_url(), sign_with=generate_private_key())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.key_record(K1) is None
    cw = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(cw) == 1, _where(caught)
    assert K1[:16] in str(cw[0].message), str(cw[0].message)


# ---- the CLI's warning lines (809c8cd) --------------------------------------------------------
def test_cli_under_warnings_as_errors_prints_an_error_line_not_a_traceback(
        tmp_path: Path) -> None:
    """BUG: the CLI now shows warnings as 'warning: ...' lines, but with PYTHONWARNINGS=error
    (a CI job's setting) the same CacheWarning escapes main() as a Python traceback (README:
    a failure is one 'error: <message>' line and exit status 1)."""
    env = dict(os.environ, KERNELPACK_REMOTE_CACHE=_down_url(), PYTHONWARNINGS="error")
    proc = subprocess.run([str(KP_BIN), "cache", "explain", "--dir", str(tmp_path / "c"), K1],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-500:])
    assert any(line.startswith(("error: ", "warning: ")) for line in proc.stderr.splitlines()), \
        proc.stderr


# ---- strict bools (809c8cd) -------------------------------------------------------------------
def test_numpy_bools_are_accepted_as_flags(tmp_path: Path) -> None:
    """BUG (regression, too broad): require_signed_remote / explain_misses must now be bools,
    to refuse ``"false"`` (truthy text). A NumPy bool (a flag read from a config array, or
    ``np.bool_`` from a comparison) is no such ambiguity and worked at 6948bd2; it is now a
    TypeError saying "must be True or False (got bool: np.True_)"."""
    np = pytest.importorskip("numpy")
    cache = kp.Cache(tmp_path / "c", remote=False, require_signed_remote=np.False_,
                     explain_misses=np.True_)
    assert cache.require_signed_remote is False
    assert cache.explain_misses is True


# ---- CudaResultError pickling (8f44f55) -------------------------------------------------------
@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes (add_note) are 3.11+")
def test_cuda_result_error_pickle_keeps_notes_and_attributes() -> None:
    """BUG (fix incomplete): CudaResultError.__reduce__ returns (type, (code, name, text)) and
    drops the instance's state, so a pickled error (a worker's, through multiprocessing or
    concurrent.futures) loses ``__notes__`` (add_note) and any attribute set on it, which
    BaseException's own reduce keeps (kp.CompileError keeps both)."""
    from kernelpack.runtime.driver import CudaResultError

    err = CudaResultError(2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
    err.add_note("while launching program softmax on device 1")
    err.program = "softmax"  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(err))
    assert (back.code, back.name, back.text) == (2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
    assert str(back) == str(err)
    assert getattr(back, "__notes__", None) == ["while launching program softmax on device 1"]
    assert getattr(back, "program", None) == "softmax"


# ---- right: pinned down ----------------------------------------------------------------------
def _sa_restart(signum: int) -> bool:
    lib = ctypes.CDLL(None)
    buf = ctypes.create_string_buffer(512)
    assert lib.sigaction(signum, None, buf) == 0
    flags_at = (8 if sys.maxsize > 2 ** 32 else 4) + 128
    return bool(int.from_bytes(buf.raw[flags_at:flags_at + 4], sys.byteorder) & 0x10000000)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads glibc's sigaction")
def test_deferred_interrupts_keeps_each_handlers_restart_flag_and_delivers_once() -> None:
    """Right: a handler installed with SA_RESTART (siginterrupt(sig, False), as asyncio's
    add_signal_handler does) keeps it through a deferred_interrupts block and one without it
    stays without; two signals sent during the block reach the handler after it, twice (as
    without the block), and the handler is the application's again."""
    import signal

    from kernelpack._interrupts import deferred_interrupts

    got: list[int] = []

    def handler(signum: int, frame: object) -> None:
        got.append(signum)

    old1 = signal.signal(signal.SIGUSR1, handler)
    old2 = signal.signal(signal.SIGUSR2, handler)
    try:
        signal.siginterrupt(signal.SIGUSR1, False)
        assert _sa_restart(signal.SIGUSR1) and not _sa_restart(signal.SIGUSR2)
        with deferred_interrupts():
            assert _sa_restart(signal.SIGUSR1) and not _sa_restart(signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.01)
            assert got == []
        assert got == [signal.SIGUSR1, signal.SIGUSR1]
        assert _sa_restart(signal.SIGUSR1) and not _sa_restart(signal.SIGUSR2)
        assert signal.getsignal(signal.SIGUSR1) is handler
    finally:
        signal.signal(signal.SIGUSR1, old1)
        signal.signal(signal.SIGUSR2, old2)


def test_threads_queued_behind_a_reconnect_are_not_failed(tmp_path: Path,
                                                          redis_port: int) -> None:
    """Right: the fail-fast for queued commands fires only on a real failure. After Redis
    closed the client's idle connection (CLIENT KILL, as its `timeout` does), eight threads
    that queue for it while the first one reconnects all get their remote hits, with no
    warning and no error counted."""
    redis = pytest.importorskip("redis")
    url = f"redis://127.0.0.1:{redis_port}/0"
    key = generate_private_key()
    writer = kp.Cache(tmp_path / "w", remote=url, sign_with=key)
    for i in range(9):
        writer.fetch_or_compile(f"{i:064x}", axpy, name="axpy")
    reader = kp.Cache(tmp_path / "r", remote=url, sign_with=key)
    assert reader.get(f"{8:064x}") is not None  # the connection is open now
    redis.Redis(port=redis_port).client_kill_filter(_type="normal", skipme=True)
    start = threading.Barrier(8)
    found: dict[int, bool] = {}

    def worker(i: int) -> None:
        start.wait()
        found[i] = reader.get(f"{i:064x}") is not None

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert found == dict.fromkeys(range(8), True), (found, _where(caught))
    assert caught == [], _where(caught)
    s = reader.stats()
    assert (s["remote_hits"], s["remote_errors"], s["errors"]) == (9, 0, 0), s


def test_cache_pickling_is_refused_by_name(tmp_path: Path) -> None:
    """Right: pickling or copying a kp.Cache is a TypeError that says what to do."""
    import copy

    cache = kp.Cache(tmp_path / "c", remote=False)
    for how in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="kp.Cache cannot be pickled"):
            how(cache)


def test_cli_unknown_option_shows_the_subcommands_usage(tmp_path: Path) -> None:
    """Right: an unknown option of `kernelpack cache ls` shows that command's usage, exit 2."""
    proc = subprocess.run([str(KP_BIN), "cache", "ls", "--dir", str(tmp_path), "--bogus"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("usage: kernelpack cache ls"), proc.stderr
    assert "unrecognized arguments: --bogus" in proc.stderr, proc.stderr


def test_a_disk_warning_raised_as_an_error_still_puts_the_entry_to_the_remote(
        tmp_path: Path, redis_port: int) -> None:
    """Review 35c's note: under simplefilter("error") the disk tier's warning after a compile
    (here: an entry over max_bytes) raised before the remote put, so the fleet never got the
    compile. The remote put now runs whatever the disk put raised."""
    url = f"redis://127.0.0.1:{redis_port}/0"
    key = generate_private_key()
    cache = kp.Cache(tmp_path / "a", remote=url, sign_with=key, max_bytes=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(CacheWarning, match="exceed the cache's cap"):
            cache.fetch_or_compile(K1, lambda: axpy("axpy"), name="axpy")
    other = kp.Cache(tmp_path / "b", remote=url, sign_with=key)
    assert other.fetch_or_compile(K1, lambda: axpy("axpy"), name="axpy").origin == "remote"
