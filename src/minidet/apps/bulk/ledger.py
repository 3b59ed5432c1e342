"""The run's ledger: which images run together (``forwards``, torchrun's ``shard``), this process's share and the
run's identity (``open_share``, ``begin_run``: what resume checks), the record of what is finished (:class:`Ledger`:
chunks of whole forwards, saved durably) and the timing records (``timing_summary``). ``infer`` (in one process,
each torchrun process, or with Ray's actors) and ``eval`` keep their runs here."""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from minidet.apps.bulk import dist
from minidet.apps.bulk.chunks import ChunkError, ChunkStore
from minidet.timing import summarize


@dataclass
class Share:
    """What this process does: ``todo``, its share (:func:`shard`) of the ``(id, path)`` not ``done``, as run
    ``run_id``; ``manifest``: the run's identity (on rank 0)."""

    run_id: int
    todo: list[tuple[int, str]]
    done: set[int]
    manifest: dict | None = None


def forwards(images: list[tuple[int, str]], batch: int) -> list[list[tuple[int, str]]]:
    """``images`` in the forwards one process runs them in: ``batch`` consecutive images each (the loader's
    batches, Ray's blocks)."""
    return [images[k : k + batch] for k in range(0, len(images), batch)]


def shard(todo: list[tuple[int, str]], rank: int, world_size: int, batch: int = 1,
          alone: Callable[[str], bool] = lambda path: False) -> list[tuple[int, str]]:
    """Process ``rank``'s share of ``todo``: every ``world_size``-th forward, a forward being ``batch`` consecutive
    images as one process runs them (an input ``alone`` accepts, a video, is a forward of its own, after them).
    The images of a forward are padded together and the padding reaches the detections, so each image runs in
    the forward it has in one process, whatever the process count; and since chunks hold whole forwards, the
    inputs left after a stop form the same forwards again."""
    images = [x for x in todo if not alone(x[1])]
    units = forwards(images, batch) + [[x] for x in todo if alone(x[1])]
    return [x for f in units[rank::world_size] for x in f]


def open_share(store: ChunkStore, prepare: Callable[[], dict], items: list[tuple[int, str]], resume: bool,
               info: dist.DistInfo, keep: Callable[[int], bool] | None = None, restart: bool = False,
               batch: int = 1, alone: Callable[[str], bool] = lambda path: False) -> Share:
    """Rank 0 calls ``prepare()`` for the run's manifest, checks ``store`` with it (see :meth:`ChunkStore.check`;
    nothing is written) and, with ``resume``, reads which ids the chunks finished (those ``keep`` accepts, when
    given); every rank gets the same answer, or the same :class:`ChunkError` for anything that failed on rank 0.
    Once set up, :func:`begin_run` records the run. ``batch``, ``alone``: how the inputs are run (:func:`shard`)."""
    state: dict = {}
    manifest = None
    if info.is_main:  # one process decides, so that every rank shards the same list
        try:
            manifest = prepare()
            run = store.check(manifest, resume, restart)
            done = store.done_ids() if resume else set()
            state = {"run": run, "done": sorted(i for i in done if keep is None or keep(i))}
        except (ChunkError, OSError) as e:
            state = {"error": str(e)}
    state = dist.broadcast(state)
    if "error" in state:
        raise ChunkError(state["error"])
    done = set(state["done"])
    todo = [(i, path) for i, path in items if i not in done]
    return Share(state["run"], shard(todo, info.rank, info.world_size, batch, alone), done, manifest)


def begin_run(store: ChunkStore, share: Share, resume: bool, info: dist.DistInfo,
              clean: Callable[[], None] | None = None) -> None:
    """Once the run is set up (the model loaded) and before any output: rank 0 calls ``clean()`` (temporary files
    of a killed run) and records the run's identity (:meth:`ChunkStore.begin`); every rank waits for that, so that
    no output exists without it, and raises what failed on rank 0."""
    error = None
    if info.is_main:
        try:
            if clean is not None:
                clean()
            store.begin(share.manifest, share.run_id, resume)
        except OSError as e:
            error = e
    message = dist.broadcast(None if error is None else str(error))
    if error is not None:
        raise error
    if message is not None:
        raise ChunkError(message)


class Ledger:
    """What one process of a run has finished, as its chunks hold it: inputs ``done`` (their instance count and, for
    a results file, their record) or ``skip``-ped (the error), the timing of each forward; a chunk is saved into
    ``store`` (durably) as soon as ``chunk_size`` inputs are finished and no forward is partly so (``plan``): the
    images of one forward are padded together and the padding reaches the detections, so ``--resume`` must run the
    forwards left with the images they had. ``stream``: the results file's partial lines, written as records come.
    Thread-safe: writer threads finish inputs (``lock``)."""

    def __init__(self, store: ChunkStore, run_id: int, rank: int, chunk_size: int, stream: IO[str] | None = None):
        self.store, self.run_id, self.rank, self.chunk_size, self.stream = store, run_id, rank, chunk_size, stream
        self.lock = threading.RLock()
        self.pending = self._empty()
        self.written: list[str] = []  # this process's chunk files
        self.seq = 0  # this process's forwards timed
        # each image's forward (:meth:`plan`), the images left of each, the forwards partly finished
        self.forward_of: dict[int, int] = {}
        self.forward_left: collections.Counter[int] = collections.Counter()
        self.open_forwards: set[int] = set()

    @staticmethod
    def _empty() -> dict:
        return {"image_ids": [], "instances": [], "skipped": [], "detections": [], "timings": []}

    def plan(self, images: list[tuple[int, str]], batch: int) -> None:
        """Note which forward each image runs in: ``batch`` consecutive images of this process's, as the loader (and
        Ray's blocks) form them (:func:`forwards`). An input not planned (a video) is a forward of its own."""
        self.forward_of = {i: f for f, group in enumerate(forwards(images, batch)) for i, _ in group}
        self.forward_left = collections.Counter(self.forward_of.values())
        self.open_forwards = set()

    def _finished_one(self, image_id: int) -> None:
        """An input is done or skipped: its forward is open until its last image is (under ``self.lock``)."""
        f = self.forward_of.get(image_id)
        if f is None:
            return
        self.forward_left[f] -= 1
        if self.forward_left[f]:
            self.open_forwards.add(f)
        else:
            self.open_forwards.discard(f)

    def done(self, image_id: int, n_instances: int, line: dict | None = None) -> None:
        """An input finished with ``n_instances`` detections; ``line``: its record for the results file."""
        with self.lock:
            self.pending["image_ids"].append(image_id)
            self.pending["instances"].append(n_instances)
            self._finished_one(image_id)
            if line is not None:
                self.pending["detections"].append(line)
                if self.stream is not None:
                    self.stream.write(json.dumps(line) + "\n")
                    self.stream.flush()
            self.save(full=True)

    def skip(self, entry: dict, save: bool = True) -> None:
        """An input failed: ``entry`` has its ``image_id``, ``file`` and ``error`` (a damaged video whose frames read
        are kept: ``incomplete`` and their ``instances`` too); ``save``: a full chunk is saved now."""
        with self.lock:
            self.pending["skipped"].append(entry)
            self._finished_one(entry["image_id"])
            if save:
                self.save(full=True)

    def timing(self, timing: dict) -> None:
        """A forward's timing (``n`` images, seconds: ``data``, ``model``, ``stages``...), with this run, this
        process's rank and forward count unless it names its own (a Ray actor's); forwards of no image are left out."""
        with self.lock:
            if timing["n"]:
                self.pending["timings"].append({"run": self.run_id, "rank": self.rank, "seq": self.seq, **timing})
                self.seq += 1

    def save(self, full: bool = False, **contents) -> bool:
        """Write the finished and skipped inputs as a chunk (with ``full`` only once ``chunk_size`` of them are there
        and no forward is partly finished); start anew (memory stays flat). Without ``full`` (the end, or a stop) the
        images of a partly finished forward are left out: ``--resume`` runs that forward again whole. ``contents``:
        fields the caller keeps itself (``eval``'s evaluator: its images, detections), written in place of these.
        Returns whether a chunk was written."""
        with self.lock:
            if full and self.open_forwards:
                return False
            if self.open_forwards:
                self._drop_open_forwards()
            p = {**self.pending, **contents}
            n = len(p["image_ids"]) + len(p["skipped"])
            if n == 0 or (full and n < self.chunk_size):
                return False
            self.written.append(self.store.write(self.run_id, self.rank, len(self.written), p))
            self.pending = self._empty()
            return True

    def _drop_open_forwards(self) -> None:
        """Take the images of partly finished forwards out of the pending chunk (their files are rewritten, the
        same, when ``--resume`` runs their forward)."""
        p, drop = self.pending, {i for i, f in self.forward_of.items() if f in self.open_forwards}
        kept = [k for k, i in enumerate(p["image_ids"]) if i not in drop]
        p["image_ids"], p["instances"] = [p["image_ids"][k] for k in kept], [p["instances"][k] for k in kept]
        p["detections"] = [d for d in p["detections"] if d["image_id"] not in drop]
        p["skipped"] = [e for e in p["skipped"] if e["image_id"] not in drop]


def timing_summary(records: list[dict], warmup: int) -> tuple[dict, dict, list[dict]]:
    """Per-image statistics (:func:`summarize`) of the model stages and of the pipeline (``data``, ``model`` and,
    where recorded, ``encode``) over batch ``records`` (``n`` images, seconds for the batch, ``seq`` its place in
    its process's run); the first ``warmup`` batches of each are left out unless nothing would remain.
    Returns (stage statistics, pipeline statistics, the records timed)."""
    timed = [r for r in records if r["seq"] >= warmup] or list(records)
    stages = [{k: v / r["n"] for k, v in r["stages"].items()} for r in timed if r["stages"]]
    pipeline = [{k: r[k] / r["n"] for k in ("data", "model", "encode") if k in r} for r in timed]
    return (summarize(stages) if stages else {}), (summarize(pipeline) if pipeline else {}), timed


