"""Property tests of the box operations, in the torchvision (offset 0) and Detectron (+1) forms.

Every expectation is computed here from the definition in the function's docstring, in float64
or exact fractions, not by calling minidet a second time.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minidet.boxes import BBOX_XFORM_CLIP, batched_nms, clip_boxes, decode_boxes
from minidet.transform import paste_masks, paste_masks_aligned

SETTINGS = settings(max_examples=100, deadline=None)
offsets = st.sampled_from([0, 1])
reg_weights = st.sampled_from([(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0), (2.5, 7.0, 0.5, 3.0)])


@st.composite
def boxes_xyxy(draw, n_min=1, n_max=12, offset=0, low=-50.0, high=1000.0, max_side=400.0):
    """(N, 4) float64 boxes with a positive size (x2 - x1 + offset > 0)."""
    n = draw(st.integers(n_min, n_max))
    coord = st.floats(low, high, allow_nan=False, allow_infinity=False)
    side = st.floats(0.5, max_side, allow_nan=False, allow_infinity=False)
    rows = []
    for _ in range(n):
        x1, y1, w, h = draw(coord), draw(coord), draw(side), draw(side)
        rows.append([x1, y1, x1 + w - offset, y1 + h - offset])
    return torch.tensor(rows, dtype=torch.float64)


def encode(gt: torch.Tensor, ref: torch.Tensor, weights, offset: int) -> torch.Tensor:
    """The deltas that take ``ref`` to ``gt``, from the definition of the box transform:
    dx = (gx_ctr - ctr_x) / w * wx, dw = log(gw / w) * ww, sizes with +offset."""
    wx, wy, ww, wh = weights
    w = ref[:, 2] - ref[:, 0] + offset
    h = ref[:, 3] - ref[:, 1] + offset
    gw = gt[:, 2] - gt[:, 0] + offset
    gh = gt[:, 3] - gt[:, 1] + offset
    dx = (gt[:, 0] + 0.5 * gw - (ref[:, 0] + 0.5 * w)) / w * wx
    dy = (gt[:, 1] + 0.5 * gh - (ref[:, 1] + 0.5 * h)) / h * wy
    return torch.stack((dx, dy, torch.log(gw / w) * ww, torch.log(gh / h) * wh), dim=1)


# ------------------------------------------------------------------------------ encode / decode


@SETTINGS
@given(data=st.data(), offset=offsets, weights=reg_weights)
def test_decode_inverts_encode(data, offset, weights):
    ref = data.draw(boxes_xyxy(offset=offset))
    # the ground truth is at most 50x larger or smaller than its reference box per side, so that
    # log(gw / w) stays below the clamp of the decoder (log(1000 / 16) = log 62.5)
    n = len(ref)
    factors = st.floats(1 / 50, 50, allow_nan=False)
    fw = torch.tensor(data.draw(st.lists(factors, min_size=n, max_size=n)), dtype=torch.float64)
    fh = torch.tensor(data.draw(st.lists(factors, min_size=n, max_size=n)), dtype=torch.float64)
    shift = torch.tensor(data.draw(st.lists(st.floats(-300, 300), min_size=2 * n, max_size=2 * n)))
    w, h = ref[:, 2] - ref[:, 0] + offset, ref[:, 3] - ref[:, 1] + offset
    x1, y1 = ref[:, 0] + shift[:n], ref[:, 1] + shift[n:]
    gt = torch.stack((x1, y1, x1 + w * fw - offset, y1 + h * fh - offset), dim=1)

    deltas = encode(gt, ref, weights, offset)
    out = decode_boxes(deltas, ref, weights, offset)
    torch.testing.assert_close(out, gt, rtol=0, atol=1e-9 * (1 + gt.abs().max().item()))
    # float32, as the model runs it: rounding the reference box moves the result by up to the
    # rounding error times the (unweighted) deltas
    out32 = decode_boxes(deltas.float(), ref.float(), weights, offset)
    spread = 1 + (deltas / torch.tensor(weights, dtype=torch.float64)).abs().max().item()
    torch.testing.assert_close(out32.double(), gt, rtol=0, atol=4e-6 * (1 + gt.abs().max().item()) * spread)


@SETTINGS
@given(data=st.data(), offset=offsets)
def test_decode_clamps_log_sizes(data, offset):
    """Size deltas above log(1000 / 16) give exactly that growth; zero deltas give the box back."""
    ref = data.draw(boxes_xyxy(offset=offset))
    big = data.draw(st.floats(BBOX_XFORM_CLIP, 50.0))
    deltas = torch.zeros((len(ref), 4), dtype=torch.float64)
    torch.testing.assert_close(decode_boxes(deltas, ref, (1.0,) * 4, offset), ref)
    deltas[:, 2:] = big
    out = decode_boxes(deltas, ref, (1.0,) * 4, offset)
    w = ref[:, 2] - ref[:, 0] + offset
    torch.testing.assert_close(out[:, 2] - out[:, 0] + offset, w * math.exp(BBOX_XFORM_CLIP))


# ------------------------------------------------------------------------------ clipping


@SETTINGS
@given(
    boxes=st.lists(st.lists(st.floats(-3000, 3000, allow_nan=False), min_size=4, max_size=4), min_size=1, max_size=20),
    height=st.integers(1, 2000),
    width=st.integers(1, 2000),
    offset=offsets,
    batch=st.booleans(),
)
def test_clip_keeps_boxes_inside_the_image(boxes, height, width, offset, batch):
    b = torch.tensor(boxes, dtype=torch.float32)
    if batch:  # (R, 4k): several classes' boxes per row
        b = b.repeat(1, 2)
    out = clip_boxes(b, height, width, offset)
    assert out.shape == b.shape
    x, y = out[:, 0::2], out[:, 1::2]
    assert (x >= 0).all() and (x <= width - offset).all()
    assert (y >= 0).all() and (y <= height - offset).all()
    # coordinates already inside are unchanged, the others land on the nearest edge; idempotent
    expect_x = b[:, 0::2].clamp(0, width - offset)
    expect_y = b[:, 1::2].clamp(0, height - offset)
    assert torch.equal(x, expect_x) and torch.equal(y, expect_y)
    assert torch.equal(clip_boxes(out, height, width, offset), out)


# ------------------------------------------------------------------------------ NMS

# Thresholds that float32 holds exactly: the IoU of integer boxes is then compared exactly (its
# float32 quotient is correctly rounded and lands on the same side of the threshold as the
# fraction, which differs from it by far more than a rounding error unless equal). 0.7 and 0.3
# are checked too, away from the threshold, where the float32 of the fraction decides.
NMS_THRESHOLDS = [0.25, 0.375, 0.5, 0.75, 0.3, 0.7]


def iou_fraction(a, b, offset: int) -> Fraction:
    """IoU of two integer boxes with +offset sizes, as an exact fraction."""
    iw = min(a[2], b[2]) - max(a[0], b[0]) + offset
    ih = min(a[3], b[3]) - max(a[1], b[1]) + offset
    inter = max(iw, 0) * max(ih, 0)
    area = [(r[2] - r[0] + offset) * (r[3] - r[1] + offset) for r in (a, b)]
    return Fraction(inter, area[0] + area[1] - inter)


@st.composite
def nms_problems(draw, offset):
    n = draw(st.integers(1, 25))
    rows = []
    for _ in range(n):
        if rows and draw(st.booleans()):  # a shifted copy: equal sizes make IoUs on the threshold likely
            x1, y1, x2, y2 = draw(st.sampled_from(rows))
            dx, dy = draw(st.integers(-6, 6)), draw(st.integers(-2, 2))
            rows.append([x1 + dx, y1 + dy, x2 + dx, y2 + dy])
            continue
        x1, y1 = draw(st.integers(0, 40)), draw(st.integers(0, 40))
        w, h = draw(st.integers(1, 30)), draw(st.integers(1, 30))  # +offset sizes: w, h
        rows.append([x1, y1, x1 + w - offset, y1 + h - offset])
    order = draw(st.permutations(range(n)))  # distinct scores
    scores = [0.01 + 0.9 * k / n for k in order]
    groups = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    return rows, scores, groups


@SETTINGS
@given(data=st.data(), offset=offsets, inclusive=st.booleans(), thresh=st.sampled_from(NMS_THRESHOLDS))
def test_nms_keeps_a_greedy_non_overlapping_subset(data, offset, inclusive, thresh):
    rows, scores, groups = data.draw(nms_problems(offset))
    keep = batched_nms(
        torch.tensor(rows, dtype=torch.float32),
        torch.tensor(scores, dtype=torch.float32),
        torch.tensor(groups),
        thresh,
        offset,
        inclusive,
        tv_tie_order=True,
    ).tolist()
    assert len(set(keep)) == len(keep) and set(keep) <= set(range(len(rows)))
    assert [scores[k] for k in keep] == sorted((scores[k] for k in keep), reverse=True)
    t = Fraction(thresh)

    def decided(iou: Fraction) -> bool:  # non-dyadic thresholds: leave out what float32 rounding decides
        return float(t) in (0.25, 0.375, 0.5, 0.75) or abs(float(iou) - thresh) > 1e-6

    def suppresses(iou: Fraction) -> bool:
        return iou >= t if inclusive else iou > t

    kept = set(keep)
    for a in keep:  # no two kept boxes of a group overlap beyond the threshold
        for b in keep:
            if a < b and groups[a] == groups[b]:
                iou = iou_fraction(rows[a], rows[b], offset)
                assert not (decided(iou) and suppresses(iou)), (rows[a], rows[b], iou)
    for j in set(range(len(rows))) - kept:  # and every dropped box was suppressed by a better kept one
        reasons = [
            iou_fraction(rows[i], rows[j], offset) for i in keep if groups[i] == groups[j] and scores[i] > scores[j]
        ]
        assert any(suppresses(iou) or not decided(iou) for iou in reasons), (rows[j], reasons)


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("thresh", [Fraction(1, 4), Fraction(3, 8), Fraction(1, 2), Fraction(3, 4)])
def test_nms_at_exactly_the_threshold(offset, thresh):
    """Two equal boxes of side p + q (+offset sizes) overlapping by 2p have IoU 2p / (2(p + q) - 2p)
    = p / q: torchvision keeps both (IoU > t suppresses), Detectron (inclusive) only the first."""
    p, q = thresh.numerator, thresh.denominator
    side, shift = p + q, q - p
    rows = [[0, 0, side - offset, side - offset], [shift, 0, shift + side - offset, side - offset]]
    assert iou_fraction(rows[0], rows[1], offset) == thresh
    args = torch.tensor(rows, dtype=torch.float32), torch.tensor([0.9, 0.8]), torch.zeros(2, dtype=torch.int64)
    assert batched_nms(*args, float(thresh), offset, inclusive=False, tv_tie_order=True).tolist() == [0, 1]
    assert batched_nms(*args, float(thresh), offset, inclusive=True, tv_tie_order=True).tolist() == [0]


# ------------------------------------------------------------------------------ mask pasting

# Pixels whose computed value lies this close to the threshold are left out of the comparison:
# there, float32 interpolation and the float64 derivation may fall on either side.
AMBIGUOUS = 1e-4


def resize_profile(m: int, out: int) -> np.ndarray:
    """Values of one row of a full-ones M-cell mask, zero-padded by one cell on each side and
    resized bilinearly (align_corners=False) to ``out`` pixels: the source coordinate of pixel
    u is (u + 0.5) * (M + 2) / out - 0.5, clamped at 0; the padded row is 0, 1 x M, 0."""
    padded = np.r_[0.0, np.ones(m), 0.0]
    src = np.maximum((np.arange(out) + 0.5) * (m + 2) / out - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(int), m + 1)
    i1 = np.minimum(i0 + 1, m + 1)
    lam = src - i0
    return (1 - lam) * padded[i0] + lam * padded[i1]


def expected_paste(box, m: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """paste_masks of a full-ones mask from its docstring: the box expanded by (M + 2) / M about
    its centre, truncated to integers (x0, y0, x1, y1, pixel-inclusive), the padded mask resized
    to (y1 - y0 + 1, x1 - x0 + 1) there, > 0.5. Bilinear on a product of rows and columns is the
    product of the 1-D resizes. Returns the value per pixel and the region that is on.

    The expansion is done in float32, as the model's boxes are: truncation is discontinuous, so
    float64 could land on the other side of an integer."""
    b = torch.tensor(box, dtype=torch.float32)
    scale = (m + 2) / m
    ctr, half = (b[2:] + b[:2]) * 0.5, (b[2:] - b[:2]) * 0.5 * scale
    x0, y0, x1, y1 = torch.cat((ctr - half, ctr + half)).to(torch.int64).tolist()  # truncation toward 0
    w, h = max(x1 - x0 + 1, 1), max(y1 - y0 + 1, 1)
    value = np.zeros((height, width))
    prof = np.outer(resize_profile(m, h), resize_profile(m, w))
    ya, yb, xa, xb = max(y0, 0), min(y1 + 1, height), max(x0, 0), min(x1 + 1, width)
    if ya < yb and xa < xb:
        value[ya:yb, xa:xb] = prof[ya - y0 : yb - y0, xa - x0 : xb - x0]
    return value, value > 0.5


@st.composite
def paste_problems(draw):
    m = draw(st.sampled_from([1, 2, 5, 14, 28]))
    height, width = draw(st.integers(4, 60)), draw(st.integers(4, 60))
    x1 = draw(st.floats(-3, width - 1))
    y1 = draw(st.floats(-3, height - 1))
    x2 = x1 + draw(st.floats(0.5, width))
    y2 = y1 + draw(st.floats(0.5, height))
    return m, height, width, (x1, y1, x2, y2)


@SETTINGS
@given(problem=paste_problems())
def test_paste_of_a_full_mask_is_the_box_region(problem):
    """torchvision / Detectron paste (the same geometry for both conventions).

    The 0.5 level of the resized padded row lies half way between the pad cell and the first mask
    cell, i.e. on the edge of the original box (the expansion added exactly one mask cell on
    each side). So the pasted region is the box, up to the integer truncation of the expanded
    box and the pixel grid: every pixel on lies within one pixel of the box, and every pixel
    whose centre is more than 1.5 pixels inside the box is on, except where the corners of the
    box are cut (the product of two edge values below 1 can fall under 0.5: checked exactly
    against the derivation, pixel by pixel)."""
    m, height, width, box = problem
    box = torch.tensor(box, dtype=torch.float32).tolist()  # what the model holds
    got = paste_masks(torch.ones((1, m, m)), torch.tensor([box]), height, width)[0].numpy()
    value, expect = expected_paste(box, m, height, width)
    sure = np.abs(value - 0.5) > AMBIGUOUS
    assert np.array_equal(got[sure], expect[sure])

    ys, xs = np.nonzero(got)
    x1, y1, x2, y2 = box
    if len(xs):
        assert xs.min() >= math.floor(x1) - 1 and xs.max() <= math.ceil(x2) + 1
        assert ys.min() >= math.floor(y1) - 1 and ys.max() <= math.ceil(y2) + 1
    # the inner part: pixel centres at least 1.5 pixels (and one mask cell) inside each edge
    cx, cy = (x2 - x1) / m, (y2 - y1) / m
    px, py = np.arange(width) + 0.5, np.arange(height) + 0.5
    mx, my = max(1.5, 1.5 * cx), max(1.5, 1.5 * cy)
    inner = np.outer((py > y1 + my) & (py < y2 - my), (px > x1 + mx) & (px < x2 - mx))
    assert got[inner].all()


def expected_aligned(box, m: int, height: int, width: int) -> np.ndarray:
    """paste_masks_aligned of a full-ones mask, from its docstring: pixel centre (x + 0.5) maps
    to the mask coordinate s = (x + 0.5 - x1) / (x2 - x1) * M - 0.5 (grid_sample,
    align_corners=False); with zeros outside, a row of ones reads 1 on [0, M - 1], falling
    linearly to 0 at -1 and at M. Per pixel: the product of the row and column values."""
    x1, y1, x2, y2 = box

    def profile(n, lo, hi):
        s = (np.arange(n) + 0.5 - lo) / (hi - lo) * m - 0.5
        return np.clip(np.minimum(s + 1, m - s), 0.0, 1.0)

    return np.outer(profile(height, y1, y2), profile(width, x1, x2))


@SETTINGS
@given(problem=paste_problems())
def test_aligned_paste_of_a_full_mask_is_the_box_region(problem):
    """detectron2 paste: the value is >= 0.5 exactly where the pixel centre lies within half a
    mask cell outside the box's mask extent, i.e. inside the box itself (s in [-0.5, M - 0.5]
    is x + 0.5 in [x1, x2]); only corners, where two edge values below 1 multiply, are cut.
    So: every pixel on has its centre in the box, and every pixel whose centre is inside the
    box by half a mask cell in both directions is on."""
    m, height, width, box = problem
    box = torch.tensor(box, dtype=torch.float32).tolist()
    got = paste_masks_aligned(torch.ones((1, m, m)), torch.tensor([box]), height, width)[0].numpy()
    value = expected_aligned(box, m, height, width)
    sure = np.abs(value - 0.5) > AMBIGUOUS
    assert np.array_equal(got[sure], (value >= 0.5)[sure])

    x1, y1, x2, y2 = box
    px, py = np.arange(width) + 0.5, np.arange(height) + 0.5
    eps = 1e-4 * max(1.0, x2 - x1, y2 - y1)
    in_box = np.outer((py >= y1 - eps) & (py <= y2 + eps), (px >= x1 - eps) & (px <= x2 + eps))
    assert not (got & ~in_box).any()
    hx, hy = (x2 - x1) / m / 2 + eps, (y2 - y1) / m / 2 + eps
    inner = np.outer((py >= y1 + hy) & (py <= y2 - hy), (px >= x1 + hx) & (px <= x2 - hx))
    assert got[inner].all()


def test_paste_of_integer_aligned_boxes_is_exact():
    """A box whose expanded version truncates without loss (M = 28, box side a multiple of 28)
    pastes its full-ones mask exactly onto the box's pixels [x1, x2) x [y1, y2): for a 56-pixel
    side, the expanded box spans 60 cells (x1 - 2 .. x2 + 2), resized to 61 pixels."""
    box = (10.0, 4.0, 66.0, 32.0)  # 56 x 28
    got = paste_masks(torch.ones((1, 28, 28)), torch.tensor([box]), 40, 80)[0]
    expect = torch.zeros((40, 80), dtype=torch.bool)
    value, region = expected_paste(box, 28, 40, 80)
    assert (np.abs(value - 0.5) > AMBIGUOUS).all()
    expect[torch.from_numpy(region)] = True
    assert torch.equal(got, expect)
    ys, xs = torch.nonzero(got, as_tuple=True)
    assert (xs.min().item(), xs.max().item(), ys.min().item(), ys.max().item()) == (10, 66, 4, 32)
