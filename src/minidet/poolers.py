"""RoI pooling: the gather RoIAlign, multi-scale RoIAlign over the FPN levels, the FPN level rules."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.ops import roi_align

ROI_ALIGN_IMPLS = ("gather", "torchvision")  # MultiScaleRoIAlign(impl=...), config MODEL.ROI_ALIGN_IMPL
LevelRule = Callable[[torch.Tensor, int, int], torch.Tensor]  # (boxes (R, 4), min, max level) -> (R,) 0-based


def _level_index(level: torch.Tensor, min_level: int, max_level: int) -> torch.Tensor:
    return level.clamp(min=min_level, max=max_level).to(torch.int64) - min_level


def _sqrt_area(boxes: torch.Tensor, offset: int = 0) -> torch.Tensor:
    return torch.sqrt((boxes[:, 2] - boxes[:, 0] + offset) * (boxes[:, 3] - boxes[:, 1] + offset))


def torchvision_levels(boxes: torch.Tensor, min_level: int, max_level: int) -> torch.Tensor:
    """FPN level (FPN paper eq. 1), 0-based from ``min_level``: ``floor(4 + log2(sqrt(area) / 224) + 1e-6)``."""
    s = _sqrt_area(boxes)
    return _level_index(torch.floor(4 + torch.log2(s / 224) + torch.tensor(1e-6, dtype=s.dtype)), min_level, max_level)


def detectron_levels(boxes: torch.Tensor, min_level: int, max_level: int) -> torch.Tensor:
    """Detectron: ``floor(4 + log2(sqrt(area with +1 sizes) / 224 + 1e-6))``."""
    return _level_index(torch.floor(4 + torch.log2(_sqrt_area(boxes, 1) / 224 + 1e-6)), min_level, max_level)


def detectron2_levels(boxes: torch.Tensor, min_level: int, max_level: int) -> torch.Tensor:
    """detectron2: ``floor(4 + log2(sqrt(area) / 224 + 1e-8))``."""
    return _level_index(torch.floor(4 + torch.log2(_sqrt_area(boxes) / 224 + 1e-8)), min_level, max_level)


def mmdet_levels(boxes: torch.Tensor, min_level: int, max_level: int) -> torch.Tensor:
    """mmdetection's ``SingleRoIExtractor``: ``floor(log2(sqrt(area) / 56 + 1e-6))`` (56: its finest scale, the first
    level's), clamped to the levels."""
    level = torch.floor(torch.log2(_sqrt_area(boxes) / 56 + 1e-6))
    return level.clamp(min=0, max=max_level - min_level).to(torch.int64)


def _axis_samples(start, bin_size, size: int, out: int, g: int):
    """RoIAlign's sample coordinates along one axis (``start``, ``bin_size``: (R,); ``g`` samples per bin) -> each
    (R, out, g): valid, low index, high index, low weight, high weight. torchvision's (and Caffe2's) rules: a sample
    beyond [-1, size] contributes zero, one in [-1, 0] reads row 0, one past ``size - 1`` reads the last row."""
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
    lo = torch.where(top, torch.full_like(lo, size - 1), lo)
    c = torch.where(top, lo, c)
    hi = torch.where(top, lo, lo + 1)
    frac = c - lo
    return valid, lo.to(torch.int64).clamp_(0, size - 1), hi.to(torch.int64).clamp_(0, size - 1), 1.0 - frac, frac


def _roi_frame(rois: torch.Tensor, spatial_scale: float, aligned: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, 2) start (x, y) and extent (w, h) of each RoI in feature cells, as RoIAlign sees them:
    shifted by half a cell when ``aligned``, else at least one cell wide and tall."""
    off = 0.5 if aligned else 0.0
    start = rois[:, 1:3] * spatial_scale - off
    extent = (rois[:, 3:5] * spatial_scale - off) - start
    return start, extent if aligned else extent.clamp(min=1.0)


def roi_align_gather(
    table: torch.Tensor, height: int, width: int, rois: torch.Tensor, output_size: int, spatial_scale: float,
    grid: tuple[int, int], aligned: bool,
) -> torch.Tensor:
    """RoIAlign (torchvision's / Caffe2's arithmetic) as one weighted gather over NHWC features: table (N*H*W, C),
    rois (R, 5) [batch index, x1, y1, x2, y2] -> (R, S, S, C). A bin is the mean of ``gh x gw`` bilinear samples of
    four feature rows each: one ``embedding_bag`` over ``table``, all RoIs sharing ``grid`` = (gh, gw). Same values
    as ``torchvision.ops.roi_align`` up to the order of the sums."""
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
    row0, row1 = ((base + y * width)[:, :, None, :, None] for y in (y0, y1))
    col0, col1 = x0[:, None, :, None, :], x1[:, None, :, None, :]
    index = torch.stack((row0 + col0, row0 + col1, row1 + col0, row1 + col1), -1)
    a0, a1 = wy0[:, :, None, :, None], wy1[:, :, None, :, None]
    b0, b1 = wx0[:, None, :, None, :], wx1[:, None, :, None, :]
    weight = torch.stack((a0 * b0, a0 * b1, a1 * b0, a1 * b1), -1)
    valid = vy[:, :, None, :, None, None] & vx[:, None, :, None, :, None]
    weight = (weight * valid) / (gh * gw)
    bag = 4 * gh * gw
    index, weight = index.reshape(r * s * s, bag), weight.reshape(r * s * s, bag).to(table.dtype)
    return F.embedding_bag(index, table, per_sample_weights=weight, mode="sum").view(r, s, s, -1)


class MultiScaleRoIAlign(nn.Module):
    """RoIAlign each box on its FPN level: features[l] (N, C, H_l, W_l), boxes list of (R_i, 4) -> (sum R_i, C, S, S)
    (channels-last strides for ``impl="gather"``). ``scales``: spatial scale of each feature map (1/4, 1/8, ...);
    ``min_level``: FPN level of the first; ``aligned``: shifted by half a pixel (ROIAlignV2); ``level_rule``: a
    ``LevelRule``; ``impl``: ``"gather"`` (``roi_align_gather``, on channels-last features) or ``"torchvision"``
    (``torchvision.ops.roi_align``, the reference; serial on CPU)."""

    def __init__(
        self, output_size: int, scales: Sequence[float], sampling_ratio: int, aligned: bool = False,
        min_level: int = 2, level_rule: LevelRule = torchvision_levels, impl: str = "gather",
    ) -> None:
        super().__init__()
        if impl not in ROI_ALIGN_IMPLS:
            raise ValueError(f"unknown RoIAlign implementation {impl!r}; choose one of {', '.join(ROI_ALIGN_IMPLS)}")
        self.output_size, self.scales, self.sampling_ratio = (output_size, output_size), list(scales), sampling_ratio
        self.aligned, self.min_level, self.level_rule, self.impl = aligned, min_level, level_rule, impl

    def layout(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """The pooled levels (the first ``len(scales)``) in the memory layout ``impl`` reads (NCHW for
        torchvision's, channels-last for the gather), to convert once for every pooler of that ``impl``."""
        fmt = torch.contiguous_format if self.impl == "torchvision" else torch.channels_last
        return [f.contiguous(memory_format=fmt) for f in features[: len(self.scales)]]

    def forward(self, features: list[torch.Tensor], boxes: list[torch.Tensor]) -> torch.Tensor:
        cat = torch.cat(boxes)
        idx = torch.cat([torch.full((len(b), 1), i, dtype=cat.dtype, device=cat.device) for i, b in enumerate(boxes)])
        rois = torch.cat([idx, cat], dim=1)
        c, s = features[0].shape[1], self.output_size[0]
        if len(rois) == 0:
            return features[0].new_zeros((0, c, s, s))
        levels = self.level_rule(cat, self.min_level, self.min_level + len(features) - 1)
        gather = self.impl == "gather"
        out = features[0].new_empty((len(rois), s, s, c) if gather else (len(rois), c, s, s))
        for lvl, (feat, scale) in enumerate(zip(features, self.scales)):
            sel = torch.where(levels == lvl)[0]
            if sel.numel() == 0:
                continue
            y = (self._gather_level(feat, rois[sel], scale) if gather
                 else roi_align(feat, rois[sel], self.output_size, scale, self.sampling_ratio, self.aligned))
            y = y.to(out.dtype)
            out = y if sel.numel() == len(rois) else out.index_copy_(0, sel, y)
        return out.permute(0, 3, 1, 2) if gather else out

    def _gather_level(self, feat: torch.Tensor, rois: torch.Tensor, scale: float) -> torch.Tensor:
        n, c, h, w = feat.shape
        table = feat.permute(0, 2, 3, 1).reshape(n * h * w, c)  # a view for channels-last features
        s = self.output_size[0]
        args = (table, h, w)
        if self.sampling_ratio > 0:
            return roi_align_gather(*args, rois, s, scale, (self.sampling_ratio,) * 2, self.aligned)
        # adaptive sampling: (gh, gw) = ceil(RoI size / S) samples per bin, one call per distinct grid
        per_roi = torch.ceil(_roi_frame(rois, scale, self.aligned)[1] / s).to(torch.int64).flip(1)
        grids, which = torch.unique(per_roi, dim=0, return_inverse=True)
        if len(grids) == 1:
            return roi_align_gather(*args, rois, s, scale, tuple(grids[0].tolist()), self.aligned)
        out = table.new_empty((len(rois), s, s, c))
        for j, grid in enumerate(grids.tolist()):
            sel = torch.where(which == j)[0]
            out.index_copy_(0, sel, roi_align_gather(*args, rois[sel], s, scale, tuple(grid), self.aligned))
        return out
