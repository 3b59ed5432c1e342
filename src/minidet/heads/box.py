"""The box head (convs and fcs on the pooled RoIs) and the box predictor with its post-processing."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ..boxes import PLAIN_BOX_RULE, BoxRule
from ..layers import Conv2d, Linear
from ..norm import NormFn
from .detections import Detections


class BoxHead(nn.Module):
    """``num_conv`` 3x3 conv(+norm)+ReLU, flatten, ``num_fc`` fc(+norm)+ReLU: (R, C, 7, 7) -> (R, fc_dim).
    ``fc_norm``: each fc bias-free and followed by this norm (``fc<i>_norm``; maskrcnn-benchmark's GN MLP head)."""

    def __init__(
        self, in_channels: int, resolution: int, num_conv: int, conv_dim: int, num_fc: int, fc_dim: int, norm: NormFn,
        fc_norm: NormFn | None = None,
    ) -> None:
        super().__init__()
        self.num_conv, self.num_fc, self.norm_fc = num_conv, num_fc, fc_norm is not None
        c = in_channels
        for i in range(num_conv):
            nm = norm(conv_dim)
            self.add_module(f"conv{i + 1}", Conv2d(c, conv_dim, 3, padding=1, bias=nm is None, norm=nm, relu=True))
            c = conv_dim
        d = c * resolution * resolution
        for i in range(num_fc):
            self.add_module(f"fc{i + 1}", Linear(d, fc_dim, bias=fc_norm is None, relu=fc_norm is None))
            if fc_norm is not None:
                self.add_module(f"fc{i + 1}_norm", fc_norm(fc_dim))
            d = fc_dim
        self.out_dim = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.num_conv):
            x = getattr(self, f"conv{i + 1}")(x)
        if self.num_fc == 0:
            return x.flatten(1)
        for i in range(self.num_fc):
            fc = getattr(self, f"fc{i + 1}")
            x = fc.flat(x) if i == 0 else fc(x)  # fc.relu: ReLU inside fc, unless a norm comes first
            if self.norm_fc:
                x = F.relu_(getattr(self, f"fc{i + 1}_norm")(x))
        return x


class BoxPredictor(nn.Module):
    """Class logits (R, K) and box deltas (R, 4K') (K includes background; K' = K class-specific, K - 1 with the
    background last, 1 or 2 (background and foreground) class-agnostic). ``inference`` turns them into
    detections: ``detections_per_image`` is the cap, ``min_box_size`` None: no small-box filter, ``bg_last``: background
    last (else first); ``box_rule``, ``ties_at_cap``, ``original_frame``: the weight family's (``conventions``);
    ``class_agnostic_nms``: one NMS over the boxes of every class (mmdetection's Panoptic FPN)."""

    def __init__(
        self, in_dim: int, num_classes: int, num_bbox_reg_classes: int | None = None, *,
        bbox_reg_weights: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0), score_thresh: float = 0.05,
        nms_thresh: float = 0.5, detections_per_image: int = 100, min_box_size: float | None = None,
        bg_last: bool = False, box_rule: BoxRule = PLAIN_BOX_RULE, ties_at_cap: bool = False,
        original_frame: bool = False, class_agnostic_nms: bool = False,
    ) -> None:
        super().__init__()
        self.cls_score = Linear(in_dim, num_classes)
        self.bbox_pred = Linear(in_dim, 4 * (num_bbox_reg_classes or num_classes))
        self.bbox_reg_weights = tuple(bbox_reg_weights)
        self.score_thresh, self.nms_thresh, self.detections_per_image = score_thresh, nms_thresh, detections_per_image
        self.min_box_size, self.bg_last, self.box_rule = min_box_size, bg_last, box_rule
        self.ties_at_cap, self.original_frame, self.class_agnostic_nms = ties_at_cap, original_frame, class_agnostic_nms

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cls_score(x), self.bbox_pred(x)

    def refine(self, deltas: torch.Tensor, proposals: list[torch.Tensor], sizes: list[tuple[int, int]]) -> list:
        """A cascade stage's boxes for the next: class-agnostic ``deltas`` (R, 4) float32 applied to the concatenated
        ``proposals`` (R_i, 4) of the resized frame, clipped to each image's ``sizes`` (h, w); per image (R_i, 4)."""
        rule, weights = self.box_rule, self.bbox_reg_weights
        # one image (the exported graph's, whose box count is data-dependent): its deltas whole, not split
        split = (deltas,) if len(proposals) == 1 else deltas.split([len(p) for p in proposals])
        parts = zip(proposals, split, sizes)
        return [rule.clip(rule.decode(d, p, weights), h, w) for p, d, (h, w) in parts]

    def inference(self, logits: torch.Tensor, deltas: torch.Tensor, proposals: list[torch.Tensor], images, *,
                  probabilities: bool = False) -> list:
        """Softmax, threshold, class-specific decode, clip, per-class NMS, cap -> one ``Detections`` per
        image, from ``logits`` (R, K) (``probabilities``: already the class probabilities), ``deltas`` (R, 4K') float32
        for the concatenated ``proposals`` (R_i, 4) in the resized frame; ``images`` is the chunk's
        ``transform.ImageBatch``."""
        sizes, frame = (images.orig_sizes, "original") if self.original_frame else (images.sizes, "resized")
        if self.original_frame:  # proposals to original-image pixels
            proposals = [b / s for b, s in zip(proposals, images.scales)]
        rule, topk = self.box_rule, self.detections_per_image
        scores_all = logits if probabilities else F.softmax(logits, -1)
        counts = [len(p) for p in proposals]
        results = []
        for props, (h, w), probs, dl in zip(proposals, sizes, scores_all.split(counts), deltas.split(counts)):
            boxes, scores, labels = self.candidates(probs, dl, props, h, w)
            keep = rule.nms(boxes, scores, labels, self.nms_thresh, topk=topk, tv_tie_order=True,
                            class_agnostic=self.class_agnostic_nms)
            at_cap = self.ties_at_cap and len(keep) > topk
            keep = keep[scores[keep] >= scores[keep][topk - 1]] if at_cap else keep[:topk]
            results.append(Detections(boxes[keep], scores[keep], labels[keep], frame))
        return results

    def inference_image(self, logits: torch.Tensor, deltas: torch.Tensor, proposals: torch.Tensor,
                        size: tuple, original_size: tuple, scale, nms: Callable, *,
                        probabilities: bool = False) -> Detections:
        """``inference`` of one image (``size``, ``original_size``: (h, w); ``scale``: its resize factor) in operators
        that ``torch.export`` follows through any count of boxes: ``nms(box_rule, boxes, scores, groups, thresh,
        num_groups)`` the graph's NMS (kept indices by decreasing score, no top-k shortcut), the cap without a branch
        on the count (with ``ties_at_cap``: every detection scoring at least the cap-th)."""
        (h, w), frame = (original_size, "original") if self.original_frame else (size, "resized")
        if self.original_frame:
            proposals = proposals / scale
        probs = logits if probabilities else F.softmax(logits, -1)
        boxes, scores, labels = self.candidates(probs, deltas, proposals, h, w)
        # one NMS over every class's boxes: one group
        groups, num_groups = (labels * 0, 1) if self.class_agnostic_nms else (labels, probs.shape[1])
        keep = nms(self.box_rule, boxes, scores, groups, self.nms_thresh, num_groups)
        cap = self.detections_per_image
        if self.ties_at_cap:
            s = scores[keep]
            keep = keep[s >= torch.cat([s[:cap], s.new_full((1,), float("inf"))]).min()]
        else:
            keep = keep[:cap]
        return Detections(boxes[keep], scores[keep], labels[keep], frame)

    def candidates(self, probs: torch.Tensor, deltas: torch.Tensor, proposals: torch.Tensor, h, w) -> tuple:
        """One image's (R, K) class probabilities, (R, 4K') deltas and (R, 4) proposals -> the (proposal, class)
        pairs above the score threshold, proposal-major: boxes (C, 4) decoded and clipped to (``h``, ``w``), scores
        (C,), labels (C,); without the small boxes (``min_box_size``)."""
        num_classes, rule = probs.shape[1], self.box_rule
        fg = slice(0, num_classes - 1) if self.bg_last else slice(1, num_classes)
        scores = probs[:, fg]
        # threshold first, then decode only the surviving (proposal, class) pairs: the same
        # values as decoding all R x K boxes, in the same (proposal-major) order
        rows, cols = torch.where(scores > self.score_thresh)
        labels = cols + fg.start
        reg_classes = deltas.shape[1] // 4
        if reg_classes == 1:  # class-agnostic regression
            d = deltas[rows]
        elif reg_classes == num_classes - self.bg_last:  # class-specific (no background rows when it is last)
            d = deltas.view(-1, reg_classes, 4)[rows, cols if self.bg_last else labels]
        else:  # class-agnostic with background and foreground deltas (Detectron, maskrcnn-benchmark)
            d = deltas.view(-1, 2, 4)[rows, 1]
        boxes = rule.clip(rule.decode(d, proposals[rows], self.bbox_reg_weights), h, w)
        scores = scores[rows, cols]
        if self.min_box_size is not None:
            keep = torch.where(rule.nonempty(boxes, self.min_box_size))[0]
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        return boxes, scores, labels
