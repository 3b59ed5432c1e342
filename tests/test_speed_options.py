"""Exactness guard of the speed options, piece by piece (issue 5 §3).

Each fast path is compared with the reference it replaces, computed by the reference itself
(torchvision's ``roi_align`` and ``batched_nms``, the unfused convolution); the whole model
with every option is compared with torchvision in ``test_parity_torchvision.py``.
"""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import batched_nms as tv_batched_nms
from torchvision.ops import roi_align

from minidet.boxes import batched_nms
from minidet.fpn import FPN
from minidet.layers import Conv2d, fuse_convs
from minidet.poolers import MultiScaleRoIAlign, detectron2_levels, detectron_levels, torchvision_levels
from minidet.resnet import ResNet

SCALES = [1 / 4, 1 / 8, 1 / 16, 1 / 32]


def _rois(gen: torch.Generator, n: int, h: int, w: int) -> torch.Tensor:
    """Boxes of all sizes inside and around an h x w image, with the awkward ones first."""
    xy = torch.rand(n, 2, generator=gen) * torch.tensor([w, h])
    wh = torch.rand(n, 2, generator=gen) ** 3 * torch.tensor([w, h])
    b = torch.cat([xy, xy + wh], 1)
    edge = [
        [0, 0, w, h],  # the whole image
        [w - 1, h - 1, w, h],  # one pixel at the far corner
        [0, 0, 0.5, 0.3],  # smaller than a feature cell
        [-3, -3, 2, 2],  # partly outside
        [50, 50, 50, 50],  # empty
        [10, 10, 10.2, h + 40],  # thin, past the bottom
        [w + 5, h + 5, w + 60, h + 60],  # entirely outside
    ]
    b[: len(edge)] = torch.tensor(edge, dtype=torch.float32)
    return b


@pytest.mark.parametrize("sampling_ratio", [2, 0, 1, 3])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("rule", [torchvision_levels, detectron_levels, detectron2_levels])
@pytest.mark.parametrize("channels_last", [False, True])
def test_gather_roi_align_equals_torchvision(sampling_ratio, aligned, rule, channels_last):
    gen = torch.Generator().manual_seed(sampling_ratio * 7 + aligned)
    h, w = 256, 192
    feats = [torch.randn(2, 16, h // 2 ** (i + 2), w // 2 ** (i + 2), generator=gen) for i in range(4)]
    if channels_last:
        feats = [f.contiguous(memory_format=torch.channels_last) for f in feats]
    boxes = _rois(gen, 300, h, w)
    per_image = [boxes[:170], boxes[170:]]
    for size in (7, 14):
        args = (size, SCALES, sampling_ratio)
        fast = MultiScaleRoIAlign(*args, aligned=aligned, level_rule=rule, impl="gather")(feats, per_image)
        ref = MultiScaleRoIAlign(*args, aligned=aligned, level_rule=rule, impl="torchvision")(feats, per_image)
        assert fast.shape == ref.shape == (300, 16, size, size)
        # the same samples and weights; only the order of the float additions differs
        torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)


def test_gather_roi_align_single_level_matches_roi_align_call():
    """One level, plain torchvision call on the same rois (batch index, x1, y1, x2, y2)."""
    gen = torch.Generator().manual_seed(3)
    feat = torch.randn(1, 8, 40, 50, generator=gen)
    boxes = _rois(gen, 64, 160, 200) * 0.2  # all small: every box maps to P2
    pooler = MultiScaleRoIAlign(7, [1 / 4], 2, impl="gather")
    rois = torch.cat([torch.zeros(64, 1), boxes], 1)
    torch.testing.assert_close(pooler([feat], [boxes]), roi_align(feat, rois, 7, 1 / 4, 2), rtol=1e-5, atol=1e-6)


def test_gather_roi_align_no_boxes():
    feats = [torch.randn(1, 4, 8, 8)] * 4
    out = MultiScaleRoIAlign(7, SCALES, 2, impl="gather")(feats, [torch.zeros(0, 4)])
    assert out.shape == (0, 4, 7, 7)


@pytest.mark.parametrize("channels_last", [False, True])
def test_fused_convs_are_bit_identical(channels_last):
    """oneDNN post-op fusion (ReLU, residual sum, FPN top-down sum) runs the same arithmetic."""
    gen = torch.Generator().manual_seed(0)
    backbone = ResNet(50, lambda c: None).eval()
    fpn = FPN(backbone.out_channels, 32, lambda c: None).eval()
    with torch.no_grad():
        for m in [*backbone.modules(), *fpn.modules()]:
            if isinstance(m, Conv2d):  # folded convs: every conv has a bias
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
                m.bias = torch.nn.Parameter(torch.randn(m.out_channels, generator=gen) * 0.1, requires_grad=False)
    x = torch.randn(1, 3, 96, 128, generator=gen)
    if channels_last:
        backbone, fpn = backbone.to(memory_format=torch.channels_last), fpn.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        fuse_convs(backbone, False), fuse_convs(fpn, False)
        ref = fpn(backbone(x))
        n = fuse_convs(backbone) + fuse_convs(fpn)
        out = fpn(backbone(x))
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN: fusion is off")
    assert n > 50
    for k in ref:
        assert torch.equal(out[k], ref[k]), k


def test_fusion_is_skipped_where_it_does_not_apply():
    conv = Conv2d(4, 4, 3, padding=1, relu=True)
    fuse_convs(conv)
    x = torch.randn(1, 4, 8, 8)
    with torch.inference_mode():
        ref = torch.relu(torch.nn.functional.conv2d(x, conv.weight, conv.bias, padding=1))
        assert torch.equal(conv(x), ref)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast: the plain path, in bf16
            assert conv(x).dtype == torch.bfloat16
        conv.double()  # float64: the plain path
        assert torch.equal(
            conv(x.double()), torch.relu(torch.nn.functional.conv2d(x.double(), conv.weight, conv.bias, padding=1))
        )


def _nms_case(gen: torch.Generator, n: int, groups: int, tie_levels: int, clustered: bool):
    xy = torch.rand(n, 2, generator=gen) * 500
    if clustered:  # many overlapping boxes
        xy = (xy / 50).round() * 50 + torch.rand(n, 2, generator=gen) * 3
    boxes = torch.cat([xy, xy + torch.rand(n, 2, generator=gen) * 100 + 1], 1)
    scores = torch.rand(n, generator=gen)
    if tie_levels:
        scores = (scores * tie_levels).round() / tie_levels
    return boxes, scores, torch.randint(0, groups, (n,), generator=gen)


@pytest.mark.parametrize("n", [150, 900, 1001, 2600])  # both of torchvision's strategies (switch at 1000)
@pytest.mark.parametrize("tie_levels", [0, 3, 40, 1000])
def test_nms_topk_equals_full_nms(n, tie_levels):
    gen = torch.Generator().manual_seed(n + tie_levels)
    for trial in range(12):
        boxes, scores, groups = _nms_case(gen, n, 1 + trial * 3, tie_levels, clustered=trial % 2 == 0)
        thresh = 0.3 + 0.05 * trial
        for k in (1, 7, 60, 300):
            full = tv_batched_nms(boxes, scores, groups, thresh)
            fast = batched_nms(boxes, scores, groups, thresh, topk=k, tv_tie_order=True)
            assert torch.equal(fast, full[: len(fast)]), (trial, k)
            assert len(fast) >= min(k, len(full))
            if len(fast) < len(full) and len(fast) >= k:  # everything tied with the k-th is there
                assert scores[full[len(fast)]] < scores[full[k - 1]]


@pytest.mark.parametrize("n", [1001, 2600])  # torchvision's per-group strategy (its unstable final sort)
@pytest.mark.parametrize("tie_levels", [0, 40, 1000])
def test_nms_topk_stable_tie_order(n, tie_levels):
    """``tv_tie_order=False``: the same leading ``k`` boxes as torchvision and the same scores in
    the same places; only boxes of equal score may be in another order (index order here, or
    torchvision's where the full set runs: few boxes, or a tie across the ``k``-th kept box)."""
    gen = torch.Generator().manual_seed(7 * n + tie_levels)
    for trial in range(12):
        boxes, scores, groups = _nms_case(gen, n, 2 + trial, tie_levels, clustered=trial % 2 == 0)
        full = tv_batched_nms(boxes, scores, groups, 0.5)
        for k in (1, 60, 300, 1000):
            fast = batched_nms(boxes, scores, groups, 0.5, topk=k, tv_tie_order=False)
            lead = min(k, len(full))
            assert len(fast) >= lead
            assert set(fast[:lead].tolist()) == set(full[:lead].tolist()), (trial, k)
            assert torch.equal(scores[fast], scores[full[: len(fast)]])
            s = scores[fast]
            if not bool((s[1:] == s[:-1]).any()):
                assert torch.equal(fast, full[: len(fast)])
            tied = s[1:] == s[:-1]  # equal scores: index order, or torchvision's where the full set ran
            assert bool((fast[1:][tied] > fast[:-1][tied]).all()) or torch.equal(fast, full[: len(fast)])


@pytest.mark.parametrize("n", [900, 2600])
def test_nms_topk_detectron_rule(n):
    """+1 sizes and suppression at IoU >= t: the top-k path equals the full path."""
    gen = torch.Generator().manual_seed(n)
    for trial in range(6):
        boxes, scores, groups = _nms_case(gen, n, 1 + trial * 5, 20, clustered=True)
        for k in (10, 100):
            full = batched_nms(boxes, scores, groups, 0.5, offset=1, inclusive=True, tv_tie_order=True)
            fast = batched_nms(boxes, scores, groups, 0.5, offset=1, inclusive=True, topk=k, tv_tie_order=True)
            assert torch.equal(fast, full[: len(fast)])


@pytest.mark.parametrize("tie_levels", [0, 200])
def test_nms_topk_rounds_reuse_complete_groups(tie_levels):
    """Heavy overlap (few kept: the cut is lowered several times) and one small high-scoring group
    that is complete after the first round and reused; also with ties (the full-set fallback)."""
    gen = torch.Generator().manual_seed(tie_levels)
    for _ in range(20):
        n = int(torch.randint(1100, 3000, (1,), generator=gen))
        xy = (torch.rand(n, 2, generator=gen) * 300 / 60).round() * 60 + torch.rand(n, 2, generator=gen) * 2
        boxes = torch.cat([xy, xy + 50], 1)
        scores = torch.rand(n, generator=gen)
        if tie_levels:
            scores = (scores * tie_levels).round() / tie_levels
        groups = torch.randint(0, int(torch.randint(2, 8, (1,), generator=gen)), (n,), generator=gen)
        scores[groups == 0] = scores[groups == 0] * 0.01 + 0.99
        full = tv_batched_nms(boxes, scores, groups, 0.5)
        for k in (5, 40, 150):
            fast = batched_nms(boxes, scores, groups, 0.5, topk=k, tv_tie_order=True)
            assert torch.equal(fast, full[: len(fast)]) and len(fast) >= min(k, len(full))
