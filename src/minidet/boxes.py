"""Box arithmetic shared by the RPN and the RoI heads (x1, y1, x2, y2 boxes), and the exact NMS. ``offset``:
0 for torchvision/detectron2 (width = x2 - x1), 1 for Detectron's pixel-inclusive boxes (x2 - x1 + 1).
mmdetection's decoder and mmcv's NMS (``MMCVBoxRule``) are restated at the end."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torchvision.ops import batched_nms as _tv_batched_nms
from torchvision.ops import nms as _tv_nms

BBOX_XFORM_CLIP = math.log(1000.0 / 16)


def decode_boxes(
    deltas: torch.Tensor, boxes: torch.Tensor, weights: tuple[float, float, float, float], offset: int = 0
) -> torch.Tensor:
    """Apply (R, 4k) (dx, dy, dw, dh) deltas for k classes (or k=1) to (R, 4) boxes -> (R, 4k) boxes."""
    boxes = boxes.to(deltas.dtype)
    widths, heights = boxes[:, 2] - boxes[:, 0] + offset, boxes[:, 3] - boxes[:, 1] + offset
    ctr_x, ctr_y = boxes[:, 0] + 0.5 * widths, boxes[:, 1] + 0.5 * heights
    wx, wy, ww, wh = weights
    dw = torch.clamp(deltas[:, 2::4] / ww, max=BBOX_XFORM_CLIP)
    dh = torch.clamp(deltas[:, 3::4] / wh, max=BBOX_XFORM_CLIP)
    pred_x = deltas[:, 0::4] / wx * widths[:, None] + ctr_x[:, None]  # the predicted centres
    pred_y = deltas[:, 1::4] / wy * heights[:, None] + ctr_y[:, None]
    half_w, half_h = 0.5 * (torch.exp(dw) * widths[:, None]), 0.5 * (torch.exp(dh) * heights[:, None])
    corners = (pred_x - half_w, pred_y - half_h, pred_x + half_w - offset, pred_y + half_h - offset)
    return torch.stack(corners, dim=2).flatten(1)


def clip_boxes(boxes: torch.Tensor, height: int, width: int, offset: int = 0) -> torch.Tensor:
    """Clamp (..., 4) boxes to [0, width - offset] x [0, height - offset]."""
    x, y = boxes[..., 0::2].clamp(min=0, max=width - offset), boxes[..., 1::2].clamp(min=0, max=height - offset)
    return torch.stack((x, y), dim=-1).reshape(boxes.shape)


def nonempty(boxes: torch.Tensor, min_size: float, offset: int = 0) -> torch.Tensor:
    """Bool mask (R,) of boxes whose width and height are >= ``min_size``."""
    return (boxes[:, 2] - boxes[:, 0] + offset >= min_size) & (boxes[:, 3] - boxes[:, 1] + offset >= min_size)


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, thresh: float, offset: int = 0,
    inclusive: bool = False, topk: int | None = None, *, tv_tie_order: bool,
) -> torch.Tensor:
    """NMS within each group id: boxes (R, 4), scores (R,), groups (R,) int64 -> kept indices (K,) int64 by decreasing
    score. Suppresses at IoU > ``thresh`` (torchvision); ``offset=1, inclusive=True`` is Detectron's IoU with +1
    sizes, suppressing at IoU >= ``thresh``. ``topk``: only the best ``topk`` kept boxes are wanted; the result is the
    full result's leading part holding every kept box scoring at least the ``topk``-th. ``tv_tie_order``: kept boxes
    of equal score in torchvision's (unstable-sort) order, else in index order (the same leading ``topk``). Why both
    are exact: docs/exactness.md, "Exact top-k NMS"."""
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
    ranked = scores.sort(descending=True).values
    if boxes.numel() > (4000 if boxes.device.type == "cpu" else 20000):  # torchvision's choice, on the full set
        return _topk_per_group(boxes, scores, groups, thresh, topk, ranked, tv_tie_order)
    # group shifts from the full set's largest coordinate, as torchvision computes them
    boxes = boxes + (groups.to(boxes) * (boxes.max() + torch.tensor(1).to(boxes)))[:, None]
    m = 2 * topk
    while m < n:
        sel = torch.where(scores >= ranked[m - 1])[0]  # index order kept: the stable sort agrees
        keep = _tv_nms(boxes[sel], scores[sel], thresh)
        if len(keep) >= topk:
            return sel[keep]
        m *= 4
    return _tv_nms(boxes, scores, thresh)


def _topk_per_group(
    boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, thresh: float, topk: int,
    ranked: torch.Tensor, tv_tie_order: bool,
) -> torch.Tensor:
    """``batched_nms(..., topk)`` with torchvision's per-group strategy: rounds of per-group NMS over
    the boxes scoring at least a falling cut; a group whose boxes all pass the cut is final. Ties
    among kept boxes run the full set (docs/exactness.md, "Exact top-k NMS")."""
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


@dataclass(frozen=True)
class BoxRule:
    """A weight family's box arithmetic: ``offset`` 1 for +1 box sizes, ``inclusive_nms`` for NMS
    suppressing at IoU >= thresh (Detectron); torchvision and detectron2 are ``BoxRule(0, False)``."""

    offset: int = 0
    inclusive_nms: bool = False

    def decode(self, deltas: torch.Tensor, boxes: torch.Tensor, weights: tuple[float, float, float, float]):
        return decode_boxes(deltas, boxes, weights, self.offset)

    def clip(self, boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
        return clip_boxes(boxes, height, width, self.offset)

    def nonempty(self, boxes: torch.Tensor, min_size: float) -> torch.Tensor:
        return nonempty(boxes, min_size, self.offset)

    def nms(self, boxes, scores, groups, thresh: float, *, topk: int | None = None, tv_tie_order: bool,
            class_agnostic: bool = False):
        """NMS within each group (``class_agnostic``: over all boxes as one group) -> kept indices by score."""
        off, inclusive = self.offset, self.inclusive_nms
        groups = torch.zeros_like(groups) if class_agnostic else groups
        return batched_nms(boxes, scores, groups, thresh, off, inclusive, topk, tv_tie_order=tv_tie_order)


PLAIN_BOX_RULE = BoxRule(0, False)  # width = x2 - x1, NMS suppressing at IoU > thresh


# mmdetection's DeltaXYWHBBoxCoder clamps dw, dh to +-|log(wh_ratio_clip)|, wh_ratio_clip = 16 / 1000 (numpy's log)
MMDET_WH_CLIP = float(np.abs(np.log(16 / 1000)))
MMCV_SPLIT_THR = 10000  # mmcv's batched_nms: fewer boxes run as one NMS over group-shifted boxes


def decode_boxes_mmdet(deltas: torch.Tensor, boxes: torch.Tensor, weights: tuple[float, float, float, float]):
    """mmdetection's ``delta2bbox``: (R, 4k) deltas for k classes times its ``target_stds`` (1 / ``weights``; its
    ``target_means`` are 0) applied to (R, 4) boxes -> (R, 4k). The centre is (x1 + x2) * 0.5, the size x2 - x1;
    dw, dh are clamped on both sides, to +-``MMDET_WH_CLIP``."""
    r, k = deltas.shape[0], deltas.shape[1] // 4
    d = deltas.reshape(-1, 4) * deltas.new_tensor([1.0 / w for w in weights]).view(1, -1)
    rois = boxes.to(deltas.dtype).repeat(1, k).reshape(-1, 4)
    pxy, pwh = (rois[:, :2] + rois[:, 2:]) * 0.5, rois[:, 2:] - rois[:, :2]
    dwh = d[:, 2:].clamp(min=-MMDET_WH_CLIP, max=MMDET_WH_CLIP)
    gxy, gwh = pxy + pwh * d[:, :2], pwh * dwh.exp()
    return torch.cat([gxy - gwh * 0.5, gxy + gwh * 0.5], dim=-1).reshape(r, 4 * k)


def mmcv_nms(boxes: torch.Tensor, scores: torch.Tensor, thresh: float) -> torch.Tensor:
    """mmcv's CPU ``nms`` kernel: boxes (R, 4), scores (R,) -> kept indices (K,) by rank. It ranks the boxes by
    ``scores.sort(descending=True)``, PyTorch's unstable sort (equal scores come in that sort's order, not by
    index as in torchvision), and suppresses at IoU > ``thresh`` compared in float32. Its IoU is torchvision's, so
    torchvision's kernel runs on the boxes in that order (its stable sort keeps it) at the float32 threshold."""
    order = scores.sort(descending=True)[1]
    t = float(torch.tensor(thresh, dtype=torch.float32))
    return order[_tv_nms(boxes[order], scores[order], t)]


def mmcv_batched_nms(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, thresh: float,
                     class_agnostic: bool = False) -> torch.Tensor:
    """mmcv's ``batched_nms``: NMS within each group id -> kept indices by decreasing score. Every box is shifted by
    group id * (largest coordinate + 1) in float32, which rounds the shifted coordinates and so the IoUs mmcv
    compares (``class_agnostic``: not shifted, so that under the split threshold one NMS runs over all boxes as if one
    group); under ``MMCV_SPLIT_THR`` boxes one ``mmcv_nms`` runs over all of them, else one per group (even
    ``class_agnostic``, as mmcv does) and the kept boxes are ranked by another unstable sort of their scores."""
    if len(boxes) == 0:
        return groups.new_zeros(0)
    shifted = boxes
    if not class_agnostic:  # each group apart by the largest coordinate + 1
        shifted = boxes + (groups.to(boxes) * (boxes.max() + torch.tensor(1).to(boxes)))[:, None]
    if len(boxes) < MMCV_SPLIT_THR:
        return mmcv_nms(shifted, scores, thresh)
    kept = torch.zeros(len(boxes), dtype=torch.bool, device=boxes.device)
    for g in torch.unique(groups):
        idx = torch.where(groups == g)[0]
        kept[idx[mmcv_nms(shifted[idx], scores[idx], thresh)]] = True
    keep = torch.where(kept)[0]
    return keep[scores[keep].sort(descending=True)[1]]


@dataclass(frozen=True)
class MMCVBoxRule(BoxRule):
    """mmdetection's box arithmetic: widths without +1 and clipping as ``PLAIN_BOX_RULE``, its own decoder
    (``decode_boxes_mmdet``) and mmcv's NMS (``mmcv_batched_nms``: always the whole result, so ``topk`` and
    ``tv_tie_order`` do not apply)."""

    def decode(self, deltas: torch.Tensor, boxes: torch.Tensor, weights: tuple[float, float, float, float]):
        return decode_boxes_mmdet(deltas, boxes, weights)

    def nms(self, boxes, scores, groups, thresh: float, *, topk: int | None = None, tv_tie_order: bool,
            class_agnostic: bool = False):
        return mmcv_batched_nms(boxes, scores, groups, thresh, class_agnostic)


MMDET_BOX_RULE = MMCVBoxRule()
