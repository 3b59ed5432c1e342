"""Detectron's (Caffe2) model-zoo ``model_final.pkl`` files: blob names, arithmetic and published weights."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from ..errors import CheckpointError
from .architectures import set_aside
from .base import MASK_OUT, RPN_OUT, Family
from .zoo import detectron as _zoo


def arithmetic():
    """BGR minus the pixel mean, cv2 resizing, quantized anchors at fixed strides, +1 box sizes and NMS at
    IoU >= thresh, proposals clipped to the padded input and filtered in original pixels, top-k per level, boxes
    decoded in the original frame, score ties kept at the detection cap."""
    from .. import poolers, transform
    from ..boxes import BoxRule
    from ..conventions import Convention
    from ..heads import rpn

    return Convention(
        resize=transform.resize_cv2, anchors=rpn.detectron_cell_anchors, proposal_filter=rpn.keep_original_pixels,
        fpn_levels=poolers.detectron_levels, box_rule=BoxRule(offset=1, inclusive_nms=True), clip_to_padded=True,
        topk_per_level=True, original_frame=True, ties_at_cap=True,
    )


# blob name endings; a "bn" is an AffineChannel: an already folded frozen batch norm
_PARAM = {
    "w": "weight", "b": "bias", "bn_s": "norm.scale", "bn_b": "norm.shift", "gn_s": "norm.weight", "gn_b": "norm.bias"
}
_CONV = {"a": 1, "b": 2, "c": 3}

# whole blob name (pattern, its last group the ending) -> module (template or function of the match)
RULES: list[tuple[str, str | Callable]] = [
    (r"conv1_(w|gn_[sb])", "backbone.stem.conv1"),
    (r"res_conv1_(bn_[sb])", "backbone.stem.conv1"),
    (r"res(\d)_(\d+)_branch2([abc])_(w|[bg]n_[sb])", lambda m: f"backbone.res{m[1]}.{m[2]}.conv{_CONV[m[3]]}"),
    (r"res(\d)_0_branch1_(w|[bg]n_[sb])", r"backbone.res\1.0.shortcut"),
    (r"fpn_inner_res(\d)_\d+_sum(?:_lateral)?_([wb]|gn_[sb])", r"fpn.lateral\1"),
    (r"fpn_res(\d)_\d+_sum_([wb]|gn_[sb])", r"fpn.output\1"),
    # the RPN head is defined on P2 and shared by all levels
    (r"conv_rpn_fpn2_([wb])", "rpn.head.convs.0"),
    (r"rpn_(cls_logits|bbox_pred)_fpn2_([wb])", lambda m: f"rpn.head.{RPN_OUT[m[1]]}"),
    (r"fc([67])_([wb])", lambda m: f"box_head.fc{int(m[1]) - 5}"),
    (r"head_conv(\d)_([wb]|gn_[sb])", r"box_head.conv\1"),
    (r"(cls_score|bbox_pred)_([wb])", r"box_predictor.\1"),
    # BN heads name the mask convs `_[mask]_fcn{j}`, GN heads `_mask_fcn{j}`
    (r"_(?:\[mask\]|mask)_fcn(\d)_([wb])", r"mask_head.mask_fcn\1"),
    (r"_mask_fcn(\d)_(gn_[sb])", r"mask_head.mask_fcn\1"),
    (r"(conv5_mask|mask_fcn_logits)_([wb])", lambda m: f"mask_head.{MASK_OUT[m[1]]}"),
]
def rename(name: str) -> str | None:
    """Detectron blob name -> minidet name; None for what plays no part at inference (``architectures.SET_ASIDE``:
    SGD momenta, the blobs kept from the ImageNet file); unknown names come back unchanged for the matcher to
    report."""
    if set_aside("detectron", name):
        return None
    for pattern, rep in RULES:
        if m := re.match(pattern + "$", name):
            return f"{rep(m) if callable(rep) else m.expand(rep)}.{_PARAM[m.groups()[-1]]}"
    return name


def recognize(keys: Collection[str]) -> str | None:
    """Caffe2 blob names: ``conv1_w`` and the ``res2_0_*`` blocks."""
    return "" if "conv1_w" in keys and any(k.startswith("res2_0_") for k in keys) else None


def check_variant(model, blobs: dict, path: str) -> None:
    """Fail with the config key to change when the blobs describe another variant than the model: GroupNorms and the
    model's are not (``MODEL.NORM``, Detectron's GN configs), AffineChannels (frozen batch norms) and the model's are
    GroupNorms, a 4conv1fc box head and the model's 2fc or the reverse (``MODEL.ROI_BOX_HEAD.NUM_CONV``). What every
    family's files are checked for (another body, class count) is ``checkpoint.load_checkpoint``'s."""
    from torch import nn

    stem_norm = getattr(model.backbone.stem.conv1, "norm", None)
    if "conv1_gn_s" in blobs and not isinstance(stem_norm, nn.GroupNorm):
        raise CheckpointError(
            f"{path}: a GroupNorm model (conv1_gn_s) but MODEL.NORM is {type(stem_norm).__name__}; "
            "use MODEL.NORM GN (configs/detectron/*_gn.yaml)"
        )
    if "res_conv1_bn_s" in blobs and isinstance(stem_norm, nn.GroupNorm):
        raise CheckpointError(
            f"{path}: a frozen-BN model (res_conv1_bn_s) but MODEL.NORM is GN; use MODEL.NORM Affine or FrozenBN"
        )
    convs, num_conv = "head_conv1_w" in blobs, model.box_head.num_conv
    if convs != (num_conv > 0):
        kind = "4conv1fc (head_conv1_w)" if convs else "2fc (fc7_w)"
        raise CheckpointError(f"{path}: box head is {kind} but MODEL.ROI_BOX_HEAD.NUM_CONV is {num_conv}")


FAMILY = Family(
    name="detectron",
    title="Detectron",
    licence="CC BY-SA 3.0",
    licence_source="MODEL_ZOO.md of facebookresearch/Detectron",
    arithmetic=arithmetic,
    recognize=recognize,
    renamer=lambda keys: rename,
    check=check_variant,
    ignores_non_arrays=True,  # real files carry None blobs (pred_b) and the config text beside the blobs
    weights=tuple(row.weights for row in _zoo.ROWS),
)
