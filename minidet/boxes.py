"""Box arithmetic shared by the RPN and the RoI heads (x1, y1, x2, y2 boxes).

``offset`` selects the box-size convention: 0 for torchvision/detectron2
(width = x2 - x1), 1 for Detectron's legacy pixel-inclusive boxes (width = x2 - x1 + 1).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn import functional as F
from torchvision.ops import batched_nms as _tv_batched_nms
from torchvision.ops import nms as _tv_nms

BBOX_XFORM_CLIP = math.log(1000.0 / 16)


def decode_boxes(
    deltas: torch.Tensor,
    boxes: torch.Tensor,
    weights: tuple[float, float, float, float],
    offset: int = 0,
    clip: float = BBOX_XFORM_CLIP,
) -> torch.Tensor:
    """Apply (dx, dy, dw, dh) deltas to reference boxes.

    Args:
        deltas: (R, 4k) deltas for k classes (or k=1).
        boxes: (R, 4) reference boxes.
    Returns:
        (R, 4k) decoded boxes.
    """
    boxes = boxes.to(deltas.dtype)
    widths = boxes[:, 2] - boxes[:, 0] + offset
    heights = boxes[:, 3] - boxes[:, 1] + offset
    ctr_x = boxes[:, 0] + 0.5 * widths
    ctr_y = boxes[:, 1] + 0.5 * heights
    wx, wy, ww, wh = weights
    dx = deltas[:, 0::4] / wx
    dy = deltas[:, 1::4] / wy
    dw = torch.clamp(deltas[:, 2::4] / ww, max=clip)
    dh = torch.clamp(deltas[:, 3::4] / wh, max=clip)
    pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
    pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
    half_w = 0.5 * (torch.exp(dw) * widths[:, None])
    half_h = 0.5 * (torch.exp(dh) * heights[:, None])
    out = torch.stack(
        (pred_ctr_x - half_w, pred_ctr_y - half_h, pred_ctr_x + half_w - offset, pred_ctr_y + half_h - offset),
        dim=2,
    )
    return out.flatten(1)


def clip_boxes(boxes: torch.Tensor, height: int, width: int, offset: int = 0) -> torch.Tensor:
    """Clamp (..., 4) boxes to [0, width - offset] x [0, height - offset]."""
    x = boxes[..., 0::2].clamp(min=0, max=width - offset)
    y = boxes[..., 1::2].clamp(min=0, max=height - offset)
    return torch.stack((x, y), dim=-1).reshape(boxes.shape)


def nonempty(boxes: torch.Tensor, min_size: float, offset: int = 0) -> torch.Tensor:
    """Bool mask (R,) of boxes whose width and height are >= ``min_size``."""
    ws = boxes[:, 2] - boxes[:, 0] + offset
    hs = boxes[:, 3] - boxes[:, 1] + offset
    return (ws >= min_size) & (hs >= min_size)


def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    groups: torch.Tensor,
    thresh: float,
    offset: int = 0,
    inclusive: bool = False,
    topk: int | None = None,
    tv_tie_order: bool = True,
) -> torch.Tensor:
    """NMS within each group id; kept indices sorted by decreasing score.

    torchvision suppresses a box when IoU > ``thresh``. Detectron (``offset=1``,
    ``inclusive=True``) measures IoU with +1 sizes and suppresses when IoU >= ``thresh``.
    Both map onto torchvision's kernel exactly: +1 sizes are the plain sizes of boxes whose
    x2, y2 are moved by +1, and for a float32 IoU, ``iou >= t`` is ``iou > t'`` with t' the
    float32 just below the smallest float32 >= t.

    ``topk``: only the best ``topk`` kept boxes are wanted. Greedy NMS visits boxes in
    decreasing score order (a stable sort) and a box's fate depends only on the boxes before
    it, so NMS over the boxes scoring at least some cut gives exactly the leading part of the
    full result; the cut is lowered until that part holds ``topk`` boxes. The result is then
    the full result's leading part holding every kept box that scores at least as high as
    the ``topk``-th (so ``[:topk]`` and tie rules at the cap see what they would see in
    the full result). The full set decides which of torchvision's two batched strategies
    (one NMS over group-shifted boxes, or one NMS per group) runs, as ``batched_nms`` does.
    The per-group strategy ends with an unstable sort, which orders kept boxes of equal
    score in a way that depends on the whole set: when kept boxes tie, the full set runs.
    ``tv_tie_order=False`` skips that: kept boxes of equal score stay in index order, which
    changes no box of the leading ``topk`` (the full set still runs when the ``topk``-th kept
    box ties with the next one), only the order inside runs of equal scores.
    """
    if offset:
        boxes = boxes + torch.tensor([0.0, 0.0, offset, offset], dtype=boxes.dtype, device=boxes.device)
    if inclusive:
        t = torch.tensor(thresh, dtype=torch.float32)
        if float(t) < thresh:  # rounded down: the smallest float32 >= thresh is the next one up
            t = torch.nextafter(t, torch.tensor(float("inf")))
        thresh = float(torch.nextafter(t, torch.tensor(float("-inf"))))
    n = len(scores)
    if topk is None or n <= 2 * topk or bool(torch.isnan(scores).any()):
        return _tv_batched_nms(boxes, scores, groups, thresh)
    # torchvision.ops.batched_nms's choice of strategy, made on the full set
    per_group = boxes.numel() > (4000 if boxes.device.type == "cpu" else 20000)
    if not per_group:  # group shifts from the full set's largest coordinate, as torchvision computes them
        shift = groups.to(boxes) * (boxes.max() + torch.tensor(1).to(boxes))
        boxes = boxes + shift[:, None]
    ranked = scores.sort(descending=True).values
    if per_group:
        return _topk_per_group(boxes, scores, groups, thresh, topk, ranked, tv_tie_order)
    m = 2 * topk
    while m < n:
        sel = torch.where(scores >= ranked[m - 1])[0]  # index order kept: the stable sort agrees
        keep = _tv_nms(boxes[sel], scores[sel], thresh)
        if len(keep) >= topk:
            return sel[keep]
        m *= 4
    return _tv_nms(boxes, scores, thresh)


def _topk_per_group(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    groups: torch.Tensor,
    thresh: float,
    topk: int,
    ranked: torch.Tensor,
    tv_tie_order: bool = True,
) -> torch.Tensor:
    """``batched_nms(..., topk)`` with torchvision's per-group strategy (one NMS per group id).

    Each round runs NMS, per group, over the group's boxes scoring at least the cut (in index
    order, as the full run sees them); a group whose boxes all pass the cut has its final
    result and is not run again. torchvision ends with an unstable sort of all kept boxes by
    score, which orders equal scores in a way that depends on the whole kept set: when kept
    boxes tie, the groups not yet complete run in full and the same sort runs on the full
    kept set, giving exactly torchvision's result. Without ``tv_tie_order`` the rounds' results
    are ordered by a stable sort instead, and only a tie across the ``topk``-th kept box (which
    decides the leading set) needs the full run.
    """
    n = len(scores)
    order = torch.argsort(groups, stable=True)  # by group, each group in index order
    members = order.split(torch.unique_consecutive(groups[order], return_counts=True)[1].tolist())
    done: dict[int, torch.Tensor] = {}  # group position -> kept indices of the whole group

    def nms_of(idx: torch.Tensor) -> torch.Tensor:
        return idx[_tv_nms(boxes[idx], scores[idx], thresh)]

    def by_score(kept: list[torch.Tensor], stable: bool = False) -> torch.Tensor:  # torchvision's final step
        keep = torch.cat(kept).sort().values if kept else groups.new_zeros(0)
        return keep[scores[keep].sort(descending=True, stable=stable)[1]]

    m = 2 * topk
    while m < n:
        cut = ranked[m - 1]
        kept = []
        for g, idx in enumerate(members):
            if g in done:
                kept.append(done[g])
                continue
            part = idx[scores[idx] >= cut]
            k = nms_of(part) if len(part) else part
            if len(part) == len(idx):
                done[g] = k
            kept.append(k)
        result = by_score(kept, stable=not tv_tie_order)
        s = scores[result]
        if tv_tie_order and bool((s[1:] == s[:-1]).any()):
            break  # equal scores among the kept boxes: only the full kept set orders them as torchvision does
        if len(result) >= topk:
            if len(result) > topk and bool(s[topk] == s[topk - 1]):
                break  # the topk-th kept box ties with the next: torchvision's order decides which is in
            return result
        m *= 4
    return by_score([done[g] if g in done else nms_of(idx) for g, idx in enumerate(members)])


def box_area(boxes: torch.Tensor, offset: int = 0) -> torch.Tensor:
    return (boxes[:, 2] - boxes[:, 0] + offset) * (boxes[:, 3] - boxes[:, 1] + offset)


def assign_levels(
    boxes: torch.Tensor,
    min_level: int,
    max_level: int,
    legacy: bool | str = False,
    canonical_size: int = 224,
    canonical_level: int = 4,
    eps: float = 1e-6,
) -> torch.Tensor:
    """FPN level of each RoI (FPN paper eq. 1), returned as 0-based index from ``min_level``.

    torchvision: ``floor(4 + log2(sqrt(area) / 224) + eps)``; Detectron (``legacy``):
    ``floor(4 + log2(sqrt(area_plus_one) / 224 + eps))``; detectron2 (``legacy="detectron2"``):
    ``floor(4 + log2(sqrt(area) / 224 + 1e-8))``.
    """
    if legacy == "detectron2":
        s = torch.sqrt(box_area(boxes))
        lvl = torch.floor(canonical_level + torch.log2(s / canonical_size + 1e-8))
    elif legacy:
        s = torch.sqrt(box_area(boxes, 1))
        lvl = torch.floor(canonical_level + torch.log2(s / canonical_size + eps))
    else:
        s = torch.sqrt(box_area(boxes))
        lvl = torch.floor(canonical_level + torch.log2(s / canonical_size) + torch.tensor(eps, dtype=s.dtype))
    return lvl.clamp(min=min_level, max=max_level).to(torch.int64) - min_level


def detectron2_cell_anchors(size: float, aspect_ratios) -> torch.Tensor:
    """(A, 4) anchors of detectron2's ``DefaultAnchorGenerator``: exact areas, centred at 0.

    For r = h / w: w = sqrt(size^2 / r), h = r * w; computed in double, stored as float32.
    """
    out = []
    for r in aspect_ratios:
        w = math.sqrt(size * size / r)
        h = r * w
        out.append([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0])
    return torch.tensor(out, dtype=torch.float32)


def paste_masks_aligned(
    masks: torch.Tensor, boxes: torch.Tensor, height: int, width: int, threshold: float = 0.5
) -> torch.Tensor:
    """detectron2's paste: sample each (M, M) mask at the image's pixel centres inside its box.

    Pixel (x + 0.5, y + 0.5) maps to [-1, 1] across the float box and is read from the mask
    with ``grid_sample`` (bilinear, zeros outside, align_corners=False); ``>= threshold``.
    Only a window around each box is computed.
    """
    n = masks.shape[0]
    out = torch.zeros((n, height, width), dtype=torch.bool, device=masks.device)
    for i in range(n):
        box = boxes[i : i + 1]
        x0i, y0i = torch.clamp(box.min(dim=0).values.floor()[:2] - 1, min=0).to(torch.int32).tolist()
        x1i = int(torch.clamp(box[:, 2].max().ceil() + 1, max=width).to(torch.int32))
        y1i = int(torch.clamp(box[:, 3].max().ceil() + 1, max=height).to(torch.int32))
        if x1i <= x0i or y1i <= y0i:
            continue
        x0, y0, x1, y1 = torch.split(box, 1, dim=1)
        img_y = torch.arange(y0i, y1i, device=masks.device, dtype=torch.float32) + 0.5
        img_x = torch.arange(x0i, x1i, device=masks.device, dtype=torch.float32) + 0.5
        img_y = (img_y - y0) / (y1 - y0) * 2 - 1
        img_x = (img_x - x0) / (x1 - x0) * 2 - 1
        gx = img_x[:, None, :].expand(1, img_y.size(1), img_x.size(1))
        gy = img_y[:, :, None].expand(1, img_y.size(1), img_x.size(1))
        grid = torch.stack([gx, gy], dim=3)
        sampled = F.grid_sample(masks[i : i + 1, None].float(), grid, align_corners=False)
        out[i, y0i:y1i, x0i:x1i] = sampled[0, 0] >= threshold
    return out


def detectron_cell_anchors(stride: int, size: float, aspect_ratios) -> torch.Tensor:
    """(A, 4) anchors of Detectron's ``generate_anchors`` for one FPN level.

    A ``stride`` x ``stride`` base box [0, 0, stride-1, stride-1] is reshaped to each
    aspect ratio r = h / w at constant area (sides rounded half-to-even), then scaled by
    ``size / stride``; boxes stay centred at ((stride-1)/2, (stride-1)/2) with +1 sizes.
    """
    ctr = 0.5 * (stride - 1)
    out = []
    for r in aspect_ratios:
        ws = float(np.round(np.sqrt(stride * stride / r)))
        hs = float(np.round(ws * r))
        ws, hs = ws * size / stride, hs * size / stride
        out.append([ctr - 0.5 * (ws - 1), ctr - 0.5 * (hs - 1), ctr + 0.5 * (ws - 1), ctr + 0.5 * (hs - 1)])
    return torch.tensor(out, dtype=torch.float32)


def paste_masks(
    masks: torch.Tensor, boxes: torch.Tensor, height: int, width: int, threshold: float = 0.5
) -> torch.Tensor:
    """Paste (N, M, M) mask probabilities into (N, height, width) bool masks.

    torchvision/Detectron geometry: the mask is padded by one pixel, the box expanded by
    (M + 2) / M about its centre and truncated to integers, the padded mask resized
    bilinearly (align_corners=False) to the box's (x2 - x1 + 1, y2 - y1 + 1) size, and
    binarized with ``> threshold``. Only the box region is interpolated.
    """
    n = masks.shape[0]
    out = torch.zeros((n, height, width), dtype=torch.bool, device=masks.device)
    if n == 0:
        return out
    m = masks.shape[-1]
    padded = F.pad(masks, (1, 1, 1, 1))
    scale = float(m + 2) / m
    w_half = (boxes[:, 2] - boxes[:, 0]) * 0.5 * scale
    h_half = (boxes[:, 3] - boxes[:, 1]) * 0.5 * scale
    x_c = (boxes[:, 2] + boxes[:, 0]) * 0.5
    y_c = (boxes[:, 3] + boxes[:, 1]) * 0.5
    ib = torch.stack((x_c - w_half, y_c - h_half, x_c + w_half, y_c + h_half), dim=1).to(torch.int64).tolist()
    for i, (x0, y0, x1, y1) in enumerate(ib):
        w = max(x1 - x0 + 1, 1)
        h = max(y1 - y0 + 1, 1)
        xa, xb = max(x0, 0), min(x1 + 1, width)
        ya, yb = max(y0, 0), min(y1 + 1, height)
        if xa >= xb or ya >= yb:
            continue
        res = F.interpolate(padded[i][None, None], size=(h, w), mode="bilinear", align_corners=False)[0, 0]
        out[i, ya:yb, xa:xb] = res[ya - y0 : yb - y0, xa - x0 : xb - x0] > threshold
    return out
