"""A model worker of ``minidet serve``: one process with its own model and thread count, answering one request at a
time over a pipe (:func:`worker_main`), one image per forward, so that an answer never depends on another request.

The pipe's messages: the worker says ``("ready", facts)`` once its model is loaded and warmed up (or ``("failed",
line)``), then answers each ``(image bytes, options)`` with :func:`answer`'s tuple (any failure while answering one
is that request's 500, and the worker goes on); ``None`` or the pipe's end stops it. It ignores SIGINT and SIGTERM:
the server that owns it stops it when the requests in flight are answered (or killed when their grace is over)."""

from __future__ import annotations

import os
import signal
import time
import traceback
from dataclasses import dataclass

import torch

from minidet.apps.outputs.records import dumps_record, keep_classes, keep_scores, to_record
from minidet.config import CfgNode
from minidet.errors import MinidetError
from minidet.imageio import ImageReadError, read_image_bytes

WARMUP_SIZE = (480, 640)  # the warm-up image (the config's resize takes it to the model's size)


@dataclass
class Options:
    """What one request asks beyond its image: the ``file`` name its record carries, the class indices to keep
    (None: all), the lowest score returned, ``mask_format`` (``rle``, ``polygon`` or ``none``) and the polygons'
    ``tolerance`` in pixels."""

    file: str = ""
    keep: set[int] | None = None
    score_thresh: float = 0.0
    mask_format: str = "rle"
    tolerance: float = 0.0


@dataclass
class Spec:
    """What a worker builds its model from: the server's config (``config.load_cfg``: merged, validated and frozen
    once, there), the checkpoint's path (``MODEL.WEIGHTS`` resolved once by the server), torch's thread count."""

    cfg: CfgNode
    weights: str | None = None
    threads: int = 1
    debug: bool = False
    nice: int = 0  # added to the worker's niceness: the HTTP process, which answers refusals, keeps its share


def load(spec: Spec):
    """The Predictor of ``spec``, warmed up (one forward on a synthetic image); and what the server says of it."""
    from minidet.apps.synthetic import structured_image
    from minidet.predictor import Predictor

    torch.set_num_threads(spec.threads)
    predictor = Predictor(spec.cfg, spec.weights)
    t0 = time.perf_counter()
    predictor(structured_image(*WARMUP_SIZE))
    classes = predictor.classes
    facts = {"family": predictor.cfg.MODEL.CONVENTION, "runtime": predictor.cfg.MODEL.RUNTIME,
             "class_names": list(predictor.class_names), "classes": [{"index": k, "id": int(i), "name": n}
                                                                     for k, (i, n) in enumerate(zip(classes.ids,
                                                                                                    classes.names))],
             "weights_summary": predictor.weights_summary, "classes_summary": predictor.classes_summary,
             "config": predictor.cfg.dump(), "max_pixels": int(predictor.cfg.INPUT.MAX_PIXELS),
             "warmup_seconds": time.perf_counter() - t0, "threads": torch.get_num_threads()}
    return predictor, facts


def answer(predictor, data: bytes, options: Options, max_pixels: int, debug: bool = False) -> tuple:
    """One request: ``("ok", JSON bytes, seconds by stage)``, the body being the record ``minidet infer`` writes for
    this image (``outputs.records``: the same serializer); or ``("error", HTTP status, message, seconds)`` (the
    server's ``app.error`` makes it one line):
    413 for an image over ``INPUT.MAX_PIXELS``, 400 for bytes that do not decode or an image the model refuses,
    500 for any other failure (of the model, of the serializer, ...): the worker goes on to the next request."""
    try:
        return _answer(predictor, data, options, max_pixels)
    except Exception as e:  # noqa: BLE001 - this request's failure: answered, and the worker goes on
        if debug:
            traceback.print_exc()
        return "error", 500, f"{type(e).__name__}: {e}", {}


def _answer(predictor, data: bytes, options: Options, max_pixels: int) -> tuple:
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        image = read_image_bytes(data, options.file or "image", max_pixels, on_warning=lambda line: None)
    except ImageReadError as e:
        return "error", 413 if e.too_large else 400, str(e), times
    times["decode"] = time.perf_counter() - t0
    try:
        out = predictor(image)
    except ValueError as e:  # the documented input checks (an image too small for the model, ...)
        return "error", 400, str(e), times
    times.update(out.pop("timings"))
    t1 = time.perf_counter()
    out = keep_scores(keep_classes(out, options.keep), options.score_thresh)
    body = dumps_record(to_record(options.file, image, out, options.mask_format, options.tolerance)).encode()
    times["serialize"] = time.perf_counter() - t1
    return "ok", body, times


def worker_main(conn, spec: Spec) -> None:
    """The worker process: load and warm up the model, say so, then answer requests until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if spec.nice:
        os.nice(spec.nice)
    try:
        predictor, facts = load(spec)
    except (MinidetError, OSError) as e:
        conn.send(("failed", " ".join(str(e).split())))
        return
    except Exception as e:  # noqa: BLE001 - any other failure to load: one line for the server to print
        if spec.debug:
            traceback.print_exc()
        conn.send(("failed", " ".join(f"{type(e).__name__}: {e}".split())))
        return
    conn.send(("ready", facts))
    max_pixels = facts["max_pixels"]
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the server is gone
            return
        if message is None:
            return
        data, options = message
        try:
            conn.send(answer(predictor, data, options, max_pixels, spec.debug))
        except (BrokenPipeError, OSError):
            return
