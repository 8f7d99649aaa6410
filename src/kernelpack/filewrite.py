"""Writing an artifact: to a path crash-safely (temp file, fsync, rename), or to a file object.

``kp.save(..., path)`` and the CLI's writers (``extract``, ``sign``) go through
:func:`write_atomic`: all or nothing under the final name, the directory fsynced after the
rename, an existing file's permissions kept (a new one gets what ``open()`` would give it), a
symbolic link followed, a FIFO or device written directly. Errors name the path asked for,
not a temporary name. A writer killed mid-write leaves its temporary (``.NAME.XXXXXXXX.tmp``;
for a name too long for that, its first bytes and ``~`` and a digest of the whole name stand
for NAME) beside the file; the next successful write of that name removes it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import stat
import tempfile

from ._interrupts import deferred_interrupts

__all__ = ["absolute", "write_atomic", "write_file_object"]


def _renamed(exc: OSError, path: str) -> OSError:
    """``exc`` (same type, errno and reason) naming ``path`` instead of a temporary file."""
    if exc.errno is None:
        return exc
    return type(exc)(exc.errno, exc.strerror, path)


def absolute(path: str) -> str:
    """``path`` joined to the working directory when relative (not normalized: ``..`` after a
    symbolic link is the link's parent's); for a working directory that was removed (a cron
    job's, under it), a FileNotFoundError naming ``path`` and saying so, instead of
    ``os.getcwd``'s bare "[Errno 2] No such file or directory"."""
    if os.path.isabs(path):
        return path
    try:
        return os.path.join(os.getcwd(), path)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "the working directory no longer exists, and the "
                                "path is relative to it", path) from None


def _new_file_mode() -> int:
    """0o666 less the process umask: the mode ``open(path, "wb")`` gives a new file. (A fixed
    0o644 made files world-readable under umask 077.) Read from /proc where it can be, since
    ``os.umask`` can only be read by setting it, which races with other threads."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_file_object(file: object, data: bytes) -> None:
    """Write all of ``data`` to a binary file object. A text file is a TypeError naming the
    parameter (not io's "string argument expected"); a raw, unbuffered file may write only
    part of the bytes per call, so it is written until done. A raw file's ``write`` answering
    None wrote nothing (a non-blocking stream that cannot take more now): BlockingIOError
    with the count written, never a truncated artifact reported as saved. Any other object's
    None is taken as "all written", as a duck-typed ``write(self, b)`` that returns nothing
    means it."""
    if isinstance(file, io.TextIOBase):
        raise TypeError("kp.save: path_or_file is a text file; open it in binary mode "
                        "('wb') to write an artifact")
    if getattr(file, "closed", False) is True:
        raise ValueError("kp.save: path_or_file is a closed file")
    try:
        written = file.write(data)  # type: ignore[attr-defined]
    except io.UnsupportedOperation as exc:  # opened for reading ('rb')
        raise io.UnsupportedOperation(f"kp.save: path_or_file is not open for writing "
                                      f"({exc}); open it with 'wb'") from None
    view = memoryview(data)
    done = 0
    while True:
        if written is None and isinstance(file, io.RawIOBase):
            raise BlockingIOError(errno.EAGAIN, f"kp.save: the file object would block "
                                                f"(non-blocking?) after {done} of {len(data)} "
                                                f"bytes; the artifact is incomplete")
        if not isinstance(written, int) or isinstance(written, bool) or written >= len(view):
            return
        if written <= 0:
            raise OSError(errno.EIO, f"kp.save: the file object wrote {written} of "
                                     f"{len(view)} bytes")
        done += written
        view = view[written:]
        written = file.write(view)  # type: ignore[attr-defined]


def _write_target(path: str) -> tuple[str, bool]:
    """(the path to write, whether to write it directly): ``path`` means the file it names,
    as for ``open(path, "wb")``. A symbolic link is followed, so that the file it names is
    replaced and the link stays. A FIFO or device (``/dev/stdout``, ``/dev/null``) is written
    directly: renaming over it replaced the device itself (as root, for everyone)."""
    try:
        st: os.stat_result | None = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link that cannot be followed: open() fails, and so
            raise _renamed(exc, path) from None  # must this (not replace the link)
        st = None  # nothing there yet, or a dangling link: created below
    if st is not None and not stat.S_ISREG(st.st_mode):
        return path, True
    if not os.path.islink(path):
        return path, False
    real = os.path.realpath(path)
    if st is None:
        return real, False  # a dangling link: create the file it names
    try:
        if os.path.samestat(st, os.stat(real)):
            return real, False
    except OSError:
        pass
    return path, True  # a link no path resolves to (/proc/self/fd/N of a deleted file)


def _try_lock(fd: int) -> bool | None:
    """``flock`` ``fd`` without waiting: True, False when someone else holds it, None where
    the platform or filesystem has no flock."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        return False if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None


def _names_it(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except OSError:
        return False


_NAME_MAX = 255  # bytes in one path component, on every filesystem Linux writes to
_TEMP_EXTRA = len("..XXXXXXXX.tmp")


def _temp_stem(base: str) -> str:
    """What a temporary of ``base`` is named after: ``base`` itself, or, when a temporary
    named after it would pass ``NAME_MAX`` (a legal name of 242-255 bytes failed to save with
    "File name too long"), its first bytes and a digest of the whole name."""
    raw = os.fsencode(base)
    if len(raw) + _TEMP_EXTRA <= _NAME_MAX:
        return base
    import hashlib

    tag = hashlib.sha256(raw).hexdigest()[:8]
    cut = _NAME_MAX - _TEMP_EXTRA - len(tag) - 1
    while cut > 0 and raw[cut] & 0xC0 == 0x80:  # not inside a UTF-8 character
        cut -= 1
    return os.fsdecode(raw[:cut]) + "~" + tag


def _locked_temporary(directory: str, base: str) -> tuple[int, str]:
    """A new temporary for ``base``, locked (``flock``) until the writer is done with it: a
    writer killed meanwhile (SIGKILL, the OOM killer) leaves it unlocked, which is how a
    later write of ``base`` knows it may remove it (:func:`_remove_orphans`). Between the
    file's creation and the lock, a sweep may take the lock first and remove it: the writer
    then sees the lock held, or the name gone, and makes another."""
    base = _temp_stem(base)
    for _ in range(16):
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{base}.", suffix=".tmp")
        try:
            locked = _try_lock(fd)
            if locked is None or locked and _names_it(fd, tmp):
                return fd, tmp
        except BaseException:  # Ctrl-C: neither the descriptor nor the file may stay
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)  # a sweep holds it (and removes it), or removed it already
    return tempfile.mkstemp(dir=directory, prefix=f".{base}.", suffix=".tmp")  # unlocked


def _remove_orphans(directory: str, base: str) -> int:
    """Remove the temporaries of earlier writes of ``base`` whose writers are gone: named as
    :func:`write_atomic` names them and not locked (a live writer holds its lock until the
    rename). Each killed ``kp.save`` left one beside the artifact, for ever. Returns how many
    were removed; never raises (a cleanup, not part of the write)."""
    pattern = re.compile(re.escape(f".{_temp_stem(base)}.") + r"[A-Za-z0-9_]{8}\.tmp")
    removed = 0
    try:
        names = [e.name for e in os.scandir(directory) if pattern.fullmatch(e.name)]
    except OSError:
        return 0
    for name in names:
        with deferred_interrupts():  # a few calls; no Ctrl-C may lose the descriptor opened
            removed += _remove_orphan(os.path.join(directory, name))
    return removed


def _remove_orphan(candidate: str) -> int:
    try:
        fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return 0
    try:  # locked by us, so no writer holds it; and still the file of that name
        if stat.S_ISREG(os.fstat(fd).st_mode) and _try_lock(fd) and _names_it(fd, candidate):
            os.unlink(candidate)
            return 1
    except OSError:
        pass
    finally:
        os.close(fd)  # (releases the lock after the unlink: see _locked_temporary)
    return 0


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Temp file in the same directory, fsync, os.replace: all or nothing under ``path``
    (see :func:`_write_target` for links, devices and FIFOs, which are written directly)."""
    # errors name it, not the link's target or a temporary name; a bytes path as str, so that
    # the temporary's name can be made from it
    asked = os.fsdecode(os.fspath(path))
    if os.path.isdir(asked):
        raise IsADirectoryError(errno.EISDIR, "is a directory, expected a file path", asked)
    path, direct = _write_target(asked)
    f: io.BufferedWriter | None  # the file being written; None once closed
    if direct:
        with open(path, "wb") as f:
            write_file_object(f, data)
        return
    directory = os.path.dirname(absolute(path))
    base = os.path.basename(path)
    fd, tmp, f = -1, "", None
    try:  # from here on, whatever is raised (Ctrl-C included) leaves no descriptor or temp
        try:
            with deferred_interrupts():  # a Ctrl-C as mkstemp returns lost its descriptor
                fd, tmp = _locked_temporary(directory, base)
        except OSError as exc:
            if exc.errno is None:
                raise
            # "No such file or directory: '/proc/version'" of a file that is there: say that
            # the temporary beside it could not be made
            raise type(exc)(exc.errno, f"{exc.strerror} (creating a temporary file in "
                                       f"{directory} to write it)", asked) from None
        f, fd = os.fdopen(fd, "wb"), -1  # the file object owns the descriptor now
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        try:  # replacing a file keeps its permissions (a 0600 artifact stays private)
            mode = os.stat(path).st_mode & 0o7777
        except OSError:  # a new file: what open() would give it (mkstemp's is 0600)
            mode = _new_file_mode()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        closing, f = f, None
        closing.close()
    except BaseException as exc:
        with contextlib.suppress(OSError):  # f or fd owns the descriptor, never both
            if f is not None:
                f.close()
            elif fd >= 0:
                os.close(fd)
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _renamed(exc, asked) from None
        raise
    _remove_orphans(directory, base)
    with deferred_interrupts():  # no Ctrl-C may lose the directory's descriptor
        _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable; not every platform can open a directory."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
