"""RoI heads: multi-scale RoIAlign, box head + predictor + post-processing, mask head."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.ops import roi_align

from .boxes import assign_levels, batched_nms, clip_boxes, decode_boxes, nonempty
from .norm import Conv2d

NormFn = Callable[[int], nn.Module | None]


def _axis_samples(start, bin_size, size: int, out: int, g: int):
    """Sample coordinates of RoIAlign along one axis, and their bilinear neighbours.

    ``start``, ``bin_size``: (R,) per RoI; ``g`` the samples per bin of this call.
    Returns, each (R, out, g): valid, low index, high index, low weight, high weight, with
    torchvision's (and Caffe2's) rules: a sample beyond [-1, size] contributes zero, one in
    [-1, 0] reads row 0, one past ``size - 1`` reads the last row.
    """
    dt = start.dtype
    p = torch.arange(out, dtype=dt, device=start.device)[None, :, None]
    i = torch.arange(g, dtype=dt, device=start.device)[None, None, :] + 0.5
    b = bin_size[:, None, None]
    # same operation order as the C++ kernel: (start + p * bin) + (i + .5) * bin / grid
    c = (start[:, None, None] + p * b) + i * b / g
    valid = (c >= -1.0) & (c <= size)
    c = c.clamp(min=0.0)
    lo = c.floor()
    top = lo >= size - 1
    last = torch.full_like(lo, size - 1)
    lo = torch.where(top, last, lo)
    c = torch.where(top, lo, c)
    hi = torch.where(top, lo, lo + 1)
    frac = c - lo
    lo_i = lo.to(torch.int64).clamp_(0, size - 1)
    hi_i = hi.to(torch.int64).clamp_(0, size - 1)
    return valid, lo_i, hi_i, 1.0 - frac, frac


def _roi_frame(rois: torch.Tensor, spatial_scale: float, aligned: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, 2) start (x, y) and extent (w, h) of each RoI in feature cells, as RoIAlign sees them:
    shifted by half a cell when ``aligned``, else at least one cell wide and tall."""
    off = 0.5 if aligned else 0.0
    start = rois[:, 1:3] * spatial_scale - off
    extent = (rois[:, 3:5] * spatial_scale - off) - start
    return start, extent if aligned else extent.clamp(min=1.0)


def roi_align_gather(
    table: torch.Tensor,
    height: int,
    width: int,
    rois: torch.Tensor,
    output_size: int,
    spatial_scale: float,
    grid: tuple[int, int],
    aligned: bool,
) -> torch.Tensor:
    """RoIAlign (torchvision's / Caffe2's arithmetic) as one weighted gather over NHWC features.

    Every output bin is the mean of ``gh x gw`` bilinear samples; each sample is a weighted
    sum of four feature rows, so a bin is one bag of ``4 gh gw`` (row, weight) pairs and the
    whole call is a single ``embedding_bag`` over ``table``, the features as rows
    (N*H*W, C). All RoIs of a call share the sampling grid ``grid`` = (gh, gw) samples per bin.
    Same values as ``torchvision.ops.roi_align`` up to the order of the float additions.

    Shapes: table (N*H*W, C), rois (R, 5) [batch index, x1, y1, x2, y2] -> (R, S, S, C).
    """
    r, s = len(rois), output_size
    gh, gw = grid
    if gh * gw == 0:  # an empty RoI (aligned, adaptive grid): no samples, zero output
        return table.new_zeros((r, s, s, table.shape[1]))
    start, extent = _roi_frame(rois, spatial_scale, aligned)
    bins = extent / s
    vy, y0, y1, wy0, wy1 = _axis_samples(start[:, 1], bins[:, 1], height, s, gh)
    vx, x0, x1, wx0, wx1 = _axis_samples(start[:, 0], bins[:, 0], width, s, gw)
    base = (rois[:, 0].to(torch.int64) * (height * width))[:, None, None]
    # (R, S, gh) rows and (R, S, gw) columns -> (R, S, S, gh, gw, 4) rows of the table
    row0 = (base + y0 * width)[:, :, None, :, None]
    row1 = (base + y1 * width)[:, :, None, :, None]
    col0, col1 = x0[:, None, :, None, :], x1[:, None, :, None, :]
    index = torch.stack((row0 + col0, row0 + col1, row1 + col0, row1 + col1), -1)
    a0, a1 = wy0[:, :, None, :, None], wy1[:, :, None, :, None]
    b0, b1 = wx0[:, None, :, None, :], wx1[:, None, :, None, :]
    weight = torch.stack((a0 * b0, a0 * b1, a1 * b0, a1 * b1), -1)
    valid = vy[:, :, None, :, None, None] & vx[:, None, :, None, :, None]
    weight = (weight * valid) / (gh * gw)
    bag = 4 * gh * gw
    out = F.embedding_bag(
        index.reshape(r * s * s, bag),
        table,
        per_sample_weights=weight.reshape(r * s * s, bag).to(table.dtype),
        mode="sum",
    )
    return out.view(r, s, s, -1)


def _adaptive_grids(rois: torch.Tensor, output_size: int, spatial_scale: float, aligned: bool) -> torch.Tensor:
    """(R, 2) sampling grid (gh, gw) per RoI for ``sampling_ratio <= 0``: ceil(roi size / S)."""
    extent = _roi_frame(rois, spatial_scale, aligned)[1]
    return torch.ceil(extent / output_size).to(torch.int64).flip(1)


class MultiScaleRoIAlign(nn.Module):
    """RoIAlign each box on its FPN level (P2..P5 by default).

    Args:
        scales: spatial scale of each feature map (1/4, 1/8, ...).
        min_level: FPN level of the first feature map.
        impl: ``"gather"`` (``roi_align_gather``: one vectorized weighted gather per level over
            channels-last features, multi-threaded) or ``"torchvision"``
            (``torchvision.ops.roi_align``, the reference; serial on CPU).
    Shapes: features[l] (N, C, H_l, W_l), boxes list of (R_i, 4) -> (sum R_i, C, S, S);
    with ``impl="gather"`` the result has channels-last strides.
    """

    def __init__(
        self,
        output_size: int,
        scales: Sequence[float],
        sampling_ratio: int,
        aligned: bool = False,
        min_level: int = 2,
        legacy: bool | str = False,
        impl: str = "gather",
    ) -> None:
        super().__init__()
        if impl not in ("gather", "torchvision"):
            raise ValueError(f"unknown RoIAlign implementation {impl!r}; choose gather or torchvision")
        self.output_size = (output_size, output_size)
        self.scales = list(scales)
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned
        self.min_level = min_level
        self.legacy = legacy
        self.impl = impl

    def forward(self, features: list[torch.Tensor], boxes: list[torch.Tensor]) -> torch.Tensor:
        cat = torch.cat(boxes)
        idx = torch.cat([torch.full((len(b), 1), i, dtype=cat.dtype, device=cat.device) for i, b in enumerate(boxes)])
        rois = torch.cat([idx, cat], dim=1)
        c = features[0].shape[1]
        s = self.output_size[0]
        if len(rois) == 0:
            return features[0].new_zeros((0, c, s, s))
        levels = assign_levels(cat, self.min_level, self.min_level + len(features) - 1, self.legacy)
        gather = self.impl == "gather"
        out = features[0].new_empty((len(rois), s, s, c) if gather else (len(rois), c, s, s))
        for lvl, (feat, scale) in enumerate(zip(features, self.scales)):
            sel = torch.where(levels == lvl)[0]
            if sel.numel() == 0:
                continue
            if gather:
                y = self._gather_level(feat, rois[sel], scale)
            else:
                y = roi_align(
                    feat,
                    rois[sel],
                    self.output_size,
                    spatial_scale=scale,
                    sampling_ratio=self.sampling_ratio,
                    aligned=self.aligned,
                )
            if sel.numel() == len(rois):
                out = y.to(out.dtype)
            else:
                out.index_copy_(0, sel, y.to(out.dtype))
        return out.permute(0, 3, 1, 2) if gather else out

    def _gather_level(self, feat: torch.Tensor, rois: torch.Tensor, scale: float) -> torch.Tensor:
        n, c, h, w = feat.shape
        table = feat.permute(0, 2, 3, 1).reshape(n * h * w, c)  # a view for channels-last features
        s = self.output_size[0]
        args = (table, h, w)
        if self.sampling_ratio > 0:
            return roi_align_gather(*args, rois, s, scale, (self.sampling_ratio,) * 2, self.aligned)
        # adaptive sampling: one call per distinct (gh, gw) grid
        grids, which = torch.unique(_adaptive_grids(rois, s, scale, self.aligned), dim=0, return_inverse=True)
        if len(grids) == 1:
            return roi_align_gather(*args, rois, s, scale, tuple(grids[0].tolist()), self.aligned)
        out = table.new_empty((len(rois), s, s, c))
        for j, grid in enumerate(grids.tolist()):
            sel = torch.where(which == j)[0]
            out.index_copy_(0, sel, roi_align_gather(*args, rois[sel], s, scale, tuple(grid), self.aligned))
        return out


class BoxHead(nn.Module):
    """``num_conv`` 3x3 conv(+norm)+ReLU, flatten, ``num_fc`` fc+ReLU: (R, C, 7, 7) -> (R, fc_dim)."""

    def __init__(
        self,
        in_channels: int,
        resolution: int,
        num_conv: int,
        conv_dim: int,
        num_fc: int,
        fc_dim: int,
        norm: NormFn,
    ) -> None:
        super().__init__()
        self.num_conv, self.num_fc = num_conv, num_fc
        c = in_channels
        for i in range(num_conv):
            nm = norm(conv_dim)
            self.add_module(f"conv{i + 1}", Conv2d(c, conv_dim, 3, padding=1, bias=nm is None, norm=nm, relu=True))
            c = conv_dim
        d = c * resolution * resolution
        for i in range(num_fc):
            self.add_module(f"fc{i + 1}", nn.Linear(d, fc_dim))
            d = fc_dim
        self.out_dim = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.num_conv):
            x = getattr(self, f"conv{i + 1}")(x)
        x = x.flatten(1)
        for i in range(self.num_fc):
            x = F.relu_(getattr(self, f"fc{i + 1}")(x))
        return x


class BoxPredictor(nn.Module):
    """Class logits (R, K) and class-specific box deltas (R, 4K); K includes background."""

    def __init__(self, in_dim: int, num_classes: int, num_bbox_reg_classes: int | None = None) -> None:
        super().__init__()
        self.cls_score = nn.Linear(in_dim, num_classes)
        self.bbox_pred = nn.Linear(in_dim, 4 * (num_bbox_reg_classes or num_classes))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cls_score(x), self.bbox_pred(x)


class MaskHead(nn.Module):
    """``num_conv`` 3x3 conv(+norm)+ReLU, 2x2/2 deconv+ReLU, 1x1 predictor.

    Shapes: (R, C, 14, 14) -> logits (R, num_classes, 28, 28).
    """

    def __init__(self, in_channels: int, num_conv: int, conv_dim: int, num_classes: int, norm: NormFn) -> None:
        super().__init__()
        self.num_conv = num_conv
        c = in_channels
        for i in range(num_conv):
            nm = norm(conv_dim)
            self.add_module(f"mask_fcn{i + 1}", Conv2d(c, conv_dim, 3, padding=1, bias=nm is None, norm=nm, relu=True))
            c = conv_dim
        self.deconv = nn.ConvTranspose2d(c, conv_dim, 2, stride=2)
        self.predictor = nn.Conv2d(conv_dim, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.num_conv):
            x = getattr(self, f"mask_fcn{i + 1}")(x)
        return self.predictor(F.relu_(self.deconv(x)))


def box_postprocess(
    logits: torch.Tensor,
    deltas: torch.Tensor,
    proposals: list[torch.Tensor],
    image_sizes: list[tuple[int, int]],
    bbox_weights: tuple[float, float, float, float],
    score_thresh: float,
    nms_thresh: float,
    topk: int,
    min_box_size: float | None,
    bg_last: bool = False,
    legacy: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Softmax, class-specific decode, clip, threshold, per-class NMS, top-k.

    Boxes are decoded against ``proposals`` and clipped to ``image_sizes`` (the same
    coordinate frame). ``min_box_size`` None skips the small-box filter. ``legacy`` is
    Detectron's arithmetic: +1 box sizes, NMS suppressing at IoU >= ``nms_thresh``, and at
    the cap every detection scoring at least the ``topk``-th best score is kept (ties can
    exceed ``topk``).

    Returns, per image, ``(boxes (D, 4), scores (D,), labels (D,))`` with labels the
    checkpoint's class index, sorted by decreasing score.
    """
    num_classes = logits.shape[1]
    off = int(legacy)
    scores_all = F.softmax(logits, -1)
    fg = slice(0, num_classes - 1) if bg_last else slice(1, num_classes)
    first_fg = fg.start
    reg_classes = deltas.shape[1] // 4
    results = []
    start = 0
    for props, (h, w) in zip(proposals, image_sizes):
        end = start + len(props)
        scores = scores_all[start:end, fg]
        # threshold first, then decode only the surviving (proposal, class) pairs: the same
        # values as decoding all R x K boxes, in the same (proposal-major) order
        rows, cols = torch.where(scores > score_thresh)
        labels = cols + first_fg
        if reg_classes == 1:  # class-agnostic regression
            d = deltas[start:end][rows]
        else:
            reg_col = labels if reg_classes == num_classes else cols  # detectron2: no bg rows
            d = deltas[start:end].view(-1, reg_classes, 4)[rows, reg_col]
        boxes = clip_boxes(decode_boxes(d, props[rows], bbox_weights, off), h, w, off)
        scores = scores[rows, cols]
        start = end
        if min_box_size is not None:
            keep = torch.where(nonempty(boxes, min_box_size, off))[0]
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        keep = batched_nms(boxes, scores, labels, nms_thresh, off, inclusive=legacy, topk=topk)
        if legacy and len(keep) > topk:
            keep = keep[scores[keep] >= scores[keep][topk - 1]]
        else:
            keep = keep[:topk]
        results.append((boxes[keep], scores[keep], labels[keep]))
    return results


def select_class_masks(mask_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(R, K, M, M) logits, (R,) labels -> (R, M, M) probabilities of each box's class."""
    if mask_logits.shape[1] == 1:
        return mask_logits[:, 0].sigmoid()
    idx = torch.arange(len(labels), device=labels.device)
    return mask_logits[idx, labels].sigmoid()
