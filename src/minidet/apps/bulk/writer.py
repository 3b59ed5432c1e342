"""Writing a bulk run's outputs: the input guard (no output replaces an input) and the ordered writer (files written
by writer threads while the model runs, finished inputs handed on in input order), for ``infer`` and its Ray
engine alike."""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from minidet.apps.outputs.fileio import OutputError, atomic_write, no_space


class InputGuard:
    """The input files, to make sure no output replaces one (same path, through links, a hard link
    or a case-insensitive file system)."""

    def __init__(self, paths: list[str]) -> None:
        self.by_id: dict[tuple[int, int], str] = {}
        self.by_name = {os.path.realpath(p): p for p in paths}
        for p in paths:
            for key in _file_ids(p):
                self.by_id.setdefault(key, p)

    def input_at(self, out_path: str) -> str | None:
        """The input file that writing ``out_path`` would replace, or None."""
        for key in _file_ids(out_path):
            if key in self.by_id:
                return self.by_id[key]
        return self.by_name.get(os.path.realpath(out_path))

    def check_folder(self, folder: str, names: list[str]) -> None:
        """Raise :class:`OutputError` naming ``--output`` and the first input an output would replace."""
        for name in names:
            hit = self.input_at(os.path.join(folder, name))
            if hit is not None:
                raise OutputError(f"--output {folder}: {name} would replace the input file {hit}; "
                                  "choose another folder")

    def write(self, path: str, data: bytes) -> None:
        """:func:`atomic_write`, unless ``path`` is one of the inputs (checked again as each file is written)."""
        hit = self.input_at(path)
        if hit is not None:
            raise OutputError(f"{path}: is the input file {hit}; not written")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, data)


def _file_ids(path: str) -> list[tuple[int, int]]:
    """(device, inode) of ``path`` and, for a link, of its target; none for what does not exist."""
    ids = []
    for stat in (os.lstat, os.stat):
        with contextlib.suppress(OSError):
            st = stat(path)
            ids.append((st.st_dev, st.st_ino))
    return ids


class OrderedWriter:
    """Each input's files written in ``pool``'s threads (``submit``: its ``write()``, which returns its record) while
    the engine runs the next forward; the inputs handed on in input order, as they finish: ``done(image_id,
    record)``, ``failed(image_id, message)`` (a write that failed: the one line, the run goes on), and a forward's
    ``timing`` with its last image (``expect``). A full disk stops the run: raised by :meth:`drain`, what finished
    before it handed on. ``describe(image_id)`` names an input in a message; ``lock`` is the caller's (its ledger's),
    held while inputs are handed on."""

    def __init__(self, pool: ThreadPoolExecutor, lock: threading.RLock, done: Callable[[int, dict], None],
                 failed: Callable[[int, str], None], timing: Callable[[dict], None], describe: Callable[[int], str],
                 debug: bool = False) -> None:
        self.pool, self.lock, self.debug, self.describe = pool, lock, debug, describe
        self.on_done, self.on_failed, self.on_timing = done, failed, timing
        self.order: collections.deque[int] = collections.deque()  # inputs at the writers, in input order
        self.finished: dict[int, dict | str | None] = {}  # their results, until the earlier ones are in
        self.timings: dict[int, dict] = {}  # a forward's timing, by the id of its last image
        self.futures: collections.deque[Future] = collections.deque()

    def expect(self, image_ids: list[int], timing: dict | None = None) -> None:
        """The inputs of a forward, in order, before their writes are submitted; its ``timing`` goes with the last."""
        with self.lock:
            self.order.extend(image_ids)
            if image_ids and timing is not None:
                self.timings[image_ids[-1]] = timing

    def submit(self, image_id: int, write: Callable[[], dict]) -> None:
        """Write an expected input's files in a writer thread (``write()`` returns its record)."""
        self.futures.append(self.pool.submit(self._task, image_id, write))

    def drain(self, limit: int) -> None:
        """Wait for the writes, oldest first, until at most ``limit`` are in flight (a full disk raises here)."""
        while len(self.futures) > limit:
            self.futures.popleft().result()

    def _task(self, image_id: int, write: Callable[[], dict]) -> None:
        """In a writer thread: one input's files, then its place in the order (:meth:`_finish`). A full disk stops
        the run (raised here, to :meth:`drain`); any other failure is this input's, reported."""
        try:
            result: dict | str | None = write()
        except Exception as e:  # noqa: BLE001 - this input's problem: reported, the run goes on
            if self.debug:
                traceback.print_exception(e)
            if no_space(e):
                self._finish(image_id, None)
                raise
            result = str(e) if isinstance(e, OutputError) else f"{self.describe(image_id)}: {type(e).__name__}: {e}"
        self._finish(image_id, result)

    def _finish(self, image_id: int, result: dict | str | None) -> None:
        """An input's files are written (``result`` its record), failed (the message) or not done (None): hand on,
        in input order, every input finished so far."""
        with self.lock:
            self.finished[image_id] = result
            while self.order and self.order[0] in self.finished:
                i = self.order.popleft()
                result = self.finished.pop(i)
                timing = self.timings.pop(i, None)
                if timing is not None and result is not None:
                    self.on_timing(timing)
                if isinstance(result, dict):
                    self.on_done(i, result)
                elif result is not None:
                    self.on_failed(i, result)
