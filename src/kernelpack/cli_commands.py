"""The subcommands of the ``kernelpack`` command, one function each, and what they share.

Each ``cmd_*`` takes the parsed arguments (:func:`kernelpack.cli.build_parser` wires them)
and returns the exit status; a failure the user must see is a :class:`CLIError` (or a
KernelPackError, OSError, ValueError), which :func:`kernelpack.cli.main` prints as one line
``error: <message>``. Artifacts are loaded, verified and decoded here; nothing touches a GPU.
Names and paths come from the artifact, which is untrusted: :func:`safe_filename` keeps what
``extract`` writes inside its directory.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from .cli_facts import printable
from .errors import KernelPackError

__all__ = ["CLIError", "UsageError", "not_a_file", "parse_assignment", "safe_filename",
           "cmd_inspect",
           "cmd_verify", "cmd_extract", "cmd_eval", "cmd_diff", "cmd_keygen", "cmd_sign",
           "DEFAULT_KEY_NAME"]

EXTENSIONS = {"cubin": "cubin", "ptx": "ptx", "host": "o"}
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")


class CLIError(Exception):
    """A failure the user must see as ``error: <message>`` with exit status 1."""


class UsageError(CLIError):
    """Options that do not go together: ``<prog>: error: <message>``, exit status 2 (as
    argparse's own usage errors)."""


# ---- helpers ------------------------------------------------------------------------------------
def _load(path: str, trusted_keys: Sequence[str] | None = None) -> Any:
    from .loader import load

    if path == "-" and not os.path.exists(path):  # `... | kernelpack inspect -`
        raise CLIError("-: reading an artifact from standard input is not supported; give "
                       "the path of a .kpack file")
    if not os.path.isfile(path):
        raise CLIError(not_a_file(path))
    if trusted_keys:
        from .signing import load_public_key

        # read every --trusted-key before the artifact: the loader reads them only for a
        # signed file, so a mistyped key path was reported as "artifact is unsigned"
        trusted_keys = [load_public_key(k) for k in trusted_keys]  # type: ignore[misc]
    return load(path, trusted_keys=list(trusted_keys) if trusted_keys else None)


def not_a_file(path: str) -> str:
    """Why ``path``, which is no regular file, cannot be read as one: "no such file", what
    ``stat`` says otherwise (a symbolic link loop, no permission: it exists, and "no such
    file" sent users looking for a typo), or "not a regular file" (a FIFO, a device)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return f"{path}: no such file"
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return f"{path}: not a regular file"


@contextlib.contextmanager
def _about(path: str) -> Iterator[None]:
    """A KernelPackError raised inside names ``path``: ``diff`` has two files, and a corrupt
    image found by ``verify`` must say which file holds it."""
    try:
        yield
    except KernelPackError as exc:
        from .loader import name_file

        name_file(exc, path)
        raise


def _stdout_console() -> Any:
    from .cli_render import console

    return console(sys.stdout)


def safe_filename(text: str) -> str:
    """A file name that cannot leave its directory: no separators, no leading dots, no ``..``
    (names come from the artifact, which is untrusted)."""
    name = _UNSAFE.sub("_", text).lstrip(".")
    name = name.replace("..", "_")
    return name or "_"


# The longest stem kept as it is: a file name is at most 255 bytes on Linux and macOS, and
# the stem gets ``.<target>.<ext>`` and, while written, write_atomic's temporary ``.<name>.
# XXXXXXXX.tmp`` around it. A module name may be 1024 bytes (FORMAT.md section 6).
_MAX_STEM = 160


def _module_stem(name: str) -> str:
    """A module's file name stem: the name itself when it is safe as it stands, else the safe
    form plus a hash of the name, so that module names differing only in characters that
    :func:`safe_filename` replaces (``mé`` and ``mè``) still get one file each; a stem longer
    than a file name may be is cut to :data:`_MAX_STEM` characters, the hash included."""
    safe = safe_filename(name)  # plain ASCII: its characters are its bytes
    if safe == name and len(safe) <= _MAX_STEM:
        return safe
    import hashlib

    digest = hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]
    return f"{safe[:_MAX_STEM - len(digest) - 1]}-{digest}"


def _integer(text: str) -> int:
    """``int(text)``, also past ``sys.get_int_max_str_digits()`` (read in chunks): a
    700-digit size is an integer outside int64, which the planner says, not "expected an
    integer" (review 34)."""
    digits = text.strip().replace("_", "")
    sign, body = (-1, digits[1:]) if digits[:1] == "-" else (1, digits.lstrip("+"))
    if len(body) <= 600 or not body.isdigit() or not body.isascii():  # 640: the lowest limit
        return int(text)
    value = 0
    for start in range(0, len(body), 600):
        chunk = body[start:start + 600]
        value = value * 10 ** len(chunk) + int(chunk)
    return sign * value


def parse_assignment(text: str, kinds: dict[str, str]) -> tuple[str, Any]:
    """``x=4096,1000`` -> ("x", (4096, 1000)); ``a=0.5`` -> ("a", 0.5); ``n=7`` -> ("n", 7).

    ``kinds`` maps parameter names to ``"tensor"``, ``"int"``, ``"bool"`` or ``"float"``: a
    tensor always gets a shape tuple (``x=4096`` is 1-D, ``x=`` and ``x=()`` are 0-D;
    parentheses or brackets around a shape are allowed), a scalar a single number (a bool
    also ``true``/``false``, as ``Program.plan`` takes True/False).
    """
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise CLIError(f"expected NAME=VALUE such as x=4096,1000 or s=3 (got {text!r})")
    stripped = value.strip()
    if len(stripped) >= 2 and (stripped[0], stripped[-1]) in (("(", ")"), ("[", "]")):
        value = stripped[1:-1]  # x=(4096,1000) or x=[4096,1000], as Python writes shapes
    parts = [p.strip() for p in value.split(",")] if value.strip() else []
    if parts and parts[-1] == "":
        parts.pop()  # "x=4096," is a 1-D shape too
    kind = kinds.get(name, "tensor" if "," in value else "int")
    try:
        if kind == "tensor":
            return name, tuple(_integer(p) for p in parts)
        if len(parts) != 1:
            raise ValueError
        if kind == "bool" and parts[0].lower() in ("true", "false"):
            return name, parts[0].lower() == "true"
        return name, (float(parts[0]) if kind == "float" else _integer(parts[0]))
    except ValueError:
        want = {"tensor": "a shape of integers", "int": "an integer", "float": "a number",
                "bool": "true, false, 0 or 1"}[kind]
        raise CLIError(f"{name}: expected {want} (got {value!r})") from None



# ---- subcommands -------------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    from .cli_facts import pack_facts

    if args.driver is not None and args.device is None:
        raise UsageError("--driver needs --device (the architecture to explain the choice for)")
    pack = _load(args.file)
    with _about(args.file):
        facts = pack_facts(pack, device=args.device, driver_version=args.driver)
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        from .cli_render import render_pack

        render_pack(_stdout_console(), facts)
    return 0


def _verified(path: str, trusted_keys: Sequence[str] | None = None) -> Any:
    """The pack at ``path`` after every check ``verify`` makes: structure, every summary and
    image, and a signature it carries, which must hold under the key it names even when no
    key is trusted (the loader checks it only against trusted keys): a file changed after
    signing fails here."""
    pack = _load(path, trusted_keys)
    with _about(path):
        pack.verify()
        # the digest load() verified, not a second load: no second pass over the file, and no
        # window in which a replaced file's signature is checked for this pack's contents
        pack.check_signature_intact()
    return pack


def cmd_verify(args: argparse.Namespace) -> int:
    pack = _verified(args.file, args.trusted_key)
    sig = getattr(pack, "signature", None)
    modules = list(pack.modules.values())
    images = [image for m in modules for image in m.images]
    raw = sum(int(getattr(i, "raw_size", 0)) for i in images)
    signed = ("unsigned" if sig is None else
              f"signed by {getattr(sig, 'key_id', '?')}" +
              (" (trusted)" if getattr(sig, "verified", False)
               else " (signature intact; key not checked: use --trusted-key)"))
    # names printed as errors print them: a name's newline or ESC must not forge a line
    print(printable(f"OK: {args.file}: {len(pack.programs)} program(s), {len(modules)} "
                    f"module(s), {len(images)} image(s), {raw} raw bytes; {signed}"))
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    pack = _load(args.file)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise CLIError(f"{out}: exists and is not a directory")
    plan: list[tuple[Path, Any]] = []
    seen: dict[Path, str] = {}
    renamed: dict[Path, str] = {}  # files whose name is not the module's: say whose they are
    for module in pack.modules.values():
        stem = _module_stem(module.name)
        for image in module.images:
            ext = EXTENSIONS.get(image.kind, "bin")
            name = f"{stem}.{safe_filename(image.target)}.{ext}"
            path = out / name
            label = f"{module.name}/{image.target}"
            if path in seen:
                raise CLIError(f"images {seen[path]} and {label} map to one file name {name}")
            seen[path] = label
            if stem != module.name:
                renamed[path] = module.name
            plan.append((path, image))
    total = sum(image.raw_size for _, image in plan)  # raw sizes are checked when read
    if total > args.max_bytes:
        raise CLIError(f"{args.file}: extracting would write {total} bytes in {len(plan)} "
                       f"file(s), over the limit of {args.max_bytes} (raise it with "
                       f"--max-bytes)")
    # lexists: a dangling symlink counts too (writing through it would create a file elsewhere)
    existing = [p for p, _ in plan if os.path.lexists(p)]
    if existing and not args.force:
        raise CLIError(f"refusing to overwrite {', '.join(map(str, existing))} (use --force)")
    for path in existing:  # --force replaces files only: fail before anything is written
        if path.is_symlink() or not path.is_file():
            raise CLIError(f"{path}: exists and is not a regular file; not overwriting it")
    checked: set[tuple] = set()
    with _about(args.file):  # every image checked before anything is created or written,
        for _, image in plan:  # one at a time: their raw sizes may add up beyond memory
            if image.check_key not in checked:  # images sharing a blob: checked once
                image.read(keep=False)  # decompressed and digest-checked
                checked.add(image.check_key)
    out.mkdir(parents=True, exist_ok=True)
    from .filewrite import write_atomic

    reader_gone = False
    for path, image in plan:
        with _about(args.file):
            raw = image.read(keep=False)
        # a temporary file renamed into place: a full disk or Ctrl-C half-way through an image
        # leaves no truncated cubin under its final name for cuobjdump to choke on
        write_atomic(path, raw)
        if not reader_gone:
            try:
                whose = f", module {printable(renamed[path])}" if path in renamed else ""
                print(printable(f"{path}  ({len(raw)} bytes)") + whose)
            except BrokenPipeError:  # `extract ... | head -1`: the files are what was asked
                reader_gone = True   # for, so all of them are written (and the status is 0)
    if not plan:
        print(printable(f"{args.file} holds no images; nothing written"))
    return 0


def _param_kinds(summary: Any) -> dict[str, str]:
    from .summary import Tensor

    kinds: dict[str, str] = {}
    for p in summary.params:
        if isinstance(p, Tensor):
            kinds[p.name] = "tensor"
        else:
            kinds[p.name] = ("bool" if p.dtype.kind == "b" else
                             "int" if p.dtype.is_integer else "float")
    return kinds


def cmd_eval(args: argparse.Namespace) -> int:
    from .cli_facts import plan_facts

    pack = _load(args.file)
    if args.program not in pack.programs:
        names = pack.programs
        shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        raise CLIError(f"no program {args.program!r} in {args.file} (programs: {shown or 'none'}"
                       f"; `kernelpack inspect` lists them)")
    program = pack[args.program]
    with _about(args.file):
        kinds = _param_kinds(program.summary)
    values: dict[str, Any] = {}
    for text in args.values:
        given = text.partition("=")[0].strip()
        if given.isidentifier() and given not in kinds:  # before its value is judged by a guess
            inputs = [p.name for p in program.summary.params
                      if getattr(p, "role", "in") != "out" and getattr(p, "value", None) is None]
            raise CLIError(f"{args.program} has no input {given!r} "
                           f"(inputs: {', '.join(inputs) or 'none'})")
        name, value = parse_assignment(text, kinds)
        if name in values:
            raise CLIError(f"{name} is given twice ({name}={values[name]!r} and {text!r})")
        values[name] = value
    try:
        plan = program.plan(**values)
    except TypeError as exc:  # missing or unknown inputs: the user's command line is wrong
        raise CLIError(str(exc)) from None
    facts = plan_facts(plan)
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        from .cli_render import render_plan

        render_plan(_stdout_console(), facts)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from .cli_facts import diff_facts, pack_facts, unprinted_changes

    a, b = _load(args.a), _load(args.b)
    # Images are compared by their recorded digests, so first prove that the bytes match
    # them: a corrupt file is an error, never "identical".
    with _about(args.a):
        a.verify()
        fa = pack_facts(a)
    with _about(args.b):
        b.verify()
        fb = pack_facts(b)
    lines = diff_facts(fa, fb)
    lines += unprinted_changes(a, b, lines)
    args.answer = 1 if lines else 0  # main's exit status if the reader leaves (`| head -1`)
    from .cli_render import signature_text

    for key, show in (("format_version", str), ("generator", str),
                      ("signature", signature_text)):
        if fa[key] != fb[key]:  # metadata: reported, but the kernels are what diff compares
            print(printable(f"note: {key}: {show(fa[key])} -> {show(fb[key])}"))
    for line in lines:
        print(printable(line))
    return 1 if lines else 0


# `kernelpack keygen` with no -o: a name in the working directory (as ssh-keygen's default),
# never written over an existing key (signing.write_keypair refuses)
DEFAULT_KEY_NAME = "kernelpack-signing.key"


def cmd_keygen(args: argparse.Namespace) -> int:
    from .signing import key_id, load_public_key, write_keypair

    try:
        private, public = write_keypair(args.output)
    except FileExistsError as exc:
        raise CLIError(f"{exc.filename}: already exists, and a key is never overwritten: "
                       f"remove it, or give another name with -o NAME") from None
    print(printable(f"private key: {private} (keep it secret)"))
    print(printable(f"public key:  {public} (key id {key_id(load_public_key(public))})"))
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    from .filewrite import write_atomic
    from .serializer import resign
    from .signing import key_id, load_private_key, public_key_bytes

    key = load_private_key(args.key)
    # never put a signature on bytes that do not verify, nor over a broken signature: that
    # file was changed after it was signed, and `verify` refuses it
    pack = _verified(args.file)
    target = args.file if args.output is None else args.output
    try:  # `-o /dev/stdout`: the artifact goes to stdout, so the report goes to stderr
        to_stdout = os.path.samestat(os.stat(target), os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        to_stdout = False
    write_atomic(target, resign(pack, key))  # the verified body and blobs, not re-encoded
    print(printable(f"signed {args.file} -> {target} (key id {key_id(public_key_bytes(key))})"),
          file=sys.stderr if to_stdout else sys.stdout)
    return 0

