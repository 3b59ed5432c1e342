"""ResNet-50/101/152 bottom-up body (stem + res2..res5) with a pluggable norm and, per stage, deformable 3x3 convs."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .layers import Conv2d, DeformConv2d
from .norm import NormFn

BLOCKS_PER_STAGE = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


class Bottleneck(nn.Module):
    """1x1 -> 3x3 -> 1x1 residual block, ReLU after the sum. ``stride_in_1x1`` puts the stride on the
    first 1x1 conv (MSRA/Caffe2 models) instead of the 3x3 (torchvision, "ResNet v1.5"). ``deform``: the 3x3 conv is
    deformable (``DeformConv2d``), given as (modulated, deformable groups)."""

    def __init__(
        self, in_channels: int, bottleneck_channels: int, out_channels: int, stride: int, norm: NormFn,
        stride_in_1x1: bool = False, num_groups: int = 1, deform: tuple[bool, int] | None = None,
    ) -> None:
        super().__init__()
        s1, s3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.shortcut = None
        if in_channels != out_channels or stride != 1:
            self.shortcut = Conv2d(in_channels, out_channels, 1, stride=stride, bias=False, norm=norm(out_channels))
        bc = bottleneck_channels
        self.conv1 = Conv2d(in_channels, bc, 1, stride=s1, bias=False, norm=norm(bc), relu=True)
        conv, more = (Conv2d, {}) if deform is None else (DeformConv2d, {"modulated": deform[0],
                                                                         "deform_groups": deform[1]})
        self.conv2 = conv(bc, bc, 3, stride=s3, padding=1, groups=num_groups, bias=False, norm=norm(bc), relu=True,
                          **more)
        # conv3's ReLU comes after the residual sum: relu(norm(conv3(.)) + identity)
        self.conv3 = Conv2d(bc, out_channels, 1, bias=False, norm=norm(out_channels), relu=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        return self.conv3(self.conv2(self.conv1(x)), add=identity)


class Stem(nn.Module):
    """7x7/2 conv + norm + ReLU + 3x3/2 max-pool: (N,3,H,W) -> (N,64,H/4,W/4)."""

    def __init__(self, norm: NormFn, out_channels: int = 64) -> None:
        super().__init__()
        self.conv1 = Conv2d(3, out_channels, 7, stride=2, padding=3, bias=False, norm=norm(out_channels), relu=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(self.conv1(x), kernel_size=3, stride=2, padding=1)


class ResNet(nn.Module):
    """Returns ``{"res2": C2, ..., "res5": C5}`` at strides 4, 8, 16, 32, with 256, 512, 1024, 2048 channels.
    ``deform_stages``: per stage (res2..res5) whether its blocks' 3x3 convs are deformable; ``deform``: their
    (modulated, deformable groups)."""

    def __init__(
        self, depth: int, norm: NormFn, stride_in_1x1: bool = False, num_groups: int = 1, width_per_group: int = 64,
        deform_stages: tuple[bool, ...] = (False,) * 4, deform: tuple[bool, int] = (False, 1),
    ) -> None:
        super().__init__()
        if depth not in BLOCKS_PER_STAGE:
            raise ValueError(f"ResNet depth must be one of {sorted(BLOCKS_PER_STAGE)}; got {depth}")
        self.stem = Stem(norm)
        in_ch, bott, out_ch = 64, num_groups * width_per_group, 256
        self.out_channels = {}  # stage name -> channels, in order
        for i, n in enumerate(BLOCKS_PER_STAGE[depth]):
            name = f"res{i + 2}"
            dcn = deform if deform_stages[i] else None
            first = Bottleneck(in_ch, bott, out_ch, 2 if i > 0 else 1, norm, stride_in_1x1, num_groups, dcn)
            rest = [Bottleneck(out_ch, bott, out_ch, 1, norm, stride_in_1x1, num_groups, dcn) for _ in range(n - 1)]
            self.add_module(name, nn.Sequential(first, *rest))
            self.out_channels[name] = out_ch
            in_ch, bott, out_ch = out_ch, bott * 2, out_ch * 2

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.stem(x)
        out = {}
        for name in self.out_channels:
            x = getattr(self, name)(x)
            out[name] = x
        return out
