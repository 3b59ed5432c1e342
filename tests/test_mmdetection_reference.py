"""minidet's mmdetection configs against mmdetection 3.3.0 itself (the ``reference`` extra; tests/mmdet_reference.py
gives mmcv's two CPU kernels pure-PyTorch stand-ins): a synthetic checkpoint in mmdetection's layout gives
mmdetection's own detections, bit for bit, under minidet (MODEL.ROI_ALIGN_IMPL torchvision: mmcv's RoIAlign kernel's
arithmetic; the default gather RoIAlign only reorders float sums). That every shipped config computes what its zoo
config computes at test time is tests/test_zoo_configs.py's (the configs are made from the zoo's config files by
tools/zoo_configs.py)."""

import pytest

import minidet
from helpers import REFERENCE_SCALE, assert_bit_identical, config, needs_extra
from minidet.apps.synthetic import structured_image
from minidet.families.mmdetection import ZOO_CONFIGS
from minidet.testing.mmdet import COCO_CLASSES, mmdet_meta, mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint

pytestmark = [needs_extra("mmdet", "reference"), needs_extra("mmengine", "reference")]


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
    zoo_cfg = zoo_config(zoo, (512, 320), fewer=True)
    if zoo.startswith("panoptic_fpn/"):  # the semantic head's keys, as mmdetection's module tree names them
        semantic = {k: v for k, v in detector(zoo_cfg, None).state_dict().items() if k.startswith("semantic_head.")}
        assert semantic
        state.update(semantic)
    write_mmdet_checkpoint(path, state, meta)
    opts = list(REFERENCE_SCALE)
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
