"""``minidet convert RESULTS --to FORMAT --output PATH``: infer's results in the files annotation and GIS tools
import (``outputs.formats``): ``coco-dataset`` (COCO JSON with polygons), ``cvat`` (CVAT for images 1.1 XML),
``labelstudio`` (tasks with polygon predictions), ``yolo-seg`` (a folder of label files and data.yaml), ``geojson``
(a FeatureCollection; in the raster's CRS for GeoTIFF images, with the geo extra).

RESULTS is infer's ``--results`` file (``.jsonl`` or COCO ``.json``) or one image's record. A file that cannot be
read is one ``error:`` line (exit status 2).
"""

from __future__ import annotations

import argparse
import sys

from minidet.apps import fail
from minidet.apps.outputs.fileio import OutputError
from minidet.apps.outputs.formats import FORMATS, FormatError, read_results


def parse_args(argv: list[str] | None = None, prog: str = "minidet convert") -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description="infer's results in an annotation or GIS tool's format.")
    p.add_argument("results", metavar="RESULTS", help="infer's --results file (.jsonl or .json) or a record .json")
    p.add_argument("--to", required=True, choices=list(FORMATS), help="the format written")
    p.add_argument("--output", required=True, metavar="PATH", help="the file written (yolo-seg: a folder)")
    p.add_argument("--score-thresh", type=float, default=0.0, help="only detections scoring at least this")
    p.add_argument("--image-prefix", default="", help="labelstudio: put before each file name (a URL or path)")
    p.add_argument("--debug", action="store_true", help="print tracebacks for errors")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, prog: str = "minidet convert") -> int:
    args = parse_args(argv, prog)
    try:
        results = read_results(args.results)
        extra = {"image_prefix": args.image_prefix} if args.to == "labelstudio" else {}
        FORMATS[args.to](results, args.output, args.score_thresh, **extra)
    except (FormatError, OutputError) as e:
        return fail(str(e), args.debug)
    n = sum(1 for r in results.images for i in r["instances"] if i["score"] >= args.score_thresh)
    print(f"convert: {len(results.images)} images, {n} instances -> {args.output} ({args.to})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
