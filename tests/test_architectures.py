"""Checkpoints of architectures minidet does not run (deformable convolution, GC blocks, cascades, Mask Scoring,
Keypoint R-CNN, RegNet), in each family's key names, are refused in one line naming the architecture and the config;
keys known to play no part at inference are set aside by name; any other key no layer takes is refused
(``minidet.families.architectures``, ``checkpoint.load_checkpoint``)."""

import dataclasses
import os
import pickle

import numpy as np
import pytest
import torch

import minidet
from helpers import ROOT, config, load_tool, one_error_line
from minidet.apps.synthetic import structured_image
from minidet.checkpoint import CheckpointError
from minidet.families import FAMILIES, architectures
from minidet.testing.checkpoints import (
    REFERENCE,
    d2_state_shapes,
    d2_weights,
    make_blobs,
    mb_state_shapes,
    mb_weights,
    write_detectron_pkl,
    write_mb_checkpoint,
)
from minidet.testing.mmdet import mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint

SIZE = ["INPUT.MIN_SIZE_TEST", 96, "INPUT.MAX_SIZE_TEST", 128, "MODEL.RPN.PRE_NMS_TOPK_TEST", 50,
        "MODEL.RPN.POST_NMS_TOPK_TEST", 20]
CONFIGS = {
    "mmdetection": "configs/mmdetection/mask-rcnn_r50_fpn_1x_coco.yaml",
    "detectron2": "configs/detectron2/mask_rcnn_R_50_FPN_3x.yaml",
    "maskrcnn_benchmark": "configs/maskrcnn_benchmark/e2e_mask_rcnn_R_50_FPN_1x.yaml",
    "detectron": "configs/detectron/e2e_mask_rcnn_R-50-FPN_1x.yaml",
    "torchvision": "configs/torchvision/maskrcnn_resnet50_fpn_v2.yaml",
}
STAGES = {2: 4, 3: 6, 4: 3}  # ResNet-50's res3..res5 (layer2..4): blocks
NOT_YET = "an architecture minidet does not run yet; no shipped config runs it"


def _zeros(shape) -> torch.Tensor:
    return torch.zeros(shape)


def _refused(family: str, path, *opts) -> str:
    """The one-line CheckpointError that loading ``path`` with the family's R-50 config raises."""
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(config(CONFIGS[family], *SIZE, *opts, weights=path))
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.fixture(scope="module")
def mm_state() -> dict:
    """mmdetection's R-50 Mask R-CNN state dict (realistic random weights), made once; tests change copies."""
    return mmdet_weights(mmdet_state_shapes())


@pytest.fixture(scope="module")
def d2_state() -> dict:
    return {k: torch.from_numpy(v) for k, v in d2_weights(50).items()}


@pytest.fixture(scope="module")
def mb_state() -> dict:
    return mb_weights(mb_state_shapes())


def _save_d2(path, state: dict):
    with open(path, "wb") as f:  # the model zoo's .pkl: numpy arrays under "model"
        pickle.dump({"model": {k: v.numpy() for k, v in state.items()}, "__author__": "test"}, f)
    return path


def _mm_dcn(state: dict) -> dict:
    """mmdetection's ``dconv_c3-c5``: ``dcn=dict(type='DCN')`` on layer2..4, each 3x3 an mmcv ``DeformConv2dPack``
    with its ``conv_offset`` (18 offsets for a 3x3 kernel)."""
    out = dict(state)
    for layer, blocks in STAGES.items():
        for i in range(blocks):
            planes = 64 * 2 ** (layer - 1)
            out[f"backbone.layer{layer}.{i}.conv2.conv_offset.weight"] = _zeros((18, planes, 3, 3))
            out[f"backbone.layer{layer}.{i}.conv2.conv_offset.bias"] = _zeros(18)
    return out


def _mm_gc(state: dict) -> dict:
    """mmdetection's ``gcb_c3-c5`` (r4): an mmcv ``ContextBlock`` plugin after conv3 of every layer2..4 block."""
    out = dict(state)
    for layer, blocks in STAGES.items():
        c = 256 * 2 ** (layer - 1)
        for i in range(blocks):
            pre = f"backbone.layer{layer}.{i}.context_block."
            r = c // 4  # ratio 1/4
            for name, shape in (("conv_mask.weight", (1, c, 1, 1)), ("conv_mask.bias", (1,)),
                                ("channel_add_conv.0.weight", (r, c, 1, 1)), ("channel_add_conv.0.bias", (r,)),
                                ("channel_add_conv.1.weight", (r, 1, 1)), ("channel_add_conv.1.bias", (r, 1, 1)),
                                ("channel_add_conv.3.weight", (c, r, 1, 1)), ("channel_add_conv.3.bias", (c,))):
                out[pre + name] = _zeros(shape)
    return out


def _mm_cascade(state: dict) -> dict:
    """mmdetection's ``CascadeRoIHead``: three box heads and three mask heads, ``bbox_head.{0,1,2}`` (class-agnostic
    deltas) and ``mask_head.{0,1,2}``."""
    out = {k: v for k, v in state.items() if not k.startswith(("roi_head.bbox_head.", "roi_head.mask_head."))}
    for stage in range(3):
        for k, v in state.items():
            for head in ("bbox_head", "mask_head"):
                if k.startswith(f"roi_head.{head}."):
                    new = k.replace(f"roi_head.{head}.", f"roi_head.{head}.{stage}.")
                    out[new] = _zeros((4, v.shape[1])) if k.startswith("roi_head.bbox_head.fc_reg.w") else v
                    if k == "roi_head.bbox_head.fc_reg.bias":
                        out[new] = _zeros(4)
    return out


def _mm_htc(state: dict) -> dict:
    """mmdetection's ``HybridTaskCascadeRoIHead``: a cascade, the mask heads of stages 1 and 2 with ``conv_res``,
    and the ``FusedSemanticHead``."""
    out = _mm_cascade(state)
    for stage in (1, 2):
        out[f"roi_head.mask_head.{stage}.conv_res.conv.weight"] = _zeros((256, 256, 1, 1))
        out[f"roi_head.mask_head.{stage}.conv_res.conv.bias"] = _zeros(256)
    for i in range(5):
        out[f"roi_head.semantic_head.lateral_convs.{i}.conv.weight"] = _zeros((256, 256, 1, 1))
    out["roi_head.semantic_head.conv_logits.weight"] = _zeros((183, 256, 1, 1))
    return out


def _mm_ms(state: dict) -> dict:
    """mmdetection's ``MaskScoringRoIHead``: its ``MaskIoUHead`` (4 convs, 2 fcs, ``fc_mask_iou``)."""
    out = dict(state)
    for i in range(4):
        out[f"roi_head.mask_iou_head.convs.{i}.weight"] = _zeros((256, 257 if i == 0 else 256, 3, 3))  # mmcv Conv2d
        out[f"roi_head.mask_iou_head.convs.{i}.bias"] = _zeros(256)
    for i, cin in enumerate((256 * 49, 1024)):
        out[f"roi_head.mask_iou_head.fcs.{i}.weight"] = _zeros((1024, cin))
        out[f"roi_head.mask_iou_head.fcs.{i}.bias"] = _zeros(1024)
    out["roi_head.mask_iou_head.fc_mask_iou.weight"] = _zeros((80, 1024))
    out["roi_head.mask_iou_head.fc_mask_iou.bias"] = _zeros(80)
    return out


@pytest.mark.slow
def test_the_dcn_file_of_the_issue_is_one_error_line_through_infer(mm_state, tmp_path, capsys):
    """The report of issue 41: ``minidet infer`` with the plain R-50 config and a ``dconv_c3-c5`` file printed a
    warning about 26 keys and wrote detections of a network the file does not hold; it is one line and status 2."""
    path = tmp_path / "mask-rcnn_r50_fpn_dconv_c3-c5_1x_coco.pth"
    write_mmdet_checkpoint(path, _mm_dcn(mm_state))
    assert _infer_refuses_under_the_plain_config(path, tmp_path, capsys) == (
        f"error: {path}: the checkpoint holds deformable convolution (DCN) "
        "(backbone.layer2.0.conv2.conv_offset.weight and 25 more keys): minidet runs it with the config "
        "mmdetection/mask-rcnn_r50-dconv-c3-c5_fpn_1x_coco")


def _infer_refuses_under_the_plain_config(path, tmp_path, capsys) -> str:
    """``minidet infer`` (tools/infer.py) of one image with mmdetection's plain config and the file ``path``: it
    exits 2 having written no record; its one error line."""
    import cv2

    image = tmp_path / "a.png"
    cv2.imwrite(str(image), structured_image(64, 80, seed=0))
    out = tmp_path / "out"
    rc = load_tool(ROOT / "tools" / "infer.py").main(
        ["--config-file", CONFIGS["mmdetection"], "--input", str(image), "--output", str(out),
         "MODEL.WEIGHTS", str(path), *map(str, SIZE)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert not list(out.glob("**/*.json"))
    return one_error_line(err)


@pytest.mark.parametrize("make,arch,example,count,tail", [
    (_mm_gc, "global context blocks (GCNet)", "backbone.layer2.0.context_block.conv_mask.weight", 104,
     "minidet runs it with the config mmdetection/mask-rcnn_r50-gcb-r16-c3-c5_fpn_1x_coco"),
    (_mm_cascade, "Cascade R-CNN", "roi_head.bbox_head.0.shared_fcs.0.weight", 60,
     "minidet runs it with the config mmdetection/cascade-mask-rcnn_r50_fpn_1x_coco"),
    (_mm_htc, "Hybrid Task Cascade (HTC)", "roi_head.mask_head.1.conv_res.conv.weight", 70, NOT_YET),
    (_mm_ms, "Mask Scoring R-CNN (mask IoU head)", "roi_head.mask_iou_head.convs.0.weight", 14,
     "minidet runs it with the config mmdetection/ms-rcnn_r50-caffe_fpn_1x_coco"),
])
def test_mmdetection_architectures_are_named(mm_state, tmp_path, make, arch, example, count, tail):
    path = tmp_path / "model.pth"
    write_mmdet_checkpoint(path, make(mm_state))
    assert _refused("mmdetection", path) == (
        f"{path}: the checkpoint holds {arch} ({example} and {count - 1} more keys): {tail}")


def test_two_architectures_in_one_file_are_both_named(mm_state, tmp_path):
    """mmdetection's ``cascade-mask-rcnn_r50_fpn_dconv_c3-c5``: deformable convolution and a cascade."""
    path = tmp_path / "model.pth"
    write_mmdet_checkpoint(path, _mm_cascade(_mm_dcn(mm_state)))
    assert _refused("mmdetection", path) == (
        f"{path}: the checkpoint holds deformable convolution (DCN) (backbone.layer2.0.conv2.conv_offset.weight and "
        "25 more keys) and Cascade R-CNN (roi_head.bbox_head.0.shared_fcs.0.weight and 59 more keys): each runs with "
        "its own config (deformable convolution (DCN): mmdetection/mask-rcnn_r50-dconv-c3-c5_fpn_1x_coco; Cascade "
        "R-CNN: mmdetection/cascade-mask-rcnn_r50_fpn_1x_coco); a file with them all needs a config with them all "
        "(`minidet configs` lists the shipped ones)")


def test_an_entry_with_a_config_names_it(mm_state, tmp_path, monkeypatch):
    """What a zoo issue changes to run an architecture: the entry's ``config``. Loaded with another config, the file
    is refused naming it."""
    table = tuple(dataclasses.replace(a, config={"mmdetection": "mmdetection/mask-rcnn_r50_fpn_dconv_c3-c5_1x_coco"})
                  if a.name.startswith("deformable") else a for a in architectures.ARCHITECTURES)
    monkeypatch.setattr(architectures, "ARCHITECTURES", table)
    path = tmp_path / "model.pth"
    write_mmdet_checkpoint(path, _mm_dcn(mm_state))
    assert _refused("mmdetection", path).endswith(
        "(backbone.layer2.0.conv2.conv_offset.weight and 25 more keys): minidet runs it with the config "
        "mmdetection/mask-rcnn_r50_fpn_dconv_c3-c5_1x_coco")


def _d2_dcn(state: dict) -> dict:
    """detectron2's ``DeformBottleneckBlock`` on res3..res5 (``DEFORM_ON_PER_STAGE [False, True, True, True]``):
    ``conv2_offset`` beside ``conv2``."""
    out = dict(state)
    for stage, blocks in STAGES.items():
        for i in range(blocks):
            c = 64 * 2 ** (stage - 1)
            out[f"backbone.bottom_up.res{stage + 1}.{i}.conv2_offset.weight"] = _zeros((18, c, 3, 3))
            out[f"backbone.bottom_up.res{stage + 1}.{i}.conv2_offset.bias"] = _zeros(18)
    return out


def _d2_cascade(state: dict) -> dict:
    """detectron2's ``CascadeROIHeads``: ``box_head`` and ``box_predictor`` are ModuleLists of three (class-agnostic
    deltas); one mask head."""
    out = {k: v for k, v in state.items() if not k.startswith(("roi_heads.box_head.", "roi_heads.box_predictor."))}
    for stage in range(3):
        for k, v in state.items():
            for part in ("box_head", "box_predictor"):
                if k.startswith(f"roi_heads.{part}."):
                    new = k.replace(f"roi_heads.{part}.", f"roi_heads.{part}.{stage}.")
                    out[new] = v[:4] if ".bbox_pred." in k else v
    return out


def _d2_keypoint(state: dict) -> dict:
    """detectron2's Keypoint R-CNN (COCO-Keypoints): no mask head, ``KRCNNConvDeconvUpsampleHead``."""
    out = {k: v for k, v in state.items() if not k.startswith("roi_heads.mask_head.")}
    for i in range(1, 9):
        out[f"roi_heads.keypoint_head.conv_fcn{i}.weight"] = _zeros((512, 256 if i == 1 else 512, 3, 3))
        out[f"roi_heads.keypoint_head.conv_fcn{i}.bias"] = _zeros(512)
    out["roi_heads.keypoint_head.score_lowres.weight"] = _zeros((512, 17, 4, 4))
    out["roi_heads.keypoint_head.score_lowres.bias"] = _zeros(17)
    return out


def _d2_regnet(state: dict) -> dict:
    """detectron2's RegNetX-4GF body (``mask_rcnn_regnetx_4gf_dds_fpn_1x``) in place of the ResNet: ``stem.conv``,
    stages ``s1..s4`` of blocks ``b1..`` (``proj``, ``f.a``, ``f.b``, ``f.c`` with their norms)."""
    out = {k: v for k, v in state.items() if not k.startswith("backbone.bottom_up.")}
    out["backbone.bottom_up.stem.conv.weight"] = _zeros((32, 3, 3, 3))
    for s in ("weight", "bias", "running_mean", "running_var"):
        out[f"backbone.bottom_up.stem.bn.{s}"] = _zeros(32)
    cin = 32
    for stage, (depth, w) in enumerate(zip((2, 5, 14, 2), (80, 240, 560, 1360)), start=1):
        for b in range(1, depth + 1):
            pre = f"backbone.bottom_up.s{stage}.b{b}."
            if b == 1:
                out[pre + "proj.weight"] = _zeros((w, cin, 1, 1))
                for s in ("weight", "bias", "running_mean", "running_var"):
                    out[pre + f"bn.{s}"] = _zeros(w)
            for conv, shape in (("a", (w, cin if b == 1 else w, 1, 1)), ("b", (w, 40, 3, 3)), ("c", (w, w, 1, 1))):
                out[pre + f"f.{conv}.weight"] = _zeros(shape)
                for s in ("weight", "bias", "running_mean", "running_var"):
                    out[pre + f"f.{conv}_bn.{s}"] = _zeros(w)
        cin = w
    return out


@pytest.mark.slow
@pytest.mark.parametrize("make,arch,example,count,tail", [
    (_d2_dcn, "deformable convolution (DCN)", "backbone.bottom_up.res3.0.conv2_offset.weight", 26,
     "minidet runs it with the config detectron2/mask_rcnn_R_50_FPN_1x_dconv_c3-c5"),
    (_d2_cascade, "Cascade R-CNN", "roi_heads.box_head.0.fc1.weight", 24,
     "minidet runs it with the config detectron2/cascade_mask_rcnn_R_50_FPN_1x"),
    (_d2_keypoint, "Keypoint R-CNN (keypoint head)", "roi_heads.keypoint_head.conv_fcn1.weight", 18, NOT_YET),
])
def test_detectron2_architectures_are_named(d2_state, tmp_path, make, arch, example, count, tail):
    path = _save_d2(tmp_path / "model_final.pkl", make(d2_state))
    assert _refused("detectron2", path) == (
        f"{path}: the checkpoint holds {arch} ({example} and {count - 1} more keys): {tail}")


@pytest.mark.slow
def test_a_regnet_file_under_a_resnet_config_is_named(d2_state, tmp_path):
    """detectron2's RegNet keys rename onto the ResNet's names (stem, resN.i.convK): its key names tell the bodies
    apart (``ARCHITECTURES``, with the config's ``MODEL.REGNET`` off) before any shape does; mmdetection's RegNet, of
    ResNet key names, is told by its stem (``families.check_body``)."""
    path = _save_d2(tmp_path / "model_final.pkl", _d2_regnet(d2_state))
    assert _refused("detectron2", path) == (
        f"{path}: the checkpoint holds RegNet backbone (backbone.bottom_up.stem.conv.weight and 369 more keys): "
        "minidet runs it with the config detectron2/mask_rcnn_regnetx_4gf_dds_FPN_100ep_LSJ")


def test_an_mmdetection_regnet_file_under_a_resnet_config_is_named(tmp_path):
    """mmdetection's RegNet has its ResNet's key names: the stem (a 3x3 conv) tells it (``families.check_body``)."""
    path = tmp_path / "model.pth"
    write_mmdet_checkpoint(path, {k: _zeros(s) for k, s in mmdet_state_shapes(arch="regnetx_400mf").items()})
    assert _refused("mmdetection", path) == (
        f"{path}: the checkpoint's body is a RegNet (its stem a 3x3 conv of 32 channels) but the config builds a "
        "ResNet (a 7x7 stem): minidet runs it with a config that sets MODEL.REGNET, such as "
        "mmdetection/mask-rcnn_regnetx-3.2GF_fpn_1x_coco")


def _mb_dcn(state: dict) -> dict:
    """maskrcnn-benchmark's ``STAGE_WITH_DCN (False, True, True, True)``: each 3x3 a ``DFConv2d`` (``conv2.offset``,
    ``conv2.conv``)."""
    out = dict(state)
    for layer, blocks in STAGES.items():
        for i in range(blocks):
            pre = f"backbone.body.layer{layer}.{i}.conv2."
            w = out.pop(pre + "weight")
            out[pre + "offset.weight"] = _zeros((18, w.shape[1], 3, 3))
            out[pre + "offset.bias"] = _zeros(18)
            out[pre + "conv.weight"] = w
    return out


def _mb_keypoint(state: dict) -> dict:
    """maskrcnn-benchmark's keypoint head: ``roi_heads.keypoint.feature_extractor.conv_fcn{1..8}``, its predictor's
    ``kps_score_lowres``; no mask head."""
    out = {k: v for k, v in state.items() if not k.startswith("roi_heads.mask.")}
    for i in range(1, 9):
        out[f"roi_heads.keypoint.feature_extractor.conv_fcn{i}.weight"] = np.zeros((512, 512, 3, 3), np.float32)
        out[f"roi_heads.keypoint.feature_extractor.conv_fcn{i}.bias"] = np.zeros(512, np.float32)
    out["roi_heads.keypoint.predictor.kps_score_lowres.weight"] = np.zeros((512, 17, 4, 4), np.float32)
    out["roi_heads.keypoint.predictor.kps_score_lowres.bias"] = np.zeros(17, np.float32)
    return out


def _mb_maskiou(state: dict) -> dict:
    """Mask Scoring R-CNN (built on maskrcnn-benchmark): ``roi_heads.maskiou`` (feature extractor, predictor)."""
    out = dict(state)
    for i in range(1, 5):
        out[f"roi_heads.maskiou.feature_extractor.maskiou_fcn{i}.weight"] = np.zeros((256, 256, 3, 3), np.float32)
        out[f"roi_heads.maskiou.feature_extractor.maskiou_fcn{i}.bias"] = np.zeros(256, np.float32)
    out["roi_heads.maskiou.predictor.maskiou.weight"] = np.zeros((81, 1024), np.float32)
    out["roi_heads.maskiou.predictor.maskiou.bias"] = np.zeros(81, np.float32)
    return out


@pytest.mark.parametrize("make,arch,example,count", [
    (_mb_dcn, "deformable convolution (DCN)", "backbone.body.layer2.0.conv2.offset.weight", 39),
    (_mb_keypoint, "Keypoint R-CNN (keypoint head)", "roi_heads.keypoint.feature_extractor.conv_fcn1.weight", 18),
    (_mb_maskiou, "Mask Scoring R-CNN (mask IoU head)", "roi_heads.maskiou.feature_extractor.maskiou_fcn1.weight",
     10),
])
def test_maskrcnn_benchmark_architectures_are_named(mb_state, tmp_path, make, arch, example, count):
    path = tmp_path / "model_final.pth"
    write_mb_checkpoint(str(path), {k: torch.as_tensor(v) for k, v in make(mb_state).items()})
    assert _refused("maskrcnn_benchmark", path) == (
        f"{path}: the checkpoint holds {arch} ({example} and {count - 1} more keys): {NOT_YET}")


@pytest.mark.slow
@pytest.mark.parametrize("extra,arch,example,count", [
    # Detectron's keypoint_rcnn_heads: conv_fcn{1..8}, kps_score_lowres
    ({**{f"conv_fcn{i}_{p}": (512,) for i in range(1, 9) for p in "wb"}, "kps_score_lowres_w": (512, 17, 4, 4),
      "kps_score_lowres_b": (17,)}, "Keypoint R-CNN (keypoint head)", "conv_fcn1_w", 18),
    # Detectron-Cascade-RCNN: each later stage's fc6, fc7, cls_score and bbox_pred suffixed _2nd and _3rd
    ({f"{n}_{s}_{p}": (8,) for s in ("2nd", "3rd") for n in ("fc6", "fc7", "cls_score", "bbox_pred") for p in "wb"},
     "Cascade R-CNN", "fc6_2nd_w", 16),
])
def test_detectron_architectures_are_named(tmp_path, extra, arch, example, count):
    blobs = make_blobs("R-50-FPN")
    blobs.update({k: np.zeros(shape, np.float32) for k, shape in extra.items()})
    path = tmp_path / "model_final.pkl"
    write_detectron_pkl(str(path), blobs)
    assert _refused("detectron", path) == (
        f"{path}: the checkpoint holds {arch} ({example} and {count - 1} more keys): {NOT_YET}")


def test_torchvision_keypoint_rcnn_is_named(tv_v2_state_init, tmp_path):
    """torchvision's ``keypointrcnn_resnet50_fpn`` head (``KeypointRCNNHeads``: 8 convs, ``KeypointRCNNPredictor``)
    on the Mask R-CNN v2 file's other weights."""
    state = {k: v for k, v in tv_v2_state_init.items() if not k.startswith("roi_heads.mask_")}
    for i in range(8):
        state[f"roi_heads.keypoint_head.{2 * i}.weight"] = _zeros((512, 256 if i == 0 else 512, 3, 3))
        state[f"roi_heads.keypoint_head.{2 * i}.bias"] = _zeros(512)
    state["roi_heads.keypoint_predictor.kps_score_lowres.weight"] = _zeros((512, 17, 4, 4))
    state["roi_heads.keypoint_predictor.kps_score_lowres.bias"] = _zeros(17)
    path = tmp_path / "keypointrcnn.pth"
    torch.save(state, path)
    assert _refused("torchvision", path) == (
        f"{path}: the checkpoint holds Keypoint R-CNN (keypoint head) (roi_heads.keypoint_head.0.weight and 17 more "
        f"keys): {NOT_YET}")


# ---------------------------------------------------------------------------------- keys that match no table


@pytest.mark.slow
def test_an_unknown_key_is_refused_not_ignored(mm_state, d2_state, tmp_path):
    """A key no layer takes and no table names (a squeeze-and-excitation block, a third fc): a layer minidet does not
    build; refused naming the key, as it appears in the file."""
    state = dict(mm_state)
    state["backbone.layer3.0.se.fc1.weight"] = _zeros((64, 1024))
    state["backbone.layer3.0.se.fc2.weight"] = _zeros((1024, 64))
    path = tmp_path / "model.pth"
    write_mmdet_checkpoint(path, state)
    assert _refused("mmdetection", path) == (
        f"{path}: no layer of the model takes backbone.layer3.0.se.fc1.weight and 1 more keys, and they are not among "
        "the keys known to play no part at inference: layers minidet does not build (another architecture?), so it "
        "does not run the file; if they play no part in inference, delete them from the file")
    d2 = dict(d2_state)
    d2["roi_heads.box_head.fc3.weight"] = _zeros((1024, 1024))
    assert _refused("detectron2", _save_d2(tmp_path / "d2.pkl", d2)) == (
        f"{tmp_path / 'd2.pkl'}: no layer of the model takes roi_heads.box_head.fc3.weight, and it is not among the "
        "keys known to play no part at inference: a layer minidet does not build (another architecture?), so it does "
        "not run the file; if it plays no part in inference, delete it from the file")


# ------------------------------------------------------------------------------------------- set aside by name


@pytest.mark.slow
def test_what_plays_no_part_is_set_aside_by_name(d2_state, tmp_path):
    """detectron2: old files' pixel statistics and stored anchors, PanopticFPN's semantic head; they load, and the
    report names each with why it may go."""
    state = dict(d2_state)
    state["pixel_mean"], state["pixel_std"] = torch.tensor([103.53, 116.28, 123.675]), torch.ones(3)
    for i in range(5):
        state[f"proposal_generator.anchor_generator.cell_anchors.{i}"] = _zeros((3, 4))
    for lvl in (2, 3, 4, 5):
        state[f"sem_seg_head.p{lvl}.0.weight"] = _zeros((128, 256, 3, 3))
    state["sem_seg_head.predictor.weight"] = _zeros((54, 128, 1, 1))
    path = _save_d2(tmp_path / "panoptic_fpn.pkl", state)
    _, report = minidet.prepare_model(config(CONFIGS["detectron2"], *SIZE, weights=path))
    assert not report.unexpected and not report.missing and sorted(report.ignored) == sorted(set(state) - set(d2_state))
    text = str(report)
    for why in ("pixel statistics", "stored anchors", "semantic head (no instance detection reads it)"):
        assert why in text, text


@pytest.mark.slow
def test_mmdetection_ema_buffers_and_panoptic_head_are_set_aside(mm_state, tmp_path):
    """mmcv's EMAHook buffers (``ema_<name with _>``, here of the first 20 weights) and a PanopticFPN's top-level
    ``semantic_head`` (under its own config: under another, see below)."""
    state = dict(mm_state)
    for k in list(mm_state)[:20]:
        state["ema_" + k.replace(".", "_")] = mm_state[k].clone()
    state["semantic_head.conv_logits.weight"] = _zeros((54, 128, 1, 1))
    path = tmp_path / "model.pth"
    write_mmdet_checkpoint(path, state)
    _, report = minidet.prepare_model(config("configs/mmdetection/panoptic-fpn_r50_fpn_1x_coco.yaml", *SIZE,
                                             weights=path))
    assert not report.unexpected and not report.missing
    counters = {k for k in mm_state if k.endswith("num_batches_tracked")}
    assert set(report.ignored) == set(state) - set(mm_state) | counters
    assert "exponential moving averages" in str(report)


@pytest.mark.slow
def test_mask_weights_under_mask_on_false_are_set_aside(tv_file):
    _, report = minidet.prepare_model(config(CONFIGS["torchvision"].replace("_v2", ""), *SIZE, "MODEL.MASK_ON", False,
                                             weights=tv_file))
    assert not report.unexpected and "the mask head (MODEL.MASK_ON False): roi_heads.mask_" in str(report)


# ------------------------------------------------------------------------------------------------ the tables


@pytest.mark.skipif(not os.path.isdir(REFERENCE), reason="needs ../shared/reference (key lists)")
def test_the_tables_name_real_families_and_claim_no_key_of_a_valid_file():
    listing = os.path.join(REFERENCE, "torchvision_maskrcnn_resnet50_fpn.keys.txt")
    tv = [ln.split()[0] for ln in open(listing) if ln.strip() and not ln.startswith("#")]
    valid = {"mmdetection": mmdet_state_shapes(), "detectron2": d2_state_shapes(50), "maskrcnn_benchmark":
             mb_state_shapes(), "detectron": make_blobs("R-50-FPN"), "torchvision": tv}
    for entry in (*architectures.ARCHITECTURES, *architectures.SET_ASIDE):
        assert set(entry.keys) <= {*FAMILIES, "*"}, entry
    names = [a.name for a in architectures.ARCHITECTURES]
    assert len(set(names)) == len(names) and all(n in names for a in architectures.ARCHITECTURES for n in a.includes)
    for family, keys in valid.items():
        assert architectures.other_architectures(family, keys) == [], family
        aside = {k for k in keys if architectures.set_aside(family, k)}
        assert aside == {k for k in keys if k.endswith("num_batches_tracked") or ".cell_anchors." in k}, family


def test_a_resnet_file_under_a_regnet_config_is_named(mm_state, tmp_path):
    path = tmp_path / "model.pth"
    write_mmdet_checkpoint(path, mm_state)
    regnet_400mf = ["MODEL.REGNET.DEPTH", 22, "MODEL.REGNET.W_A", 24.48, "MODEL.REGNET.W_0", 24, "MODEL.REGNET.W_M",
                    2.54, "MODEL.REGNET.GROUP_WIDTH", 16]
    assert _refused("mmdetection", path, *regnet_400mf) == (
        f"{path}: the checkpoint's body is a ResNet (its stem a 7x7 conv) but the config builds a RegNet: minidet "
        "runs it with a ResNet config (MODEL.REGNET.DEPTH 0), such as mmdetection/mask-rcnn_r50_fpn_1x_coco")


# ------------------------------------------------------------- a file under another architecture's config (issue 56)

PLAIN = "minidet runs the file with a plain Mask R-CNN config, such as"


def _refused_by(name: str, path, *opts) -> str:
    """The one-line CheckpointError that loading ``path`` with the shipped config ``name`` raises."""
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(config(f"configs/{name}.yaml", *SIZE, *opts, weights=path))
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.slow
@pytest.mark.parametrize("name,arch,switch", [
    ("detectron2/cascade_mask_rcnn_R_50_FPN_1x", "Cascade R-CNN", "MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS"),
    ("detectron2/mask_rcnn_R_50_FPN_1x_dconv_c3-c5", "deformable convolution (DCN)",
     "MODEL.RESNETS.DEFORM_ON_PER_STAGE"),
    ("detectron2/mask_rcnn_R_50_FPN_100ep_LSJ", "detectron2's LSJ new baseline (two RPN convs)",
     "MODEL.RPN.CONV_DEPTH"),
    ("detectron2/mask_rcnn_regnetx_4gf_dds_FPN_100ep_LSJ", "RegNet backbone or detectron2's LSJ new baseline (two RPN "
     "convs)", "MODEL.REGNET.DEPTH, MODEL.RPN.CONV_DEPTH"),
])
def test_a_plain_detectron2_file_under_another_architectures_config_is_named(d2_state, tmp_path, name, arch, switch):
    """The reverse of the tables' first use: the config turns an architecture on (a cascade, DCN, the LSJ baseline,
    a RegNet) and the file has none of its keys; before, the cascade config's check of CLS_AGNOSTIC_BBOX_REG, or
    a list of minidet's internal weight names, was what the user read."""
    path = _save_d2(tmp_path / "model_final.pkl", d2_state)
    them = "them" if " or " in arch else "it"
    assert _refused_by(name, path) == (
        f"{path}: the checkpoint holds a plain Mask R-CNN, without {arch} keys, but the config turns {them} on "
        f"({switch}): "
        f"{PLAIN} detectron2/mask_rcnn_R_50_FPN_3x")


def test_an_lsj_file_under_the_plain_config_is_named(tmp_path):
    """detectron2's new baselines (two RPN convs, SyncBN in the FPN and the 4conv1fc heads) under the plain 3x
    config: before, 14 missing keys."""
    path = _save_d2(tmp_path / "model_final.pkl", {k: torch.from_numpy(v) for k, v in d2_weights(
        50, fpn_norm=True, head_norm=True, box_convs=4, rpn_convs=2).items()})
    assert _refused_by("detectron2/mask_rcnn_R_50_FPN_3x", path) == (
        f"{path}: the checkpoint holds detectron2's LSJ new baseline (two RPN convs) "
        "(proposal_generator.rpn_head.conv.conv0.weight and 3 more keys): minidet runs it with the config "
        "detectron2/mask_rcnn_R_50_FPN_100ep_LSJ")


def test_an_lsj_file_with_a_cascade_config_names_what_it_holds(tmp_path):
    """A file holding one architecture under a config of another: what it holds, what it lacks, its own config."""
    path = _save_d2(tmp_path / "model_final.pkl", {k: torch.zeros(s) for k, s in d2_state_shapes(
        50, fpn_norm=True, head_norm=True, box_convs=4, rpn_convs=2).items()})
    assert _refused_by("detectron2/cascade_mask_rcnn_R_50_FPN_1x", path, "MODEL.RPN.CONV_DEPTH", 2) == (
        f"{path}: the checkpoint holds a Mask R-CNN with detectron2's LSJ new baseline (two RPN convs), without "
        "Cascade R-CNN keys, but the config turns it on (MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS): minidet runs "
        "the file with the config detectron2/mask_rcnn_R_50_FPN_100ep_LSJ")


@pytest.mark.parametrize("name,arch,switch", [
    ("mmdetection/mask-rcnn_r50-gcb-r16-c3-c5_fpn_1x_coco", "global context blocks (GCNet)",
     "MODEL.RESNETS.CONTEXT_ON_PER_STAGE"),
    ("mmdetection/ms-rcnn_r50-caffe_fpn_1x_coco", "Mask Scoring R-CNN (mask IoU head)", "MODEL.MASKIOU_ON"),
    ("mmdetection/mask-rcnn_r50-dconv-c3-c5_fpn_1x_coco", "deformable convolution (DCN)",
     "MODEL.RESNETS.DEFORM_ON_PER_STAGE"),
    ("mmdetection/cascade-mask-rcnn_r50_fpn_1x_coco", "Cascade R-CNN", "MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS"),
    ("mmdetection/panoptic-fpn_r50_fpn_1x_coco", "Panoptic FPN (semantic head)", "MODEL.ROI_HEADS.NMS_CLASS_AGNOSTIC"),
])
def test_a_plain_mmdetection_file_under_another_architectures_config_is_named(mm_state, tmp_path, name, arch, switch):
    path = tmp_path / "model.pth"
    write_mmdet_checkpoint(path, mm_state)
    assert _refused_by(name, path) == (
        f"{path}: the checkpoint holds a plain Mask R-CNN, without {arch} keys, but the config turns it on ({switch}): "
        f"{PLAIN} mmdetection/mask-rcnn_r50_fpn_1x_coco")


def _mm_panoptic(state: dict) -> dict:
    """mmdetection's ``PanopticFPN`` (``TwoStagePanopticSegmentor``): a Mask R-CNN and its top-level
    ``semantic_head`` (``PanopticFPNHead``: ``conv_upsample_layers``, ``conv_logits`` of 53 stuff classes + 1)."""
    out = dict(state)
    for i in range(4):
        out[f"semantic_head.conv_upsample_layers.{i}.conv.0.conv.weight"] = _zeros((128, 256, 3, 3))
    out["semantic_head.conv_logits.weight"] = _zeros((54, 128, 1, 1))
    out["semantic_head.conv_logits.bias"] = _zeros(54)
    return out


def test_a_panoptic_file_under_the_plain_config_is_one_error_line_through_infer(mm_state, tmp_path, capsys):
    """The instances of mmdetection's Panoptic FPN are its instance branch's under its own test settings (score 0.6,
    one class-agnostic NMS); under the plain config ``minidet infer`` wrote 100 detections with status 0."""
    path = tmp_path / "panoptic_fpn_r50_fpn_1x_coco.pth"
    write_mmdet_checkpoint(path, _mm_panoptic(mm_state))
    assert _infer_refuses_under_the_plain_config(path, tmp_path, capsys) == (
        f"error: {path}: the checkpoint holds Panoptic FPN (semantic head) "
        "(semantic_head.conv_upsample_layers.0.conv.0.conv.weight and 5 more keys): minidet runs it with the config "
        "mmdetection/panoptic-fpn_r50_fpn_1x_coco")


def test_the_plain_configs_are_shipped():
    names = minidet.config.config_names()
    assert set(architectures.PLAIN) == set(FAMILIES) and set(architectures.PLAIN.values()) <= set(names)
    for arch in architectures.ARCHITECTURES:
        assert set(arch.config.values()) <= set(names), arch
        assert all(minidet.config.cfg_value(minidet.get_cfg(), k) is not None for k in arch.switches), arch


def test_the_table_names_what_runs_apart_from_what_does_not_yet():
    """An entry runs where a shipped config runs it; then (but the plain Mask R-CNN) config keys turn it on, and the
    config that runs it does; one that does not run yet has no switch, config key, rule, int8 policy or variant."""
    table, defaults = architectures.ARCHITECTURES, minidet.get_cfg()
    assert table[0] is architectures.MASK_RCNN and architectures.RUNS[0] is architectures.MASK_RCNN
    runs, not_yet = ({a.name for a in part} for part in (architectures.RUNS, architectures.NOT_YET))
    assert runs | not_yet == {a.name for a in table} and not runs & not_yet
    for arch in architectures.RUNS[1:]:
        assert arch.switches, arch.name
        for name in arch.config.values():
            assert arch in architectures.turned_on(minidet.get_cfg(name), defaults), (arch.name, name)
    assert architectures.turned_on(defaults, defaults) == []
    for arch in architectures.NOT_YET:  # docs/zoo_census.tsv names them, a comma apart
        assert "," not in arch.name, arch.name
        assert not (arch.switches or arch.settings or arch.rules or arch.bench or arch.tag or arch.lacks), arch.name
        assert arch.int8 == architectures.Int8(), arch.name
    tags = [a.tag for a in table if a.tag]
    assert len(set(tags)) == len(tags)
    variants = [v.name for a in table for v in a.bench]
    assert len(set(variants)) == len(variants)
    shipped = set(minidet.config.config_names(bases=True))
    assert {c for a in table for v in a.bench for c in v.configs} <= shipped
    for key, (default, _) in architectures.settings().items():  # the config's defaults are the table's
        assert minidet.config.cfg_value(defaults, key) == default, key
