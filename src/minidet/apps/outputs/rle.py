"""COCO run-length encoding of masks, ready for JSON, made from the masks' box crops."""

from __future__ import annotations

import numpy as np
from pycocotools import mask as mask_utils

from minidet.masks import BoxMasks


def encode_mask(mask: np.ndarray) -> dict:
    """COCO compressed RLE ``{"size": [H, W], "counts": str}`` of one HxW mask (nonzero = in)."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"expected an HxW mask, got shape {mask.shape}")
    return encode_masks(mask[None])[0]


def encode_masks(masks: BoxMasks | np.ndarray) -> list[dict]:
    """COCO RLE of each mask of a ``BoxMasks`` (or of an (N, H, W) stack, cut to its masks' extents first): the
    string pycocotools' ``encode`` makes of the whole frame, byte for byte, made from each mask's crop
    (:func:`crop_counts`), so that the cost follows the masks' boxes, not N x H x W."""
    if not isinstance(masks, BoxMasks):
        masks = np.asarray(masks)
        if masks.ndim != 3:
            raise ValueError(f"expected an (N, H, W) mask stack, got shape {masks.shape}")
        masks = BoxMasks.from_dense(masks)
    h, w = masks.size
    found = []
    for crop, (x, y) in zip(masks.crops, masks.origins):
        counts = crop_counts(crop.cpu().numpy(), x, y, h, w)
        rle = mask_utils.frPyObjects({"size": [h, w], "counts": counts}, h, w)  # pycocotools' own compression
        found.append({"size": [h, w], "counts": rle["counts"].decode("utf-8")})
    return found


def crop_counts(crop: np.ndarray, x0: int, y0: int, height: int, width: int) -> list[int]:
    """The run lengths of a height x width frame (column-major, COCO's order: a run of 0s first, possibly empty, then
    1s and 0s in turn, none other empty) that is 0 everywhere but the bool ``crop`` placed at (x0, y0)."""
    total = height * width
    if crop.size == 0:
        return [total]
    # per crop column (transposed: column-major), +1 where a run of 1s starts and -1 where one has ended
    d = np.diff(crop.T.astype(np.int8), axis=1, prepend=0, append=0)
    col, row = np.nonzero(d)  # in column-major order; starts and ends alternate within each column
    if len(col) == 0:
        return [total]
    pos = (x0 + col.astype(np.int64)) * height + y0 + row
    joined = pos[1:] == pos[:-1]  # a run that ends at a column's bottom and goes on at the next column's top
    if joined.any():
        drop = np.zeros(len(pos), bool)
        drop[1:] |= joined
        drop[:-1] |= joined
        pos = pos[~drop]
    runs = np.diff(np.concatenate(([0], pos, [total])))
    if runs[-1] == 0:  # the last run of 1s reaches the frame's last pixel
        runs = runs[:-1]
    return runs.tolist()
