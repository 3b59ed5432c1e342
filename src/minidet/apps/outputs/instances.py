"""Detections as COCO instance dicts, the one conversion behind every output: the per-image JSON and video records
of ``infer`` (and, through them, its results file) and the results that ``eval`` scores.

A Predictor's output carries what the conversion needs beside its tensors: ``box_offset`` (1 where the weight
family counts box sizes pixel-inclusively, Detectron's width ``x2 - x1 + 1``) and ``class_names`` (the name of each
class index). Masks (``BoxMasks``, or (N, H, W) arrays) become COCO RLE, COCO polygons or nothing
(``MASK_FORMATS``: ``--mask-format`` of infer, eval and the server).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from minidet.apps.outputs.options import MASK_FORMATS
from minidet.apps.outputs.polygons import encode_polygons
from minidet.apps.outputs.rle import encode_masks
from minidet.heads.detections import RECORDED
from minidet.masks import BoxMasks


def segmentations(masks, mask_format: str = "rle", tolerance: float = 0.0) -> list | None:
    """Each mask of ``masks`` (``BoxMasks`` or an (N, H, W) stack) as ``mask_format`` gives it: COCO RLE dicts,
    COCO polygon lists (outlines on the pixels' edges, simplified by ``tolerance`` pixels), or None for ``none``."""
    if mask_format not in MASK_FORMATS:
        raise ValueError(f"mask format: one of {', '.join(MASK_FORMATS)}, got {mask_format!r}")
    if mask_format == "none":
        return None
    masks = masks if isinstance(masks, BoxMasks) else BoxMasks.from_dense(np.asarray(masks))
    return encode_masks(masks) if mask_format == "rle" else encode_polygons(masks, tolerance)


def coco_boxes(boxes: np.ndarray, offset: int) -> list[list[float]]:
    """(N, 4) ``x1, y1, x2, y2`` boxes as COCO ``[x, y, width, height]`` lists; ``offset=1`` for pixel-inclusive
    box rules (width = x2 - x1 + 1)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    return [[float(x1), float(y1), float(x2 - x1 + offset), float(y2 - y1 + offset)] for x1, y1, x2, y2 in b]


def offset_of(out: Mapping) -> int:
    """The box rule's size offset the detections carry (``out["box_offset"]``); never assumed."""
    if "box_offset" not in out:
        raise KeyError("the detections do not say how their family counts box sizes (no 'box_offset' entry): "
                       "give box_offset= when converting detections made outside a minidet Predictor")
    return int(out["box_offset"])


def _columns(out: Mapping, rows: np.ndarray, offset: int | None, mask_format: str = "rle",
             tolerance: float = 0.0) -> tuple[list, np.ndarray, np.ndarray, list | None]:
    """bbox lists, scores, category ids and segmentations (``segmentations``; None without masks or with
    ``mask_format`` none) of the detections ``rows``."""
    boxes = coco_boxes(np.asarray(out["boxes"])[rows], offset_of(out) if offset is None else offset)
    scores = np.asarray(out["scores"]).reshape(-1)[rows]
    cats = np.asarray(out["category_ids"]).reshape(-1)[rows]
    rles = None
    if "masks" in out:
        masks = out["masks"]  # BoxMasks (a Predictor's) or an (N, H, W) stack
        masks = masks if isinstance(masks, BoxMasks) else np.asarray(masks)
        rles = segmentations(masks if np.array_equal(rows, np.arange(len(masks))) else masks[rows], mask_format,
                             tolerance)
    return boxes, scores, cats, rles


def record_instances(out: Mapping, mask_format: str = "rle", tolerance: float = 0.0) -> list[dict]:
    """One image's detections as the instances of ``infer``'s records: ``bbox`` [x, y, w, h], ``score``,
    ``category_id``, ``category_name``, the fields of the detections that records carry (``heads.detections``'
    ``RECORDED``: where a mask IoU head rescored the detections, ``box_score``, ``score`` being the box score times
    the predicted mask IoU), and, with masks, ``segmentation`` in ``mask_format`` (``segmentations``)."""
    rows = np.arange(len(out["scores"]))
    boxes, scores, cats, rles = _columns(out, rows, None, mask_format, tolerance)
    names, labels = out["class_names"], np.asarray(out["labels"]).reshape(-1)
    # the detections' fields that records carry (``heads.detections.RECORDED``: a Mask Scoring R-CNN's box scores)
    extra = {f.record: np.asarray(out[f.name]).reshape(-1) for f in RECORDED if f.name in out}
    found = []
    for i, box in enumerate(boxes):
        inst = {"bbox": box, "score": float(scores[i]), "category_id": int(cats[i]),
                "category_name": names[int(labels[i])]}
        inst.update((key, float(values[i])) for key, values in extra.items())
        if rles is not None:
            inst["segmentation"] = rles[i]
        found.append(inst)
    return found


def instances_to_coco(image_id: int, out: Mapping, box_offset: int | None = None,
                      keep: Iterable[int] | None = None, mask_format: str = "rle",
                      tolerance: float = 0.0) -> tuple[list[dict], int]:
    """One image's detections as COCO result dicts (``image_id``, ``category_id``, ``bbox``, ``score``, with masks
    ``segmentation`` in ``mask_format``) in its order; detections whose category id is not in ``keep`` (coco91's
    unused slots, classes a dataset lacks) are dropped. ``box_offset``: the box rule's, for detections that do not
    carry it. Returns (results, number dropped)."""
    cat = np.asarray(out["category_ids"]).reshape(-1)
    rows = np.flatnonzero(np.isin(cat, np.fromiter(keep, dtype=np.int64))) if keep is not None else np.arange(len(cat))
    boxes, scores, cats, rles = _columns(out, rows, box_offset, mask_format, tolerance)
    results = [{"image_id": int(image_id), "category_id": int(cats[k]), "bbox": boxes[k], "score": float(scores[k])}
               for k in range(len(rows))]
    for r, rle in zip(results, rles or []):
        r["segmentation"] = rle
    return results, int(len(cat) - len(rows))
