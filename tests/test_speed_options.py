"""Exactness guard of the speed options, piece by piece (issue 5 §3).

Each fast path is compared with the reference it replaces, computed by the reference itself
(torchvision's ``roi_align`` and ``batched_nms``, the unfused convolution); the whole model
with every option is compared with torchvision in ``test_parity_torchvision.py``.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn
from torchvision.ops import batched_nms as tv_batched_nms
from torchvision.ops import roi_align

import minidet
from minidet.bodies import resnet_body
from minidet.bodies.resnet import ResNet
from minidet.boxes import batched_nms
from minidet.heads.box import BoxHead, BoxPredictor
from minidet.heads.mask import MaskHead
from minidet.layers import ClassConv1x1, Conv2d, Deconv, Linear, fuse_convs, fuse_linears
from minidet.necks.fpn import FPN
from minidet.poolers import MultiScaleRoIAlign, detectron2_levels, detectron_levels, torchvision_levels
from minidet.predictor import prepare_model

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


@pytest.mark.slow
@pytest.mark.parametrize("channels_last", [False, True])
def test_fused_convs_are_bit_identical(channels_last):
    """oneDNN post-op fusion (ReLU, residual sum, FPN top-down sum) runs the same arithmetic."""
    gen = torch.Generator().manual_seed(0)
    backbone = ResNet(resnet_body(50), lambda c: None).eval()
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


def _box_head_and_predictor(gen: torch.Generator, num_conv: int = 0):
    """torchvision's box head (two fcs 12544 -> 1024 -> 1024) and predictor (91 classes), weights at the scale
    that keeps the activations near 1, in eval mode."""
    norm = lambda c: None  # noqa: E731
    head = BoxHead(256, 7, num_conv, 256, 2, 1024, norm).eval()
    pred = BoxPredictor(1024, 91).eval()
    with torch.no_grad():
        for m in [*head.modules(), *pred.modules()]:
            if isinstance(m, (Linear, Conv2d)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
    return head, pred


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("num_conv", [0, 1])
def test_fused_linears_equal_the_plain_path(channels_last, num_conv):
    """``MODEL.FUSE_LINEAR``: the box head's and predictor's linears on oneDNN (prepacked weights; the first fc reading
    channels-last pooled features as they lie, against its columns permuted once) give the plain path's values
    up to the order of the float additions; off, the plain path runs unchanged (bit-identical to nn.Linear)."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN: fusion is off")
    gen = torch.Generator().manual_seed(num_conv)
    head, pred = _box_head_and_predictor(gen, num_conv)
    x = torch.randn(300, 256, 7, 7, generator=gen).relu()
    if channels_last:  # as the gather RoIAlign gives them (with or without MODEL.CHANNELS_LAST)
        head, x = head.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        plain = [nn.Linear(m.in_features, m.out_features) for m in (head.fc1, head.fc2)]
        for p, m in zip(plain, (head.fc1, head.fc2)):
            p.load_state_dict(m.state_dict())
        h = x
        for i in range(num_conv):
            h = getattr(head, f"conv{i + 1}")(h)
        ref_feat = torch.relu(plain[1](torch.relu(plain[0](h.flatten(1)))))
        feat = head(x)
        assert torch.equal(feat, ref_feat)  # off: nn.Linear's arithmetic
        ref = pred(feat)
        assert fuse_linears(head) + fuse_linears(pred) == 4
        fused_feat = head(x)
        out = pred(fused_feat)
        assert fused_feat.shape == feat.shape and fused_feat.dtype == feat.dtype
        torch.testing.assert_close(fused_feat, feat, rtol=1e-5, atol=1e-5)
        for a, b in zip(out, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert not torch.equal(fused_feat, feat)  # the oneDNN path ran (another summation order)
        assert list(head.fc1._prepared) == [(256, 7, 7) if channels_last else None]  # NHWC: read as it lies
        fuse_linears(head, False)
        assert torch.equal(head(x), feat)


def test_fused_linear_weight_cache_follows_the_weight():
    """The packed weight is a cache: rebuilt after an in-place change, a load, a replacement or a move; never in
    the state dict; dropped from copies and pickles."""
    gen = torch.Generator().manual_seed(1)
    fc = Linear(64, 32, relu=True)
    keys = list(fc.state_dict())
    fuse_linears(fc)
    x = torch.randn(10, 64, generator=gen)

    def check():
        with torch.inference_mode():
            torch.testing.assert_close(fc(x), torch.relu(torch.nn.functional.linear(x, fc.weight, fc.bias)))

    check()
    with torch.no_grad():
        fc.weight.mul_(-2.0)
    check()
    fc.load_state_dict({"weight": torch.randn(32, 64, generator=gen), "bias": torch.randn(32, generator=gen)})
    check()
    fc.weight = nn.Parameter(torch.randn(32, 64, generator=gen))
    check()
    assert list(fc.state_dict()) == keys and fc._prepared
    clone = copy.deepcopy(fc)
    assert clone.fuse and not clone._prepared
    buf = io.BytesIO()
    torch.save(fc, buf)
    fc.double()
    assert not fc._prepared
    with torch.inference_mode():  # float64: the plain path
        assert torch.equal(fc(x.double()), torch.relu(torch.nn.functional.linear(x.double(), fc.weight, fc.bias)))


def test_fused_linear_is_skipped_where_it_does_not_apply():
    fc = Linear(16, 8, relu=True)
    fuse_linears(fc)
    x = torch.randn(5, 16)
    ref = torch.relu(torch.nn.functional.linear(x, fc.weight, fc.bias))
    with torch.inference_mode():
        with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast: the plain path, in bf16
            assert fc(x).dtype == torch.bfloat16
        assert fc(torch.zeros(0, 16)).shape == (0, 8)
    y = fc(x)  # autograd on: the plain path, with gradients
    assert torch.equal(y, ref) and y.requires_grad
    y.sum().backward()
    assert fc.weight.grad is not None


@pytest.mark.slow
@pytest.mark.parametrize("channels_last", [False, True])
def test_mask_predictor_of_the_selected_class_equals_the_full_one(channels_last):
    """``MODEL.FUSE_LINEAR``: the mask head's deconv runs as one oneDNN inner product and the predictor computes
    only each box's class channel, on the deconv's pixels as they come; the probabilities are the full head's for
    that class up to the order of the float additions; off: the full head, unchanged."""
    gen = torch.Generator().manual_seed(2)
    head = MaskHead(256, 2, 256, 91, lambda c: None).eval()
    with torch.no_grad():
        for m in head.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (2.0 / m.weight[0].numel()) ** 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
    x = torch.randn(40, 256, 14, 14, generator=gen).relu()
    labels = torch.randint(1, 91, (40,), generator=gen)
    if channels_last:
        head, x = head.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        full = head(x, labels)
        assert full.shape == (40, 91, 28, 28) and torch.equal(full, head(x))  # off: every class
        ref = MaskHead.select(full, labels)
        assert fuse_linears(head) == (2 if torch.backends.mkldnn.is_available() else 0)
        if not head.predictor.fuse:
            pytest.skip("no oneDNN: fusion is off")
        one = head(x, labels)
        assert one.shape == (40, 1, 28, 28)
        torch.testing.assert_close(MaskHead.select(one, labels), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(one[:, 0], full[torch.arange(40), labels], rtol=1e-5, atol=1e-5)
        assert torch.equal(head(x), full)  # no labels: every class
        with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast: the full predictor
            assert head(x, labels).shape == (40, 91, 28, 28)
    agnostic = ClassConv1x1(8, 1, 1)
    fuse_linears(agnostic)
    with torch.inference_mode():  # one channel: nothing to select
        y = torch.randn(3, 8, 5, 5)
        assert torch.equal(agnostic(y, torch.tensor([4, 0, 2])), agnostic(y))


@pytest.mark.parametrize("channels_last", [False, True])
def test_deconv_blocks_equal_the_transposed_conv(channels_last):
    """``Deconv.blocks``: the 2x2/2 transposed conv + ReLU as one inner product, each output pixel where the
    docstring says, the values of ``conv_transpose2d`` up to the float summation order; the forward unchanged."""
    gen = torch.Generator().manual_seed(3)
    deconv = Deconv(32, 16, 2, stride=2, relu=True)
    plain = nn.ConvTranspose2d(32, 16, 2, stride=2)
    plain.load_state_dict(deconv.state_dict())
    x = torch.randn(5, 32, 6, 7, generator=gen)
    if channels_last:
        deconv, x = deconv.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        ref = torch.relu(plain(x))
        assert torch.equal(deconv(x), ref) and deconv.blocks(x) is None  # off: the plain layer
        fuse_linears(deconv)
        if not deconv.fuse:
            pytest.skip("no oneDNN: fusion is off")
        y = deconv.blocks(x)
        assert y.shape == (5, 6, 7, 2, 2, 16)
        torch.testing.assert_close(y.permute(0, 5, 1, 3, 2, 4).reshape(5, 16, 12, 14), ref, rtol=1e-5, atol=1e-6)
        assert torch.equal(deconv(x), ref)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert deconv.blocks(x) is None
        overlapping = Deconv(32, 16, 3, stride=2)
        fuse_linears(overlapping)
        assert overlapping.blocks(x) is None


def test_fuse_linear_config_reaches_the_model():
    cfg = minidet.get_cfg()
    cfg.merge_from_list(["MODEL.WEIGHTS", "none"])
    model, _ = prepare_model(cfg)
    layers = [m for m in model.modules() if isinstance(m, (Linear, Deconv, ClassConv1x1))]
    assert len(layers) == 6 and not any(m.fuse for m in layers)  # off by default
    cfg.merge_from_list(["MODEL.FUSE_LINEAR", True])
    fused, _ = prepare_model(cfg)
    layers = [m for m in fused.modules() if isinstance(m, (Linear, Deconv, ClassConv1x1))]
    assert all(m.fuse for m in layers) == torch.backends.mkldnn.is_available()
    assert list(fused.state_dict()) == list(model.state_dict())


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
