"""Detectron (Caffe2) checkpoints: safe reading, renaming, variants, and Detectron's arithmetic."""

import os
import pickle
import re

import cv2
import numpy as np
import pytest
import torch

import minidet
from helpers import FEWER, config
from minidet.apps.compare import assert_same_detections
from minidet.apps.synthetic import structured_image
from minidet.boxes import BoxRule, batched_nms, clip_boxes, decode_boxes
from minidet.checkpoint import CheckpointError
from minidet.families.detectron import rename as rename_detectron
from minidet.heads.box import BoxPredictor
from minidet.heads.rpn import detectron_cell_anchors, keep_original_pixels
from minidet.norm import Affine, FrozenBN
from minidet.poolers import detectron_levels, torchvision_levels
from minidet.readers import read_pickle_file
from minidet.testing.checkpoints import REFERENCE, add_real_file_extras, blob_list, make_blobs, write_detectron_pkl
from minidet.transform import ImageBatch, paste_masks

# one process of the parallel part runs the file: its synthetic files are written once, not waited for by another
pytestmark = [pytest.mark.skipif(not os.path.isdir(REFERENCE), reason="needs ../shared/reference (blob lists)"),
              pytest.mark.xdist_group("detectron")]

SIZE = ["INPUT.MIN_SIZE_TEST", 320, "INPUT.MAX_SIZE_TEST", 512]
CONFIGS = {
    "R-50-FPN": "e2e_mask_rcnn_R-50-FPN_1x",
    "R-101-FPN": "e2e_mask_rcnn_R-101-FPN_1x",
    "R-50-FPN_gn": "e2e_mask_rcnn_R-50-FPN_2x_gn",
    "R-101-FPN_gn": "e2e_mask_rcnn_R-101-FPN_3x_gn",
}


def _cfg(variant, weights, *opts):
    return config(f"configs/detectron/{CONFIGS[variant]}.yaml", *SIZE, *opts, weights=weights)


@pytest.fixture(scope="module")
def pkl_files(session_cache):
    """variant -> its synthetic Detectron file, written once per test run (``session_cache``: both workers of the
    parallel part read them)."""
    def write(folder):
        for seed, variant in enumerate(CONFIGS):
            write_detectron_pkl(str(folder / f"{variant}.pkl"), add_real_file_extras(make_blobs(variant, seed=seed)))

    folder = session_cache.get({"made": "detectron pkl files", "variants": list(CONFIGS)}, write)[0]
    return {variant: folder / f"{variant}.pkl" for variant in CONFIGS}


# ------------------------------------------------------------------------------- file and names


def test_py2_pickle_needs_latin1_and_reads_safely(pkl_files):
    raw = pkl_files["R-50-FPN"].read_bytes()
    assert raw[:2] == b"\x80\x02" and b"numpy.core.multiarray\n_reconstruct" in raw
    with pytest.raises(UnicodeDecodeError):  # what a plain Python 3 load does with these files
        pickle.loads(raw)
    blobs = read_pickle_file(str(pkl_files["R-50-FPN"]))
    ref = make_blobs("R-50-FPN", seed=0)
    assert np.array_equal(blobs["res4_3_branch2b_bn_s"], ref["res4_3_branch2b_bn_s"])
    assert blobs["pred_b"] is None and "res5_2_branch2c_w_momentum" in blobs


def test_flat_imagenet_style_dict(tmp_path):
    p = tmp_path / "R-50.pkl"
    with open(p, "wb") as f:
        pickle.dump({"conv1_w": np.ones((64, 3, 7, 7), np.float32)}, f, protocol=2)
    assert set(read_pickle_file(str(p))) == {"conv1_w"}


def _d2_to_minidet(d2: str, gn: bool) -> str | None:
    """detectron2's module names (independent oracle: its real converter's output) -> minidet's."""
    if re.fullmatch(r"fc1000\.weight|fc1000\.bias|fc\d+\.weight|(res\d\.\d+\.(conv\d|shortcut)|stem\.conv1)\.bias", d2):
        return None  # ImageNet classifier and zero conv biases: unused extras
    if not gn:
        d2 = d2.replace("norm.weight", "norm.scale").replace("norm.bias", "norm.shift")
    d2 = re.sub(r"^(stem|res\d)\.", r"backbone.\1.", d2)
    d2 = re.sub(r"^fpn_(lateral|output)(\d)\.", r"fpn.\1\2.", d2)
    d2 = d2.replace("proposal_generator.rpn_head.conv.", "rpn.head.convs.0.")
    d2 = d2.replace("proposal_generator.rpn_head.", "rpn.head.")
    return re.sub(r"^(cls_score|bbox_pred)\.", r"box_predictor.\1.", d2)


@pytest.mark.parametrize("variant", ["R-50-FPN", "R-50-FPN_gn"])
def test_renaming_agrees_with_detectron2(variant):
    path = os.path.join(REFERENCE, f"detectron_e2e_mask_rcnn_{variant}.d2map.txt")
    n = 0
    for line in open(path):
        if line.startswith("#") or "<-" not in line:
            continue
        d2, c2 = line.split("<-")[0].strip(), line.split("<-")[1].split()[0]
        assert rename_detectron(c2) == _d2_to_minidet(d2, variant.endswith("_gn")), c2
        n += 1
    assert n > 200


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(CONFIGS))
def test_synthetic_checkpoints_load_completely(pkl_files, variant):
    model, report = minidet.prepare_model(_cfg(variant, pkl_files[variant]))
    assert report.format == "detectron" and not report.missing and not report.unexpected
    assert report.loaded == len(blob_list(variant))
    assert {"fc1000_w", "conv1_b", "res3_2_branch2a_b", "fc6_w_momentum", "pred_b"} <= set(report.ignored)
    assert "ignored by design" in str(report)
    if variant.endswith("_gn"):
        gn = model.backbone.res3[0].conv2.norm
        assert isinstance(gn, torch.nn.GroupNorm) and gn.num_groups == 32 and gn.eps == 1e-5
        assert model.backbone.res3[0].conv2.stride == (2, 2)  # GN models: stride in the 3x3
    else:
        assert model.backbone.res3[0].conv1.stride == (2, 2)  # MSRA BN models: stride in the 1x1
        blobs = make_blobs(variant, seed=list(CONFIGS).index(variant))
        norm = model.backbone.res4[2].conv2.norm
        assert isinstance(norm, Affine)
        assert torch.equal(norm.scale.view(-1), torch.from_numpy(blobs["res4_2_branch2b_bn_s"]))
        assert torch.equal(norm.shift.view(-1), torch.from_numpy(blobs["res4_2_branch2b_bn_b"]))


@pytest.mark.slow
def test_affine_channel_into_frozen_bn_is_identity_stats_eps0(pkl_files):
    model, _ = minidet.prepare_model(_cfg("R-50-FPN", pkl_files["R-50-FPN"], "MODEL.NORM", "FrozenBN"))
    n = model.backbone.stem.conv1.norm
    assert isinstance(n, FrozenBN) and n.eps == 0.0
    assert torch.equal(n.running_mean, torch.zeros(64)) and torch.equal(n.running_var, torch.ones(64))
    s, b = n.scale_shift()
    assert torch.equal(s, n.weight) and torch.equal(b, n.bias)


@pytest.mark.parametrize(
    "variant,opts,match",
    [
        ("R-50-FPN_gn", ["MODEL.NORM", "FrozenBN"], "GroupNorm model .conv1_gn_s. but MODEL.NORM is FrozenBN"),
        ("R-50-FPN", ["MODEL.NORM", "GN"], "frozen-BN model .res_conv1_bn_s. but MODEL.NORM is GN"),
        ("R-101-FPN", ["MODEL.RESNETS.DEPTH", 50], r"ResNet-101 \(res4 has 23 blocks\).*MODEL.RESNETS.DEPTH 101"),
        ("R-50-FPN_gn", ["MODEL.ROI_BOX_HEAD.NUM_CONV", 0, "MODEL.ROI_BOX_HEAD.NUM_FC", 2], "4conv1fc"),
    ],
)
def test_checkpoint_config_mismatch_is_named(pkl_files, variant, opts, match):
    with pytest.raises(CheckpointError, match=match):
        minidet.prepare_model(_cfg(variant, pkl_files[variant], *opts))


def test_the_class_count_is_the_checkpoints(pkl_files):
    """MODEL.ROI_HEADS.NUM_CLASSES belongs to the weights: the checkpoint's class logits decide it."""
    model, _ = minidet.prepare_model(_cfg("R-50-FPN", pkl_files["R-50-FPN"], "MODEL.ROI_HEADS.NUM_CLASSES", 91))
    assert model.box_predictor.cls_score.out_features == 81


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_code_execution_payload_is_refused(tmp_path):
    marker = tmp_path / "ran"
    p = tmp_path / "evil.pkl"
    blobs = {"conv1_w": np.zeros((1,), np.float32), "evil": _Payload(str(marker))}
    p.write_bytes(pickle.dumps({"blobs": blobs}, protocol=2))
    with pytest.raises(CheckpointError, match=r"evil.pkl: refused: the pickle asks for (posix|os)\.system"):
        read_pickle_file(str(p))
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"\x80\x02}q\x00(U\x05blobs", b"not a pickle at all"])
def test_corrupt_pkl_one_line_error(tmp_path, content):
    p = tmp_path / "bad.pkl"
    p.write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        read_pickle_file(str(p))
    assert "bad.pkl" in str(e.value) and "\n" not in str(e.value)


def test_detectron2_pickle_is_told_apart(tmp_path):
    p = tmp_path / "model_final_f10217.pkl"
    with open(p, "wb") as f:
        pickle.dump({"model": {"stem.conv1.weight": np.zeros(1, np.float32)}, "__author__": "x"}, f)
    assert set(read_pickle_file(str(p))) == {"stem.conv1.weight"}  # the 'model' dict, not blobs


# ------------------------------------------------------------------------------- whole model


@pytest.mark.slow
def test_bn_checkpoint_same_detections_for_every_frozen_norm(pkl_files):
    imgs = [structured_image(240, 320, 0), structured_image(300, 200, 1)]
    # the norm's form is the subject, not the caps: FEWER's
    ref = minidet.Predictor(_cfg("R-50-FPN", pkl_files["R-50-FPN"], *FEWER)).predict_batch(imgs)
    assert all(len(r["boxes"]) > 20 for r in ref)
    for norm, fold in [("FrozenBN", False), ("FrozenBN", True), ("Affine", True)]:
        p = minidet.Predictor(_cfg("R-50-FPN", pkl_files["R-50-FPN"], *FEWER, "MODEL.NORM", norm, "MODEL.FOLD_NORM",
                                   fold))
        for out, r in zip(p.predict_batch(imgs), ref):
            assert_same_detections(out, r)


@pytest.mark.slow
def test_gn_model_runs_and_maps_categories(pkl_files):
    p = minidet.Predictor(_cfg("R-50-FPN_gn", pkl_files["R-50-FPN_gn"]))
    out = p(structured_image(200, 260, 4))
    assert len(out["boxes"]) > 0 and p.box_offset == 1
    assert p.class_names[1] == "person" and p.class_names[80] == "toothbrush"
    ids = minidet.categories.category_ids("coco81")
    assert out["category_ids"].tolist() == [ids[i] for i in out["labels"].tolist()]
    assert (out["boxes"][:, 2] <= 259).all() and (out["boxes"][:, 3] <= 199).all()  # clipped to W-1, H-1


# ------------------------------------------------------------------------------- conventions


def test_anchors_match_detectrons_generate_anchors():
    """Values from shared/reference/checkpoints.md §3.5 (Detectron's algorithm, run there)."""
    table = {
        4: [[-22, -10, 25, 13], [-14, -14, 17, 17], [-10, -22, 13, 25]],
        64: [[-332, -152, 395, 215], [-224, -224, 287, 287], [-148, -328, 211, 391]],
    }
    for stride, expected in table.items():
        size = 32 * stride // 4
        assert detectron_cell_anchors(size, (0.5, 1.0, 2.0), stride).tolist() == expected


def test_plus_one_decode_and_clip():
    anchor = torch.tensor([[0.0, 0.0, 9.0, 9.0]])  # width 10 with +1
    zero = torch.zeros(1, 4)
    assert decode_boxes(zero, anchor, (1, 1, 1, 1), offset=1).tolist() == [[0, 0, 9, 9]]
    d = torch.tensor([[0.0, 0.0, float(np.log(2)), 0.0]])
    # w = 20 around ctr 5: x1 = 5 - 10, x2 = 5 + 10 - 1
    assert decode_boxes(d, anchor, (1, 1, 1, 1), offset=1).tolist() == [[-5, 0, 14, 9]]
    assert decode_boxes(d, anchor, (1, 1, 1, 1), offset=0).tolist() == [[-4.5, 0, 13.5, 9]]
    b = torch.tensor([[-3.0, -1.0, 120.0, 50.0]])
    assert clip_boxes(b, 40, 100, offset=1).tolist() == [[0, 0, 99, 39]]
    assert clip_boxes(b, 40, 100).tolist() == [[0, 0, 100, 40]]


def test_nms_tie_at_exactly_the_threshold():
    boxes = torch.tensor([[0.0, 0.0, 9.0, 9.0], [0.0, 0.0, 9.0, 4.0]])  # +1 IoU = 50 / 100 = 0.5
    scores, groups = torch.tensor([0.9, 0.8]), torch.zeros(2, dtype=torch.int64)
    assert batched_nms(boxes, scores, groups, 0.5, offset=1, inclusive=True, tv_tie_order=True).tolist() == [0]
    assert batched_nms(boxes, scores, groups, 0.5, offset=1, inclusive=False, tv_tie_order=True).tolist() == [0, 1]
    assert batched_nms(boxes, scores, groups, 0.5, tv_tie_order=True).tolist() == [0, 1]  # torchvision: 36 / 81
    for t in (0.3, 0.7, 0.55):  # the >= rewrite is exact around other thresholds too
        iou = torch.tensor(t, dtype=torch.float32)
        kept = batched_nms(boxes, scores, groups, float(iou), offset=1, inclusive=True, tv_tie_order=True).tolist()
        assert kept == ([0] if 0.5 >= float(iou) else [0, 1])


def test_level_assignment_at_the_boundary():
    b = torch.tensor([[0.0, 0.0, 223.0, 223.0], [0.0, 0.0, 222.0, 223.0], [0.0, 0.0, 447.0, 447.0]])
    assert detectron_levels(b, 2, 5).tolist() == [2, 1, 3]  # P4, P3, P5
    b = torch.tensor([[0.0, 0.0, 224.0, 224.0], [0.0, 0.0, 223.0, 224.0]])
    assert torchvision_levels(b, 2, 5).tolist() == [2, 1]


def _detectron_paste(mask28: np.ndarray, box: np.ndarray, h: int, w: int) -> np.ndarray:
    """Detectron's segm_results for one mask, step by step (cv2, as Detectron does it)."""
    scale = 30.0 / 28.0
    w_half, h_half = (box[2] - box[0]) * 0.5 * scale, (box[3] - box[1]) * 0.5 * scale
    x_c, y_c = (box[2] + box[0]) * 0.5, (box[3] + box[1]) * 0.5
    ref = np.array([x_c - w_half, y_c - h_half, x_c + w_half, y_c + h_half]).astype(np.int32)
    padded = np.zeros((30, 30), np.float32)
    padded[1:-1, 1:-1] = mask28
    bw, bh = max(ref[2] - ref[0] + 1, 1), max(ref[3] - ref[1] + 1, 1)
    m = (cv2.resize(padded, (int(bw), int(bh))) > 0.5).astype(np.uint8)
    out = np.zeros((h, w), np.uint8)
    x0, x1 = max(ref[0], 0), min(ref[2] + 1, w)
    y0, y1 = max(ref[1], 0), min(ref[3] + 1, h)
    out[y0:y1, x0:x1] = m[(y0 - ref[1]) : (y1 - ref[1]), (x0 - ref[0]) : (x1 - ref[0])]
    return out.astype(bool)


def test_mask_paste_matches_detectrons_definition():
    rng = np.random.default_rng(0)
    masks = torch.from_numpy(rng.uniform(0, 1, (6, 28, 28)).astype(np.float32))
    boxes = torch.tensor(
        [
            [10, 20, 37, 47],
            [0.4, 0.2, 5.3, 3.1],
            [50.5, 10.2, 99.9, 79.5],
            [-5, -8, 30, 12],
            [90, 60, 130, 95],
            [33.3, 44.4, 33.9, 44.9],
        ],
        dtype=torch.float32,
    )
    ours = paste_masks(masks, boxes, 80, 100).numpy()
    for i in range(len(boxes)):
        ref = _detectron_paste(masks[i].numpy(), boxes[i].numpy(), 80, 100)
        assert (ours[i] != ref).sum() <= 1, f"mask {i}: {(ours[i] != ref).sum()} pixels differ"


def test_detection_cap_keeps_score_ties():
    """Detectron keeps every detection scoring >= the 100th best; torchvision cuts at 100."""
    n = 120
    props = [
        torch.stack([torch.arange(n) * 20.0, torch.zeros(n), torch.arange(n) * 20.0 + 10, torch.full((n,), 10.0)], 1)
    ]
    logits = torch.full((n, 3), -10.0)
    logits[:, 1] = 5.0  # every proposal: class 1, identical scores
    deltas = torch.zeros(n, 12)
    images = ImageBatch(torch.zeros(1, 3, 20, 2600), [(20, 2600)], [(20, 2600)], [1.0])
    legacy = BoxPredictor(4, 3, box_rule=BoxRule(1, True), ties_at_cap=True, original_frame=True)
    assert len(legacy.inference(logits, deltas, props, images)[0].boxes) == n
    tv = BoxPredictor(4, 3, min_box_size=1e-2)
    assert len(tv.inference(logits, deltas, props, images)[0].boxes) == 100


def test_preprocess_is_detectrons_blob():
    """BGR float minus mean, cv2 resize with rounded size (480x640 -> 800x1067), zero padding."""
    model = minidet.build_model(config("configs/detectron/e2e_mask_rcnn_R-50-FPN_1x.yaml"))
    img = structured_image(480, 640, 7)
    batch, sizes, orig, scales = model.preprocess([img])
    assert sizes == [(800, 1067)] and orig == [(480, 640)] and scales == [800 / 480]
    ref = img.astype(np.float32) - np.array([[[102.9801, 115.9465, 122.7717]]], np.float32)
    ref = cv2.resize(ref, None, None, fx=800 / 480, fy=800 / 480, interpolation=cv2.INTER_LINEAR)
    assert torch.equal(batch[0, :, :800, :1067], torch.from_numpy(ref).permute(2, 0, 1))
    assert batch.shape[-2:] == (800, 1088) and batch[0, :, :, 1067:].abs().max() == 0


@pytest.mark.slow
def test_resnext_grouped_convs_load(tmp_path):
    """ResNeXt files use the same blob names; the 3x3 convs are grouped (32 groups of width 2
    here, so the R-101 blob list keeps its other shapes)."""
    path = tmp_path / "x101.pkl"
    write_detectron_pkl(str(path), make_blobs("R-101-FPN", seed=3, num_groups=32))
    opts = ["MODEL.RESNETS.NUM_GROUPS", 32, "MODEL.RESNETS.WIDTH_PER_GROUP", 2, "MODEL.RESNETS.STRIDE_IN_1X1", False]
    model, report = minidet.prepare_model(_cfg("R-101-FPN", path, *opts))
    assert not report.missing and not report.unexpected
    assert model.backbone.res4[7].conv2.groups == 32 and model.backbone.res4[7].conv2.weight.shape[1] == 8
    grouped = "res2_0_branch2b_w is a 3x3 conv of 32 groups of 2 .*NUM_GROUPS 32 and WIDTH_PER_GROUP 2"
    with pytest.raises(CheckpointError, match=grouped):
        minidet.prepare_model(_cfg("R-101-FPN", path))
    for name in ("X-101-64x4d", "X-101-32x8d"):
        m = minidet.build_model(config(f"configs/detectron/e2e_mask_rcnn_{name}-FPN_1x.yaml"))
        groups, width = (64, 4) if "64x4d" in name else (32, 8)
        assert m.backbone.res2[0].conv2.groups == groups and m.backbone.res2[0].conv2.out_channels == groups * width


def test_legacy_rpn_filters_like_detectron():
    """Clip to the padded input with [0, W-1]; keep boxes >= 1 original pixel with the centre inside."""
    from minidet.heads.rpn import RPN

    detectron = {"box_rule": BoxRule(1, True), "clip_to_padded": True, "topk_per_level": True}
    rpn = RPN(8, [32], [1.0], min_size=0.0, post_nms_topk=10, proposal_filter=keep_original_pixels, **detectron)
    boxes = torch.tensor(
        [
            [-10.0, -10.0, 50.0, 40.0],
            [100.0, 100.0, 100.2, 140.0],
            [60.0, 5.0, 200.0, 30.0],
            [10.0, 10.0, 10.5, 11.0],
            [30.0, 30.0, 29.0, 40.0],
        ]
    )
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5])
    levels = torch.zeros(5, dtype=torch.int64)
    out = rpn.select_image(boxes, scores, levels, (64, 96), (64, 96), scale=2.0)
    # box 0 clipped to [0, 0, 50, 40]; box 1 clipped to the corner [95, 63, 95, 63]: +1 sizes make
    # it one pixel, kept; box 2 clipped to x2 = 95; box 3 is 0.5 px wide -> 0.25 + 1 >= 1: kept;
    # box 4 has x2 = x1 - 1 -> -0.5 + 1 < 1 original pixel: dropped
    assert out.tolist() == [[0, 0, 50, 40], [95, 63, 95, 63], [60, 5, 95, 30], [10, 10, 10.5, 11]]
