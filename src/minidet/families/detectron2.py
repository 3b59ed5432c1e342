"""detectron2's model-zoo Mask R-CNN files (``.pkl`` / ``.pth``): keys, arithmetic and published weights."""

from __future__ import annotations

from collections.abc import Collection

from .architectures import set_aside
from .base import Family, WeightsEntry, rename_by_rules


def arithmetic():
    """PIL resizing, exact-area anchors at fixed strides, proposals ranked by logit, aligned RoIAlign, boxes
    clipped and empty ones dropped after rescaling, grid-sample mask paste."""
    from .. import poolers, rpn, transform
    from ..conventions import Convention

    return Convention(
        resize=transform.resize_pil, anchors=rpn.detectron2_cell_anchors, proposal_filter=rpn.keep_above_min_size,
        fpn_levels=poolers.detectron2_levels, rank_by_logit=True, aligned_roi=True,
        rescale=transform.rescale_clip_nonempty, paste=transform.paste_masks_aligned,
    )


RULES: list[tuple[str, str]] = [
    (r"^backbone\.bottom_up\.", "backbone."),
    (r"^backbone\.fpn_(lateral|output)(\d)\.", r"fpn.\1\2."),
    (r"^proposal_generator\.rpn_head\.conv\.", "rpn.head.convs.0."),
    (r"^proposal_generator\.rpn_head\.", "rpn.head."),
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


_SOURCE = "detectron2's MODEL_ZOO.md (URL, AP); detectron2 publishes no digests"
_URL = "https://dl.fbaipublicfiles.com/detectron2/{}/{}/{}"
_ZOO = [  # zoo config (under detectron2's configs/), model id, published file, box AP, mask AP
    ("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml", 137260431, "model_final_a54504.pkl", 38.6, 35.2),
    ("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x.yaml", 137849600, "model_final_f10217.pkl", 41.0, 37.2),
    ("COCO-InstanceSegmentation/mask_rcnn_R_101_FPN_3x.yaml", 138205316, "model_final_a3ec72.pkl", 42.9, 38.6),
    ("COCO-InstanceSegmentation/mask_rcnn_X_101_32x8d_FPN_3x.yaml", 139653917, "model_final_2d9806.pkl", 44.3, 39.5),
]
_PREFIX = {"LVISv0.5-InstanceSegmentation": "lvis_v0.5_", "Cityscapes": "cityscapes_"}  # their names repeat COCO's


def _name(zoo: str) -> str:
    """The registry's (and the shipped config's) name of the zoo config ``zoo``."""
    folder, _, file = zoo.rpartition("/")
    return f"detectron2/{_PREFIX.get(folder, '')}{file.rpartition('.')[0]}"


ZOO_CONFIGS = {_name(zoo): zoo for zoo, *_ in _ZOO}
"""Registry name -> the zoo's config (its path under detectron2's ``configs/``) that the shipped config restates."""


FAMILY = Family(
    name="detectron2",
    title="detectron2",
    arithmetic=arithmetic,
    recognize=recognize,
    renamer=lambda keys: rename,
    ignores_non_arrays=True,
    background_last=True,
    weights=tuple(
        WeightsEntry(name, _URL.format(zoo.rpartition(".")[0], model_id, file), f"{name.partition('/')[2]}.pkl", name,
                     None, None, box, mask, _SOURCE)
        for name, (zoo, model_id, file, box, mask) in zip(ZOO_CONFIGS, _ZOO)
    ),
)
