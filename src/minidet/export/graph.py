"""``NetworkGraph``: one image's network (``MaskRCNN._detect`` for a chunk of one) in operators that
``torch.export`` follows through data-dependent sizes, built from a loaded model.

Every part is the model's own module (backbone with its SE and GC blocks, FPN, RPN, the RoI heads: box stage or
cascade, mask stage(s), Mask Scoring R-CNN's mask IoU head, with the fused CPU paths off), run by its own methods:
the RPN's ``select_one`` and the RoI heads' ``forward_image`` are the one-image paths the heads' modules keep beside
their eager ones (``heads.rpn``, ``heads.roi``), with every family rule the model's own attribute or function. This
module gives them only what an export needs of the operators around them: NMS (``ops.batched_nms``), multi-scale
RoIAlign (torchvision's ``roi_align``, ONNX's ``RoiAlign``), and norms in forms the runtimes compute as PyTorch does
(a head's batch norm as the kernel's own op, ``_BatchNorm``; FrozenBN as a scale and shift; GroupNorm's statistics
in float64). So a family that only recombines these rules, and a new kind of RoI heads, exports unchanged; the
graph's outputs are ``OUTPUTS``' first four and the ``Detections`` fields the heads give.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from ..detector import MaskRCNN
from ..heads.detections import FIELD_NAMES
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
# then the ``Detections`` fields the model's RoI heads give (``heads.detections.FIELDS``, in its order)
OUTPUTS = ("proposals", "boxes", "scores", "labels", *FIELD_NAMES)


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
    network input's pixels, or ``"original"``), ``scores`` (D,), ``labels`` (D,) int64, then the ``Detections``
    fields the model's RoI heads give (``heads.detections.FIELDS``: with a mask head ``masks``, with a mask IoU head
    ``box_scores``; ``outputs`` names them all). The same values as ``model._detect`` on that image up to the order
    of float sums (RoIAlign, convolutions); ``model`` is copied, not changed. The RoI heads' modules are this
    module's children by the model's names (the exported nodes' scopes: ``export.quantize`` picks layers by them)."""

    def __init__(self, model: MaskRCNN) -> None:
        super().__init__()
        m = copy.deepcopy(model).cpu().float().to(memory_format=torch.contiguous_format)
        fuse_convs(m, False)  # oneDNN's private ops have no ONNX form; the plain ops compute the same
        fuse_linears(m, False)
        for head in m.roi_heads.mask_stages:
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
        heads = self.__dict__["roi_heads"] = m.roi_heads  # its parts are this module's children, named as the model's
        self.box_pooler, self.box_head, self.box_predictor = heads.box_pooler, heads.box_head, heads.box_predictor
        self.cascade, self.final_predictor = heads.cascade, heads.final_predictor
        self.mask_pooler, self.mask_head, self.mask_iou_head = heads.mask_pooler, heads.mask_head, heads.mask_iou_head
        self.frame = heads.frame
        self.outputs = (*OUTPUTS[:4], *(f for f in OUTPUTS[4:] if f in heads.outputs))

    def forward(self, image: torch.Tensor, image_size: torch.Tensor, original_size: torch.Tensor,
                scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
        size = (image_size[0].item(), image_size[1].item())  # ints (symbols in the export), as the engine has them
        orig = (original_size[0].item(), original_size[1].item())
        s = scale.item()
        pyramid = list(self.fpn(self.backbone(image)).values())
        logits, deltas = self.rpn.head(pyramid)
        proposals = self.rpn.select_one(logits, deltas, tuple(image.shape[-2:]), size, s, self.nms)
        levels = pyramid[: len(self.box_pooler.scales)]
        det = self.roi_heads.forward_image(lambda pooler, boxes: self.pool(pooler, levels, boxes[0]), proposals,
                                           size, orig, s, self.nms)
        return (proposals, *(getattr(det, name) for name in self.outputs[1:]))

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


def inexact_steps(model: MaskRCNN) -> list[str]:
    """What of ``model``'s arithmetic its graph cannot give exactly (``EQUAL_SCORES`` always), in words."""
    steps = [EQUAL_SCORES]
    if model.rpn.tv_tie_order:
        steps.append("MODEL.RPN.TORCHVISION_TIE_ORDER: torchvision's order of equal proposal scores comes from an "
                     "unstable sort, which no ONNX operator reproduces; the graph orders them by index")
    return steps
