"""RoI heads: box head, box predictor with its post-processing, mask head with class selection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from .boxes import PLAIN_BOX_RULE, BoxRule
from .layers import ClassConv1x1, Conv2d, Deconv, Linear
from .norm import NormFn


class Detections(NamedTuple):
    """One image's detections, sorted by decreasing score (a Mask Scoring R-CNN's by decreasing box score, which its
    rescoring keeps, as mmdetection does): boxes (D, 4) xyxy in ``frame``
    (``"resized"``: the network input's pixels, or ``"original"``); scores (D,); labels (D,) int64,
    the checkpoint's class index; masks (D, M, M) probabilities of each box's class, or None; box_scores (D,): where
    a mask IoU head rescored the detections (Mask Scoring R-CNN; ``scores`` = box score x predicted mask IoU), the box
    head's scores, else None."""

    boxes: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor
    frame: str
    masks: torch.Tensor | None = None
    box_scores: torch.Tensor | None = None


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
        num_classes, rule, topk = logits.shape[1], self.box_rule, self.detections_per_image
        scores_all = logits if probabilities else F.softmax(logits, -1)
        fg = slice(0, num_classes - 1) if self.bg_last else slice(1, num_classes)
        reg_classes = deltas.shape[1] // 4
        counts = [len(p) for p in proposals]
        results = []
        for props, (h, w), probs, dl in zip(proposals, sizes, scores_all.split(counts), deltas.split(counts)):
            scores = probs[:, fg]
            # threshold first, then decode only the surviving (proposal, class) pairs: the same
            # values as decoding all R x K boxes, in the same (proposal-major) order
            rows, cols = torch.where(scores > self.score_thresh)
            labels = cols + fg.start
            if reg_classes == 1:  # class-agnostic regression
                d = dl[rows]
            elif reg_classes == num_classes - self.bg_last:  # class-specific (no background rows when it is last)
                d = dl.view(-1, reg_classes, 4)[rows, cols if self.bg_last else labels]
            else:  # class-agnostic with background and foreground deltas (Detectron, maskrcnn-benchmark)
                d = dl.view(-1, 2, 4)[rows, 1]
            boxes = rule.clip(rule.decode(d, props[rows], self.bbox_reg_weights), h, w)
            scores = scores[rows, cols]
            if self.min_box_size is not None:
                keep = torch.where(rule.nonempty(boxes, self.min_box_size))[0]
                boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
            keep = rule.nms(boxes, scores, labels, self.nms_thresh, topk=topk, tv_tie_order=True,
                            class_agnostic=self.class_agnostic_nms)
            at_cap = self.ties_at_cap and len(keep) > topk
            keep = keep[scores[keep] >= scores[keep][topk - 1]] if at_cap else keep[:topk]
            results.append(Detections(boxes[keep], scores[keep], labels[keep], frame))
        return results


@dataclass(frozen=True)
class CascadeRule:
    """How a family's Cascade R-CNN (a ``Cascade`` of box stages) combines its stages at test time.
    ``mean_logits``: the final class scores are the softmax of the stages' mean logits (mmdetection), else the mean
    of the stages' softmax probabilities, summed and times 1 / stages (detectron2); ``mask_per_stage``: every stage
    has a mask head and the mask is the mean of their probabilities on the final boxes (mmdetection), else one mask
    head (detectron2)."""

    mean_logits: bool
    mask_per_stage: bool


class Cascade(nn.Module):
    """Cascade R-CNN's box stages: stage k pools the boxes that stage k - 1 regressed (class-agnostic, with its own
    ``bbox_reg_weights``, clipped to the image), from the RPN's proposals for the first; ``heads.k``, ``predictors.k``
    are each stage's ``BoxHead`` and ``BoxPredictor``. The last stage's predictor turns the combined scores
    (``rule``) and its deltas into detections."""

    def __init__(self, heads: list[BoxHead], predictors: list[BoxPredictor], rule: CascadeRule) -> None:
        super().__init__()
        self.heads, self.predictors, self.rule = nn.ModuleList(heads), nn.ModuleList(predictors), rule

    def forward(self, pool, proposals: list[torch.Tensor], sizes: list[tuple[int, int]], amp) -> tuple:
        """Run the stages: ``pool(boxes)`` gives the pooled features of per-image ``boxes``, ``amp()`` the network
        layers' autocast. -> (scores (R, K) float32: the mean logits, or the mean probabilities (``rule``), the last
        stage's deltas (R, 4) float32, the last stage's per-image boxes)."""
        outputs, deltas = [], None
        for k, (head, predictor) in enumerate(zip(self.heads, self.predictors)):
            if deltas is not None:  # the previous stage's boxes
                proposals = self.predictors[k - 1].refine(deltas, proposals, sizes)
            with amp():
                logits, deltas = predictor(head(pool(proposals)))
            logits, deltas = logits.float(), deltas.float()
            outputs.append(logits if self.rule.mean_logits else F.softmax(logits, -1))
        total = sum(outputs)  # 0 + the first + ...: the sources' Python sum
        scores = total / float(len(outputs)) if self.rule.mean_logits else total * (1.0 / len(outputs))
        return scores, deltas, proposals


class MaskHead(nn.Module):
    """``num_conv`` 3x3 conv(+norm)+ReLU, 2x2/2 deconv+ReLU, 1x1 predictor: (R, C, 14, 14) -> (R, K, 28, 28). With
    ``labels`` (R,) and ``fuse_linears``, only each box's class channel: (R, 1, 28, 28), the predictor taking the
    deconv's pixels in the order its one inner product gives them (``Deconv.blocks``, ``ClassConv1x1.pixels``)."""

    def __init__(self, in_channels: int, num_conv: int, conv_dim: int, num_classes: int, norm: NormFn) -> None:
        super().__init__()
        self.num_conv = num_conv
        c = in_channels
        for i in range(num_conv):
            nm = norm(conv_dim)
            self.add_module(f"mask_fcn{i + 1}", Conv2d(c, conv_dim, 3, padding=1, bias=nm is None, norm=nm, relu=True))
            c = conv_dim
        self.deconv = Deconv(c, conv_dim, 2, stride=2, relu=True)
        self.predictor = ClassConv1x1(conv_dim, num_classes, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        for i in range(self.num_conv):
            x = getattr(self, f"mask_fcn{i + 1}")(x)
        if self.predictor.selects(x, labels) and len(x):
            y = self.deconv.blocks(x)  # (R, H, W, 2, 2, C): pixel (2i + a, 2j + b) at [:, i, j, a, b]
            if y is not None:
                r, h, w, kh, kw = y.shape[:5]
                logits = self.predictor.pixels(y.view(r, h * w * kh * kw, -1), labels).view(r, h, w, kh, kw)
                return logits.permute(0, 1, 3, 2, 4).reshape(r, 1, kh * h, kw * w)
        return self.predictor(self.deconv(x), labels)

    @staticmethod
    def select(mask_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(R, K, M, M) logits, (R,) labels -> (R, M, M) probabilities of each box's class (or the one channel:
        class-agnostic masks, or the class already selected by ``forward``)."""
        if mask_logits.shape[1] == 1:
            return mask_logits[:, 0].sigmoid()
        return mask_logits[torch.arange(len(labels), device=labels.device), labels].sigmoid()


class MaskIoUHead(nn.Module):
    """Mask Scoring R-CNN's mask IoU head (mmdetection's ``MaskIoUHead``): the pooled mask features (R, C, M, M)
    beside each box's mask probabilities (R, 2M, 2M) max-pooled 2x2 to M x M, ``num_conv`` 3x3 convs + ReLU (the last
    of stride 2), ``num_fc`` fcs + ReLU, and one IoU per class; ``forward`` gives each box's own class's predicted
    IoU (R,), by which the box's score is multiplied."""

    def __init__(self, in_channels: int, num_classes: int, resolution: int = 14, num_conv: int = 4,
                 conv_dim: int = 256, num_fc: int = 2, fc_dim: int = 1024) -> None:
        super().__init__()
        self.num_conv, self.num_fc = num_conv, num_fc
        c = in_channels + 1
        for i in range(num_conv):
            stride = 2 if i == num_conv - 1 else 1
            self.add_module(f"conv{i + 1}", Conv2d(c, conv_dim, 3, stride=stride, padding=1, relu=True))
            c = conv_dim
        d = c * (resolution // 2) ** 2
        for i in range(num_fc):
            self.add_module(f"fc{i + 1}", Linear(d, fc_dim, relu=True))
            d = fc_dim
        self.iou = Linear(d, num_classes)

    def forward(self, features: torch.Tensor, probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = torch.cat((features, F.max_pool2d(probs[:, None].to(features.dtype), 2, 2)), 1)
        for i in range(self.num_conv):
            x = getattr(self, f"conv{i + 1}")(x)
        x = x.flatten(1)
        for i in range(self.num_fc):
            x = getattr(self, f"fc{i + 1}")(x)
        iou = self.iou(x)
        return iou.gather(1, labels[:, None])[:, 0]
