"""minidet's mmdetection configs against mmdetection 3.3.0 itself (the ``reference`` extra; tests/mmdet_reference.py
gives mmcv's two CPU kernels pure-PyTorch stand-ins): every shipped config computes what its zoo config computes at
test time, read from the config file the installed mmdetection ships; and a synthetic checkpoint in mmdetection's
layout gives mmdetection's own detections, bit for bit, under minidet (MODEL.ROI_ALIGN_IMPL torchvision: mmcv's
RoIAlign kernel's arithmetic; the default gather RoIAlign only reorders float sums)."""

import pytest

import minidet
from helpers import assert_bit_identical, config, needs_extra
from minidet.apps.synthetic import structured_image
from minidet.config import body_of, cfg_value, config_names
from minidet.families.mmdetection import ZOO_CONFIGS
from minidet.testing.mmdet import COCO_CLASSES, mmdet_meta, mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint

pytestmark = [needs_extra("mmdet", "reference"), needs_extra("mmengine", "reference")]


_NORMS = {"BN": "BN", "SyncBN": "BN", "MMSyncBN": "BN", "GN": "GN"}  # mmcv's norm kinds -> MODEL.NORM at test time
_BOX_HEADS = {"Shared2FCBBoxHead": (0, 2), "Shared4Conv1FCBBoxHead": (4, 1)}  # -> (convs, fcs)
_DCN = {"DCN": False, "DCNv2": True}  # mmcv's deformable convs -> MODEL.RESNETS.DEFORM_MODULATED
# MaskIoUHead's dimensions, the ones minidet's mask IoU head has (MODEL.MASKIOU_ON)
_MASK_IOU = {"num_convs": 4, "num_fcs": 2, "roi_feat_size": 14, "in_channels": 256, "conv_out_channels": 256,
             "fc_out_channels": 1024}


def _context(bb) -> tuple[list, float] | None:
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


def _regnet(bb) -> dict:
    """MODEL.REGNET's keys for mmdetection's RegNet ``bb`` (its ``arch``: a name of RegNet.arch_settings or the dict
    itself): a RegNetX of bottleneck ratio 1, its defaults elsewhere (stem of 32, stride 2 per stage, no dilation)."""
    if bb.type != "RegNet":
        return {"MODEL.REGNET.DEPTH": 0}
    from mmdet_reference import install_stand_ins

    install_stand_ins()  # mmdet.models imports mmcv's compiled ops
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


def _stages(roi) -> tuple[list, object]:
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


def _expected(zoo_cfg) -> dict:
    """What mmdetection's config ``zoo_cfg`` computes at test time, as minidet's config keys; fails on any part of
    its network that these keys cannot describe (another head, a plugin, norms of two kinds ...)."""
    m = zoo_cfg.model
    bb, dp, neck, rpn, roi = m.backbone, m.data_preprocessor, m.neck, m.rpn_head, m.roi_head
    stages, mask = _stages(roi)
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
        assert {k: iou.get(k, v) for k, v in _MASK_IOU.items()} == _MASK_IOU, iou
    assert bb.type in ("ResNet", "ResNeXt", "RegNet")
    context = _context(bb)
    dcn = bb.get("dcn")  # deformable 3x3 convs in the stages of stage_with_dcn, strided ones too
    assert dcn is None or (dcn.type in _DCN and not dcn.get("fallback_on_stride", False)
                           and set(dcn) <= {"type", "deform_groups", "fallback_on_stride"}), dcn
    assert box.type in _BOX_HEADS and mask.type == "FCNMaskHead"
    assert neck.num_outs == 5 and neck.out_channels == rpn.in_channels == 256
    normed = {"backbone": bb.norm_cfg, "neck": neck.get("norm_cfg"), "box": box.get("norm_cfg"),
              "mask": mask.get("norm_cfg")}
    kinds = {_NORMS[n.type] for n in normed.values() if n is not None}
    assert len(kinds) == 1, normed  # one MODEL.NORM
    norm = kinds.pop()
    assert all(n.get("eps", 1e-5) == 1e-5 for n in normed.values() if n is not None)
    groups = {n.get("num_groups") for n in normed.values() if n is not None}
    assert norm != "GN" or len(groups) == 1
    convs = {c.type if c else None for c in (bb.get("conv_cfg"), neck.get("conv_cfg"), box.get("conv_cfg"),
                                              mask.get("conv_cfg"))}
    assert convs in ({None}, {"ConvWS"}), convs
    box_convs, box_fcs = _BOX_HEADS[box.type]
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
        **_regnet(bb),
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
        "MODEL.RESNETS.DEFORM_MODULATED": _DCN[dcn.type] if dcn else False,
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


def test_each_config_computes_what_its_zoo_config_computes():
    """Every shipped mmdetection config (one per registry entry) against the config file of mmdetection 3.3.0 it
    restates: the pixel statistics and order, the test scale, the backbone (its stage widths the FPN's inputs),
    its plugins, anchors, RPN and head thresholds, the class count, the mask IoU head."""
    from mmdet_reference import zoo_config

    assert len(ZOO_CONFIGS) == len([n for n in config_names() if n.startswith("mmdetection/")])
    for name, zoo in ZOO_CONFIGS.items():
        cfg = minidet.get_cfg(name)
        zoo_cfg = zoo_config(zoo)
        assert list(body_of(cfg).out_channels) == list(zoo_cfg.model.neck.in_channels), name
        expected = _expected(zoo_cfg)
        got = {k: cfg_value(cfg, k) for k in expected}
        got = {k: list(v) if isinstance(v, tuple) else v for k, v in got.items()}
        assert got == expected, (name, {k: (got[k], v) for k, v in expected.items() if got[k] != v})


GN_ALL = {"norm": "gn", "neck_norm": "gn", "head_norm": "gn", "box_convs": 4}
# zoo config -> the synthetic file's shapes and meta, and the proposals per image where fewer than the config's (both
# sides alike: LVIS's 1203 classes at score threshold 0.0001 give the stand-in NMS ~10^5 boxes for 1000 proposals);
# each runs at a small test scale on both sides
CASES = {
    "mask_rcnn/mask-rcnn_r50_fpn_1x_coco": ({}, mmdet_meta(), None),
    "mask_rcnn/mask-rcnn_r50-caffe_fpn_1x_coco": ({}, mmdet_meta("2.0.0", style="caffe"), None),
    "pisa/mask-rcnn_r50_fpn_pisa_1x_coco": ({}, mmdet_meta("2.0.0"), None),
    "lvis/mask-rcnn_r50_fpn_sample1e-3_ms-1x_lvis-v1":
        ({"num_classes": 1203}, mmdet_meta("2.0.0", classes=tuple(f"lvis_{k}" for k in range(1, 1204))), 50),
    "cityscapes/mask-rcnn_r50_fpn_1x_cityscapes": ({"num_classes": 8}, mmdet_meta("2.0.0", classes=(
        "person", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle")), None),
    "gn/mask-rcnn_r50_fpn_gn-all_2x_coco": (GN_ALL, mmdet_meta("2.0.0"), None),
    "gn+ws/mask-rcnn_x50-32x4d_fpn_gn-ws-all_2x_coco": ({**GN_ALL, "groups": 32}, mmdet_meta("2.0.0"), None),
    "simple_copy_paste/mask-rcnn_r50_fpn_rpn-2conv_4conv1fc_syncbn-all_32xb2-ssj-90k_coco":
        ({"neck_norm": "bn", "head_norm": "bn", "box_convs": 4, "rpn_convs": 2}, mmdet_meta(), None),
    # a 2.x Panoptic FPN file: COCO panoptic's 133 names (things first), and its semantic head, which minidet sets aside
    "panoptic_fpn/panoptic-fpn_r50_fpn_1x_coco":
        ({}, mmdet_meta("2.0.0", classes=COCO_CLASSES + tuple(f"stuff_{k}" for k in range(53))), None),
}


@pytest.mark.parametrize("zoo", list(CASES))
def test_detections_are_mmdetections_bit_for_bit(zoo, tmp_path):
    from mmdet_reference import detect, detector, zoo_config

    shapes, meta, proposals = CASES[zoo]
    path = tmp_path / "model.pth"
    bgr = "caffe" in zoo or zoo.startswith("gn/")  # 0-255 BGR pixels into the stem
    state = mmdet_weights(mmdet_state_shapes(**shapes), seed=3, caffe=bgr)
    zoo_cfg = zoo_config(zoo, (512, 320))
    if zoo.startswith("panoptic_fpn/"):  # the semantic head's keys, as mmdetection's module tree names them
        semantic = {k: v for k, v in detector(zoo_cfg, None).state_dict().items() if k.startswith("semantic_head.")}
        assert semantic
        state.update(semantic)
    write_mmdet_checkpoint(path, state, meta)
    opts = ["INPUT.MIN_SIZE_TEST", 320, "INPUT.MAX_SIZE_TEST", 512, "MODEL.ROI_ALIGN_IMPL", "torchvision"]
    if proposals:
        zoo_cfg.model.test_cfg.rpn.max_per_img = proposals
        opts += ["MODEL.RPN.POST_NMS_TOPK_TEST", proposals]
    reference = detector(zoo_cfg, path)
    assert {k: tuple(v.shape) for k, v in state.items()} == {k: tuple(v.shape) for k, v in
                                                               reference.state_dict().items()}, zoo  # its module tree
    name = next(n for n, z in ZOO_CONFIGS.items() if z == zoo)
    ours = minidet.Predictor(config(f"configs/{name}.yaml", *opts, weights=path))
    shapes = [(230, 311), (300, 200)] if zoo == next(iter(CASES)) else [(230, 311)]  # a second image on the first
    for seed, (h, w) in enumerate(shapes):
        image = structured_image(h, w, seed)
        ref, out = detect(reference, image), ours(image)
        assert_bit_identical(out, ref, zoo)
