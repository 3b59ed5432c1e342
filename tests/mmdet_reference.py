"""mmdetection 3.3.0 itself as a test reference (the ``reference`` extra: mmdetection, mmengine and mmcv-lite, which
is mmcv without its compiled ops). Its Mask R-CNN calls two of mmcv's compiled kernels on CPU, RoIAlign and NMS,
and its deformable convolutions two more; :func:`install_stand_ins` gives it pure-PyTorch ones, written here from mmcv
2.1's CPU kernels (``roi_align.cpp``: torchvision's aligned RoIAlign computes the same samples, weights and sums;
``nms.cpp``: below; ``deform_conv.cpp``, ``modulated_deform_conv.cpp``: torchvision's ``deform_conv2d`` samples the
same offsets, in the same layout, bilinearly). Any other compiled
op mmcv asks for fails by name. Import this module only where the extra is installed."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torchvision

from helpers import compiled_stand_in


def _nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float, offset: int) -> torch.Tensor:
    """mmcv's CPU ``nms``: the boxes in the order of ``scores.sort(descending=True)`` (torch's unstable sort), each
    kept box suppressing the later ones whose IoU with it, in float32 with ``offset`` added to each side, is above
    the threshold as a float32. Returns the kept indices, highest score first."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1 + offset) * (y2 - y1 + offset)
    order = scores.sort(0, descending=True)[1]
    threshold = torch.tensor(iou_threshold, dtype=boxes.dtype)
    alive = torch.ones(len(order), dtype=torch.bool)
    keep = []
    for n in range(len(order)):
        if not alive[n]:
            continue
        i, rest = order[n], order[n + 1:]
        w = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest]) + offset).clamp(min=0)
        h = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest]) + offset).clamp(min=0)
        inter = w * h
        alive[n + 1:] &= ~(inter / (areas[i] + areas[rest] - inter) > threshold)
        keep.append(i)
    return torch.stack(keep)


def _roi_align_forward(features, rois, output, argmax_y, argmax_x, aligned_height, aligned_width, spatial_scale,
                       sampling_ratio, pool_mode, aligned) -> None:
    """mmcv's ``roi_align_forward`` in average mode: ``output`` (R, C, h, w) filled in place."""
    if pool_mode != 1:
        raise NotImplementedError("mmcv's RoIAlign stand-in averages (pool_mode 1) only")
    output.copy_(torchvision.ops.roi_align(features, rois, (aligned_height, aligned_width), spatial_scale,
                                           sampling_ratio, aligned))


def _deform_conv_forward(input, weight, offset, output, columns, ones, kW, kH, dW, dH, padW, padH, dilationW,
                         dilationH, group, deformable_group, im2col_step) -> None:
    """mmcv's ``deform_conv_forward`` (v1): ``output`` filled in place by torchvision's ``deform_conv2d``, which takes
    the offsets in mmcv's layout (per deformable group and kernel tap a (dy, dx) pair) and infers the groups from
    the shapes of ``weight`` and ``offset``."""
    assert input.shape[1] // weight.shape[1] == group and offset.shape[1] // (2 * kH * kW) == deformable_group
    output.copy_(torchvision.ops.deform_conv2d(input, offset, weight, None, (dH, dW), (padH, padW),
                                               (dilationH, dilationW)))


def _modulated_deform_conv_forward(input, weight, bias, ones, offset, mask, output, columns, kernel_h, kernel_w,
                                   stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, deformable_group,
                                   with_bias) -> None:
    """mmcv's ``modulated_deform_conv_forward`` (v2): as v1 with each tap's sample weighted by ``mask`` (mmcv's
    layout: per deformable group, one weight per kernel tap) and the bias where ``with_bias``."""
    assert input.shape[1] // weight.shape[1] == group and mask.shape[1] // (kernel_h * kernel_w) == deformable_group
    output.copy_(torchvision.ops.deform_conv2d(input, offset, weight, bias if with_bias else None,
                                               (stride_h, stride_w), (pad_h, pad_w), (dilation_h, dilation_w), mask))


def install_stand_ins() -> None:
    """Put a ``mmcv._ext`` module with the stand-ins where mmcv's ``ext_loader`` looks for its compiled ops."""
    if "mmcv._ext" in sys.modules:
        return
    ext = compiled_stand_in("mmcv._ext", "mmcv's compiled op {op} has no stand-in here", nms=_nms,
                            roi_align_forward=_roi_align_forward, deform_conv_forward=_deform_conv_forward,
                            modulated_deform_conv_forward=_modulated_deform_conv_forward)
    sys.modules["mmcv._ext"] = ext


def zoo_config(zoo: str, test_scale: tuple[int, int] | None = None, fewer: bool = False):
    """mmdetection's config ``configs/<zoo>.py`` as the installed package ships it (mmengine's ``Config``); with
    ``test_scale`` (long side, short side), its test pipeline's ``Resize`` scale replaced; ``fewer``: at most
    helpers.PROPOSALS proposals and helpers.DETECTIONS detections an image (minidet's side: helpers.FEWER)."""
    import mmdet
    from mmengine.config import Config

    cfg = Config.fromfile(str(Path(mmdet.__file__).parent / ".mim" / "configs" / f"{zoo}.py"))
    pipeline = cfg.test_dataloader.dataset.pipeline  # without the ground truth of a panoptic test set (panopticapi)
    pipeline[:] = [t for t in pipeline if t["type"] != "LoadPanopticAnnotations"]
    if test_scale is not None:
        resize = next(t for t in cfg.test_dataloader.dataset.pipeline if t["type"] == "Resize")
        resize["scale"] = tuple(test_scale)
    if fewer:
        from helpers import DETECTIONS, PROPOSALS

        cfg.model.test_cfg.rpn.max_per_img, cfg.model.test_cfg.rcnn.max_per_img = PROPOSALS, DETECTIONS
    return cfg


_SYNC_NORMS = ("SyncBN", "MMSyncBN")  # torch's and mmcv's SyncBatchNorm


def _unsync(node) -> None:
    """Every ``norm_cfg`` of a SyncBN kind under ``node`` made ``BN``: in eval mode torch's and mmcv's SyncBatchNorm
    run ``F.batch_norm`` with the running statistics, as ``nn.BatchNorm2d`` does, and building them needs a process
    group."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if key == "norm_cfg" and isinstance(value, dict) and value.get("type") in _SYNC_NORMS:
            value["type"] = "BN"
        else:
            _unsync(value)


def detector(cfg, checkpoint: str | Path | None):
    """mmdetection's detector of ``cfg`` on CPU with the weights of ``checkpoint`` (mmdetection's own loader; None:
    its initial weights); its SyncBN norms built as BN (:func:`_unsync`)."""
    install_stand_ins()
    from mmdet.apis import init_detector
    from mmdet.utils import register_all_modules

    register_all_modules()
    _unsync(cfg.model)
    return init_detector(cfg, None if checkpoint is None else str(checkpoint), device="cpu")


def detect(model, bgr) -> dict[str, torch.Tensor]:
    """mmdetection's ``inference_detector`` on the uint8 BGR image ``bgr``: boxes, scores, labels, masks (bool); of a
    Panoptic FPN, its instance half (what its RoI head predicts, before the panoptic fusion)."""
    from mmdet.apis import inference_detector

    panoptic, instances = hasattr(model, "panoptic_fusion_head"), []
    predict = model.roi_head.predict
    if panoptic:  # keep what the RoI head predicts

        def keep(*args, **kwargs):
            instances.extend(predict(*args, **kwargs))
            return instances

        model.roi_head.predict = keep
    try:
        with torch.no_grad():
            sample = inference_detector(model, bgr)
    finally:
        model.roi_head.predict = predict
    found = instances[0] if panoptic else sample.pred_instances
    return {"boxes": found.bboxes, "scores": found.scores, "labels": found.labels, "masks": found.masks.bool()}
