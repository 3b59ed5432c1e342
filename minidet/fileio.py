"""Atomic file output: readers never see a half-written file; a killed writer leaves only a temp file."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from typing import IO, Any

_TEMP_RE = re.compile(r"^\..+\.\d+\.[0-9a-f]{8}\.tmp$")


def _temp_name(name: str) -> str:
    return f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def remove_temp_files(folder: str) -> list[str]:
    """Remove the temporary files that killed writers left in ``folder``; returns their names.

    A process killed (SIGKILL, power loss) inside :func:`atomic_open` leaves its temporary file
    behind, never the target. Call this only while nothing writes into ``folder``.
    """
    if not os.path.isdir(folder):
        return []
    names = sorted(n for n in os.listdir(folder) if _TEMP_RE.match(n))
    for n in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, n))
    return names


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on a clean exit it is renamed to ``path``.

    ``mode`` is ``"w"`` (text, UTF-8) or ``"wb"``. If the block raises, the temporary file is
    removed and ``path`` keeps its previous content (or stays absent).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes only; mode must be 'w' or 'wb', got {mode!r}")
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, _temp_name(name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode honours the umask
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def write_json(path: str, obj: Any, indent: int | None = None) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (streamed, no full copy in memory)."""
    with atomic_open(path, "w") as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")
