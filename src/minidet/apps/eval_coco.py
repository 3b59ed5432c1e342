"""COCO box and mask AP of a minidet model on a COCO-format dataset, with per-stage timing.

Usage::

    python tools/eval_coco.py --config-file CFG --ann ANN.json --images DIR --output OUT \\
        [--max-images N] [--workers 2] [--warmup 2] [--chunk-size 50] [--resume] [--debug] [KEY VALUE ...]
    python tools/eval_coco.py --ann ANN.json --results RESULTS.json [MORE.json ...] --output OUT [--only-result-images]
    ... [--backend auto|pycocotools|hotcoco|lvis] [--mask-area auto|mask|box]   # either form
    torchrun --nproc_per_node N tools/eval_coco.py --config-file CFG ...   # shards the images

The first form runs the model over the annotation file's images (the first ``N`` by id with
``--max-images``), reading them in ``--workers`` DataLoader processes, ``TEST.IMS_PER_BATCH``
images per forward, and writes to ``OUT``:

- ``coco_instances_results.json``: COCO results (``image_id``, ``category_id``, ``bbox``
  [x, y, w, h], ``score``, ``segmentation`` RLE), sorted by image id, then by decreasing score;
- ``metrics.json``: ``{"bbox": {"stats": [12 COCOeval stats], "AP": ..., ...}, "segm": {...}, "scoring": {...}}``
  (an LVIS file: LVIS's 13 results, ``AP`` ... ``APr``, ``APc``, ``APf`` ... ``ARl@300``); ``scoring`` names the
  backend, its version, the format's rules and the mask size rule;
- ``images.json``: the ids of the evaluated images and the skipped ones with the reason;
- ``timing.json``: seconds per image for each model stage, data loading (time waiting for the
  DataLoader) and RLE encoding (mean, median, std, min, max over the batches after the first
  ``--warmup`` of each process), their totals, the evaluation time and the wall time.

Results are saved as the run goes in ``OUT/chunks/`` (every ``--chunk-size`` images per
process). A run that stops (Ctrl-C, a crash, a killed worker) keeps them; the same command
with ``--resume`` does only the missing images and writes the same results and metrics files
(``timing.json`` then describes the images timed in all runs, and the wall time of the last).
The chunks' manifest, written when the run starts, records the config, the dataset (the annotation
file by content, the images folder, the image ids) and the checkpoint file's size, mtime and SHA-256:
a resumed run with another checkpoint (another file, or one replaced at the same path), config or
dataset is refused with what differs; one only touched or copied resumes. The DataLoader workers die with their process,
however it ends (on Linux, by ``PR_SET_PDEATHSIG``; SIGKILL included).

An image that is missing, truncated, unreadable, not the annotated size or one the model cannot
take (e.g. too elongated for the resize) is reported on one ``error: <file>: ... (skipped)`` line,
left out of the evaluation and counted; the exit status is then 1. A bad config, checkpoint,
annotation or results file stops the run with one ``error:`` line and exit status 2 (``--debug``:
with the traceback); an interrupted run exits with 130 (Ctrl-C), 143 (SIGTERM) or 2 (an error).

The second form evaluates detections made elsewhere: each file may carry ``bbox``,
``segmentation`` or both; ``metrics.json`` gets what they allow. A file that ``infer.py --results
x.json`` wrote (with its own ``images`` list) is matched to the annotation file's images by file
name. COCOeval counts every image of the annotation file: a file with detections of only some of them is told on stderr
(``warning: RESULTS.json: results cover 10 of 80 annotated images; ...``), and
``--only-result-images`` evaluates those images alone (the first form always evaluates the
images it ran, e.g. the first N with ``--max-images``). Under torchrun each process takes every
N-th image and writes its own chunks; rank 0 then merges them, evaluates and writes the files.
``OUT`` must be a folder all processes see (on several nodes: a shared file system). Freed memory
stays in the process for the next image (``--no-keep-memory``: glibc's defaults; ``minidet.memory``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tqdm import tqdm

from minidet.apps import fail, parse_with_overrides, run_app
from minidet.apps.bulk import dist
from minidet.apps.bulk.chunks import ChunkError, config_entries, file_identity, merge_chunks
from minidet.apps.bulk.engines import LocalEngine
from minidet.apps.bulk.job import BulkJob, drive
from minidet.apps.bulk.ledger import timing_summary
from minidet.apps.bulk.loader import ImageFiles, coco_image_files
from minidet.apps.evaluation import (
    IOU_TYPES,
    COCOEvaluator,
    EvaluationError,
    load_coco_annotations,
    load_results,
    match_dataset,
)
from minidet.apps.outputs import options
from minidet.apps.outputs.fileio import OutputDir, remove_temp_files, write_json
from minidet.apps.outputs.options import MASK_FORMATS
from minidet.apps.scoring import CHOICES, LVIS_MAX_DETS, LVIS_SCORE_THRESH, MASK_AREAS, Scorer, Scores, stage_line
from minidet.families import FAMILIES
from minidet.timing import format_table

RESULTS_FILE = "coco_instances_results.json"


def parse_args(argv: list[str] | None = None, prog: str = "eval_coco.py") -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog=prog, description="COCO box and mask AP with per-stage timing.")
    p.add_argument("--config-file", metavar="CFG", help="yaml config file of the model")
    p.add_argument("--ann", required=True, metavar="ANN.json", help="COCO instances annotation file")
    p.add_argument("--images", metavar="DIR", help="folder of the annotation file's images")
    p.add_argument("--output", required=True, metavar="OUT", help="output folder (created if needed)")
    p.add_argument("--results", nargs="+", metavar="RESULTS.json", help="evaluate these COCO results files instead")
    p.add_argument("--only-result-images", action="store_true",
                   help="with --results: evaluate only the images that have detections in the file")
    p.add_argument("--mask-format", choices=MASK_FORMATS, default="rle",
                   help="masks in the results file: COCO RLE (exact), COCO polygons (outlines, holes filled; scored "
                        "as pycocotools rasterizes them) or none (boxes only)")
    p.add_argument("--backend", choices=CHOICES, default="auto",
                   help="what scores the detections: auto (the fastest installed: hotcoco, else pycocotools for COCO, "
                        "the LVIS API for LVIS), each proven equal to its format's reference API")
    p.add_argument("--mask-area", choices=("auto", *MASK_AREAS), default="auto",
                   help="size of a mask result for APs/APm/APl: its mask's area (detectron2, torchvision) or its box's "
                        "(mmdetection); auto: the model family's rule (mask for --results)")
    p.add_argument("--max-images", type=int, metavar="N", help="only the first N images (by id)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per process (0: none)")
    p.add_argument("--warmup", type=int, default=2, help="batches per process left out of the timing statistics")
    p.add_argument("--chunk-size", type=int, default=50, help="images per saved result chunk")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in OUT")
    p.add_argument("--debug", action="store_true", help="print tracebacks for errors")
    p.add_argument("--keep-memory", action=argparse.BooleanOptionalAction, default=True,
                   help="keep freed memory in the process for reuse (no page faults; it keeps its peak memory)")
    p.add_argument("opts", nargs=argparse.REMAINDER, metavar="KEY VALUE", help="config overrides")
    # overrides are taken as they are (e.g. MODEL.FROZEN_BN_EPS -1e-5), options may follow them
    args = parse_with_overrides(p, argv, lists=("results",))
    if args.results:
        extra = [f for f, v in [("--config-file", args.config_file), ("--images", args.images),
                                ("--max-images", args.max_images), ("--resume", args.resume),
                                ("KEY VALUE overrides", args.opts)] if v]
        if extra:
            p.error(f"--results evaluates existing detections; {', '.join(extra)} do not apply")
    elif not (args.config_file and args.images):
        p.error("give --config-file and --images (to run a model) or --results (to evaluate detections)")
    if args.max_images is not None and args.max_images < 1:
        p.error("--max-images must be >= 1")
    if args.workers < 0 or args.warmup < 0 or args.chunk_size < 1:
        p.error("need --workers >= 0, --warmup >= 0, --chunk-size >= 1")
    args.options = options.from_args(args, p)  # --mask-format; the run's OutputOptions
    return args


def _metric_line(iou_type: str, m: dict) -> str:
    return f"eval_coco: {iou_type} " + " ".join(f"{k} {v:.4f}" for k, v in m.items() if k != "stats")


def _report_scoring(scores: Scores, sources: dict[str, str] | None = None) -> None:
    """Print each table with what scored it (and from which file), the stage times, the metric lines."""
    for t in scores.metrics:
        where = f", {sources[t]}" if sources else ""
        print(f"{t} ({scores.describe(t)}{where}):\n{scores.tables[t]}")
    for t in scores.metrics:
        print(f"eval_coco: scoring {t}: {stage_line(scores, t)}")
    for t, m in scores.metrics.items():
        print(_metric_line(t, m))


def _metrics_document(scores: Scores) -> dict:
    """metrics.json: the metrics per IoU type and what scored them (no times: the same scoring writes the same
    file)."""
    ident = {k: v for k, v in scores.identity().items() if k != "stages_s"}
    return {**scores.metrics, "scoring": ident}


def _report_coverage(path: str, results: list[dict], n_images: int, only_those: bool) -> set[int]:
    """The images ``results`` has detections of; says so on stderr when that is not all of them."""
    ids = {r["image_id"] for r in results}
    if len(ids) < n_images:
        what = (
            "only those are evaluated (--only-result-images)" if only_those else
            f"the other {n_images - len(ids)} count as images without detections "
            f"(--only-result-images evaluates the {len(ids)} alone)"
        )
        print(f"warning: {path}: results cover {len(ids)} of {n_images} annotated images; {what}", file=sys.stderr)
    return ids


def _lvis_config_note(cfg) -> None:
    """LVIS scores each image's 300 best detections from scores of 0.0001 (its configs' test settings); a config
    that keeps fewer is named on stderr (its AP is the model's under that config, not the LVIS configs')."""
    heads = cfg.MODEL.ROI_HEADS
    if heads.DETECTIONS_PER_IMAGE < LVIS_MAX_DETS or heads.SCORE_THRESH_TEST > LVIS_SCORE_THRESH:
        print(f"warning: LVIS is scored on up to {LVIS_MAX_DETS} detections per image with scores from "
              f"{LVIS_SCORE_THRESH} (the LVIS configs' MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE and SCORE_THRESH_TEST); "
              f"this config keeps {heads.DETECTIONS_PER_IMAGE} from {heads.SCORE_THRESH_TEST}, which lowers the AP",
              file=sys.stderr)


def evaluate_results_files(args: argparse.Namespace) -> int:
    """The ``--results`` form: validate the files, say how many images they cover, score them (over every image
    of the annotation file, or those with detections), write ``metrics.json`` and ``timing.json``."""
    coco_gt = load_coco_annotations(args.ann)
    scorer = Scorer(coco_gt, args.backend, "mask" if args.mask_area == "auto" else args.mask_area, args.ann)
    by_type: dict[str, tuple[str, list]] = {}
    known = set(coco_gt.getCatIds())
    covered: dict[str, set[int]] = {}  # results file -> the images it has detections of
    for path in args.results:
        results, types = load_results(path, coco_gt)
        covered[path] = _report_coverage(path, results, len(coco_gt.imgs), args.only_result_images)
        unknown = [r["category_id"] for r in results if r["category_id"] not in known]
        if unknown:  # COCOeval evaluates the annotation file's categories only
            print(
                f"warning: {path}: {len(unknown)} detections of categories that are not in {args.ann} "
                f"(e.g. {unknown[0]}) are left out",
                file=sys.stderr,
            )
        for t in types:
            if t in by_type:
                raise EvaluationError(f"{path}: {t} results already given by {by_type[t][0]}")
            by_type[t] = (path, results)
    t0 = time.perf_counter()
    scores = scorer.score([], [])  # the backend and rules, no IoU type yet
    for t in IOU_TYPES:
        if t in by_type:
            ids = covered[by_type[t][0]] if args.only_result_images else None
            scores.add(scorer.score(by_type[t][1], [t], ids))
    t_eval = time.perf_counter() - t0
    write_json(os.path.join(args.output, "metrics.json"), _metrics_document(scores), indent=1)  # OUT: prepare_folders
    write_json(os.path.join(args.output, "timing.json"), {"scoring": scores.identity(), "eval_s": t_eval}, indent=1)
    _report_scoring(scores, {t: path for t, (path, _) in by_type.items()})
    print(f"eval_coco: wrote {os.path.join(args.output, 'timing.json')}")
    print(f"eval_coco: wrote {os.path.join(args.output, 'metrics.json')}")
    return 0


class Run(BulkJob):
    """One process's share of a model evaluation: the set-up (:class:`BulkJob`), the image loop, the chunks."""

    name, unit, chunks = "eval_coco", "images", "chunks"

    def __init__(self, args: argparse.Namespace) -> None:
        if args.only_result_images:
            raise EvaluationError("--only-result-images applies to --results (a model run evaluates the images it ran)")
        self.engine = LocalEngine(args)
        super().__init__(args)
        self.evaluator = COCOEvaluator(self.coco_gt, self.options.mask_format)

    def inputs(self, cfg) -> tuple[list[tuple[int, str]], dict]:
        """The annotation file's images (the first ``--max-images`` by id), its categories checked."""
        args = self.args
        self.coco_gt = load_coco_annotations(args.ann)
        family_rule = FAMILIES[cfg.MODEL.CONVENTION].mask_area
        self.scorer = Scorer(self.coco_gt, args.backend, family_rule if args.mask_area == "auto" else args.mask_area,
                             args.ann)
        if self.scorer.format == "lvis" and dist.from_env().is_main:
            _lvis_config_note(cfg)
        files = coco_image_files(self.coco_gt.dataset["images"], args.images)[: args.max_images]
        self.files = dict(files)
        mask_format = self.options.mask_format
        if cfg.MODEL.MASK_ON and mask_format != "none":  # refused now, not after the model's run
            self.scorer.check_masks(" (--mask-format none scores the boxes alone)")
        fmt = {"mask format": mask_format} if mask_format != "rle" else {}  # resumed only in one format
        return files, {"images": os.path.abspath(args.images), "image ids": [i for i, _ in files],
                       "config": config_entries(cfg), **fmt}

    def input_files(self) -> dict:
        return {"annotations": file_identity(self.args.ann)}

    def load_model(self, cfg, weights: str | None):
        """The Predictor (the local engine's), its classes mapped to the dataset's categories
        (:func:`match_dataset`)."""
        predictor = self.local_model(cfg, weights)
        predictor.classes = match_dataset(predictor.classes, self.coco_gt, self.args.ann, cfg.MODEL.CATEGORY_LAYOUT)
        self.engine.predictor = predictor
        return predictor

    def remove_temp_files(self) -> None:
        remove_temp_files(self.args.output)  # of a run killed while writing the final files

    def loop(self) -> None:
        """Run the model over this process's images (the local engine), the results kept in the evaluator; the
        ledger saves them as a chunk every ``--chunk-size`` images."""
        info, ledger, ev = self.info, self.ledger, self.evaluator
        sizes = {i: (self.coco_gt.imgs[i]["height"], self.coco_gt.imgs[i]["width"]) for i, _ in self.share.todo}
        files = ImageFiles(self.share.todo, self.cfg.INPUT.MAX_PIXELS, sizes)
        bar = tqdm(
            total=len(self.share.todo),
            unit="img",
            file=sys.stderr,
            disable=not info.is_main or None,
            desc=f"rank 0 of {info.world_size}" if info.distributed else None,
        )
        try:
            for batch in self.engine.batches(files, self.cfg.TEST.IMS_PER_BATCH):
                for i, error in batch.errors:
                    ledger.skip({"image_id": i, "file": self.files[i], "error": error}, save=False)
                    tqdm.write(f"error: {error} (skipped)", file=sys.stderr)
                if batch.outputs:
                    t0 = time.perf_counter()
                    ev.process([i for i, _, _ in batch.outputs], [o for _, _, o in batch.outputs])
                    ledger.timing({**batch.timing, "encode": time.perf_counter() - t0})  # masks become RLE here
                bar.update(len(batch.outputs) + len(batch.errors))
                self._save(full=True)
        finally:  # whatever stops the loop, what is finished is kept
            self._save()
            bar.close()

    def _save(self, full: bool = False) -> None:
        """The evaluator's images and results, and the ledger's skips and timings, as a chunk (``full``: once
        ``--chunk-size`` images are finished); the evaluator emptied once saved (memory stays flat)."""
        ev = self.evaluator
        if self.ledger.save(full, image_ids=ev.image_ids, dropped=ev.dropped, detections=ev.results):
            ev.reset()


def finish(run: Run, t_start: float, t_loop: float) -> int:
    """Rank 0: merge every process's chunks, write the results, evaluate, report. Returns the status."""
    args, cfg = run.args, run.cfg
    merged = merge_chunks(run.store.read_all())
    missing = set(run.files) - set(merged.image_ids) - set(merged.skipped)
    if missing:
        raise ChunkError(f"{len(missing)} images (e.g. id {min(missing)}) are in no result chunk; rerun with --resume")
    evaluator = COCOEvaluator(run.coco_gt)
    evaluator.extend(merged.image_ids, merged.results, merged.dropped)
    results = evaluator.sorted_results()
    out = args.output
    write_json(os.path.join(out, RESULTS_FILE), results)
    t0 = time.perf_counter()
    segm = cfg.MODEL.MASK_ON and run.options.mask_format != "none"
    evaluator.evaluate(("bbox", "segm") if segm else ("bbox",), run.scorer)
    scores = evaluator.scores
    t_eval = time.perf_counter() - t0
    skipped = [merged.skipped[i] for i in sorted(merged.skipped)]
    write_json(os.path.join(out, "metrics.json"), _metrics_document(scores), indent=1)
    write_json(os.path.join(out, "images.json"), {"evaluated": sorted(merged.image_ids), "skipped": skipped}, indent=1)

    stage_stats, pipe_stats, timed = timing_summary(merged.timings, args.warmup)
    totals = {k: sum(r[k] for r in merged.timings) for k in ("data", "model", "encode")}
    this_run = merged.images_per_run.get(run.share.run_id, 0)
    wall = time.perf_counter() - t_start
    timing = {
        "device": cfg.MODEL.DEVICE,
        "world_size": run.info.world_size,
        "ims_per_batch": cfg.TEST.IMS_PER_BATCH,
        "warmup_batches_per_process": args.warmup,
        "images": len(run.files),
        "images_evaluated": len(merged.image_ids),
        "images_skipped": len(skipped),
        "images_timed": sum(r["n"] for r in timed),
        "units": "seconds per image; n counts batches",
        "stages": stage_stats,
        "pipeline": pipe_stats,
        "totals_s": {**totals, "eval": t_eval},
        "scoring": scores.identity(),
        "last_run": {"images": this_run, "loop_s": t_loop, "wall_s": wall,
                     "images_per_s": this_run / t_loop if t_loop > 0 else 0.0},
        "runs": len(merged.images_per_run),
    }
    write_json(os.path.join(out, "timing.json"), timing, indent=1)

    skipped_warmup = len(timed) < len(merged.timings)
    skip_note = f"first {args.warmup} batch(es) per process skipped" if skipped_warmup else "none skipped"
    if stage_stats:
        print(format_table(stage_stats, title=f"model stages per image ({skip_note}):"))
    print(format_table(pipe_stats, title="per image: waiting for data, model, RLE encoding:"))
    print(
        f"eval_coco: images {len(run.files)} | evaluated {len(merged.image_ids)} | skipped {len(skipped)} | "
        f"detections {len(results)} | dropped {merged.dropped} (categories not in the annotation file)"
    )
    _report_scoring(scores)
    print(
        f"eval_coco: time wall {wall:.1f} s | this run {this_run} images in {t_loop:.1f} s "
        f"({timing['last_run']['images_per_s']:.2f} img/s) | data {totals['data']:.1f} s | "
        f"model {totals['model']:.1f} s | encode {totals['encode']:.1f} s | eval {t_eval:.1f} s"
    )
    names = (RESULTS_FILE, "metrics.json", "images.json", "timing.json")
    print(f"eval_coco: wrote {' '.join(os.path.join(out, n) for n in names)}")
    return 1 if skipped else 0


def evaluate_model(args: argparse.Namespace) -> int:
    """The model form: set up, loop over this process's images, then rank 0 finishes."""
    t_start = time.perf_counter()  # wall time: model loading included, Python imports not
    run = Run(args)  # a set-up error is run_app's one line
    return drive(run, lambda message: fail(message, args.debug), "OUT", lambda t_loop: finish(run, t_start, t_loop))


def main(argv: list[str] | None = None, prog: str = "eval_coco.py") -> int:
    """Run the tool; return the exit status (0 ok, 1 images skipped, 2 error, 130 Ctrl-C, 143 SIGTERM)."""
    args = parse_args(argv, prog)
    # OUT locked for the run (by rank 0; an empty OUT made here is removed); libjpeg / libpng lines only with
    # --debug (loader workers inherit the setting)
    body = evaluate_results_files if args.results else evaluate_model
    return run_app(args, lambda: prepare_folders(args), lambda: body(args))


def prepare_folders(args: argparse.Namespace) -> OutputDir:
    """Check ``--images`` and ``--output`` once, before anything is loaded, and lock ``--output``
    against a second run; under torchrun only rank 0 (``RANK`` in the environment) takes the lock,
    the other ranks write into the same folder."""
    if args.images is not None and not os.path.isdir(args.images):
        what = "not a folder" if os.path.exists(args.images) else "no such folder"
        raise NotADirectoryError(f"--images {args.images}: {what}")
    return OutputDir(args.output, "--output", lock=dist.from_env().is_main)


if __name__ == "__main__":
    sys.exit(main())
