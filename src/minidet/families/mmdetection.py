"""mmdetection's (2.x and 3.x) Mask R-CNN files, ``{"meta": {...}, "state_dict": {...}}``: keys, arithmetic, checks,
class names and published weights."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from ..categories import COCO_CATEGORIES, names_problem
from ..errors import CheckpointError
from . import torchvision
from .architectures import set_aside
from .base import NOT_STATED, Family, rename_by_rules
from .zoo import mmdetection as _zoo


def arithmetic():
    """mmdetection 3.3.0's test pipeline and heads (mmcv 2.1's ops): cv2 resize of the uint8 image (sizes rounded
    half up, as mmcv's ``Resize`` does), unrounded anchors at fixed strides, the RPN's per-level sort of sigmoid
    scores, its own box decoder (dw, dh clamped on both sides), mmcv's NMS (unstable score sort, float32 threshold,
    group-shifted boxes), no small-box filter, its RoI level rule, aligned RoIAlign, boxes divided by the resize
    factors and kept unclipped and when empty, detectron2's paste with an empty box's grid set to its centre; a
    cascade's scores the softmax of its stages' mean logits, its masks the mean of every stage's mask head's."""
    from .. import poolers, transform
    from ..boxes import MMDET_BOX_RULE
    from ..conventions import CascadeRule, Convention
    from ..heads import rpn

    return Convention(
        resize=transform.resize_mmdet, anchors=rpn.mmdet_cell_anchors, proposal_filter=rpn.keep_above_min_size,
        fpn_levels=poolers.mmdet_levels, level_topk=rpn.sorted_sigmoid,
        rank_by_logit=True,  # level_topk's scores are already mmdetection's sigmoid scores
        box_rule=MMDET_BOX_RULE, aligned_roi=True, rescale=transform.rescale_divide, paste=transform.paste_masks_mmdet,
        cascade=CascadeRule(mean_logits=True, mask_per_stage=True),  # CascadeRoIHead
    )


_RPN_OUT = {"cls": "objectness_logits", "reg": "anchor_deltas"}
_BOX_OUT = {"cls": "cls_score", "reg": "bbox_pred"}
_MASK_OUT = {"upsample": "deconv", "conv_logits": "predictor"}
_FPN = {"lateral": "lateral", "fpn": "output"}
_IN_MODULE = {"conv": "", "gn": "norm.", "bn": "norm."}  # a ConvModule's conv, and its norm named by its kind
_CASCADE = {"box_head": "cascade.heads", "box_predictor": "cascade.predictors", "mask_head": "mask_head"}
# mmcv's ContextBlock (a GC block plugin after conv3): its attention-pooling conv and channel-add transform
_CONTEXT = {"conv_mask": "mask", "channel_add_conv.0": "reduce", "channel_add_conv.1": "norm",
            "channel_add_conv.3": "expand"}
_GC_BLOCK = re.compile(r"^backbone\.layer(\d)\.(\d+)\.context_block\.(conv_mask|channel_add_conv\.[013])\.")


def _stage(m: re.Match, part: str) -> str:
    """minidet's name of the head ``part`` of the rule's match: a cascade's stage ``m[1]`` in its list, else the
    one head."""
    return part if m[1] is None else f"{_CASCADE[part]}.{m[1]}"


RULES: list[tuple[str, str | Callable]] = [
    (r"^neck\.(lateral|fpn)_convs\.(\d)\.(conv|gn|bn)\.",
     lambda m: f"fpn.{_FPN[m[1]]}{int(m[2]) + 2}.{_IN_MODULE[m[3]]}"),
    (r"^rpn_head\.rpn_conv\.(\d)\.conv\.", lambda m: f"rpn.head.convs.{m[1]}."),  # num_convs > 1: ConvModules
    (r"^rpn_head\.rpn_conv\.", "rpn.head.convs.0."),
    (r"^rpn_head\.rpn_(cls|reg)\.", lambda m: f"rpn.head.{_RPN_OUT[m[1]]}."),
    # a head's stage (``(\d)\.``, named ``s`` below) where a Cascade R-CNN (CascadeRoIHead) lists its heads
    (r"^roi_head\.bbox_head\.(?:(\d)\.)?shared_convs\.(\d)\.(conv|gn|bn)\.",  # Shared4Conv1FCBBoxHead
     lambda m: f"{_stage(m, 'box_head')}.conv{int(m[2]) + 1}.{_IN_MODULE[m[3]]}"),
    (r"^roi_head\.bbox_head\.(?:(\d)\.)?shared_fcs\.(\d)\.",
     lambda m: f"{_stage(m, 'box_head')}.fc{int(m[2]) + 1}."),
    (r"^roi_head\.bbox_head\.(?:(\d)\.)?fc_(cls|reg)\.",
     lambda m: f"{_stage(m, 'box_predictor')}.{_BOX_OUT[m[2]]}."),
    (r"^roi_head\.mask_head\.(?:(\d)\.)?convs\.(\d)\.(conv|gn|bn)\.",
     lambda m: f"{_stage(m, 'mask_head')}.mask_fcn{int(m[2]) + 1}.{_IN_MODULE[m[3]]}"),
    (r"^roi_head\.mask_head\.(?:(\d)\.)?(upsample|conv_logits)\.",
     lambda m: f"{_stage(m, 'mask_head')}.{_MASK_OUT[m[2]]}."),
    # Mask Scoring R-CNN's MaskIoUHead: plain convs and fcs
    (r"^roi_head\.mask_iou_head\.(conv|fc)s\.(\d)\.", lambda m: f"mask_iou_head.{m[1]}{int(m[2]) + 1}."),
    (r"^roi_head\.mask_iou_head\.fc_mask_iou\.", "mask_iou_head.iou."),
]
_BACKBONE_GN = re.compile(r"(^|\.)gn(\d)\.")  # its ResNet's GroupNorms: gn1 where a BatchNorm is bn1


def rename(name: str) -> str | None:
    """mmdetection ``MaskRCNN`` state-dict key -> minidet name; None for what plays no part at inference
    (``architectures.SET_ASIDE``: ``num_batches_tracked``, EMA copies, ...); unknown keys come back unchanged for the
    matcher to report. Its ResNet is torchvision's module tree (``conv1``, ``bn1``,
    ``layerK.i.{conv,bn}{1,2,3}``, ``downsample.{0,1}``; its GroupNorms ``gnN``; its GC blocks ``context_block``;
    its RegNet the same tree) directly under ``backbone.``; a
    ConvModule of the neck and heads holds ``conv`` and its norm ``gn`` or ``bn``."""
    if set_aside("mmdetection", name):
        return None
    if gc := _GC_BLOCK.match(name):
        return f"backbone.res{int(gc[1]) + 1}.{gc[2]}.context.{_CONTEXT[gc[3]]}.{name[gc.end():]}"
    if name.startswith("backbone."):
        # a deformable conv2 (mmcv's DeformConv2dPack, ModulatedDeformConv2dPack) holds its offset conv
        as_tv = "backbone.body." + _BACKBONE_GN.sub(r"\1bn\2.", name[len("backbone.") :]).replace(
            ".conv2.conv_offset.", ".conv2.offset.")
        new = rename_by_rules(torchvision.RULES[:6], as_tv)
        return name if new == as_tv else new
    return rename_by_rules(RULES, name)


def recognize(keys: Collection[str]) -> str | None:
    """mmdetection's module tree: ``neck.``, ``rpn_head.`` or ``roi_head.`` (its ResNet is ``backbone.conv1``...)."""
    return "" if any(k.startswith(("neck.", "rpn_head.", "roi_head.")) for k in keys) else None


_UPGRADE = ("convert it with mmdetection's tools/model_converters/upgrade_model_version.py IN OUT (it needs "
            "mmengine, not mmcv's compiled ops)")


# the output layers that name a single-stage head of mmdetection (dense_heads/): RetinaHead, FCOSHead, ATSSHead
_DENSE_HEADS = (("retina_cls", "RetinaNet"), ("conv_centerness", "FCOS"), ("atss_cls", "ATSS"))


def _check_two_stage(tensors: Mapping, path: str) -> None:
    """Refuse a single-stage detector (RetinaNet, FCOS, ATSS, ...): its dense head is ``bbox_head.`` at the top, as
    in every mmdetection version, and it has no ``rpn_head.``; minidet runs two-stage Mask R-CNN files only."""
    if any(k.startswith("rpn_head.") for k in tensors):
        return
    heads = [k for k in tensors if k.startswith("bbox_head.")]
    if not heads:
        return
    key, name = next(((k, n) for layer, n in _DENSE_HEADS for k in heads if f".{layer}." in k), (heads[0], ""))
    raise CheckpointError(
        f"{path}: a single-stage detector ({f'{name}: ' if name else ''}{key}; no rpn_head or roi_head weights), not "
        "a Mask R-CNN: minidet cannot run it (it runs Mask R-CNN files, and Faster R-CNN ones with MODEL.MASK_ON False)"
    )


def _check_v1(tensors: Mapping, path: str) -> None:
    """Refuse an mmdetection 1.x file: heads outside ``roi_head.``, or the background class first (81 class
    logits, 4 x 81 box deltas, 81 mask logits)."""
    if head := next((k for k in tensors if k.startswith(("bbox_head.", "mask_head."))), None):
        raise CheckpointError(f"{path}: {head} is outside roi_head: a file of mmdetection 1.x (background class first, "
                              f"heads before 2.0's RoIHead); {_UPGRADE}")
    cls = tensors.get("roi_head.bbox_head.fc_cls.weight")
    if cls is None or cls.ndim != 2:
        return
    n = cls.shape[0]
    for key, per_class in (("roi_head.bbox_head.fc_reg.weight", 4), ("roi_head.mask_head.conv_logits.weight", 1)):
        if (t := tensors.get(key)) is not None and t.ndim >= 1 and n > 1 and t.shape[0] == per_class * n:
            raise CheckpointError(
                f"{path}: {key} has {t.shape[0]} rows, {per_class} for each of fc_cls's {n} classes including the "
                f"background: a file of mmdetection 1.x, which put the background class first; {_UPGRADE}"
            )


def _check_style(model, tensors: Mapping, path: str) -> None:
    """Refuse caffe-style weights under a pytorch-style config and the reverse. mmdetection's ``*-caffe`` configs
    start from Caffe2 ResNet weights converted with running mean 0 and variance 1, which their frozen norms keep;
    pytorch-style files keep ImageNet statistics. The config's side: the stride on the 1x1 conv (caffe) or 3x3."""
    stats = {k: v for k, v in tensors.items() if k.startswith("backbone.") and k.endswith(("_mean", "_var"))}
    if not stats:
        return
    caffe = all(bool((v == (1 if k.endswith("_var") else 0)).all()) for k, v in stats.items())
    in_1x1 = tuple(model.backbone.res3[0].conv1.stride) == (2, 2)
    key = "backbone.bn1.running_var" if "backbone.bn1.running_var" in stats else next(iter(stats))
    if caffe and not in_1x1:
        raise CheckpointError(
            f"{path}: caffe-style weights ({key} and every backbone norm's statistics are 1 and 0, as mmdetection's "
            "*-caffe configs keep them) but MODEL.RESNETS.STRIDE_IN_1X1 is False (a pytorch-style config); use "
            "configs/mmdetection/mask-rcnn_r50-caffe_fpn_1x_coco or mask-rcnn_r50-caffe_fpn_ms-poly-3x_coco"
        )
    if in_1x1 and not caffe:
        raise CheckpointError(
            f"{path}: pytorch-style weights ({key} holds ImageNet statistics, not the 1s of caffe-style files) but "
            "MODEL.RESNETS.STRIDE_IN_1X1 is True (a caffe-style config); use a configs/mmdetection/mask-rcnn_r*_fpn_* "
            "config without -caffe"
        )


def check(model, tensors: dict, path: str) -> None:
    """Fail naming the key to change (or the conversion tool) when the file is not what the model describes: a
    single-stage detector, an mmdetection 1.x file, the other backbone style."""
    _check_two_stage(tensors, path)
    _check_v1(tensors, path)
    _check_style(model, tensors, path)  # other ResNeXt groups: every family's check (base.check_groups)


def class_names(meta: Mapping[str, Any] | None) -> list[str] | None:
    """The class names an mmdetection file carries, read as mmdetection reads them: ``meta`` is what its wrapper
    holds beside the weights (``readers.StateDict.meta``, ``{"meta": {...}}``); 3.x files name them in
    ``meta["dataset_meta"]["classes"]`` (its keys in any case: mmdetection lowercases them), 2.x files in
    ``meta["CLASSES"]``; a list or tuple, or a single string for one class (``classes = ('balloon')``, which
    mmdetection's datasets match as one category name). A Panoptic FPN's instances are of its thing classes: 3.x
    ``dataset_meta["thing_classes"]``, 2.x the first 80 of COCO panoptic's 133. None when the file names none.
    ValueError (one line, naming the entry and ``names_problem``'s reason) when they are no list of distinct, non-empty
    strings."""
    inner = (meta or {}).get("meta")
    if not isinstance(inner, Mapping):
        return None
    dataset = inner.get("dataset_meta")
    found = None
    if isinstance(dataset, Mapping) and dataset.get("thing_classes") is not None:  # a panoptic dataset's: its
        found = ("dataset_meta.thing_classes", dataset["thing_classes"])  # instances are of its thing classes
    elif isinstance(dataset, Mapping):
        found = next(((f"dataset_meta.{k}", v) for k, v in dataset.items() if str(k).lower() == "classes"), None)
    if (found is None or found[1] is None) and inner.get("CLASSES") is not None:
        found = ("CLASSES", inner["CLASSES"])
    if found is None or found[1] is None:
        return None
    key, names = found
    names = [names] if isinstance(names, str) else names
    if (problem := names_problem(names)) or not names:
        problem = problem or f"an empty {type(names).__name__}, no names"
        raise ValueError(f"its class names (meta {key}): {problem}")
    if len(names) == _COCO_PANOPTIC and [n.replace("_", " ") for n in names[:80]] == _COCO_THINGS:
        return list(names[:80])  # a 2.x Panoptic FPN's: COCO panoptic's things (COCO's 80), then its stuff
    return list(names)


_COCO_PANOPTIC = 133  # COCO panoptic's categories: its 80 things (COCO's instance classes) first, then 53 stuff
_COCO_THINGS = [name for _, name in COCO_CATEGORIES]


ZOO_CONFIGS = {row.name: row.zoo for row in _zoo.ROWS}
"""Registry name -> the zoo's config (``folder/name`` under mmdetection's ``configs/``) that the shipped config
restates."""


FAMILY = Family(
    name="mmdetection",
    title="mmdetection",
    licence=NOT_STATED,
    licence_source="configs/mask_rcnn/README.md of open-mmlab/mmdetection",
    arithmetic=arithmetic,
    recognize=recognize,
    renamer=lambda keys: rename,
    fixed={"": {"MODEL.FROZEN_BN_EPS": 1e-5}},  # nn.BatchNorm2d's eps, with which mmdetection runs its frozen norms
    check=check,
    background_last=True,
    mask_area="box",  # CocoMetric's mask results keep their boxes: pycocotools sizes them by the box
    class_names=class_names,
    weights=tuple(row.weights for row in _zoo.ROWS),
)
