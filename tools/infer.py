"""Run a minidet Mask R-CNN on image files; write a visualization and a COCO-style JSON per image.

Usage::

    python tools/infer.py --config-file CFG --input PATH [PATH ...] --output DIR \\
        [--vis-thresh 0.5] [--warmup 1] [--debug] [KEY VALUE ...]

``PATH`` is an image file, a folder (its images, not recursive) or a quoted glob pattern.
Trailing ``KEY VALUE`` pairs override the config, e.g. ``MODEL.DEVICE cuda``.

For each input ``DIR/<stem>.jpg`` (drawing) and ``DIR/<stem>.json`` are written; two inputs
with the same stem get ``<stem>_1`` etc. An image that cannot be read or run is reported on
one ``error: <file>: <what>`` line and skipped; the exit status is then 1. Bad configs,
weights or arguments stop the run with one ``error:`` line and exit status 2 (``--debug``
adds the traceback); Ctrl-C stops it with exit status 130, every output already written being
complete (files are written to a temporary name and renamed). At the end a per-stage timing
table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
from pathlib import Path

try:
    import minidet
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import minidet

import cv2
import numpy as np
from tqdm import tqdm

from minidet.checkpoint import CheckpointError
from minidet.config import ConfigError
from minidet.fileio import atomic_write
from minidet.imageio import ImageReadError, list_images, read_image
from minidet.rle import encode_masks, xyxy_to_xywh
from minidet.timing import format_table, summarize
from minidet.vis import draw_instances

PROGRESS_MIN_IMAGES = 4
_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)+$")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="infer.py",
        description="Mask R-CNN inference on images: writes <stem>.jpg and <stem>.json per image.",
    )
    p.add_argument("--config-file", required=True, metavar="CFG", help="yaml config file")
    p.add_argument("--input", required=True, nargs="+", metavar="PATH", help="image files, folders or globs")
    p.add_argument("--output", required=True, metavar="DIR", help="output folder (created if needed)")
    p.add_argument("--vis-thresh", type=float, default=0.5, help="draw instances scoring at least this")
    p.add_argument("--warmup", type=int, default=1, help="images left out of the timing statistics")
    p.add_argument("--debug", action="store_true", help="print tracebacks for errors")
    p.add_argument("opts", nargs=argparse.REMAINDER, metavar="KEY VALUE", help="config overrides")
    args = p.parse_args(argv)
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    # "--input a.jpg MODEL.DEVICE cuda": --input swallowed the overrides; give them back.
    for i, item in enumerate(args.input):
        if i > 0 and _KEY_RE.match(item) and not os.path.exists(item):
            args.opts = args.input[i:] + args.opts
            args.input = args.input[:i]
            break
    return args


def unique_stems(paths: list[str]) -> list[str]:
    """Output base name per input: the file stem, with ``_1``, ``_2``... added on collisions."""
    used: set[str] = set()
    stems = []
    for path in paths:
        base = Path(path).stem or "image"
        stem, k = base, 0
        while stem in used:
            k += 1
            stem = f"{base}_{k}"
        used.add(stem)
        stems.append(stem)
    return stems


def dumps_record(doc: dict) -> str:
    """JSON text of a record with one instance per line (compact but still diff-friendly)."""
    head = json.dumps({k: v for k, v in doc.items() if k != "instances"})[:-1]
    items = ",\n  ".join(json.dumps(inst) for inst in doc["instances"])
    body = f"[\n  {items}\n]" if items else "[]"
    return f'{head}, "instances": {body}}}\n'


def to_record(path: str, image: np.ndarray, out: dict, class_names: list[str], box_offset: int = 0) -> dict:
    """The JSON document for one image's detections."""
    boxes = out["boxes"].numpy()
    scores = out["scores"].numpy()
    labels = out["labels"].numpy()
    cat_ids = out["category_ids"].numpy()
    rles = encode_masks(out["masks"].numpy()) if "masks" in out else None
    instances = []
    for i, box in enumerate(xyxy_to_xywh(boxes, box_offset)):
        inst = {
            "bbox": box,
            "score": float(scores[i]),
            "category_id": int(cat_ids[i]),
            "category_name": class_names[int(labels[i])],
        }
        if rles is not None:
            inst["segmentation"] = rles[i]
        instances.append(inst)
    return {"file": path, "height": int(image.shape[0]), "width": int(image.shape[1]), "instances": instances}


def _fail(message: str, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run the tool; return the process exit status (0 ok, 1 some images failed, 2 setup error)."""
    args = parse_args(argv)
    if not args.debug:
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    try:
        cfg = minidet.get_cfg()
        cfg.merge_from_file(args.config_file)
        cfg.merge_from_list(args.opts)
        paths = list_images(args.input)
        os.makedirs(args.output, exist_ok=True)
        predictor = minidet.Predictor(cfg)
    except (ConfigError, CheckpointError, OSError) as e:
        return _fail(str(e), args.debug)
    except KeyboardInterrupt:
        _fail("interrupted", args.debug)
        return 130
    except Exception as e:  # noqa: BLE001 - any other setup failure: still one line without --debug
        hint = "" if args.debug else " (rerun with --debug for the traceback)"
        return _fail(f"{type(e).__name__}: {e}{hint}", args.debug)

    stems = unique_stems(paths)
    records: list[dict[str, float]] = []
    failed = 0
    n_instances = 0
    bar = tqdm(paths, file=sys.stderr, unit="img", disable=None) if len(paths) >= PROGRESS_MIN_IMAGES else None
    seen = 0
    try:
        for path, stem in zip(bar if bar is not None else paths, stems):
            seen += 1
            try:
                image = read_image(path, cfg.INPUT.MAX_PIXELS)
                out = predictor(image)
                doc = to_record(path, image, out, predictor.class_names, predictor.box_offset)
                labels = [predictor.class_names[int(k)] for k in out["labels"]]
                masks = out["masks"].numpy() if "masks" in out else None
                boxes, scores = out["boxes"].numpy(), out["scores"].numpy()
                vis = draw_instances(image, boxes, scores, labels, masks, args.vis_thresh)
                ok, jpg = cv2.imencode(".jpg", vis, [cv2.IMWRITE_JPEG_QUALITY, 90])
                if not ok:
                    raise RuntimeError("cannot encode the visualization as JPEG")
                atomic_write(os.path.join(args.output, f"{stem}.jpg"), jpg.tobytes())
                atomic_write(os.path.join(args.output, f"{stem}.json"), dumps_record(doc).encode("utf-8"))
            except Exception as e:  # noqa: BLE001 - one bad image must not stop the batch
                failed += 1
                if args.debug:
                    traceback.print_exc()
                what = str(e) if isinstance(e, ImageReadError) else f"{path}: {type(e).__name__}: {e}"
                tqdm.write(f"error: {' '.join(what.split())}", file=sys.stderr)
                continue
            n_instances += len(doc["instances"])
            if out.get("timings"):
                records.append(out["timings"])
    except KeyboardInterrupt:  # Ctrl-C: what is written is complete (atomic writes); say so, no traceback
        if bar is not None:
            bar.close()
        _fail(f"interrupted at image {seen} of {len(paths)}; the outputs written so far are complete", args.debug)
        return 130

    if records:
        skipped = args.warmup if len(records) > args.warmup else 0
        print(format_table(summarize(records, skip=args.warmup), title=f"timing (first {skipped} skipped):"))
    print(f"infer: {len(paths)} images, {failed} failed, {n_instances} instances, output in {args.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
