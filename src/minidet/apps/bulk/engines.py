"""What runs a bulk job's images: an engine. ``infer`` runs through one (``Job.loop``), ``eval`` through the local one;
a server can call the same ``Predictor`` and the same serializer (``minidet.apps.outputs.records``) without either.

An engine has ``find_inputs(args)`` (the inputs it can read), ``load(job, cfg, weights)`` (what runs them, set up:
the model, or the cluster; the job's classes named), ``forwards(job, images)`` (:class:`Forward` after forward, in
input order), ``videos`` (whether it runs video files) and ``close()``.

- :class:`LocalEngine`: the model in this process (one process, or each torchrun process on its share: the share
  is set up by ``ledger.open_share``), images decoded by loader workers (``run_batches``).
- ``raydata.RayEngine``: a pool of actors on a Ray cluster (``--engine ray``).
"""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
from torch.utils.data import DataLoader

from minidet.apps.bulk.inputs import find_inputs
from minidet.apps.bulk.loader import ImageFiles, collate, worker_init_fn
from minidet.apps.bulk.sliced import image_reader
from minidet.apps.outputs.records import keep_classes, render
from minidet.errors import MinidetError
from minidet.imageio import ImageReadError

Output = Callable[[], tuple[dict, "bytes | None"]]  # makes one image's record and drawing (in a writer thread)


@dataclass
class Forward:
    """What an engine gives back for one forward, in input order: ``outputs`` (image id, the function that makes
    its record and drawing), ``errors`` (image id, one line), ``timing`` (the forward's seconds: ``n`` images,
    ``data``, ``model``, ``stages``; None: no timing), ``warnings`` (lines to print)."""

    outputs: list[tuple[int, Output]] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)
    timing: dict | None = None
    warnings: list[str] = field(default_factory=list)


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
        what = str(e) if isinstance(e, MinidetError) else f"{type(e).__name__}: {e}"  # minidet's: one line already
        if isinstance(e, ImageReadError):  # names its file already (a raster's tile read in the model's loop)
            return image_id, what
        return image_id, " ".join(f"{paths[image_id]}: {what}".split())

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



class LocalEngine:
    """The model in this process: images decoded by ``--workers`` loader processes while it runs, ``TEST.IMS_PER_BATCH``
    per forward (:func:`run_batches`); each output's record and drawing made in a writer thread, the ``--classes``
    filter applied first. Under torchrun, each process runs its share this way."""

    name, videos = "local", True

    def __init__(self, args) -> None:
        self.args = args
        self.predictor = None

    def find_inputs(self, args) -> tuple[list[tuple[str, str]], dict]:
        """The inputs as ``(path, name)`` and what folders left out (``inputs.find_inputs``; videos too)."""
        return find_inputs(args.input, args.recursive, args.input_list, videos=True)

    def load(self, job, cfg, weights: str | None):
        """The Predictor (``job.local_model``), its classes the job's."""
        self.predictor = job.local_model(cfg, weights)
        job.use_classes(self.predictor.classes)
        return self.predictor

    def batches(self, files: ImageFiles, batch_size: int) -> Iterator[Batch]:
        """``files`` through the model, ``batch_size`` per forward (:func:`run_batches`, ``--workers`` loaders)."""
        return run_batches(self.predictor, files, batch_size, self.args.workers, self.args.debug)

    def forwards(self, job, images: list[tuple[int, str]]) -> Iterator[Forward]:
        """``images`` forward after forward; each output's record and drawing by ``render`` with the job's options."""
        cfg, options = job.cfg, job.options
        files = ImageFiles(images, cfg.INPUT.MAX_PIXELS, read=image_reader(options.slicing))
        for batch in self.batches(files, cfg.TEST.IMS_PER_BATCH):
            outputs = [(i, functools.partial(render, job.paths[i - 1], image, keep_classes(out, job.keep), options))
                       for i, image, out in batch.outputs]
            yield Forward(outputs, batch.errors, batch.timing)

    def close(self) -> None:
        """Nothing to let go of (the loader's workers end with the loop)."""
