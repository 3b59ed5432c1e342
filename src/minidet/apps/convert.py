"""``minidet convert RESULTS --to FORMAT --output PATH``: infer's results in the files annotation and GIS tools
import (``outputs.formats``): ``coco-dataset`` (COCO JSON with polygons), ``cvat`` (CVAT for images 1.1 XML),
``labelstudio`` (tasks with polygon predictions), ``yolo-seg`` (a folder of label files and data.yaml), ``geojson``
(a FeatureCollection; in the raster's CRS for GeoTIFF images, with the geo extra).

RESULTS is infer's ``--results`` file (``.jsonl`` or COCO ``.json``) or one image's record, every record checked
(``outputs.results``). A record that fails a check is one ``error:`` line naming it and is left out, the others are
converted (exit status 1); a file that cannot be read, or none of whose records can, is one ``error:`` line and
nothing is written (exit status 2), as for an ``--output`` that would replace the results file itself.

A Mask Scoring R-CNN's ``box_score`` is kept where the format has attributes (``formats.BOX_SCORE_IN``); for
YOLO-seg, which has none, a note says it is not carried.
"""

from __future__ import annotations

import argparse
import math
import sys

from minidet.apps import fail
from minidet.apps.outputs.fileio import OutputError
from minidet.apps.outputs.formats import FORMATS, NO_ATTRIBUTES, has_box_scores, overwrites
from minidet.apps.outputs.results import FormatError, read_results
from minidet.imageio import DEFAULT_MAX_PIXELS


def _number(text: str, kind=float):
    """A finite, non-negative ``kind`` for argparse."""
    value = kind(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of at least 0, got {text}")
    return value


def _score(text: str) -> float:
    """A score, from 0 to 1, for argparse."""
    value = float(text)
    if not 0.0 <= value <= 1.0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a score from 0 to 1, got {text}")
    return value


def parse_args(argv: list[str] | None = None, prog: str = "minidet convert") -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description="infer's results in an annotation or GIS tool's format.")
    p.add_argument("results", metavar="RESULTS", help="infer's --results file (.jsonl or .json) or a record .json")
    p.add_argument("--to", required=True, choices=list(FORMATS), help="the format written")
    p.add_argument("--output", required=True, metavar="PATH", help="the file written (yolo-seg: a folder)")
    p.add_argument("--score-thresh", type=_score, default=0.0,
                   help="only detections scoring at least this (0 to 1)")
    p.add_argument("--image-prefix", default="", help="labelstudio: put before each file name (a URL or path)")
    p.add_argument("--max-pixels", type=lambda t: _number(t, int), default=DEFAULT_MAX_PIXELS, metavar="N",
                   help="refuse a record whose image has more pixels (default INPUT.MAX_PIXELS's, %(default)s; 0: no "
                        "limit)")
    p.add_argument("--debug", action="store_true", help="print tracebacks for errors")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, prog: str = "minidet convert") -> int:
    args = parse_args(argv, prog)
    try:
        if overwrites(args.to, args.output, args.results):
            raise OutputError(f"--output {args.output}: would overwrite the results file being converted "
                              f"({args.results}); choose another path")
        results = read_results(args.results, args.max_pixels)
        *told, last = results.problems or [""]
        for line in told:
            print(f"error: {line}", file=sys.stderr)
        if last and not results.images:
            whole = f"none of its {results.total} records could be read" if results.total > 1 else ""
            raise FormatError(f"{last} ({whole}{': ' if whole else ''}nothing written)")
        if last:
            print(f"error: {last}", file=sys.stderr)
        extra = {"image_prefix": args.image_prefix} if args.to == "labelstudio" else {}
        empty = FORMATS[args.to](results, args.output, args.score_thresh, **extra)
    except (FormatError, OutputError) as e:
        return fail(str(e), args.debug)
    n = sum(1 for r in results.images for i in r["instances"] if i["score"] >= args.score_thresh) - empty
    failed = results.total - len(results.images)
    left = f", {empty} with an empty mask left out ({args.to} has no empty shape)" if empty else ""
    if args.to in NO_ATTRIBUTES and has_box_scores(results):
        print(f"convert: note: {args.to} labels hold no attributes: the instances' box_score (the box head's score "
              "beside a Mask Scoring R-CNN's mask score) is not carried")
    print(f"convert: {results.total} images, {failed} failed, {n} instances{left} -> {args.output} ({args.to})")
    return 1 if results.problems else 0


if __name__ == "__main__":
    sys.exit(main())
