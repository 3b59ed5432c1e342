"""mmdetection checkpoints and mmdetection 3.3.0's test-time arithmetic with mmcv 2.1's CPU ops (MODEL.CONVENTION
mmdetection). Each rule is checked on its own against a restatement of the source (the ``_mm_*`` functions below,
written from mmcv's ``transforms/processing.py`` ``Resize`` and ``image/geometric.py`` ``imrescale``, mmengine's
``ImgDataPreprocessor``, mmdetection's ``task_modules/prior_generators/anchor_generator.py``,
``task_modules/coders/delta_xywh_bbox_coder.py``, ``dense_heads/rpn_head.py``, ``layers/bbox_nms.py``,
``roi_heads/bbox_heads/bbox_head.py``, ``roi_heads/roi_extractors/single_level_roi_extractor.py`` and
``roi_heads/mask_heads/fcn_mask_head.py``, and mmcv's ``ops/nms.py`` with its CPU kernels ``nms.cpp`` and
``roi_align.cpp``).
"""

import math
import os
import pickle
import re

import cv2
import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torchvision.ops import nms as tv_nms
from torchvision.ops import roi_align

import minidet
from helpers import FEWER, ROOT, config, images_bgr, run_tool
from minidet.apps.compare import assert_norm_forms_agree
from minidet.apps.synthetic import structured_image
from minidet.boxes import MMDET_BOX_RULE, decode_boxes, mmcv_batched_nms, mmcv_nms
from minidet.checkpoint import CheckpointError
from minidet.config import config_names
from minidet.families import FAMILIES, recognize
from minidet.families import mmdetection as mm_family
from minidet.heads.detections import Detections
from minidet.heads.rpn import mmdet_cell_anchors, torchvision_cell_anchors
from minidet.hub import REGISTRY
from minidet.norm import FrozenBN
from minidet.poolers import detectron2_levels, mmdet_levels
from minidet.readers import read_checkpoint
from minidet.testing.checkpoints import REFERENCE, d2_state_shapes, d2_weights, make_blobs, mb_state_shapes
from minidet.testing.mmdet import COCO_CLASSES, mmdet_meta, mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint
from minidet.transform import ImageBatch, mmcv_size, paste_masks_aligned, paste_masks_mmdet, resize_mmdet

SIZE = ["INPUT.MIN_SIZE_TEST", 320, "INPUT.MAX_SIZE_TEST", 512]
PYTORCH_NORM = ([123.675, 116.28, 103.53], [58.395, 57.12, 57.375], True)  # mean, std, bgr_to_rgb
CAFFE_NORM = ([103.53, 116.28, 123.675], [1.0, 1.0, 1.0], False)
D2_NORM = ([103.53, 116.28, 123.675], [57.375, 57.12, 58.395], False)  # the ResNeXt-101 32x8d of detectron2's
# variant -> (config under configs/mmdetection/, mmdet_state_shapes arguments, its data_preprocessor's values; the
# caffe-style ones (CAFFE_NORM): style='caffe', a 2.x file's meta)
VARIANTS = {
    "r50": ("mask-rcnn_r50_fpn_1x_coco", {}, PYTORCH_NORM),
    "r50-caffe": ("mask-rcnn_r50-caffe_fpn_1x_coco", {}, CAFFE_NORM),
    "r101": ("mask-rcnn_r101_fpn_1x_coco", {"depth": 101}, PYTORCH_NORM),
    "x101-32x4d": ("mask-rcnn_x101-32x4d_fpn_1x_coco", {"depth": 101, "groups": 32, "base_width": 4}, PYTORCH_NORM),
    "x101-64x4d": ("mask-rcnn_x101-64x4d_fpn_1x_coco", {"depth": 101, "groups": 64, "base_width": 4}, PYTORCH_NORM),
    "x101-32x8d": ("mask-rcnn_x101-32x8d_fpn_1x_coco", {"depth": 101, "groups": 32, "base_width": 8}, D2_NORM),
}
LARGE = ("r101", "x101-32x4d", "x101-64x4d", "x101-32x8d")


def _cfg(variant, weights, *opts):
    return config(f"configs/mmdetection/{VARIANTS[variant][0]}.yaml", *SIZE, *opts, weights=weights)


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def _state(variant, seed=0):
    _, shapes, norm = VARIANTS[variant]
    return mmdet_weights(mmdet_state_shapes(**shapes), seed=seed, caffe=norm is CAFFE_NORM)


@pytest.fixture(scope="module")
def mm_files(tmp_path_factory):
    """variant -> (path, state) of the R-50 files (pytorch-style with 3.x meta, caffe-style with 2.x meta), each
    written once."""
    d = tmp_path_factory.mktemp("mmdet")
    made = {}

    def get(variant):
        if variant not in made:
            state = _state(variant, seed=len(made))
            path = d / f"{VARIANTS[variant][0]}.pth"
            caffe = VARIANTS[variant][2] is CAFFE_NORM
            meta = mmdet_meta("2.0.0", style="caffe") if caffe else mmdet_meta()
            write_mmdet_checkpoint(path, state, meta)
            made[variant] = (path, state)
        return made[variant]

    return get


@pytest.fixture(scope="module")
def mm_model():
    """The R-50 model as mmdetection's config builds it (random weights): its transform, RPN and heads."""
    return minidet.build_model(_cfg("r50", ""))


# ------------------------------------------------------------------------- mmdetection's rules, restated


def _mm_rescale_size(h, w, scale=(1333, 800)):
    """mmcv's imrescale size for keep_ratio: factor min(max(scale) / long side, min(scale) / short side), then
    _scale_size: each side int(side * factor + 0.5). Returns (new_w, new_h)."""
    f = min(max(scale) / max(h, w), min(scale) / min(h, w))
    return int(w * float(f) + 0.5), int(h * float(f) + 0.5)


def _mm_preprocess(bgr, scale, norm):
    """Resize (cv2 bilinear on the uint8 image), PackDetInputs (HWC -> CHW uint8), then the data preprocessor: the
    channel flip on the uint8 tensor, float, (x - mean) / std with (3, 1, 1) float32 buffers."""
    mean, std, to_rgb = norm
    new_w, new_h = _mm_rescale_size(*bgr.shape[:2], scale)
    img = cv2.resize(bgr, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
    if to_rgb:
        x = x[[2, 1, 0], ...]
    x = x.float()
    x = (x - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
    return x, (new_w / bgr.shape[1], new_h / bgr.shape[0])


def _mm_base_anchors(base_size, scales, ratios):
    """AnchorGenerator.gen_single_level_base_anchors, scale-major, center_offset 0."""
    root = torch.sqrt(torch.Tensor(ratios))  # r = h / w: h grows with sqrt(r), w with 1 / sqrt(r)
    octave = torch.Tensor(scales)[None, :]
    width = (base_size * (1 / root)[:, None] * octave).view(-1)
    height = (base_size * root[:, None] * octave).view(-1)
    c = 0.0 * base_size  # center_offset 0
    return torch.stack([c - 0.5 * width, c - 0.5 * height, c + 0.5 * width, c + 0.5 * height], dim=-1)


def _mm_grid_anchors(base, feat_h, feat_w, stride):
    """single_level_grid_priors: float shifts at the stride, row-major meshgrid, (H * W * A, 4)."""
    cols = torch.arange(0, feat_w).to(torch.float32) * stride
    rows = torch.arange(0, feat_h).to(torch.float32) * stride
    x = cols.repeat(feat_h)  # row-major: x runs fastest
    y = rows[:, None].repeat(1, feat_w).view(-1)
    return (base[None] + torch.stack([x, y, x, y], dim=-1)[:, None]).view(-1, 4)


def _mm_delta2bbox(rois, deltas, stds, max_shape=None, wh_ratio_clip=16 / 1000):
    """delta2bbox with means 0, clip_border, no ctr_clamp: deltas * stds, centres (x1 + x2) * 0.5, sizes
    x2 - x1, dw/dh clamped to +-|log(wh_ratio_clip)| on both sides, then clamped to [0, W] x [0, H]."""
    n, k = deltas.size(0), deltas.size(1) // 4
    d = deltas.reshape(-1, 4) * deltas.new_tensor(stds).view(1, -1) + deltas.new_tensor([0.0] * 4).view(1, -1)
    src = rois.repeat(1, k).reshape(-1, 4)  # each roi once per class
    centre, size = (src[:, :2] + src[:, 2:]) * 0.5, src[:, 2:] - src[:, :2]
    limit = np.abs(np.log(wh_ratio_clip))
    log_scale = d[:, 2:].clamp(min=-limit, max=limit)
    new_centre, new_size = centre + size * d[:, :2], size * log_scale.exp()
    out = torch.cat([new_centre - (new_size * 0.5), new_centre + (new_size * 0.5)], dim=-1)
    if max_shape is not None:
        out[..., 0::2].clamp_(min=0, max=max_shape[1])
        out[..., 1::2].clamp_(min=0, max=max_shape[0])
    return out.reshape(n, -1)


def _mm_nms_kernel(boxes, scores, iou_threshold):
    """mmcv's nms_cpu: order = scores.sort(0, descending=True) (unstable); ``select`` flags indexed by rank; each
    kept box suppresses later ranks with float32 IoU (offset 0) > the float32 threshold; the kept ranks' indices."""
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.int64)
    x1, y1, x2, y2 = (boxes[:, i].contiguous().numpy() for i in range(4))
    areas = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).numpy()
    order = scores.sort(0, descending=True)[1]
    o = order.numpy()
    select = np.ones(len(o), bool)
    thr = np.float32(iou_threshold)
    for r in range(len(o)):
        if not select[r]:
            continue
        i, later = o[r], o[r + 1 :]
        w = np.maximum(np.float32(0), np.minimum(x2[i], x2[later]) - np.maximum(x1[i], x1[later]))
        h = np.maximum(np.float32(0), np.minimum(y2[i], y2[later]) - np.maximum(y1[i], y1[later]))
        inter = w * h
        with np.errstate(invalid="ignore"):  # 0 / 0 for two empty boxes: NaN, which suppresses nothing
            ovr = inter / (areas[i] + areas[later] - inter)
        select[r + 1 :] &= ~(ovr > thr)
    return order[torch.from_numpy(select)]


def _mm_batched_nms(boxes, scores, idxs, iou_threshold, split_thr=10000):
    """mmcv's batched_nms (class-aware): boxes shifted by idx * (max coordinate + 1); under split_thr one nms, else
    one per idx on the shifted boxes, the kept ones sorted by score (unstable)."""
    moved = boxes + (idxs.to(boxes) * (boxes.max() + torch.tensor(1).to(boxes)))[:, None]
    if len(moved) < split_thr:
        return _mm_nms_kernel(moved, scores, iou_threshold)
    kept = torch.zeros(len(scores), dtype=torch.bool)
    for g in torch.unique(idxs):
        members = (idxs == g).nonzero(as_tuple=False).view(-1)
        kept[members[_mm_nms_kernel(moved[members], scores[members], iou_threshold)]] = True
    survivors = kept.nonzero(as_tuple=False).view(-1)
    return survivors[scores[survivors].sort(descending=True)[1]]


def _mm_rpn(cls_scores, bbox_preds, img_shape, nms_pre=1000, max_per_img=1000, iou=0.7):
    """RPNHead._predict_by_feat_single + _bbox_post_process for one image: per level the sigmoid of
    cls_score.permute(1, 2, 0).reshape(-1, 1), sorted (descending) and cut to nms_pre only where the level has more
    anchors; decode against the anchors, clamped to img_shape; keep w > 0 and h > 0; batched_nms over level ids;
    the first max_per_img."""
    per_level = []  # (deltas, anchors, scores, level ids)
    for lvl, (logit, delta) in enumerate(zip(cls_scores, bbox_preds)):
        stride = 4 * 2**lvl
        anchors = _mm_grid_anchors(_mm_base_anchors(stride, [8], [0.5, 1.0, 2.0]), *logit.shape[1:], stride)
        delta = delta.permute(1, 2, 0).reshape(-1, 4)
        prob = torch.squeeze(logit.permute(1, 2, 0).reshape(-1, 1).sigmoid())
        if 0 < nms_pre < len(prob):
            prob, order = prob.sort(descending=True)
            prob, delta, anchors = prob[:nms_pre], delta[order[:nms_pre]], anchors[order[:nms_pre]]
        per_level.append((delta, anchors, prob, torch.full((len(prob),), lvl, dtype=torch.long)))
    delta, anchors, prob, level = (torch.cat(parts) for parts in zip(*per_level))
    boxes = _mm_delta2bbox(anchors, delta, [1.0] * 4, max_shape=img_shape)
    ok = ((boxes[:, 2] - boxes[:, 0]) > 0) & ((boxes[:, 3] - boxes[:, 1]) > 0)
    if not ok.all():
        boxes, prob, level = boxes[ok], prob[ok], level[ok]
    return boxes[_mm_batched_nms(boxes, prob, level, iou)][:max_per_img]


def _mm_bbox_post(cls_score, bbox_pred, rois, img_shape, score_thr=0.05, iou=0.5, max_per_img=100):
    """BBoxHead._predict_by_feat_single (no rescale: a mask head follows) + multiclass_nms for one image: softmax,
    decode every (roi, class) with stds (0.1, 0.1, 0.2, 0.2) clamped to img_shape, scores[:, :-1] > score_thr
    (strict), batched_nms over labels, the first max_per_img. Returns boxes, scores, labels in that order."""
    prob = F.softmax(cls_score, dim=-1)[:, :-1]  # the background is the last column
    k = prob.shape[1]
    boxes = _mm_delta2bbox(rois.repeat_interleave(k, dim=0), bbox_pred.view(-1, 4), [0.1, 0.1, 0.2, 0.2],
                           max_shape=img_shape).reshape(-1, 4)  # roi-major, class-minor, as the scores flatten
    labels = torch.arange(k, dtype=torch.long).view(1, -1).expand_as(prob).reshape(-1)
    prob = prob.reshape(-1)
    above = (prob > score_thr).nonzero(as_tuple=False).squeeze(1)
    boxes, prob, labels = boxes[above], prob[above], labels[above]
    keep = _mm_batched_nms(boxes, prob, labels, iou)[:max_per_img]
    return boxes[keep], prob[keep], labels[keep]


def _mm_levels(rois, num_levels=4, finest_scale=56):
    """SingleRoIExtractor.map_roi_levels (rois with the batch index first)."""
    side = torch.sqrt((rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2]))
    return torch.floor(torch.log2(side / finest_scale + 1e-6)).clamp(min=0, max=num_levels - 1).long()


def _mm_paste_one(mask, box, img_h, img_w, thr=0.5):
    """FCNMaskHead on CPU: one box per chunk, _do_paste_mask with skip_empty (the pixels around the box), img_x /
    img_y set to 0 where infinite, grid_sample(align_corners=False), then >= thr into a full-size mask."""
    b = box[None]
    left, top = torch.clamp(b.min(dim=0).values.floor()[:2] - 1, min=0).to(dtype=torch.int32)
    right = torch.clamp(b[:, 2].max().ceil() + 1, max=img_w).to(dtype=torch.int32)
    bottom = torch.clamp(b[:, 3].max().ceil() + 1, max=img_h).to(dtype=torch.int32)
    bx0, by0, bx1, by1 = torch.split(b, 1, dim=1)
    ys = ((torch.arange(top, bottom).to(torch.float32) + 0.5) - by0) / (by1 - by0) * 2 - 1
    xs = ((torch.arange(left, right).to(torch.float32) + 0.5) - bx0) / (bx1 - bx0) * 2 - 1
    xs[torch.isinf(xs)], ys[torch.isinf(ys)] = 0, 0
    hw = (1, ys.size(1), xs.size(1))
    grid = torch.stack([xs[:, None, :].expand(hw), ys[:, :, None].expand(hw)], dim=3)
    sampled = F.grid_sample(mask[None, None].float(), grid, align_corners=False)
    out = torch.zeros((img_h, img_w), dtype=torch.bool)
    out[top:bottom, left:right] = sampled[0, 0] >= thr
    return out


def _mm_roi_align_kernel(feat, roi, out_size, spatial_scale):
    """mmcv's roi_align.cpp, avg pool, aligned, sampling ratio 0 (adaptive), for one (C, H, W) map and one box."""
    c, height, width = feat.shape
    f = feat.numpy()
    start_w, start_h, end_w, end_h = (np.float32(v) * np.float32(spatial_scale) - np.float32(0.5) for v in roi)
    roi_w, roi_h = end_w - start_w, end_h - start_h
    bin_h, bin_w = roi_h / np.float32(out_size), roi_w / np.float32(out_size)
    grid_h, grid_w = int(math.ceil(roi_h / out_size)), int(math.ceil(roi_w / out_size))
    count = max(grid_h * grid_w, 1)
    out = np.zeros((c, out_size, out_size), np.float32)
    for ph in range(out_size):
        for pw in range(out_size):
            acc = np.zeros(c, np.float32)
            for iy in range(grid_h):
                y = start_h + np.float32(ph) * bin_h + np.float32(iy + 0.5) * bin_h / np.float32(grid_h)
                for ix in range(grid_w):
                    x = start_w + np.float32(pw) * bin_w + np.float32(ix + 0.5) * bin_w / np.float32(grid_w)
                    if y < -1.0 or y > height or x < -1.0 or x > width:
                        continue
                    yy, xx = max(y, np.float32(0)), max(x, np.float32(0))
                    y_lo, x_lo = int(yy), int(xx)
                    if y_lo >= height - 1:
                        y_lo = y_hi = height - 1
                        yy = np.float32(y_lo)
                    else:
                        y_hi = y_lo + 1
                    if x_lo >= width - 1:
                        x_lo = x_hi = width - 1
                        xx = np.float32(x_lo)
                    else:
                        x_hi = x_lo + 1
                    ly, lx = yy - np.float32(y_lo), xx - np.float32(x_lo)
                    hy, hx = np.float32(1) - ly, np.float32(1) - lx
                    acc += (hy * hx * f[:, y_lo, x_lo] + hy * lx * f[:, y_lo, x_hi]
                            + ly * hx * f[:, y_hi, x_lo] + ly * lx * f[:, y_hi, x_hi])
            out[:, ph, pw] = acc / np.float32(count)
    return torch.from_numpy(out)


def _mm_to_minidet(name):
    """mmdetection's module names -> minidet's (each module's place in both trees), restated; None for
    num_batches_tracked."""
    if name.endswith("num_batches_tracked"):
        return None
    if m := re.match(r"backbone\.(conv1|bn1)\.(\w+)$", name):
        return "backbone.stem.conv1." + ("norm." if m[1] == "bn1" else "") + m[2]
    if m := re.match(r"backbone\.layer(\d)\.(\d+)\.(conv|bn)(\d)\.(\w+)$", name):
        return f"backbone.res{int(m[1]) + 1}.{m[2]}.conv{m[4]}." + ("norm." if m[3] == "bn" else "") + m[5]
    if m := re.match(r"backbone\.layer(\d)\.0\.downsample\.([01])\.(\w+)$", name):
        return f"backbone.res{int(m[1]) + 1}.0.shortcut." + ("norm." if m[2] == "1" else "") + m[3]
    if m := re.match(r"neck\.(lateral|fpn)_convs\.(\d)\.conv\.(\w+)$", name):
        return f"fpn.{'lateral' if m[1] == 'lateral' else 'output'}{int(m[2]) + 2}.{m[3]}"
    if m := re.match(r"rpn_head\.rpn_(conv|cls|reg)\.(\w+)$", name):
        return "rpn.head." + {"conv": "convs.0", "cls": "objectness_logits", "reg": "anchor_deltas"}[m[1]] + "." + m[2]
    if m := re.match(r"roi_head\.bbox_head\.shared_fcs\.([01])\.(\w+)$", name):
        return f"box_head.fc{int(m[1]) + 1}.{m[2]}"
    if m := re.match(r"roi_head\.bbox_head\.fc_(cls|reg)\.(\w+)$", name):
        return f"box_predictor.{'cls_score' if m[1] == 'cls' else 'bbox_pred'}.{m[2]}"
    if m := re.match(r"roi_head\.mask_head\.convs\.(\d)\.conv\.(\w+)$", name):
        return f"mask_head.mask_fcn{int(m[1]) + 1}.{m[2]}"
    if m := re.match(r"roi_head\.mask_head\.(upsample|conv_logits)\.(\w+)$", name):
        return f"mask_head.{'deconv' if m[1] == 'upsample' else 'predictor'}.{m[2]}"
    raise AssertionError(f"no mmdetection module for {name}")


# ------------------------------------------------------------------------------- files and names


@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.slow) if v in LARGE else v for v in VARIANTS])
def test_every_name_loads_where_mmdetection_has_it(mm_files, tmp_path, variant):
    if variant in LARGE:  # written here, not kept for the module
        state = _state(variant, seed=7)
        path = tmp_path / "large.pth"
        write_mmdet_checkpoint(path, state)
    else:
        path, state = mm_files(variant)
    model, report = minidet.prepare_model(_cfg(variant, path))
    assert report.format == "mmdetection" and report.layout == ""
    assert not report.missing and not report.unexpected and not report.mismatched, str(report)
    weights = [k for k in state if not k.endswith("num_batches_tracked")]
    assert report.loaded == len(weights) and sorted(report.ignored) == sorted(set(state) - set(weights))
    ours = model.state_dict()
    for k in weights:  # every value where mmdetection's module tree has it
        assert torch.equal(ours[_mm_to_minidet(k)], state[k]), k
    norm = model.backbone.res3[1].conv2.norm
    assert isinstance(norm, FrozenBN) and norm.eps == 1e-5  # nn.BatchNorm2d's eps
    mean, std, bgr_to_rgb = norm = VARIANTS[variant][2]
    assert model.backbone.res3[0].conv1.stride == ((2, 2) if norm is CAFFE_NORM else (1, 1))  # 'caffe' / 'pytorch'
    assert model.box_pooler.aligned and model.box_pooler.sampling_ratio == 0
    assert model.transform.flip_channels == bgr_to_rgb
    assert model.transform.pixel_mean.flatten().tolist() == pytest.approx(mean)  # after the flip, as mmdetection
    assert model.transform.pixel_std.flatten().tolist() == pytest.approx(std)
    del state, model


@pytest.mark.parametrize("shapes", [{}, {"depth": 101, "groups": 32, "base_width": 4}])
def test_renamer_against_the_module_tree(shapes):
    names = mmdet_state_shapes(**shapes)
    assert recognize(list(names))[0] is mm_family.FAMILY
    renamed = {}
    for k, shape in names.items():
        assert mm_family.rename(k) == _mm_to_minidet(k), k
        if _mm_to_minidet(k) is not None:
            renamed[_mm_to_minidet(k)] = shape
    variant = "r50" if not shapes else "x101-32x4d"
    model = minidet.build_model(_cfg(variant, ""))
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == renamed
    assert mm_family.rename("roi_head.bbox_head.unknown.weight") == "roi_head.bbox_head.unknown.weight"
    assert mm_family.rename("backbone.layer9.extra.weight") == "backbone.layer9.extra.weight"


@pytest.mark.skipif(not os.path.isdir(REFERENCE), reason="needs ../shared/reference (key lists)")
def test_no_other_family_claims_these_files_and_the_reverse():
    mm = list(mmdet_state_shapes())
    assert [f.name for f in FAMILIES.values() if f.recognize(mm) is not None] == ["mmdetection"]
    tv = [ln.split()[0] for ln in open(os.path.join(REFERENCE, "torchvision_maskrcnn_resnet50_fpn.keys.txt"))
          if ln.strip() and not ln.startswith("#")]
    for others in (tv, list(d2_state_shapes(50)), list(mb_state_shapes()), list(make_blobs("R-50-FPN"))):
        assert mm_family.recognize(others) is None


def test_class_names_from_meta(mm_files):
    path, _ = mm_files("r50")  # 3.x: meta["dataset_meta"]["classes"]
    assert mm_family.class_names(read_checkpoint(str(path)).meta) == list(COCO_CLASSES)
    caffe, _ = mm_files("r50-caffe")  # 2.x: meta["CLASSES"]
    assert mm_family.class_names(read_checkpoint(str(caffe)).meta) == list(COCO_CLASSES)
    assert mm_family.class_names({"meta": mmdet_meta("2.28.2", classes=("cell", "nucleus"))}) == ["cell", "nucleus"]
    for meta in ({}, {"meta": {}}, {"meta": {"CLASSES": None}}, {"meta": {"dataset_meta": {"palette": []}}}):
        assert mm_family.class_names(meta) is None, meta  # no names: the config's, the dataset's or class_N
    assert mm_family.class_names({"meta": {"CLASSES": "person"}}) == ["person"]  # one class, as mmdetection reads it
    assert mm_family.class_names({"meta": {"dataset_meta": {"CLASSES": ("a", "b")}, "CLASSES": ("c",)}}) == ["a", "b"]
    for classes in ([1, 2], ["a", "a"], ["a", ""], {"a": 1}, []):  # names it cannot take: one line (test_own_classes)
        with pytest.raises(ValueError, match=r"^its class names \(meta dataset_meta.classes\): "):
            mm_family.class_names({"meta": {"dataset_meta": {"classes": classes}}})
    # a Panoptic FPN's instances are of its thing classes: 3.x names them, a 2.x file lists COCO panoptic's 133
    panoptic = COCO_CLASSES + tuple(f"stuff_{k}" for k in range(53))
    three = {"dataset_meta": {"classes": panoptic, "thing_classes": COCO_CLASSES, "stuff_classes": panoptic[80:]}}
    assert mm_family.class_names({"meta": three}) == list(COCO_CLASSES)
    assert mm_family.class_names({"meta": mmdet_meta("2.18.0", classes=panoptic)}) == list(COCO_CLASSES)
    other = tuple(f"c{k}" for k in range(133))  # 133 names that are not COCO panoptic's: as they are
    assert mm_family.class_names({"meta": mmdet_meta("2.18.0", classes=other)}) == list(other)


def test_configs_and_registry():
    names = [n for n in config_names() if n.startswith("mmdetection/")]
    assert len(names) == 132 and {f"mmdetection/{c}" for c, _, _ in VARIANTS.values()} <= set(names)
    for name in names:
        assert name in REGISTRY and REGISTRY[name].config == name
        e = REGISTRY[name]
        assert e.url.startswith("https://download.openmmlab.com/mmdetection/v2.0/") and e.url.endswith(e.filename)
        assert e.name_prefix and e.filename.endswith(f"-{e.name_prefix}.pth") and e.sha256 is None
        cfg = minidet.get_cfg(name)
        assert cfg.MODEL.CONVENTION == "mmdetection" and os.path.basename(cfg.MODEL.WEIGHTS) == e.filename
        caffe = "-caffe" in name
        detectron_gn = mm_family.ZOO_CONFIGS[name].startswith("gn/") and "contrib" not in name  # BGR, std 1
        # the RegNet files take their ImageNet model's BGR statistics, but the ms-poly-3x ones keep mask_rcnn's
        bgr_regnet = "regnetx" in name and "ms-poly" not in name
        mean, std, bgr_to_rgb = CAFFE_NORM if caffe or detectron_gn else \
            D2_NORM if "x101-32x8d" in name or bgr_regnet else PYTORCH_NORM
        assert cfg.MODEL.RESNETS.STRIDE_IN_1X1 == caffe and (cfg.INPUT.FORMAT == "RGB") == bgr_to_rgb
        assert (list(cfg.MODEL.PIXEL_MEAN), list(cfg.MODEL.PIXEL_STD)) == (mean, std), name


# ------------------------------------------------------------------------------- wrong files


def test_detectron2_file_under_this_config(tmp_path):
    p = tmp_path / "model_final.pkl"
    with open(p, "wb") as f:
        pickle.dump({"model": d2_weights(50), "__author__": "test"}, f)
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50", p))
    msg = _one_line(e)
    assert str(p) in msg and "MODEL.CONVENTION detectron2" in msg


def test_mmdetection_1x_files_are_refused_with_the_converter(mm_files, tmp_path):
    _, state = mm_files("r50")
    old = dict(state)  # 1.x: the background first, 81 class logits, 4 x 81 deltas, 81 mask logits
    for key, rows in (("roi_head.bbox_head.fc_reg", 324), ("roi_head.mask_head.conv_logits", 81)):
        for leaf in ("weight", "bias"):
            t = state[f"{key}.{leaf}"]
            old[f"{key}.{leaf}"] = torch.cat([t, t[: rows - len(t)]])
    p = tmp_path / "v1_shapes.pth"
    write_mmdet_checkpoint(p, old, {"mmdet_version": "1.1.0", "config": "", "CLASSES": COCO_CLASSES})
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50", p))
    msg = _one_line(e)
    assert str(p) in msg and "roi_head.bbox_head.fc_reg.weight" in msg and "324" in msg
    assert "upgrade_model_version.py" in msg
    heads = {re.sub(r"^roi_head\.", "", k): v for k, v in state.items()}  # 1.x: no RoIHead
    p2 = tmp_path / "v1_layout.pth"
    write_mmdet_checkpoint(p2, heads)
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50", p2))
    msg = _one_line(e)
    assert str(p2) in msg and "bbox_head." in msg and "upgrade_model_version.py" in msg


def _retina_state(state: dict) -> dict:
    """mmdetection's RetinaNet (``RetinaHead``, 9 anchors, 80 classes) on the ResNet-50 and FPN of ``state``: its
    dense head ``bbox_head.`` at the top (4 ``cls_convs`` and ``reg_convs``, ``retina_cls``, ``retina_reg``), no
    ``rpn_head.``, no ``roi_head.`` (the FPN's extra P6 conv, on C5, too)."""
    out = {k: v for k, v in state.items() if k.startswith(("backbone.", "neck."))}
    out["neck.fpn_convs.4.conv.weight"] = torch.zeros(256, 2048, 3, 3)
    out["neck.fpn_convs.4.conv.bias"] = torch.zeros(256)
    for branch in ("cls", "reg"):
        for i in range(4):
            out[f"bbox_head.{branch}_convs.{i}.conv.weight"] = torch.zeros(256, 256, 3, 3)
            out[f"bbox_head.{branch}_convs.{i}.conv.bias"] = torch.zeros(256)
    for name, rows in (("retina_cls", 9 * 80), ("retina_reg", 9 * 4)):
        out[f"bbox_head.{name}.weight"], out[f"bbox_head.{name}.bias"] = torch.zeros(rows, 256, 3, 3), torch.zeros(rows)
    return out


def test_a_single_stage_detector_is_named_not_sent_to_the_converter(mm_files, tmp_path):
    _, state = mm_files("r50")
    path = tmp_path / "retinanet_r50_fpn_1x_coco.pth"
    write_mmdet_checkpoint(path, _retina_state(state))
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50", path))
    msg = _one_line(e)
    assert msg == (f"{path}: a single-stage detector (RetinaNet: bbox_head.retina_cls.weight; no rpn_head or "
                   "roi_head weights), not a Mask R-CNN: minidet cannot run it (it runs Mask R-CNN files, and Faster "
                   "R-CNN ones with MODEL.MASK_ON False)")
    assert "1.x" not in msg and "upgrade_model_version" not in msg
    fcos = {k.replace("retina_cls", "conv_cls").replace("retina_reg", "conv_reg"): v
            for k, v in _retina_state(state).items()}
    fcos["bbox_head.conv_centerness.weight"] = torch.zeros(1, 256, 3, 3)  # FCOSHead's
    fcos["bbox_head.conv_centerness.bias"] = torch.zeros(1)
    write_mmdet_checkpoint(path, fcos)
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50", path))
    assert "a single-stage detector (FCOS: bbox_head.conv_centerness.weight; " in _one_line(e)


def test_a_faster_rcnn_file_is_told_it_runs_with_mask_on_false(mm_files, tmp_path):
    _, state = mm_files("r50")
    path = tmp_path / "faster-rcnn_r50_fpn_1x_coco.pth"
    write_mmdet_checkpoint(path, {k: v for k, v in state.items() if not k.startswith("roi_head.mask_head.")})
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50", path))
    msg = _one_line(e)
    assert msg.startswith(f"{path}: 12 model weights not in checkpoint: mask_head.mask_fcn1.{{weight, bias}}; "), msg
    assert msg.endswith("; the checkpoint has no mask head (a Faster R-CNN?): MODEL.MASK_ON False runs it, boxes only")
    small = ["INPUT.MIN_SIZE_TEST", 120, "INPUT.MAX_SIZE_TEST", 160, "MODEL.RPN.PRE_NMS_TOPK_TEST", 100,
             "MODEL.RPN.POST_NMS_TOPK_TEST", 50]
    predictor = minidet.Predictor(_cfg("r50", path, "MODEL.MASK_ON", False, *small))  # as the hint says
    report = predictor.load_report
    assert not report.missing and not report.unexpected and predictor.model.mask_head is None
    out = predictor(images_bgr([(120, 160)])[0])
    assert len(out["boxes"]) and "masks" not in out


def test_a_truncated_file_is_named_truncated(mm_files, tmp_path):
    """A model-zoo file cut short (an interrupted download or copy): torch's legacy format, as mmdetection publishes
    its files; cut inside its pickled entries or inside a tensor's data."""
    path, _ = mm_files("r50")
    data = path.read_bytes()
    cut_path = tmp_path / "mask_rcnn_r50_fpn_1x_coco_20200205-d4b0c5d6.pth"
    for cut, where in ((20, "its pickled entries"), (2000, "its pickled entries"), (len(data) // 2, "a tensor's data"),
                       (len(data) - 1, "a tensor's data")):
        cut_path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError) as e:
            minidet.prepare_model(_cfg("r50", cut_path))
        assert _one_line(e) == (f"{cut_path}: cannot read as a torch checkpoint: the file is truncated: it ends after "
                                f"{cut} bytes, inside {where} (torch's legacy non-zip format); download or copy it "
                                "again")
    named_pkl = tmp_path / "cut.pkl"  # the content decides the reader, whatever the name
    named_pkl.write_bytes(data[:2000])
    with pytest.raises(CheckpointError, match="cannot read as a torch checkpoint: the file is truncated"):
        read_checkpoint(str(named_pkl))


def test_caffe_style_file_under_the_pytorch_style_config_and_the_reverse(mm_files):
    caffe, _ = mm_files("r50-caffe")
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50", caffe))
    msg = _one_line(e)
    assert str(caffe) in msg and "backbone.bn1.running_var" in msg and "MODEL.RESNETS.STRIDE_IN_1X1" in msg
    assert "mask-rcnn_r50-caffe_fpn_1x_coco" in msg
    pytorch, _ = mm_files("r50")
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50-caffe", pytorch))
    msg = _one_line(e)
    assert str(pytorch) in msg and "backbone.bn1.running_var" in msg and "MODEL.RESNETS.STRIDE_IN_1X1" in msg


def test_other_groups_and_eps_are_refused(mm_files, tmp_path):
    _, state = mm_files("r50")
    grouped = dict(state)
    grouped["backbone.layer1.0.conv2.weight"] = torch.zeros(64, 2, 3, 3)  # 32 groups of 2
    p = tmp_path / "grouped.pth"
    write_mmdet_checkpoint(p, grouped)
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50", p))
    msg = _one_line(e)
    assert "backbone.layer1.0.conv2.weight" in msg and "MODEL.RESNETS.NUM_GROUPS 32" in msg
    path, _ = mm_files("r50")
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50", path, "MODEL.FROZEN_BN_EPS", 0.0))
    assert "MODEL.FROZEN_BN_EPS" in _one_line(e)


class HistoryBuffer:
    """What mmengine's MessageHub keeps in a training checkpoint (torch's weights-only load refuses it)."""

    def __init__(self):
        self.data = [1.0, 0.5]


@pytest.mark.slow
def test_training_checkpoint_and_extract_weights(mm_files, tmp_path):
    _, state = mm_files("r50")
    sgd = {"state": {0: {"momentum_buffer": torch.zeros(3)}}, "param_groups": [{"lr": 0.02, "params": [0]}]}
    plain = tmp_path / "epoch_12.pth"  # optimizer and schedulers of plain values: read weights-only
    write_mmdet_checkpoint(plain, state, extra={"optimizer": sgd, "param_schedulers": [{"last_step": 12}],
                                                "message_hub": {"runtime_info": {"epoch": 12}}})
    _, report = minidet.prepare_model(_cfg("r50", plain))
    assert not report.missing and not report.unexpected
    hub = tmp_path / "epoch_12_hub.pth"
    write_mmdet_checkpoint(hub, state, extra={"message_hub": {"log_scalars": {"loss": HistoryBuffer()}}})
    with pytest.raises(CheckpointError) as e:
        minidet.prepare_model(_cfg("r50", hub))
    msg = _one_line(e)
    assert "HistoryBuffer" in msg and "tools/extract_weights.py" in msg
    out = tmp_path / "weights.pth"
    r = run_tool(ROOT / "tools" / "extract_weights.py", str(hub), str(out), cwd=tmp_path, threads=1)
    assert r.returncode == 0, r.stderr
    _, report = minidet.prepare_model(_cfg("r50", out))
    assert report.format == "mmdetection" and not report.missing and not report.unexpected
    assert mm_family.class_names(read_checkpoint(str(out)).meta) == list(COCO_CLASSES)  # meta kept


# ------------------------------------------------------------------------------- pre-processing


def test_resize_size_rounds_half_up_on_odd_sizes():
    """mmdetection's test pipeline uses mmcv's Resize (keep_ratio): int(side * factor + 0.5). mmdetection's own
    floor rule (_fixed_scale_size) belongs to FixScaleResize, which no Mask R-CNN config uses."""
    assert mmcv_size(427, 640, 800, 1333) == (800, 1199)  # 640 * 800 / 427 = 1199.06
    assert mmcv_size(333, 499, 800, 1333) == (800, 1199)  # 499 * 800 / 333 = 1198.8: floor would give 1198
    assert mmcv_size(1000, 3000, 800, 1333) == (444, 1333)  # 1000 * 1333 / 3000 = 444.33
    assert mmcv_size(2001, 3, 800, 1333) == (1333, 2)  # 3 * 1333 / 2001 = 1.9985: floor would give 1
    rng = np.random.default_rng(0)
    shapes = [tuple(int(v) for v in rng.integers(1, 2500, 2)) for _ in range(2000)]
    floored = 0
    for h, w in shapes + [(333, 499), (481, 641), (799, 1201), (3, 1000), (1000, 3)]:
        for lo, hi in ((800, 1333), (320, 512), (640, 1333)):
            new_w, new_h = _mm_rescale_size(h, w, (hi, lo))
            assert mmcv_size(h, w, lo, hi) == (new_h, new_w), (h, w, lo, hi)
            f = min(hi / max(h, w), lo / min(h, w))
            floored += (int(h * f), int(w * f)) != (new_h, new_w)
    assert floored > 100  # the rounding rule decides the size often


@pytest.mark.parametrize("variant,norm", [("r50", PYTORCH_NORM), ("r50-caffe", CAFFE_NORM), ("x101-32x8d", D2_NORM)])
@pytest.mark.parametrize("shape", [(333, 499), (481, 641), (200, 701), (320, 400)])
def test_preprocess_is_cv2_on_uint8_then_the_data_preprocessor(variant, norm, shape):
    model = minidet.build_model(_cfg(variant, ""))
    img = structured_image(*shape, seed=sum(shape))
    ref, (w_scale, h_scale) = _mm_preprocess(img, (512, 320), norm)
    x, scale = resize_mmdet(model.transform, img)
    assert x.dtype == torch.float32 and torch.equal(x, ref)
    batch, sizes, orig, _ = model.preprocess([img])
    oh, ow = ref.shape[1:]
    assert sizes == [(oh, ow)] and orig == [shape] and (ow / shape[1], oh / shape[0]) == (w_scale, h_scale)
    assert batch.shape[-2] % 32 == 0 and batch.shape[-1] % 32 == 0
    assert torch.equal(batch[0, :, :oh, :ow], ref)
    assert not batch[0, :, oh:].any() and not batch[0, :, :, ow:].any()  # padded with 0 after normalization


# ------------------------------------------------------------------------------- anchors and boxes


def test_anchors_are_mmdetections_unrounded(mm_model):
    for lvl, stride in enumerate((4, 8, 16, 32, 64)):
        ref = _mm_base_anchors(stride, [8], [0.5, 1.0, 2.0])
        assert torch.equal(mm_model.rpn.cell_anchors[lvl], ref)
        assert torch.equal(mmdet_cell_anchors(8 * stride, [0.5, 1.0, 2.0], stride), ref)
        h, w = 5, 7
        ours = mm_model.rpn.grid_anchors(lvl, (h, w), (stride, stride), torch.device("cpu"))
        assert torch.equal(ours, _mm_grid_anchors(ref, h, w, stride))
    assert not torch.equal(mm_model.rpn.cell_anchors[0], torchvision_cell_anchors(32, [0.5, 1.0, 2.0]))  # rounded


def _deltas(n, k, seed, far=7.0):
    gen = torch.Generator().manual_seed(seed)
    d = torch.randn(n, 4 * k, generator=gen) * 2
    d[: n // 4, 2::4] = far  # beyond +log(1000 / 16)
    d[n // 4 : n // 2, 3::4] = -far  # beyond -log(1000 / 16): mmdetection clamps this side too
    return d


def test_decode_clamps_both_sides_and_centres_as_mmdetection():
    gen = torch.Generator().manual_seed(1)
    xy = torch.rand(400, 2, generator=gen) * 300
    boxes = torch.cat([xy, xy + torch.rand(400, 2, generator=gen) * 150 + 0.5], 1)
    for weights, k in (((1.0, 1.0, 1.0, 1.0), 1), ((10.0, 10.0, 5.0, 5.0), 3)):
        deltas = _deltas(400, k, seed=k)
        stds = [1 / w for w in weights]
        ours = MMDET_BOX_RULE.clip(MMDET_BOX_RULE.decode(deltas, boxes, weights), 320, 480)
        assert torch.equal(ours, _mm_delta2bbox(boxes, deltas, stds, max_shape=(320, 480)))
    # the low side: a box shrinks at most by exp(-log(1000 / 16)) = 16 / 1000; the one-sided rule lets it vanish
    box, d = torch.tensor([[0.0, 0.0, 1000.0, 1000.0]]), torch.tensor([[0.0, 0.0, -20.0, -20.0]])
    ours = MMDET_BOX_RULE.decode(d, box, (1.0, 1.0, 1.0, 1.0))[0]
    assert float(ours[2] - ours[0]) == pytest.approx(16.0, rel=1e-5)
    assert float(decode_boxes(d, box, (1.0, 1.0, 1.0, 1.0))[0, 2] - decode_boxes(d, box, (1.0,) * 4)[0, 0]) < 1e-3


def test_level_epsilon_inside_the_log_at_a_boundary():
    # sqrt(area) a hair under 112 = 2 * 56: floor(log2(s / 56)) is 0, but the 1e-6 inside the log lifts it to 1
    side = torch.tensor(112 * (1 - 5e-7), dtype=torch.float32)
    b = torch.stack([torch.tensor(0.0), torch.tensor(0.0), side, torch.tensor(112.0)])[None]
    rois = torch.cat([torch.zeros(1, 1), b], 1)
    assert float(torch.floor(torch.log2(torch.sqrt(side * 112) / 56))) == 0.0
    assert _mm_levels(rois).tolist() == [1] and mmdet_levels(b, 2, 5).tolist() == [1]  # P3
    assert detectron2_levels(b, 2, 5).tolist() == [0]  # detectron2's 1e-8 at the 224 scale: P2
    gen = torch.Generator().manual_seed(2)
    xy = torch.rand(3000, 2, generator=gen) * 500
    boxes = torch.cat([xy, xy + torch.rand(3000, 2, generator=gen) ** 2 * 700], 1)
    rois = torch.cat([torch.zeros(len(boxes), 1), boxes], 1)
    assert torch.equal(mmdet_levels(boxes, 2, 5), _mm_levels(rois))


# ------------------------------------------------------------------------------- mmcv's NMS


def _tied_boxes(n, seed, groups=1):
    """``n`` boxes in clusters that overlap above 0.7, their scores drawn from a few values (many ties)."""
    gen = torch.Generator().manual_seed(seed)
    ctr = torch.rand(n // 10, 2, generator=gen) * 200
    half = torch.rand(n // 10, 2, generator=gen) * 30 + 5
    base = torch.cat([ctr - half, ctr + half], 1).repeat(10, 1)
    boxes = base + (torch.rand(n, 4, generator=gen) - 0.5) * 3
    scores = torch.tensor([0.9, 0.8, 0.8, 0.5, 1.0])[torch.randint(0, 5, (n,), generator=gen)]
    return boxes, scores, torch.randint(0, groups, (n,), generator=gen)


def test_nms_kernel_is_mmcvs_and_ties_decide():
    """mmcv's kernel ranks by PyTorch's unstable sort: among tied scores the first in that order suppresses the
    others; torchvision's stable sort keeps the lowest index instead."""
    boxes, scores, _ = _tied_boxes(400, seed=3)
    for thr in (0.3, 0.5, 0.7):
        assert torch.equal(mmcv_nms(boxes, scores, thr), _mm_nms_kernel(boxes, scores, thr)), thr
    same = torch.tensor([[10.0, 10.0, 50.0, 50.0]]).repeat(40, 1) + torch.arange(40.0)[:, None] * 0.01
    tied = torch.full((40,), 0.8)
    kept, kept_tv = mmcv_nms(same, tied, 0.5), tv_nms(same, tied, 0.5)
    assert torch.equal(kept, _mm_nms_kernel(same, tied, 0.5)) and len(kept) == 1
    assert kept.tolist() == [int(tied.sort(descending=True)[1][0])] and kept.tolist() != kept_tv.tolist()


def test_nms_threshold_is_compared_in_float32():
    """IoU exactly 0.5 (areas 100 and 50, nested); a threshold just under 0.5 rounds up to 0.5 in float32, and
    mmcv's strict compare then keeps both boxes, where a double compare (torchvision) would suppress."""
    boxes, scores = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 5.0]]), torch.tensor([0.9, 0.8])
    thr = 0.5 - 1e-12
    assert float(torch.tensor(thr, dtype=torch.float32)) == 0.5
    assert _mm_nms_kernel(boxes, scores, thr).tolist() == [0, 1] == mmcv_nms(boxes, scores, thr).tolist()
    assert tv_nms(boxes, scores, thr).tolist() == [0]
    assert mmcv_nms(boxes, scores, 0.49).tolist() == [0]


def test_group_shift_rounds_the_iou_and_decides():
    """batched_nms shifts group g by g * (max coordinate + 1): in float32 the shifted corners round (label 79 of
    boxes up to 1300 pixels: a shift near 100000, corners on a 1/128 grid), and an IoU near the threshold can land
    on the other side. Such pairs are found here; mmcv's decision is the one kept."""
    gen = torch.Generator().manual_seed(4)
    n = 5000
    a = torch.rand(n, 4, generator=gen) * 1000
    a[:, 2:] = a[:, :2] + 50 + torch.rand(n, 2, generator=gen) * 250
    dx = (a[:, 2] - a[:, 0]) / 3 + (torch.rand(n, generator=gen) - 0.5) * 0.02  # IoU (w - dx) / (w + dx) near 0.5
    b = a + torch.stack([dx, torch.zeros(n), dx, torch.zeros(n)], 1)
    pairs = torch.stack([a, b], 1)  # (n, 2, 4)
    shift = 79 * (pairs.flatten(1).max(1).values + torch.tensor(1).to(a))

    def iou(p, q):  # the kernel's float32 IoU of p (ranked first) and q
        wh = (torch.minimum(p[:, 2:], q[:, 2:]) - torch.maximum(p[:, :2], q[:, :2])).clamp(min=0)
        inter = wh[:, 0] * wh[:, 1]
        return inter / ((p[:, 2] - p[:, 0]) * (p[:, 3] - p[:, 1]) + (q[:, 2] - q[:, 0]) * (q[:, 3] - q[:, 1]) - inter)

    plain, shifted = iou(a, b) > 0.5, iou(a + shift[:, None], b + shift[:, None]) > 0.5
    flips = torch.where(plain != shifted)[0]
    assert len(flips) >= 2
    scores, groups = torch.tensor([0.9, 0.8]), torch.tensor([79, 79])
    for i in flips[:10].tolist():
        ours = mmcv_batched_nms(pairs[i], scores, groups, 0.5)
        assert torch.equal(ours, _mm_batched_nms(pairs[i], scores, groups, 0.5))
        assert ours.tolist() == ([0] if shifted[i] else [0, 1])
        assert _mm_nms_kernel(pairs[i], scores, 0.5).tolist() != ours.tolist()  # unshifted: the other decision


def test_batched_nms_over_the_split_threshold():
    boxes, scores, groups = _tied_boxes(12000, seed=5, groups=40)
    ours = mmcv_batched_nms(boxes, scores, groups, 0.5)
    assert torch.equal(ours, _mm_batched_nms(boxes, scores, groups, 0.5))
    small = torch.arange(5000)
    assert torch.equal(mmcv_batched_nms(boxes[small], scores[small], groups[small], 0.5),
                       _mm_batched_nms(boxes[small], scores[small], groups[small], 0.5))


# ------------------------------------------------------------------------------- RPN and box head


def _head_outputs(n, padded, seed):
    """RPN head outputs for P2..P6 of a ``padded`` input: logits with many exact sigmoid ties (saturated at 1 and
    equal values) on neighbouring anchors, deltas that reach past the clamp on both sides and out of the image."""
    gen = torch.Generator().manual_seed(seed)
    logits, deltas = [], []
    h, w = padded[0] // 4, padded[1] // 4
    for _ in range(5):
        lg = torch.randn(n, 3, h, w, generator=gen) * 3
        lg[:, :, ::3, ::2] = 30.0  # sigmoid 1.0
        lg[:, 1, 1::4, 1::3] = 2.0
        logits.append(lg)
        d = torch.randn(n, 12, h, w, generator=gen) * 0.7
        d[:, 2::4][d[:, 2::4] > 1.8] = 6.0
        d[:, 3::4][d[:, 3::4] < -1.8] = -6.0
        deltas.append(d)
        h, w = (h + 1) // 2, (w + 1) // 2
    return logits, deltas


@pytest.mark.parametrize("pre,post", [(1000, 1000), (150, 60)])
def test_rpn_proposals_are_mmdetections(pre, post):
    opts = ["MODEL.RPN.PRE_NMS_TOPK_TEST", pre, "MODEL.RPN.POST_NMS_TOPK_TEST", post]
    rpn = minidet.build_model(_cfg("r50", "", *opts)).rpn
    padded, sizes = (320, 448), [(320, 427), (301, 448)]
    logits, deltas = _head_outputs(2, padded, seed=6)
    with torch.no_grad():
        ours = rpn.select(logits, deltas, padded, sizes)
    for i, (o, size) in enumerate(zip(ours, sizes)):
        ref = _mm_rpn([lg[i] for lg in logits], [d[i] for d in deltas], size, nms_pre=pre, max_per_img=post)
        assert 0.5 * post < len(ref) <= post
        assert torch.equal(o, ref)  # the same proposals in the same order


def _images(sizes):
    ph, pw = (-(-max(s[0] for s in sizes) // 32) * 32), (-(-max(s[1] for s in sizes) // 32) * 32)
    return ImageBatch(torch.zeros(len(sizes), 3, ph, pw), list(sizes), list(sizes), [1.0] * len(sizes))


def test_box_postprocess_is_mmdetections(mm_model):
    gen = torch.Generator().manual_seed(7)
    sizes = [(320, 427), (290, 448)]
    proposals = []
    for h, w in sizes:
        xy = torch.rand(500, 2, generator=gen) * torch.tensor([w * 0.95, h * 0.95])
        proposals.append(torch.cat([xy, xy + torch.rand(500, 2, generator=gen) * 90 + 2], 1))
    logits = torch.randn(1000, 81, generator=gen) * 2.5
    logits[:, 80] += 1.0  # the background, last
    deltas = _deltas(1000, 80, seed=8, far=6.0)
    same = torch.arange(0, 60, 3)  # 20 proposals of image 1 with equal scores and deltas on nearly one box
    logits[500, 7] = 12.0  # confident: among the 100 kept
    logits[500 + same], deltas[500 + same] = logits[500].clone(), deltas[500].clone()
    proposals[1][same] = proposals[1][0].clone() + torch.rand(len(same), 4, generator=gen)
    dets = mm_model.box_predictor.inference(logits, deltas, proposals, _images(sizes))
    start = 0
    for d, props, size in zip(dets, proposals, sizes):
        sl = slice(start, start + len(props))
        start += len(props)
        b, s, lab = _mm_bbox_post(logits[sl], deltas[sl], props, size)
        assert d.frame == "resized" and len(b) == 100  # the cap is reached
        assert torch.equal(d.boxes, b) and torch.equal(d.scores, s) and torch.equal(d.labels, lab)


def test_score_threshold_is_strict(mm_model):
    gen = torch.Generator().manual_seed(9)
    props = [torch.tensor([[10.0, 10.0, 60.0, 70.0], [100.0, 40.0, 150.0, 90.0]])]
    logits = torch.randn(2, 81, generator=gen)
    probs = F.softmax(logits, -1)
    predictor = mm_model.box_predictor
    old = predictor.score_thresh
    try:
        predictor.score_thresh = float(probs[0, 5])  # a score exactly at the threshold is dropped
        det = predictor.inference(logits, torch.zeros(2, 320), props, _images([(200, 200)]))[0]
        kept = set(zip(det.labels.tolist(), det.scores.tolist()))
        assert (5, float(probs[0, 5])) not in kept
        assert all(s > float(probs[0, 5]) for _, s in kept) and len(kept) > 0
    finally:
        predictor.score_thresh = old


def test_empty_boxes_are_kept_rescaled_and_get_a_mask(mm_model):
    """mmdetection divides the boxes by the float32 resize factors, clips nothing and keeps empty boxes; its paste
    turns the infinite grid of an empty box into the mask's centre line."""
    sizes, orig = [(320, 427)], [(481, 641)]
    images = ImageBatch(torch.zeros(1, 3, 320, 448), sizes, orig, [320 / 481])
    boxes = torch.tensor([[20.0, 30.0, 20.0, 90.0], [100.0, 50.0, 180.0, 50.0], [-3.0, 5.0, 430.5, 322.0],
                          [40.5, 60.25, 41.0, 61.0]])
    gen = torch.Generator().manual_seed(10)
    masks = torch.rand(4, 28, 28, generator=gen)
    det = Detections(boxes, torch.rand(4, generator=gen), torch.arange(4), "resized", masks)
    out = mm_model.transform.postprocess([det], images)[0]
    factor = torch.tensor([427 / 641, 320 / 481], dtype=torch.float32).repeat(2)
    assert torch.equal(out["boxes"], boxes / factor)  # bboxes /= scale_factor, nothing clipped or dropped
    ref = torch.stack([_mm_paste_one(masks[i], out["boxes"][i], 481, 641) for i in range(4)])
    assert torch.equal(out["masks"].dense(), ref)
    assert ref[0].any() and ref[1].any()  # the empty boxes' masks
    assert not paste_masks_aligned(masks[:2], out["boxes"][:2], 481, 641).dense().any()  # detectron2's gives none


def test_paste_is_mmdetections():
    gen = torch.Generator().manual_seed(11)
    masks = torch.rand(8, 28, 28, generator=gen)
    boxes = torch.tensor([[10.3, 20.7, 37.2, 47.9], [0.0, 0.0, 5.5, 3.1], [-4.0, 30.0, 60.0, 99.0],
                          [80, 5, 99.9, 44], [50.5, 50.5, 50.5, 60.0], [12.0, 3.0, 30.0, 3.0],
                          [33.3, 44.4, 33.9, 44.9], [95.0, 65.0, 130.0, 90.0]])
    ours = paste_masks_mmdet(masks, boxes, 70, 100).dense()
    ref = torch.stack([_mm_paste_one(masks[i], boxes[i], 70, 100) for i in range(len(boxes))])
    assert torch.equal(ours, ref)


def test_roi_align_is_mmcvs_kernel():
    """mmcv's CPU RoIAlign (aligned, adaptive sampling, average) is torchvision's aligned roi_align: the same
    samples, weights and order of sums; minidet pools each RoI on mmdetection's level with it."""
    gen = torch.Generator().manual_seed(12)
    feat = torch.randn(1, 3, 12, 15, generator=gen)
    rois = torch.tensor([[0, 3.2, 4.1, 40.7, 30.0], [0, -5.0, 2.0, 20.0, 55.0], [0, 10.0, 10.0, 10.5, 11.0],
                         [0, 0.0, 0.0, 60.0, 48.0]])
    ref = torch.stack([_mm_roi_align_kernel(feat[0], r[1:].tolist(), 7, 0.25) for r in rois])
    assert torch.equal(roi_align(feat, rois, (7, 7), 0.25, 0, True), ref)


# ------------------------------------------------------------------------------- whole model


@pytest.mark.slow
def test_frozen_norm_forms_give_the_same_detections(mm_files):
    path, _ = mm_files("r50")  # the norm's form is the subject, not the caps: FEWER's
    assert_norm_forms_agree(lambda *opts: _cfg("r50", path, *FEWER, *opts), images_bgr()[:2])


def test_end_to_end_caffe_style(mm_files):
    """A caffe-style file through the Predictor: COCO ids of the 80 classes (background last), widths without +1."""
    path, _ = mm_files("r50-caffe")
    p = minidet.Predictor(_cfg("r50-caffe", path))
    assert p.model.rpn.box_rule is MMDET_BOX_RULE and p.model.transform.resize is resize_mmdet and p.box_offset == 0
    out = p(structured_image(230, 311, 2))
    assert len(out["boxes"]) > 0 and out["masks"].shape == (len(out["boxes"]), 230, 311)
    coco80 = minidet.categories.category_ids("coco80")
    assert out["category_ids"].tolist() == [coco80[i] for i in out["labels"].tolist()] and len(p.class_names) == 80


def test_class_agnostic_nms_is_mmcvs():
    """``class_agnostic`` (mmdetection's Panoptic FPN): under mmcv's split threshold one NMS over the unshifted boxes
    of every class; at or above it, as mmcv, still one NMS per class (on unshifted boxes)."""
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0], [30.0, 30.0, 40.0, 40.0]])
    scores, labels = torch.tensor([0.9, 0.8, 0.7]), torch.tensor([0, 1, 1])
    assert mmcv_batched_nms(boxes, scores, labels, 0.5).tolist() == [0, 1, 2]
    assert mmcv_batched_nms(boxes, scores, labels, 0.5, class_agnostic=True).tolist() == [0, 2]
    assert MMDET_BOX_RULE.nms(boxes, scores, labels, 0.5, tv_tie_order=True, class_agnostic=True).tolist() == [0, 2]
    gen = torch.Generator().manual_seed(4)
    xy = torch.rand(10500, 2, generator=gen) * 500
    many = torch.cat([xy, xy + 5 + torch.rand(10500, 2, generator=gen) * 40], 1)
    s, g = torch.rand(10500, generator=gen), torch.randint(0, 3, (10500,), generator=gen)
    per_class = torch.cat([torch.where(g == c)[0][mmcv_nms(many[g == c], s[g == c], 0.5)] for c in range(3)]).sort()[0]
    expected = per_class[s[per_class].sort(descending=True)[1]]  # mmcv: the kept in index order, then by score
    assert torch.equal(mmcv_batched_nms(many, s, g, 0.5, class_agnostic=True), expected)
