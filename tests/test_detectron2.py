"""detectron2 checkpoints and detectron2's inference arithmetic (MODEL.CONVENTION detectron2)."""

import math
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn import functional as F

import minidet
from helpers import config
from minidet.apps.synthetic import structured_image
from minidet.families.detectron2 import rename as rename_detectron2
from minidet.heads.rpn import detectron2_cell_anchors, keep_above_min_size
from minidet.poolers import detectron2_levels, torchvision_levels
from minidet.testing.checkpoints import d2_state_shapes, d2_weights
from minidet.transform import paste_masks_aligned

SIZE = ["INPUT.MIN_SIZE_TEST", 320, "INPUT.MAX_SIZE_TEST", 512]


def _cfg(name, weights, *opts):
    return config(f"configs/detectron2/mask_rcnn_{name}.yaml", *SIZE, *opts, weights=weights)


@pytest.fixture(scope="module")
def d2_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("d2") / "model_final.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": d2_weights(50), "__author__": "test", "matching_heuristics": True}, f)
    return path


@pytest.mark.slow
def test_every_name_maps_and_loads(d2_file):
    model, report = minidet.prepare_model(_cfg("R_50_FPN_3x", d2_file))
    assert report.format == "detectron2" and not report.missing and not report.unexpected
    assert report.loaded == len(d2_state_shapes(50))
    assert model.box_predictor.cls_score.out_features == 81 and model.box_predictor.bbox_pred.out_features == 320
    assert model.backbone.res3[0].conv1.stride == (2, 2)  # MSRA: stride in the 1x1
    assert model.backbone.stem.conv1.norm.eps == 1e-5
    assert model.box_pooler.aligned and model.box_pooler.sampling_ratio == 0


@pytest.mark.slow
def test_pth_with_model_key_and_r101(tmp_path):
    sd = {k: torch.from_numpy(v) for k, v in d2_weights(101, seed=1).items()}
    path = tmp_path / "r101.pth"
    torch.save({"model": sd, "iteration": 270000}, path)
    _, report = minidet.prepare_model(_cfg("R_101_FPN_3x", path))
    assert not report.missing and not report.unexpected


@pytest.mark.slow
def test_resnext_file_loads_with_its_config(tmp_path):
    """mask_rcnn_X_101_32x8d_FPN_3x's layout (the R-101 names, 32 groups of width 8 in res2's 3x3 convs, doubling per
    stage): every key loaded by its config, which puts the stride in the 3x3 and divides by the ImageNet model's
    pixel standard deviation, as detectron2's config does; the R-101 config refuses the file in one line."""
    path = tmp_path / "model_final_2d9806.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": d2_weights(101, seed=2, groups=32, width=8), "__author__": "test"}, f)
    model, report = minidet.prepare_model(_cfg("X_101_32x8d_FPN_3x", path))
    assert not report.missing and not report.unexpected
    assert report.loaded == len(d2_state_shapes(101, 32, 8))
    conv2 = model.backbone.res4[22].conv2
    assert (conv2.groups, conv2.in_channels, conv2.weight.shape[1]) == (32, 1024, 32)
    assert model.backbone.res3[0].conv1.stride == (1, 1) and model.backbone.res3[0].conv2.stride == (2, 2)
    assert model.transform.pixel_std.flatten().tolist() == pytest.approx([57.375, 57.120, 58.395])
    out = minidet.Predictor(_cfg("X_101_32x8d_FPN_3x", path))(structured_image(200, 260, seed=3))
    assert out["boxes"].shape[1:] == (4,)
    grouped = "res2.0.conv2.weight is a 3x3 conv of 32 groups of 8 .*NUM_GROUPS 32 and WIDTH_PER_GROUP 8"
    with pytest.raises(minidet.CheckpointError, match=grouped) as e:
        minidet.prepare_model(_cfg("R_101_FPN_3x", path))
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_rename_examples():
    assert (
        rename_detectron2("backbone.bottom_up.res4.5.conv2.norm.running_var")
        == "backbone.res4.5.conv2.norm.running_var"
    )
    assert rename_detectron2("backbone.fpn_output3.bias") == "fpn.output3.bias"
    assert rename_detectron2("proposal_generator.rpn_head.conv.weight") == "rpn.head.convs.0.weight"
    assert rename_detectron2("roi_heads.mask_head.predictor.weight") == "mask_head.predictor.weight"
    assert rename_detectron2("pixel_mean") is None


@pytest.mark.slow
def test_end_to_end_categories_and_boxes(d2_file):
    p = minidet.Predictor(_cfg("R_50_FPN_3x", d2_file))
    img = structured_image(230, 310, 2)
    out = p(img)
    n = len(out["boxes"])
    assert n > 0 and out["labels"].max() < 80 and p.box_offset == 0
    assert p.class_names[0] == "person" and len(p.class_names) == 80
    ids = minidet.categories.category_ids("coco80")
    assert out["category_ids"].tolist() == [ids[i] for i in out["labels"].tolist()]
    b = out["boxes"]
    assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()  # empty boxes dropped
    assert (b[:, 2] <= 310).all() and (b[:, 3] <= 230).all()
    assert out["masks"].shape == (n, 230, 310)


def test_anchors_are_detectron2s():
    a = detectron2_cell_anchors(32, (0.5, 1.0, 2.0))
    w = math.sqrt(32 * 32 / 0.5)
    expected = [[-w / 2, -w / 4, w / 2, w / 4], [-16, -16, 16, 16], [-w / 4, -w / 2, w / 4, w / 2]]
    torch.testing.assert_close(a, torch.tensor(expected, dtype=torch.float32))
    assert ((a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])).sub(1024).abs().max() < 1e-3  # exact areas


def test_level_eps_inside_the_log():
    h = torch.tensor(224 * (1 - 7e-7), dtype=torch.float32)
    b = torch.stack([torch.tensor(0.0), torch.tensor(0.0), torch.tensor(224.0), h])[None]
    assert detectron2_levels(b, 2, 5).tolist() == [1]  # log2 < 0 -> P3
    assert torchvision_levels(b, 2, 5).tolist() == [2]  # torchvision: eps outside the log -> P4


def test_resize_is_pils():
    cfg = _cfg("R_50_FPN_3x", "")
    cfg.merge_from_list(["INPUT.MIN_SIZE_TEST", 800, "INPUT.MAX_SIZE_TEST", 1333])
    model = minidet.build_model(cfg)
    img = structured_image(427, 640, 9)
    batch, sizes, _, _ = model.preprocess([img])
    assert sizes == [(800, 1199)]  # 640 * 800 / 427 = 1199.06 -> int(x + 0.5)
    ref = np.asarray(Image.fromarray(img).resize((1199, 800), Image.BILINEAR)).astype(np.float32)
    ref = torch.from_numpy(ref.transpose(2, 0, 1)) - torch.tensor([103.53, 116.28, 123.675]).view(3, 1, 1)
    assert torch.equal(batch[0, :, :800, :1199], ref)


def test_paste_is_grid_sample_over_the_whole_image():
    rng = np.random.default_rng(0)
    masks = torch.from_numpy(rng.uniform(0, 1, (4, 28, 28)).astype(np.float32))
    boxes = torch.tensor([[10.3, 20.7, 37.2, 47.9], [0.0, 0.0, 5.5, 3.1], [-4.0, 30.0, 60.0, 99.0], [80, 5, 99.9, 44]])
    ours = paste_masks_aligned(masks, boxes, 70, 100).dense()
    ys = (torch.arange(70, dtype=torch.float32) + 0.5)[None]
    xs = (torch.arange(100, dtype=torch.float32) + 0.5)[None]
    x0, y0, x1, y1 = boxes.split(1, dim=1)
    gy = ((ys - y0) / (y1 - y0) * 2 - 1)[:, :, None].expand(4, 70, 100)
    gx = ((xs - x0) / (x1 - x0) * 2 - 1)[:, None, :].expand(4, 70, 100)
    ref = F.grid_sample(masks[:, None], torch.stack([gx, gy], 3), align_corners=False)[:, 0] >= 0.5
    assert torch.equal(ours, ref)


def test_rpn_keeps_only_nonempty_boxes():
    """detectron2 drops clipped boxes without area (``> MIN_SIZE``, MIN_SIZE 0); per-level NMS."""
    from minidet.heads.rpn import RPN

    d2 = {"anchor_generator": detectron2_cell_anchors, "fixed_strides": True, "rank_by_logit": True}
    rpn = RPN(8, [32], [1.0], min_size=0.0, post_nms_topk=10, proposal_filter=keep_above_min_size, **d2)
    logits = torch.full((1, 1, 2, 2), -50.0)
    logits[0, 0, 0, 0], logits[0, 0, 0, 1] = 30.0, 31.0  # sigmoid ties both at 1.0 in float32
    deltas = torch.zeros(1, 4, 2, 2)
    props = rpn.select([logits], [deltas], (8, 8), [(8, 8)])[0]
    # anchors (stride 4, offset 0): [-16, -16, 16, 16] + shifts; clipped to the 8 x 8 image, all four
    # overlap fully -> NMS keeps one
    assert props.tolist() == [[0.0, 0.0, 8.0, 8.0]] and len(props) == 1
    empty = rpn.select([logits], [deltas], (8, 8), [(0, 8)])[0]  # zero-height image: all boxes empty
    assert len(empty) == 0
