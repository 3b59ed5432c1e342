"""Drawing instances, COCO RLE encoding (round trip through pycocotools) and box conversion."""

from __future__ import annotations

import colorsys
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pycocotools import mask as mask_utils

from minidet.apps.outputs.instances import coco_boxes
from minidet.apps.outputs.rle import encode_mask, encode_masks
from minidet.apps.outputs.vis import draw_instances, palette, undrawable
from minidet.apps.synthetic import structured_image

# pycocotools' decode trips a numpy 2 deprecation warning inside pycocotools itself.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

# ---------------------------------------------------------------- vis


def test_draw_options_leave_out_boxes_labels_and_mask_fill():
    """infer.py's --no-boxes, --no-labels and --mask-alpha: each part can be left out of the drawing."""
    img = structured_image(120, 160, seed=3)
    boxes, scores = np.array([[10.0, 10.0, 80.0, 60.0]]), np.array([0.9])
    mask = np.zeros((1, 120, 160), bool)
    mask[0, 20:40, 20:50] = True
    assert np.array_equal(draw_instances(img, boxes, scores, None, draw_boxes=False), img)
    box = draw_instances(img, boxes, scores, None)
    labelled = draw_instances(img, boxes, scores, ["cat"])
    assert not np.array_equal(box, img) and not np.array_equal(labelled, box)
    outline = draw_instances(img, boxes, scores, None, mask, alpha=0.0, draw_boxes=False)
    filled = draw_instances(img, boxes, scores, None, mask, alpha=0.5, draw_boxes=False)
    inside = (slice(24, 36), slice(24, 46))  # away from the outline
    assert np.array_equal(outline[inside], img[inside]) and not np.array_equal(filled[inside], img[inside])


def _scene(h: int = 200, w: int = 300):
    img = structured_image(h, w, seed=7)
    boxes = np.array([[20, 60, 120, 180], [150, 40, 290, 190], [5, 5, 25, 25]], np.float32)
    scores = np.array([0.95, 0.7, 0.3], np.float32)
    masks = np.zeros((3, h, w), bool)
    masks[0, 70:170, 30:110] = True
    masks[1, 50:180, 160:280] = True
    masks[2, 8:22, 8:22] = True
    return img, boxes, scores, ["person", "dog", "cat"], masks


def test_draw_returns_new_image():
    img, boxes, scores, labels, masks = _scene()
    before = img.copy()
    out = draw_instances(img, boxes, scores, labels, masks)
    np.testing.assert_array_equal(img, before)
    assert out is not img and out.dtype == np.uint8 and out.shape == img.shape


def test_draw_masks_blended():
    img, boxes, scores, labels, masks = _scene()
    out = draw_instances(img, boxes, scores, labels, masks)
    inner = np.zeros_like(masks[0])
    inner[90:160, 40:100] = True  # inside mask 0, away from its contour, box and label
    color = palette(3)[0].astype(np.float64)
    expect = img[inner].astype(np.float64) * 0.5 + color * 0.5
    assert np.abs(out[inner].astype(np.float64) - expect).max() <= 1.0


def test_draw_threshold():
    img, boxes, scores, labels, masks = _scene()
    out = draw_instances(img, boxes, scores, labels, masks, thresh=0.5)
    # instance 2 (score 0.3) is not drawn: its mask interior keeps the original pixels
    np.testing.assert_array_equal(out[:30, :30], img[:30, :30])
    none = draw_instances(img, boxes, scores, labels, masks, thresh=0.99)
    np.testing.assert_array_equal(none, img)
    all_drawn = draw_instances(img, boxes, scores, labels, masks, thresh=0.0)
    assert not np.array_equal(all_drawn[10:20, 10:20], img[10:20, 10:20])


def test_draw_without_masks_and_empty():
    img, boxes, scores, labels, _ = _scene()
    out = draw_instances(img, boxes, scores, labels, None)
    assert not np.array_equal(out, img)
    empty = draw_instances(img, np.zeros((0, 4)), np.zeros(0), [], np.zeros((0, *img.shape[:2]), bool))
    np.testing.assert_array_equal(empty, img)


def test_draw_deterministic():
    img, boxes, scores, labels, masks = _scene()
    a = draw_instances(img, boxes, scores, labels, masks)
    b = draw_instances(img, boxes, scores, labels, masks)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("h", "w"), [(1, 1), (8, 8), (16, 600), (900, 1400)])
def test_draw_boxes_outside_and_tiny_images(h, w):
    img = np.full((h, w, 3), 128, np.uint8)
    boxes = np.array([[-50, -50, w + 50, h + 50], [w - 1, h - 1, w + 10, h + 10], [np.nan, 0, np.inf, 5]])
    masks = np.ones((3, h, w), bool)
    out = draw_instances(img, boxes, np.ones(3), ["a very long category name", "b", "c"], masks, thresh=0)
    assert out.shape == img.shape and out.dtype == np.uint8


def test_draw_rejects_bad_shapes():
    img, boxes, scores, labels, masks = _scene()
    with pytest.raises(ValueError, match="masks"):
        draw_instances(img, boxes, scores, labels, masks[:, :10])
    with pytest.raises(ValueError, match="labels"):
        draw_instances(img, boxes, scores, labels[:2], masks)


def test_palette_distinct():
    p = palette(80).astype(int)
    assert p.shape == (80, 3)
    d = np.abs(p[:, None] - p[None]).sum(-1)
    assert (d[~np.eye(80, dtype=bool)] > 0).all()  # all different
    assert (np.abs(p[1:] - p[:-1]).sum(-1) > 60).all()  # neighbours clearly different
    np.testing.assert_array_equal(palette(5), palette(80)[:5])


def test_palette_is_hsv():
    for i, bgr in enumerate(palette(12)):
        hue, sat, val = colorsys.rgb_to_hsv(*(bgr[::-1] / 255.0))
        assert val >= 0.75 and sat >= 0.6
        if i:
            prev = colorsys.rgb_to_hsv(*(palette(i)[i - 1][::-1] / 255.0))[0]
            assert min(abs(hue - prev), 1 - abs(hue - prev)) > 0.3  # golden-ratio hue steps


# ---------------------------------------------------------------- rle


def test_encode_mask_round_trip():
    m = np.zeros((37, 53), bool)
    m[3:20, 5:40] = True
    m[25:, :7] = True
    rle = encode_mask(m)
    assert rle["size"] == [37, 53] and isinstance(rle["counts"], str)
    json.dumps(rle)
    back = mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()})
    np.testing.assert_array_equal(back.astype(bool), m)
    assert int(mask_utils.area({"size": rle["size"], "counts": rle["counts"]})) == int(m.sum())


def test_encode_masks_matches_single():
    rng = np.random.default_rng(0)
    masks = rng.random((4, 19, 23)) > 0.6
    masks[0] = False
    masks[1] = True
    many = encode_masks(masks)
    assert len(many) == 4
    for i in range(4):
        assert many[i] == encode_mask(masks[i])
        np.testing.assert_array_equal(mask_utils.decode(many[i]).astype(bool), masks[i])
    assert encode_masks(np.zeros((0, 5, 6), bool)) == []


def _pycocotools_frame(masks: np.ndarray) -> list[dict]:
    """pycocotools' own encoding of each whole frame: what encode_masks must give, byte for byte."""
    fortran = np.asfortranarray((np.asarray(masks) != 0).astype(np.uint8).transpose(1, 2, 0))
    return [{"size": [int(r["size"][0]), int(r["size"][1])], "counts": r["counts"].decode()}
            for r in mask_utils.encode(fortran)]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 24), st.integers(1, 24), st.integers(0, 2**32 - 1))
def test_encode_masks_is_pycocotools_whole_frame_encoding(h, w, seed):
    """Made from the columns a mask touches, the strings are those of pycocotools' encoding of the whole frame: masks
    at the frame's edges or away from them, empty, full, one pixel, blobs with holes."""
    rng = np.random.default_rng(seed)
    masks = np.zeros((6, h, w), bool)
    y0, x0 = rng.integers(0, h), rng.integers(0, w)
    y1, x1 = rng.integers(y0 + 1, h + 1), rng.integers(x0 + 1, w + 1)
    masks[0, y0:y1, x0:x1] = rng.random((y1 - y0, x1 - x0)) > 0.3  # a box of noise anywhere
    masks[1] = True
    masks[2, rng.integers(0, h), rng.integers(0, w)] = True
    masks[3] = rng.random((h, w)) > 0.5
    masks[4, :, x0:x1] = True  # whole columns: runs that join across columns
    assert encode_masks(masks) == _pycocotools_frame(masks)
    assert encode_masks(masks.astype(np.uint8) * 7) == _pycocotools_frame(masks)


def test_encode_masks_of_a_detector_frame():
    """100 pasted-like masks in a 720 x 1280 frame: the same strings as pycocotools' whole-frame encoding."""
    rng = np.random.default_rng(1)
    masks = np.zeros((100, 720, 1280), bool)
    for m in masks:
        y, x = rng.integers(0, 700), rng.integers(0, 1260)
        hh, ww = rng.integers(1, 720 - y + 1), rng.integers(1, 1280 - x + 1)
        yy, xx = np.ogrid[:hh, :ww]
        m[y : y + hh, x : x + ww] = ((yy - hh / 2) / (hh / 2 + 0.5)) ** 2 + ((xx - ww / 2) / (ww / 2 + 0.5)) ** 2 < 1
    assert encode_masks(masks) == _pycocotools_frame(masks)


def test_encode_non_contiguous_and_uint8():
    base = np.zeros((40, 30), np.uint8)
    base[5:25, 3:12] = 1
    view = base.T[::2]  # non-contiguous view
    np.testing.assert_array_equal(mask_utils.decode(encode_mask(view)), view)


def test_encode_rejects_bad_rank():
    with pytest.raises(ValueError):
        encode_mask(np.zeros((2, 3, 4), bool))
    with pytest.raises(ValueError):
        encode_masks(np.zeros((3, 4), bool))


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(bool, hnp.array_shapes(min_dims=3, max_dims=3, min_side=1, max_side=17)))
def test_rle_round_trip_property(masks):
    for m, rle in zip(masks, encode_masks(masks), strict=True):
        assert isinstance(rle["counts"], str)
        np.testing.assert_array_equal(mask_utils.decode(rle).astype(bool), m)


def test_coco_boxes():
    boxes = np.array([[1.5, 2.0, 11.5, 7.25], [0, 0, 0, 0]], np.float32)
    out = coco_boxes(boxes, 0)
    assert out == [[1.5, 2.0, 10.0, 5.25], [0.0, 0.0, 0.0, 0.0]]
    assert all(type(v) is float for row in out for v in row)
    assert coco_boxes(np.zeros((0, 4)), 0) == []
    json.dumps(out)


@given(st.lists(st.tuples(*[st.floats(-1e4, 1e4, width=32)] * 4), max_size=5))
def test_coco_boxes_property(rows):
    boxes = np.array(rows, np.float32).reshape(-1, 4)
    for (x1, y1, x2, y2), (x, y, w, h) in zip(boxes.astype(np.float64), coco_boxes(boxes, 0), strict=True):
        assert (x, y) == (x1, y1) and x + w == pytest.approx(x2) and y + h == pytest.approx(y2)


def test_undrawable_names_are_those_opencv_draws_with_question_marks():
    """``undrawable`` asks OpenCV itself: a name is drawable when each of its characters is drawn as itself, not as
    the ``?`` that stands in for a missing glyph (4.x's Hershey fonts: ASCII only; 5.x's font: also Latin, Cyrillic,
    Hebrew and Arabic letters). Greek and CJK are drawable by neither; ASCII by both."""
    ascii_names = ["person", "traffic light", "N/A", "a-b_c.d (e) 1/2 ~!@#$%^&*+=[]{}|;:'\",<>?`"]
    assert undrawable(ascii_names) == []
    assert undrawable(["αβγ", "cell", "中文", "cell α"]) == ["αβγ", "中文", "cell α"]
    img = np.zeros((60, 200, 3), np.uint8)
    boxes, scores = np.array([[50.0, 30.0, 150.0, 55.0]]), np.array([0.9])
    for name in ("é", "Ж"):  # drawn as themselves where undrawable says so, else exactly as "?" (one per byte)
        drawn = draw_instances(img, boxes, scores, [name])
        as_question_marks = [draw_instances(img, boxes, scores, ["?" * k]) for k in (1, 2)]
        assert (not undrawable([name])) == all(not np.array_equal(drawn, q) for q in as_question_marks), name
