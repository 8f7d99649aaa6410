"""``kernelpack build --cache`` with ``$KERNELPACK_REMOTE_CACHE``: the build machine signs the
remote entries it writes with ``--sign-with`` and reads entries signed by ``--trusted-key``
(or by its own key), so a second build on a clean disk loads them instead of compiling."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelpack.cli import main

pytest.importorskip("llvmlite", reason="the lowering (kernelpack[compile]) is not installed")
pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")

SOURCE = '''
import kernelpack as kp

@kp.fusion
def shifted(x: kp.Tensor[kp.f32, "n"], a: kp.f32):
    return x + a
'''


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def origins(stderr: str) -> list[str]:
    return [line.split(": ", 1)[1].split(" in ")[0] for line in stderr.splitlines()
            if line.startswith("[")]


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    path = tmp_path / "kp_remote_build.py"
    path.write_text(textwrap.dedent(SOURCE))
    return path


def test_a_signed_build_reads_back_its_remote_entries(capsys, monkeypatch, tmp_path, source,
                                                      redis_server, signing_keys) -> None:
    private, public = signing_keys
    monkeypatch.setenv("KERNELPACK_REMOTE_CACHE", redis_server.url)
    first = run(capsys, "build", source, "-o", tmp_path / "1.kpack", "--targets", "sm_80",
                "--cache-dir", tmp_path / "disk1", "--sign-with", private)
    assert first[0] == 0, first[2]
    assert origins(first[2]) == ["compiled"]
    # another machine: a clean disk, the same Redis, trusting the build key's public half
    second = run(capsys, "build", source, "-o", tmp_path / "2.kpack", "--targets", "sm_80",
                 "--cache-dir", tmp_path / "disk2", "--trusted-key", public)
    assert second[0] == 0, second[2]
    assert origins(second[2]) == ["from the remote cache"]
    # and the build machine itself, on a clean disk, trusts its own key by default
    third = run(capsys, "build", source, "-o", tmp_path / "3.kpack", "--targets", "sm_80",
                "--cache-dir", tmp_path / "disk3", "--sign-with", private)
    assert origins(third[2]) == ["from the remote cache"]


def test_an_unsigned_build_warns_that_its_remote_entries_are_never_read(
        capsys, monkeypatch, tmp_path, source, redis_server) -> None:
    monkeypatch.setenv("KERNELPACK_REMOTE_CACHE", redis_server.url)
    code, _, stderr = run(capsys, "build", source, "-o", tmp_path / "1.kpack", "--targets",
                          "sm_80", "--cache-dir", tmp_path / "disk1")
    assert code == 0, stderr
    # one line of its own, as the CLI's errors are (not Python's path:line: Category: format)
    assert "\nwarning: remote cache has no trusted_keys" in "\n" + stderr, stderr
    assert "written but never read" in stderr and "CacheWarning" not in stderr, stderr


def test_trusted_key_without_cache_is_a_usage_error(capsys, tmp_path, source,
                                                    signing_keys) -> None:
    code, _, stderr = run(capsys, "build", source, "-o", tmp_path / "1.kpack",
                          "--trusted-key", signing_keys[1])
    assert code == 2 and "--trusted-key" in stderr and "--cache" in stderr
