"""Cascade Mask R-CNN and deformable convolution against their sources' own code (the ``reference`` extra):
synthetic checkpoints in each zoo file's real layout (the reference model's own state dict names and shapes, every
key loaded strictly by minidet) give mmdetection 3.3.0's and detectron2's detections bit for bit under minidet's
shipped config of that file (MODEL.ROI_ALIGN_IMPL torchvision). mmdetection runs its deformable convolutions through
tests/mmdet_reference.py's stand-ins for mmcv's kernels (torchvision's ``deform_conv2d``, mmcv's offset and mask
layout); detectron2 runs its v1 deformable convolution on CPU itself (torchvision's, reached once a stand-in
``detectron2._C`` lets its real ``DeformConv`` be defined)."""

import pickle

import pytest

import minidet
from helpers import REFERENCE_SCALE, assert_bit_identical, config, needs_extra
from minidet.apps.synthetic import structured_image
from minidet.families import detectron2, mmdetection
from minidet.layers import DeformConv2d
from minidet.testing.checkpoints import d2_random_weights, d2_state_shapes
from minidet.testing.mmdet import mmdet_meta, mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint

pytestmark = [needs_extra("mmdet", "reference"), needs_extra("fvcore", "reference")]

# zoo config -> the layout minidet.testing writes for it (the other tests' synthetic files), which must be the
# reference's module tree; None: not one of those layouts
MMDET = {  # cascade; v1 and v2 deformable convolution; both, in a ResNeXt (grouped deformable convs)
    "cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco": {"stages": 3},
    "dcn/mask-rcnn_r50-dconv-c3-c5_fpn_1x_coco": {"dcn": "DCN"},
    "dcnv2/mask-rcnn_r50-mdconv-c3-c5_fpn_1x_coco": {"dcn": "DCNv2"},
    "dcn/cascade-mask-rcnn_x101-32x4d-dconv-c3-c5_fpn_1x_coco": {"depth": 101, "groups": 32, "stages": 3, "dcn": "DCN"},
}
DETECTRON2 = {  # cascade; v1 deformable convolution; both with GroupNorm (a panoptic file); both in a ResNeXt-152
    "Misc/cascade_mask_rcnn_R_50_FPN_1x.yaml": {"depth": 50, "stages": 3},
    "Misc/mask_rcnn_R_50_FPN_1x_dconv_c3-c5.yaml": {"depth": 50, "deform": True},
    "Misc/panoptic_fpn_R_101_dconv_cascade_gn_3x.yaml": None,
    "Misc/cascade_mask_rcnn_X_152_32x8d_FPN_IN5k_gn_dconv.yaml": None,
}


def _name(configs: dict, zoo: str) -> str:
    return next(n for n, z in configs.items() if z == zoo)


def _check(ours: minidet.Predictor, ref_detect, zoo: str) -> None:
    """minidet's detections on a structured image are the reference's bit for bit, and the deformable convs (if any)
    sample away from the grid: their offsets spread by a pixel or so, as trained ones do."""
    spread = []
    hooks = [m.offset.register_forward_hook(lambda mod, args, out: spread.append(float(out.std())))
             for m in ours.model.modules() if isinstance(m, DeformConv2d)]
    image = structured_image(230, 311, 0)
    out = ours(image)
    for h in hooks:
        h.remove()
    assert_bit_identical(out, ref_detect(image), zoo)
    assert not hooks or min(spread) > 0.3, (zoo, min(spread))


# the first check (-m "not slow") keeps one quick case of each source: v1 deformable convolution, 5 s to 10 s
QUICK = {"dcn/mask-rcnn_r50-dconv-c3-c5_fpn_1x_coco", "Misc/mask_rcnn_R_50_FPN_1x_dconv_c3-c5.yaml"}


def _cases(zoos) -> list:
    return [pytest.param(*z, marks=() if z[0] in QUICK else pytest.mark.slow) for z in zoos]


@pytest.mark.parametrize(("zoo", "deform_groups"), _cases([(z, 1) for z in MMDET] + [
    ("dcnv2/mask-rcnn_r50-mdconv-c3-c5_fpn_1x_coco", 4)]))  # no zoo file has more groups; mmcv's layout for them
def test_mmdetection_cascade_and_dcn_bit_for_bit(zoo, deform_groups, tmp_path):
    from mmdet_reference import detect, detector, zoo_config

    def reference_config():
        cfg = zoo_config(zoo, (512, 320), fewer=True)
        if deform_groups > 1:
            cfg.model.backbone.dcn.deform_groups = deform_groups
        return cfg

    shapes = {k: tuple(v.shape) for k, v in detector(reference_config(), None).state_dict().items()}  # its tree
    assert MMDET[zoo] is None or deform_groups > 1 or mmdet_state_shapes(**MMDET[zoo]) == shapes
    path = tmp_path / "model.pth"
    write_mmdet_checkpoint(path, mmdet_weights(shapes, seed=3), mmdet_meta())
    reference = detector(reference_config(), path)
    ours = minidet.Predictor(config(f"configs/{_name(mmdetection.ZOO_CONFIGS, zoo)}.yaml", *REFERENCE_SCALE,
                                    "MODEL.RESNETS.DEFORM_NUM_GROUPS", deform_groups, weights=path))
    _check(ours, lambda image: detect(reference, image), zoo)


@pytest.mark.parametrize("zoo", _cases([(z,) for z in DETECTRON2]))
def test_detectron2_cascade_and_dcn_bit_for_bit(zoo, tmp_path):
    d2 = pytest.importorskip("detectron2_reference")
    if not d2.SOURCES.is_file():
        pytest.skip(f"needs detectron2's sources: {d2.SOURCES}")
    zoo_cfg = d2.zoo_config(zoo, 320, 512, fewer=True)
    from detectron2.modeling import build_model

    shapes = {k: tuple(v.shape) for k, v in build_model(zoo_cfg).state_dict().items() if not k.startswith("pixel_")}
    assert DETECTRON2[zoo] is None or d2_state_shapes(**DETECTRON2[zoo]) == shapes
    path = tmp_path / "model_final.pkl"
    with open(path, "wb") as f:  # a panoptic file's semantic head too: minidet sets it aside by name
        pickle.dump({"model": d2_random_weights(shapes, seed=3), "__author__": "test"}, f)
    reference = d2.predictor(zoo_cfg, path)
    name = _name(detectron2.ZOO_CONFIGS, zoo)
    ours = minidet.Predictor(config(f"configs/{name}.yaml", *REFERENCE_SCALE, weights=path))
    _check(ours, lambda image: d2.detect(reference, image), zoo)
