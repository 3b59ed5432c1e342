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


class MultiScaleRoIAlign(nn.Module):
    """RoIAlign each box on its FPN level (P2..P5 by default).

    Args:
        scales: spatial scale of each feature map (1/4, 1/8, ...).
        min_level: FPN level of the first feature map.
    Shapes: features[l] (N, C, H_l, W_l), boxes list of (R_i, 4) -> (sum R_i, C, S, S).
    """

    def __init__(
        self,
        output_size: int,
        scales: Sequence[float],
        sampling_ratio: int,
        aligned: bool = False,
        min_level: int = 2,
        legacy: bool | str = False,
    ) -> None:
        super().__init__()
        self.output_size = (output_size, output_size)
        self.scales = list(scales)
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned
        self.min_level = min_level
        self.legacy = legacy

    def forward(self, features: list[torch.Tensor], boxes: list[torch.Tensor]) -> torch.Tensor:
        cat = torch.cat(boxes)
        idx = torch.cat([torch.full((len(b), 1), i, dtype=cat.dtype, device=cat.device) for i, b in enumerate(boxes)])
        rois = torch.cat([idx, cat], dim=1)
        c = features[0].shape[1]
        out = features[0].new_zeros((len(rois), c, *self.output_size))
        if len(rois) == 0:
            return out
        levels = assign_levels(cat, self.min_level, self.min_level + len(features) - 1, self.legacy)
        for lvl, (feat, scale) in enumerate(zip(features, self.scales)):
            sel = torch.where(levels == lvl)[0]
            if sel.numel() == 0:
                continue
            out[sel] = roi_align(
                feat,
                rois[sel],
                self.output_size,
                spatial_scale=scale,
                sampling_ratio=self.sampling_ratio,
                aligned=self.aligned,
            ).to(out.dtype)
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
            x = F.relu(getattr(self, f"fc{i + 1}")(x))
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
        return self.predictor(F.relu(self.deconv(x)))


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
        keep = batched_nms(boxes, scores, labels, nms_thresh, off, inclusive=legacy)
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
