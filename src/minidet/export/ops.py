"""The graph's one operator of its own, ``minidet::batched_nms``, and how it becomes ONNX (and torchvision's
``deform_conv2d``: ONNX's ``DeformConv``, ``deform_conv_to_onnx``).

In PyTorch it is ``torchvision.ops.batched_nms`` (what the eager engine's ``boxes.batched_nms`` runs,
including torchvision's choice between one NMS over group-shifted boxes and one NMS per group), its kept
boxes ordered by decreasing score, equal scores by index. In ONNX (``to_onnx``) it is ONNX's own
``NonMaxSuppression`` run both ways, per group (a class dimension whose other members score -inf) and over
the boxes shifted by ``group * (largest coordinate + 1)`` as torchvision shifts them, the result of the way
torchvision would take for that many boxes kept. ``NonMaxSuppression`` suppresses at a float32 IoU above
its float32 threshold, the IoU computed as torchvision computes it (docs/exactness.md, "The exported
graph"), so ``strict_threshold`` gives each family's threshold rule as such a float32.
"""

from __future__ import annotations

import numpy as np
import torch
import torchvision

PER_GROUP_ABOVE = 4000  # torchvision's batched_nms runs one NMS per group above this many coordinates (CPU)


def strict_threshold(thresh: float, inclusive: bool) -> float:
    """The float32 ``t`` (returned as a float) with ``iou > t`` exactly when ``iou >= thresh`` (``inclusive``) or
    ``iou > thresh``, for every float32 ``iou``: the largest float32 below ``thresh`` or not above it."""
    t = np.float32(thresh)
    if float(t) > thresh or (inclusive and float(t) == thresh):  # compared in double (numpy would use float32)
        t = np.nextafter(t, np.float32(-np.inf))
    return float(t)


@torch.library.custom_op("minidet::batched_nms", mutates_args=())
def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, iou_threshold: float, num_groups: int
) -> torch.Tensor:
    """NMS within each group: boxes (N, 4) xyxy float32, scores (N,), groups (N,) int64 in [0, ``num_groups``)
    -> kept indices (K,) int64 by decreasing score (equal scores by index); suppresses at IoU > ``iou_threshold``
    (a float32 value: ``strict_threshold``)."""
    keep = torchvision.ops.batched_nms(boxes, scores, groups, iou_threshold).sort().values
    return keep[scores[keep].sort(descending=True, stable=True).indices]


@batched_nms.register_fake
def _(boxes, scores, groups, iou_threshold, num_groups):
    return boxes.new_empty((torch.library.get_ctx().new_dynamic_size(),), dtype=torch.int64)


def to_onnx(boxes, scores, groups, iou_threshold: float, num_groups: int):
    """``batched_nms`` in ONNX operators (an onnxscript translation for ``torch.onnx.export``)."""
    from onnxscript import opset18 as op
    from onnxscript.onnx_types import FLOAT, INT64

    n = op.Shape(scores)
    limit = op.Constant(value_ints=[2**62])  # every box may be kept
    thresh = op.Constant(value_floats=[iou_threshold])

    def kept_mask(selected):  # (K, 3) NonMaxSuppression rows -> (N,) int64, 1 where kept
        idx = op.Reshape(op.Slice(selected, [2], [3], [1]), [-1])
        ones = op.Expand(op.Constant(value_ints=[1]), op.Shape(idx))
        return op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), n), idx, ones)

    member = op.Equal(op.Unsqueeze(groups, [0]), op.Unsqueeze(op.Range(0, op.Constant(value_int=num_groups), 1), [1]))
    per_group = op.Where(member, op.Unsqueeze(scores, [0]), op.Constant(value_float=float("-inf")))
    lowest = op.Constant(value_floats=[float(np.finfo(np.float32).min)])  # keeps all but the -inf non-members
    by_group = kept_mask(op.NonMaxSuppression(op.Unsqueeze(boxes, [0]), op.Unsqueeze(per_group, [0]), limit, thresh,
                                              lowest))
    top = op.Add(op.ReduceMax(boxes, keepdims=0), op.Constant(value_float=1.0))
    shifted = op.Add(boxes, op.Unsqueeze(op.Mul(op.Cast(groups, to=FLOAT.dtype), top), [1]))
    by_shift = kept_mask(op.NonMaxSuppression(op.Unsqueeze(shifted, [0]), op.Unsqueeze(scores, [0, 1]), limit, thresh))
    many = op.Greater(op.Mul(n, op.Constant(value_ints=[4])), op.Constant(value_ints=[PER_GROUP_ABOVE]))
    kept = op.Reshape(op.NonZero(op.Where(many, by_group, by_shift)), [-1])  # increasing index
    order = op.TopK(op.Gather(scores, kept), op.Shape(kept), largest=1, sorted=1)[1]  # ties: lower index first
    return op.Cast(op.Gather(kept, order), to=INT64.dtype)


def deform_conv_to_onnx(input, weight, offset, mask, bias, stride_h: int, stride_w: int, pad_h: int, pad_w: int,
                        dilation_h: int, dilation_w: int, groups: int, offset_groups: int, use_mask: bool):
    """torchvision's ``deform_conv2d`` (``layers.DeformConv2d``) as ONNX's ``DeformConv`` (opset 19): the same offset
    layout (per offset group and kernel tap a (dy, dx) pair) and mask (one weight per tap, v2 only), the bias that
    torchvision always adds (zeros where the layer has none)."""
    from onnxscript import opset19 as op

    attrs = {"dilations": [dilation_h, dilation_w], "group": groups, "offset_group": offset_groups,
             "pads": [pad_h, pad_w, pad_h, pad_w], "strides": [stride_h, stride_w]}
    if use_mask:
        return op.DeformConv(input, weight, offset, bias, mask, **attrs)
    return op.DeformConv(input, weight, offset, bias, **attrs)


TRANSLATIONS = {torch.ops.minidet.batched_nms.default: to_onnx,
                torch.ops.torchvision.deform_conv2d.default: deform_conv_to_onnx}
