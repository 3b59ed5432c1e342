"""Test support: the processes below a process, which are still running, and resident memory (from /proc)."""

from __future__ import annotations

import os
import time


def _proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) of a process, None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after "(name)", which may hold spaces
    except OSError:
        return None
    return int(fields[1]), fields[0].decode(), fields[19].decode()


def descendants(pid: int) -> dict[int, str]:
    """The processes below ``pid`` (children, theirs, ...) now: pid -> start time (which tells a
    process apart from a later one given the same pid)."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _proc_stat(int(p)))}
    found: dict[int, str] = {}
    parents = {pid}
    while parents:
        new = {p: s[2] for p, s in stats.items() if s[0] in parents and p not in found}
        found.update(new)
        parents = set(new)
    return found


def survivors(procs: dict[int, str], wait_s: float = 10.0) -> list[int]:
    """Those of ``procs`` still running after up to ``wait_s`` seconds (a zombie, which only waits to
    be reaped, has ended)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p, start in procs.items() if (s := _proc_stat(p)) and s[2] == start and s[1] != "Z"]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def rss_mb() -> float:
    """This process's resident memory in MiB (from /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
