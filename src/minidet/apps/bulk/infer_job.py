"""``minidet infer``'s job (:class:`Job`): the set-up of :class:`~minidet.apps.bulk.job.BulkJob`, the loop that takes
an engine's forwards (this process's model, or Ray's actors: ``engines``) and hands each output to the ordered
writer, the videos, the results file; the per-image records and drawings are ``minidet.apps.outputs.records``'.
``minidet.apps.infer`` is the program around it."""

from __future__ import annotations

import argparse
import collections
import functools
import heapq
import itertools
import json
import os
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
from tqdm import tqdm

from minidet.apps.bulk import sliced
from minidet.apps.bulk.chunks import ChunkError, config_entries
from minidet.apps.bulk.engines import LocalEngine
from minidet.apps.bulk.inputs import describe_skipped
from minidet.apps.bulk.job import BulkJob
from minidet.apps.bulk.ledger import timing_summary
from minidet.apps.bulk.writer import InputGuard, OrderedWriter
from minidet.apps.outputs.fileio import OutputDir, OutputError, atomic_open, remove_temp_files
from minidet.apps.outputs.instances import record_instances
from minidet.apps.outputs.records import draw, dumps_record, keep_classes
from minidet.apps.outputs.video import STDERR, VideoError, VideoReader, VideoWriter, is_video, working_codec
from minidet.apps.outputs.vis import undrawable
from minidet.categories import COCO_CATEGORIES, Classes
from minidet.timing import format_table

CHUNKS = ".chunks"
_OUTPUT_KEYS = ("no_vis", "vis_thresh", "mask_alpha", "no_boxes", "no_labels", "classes", "every", "codecs",
                "mask_format", "polygon_tolerance", *sliced.KEYS)


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
    """One process's share of an inference run: the set-up (:class:`BulkJob`), the loop over ``engine``'s forwards
    (default: :class:`~minidet.apps.bulk.engines.LocalEngine`), the videos, the results file."""

    name, unit, chunks = "infer", "inputs", CHUNKS
    restart = True
    alone = staticmethod(is_video)  # a video's frames run in forwards of their own

    def __init__(self, args: argparse.Namespace, engine=None) -> None:
        self.engine = engine if engine is not None else LocalEngine(args)
        try:
            super().__init__(args)
        except BaseException:
            self.engine.close()  # a cluster joined during the set-up
            raise
        self.codec: dict[tuple, str | None] = {}

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
        names = [f for i, p in items for f in output_files(self.stems[i], is_video(p), not self.options.no_vis)]
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
        """What runs the images (``engine.load``: this process's Predictor, or a cluster's actors); the model's
        classes named (:meth:`use_classes`)."""
        return self.engine.load(self, cfg, weights)

    def use_classes(self, classes: Classes) -> None:
        """The model's classes (for the results file) and the ``--classes`` kept (names among them); one warning for
        the run (rank 0) when labels will be drawn and some of those names have characters the drawing cannot show."""
        self.classes = classes
        self.keep = self.options.keep(classes.names)
        if self.info.is_main and not self.options.no_vis and not self.options.no_labels:
            drawn = [n for k, _, n in classes.real() if self.keep is None or k in self.keep]
            if bad := undrawable(drawn):
                shown = ", ".join(map(repr, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
                print(f"warning: the drawings show {len(bad)} class name{'s' if len(bad) > 1 else ''} with '?' for "
                      f"the characters OpenCV {cv2.__version__}'s font lacks: {shown}; the JSON records have the "
                      "names in full", file=sys.stderr)

    def find_inputs(self) -> tuple[list[tuple[str, str]], dict]:
        """The inputs as ``(path, name)`` and what folders left out (the engine's: paths, or URIs too)."""
        return self.engine.find_inputs(self.args)

    def complete(self, image_id: int) -> bool:
        """Whether an input's outputs are all there (they are written whole or not at all)."""
        path, vis = self.paths[image_id - 1], not self.options.no_vis
        files = [os.path.join(self.args.output, f) for f in output_files(self.stems[image_id], is_video(path), vis)]
        if is_video(path) and vis:
            return os.path.isfile(files[0]) and (os.path.isfile(files[1]) or os.path.isfile(files[2]))
        return all(os.path.isfile(f) for f in files)

    # ------------------------------------------------------------------ the loop

    def loop(self) -> None:
        """This process's images through the engine, forward after forward; each output's files written by two
        writer threads while the next forward runs, and handed to the ledger in input order (a chunk saved as soon
        as ``--chunk-size`` inputs are finished, whole forwards only); then its videos."""
        args, info, ledger = self.args, self.info, self.ledger
        images = [(i, p) for i, p in self.share.todo if not is_video(p)]
        videos = [(i, p) for i, p in self.share.todo if is_video(p)]
        if args.results and args.results.endswith(".jsonl"):
            suffix = f".rank{info.rank}.partial" if info.distributed else ".partial"
            os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
            ledger.stream = open(args.results + suffix, "w", encoding="utf-8")  # closed at the end of the loop
        bar = tqdm(total=len(images), unit="img", file=sys.stderr, disable=(not info.is_main or not images) or None,
                   desc=f"rank 0 of {info.world_size}" if info.distributed else None)
        ledger.plan(images, self.cfg.TEST.IMS_PER_BATCH)
        tiles = sliced.TileReport(self.name, bar, len(images), info.is_main)
        self.on_plan, self.on_tile = tiles.plan, tiles.tile
        limit = 2 * self.cfg.TEST.IMS_PER_BATCH + 2
        try:
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="infer-write") as pool:
                writer = OrderedWriter(pool, ledger.lock, self._done_record, self._skip, ledger.timing,
                                       lambda i: self.paths[i - 1], args.debug)
                try:
                    for forward in self.engine.forwards(self, images):
                        for line in forward.warnings:
                            tqdm.write(f"warning: {line}", file=sys.stderr)
                        for i, error in forward.errors:
                            self._skip(i, error)
                        if forward.timing is not None and not forward.outputs:  # no image to carry it
                            ledger.timing(forward.timing)
                        writer.expect([i for i, _ in forward.outputs], forward.timing)
                        for i, output in forward.outputs:
                            writer.submit(i, functools.partial(self._write_outputs, i, output))
                        writer.drain(limit)
                        bar.update(len(forward.outputs) + len(forward.errors))
                    for i, path in videos:
                        writer.drain(limit=0)
                        if self.engine.videos:
                            self._video(i, path, pool)
                        else:
                            self._skip(i, f"{path}: videos run with --engine local only")
                finally:  # whatever stops the loop, what is finished is written and kept
                    writer.drain(limit=0)
        finally:
            try:
                ledger.save()
                bar.close()
                if ledger.stream is not None:
                    ledger.stream.close()
            finally:
                self.engine.close()

    def _write_outputs(self, image_id: int, output) -> dict:
        """In a writer thread: one image's record and drawing (``output()``), its files written; returns its
        record."""
        record, jpg = output()
        stem = os.path.join(self.args.output, self.stems[image_id])
        if jpg is not None:
            self.guard.write(stem + ".jpg", jpg)
        self.guard.write(stem + ".json", dumps_record(record).encode("utf-8"))
        return record

    def _done_record(self, image_id: int, record: dict) -> None:
        """An image's files are written: the ledger has it, and its record for the results file."""
        self._done(image_id, len(record["instances"]), record)

    def _done(self, image_id: int, n_instances: int, record: dict | None = None) -> None:
        line = {"image_id": image_id, "name": self.rel[image_id], **record} if record and self.args.results else None
        self.ledger.done(image_id, n_instances, line)

    def _skip(self, image_id: int, error: str, incomplete_instances: int | None = None) -> None:
        """An input failed (``error``: one line, printed); ``incomplete_instances``: it is a damaged video whose
        frames read are kept, with that many instances (counted in the summary, :meth:`finish`)."""
        error = " ".join(error.split())
        entry = {"image_id": image_id, "file": self.paths[image_id - 1], "error": error}
        if incomplete_instances is not None:
            entry.update(incomplete=True, instances=incomplete_instances)
        with self.ledger.lock:
            self.ledger.skip(entry)
            tqdm.write(f"error: {error}", file=sys.stderr)

    def _filter(self, out: dict) -> dict:
        """``out`` with only the ``--classes`` detections."""
        return keep_classes(out, self.keep)

    def _draw(self, image: np.ndarray, out: dict) -> np.ndarray:
        return draw(image, out, self.options)

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
            if not self.options.no_vis:
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
                        self.ledger.timing(timing)
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
                  "instances": record_instances(out, self.options.mask_format, self.options.tolerance)}
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
