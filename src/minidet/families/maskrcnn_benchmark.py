"""maskrcnn-benchmark's (and MLPerf's) training checkpoints: keys, arithmetic and published weights."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection

from . import torchvision
from .architectures import set_aside
from .base import MASK_OUT, NOT_STATED, RPN_OUT, Family, Renamer, rename_by_rules
from .zoo import maskrcnn_benchmark as _zoo

logger = logging.getLogger("minidet")


def arithmetic():
    """Detectron's anchors, +1 sizes and levels, but PIL resizing by its own size rule, NMS suppressing at
    IoU > thresh (its CUDA kernel; the CPU kernel uses >=), clipping to each image, boxes decoded in the resized
    frame and scaled per axis, torchvision's paste (which came from it)."""
    from .. import poolers, transform
    from ..boxes import BoxRule
    from ..conventions import Convention
    from ..heads import rpn

    return Convention(
        resize=transform.resize_pil_mb, anchors=rpn.detectron_cell_anchors,
        proposal_filter=rpn.keep_min_size_inclusive, fpn_levels=poolers.detectron_levels,
        box_rule=BoxRule(offset=1, inclusive_nms=False), topk_per_level=True, ties_at_cap=True,
    )


# keys after the ``module.`` strip: the ResNet body named as torchvision's but for the stem; `fpn_inner{j}` /
# `fpn_layer{j}` (j = 1 for C2), a Sequential (`.0` conv, `.1` GN) when normalized
_LEVEL = {"inner": "lateral", "layer": "output"}
_FX = r"^roi_heads\.box\.feature_extractor\."
RULES: list[tuple[str, str | Callable]] = [
    (r"^backbone\.body\.stem\.conv1\.", "backbone.stem.conv1."),
    (r"^backbone\.body\.stem\.bn1\.", "backbone.stem.conv1.norm."),
    *torchvision.RULES[2:6],  # layer{1..4}: conv, bn, downsample as torchvision's
    (r"^backbone\.fpn\.fpn_(inner|layer)(\d)\.(?:0\.)?", lambda m: f"fpn.{_LEVEL[m[1]]}{int(m[2]) + 1}."),
    (r"^rpn\.head\.conv\.", "rpn.head.convs.0."),
    (r"^rpn\.head\.(cls_logits|bbox_pred)\.", lambda m: f"rpn.head.{RPN_OUT[m[1]]}."),
    (_FX + r"fc([67])\.1\.", lambda m: f"box_head.fc{int(m[1]) - 5}_norm."),
    (_FX + r"fc([67])\.(?:0\.)?", lambda m: f"box_head.fc{int(m[1]) - 5}."),
    (r"^roi_heads\.box\.predictor\.", "box_predictor."),
    (r"^roi_heads\.mask\.feature_extractor\.mask_fcn(\d)\.(?:0\.)?", r"mask_head.mask_fcn\1."),
    (r"^roi_heads\.mask\.predictor\.(conv5_mask|mask_fcn_logits)\.", lambda m: f"mask_head.{MASK_OUT[m[1]]}."),
]
_NORM = re.compile(r"^(backbone\.fpn\.fpn_(?:inner|layer)\d|roi_heads\.mask\.feature_extractor\.mask_fcn\d)\.1\.")
_ANCHORS = re.compile(r"^rpn\.anchor_generator\.cell_anchors\.(\d+)$")


def recognize(keys: Collection[str]) -> str | None:
    """maskrcnn-benchmark's module tree: its ResNet stem, stored anchors or ``roi_heads.box.``."""
    is_mb = any(k.startswith(("backbone.body.stem.", "rpn.anchor_generator.", "roi_heads.box.")) for k in keys)
    return "" if is_mb else None


def renamer(keys: Collection[str]) -> Renamer:
    """maskrcnn-benchmark key -> minidet name, for a file with ``keys``: the 4conv1fc head's ``xconvs``
    Sequential holds (conv, GN, ReLU) per conv with GN, (conv, ReLU) without. None for what plays no part at
    inference (``architectures.SET_ASIDE``: the stored anchors)."""
    step = 3 if any(re.search(r"\.xconvs\.1\.weight$", k) for k in keys) else 2

    def rename(name: str) -> str | None:
        if set_aside("maskrcnn_benchmark", name):
            return None
        if m := _NORM.match(name):  # the GN of a normalized FPN or mask conv
            return rename(m[1] + ".0.")[:-1] + ".norm." + name[m.end() :]
        if m := re.match(_FX + r"xconvs\.(\d+)\.", name):
            j, part = divmod(int(m[1]), step)
            return f"box_head.conv{j + 1}.{'norm.' if part else ''}{name[m.end() :]}"
        return rename_by_rules(RULES, name)

    return rename


def check_anchors(model, src: dict, path: str) -> None:
    """maskrcnn-benchmark files store the anchors its strict load puts in place of the configured ones:
    one warning line when they are not minidet's."""
    for k, v in src.items():
        if m := _ANCHORS.match(k):
            ours = model.rpn.cell_anchors[int(m[1])] if int(m[1]) < len(model.rpn.cell_anchors) else None
            if ours is None or tuple(v.shape) != tuple(ours.shape) or not v.float().equal(ours):
                what = "no such level" if ours is None else f"file {v.tolist()} vs {ours.tolist()}"
                logger.warning("%s: %s is not the anchors minidet generates (%s); minidet uses its own", path, k, what)
                return


FAMILY = Family(
    name="maskrcnn_benchmark",
    title="maskrcnn-benchmark",
    licence=NOT_STATED,
    licence_source="MODEL_ZOO.md of facebookresearch/maskrcnn-benchmark",
    arithmetic=arithmetic,
    recognize=recognize,
    renamer=renamer,
    fixed={"": {"MODEL.FROZEN_BN_EPS": 0.0}},  # its FrozenBatchNorm2d has no eps
    check=check_anchors,
    weights=tuple(row.weights for row in _zoo.ROWS),
)
