"""RegNet bodies, GC blocks and Mask Scoring R-CNN against their sources' own code (the ``reference`` extra), as
tests/test_cascade_dcn_reference.py does for the cascade and deformable convolution: synthetic checkpoints in each zoo
file's real layout (``minidet.testing``'s writers, held equal to the reference model's own state dict names and
shapes, every key loaded strictly by minidet) give mmdetection 3.3.0's and detectron2's detections bit for bit under
minidet's shipped config of that file (MODEL.ROI_ALIGN_IMPL torchvision). mmdetection: RegNetX Mask R-CNNs (plain,
with modulated deformable 3x3 convs in its grouped convs, in a cascade), mmcv's GC blocks (``ContextBlock``) after
conv3 in res3..res5 of a ResNet-50 and of a SyncBN, deformable, cascade ResNeXt-101, Mask Scoring R-CNN (each
detection's score its box score times its predicted mask IoU; minidet keeps the box scores, which are mmdetection's
before that product); detectron2: its RegNetX-4GF and RegNetY-4GF (squeeze-and-excitation) new baselines. The random
weights make each new part count: deformable offsets of about a pixel, GC context terms the size of the residual
branch, SE gates spread over (0, 1), mask IoUs spread over (0.3, 1)."""

import pickle

import pytest
import torch

import minidet
from helpers import REFERENCE_SCALE, assert_bit_identical, config, needs_extra
from minidet.apps.synthetic import structured_image
from minidet.bodies.blocks import ContextBlock, SqueezeExcite
from minidet.layers import DeformConv2d
from minidet.testing.checkpoints import d2_random_weights, d2_state_shapes
from minidet.testing.mmdet import mmdet_meta, mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint

pytestmark = [needs_extra("mmdet", "reference"), needs_extra("fvcore", "reference")]

# zoo config -> mmdet_state_shapes arguments of its layout (the reference's module tree, asserted)
MMDET = {
    "regnet/mask-rcnn_regnetx-400MF_fpn_ms-poly-3x_coco": {"arch": "regnetx_400mf"},
    "regnet/mask-rcnn_regnetx-3.2GF_fpn_1x_coco": {"arch": "regnetx_3.2gf"},
    "regnet/mask-rcnn_regnetx-3.2GF-mdconv-c3-c5_fpn_1x_coco": {"arch": "regnetx_3.2gf", "dcn": "DCNv2"},
    "regnet/cascade-mask-rcnn_regnetx-400MF_fpn_ms-3x_coco": {"arch": "regnetx_400mf", "stages": 3},
    "gcnet/mask-rcnn_r50-gcb-r16-c3-c5_fpn_1x_coco": {"context": 1 / 16},
    "gcnet/mask-rcnn_r50-gcb-r4-c3-c5_fpn_1x_coco": {"context": 1 / 4},
    "gcnet/cascade-mask-rcnn_x101-32x4d-syncbn-dconv-c3-c5-r16-gcb-c3-c5_fpn_1x_coco":
        {"depth": 101, "groups": 32, "stages": 3, "dcn": "DCN", "context": 1 / 16},
    "ms_rcnn/ms-rcnn_r50-caffe_fpn_1x_coco": {"mask_iou": True},
    "ms_rcnn/ms-rcnn_x101-32x4d_fpn_1x_coco": {"depth": 101, "groups": 32, "mask_iou": True},
}
# zoo config -> the RegNet's regnet_body parameters (the new baselines' LazyConfig files); the rest of the layout is
# the LSJ baselines' (SyncBN everywhere with its counters, a 4conv1fc box head, two RPN convs)
LSJ = {"fpn_norm": True, "head_norm": True, "box_convs": 4, "rpn_convs": 2, "counters": True}
DETECTRON2 = {
    "new_baselines/mask_rcnn_regnetx_4gf_dds_FPN_100ep_LSJ.py":
        {"depth": 23, "w_a": 38.65, "w_0": 96, "w_m": 2.43, "group_width": 40},
    "new_baselines/mask_rcnn_regnety_4gf_dds_FPN_100ep_LSJ.py":
        {"depth": 22, "w_a": 31.41, "w_0": 96, "w_m": 2.24, "group_width": 64, "se_ratio": 0.25},
}
# the first check (-m "not slow") keeps the quick cases: a RegNetX-400MF, a GC R-50, an MS R-CNN R-50 (mmdetection)
# and detectron2's RegNetY-4GF
QUICK = {"regnet/mask-rcnn_regnetx-400MF_fpn_ms-poly-3x_coco", "gcnet/mask-rcnn_r50-gcb-r16-c3-c5_fpn_1x_coco",
         "ms_rcnn/ms-rcnn_r50-caffe_fpn_1x_coco", "new_baselines/mask_rcnn_regnety_4gf_dds_FPN_100ep_LSJ.py"}


def _cases(zoos) -> list:
    return [pytest.param(z, marks=() if z in QUICK else pytest.mark.slow) for z in zoos]


def _config(family: str, zoo: str, weights):
    """minidet's shipped config of the zoo file: ``<family>/<its base name>``, at the test scale."""
    name = zoo.rpartition("/")[2].removesuffix(".py")
    return config(f"configs/{family}/{name}.yaml", *REFERENCE_SCALE, weights=weights)


def _spreads(model: torch.nn.Module):
    """Forward hooks recording how much each new part changes its input: per deformable conv its offsets' std (in
    pixels), per GC block its context term's std over its input's, per SE its gates' std. Returns (the records by
    kind, the hooks)."""
    seen = {"offsets": [], "context": [], "gates": []}

    def context(mod, args, out):
        seen["context"].append(float((out - args[0]).std() / args[0].std()))

    def gates(mod, args, out):
        seen["gates"].append(float((out / args[0]).nan_to_num(0.5).std()))

    hooks = []
    for m in model.modules():
        if isinstance(m, DeformConv2d):  # a modulated one's last third: its mask logits
            n = 2 * m.offset.out_channels // 3 if m.modulated else m.offset.out_channels
            hooks.append(m.offset.register_forward_hook(
                lambda mod, args, out, n=n: seen["offsets"].append(float(out[:, :n].std()))))
        elif isinstance(m, ContextBlock):
            hooks.append(m.register_forward_hook(context))
        elif isinstance(m, SqueezeExcite):
            hooks.append(m.register_forward_hook(gates))
    return seen, hooks


def _check(ours: minidet.Predictor, ref_detect, zoo: str) -> dict:
    """minidet's detections on a structured image are the reference's bit for bit, and each new part changes what
    it is given: deformable offsets spread by a pixel or so, GC context terms a tenth of their input's size or more,
    SE gates spread. Returns minidet's detections."""
    seen, hooks = _spreads(ours.model)
    image = structured_image(230, 311, 0)
    out = ours(image)
    for h in hooks:
        h.remove()
    assert_bit_identical(out, ref_detect(image), zoo)
    assert not seen["offsets"] or min(seen["offsets"]) > 0.3, (zoo, min(seen["offsets"]))
    assert not seen["context"] or min(seen["context"]) > 0.1, (zoo, min(seen["context"]))
    assert not seen["gates"] or min(seen["gates"]) > 0.03, (zoo, min(seen["gates"]))
    return out


@pytest.mark.parametrize("zoo", _cases(MMDET))
def test_mmdetection_regnet_gc_ms_bit_for_bit(zoo, tmp_path):
    from mmdet_reference import detect, detector, zoo_config

    layout = mmdet_state_shapes(**MMDET[zoo])
    path = tmp_path / "model.pth"
    write_mmdet_checkpoint(path, mmdet_weights(layout, seed=3, caffe="caffe" in zoo), mmdet_meta())
    reference = detector(zoo_config(zoo, (512, 320), fewer=True), path)
    assert layout == {k: tuple(v.shape) for k, v in reference.state_dict().items()}, zoo  # its module tree
    box_scores = []  # Mask Scoring R-CNN: the scores before its mask IoU head multiplies them
    if MMDET[zoo].get("mask_iou"):
        rescore = reference.roi_head.mask_iou_head.predict_by_feat

        def keep_box_scores(mask_iou_preds, results_list):
            box_scores.extend(r.scores.clone() for r in results_list)
            return rescore(mask_iou_preds=mask_iou_preds, results_list=results_list)

        reference.roi_head.mask_iou_head.predict_by_feat = keep_box_scores
    out = _check(minidet.Predictor(_config("mmdetection", zoo, path)), lambda image: detect(reference, image), zoo)
    if MMDET[zoo].get("mask_iou"):
        assert torch.equal(out["box_scores"], box_scores[0]), zoo
        ious = out["scores"] / out["box_scores"]  # the predicted mask IoUs: spread, each detection's own
        assert ious.std() > 0.03 and 0.1 < ious.min() and ious.max() < 1.5, (zoo, ious)
    else:
        assert "box_scores" not in out


@pytest.mark.parametrize("zoo", _cases(DETECTRON2))
def test_detectron2_regnet_bit_for_bit(zoo, tmp_path):
    d2 = pytest.importorskip("detectron2_reference")
    if not d2.SOURCES.is_file():
        pytest.skip(f"needs detectron2's sources: {d2.SOURCES}")
    layout = d2_state_shapes(0, regnet=DETECTRON2[zoo], **LSJ)
    path = tmp_path / "model_final.pkl"
    # the stem takes pixels divided by their std (pycls's); the normalized box head's features call for wide logits
    weights = d2_random_weights(layout, seed=3, normalized_input=True, spread=10.0)
    with open(path, "wb") as f:
        pickle.dump({"model": weights, "__author__": "test"}, f)
    reference = d2.predictor(d2.zoo_config(zoo, 320, 512, fewer=True), path)
    assert layout == d2.state_shapes(reference), zoo  # its module tree
    _check(minidet.Predictor(_config("detectron2", zoo, path)), lambda image: d2.detect(reference, image), zoo)
