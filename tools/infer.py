"""Run a minidet Mask R-CNN on image files; write a visualization and a COCO-style JSON per image.

Usage::

    python tools/infer.py --config-file CFG --input PATH [PATH ...] --output DIR \\
        [--vis-thresh 0.5] [--warmup 1] [--debug] [KEY VALUE ...]

``PATH`` is an image file, a folder (its images, not recursive) or a quoted glob pattern.
Trailing ``KEY VALUE`` pairs override the config, e.g. ``MODEL.DEVICE cuda``.

For each input ``DIR/<stem>.jpg`` (drawing) and ``DIR/<stem>.json`` are written; two inputs
with the same stem get ``<stem>_1`` etc. An output folder where one of these would replace an
input file, one that cannot be created or written, or one another run is writing into (a lock
file ``DIR/.minidet.lock`` is held during the run) is refused before the model loads. A folder
input's entries that are not image files (other extensions, dangling links, symlink loops,
folders named like images) are counted on one ``infer: skipped ...`` line. An image that
cannot be read or run (a folder named ``x.jpg`` given as an input too) is reported on one
``error: <file>: <what>`` line and skipped; the exit status is then 1. Bad configs,
weights or arguments stop the run with one ``error:`` line and exit status 2 (``--debug``
adds the traceback); Ctrl-C stops it with exit status 130, every output already written being
complete (files are written to a temporary name and renamed). At the end a per-stage timing
table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
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
from minidet.config import ConfigError, validate_cfg
from minidet.fileio import OutputDir, OutputError, atomic_write
from minidet.imageio import ImageReadError, describe_skipped, find_images, native_messages, read_image
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

    def check_folder(self, folder: str, stems: list[str]) -> None:
        """Raise :class:`OutputError` naming ``--output`` and the first input an output would replace."""
        for stem in stems:
            for ext in (".jpg", ".json"):
                hit = self.input_at(os.path.join(folder, stem + ext))
                if hit is not None:
                    raise OutputError(
                        f"--output {folder}: {stem}{ext} would replace the input file {hit}; choose another folder"
                    )

    def write(self, path: str, data: bytes) -> None:
        """:func:`atomic_write`, unless ``path`` is one of the inputs (checked again as each file is written)."""
        hit = self.input_at(path)
        if hit is not None:
            raise OutputError(f"{path}: is the input file {hit}; not written")
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
    # the output folder's lock: released however the run ends; libjpeg / libpng lines only with --debug
    with contextlib.ExitStack() as held, native_messages(args.debug):
        return _run(args, held)


def _run(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    """The run; ``held`` keeps the output folder (and its lock) until :func:`main` returns."""
    try:
        cfg = minidet.get_cfg()
        cfg.merge_from_file(args.config_file)
        cfg.merge_from_list(args.opts)
        validate_cfg(cfg)  # every value in range before anything is read or loaded
        paths, skipped = find_images(args.input)
        for source, entries in skipped.items():
            print(f"infer: skipped {len(entries)} entries in {source}: {describe_skipped([r for _, r in entries])}")
        stems = unique_stems(paths)
        inputs = InputGuard(paths)
        inputs.check_folder(args.output, stems)  # before anything is created or loaded
        held.enter_context(OutputDir(args.output, "--output"))
        predictor = minidet.Predictor(cfg)
    except (ConfigError, CheckpointError, OSError) as e:
        return _fail(str(e), args.debug)
    except KeyboardInterrupt:
        _fail("interrupted", args.debug)
        return 130
    except Exception as e:  # noqa: BLE001 - any other setup failure: still one line without --debug
        hint = "" if args.debug else " (rerun with --debug for the traceback)"
        return _fail(f"{type(e).__name__}: {e}{hint}", args.debug)
    print(f"infer: weights {predictor.weights_summary}")

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
                inputs.write(os.path.join(args.output, f"{stem}.jpg"), jpg.tobytes())
                inputs.write(os.path.join(args.output, f"{stem}.json"), dumps_record(doc).encode("utf-8"))
            except Exception as e:  # noqa: BLE001 - one bad image must not stop the batch
                failed += 1
                if args.debug:
                    traceback.print_exc()
                what = str(e) if isinstance(e, (ImageReadError, OutputError)) else f"{path}: {type(e).__name__}: {e}"
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
