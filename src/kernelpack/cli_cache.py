"""``kernelpack cache ls|stats|prune|clear|explain``: look after the disk cache from a shell.

Registered into the ``kernelpack`` command by :func:`register` (``kernelpack.cli`` calls it when
this module exists). Works on the directory :func:`kernelpack.config.cache_dir` names, or
``--dir``; never touches a GPU and never compiles. ``explain`` also asks the remote for a key's
parts when given ``--remote`` (or ``$KERNELPACK_REMOTE_CACHE`` is set).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from . import config
from .cli import _size, dir_arg

__all__ = ["register", "resolve_digest"]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``cache`` command (with its own subcommands) to ``kernelpack``'s parser."""
    parser = subparsers.add_parser("cache", help="list, explain, prune or clear the kernel cache",
                                   description="list, explain, prune or clear the kernel cache")
    sub = parser.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    def add(name: str, fn: Any, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--dir", type=dir_arg, default=None,
                       help="cache root (default: $KERNELPACK_CACHE_DIR, else "
                            "$XDG_CACHE_HOME/kernelpack, else ~/.cache/kernelpack)")
        p.set_defaults(func=fn, usage_parser=p)
        return p

    p = add("ls", _cmd_ls, "list entries, least recently used first")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p = add("stats", _cmd_stats, "entry count, bytes, cap, quarantined and leftover files")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p = add("prune", _cmd_prune, "evict least-recently-used entries (and cubins the runtime "
                                 "made from PTX) down to the cap, and remove temporary and "
                                 "lock files left by killed processes")
    p.add_argument("--max-bytes", type=_size, default=None, metavar="SIZE",
                   help="size to evict down to (default: $KERNELPACK_CACHE_MAX_BYTES; K/M/G/T "
                        "suffixes are powers of 1024, as for extract --max-bytes)")
    p.add_argument("--temp-age", type=_non_negative(float), default=3600.0, metavar="SECONDS",
                   help="remove temporary files older than this (default 3600)")
    add("clear", _cmd_clear, "remove every entry, runtime cubin, key record and quarantined "
                             "file")
    p = add("explain", _cmd_explain, "show the parts a key was computed from")
    p.add_argument("key", help="a key digest, or a unique prefix of one (8+ hex digits)")
    p.add_argument("--remote", default=None, help="redis:// URL to ask for the key's parts")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return parser


def _non_negative(kind: Any) -> Any:
    """An argparse type: a number of ``kind`` that is at least 0 (a negative cap would evict
    everything, a negative age would delete temporary files being written right now)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        if not value >= 0:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be at least 0 (got {text})")
        return value

    parse.__name__ = kind.__name__
    return parse


def _store(args: argparse.Namespace) -> Any:
    from .cache.disk import DiskStore

    root = args.dir if args.dir is not None else config.default_cache_dir()
    if Path(root).exists() and not Path(root).is_dir():
        raise ValueError(f"{root}: not a directory (the cache root must be one)")
    return DiskStore(root, config.cache_max_bytes())


def resolve_digest(store: Any, text: str) -> str:
    """A full digest from a full one or a unique prefix of an entry or key record on disk."""
    text = text.strip().lower()
    if len(text) == 64:
        return text
    if len(text) < 8 or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"key must be 64 hex digits or a prefix of at least 8 (got {text!r})")
    found = {e.digest for e in store.entries() if e.digest.startswith(text)}
    found |= {p.stem for p in (store.root / "keys").glob(f"{text[:2]}/{text}*.json")}
    if len(found) != 1:
        raise ValueError(f"key prefix {text!r} matches {len(found)} keys in {store.root} "
                         f"(expected exactly 1)")
    return found.pop()


def _program_name(store: Any, digest: str) -> str:
    """The programs an entry holds, read as the cache reads it (a FIFO or a device planted
    under an entry's name must not hang or exhaust ``ls``), without refreshing its LRU time."""
    try:
        from .loader import load

        found = store.read(digest, touch=False)
        if found is None:
            return "<gone>"  # evicted or cleared while we listed
        return ",".join(load(found[0]).programs)
    except Exception as exc:  # ls shows a bad entry instead of stopping at it
        return f"<invalid: {type(exc).__name__}>"


def _cmd_ls(args: argparse.Namespace) -> int:
    store = _store(args)
    rows = []
    for e in store.entries():
        record = store.read_parts(e.digest)
        # mtime 0: dated in the future (see DiskStore.entries): its age is unknown (None)
        age = round(max(0.0, time.time() - e.mtime), 1) if e.mtime else None
        rows.append({"key": e.digest, "bytes": e.size, "age_s": age,
                     "kind": record.part("kind") if record else "?",
                     "program": _program_name(store, e.digest)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    from .cli_facts import printable  # key records may come from a shared (remote) cache

    print(f"{'key':<16}  {'bytes':>10}  {'unused':>8}  {'kind':<10}  program")
    for r in rows:
        print(f"{r['key'][:16]}  {r['bytes']:>10}  {_age(r['age_s']):>8}  "
              f"{printable(str(r['kind'])):<10}  {printable(r['program'])}")
    print(f"{len(rows)} entries in {store.root}")
    return 0


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "future"  # dated ahead of this machine's clock: evicted first
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _cmd_stats(args: argparse.Namespace) -> int:
    store = _store(args)
    entries = store.entries()
    cubins = store.runtime_cubins()
    facts = {"root": str(store.root), "entries": len(entries),
             "bytes": sum(e.size for e in entries), "max_bytes": store.max_bytes,
             "quarantined": len(store.quarantined()),
             "temporary_files": len(store.temporaries()),
             "runtime_ptx_cubins": len(cubins), "runtime_ptx_bytes": sum(e.size for e in cubins),
             "key_records": len(list(store.root.glob("keys/??/*.json")))}
    if args.json:
        print(json.dumps(facts, indent=1))
    else:
        for name, value in facts.items():
            print(f"{name:<16} {value}")
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    store = _store(args)
    temps = store.prune_temps(args.temp_age)
    cap = args.max_bytes if args.max_bytes is not None else store.max_bytes
    removed, freed = store.evict(cap) if cap is not None else (0, 0)
    print(f"removed {removed} entries ({freed} bytes) and {temps} temporary or lock files")
    return 0


def _cmd_clear(args: argparse.Namespace) -> int:
    store = _store(args)
    print(f"removed {store.clear()} entries from {store.root}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from .cache import Cache

    store = _store(args)
    digest = resolve_digest(store, args.key)
    remote = args.remote if args.remote is not None else (config.remote_cache_url() or False)
    cache = Cache(store.root, remote=remote, require_signed_remote=False)
    record = cache.key_record(digest)
    if args.json:
        print(json.dumps({"key": digest, "parts": dict(record.parts) if record else None,
                          "on_disk": store.path(digest).exists()}, indent=1))
    else:
        from .cli_facts import printable  # a record's parts are text from whoever wrote it

        from .cache.explain import explain  # with the record read above: one remote query

        text = explain(store, digest, record)
        print("\n".join(printable(line) for line in text.splitlines()))
    if record is None:  # (with --json too: status 1 comes with its one error line)
        print(f"error: no record of key {digest} in {store.root}", file=sys.stderr)
        return 1
    return 0
