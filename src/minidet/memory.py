"""Keep freed memory in the process: glibc's ``mallopt``, for the command-line applications.

By default glibc gives large freed blocks back to the system (blocks over its mmap threshold are unmapped on
``free``, a large free top of the heap is trimmed), so every forward of the network faults its activations in
afresh: about 800 MiB, 200k page faults and 0.2 s per 800-pixel image on CPU, each fault also zeroing a page.
``keep_freed_memory`` turns both off (``M_MMAP_MAX`` 0, ``M_TRIM_THRESHOLD`` -1): the next forward reuses the
same pages. The arithmetic is untouched. The cost: the process keeps its high-water mark (the largest forward's
working set, plus what allocating everything from the heap fragments: about +225 MiB peak for the R-50 FPN at
short side 800) until it exits, and processes forked after the call (DataLoader workers) inherit the setting.

It is process-wide, so importing minidet never calls it: the applications (``infer``, ``eval_coco``; their
``--no-keep-memory`` leaves the allocator alone) and the benchmark call it at start; a host application may call
it itself, before its first forward. ``release_freed_memory`` gives the kept memory back (``malloc_trim``);
``memory_settings`` reports what is in force. Without glibc (macOS, Windows, musl) all three change nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h> parameter numbers
_ENV = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
_kept = False  # set by keep_freed_memory in this process


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _glibc() -> ctypes.CDLL | None:
    """The C library of this process if it is glibc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt  # noqa: B018 - present in every glibc; checked anyway
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the system: no mmap for large blocks
    (``M_MMAP_MAX`` 0: they come from the heap) and no trimming of the heap (``M_TRIM_THRESHOLD`` -1). Returns
    True when both are set, False (nothing changed) without glibc. Process-wide and for the rest of the process's
    life (``release_freed_memory`` returns what is free now); call it before the first forward."""
    global _kept
    libc = _glibc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, -1) == 1
    _kept = _kept or ok
    return ok


def release_freed_memory() -> bool:
    """Give the heap's free memory back to the system now (glibc's ``malloc_trim(0)``); False without glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def memory_settings() -> dict:
    """What is in force: ``allocator`` ("glibc 2.39", or None for another C library); ``keep_freed_memory``
    (whether ``keep_freed_memory`` succeeded in this process); ``env``: the ``MALLOC_*_`` / ``GLIBC_TUNABLES``
    variables the process started with (they set the same parameters); and, from glibc's ``mallinfo2``,
    ``heap_mib`` (the heap's size), ``heap_free_mib`` (freed memory kept in it) and ``mmap_mib`` (blocks mapped
    one by one, returned on free)."""
    env = {k: os.environ[k] for k in _ENV if k in os.environ}
    libc = _glibc()
    out: dict = {"allocator": None, "keep_freed_memory": _kept, "env": env}
    if libc is None:
        return out
    out["allocator"] = "glibc " + libc.gnu_get_libc_version().decode()
    mallinfo2 = getattr(libc, "mallinfo2", None)  # glibc >= 2.33
    if mallinfo2 is not None:
        mallinfo2.restype = _MallInfo2
        info = mallinfo2()
        mib = 1 / 2**20
        out.update(heap_mib=info.arena * mib, heap_free_mib=info.fordblks * mib, mmap_mib=info.hblkhd * mib)
    return out
