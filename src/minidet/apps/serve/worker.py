"""A model worker of ``minidet serve``: one process with its own model and thread count, answering one request at a
time over a pipe (:func:`worker_main`), one image per forward, so that an answer never depends on another request.

The pipe's messages are ``protocol``'s: the worker says ``Ready`` once its model is loaded and warmed up (or
``Failed``), then says ``Started`` on receiving each ``Request`` and answers it with :func:`answer`'s ``Answer`` (any
failure while answering one is that request's 500, and the worker goes on); ``STOP`` or the pipe's end stops it.
It ignores SIGINT and SIGTERM: the server that owns it stops it when the requests in flight are answered (or killed
when their grace is over)."""

from __future__ import annotations

import os
import signal
import time
import traceback
from dataclasses import dataclass

import torch

from minidet.apps.outputs.records import dumps_record, keep_classes, keep_scores, to_record
from minidet.apps.serve.protocol import STOP, Answer, ClientError, Failed, Ready, Request, Result, ServerError, Started
from minidet.config import CfgNode
from minidet.errors import MinidetError
from minidet.imageio import ImageReadError, read_image_bytes

WARMUP_SIZE = (480, 640)  # the warm-up image (the config's resize takes it to the model's size)


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


def answer(predictor, request: Request, max_pixels: int, debug: bool = False) -> Answer:
    """One request: its :class:`~minidet.apps.serve.protocol.Result`, the body being the record ``minidet infer``
    writes for this image (``outputs.records``: the same serializer); or a ``ClientError`` (413 for an image over
    ``INPUT.MAX_PIXELS``, 400 for bytes that do not decode or an image the model refuses), or a ``ServerError`` (500)
    for any other failure (of the model, of the serializer, ...): the worker goes on to the next request."""
    try:
        return _answer(predictor, request, max_pixels)
    except Exception as e:  # noqa: BLE001 - this request's failure: answered, and the worker goes on
        if debug:
            traceback.print_exc()
        return ServerError(f"{type(e).__name__}: {e}")


def _answer(predictor, request: Request, max_pixels: int) -> Answer:
    options = request.options
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        image = read_image_bytes(request.data, request.file or "image", max_pixels, on_warning=lambda line: None)
    except ImageReadError as e:
        return ClientError(413 if e.too_large else 400, str(e))
    times["decode"] = time.perf_counter() - t0
    try:
        out = predictor(image)
    except ValueError as e:  # the documented input checks (an image too small for the model, ...)
        return ClientError(400, str(e))
    times.update(out.pop("timings"))
    t1 = time.perf_counter()
    out = keep_scores(keep_classes(out, options.keep(predictor.class_names)), options.score_thresh)
    body = dumps_record(to_record(request.file, image, out, options.mask_format, options.tolerance)).encode()
    times["serialize"] = time.perf_counter() - t1
    return Result(body, times)


def worker_main(conn, spec: Spec) -> None:
    """The worker process: load and warm up the model, say so, then answer requests until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if spec.nice:
        os.nice(spec.nice)
    try:
        predictor, facts = load(spec)
    except (MinidetError, OSError) as e:
        conn.send(Failed(" ".join(str(e).split())))
        return
    except Exception as e:  # noqa: BLE001 - any other failure to load: one line for the server to print
        if spec.debug:
            traceback.print_exc()
        conn.send(Failed(" ".join(f"{type(e).__name__}: {e}".split())))
        return
    conn.send(Ready(facts))
    max_pixels = facts["max_pixels"]
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the server is gone
            return
        if message is STOP:
            return
        try:
            conn.send(Started())  # before anything runs: a death from now on may be this request's doing
            conn.send(answer(predictor, message, max_pixels, spec.debug))
        except (BrokenPipeError, OSError):
            return
