"""``--slice`` and its options (sliced inference, ``minidet.slicing``) as ``infer`` and ``eval`` take them."""

from __future__ import annotations

import argparse

from minidet.imageio import read_image
from minidet.rasters import open_raster
from minidet.slicing import MATCHES, MERGES, Slicing

KEYS = ("slice", "overlap", "merge", "match", "match_thresh", "full_pass")  # what a resumed run must repeat


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slice", type=int, metavar="S",
                   help="sliced inference: run each image as S x S tiles of its own pixels, each as the model runs "
                        "that crop, and merge the detections cut by tile borders")
    p.add_argument("--overlap", type=float, default=0.2, metavar="F", help="--slice: tiles overlap by F of S")
    p.add_argument("--merge", choices=MERGES, default="nmm",
                   help="--slice: nmm joins the pieces of an object cut by tile borders (boxes and masks united); "
                        "nms keeps the highest-scoring piece")
    p.add_argument("--match", choices=MATCHES, default="ios",
                   help="--slice: pieces match by box IoS (intersection over the smaller box) or IoU")
    p.add_argument("--match-thresh", type=float, default=0.5, metavar="T", help="--slice: the lowest match")
    p.add_argument("--full-pass", action="store_true",
                   help="--slice: run the whole image too and merge it in (objects larger than a tile)")


def image_reader(args: argparse.Namespace):
    """How the loader reads an input: with ``--slice``, a georeferenced raster (a GeoTIFF, with the geo extra) as a
    ``RasterImage`` whose tiles are read window by window; everything else, and every input without ``--slice``,
    decoded whole (``read_image``)."""
    if getattr(args, "slice", None) is None:
        return read_image

    def read(path: str, max_pixels: int):
        raster = open_raster(path, max_pixels)
        return raster if raster is not None else read_image(path, max_pixels)

    return read


def slicing_of(args: argparse.Namespace, p: argparse.ArgumentParser | None = None) -> Slicing | None:
    """The ``Slicing`` the options ask for (None without ``--slice``); a bad value is ``p.error``'s one line."""
    if getattr(args, "slice", None) is None:  # eval's arguments have no --slice
        return None
    try:
        return Slicing(args.slice, args.overlap, args.merge, args.match, args.match_thresh, args.full_pass)
    except ValueError as e:
        if p is None:
            raise
        p.error(f"--slice: {e}")
