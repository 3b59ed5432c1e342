"""Box-cropped masks (``minidet.masks.BoxMasks``): what reads them from the crops gives what the whole frames give —
COCO RLE byte for byte as pycocotools encodes the frame, drawings pixel for pixel as drawn from the frames."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools import mask as mask_utils

from minidet.apps.outputs.rle import encode_masks
from minidet.apps.outputs.vis import draw_instances, palette
from minidet.apps.synthetic import structured_image
from minidet.masks import BoxMasks
from minidet.transform import paste_masks, paste_masks_aligned, paste_masks_mmdet

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _random_masks(rng: np.random.Generator, n: int, h: int, w: int) -> BoxMasks:
    """``n`` masks with crops anywhere in the frame (at its edges, as tall as it, the whole of it), holes and parts."""
    crops, origins = [], []
    for k in range(n):
        kind = k % 5
        if kind == 0:  # the whole frame
            x, y, ch, cw = 0, 0, h, w
        elif kind == 1:  # as tall as the frame: runs go on from a column's bottom to the next one's top
            x, cw = int(rng.integers(0, w)), 0
            cw = int(rng.integers(1, w - x + 1))
            y, ch = 0, h
        else:
            x, y = int(rng.integers(0, w)), int(rng.integers(0, h))
            cw, ch = int(rng.integers(0, w - x + 1)), int(rng.integers(0, h - y + 1))
        crop = rng.random((ch, cw)) < rng.choice([0.1, 0.5, 0.95])
        if kind == 0 and ch * cw:
            crop[-1, -1] = True  # the frame's last pixel is in
        crops.append(torch.from_numpy(crop))
        origins.append((x, y))
    return BoxMasks(crops, origins, (h, w))


def _pycocotools(frames: np.ndarray) -> list[dict]:
    rles = mask_utils.encode(np.asfortranarray(frames.transpose(1, 2, 0).astype(np.uint8)))
    return [{"size": r["size"], "counts": r["counts"].decode("utf-8")} for r in rles]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 23), st.integers(1, 23), st.integers(0, 2**31 - 1))
def test_rle_from_crops_is_pycocotools_encoding_of_the_frames(h, w, seed):
    masks = _random_masks(np.random.default_rng(seed), 7, h, w)
    frames = masks.numpy()
    assert encode_masks(masks) == _pycocotools(frames)
    assert encode_masks(frames) == _pycocotools(frames)  # a dense stack: cut to its crops first


def test_box_masks_read_like_the_stack_they_stand_for():
    rng = np.random.default_rng(0)
    masks = _random_masks(rng, 9, 31, 47)
    frames = masks.dense()
    assert masks.shape == frames.shape == (9, 31, 47) and len(masks) == 9
    assert torch.equal(masks[3], frames[3]) and torch.equal(masks[-1], frames[-1])
    assert torch.equal(masks[torch.tensor(4)], frames[4])
    rows = np.array([True, False, True, False, False, True, True, False, True])
    for key in (slice(2, 7), [5, 1, 5], rows, torch.from_numpy(rows), torch.tensor([0, 8])):
        index = torch.from_numpy(key) if isinstance(key, np.ndarray) else key
        assert torch.equal(masks[key].dense(), frames[index])
    assert np.array_equal(np.asarray(masks), frames.numpy())
    assert torch.equal(BoxMasks.from_dense(frames).dense(), frames)
    assert torch.equal(masks.areas(), frames.flatten(1).sum(1))
    tight = BoxMasks.from_dense(frames)
    assert tight.nbytes() <= masks.nbytes()
    moved = masks.shifted(5, 2, (40, 60))
    assert torch.equal(moved.dense()[:, 2:33, 5:52], frames) and int(moved.dense().sum()) == int(frames.sum())
    both = BoxMasks.cat([masks, masks[:2]])
    assert torch.equal(both.dense(), torch.cat([frames, frames[:2]]))
    with pytest.raises(IndexError):
        masks[9]
    with pytest.raises(ValueError, match="not inside"):
        BoxMasks([torch.ones(3, 3, dtype=torch.bool)], [(45, 0)], (31, 47))


@pytest.mark.parametrize("paste", [paste_masks, paste_masks_aligned, paste_masks_mmdet])
def test_pastes_keep_their_masks_to_the_pixels_around_the_boxes(paste):
    """Each pasted mask's crop covers its box (and the paste's margin) only, whatever the frame's size."""
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand((5, 28, 28), generator=gen)
    boxes = torch.tensor([[10.0, 20.0, 60.0, 90.0], [-30.0, -10.0, 15.0, 12.0], [3990.0, 3980.0, 4100.0, 4100.0],
                          [500.0, 700.0, 500.0, 760.0], [5000.0, 5000.0, 5100.0, 5100.0]])
    masks = paste(probs, boxes, 4000, 4000)
    assert masks.shape == (5, 4000, 4000)
    assert masks.nbytes() < 5 * 80 * 90  # against 80 MB for the frames
    for i, (x0, y0, x1, y1) in enumerate(boxes.tolist()):
        rx0, ry0, rx1, ry1 = masks.region(i)
        mx, my = (x1 - x0) / 14 + 2, (y1 - y0) / 14 + 2  # the paste's margin: (M + 2) / M of the box, a pixel
        if rx1 > rx0:
            assert x0 - mx <= rx0 and rx1 <= x1 + mx and y0 - my <= ry0 and ry1 <= y1 + my


def _draw_from_frames(image, boxes, scores, masks, alpha, thresh):
    """The masks' part of the drawing made from whole frames: each blended where it is set, then outlined (the
    contours OpenCV finds in the whole frame), big ones first — what draw_instances must give from crops."""
    out = image.copy()
    colors = [tuple(c) for c in palette(len(scores)).tolist()]
    line = max(1, round(np.sqrt(image.shape[0] * image.shape[1]) / 500))
    keep = [i for i in range(len(scores)) if scores[i] >= thresh]
    for i in sorted(keep, key=lambda k: -int(masks[k].sum())):
        m = masks[i]
        if not m.any():
            continue
        color = np.array(colors[i], np.float32)
        out[m] = (out[m].astype(np.float32) * (1.0 - alpha) + color * alpha + 0.5).astype(np.uint8)
        contours, _ = cv2.findContours(m.astype(np.uint8), cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE)
        cv2.drawContours(out, contours, -1, colors[i], line, cv2.LINE_AA)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_drawing_from_crops_is_the_drawing_from_frames(seed):
    rng = np.random.default_rng(seed)
    h, w = 90, 130
    image = structured_image(h, w, seed=seed)
    masks = _random_masks(rng, 8, h, w)
    # masks with holes and several parts, some touching the frame's edges
    for k in range(3, 8):
        crop = masks.crops[k].numpy()
        if crop.size:
            smooth = cv2.GaussianBlur(crop.astype(np.float32), (0, 0), 2.0) > 0.5
            masks.crops[k] = torch.from_numpy(smooth)
    scores = rng.random(8)
    boxes = np.zeros((8, 4))
    ours = draw_instances(image, boxes, scores, None, masks, thresh=0.2, alpha=0.4, draw_boxes=False)
    ref = _draw_from_frames(image, boxes, scores, masks.numpy(), 0.4, 0.2)
    assert np.array_equal(ours, ref)
    assert np.array_equal(ours, draw_instances(image, boxes, scores, None, masks.numpy(), thresh=0.2, alpha=0.4,
                                               draw_boxes=False))
