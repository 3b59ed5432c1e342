"""detectron2 checkpoints and detectron2's inference arithmetic (MODEL.CONVENTION detectron2)."""

import math
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn import functional as F

import minidet
from minidet.boxes import assign_levels, detectron2_cell_anchors, paste_masks_aligned
from minidet.checkpoint import rename_detectron2
from minidet.synthetic import structured_image

SIZE = ["INPUT.MIN_SIZE_TEST", 320, "INPUT.MAX_SIZE_TEST", 512]


def d2_state_shapes(depth: int) -> dict[str, tuple]:
    """Names and shapes of detectron2's GeneralizedRCNN (R-FPN Mask R-CNN) state dict, from its
    module tree: backbone.bottom_up (ResNet: stem, res2..res5 with conv1..3, shortcut, FrozenBN
    `norm`), backbone.fpn_lateral/output{2..5}, proposal_generator.rpn_head (conv,
    objectness_logits, anchor_deltas), roi_heads.box_head (fc1, fc2), roi_heads.box_predictor
    (cls_score 81 with background last, bbox_pred 80 x 4), roi_heads.mask_head (mask_fcn1..4,
    deconv, predictor)."""
    out = {}

    def conv(name, cout, cin, k, norm=True, bias=False):
        out[f"{name}.weight"] = (cout, cin, k, k)
        if bias:
            out[f"{name}.bias"] = (cout,)
        if norm:
            for s in ("weight", "bias", "running_mean", "running_var"):
                out[f"{name}.norm.{s}"] = (cout,)

    conv("backbone.bottom_up.stem.conv1", 64, 3, 7)
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}[depth]
    cin, bott, cout = 64, 64, 256
    for stage, n in enumerate(blocks, start=2):
        for i in range(n):
            pre = f"backbone.bottom_up.res{stage}.{i}"
            if i == 0:
                conv(f"{pre}.shortcut", cout, cin, 1)
            conv(f"{pre}.conv1", bott, cin if i == 0 else cout, 1)
            conv(f"{pre}.conv2", bott, bott, 3)
            conv(f"{pre}.conv3", cout, bott, 1)
        cin, bott, cout = cout, bott * 2, cout * 2
    for lvl, c in zip(range(2, 6), (256, 512, 1024, 2048)):
        conv(f"backbone.fpn_lateral{lvl}", 256, c, 1, norm=False, bias=True)
        conv(f"backbone.fpn_output{lvl}", 256, 256, 3, norm=False, bias=True)
    conv("proposal_generator.rpn_head.conv", 256, 256, 3, norm=False, bias=True)
    conv("proposal_generator.rpn_head.objectness_logits", 3, 256, 1, norm=False, bias=True)
    conv("proposal_generator.rpn_head.anchor_deltas", 12, 256, 1, norm=False, bias=True)
    for name, shape in [
        ("box_head.fc1", (1024, 12544)),
        ("box_head.fc2", (1024, 1024)),
        ("box_predictor.cls_score", (81, 1024)),
        ("box_predictor.bbox_pred", (320, 1024)),
    ]:
        out[f"roi_heads.{name}.weight"], out[f"roi_heads.{name}.bias"] = shape, shape[:1]
    for j in range(1, 5):
        conv(f"roi_heads.mask_head.mask_fcn{j}", 256, 256, 3, norm=False, bias=True)
    out["roi_heads.mask_head.deconv.weight"], out["roi_heads.mask_head.deconv.bias"] = (256, 256, 2, 2), (256,)
    conv("roi_heads.mask_head.predictor", 80, 256, 1, norm=False, bias=True)
    return out


def d2_weights(depth: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random but sane values; non-trivial frozen-BN statistics."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in d2_state_shapes(depth).items():
        if name.endswith("norm.weight"):
            v = rng.uniform(0.1, 0.3, shape) if ".conv3." in name else rng.uniform(0.6, 1.2, shape)
        elif name.endswith(("norm.bias", "running_mean")):
            v = rng.normal(0, 0.1, shape)
        elif name.endswith("running_var"):
            v = rng.uniform(0.5, 2.0, shape)
        elif name.endswith("weight"):
            fan_in = int(np.prod(shape[1:])) if "deconv" not in name else shape[0] * 4
            v = rng.normal(0, math.sqrt(2.0 / fan_in), shape)
            if "stem" in name:
                v /= 60.0  # 0-255 pixels
            if "fpn_" in name:
                v *= 0.4
            if "cls_score" in name:
                v = (v - v.mean(axis=1, keepdims=True)) * 3.0
            if "bbox_pred" in name:
                v *= 0.3
        else:
            v = rng.normal(0, 0.05, shape)
        out[name] = v.astype(np.float32)
    return out


def _cfg(name, weights, *opts):
    cfg = minidet.get_cfg()
    cfg.merge_from_file(f"configs/detectron2/mask_rcnn_{name}.yaml")
    cfg.merge_from_list(["MODEL.WEIGHTS", str(weights), *SIZE, *opts])
    return cfg


@pytest.fixture(scope="module")
def d2_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("d2") / "model_final.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": d2_weights(50), "__author__": "test", "matching_heuristics": True}, f)
    return path


def test_every_name_maps_and_loads(d2_file):
    model, report = minidet.prepare_model(_cfg("R_50_FPN_3x", d2_file))
    assert report.format == "detectron2" and not report.missing and not report.unexpected
    assert report.loaded == len(d2_state_shapes(50))
    assert model.box_predictor.cls_score.out_features == 81 and model.box_predictor.bbox_pred.out_features == 320
    assert model.backbone.res3[0].conv1.stride == (2, 2)  # MSRA: stride in the 1x1
    assert model.backbone.stem.conv1.norm.eps == 1e-5
    assert model.box_pooler.aligned and model.box_pooler.sampling_ratio == 0


def test_pth_with_model_key_and_r101(tmp_path):
    sd = {k: torch.from_numpy(v) for k, v in d2_weights(101, seed=1).items()}
    path = tmp_path / "r101.pth"
    torch.save({"model": sd, "iteration": 270000}, path)
    _, report = minidet.prepare_model(_cfg("R_101_FPN_3x", path))
    assert not report.missing and not report.unexpected


def test_rename_examples():
    assert (
        rename_detectron2("backbone.bottom_up.res4.5.conv2.norm.running_var")
        == "backbone.res4.5.conv2.norm.running_var"
    )
    assert rename_detectron2("backbone.fpn_output3.bias") == "fpn.output3.bias"
    assert rename_detectron2("proposal_generator.rpn_head.conv.weight") == "rpn.head.convs.0.weight"
    assert rename_detectron2("roi_heads.mask_head.predictor.weight") == "mask_head.predictor.weight"
    assert rename_detectron2("pixel_mean") is None


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
    assert assign_levels(b, 2, 5, "detectron2").tolist() == [1]  # log2 < 0 -> P3
    assert assign_levels(b, 2, 5).tolist() == [2]  # torchvision: eps outside the log -> P4


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
    ours = paste_masks_aligned(masks, boxes, 70, 100)
    ys = (torch.arange(70, dtype=torch.float32) + 0.5)[None]
    xs = (torch.arange(100, dtype=torch.float32) + 0.5)[None]
    x0, y0, x1, y1 = boxes.split(1, dim=1)
    gy = ((ys - y0) / (y1 - y0) * 2 - 1)[:, :, None].expand(4, 70, 100)
    gx = ((xs - x0) / (x1 - x0) * 2 - 1)[:, None, :].expand(4, 70, 100)
    ref = F.grid_sample(masks[:, None], torch.stack([gx, gy], 3), align_corners=False)[:, 0] >= 0.5
    assert torch.equal(ours, ref)


def test_rpn_keeps_only_nonempty_boxes():
    """detectron2 drops clipped boxes without area (``> MIN_SIZE``, MIN_SIZE 0); per-level NMS."""
    from minidet.rpn import RPN

    rpn = RPN(8, [32], [1.0], min_size=0.0, style="detectron2", post_nms_topk=10)
    logits = torch.full((1, 1, 2, 2), -50.0)
    logits[0, 0, 0, 0], logits[0, 0, 0, 1] = 30.0, 31.0  # sigmoid ties both at 1.0 in float32
    deltas = torch.zeros(1, 4, 2, 2)
    props = rpn.select([logits], [deltas], (8, 8), [(8, 8)])[0]
    # anchors (stride 4, offset 0): [-16, -16, 16, 16] + shifts; clipped to the 8 x 8 image, all four
    # overlap fully -> NMS keeps one
    assert props.tolist() == [[0.0, 0.0, 8.0, 8.0]] and len(props) == 1
    empty = rpn.select([logits], [deltas], (8, 8), [(0, 8)])[0]  # zero-height image: all boxes empty
    assert len(empty) == 0
