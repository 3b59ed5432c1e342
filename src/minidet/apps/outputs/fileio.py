"""Output files and folders: atomic writes (readers never see a half-written file; a killed writer
leaves only a temp file), output folders checked before a run, and a lock against two runs at once."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
from collections.abc import Iterator
from typing import IO, Any

from minidet.errors import InputError

try:
    import fcntl
except ImportError:  # not on Linux/macOS: runs are not locked
    fcntl = None

# ".md-<pid>-<8 hex>.tmp": fixed length (a 250-byte target name still fits); earlier: ".<name>.<pid>.<8 hex>.tmp";
# videos (minidet.apps.outputs.video) keep their container's extension: ".md-<pid>-<8 hex or probe>.tmp.mp4"
_TEMP_RE = re.compile(r"^\.(md-\d+-([0-9a-f]{8}|probe)|.+\.\d+\.[0-9a-f]{8})\.tmp(\.mp4|\.avi)?$")
LOCK_NAME = ".minidet.lock"
_LOCK_FDS: set[int] = set()  # the lock files this process holds
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # the file system is full: every later write would fail too
_WRITE_ERRNOS = (*NO_SPACE, errno.EFBIG, errno.EIO, errno.EROFS)  # a write itself failed (not the caller's code)


def _forget_locks() -> None:  # in a forked child (a DataLoader worker): the lock stays with the parent alone
    for fd in _LOCK_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCK_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks)


class OutputError(InputError, OSError):
    """An output file or folder cannot be written; ``str(err)`` is one line naming it (never a temp file), ``path``
    the file when it is one."""

    def __init__(self, message: str, errno: int | None = None, path: str | None = None) -> None:
        super().__init__(" ".join(message.split()))
        self.errno = errno
        self.path = path


def _temp_name() -> str:
    """A temporary name for a file written into a folder (the target's name is no part of it)."""
    return f".md-{os.getpid()}-{secrets.token_hex(4)}.tmp"


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def remove_temp_files(folder: str) -> list[str]:
    """Remove the temporary files that writers killed inside :func:`atomic_open` left in ``folder``; returns their
    names. Call this only while nothing writes into ``folder``."""
    if not os.path.isdir(folder):
        return []
    names = sorted(n for n in os.listdir(folder) if _TEMP_RE.match(n))
    for n in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, n))
    return names


def no_space(e: BaseException) -> bool:
    """Whether ``e`` says the file system is full (or the user's quota is): a run stops, it cannot go on."""
    return isinstance(e, OSError) and e.errno in NO_SPACE


def _sync_folder(folder: str) -> None:
    """Make the names in ``folder`` (a rename into it) durable; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot sync a folder: the file itself is synced
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", durable: bool = False) -> Iterator[IO]:
    """Open a temporary file beside ``path`` (``mode`` ``"w"``: UTF-8 text, or ``"wb"``), renamed to ``path`` on a
    clean exit; if the block raises, it is removed and ``path`` stays as it was. With ``durable`` the file's data
    and then its name are on the disk (``fsync``) when the block ends: a power cut cannot undo it. A failure to
    create, write (disk full) or rename it raises :class:`OutputError` naming ``path``."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes only; mode must be 'w' or 'wb', got {mode!r}")
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, _temp_name())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode honours the umask
    except OSError as e:
        raise OutputError(f"{path}: cannot write ({_why(e)})", e.errno, path) from None
    try:
        try:
            with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
                yield f
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
        except OSError as e:  # the writes (or the caller's code: only the write errors are ours to name)
            if isinstance(e, OutputError) or e.errno not in _WRITE_ERRNOS:
                raise
            raise OutputError(f"{path}: cannot write ({_why(e)})", e.errno, path) from None
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise OutputError(f"{path}: cannot write ({_why(e)})", e.errno, path) from None
        if durable:
            _sync_folder(folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: str, data: bytes, durable: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename (see :func:`atomic_open`
    for ``durable``)."""
    with atomic_open(path, "wb", durable) as f:
        f.write(data)


def write_json(path: str, obj: Any, indent: int | None = None, durable: bool = False) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (streamed, no full copy in memory; see :func:`atomic_open` for
    ``durable``)."""
    with atomic_open(path, "w", durable) as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")


class OutputDir:
    """An output folder, checked before a run (created if needed; files can be created and renamed in it), else
    :class:`OutputError` naming ``flag``. With ``lock``, :data:`LOCK_NAME` in it is ``flock``-ed until :meth:`close`
    or the process ends, however: a second run is refused, a killed one blocks nothing, forked children hold none.
    :meth:`close` removes the folders created here again if the run left them empty (a failed set-up)."""

    def __init__(self, path: str, flag: str = "--output", lock: bool = True) -> None:
        self.path, self.flag = path, flag
        self._fd: int | None = None
        self._created: list[str] = []
        if os.path.lexists(path) and not os.path.isdir(path):
            raise OutputError(f"{flag} {path}: exists and is not a folder")
        missing, head = [], os.path.abspath(path)
        while not os.path.lexists(head):
            missing.append(head)
            head = os.path.dirname(head)
        try:
            os.makedirs(path, exist_ok=True)
            self._probe()
        except OSError as e:
            what = "cannot create the folder" if missing and not os.path.isdir(path) else "cannot write in the folder"
            raise OutputError(f"{flag} {path}: {what} ({_why(e)})", e.errno) from None
        self._created = missing
        if lock:
            self._lock()

    def _probe(self) -> None:
        a, b = (os.path.join(self.path, _temp_name()) for _ in range(2))
        os.close(os.open(a, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            os.replace(a, b)
        finally:
            for p in (a, b):
                with contextlib.suppress(OSError):
                    os.unlink(p)

    def _lock(self) -> None:
        if fcntl is None:
            return
        path = os.path.join(self.path, LOCK_NAME)
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise OutputError(f"{self.flag} {self.path}: cannot create {LOCK_NAME} ({_why(e)})", e.errno) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise OutputError(f"{self.flag} {self.path}: another minidet run (pid {pid}) is writing into this "
                                  "folder; wait for it to end or choose another folder") from None
            except OSError:  # a file system without flock: run unlocked
                os.close(fd)
                return
            # the lock file may have been removed by the holder we waited for: lock the current one
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        _LOCK_FDS.add(fd)

    def close(self) -> None:
        """Release the lock, remove the lock file and the folders created here if still empty."""
        if self._fd is not None and self._fd in _LOCK_FDS:  # not in a forked child
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.path, LOCK_NAME))  # while still locked: no run can be in between
            _LOCK_FDS.discard(self._fd)
            os.close(self._fd)
        self._fd = None
        for folder in self._created:  # innermost first
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        self._created = []

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
