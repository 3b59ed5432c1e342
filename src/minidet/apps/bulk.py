"""Bulk inference as both tools run it: this process's share of the inputs (under torchrun every N-th of those not
done), images decoded in DataLoader workers while the model runs, ``TEST.IMS_PER_BATCH`` per forward, each batch
timed, and an image the model cannot take reported and skipped rather than stopping the run."""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
from torch.utils.data import DataLoader

from ..timing import summarize
from . import dist
from .chunks import ChunkError, ChunkStore
from .data import ImageFiles, collate, worker_init_fn


@dataclass
class Share:
    """What this process does: ``todo``, every ``world_size``-th ``(id, path)`` not ``done``, as run ``run_id``."""

    run_id: int
    todo: list[tuple[int, str]]
    done: set[int]


def open_share(store: ChunkStore, prepare: Callable[[], dict], items: list[tuple[int, str]], resume: bool,
               info: dist.DistInfo, keep: Callable[[int], bool] | None = None) -> Share:
    """Rank 0 calls ``prepare()`` for the run's manifest, opens ``store`` with it (see :meth:`ChunkStore.open`) and
    reads which ids the chunks finished (those ``keep`` accepts, when given); every rank gets the same answer, or
    the same :class:`ChunkError` for anything that failed on rank 0."""
    state: dict = {}
    if info.is_main:  # one process decides, so that every rank shards the same list
        try:
            run = store.open(prepare(), resume)
            state = {"run": run, "done": sorted(i for i in store.done_ids() if keep is None or keep(i))}
        except (ChunkError, OSError) as e:
            state = {"error": str(e)}
    state = dist.broadcast(state)
    if "error" in state:
        raise ChunkError(state["error"])
    done = set(state["done"])
    todo = [(i, path) for i, path in items if i not in done]
    return Share(state["run"], todo[info.rank :: info.world_size], done)


@dataclass
class Batch:
    """One forward's worth: ``outputs`` ``(id, image, prediction)`` of the images that ran, ``errors`` ``(id, one-line
    message)`` of those that could not be read or run, ``timing`` seconds for the batch: ``data`` (waiting for the
    loader), ``model`` and its ``stages``, over ``n`` images."""

    outputs: list[tuple[int, np.ndarray, dict]] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)
    timing: dict = field(default_factory=dict)


def run_batches(predictor, files: ImageFiles, batch_size: int, workers: int, debug: bool = False) -> Iterator[Batch]:
    """Read ``files`` in ``workers`` loader processes (0: in this one) and run them ``batch_size`` at a time. When a
    batch fails, each of its images runs alone and those that fail by themselves become errors: one image the
    model cannot take must not stop the run (nor every resumed run after it). Iterate from the main thread (the
    workers die with it, see :func:`worker_init_fn`)."""
    paths = dict(files.items)
    loader = DataLoader(files, batch_size=batch_size, num_workers=workers, collate_fn=collate,
                        worker_init_fn=worker_init_fn())
    batches = iter(loader)

    def model_error(image_id: int, e: Exception) -> tuple[int, str]:
        if debug:
            traceback.print_exc()
        return image_id, " ".join(f"{paths[image_id]}: {type(e).__name__}: {e}".split())

    while True:
        t0 = time.perf_counter()
        items = next(batches, None)
        t_data = time.perf_counter() - t0
        if items is None:
            return
        batch = Batch(errors=[(i, im) for i, im in items if isinstance(im, str)])
        good = [(i, im) for i, im in items if not isinstance(im, str)]
        stages: dict[str, float] = {}
        t1 = time.perf_counter()
        try:
            outs = predictor.predict_batch([im for _, im in good]) if good else []
            batch.outputs = [(i, im, out) for (i, im), out in zip(good, outs)]
            stages = dict(outs[0]["timings"]) if outs else {}
        except Exception as e:  # noqa: BLE001 - reported per image
            if len(good) == 1:
                batch.errors.append(model_error(good[0][0], e))
            else:
                for i, im in good:
                    try:
                        out = predictor(im)
                    except Exception as e:  # noqa: BLE001 - this image's problem: reported, skipped
                        batch.errors.append(model_error(i, e))
                        continue
                    batch.outputs.append((i, im, out))
                    for k, v in out["timings"].items():
                        stages[k] = stages.get(k, 0.0) + v
        model = sum(stages.values()) if stages else time.perf_counter() - t1
        batch.timing = {"n": len(batch.outputs), "data": t_data, "model": model, "stages": stages}
        yield batch


def timing_summary(records: list[dict], warmup: int) -> tuple[dict, dict, list[dict]]:
    """Per-image statistics (:func:`summarize`) of the model stages and of the pipeline (``data``, ``model`` and,
    where recorded, ``encode``) over batch ``records`` (``n`` images, seconds for the batch, ``seq`` its place in
    its process's run); the first ``warmup`` batches of each are left out unless nothing would remain.
    Returns (stage statistics, pipeline statistics, the records timed)."""
    timed = [r for r in records if r["seq"] >= warmup] or list(records)
    stages = [{k: v / r["n"] for k, v in r["stages"].items()} for r in timed if r["stages"]]
    pipeline = [{k: r[k] / r["n"] for k in ("data", "model", "encode") if k in r} for r in timed]
    return (summarize(stages) if stages else {}), (summarize(pipeline) if pipeline else {}), timed


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: what is finished is saved on the way out


def drive(job, fail: Callable[[str], int], folder_flag: str) -> tuple[int | None, float]:
    """Run ``job.loop()`` (SIGTERM unwinds it like Ctrl-C), then learn which chunks every process wrote
    (``job.written``, in ``job.store``). Returns ``(status, loop seconds)``: the exit status when this process is
    done (stopped: 130 Ctrl-C, 128 + signal, or ``fail``'s for an error; 0 for a rank above 0; ``fail``'s when a
    chunk of another process is not visible, i.e. ``folder_flag`` is not shared), None when rank 0 is to merge."""
    signal.signal(signal.SIGTERM, _raise_exit)
    t0 = time.perf_counter()
    try:
        job.loop()
    except (KeyboardInterrupt, SystemExit, Exception) as e:  # noqa: BLE001 - report, keep the chunks, stop
        what = "interrupted" if isinstance(e, (KeyboardInterrupt, SystemExit)) else f"{type(e).__name__}: {e}"
        rc = fail(f"{what.strip().rstrip('.')}; finished work is kept in {job.store.folder}: rerun the same command "
                  "with --resume to do the rest")
        return (130 if isinstance(e, KeyboardInterrupt) else e.code if isinstance(e, SystemExit) else rc), 0.0
    written = dist.all_gather(job.written)
    t_loop = time.perf_counter() - t0
    if not job.info.is_main:
        return 0, t_loop
    unseen = [n for names in written for n in names if not os.path.exists(os.path.join(job.store.folder, n))]
    if unseen:
        where = f"{job.store.folder}: {folder_flag} must be shared"
        return fail(f"{unseen[0]} of another process is not in {where}"), t_loop
    return None, t_loop
