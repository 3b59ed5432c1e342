"""The shipped configs of the zoos' published files (``src/minidet/configs/<family>/<name>.yaml``), made from each
family's table (``src/minidet/families/zoo/<family>.py``: name, the zoo's config, URL, digest, AP, written once) and,
for mmdetection and detectron2, from the zoo's own config file, read as the zoo reads it and mapped to minidet's keys
here (:func:`from_mmdetection`, :func:`from_detectron2`: what the zoo's config computes at test time; they fail on
any part of its network that minidet's keys cannot describe).

A config is its family's Base config nearest to what the zoo's config computes (the fewest keys beside it), those keys,
the row's ``keys`` and ``MODEL.WEIGHTS`` (the row's file); for torchvision, Detectron and maskrcnn-benchmark, whose
configs are not at hand, the row's ``base`` and ``keys``. Each made config says so in its first line; the configs
without it (the Base configs, the ``_fast`` variants, maskrcnn-benchmark's GN files) are written by hand.

The zoos' configs are read with the ``reference`` extra (mmdetection 3.3.0, mmengine; detectron2's sources in
../shared/reference), through the tests' reference modules (tests/mmdet_reference.py,
tests/detectron2_reference.py); without them a family's configs are left as they are (and said so).

Usage::

    python tools/zoo_configs.py                 # (re)writes the made configs
    python tools/zoo_configs.py --check         # exit status 1 when a shipped config is not what the tables make
    python tools/zoo_configs.py --family mmdetection [--check]

tests/test_zoo_configs.py runs the check (CI has the extra).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "src" / "minidet" / "configs"
MADE = "# Made by tools/zoo_configs.py"  # the first words of a made config


def _minidet():
    if importlib.util.find_spec("minidet") is None:
        sys.path.insert(0, str(ROOT / "src"))


def _reference(module: str):
    """The tests' reference module ``module`` (tests/mmdet_reference.py, tests/detectron2_reference.py)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    return importlib.import_module(module)


# ----------------------------------------------------------------------------------------------------------------
# mmdetection 3.3.0's python configs (mmengine's Config)

_MM_NORMS = {"BN": "BN", "SyncBN": "BN", "MMSyncBN": "BN", "GN": "GN"}  # mmcv's norm kinds -> MODEL.NORM at test time
_MM_BOX_HEADS = {"Shared2FCBBoxHead": (0, 2), "Shared4Conv1FCBBoxHead": (4, 1)}  # -> (convs, fcs)
_MM_DCN = {"DCN": False, "DCNv2": True}  # mmcv's deformable convs -> MODEL.RESNETS.DEFORM_MODULATED
# MaskIoUHead's dimensions, the ones minidet's mask IoU head has (MODEL.MASKIOU_ON)
_MM_MASK_IOU = {"num_convs": 4, "num_fcs": 2, "roi_feat_size": 14, "in_channels": 256, "conv_out_channels": 256,
             "fc_out_channels": 1024}


def _mm_context(bb) -> tuple[list, float] | None:
    """The backbone's GC blocks as (MODEL.RESNETS.CONTEXT_ON_PER_STAGE, CONTEXT_RATIO): one plugin, mmcv's
    ContextBlock after conv3 with attention pooling and channel add (its defaults); None without plugins."""
    plugins = bb.get("plugins")
    if not plugins:
        return None
    (plugin,) = plugins
    block = plugin.cfg
    assert plugin.position == "after_conv3" and block.type == "ContextBlock", plugin
    assert block.get("pooling_type", "att") == "att" and tuple(block.get("fusion_types", ("channel_add",))) == (
        "channel_add",), block
    assert set(block) <= {"type", "ratio", "pooling_type", "fusion_types"} and len(plugin.stages) == 4, block
    return [bool(s) for s in plugin.stages], block.ratio


def _mm_regnet(bb) -> dict:
    """MODEL.REGNET's keys for mmdetection's RegNet ``bb`` (its ``arch``: a name of RegNet.arch_settings or the dict
    itself): a RegNetX of bottleneck ratio 1, its defaults elsewhere (stem of 32, stride 2 per stage, no dilation)."""
    if bb.type != "RegNet":
        return {"MODEL.REGNET.DEPTH": 0}
    _reference("mmdet_reference").install_stand_ins()  # mmdet.models imports mmcv's compiled ops
    from mmdet.models.backbones import RegNet

    arch = RegNet.arch_settings[bb.arch] if isinstance(bb.arch, str) else bb.arch
    assert arch.get("bot_mul", 1.0) == 1.0, arch
    assert tuple(bb.get("strides", (2,) * 4)) == (2,) * 4 and tuple(bb.get("dilations", (1,) * 4)) == (1,) * 4
    assert not bb.get("deep_stem", False) and not bb.get("avg_down", False) and bb.get("in_channels", 3) == 3
    return {
        "MODEL.REGNET.DEPTH": arch["depth"],
        "MODEL.REGNET.W_A": arch["wa"],
        "MODEL.REGNET.W_0": arch["w0"],
        "MODEL.REGNET.W_M": arch["wm"],
        "MODEL.REGNET.GROUP_WIDTH": arch["group_w"],
        "MODEL.REGNET.SE_RATIO": 0.0,  # mmdetection's RegNet is RegNetX
        "MODEL.REGNET.STEM_WIDTH": bb.get("stem_channels", 32),
    }


def _mm_stages(roi) -> tuple[list, object]:
    """A CascadeRoIHead's box heads, one per stage, and its mask head (a list of identical heads, or one config that
    mmdetection builds once per stage); a StandardRoIHead's one box head and its mask head."""
    if roi.type != "CascadeRoIHead":
        return [roi.bbox_head], roi.mask_head
    boxes, masks = roi.bbox_head, roi.mask_head
    assert isinstance(boxes, list) and len(boxes) == roi.num_stages >= 2
    assert isinstance(roi.bbox_roi_extractor, dict) and isinstance(roi.mask_roi_extractor, dict)  # shared
    assert all(b.get("reg_class_agnostic", False) for b in boxes)  # minidet's cascade: class-agnostic boxes only
    without_coder = [{k: v for k, v in b.items() if k != "bbox_coder"} for b in boxes]
    assert all(b == without_coder[0] for b in without_coder), boxes  # the stages differ in their box coders only
    masks = masks if isinstance(masks, list) else [masks]
    assert len(masks) in (1, roi.num_stages) and all(mk == masks[0] for mk in masks), masks
    return boxes, masks[0]


def from_mmdetection(zoo_cfg) -> dict:
    """What mmdetection's config ``zoo_cfg`` computes at test time, as minidet's config keys; fails on any part of
    its network that these keys cannot describe (another head, a plugin, norms of two kinds ...)."""
    m = zoo_cfg.model
    bb, dp, neck, rpn, roi = m.backbone, m.data_preprocessor, m.neck, m.rpn_head, m.roi_head
    stages, mask = _mm_stages(roi)
    box, test = stages[0], m.test_cfg
    assert m.type in ("MaskRCNN", "PanopticFPN", "CascadeRCNN", "MaskScoringRCNN")
    assert (neck.type, rpn.type) == ("FPN", "RPNHead")
    # PISA's changes only its training loss; Mask Scoring R-CNN's adds the mask IoU head
    assert roi.type in ("StandardRoIHead", "PISARoIHead", "CascadeRoIHead", "MaskScoringRoIHead")
    assert (m.type == "CascadeRCNN") == (roi.type == "CascadeRoIHead")
    scoring = roi.type == "MaskScoringRoIHead"
    assert (m.type == "MaskScoringRCNN") == scoring
    if scoring:
        iou = roi.mask_iou_head
        assert iou.type == "MaskIoUHead" and iou.num_classes == mask.num_classes, iou
        assert {k: iou.get(k, v) for k, v in _MM_MASK_IOU.items()} == _MM_MASK_IOU, iou
    assert bb.type in ("ResNet", "ResNeXt", "RegNet")
    context = _mm_context(bb)
    dcn = bb.get("dcn")  # deformable 3x3 convs in the stages of stage_with_dcn, strided ones too
    assert dcn is None or (dcn.type in _MM_DCN and not dcn.get("fallback_on_stride", False)
                           and set(dcn) <= {"type", "deform_groups", "fallback_on_stride"}), dcn
    assert box.type in _MM_BOX_HEADS and mask.type == "FCNMaskHead"
    assert neck.num_outs == 5 and neck.out_channels == rpn.in_channels == 256
    normed = {"backbone": bb.norm_cfg, "neck": neck.get("norm_cfg"), "box": box.get("norm_cfg"),
              "mask": mask.get("norm_cfg")}
    kinds = {_MM_NORMS[n.type] for n in normed.values() if n is not None}
    assert len(kinds) == 1, normed  # one MODEL.NORM
    norm = kinds.pop()
    assert all(n.get("eps", 1e-5) == 1e-5 for n in normed.values() if n is not None)
    groups = {n.get("num_groups") for n in normed.values() if n is not None}
    assert norm != "GN" or len(groups) == 1
    convs = {c.type if c else None for c in (bb.get("conv_cfg"), neck.get("conv_cfg"), box.get("conv_cfg"),
                                              mask.get("conv_cfg"))}
    assert convs in ({None}, {"ConvWS"}), convs
    box_convs, box_fcs = _MM_BOX_HEADS[box.type]
    assert box_convs == 0 or (box.conv_out_channels == 256 and box.get("conv_cfg") == bb.get("conv_cfg"))
    anchors, rpn_coder, box_coder = rpn.anchor_generator, rpn.bbox_coder, box.bbox_coder
    assert anchors.type == "AnchorGenerator" and len(anchors.scales) == 1
    assert list(rpn_coder.target_means) == [0.0] * 4
    assert all(b.bbox_coder.type == "DeltaXYWHBBoxCoder" and list(b.bbox_coder.target_means) == [0.0] * 4
               for b in stages)
    assert list(rpn_coder.target_stds) == [1.0] * 4
    resize = [t for t in zoo_cfg.test_dataloader.dataset.pipeline if t["type"] == "Resize"]
    assert len(resize) == 1 and resize[0]["keep_ratio"]
    assert box.roi_feat_size == roi.bbox_roi_extractor.roi_layer.output_size
    assert roi.bbox_roi_extractor.roi_layer.type == roi.mask_roi_extractor.roi_layer.type == "RoIAlign"
    assert box.num_classes == mask.num_classes
    resnext, regnet = bb.type == "ResNeXt", bb.type == "RegNet"
    body = {} if regnet else {  # a RegNet's body is MODEL.REGNET's
        "MODEL.RESNETS.DEPTH": bb.depth,
        "MODEL.RESNETS.NUM_GROUPS": bb.groups if resnext else 1,
        "MODEL.RESNETS.WIDTH_PER_GROUP": bb.base_width if resnext else 64,
    }
    return {
        **body,
        **_mm_regnet(bb),
        "MODEL.CONVENTION": "mmdetection",
        "MODEL.NORM": norm,
        "MODEL.FROZEN_BN_EPS": 1e-5,
        "MODEL.GN_NUM_GROUPS": groups.pop() if norm == "GN" else 32,
        "MODEL.GN_EPS": 1e-5,
        "MODEL.HEAD_NORM": "",  # one norm kind throughout (asserted above)
        "MODEL.WEIGHT_STANDARDIZATION": convs == {"ConvWS"},
        "MODEL.PIXEL_MEAN": list(dp.mean),
        "MODEL.PIXEL_STD": list(dp.std),
        "INPUT.FORMAT": "RGB" if dp.bgr_to_rgb else "BGR",
        "INPUT.SIZE_DIVISIBILITY": dp.pad_size_divisor,
        "INPUT.MIN_SIZE_TEST": min(resize[0]["scale"]),
        "INPUT.MAX_SIZE_TEST": max(resize[0]["scale"]),
        "MODEL.RESNETS.STRIDE_IN_1X1": bb.get("style", "pytorch") == "caffe",
        "MODEL.RESNETS.DEFORM_ON_PER_STAGE": list(bb.get("stage_with_dcn", [False] * 4)) if dcn else [False] * 4,
        "MODEL.RESNETS.DEFORM_MODULATED": _MM_DCN[dcn.type] if dcn else False,
        "MODEL.RESNETS.DEFORM_NUM_GROUPS": dcn.get("deform_groups", 1) if dcn else 1,
        "MODEL.RESNETS.CONTEXT_ON_PER_STAGE": context[0] if context else [False] * 4,
        "MODEL.RESNETS.CONTEXT_RATIO": context[1] if context else 1 / 16,
        "MODEL.FPN.OUT_CHANNELS": neck.out_channels,
        "MODEL.FPN.USE_NORM": normed["neck"] is not None,
        "MODEL.ANCHOR_GENERATOR.SIZES": [anchors.scales[0] * s for s in anchors.strides],
        "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS": list(anchors.ratios),
        "MODEL.RPN.CONV_DEPTH": rpn.get("num_convs", 1),
        "MODEL.RPN.PRE_NMS_TOPK_TEST": test.rpn.nms_pre,
        "MODEL.RPN.POST_NMS_TOPK_TEST": test.rpn.max_per_img,
        "MODEL.RPN.NMS_THRESH": test.rpn.nms.iou_threshold,
        "MODEL.RPN.MIN_SIZE": test.rpn.min_bbox_size,
        "MODEL.ROI_HEADS.NAME": "CascadeROIHeads" if len(stages) > 1 else "StandardROIHeads",
        "MODEL.ROI_HEADS.NUM_CLASSES": box.num_classes,
        "MODEL.ROI_HEADS.SCORE_THRESH_TEST": test.rcnn.score_thr,
        "MODEL.ROI_HEADS.NMS_THRESH_TEST": test.rcnn.nms.iou_threshold,
        "MODEL.ROI_HEADS.NMS_CLASS_AGNOSTIC": test.rcnn.nms.get("class_agnostic", False),
        "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE": test.rcnn.max_per_img,
        "MODEL.ROI_BOX_HEAD.NUM_CONV": box_convs,
        "MODEL.ROI_BOX_HEAD.CONV_DIM": 256,
        "MODEL.ROI_BOX_HEAD.NUM_FC": box_fcs,
        "MODEL.ROI_BOX_HEAD.USE_NORM": box_convs > 0 and normed["box"] is not None,
        "MODEL.ROI_BOX_HEAD.FC_DIM": box.fc_out_channels,
        "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION": box.roi_feat_size,
        "MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO": roi.bbox_roi_extractor.roi_layer.sampling_ratio,
        "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS": [1 / s for s in box_coder.target_stds],
        "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG": box.get("reg_class_agnostic", False),
        "MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS":
            [[1 / s for s in b.bbox_coder.target_stds] for b in stages] if len(stages) > 1 else [],
        "MODEL.ROI_MASK_HEAD.NUM_CONV": mask.num_convs,
        "MODEL.ROI_MASK_HEAD.CONV_DIM": mask.conv_out_channels,
        "MODEL.ROI_MASK_HEAD.USE_NORM": normed["mask"] is not None,
        "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION": roi.mask_roi_extractor.roi_layer.output_size,
        "MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO": roi.mask_roi_extractor.roi_layer.sampling_ratio,
        "MODEL.ROI_MASK_HEAD.THRESHOLD": test.rcnn.mask_thr_binary,
        "MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK": mask.get("class_agnostic", False),  # FCNMaskHead's default
        "MODEL.MASKIOU_ON": scoring,
    }


# ----------------------------------------------------------------------------------------------------------------
# detectron2's yaml configs (get_cfg) and LazyConfig files (LazyConfig.load), read as yaml configs

_D2_NORMS = {"FrozenBN": "BN", "BN": "BN", "SyncBN": "BN", "naiveSyncBN": "BN", "GN": "GN"}  # at test time


def from_detectron2(cfg) -> dict:
    """What detectron2's config ``cfg`` computes at test time, as minidet's config keys; fails on any part of its
    network that these keys cannot describe."""
    m = cfg.MODEL
    assert m.META_ARCHITECTURE in ("GeneralizedRCNN", "PanopticFPN") and m.MASK_ON and not m.KEYPOINT_ON
    assert m.BACKBONE.NAME == "build_resnet_fpn_backbone" and m.RESNETS.OUT_FEATURES == ["res2", "res3", "res4", "res5"]
    assert m.RESNETS.RES5_DILATION == 1 and m.RESNETS.STEM_OUT_CHANNELS == 64
    assert m.RPN.HEAD_NAME == "StandardRPNHead" and m.ROI_HEADS.NAME in ("StandardROIHeads", "CascadeROIHeads")
    cascade = m.ROI_HEADS.NAME == "CascadeROIHeads"  # one box head and predictor per entry of its regression weights
    stages = [list(w) for w in m.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS] if cascade else []
    assert not cascade or (m.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG and len(stages) == len(m.ROI_BOX_CASCADE_HEAD.IOUS))
    assert (m.ROI_BOX_HEAD.NAME, m.ROI_MASK_HEAD.NAME) == ("FastRCNNConvFCHead", "MaskRCNNConvUpsampleHead")
    assert m.ROI_BOX_HEAD.POOLER_TYPE == m.ROI_MASK_HEAD.POOLER_TYPE == "ROIAlignV2"  # aligned
    assert m.FPN.FUSE_TYPE == "sum" and m.ANCHOR_GENERATOR.OFFSET == 0.0 and m.ANCHOR_GENERATOR.ANGLES == [[-90, 0, 90]]
    # MODEL.NORM: the ResNet's and FPN's; MODEL.HEAD_NORM: the heads' where another kind (the X-152 cascade's GN)
    body = {_D2_NORMS[n] for n in (m.RESNETS.NORM, m.FPN.NORM) if n}
    heads = {_D2_NORMS[n] for n in (m.ROI_BOX_HEAD.NORM, m.ROI_MASK_HEAD.NORM) if n}
    assert len(body) == 1 and len(heads) <= 1, (body, heads)
    norm = body.pop()
    head_norm = heads.pop() if heads else norm
    sizes = [s for level in m.ANCHOR_GENERATOR.SIZES for s in level]
    assert len(m.ANCHOR_GENERATOR.SIZES) == 5 and len(m.ANCHOR_GENERATOR.ASPECT_RATIOS) == 1
    assert all(d == -1 for d in m.RPN.CONV_DIMS)
    assert len(cfg.INPUT.MIN_SIZE_TEST if isinstance(cfg.INPUT.MIN_SIZE_TEST, list) else [0]) <= 1
    regnet = m.get("REGNET")  # a RegNet bottom-up body (_lazy_as_yacs), else the ResNet of MODEL.RESNETS
    body = {  # a RegNet's body is MODEL.REGNET's
        f"MODEL.REGNET.{k}": regnet[k] for k in ("DEPTH", "W_A", "W_0", "W_M", "GROUP_WIDTH", "SE_RATIO", "STEM_WIDTH")
    } if regnet else {
        "MODEL.REGNET.DEPTH": 0,
        "MODEL.RESNETS.DEPTH": m.RESNETS.DEPTH,
        "MODEL.RESNETS.NUM_GROUPS": m.RESNETS.NUM_GROUPS,
        "MODEL.RESNETS.WIDTH_PER_GROUP": m.RESNETS.WIDTH_PER_GROUP,
    }
    return {
        **body,
        "MODEL.CONVENTION": "detectron2",
        "MODEL.NORM": norm,
        "MODEL.HEAD_NORM": "" if head_norm == norm else head_norm,
        "MODEL.FROZEN_BN_EPS": 1e-5,
        "MODEL.GN_NUM_GROUPS": 32,
        "MODEL.GN_EPS": 1e-5,
        "MODEL.PIXEL_MEAN": list(m.PIXEL_MEAN),
        "MODEL.PIXEL_STD": list(m.PIXEL_STD),
        "INPUT.FORMAT": cfg.INPUT.FORMAT,
        "INPUT.MIN_SIZE_TEST": cfg.INPUT.MIN_SIZE_TEST,
        "INPUT.MAX_SIZE_TEST": cfg.INPUT.MAX_SIZE_TEST,
        "INPUT.SIZE_DIVISIBILITY": 32,  # the FPN backbone's size_divisibility
        "MODEL.RESNETS.STRIDE_IN_1X1": m.RESNETS.STRIDE_IN_1X1,
        "MODEL.RESNETS.DEFORM_ON_PER_STAGE": list(m.RESNETS.DEFORM_ON_PER_STAGE),
        "MODEL.RESNETS.DEFORM_MODULATED": m.RESNETS.DEFORM_MODULATED,
        "MODEL.RESNETS.DEFORM_NUM_GROUPS": m.RESNETS.DEFORM_NUM_GROUPS,
        "MODEL.RESNETS.CONTEXT_ON_PER_STAGE": [False] * 4,  # detectron2 has no GC blocks
        "MODEL.FPN.OUT_CHANNELS": m.FPN.OUT_CHANNELS,
        "MODEL.FPN.USE_NORM": bool(m.FPN.NORM),
        "MODEL.ANCHOR_GENERATOR.SIZES": sizes,
        "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS": list(m.ANCHOR_GENERATOR.ASPECT_RATIOS[0]),
        "MODEL.RPN.CONV_DEPTH": len(m.RPN.CONV_DIMS),
        "MODEL.RPN.PRE_NMS_TOPK_TEST": m.RPN.PRE_NMS_TOPK_TEST,
        "MODEL.RPN.POST_NMS_TOPK_TEST": m.RPN.POST_NMS_TOPK_TEST,
        "MODEL.RPN.NMS_THRESH": m.RPN.NMS_THRESH,
        "MODEL.RPN.MIN_SIZE": 0.0,
        "MODEL.ROI_HEADS.NAME": "CascadeROIHeads" if cascade else "StandardROIHeads",
        "MODEL.ROI_HEADS.NUM_CLASSES": m.ROI_HEADS.NUM_CLASSES,
        "MODEL.ROI_HEADS.SCORE_THRESH_TEST": m.ROI_HEADS.SCORE_THRESH_TEST,
        "MODEL.ROI_HEADS.NMS_THRESH_TEST": m.ROI_HEADS.NMS_THRESH_TEST,
        "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE": cfg.TEST.DETECTIONS_PER_IMAGE,
        "MODEL.ROI_BOX_HEAD.NUM_CONV": m.ROI_BOX_HEAD.NUM_CONV,
        "MODEL.ROI_BOX_HEAD.CONV_DIM": m.ROI_BOX_HEAD.CONV_DIM,
        "MODEL.ROI_BOX_HEAD.NUM_FC": m.ROI_BOX_HEAD.NUM_FC,
        "MODEL.ROI_BOX_HEAD.FC_DIM": m.ROI_BOX_HEAD.FC_DIM,
        "MODEL.ROI_BOX_HEAD.USE_NORM": bool(m.ROI_BOX_HEAD.NORM) and m.ROI_BOX_HEAD.NUM_CONV > 0,
        "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION": m.ROI_BOX_HEAD.POOLER_RESOLUTION,
        "MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO": m.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO,
        "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS": list(m.ROI_BOX_HEAD.BBOX_REG_WEIGHTS),
        "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG": m.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG,
        "MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS": stages,
        "MODEL.ROI_MASK_HEAD.NUM_CONV": m.ROI_MASK_HEAD.NUM_CONV,
        "MODEL.ROI_MASK_HEAD.CONV_DIM": m.ROI_MASK_HEAD.CONV_DIM,
        "MODEL.ROI_MASK_HEAD.USE_NORM": bool(m.ROI_MASK_HEAD.NORM),
        "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION": m.ROI_MASK_HEAD.POOLER_RESOLUTION,
        "MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO": m.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO,
        "MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK": m.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK,
        "MODEL.ROI_MASK_HEAD.THRESHOLD": 0.5,  # detectron2's paste_masks_in_image threshold
        "MODEL.MASKIOU_ON": False,  # nor a mask IoU head
    }


def _d2_body_widths(cfg) -> list[int]:
    """The output channels of the bottom-up body of detectron2's config ``cfg`` (res2..res5 / s1..s4): a RegNet's
    as _lazy_as_yacs read them off the built body, a ResNet's from RES2_OUT_CHANNELS."""
    regnet = cfg.MODEL.get("REGNET")
    return list(regnet.OUT_CHANNELS) if regnet else [cfg.MODEL.RESNETS.RES2_OUT_CHANNELS << i for i in range(4)]


def _regnet_as_yacs(c, bottom_up) -> None:
    """Describe the LazyCall of detectron2's ``RegNet`` ``bottom_up`` in yaml config ``MODEL`` ``c``: its arguments in a
    new ``REGNET`` node (with ``OUT_CHANNELS``, read off the body it builds), its norm as the ResNet's. It must be what
    MODEL.REGNET describes: SimpleStem, ResBottleneckBlock with bottleneck ratio 1 (the stride in its 3x3 conv), stride
    2 per stage, ReLU, its four stages out."""
    import inspect

    from detectron2.config import CfgNode, instantiate
    from detectron2.modeling.backbone import RegNet
    from detectron2.modeling.backbone.regnet import ResBottleneckBlock, SimpleStem

    def arg(name):
        return bottom_up.get(name, inspect.signature(RegNet).parameters[name].default)

    assert (arg("stem_class"), arg("block_class")) == (SimpleStem, ResBottleneckBlock)
    assert arg("stride") == 2 and arg("bottleneck_ratio") == 1.0 and arg("activation_class") is None
    assert list(arg("out_features")) == ["s1", "s2", "s3", "s4"]
    body = instantiate(bottom_up)
    c.REGNET = CfgNode({"DEPTH": arg("depth"), "W_A": arg("w_a"), "W_0": arg("w_0"), "W_M": arg("w_m"),
                        "GROUP_WIDTH": arg("group_width"), "SE_RATIO": arg("se_ratio"), "STEM_WIDTH": arg("stem_width"),
                        "OUT_CHANNELS": [body.output_shape()[f"s{i}"].channels for i in range(1, 5)]})
    c.RESNETS.NORM, c.RESNETS.STRIDE_IN_1X1 = arg("norm"), False  # ResBottleneckBlock strides its 3x3 conv


def _lazy_as_yacs(d2, lazy):
    """The yaml config (``get_cfg`` with detectron2's Base-RCNN-FPN.yaml) describing what the LazyConfig ``lazy``
    instantiates at test time; arguments a ``LazyCall`` leaves out are its class's defaults."""
    import inspect

    from detectron2.config import get_cfg, instantiate
    from detectron2.modeling.backbone import RegNet
    from detectron2.modeling.roi_heads import FastRCNNOutputLayers

    def default(cls, arg):
        return inspect.signature(cls).parameters[arg].default

    def norm_name(norm):  # a string, or a function making the norm layer (NaiveSyncBatchNorm in the heads)
        return norm if isinstance(norm, str) else {"NaiveSyncBatchNorm": "naiveSyncBN"}[type(norm(8)).__name__]

    cfg = get_cfg()
    cfg.merge_from_file(str(d2.root() / "configs" / "Base-RCNN-FPN.yaml"))
    m, c = lazy.model, cfg.MODEL
    c.MASK_ON = True
    c.PIXEL_MEAN, c.PIXEL_STD, cfg.INPUT.FORMAT = list(m.pixel_mean), list(m.pixel_std), m.input_format
    bottom_up = m.backbone.bottom_up
    if bottom_up._target_ is RegNet:
        _regnet_as_yacs(c, bottom_up)
    else:
        assert bottom_up.stem.norm == bottom_up.stages.norm and bottom_up.stages.get("num_groups", 1) == 1
        c.RESNETS.DEPTH, c.RESNETS.STRIDE_IN_1X1 = bottom_up.stages.depth, bottom_up.stages.stride_in_1x1
        c.RESNETS.NORM = bottom_up.stages.norm
    c.FPN.NORM, c.FPN.OUT_CHANNELS = m.backbone.norm, m.backbone.out_channels
    rpn = m.proposal_generator
    c.RPN.CONV_DIMS = list(rpn.head.get("conv_dims", [-1]))
    c.RPN.PRE_NMS_TOPK_TEST, c.RPN.POST_NMS_TOPK_TEST = rpn.pre_nms_topk[1], rpn.post_nms_topk[1]
    c.RPN.NMS_THRESH = rpn.nms_thresh
    heads, box, predictor = m.roi_heads, m.roi_heads.box_head, m.roi_heads.box_predictor
    c.ROI_HEADS.NUM_CLASSES = heads.num_classes
    c.ROI_HEADS.SCORE_THRESH_TEST = predictor.get("test_score_thresh",
                                                  default(FastRCNNOutputLayers, "test_score_thresh"))
    c.ROI_HEADS.NMS_THRESH_TEST = predictor.get("test_nms_thresh", default(FastRCNNOutputLayers, "test_nms_thresh"))
    cfg.TEST.DETECTIONS_PER_IMAGE = predictor.get("test_topk_per_image",
                                                  default(FastRCNNOutputLayers, "test_topk_per_image"))
    c.ROI_BOX_HEAD.BBOX_REG_WEIGHTS = list(instantiate(predictor.box2box_transform).weights)
    c.ROI_BOX_HEAD.NAME, c.ROI_BOX_HEAD.NUM_CONV = "FastRCNNConvFCHead", len(box.conv_dims)
    c.ROI_BOX_HEAD.CONV_DIM = box.conv_dims[0] if box.conv_dims else c.ROI_BOX_HEAD.CONV_DIM
    c.ROI_BOX_HEAD.NUM_FC, c.ROI_BOX_HEAD.FC_DIM = len(box.fc_dims), box.fc_dims[0]
    c.ROI_BOX_HEAD.NORM = norm_name(box.get("conv_norm", ""))
    mask = heads.mask_head
    c.ROI_MASK_HEAD.NUM_CONV, c.ROI_MASK_HEAD.CONV_DIM = len(mask.conv_dims) - 1, mask.conv_dims[0]
    c.ROI_MASK_HEAD.NORM = norm_name(mask.get("conv_norm", ""))
    for pooler, part in ((heads.box_pooler, c.ROI_BOX_HEAD), (heads.mask_pooler, c.ROI_MASK_HEAD)):
        part.POOLER_RESOLUTION, part.POOLER_SAMPLING_RATIO = pooler.output_size, pooler.sampling_ratio
        part.POOLER_TYPE = pooler.pooler_type
    (resize,) = lazy.dataloader.test.mapper.augmentations
    cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST = resize.short_edge_length, resize.max_size
    return cfg


# ----------------------------------------------------------------------------------------------------------------
# the readers and the configs they make


@dataclass(frozen=True)
class Reader:
    """How a family's zoo configs are read: ``title`` (for the made config's first line), ``missing()`` (why they
    cannot be read here, or ``""``), ``read(zoo)``: (the keys :func:`from_mmdetection` / :func:`from_detectron2` give,
    the output channels of the zoo's body, which the config's body must have)."""

    title: str
    missing: Callable[[], str]
    read: Callable[[str], tuple[dict[str, Any], list[int]]]


def _mm_missing() -> str:
    absent = [m for m in ("mmdet", "mmengine") if importlib.util.find_spec(m) is None]
    return f"needs {', '.join(absent)} (pip install 'minidet[reference]')" if absent else ""


def _mm_read(zoo: str) -> tuple[dict[str, Any], list[int]]:
    cfg = _reference("mmdet_reference").zoo_config(zoo)
    return from_mmdetection(cfg), list(cfg.model.neck.in_channels)


def _d2_missing() -> str:
    absent = [m for m in ("fvcore", "omegaconf") if importlib.util.find_spec(m) is None]
    if absent:
        return f"needs {', '.join(absent)} (pip install 'minidet[reference]')"
    sources = _reference("detectron2_reference").SOURCES
    return "" if sources.is_file() else f"needs detectron2's sources: {sources}"


def _d2_read(zoo: str) -> tuple[dict[str, Any], list[int]]:
    d2 = _reference("detectron2_reference")
    cfg = d2.zoo_config(zoo)
    cfg = _lazy_as_yacs(d2, cfg) if zoo.endswith(".py") else cfg
    return from_detectron2(cfg), _d2_body_widths(cfg)


READERS: dict[str, Reader] = {
    "mmdetection": Reader("mmdetection 3.3.0's configs/{}.py", _mm_missing, _mm_read),
    "detectron2": Reader("detectron2's configs/{}", _d2_missing, _d2_read),
}
# the families whose tables give their configs' keys, and how their first line names the zoo's config
WRITTEN = {"torchvision": "torchvision's {}", "detectron": "Detectron's configs/{}",
           "maskrcnn_benchmark": "maskrcnn-benchmark's {}"}


def _rows(family: str):
    return importlib.import_module(f"minidet.families.zoo.{family}").ROWS


def _float(value: float) -> str:
    """A float as YAML 1.1 reads it back as that float (``1e-05`` is a string to it: ``1.0e-05``)."""
    text = repr(float(value))
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa if '.' in mantissa else mantissa + '.0'}{e}{exponent}" if e else text


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_value(v) for v in value)}]"
    raise TypeError(f"no YAML form for {value!r}")


def render(first: str, note: str, base: str, keys: dict[str, Any]) -> str:
    """A config's text: its comment (``first`` line, then ``note``), ``_BASE_``, then ``keys`` nested in the order
    of minidet's defaults."""
    from minidet.config import get_cfg, leaves

    order = {k: i for i, k in enumerate(leaves(get_cfg()))}
    comment = [line for text in (first, note) for line in textwrap.wrap(text, 116, break_on_hyphens=False)]
    lines = [f"# {line}" for line in comment] + [f"_BASE_: {_value(base)}"]
    opened: list[str] = []
    for key in sorted(keys, key=order.__getitem__):
        *parents, leaf = key.split(".")
        common = next((i for i, (a, b) in enumerate(zip(opened, parents)) if a != b), min(len(opened), len(parents)))
        lines += [f"{'  ' * i}{p}:" for i, p in enumerate(parents) if i >= common]
        opened = parents
        lines.append(f"{'  ' * len(parents)}{leaf}: {_value(keys[key])}")
    return "\n".join(lines) + "\n"


def _bases(family: str) -> list[str]:
    """The family's Base configs (``Base-*.yaml`` in its folder), the shortest name (the family's plain one) first."""
    return sorted((p.name for p in (CONFIGS / family).glob("Base-*.yaml")), key=lambda n: (len(n), n))


@functools.cache
def _base_leaves(family: str) -> dict[str, dict[str, Any]]:
    from minidet.config import get_cfg, leaves

    return {b: leaves(get_cfg(f"{family}/{b.removesuffix('.yaml')}")) for b in _bases(family)}


def _nearest(family: str, want: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The family's Base config nearest to ``want``: of those that set nothing the config must take back (every key
    a Base sets beside the family's plain one has ``want``'s value), the one with the fewest of ``want`` beside it;
    and those keys."""
    bases = _bases(family)
    have = _base_leaves(family)
    plain = have[bases[0]]
    best = None
    for base in bases:
        adds = {k: _listed(v) for k, v in have[base].items() if v != plain[k]}
        if any(k not in want or want[k] != v for k, v in adds.items()):
            continue
        beside = {k: v for k, v in want.items() if _listed(have[base][k]) != v}
        if best is None or len(beside) < len(best[1]):
            best = base, beside
    return best


def _listed(value: Any) -> Any:
    return [_listed(v) for v in value] if isinstance(value, (list, tuple)) else value


def _check_body(name: str, base: str, keys: dict[str, Any], widths: list[int]) -> None:
    """The config ``base`` + ``keys`` builds a body of the zoo's output channels ``widths`` (the FPN's inputs)."""
    from minidet.config import body_of, get_cfg

    cfg = get_cfg(f"{name.partition('/')[0]}/{base.removesuffix('.yaml')}")
    cfg.merge_from_list([x for k, v in keys.items() for x in (k, v)])
    if (have := list(body_of(cfg).out_channels)) != widths:
        raise ValueError(f"{name}: the body's output channels {have} are not the zoo's {widths}")


@dataclass(frozen=True)
class Made:
    """One made config: its ``path``, ``text`` and the keys the zoo's config gives (``{}`` where the table gives
    them)."""

    name: str
    path: Path
    text: str
    zoo_keys: dict[str, Any]


def make(family: str) -> list[Made]:
    """The configs of ``family``'s table. ValueError when its zoo configs cannot be read here (see
    :data:`READERS`) or one describes what minidet's keys cannot."""
    _minidet()
    reader = READERS.get(family)
    if reader is not None and (why := reader.missing()):
        raise ValueError(f"{family}: {why}")
    made = []
    for row in _rows(family):
        weights = {"MODEL.WEIGHTS": f"weights/{row.file}"}
        path = CONFIGS / f"{row.name}.yaml"
        if reader is None:
            first = (f"Made by tools/zoo_configs.py from its row in families/zoo/{family}.py "
                     f"({WRITTEN[family].format(row.zoo)}): change the row, not this file; see weights/README.md for "
                     "the file.")
            made.append(Made(row.name, path, render(first, row.note, row.base, {**weights, **row.keys}), {}))
            continue
        zoo_keys, widths = reader.read(row.zoo)
        base, beside = _nearest(family, {**zoo_keys, **row.keys})
        first = (f"Made by tools/zoo_configs.py from {reader.title.format(row.zoo)} and its row in "
                 f"families/zoo/{family}.py: change the row or the tool, not this file; see weights/README.md for the "
                 "file.")
        text = render(first, row.note, base, {**weights, **beside})
        _check_body(row.name, base, beside, widths)
        made.append(Made(row.name, path, text, zoo_keys))
    return made


def stale(family: str, made: list[Made]) -> list[Path]:
    """The family's made configs (their first line says so) that no row of its table makes."""
    paths = {m.path for m in made}
    return sorted(p for p in (CONFIGS / family).glob("*.yaml")
                  if p not in paths and p.read_text(encoding="utf-8").startswith(MADE))


FAMILIES = ("torchvision", "detectron", "detectron2", "maskrcnn_benchmark", "mmdetection")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="zoo_configs.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit status 1 where a config differs")
    parser.add_argument("--family", action="append", choices=FAMILIES, help="only this family (repeatable)")
    args = parser.parse_args(argv)
    differs = failed = 0
    for family in args.family or FAMILIES:
        try:
            made = make(family)
        except ValueError as e:
            print(f"skipped: {e}", file=sys.stderr)
            failed += bool(args.family)  # a family asked for by name must be made
            continue
        for m in made:
            shipped = m.path.read_text(encoding="utf-8") if m.path.is_file() else None
            if shipped == m.text:
                continue
            differs += 1
            if args.check:
                print(f"{m.path.relative_to(ROOT)}: {'differs from' if shipped else 'missing, unlike'} what the "
                      "table makes", file=sys.stderr)
            else:
                m.path.write_text(m.text, encoding="utf-8")
                print(f"wrote {m.path.relative_to(ROOT)}")
        for path in stale(family, made):
            differs += 1
            if args.check:
                print(f"{path.relative_to(ROOT)}: made by the tool but no row makes it", file=sys.stderr)
            else:
                path.unlink()
                print(f"removed {path.relative_to(ROOT)}")
    return 1 if failed or (args.check and differs) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
