"""One process's share of ``minidet infer`` (:class:`Job`: the set-up of :class:`~minidet.apps.bulk.job.BulkJob`, the
image loop with its writer threads, the videos, the chunks, the results file) and the per-image outputs: records
(``to_record``, ``dumps_record``), drawings (``draw``, ``render``), the ``--classes`` filter, output names and the
guard that keeps every output off the inputs. ``minidet.apps.infer`` is the program around it; ``--engine ray``
(``minidet.apps.bulk.raydata``) runs the same job's images on a Ray cluster."""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import heapq
import itertools
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import cv2
import numpy as np
import torch
from tqdm import tqdm

from minidet.apps.bulk.chunks import ChunkError, config_entries
from minidet.apps.bulk.inputs import describe_skipped, find_inputs
from minidet.apps.bulk.job import BulkJob, forwards, run_batches, timing_summary
from minidet.apps.bulk.loader import ImageFiles
from minidet.apps.outputs.fileio import OutputDir, OutputError, atomic_open, atomic_write, no_space, remove_temp_files
from minidet.apps.outputs.instances import record_instances
from minidet.apps.outputs.video import STDERR, VideoError, VideoReader, VideoWriter, is_video, working_codec
from minidet.apps.outputs.vis import draw_instances, undrawable
from minidet.categories import BACKGROUND, COCO_CATEGORIES, UNUSED, Classes
from minidet.errors import ConfigError
from minidet.timing import format_table

CHUNKS = ".chunks"
_OUTPUT_KEYS = ("no_vis", "vis_thresh", "mask_alpha", "no_boxes", "no_labels", "classes", "every", "codecs")


def unique_stems(names: list[str]) -> list[str]:
    """Output name per input (its relative path without the extension), with ``_1``, ``_2``... added on collisions."""
    used: set[str] = set()
    stems = []
    for name in names:
        base = os.path.splitext(name)[0] or "image"
        stem, k = base, 0
        while stem in used:
            k += 1
            stem = f"{base}_{k}"
        used.add(stem)
        stems.append(stem)
    return stems


def output_files(stem: str, video: bool, vis: bool) -> list[str]:
    """The files an input's outputs are, relative to ``--output`` (a video's drawing may be .mp4 or .avi)."""
    if video:
        return [stem + ".jsonl"] + ([stem + ".mp4", stem + ".avi"] if vis else [])
    return [stem + ".json"] + ([stem + ".jpg"] if vis else [])


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


def dumps_record(doc: dict) -> str:
    """JSON text of a record with one instance per line (compact but still diff-friendly)."""
    head = json.dumps({k: v for k, v in doc.items() if k != "instances"})[:-1]
    items = ",\n  ".join(json.dumps(inst) for inst in doc["instances"])
    body = f"[\n  {items}\n]" if items else "[]"
    return f'{head}, "instances": {body}}}\n'


def to_record(path: str, image: np.ndarray, out: dict) -> dict:
    """The JSON document for one image's detections."""
    return {"file": path, "height": int(image.shape[0]), "width": int(image.shape[1]),
            "instances": record_instances(out)}


def keep_classes(out: dict, keep: set[int] | None) -> dict:
    """``out`` with only the detections whose class index is in ``keep`` (None: all)."""
    if keep is None:
        return out
    sel = np.isin(out["labels"].numpy(), sorted(keep))
    return {k: (v[sel] if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def draw(image: np.ndarray, out: dict, args: argparse.Namespace) -> np.ndarray:
    """The drawing of one image's detections as ``args`` asks (``no_labels``, ``vis_thresh``, ``mask_alpha``,
    ``no_boxes``)."""
    labels = None if args.no_labels else [out["class_names"][int(k)] for k in out["labels"]]
    masks = out["masks"].numpy() if "masks" in out else None
    return draw_instances(image, out["boxes"].numpy(), out["scores"].numpy(), labels, masks, args.vis_thresh,
                          args.mask_alpha, draw_boxes=not args.no_boxes)


def render(path: str, image: np.ndarray, out: dict, args: argparse.Namespace) -> tuple[dict, bytes | None]:
    """One image's record (:func:`to_record`) and, unless ``args.no_vis``, its drawing as JPEG bytes."""
    record = to_record(path, image, out)
    if args.no_vis:
        return record, None
    ok, jpg = cv2.imencode(".jpg", draw(image, out, args), [cv2.IMWRITE_JPEG_QUALITY, 90])
    if not ok:
        raise RuntimeError("cannot encode the visualization as JPEG")
    return record, jpg.tobytes()


def parse_classes(text: str | None, names: list[str]) -> set[int] | None:
    """The class indices ``--classes`` names (any case), None for all; ConfigError for a name the model lacks."""
    if text is None:
        return None
    real = [(k, n) for k, n in enumerate(names) if n not in (BACKGROUND, UNUSED)]
    lower = {n.lower(): k for k, n in real}
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in wanted if w.lower() not in lower]
    if unknown or not wanted:
        listed = ", ".join(n for _, n in real)
        raise ConfigError(f"--classes: {'no class given' if not wanted else 'unknown class ' + repr(unknown[0])} "
                          f"(the model's classes: {listed})")
    return {lower[w.lower()] for w in wanted}


def _check_results_file(path: str, output: str, names: list[str], guard: InputGuard) -> None:
    """``--results`` must be neither an input nor one of the per-input outputs; its folder must be writable (it is
    made when the run writes the file, not here: a run that fails during set-up leaves no empty folder)."""
    hit = guard.input_at(path)
    if hit is None and os.path.abspath(path) in {os.path.abspath(os.path.join(output, n)) for n in names}:
        hit = "an output of the run"
    elif hit is not None:
        hit = f"the input file {hit}"
    if hit is not None:
        raise OutputError(f"--results {path}: would replace {hit}; choose another name")
    OutputDir(os.path.dirname(path) or ".", "--results", lock=False).close()


class Job(BulkJob):
    """One process's share of an inference run: the set-up (:class:`BulkJob`), the image loop, the videos, the
    chunks."""

    name, unit, chunks = "infer", "inputs", CHUNKS
    restart = True
    alone = staticmethod(is_video)  # a video's frames run in forwards of their own

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.pending = self._empty()
        self.lock = threading.RLock()  # pending, written and the order below: writer threads finish images
        self.order: collections.deque[int] = collections.deque()  # images at the writers, in image order
        self.finished: dict[int, dict | str | None] = {}  # their results, until the earlier ones are in
        self.batch_timing: dict[int, dict] = {}  # a batch's timing, by the id of its last image
        self.futures: collections.deque[Future] = collections.deque()
        self.stream = None
        self.seq = 0
        self.codec: dict[tuple, str | None] = {}
        # each image's forward (:meth:`_forwards`), the images left of each, the forwards partly finished
        self.forward_of: dict[int, int] = {}
        self.forward_left: collections.Counter[int] = collections.Counter()
        self.open_forwards: set[int] = set()

    def inputs(self, cfg) -> tuple[list[tuple[int, str]], dict]:
        """The inputs in sorted path order (ids, shards and the results file follow it), their output names, and
        the outputs checked before anything is created or loaded."""
        args = self.args
        inputs, skipped = self.find_inputs()
        if self.info.is_main:
            for source, entries in skipped.items():
                what = describe_skipped([r for _, r in entries], videos=True)
                print(f"infer: skipped {len(entries)} entries in {source}: {what}")
        inputs.sort()
        self.paths = [p for p, _ in inputs]
        self.rel = {i: rel for i, (_, rel) in enumerate(inputs, 1)}
        self.stems = dict(enumerate(unique_stems([rel for _, rel in inputs]), 1))
        items = list(enumerate(self.paths, 1))
        self.guard = InputGuard(self.paths)
        names = [f for i, p in items for f in output_files(self.stems[i], is_video(p), not args.no_vis)]
        self.guard.check_folder(args.output, names)
        if args.results:
            _check_results_file(args.results, args.output, names, self.guard)
        return items, {
            "config": config_entries(cfg),
            "options": {**{"--" + k.replace("_", "-"): getattr(args, k) for k in _OUTPUT_KEYS},
                        "--results": bool(args.results)},  # whether the chunks hold the records
            "inputs": self.paths,
        }

    def remove_temp_files(self) -> None:
        """Remove the files a killed run was writing (the chunk store cleans its own)."""
        for folder, subfolders, _ in os.walk(self.args.output):
            subfolders[:] = [d for d in subfolders if d != CHUNKS]
            remove_temp_files(folder)

    def load_model(self, cfg, weights: str | None):
        """The Predictor; ``--classes`` named among its classes."""
        predictor = super().load_model(cfg, weights)
        self.use_classes(predictor.classes)
        return predictor

    def use_classes(self, classes: Classes) -> None:
        """The model's classes (for the results file) and the ``--classes`` kept (names among them); one warning for
        the run (rank 0) when labels will be drawn and some of those names have characters the drawing cannot show."""
        self.classes = classes
        self.keep = parse_classes(self.args.classes, list(classes.names))
        if self.info.is_main and not self.args.no_vis and not self.args.no_labels:
            drawn = [n for k, _, n in classes.real() if self.keep is None or k in self.keep]
            if bad := undrawable(drawn):
                shown = ", ".join(map(repr, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
                print(f"warning: the drawings show {len(bad)} class name{'s' if len(bad) > 1 else ''} with '?' for "
                      f"the characters OpenCV {cv2.__version__}'s font lacks: {shown}; the JSON records have the "
                      "names in full", file=sys.stderr)

    def find_inputs(self) -> tuple[list[tuple[str, str]], dict]:
        """The inputs as ``(path, name)`` and what folders left out (see :func:`find_inputs`)."""
        args = self.args
        return find_inputs(args.input, args.recursive, args.input_list, videos=True)

    def complete(self, image_id: int) -> bool:
        """Whether an input's outputs are all there (they are written whole or not at all)."""
        path, vis = self.paths[image_id - 1], not self.args.no_vis
        files = [os.path.join(self.args.output, f) for f in output_files(self.stems[image_id], is_video(path), vis)]
        if is_video(path) and vis:
            return os.path.isfile(files[0]) and (os.path.isfile(files[1]) or os.path.isfile(files[2]))
        return all(os.path.isfile(f) for f in files)

    @staticmethod
    def _empty() -> dict:
        return {"image_ids": [], "instances": [], "skipped": [], "detections": [], "timings": []}

    # ------------------------------------------------------------------ the loop

    def _forwards(self, images: list[tuple[int, str]]) -> None:
        """Note which forward each image runs in: consecutive ``TEST.IMS_PER_BATCH`` of this process's images, as
        the loader (and Ray's blocks) form them. The images of one forward are padded together, and the padded
        size reaches the detections (the RPN ranks anchors over the padding too), so a chunk holds whole forwards
        only: ``--resume`` then runs the forwards left with the images they had in the run it continues."""
        self.forward_of = {i: f for f, group in enumerate(forwards(images, self.cfg.TEST.IMS_PER_BATCH))
                           for i, _ in group}
        self.forward_left = collections.Counter(self.forward_of.values())
        self.open_forwards = set()

    def _finished_one(self, image_id: int) -> None:
        """An image is done or skipped: its forward is open until its last image is (under ``self.lock``)."""
        f = self.forward_of.get(image_id)
        if f is None:  # a video: a forward of its own
            return
        self.forward_left[f] -= 1
        if self.forward_left[f]:
            self.open_forwards.add(f)
        else:
            self.open_forwards.discard(f)

    def loop(self) -> None:
        """This process's images (batched, decoded by the loader's workers, drawn and written by two threads while
        the model runs), then its videos; a chunk is saved as soon as ``--chunk-size`` inputs are finished (their
        files written, by whichever writer thread finishes the last of them)."""
        args, info = self.args, self.info
        images = [(i, p) for i, p in self.share.todo if not is_video(p)]
        videos = [(i, p) for i, p in self.share.todo if is_video(p)]
        if args.results and args.results.endswith(".jsonl"):
            suffix = f".rank{info.rank}.partial" if info.distributed else ".partial"
            os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
            self.stream = open(args.results + suffix, "w", encoding="utf-8")  # closed at the end of the loop
        bar = tqdm(total=len(images), unit="img", file=sys.stderr, disable=(not info.is_main or not images) or None,
                   desc=f"rank 0 of {info.world_size}" if info.distributed else None)
        self._forwards(images)
        files = ImageFiles(images, self.cfg.INPUT.MAX_PIXELS)
        bs = self.cfg.TEST.IMS_PER_BATCH
        try:
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="infer-write") as pool:
                try:
                    for batch in run_batches(self.predictor, files, bs, args.workers, args.debug):
                        for i, error in batch.errors:
                            self._skip(i, error)
                        with self.lock:  # the batch's timing goes into the chunk of its last image
                            self.order.extend(i for i, _, _ in batch.outputs)
                            if batch.outputs:
                                self.batch_timing[batch.outputs[-1][0]] = batch.timing
                        for i, image, out in batch.outputs:
                            write = functools.partial(self._write_image, i, image, self._filter(out))
                            self.futures.append(pool.submit(self._write_task, i, write))
                        self._drain(limit=2 * bs + 2)
                        bar.update(len(batch.outputs) + len(batch.errors))
                    for i, path in videos:
                        self._drain(limit=0)
                        self._video(i, path, pool)
                finally:  # whatever stops the loop, what is finished is written and kept
                    self._drain(limit=0)
        finally:
            self._save()
            bar.close()
            if self.stream is not None:
                self.stream.close()

    def _filter(self, out: dict) -> dict:
        """``out`` with only the ``--classes`` detections."""
        return keep_classes(out, self.keep)

    def _draw(self, image: np.ndarray, out: dict) -> np.ndarray:
        return draw(image, out, self.args)

    def _write_image(self, image_id: int, image: np.ndarray, out: dict) -> dict:
        """In a writer thread: draw, encode and write one image's files; returns its record."""
        return self._write_outputs(image_id, *render(self.paths[image_id - 1], image, out, self.args))

    def _write_outputs(self, image_id: int, record: dict, jpg: bytes | None) -> dict:
        """Write one image's drawing (if any) and JSON document; returns its record."""
        stem = os.path.join(self.args.output, self.stems[image_id])
        if jpg is not None:
            self.guard.write(stem + ".jpg", jpg)
        self.guard.write(stem + ".json", dumps_record(record).encode("utf-8"))
        return record

    def _write_task(self, image_id: int, write: Callable[[], dict]) -> None:
        """In a writer thread: one image's files (``write()``, which returns its record), then its place in the
        chunks (:meth:`_finish`). A full disk stops the run (raised here, to :meth:`_drain`); any other failure is
        this image's, reported."""
        try:
            result: dict | str | None = write()
        except Exception as e:  # noqa: BLE001 - this image's problem: reported, the run goes on
            if self.args.debug:
                traceback.print_exception(e)
            if no_space(e):
                self._finish(image_id, None)
                raise
            result = str(e) if isinstance(e, OutputError) else f"{self.paths[image_id - 1]}: {type(e).__name__}: {e}"
        self._finish(image_id, result)

    def _finish(self, image_id: int, result: dict | str | None) -> None:
        """An image's files are written (``result`` its record), failed (the message) or not done (None): record,
        in image order, every image finished so far; a chunk is saved as soon as one is complete."""
        with self.lock:
            self.finished[image_id] = result
            while self.order and self.order[0] in self.finished:
                i = self.order.popleft()
                result = self.finished.pop(i)
                timing = self.batch_timing.pop(i, None)
                if timing is not None and result is not None:
                    self._timing(timing)
                if isinstance(result, dict):
                    self._done(i, len(result["instances"]), result)
                elif result is not None:
                    self._skip(i, result)

    def _drain(self, limit: int) -> None:
        """Wait for the writes, oldest first, until at most ``limit`` are in flight (a full disk raises here)."""
        while len(self.futures) > limit:
            self.futures.popleft().result()

    def _done(self, image_id: int, n_instances: int, record: dict | None = None) -> None:
        with self.lock:
            self.pending["image_ids"].append(image_id)
            self.pending["instances"].append(n_instances)
            self._finished_one(image_id)
            if record is not None and self.args.results:
                line = {"image_id": image_id, "name": self.rel[image_id], **record}
                self.pending["detections"].append(line)
                if self.stream is not None:
                    self.stream.write(json.dumps(line) + "\n")
                    self.stream.flush()
            self._save(full=True)

    def _skip(self, image_id: int, error: str, incomplete_instances: int | None = None) -> None:
        """An input failed (``error``: one line, printed); ``incomplete_instances``: it is a damaged video whose
        frames read are kept, with that many instances (counted in the summary, :meth:`finish`)."""
        error = " ".join(error.split())
        entry = {"image_id": image_id, "file": self.paths[image_id - 1], "error": error}
        if incomplete_instances is not None:
            entry.update(incomplete=True, instances=incomplete_instances)
        with self.lock:
            self.pending["skipped"].append(entry)
            self._finished_one(image_id)
            tqdm.write(f"error: {error}", file=sys.stderr)
            self._save(full=True)

    def _timing(self, timing: dict) -> None:
        with self.lock:
            if timing["n"]:
                self.pending["timings"].append({"run": self.share.run_id, "rank": self.info.rank, "seq": self.seq,
                                                **timing})
                self.seq += 1

    def _save(self, full: bool = False) -> None:
        """Write the finished and skipped inputs as a chunk (with ``full`` only once ``--chunk-size`` of them are
        there and no forward is partly finished); start anew (memory stays flat). Without ``full`` (the end, or a
        stop) the images of a partly finished forward are left out: ``--resume`` runs that forward again whole."""
        with self.lock:
            if full and self.open_forwards:
                return
            if self.open_forwards:
                self._drop_open_forwards()
            n = len(self.pending["image_ids"]) + len(self.pending["skipped"])
            if n == 0 or (full and n < self.args.chunk_size):
                return
            index = len(self.written)
            self.written.append(self.store.write(self.share.run_id, self.info.rank, index, self.pending))
            self.pending = self._empty()

    def _drop_open_forwards(self) -> None:
        """Take the images of partly finished forwards out of the pending chunk (their files are rewritten, the
        same, when ``--resume`` runs their forward)."""
        p, drop = self.pending, {i for i, f in self.forward_of.items() if f in self.open_forwards}
        kept = [k for k, i in enumerate(p["image_ids"]) if i not in drop]
        p["image_ids"], p["instances"] = [p["image_ids"][k] for k in kept], [p["instances"][k] for k in kept]
        p["detections"] = [d for d in p["detections"] if d["image_id"] not in drop]
        p["skipped"] = [e for e in p["skipped"] if e["image_id"] not in drop]

    # ------------------------------------------------------------------ videos

    def _video(self, video_id: int, path: str, pool: ThreadPoolExecutor) -> None:
        """One video: frames decoded ahead in a thread, run ``TEST.IMS_PER_BATCH`` at a time, drawn in the writer
        threads, records and drawn frames written in order; the outputs are kept only if both are whole. A damaged
        video whose decoding stops before its announced frame count keeps the outputs of the frames read (valid
        as far as they go) but is one ``error:`` line and counts as incomplete, not done: the run's exit status is
        1 and ``--resume`` redoes it, as a failed input."""
        args = self.args
        stem = os.path.join(args.output, self.stems[video_id])
        writer = None
        try:
            reader = VideoReader(path, args.every)
            fps = reader.fps / args.every
            os.makedirs(os.path.dirname(stem), exist_ok=True)
            if not args.no_vis:
                key = (os.path.dirname(stem), reader.size, fps)
                if key not in self.codec:
                    self.codec[key] = working_codec(key[0], reader.size, fps, args.codecs)
                if self.codec[key] is None:
                    raise VideoError(f"{stem}.mp4: no video codec works here (tried {', '.join(args.codecs)}); "
                                     "not written (--no-vis writes the records alone)")
                writer = VideoWriter(stem, self.codec[key], fps, reader.size)
            bar = tqdm(total=-(-reader.frames // args.every) or None, unit="frame", file=STDERR, leave=False,
                       desc=os.path.basename(path), disable=not self.info.is_main or None)
            n_instances = 0
            with atomic_open(stem + ".jsonl") as f, bar:
                frames: list = []
                drawn: collections.deque = collections.deque()
                for item in itertools.chain(reader, [None]):
                    if item is not None:
                        frames.append(item)
                    if frames and (item is None or len(frames) == self.cfg.TEST.IMS_PER_BATCH):
                        t0 = time.perf_counter()
                        outs = self.predictor.predict_batch([frame for _, frame in frames])
                        timing = {"n": len(frames), "data": 0.0, "model": time.perf_counter() - t0,
                                  "stages": dict(outs[0]["timings"])}
                        self._timing(timing)
                        for (k, frame), out in zip(frames, outs):
                            out = self._filter(out)
                            drawn.append(pool.submit(self._frame, k, k / reader.fps, frame, out, writer is not None))
                        frames = []
                    while drawn and (item is None or len(drawn) > 2 * self.cfg.TEST.IMS_PER_BATCH):
                        record, image = drawn.popleft().result()
                        n_instances += len(record["instances"])
                        f.write(json.dumps(record) + "\n")
                        if writer is not None:
                            writer.write(image)
                        bar.update(1)
                if writer is not None:
                    writer.close()
        except BaseException as e:  # noqa: BLE001 - this video's problem: reported, the run goes on
            if writer is not None:
                writer.abort()
            if not isinstance(e, Exception):  # Ctrl-C, SIGTERM: no half-written video is left
                raise
            if args.debug:
                traceback.print_exc()
            known = isinstance(e, (VideoError, OutputError))
            self._skip(video_id, str(e) if known else f"{path}: {type(e).__name__}: {e}")
            return
        if (warning := reader.warning()) is not None:
            tqdm.write(f"warning: {warning}", file=sys.stderr)
        if (short := reader.shortfall()) is not None:
            kept = "records and drawing" if writer is not None else "records"
            # finish() counts it apart from the failed inputs, and the instances of its frames read
            self._skip(video_id, f"{short}; the {kept} of the frames read are kept, --resume redoes it", n_instances)
            return
        self._done(video_id, n_instances)

    def _frame(self, index: int, seconds: float, frame: np.ndarray, out: dict, draw: bool):
        record = {"frame": index, "time": round(seconds, 6),
                  "instances": record_instances(out)}
        return record, (self._draw(frame, out) if draw else None)

    # ------------------------------------------------------------------ rank 0, at the end

    def finish(self, t_loop: float) -> int:
        """Merge every process's chunks, write the results file, report. Returns the exit status."""
        done: dict[int, int] = {}  # image id -> instances
        skipped: dict[int, dict] = {}
        timings = []
        for c in self.store.read_all():  # one at a time: the records are streamed later (_records)
            done.update(zip(c["image_ids"], c["instances"]))
            skipped.update((s["image_id"], s) for s in c["skipped"])
            timings.extend(c["timings"])
        for i in done:
            skipped.pop(i, None)
        missing = [i for i, _ in self.items if i not in done and i not in skipped]
        if missing:
            raise ChunkError(f"{len(missing)} inputs (e.g. {self.paths[missing[0] - 1]}) are in no chunk; "
                             "rerun with --resume")
        if self.args.results:
            self._write_results(done)
        stage_stats, _, timed = timing_summary(timings, self.args.warmup)
        if stage_stats:
            note = f"first {self.args.warmup} batch(es) per process skipped" if len(timed) < len(timings) else ""
            print(format_table(stage_stats, title=f"timing per image{' (' + note + ')' if note else ''}:"))
        this_run = sum(t["n"] for t in timings if t["run"] == self.share.run_id)
        rate = this_run / t_loop if t_loop > 0 else 0.0
        partial = [s for s in skipped.values() if s.get("incomplete")]  # damaged videos: their frames read are kept
        incomplete, instances = len(partial), sum(done.values()) + sum(s.get("instances", 0) for s in partial)
        print(f"infer: {len(self.items)} inputs, {len(skipped) - incomplete} failed"
              f"{f', {incomplete} incomplete' if incomplete else ''}, {instances} instances, "
              f"output in {self.args.output}")
        print(f"infer: this run {this_run} images and video frames in {t_loop:.1f} s: {rate:.2f} per second "
              f"({self.info.world_size} process{'es' if self.info.distributed else ''})")
        if self.args.results:
            print(f"infer: wrote {self.args.results}")
        return 1 if skipped else 0

    def _records(self):
        """Every image record of the chunks in image order, streamed (each process's chunks are in order: merged
        lazily); an image redone by a later run has that run's record."""
        streams: dict[tuple, list[str]] = {}
        for name in self.store.names():
            c = name.split("-")
            streams.setdefault((c[0], c[1]), []).append(name)

        def stream(names):
            for name in names:
                c = self.store.read(name)
                yield from ((r["image_id"], c["run"], r) for r in c["detections"])

        last = None
        for image_id, _, record in heapq.merge(*(stream(n) for n in streams.values()), key=lambda t: t[:2]):
            if last is not None and last[0] != image_id:
                yield last[1]
            last = (image_id, record)
        if last is not None:
            yield last[1]

    def _write_results(self, done: dict[int, int]) -> None:
        """``--results``: every done image's record, in image order, as JSON lines or one COCO results document."""
        path = self.args.results
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # checked, not made, at the start
        with atomic_open(path) as f:
            if path.endswith(".jsonl"):
                for r in self._records():
                    if r["image_id"] in done:
                        f.write(json.dumps({k: v for k, v in r.items() if k != "name"}) + "\n")
            else:
                f.write('{"images": [')
                sep = ""
                for r in self._records():
                    if r["image_id"] in done:
                        image = {"id": r["image_id"], "file_name": r["name"]}
                        f.write(sep + json.dumps({**image, "height": r["height"], "width": r["width"]}))
                        sep = ", "
                f.write('],\n"annotations": [')
                sep = ""
                for r in self._records():
                    if r["image_id"] in done:
                        for inst in r["instances"]:
                            det = {"image_id": r["image_id"], **{k: v for k, v in inst.items() if k != "category_name"}}
                            f.write(sep + "\n" + json.dumps(det))
                            sep = ","
                listed = COCO_CATEGORIES if not self.classes.own else [(i, n) for _, i, n in self.classes.real()]
                cats = [{"id": i, "name": n} for i, n in listed]
                f.write(f"\n],\n\"categories\": {json.dumps(cats)}}}\n")
        for name in os.listdir(os.path.dirname(os.path.abspath(path)) or "."):
            if name.startswith(os.path.basename(path) + ".") and name.endswith(".partial"):
                os.unlink(os.path.join(os.path.dirname(os.path.abspath(path)), name))
