"""minidet's detectron2 configs against detectron2 itself (its sources in ../shared/reference, run by
tests/detectron2_reference.py with the ``reference`` extra's packages): a synthetic checkpoint in detectron2's layout
gives ``DefaultPredictor``'s detections, bit for bit, under minidet (MODEL.ROI_ALIGN_IMPL torchvision: the RoIAlign
detectron2 calls; the default gather RoIAlign only reorders float sums). That every shipped config computes what its
zoo config computes at test time is tests/test_zoo_configs.py's (the configs are made from the zoo's config files by
tools/zoo_configs.py)."""

import pickle

import pytest

import minidet
from helpers import REFERENCE_SCALE, assert_bit_identical, config, needs_extra
from minidet.apps.synthetic import structured_image
from minidet.families.detectron2 import ZOO_CONFIGS
from minidet.testing.checkpoints import d2_weights

pytestmark = [needs_extra("fvcore", "reference"), needs_extra("omegaconf", "reference")]


@pytest.fixture(scope="module")
def d2():
    import detectron2_reference

    if not detectron2_reference.SOURCES.is_file():
        pytest.skip(f"needs detectron2's sources: {detectron2_reference.SOURCES}")
    return detectron2_reference


# zoo config -> d2_weights arguments of its synthetic file, and the proposals per image where fewer than the config's
# (both sides alike: LVIS's 1230 classes at score threshold 0.0001 make a slow reference otherwise)
NORMED_HEADS = {"fpn_norm": True, "head_norm": True, "box_convs": 4}
CASES = {
    "COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x.yaml": ({"depth": 50}, None),
    "COCO-InstanceSegmentation/mask_rcnn_X_101_32x8d_FPN_3x.yaml": ({"depth": 101, "groups": 32, "width": 8}, None),
    "new_baselines/mask_rcnn_R_50_FPN_100ep_LSJ.py": ({"depth": 50, "rpn_convs": 2, "counters": True, **NORMED_HEADS},
                                                      None),
    "Misc/mask_rcnn_R_50_FPN_3x_gn.yaml": ({"depth": 50, "norm": "gn", **NORMED_HEADS}, None),
    "COCO-PanopticSegmentation/panoptic_fpn_R_50_1x.yaml": ({"depth": 50}, None),
    "LVISv0.5-InstanceSegmentation/mask_rcnn_R_50_FPN_1x.yaml": ({"depth": 50, "num_classes": 1230}, 50),
    "Cityscapes/mask_rcnn_R_50_FPN.yaml": ({"depth": 50, "num_classes": 8}, None),
}


@pytest.mark.parametrize("zoo", list(CASES))
def test_detections_are_detectron2s_bit_for_bit(d2, zoo, tmp_path):
    layout, proposals = CASES[zoo]
    zoo_cfg = d2.zoo_config(zoo, 320, 512, fewer=True)
    opts = list(REFERENCE_SCALE)
    if proposals:
        zoo_cfg.MODEL.RPN.POST_NMS_TOPK_TEST = proposals
        opts += ["MODEL.RPN.POST_NMS_TOPK_TEST", proposals]
    weights = d2_weights(seed=3, **layout)
    if zoo.startswith("COCO-PanopticSegmentation/"):  # the file holds the semantic head too: minidet sets it aside
        from detectron2.modeling import build_model

        semantic = {k: v.numpy() for k, v in build_model(zoo_cfg).state_dict().items() if k.startswith("sem_seg_head.")}
        assert semantic
        weights.update(semantic)
    path = tmp_path / "model_final.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": weights, "__author__": "test"}, f)
    reference = d2.predictor(zoo_cfg, path)
    assert {k: tuple(v.shape) for k, v in weights.items()} == d2.state_shapes(reference), zoo  # its module tree
    name = next(n for n, z in ZOO_CONFIGS.items() if z == zoo)
    ours = minidet.Predictor(config(f"configs/{name}.yaml", *opts, weights=path))
    image = structured_image(230, 311, 0)
    ref, out = d2.detect(reference, image), ours(image)
    assert_bit_identical(out, ref, zoo)
