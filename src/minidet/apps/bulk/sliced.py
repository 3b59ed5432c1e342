"""``--slice`` and its options (sliced inference, ``minidet.slicing``) as ``infer`` takes them (read into the run's
``Slicing`` by ``outputs.options.from_args``), and what a sliced run says of its tiles (:class:`TileReport`)."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from tqdm import tqdm

from minidet.imageio import read_image
from minidet.rasters import open_raster
from minidet.slicing import MATCHES, MAX_TILES, MERGES, Slicing

KEYS = ("slice", "overlap", "merge", "match", "match_thresh", "full_pass")  # what a resumed run must repeat
# where stderr is no terminal (a log file, a pipe), the tile a sliced run is at is a line at most this often
TILE_LINE_EVERY = 30.0


class _SliceOption(argparse.Action):
    """Stores a ``--slice`` option's value (a flag's: True) and notes the option in ``slice_options``, so that one
    given without ``--slice`` is refused (``outputs.options.slicing_of``), its default value too."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, True if self.nargs == 0 else values)
        namespace.slice_options = [*getattr(namespace, "slice_options", []), self.option_strings[0]]


def add_options(p: argparse.ArgumentParser) -> None:
    """``--slice`` and the options that only it reads (noted when given: :class:`_SliceOption`)."""
    p.add_argument("--slice", type=int, metavar="S",
                   help="sliced inference: run each image as S x S tiles of its own pixels, each as the model runs "
                        "that crop, and merge the detections cut by tile borders")
    p.add_argument("--overlap", action=_SliceOption, type=float, default=0.2, metavar="F",
                   help="--slice: tiles overlap by F of S")
    p.add_argument("--merge", action=_SliceOption, choices=MERGES, default="nmm",
                   help="--slice: nmm joins the pieces of an object cut by tile borders (boxes and masks united); "
                        "nms keeps the highest-scoring piece")
    p.add_argument("--match", action=_SliceOption, choices=MATCHES, default="ios",
                   help="--slice: pieces match by box IoS (intersection over the smaller box) or IoU")
    p.add_argument("--match-thresh", action=_SliceOption, type=float, default=0.5, metavar="T",
                   help="--slice: the lowest match")
    p.add_argument("--full-pass", action=_SliceOption, nargs=0, default=False,
                   help="--slice: run the whole image too and merge it in (objects larger than a tile)")
    p.add_argument("--max-tiles", action=_SliceOption, type=int, default=MAX_TILES, metavar="N",
                   help=f"--slice: refuse an image whose tiles are more than N (default {MAX_TILES})")


def image_reader(slicing: Slicing | None):
    """How the loader reads an input: a georeferenced raster (a GeoTIFF, with the geo extra) through
    ``rasters.open_raster``, with ``slicing`` (``--slice``) as a ``RasterImage`` whose tiles are read window by
    window, without it read whole (the same pixels and the same refusals either way); everything else decoded whole
    (``read_image``)."""

    def read(path: str, max_pixels: int):
        raster = open_raster(path, max_pixels)
        if raster is None:
            return read_image(path, max_pixels)
        return raster if slicing is not None else np.asarray(raster)

    return read


class TileReport:
    """What a sliced run says of its tiles, on the process that shows the bar (``shown``): a line on stdout for each
    image whose tile count is new to the run (:meth:`plan`: one line for a run of like images), and after each tile
    (:meth:`tile`) the tile on the ``bar`` where it is drawn (a terminal), else, where stderr is a file or a pipe, a
    line on stderr at most every ``TILE_LINE_EVERY`` seconds. ``name``: the lines' prefix; ``images``: how many
    images the loop runs."""

    def __init__(self, name: str, bar: tqdm, images: int, shown: bool) -> None:
        self.name, self.bar, self.images, self.shown = name, bar, images, shown
        self.counts: set[int] = set()
        self.image = 0
        self.last = time.monotonic()

    def plan(self, height: int, width: int, windows: list) -> None:
        self.image += 1
        n = len(windows)
        if not self.shown or n in self.counts:
            return
        self.counts.add(n)
        if n == 1:
            what = "1 tile (the plain run)"
        else:
            whole = windows[-1] == (0, 0, width, height)  # --full-pass: the whole image last
            tiles = windows[:-1] if whole else windows
            across, down = len({w[0] for w in tiles}), len({w[1] for w in tiles})
            what = f"{len(tiles):,} tiles ({across} across, {down} down){' and the whole image' if whole else ''}"
        tqdm.write(f"{self.name}: a {width} x {height} px image: {what}", file=sys.stdout)

    def tile(self, done: int, total: int) -> None:
        if not self.shown:
            return
        if not self.bar.disable:
            self.bar.set_postfix_str(f"tile {done}/{total}" if done < total else "")
            return
        now = time.monotonic()
        if done < total and now - self.last >= TILE_LINE_EVERY:
            self.last = now
            print(f"{self.name}: image {self.image} of {self.images}: tile {done} of {total}", file=sys.stderr,
                  flush=True)
