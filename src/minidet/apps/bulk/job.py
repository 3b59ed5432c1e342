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

from minidet.apps.bulk import dist
from minidet.apps.bulk.chunks import ChunkError, ChunkStore, file_identity
from minidet.apps.bulk.loader import ImageFiles, collate, worker_init_fn
from minidet.apps.outputs.fileio import no_space
from minidet.config import CfgNode, get_cfg, validate_cfg
from minidet.errors import Interrupted
from minidet.hub import weights_path
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


class BulkJob:
    """The set-up that ``infer`` and ``eval`` share, in its order: the config (merged, every value checked before
    anything is read), the inputs (:meth:`inputs`), the weights resolved once (a name or URL downloads), torchrun,
    the chunk store and this process's share (resumed: what the chunks finished is not redone), the model
    (:meth:`load_model`), then the run recorded before any output. A subclass gives ``name`` (its lines' prefix),
    ``unit`` (what an input is called), ``chunks`` (the store's folder in ``--output``) and the hooks; its ``loop``
    and ``finish`` run through :func:`drive`."""

    name, unit, chunks = "bulk", "inputs", "chunks"
    restart = False  # a run without --resume replaces the chunks of an earlier one (else it is refused)

    @staticmethod
    def alone(path: str) -> bool:
        """Whether the input ``path`` runs by itself, not in forwards of ``TEST.IMS_PER_BATCH`` (infer: a video)."""
        return False

    def __init__(self, args) -> None:
        self.args = args
        cfg = get_cfg()
        cfg.merge_from_file(args.config_file)
        cfg.merge_from_list(args.opts)
        validate_cfg(cfg)
        self.info = dist.from_env()
        self.items, manifest = self.inputs(cfg)
        weights = weights_path(cfg.MODEL.WEIGHTS)  # after the inputs and outputs are checked
        self.info, device = dist.init(cfg.MODEL.DEVICE)
        cfg.MODEL.DEVICE = device
        self.cfg = cfg
        self.store = ChunkStore(os.path.join(args.output, self.chunks))
        identity = lambda: {"weights": file_identity(weights), **self.input_files(), **manifest}  # noqa: E731
        self.share = open_share(self.store, identity, self.items, args.resume, self.info, keep=self.complete,
                                restart=self.restart, batch=cfg.TEST.IMS_PER_BATCH, alone=self.alone)
        if self.share.done and self.info.is_main:
            n, done = len(self.items), len(self.share.done)
            print(f"{self.name}: resuming: {done} of {n} {self.unit} done, {n - done} to go")
        self.predictor = self.load_model(cfg, weights)
        begin_run(self.store, self.share, args.resume, self.info, self.remove_temp_files)
        self.written: list[str] = []  # this process's chunk files

    def inputs(self, cfg: CfgNode) -> tuple[list[tuple[int, str]], dict]:
        """The run's ``(id, path)`` inputs in id order (their outputs checked), and its identity beyond the config
        file and weights (config entries, options, inputs) for the chunks' manifest."""
        raise NotImplementedError

    def input_files(self) -> dict:
        """Files the run reads besides the weights, by content (:func:`file_identity`), for the manifest."""
        return {}

    def complete(self, image_id: int) -> bool:
        """Whether a finished input's outputs are all there (a resumed run redoes those that are not)."""
        return True

    def load_model(self, cfg: CfgNode, weights: str | None):
        """The Predictor (``weights``: the resolved checkpoint); rank 0 names what was loaded."""
        from minidet.predictor import Predictor

        predictor = Predictor(cfg, weights)
        if self.info.is_main:
            print(f"{self.name}: weights {predictor.weights_summary}")
            if predictor.classes_summary:
                print(f"{self.name}: {predictor.classes_summary}")
        return predictor

    def remove_temp_files(self) -> None:
        """Remove what a killed run left half-written (rank 0, before the run is recorded)."""


@dataclass
class Batch:
    """One forward's worth: ``outputs`` ``(id, image, prediction)`` of the images that ran, ``errors`` ``(id, one-line
    message)`` of those that could not be read or run, ``timing`` seconds for the batch: ``data`` (waiting for the
    loader), ``model`` and its ``stages``, over ``n`` images."""

    outputs: list[tuple[int, np.ndarray, dict]] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)
    timing: dict = field(default_factory=dict)


def loader_died(e: BaseException) -> bool:
    """Whether ``e`` is the loader saying one of its workers ended (torch raises it from its SIGCHLD handler, so it
    can surface inside the model's call): the run's problem, never the image's."""
    return isinstance(e, RuntimeError) and str(e).startswith("DataLoader worker")


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
        if loader_died(e):  # a worker's end, reported by the loader's SIGCHLD handler wherever the run was
            raise e
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
            if loader_died(e) or len(good) == 1:
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


_SIGNALLED: list[int] = []  # the signals that stopped this process's loop (SIGTERM)


def _raise_exit(signum, frame):
    _SIGNALLED.append(signum)  # the same SIGTERM to the process group may end a loader worker first
    raise Interrupted(signum)  # unwinds like Ctrl-C (no Exception): what is finished is saved on the way out


def stopped(e: BaseException, folder: str) -> str:
    """The line a run stopped by ``e`` ends with: why (which process of the run died, an interruption, a full
    disk naming the output folder, the error) and that the finished work in the chunk ``folder`` is kept."""
    then = "rerun"
    if dead := dist.dead_ranks():  # torchrun ends the other processes when one dies: say which
        why = dist.describe_dead(dead)
    elif isinstance(e, (KeyboardInterrupt, SystemExit)) or _SIGNALLED:  # not what a loader worker saw of it
        why = "interrupted"
    elif no_space(e):
        writing = f" (writing {e.path})" if getattr(e, "path", None) else ""
        why, then = f"{os.path.dirname(folder)}: {os.strerror(e.errno).lower()}{writing}", "make room, then rerun"
    else:
        why = str(e) if isinstance(e, dist.PeerError) else f"{type(e).__name__}: {e}".strip().rstrip(".")
    return f"{why}; finished work is kept in {folder}: {then} the same command with --resume to do the rest"


def drive(job, fail: Callable[[str], int], folder_flag: str, finish: Callable[[float], int]) -> int:
    """Run ``job.loop()`` (SIGTERM unwinds it like Ctrl-C), learn which chunks every process wrote
    (``job.written``, in ``job.store``), then on rank 0 ``finish(loop seconds)``. Returns the exit status: 130
    (Ctrl-C), 128 + signal, or ``fail``'s for an error, a full disk or another process of the run that died, each
    one :func:`stopped` line; 0 for a rank above 0; ``fail``'s when a chunk of another process is not visible
    (``folder_flag`` is not shared); else ``finish``'s, or ``fail``'s when the disk is full for its files."""
    signal.signal(signal.SIGTERM, _raise_exit)
    _SIGNALLED.clear()
    t0 = time.perf_counter()
    try:
        job.loop()
        written = dist.all_gather(job.written)
    except (KeyboardInterrupt, SystemExit, Exception) as e:  # noqa: BLE001 - report, keep the chunks, stop
        # the loader's workers end with the run (a signal to the whole group may reach them first): its SIGCHLD
        # handler would report that, as a traceback, when the loader is collected after this one line
        if hasattr(signal, "SIGCHLD"):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        rc = fail(stopped(e, job.store.folder))
        if isinstance(e, KeyboardInterrupt):
            return 130
        return e.code if isinstance(e, SystemExit) else 128 + _SIGNALLED[0] if _SIGNALLED else rc
    t_loop = time.perf_counter() - t0
    if not job.info.is_main:
        return 0
    unseen = [n for names in written for n in names if not os.path.exists(os.path.join(job.store.folder, n))]
    if unseen:
        return fail(f"{unseen[0]} of another process is not in {job.store.folder}: {folder_flag} must be shared")
    try:
        return finish(t_loop)
    except OSError as e:
        if not no_space(e):
            raise
        return fail(stopped(e, job.store.folder))
