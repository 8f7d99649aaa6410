"""``kernelpack build``: compile the fusions a Python file or module defines into one artifact.

The "compile once" step of a fleet's deployment, without a script of one's own: a build job
runs ``kernelpack build model/kernels.py -o model.kpack`` and ships the artifact; every
process of the fleet then ``kp.load``\\ s it and compiles nothing. What is built are the
module-level objects of the source: each ``@kp.fusion`` function is compiled for
``--targets``, and each :class:`~kernelpack.compiled.Compiled` (a ``kp.compile(...,
static=...)`` specialization, a ``kp.external`` kernel) is taken as it is. Names starting
with ``_`` are left out unless asked for by name.

Compiling takes seconds per row fusion, so every program is reported on stderr as it is done
(``[2/5] softmax: compiled in 1.21 s``; ``--quiet`` turns that off). A program that fails is
reported with its error and the others are still compiled, so that one run shows every
failure; then nothing is written. Only a build where every program compiled writes: the
artifact is written crash-safely by :func:`kernelpack.save` (temporary file, fsync, rename),
so a failed or interrupted build leaves any earlier artifact of that name as it was.
Registered into the ``kernelpack`` command by :func:`register`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from .cli import dir_arg, name_arg, path_arg
from .cli_commands import CLIError, UsageError, not_a_file
from .cli_facts import printable

__all__ = ["register", "import_source", "collect_programs"]

DEFAULT_TARGETS = "sm_80,sm_90,ptx"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``build`` command to ``kernelpack``'s parser."""
    summary = "compile the fusions of a Python file or module into one artifact"
    p = subparsers.add_parser(
        "build", help=summary,
        description=f"{summary}. Every module-level @kp.fusion function is compiled for "
                    f"--targets (the lowering's extra: pip install 'kernelpack[compile]'), "
                    f"and every module-level kp.Compiled (kp.compile(..., static=...), "
                    f"kp.external) is taken as it is; names starting with '_' only when "
                    f"named. Progress goes to stderr. Needs no GPU.",
        epilog="example: kernelpack build examples/fusions.py -o model.kpack "
               "--targets sm_80,sm_90,ptx --cache")
    p.add_argument("source", help="a Python file (path/to/kernels.py) or an importable module "
                                  "(mypackage.kernels, looked up from the current directory "
                                  "first, as python -m does)")
    p.add_argument("names", nargs="*", default=[], metavar="NAME", type=name_arg,
                   help="build only these module attributes (default: every public fusion and "
                        "Compiled)")
    p.add_argument("-o", "--output", required=True, type=path_arg, metavar="OUT",
                   help="the artifact to write (replaced if it exists)")
    p.add_argument("--targets", default=DEFAULT_TARGETS, metavar="LIST",
                   help=f"comma-separated architectures for the fusions (default "
                        f"{DEFAULT_TARGETS}): sm_XY cubins, 'ptx' for a forward-compatible "
                        f"PTX image")
    p.add_argument("--cache", action="store_true",
                   help="compile through the disk cache ($KERNELPACK_CACHE_DIR, else "
                        "$XDG_CACHE_HOME/kernelpack): unchanged fusions are not recompiled")
    p.add_argument("--cache-dir", type=dir_arg, default=None, metavar="DIR",
                   help="compile through the disk cache at DIR (implies --cache)")
    p.add_argument("--explain", action="store_true",
                   help="on a cache miss, print why on stderr: the nearest key the cache "
                        "holds for that fusion and the parts that differ (as "
                        "$KERNELPACK_CACHE_EXPLAIN=1; implies --cache); `kernelpack cache "
                        "explain KEY` shows one key's parts")
    p.add_argument("--sign-with", default=None, type=path_arg, metavar="KEY",
                   help="sign the artifact with this ed25519 private key (from keygen); with "
                        "a remote cache ($KERNELPACK_REMOTE_CACHE) the entries build writes "
                        "there are signed with it too, and entries it signed are read back")
    p.add_argument("--trusted-key", action="append", default=None, type=path_arg,
                   metavar="PUB",
                   help="with --cache and $KERNELPACK_REMOTE_CACHE: a public key file (or hex) "
                        "whose signed remote entries build may load instead of compiling "
                        "(repeat for several; the --sign-with key's own is always trusted)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_build, usage_parser=p)
    return p


def import_source(source: str) -> ModuleType:
    """Import ``source``, a ``.py`` file or a dotted module name, as ``python FILE`` or
    ``python -m MODULE`` would find it (the file's directory, or the current directory,
    first on ``sys.path``). Any failure while importing it is a CLIError naming the source."""
    if not source.strip():  # an unset shell variable: Path("") is the current directory
        raise UsageError("SOURCE is empty: give a .py file or a module name (package.module)")
    path = Path(source)
    as_file = _is_file(source)
    if as_file and path.is_dir():
        raise CLIError(f"{source}: a directory; give a .py file or a module name "
                       f"(package.module)")
    if as_file and not path.is_file():
        raise CLIError(not_a_file(source))
    if not as_file and not all(part.isidentifier() for part in source.split(".")):
        raise UsageError(f"{source!r} is neither a .py file nor a module name")
    home = _home_of(source, as_file)
    # outside the try below: its CLIError says what is wrong already (not "importing it failed")
    spec = _file_spec(path) if as_file else None
    try:
        if spec is not None:
            return _import_file(path, spec)
        _path_first(os.getcwd())
        return importlib.import_module(source)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (source == exc.name or source.startswith(exc.name + ".")):
            raise CLIError(f"{source}: no such module (looked in the current directory "
                           f"and sys.path)") from None
        raise CLIError(f"{source}: importing it failed{_user_line(exc, home)}: "
                       f"{type(exc).__name__}: {exc}") from None
    except SystemExit as exc:  # a script's sys.exit() at import
        raise CLIError(f"{source}: called sys.exit({exc.code!r}) while being imported "
                       f"(guard its script part with if __name__ == '__main__')") from None
    except Exception as exc:  # noqa: BLE001 - the user's code: any failure is reported
        raise CLIError(f"{source}: importing it failed{_user_line(exc, home)}: "
                       f"{type(exc).__name__}: {exc}") from None


_PACKAGE_DIR = str(Path(__file__).resolve().parent)


def _user_line(exc: BaseException, home: str) -> str:
    """`` (at FILE, line N)`` for the deepest frame of the failure in the user's code, so
    that a failure at import names where it happened: a file under ``home`` (the source's
    directory) if any frame is there, else any file that is not importlib's or kernelpack's
    (a library the source called); "" when there is none (a SyntaxError's message names its
    line already)."""
    mine = other = ""
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith("<") and not filename.startswith(_PACKAGE_DIR):
            where = f" (at {filename}, line {tb.tb_lineno})"
            if os.path.abspath(filename).startswith(home):
                mine = where
            else:
                other = where
        tb = tb.tb_next
    return mine or other


def _path_first(directory: str) -> None:
    """``directory`` first on ``sys.path``, once: a service calling ``main(["build", ...])``
    per request grew ``sys.path`` by one entry per build (review 30)."""
    if not sys.path or sys.path[0] != directory:
        if directory in sys.path:
            sys.path.remove(directory)
        sys.path.insert(0, directory)


def _file_spec(path: Path) -> importlib.machinery.ModuleSpec:
    """The spec to import the ``.py`` file ``path`` with, under its own stem (or a private
    name when that is taken, as for a file called ``json.py``); a name an earlier build gave
    this same file is used again, so builds in one process do not leave a module behind each.
    CLIError when Python cannot import the file as source (no ``.py`` suffix it knows)."""
    resolved = path.resolve()
    name, n = path.stem, 0
    while not name.isidentifier() or (name in sys.modules
                                      and not _is_build_of(sys.modules[name], resolved)):
        n += 1
        name = f"_kernelpack_build_source_{n}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CLIError(f"{path}: cannot be imported as Python source")
    return spec


def _import_file(path: Path, spec: importlib.machinery.ModuleSpec) -> ModuleType:
    """The file ``path`` run as a module (``spec``: :func:`_file_spec`'s), registered in
    ``sys.modules`` so that what it defines can be pickled and its dataclasses work, as for
    any imported module. The file is run afresh at each build (it may have changed)."""
    resolved = path.resolve()
    name = spec.name
    assert spec.loader is not None  # (_file_spec refuses a spec without one)
    module = importlib.util.module_from_spec(spec)
    module.__kernelpack_build_source__ = str(resolved)  # type: ignore[attr-defined]
    _path_first(str(resolved.parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _is_build_of(module: ModuleType, resolved: Path) -> bool:
    """Whether ``module`` is what an earlier build made of the file at ``resolved``."""
    return getattr(module, "__kernelpack_build_source__", None) == str(resolved)


def collect_programs(module: ModuleType, names: list[str],
                     source: str | None = None) -> list[tuple[str, Any]]:
    """``(attribute, Fusion or Compiled)`` pairs to build, in program-name order: the named
    ones, or every public one. One object bound to several names is built once (under the
    name it was defined with, when that is one of them).
    Two different programs with one program name are a CLIError naming both attributes (the
    artifact holds one program per name)."""
    from .compiled import Compiled
    from .fusion import Fusion

    label = source or module.__name__  # what the user typed: a file's import name is private
    found = {attr: value for attr, value in vars(module).items()
             if isinstance(value, (Fusion, Compiled))}
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            have = ", ".join(sorted(found)) or "none"
            raise UsageError(f"{label} has no fusion or kp.Compiled named "
                             f"{', '.join(missing)} (has: {have})")
        chosen = [(n, found[n]) for n in dict.fromkeys(names)]
    else:
        chosen = sorted((a, v) for a, v in found.items() if not a.startswith("_"))
        if not chosen:
            raise CLIError(f"{label} defines no @kp.fusion function or kp.Compiled "
                           f"at module level (names starting with '_' count only when named)")
    attrs_of: dict[int, list[str]] = {}  # one object under several names: built once
    for attr, value in chosen:
        attrs_of.setdefault(id(value), []).append(attr)
    by_program: dict[str, str] = {}
    out = []
    for attr, value in chosen:
        attrs = attrs_of[id(value)]
        if attr != attrs[0]:
            continue
        attr = value.name if value.name in attrs else attr  # the name it is defined under
        if value.name in by_program:
            raise CLIError(f"attributes {by_program[value.name]!r} and {attr!r} both make a "
                           f"program named {value.name!r}; an artifact holds one program per "
                           f"name (give one a name: @kp.fusion(name=...))")
        by_program[value.name] = attr
        out.append((attr, value))
    return sorted(out, key=lambda item: item[1].name)  # the artifact's order


def _check_output(output: str, source: str | None = None) -> None:
    """The artifact's directory must exist and ``output`` must not be a directory: found out
    now, not by :func:`kernelpack.save` after every program has compiled."""
    path = Path(output)
    if path.is_dir():
        raise CLIError(f"{output}: is a directory (give the artifact's file name)")
    if source is not None and path.exists() and Path(source).exists() and \
            os.path.samefile(path, source):
        raise CLIError(f"{output}: is the source file itself (the artifact would overwrite "
                       f"it; give another -o)")
    parent = path.parent
    if not parent.is_dir():
        raise CLIError(f"{output}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise CLIError(f"{output}: directory {str(parent)!r} is not writable")


def _kind(exc: BaseException) -> str:
    """The public name of an error's class: a TraceError raised as a private subclass (which
    is also an AttributeError, for ``hasattr``) is a TraceError to the user."""
    return next(c.__name__ for c in type(exc).__mro__ if not c.__name__.startswith("_"))


def _cache(args: argparse.Namespace, sign_key: Any) -> Any:
    """The Cache behind ``--cache``: the disk tier, and the remote one when
    ``$KERNELPACK_REMOTE_CACHE`` names it, signed and read with the build's keys (without
    them the remote entries it wrote were unsigned, so no reader, build included, took them)."""
    if args.cache_dir is None and not args.cache and not args.explain:
        if args.trusted_key:
            raise UsageError("--trusted-key is for reading a remote cache: give --cache too")
        return None
    from . import config
    from .cache import Cache

    explain = args.explain or config.explain_cache_misses()
    if explain:  # the library logs why a miss missed; show it here
        _show_cache_explanations()
    trusted: list[object] | None = None
    if args.trusted_key:
        trusted = list(args.trusted_key)
        if sign_key is not None:  # its own entries beside the others' (the README's "or")
            from .signing import public_key_bytes

            trusted.append(public_key_bytes(sign_key))
    return Cache(path=args.cache_dir, sign_with=sign_key, trusted_keys=trusted,
                 explain_misses=explain)


def _show_cache_explanations() -> None:
    """Print the ``kernelpack.cache`` logger's INFO records (the explanations of misses
    that ``$KERNELPACK_CACHE_EXPLAIN`` asks for) on stderr. Warnings are not: they reach the
    user as CacheWarnings already."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(lambda record: record.levelno < logging.WARNING)
    logger = logging.getLogger("kernelpack.cache")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def cmd_build(args: argparse.Namespace) -> int:
    """Import, compile every program (reporting each), save once at the end; then forget the
    modules the source brought in from its own directory (:func:`_forget_project_modules`)."""
    before = set(sys.modules)
    try:
        return _build(args)
    finally:
        _forget_project_modules(before, _home(args.source))


def _is_file(source: str) -> bool:
    """Whether ``source`` names a ``.py`` file rather than a module name."""
    return source.endswith(".py") or os.sep in source or Path(source).exists()


def _home_of(source: str, as_file: bool) -> str:
    """The directory ``source`` imports its own modules from (its directory, or the current
    one for a module name), as :func:`import_source` puts it first on ``sys.path``, with a
    trailing separator."""
    return os.path.join(os.path.abspath(Path(source).parent if as_file else os.getcwd()), "")


def _home(source: str) -> str:
    """:func:`_home_of`; "" when the working directory is gone (nothing of it was
    imported)."""
    try:
        return _home_of(source, _is_file(source))
    except OSError:
        return ""


def _forget_project_modules(before: set[str], home: str) -> None:
    """Remove from ``sys.modules`` what a build imported from the source's own directory
    (``home``): in one process, a second project's ``from helpers import OUT`` got the first
    project's ``helpers`` module, already in ``sys.modules``, and built the other project's
    code. Modules imported from elsewhere (libraries) stay."""
    if not home:
        return
    for name in [n for n in sys.modules if n not in before]:
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str) and os.path.abspath(path).startswith(home):
            sys.modules.pop(name, None)


def _build(args: argparse.Namespace) -> int:
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    from .targets import parse_target_list

    try:
        parse_target_list(targets)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--targets {args.targets!r}: {exc}") from None
    sign_key = None
    if args.sign_with is not None:  # a bad key fails now, before minutes of compiling
        from .signing import load_private_key

        sign_key = load_private_key(args.sign_with)
    _check_output(args.output, args.source)  # before minutes of compiling, not after them
    cache = _cache(args, sign_key)
    programs = collect_programs(import_source(args.source), list(args.names), args.source)

    from .compile_entry import compile as compile_fusion
    from .compiled import Compiled

    if (any(not isinstance(v, Compiled) for _, v in programs)
            and importlib.util.find_spec("llvmlite") is None):
        raise CLIError("compiling fusions needs the lowering (llvmlite, nvJitLink, libdevice): "
                       "pip install 'kernelpack[compile]'")

    built: list[Compiled] = []
    failed: list[str] = []
    for i, (attr, value) in enumerate(programs, 1):
        start = time.perf_counter()
        label = value.name if value.name == attr else f"{value.name} ({attr})"
        if isinstance(value, Compiled):
            how = "taken as it is (kp.Compiled)"
            built.append(value)
        else:
            try:
                compiled = compile_fusion(value, targets, cache=cache)
            except Exception as exc:  # noqa: BLE001 - reported; the other programs go on
                # always shown, --quiet or not: it is why the build fails
                print(printable(f"[{i}/{len(programs)}] {label}: FAILED: {_kind(exc)}: {exc}"),
                      file=sys.stderr, flush=True)
                failed.append(label)
                continue
            origin = {"compiled": "compiled", "disk": "from the disk cache",
                      "remote": "from the remote cache"}.get(compiled.origin, compiled.origin)
            how = f"{origin} in {time.perf_counter() - start:.2f} s"
            built.append(compiled)
        if not args.quiet:
            print(printable(f"[{i}/{len(programs)}] {label}: {how}"), file=sys.stderr,
                  flush=True)
    if failed:
        raise CLIError(f"{args.source}: {len(failed)} of {len(programs)} programs failed "
                       f"({', '.join(failed)}); {args.output} was not written")

    from .serializer import save

    data = save(built, args.output, sign_with=sign_key)
    print(printable(f"wrote {args.output}: {len(built)} program"
                    f"{'s' if len(built) != 1 else ''}, {len(data)} bytes"))
    return 0
