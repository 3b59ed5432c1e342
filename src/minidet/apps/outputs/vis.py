"""Draw detections (masks, contours, boxes, labels) onto a BGR image."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence

import cv2
import numpy as np

from minidet.masks import BoxMasks

_GOLDEN = 0.6180339887498949
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def palette(n: int) -> np.ndarray:
    """``n`` well-separated BGR colours (uint8, shape (n, 3)); colour ``i`` never depends on ``n``: hues step by the
    golden ratio around the wheel and saturation/brightness alternate, so neighbouring indices differ."""
    i = np.arange(n)
    hue = (0.08 + i * _GOLDEN) % 1.0
    sat = np.where(i % 3 == 1, 0.65, 0.92)
    val = np.where(i % 2 == 1, 0.78, 1.0)
    # HSV -> RGB: channel = val * (1 - sat * clamp(min(k, 4 - k), 0, 1)), k = (6 * hue + offset) mod 6.
    k = (hue[:, None] * 6.0 + np.array([5.0, 3.0, 1.0])) % 6.0  # R, G, B
    rgb = val[:, None] * (1.0 - sat[:, None] * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0))
    return np.round(rgb[:, ::-1] * 255.0).astype(np.uint8)


def draw_instances(image_bgr: np.ndarray, boxes: np.ndarray, scores: np.ndarray, labels: Sequence[str] | None,
                   masks: BoxMasks | np.ndarray | None = None, thresh: float = 0.5, alpha: float = 0.5,
                   draw_boxes: bool = True) -> np.ndarray:
    """A new uint8 BGR image with the instances scoring ``>= thresh`` drawn on it: ``boxes`` (N, 4) xyxy in pixels,
    ``scores`` (N,), ``labels`` N class names (None: no labels), ``masks`` a ``BoxMasks`` of the image's frame, an
    (N, H, W) boolean stack or None (blended with weight ``alpha``, outlined, each within its crop); boxes (unless
    not ``draw_boxes``) and ``"name 0.93"`` labels in the instance's colour, lines and font growing with the
    image."""
    img = np.asarray(image_bgr)
    if img.dtype != np.uint8:
        raise ValueError(f"image must be uint8, got {img.dtype}")
    if img.ndim == 2:
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"image must be HxWx3 BGR, got shape {img.shape}")
    out = np.ascontiguousarray(img).copy()
    height, width = out.shape[:2]
    boxes = np.nan_to_num(np.asarray(boxes, dtype=np.float64).reshape(-1, 4))
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    n = len(scores)
    if len(boxes) != n or (labels is not None and len(labels) != n):
        raise ValueError(f"got {len(boxes)} boxes, {n} scores and {len(labels)} labels")
    if masks is not None:
        if tuple(masks.shape) != (n, height, width):
            raise ValueError(f"masks must have shape {(n, height, width)}, got {tuple(masks.shape)}")
        masks = masks if isinstance(masks, BoxMasks) else BoxMasks.from_dense(np.asarray(masks))
    keep = [i for i in range(n) if scores[i] >= thresh]
    colors = [tuple(c) for c in palette(n).tolist()]
    diag = math.sqrt(height * width)
    line = max(1, round(diag / 500))
    if masks is not None:
        crops = {i: masks.crops[i].cpu().numpy() for i in keep}
        # Big masks first so that small ones stay visible on top.
        for i in sorted(keep, key=lambda k: -int(crops[k].sum())):
            m = crops[i]
            if not m.any():
                continue
            x0, y0, x1, y1 = masks.region(i)
            _blend(out[y0:y1, x0:x1], m, np.array(colors[i], np.float32), alpha)
            # the crop with a border of 0s, as the whole frame would have around it: the same contours, moved
            framed = np.pad(m, 1).astype(np.uint8)
            contours, _ = cv2.findContours(framed, cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE, offset=(x0 - 1, y0 - 1))
            cv2.drawContours(out, contours, -1, colors[i], line, cv2.LINE_AA)
    for i in keep if draw_boxes else []:
        x1, y1, x2, y2 = _clip_box(boxes[i], width, height)
        cv2.rectangle(out, (x1, y1), (x2, y2), colors[i], line, cv2.LINE_AA)
    scale = min(2.5, max(0.4, diag / 1100))
    thick = max(1, round(scale * 1.6))
    # Lowest scores first so that the most confident labels end up on top.
    for i in sorted(keep, key=lambda k: scores[k]) if labels is not None else []:
        x1, y1, _, _ = _clip_box(boxes[i], width, height)
        _draw_label(out, f"{labels[i]} {scores[i]:.2f}", x1, y1, colors[i], scale, thick)
    return out


def _blend(part: np.ndarray, mask: np.ndarray, color: np.ndarray, alpha: float, rows: int = 256) -> None:
    """``part``'s pixels under ``mask`` blended with ``color`` (weight ``alpha``) in place, a band of ``rows`` rows
    at a time so that the float copies stay small for a mask of any size."""
    for r in range(0, mask.shape[0], rows):
        sub, m = part[r : r + rows], mask[r : r + rows]
        sub[m] = (sub[m].astype(np.float32) * (1.0 - alpha) + color * alpha + 0.5).astype(np.uint8)


@functools.cache
def _has_glyph(char: str) -> bool:
    """Whether ``cv2.putText`` draws ``char`` as itself, not as the ``?`` it puts for a character its font lacks (one
    per UTF-8 byte with OpenCV 4's Hershey fonts, which have ASCII only; one with OpenCV 5's built-in font, which
    also has Latin, Cyrillic, Hebrew and Arabic letters but no Greek or CJK ones)."""
    if " " <= char <= "~":
        return True

    def ink(text: str) -> np.ndarray:
        img = np.zeros((40, 160), np.uint8)
        cv2.putText(img, text, (4, 30), _FONT, 1.0, 255, 1, cv2.LINE_8)
        return img

    drawn = ink(char)
    return not any(np.array_equal(drawn, ink("?" * k)) for k in range(1, len(char.encode("utf-8")) + 1))


def undrawable(names: Iterable[str]) -> list[str]:
    """The ``names`` whose labels cannot show them as they are: ``cv2.putText`` draws ``?`` for each character its
    font has no glyph for (:func:`draw_instances` draws them so all the same; the JSON records keep the names)."""
    return [n for n in names if not all(_has_glyph(c) for c in n)]


def _clip_box(box: np.ndarray, width: int, height: int) -> tuple[int, int, int, int]:
    return tuple(min(max(round(float(v)), 0), size - 1) for v, size in zip(box, (width, height) * 2))


def _draw_label(img: np.ndarray, text: str, x: int, y: int, color: tuple, scale: float, thick: int) -> None:
    """A filled tag with ``text`` above (x, y), or just below it when there is no room."""
    height, width = img.shape[:2]
    (tw, th), base = cv2.getTextSize(text, _FONT, scale, thick)
    pad = max(1, round(2 * scale))
    tag_w, tag_h = tw + 2 * pad, th + base + 2 * pad
    top = max(0, min(y - tag_h if y >= tag_h else y, height - tag_h))
    left = max(0, min(x, width - tag_w))
    cv2.rectangle(img, (left, top), (left + tag_w - 1, top + tag_h - 1), color, -1)
    luminance = 0.114 * color[0] + 0.587 * color[1] + 0.299 * color[2]
    ink = (0, 0, 0) if luminance > 150 else (255, 255, 255)
    cv2.putText(img, text, (left + pad, top + pad + th), _FONT, scale, ink, thick, cv2.LINE_AA)
