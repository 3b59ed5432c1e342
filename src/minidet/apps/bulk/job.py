"""The bulk job as ``infer`` and ``eval`` run it: the set-up they share (:class:`BulkJob`: config, inputs, weights,
torchrun, this process's share of the inputs and its ledger, the model, the run recorded before any output) and
the driver that runs a job's loop and stops it cleanly (:func:`drive`: Ctrl-C, SIGTERM, a full disk, a dead
process of the run). What runs the images is an engine (``engines``); what is finished is in the ledger
(``ledger``)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from minidet.apps.bulk import dist
from minidet.apps.bulk.chunks import ChunkStore, file_identity
from minidet.apps.bulk.ledger import Ledger, begin_run, open_share
from minidet.apps.outputs.fileio import no_space
from minidet.config import CfgNode, load_cfg
from minidet.errors import Interrupted
from minidet.hub import weights_path
from minidet.slicing import SlicedPredictor


class BulkJob:
    """The set-up that ``infer`` and ``eval`` share, in its order: the config (merged, every value checked before
    anything is read), the inputs (:meth:`inputs`), the weights resolved once (a name or URL downloads), torchrun,
    the chunk store and this process's share (resumed: what the chunks finished is not redone), the model
    (:meth:`load_model`), then the run recorded before any output and this process's :class:`Ledger`. A subclass
    gives ``name`` (its lines' prefix), ``unit`` (what an input is called), ``chunks`` (the store's folder in
    ``--output``) and the hooks; its ``loop`` and ``finish`` run through :func:`drive`. ``args``: the program's
    arguments, ``args.options`` their :class:`~minidet.apps.outputs.options.OutputOptions` (``options.from_args``)."""

    name, unit, chunks = "bulk", "inputs", "chunks"
    restart = False  # a run without --resume replaces the chunks of an earlier one (else it is refused)

    @staticmethod
    def alone(path: str) -> bool:
        """Whether the input ``path`` runs by itself, not in forwards of ``TEST.IMS_PER_BATCH`` (infer: a video)."""
        return False

    def __init__(self, args) -> None:
        self.args = args
        self.options = args.options  # the run's OutputOptions (the program's parse_args built them)
        cfg = load_cfg(args.config_file, args.opts)
        self.info = dist.from_env()
        self.items, manifest = self.inputs(cfg)
        weights = weights_path(cfg.MODEL.WEIGHTS)  # after the inputs and outputs are checked
        self.info, device = dist.init(cfg.MODEL.DEVICE)
        if device != cfg.MODEL.DEVICE:  # torchrun's cuda:<local rank>
            cfg.defrost()
            cfg.MODEL.DEVICE = device
            cfg.freeze()
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
        self.ledger = Ledger(self.store, self.share.run_id, self.info.rank, args.chunk_size)

    @property
    def written(self) -> list[str]:
        """This process's chunk files (its ledger's)."""
        return self.ledger.written

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
        """What runs the inputs: by default :meth:`local_model`."""
        return self.local_model(cfg, weights)

    def local_model(self, cfg: CfgNode, weights: str | None):
        """The Predictor in this process (``weights``: the resolved checkpoint); rank 0 names what was loaded."""
        from minidet.predictor import Predictor

        predictor = Predictor(cfg, weights)
        if self.info.is_main:
            print(f"{self.name}: weights {predictor.weights_summary}")
            if predictor.classes_summary:
                print(f"{self.name}: {predictor.classes_summary}")
        slicing = self.options.slicing
        if slicing is None:
            return predictor
        if self.info.is_main:
            print(f"{self.name}: sliced inference: {slicing.size} px tiles, overlap {slicing.overlap:g}, merge "
                  f"{slicing.merge} by box {slicing.match} >= {slicing.threshold:g}"
                  + (", and the whole image" if slicing.full_pass else ""))
        return SlicedPredictor(predictor, slicing, progress=lambda done, total: self.on_tile(done, total),
                               plan=lambda height, width, windows: self.on_plan(height, width, windows))

    def on_plan(self, height: int, width: int, windows: list) -> None:
        """Called before the tiles of a sliced image run (``windows``: its runs; the loop says how many)."""

    def on_tile(self, done: int, total: int) -> None:
        """Called after each tile of a sliced image (the loop shows it on its bar)."""

    def remove_temp_files(self) -> None:
        """Remove what a killed run left half-written (rank 0, before the run is recorded)."""


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
