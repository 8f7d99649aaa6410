"""Review 35: warnings, logging and output hygiene for a long-running server.

An inference server imports kernelpack, compiles and loads through ``kp.Cache`` (disk and
Redis) and serves for weeks. What it needs from the library's diagnostics:

- every warning names what and where (key, directory, server with the password hidden) and
  points (``stacklevel``) at the caller's line, not at a line inside kernelpack;
- one outage is one warning and one timeout, however many lookups or threads run into it;
- with ``warnings.simplefilter("error")`` a warning turned into an exception leaves the cache
  working afterwards (no lock held, nothing half-written, the key not blocked for ever);
- nothing is printed by the library; loggers live under ``kernelpack`` with a NullHandler at
  most; one event is reported once;
- the CLI prints data on stdout and clean diagnostics on stderr;
- ``cache.stats()`` counts what happened.

The tests are black-box (README, ``help(kp.Cache)``); Redis tests start their own
redis-server on a free loopback port, or point at a port where nothing listens (a down
Redis), or at a socket that accepts and never answers (a hung Redis).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kp_redis_helpers import HungServer, down_url, free_port, hung_server, redis_server

import kernelpack as kp
from kernelpack.cache import CacheWarning
from kernelpack.signing import generate_private_key
from kp_samples import axpy

HERE = os.path.abspath(__file__)
PKG_DIR = os.path.dirname(os.path.abspath(kp.__file__))
KP_BIN = Path(sys.executable).with_name("kernelpack")
AXPY_PTX = (Path(__file__).parent / "golden" / "axpy.ptx").read_text()

K1 = "a1" * 32
K2 = "b2" * 32


# ---- helpers --------------------------------------------------------------------------------
_free_port, _down_url, _HungServer = free_port, down_url, HungServer


@pytest.fixture()
def hung() -> Iterator[HungServer]:
    with hung_server() as server:
        yield server


@pytest.fixture()
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A real redis-server on a free loopback port."""
    with redis_server(tmp_path) as port:
        yield f"redis://127.0.0.1:{port}/0"


def _build(name: str = "axpy") -> Callable[[], kp.Compiled]:
    return lambda: axpy(name)


def _record(fn: Callable[[], Any]) -> tuple[Any, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, list(caught)


def _where(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__} at {w.filename}:{w.lineno}: {str(w.message)[:120]}"
            for w in caught]


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _corrupt_entry(root: Path, key: str) -> None:
    [entry] = [p for p in root.rglob(f"{key}*") if p.is_file() and "quarantine" not in p.parts]
    entry.write_bytes(b"not an artifact")


def _signed_cache(path: Path, url: str, **kw: Any) -> kp.Cache:
    return kp.Cache(path, remote=url, sign_with=generate_private_key(), **kw)


# ---- stacklevel: a warning names the caller's line -------------------------------------------
def _call_remote(cache: kp.Cache, how: str) -> None:
    if how == "get":
        cache.get(K1)  # the caller's line
    elif how == "load":
        cache.load(K1)  # the caller's line
    elif how == "fetch_or_compile":
        cache.fetch_or_compile(K1, _build(), name="axpy")  # the caller's line
    elif how == "store":
        cache.store(K1, axpy())  # the caller's line
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["get", "load", "fetch_or_compile", "store"])
def test_down_redis_warning_points_at_the_callers_line(tmp_path: Path, how: str) -> None:
    """BUG: the Redis-down CacheWarning of every public Cache method is attributed to
    kernelpack/cache/remote_tier.py (its ``self.failed(...)`` line is what Python prints under
    it), not to the line that called the cache; ``key_record`` gets it right."""
    url = _down_url("s3cret")
    cache = _signed_cache(tmp_path / "c", url)
    _, caught = _record(lambda: _call_remote(cache, how))
    cw = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(cw) == 1, _where(caught)
    msg = str(cw[0].message)
    assert "s3cret" not in msg and "***" in msg and str(url.rsplit(":", 1)[1][:-2]) in msg, msg
    assert cw[0].filename == HERE, _where(cw)


def test_down_redis_warning_through_kp_compile_points_at_the_callers_line(
        tmp_path: Path) -> None:
    """BUG: a server's main path, ``kp.compile(f, cache=cache)`` with Redis down, warns from
    kernelpack/cache/remote_tier.py instead of the kp.compile line."""
    @kp.fusion
    def r35_scale(x: kp.Tensor[kp.f32, "n"]):
        return x * 3.5

    cache = _signed_cache(tmp_path / "c", _down_url())
    c, caught = _record(lambda: kp.compile(r35_scale, targets=["sm_80"], cache=cache))
    assert c.origin == "compiled"
    cw = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(cw) == 1, _where(caught)
    assert cw[0].filename == HERE, _where(cw)


@pytest.mark.parametrize("how", ["get", "load", "fetch_or_compile"])
def test_quarantine_warning_points_at_the_callers_line(tmp_path: Path, how: str) -> None:
    """BUG: a corrupt disk entry's CacheWarning (quarantined) is attributed to
    kernelpack/cache/__init__.py, not to the caller of cache.get / load / fetch_or_compile."""
    root = tmp_path / "c"
    cache = kp.Cache(root, remote=False)
    cache.fetch_or_compile(K1, _build(), name="axpy")
    _corrupt_entry(root, K1)
    _, caught = _record(lambda: _call_remote(cache, how))
    cw = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(cw) == 1, _where(caught)
    assert K1[:16] in str(cw[0].message) and "quarantine" in str(cw[0].message)
    assert cw[0].filename == HERE, _where(cw)
    assert cache.stats()["quarantined"] == 1


def test_cache_external_width_warning_points_at_the_callers_line(tmp_path: Path) -> None:
    """BUG: ``kp.external`` warns about a scalar width mismatch at the caller's line, but the
    same call through ``cache.external`` warns from kernelpack/cache/external_key.py (Python
    then prints kernelpack's ``lambda: external(...)`` source line under it)."""
    params = [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
              kp.Scalar("a", kp.f64), kp.Scalar("n", kp.u32)]
    kw = dict(grid=kp.cdiv("n", 256), block=256, ptx=AXPY_PTX, targets=["sm_80"])
    try:
        _, direct = _record(lambda: kp.external("axpy", "axpy", params, **kw))
    except kp.CompileError as exc:
        pytest.skip(f"nvJitLink is not available: {exc}")
    assert [w.filename for w in direct] == [HERE], _where(direct)  # right
    cache = kp.Cache(tmp_path / "c", remote=False)
    _, cached = _record(lambda: cache.external("axpy", "axpy", params, **kw))
    assert [w.category for w in cached] == [UserWarning], _where(cached)
    assert "'.param .f32 a'" in str(cached[0].message)
    assert cached[0].filename == HERE, _where(cached)


# ---- no spam: one outage, one warning, one timeout -------------------------------------------
def test_down_redis_for_many_lookups_warns_once_and_waits_once(tmp_path: Path,
                                                               hung: _HungServer) -> None:
    """Right: a hung Redis costs one timeout and one warning for 300 lookups and 5 compiles,
    then the documented 30 s back-off; the counters say so."""
    cache = kp.Cache(tmp_path / "c", remote=hung.url, sign_with=generate_private_key(),
                     timeout_s=0.3)
    t0 = time.monotonic()

    def work() -> None:
        for i in range(300):
            assert cache.get(f"{i:064x}") is None
        for i in range(5):
            assert cache.fetch_or_compile(f"{1000 + i:064x}", _build(), name="axpy"
                                          ).origin == "compiled"

    _, caught = _record(work)
    elapsed = time.monotonic() - t0
    assert len(caught) == 1, _where(caught)
    msg = str(caught[0].message)
    assert "hunter2" not in msg and f"127.0.0.1:{hung.port}" in msg and "30 s" in msg, msg
    assert elapsed < 0.3 * 4, elapsed
    assert len(hung.conns) == 1
    s = cache.stats()
    assert (s["disk_misses"], s["compiles"], s["puts"], s["remote_errors"], s["remote_hits"],
            s["errors"]) == (305, 5, 5, 1, 0, 0), s


def test_threads_behind_a_hung_redis_do_not_each_wait_out_the_timeout(
        tmp_path: Path, hung: _HungServer) -> None:
    """BUG: 8 server threads hitting one Cache while Redis hangs (timeout_s=0.5) take 4 s: they
    queue for the connection and each, in turn, opens a new one, waits the full timeout, warns
    and counts an error (8 identical warnings, remote_errors 8). The back-off the first failure
    starts should answer the threads queued behind it (a 64-thread server would stall a
    request for 32 s, a full timeout per thread ahead of it)."""
    cache = kp.Cache(tmp_path / "c", remote=hung.url, sign_with=generate_private_key(),
                     timeout_s=0.5)
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        start.wait()
        for j in range(5):
            cache.get(f"{i * 100 + j:064x}")

    def run() -> None:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)

    t0 = time.monotonic()
    _, caught = _record(run)
    elapsed = time.monotonic() - t0
    s = cache.stats()
    assert s["disk_misses"] == 40, s
    assert elapsed < 1.5, (f"{elapsed:.2f} s for 8 threads x 5 lookups with timeout_s=0.5; "
                           f"{len(hung.conns)} connections, {len(caught)} warnings, {s}")
    assert len(caught) <= 2, _where(caught)
    assert s["remote_errors"] <= 2, s


def test_key_record_backs_off_after_a_failure(tmp_path: Path, hung: _HungServer) -> None:
    """BUG: ``cache.key_record`` (and ``cache.explain``, which calls it) with a hung Redis
    waits the whole timeout and warns again on every call (5 calls: 1.5 s, 5 warnings), never
    starting the back-off that a failed ``get`` starts (nor counting in remote_errors)."""
    cache = kp.Cache(tmp_path / "c", remote=hung.url, sign_with=generate_private_key(),
                     timeout_s=0.3)
    t0 = time.monotonic()
    _, caught = _record(lambda: [cache.key_record(f"{i:064x}") for i in range(5)])
    elapsed = time.monotonic() - t0
    assert len(caught) == 1, _where(caught)
    assert elapsed < 0.3 * 3, f"{elapsed:.2f} s, {len(hung.conns)} connections"


# ---- warnings as errors ----------------------------------------------------------------------
def test_warnings_as_errors_leave_the_cache_working(tmp_path: Path) -> None:
    """Right: under simplefilter("error") a corrupt disk entry and a down Redis raise their
    CacheWarning once; the state was recorded first (entry quarantined, back-off started, lock
    released), so the next call works, from another thread too, and nothing is left behind."""
    root = tmp_path / "c"
    cache = kp.Cache(root, remote=_down_url(), sign_with=generate_private_key())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(CacheWarning, match="remote cache read failed"):
            cache.fetch_or_compile(K1, _build(), name="axpy")
        assert cache.fetch_or_compile(K1, _build(), name="axpy").origin == "compiled"
        _corrupt_entry(root, K1)
        with pytest.raises(CacheWarning, match="quarantine"):
            cache.fetch_or_compile(K1, _build(), name="axpy")
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(
            cache.fetch_or_compile(K1, _build(), name="axpy").origin))
        t.start()
        t.join(20)
        assert out == ["compiled"]  # no lock left held by the raising call
        assert cache.fetch_or_compile(K1, _build(), name="axpy").origin == "disk"
    files = _files(root)
    assert not [f for f in files if "tmp" in f.lower()], files
    assert len([f for f in files if f.endswith(".kpack") and "quarantine" not in f]) == 1, files
    s = cache.stats()
    assert (s["compiles"], s["quarantined"], s["remote_errors"], s["disk_hits"]) == \
        (2, 1, 1, 1), s


def test_refused_remote_entry_under_warnings_as_errors_does_not_block_the_key(
        tmp_path: Path, redis_url: str) -> None:
    """BUG: with warnings as errors, an entry the remote holds that this process does not
    trust (another fleet's signer, or anyone who can write to Redis) makes every
    fetch_or_compile of that key raise CacheWarning before compiling: the key can never be
    built, whereas a down Redis or a corrupt disk entry raises once and then works (their
    state is recorded before the warning). Expected: the cache works on the next call."""
    other = _signed_cache(tmp_path / "other", redis_url)
    assert other.fetch_or_compile(K1, _build(), name="axpy").origin == "compiled"
    cache = _signed_cache(tmp_path / "mine", redis_url)  # does not trust `other`'s key
    outcomes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            try:
                outcomes.append(cache.fetch_or_compile(K1, _build(), name="axpy").origin)
            except CacheWarning as exc:
                assert "refused" in str(exc) and K1[:16] in str(exc)
                outcomes.append("raised")
    assert outcomes[1:] != ["raised", "raised"], (outcomes, cache.stats())
    assert cache.stats()["compiles"] >= 1


# ---- messages say what happened --------------------------------------------------------------
@pytest.mark.parametrize("how", ["get", "load"])
def test_get_and_load_do_not_claim_to_recompile(tmp_path: Path, how: str) -> None:
    """BUG: cache.get / cache.load on a corrupt disk entry warn '...; moved to ...;
    recompiling', but they compile nothing (they return None); the message misleads an
    operator reading the log into thinking a compile ran."""
    root = tmp_path / "c"
    cache = kp.Cache(root, remote=False)
    cache.fetch_or_compile(K1, _build(), name="axpy")
    _corrupt_entry(root, K1)
    result, caught = _record(lambda: getattr(cache, how)(K1))
    assert result is None and cache.stats()["compiles"] == 1
    assert len(caught) == 1, _where(caught)
    assert "compil" not in str(caught[0].message), str(caught[0].message)


def test_refused_remote_entry_through_get_does_not_claim_to_compile(
        tmp_path: Path, redis_url: str) -> None:
    """BUG: cache.get of an untrusted remote entry warns '... refused (...); compiling
    locally', but get() compiles nothing and returns None."""
    other = _signed_cache(tmp_path / "other", redis_url)
    other.fetch_or_compile(K2, _build(), name="axpy")
    cache = _signed_cache(tmp_path / "mine", redis_url)
    result, caught = _record(lambda: cache.get(K2))
    assert result is None
    s = cache.stats()
    assert (s["refused"], s["compiles"]) == (1, 0), s
    assert len(caught) == 1, _where(caught)
    assert "compil" not in str(caught[0].message), str(caught[0].message)


def test_too_large_entry_warning_has_no_unrelated_errno(tmp_path: Path) -> None:
    """BUG (small): an entry larger than max_bytes warns 'disk cache write of ... failed:
    [Errno 7] the entry's N bytes exceed the cache's cap ...': errno 7 is E2BIG ('Argument
    list too long'), nothing that happened; the rest of the message says it all."""
    cache = kp.Cache(tmp_path / "c", remote=False, max_bytes=100)
    c, caught = _record(lambda: cache.fetch_or_compile(K1, _build(), name="axpy"))
    assert c.origin == "compiled"
    assert len(caught) == 1, _where(caught)
    msg = str(caught[0].message)
    assert "100 bytes" in msg and K1[:16] in msg, msg
    assert "Errno" not in msg, msg


# ---- output and logging ----------------------------------------------------------------------
def test_normal_operation_is_silent_and_counted(tmp_path: Path, redis_url: str,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    """Right: compile, put, remote hit in a second process-like Cache, save, load, verify and
    plan print nothing (fd level), warn nothing, log nothing at any level to a DEBUG root
    handler; kernelpack's loggers carry a NullHandler at most; the counters add up."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root_logger = logging.getLogger()
    handler, level = Keep(logging.DEBUG), root_logger.level
    root_logger.addHandler(handler)
    root_logger.setLevel(logging.DEBUG)
    key = generate_private_key()
    try:
        def work() -> None:
            a = kp.Cache(tmp_path / "a", remote=redis_url, sign_with=key)
            b = kp.Cache(tmp_path / "b", remote=redis_url, sign_with=key)
            for i in range(3):
                assert a.fetch_or_compile(f"{i:064x}", _build(), name="axpy").origin == \
                    "compiled"
            for i in range(3):
                assert b.fetch_or_compile(f"{i:064x}", _build(), name="axpy").origin == "remote"
                assert b.fetch_or_compile(f"{i:064x}", _build(), name="axpy").origin == "disk"
            assert b.get("ff" * 32) is None
            sa, sb = a.stats(), b.stats()
            assert (sa["compiles"], sa["puts"], sa["remote_puts"], sa["disk_misses"]) == \
                (3, 3, 3, 3), sa
            assert (sb["compiles"], sb["remote_hits"], sb["disk_hits"], sb["disk_misses"],
                    sb["remote_misses"], sb["refused"], sb["remote_errors"]) == \
                (0, 3, 3, 4, 1, 0, 0), sb
            a.close()
            b.close()
            kp.save([axpy()], tmp_path / "m.kpack")
            pack = kp.load(tmp_path / "m.kpack")
            pack.verify()
            pack["axpy"].plan(x=(1000,), y=(1000,), a=0.5)

        _, caught = _record(work)
    finally:
        root_logger.removeHandler(handler)
        root_logger.setLevel(level)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert not caught, _where(caught)
    assert not [r for r in records if r.name.startswith("kernelpack")], \
        [(r.name, r.levelname, r.getMessage()) for r in records]
    loggers = {n: lg for n, lg in logging.Logger.manager.loggerDict.items()
               if n == "kernelpack" or n.startswith("kernelpack.")}
    for name, lg in loggers.items():
        if isinstance(lg, logging.Logger):
            assert all(isinstance(h, logging.NullHandler) for h in lg.handlers), (name,
                                                                                  lg.handlers)
            assert lg.propagate, name


def test_one_cache_event_is_reported_once_when_warnings_go_to_logging(
        tmp_path: Path) -> None:
    """BUG: every CacheWarning is also logged at WARNING to the ``kernelpack.cache`` logger.
    A server that routes warnings to its logs (``logging.captureWarnings(True)``, as many
    frameworks do) gets two WARNING records for one Redis outage, and one that silences the
    category (``filterwarnings("ignore", category=CacheWarning)``) still gets the log record.
    Expected: one report per event, through one channel the caller controls."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root_logger = logging.getLogger()
    handler, level = Keep(logging.WARNING), root_logger.level
    root_logger.addHandler(handler)
    root_logger.setLevel(logging.WARNING)
    cache = _signed_cache(tmp_path / "c", _down_url())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            logging.captureWarnings(True)
            try:
                cache.get(K1)
            finally:
                logging.captureWarnings(False)
        ignored = _signed_cache(tmp_path / "d", _down_url())
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=CacheWarning)
            n = len(records)
            ignored.get(K1)
            after_ignore = records[n:]
    finally:
        root_logger.removeHandler(handler)
        root_logger.setLevel(level)
    outage = [r for r in records[:n] if "remote cache read failed" in r.getMessage()]
    assert len(outage) == 1, [(r.name, r.getMessage()[:100]) for r in outage]
    assert not after_ignore, [(r.name, r.getMessage()[:100]) for r in after_ignore]


# ---- the CLI ---------------------------------------------------------------------------------
def _cli_env(tmp_path: Path, remote: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["KERNELPACK_CACHE_DIR"] = str(tmp_path / "cli-cache")
    env.pop("KERNELPACK_REMOTE_CACHE", None)
    if remote:
        env["KERNELPACK_REMOTE_CACHE"] = remote
    env.pop("PYTHONWARNINGS", None)
    return env


def test_cli_cache_explain_warns_once_about_a_down_redis(tmp_path: Path) -> None:
    """BUG: ``kernelpack cache explain KEY`` with $KERNELPACK_REMOTE_CACHE down prints the
    same warning twice (the remote is asked for the key's record twice, each with its own
    timeout: 2 s with a hung Redis at the default timeout_s)."""
    url = _down_url("hunter2")
    proc = subprocess.run([str(KP_BIN), "cache", "explain", "0" * 64],
                          env=_cli_env(tmp_path, url), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "hunter2" not in proc.stdout + proc.stderr
    port = url.rsplit(":", 1)[1].split("/")[0]
    mentions = [line for line in proc.stderr.splitlines()
                if f"127.0.0.1:{port}" in line and "warning" in line.lower()]
    assert len(mentions) == 1, proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("error: "), proc.stderr


def test_cli_build_diagnostics_do_not_print_kernelpack_source_lines(tmp_path: Path) -> None:
    """BUG: ``kernelpack build --cache`` with Redis down prints Python's raw warning format on
    stderr: a path into kernelpack's package (``.../kernelpack/cache/remote_tier.py:124:``)
    and, under it, kernelpack's own source line (``self.failed("read", exc)``). The CLI's
    diagnostics should be clean lines (as its errors are: ``error: <message>``) naming the
    server, not the library's internals. Right: the artifact's line goes to stdout, progress
    to stderr, exit 0."""
    src = tmp_path / "kern.py"
    src.write_text(textwrap.dedent("""\
        import kernelpack as kp

        @kp.fusion
        def r35_triple(x: kp.Tensor[kp.f32, "n"]):
            return x * 3.0
        """))
    key = tmp_path / "k"
    subprocess.run([str(KP_BIN), "keygen", "-o", str(key)], check=True, capture_output=True,
                   timeout=60)
    url = _down_url("hunter2")
    out = tmp_path / "o.kpack"
    proc = subprocess.run([str(KP_BIN), "build", str(src), "-o", str(out), "--targets",
                           "sm_80", "--cache", "--sign-with", str(key)],
                          env=_cli_env(tmp_path, url), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.exists()
    assert proc.stdout.startswith(f"wrote {out}") and len(proc.stdout.splitlines()) == 1, \
        proc.stdout
    assert "r35_triple: compiled" in proc.stderr, proc.stderr
    assert "hunter2" not in proc.stdout + proc.stderr
    port = url.rsplit(":", 1)[1].split("/")[0]
    assert f"127.0.0.1:{port}" in proc.stderr, proc.stderr  # the server is named
    assert PKG_DIR not in proc.stderr and "self.failed(" not in proc.stderr, proc.stderr


# ---- a disk that cannot be written -----------------------------------------------------------
def test_disk_that_cannot_be_written_warns_once_and_counts(tmp_path: Path) -> None:
    """Right: a disk tier whose writes fail (a file size limit: EFBIG) warns once, naming the
    directory, pauses its writes, leaves no temporary behind, and counts each skipped write."""
    script = textwrap.dedent(f"""
        import os, resource, sys, warnings, json
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import kernelpack as kp
        from kp_samples import axpy
        root = {str(tmp_path / 'c')!r}
        cache = kp.Cache(root, remote=False)
        cache.fetch_or_compile("ff" * 32, lambda: axpy(), name="axpy")
        resource.setrlimit(resource.RLIMIT_FSIZE, (500, resource.RLIM_INFINITY))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for i in range(20):
                assert cache.fetch_or_compile(f"{{i:064x}}", lambda: axpy(),
                                              name="axpy").origin == "compiled"
        print(json.dumps({{"warnings": [(str(x.message), x.filename) for x in w],
                          "stats": cache.stats()}}))
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    import json

    report = json.loads(proc.stdout)
    assert len(report["warnings"]) == 1, report["warnings"]
    assert str(tmp_path / "c") in report["warnings"][0][0]
    s = report["stats"]
    assert (s["compiles"], s["errors"], s["puts"]) == (21, 20, 1), s
    files = _files(tmp_path / "c")
    assert len([f for f in files if f.endswith(".kpack")]) == 1, files
