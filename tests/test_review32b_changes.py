"""Review 32b: today's changes (save temporaries, cache roots, traces, loaded programs, CLI)
attacked from outside. Black-box: documented behaviour only."""
from __future__ import annotations

import gc
import os
import pickle
import warnings
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cli import main

AXPY_PTX = Path(__file__).resolve().parent.parent / "examples" / "axpy.ptx"


def _axpy() -> kp.Compiled:
    return kp.external(
        "axpy", "axpy",
        params=[kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv("n", 256), block=256, ptx=str(AXPY_PTX), targets=["sm_80"],
    )


@pytest.fixture(scope="module")
def axpy() -> kp.Compiled:
    return _axpy()


def _capture_temporaries(monkeypatch) -> list[bytes]:
    """Records the basename of every file kp.save renames into place."""
    seen: list[bytes] = []
    real = os.replace

    def spy(src, dst, *a, **kw):
        seen.append(os.fsencode(os.path.basename(os.fsencode(src))))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", spy)
    return seen


# --- save paths -------------------------------------------------------------------------


@pytest.mark.parametrize("lead", [0, 1, 2, 3], ids=["lead0", "lead1", "lead2", "lead3"])
def test_long_multibyte_name_temporary_is_valid_utf8(tmp_path, axpy, monkeypatch, lead):
    """A 255-byte name of two-byte characters: the temporary's shortened name must not cut
    a character in half (a name of invalid UTF-8 is refused by utf8-only file systems and
    shows as mojibake in every listing)."""
    name = ("a" * lead + "é" * 130).encode()[:249].decode("utf-8", "ignore") + ".kpack"
    assert len(name.encode()) >= 254
    seen = _capture_temporaries(monkeypatch)
    kp.save([axpy], tmp_path / name)
    assert kp.load(tmp_path / name).programs == ["axpy"]
    assert len(seen) == 1
    temp = seen[0]
    assert len(temp) <= 255
    temp.decode("utf-8")  # raises UnicodeDecodeError when a character was cut


def test_long_names_sharing_prefix_keep_each_others_orphans(tmp_path, axpy, monkeypatch):
    """Two 255-byte names that share their first 240 bytes: saving one removes only its own
    killed save's temporary, never the other's."""
    a = "a" * 240 + "A" * 9 + ".kpack"
    b = "a" * 240 + "B" * 9 + ".kpack"
    seen = _capture_temporaries(monkeypatch)
    kp.save([axpy], tmp_path / a)
    kp.save([axpy], tmp_path / b)
    monkeypatch.undo()
    ta, tb = seen
    assert ta != tb
    (tmp_path / os.fsdecode(ta)).write_bytes(b"orphan")  # as a killed save leaves them
    (tmp_path / os.fsdecode(tb)).write_bytes(b"orphan")
    kp.save([axpy], tmp_path / a)
    left = {os.fsencode(n) for n in os.listdir(tmp_path)}
    assert ta not in left
    assert tb in left
    assert kp.load(tmp_path / b).programs == ["axpy"]


def test_bytes_pathlike_save_and_load(tmp_path, axpy):
    class BytesPath:
        def __init__(self, p: bytes) -> None:
            self.p = p

        def __fspath__(self) -> bytes:
            return self.p

    target = BytesPath(os.fsencode(tmp_path / "b.kpack"))
    kp.save([axpy], target)
    assert kp.load(target).programs == ["axpy"]


# --- cache roots --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plus3():
    @kp.fusion
    def plus3(x: kp.Tensor[kp.f32, "n"]):
        return x + 3.0

    return plus3


def test_cache_root_dangling_symlink_is_refused_or_used(tmp_path, plus3):
    """A cache root that is a symbolic link to a missing directory (a moved or unmounted
    disk) is the sibling of today's link-loop fix: it must either be refused with a
    ValueError naming it, or work (entries stored). It was accepted, warned on every
    write, never stored anything, and 'cache stats' said 0 entries, exit 0."""
    root = tmp_path / "root"
    root.symlink_to(tmp_path / "gone" / "deep")
    try:
        cache = kp.Cache(root)
    except ValueError as exc:
        assert str(root) in str(exc)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kp.compile(plus3, targets=["sm_80"], cache=cache)
    assert cache.stats()["puts"] == 1, [str(w.message) for w in caught]
    assert not caught, [str(w.message) for w in caught]


def test_cache_root_dangling_symlink_cli_stats_not_silent_success(tmp_path, capsys):
    root = tmp_path / "root"
    root.symlink_to(tmp_path / "gone" / "deep")
    rc = main(["cache", "stats", "--dir", str(root)])
    err = capsys.readouterr().err
    # kp.Cache and the CLI agree: refused (exit 1 naming the root), or a usable root
    try:
        kp.Cache(root)
        refused = False
    except ValueError:
        refused = True
    if refused:
        assert rc == 1 and str(root) in err
    else:
        assert rc == 0


def test_cache_loop_chain_and_child_named(tmp_path):
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    (tmp_path / "chain").symlink_to(tmp_path / "l1")
    for p in [tmp_path / "chain", tmp_path / "chain" / "sub"]:
        with pytest.raises(ValueError) as info:
            kp.Cache(p)
        assert str(p) in str(info.value)


def test_cache_dirs_0700_with_missing_parents_and_existing_left_alone(tmp_path, plus3):
    old = os.umask(0o022)
    try:
        existing = tmp_path / "have"
        existing.mkdir(mode=0o755)
        os.chmod(existing, 0o755)
        root = existing / "missing" / "cache"
        cache = kp.Cache(root)
        assert kp.compile(plus3, targets=["sm_80"], cache=cache).origin == "compiled"
    finally:
        os.umask(old)
    assert existing.stat().st_mode & 0o777 == 0o755
    for d in [existing / "missing", root, *[p for p in root.rglob("*") if p.is_dir()]]:
        assert d.stat().st_mode & 0o777 == 0o700, d
    with kp.Cache(root) as again:
        assert kp.compile(plus3, targets=["sm_80"], cache=again).origin == "disk"
        st = again.stats()
        assert (st["disk_hits"], st["disk_misses"], st["compiles"]) == (1, 0, 0)


def test_explained_miss_names_own_key_and_survives_old_records(tmp_path, monkeypatch, caplog):
    import json

    monkeypatch.setenv("KERNELPACK_CACHE_EXPLAIN", "1")
    cache = kp.Cache(tmp_path / "c")

    def make(name: str, k: float):
        def body(x: kp.Tensor[kp.f32, "n"]):
            return x * k

        body.__name__ = body.__qualname__ = name
        return kp.fusion(body)

    for i in range(4):
        kp.compile(make(f"p{i}", float(i + 1)), targets=["sm_80"], cache=cache)
    own = {json.loads(f.read_text())["program"]: json.loads(f.read_text())["digest"]
           for f in (tmp_path / "c" / "keys").rglob("*.json")}
    with caplog.at_level("INFO", logger="kernelpack.cache"):
        kp.compile(make("p2", 7.5), targets=["sm_80"], cache=cache)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "'p2'" in text and own["p2"][:16] in text
    for f in (tmp_path / "c" / "keys").rglob("*.json"):  # records of an older version
        rec = json.loads(f.read_text())
        rec.pop("program")
        f.write_text(json.dumps(rec))
    caplog.clear()
    with caplog.at_level("INFO", logger="kernelpack.cache"):
        kp.compile(make("p3", 9.5), targets=["sm_80"], cache=cache)
    assert any("'p3'" in r.getMessage() for r in caplog.records)


# --- compile: one trace -------------------------------------------------------------------


def test_trace_runs_once_per_compile_with_cache(tmp_path):
    calls = [0]

    @kp.fusion
    def side(x: kp.Tensor[kp.f32, "n"]):
        calls[0] += 1
        return x * float(calls[0])

    cache = kp.Cache(tmp_path / "c")
    first = kp.compile(side, targets=["sm_80"], cache=cache)
    assert calls[0] == 1
    # the code filed under the key is the code of that trace: a fresh compile of the same
    # value (calls is 1 again during the trace) hits and equals it
    calls[0] = 0
    again = kp.compile(side, targets=["sm_80"], cache=kp.Cache(tmp_path / "c"))
    assert calls[0] == 1 and again.origin == "disk" and again == first


# --- loaded programs -------------------------------------------------------------------


def test_program_outlives_pack_and_refuses_pickle_and_copy(tmp_path, axpy):
    import copy

    kp.save([axpy], tmp_path / "a.kpack")
    pack = kp.load(tmp_path / "a.kpack")
    prog = pack["axpy"]
    del pack
    gc.collect()
    assert prog.plan(x=(1000,), y=(1000,), a=1.0).launches[0].grid == (4, 1, 1)
    assert kp.load(kp.save(prog, None)).programs == ["axpy"]
    for fn in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="axpy"):
            fn(prog)


# --- CLI -----------------------------------------------------------------------------------


def test_cli_main_reentered_from_built_module(tmp_path, capsys):
    kp.save([_axpy()], tmp_path / "a.kpack")
    src = tmp_path / "reent.py"
    src.write_text(
        "import kernelpack as kp\nfrom kernelpack.cli import main\n"
        f"INNER = main(['verify', {str(tmp_path / 'a.kpack')!r}])\n"
        "@kp.fusion\ndef f(x: kp.Tensor[kp.f32, 'n']):\n    return x + 1.0\n")
    rc = main(["build", str(src), "-o", str(tmp_path / "o.kpack"), "--targets", "sm_80", "-q"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "OK:" in out
    assert kp.load(tmp_path / "o.kpack").programs == ["f"]


def test_cli_unwritable_stdout_twice_then_recovers(tmp_path, axpy):
    """In one process: two calls into /dev/full both fail (1), a later call into a
    writable stdout succeeds and its output arrives (descriptor 1 not left on /dev/null)."""
    import subprocess
    import sys

    kp.save([axpy], tmp_path / "a.kpack")
    script = (
        "import os, sys\n"
        "from kernelpack.cli import main\n"
        "f = sys.argv[1]\n"
        "saved = os.dup(1); full = os.open('/dev/full', os.O_WRONLY)\n"
        "os.dup2(full, 1)\n"
        "rcs = [main(['inspect', f]), main(['inspect', f])]\n"
        "out = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT, 0o600); os.dup2(out, 1)\n"
        "rcs.append(main(['verify', f])); sys.stdout.flush()\n"
        "os.dup2(saved, 1)\n"
        "sys.stderr.write('RCS=%r\\n' % (rcs,))\n"
    )
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a.kpack"),
                          str(tmp_path / "out.txt")], capture_output=True, text=True,
                         timeout=60)
    assert "RCS=[1, 1, 0]" in res.stderr, res.stderr
    assert "OK:" in (tmp_path / "out.txt").read_text()


def test_cli_build_package_module_twice_sees_sibling_edit(tmp_path, monkeypatch):
    pkg = tmp_path / "pkgx32b"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("K = 2.0\n")
    (pkg / "sub.py").write_text(
        "import kernelpack as kp\nfrom pkgx32b.helper import K\n"
        "@kp.fusion\ndef f(x: kp.Tensor[kp.f32, 'n']):\n    return x * K\n")
    monkeypatch.chdir(tmp_path)
    args = ["--targets", "sm_80", "-q"]
    assert main(["build", "pkgx32b.sub", "-o", str(tmp_path / "1.kpack"), *args]) == 0
    (pkg / "helper.py").write_text("K = 7.0\n")  # same size, same second
    assert main(["build", "pkgx32b.sub", "-o", str(tmp_path / "2.kpack"), *args]) == 0
    one = kp.load(tmp_path / "1.kpack").compiled("f")
    two = kp.load(tmp_path / "2.kpack").compiled("f")
    assert one != two


def test_cli_diff_does_not_report_unchanged_toolchain_as_change(tmp_path, capsys, monkeypatch):
    """'kernelpack diff' of two builds that differ only in code printed
    "toolchain 'X' -> 'X'" (the same value as a change)."""
    for k, name in [("2.0", "a"), ("7.0", "b")]:
        src = tmp_path / f"m{name}.py"
        src.write_text("import kernelpack as kp\n@kp.fusion\n"
                       f"def f(x: kp.Tensor[kp.f32, 'n']):\n    return x * {k}\n")
        assert main(["build", str(src), "-o", str(tmp_path / f"{name}.kpack"),
                     "--targets", "sm_80", "-q"]) == 0
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "a.kpack"), str(tmp_path / "b.kpack")]) == 1
    out = capsys.readouterr().out
    assert "raw digest" in out
    for line in out.splitlines():
        if "toolchain" in line and "->" in line:
            part = line[line.index("toolchain"):]
            old, _, new = part.partition(" -> ")
            assert old.removeprefix("toolchain ").strip(" ,") != new.strip(" ,"), line
