"""Cache keys: stable across processes, sensitive to every input, explainable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import config
from kernelpack.cache import keys
from kernelpack.cache.keys import CacheKey, canonical_options, make_key

from .conftest import worker_env

BASE = dict(kind="external", source=b"ptx bytes", options={"entry": "axpy", "block": 256},
            targets=["sm_80", "sm_90"])


def key(**changes: object) -> CacheKey:
    args = {**BASE, **changes}
    return make_key(args["kind"], args["source"], args["options"], args["targets"])


def test_same_inputs_same_key_across_processes() -> None:
    """No id(), no salted hash(): two interpreters with different hash seeds agree."""
    code = ("import kernelpack as kp; print(kp.make_key('external', b'ptx bytes', "
            "{'entry': 'axpy', 'block': 256}, ['sm_90', 'sm_80']).digest)")
    digests = set()
    for seed in ("1", "2"):
        env = {**worker_env(), "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60, check=True)
        digests.add(out.stdout.strip())
    assert digests == {key().digest}


@pytest.mark.parametrize("change", [
    {"kind": "fusion"},
    {"source": b"ptx bytes "},
    {"options": {"entry": "axpy", "block": 128}},
    {"options": {"entry": "axpy", "block": 256.0}},
    {"options": {"entry": "axpy", "block": "256"}},
    {"options": {"entry": "axpy", "block": True}},
    {"options": {"entry": "axpy"}},
    {"options": {"entry": "axpy", "block": 256, "fast_math": False}},
    {"targets": ["sm_80"]},
    {"targets": ["sm_80", "sm_90", "ptx"]},
])
def test_every_input_changes_the_key(change: dict) -> None:
    assert key(**change).digest != key().digest


def test_option_order_and_target_order_do_not_matter() -> None:
    a = make_key("external", b"s", {"a": 1, "b": [1, 2]}, ["sm_90", "sm_80"])
    b = make_key("external", b"s", {"b": [1, 2], "a": 1}, ["SM_80 ", "sm_90"])
    assert a.digest == b.digest


def test_canonical_options_tag_types() -> None:
    assert canonical_options({"x": 1}) != canonical_options({"x": True})
    assert canonical_options({"x": [1]}) == canonical_options({"x": (1,)})  # both sequences
    assert canonical_options({"x": [1]}) != canonical_options({"x": {1}})
    assert canonical_options({"x": kp.f32}) != canonical_options({"x": "float32"})
    assert canonical_options({"x": {"b": 1, "a": 2}}) == canonical_options({"x": {"a": 2, "b": 1}})
    assert canonical_options({"x": float("nan")}) == canonical_options({"x": float("nan")})


def test_unhashable_option_types_are_refused() -> None:
    with pytest.raises(TypeError, match="options.x"):
        make_key("external", b"s", {"x": object()}, ["sm_80"])
    with pytest.raises(TypeError, match="names must be str"):
        make_key("external", b"s", {1: 2}, ["sm_80"])  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="targets"):
        make_key("external", b"s", {}, "sm_80")  # type: ignore[arg-type]


def test_codegen_knob_changes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(config._REGISTRY, "KERNELPACK_TEST_OPT",
                        config.Knob("KERNELPACK_TEST_OPT", None, True, "test"))
    unset = key()
    monkeypatch.setenv("KERNELPACK_TEST_OPT", "3")
    assert key().digest != unset.digest
    assert "KERNELPACK_TEST_OPT=3" in key().part("env")


def test_non_codegen_knob_does_not_change_the_key(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path) -> None:
    before = key()
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(tmp_path))
    assert key().digest == before.digest


def test_toolchain_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    before = key()
    monkeypatch.setattr(keys, "_TOOLCHAIN", (("llvm", "LLVM 99"), ("nvjitlink", "x"),
                                             ("libdevice", "sha256:00")))
    assert key().digest != before.digest
    assert key().part("llvm") == "LLVM 99"


@pytest.fixture()
def fresh_libdevice():  # type: ignore[no-untyped-def]
    from kernelpack.toolchain import libdevice

    def clear() -> None:
        libdevice.find.cache_clear()
        libdevice.digest.cache_clear()

    clear()
    yield
    clear()


def test_failed_probe_is_recorded_as_its_exception(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                   fresh_libdevice) -> None:
    monkeypatch.setenv("KERNELPACK_LIBDEVICE", str(tmp_path / "missing.bc"))
    assert keys._probe_libdevice() == "unavailable:CompileError"
    from kernelpack.toolchain import libdevice

    libdevice.find.cache_clear()
    real = tmp_path / "libdevice.10.bc"
    real.write_bytes(b"bitcode")
    monkeypatch.setenv("KERNELPACK_LIBDEVICE", str(real))
    probed = keys._probe_libdevice()
    assert probed == "sha256:" + __import__("hashlib").sha256(b"bitcode").hexdigest()
    assert str(tmp_path) not in probed


def test_no_absolute_paths_or_device_in_parts() -> None:
    k = key()
    text = "\n".join(v for _, v in k.parts)
    assert "/" not in text.replace("sha256:", "")  # no path separators anywhere
    assert [label for label, _ in k.parts] == list(keys.KEY_LABELS)


def test_from_parts_recomputes_and_explain_lists_parts() -> None:
    k = key()
    assert CacheKey.from_parts([list(p) for p in k.parts]) == k
    tampered = [(label, "x" if label == "targets" else v) for label, v in k.parts]
    assert CacheKey.from_parts(tampered).digest != k.digest
    text = k.explain()
    assert k.digest in text and "nvjitlink" in text and "targets" in text


def test_diff_names_the_changed_parts() -> None:
    diffs = key(targets=["sm_80"]).diff(key())
    assert [d[0] for d in diffs] == ["targets"]


def test_digest_is_injective_over_part_boundaries() -> None:
    assert keys.digest_parts([("a", "bc")]) != keys.digest_parts([("ab", "c")])
    assert keys.digest_parts([("a", "b"), ("c", "")]) != keys.digest_parts([("a", "b"), ("", "c")])


def _codegen_tree(root: Path, lowering: bytes = b"CHUNK = 8192\n") -> Path:
    for package, name, data in (("lowering", "tuning.py", lowering),
                                ("lowering", "rows.py", b"def row(): ...\n"),
                                ("toolchain", "nvjitlink.py", b"LEVEL = 3\n"),
                                ("runtime", "launcher.py", b"# not code generation\n")):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / name).write_bytes(data)
    return root


def test_the_code_generators_source_is_a_key_part(tmp_path: Path) -> None:
    """A schedule changed without a release kept kernelpack's version, and a cache filled by
    the old lowering answered with its code: the source of lowering/ and toolchain/ is hashed
    into the key (as Triton's key hashes its compiler's files)."""
    base = keys.codegen_digest(root=_codegen_tree(tmp_path / "a"))
    assert base.startswith("sha256:") and base.endswith("(3 files)")
    assert keys.codegen_digest(root=_codegen_tree(tmp_path / "b")) == base  # bytes, not paths
    assert keys.codegen_digest(root=_codegen_tree(tmp_path / "c", b"CHUNK = 16384\n")) != base
    moved = _codegen_tree(tmp_path / "d")
    (moved / "lowering" / "rows.py").rename(moved / "lowering" / "rows2.py")
    assert keys.codegen_digest(root=moved) != base  # a file's name counts too
    runtime_only = _codegen_tree(tmp_path / "e")
    (runtime_only / "runtime" / "launcher.py").write_bytes(b"# changed\n")
    assert keys.codegen_digest(root=runtime_only) == base  # the runtime makes no code
    # the package's own modules shape artifacts too (review 28: an edited expr.py, whose cdiv
    # makes grids, was served the old artifact)
    top = _codegen_tree(tmp_path / "f")
    (top / "expr.py").write_bytes(b"def cdiv(a, b): ...\n")
    with_expr = keys.codegen_digest(root=top)
    assert with_expr != base and with_expr.endswith("(4 files)")
    (top / "expr.py").write_bytes(b"def cdiv(a, b): return 1\n")
    assert keys.codegen_digest(root=top) != with_expr
    assert keys.codegen_digest(root=tmp_path / "empty") == "unavailable:no source"


def test_the_installed_code_generators_digest_is_in_every_key() -> None:
    k = keys.make_key("external", b"ptx", targets=["sm_90"])
    assert dict(k.parts)["codegen"] == keys.codegen_digest()
    assert keys.codegen_digest().endswith(" files)")  # this checkout ships its .py files
