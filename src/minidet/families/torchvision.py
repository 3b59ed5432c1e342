"""torchvision's ``maskrcnn_resnet50_fpn`` (v1, in the published legacy or the current key layout) and
``maskrcnn_resnet50_fpn_v2`` files: their keys, arithmetic and published weights."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from .architectures import set_aside
from .base import MASK_OUT, NOT_STATED, RPN_OUT, Family, rename_by_rules
from .zoo import torchvision as _zoo


def arithmetic():
    """torchvision's ``GeneralizedRCNNTransform`` (normalize, then bilinear resize), rounded anchors, anchor strides
    from the padded size, plain boxes, a small-box filter in the box head, its own paste."""
    from .. import poolers, transform
    from ..conventions import Convention
    from ..heads import rpn

    return Convention(
        resize=transform.resize_torch, anchors=rpn.torchvision_cell_anchors, proposal_filter=rpn.keep_min_size,
        fpn_levels=poolers.torchvision_levels, fixed_strides=False, small_box_filter=True,
    )


RULES: list[tuple[str, str | Callable]] = [
    (r"^backbone\.body\.conv1\.", "backbone.stem.conv1."),
    (r"^backbone\.body\.bn1\.", "backbone.stem.conv1.norm."),
    # the ResNet body's stages (maskrcnn-benchmark names them the same way)
    (r"^backbone\.body\.layer(\d)\.(\d+)\.conv(\d)\.", lambda m: f"backbone.res{int(m[1]) + 1}.{m[2]}.conv{m[3]}."),
    (r"^backbone\.body\.layer(\d)\.(\d+)\.bn(\d)\.", lambda m: f"backbone.res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.norm."),
    (r"^backbone\.body\.layer(\d)\.0\.downsample\.0\.", lambda m: f"backbone.res{int(m[1]) + 1}.0.shortcut."),
    (r"^backbone\.body\.layer(\d)\.0\.downsample\.1\.", lambda m: f"backbone.res{int(m[1]) + 1}.0.shortcut.norm."),
    # FPN: current layout `inner_blocks.i.0.` (conv) / `.1.` (norm, v2); legacy `inner_blocks.i.`
    (r"^backbone\.fpn\.inner_blocks\.(\d)\.(?:0\.)?(weight|bias)$", lambda m: f"fpn.lateral{int(m[1]) + 2}.{m[2]}"),
    (r"^backbone\.fpn\.inner_blocks\.(\d)\.1\.", lambda m: f"fpn.lateral{int(m[1]) + 2}.norm."),
    (r"^backbone\.fpn\.layer_blocks\.(\d)\.(?:0\.)?(weight|bias)$", lambda m: f"fpn.output{int(m[1]) + 2}.{m[2]}"),
    (r"^backbone\.fpn\.layer_blocks\.(\d)\.1\.", lambda m: f"fpn.output{int(m[1]) + 2}.norm."),
    (r"^rpn\.head\.conv\.(\d)\.0\.", r"rpn.head.convs.\1."),
    (r"^rpn\.head\.conv\.(weight|bias)$", r"rpn.head.convs.0.\1"),  # legacy
    (r"^rpn\.head\.(cls_logits|bbox_pred)\.", lambda m: f"rpn.head.{RPN_OUT[m[1]]}."),
    (r"^roi_heads\.box_head\.fc([67])\.", lambda m: f"box_head.fc{int(m[1]) - 5}."),
    (r"^roi_heads\.box_head\.([0-3])\.0\.", lambda m: f"box_head.conv{int(m[1]) + 1}."),  # v2 convs
    (r"^roi_heads\.box_head\.([0-3])\.1\.", lambda m: f"box_head.conv{int(m[1]) + 1}.norm."),
    (r"^roi_heads\.box_head\.5\.", "box_head.fc1."),  # v2: index 4 is Flatten
    (r"^roi_heads\.box_predictor\.", "box_predictor."),
    (r"^roi_heads\.mask_head\.mask_fcn(\d)\.", r"mask_head.mask_fcn\1."),  # legacy
    (r"^roi_heads\.mask_head\.(\d)\.0\.", lambda m: f"mask_head.mask_fcn{int(m[1]) + 1}."),
    (r"^roi_heads\.mask_head\.(\d)\.1\.", lambda m: f"mask_head.mask_fcn{int(m[1]) + 1}.norm."),
    (r"^roi_heads\.mask_predictor\.(conv5_mask|mask_fcn_logits)\.", lambda m: f"mask_head.{MASK_OUT[m[1]]}."),
]


def rename(name: str) -> str | None:
    """torchvision ``maskrcnn_resnet50_fpn`` (v1 legacy/current, v2) key -> minidet name; None for what plays no
    part at inference (``architectures.SET_ASIDE``: ``num_batches_tracked``); unknown keys come back unchanged for
    the matcher to report."""
    return None if set_aside("torchvision", name) else rename_by_rules(RULES, name)


# the published COCO_V1 file's names (modules before torchvision's ``_version = 2``)
_LEGACY = re.compile(
    r"^(backbone\.fpn\.(inner|layer)_blocks\.\d\.(weight|bias)|rpn\.head\.conv\.(weight|bias)"
    r"|roi_heads\.mask_head\.mask_fcn\d\.)"
)
_V2 = re.compile(r"^(backbone\.fpn\.inner_blocks\.\d\.1\.|roi_heads\.box_head\.\d\.0\.)")


def layout(keys: Collection[str]) -> str:
    """``"v1 legacy"`` (the published COCO_V1 key layout), ``"v2"`` (normed FPN, conv box head) or ``"v1"``."""
    if any(_LEGACY.match(k) for k in keys):
        return "v1 legacy"
    return "v2" if any(_V2.match(k) for k in keys) else "v1"


def recognize(keys: Collection[str]) -> str | None:
    """A torchvision file has its ResNet under ``backbone.body.`` with torchvision's stem (maskrcnn-benchmark's
    ResNet is there too, with its stem under ``backbone.body.stem.``)."""
    body = any(k.startswith("backbone.body.") for k in keys)
    return layout(keys) if body and not any(k.startswith("backbone.body.stem.") for k in keys) else None


FAMILY = Family(
    name="torchvision",
    title="torchvision",
    models="maskrcnn_resnet50_fpn[_v2]",
    licence=NOT_STATED,
    licence_source="README.md of pytorch/vision",
    arithmetic=arithmetic,
    recognize=recognize,
    renamer=lambda keys: rename,
    # torchvision runs its published v1 file with FrozenBN eps 0 (the default 1e-5 moves boxes by hundreds of pixels)
    fixed={"v1 legacy": {"MODEL.FROZEN_BN_EPS": 0.0}},
    weights=tuple(row.weights for row in _zoo.ROWS),
)
