"""Review 33: the error-message audit (what a user sees when they get the API or the CLI wrong).

Each test provokes a realistic mistake and checks that the error is of the documented kind and
names the parameter / field / file involved and what was expected ("clear errors for bad input,
naming the parameter, the shape, the offset"). Tests of bugs found by this review fail until
they are fixed; a few guards pin what is right already.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
from kp_redis_helpers import RedisServer, free_port

import kernelpack as kp
from kp_cli import run

ROOT = Path(__file__).resolve().parents[1]
AXPY_PTX = ROOT / "examples" / "axpy.ptx"
SECRET = "s3cretPW-r33"
SEED = b"\x01" * 32  # an ed25519 private key seed (sign_with accepts the 32 bytes)


# ---- fixtures --------------------------------------------------------------------------------
def _axpy_params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]


def _external(**kw: object) -> kp.Compiled:
    args: dict = dict(params=_axpy_params(), grid=kp.cdiv("n", 256), block=256, ptx=AXPY_PTX,
                      targets=["sm_80"])
    args.update(kw)
    return kp.external("axpy", "axpy", **args)


@pytest.fixture(scope="module")
def axpy() -> kp.Compiled:
    return _external()


@pytest.fixture(scope="module")
def art(axpy: kp.Compiled, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("r33art") / "axpy.kpack"
    kp.save([axpy], path)
    return path


class _CAI:
    """A device array as far as ``__cuda_array_interface__`` goes (nothing is dereferenced:
    these arrays are refused before any launch)."""

    def __init__(self, iface: dict) -> None:
        self.__cuda_array_interface__ = iface


_GOOD_CAI = dict(shape=(10,), typestr="<f4", data=(1 << 20, False), version=3)


_free_port = free_port


@pytest.fixture(scope="module")
def redis_pw(tmp_path_factory: pytest.TempPathFactory):
    """A password-protected redis-server on a free loopback port: (port, redis-py module)."""
    with RedisServer(tmp_path_factory.mktemp("r33redis"), password=SECRET) as server:
        yield server.port, pytest.importorskip("redis")


# ---- kp.compile / kernelpack build: an architecture the toolchain does not know -------------
@pytest.mark.parametrize("target", ["sm_999", "sm_80a"])
def test_compile_with_an_unknown_architecture_names_targets_and_prints_nothing(
        target: str, capfd: pytest.CaptureFixture[str]) -> None:
    """``targets=["sm_999"]`` (newer than this toolchain) or ``["sm_80a"]`` (no such
    arch-specific variant): the error must name ``targets`` and the target, and LLVM must not
    write "'sm_999' is not a recognized processor for this target" lines to the process's
    stderr (six of them per fusion, before nvJitLink's 'rejected the options' error)."""
    @kp.fusion
    def r33_inc(x: kp.Tensor[kp.f32, "n"]):  # type: ignore[valid-type]
        return x + 1

    capfd.readouterr()
    with pytest.raises((kp.KernelPackError, ValueError)) as info:
        kp.compile(r33_inc, targets=[target])
    err = capfd.readouterr().err
    msg = str(info.value)
    assert target in msg and "targets" in msg, msg
    assert "not a recognized processor" not in err, err


# ---- expression fields: a string that is not a symbol name --------------------------------
@pytest.mark.parametrize("call, words", [
    (lambda: kp.Tensor("x", kp.f32, ["2n"]), ["'x'", "shape"]),
    (lambda: kp.Scalar("n32", kp.u32, value="n+1"), ["n32", "value"]),
    (lambda: kp.Scratch("ws", kp.f32, ["n*2"]), ["ws"]),
    (lambda: _external(grid="cdiv(n, 256)"), ["grid"]),
    (lambda: _external(block="256"), ["block"]),
    (lambda: _external(shared_mem="0"), ["shared_mem"]),
    (lambda: _external(constraints=[("n < 10", "short rows only")]), ["constraint"]),
], ids=["tensor-shape", "scalar-value", "scratch-shape", "grid", "block", "shared_mem",
        "constraint"])
def test_a_non_identifier_string_in_an_expression_field_names_the_field(call, words) -> None:
    """Strings name symbols wherever an expression is accepted; a string that is not one
    (``block="256"`` read from a config, ``grid="cdiv(n, 256)"``, a shape ``["2n"]``) gave
    'a symbol name must be a Python identifier (got '256')', naming no field, no tensor and
    no program, while the same mistake as a float (``shape=[5.0]``) says
    "tensor 'x': shape[0]: expected an int, ...". """
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


# ---- dtypes: the error names the tensor or scalar ---------------------------------------------
@pytest.mark.parametrize("call, name", [
    (lambda: kp.Tensor("x", "fp32", ["n"]), "x"),
    (lambda: kp.Scalar("alpha", float), "alpha"),
], ids=["tensor-fp32", "scalar-python-float"])
def test_an_unknown_dtype_names_the_parameter(call, name: str) -> None:
    """``kp.Tensor("x", "fp32", ["n"])`` gave "not a kernelpack dtype (got 'fp32')": which
    parameter, and which dtypes exist? Every other field error of kp.Tensor names the tensor
    ("tensor 'x': role must be one of ...")."""
    with pytest.raises(TypeError) as info:
        call()
    msg = str(info.value)
    assert f"'{name}'" in msg and "dtype" in msg, msg


# ---- a loaded program's call: a malformed __cuda_array_interface__ --------------------------
@pytest.mark.parametrize("change, field", [
    ({"shape": None}, "shape"),
    ({"shape": 10}, "shape"),
    ({"data": None}, "data"),
    ({"data": ()}, "data"),
    ({"strides": 4}, "strides"),
    ({"typestr": "<DROP>"}, "typestr"),
], ids=["shape-None", "shape-int", "data-None", "data-empty", "strides-int", "typestr-missing"])
def test_a_malformed_array_interface_names_the_field(art: Path, change: dict,
                                                     field: str) -> None:
    """The LaunchError named the argument but then quoted Python's own error: "malformed
    __cuda_array_interface__ ('NoneType' object is not iterable)", "(tuple index out of
    range)", "('typestr')" (a KeyError's repr) — not the field, nor what was expected,
    unlike "shape[0] is float 10.5, not an integer" for the same kind of mistake."""
    iface = dict(_GOOD_CAI)
    iface.update(change)
    iface = {k: v for k, v in iface.items() if v != "<DROP>"}
    prog = kp.load(art)["axpy"]
    with pytest.raises(kp.LaunchError) as info:
        prog(_CAI(iface), _CAI(dict(_GOOD_CAI)), 0.5)
    msg = str(info.value)
    assert "'x'" in msg and field in msg, msg
    for internal in ("object is not iterable", "object is not subscriptable",
                     "index out of range", f"('{field}')"):
        assert internal not in msg, msg


# ---- kp.save to a file object that cannot be written ---------------------------------------
@pytest.mark.parametrize("how", ["read-only", "closed"])
def test_save_to_an_unwritable_file_object_names_path_or_file(axpy: kp.Compiled, tmp_path: Path,
                                                              how: str) -> None:
    """``kp.save(c, open(p, "rb"))`` raised io.UnsupportedOperation('write'), a closed file
    ValueError('write to closed file'): neither says which argument. A text file is already
    refused with "kp.save: path_or_file is a text file; open it in binary mode"."""
    path = tmp_path / "a.kpack"
    path.write_bytes(b"")
    fobj = open(path, "rb")
    if how == "closed":
        fobj.close()
    try:
        with pytest.raises((TypeError, ValueError)) as info:
            kp.save([axpy], fobj)
    finally:
        fobj.close()
    assert "path_or_file" in str(info.value), str(info.value)


# ---- kp.Cache(remote=...) ---------------------------------------------------------------------
def test_a_malformed_ipv6_remote_url_names_remote_and_hides_the_password(tmp_path: Path) -> None:
    """``remote="redis://:pw@[::1/0"`` gave urllib's bare "Invalid IPv6 URL" (and
    "error: $KERNELPACK_REMOTE_CACHE: Invalid IPv6 URL" in the CLI): no parameter, no URL,
    unlike every other malformed URL ("remote 'redis://:***@h:99999/0': Port out of range")."""
    with pytest.raises(ValueError) as info:
        kp.Cache(path=tmp_path, remote=f"redis://:{SECRET}@[::1/0", sign_with=SEED)
    msg = str(info.value)
    assert "remote" in msg and "[::1" in msg, msg
    assert SECRET not in msg


def test_a_remote_failure_warning_names_the_server(tmp_path: Path) -> None:
    """With the server down, the warning was "remote cache read failed (ConnectionRefusedError:
    [Errno 111] Connection refused); using the local cache ...": which server? The README
    says the URL's password is "shown as *** in reprs, warnings and errors"; a disk-tier
    warning names its directory. A fleet operator needs the host:port (redacted URL)."""
    port = _free_port()  # nothing listens there now
    cache = kp.Cache(path=tmp_path, remote=f"redis://:{SECRET}@127.0.0.1:{port}/0",
                     sign_with=SEED, timeout_s=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.get("ab" * 32) is None
    msgs = [str(w.message) for w in caught]
    assert msgs, "no warning for a refused connection"
    assert any(f"127.0.0.1:{port}" in m for m in msgs), msgs
    assert not any(SECRET in m for m in msgs), msgs


@pytest.mark.parametrize("where, db", [(f"/0?password={SECRET}", 0), ("?db=3", 3)],
                         ids=["password", "db"])
def test_remote_url_query_options_are_honoured_or_refused(redis_pw, axpy: kp.Compiled,
                                                          tmp_path: Path, where: str,
                                                          db: int) -> None:
    """``redis://host:port/0?password=...`` (redis-py's URL form) is accepted, and its
    password is even redacted in the repr as a password, but kernelpack's own redis:// client
    ignores every query option: it never authenticates (a NOAUTH warning at run time, no
    entry shared), and ``?db=3`` writes to db 0. An option the client does not use must be a
    ValueError naming remote (without the password), or be used."""
    port, redis = redis_pw
    auth = "" if "password" in where else f":{SECRET}@"  # the db case authenticates as usual
    url = f"redis://{auth}127.0.0.1:{port}{where}"
    try:
        cache = kp.Cache(path=tmp_path, remote=url, sign_with=SEED, timeout_s=2)
    except ValueError as exc:
        assert "remote" in str(exc) and SECRET not in str(exc), str(exc)
        return
    key = f"{db + 1:02x}" * 32
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.put(key, kp.save([axpy], None))
    client = redis.Redis(port=port, password=SECRET, db=db)
    stored = [k for k in client.keys("*") if key.encode() in k]
    assert stored, (f"{url.replace(SECRET, '***')}: nothing stored in db {db}; warnings: "
                    f"{[str(w.message) for w in caught]}")


# ---- the CLI -------------------------------------------------------------------------------
def test_cli_eval_of_a_missing_program_in_a_large_pack_keeps_the_error_short(
        axpy: kp.Compiled, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``kernelpack eval big.kpack nope ...`` printed every program name of the artifact on its
    one error line (300 programs: ~3 KB; 2000: 22 KB), while ``pack["nope"]`` lists 20 and
    says '...'."""
    many = [dataclasses.replace(axpy, summary=dataclasses.replace(axpy.summary,
                                                                   name=f"prog_{i:04d}"))
            for i in range(300)]
    path = tmp_path / "many.kpack"
    kp.save(many, path)
    code, _out, err = run(capsys, "eval", path, "nope", "x=10", "y=10", "a=0.5")
    assert code == 1 and err.startswith("error:") and "nope" in err, err
    assert len(err) < 1000, f"{len(err)} characters: {err[:200]}..."


def test_cli_build_takes_names_after_the_options(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``kernelpack build src.py -o out.kpack gelu`` (a NAME after an option, as most
    commands allow) failed with the top-level usage ("usage: kernelpack [-h] [--version]
    COMMAND ...") and "unrecognized arguments: gelu", as if NAME were not an argument of
    build. Here the name does not exist, so the answer must be build's own "has no fusion
    ... named nosuch" (checked before anything compiles)."""
    src = tmp_path / "r33_src.py"
    src.write_text("import kernelpack as kp\n\n@kp.fusion\ndef inc(x: kp.Tensor[kp.f32, 'n']):\n"
                   "    return x + 1\n")
    code, _out, err = run(capsys, "build", src, "-o", tmp_path / "o.kpack", "nosuch",
                          "--targets", "sm_80")
    assert code == 2, (code, err)
    assert "unrecognized arguments" not in err and "nosuch" in err, err
    assert not (tmp_path / "o.kpack").exists()


def test_cli_build_with_an_empty_source_does_not_call_it_a_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``kernelpack build "" -o m.kpack`` (an unset shell variable) said
    "error: : a directory; give a .py file or a module name": the empty name was read as the
    current directory."""
    code, _out, err = run(capsys, "build", "", "-o", tmp_path / "m.kpack")
    assert code in (1, 2) and "error" in err, (code, err)
    assert "a directory" not in err, err


# ---- guards: what is right already --------------------------------------------------------
def test_guard_plan_mismatch_names_both_tensors_and_the_symbol(art: Path) -> None:
    with pytest.raises(kp.ConstraintError, match=r"y\.shape\[0\] is 11 but n = 10 from "
                                                 r"x\.shape\[0\]"):
        kp.load(art)["axpy"].plan(x=(10,), y=(11,), a=0.5)
    with pytest.raises(kp.RankError, match=r"x has rank 2 .*expected rank 1"):
        kp.load(art)["axpy"].plan(x=(10, 2), y=(10,), a=0.5)


def test_guard_host_arrays_and_argument_mistakes_name_the_argument(art: Path) -> None:
    np = pytest.importorskip("numpy")
    prog = kp.load(art)["axpy"]
    x = np.zeros(10, np.float32)
    with pytest.raises(kp.LaunchError, match="argument 'x' is in host memory"):
        prog(x, x, 0.5)
    with pytest.raises(TypeError, match=r"missing input\(s\) \['a'\]"):
        prog(x, x)
    with pytest.raises(TypeError, match="has no input 'alpha'"):
        prog(x=x, y=x, alpha=0.5)
    with pytest.raises(TypeError, match="'n32' is not an input, it is computed"):
        prog(x, x, 0.5, n32=10)


def test_guard_fusion_mistakes_are_trace_errors_naming_the_fusion() -> None:
    @kp.fusion
    def r33_none(x: kp.Tensor[kp.f32, "n"]):  # type: ignore[valid-type]
        pass

    with pytest.raises(kp.TraceError, match="fusion r33_none: returns nothing"):
        kp.compile(r33_none, targets=["sm_80"])
    with pytest.raises(TypeError, match=r"compile it with kp\.compile"):
        r33_none(None)
    with pytest.raises(TypeError, match="targets must be a list"):
        kp.compile(r33_none, targets="sm_80")


def test_guard_load_of_a_non_artifact_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(kp.FormatError, match=r"axpy\.ptx: file identifier: expected b'KPAK'"):
        kp.load(AXPY_PTX)


def test_guard_cli_bad_files_give_one_error_line(art: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for argv, status in [(("inspect", tmp_path / "missing.kpack"), 1),
                         (("verify", AXPY_PTX), 1),
                         (("diff", art, tmp_path / "missing.kpack"), 2),
                         (("eval", art, "axpy", "x=10", "y=11", "a=0.5"), 1)]:
        code, _out, err = run(capsys, *argv)
        assert code == status, (argv, code, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
        assert "Traceback" not in err


def test_guard_remote_url_errors_hide_the_password(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="remote") as info:
        kp.Cache(path=tmp_path, remote=f"redis://:{SECRET}@h:99999/0", sign_with=SEED)
    assert SECRET not in str(info.value) and "***" in str(info.value)
