"""Masks as polygons: outlines along the pixels' edges, made from each mask's crop.

A mask's outline is traced on the lattice of its pixels' corners and edge midpoints (a pixel's (x, y) covers
x .. x + 1 and y .. y + 1), so that a polygon goes around the pixels, not through their centres: rasterized again
(pycocotools), an outline gives back exactly the pixels it encloses. The lattice is the crop's pixels scaled by two
with their borders (a (2h + 1) x (2w + 1) array); OpenCV's border following traces it, and the vertices are halved.

COCO polygons cannot hold holes (pycocotools fills every polygon and joins them): ``coco_polygons`` gives each
part's outer outline, so a hole's pixels come back as mask pixels; ``polygons_with_holes`` gives each part with its
holes (GeoJSON's polygons have interior rings).
"""

from __future__ import annotations

import cv2
import numpy as np

from minidet.masks import BoxMasks


def _lattice(crop: np.ndarray) -> np.ndarray:
    """Each pixel (y, x) of ``crop`` as the 3 x 3 block at (2y, 2x) of a (2h + 1) x (2w + 1) uint8 lattice: its
    corners at even, its centre at odd coordinates; neighbouring pixels share their edges."""
    h, w = crop.shape
    lattice = np.zeros((2 * h + 1, 2 * w + 1), np.uint8)
    m = crop.astype(np.uint8)
    for dy in range(3):
        for dx in range(3):
            lattice[dy : dy + 2 * h : 2, dx : dx + 2 * w : 2] |= m
    return lattice


def _ring(contour: np.ndarray, x0: int, y0: int, tolerance: float) -> np.ndarray | None:
    """A traced lattice contour as (K, 2) float frame coordinates (simplified by ``tolerance`` pixels), None when it
    has fewer than 3 vertices."""
    if tolerance > 0:
        simpler = cv2.approxPolyDP(contour, 2 * tolerance, True)  # lattice units: two per pixel
        contour = simpler if len(simpler) >= 3 else contour
    if len(contour) < 3:
        return None
    return contour.reshape(-1, 2).astype(np.float64) / 2 + (x0, y0)


def polygons_with_holes(crop: np.ndarray, x0: int = 0, y0: int = 0,
                        tolerance: float = 0.0) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """The parts of the mask ``crop`` (placed at ``x0``, ``y0``), each as (outer ring, [hole rings]): (K, 2) arrays
    of x, y frame coordinates on the pixels' edges, unclosed; ``tolerance`` > 0 simplifies each ring
    (Douglas-Peucker, in pixels)."""
    crop = np.asarray(crop, dtype=bool)
    if crop.size == 0 or not crop.any():
        return []
    contours, hierarchy = cv2.findContours(_lattice(crop), cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE)
    parts: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
    for k, (_, _, _, parent) in enumerate(hierarchy[0]):  # outer outlines have no parent
        if parent < 0 and (ring := _ring(contours[k], x0, y0, tolerance)) is not None:
            parts[k] = (ring, [])
    for k, (_, _, _, parent) in enumerate(hierarchy[0]):
        if parent >= 0 and parent in parts and (ring := _ring(contours[k], x0, y0, tolerance)) is not None:
            parts[parent][1].append(ring)
    return list(parts.values())


def coco_polygons(crop: np.ndarray, x0: int = 0, y0: int = 0, tolerance: float = 0.0) -> list[list[float]]:
    """COCO polygon segmentation of one mask: each part's outer outline as a flat ``[x1, y1, x2, y2, ...]`` list
    (holes are filled: COCO polygons cannot hold them)."""
    return [[round(float(v), 2) for v in ring.ravel()] for ring, _ in polygons_with_holes(crop, x0, y0, tolerance)]


def encode_polygons(masks: BoxMasks, tolerance: float = 0.0) -> list[list[list[float]]]:
    """COCO polygons of each mask of a ``BoxMasks``, from its crop."""
    return [coco_polygons(c.cpu().numpy(), x, y, tolerance) for c, (x, y) in zip(masks.crops, masks.origins)]
