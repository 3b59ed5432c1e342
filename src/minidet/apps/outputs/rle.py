"""COCO run-length encoding of masks, ready for JSON."""

from __future__ import annotations

import numpy as np
from pycocotools import mask as mask_utils


def encode_mask(mask: np.ndarray) -> dict:
    """COCO compressed RLE ``{"size": [H, W], "counts": str}`` of one HxW mask (nonzero = in)."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"expected an HxW mask, got shape {mask.shape}")
    return encode_masks(mask[None])[0]


def encode_masks(masks: np.ndarray) -> list[dict]:
    """COCO RLE of each mask of an (N, H, W) stack, as by :func:`encode_mask`."""
    masks = np.asarray(masks)
    if masks.ndim != 3:
        raise ValueError(f"expected an (N, H, W) mask stack, got shape {masks.shape}")
    if len(masks) == 0:
        return []
    fortran = np.asfortranarray((masks != 0).astype(np.uint8).transpose(1, 2, 0))
    return [{"size": [int(r["size"][0]), int(r["size"][1])], "counts": r["counts"].decode("utf-8")}
            for r in mask_utils.encode(fortran)]
