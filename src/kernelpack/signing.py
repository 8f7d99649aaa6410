"""Ed25519 signing of artifacts.

The signature covers ``"kernelpack-signature-v1\\0" + body_digest``: the body holds every
piece of metadata including each image's digest, so one 32-byte digest commits to the whole
file, and the domain prefix keeps a kernelpack signature from meaning anything elsewhere.
Ed25519 is deterministic, so re-signing the same artifact gives the same bytes.

``cryptography`` is imported only here, and only when a key is used: importing kernelpack or
loading unsigned artifacts never pays for it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
from typing import Any, Callable, Iterable

from ._interrupts import deferred_interrupts
from ._smallfile import read_regular
from .errors import SignatureError

__all__ = ["generate_private_key", "public_key_bytes", "load_private_key", "load_public_key",
           "small_order",
           "write_keypair", "sign_digest", "verify_digest", "key_id", "signed_message",
           "load_for", "SIGNATURE_DOMAIN"]

SIGNATURE_DOMAIN = b"kernelpack-signature-v1\0"


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:  # pragma: no cover - cryptography is a core dependency
        raise SignatureError("signing needs the 'cryptography' package") from exc
    return ed25519


def signed_message(body_digest: bytes) -> bytes:
    """The exact bytes an artifact signature signs."""
    return SIGNATURE_DOMAIN + bytes(body_digest)


def key_id(public_key: bytes) -> str:
    """A short fingerprint of a public key: the first 8 bytes of its SHA-256, in hex."""
    return hashlib.sha256(bytes(public_key)).hexdigest()[:16]


def generate_private_key() -> bytes:
    """A fresh ed25519 private key as its 32-byte seed."""
    return os.urandom(32)


def _read_key_file(path: str) -> bytes:
    """At most 64 KiB of a regular file (a FIFO named as a key must not wait forever for a
    writer)."""
    data = read_regular(path, 1 << 16)
    if data is None:
        raise ValueError(f"{path}: not a regular file (a key file is expected)")
    return data


_BYTES_LIKE = (bytes, bytearray, memoryview)


def _hex32(text: str | bytes) -> bytes | None:
    """The 32 bytes that ``text`` spells as 64 hex digits (surrounding whitespace allowed,
    as in a key file read with ``open(...).read()``), else None."""
    try:
        raw = bytes.fromhex(text if isinstance(text, str) else text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return raw if len(raw) == 32 else None


def _private_from_text(data: bytes, where: str) -> Any:
    """An ed25519 private key from a key file's contents: PEM (PKCS#8 or raw), the OpenSSH
    format of ``ssh-keygen -t ed25519``, or 64 hex digits (keygen's format)."""
    ed = _ed25519()
    if b"-----BEGIN" in data:
        from cryptography.exceptions import UnsupportedAlgorithm
        from cryptography.hazmat.primitives import serialization

        openssh = b"-----BEGIN OPENSSH PRIVATE KEY-----" in data
        kind = "OpenSSH" if openssh else "PEM"
        try:  # an encrypted key raises TypeError: name the file, never a traceback
            loaded = (serialization.load_ssh_private_key(data, password=None) if openssh
                      else serialization.load_pem_private_key(data, password=None))
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise ValueError(f"{where}: not a usable {kind} private key (an unencrypted "
                             f"ed25519 key is needed): {exc}") from None
        if not isinstance(loaded, ed.Ed25519PrivateKey):
            raise ValueError(f"{where}: not an ed25519 private key "
                             f"({type(loaded).__name__.lstrip('_')})")
        return loaded
    seed = _hex32(data)
    if seed is None:
        raise ValueError(f"{where}: expected a PEM or OpenSSH key or 64 hex digits (a 32-byte "
                         f"seed)")
    return ed.Ed25519PrivateKey.from_private_bytes(seed)


def _str_path(key: object) -> object:
    """An ``os.PathLike`` whose ``__fspath__`` gives bytes, as a path of str (still not a str:
    a str is also read as a hex key); anything else as it is."""
    if isinstance(key, os.PathLike) and isinstance(os.fspath(key), bytes):
        import pathlib

        return pathlib.PurePath(os.fsdecode(os.fspath(key)))
    return key


def load_private_key(key: object) -> Any:
    """An ``Ed25519PrivateKey`` from a key object, a 32-byte seed, a key file's contents as
    bytes (PEM or OpenSSH), 64 hex digits, or a path to a PEM, OpenSSH or hex key file.
    Raises ValueError for a value of the right type that is no usable key, TypeError for
    anything else."""
    ed = _ed25519()
    key = _str_path(key)
    if isinstance(key, ed.Ed25519PrivateKey):
        return key
    if isinstance(key, _BYTES_LIKE):
        data = bytes(key)
        if len(data) == 32:
            return ed.Ed25519PrivateKey.from_private_bytes(data)
        # a key file's contents; anything else is named by its length, never echoed
        return _private_from_text(data, f"private key bytes ({len(data)} bytes, not the "
                                        f"32-byte seed)")
    if isinstance(key, (str, os.PathLike)):
        path = os.fspath(key)
        if path.endswith(".pub"):  # same hex format as a private seed: refuse, don't misread
            raise ValueError(f"{path}: a public key file (.pub) cannot sign; pass the private "
                             f"key (keygen's NAME, without .pub)")
        if isinstance(key, str) and not os.path.exists(path):
            seed = _hex32(key)  # the seed itself, as keygen writes it (no file of that name)
            if seed is not None:
                return ed.Ed25519PrivateKey.from_private_bytes(seed)
        return _private_from_text(_read_key_file(path), path)
    if isinstance(key, ed.Ed25519PublicKey):
        raise TypeError("a public key cannot sign: pass the ed25519 private key")
    raise TypeError(f"a private key must be an Ed25519PrivateKey, 32 bytes or a path "
                    f"(got {type(key).__name__})")


def public_key_bytes(private: object) -> bytes:
    """The 32-byte public key of a private key (any form :func:`load_private_key` takes)."""
    from cryptography.hazmat.primitives import serialization

    return load_private_key(private).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _public_from_text(data: bytes, where: str) -> bytes | None:
    """Raw public key bytes from a key file's contents (PEM, an OpenSSH ``ssh-ed25519 ...``
    line, or 64 hex digits); None when it is none of these."""
    text = data.strip()
    openssh = text.startswith(b"ssh-")
    if b"-----BEGIN" in text or openssh:
        from cryptography.exceptions import UnsupportedAlgorithm
        from cryptography.hazmat.primitives import serialization

        kind = "OpenSSH" if openssh else "PEM"
        # the parsers read the first key and ignore the rest: a file of several keys (an
        # authorized_keys-like list) would trust only its first one, silently
        count = (sum(1 for line in text.splitlines() if line.strip().startswith(b"ssh-"))
                 if openssh else text.count(b"-----BEGIN"))
        if count > 1:
            raise ValueError(f"{where}: holds {count} {kind} keys; a key file must hold one "
                             f"(give each key its own file or value)")
        try:
            loaded = (serialization.load_ssh_public_key(text) if openssh
                      else serialization.load_pem_public_key(text))
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise ValueError(f"{where}: not a usable {kind} public key: {exc}") from None
        if not isinstance(loaded, _ed25519().Ed25519PublicKey):  # name the file, not a repr
            raise ValueError(f"{where}: not an ed25519 public key "
                             f"({type(loaded).__name__.lstrip('_')})")
        return load_public_key(loaded)
    return _hex32(text)


def load_public_key(key: object) -> bytes:
    """Raw 32 public-key bytes from an ``Ed25519PublicKey``, 32 bytes, 64 hex characters, a
    key file's contents as bytes (PEM or an OpenSSH ``ssh-ed25519`` line), or a path to a
    ``.pub`` file (hex, PEM or OpenSSH). ValueError for a key of small order: no one holds
    its private key, and signatures under it can be made for any message (with the
    identity point as the key, R = identity and S = 0 verify everything), so trusting one,
    by mistake or by a planted key file, would trust every file."""
    raw = _public_key_bytes_of(key)
    if small_order(raw):
        raise ValueError(f"public key {raw.hex()} is a point of small order: signatures "
                         f"under it prove nothing (anyone can make them); not trusted")
    return raw


# Ed25519's curve: -x^2 + y^2 = 1 + d x^2 y^2 over GF(2^255 - 19)
_P = 2 ** 255 - 19
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


@functools.lru_cache(maxsize=256)  # kp.load(trusted_keys=...) asks per load
def small_order(raw: bytes) -> bool:
    """Whether the 32-byte encoding is a point whose order divides 8 (8P is the identity),
    or not a canonical encoding of any point of the curve at all (y >= p). Encodings that
    are no point (no x for that y) answer False: the signature library refuses those."""
    y = int.from_bytes(raw, "little") & ((1 << 255) - 1)
    if y >= _P:
        return True
    yy = y * y % _P
    u, v = (yy - 1) % _P, (_D * yy + 1) % _P  # x^2 = u / v, one exponentiation (RFC 8032)
    v3 = v * v * v % _P
    x = u * v3 * pow(u * v3 * v3 * v % _P, (_P - 5) // 8, _P) % _P
    if (v * x * x - u) % _P:
        x = x * _SQRT_M1 % _P
    if (v * x * x - u) % _P:
        return False
    if x & 1 != raw[31] >> 7:
        x = (_P - x) % _P
    # three doublings in projective coordinates (X:Y:Z), no inversion (a = -1)
    big_x, big_y, big_z = x, y, 1
    for _ in range(3):
        b = (big_x + big_y) ** 2 % _P
        c, d, h = big_x * big_x % _P, big_y * big_y % _P, big_z * big_z % _P
        e = -c % _P
        f = (e + d) % _P
        j = (f - 2 * h) % _P
        big_x, big_y, big_z = (b - c - d) * j % _P, f * (e - d) % _P, f * j % _P
    return big_x == 0 and big_y == big_z


def _public_key_bytes_of(key: object) -> bytes:
    """:func:`load_public_key` before its check of the point."""
    key = _str_path(key)
    if isinstance(key, _BYTES_LIKE):
        data = bytes(key)
        if len(data) == 32:
            return data
        raw = _public_from_text(data, "public key bytes") if len(data) > 32 else None
        if raw is not None:
            return raw
    if isinstance(key, str):
        raw = _hex32(key)
        if raw is not None:
            return raw
    if isinstance(key, (str, os.PathLike)) and os.path.exists(os.fspath(key)):
        path = os.fspath(key)
        if not path.endswith(".pub") and os.path.exists(path + ".pub"):
            # keygen's private key: its hex would read as some other, meaningless public key
            raise ValueError(f"{path} is a private key; trust its public key {path}.pub")
        data = _read_key_file(path)
        raw = _public_from_text(data, path)
        if raw is None:
            lines = [line for line in data.split() if line]
            if len(lines) > 1 and all(_hex32(line) is not None for line in lines):
                raise ValueError(f"{path}: holds {len(lines)} hex keys; a key file must hold "
                                 f"one (give each key its own file or value)")
            raise ValueError(f"{key}: expected a PEM or OpenSSH public key or 64 hex digits")
        return raw
    if not isinstance(key, (str, os.PathLike) + _BYTES_LIKE):
        ed = _ed25519()
        if isinstance(key, ed.Ed25519PrivateKey):
            raise ValueError("a private key was given where a public key is trusted: pass "
                             "key.public_key() (or keygen's NAME.pub)")
        if isinstance(key, ed.Ed25519PublicKey):
            from cryptography.hazmat.primitives import serialization

            return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if isinstance(key, (str, os.PathLike)) and (
            os.fspath(key).endswith(".pub") or os.sep in os.fspath(key)):
        raise ValueError(f"{os.fspath(key)}: no such public key file")
    shown = f"{len(key)} bytes" if isinstance(key, _BYTES_LIKE) else f"{key!r:.80}"
    raise ValueError(f"not an ed25519 public key: expected 32 bytes, 64 hex characters, a "
                     f"key object or an existing .pub file (got {shown})")


def write_keypair(path: str | os.PathLike[str]) -> tuple[str, str]:
    """Write a new key pair: the private seed as hex at ``path`` (mode 0600) and the public
    key as hex at ``path + ".pub"``. Refuses to overwrite an existing private key."""
    path = os.fspath(path)
    if not path:
        raise ValueError("write_keypair: the private key's path is empty")
    if path.endswith(".pub"):  # load_private_key refuses a .pub file: the pair would not sign
        raise ValueError(f"write_keypair: {path!r} ends in .pub, which names a public key; "
                         f"give the private key's path (the public key goes to PATH.pub)")
    public_path = path + ".pub"
    if os.path.lexists(public_path):  # a stale .pub would silently stop matching the new key
        raise FileExistsError(errno.EEXIST, "File exists", public_path)
    seed = generate_private_key()
    created: list[str] = []
    try:  # whatever is raised (Ctrl-C included) leaves no half pair and no open descriptor
        _write_new(path, seed.hex() + "\n", 0o600, created)
        _write_new(public_path, public_key_bytes(seed).hex() + "\n", 0o644, created)
    except BaseException:
        for leftover in created:  # no half-written pair
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        raise
    return path, public_path


def _write_new(path: str, text: str, mode: int, created: list[str]) -> None:
    """Create ``path`` (never over an existing file) holding ``text``; ``created`` gets the
    path as soon as the file exists, for the caller's cleanup."""
    fd = -1
    try:  # the open inside: a Ctrl-C held back past it (deferred_interrupts) lands in here
        with deferred_interrupts():  # the file is recorded for clean-up as soon as it exists
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            created.append(path)
        data = memoryview(text.encode())
        while data:
            try:
                data = data[os.write(fd, data):]
            except OSError as exc:  # EFBIG, ENOSPC: a write's error names no file
                raise type(exc)(exc.errno, exc.strerror, path) from None
    finally:
        if fd >= 0:
            os.close(fd)


def load_for(param: str, load: Callable[[Any], Any], value: object) -> Any:
    """``load(value)`` (:func:`load_private_key`, :func:`load_public_key`, ...) with its errors
    naming the caller's parameter, which this module cannot know: a TypeError/ValueError
    prefixed with ``param``, and a key file that cannot be read (missing, unreadable) a
    ValueError naming it instead of a bare FileNotFoundError."""
    try:
        return load(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{param}: {exc}") from None
    except OSError as exc:
        raise ValueError(f"{param}: cannot read key file {exc.filename or value!r} "
                         f"({exc.strerror or exc})") from None


def sign_digest(private: object, body_digest: bytes) -> tuple[bytes, bytes]:
    """(public key, signature) for an artifact whose body hashes to ``body_digest``."""
    key = load_private_key(private)
    return public_key_bytes(key), key.sign(signed_message(body_digest))


def verify_digest(public_key: bytes, signature: bytes, body_digest: bytes,
                  trusted_keys: Iterable[object]) -> None:
    """Raise SignatureError unless ``public_key`` is trusted and ``signature`` verifies.
    ``trusted_keys`` is a list of keys or one key given bare (as ``kp.load`` takes it: a
    bare path or hex string must not be read as a list of one-character keys)."""
    if (isinstance(trusted_keys, (str, os.PathLike) + _BYTES_LIKE)
            or not isinstance(trusted_keys, Iterable)):
        trusted_keys = [trusted_keys]
    trusted = [load_public_key(k) for k in trusted_keys]
    if bytes(public_key) not in trusted:
        ids = ", ".join(key_id(k) for k in trusted) or "none"
        raise SignatureError(f"artifact is signed by key {key_id(public_key)}, which is not "
                             f"trusted (trusted: {ids})")
    ed = _ed25519()
    from cryptography.exceptions import InvalidSignature

    try:
        ed.Ed25519PublicKey.from_public_bytes(bytes(public_key)).verify(
            bytes(signature), signed_message(body_digest))
    except InvalidSignature:
        raise SignatureError(f"signature by key {key_id(public_key)} does not verify: the "
                             f"artifact was modified after signing") from None
    except ValueError as exc:
        raise SignatureError(f"signature by key {key_id(public_key)} is malformed: {exc}") from None
