"""Review 69: b7f912f joined a key's shard, entry, record, lock and temporary names as strings
(os.path) instead of Paths, and walked the cache's directories with os.path.relpath instead of
Path.relative_to. It was to change nothing observable. The first tests record where it did
(they pass on b7f912f^, failed on b7f912f, and pass since the same session's fix: `clear` goes
through what `entries()` lists again, and the walk takes a directory's components as given);
the others pin what a wrong string join or a wrong relpath would change, and pass on both."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from kernelpack.cache import DiskStore

A, B, C = "ab" * 32, "cd" * 32, "ef" * 32


def _tree(root: Path) -> list[tuple[str, str, int]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(
                st.st_mode) else "file"
            out.append((os.path.relpath(path, root), kind, stat.S_IMODE(st.st_mode)))
    return sorted(out)


# ---- differences -------------------------------------------------------------------------------
def test_clear_counts_only_entries_not_a_dangling_link_under_an_entry_name(
        tmp_path: Path) -> None:
    """Old: clear() removed what entries() listed (DirEntry.stat follows links, so a dangling
    link under ``<digest>.kpack`` was not an entry) and returned 1, the count that ``cache ls``
    and ``cache stats`` show. New: clear() walks names (_is_entry) and returns 2: ``kernelpack
    cache clear`` says "removed 2 entries" of a cache that ``cache stats`` said held 1."""
    store = DiskStore(tmp_path / "c")
    store.put(A, b"x" * 10)
    shard = tmp_path / "c" / "entries" / B[:2]
    shard.mkdir()
    (shard / f"{B}.kpack").symlink_to(tmp_path / "nowhere")
    listed = len(store.entries())
    assert listed == 1
    assert store.clear() == listed


def test_untrusted_walks_a_dotdot_below_the_root_as_given(tmp_path: Path) -> None:
    """Old: _first_not_dir walked ``directory.relative_to(root).parts`` lexically, so
    ``root/entries/../keys`` looked at ``root/entries`` first and reported the planted link
    (through which ``..`` is the link target's parent: that is where files would go). New:
    os.path.relpath normalizes ``entries/..`` away, checks only ``root/keys`` and returns
    None: the link is neither reported nor refused."""
    elsewhere = tmp_path / "elsewhere" / "sub"
    elsewhere.mkdir(parents=True)
    root = tmp_path / "c"
    root.mkdir()
    (root / "entries").symlink_to(elsewhere)
    store = DiskStore(root)
    why = store.untrusted(store.root / "entries" / ".." / "keys", "keys")
    assert why == f"{store.root / 'entries'} is a symbolic link"


# ---- the same on both --------------------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["relative", "trailing slash", "dotdot", "link then dotdot",
                                      "symlinked root", "unicode and spaces", "tilde"])
def test_a_root_however_spelled_gets_the_same_files(tmp_path: Path, spelling: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries, records and locks land in ``<root>/entries/ab/<digest>.kpack`` etc. with
    mode 0700 directories, whatever the spelling of the root; ``..`` after a symbolic link
    is the link target's parent (absolute() does not normalize, nor may the joins)."""
    real = tmp_path / "real"
    real.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "t" / "sub").mkdir(parents=True)
    (tmp_path / "ln").symlink_to(tmp_path / "t" / "sub")
    given, where = {
        "relative": ("rel/c", tmp_path / "rel" / "c"),
        "trailing slash": (f"{tmp_path}/c/", tmp_path / "c"),
        "dotdot": (f"{tmp_path}/a/b/../../c", tmp_path / "c"),
        "link then dotdot": (f"{tmp_path}/ln/../c", tmp_path / "t" / "c"),
        "symlinked root": (str(tmp_path / "ln"), tmp_path / "t" / "sub"),
        "unicode and spaces": (f"{tmp_path}/caché ü/x y", tmp_path / "caché ü" / "x y"),
        "tilde": ("~/c", tmp_path / "c"),
    }[spelling]
    store = DiskStore(given)
    store.put(A, b"x" * 100)
    store.put(B, b"y" * 100)
    with store.lock(A):
        pass
    assert store.exposed(A) is None
    assert store.untrusted(store.root / "entries" / A[:2], "entries") is None
    assert sorted(e.path.resolve() for e in store.entries()) == sorted(
        (where / "entries" / d[:2] / f"{d}.kpack").resolve() for d in (A, B))
    tree = _tree(where)
    assert ("entries", "dir", 0o700) in tree
    assert (f"entries/{A[:2]}/{A}.kpack", "file", 0o644) in tree
    assert (f"entries/{B[:2]}", "dir", 0o700) in tree
    assert not [t for t in tree if t[0].endswith(".tmp")]
    assert store.evict(150, keep=B) == (1, 100)
    assert [e.digest for e in store.entries()] == [B]
    assert store.get(B) == b"y" * 100
    assert store.clear() == 1 and store.entries() == []


@pytest.mark.parametrize("planted", ["entries", "shard", "keys shard", "locks"])
def test_a_planted_link_is_refused_naming_it(tmp_path: Path, planted: str) -> None:
    """A link in place of entries/, a shard, a key record's shard or locks/ is refused with
    ELOOP naming exactly that component (a wrong join or relpath names another or none), and
    nothing is written into the link's target."""
    target = tmp_path / "target"
    (target / A[:2]).mkdir(parents=True)
    root = tmp_path / "c"
    root.mkdir()
    store = DiskStore(root)
    name = {"entries": "entries", "shard": f"entries/{A[:2]}", "keys shard": f"keys/{A[:2]}",
            "locks": "locks"}[planted]
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).symlink_to(target)
    if planted == "keys shard":
        with pytest.raises(OSError) as info:
            store._check_no_links(store.root / "keys" / A[:2])
    elif planted == "locks":
        with pytest.raises(OSError) as info, store.lock(A):
            pass
    else:
        with pytest.raises(OSError) as info:
            store.put(A, b"x")
    assert info.value.errno == errno.ELOOP
    assert str(info.value.filename) == str(store.root / name)
    assert str(store.root / name) + " is a symbolic link" in str(info.value)
    assert _tree(target) == [(A[:2], "dir", 0o755)]


def test_eviction_order_and_records_with_a_world_writable_shard_flagged(tmp_path: Path) -> None:
    """Eviction removes the least recently used entries and their key records, keeping the
    given one; a world-writable shard is named by exposed() (its own path, not the entry's)."""
    root = tmp_path / "c"
    store = DiskStore(root)
    digests = [f"{i:02x}" * 32 for i in range(1, 7)]
    for i, d in enumerate(digests):
        store.put(d, b"x" * 1000)
        os.utime(store.path(d), (1_000_000 + i, 1_000_000 + i))
        record = root / "keys" / d[:2] / f"{d}.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text("{}")
    assert store.evict(2500, keep=digests[0]) == (4, 4000)
    assert [e.digest for e in store.entries()] == [digests[0], digests[5]]
    assert sorted(p.name for p in (root / "keys").rglob("*.json")) == [
        f"{digests[0]}.json", f"{digests[5]}.json"]
    (root / "entries" / A[:2]).mkdir(mode=0o700)
    os.chmod(root / "entries" / A[:2], 0o777)
    why = store.exposed(A)
    assert why is not None and why.startswith(f"{root / 'entries' / A[:2]} (owner uid")


def test_prune_temps_and_clear_find_what_was_planted(tmp_path: Path) -> None:
    """Temporaries in sharded and flat directories, unheld lock files, quarantined files and
    the digest memo are found by the string walk as by the Path walk."""
    root = tmp_path / "c"
    store = DiskStore(root)
    store.put(A, b"abc")
    store.put(B, b"abcd")
    (root / "entries" / A[:2] / ".x.123.abcd.tmp").write_text("t")
    (root / "keys" / "ab").mkdir(parents=True)
    (root / "keys" / "ab" / ".y.1.ab.tmp").write_text("t")
    (root / "locks").mkdir()
    (root / "locks" / f"{C}.lock").write_text("")
    (root / "meta").mkdir()
    (root / "meta" / "digests.json").write_text("{}")
    (root / "quarantine").mkdir()
    (root / "quarantine" / f"{C}.5.kpack").write_text("q")
    assert sorted(p.name for p in store.temporaries()) == [".x.123.abcd.tmp", ".y.1.ab.tmp"]
    assert store.prune_temps(older_than_s=0) == 3
    assert store.clear() == 2
    assert [t for t in _tree(root) if t[1] != "dir"] == []
