"""Sliced inference: a large image run as overlapping tiles, each exactly as the model runs that crop, the tiles'
detections mapped to the image and merged where an object was cut by a tile border.

``SlicedPredictor(predictor, Slicing(size=1024))`` stands where a ``Predictor`` does (``predictor(image)``,
``predict_batch(images)``), so that ``minidet infer --slice``, its torchrun and Ray engines and resume run tiles
the way they run images.

- Tiles (:func:`tile_windows`): ``size`` x ``size`` pixels of the original image (smaller where the image is), one
  every ``size * (1 - overlap)`` pixels, the last of a row or column flush with the image's edge (as sahi places
  them). An image no larger than one tile is one tile: the plain run, unchanged.
- Each tile is ``predictor(tile)`` (``image[y0:y1, x0:x1]``: an array's view, or a window read from a raster,
  ``minidet.rasters``): the same config, the same resize, the same detections as running that crop as
  an image. Boxes move by the tile's offset, masks (``BoxMasks``) keep their crops and move with them.
- Merging (:func:`merge_tiles`) looks only at detections that overlap a detection of another tile (same class, box
  IoU or IoS, intersection over the smaller box, at least ``threshold``); one tile's detections are never merged
  with each other (its own NMS kept them apart) and a detection that overlaps no other tile's comes out as its
  tile gave it. ``nms``: the highest-scoring one of each matched set is kept. ``nmm`` (non-maximum merging): it
  absorbs the others, one per tile, as long as they match the growing union: the union of the boxes, the union
  of the masks (made from their crops: no full-frame mask is ever made), the highest score and its class.
- ``full_pass``: the whole image is run as one more "tile" (as sahi's ``perform_standard_pred``), for objects
  larger than a tile; its detections merge with the tiles' by the same rule.
- ``max_tiles``: an image whose plan has more runs is refused (:class:`TooManyTiles`, one line) before any of
  them: small tiles with a large overlap make tens of thousands of runs of one photo.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .errors import InputError
from .heads.detections import FIELDS
from .masks import BoxMasks

MERGES = ("nmm", "nms")
MATCHES = ("ios", "iou")
# the most runs one image may take unless asked for more (--max-tiles): every image within the default
# INPUT.MAX_PIXELS (125 MP) fits, sliced in 256-pixel tiles with up to half of them overlapping (7,622 at most)
MAX_TILES = 10_000


@dataclass(frozen=True)
class Slicing:
    """How to slice: tile ``size`` in pixels, ``overlap`` (a fraction of the tile, 0 <= overlap < 1), ``merge``
    (``nmm`` or ``nms``), ``match`` (``ios`` or ``iou``) at ``threshold``, ``full_pass`` (the whole image too),
    ``max_tiles`` (the most runs of one image; more is refused)."""

    size: int
    overlap: float = 0.2
    merge: str = "nmm"
    match: str = "ios"
    threshold: float = 0.5
    full_pass: bool = False
    max_tiles: int = MAX_TILES

    def __post_init__(self) -> None:
        """A value out of range is a ValueError whose message begins with the field's name."""
        if self.size < 32:
            raise ValueError(f"size {self.size}: at least 32 pixels")
        if not 0.0 <= self.overlap < 1.0:
            raise ValueError(f"overlap {self.overlap:g}: a fraction of the tile, from 0 to under 1")
        if self.merge not in MERGES:
            raise ValueError(f"merge {self.merge!r}: one of {', '.join(MERGES)}")
        if self.match not in MATCHES:
            raise ValueError(f"match {self.match!r}: one of {', '.join(MATCHES)}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold {self.threshold:g}: above 0, at most 1")
        if self.max_tiles < 1:
            raise ValueError(f"max_tiles {self.max_tiles}: at least 1")


class TooManyTiles(InputError):
    """An image whose slicing plan has more runs than ``Slicing.max_tiles`` (one line)."""


def _starts(length: int, size: int, overlap: float) -> list[int]:
    if length <= size:
        return [0]
    step = max(1, int(size * (1.0 - overlap)))
    starts = list(range(0, length - size, step))
    return [*starts, length - size]  # the last one flush with the edge


def tile_windows(height: int, width: int, size: int, overlap: float) -> list[tuple[int, int, int, int]]:
    """The tiles of a height x width image as ``(x0, y0, x1, y1)`` (exclusive ends), row by row."""
    return [(x, y, min(x + size, width), min(y + size, height))
            for y in _starts(height, size, overlap) for x in _starts(width, size, overlap)]


def slice_windows(height: int, width: int, slicing: Slicing) -> list[tuple[int, int, int, int]]:
    """The runs of a height x width image: its tiles (:func:`tile_windows`) and, with ``full_pass`` and more than
    one tile, the whole image last."""
    found = tile_windows(height, width, slicing.size, slicing.overlap)
    if slicing.full_pass and len(found) > 1:
        found.append((0, 0, width, height))
    return found


def _box_match(a: torch.Tensor, b: torch.Tensor, match: str) -> torch.Tensor:
    """(len(a), len(b)) box IoU or IoS (intersection over the smaller box) of xyxy float boxes."""
    a, b = a.double(), b.double()
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    area_a = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(dim=1)
    area_b = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(dim=1)
    if match == "iou":
        denom = area_a[:, None] + area_b[None, :] - inter
    else:
        denom = torch.minimum(area_a[:, None], area_b[None, :])
    return torch.where(denom > 0, inter / denom.clamp(min=1e-12), torch.zeros_like(inter))


def _overlaps(w: tuple[int, int, int, int], v: tuple[int, int, int, int]) -> bool:
    return w[0] < v[2] and v[0] < w[2] and w[1] < v[3] and v[1] < w[3]


def _in_window(boxes: torch.Tensor, w: tuple[int, int, int, int]) -> torch.Tensor:
    """Which boxes reach into window ``w``."""
    return (boxes[:, 0] < w[2]) & (boxes[:, 2] > w[0]) & (boxes[:, 1] < w[3]) & (boxes[:, 3] > w[1])


def _union_mask(masks: BoxMasks, rows: list[int]) -> tuple[torch.Tensor, tuple[int, int]]:
    """The union of masks ``rows`` as one crop (over the union of their crops) and its origin."""
    regions = [masks.region(k) for k in rows if masks.crops[k].numel()]
    if not regions:
        return masks.crops[rows[0]], masks.origins[rows[0]]
    x0, y0 = min(r[0] for r in regions), min(r[1] for r in regions)
    x1, y1 = max(r[2] for r in regions), max(r[3] for r in regions)
    out = torch.zeros((y1 - y0, x1 - x0), dtype=torch.bool)
    for k in rows:
        if masks.crops[k].numel():
            a0, b0, a1, b1 = masks.region(k)
            out[b0 - y0 : b1 - y0, a0 - x0 : a1 - x0] |= masks.crops[k].cpu()
    return out, (x0, y0)


def merge_tiles(parts: list[tuple[tuple[int, int, int, int], dict]], size: tuple[int, int],
                slicing: Slicing) -> dict:
    """One image's detections from its tiles' (``parts``: window, the tile's output already in image pixels), merged
    as the module docstring says; sorted by decreasing score."""
    windows = [w for w, _ in parts]
    outs = [o for _, o in parts]
    boxes = torch.cat([o["boxes"] for o in outs]).float()
    scores = torch.cat([o["scores"] for o in outs])
    labels = torch.cat([o["labels"] for o in outs])
    cats = torch.cat([o["category_ids"] for o in outs])
    tile = torch.cat([torch.full((len(o["scores"]),), k, dtype=torch.int64) for k, o in enumerate(outs)])
    has_masks = all("masks" in o for o in outs)
    masks = BoxMasks.cat([o["masks"] for o in outs], size) if has_masks else None
    first = np.cumsum([0] + [len(o["scores"]) for o in outs])

    # matches: pairs of detections of two overlapping tiles, same class, in both tiles' overlap
    neighbours: dict[int, set[int]] = {}
    for i in range(len(windows)):
        for j in range(i + 1, len(windows)):
            if not _overlaps(windows[i], windows[j]):
                continue
            a = torch.arange(first[i], first[i + 1])
            b = torch.arange(first[j], first[j + 1])
            a, b = a[_in_window(boxes[a], windows[j])], b[_in_window(boxes[b], windows[i])]
            if not len(a) or not len(b):
                continue
            hit = (_box_match(boxes[a], boxes[b], slicing.match) >= slicing.threshold) & (
                labels[a][:, None] == labels[b][None, :])
            for p, q in hit.nonzero().tolist():
                u, v = int(a[p]), int(b[q])
                neighbours.setdefault(u, set()).add(v)
                neighbours.setdefault(v, set()).add(u)

    order = sorted(neighbours, key=lambda k: (-float(scores[k]), k))
    taken: set[int] = set()
    # the kept detection -> the detections it stands for (itself first) and the union of their boxes
    groups: dict[int, tuple[list[int], torch.Tensor]] = {}
    for d in order:
        if d in taken:
            continue
        taken.add(d)
        group, tiles, box = [d], {int(tile[d])}, boxes[d].clone()
        while True:
            near = {e for g in group for e in neighbours[g]} - taken
            near = [e for e in near if int(tile[e]) not in tiles]
            if slicing.merge == "nms":
                taken.update(near)  # suppressed by d
                break
            fits = [e for e in near if float(_box_match(box[None], boxes[e][None], slicing.match)) >= slicing.threshold]
            if not fits:
                break
            e = min(fits, key=lambda k: (-float(scores[k]), k))
            taken.add(e)
            group.append(e)
            tiles.add(int(tile[e]))
            box = torch.cat([torch.minimum(box[:2], boxes[e][:2]), torch.maximum(box[2:], boxes[e][2:])])
        groups[d] = group, box

    keep = [k for k in range(len(scores)) if k not in taken or k in groups]
    keep.sort(key=lambda k: (-float(scores[k]), k))
    out_boxes = boxes[keep].clone()
    crops, origins = [], []
    for n, k in enumerate(keep):
        group, box = groups.get(k, ([k], None))
        if len(group) > 1:  # nmm's union (an nms group is its kept detection alone)
            out_boxes[n] = box
        if masks is not None:
            crop, origin = _union_mask(masks, group) if len(group) > 1 else (masks.crops[k], masks.origins[k])
            crops.append(crop)
            origins.append(origin)
    idx = torch.tensor(keep, dtype=torch.int64)
    result = {"boxes": out_boxes, "scores": scores[idx], "labels": labels[idx], "category_ids": cats[idx]}
    for f in FIELDS:  # the detections' other fields (a Mask Scoring R-CNN's box scores): the kept detection's
        if not f.pasted and all(f.name in o for o in outs):
            result[f.name] = torch.cat([o[f.name] for o in outs])[idx]
    if masks is not None:
        result["masks"] = BoxMasks(crops, origins, size)
    return result


class SlicedPredictor:
    """A ``Predictor`` that runs each image as tiles (:class:`Slicing`) and merges them (:func:`merge_tiles`); the
    same outputs as a Predictor's, their ``timings`` the tiles' stages summed plus ``slice_merge`` and their
    ``tiles`` count. ``plan(height, width, windows)`` is called for each image before its tiles run,
    ``progress(done, total)`` after each tile. An image of more than ``slicing.max_tiles`` runs raises
    :class:`TooManyTiles` before any tile of its batch runs. Everything else (``cfg``, ``classes``, ``model``...) is
    the wrapped predictor's."""

    def __init__(self, predictor, slicing: Slicing, progress: Callable[[int, int], None] | None = None,
                 plan: Callable[[int, int, list], None] | None = None) -> None:
        self.predictor, self.slicing, self.progress, self.plan = predictor, slicing, progress, plan

    def __getattr__(self, name: str):
        return getattr(self.predictor, name)

    def __call__(self, image: np.ndarray) -> dict:
        return self.predict_batch([image])[0]

    def predict_batch(self, images: list[np.ndarray]) -> list[dict]:
        """Each image sliced and merged; ``timings`` are for the whole batch (a Predictor's are). Every image's plan
        is checked first (:meth:`check`): one refused image runs no tile of the others."""
        for im in images:
            if hasattr(im, "shape") and len(im.shape) == 3:
                self.check(*im.shape[:2])
        outs = [self._one(im) for im in images]
        total: dict[str, float] = {}
        for o in outs:
            for k, v in o["timings"].items():
                total[k] = total.get(k, 0.0) + v
        for o in outs:
            o["timings"] = total
        return outs

    def windows(self, height: int, width: int) -> list[tuple[int, int, int, int]]:
        return slice_windows(height, width, self.slicing)

    def check(self, height: int, width: int) -> list[tuple[int, int, int, int]]:
        """The runs of a height x width image; :class:`TooManyTiles` when there are more than ``max_tiles``."""
        windows, s = self.windows(height, width), self.slicing
        if len(windows) > s.max_tiles:
            raise TooManyTiles(f"{width} x {height} px: --slice {s.size} --overlap {s.overlap:g} makes "
                               f"{len(windows):,} tiles, more than --max-tiles {s.max_tiles}; raise --max-tiles to "
                               "run them all, or slice it in larger tiles or with less overlap")
        return windows

    def _one(self, image: np.ndarray) -> dict:
        if not (hasattr(image, "shape") and len(image.shape) == 3):
            return self.predictor(image)  # the Predictor's own one-line refusal
        h, w = image.shape[:2]
        windows = self.check(h, w)
        if self.plan is not None:
            self.plan(h, w, windows)
        if len(windows) == 1:  # the plain run
            out = self.predictor(np.asarray(image))
            out["tiles"] = 1
            out["timings"] = dict(out["timings"])
            return out
        parts, stages = [], {}
        for n, (x0, y0, x1, y1) in enumerate(windows):
            out = self.predictor(np.ascontiguousarray(image[y0:y1, x0:x1]))
            for k, v in out.pop("timings").items():
                stages[k] = stages.get(k, 0.0) + v
            shift = torch.tensor([x0, y0, x0, y0], dtype=out["boxes"].dtype)
            out["boxes"] = out["boxes"] + shift
            if "masks" in out:
                out["masks"] = out["masks"].shifted(x0, y0, (h, w))
            parts.append(((x0, y0, x1, y1), out))
            if self.progress is not None:
                self.progress(n + 1, len(windows))
        t0 = time.perf_counter()
        merged = merge_tiles(parts, (h, w), self.slicing)
        stages["slice_merge"] = time.perf_counter() - t0
        extra = {k: v for k, v in parts[0][1].items() if k not in merged}  # box_offset, class_names
        return {**merged, **extra, "timings": stages, "tiles": len(windows)}


def tile_count(height: int, width: int, slicing: Slicing) -> int:
    """How many runs an image of this size takes."""
    return len(slice_windows(height, width, slicing))

