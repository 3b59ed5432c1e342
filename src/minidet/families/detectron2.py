"""detectron2's model-zoo Mask R-CNN files (``.pkl`` / ``.pth``): keys, arithmetic and published weights."""

from __future__ import annotations

from collections.abc import Callable, Collection

from .architectures import set_aside
from .base import Family, WeightsEntry, rename_by_rules


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


_SOURCE = "detectron2's MODEL_ZOO.md (URL, AP); detectron2 publishes no digests"
_URL = "https://dl.fbaipublicfiles.com/detectron2/{}/{}/{}"
_ZOO = [  # zoo config (under detectron2's configs/), model id, published file, box AP, mask AP
    ("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml", 137260431, "model_final_a54504.pkl", 38.6, 35.2),
    ("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x.yaml", 137849600, "model_final_f10217.pkl", 41.0, 37.2),
    ("COCO-InstanceSegmentation/mask_rcnn_R_101_FPN_3x.yaml", 138205316, "model_final_a3ec72.pkl", 42.9, 38.6),
    ("COCO-InstanceSegmentation/mask_rcnn_X_101_32x8d_FPN_3x.yaml", 139653917, "model_final_2d9806.pkl", 44.3, 39.5),
    ("new_baselines/mask_rcnn_R_50_FPN_100ep_LSJ.py", 42047764, "model_final_bb69de.pkl", 44.6, 40.3),
    ("new_baselines/mask_rcnn_R_50_FPN_200ep_LSJ.py", 42047638, "model_final_89a8d3.pkl", 46.3, 41.7),
    ("new_baselines/mask_rcnn_R_50_FPN_400ep_LSJ.py", 42019571, "model_final_14d201.pkl", 47.4, 42.5),
    ("new_baselines/mask_rcnn_R_101_FPN_100ep_LSJ.py", 42025812, "model_final_4f7b58.pkl", 46.4, 41.6),
    ("new_baselines/mask_rcnn_R_101_FPN_200ep_LSJ.py", 42131867, "model_final_0bb7ae.pkl", 48.0, 43.1),
    ("new_baselines/mask_rcnn_R_101_FPN_400ep_LSJ.py", 42073830, "model_final_f96b26.pkl", 48.9, 43.7),
    ("COCO-PanopticSegmentation/panoptic_fpn_R_50_1x.yaml", 139514544, "model_final_dbfeb4.pkl", 37.6, 34.7),
    ("COCO-PanopticSegmentation/panoptic_fpn_R_50_3x.yaml", 139514569, "model_final_c10459.pkl", 40.0, 36.5),
    ("COCO-PanopticSegmentation/panoptic_fpn_R_101_3x.yaml", 139514519, "model_final_cafdb1.pkl", 42.4, 38.5),
    ("LVISv0.5-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml", 144219072, "model_final_571f7c.pkl", 23.6, 24.4),
    ("LVISv0.5-InstanceSegmentation/mask_rcnn_R_101_FPN_1x.yaml", 144219035, "model_final_824ab5.pkl", 25.6, 25.9),
    ("LVISv0.5-InstanceSegmentation/mask_rcnn_X_101_32x8d_FPN_1x.yaml", 144219108, "model_final_5e3439.pkl", 26.7,
     27.1),
    ("Cityscapes/mask_rcnn_R_50_FPN.yaml", 142423278, "model_final_af9cf5.pkl", None, 36.5),  # no box AP published
    ("Misc/mask_rcnn_R_50_FPN_3x_gn.yaml", 138602888, "model_final_dc5d9e.pkl", 42.6, 38.6),
    ("Misc/mask_rcnn_R_50_FPN_3x_syncbn.yaml", 169527823, "model_final_3b3c51.pkl", 41.9, 37.8),
    ("Misc/scratch_mask_rcnn_R_50_FPN_3x_gn.yaml", 138602908, "model_final_01ca85.pkl", 39.9, 36.6),
    ("Misc/scratch_mask_rcnn_R_50_FPN_9x_gn.yaml", 183808979, "model_final_da7b4c.pkl", 43.7, 39.6),
    ("Misc/scratch_mask_rcnn_R_50_FPN_9x_syncbn.yaml", 184226666, "model_final_5ce33e.pkl", 43.6, 39.3),
    ("Misc/mask_rcnn_R_50_FPN_1x_dconv_c3-c5.yaml", 138602867, "model_final_65c703.pkl", 41.5, 37.5),
    ("Misc/mask_rcnn_R_50_FPN_3x_dconv_c3-c5.yaml", 144998336, "model_final_821d0b.pkl", 42.7, 38.5),
    ("Misc/cascade_mask_rcnn_R_50_FPN_1x.yaml", 138602847, "model_final_e9d89b.pkl", 42.1, 36.4),
    ("Misc/cascade_mask_rcnn_R_50_FPN_3x.yaml", 144998488, "model_final_480dd8.pkl", 44.3, 38.5),
    ("Misc/panoptic_fpn_R_101_dconv_cascade_gn_3x.yaml", 139797668, "model_final_be35db.pkl", 47.4, 41.3),
    ("Misc/cascade_mask_rcnn_X_152_32x8d_FPN_IN5k_gn_dconv.yaml", 18131413, "model_0039999_e76410.pkl", 50.2, 44.0),
    ("new_baselines/mask_rcnn_regnetx_4gf_dds_FPN_100ep_LSJ.py", 42047771, "model_final_b7fbab.pkl", 46.0, 41.3),
    ("new_baselines/mask_rcnn_regnetx_4gf_dds_FPN_200ep_LSJ.py", 42132721, "model_final_5d87c1.pkl", 48.1, 43.1),
    ("new_baselines/mask_rcnn_regnetx_4gf_dds_FPN_400ep_LSJ.py", 42025447, "model_final_f1362d.pkl", 48.6, 43.5),
    ("new_baselines/mask_rcnn_regnety_4gf_dds_FPN_100ep_LSJ.py", 42047784, "model_final_6ba57e.pkl", 46.1, 41.6),
    ("new_baselines/mask_rcnn_regnety_4gf_dds_FPN_200ep_LSJ.py", 42047642, "model_final_27b9c1.pkl", 47.8, 43.0),
    ("new_baselines/mask_rcnn_regnety_4gf_dds_FPN_400ep_LSJ.py", 42045954, "model_final_ef3a80.pkl", 48.2, 43.3),
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
