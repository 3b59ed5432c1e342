"""detectron2's model-zoo Mask R-CNN files (``.pkl`` / ``.pth``): keys, arithmetic and published weights."""

from __future__ import annotations

from collections.abc import Callable, Collection

from .architectures import set_aside
from .base import Family, rename_by_rules
from .zoo import detectron2 as _zoo


def arithmetic():
    """PIL resizing, exact-area anchors at fixed strides, proposals ranked by logit, aligned RoIAlign, boxes
    clipped and empty ones dropped after rescaling, grid-sample mask paste; a cascade's score the mean of its stages'
    probabilities, one mask head."""
    from .. import poolers, transform
    from ..conventions import CascadeRule, Convention
    from ..heads import rpn

    return Convention(
        resize=transform.resize_pil, anchors=rpn.detectron2_cell_anchors, proposal_filter=rpn.keep_above_min_size,
        fpn_levels=poolers.detectron2_levels, rank_by_logit=True, aligned_roi=True,
        rescale=transform.rescale_clip_nonempty, paste=transform.paste_masks_aligned,
        cascade=CascadeRule(mean_logits=False, mask_per_stage=False),  # CascadeROIHeads
    )


# its RegNet (after pycls): stem ``conv``, ``bn``; stage ``sN``'s block ``bK``: ``proj`` + ``bn`` (the shortcut),
# ``f.a``, ``f.b``, ``f.c`` with their ``_bn``, RegNetY's ``f.se.f_ex.0`` / ``.2``
_REGNET = {"proj": "shortcut", "bn": "shortcut.norm", "f.a": "conv1", "f.a_bn": "conv1.norm", "f.b": "conv2",
           "f.b_bn": "conv2.norm", "f.c": "conv3", "f.c_bn": "conv3.norm", "f.se.f_ex.0": "se.reduce",
           "f.se.f_ex.2": "se.expand"}
RULES: list[tuple[str, str | Callable]] = [
    (r"^backbone\.bottom_up\.(res\d\.\d+\.conv2)_offset\.", r"backbone.\1.offset."),  # DeformBottleneckBlock
    (r"^backbone\.bottom_up\.stem\.conv\.", "backbone.stem.conv1."),
    (r"^backbone\.bottom_up\.stem\.bn\.", "backbone.stem.conv1.norm."),
    (r"^backbone\.bottom_up\.s(\d)\.b(\d+)\.(proj|bn|f\.[abc](?:_bn)?|f\.se\.f_ex\.[02])\.",
     lambda m: f"backbone.res{int(m[1]) + 1}.{int(m[2]) - 1}.{_REGNET[m[3]]}."),
    (r"^backbone\.bottom_up\.", "backbone."),
    (r"^backbone\.fpn_(lateral|output)(\d)\.", r"fpn.\1\2."),
    (r"^proposal_generator\.rpn_head\.conv\.conv(\d)\.", r"rpn.head.convs.\1."),  # conv_dims [-1, -1]: conv0, conv1
    (r"^proposal_generator\.rpn_head\.conv\.", "rpn.head.convs.0."),
    (r"^proposal_generator\.rpn_head\.", "rpn.head."),
    (r"^roi_heads\.box_head\.(\d)\.", r"cascade.heads.\1."),  # CascadeROIHeads: a list of box heads
    (r"^roi_heads\.box_predictor\.(\d)\.", r"cascade.predictors.\1."),
    (r"^roi_heads\.(box_head|box_predictor|mask_head)\.", r"\1."),
]


def rename(name: str) -> str | None:
    """detectron2 ``GeneralizedRCNN`` state-dict key -> minidet name; None for what plays no part at inference
    (``architectures.SET_ASIDE``: the pixel statistics and anchors of old files, ...); unknown keys come back
    unchanged."""
    if set_aside("detectron2", name):
        return None
    return rename_by_rules(RULES, name)


def recognize(keys: Collection[str]) -> str | None:
    """detectron2's module tree: ``backbone.bottom_up.`` (the ResNet) or ``proposal_generator.`` (the RPN)."""
    return "" if any(k.startswith(("backbone.bottom_up.", "proposal_generator.")) for k in keys) else None


ZOO_CONFIGS = {row.name: row.zoo for row in _zoo.ROWS}
"""Registry name -> the zoo's config (its path under detectron2's ``configs/``) that the shipped config restates."""


FAMILY = Family(
    name="detectron2",
    title="detectron2",
    licence="CC BY-SA 3.0",
    licence_source="MODEL_ZOO.md of facebookresearch/detectron2",
    arithmetic=arithmetic,
    recognize=recognize,
    renamer=lambda keys: rename,
    ignores_non_arrays=True,
    background_last=True,
    weights=tuple(row.weights for row in _zoo.ROWS),
)
