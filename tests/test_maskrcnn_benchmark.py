"""maskrcnn-benchmark (MB) / MLPerf checkpoints and MB's test-time arithmetic (MODEL.CONVENTION
maskrcnn_benchmark). Each MB rule is checked on its own against a restatement of MB's source
(the ``_mb_*`` functions below, written from MB's code as described in its modules
``data/transforms``, ``layers/batch_norm.py``, ``modeling/box_coder.py``, ``structures/bounding_box.py``,
``structures/boxlist_ops.py``, ``modeling/rpn/inference.py``, ``modeling/poolers.py``,
``modeling/roi_heads/box_head/inference.py`` and ``modeling/roi_heads/mask_head/inference.py``).
"""

import logging
import math
import os
import re
from collections import OrderedDict

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn import functional as F

import minidet
from helpers import FEWER, ROOT, config, images_bgr, run_tool
from minidet.apps.compare import assert_norm_forms_agree
from minidet.apps.evaluation import instances_to_coco
from minidet.apps.synthetic import structured_image
from minidet.boxes import BoxRule
from minidet.checkpoint import CheckpointError
from minidet.families import FAMILIES
from minidet.families import maskrcnn_benchmark as mb_family
from minidet.heads.detections import Detections
from minidet.heads.rpn import keep_min_size_inclusive
from minidet.norm import FrozenBN
from minidet.poolers import detectron_levels
from minidet.testing.checkpoints import (
    REFERENCE,
    d2_state_shapes,
    make_blobs,
    mb_cell_anchors,
    mb_state_shapes,
    mb_weights,
    write_detectron_pkl,
    write_mb_checkpoint,
)
from minidet.transform import ImageBatch, mb_size, paste_masks, resize_pil_mb

SIZE = ["INPUT.MIN_SIZE_TEST", 320, "INPUT.MAX_SIZE_TEST", 512]
MB_MEAN = [102.9801, 115.9465, 122.7717]  # MB's PIXEL_MEAN (BGR, 0-255), PIXEL_STD 1
BBOX_XFORM_CLIP = math.log(1000.0 / 16)  # BoxCoder's clamp of dw, dh
# config name (configs/maskrcnn_benchmark/e2e_mask_rcnn_<name>.yaml) -> mb_state_shapes arguments
VARIANTS = {
    "R_50_FPN_1x": {},
    "R_101_FPN_1x": {"depth": 101},
    "X_101_32x8d_FPN_1x": {"depth": 101, "num_groups": 32, "width_per_group": 8},
    "R_50_FPN_1x_gn": {"gn": True},
    "R_50_FPN_Xconv1fc_1x_gn": {"gn": True, "box_head": "xconv1fc"},
}
LARGE = ("R_101_FPN_1x", "X_101_32x8d_FPN_1x")
TINY = ROOT.parent / "shared" / "data" / "coco_tiny" / "val2017"


def _cfg(variant, weights, *opts):
    return config(f"configs/maskrcnn_benchmark/e2e_mask_rcnn_{variant}.yaml", *SIZE, *opts, weights=weights)


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.fixture(scope="module")
def mb_files(tmp_path_factory):
    """variant -> (path, state): the small variants' MB training checkpoints (``module.`` keys,
    optimizer/scheduler/iteration, PyTorch 1.0 pre-zip format), each written once."""
    d = tmp_path_factory.mktemp("mb")
    made = {}

    def get(variant):
        if variant not in made:
            state = mb_weights(mb_state_shapes(**VARIANTS[variant]), seed=len(made))
            path = d / f"e2e_mask_rcnn_{variant}.pth"
            write_mb_checkpoint(str(path), state)
            made[variant] = (path, state)
        return made[variant]

    return get


@pytest.fixture(scope="module")
def mb_model():
    """The R-50 model as MB's config builds it (random weights): its RPN and box predictor."""
    return minidet.build_model(_cfg("R_50_FPN_1x", ""))


# ------------------------------------------------------------------------- MB's rules, restated


def _mb_decode(rel_codes, boxes, weights, clip=BBOX_XFORM_CLIP):
    """BoxCoder.decode: TO_REMOVE = 1 widths, centre at x1 + w / 2, x2 = centre + w / 2 - 1."""
    boxes = boxes.to(rel_codes.dtype)
    widths = boxes[:, 2] - boxes[:, 0] + 1
    heights = boxes[:, 3] - boxes[:, 1] + 1
    ctr_x = boxes[:, 0] + 0.5 * widths
    ctr_y = boxes[:, 1] + 0.5 * heights
    wx, wy, ww, wh = weights
    dx = rel_codes[:, 0::4] / wx
    dy = rel_codes[:, 1::4] / wy
    dw = torch.clamp(rel_codes[:, 2::4] / ww, max=clip)
    dh = torch.clamp(rel_codes[:, 3::4] / wh, max=clip)
    pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
    pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
    pred_w = torch.exp(dw) * widths[:, None]
    pred_h = torch.exp(dh) * heights[:, None]
    out = torch.zeros_like(rel_codes)
    out[:, 0::4] = pred_ctr_x - 0.5 * pred_w
    out[:, 1::4] = pred_ctr_y - 0.5 * pred_h
    out[:, 2::4] = pred_ctr_x + 0.5 * pred_w - 1
    out[:, 3::4] = pred_ctr_y + 0.5 * pred_h - 1
    return out


def _mb_clip(boxes, h, w):
    """BoxList.clip_to_image(remove_empty=False): x in [0, w - 1], y in [0, h - 1]."""
    out = boxes.clone()
    out[:, 0].clamp_(min=0, max=w - 1)
    out[:, 1].clamp_(min=0, max=h - 1)
    out[:, 2].clamp_(min=0, max=w - 1)
    out[:, 3].clamp_(min=0, max=h - 1)
    return out


def _mb_remove_small(boxes, min_size):
    """remove_small_boxes: the xywh sizes (x2 - x1 + 1) both >= min_size -> kept indices."""
    ws = boxes[:, 2] - boxes[:, 0] + 1
    hs = boxes[:, 3] - boxes[:, 1] + 1
    return ((ws >= min_size) & (hs >= min_size)).nonzero().squeeze(1)


def _mb_iou(boxes):
    """The CUDA kernel's devIoU for every pair, float32: +1 sizes, inter / (Sa + Sb - inter)."""
    x1, y1, x2, y2 = boxes.unbind(1)
    left, right = torch.maximum(x1[:, None], x1[None]), torch.minimum(x2[:, None], x2[None])
    top, bottom = torch.maximum(y1[:, None], y1[None]), torch.minimum(y2[:, None], y2[None])
    inter = (right - left + 1).clamp(min=0) * (bottom - top + 1).clamp(min=0)
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    return inter / (area[:, None] + area[None] - inter)


def _mb_nms(boxes, scores, thresh):
    """MB's CUDA NMS: greedy by decreasing score, a box suppresses later ones with IoU > thresh
    (float compare); the kept indices come back in index order."""
    if len(boxes) == 0:
        return torch.zeros(0, dtype=torch.int64)
    iou = _mb_iou(boxes).numpy()
    order = torch.argsort(scores, descending=True, stable=True).tolist()
    suppressed = np.zeros(len(boxes), bool)
    kept = []
    t = np.float32(thresh)
    for i in order:
        if suppressed[i]:
            continue
        kept.append(i)
        suppressed |= iou[i] > t
    return torch.tensor(sorted(kept), dtype=torch.int64)


def _mb_grid_anchors(cell, h, w, stride):
    """AnchorGenerator.grid_anchors: float shifts at the fixed stride, (H, W, A) order."""
    sx = torch.arange(0, w * stride, step=stride, dtype=torch.float32)
    sy = torch.arange(0, h * stride, step=stride, dtype=torch.float32)
    yy, xx = torch.meshgrid(sy, sx, indexing="ij")
    xx, yy = xx.reshape(-1), yy.reshape(-1)
    shifts = torch.stack((xx, yy, xx, yy), dim=1)
    return (shifts.view(-1, 1, 4) + cell.view(1, -1, 4)).reshape(-1, 4)


def _mb_rpn(logits, deltas, image_sizes, pre_nms=1000, post_nms=1000, fpn_post_nms=1000, nms=0.7, min_size=0):
    """RPNPostProcessor at test time with FPN: per level sigmoid, topk(pre_nms, sorted), decode the
    chosen deltas against their anchors, clip, remove_small_boxes, NMS, keep[:post_nms]; per image
    the levels concatenated and topk(fpn_post_nms) by objectness."""
    n = logits[0].shape[0]
    levels = [[] for _ in range(n)]
    for lvl, (obj, reg) in enumerate(zip(logits, deltas)):
        _, a, h, w = obj.shape
        stride = 4 * 2**lvl
        cell = torch.from_numpy(mb_cell_anchors(stride, 32 * 2**lvl))
        anchors = _mb_grid_anchors(cell, h, w, stride)
        obj = obj.view(n, -1, 1, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1).sigmoid()
        reg = reg.view(n, -1, 4, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, 4)
        k = min(pre_nms, a * h * w)
        obj, idx = obj.topk(k, dim=1, sorted=True)
        for i, (ih, iw) in enumerate(image_sizes):
            props = _mb_clip(_mb_decode(reg[i, idx[i]], anchors[idx[i]], (1.0, 1.0, 1.0, 1.0)), ih, iw)
            keep = _mb_remove_small(props, min_size)
            props, s = props[keep], obj[i][keep]
            keep = _mb_nms(props, s, nms)[:post_nms]
            levels[i].append((props[keep], s[keep]))
    out = []
    for per_level in levels:
        boxes, scores = torch.cat([b for b, _ in per_level]), torch.cat([s for _, s in per_level])
        _, order = scores.topk(min(fpn_post_nms, len(scores)), sorted=True)
        out.append(boxes[order])
    return out


def _mb_box_post(logits, deltas, proposals, sizes, score_thresh=0.05, nms=0.5, cap=100):
    """PostProcessor: softmax, decode (10, 10, 5, 5) in the resized frame, clip, per class j >= 1
    scores > score_thresh and NMS, classes concatenated, then above ``cap`` detections keep
    scores >= kthvalue(scores, n - cap + 1). Per image (boxes, scores, labels, count before the cap)."""
    prob = F.softmax(logits, -1)
    k = prob.shape[1]
    decoded = _mb_decode(deltas.view(len(logits), -1), torch.cat(proposals), (10.0, 10.0, 5.0, 5.0))
    out, start = [], 0
    for props, (h, w) in zip(proposals, sizes):
        end = start + len(props)
        boxes = _mb_clip(decoded[start:end].reshape(-1, 4), h, w).reshape(-1, k * 4)
        scores = prob[start:end]
        start = end
        bs, ss, ls = [], [], []
        for j in range(1, k):
            inds = (scores[:, j] > score_thresh).nonzero().squeeze(1)
            s, b = scores[inds, j], boxes[inds, j * 4 : (j + 1) * 4]
            keep = _mb_nms(b, s, nms)
            bs.append(b[keep]), ss.append(s[keep]), ls.append(torch.full((len(keep),), j, dtype=torch.int64))
        b, s, lab = torch.cat(bs), torch.cat(ss), torch.cat(ls)
        n = len(s)
        if n > cap:
            thresh, _ = torch.kthvalue(s, n - cap + 1)
            keep = torch.nonzero(s >= thresh.item()).squeeze(1)
            b, s, lab = b[keep], s[keep], lab[keep]
        out.append((b, s, lab, n))
    return out


def _mb_levels(boxes, k_min=2, k_max=5, s0=224, lvl0=4, eps=1e-6):
    """LevelMapper: sqrt of the +1 area, floor(lvl0 + log2(s / s0 + eps)), clamped, minus k_min."""
    s = torch.sqrt((boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1))
    lvl = torch.floor(lvl0 + torch.log2(s / s0 + eps))
    return torch.clamp(lvl, min=k_min, max=k_max).to(torch.int64) - k_min


def _mb_paste(mask, box, im_h, im_w, thresh=0.5, padding=1):
    """Masker's paste_mask_in_image for one (M, M) mask: pad by one, expand the box by (M + 2) / M,
    int32 box, bilinear resize to its +1 size, > thresh, placed clipped to the image."""
    m = mask.shape[-1]
    scale = float(m + 2 * padding) / m
    padded = mask.new_zeros((1, 1, m + 2 * padding, m + 2 * padding))
    padded[:, :, padding:-padding, padding:-padding] = mask
    w_half = (box[2] - box[0]) * 0.5
    h_half = (box[3] - box[1]) * 0.5
    x_c = (box[2] + box[0]) * 0.5
    y_c = (box[3] + box[1]) * 0.5
    w_half *= scale
    h_half *= scale
    b = torch.stack([x_c - w_half, y_c - h_half, x_c + w_half, y_c + h_half]).to(torch.int32).tolist()
    w, h = max(b[2] - b[0] + 1, 1), max(b[3] - b[1] + 1, 1)
    res = F.interpolate(padded, size=(h, w), mode="bilinear", align_corners=False)[0, 0] > thresh
    out = torch.zeros((im_h, im_w), dtype=torch.bool)
    x0, x1 = max(b[0], 0), min(b[2] + 1, im_w)
    y0, y1 = max(b[1], 0), min(b[3] + 1, im_h)
    out[y0:y1, x0:x1] = res[y0 - b[1] : y1 - b[1], x0 - b[0] : x1 - b[0]]
    return out


def _mb_frozen_bn(x, weight, bias, running_mean, running_var):
    """FrozenBatchNorm2d: no eps."""
    scale = weight * running_var.rsqrt()
    bias = bias - running_mean * scale
    return x * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)


def _mb_get_size(h, w, min_size, max_size):
    """Resize.get_size for a PIL image of size (w, h) -> (oh, ow)."""
    size = min_size
    mn, mx = float(min(w, h)), float(max(w, h))
    if mx / mn * size > max_size:
        size = int(round(max_size * mn / mx))
    if (w <= h and w == size) or (h <= w and h == size):
        return h, w
    if w < h:
        ow = size
        oh = int(size * h / w)
    else:
        oh = size
        ow = int(size * w / h)
    return oh, ow


def _mb_preprocess(bgr, min_size, max_size):
    """The test transforms on the RGB PIL image: Resize (PIL bilinear), ToTensor, to_bgr255, Normalize."""
    pil = Image.fromarray(np.ascontiguousarray(bgr[:, :, ::-1]))  # MB reads images as RGB
    oh, ow = _mb_get_size(bgr.shape[0], bgr.shape[1], min_size, max_size)
    pil = pil.resize((ow, oh), Image.BILINEAR)
    x = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float().div(255)  # ToTensor
    x = x[[2, 1, 0]] * 255  # to_bgr255
    mean, std = torch.tensor(MB_MEAN), torch.ones(3)
    return (x - mean[:, None, None]) / std[:, None, None]


def _mb_to_minidet(name, gn):
    """MB's module names -> minidet's (each module's place in both trees), restated; None for the anchors."""
    if ".cell_anchors." in name:
        return None
    m = re.match(r"backbone\.body\.stem\.(conv1|bn1)\.(\w+)$", name)
    if m:
        return "backbone.stem.conv1." + ("norm." if m[1] == "bn1" else "") + m[2]
    m = re.match(r"backbone\.body\.layer(\d)\.(\d+)\.(conv|bn)(\d)\.(\w+)$", name)
    if m:
        return f"backbone.res{int(m[1]) + 1}.{m[2]}.conv{m[4]}." + ("norm." if m[3] == "bn" else "") + m[5]
    m = re.match(r"backbone\.body\.layer(\d)\.0\.downsample\.([01])\.(\w+)$", name)
    if m:
        return f"backbone.res{int(m[1]) + 1}.0.shortcut." + ("norm." if m[2] == "1" else "") + m[3]
    m = re.match(r"backbone\.fpn\.fpn_(inner|layer)(\d)\.(?:([01])\.)?(\w+)$", name)
    if m:
        kind = "lateral" if m[1] == "inner" else "output"
        return f"fpn.{kind}{int(m[2]) + 1}." + ("norm." if m[3] == "1" else "") + m[4]
    m = re.match(r"rpn\.head\.(conv|cls_logits|bbox_pred)\.(\w+)$", name)
    if m:
        head = {"conv": "convs.0", "cls_logits": "objectness_logits", "bbox_pred": "anchor_deltas"}
        return f"rpn.head.{head[m[1]]}.{m[2]}"
    m = re.match(r"roi_heads\.box\.feature_extractor\.fc([67])\.(?:([01])\.)?(\w+)$", name)
    if m:
        return f"box_head.fc{int(m[1]) - 5}" + ("_norm." if m[2] == "1" else ".") + m[3]
    m = re.match(r"roi_heads\.box\.feature_extractor\.xconvs\.(\d+)\.(\w+)$", name)
    if m:  # Sequential of conv, (GN,) ReLU per layer
        j, r = divmod(int(m[1]), 3 if gn else 2)
        return f"box_head.conv{j + 1}." + ("norm." if r == 1 else "") + m[2]
    m = re.match(r"roi_heads\.box\.predictor\.(cls_score|bbox_pred)\.(\w+)$", name)
    if m:
        return f"box_predictor.{m[1]}.{m[2]}"
    m = re.match(r"roi_heads\.mask\.feature_extractor\.mask_fcn(\d)\.(?:([01])\.)?(\w+)$", name)
    if m:
        return f"mask_head.mask_fcn{m[1]}." + ("norm." if m[2] == "1" else "") + m[3]
    m = re.match(r"roi_heads\.mask\.predictor\.(conv5_mask|mask_fcn_logits)\.(\w+)$", name)
    if m:
        return "mask_head." + ("deconv" if m[1] == "conv5_mask" else "predictor") + "." + m[2]
    raise AssertionError(f"no MB module for {name}")


def _sorted_rows(t: torch.Tensor) -> list:
    return sorted(map(tuple, t.tolist()))


# ------------------------------------------------------------------------------- files and names


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_mb_name_loads_where_mb_has_it(mb_files, tmp_path, variant):
    if variant in LARGE:  # written here, not kept for the module
        state = mb_weights(mb_state_shapes(**VARIANTS[variant]), seed=7)
        path = tmp_path / f"e2e_mask_rcnn_{variant}.pth"
        write_mb_checkpoint(str(path), state, trainer_state=False)
    else:
        path, state = mb_files(variant)
    model, report = minidet.prepare_model(_cfg(variant, path))
    assert report.format == "maskrcnn_benchmark"
    assert not report.missing and not report.unexpected and not report.mismatched, str(report)
    assert report.loaded == len(state) - 5  # all but the five cell anchors
    gn = VARIANTS[variant].get("gn", False)
    ours = model.state_dict()
    for k, v in state.items():  # every value where MB's module tree has it (same shapes could be swapped)
        name = _mb_to_minidet(k, gn)
        if name is not None:
            assert torch.equal(ours[name], v), f"{k} -> {name}"
    if not gn:
        norm = model.backbone.res3[1].conv2.norm
        assert isinstance(norm, FrozenBN) and norm.eps == 0.0
    else:
        assert isinstance(model.backbone.res3[1].conv2.norm, torch.nn.GroupNorm)
    del state, model


@pytest.mark.parametrize("variant", ["R_50_FPN_1x", "R_50_FPN_1x_gn", "R_50_FPN_Xconv1fc_1x_gn"])
def test_renamer_against_mb_module_tree(variant):
    shapes = mb_state_shapes(**VARIANTS[variant])
    assert mb_family.recognize(list(shapes)) is not None
    rename = mb_family.renamer(list(shapes))
    gn = VARIANTS[variant].get("gn", False)
    renamed = {}
    for k in shapes:
        assert rename(k) == _mb_to_minidet(k, gn), k
        if rename(k) is not None:
            renamed[rename(k)] = shapes[k]
    assert [rename(f"rpn.anchor_generator.cell_anchors.{j}") for j in range(5)] == [None] * 5
    model = minidet.build_model(_cfg(variant, ""))
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == renamed


def test_other_families_are_not_mb():
    tv = [ln.split()[0] for ln in open(os.path.join(REFERENCE, "torchvision_maskrcnn_resnet50_fpn.keys.txt"))
          if ln.strip() and not ln.startswith("#")]
    assert mb_family.recognize(tv) is None
    assert mb_family.recognize(list(d2_state_shapes(50))) is None
    assert mb_family.recognize(["conv1_w", "res2_0_branch2a_w", "fpn_inner_res5_2_sum_w"]) is None


def test_stored_anchors_are_mbs_and_minidets(mb_model):
    """The file's cell anchors (MB's generate_anchors) equal those minidet computes."""
    known = {4: [[-22, -10, 25, 13], [-14, -14, 17, 17], [-10, -22, 13, 25]],  # Detectron's table, P2 and P6
             64: [[-332, -152, 395, 215], [-224, -224, 287, 287], [-148, -328, 211, 391]]}
    for stride, rows in known.items():
        assert mb_cell_anchors(stride, 8 * stride).tolist() == rows
    for j in range(5):
        assert torch.equal(mb_model.rpn.cell_anchors[j], torch.from_numpy(mb_cell_anchors(4 * 2**j, 32 * 2**j)))


@pytest.mark.slow
def test_unprefixed_zip_file_loads(mb_files, tmp_path):
    _, state = mb_files("R_50_FPN_1x")
    path = tmp_path / "plain.pth"
    write_mb_checkpoint(str(path), state, prefix="", trainer_state=False, legacy_format=False)
    _, report = minidet.prepare_model(_cfg("R_50_FPN_1x", path))
    assert report.format == "maskrcnn_benchmark" and not report.missing and not report.unexpected
    assert report.loaded == len(state) - 5


@pytest.mark.slow
def test_anchor_warning_only_when_the_file_differs(mb_files, tmp_path, caplog):
    path, state = mb_files("R_50_FPN_1x")
    with caplog.at_level(logging.WARNING, logger="minidet"):
        minidet.prepare_model(_cfg("R_50_FPN_1x", path))
    assert not [r for r in caplog.records if r.name.startswith("minidet") and r.levelno >= logging.WARNING]
    caplog.clear()
    changed = dict(state)
    changed["rpn.anchor_generator.cell_anchors.2"] = state["rpn.anchor_generator.cell_anchors.2"] + 1
    p = tmp_path / "anchors.pth"
    write_mb_checkpoint(str(p), changed, trainer_state=False)
    with caplog.at_level(logging.WARNING, logger="minidet"):
        minidet.prepare_model(_cfg("R_50_FPN_1x", p))
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("minidet") and r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "\n" not in warned[0], warned
    assert "rpn.anchor_generator.cell_anchors.2" in warned[0]
    assert "cell_anchors.0" not in warned[0] and "cell_anchors.1" not in warned[0]


# ------------------------------------------------------------------------------- wrong files


@pytest.mark.skipif(not os.path.isdir(REFERENCE), reason="needs ../shared/reference (blob lists)")
def test_detectron_pkl_under_mb_config(tmp_path):
    p = tmp_path / "model_final.pkl"
    write_detectron_pkl(str(p), make_blobs("R-50-FPN", seed=0))
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("R_50_FPN_1x", p))
    msg = _one_line(e)
    assert str(p) in msg and "MODEL.CONVENTION" in msg


def test_trainer_state_without_model(tmp_path):
    p = tmp_path / "trainer_only.pth"
    sgd = {"state": {0: {"momentum_buffer": torch.zeros(3)}}, "param_groups": [{"lr": 0.02, "params": [0]}]}
    torch.save({"optimizer": sgd, "scheduler": {"last_epoch": 90000}, "iteration": 90000}, p,
               _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("R_50_FPN_1x", p))
    msg = _one_line(e)
    assert str(p) in msg and "model" in msg.replace(str(p), "")


def test_gn_file_with_bn_config(mb_files):
    path, _ = mb_files("R_50_FPN_1x_gn")
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("R_50_FPN_1x", path))
    msg = _one_line(e)
    assert str(path) in msg and "MODEL.NORM" in msg and re.search(r"GroupNorm|GN", msg.replace(str(path), ""))
    assert "backbone.body.stem.bn1.{bias, weight}" in msg  # named as in the file


def test_module_prefix_on_all_keys_but_one(mb_files, tmp_path):
    _, state = mb_files("R_50_FPN_1x")
    odd = "rpn.head.conv.weight"
    sd = OrderedDict((k if k == odd else "module." + k, v) for k, v in state.items())
    p = tmp_path / "mixed.pth"
    torch.save({"model": sd, "iteration": 1}, p)
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("R_50_FPN_1x", p))
    msg = _one_line(e)
    assert str(p) in msg and "module." in msg and odd in msg


def test_frozen_bn_eps_other_than_zero_refused(mb_files):
    path, _ = mb_files("R_50_FPN_1x")
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("R_50_FPN_1x", path, "MODEL.FROZEN_BN_EPS", 1e-5))
    msg = _one_line(e)
    assert str(path) in msg and "MODEL.FROZEN_BN_EPS" in msg


class _TrainerConfig:
    """A Python object a trainer pickles beside the weights (torch's weights_only load refuses it)."""

    def __init__(self):
        self.solver = {"base_lr": 0.02}


@pytest.mark.slow
def test_python_object_in_checkpoint_and_extract_weights(mb_files, tmp_path):
    _, state = mb_files("R_50_FPN_1x")
    p = tmp_path / "with_cfg.pth"
    sd = OrderedDict(("module." + k, v) for k, v in state.items())
    torch.save({"model": sd, "cfg": _TrainerConfig(), "iteration": 90000}, p)
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("R_50_FPN_1x", p))
    msg = _one_line(e)
    assert str(p) in msg and "_TrainerConfig" in msg and "tools/extract_weights.py" in msg
    out = tmp_path / "weights.pth"
    r = run_tool(ROOT / "tools" / "extract_weights.py", str(p), str(out), cwd=tmp_path, threads=1)
    assert r.returncode == 0, r.stderr
    obj = torch.load(out, weights_only=True)
    assert list(obj) == ["model"]
    got = {k.removeprefix("module."): v for k, v in obj["model"].items()}  # with or without the prefix
    assert list(got) == list(state) and all(torch.equal(got[k], v) for k, v in state.items())
    _, report = minidet.prepare_model(_cfg("R_50_FPN_1x", out))
    assert not report.missing and not report.unexpected and report.loaded == len(state) - 5


# ------------------------------------------------------------------------------- preprocessing


def test_size_rule_is_get_size():
    # pinned by hand from get_size: the max-size branch rounds half to even (round(666.5) == 666,
    # round(160.5) == 160), the other side is truncated
    assert mb_size(200, 400, 800, 1333) == (666, 1332)
    assert mb_size(321, 1024, 320, 512) == (160, 510)
    assert mb_size(1000, 200, 800, 1333) == (1335, 267)  # round(266.6); the long side may pass max_size
    assert mb_size(333, 500, 800, 1333) == (800, 1201)
    assert mb_size(800, 1000, 800, 1333) == (800, 1000)  # already at the size
    assert mb_size(500, 500, 800, 1333) == (800, 800)
    shapes = [(333, 500), (481, 641), (799, 1201), (1000, 200), (200, 1000), (500, 500), (320, 400), (400, 320),
              (321, 1024), (200, 400), (427, 640), (640, 427), (1, 7), (3, 1000), (512, 320), (360, 577)]
    rng = np.random.default_rng(0)
    shapes += [tuple(int(v) for v in rng.integers(20, 2000, 2)) for _ in range(300)]
    for h, w in shapes:
        for lo, hi in ((800, 1333), (320, 512), (600, 1000)):
            assert mb_size(h, w, lo, hi) == _mb_get_size(h, w, lo, hi), (h, w, lo, hi)


@pytest.mark.parametrize("shape", [(333, 500), (481, 641), (200, 700), (320, 400), (300, 300)])
def test_resize_is_pils_rgb_resize_then_bgr255(mb_model, shape):
    img = structured_image(*shape, seed=sum(shape))
    ref = _mb_preprocess(img, 320, 512)
    x, scale = resize_pil_mb(mb_model.transform, img)
    assert x.dtype == torch.float32 and torch.equal(x, ref)
    batch, sizes, orig, _ = mb_model.preprocess([img])
    oh, ow = ref.shape[1:]
    assert sizes == [(oh, ow)] and orig == [shape]
    assert batch.shape[-2] % 32 == 0 and batch.shape[-1] % 32 == 0
    assert torch.equal(batch[0, :, :oh, :ow], ref)
    assert not batch[0, :, oh:].any() and not batch[0, :, :, ow:].any()  # zero padding


# ------------------------------------------------------------------------------- FrozenBN


@pytest.mark.slow
def test_frozen_bn_has_no_eps(mb_files):
    gen = torch.Generator().manual_seed(0)
    c = 32
    w, b = torch.rand(c, generator=gen) + 0.5, torch.randn(c, generator=gen)
    mean, var = torch.randn(c, generator=gen), torch.rand(c, generator=gen) * 1.5 + 0.5
    x = torch.randn(2, c, 11, 13, generator=gen) * 4
    ref = _mb_frozen_bn(x, w, b, mean, var)
    ours = FrozenBN(c, eps=0.0)
    ours.load_stats(w, b, mean, var, 0.0)
    assert torch.equal(ours(x), ref)
    with_eps = FrozenBN(c)
    with_eps.load_stats(w, b, mean, var, 1e-5)
    assert (with_eps(x) - ref).abs().max() > 1e-6  # an eps of 1e-5 is visible
    # the loaded model: the file's statistics, eps 0, MB's values
    path, state = mb_files("R_50_FPN_1x")
    model, _ = minidet.prepare_model(_cfg("R_50_FPN_1x", path))
    norm = model.backbone.res3[1].conv2.norm
    x = torch.randn(1, 128, 9, 9, generator=gen)
    stats = [state[f"backbone.body.layer2.1.bn2.{s}"] for s in ("weight", "bias", "running_mean", "running_var")]
    assert torch.equal(norm(x), _mb_frozen_bn(x, *stats))


# ------------------------------------------------------------------------------- box rules


def test_decode_clip_and_small_boxes_are_mbs():
    gen = torch.Generator().manual_seed(1)
    boxes = torch.rand(500, 2, generator=gen) * 300
    boxes = torch.cat([boxes, boxes + torch.rand(500, 2, generator=gen) * 120], 1)
    deltas = torch.randn(500, 8, generator=gen) * 2
    deltas[:20, 2::4] = 7.0  # past the log(1000 / 16) clamp
    rule = BoxRule(1, False)
    for weights in ((1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0)):
        ours = rule.decode(deltas, boxes, weights)
        assert torch.equal(ours, _mb_decode(deltas, boxes, weights))
        clipped = rule.clip(ours, 240, 320)
        ref = torch.cat([_mb_clip(ours[:, :4], 240, 320), _mb_clip(ours[:, 4:], 240, 320)], 1)
        assert torch.equal(clipped, ref)
    small = torch.tensor([[5.0, 5.0, 3.5, 9.0], [5.0, 5.0, 4.0, 9.0], [5.0, 5.0, 4.5, 9.0], [5.0, 5.0, 5.0, 5.0],
                          [5.0, 5.0, 5.5, 6.0], [0.0, 0.0, 1.0, 0.0]])
    for min_size in (0.0, 0.5, 1.0, 2.0):
        keep = torch.zeros(len(small), dtype=torch.bool)
        keep[_mb_remove_small(small, min_size)] = True
        assert torch.equal(keep_min_size_inclusive(small, min_size, 1.0, (64, 64)), keep), min_size
    assert keep_min_size_inclusive(small, 0.0, 1.0, (64, 64)).tolist() == [False, True, True, True, True, True]


def test_level_mapping_at_the_boundaries():
    sides = [(223, 223), (222, 223), (224, 224), (111, 111), (110, 111), (112, 112), (447, 447), (446, 447),
             (448, 448), (0, 0), (30, 30), (2000, 2000), (55, 55), (54, 55), (895, 895)]
    boxes = torch.tensor([[10.0, 20.0, 10.0 + a, 20.0 + b] for a, b in sides])
    ref = _mb_levels(boxes)
    # sqrt(+1 area) 224 -> P4, 112 -> P3, 448 -> P5; a pixel less -> the level below
    assert ref[:9].tolist() == [2, 1, 2, 1, 0, 1, 3, 2, 3]
    assert torch.equal(detectron_levels(boxes, 2, 5), ref)
    gen = torch.Generator().manual_seed(2)
    xy = torch.rand(2000, 2, generator=gen) * 500
    boxes = torch.cat([xy, xy + torch.rand(2000, 2, generator=gen) ** 2 * 700], 1)
    assert torch.equal(detectron_levels(boxes, 2, 5), _mb_levels(boxes))


def test_nms_at_exactly_the_threshold_keeps_both():
    boxes = torch.tensor([[0.0, 0.0, 9.0, 9.0], [0.0, 0.0, 9.0, 4.0]])  # +1 areas 100 and 50: IoU exactly 0.5
    assert float(_mb_iou(boxes)[0, 1]) == 0.5
    scores, groups = torch.tensor([0.9, 0.8]), torch.zeros(2, dtype=torch.int64)
    assert _mb_nms(boxes, scores, 0.5).tolist() == [0, 1]  # the CUDA kernel: suppress only at IoU > 0.5
    assert sorted(BoxRule(1, False).nms(boxes, scores, groups, 0.5, tv_tie_order=False).tolist()) == [0, 1]
    assert BoxRule(1, False).nms(boxes, scores, groups, 0.49, tv_tie_order=False).tolist() == [0]


@pytest.mark.parametrize("thresh", [0.3, 0.5, 0.7])
def test_nms_same_kept_set_as_mbs(thresh):
    gen = torch.Generator().manual_seed(int(thresh * 10))
    n = 600
    ctr = torch.rand(60, 2, generator=gen) * 150
    half = torch.rand(60, 2, generator=gen) * 30 + 3
    base = torch.cat([ctr - half, ctr + half], 1)  # 60 boxes, each jittered 10 times: overlaps at any IoU
    boxes = base.repeat(10, 1) + (torch.rand(n, 4, generator=gen) - 0.5) * 8
    scores = torch.rand(n, generator=gen)
    groups = torch.randint(0, 3, (n,), generator=gen)
    kept = BoxRule(1, False).nms(boxes, scores, groups, thresh, tv_tie_order=False)
    assert torch.equal(scores[kept], scores[kept].sort(descending=True).values)  # by decreasing score
    ref = []
    for g in range(3):
        idx = torch.where(groups == g)[0]
        ref += idx[_mb_nms(boxes[idx], scores[idx], thresh)].tolist()
    assert sorted(kept.tolist()) == sorted(ref) and len(ref) < 0.8 * n
    for topk in (10, 50):  # the exact top-k path: the leading part of the full result
        part = BoxRule(1, False).nms(boxes, scores, groups, thresh, topk=topk, tv_tie_order=False)
        assert part[:topk].tolist() == kept[:topk].tolist()


# ------------------------------------------------------------------------------- RPN


def _head_outputs(n, padded, seed):
    """Random RPN head outputs for P2..P6 of a ``padded`` input; objectness logits whose sigmoids
    are distinct (no ties at any top-k), deltas that reach past the clamp and out of the image."""
    gen = torch.Generator().manual_seed(seed)
    logits, deltas = [], []
    h, w = padded[0] // 4, padded[1] // 4
    for lvl in range(5):
        k = n * 3 * h * w
        p = (torch.randperm(k, generator=gen).double() + 0.5) / k * 0.98 + 0.01
        logits.append(torch.log(p / (1 - p)).float().view(n, 3, h, w))
        d = torch.randn(n, 12, h, w, generator=gen) * 0.7
        d[:, 2::4][d[:, 2::4] > 1.8] = 6.0
        deltas.append(d)
        h, w = (h + 1) // 2 if lvl == 3 else h // 2, (w + 1) // 2 if lvl == 3 else w // 2
    return logits, deltas


@pytest.mark.parametrize("topk", [None, (200, 60)])
def test_rpn_proposals_are_mbs(mb_model, topk):
    rpn, pre, post = mb_model.rpn, 1000, 1000
    if topk is not None:  # MB with PRE_NMS_TOP_N_TEST 200, POST_NMS_TOP_N_TEST = FPN_POST_NMS_TOP_N_TEST 60
        pre, post = topk
        opts = ["MODEL.RPN.PRE_NMS_TOPK_TEST", pre, "MODEL.RPN.POST_NMS_TOPK_TEST", post]
        rpn = minidet.build_model(_cfg("R_50_FPN_1x", "", *opts)).rpn
    padded, sizes = (320, 480), [(320, 427), (301, 480)]
    logits, deltas = _head_outputs(2, padded, seed=3)
    with torch.no_grad():
        ours = rpn.select(logits, deltas, padded, sizes, [1.0, 1.25])
    ref = _mb_rpn(logits, deltas, sizes, pre_nms=pre, post_nms=post, fpn_post_nms=post)
    for o, r, (h, w) in zip(ours, ref, sizes):
        assert 0.5 * post < len(r) <= post
        assert len(o) == len(r) and _sorted_rows(o) == _sorted_rows(r)
        assert o[:, 2].max() <= w - 1 and o[:, 3].max() <= h - 1  # clipped to the unpadded image, +1


# ------------------------------------------------------------------------------- box post-processing


def _images(sizes):
    ph, pw = (-(-max(s[0] for s in sizes) // 32) * 32), (-(-max(s[1] for s in sizes) // 32) * 32)
    return ImageBatch(torch.zeros(len(sizes), 3, ph, pw), list(sizes), list(sizes), [1.0] * len(sizes))


def _rows(boxes, scores, labels):
    return sorted(zip(labels.tolist(), scores.tolist(), map(tuple, boxes.tolist())))


def test_box_postprocess_is_mbs(mb_model):
    gen = torch.Generator().manual_seed(4)
    sizes = [(320, 427), (290, 480)]
    proposals = []
    for h, w in sizes:
        xy = torch.rand(400, 2, generator=gen) * torch.tensor([w * 0.95, h * 0.95])
        wh = torch.rand(400, 2, generator=gen) * 90 + 2
        proposals.append(torch.cat([xy, xy + wh], 1))
    logits = torch.randn(800, 81, generator=gen) * 2.5
    logits[:, 0] += 1.0
    deltas = torch.randn(800, 324, generator=gen) * 2
    dets = mb_model.box_predictor.inference(logits, deltas, proposals, _images(sizes))
    ref = _mb_box_post(logits, deltas, proposals, sizes)
    assert max(r[3] for r in ref) > 100  # the cap is reached
    for d, (b, s, lab, _), (h, w) in zip(dets, ref, sizes):
        assert d.frame == "resized"
        assert _rows(d.boxes, d.scores, d.labels) == _rows(b, s, lab)
        assert torch.equal(d.scores, d.scores.sort(descending=True).values)
        assert d.boxes[:, 2].max() <= w - 1 and d.boxes[:, 3].max() <= h - 1


@pytest.mark.parametrize("case,expected", [("all_tied", 130), ("tie_at_cap", 130), ("distinct", 100)])
def test_detection_cap_keeps_every_tie(mb_model, case, expected):
    """More than 100 detections: MB keeps every score >= the 100th best (kthvalue), ties included."""
    n = 130
    col, row = torch.arange(n) % 13, torch.arange(n) // 13
    x, y = col * 20.0, row * 20.0
    proposals = [torch.stack([x, y, x + 9, y + 9], 1)]  # disjoint 10 x 10 boxes: NMS keeps all
    logits = torch.zeros(n, 81)
    logits[:, 1] = 6.0
    if case == "tie_at_cap":
        logits[80:, 1] = 5.0  # 50 equal scores across the cap
    elif case == "distinct":
        logits[:, 1] += torch.arange(n) * 0.01
    deltas = torch.zeros(n, 324)
    sizes = [(200, 260)]
    det = mb_model.box_predictor.inference(logits, deltas, proposals, _images(sizes))[0]
    b, s, lab, count = _mb_box_post(logits, deltas, proposals, sizes)[0]
    assert count == n and len(s) == expected
    assert _rows(det.boxes, det.scores, det.labels) == _rows(b, s, lab)


# ------------------------------------------------------------------------------- masks


def test_mask_paste_is_mbs_masker():
    gen = torch.Generator().manual_seed(5)
    masks = torch.rand(10, 28, 28, generator=gen)
    boxes = torch.tensor(
        [
            [10.0, 20.0, 37.0, 47.0],
            [0.4, 0.2, 5.3, 3.1],
            [50.5, 10.2, 99.9, 79.5],
            [-5.0, -8.0, 30.0, 12.0],  # partly left of and above the image
            [90.0, 60.0, 130.0, 95.0],  # partly right of and below it
            [33.3, 44.4, 33.9, 44.9],  # under a pixel
            [-20.5, 30.0, 4.2, 70.7],
            [70.0, -15.0, 98.0, 2.0],
            [0.0, 0.0, 99.0, 79.0],  # the whole image
            [98.5, 78.5, 120.0, 90.0],
        ]
    )
    ours = paste_masks(masks, boxes, 80, 100).dense()
    ref = torch.stack([_mb_paste(masks[i], boxes[i], 80, 100) for i in range(len(boxes))])
    assert ours.dtype == torch.bool and torch.equal(ours, ref)


# ------------------------------------------------------------------------------- whole model


def _two_images():
    files = sorted(TINY.glob("*.jpg"))[:2] if TINY.is_dir() else []
    if len(files) == 2:
        return [cv2.imread(str(f)) for f in files]
    return images_bgr()[:2]


@pytest.mark.slow
def test_frozen_norm_forms_give_the_same_detections(mb_files):
    path, _ = mb_files("R_50_FPN_1x")  # the norm's form is the subject, not the caps: FEWER's
    assert_norm_forms_agree(lambda *opts: _cfg("R_50_FPN_1x", path, *FEWER, *opts), _two_images())


def test_boxes_scaled_per_axis_without_clip(mb_model):
    """BoxList.resize((orig_w, orig_h)): each axis times float(orig) / float(resized), nothing clipped."""
    sizes, orig = [(320, 427), (301, 480)], [(481, 641), (333, 531)]
    images = ImageBatch(torch.zeros(2, 3, 320, 480), sizes, orig, [320 / 481, 301 / 333])
    gen = torch.Generator().manual_seed(6)
    dets = []
    for h, w in sizes:
        b = torch.rand(50, 4, generator=gen) * torch.tensor([w - 1.0, h - 1.0, w - 1.0, h - 1.0])
        b[:, 2:] = torch.maximum(b[:, 2:], b[:, :2])
        b[0] = torch.tensor([0.0, 0.0, w - 1.0, h - 1.0])
        dets.append(Detections(b, torch.rand(50, generator=gen), torch.ones(50, dtype=torch.int64), "resized"))
    outs = mb_model.transform.postprocess(dets, images)
    for out, d, (h, w), (oh, ow) in zip(outs, dets, sizes, orig):
        rw, rh = float(ow) / float(w), float(oh) / float(h)
        x1, y1, x2, y2 = d.boxes.split(1, dim=-1)
        ref = torch.cat((x1 * rw, y1 * rh, x2 * rw, y2 * rh), dim=-1)
        assert torch.equal(out["boxes"], ref)


def test_coco_boxes_are_pixel_inclusive(mb_files):
    """COCO results: convert("xywh") with TO_REMOVE = 1, width x2 - x1 + 1."""
    path, _ = mb_files("R_50_FPN_1x")
    p = minidet.Predictor(_cfg("R_50_FPN_1x", path))
    out = {"boxes": torch.tensor([[10.0, 20.0, 29.0, 59.0]]), "scores": torch.tensor([0.9]),
           "category_ids": torch.tensor([1])}
    results, _ = instances_to_coco(1, out, p.box_offset)
    assert results[0]["bbox"] == [10.0, 20.0, 20.0, 40.0]


def test_convention_is_registered(mb_model):
    assert FAMILIES["maskrcnn_benchmark"] is mb_family.FAMILY
    assert mb_model.rpn.box_rule == BoxRule(1, False) and mb_model.box_predictor.box_rule == BoxRule(1, False)
    assert mb_model.transform.resize is resize_pil_mb
