"""Feature Pyramid Network: lateral 1x1 + output 3x3 convs, top-down nearest upsampling, P6."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ..layers import Conv2d
from ..norm import NormFn


class FPN(nn.Module):
    """Maps ``{"res2".."res5"}`` to ``{"p2".."p6"}``: C_k (N, in_k, H/2^k, W/2^k) -> P_k (N, out_channels,
    H/2^k, W/2^k); P6 is a stride-2 max-pool (kernel 1) of P5. With a norm, convs have no bias."""

    def __init__(self, in_channels: dict[str, int], out_channels: int, norm: NormFn) -> None:
        super().__init__()
        self.in_features = list(in_channels)  # res2..res5, fine to coarse
        for lvl, name in enumerate(self.in_features, start=2):
            ln, on = norm(out_channels), norm(out_channels)
            self.add_module(f"lateral{lvl}", Conv2d(in_channels[name], out_channels, 1, bias=ln is None, norm=ln))
            self.add_module(f"output{lvl}", Conv2d(out_channels, out_channels, 3, padding=1, bias=on is None, norm=on))

    def forward(self, feats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        inner, outs = None, []
        for lvl, name in reversed(list(enumerate(self.in_features, start=2))):  # coarse to fine, top-down
            feat = feats[name]
            top_down = None if inner is None else F.interpolate(inner, size=feat.shape[-2:], mode="nearest")
            inner = getattr(self, f"lateral{lvl}")(feat, add=top_down)
            outs.insert(0, getattr(self, f"output{lvl}")(inner))
        result = {f"p{lvl}": o for lvl, o in enumerate(outs, start=2)}
        if torch.compiler.is_exporting():  # the same values; OpenVINO's CPU plugin zeroes a kernel-1 max-pool fed
            # by an int8 convolution (2026.4), a strided slice it computes right
            result[f"p{len(outs) + 2}"] = outs[-1][:, :, ::2, ::2]
        else:
            result[f"p{len(outs) + 2}"] = F.max_pool2d(outs[-1], kernel_size=1, stride=2, padding=0)
        return result


def build(cfg, in_channels: dict[str, int], norm: Callable[[bool], NormFn]) -> FPN:
    """The FPN of ``cfg`` (``MODEL.FPN``) over a body's stages ``in_channels``; ``norm(on)``: the config's norm, or
    none where not ``on``."""
    return FPN(in_channels, cfg.MODEL.FPN.OUT_CHANNELS, norm(cfg.MODEL.FPN.USE_NORM))
