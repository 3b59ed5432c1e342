"""FrozenBN == BatchNorm2d.eval() == Affine == folded conv, on non-trivial statistics."""

import pytest
import torch
from torch import nn

from minidet.layers import Conv2d
from minidet.norm import Affine, BatchNorm, FrozenBN, fold_norms, get_norm, standardize_weights


def _stats(c, gen):
    return (
        torch.rand(c, generator=gen) + 0.5,
        torch.randn(c, generator=gen),
        torch.randn(c, generator=gen) * 2,
        torch.rand(c, generator=gen) * 3 + 0.05,
    )


@pytest.mark.parametrize("eps", [0.0, 1e-5])
def test_frozen_bn_affine_fold_equal_batchnorm(eps):
    gen = torch.Generator().manual_seed(0)
    c = 16
    w, b, m, v = _stats(c, gen)
    bn = nn.BatchNorm2d(c, eps=eps).eval()
    with torch.no_grad():
        bn.weight.copy_(w), bn.bias.copy_(b), bn.running_mean.copy_(m), bn.running_var.copy_(v)
    frozen, affine = FrozenBN(c), Affine(c)
    frozen.load_stats(w, b, m, v, eps)
    affine.load_stats(w, b, m, v, eps)
    assert frozen.eps == eps
    x = torch.randn(2, c, 9, 7, generator=gen) * 3
    ref = bn(x)
    torch.testing.assert_close(frozen(x), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(affine(x), ref, rtol=1e-5, atol=1e-5)

    conv = nn.Conv2d(5, c, 3, padding=1, bias=True)
    inp = torch.randn(2, 5, 9, 7, generator=gen)
    for with_bias in (True, False):
        for norm in (FrozenBN, Affine):
            layer = Conv2d(5, c, 3, padding=1, bias=with_bias, norm=norm(c))
            layer.norm.load_stats(w, b, m, v, eps)
            with torch.no_grad():
                layer.weight.copy_(conv.weight)
                if with_bias:
                    layer.bias.copy_(conv.bias)
            expected = bn(conv(inp) if with_bias else nn.functional.conv2d(inp, conv.weight, None, 1, 1))
            assert fold_norms(layer) == 1 and layer.norm is None
            torch.testing.assert_close(layer(inp), expected, rtol=1e-4, atol=1e-4)


def test_wrong_eps_is_visible():
    """With near-zero variances, eps 0 vs 1e-5 must differ: the eps is not cosmetic."""
    c = 4
    w, b, m = torch.ones(c), torch.zeros(c), torch.zeros(c)
    v = torch.full((c,), 1e-5)
    a, z = FrozenBN(c), FrozenBN(c)
    a.load_stats(w, b, m, v, 0.0)
    z.load_stats(w, b, m, v, 1e-5)
    x = torch.ones(1, c, 2, 2)
    assert not torch.allclose(a(x), z(x), rtol=0.1)


def test_get_norm_factory():
    assert isinstance(get_norm("FrozenBN", 8, eps=0.0), FrozenBN) and get_norm("FrozenBN", 8, eps=0.0).eps == 0.0
    assert isinstance(get_norm("Affine", 8), Affine)
    gn = get_norm("GN", 64, num_groups=16)
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 16
    assert get_norm("", 8) is None and get_norm(None, 8) is None
    assert isinstance(get_norm(lambda c: nn.BatchNorm2d(c), 8), nn.BatchNorm2d)
    assert isinstance(get_norm("BN", 8, eps=1e-3), BatchNorm) and get_norm("BN", 8, eps=1e-3).eps == 1e-3
    with pytest.raises(ValueError, match="FrozenBN, BN, Affine, GN"):
        get_norm("SyncBN", 8)


def test_batch_norm_is_torchs_eval_batch_norm_and_folds():
    """``BN`` computes what ``nn.BatchNorm2d`` computes in eval mode, bit for bit (torch's kernel, which mmdetection
    runs at test time); folded into its conv it is float-order equal to the conv followed by the norm."""
    gen = torch.Generator().manual_seed(5)
    c = 16
    stats = (torch.rand(c, generator=gen) + 0.5, torch.randn(c, generator=gen), torch.randn(c, generator=gen),
             torch.rand(c, generator=gen) + 0.2)
    ours = BatchNorm(c, eps=1e-5)
    ours.load_stats(*stats, 1e-5)
    ref = nn.BatchNorm2d(c, eps=1e-5).eval()
    with torch.no_grad():
        for t, v in zip((ref.weight, ref.bias, ref.running_mean, ref.running_var), stats):
            t.copy_(v)
    x = torch.randn(2, c, 9, 11, generator=gen)
    with torch.no_grad():
        assert torch.equal(ours(x), ref(x))
    conv = Conv2d(c, c, 3, padding=1, bias=False, norm=ours)
    y = conv(x)
    assert fold_norms(conv) == 1 and conv.norm is None
    torch.testing.assert_close(conv(x), y, rtol=1e-5, atol=1e-5)


def test_fold_leaves_groupnorm():
    layer = Conv2d(4, 32, 1, bias=False, norm=nn.GroupNorm(8, 32))
    assert fold_norms(layer) == 0 and isinstance(layer.norm, nn.GroupNorm)


def test_frozen_bn_forward_is_two_ops_affine_one():
    """FrozenBN recomputes scale/shift each call; Affine only applies stored buffers."""
    f, a = FrozenBN(3), Affine(3)
    assert {n for n, _ in f.named_buffers()} == {"weight", "bias", "running_mean", "running_var"}
    assert {n for n, _ in a.named_buffers()} == {"scale", "shift"}


def test_weight_standardization_changes_the_convs_before_a_norm_only():
    """``standardize_weights``: each conv followed by a norm gets zero-mean kernels of standard deviation
    std / (std + 1e-5) per output channel; a conv without a norm keeps its kernel."""
    gen = torch.Generator().manual_seed(6)
    normed = Conv2d(8, 16, 3, padding=1, bias=False, norm=nn.GroupNorm(4, 16))
    plain = Conv2d(8, 16, 3, padding=1)
    for conv in (normed, plain):
        with torch.no_grad():
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) * 0.05 + 0.01)
    before, plain_before = normed.weight.clone(), plain.weight.clone()
    assert standardize_weights(nn.Sequential(normed, plain)) == 1
    assert torch.equal(plain.weight, plain_before)
    flat, old = normed.weight.view(16, -1), before.view(16, -1)
    torch.testing.assert_close(flat.mean(1), torch.zeros(16), atol=1e-6, rtol=0)
    torch.testing.assert_close(flat.std(1), old.std(1) / (old.std(1) + 1e-5))


def test_a_regnet_with_se_and_gc_blocks_folds_like_a_resnet():
    """The norms of a RegNetY body with GC blocks (the SE and GC layers have none) fold and turn into Affine as a
    ResNet's do: the same features up to the float order of the folded convs."""
    from minidet.bodies import regnet_body
    from minidet.bodies.resnet import ResNet

    gen = torch.Generator().manual_seed(0)
    body = regnet_body(8, 16.0, 16, 2.0, 8, se_ratio=0.25, stem_width=16)  # a small RegNetY: 4 stages
    frozen = ResNet(body, lambda c: FrozenBN(c), context_stages=(False, True, True, True), context_ratio=0.25).eval()
    affine = ResNet(body, lambda c: Affine(c), context_stages=(False, True, True, True), context_ratio=0.25).eval()
    with torch.no_grad():
        for p in frozen.parameters():  # convs: unit gain (fan-in scaled); biases and LayerNorm: small
            fan_in = p[0].numel() if p.dim() == 4 else 0
            p.copy_(torch.randn(p.shape, generator=gen) * (fan_in**-0.5 if fan_in else 0.1) + (p.dim() == 3))
        for m in frozen.modules():
            if isinstance(m, FrozenBN):
                m.load_stats(*_stats(m.num_channels, gen), 1e-5)
    state = frozen.state_dict()
    affine.load_state_dict({k: v for k, v in state.items() if k in affine.state_dict()}, strict=False)
    for m, a in zip(frozen.modules(), affine.modules()):
        if isinstance(m, FrozenBN):
            a.load_stats(m.weight, m.bias, m.running_mean, m.running_var, m.eps)
    x = torch.randn(1, 3, 64, 96, generator=gen)
    with torch.no_grad():
        ref = frozen(x)
        got_affine = affine(x)
        assert fold_norms(frozen) == sum(isinstance(m, Conv2d) for m in frozen.modules())
        folded = frozen(x)
    assert list(ref) == ["res2", "res3", "res4", "res5"] and ref["res5"].shape[1] == body.stages[-1].out
    for k in ref:
        scale = float(ref[k].abs().max())
        torch.testing.assert_close(got_affine[k], ref[k], rtol=1e-4, atol=1e-5 * scale)
        torch.testing.assert_close(folded[k], ref[k], rtol=1e-4, atol=1e-5 * scale)
