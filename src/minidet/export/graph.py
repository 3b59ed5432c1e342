"""``NetworkGraph``: one image's network (``MaskRCNN._detect`` for a chunk of one) in operators that
``torch.export`` follows through data-dependent sizes, built from a loaded model.

Every part with weights is the model's own module (backbone with its SE and GC blocks, FPN, RPN head, box head, box
predictor, mask head, Mask Scoring R-CNN's mask IoU head, with the fused CPU paths off); every family rule is the
model's own attribute or function, called as the eager engine calls it: the RPN's cell anchors, stride rule,
per-level top-k (``level_topk``: on logits, or on mmdetection's sigmoid scores), box rule (decode, clip, +1 sizes,
inclusive NMS), proposal filter, logit or sigmoid ranking, per-level cut; the poolers' level rule, alignment and
sampling; the box predictor's thresholds, background column, frame, small-box filter and ties at the cap. What is
restated here is only the control flow around them, written without Python branches on data: NMS
(``ops.batched_nms``), multi-scale RoIAlign (torchvision's ``roi_align``, ONNX's ``RoiAlign``), the detection cap.
So a family that only recombines these rules exports unchanged. Where an operator's exported form cannot take what
the graph gives it, an equal form is used in the export only (run by PyTorch, the graph computes the eager model's
bits): a head's batch norm as the kernel's own op (``_BatchNorm``), the mask IoU head on one zero row more
(OpenVINO's MaxPool takes no empty batch).
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn
from torch.nn import functional as F

from ..detector import MaskRCNN
from ..layers import ClassConv1x1, fuse_convs, fuse_linears
from ..norm import BatchNorm, FrozenBN
from . import ops

INPUTS = ("image", "image_size", "original_size", "scale")
# what the graph cannot compute exactly as the eager engine does, whatever the family (see ``inexact_steps``)
EQUAL_SCORES = (
    "equal scores: the graph orders candidates of exactly equal score by index (ONNX TopK and NonMaxSuppression); "
    "PyTorch's top-k and sort (the RPN's per-level top-k, torchvision's NMS) order them their own, unspecified way, "
    "so where such a tie decides (a top-k or cap cut between equal scores, NMS between two overlapping boxes of "
    "equal score) another box can be kept"
)
FLOAT_ORDER = (
    "float order only: convolutions, fully connected layers and RoIAlign run the runtime's kernels (other summation "
    "orders, as between PyTorch's own paths), GroupNorm's statistics are summed in float64; the rest is the same "
    "float32 arithmetic"
)
# masks only with a mask head; box_scores only with a mask IoU head (Mask Scoring R-CNN: ``scores`` are then the box
# scores times the predicted mask IoUs), last, so that the graphs without one keep their outputs
OUTPUTS = ("proposals", "boxes", "scores", "labels", "masks", "box_scores")


class _ScaleShift(nn.Module):
    """A ``FrozenBN`` with its scale and shift computed once (the float32 values its forward computes each time):
    the same ``x * scale + shift``, two operators in the graph instead of eleven."""

    def __init__(self, scale: torch.Tensor, shift: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale.detach().view(1, -1, 1, 1).clone())
        self.register_buffer("shift", shift.detach().view(1, -1, 1, 1).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


class _GroupNorm64(nn.Module):
    """``nn.GroupNorm`` (its groups, eps, weight and bias) with each group's mean and variance summed in float64:
    ONNX Runtime's float32 reductions stray about 30 times further from the exact statistics than PyTorch's
    (3e-5 against 1e-6 on an FPN level), in float64 they come within PyTorch's; the rest is float32. Run by
    PyTorch outside an export, it is ``F.group_norm`` (the eager model's bits)."""

    def __init__(self, gn: nn.GroupNorm) -> None:
        super().__init__()
        self.groups, self.eps, self.weight, self.bias = gn.num_groups, gn.eps, gn.weight, gn.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_exporting():
            return F.group_norm(x, self.groups, self.weight, self.bias, self.eps)
        y = x.reshape(x.shape[0], self.groups, -1)  # (N, C, ...) (a feature map, or an fc's (N, C))
        wide = y.double()
        mean = wide.mean(-1, keepdim=True)
        rstd = torch.rsqrt(((wide - mean) ** 2).mean(-1, keepdim=True) + self.eps)
        y = ((y - mean.float()) * rstd.float()).reshape(x.shape)
        per_channel = (1, -1) + (1,) * (x.dim() - 2)
        return y * self.weight.view(per_channel) + self.bias.view(per_channel)


class _BatchNorm(BatchNorm):
    """``norm.BatchNorm`` (torch's batch-norm kernel, not training) whose exported form is the kernel's own op,
    ``_native_batch_norm_legit_no_training`` (ONNX's ``BatchNormalization``): ``F.batch_norm`` first tests whether its
    input is empty, which ``torch.export`` cannot decide for a head's rows (any count of boxes, none too). The same
    operator and arguments; run by PyTorch outside an export, it is ``F.batch_norm`` (the eager model's bits)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_exporting():
            return super().forward(x)
        return torch.ops.aten._native_batch_norm_legit_no_training(
            x, self.weight, self.bias, self.running_mean, self.running_var, 0.0, self.eps)[0]


class _AllClasses(ClassConv1x1):
    """The mask predictor as the plain 1x1 convolution (all classes; the class is selected after it), without
    the row count test of its selected-class path, which a graph of any detection count cannot make."""

    def forward(self, x: torch.Tensor, classes: torch.Tensor | None = None) -> torch.Tensor:
        return nn.Conv2d.forward(self, x)


class NetworkGraph(nn.Module):
    """``forward(image, image_size, original_size, scale)``: the normalized, padded image (1, 3, H, W) float32,
    its resized size before padding (2,) int64 (h, w), the original image's size (2,) int64 and the resize
    factor () float32 -> ``proposals`` (P, 4), ``boxes`` (D, 4) in the frame of ``frame`` (``"resized"``: the
    network input's pixels, or ``"original"``), ``scores`` (D,), ``labels`` (D,) int64, with a mask head ``masks``
    (D, M, M) probabilities of each box's class, and with a mask IoU head (Mask Scoring R-CNN) ``box_scores`` (D,):
    the box head's scores, ``scores`` being those times each mask's predicted IoU (``outputs`` names them). The same
    values as ``model._detect`` on that image up to the order of float sums (RoIAlign, convolutions); ``model`` is
    copied, not changed."""

    def __init__(self, model: MaskRCNN) -> None:
        super().__init__()
        m = copy.deepcopy(model).cpu().float().to(memory_format=torch.contiguous_format)
        fuse_convs(m, False)  # oneDNN's private ops have no ONNX form; the plain ops compute the same
        fuse_linears(m, False)
        for head in self._mask_heads(m.mask_head):
            head.predictor.__class__ = _AllClasses
        for parent in list(m.modules()):
            for name, child in parent.named_children():
                if type(child) is FrozenBN:  # a BatchNorm stays: torch's batch-norm op (ONNX BatchNormalization)
                    setattr(parent, name, _ScaleShift(*child.scale_shift()))
                elif type(child) is BatchNorm:
                    child.__class__ = _BatchNorm
                elif isinstance(child, nn.GroupNorm):
                    setattr(parent, name, _GroupNorm64(child))
        self.backbone, self.fpn, self.rpn = m.backbone, m.fpn, m.rpn
        self.box_pooler, self.box_head, self.box_predictor = m.box_pooler, m.box_head, m.box_predictor
        self.cascade, self.final_predictor = m.cascade, m.final_predictor
        self.mask_pooler, self.mask_head = m.mask_pooler, m.mask_head
        self.mask_iou_head = getattr(m, "mask_iou_head", None)
        self.frame = "original" if m.final_predictor.original_frame else "resized"
        self.outputs = OUTPUTS[: 4 + (m.mask_head is not None) + (self.mask_iou_head is not None)]

    @staticmethod
    def _mask_heads(mask_head: nn.Module | None) -> list[nn.Module]:
        """The mask heads: none, one, or a cascade's one per stage (their probabilities' mean is the mask)."""
        return list(mask_head) if isinstance(mask_head, nn.ModuleList) else [mask_head] * (mask_head is not None)

    def forward(self, image: torch.Tensor, image_size: torch.Tensor, original_size: torch.Tensor,
                scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
        size = (image_size[0].item(), image_size[1].item())  # ints (symbols in the export), as the engine has them
        orig = (original_size[0].item(), original_size[1].item())
        s = scale.item()
        pyramid = list(self.fpn(self.backbone(image)).values())
        logits, deltas = self.rpn.head(pyramid)
        proposals = self.proposals(logits, deltas, tuple(image.shape[-2:]), size, s)
        levels = pyramid[: len(self.box_pooler.scales)]
        rois = proposals
        if self.cascade is None:
            cls, reg = self.box_predictor(self.box_head(self.pool(self.box_pooler, levels, rois)))
            probs = F.softmax(cls, -1)
        else:  # the eager cascade's stages, on this image's boxes
            cls, reg, (rois,) = self.cascade(lambda b: self.pool(self.box_pooler, levels, b[0]), [rois], [size],
                                             contextlib.nullcontext)
            probs = F.softmax(cls, -1) if self.cascade.rule.mean_logits else cls
        boxes, scores, labels = self.detections(probs, reg, rois, orig if self.frame == "original" else size, s)
        if self.mask_head is None:
            return proposals, boxes, scores, labels
        rois = boxes * s if self.frame == "original" else boxes
        pooled, masks = self.pool(self.mask_pooler, levels, rois), []
        for head in self._mask_heads(self.mask_head):
            logits = head(pooled)
            if logits.shape[1] > 1:  # ``MaskHead.select``: each box's class (a gather: any count of boxes)
                logits = logits.gather(1, labels.view(-1, 1, 1, 1).expand(-1, 1, *logits.shape[2:]))
            masks.append(logits[:, 0].sigmoid())
        probs = masks[0] if len(masks) == 1 else torch.stack(masks).mean(0)
        if self.mask_iou_head is None:
            return proposals, boxes, scores, labels, probs
        # ``MaskRCNN._detect``: the box score times the mask IoU head's IoU of the box's class (its own module)
        if torch.compiler.is_exporting():  # one zero row more, its IoU dropped: OpenVINO's MaxPool takes no empty
            rows = [torch.cat((t, t.new_zeros((1, *t.shape[1:])))) for t in (pooled, probs, labels)]  # batch
            iou = self.mask_iou_head(*rows).float()[:-1]
        else:
            iou = self.mask_iou_head(pooled, probs, labels).float()
        return proposals, boxes, scores * iou, labels, probs, scores

    def proposals(self, logits: list[torch.Tensor], deltas: list[torch.Tensor], padded: tuple, size: tuple,
                  scale) -> torch.Tensor:
        """``RPN.select`` and ``RPN.select_image`` for one image -> (P, 4) proposals by decreasing score."""
        rpn = self.rpn
        scores, boxes, anchors, levels = [], [], [], []
        for lvl, (lg, dl) in enumerate(zip(logits, deltas)):
            a, h, w = lg.shape[1:]
            stride = (rpn.strides[lvl],) * 2 if rpn.fixed_strides else (padded[0] // h, padded[1] // w)
            lg = lg.permute(0, 2, 3, 1).reshape(1, -1)
            dl = dl.view(a, 4, h, w).permute(2, 3, 0, 1).reshape(-1, 4)
            top, idx = (t[0] for t in rpn.level_topk(lg, rpn.pre_nms_topk))  # the family's rule (scores, ranks)
            scores.append(top)
            boxes.append(dl[idx])
            anchors.append(self.grid_anchors(lvl, h, w, stride)[idx])
            levels.append(torch.full_like(idx, lvl))
        score = torch.cat(scores)
        if not rpn.rank_by_logit:
            score = torch.sigmoid(score)
        rule = rpn.box_rule
        b = rule.decode(torch.cat(boxes), torch.cat(anchors), (1.0, 1.0, 1.0, 1.0))
        b = rule.clip(b, *(padded if rpn.clip_to_padded else size))
        keep = rpn.proposal_filter(b, rpn.min_size, scale, padded)
        b, score, level = b[keep], score[keep], torch.cat(levels)[keep]
        keep = self.nms(rule, b, score, level, rpn.nms_thresh, len(rpn.strides))
        if rpn.topk_per_level:  # rank of each kept box within its level
            onehot = F.one_hot(level[keep], len(rpn.strides))
            keep = keep[(onehot.cumsum(0) * onehot).sum(1) - 1 < rpn.post_nms_topk]
        return b[keep[: rpn.post_nms_topk]]

    def grid_anchors(self, level: int, h, w, stride: tuple) -> torch.Tensor:
        """``RPN.grid_anchors`` (uncached, any grid): (h * w * A, 4), location-major then anchor."""
        ys = torch.arange(h, dtype=torch.int32) * stride[0]
        xs = torch.arange(w, dtype=torch.int32) * stride[1]
        sy, sx = torch.meshgrid(ys, xs, indexing="ij")
        shifts = torch.stack((sx.reshape(-1), sy.reshape(-1)) * 2, dim=1)
        return (shifts.view(-1, 1, 4) + self.rpn.cell_anchors[level].view(1, -1, 4)).reshape(-1, 4)

    @staticmethod
    def nms(rule, boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, thresh: float,
            num_groups: int) -> torch.Tensor:
        """``BoxRule.nms`` without its top-k shortcut: +1 sizes as boxes grown by ``rule.offset``, the inclusive or
        strict threshold as a float32 one (``ops.strict_threshold``) -> kept indices by decreasing score."""
        if rule.offset:
            boxes = boxes + torch.tensor([0.0, 0.0, rule.offset, rule.offset])
        t = ops.strict_threshold(thresh, rule.inclusive_nms)
        return torch.ops.minidet.batched_nms(boxes, scores, groups, t, num_groups)

    @staticmethod
    def pool(pooler, features: list[torch.Tensor], boxes: torch.Tensor) -> torch.Tensor:
        """``MultiScaleRoIAlign`` of one image's boxes (R, 4) -> (R, C, S, S): each box on its level (the pooler's
        level rule) by torchvision's ``roi_align`` with the pooler's alignment and sampling."""
        levels = pooler.level_rule(boxes, pooler.min_level, pooler.min_level + len(features) - 1)
        rois = torch.cat([torch.zeros_like(boxes[:, :1]), boxes], dim=1)
        s = pooler.output_size[0]
        sels, outs = [], []
        for lvl, (feat, scale) in enumerate(zip(features, pooler.scales)):
            sel = torch.where(levels == lvl)[0]
            sels.append(sel)
            outs.append(torch.ops.torchvision.roi_align(feat, rois[sel], scale, s, s, pooler.sampling_ratio,
                                                        pooler.aligned))
        return torch.cat(outs)[torch.argsort(torch.cat(sels))]

    def detections(self, probs: torch.Tensor, deltas: torch.Tensor, proposals: torch.Tensor, size: tuple,
                   scale) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``BoxPredictor.inference`` for one image, from the class probabilities -> boxes (D, 4), scores (D,),
        labels (D,)."""
        p = self.final_predictor
        if p.original_frame:
            proposals = proposals / scale
        num_classes, rule, cap = probs.shape[1], p.box_rule, p.detections_per_image
        first = 0 if p.bg_last else 1
        scores = probs[:, first : first + num_classes - 1]
        rows, cols = torch.where(scores > p.score_thresh)
        labels = cols + first
        reg_classes = deltas.shape[1] // 4
        if reg_classes == 1:
            d = deltas[rows]
        else:
            d = deltas.view(-1, reg_classes, 4)[rows, labels if reg_classes == num_classes else cols]
        boxes = rule.clip(rule.decode(d, proposals[rows], p.bbox_reg_weights), *size)
        scores = scores[rows, cols]
        if p.min_box_size is not None:
            keep = rule.nonempty(boxes, p.min_box_size)
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        if p.class_agnostic_nms:  # one NMS over every class's boxes: one group
            keep = self.nms(rule, boxes, scores, labels * 0, p.nms_thresh, 1)
        else:
            keep = self.nms(rule, boxes, scores, labels, p.nms_thresh, num_classes)
        if p.ties_at_cap:  # every detection scoring at least the cap-th
            s = scores[keep]
            keep = keep[s >= torch.cat([s[:cap], s.new_full((1,), float("inf"))]).min()]
        else:
            keep = keep[:cap]
        return boxes[keep], scores[keep], labels[keep]


def inexact_steps(model: MaskRCNN) -> list[str]:
    """What of ``model``'s arithmetic its graph cannot give exactly (``EQUAL_SCORES`` always), in words."""
    steps = [EQUAL_SCORES]
    if model.rpn.tv_tie_order:
        steps.append("MODEL.RPN.TORCHVISION_TIE_ORDER: torchvision's order of equal proposal scores comes from an "
                     "unstable sort, which no ONNX operator reproduces; the graph orders them by index")
    return steps
