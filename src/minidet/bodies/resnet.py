"""The bottom-up body (stem + res2..res5 of residual bottleneck blocks) with a pluggable norm: ResNet-50/101/152,
ResNeXt and RegNetX/Y alike (``bodies.Body`` gives the shapes), per stage deformable 3x3 convs, and the blocks of
``bodies.blocks`` (GC, RegNetY's squeeze-and-excitation)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..layers import Conv2d, DeformConv2d
from ..norm import NormFn
from . import Body
from .blocks import ContextBlock, SqueezeExcite


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (grouped) -> 1x1 residual block, ReLU after the sum. ``stride_in_1x1`` puts the stride on the
    first 1x1 conv (MSRA/Caffe2 models) instead of the 3x3 (torchvision, "ResNet v1.5", RegNet). ``deform``: the 3x3
    conv is deformable (``DeformConv2d``), given as (modulated, deformable groups); ``se``: SE channels after the 3x3
    (0: none); ``context``: a GC block of this ratio on the last conv's output, before the sum (0: none)."""

    def __init__(
        self, in_channels: int, bottleneck_channels: int, out_channels: int, stride: int, norm: NormFn,
        stride_in_1x1: bool = False, num_groups: int = 1, deform: tuple[bool, int] | None = None, se: int = 0,
        context: float = 0.0,
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
        self.se = SqueezeExcite(bc, se) if se else None
        # conv3's ReLU comes after the residual sum: relu(norm(conv3(.)) + identity), the GC block before the sum
        self.conv3 = Conv2d(bc, out_channels, 1, bias=False, norm=norm(out_channels), relu=not context)
        self.context = ContextBlock(out_channels, context) if context else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        y = self.conv2(self.conv1(x))
        if self.se is not None:
            y = self.se(y)
        if self.context is None:
            return self.conv3(y, add=identity)
        return F.relu_(self.context(self.conv3(y)) + identity)


class Stem(nn.Module):
    """A ``kernel`` x ``kernel`` stride-2 conv + norm + ReLU, then (``pool``) a 3x3/2 max-pool: (N, 3, H, W) ->
    (N, out_channels, H/4, W/4) (ResNet's 7x7 with the pool) or H/2, W/2 (RegNet's 3x3 without)."""

    def __init__(self, norm: NormFn, out_channels: int = 64, kernel: int = 7, pool: bool = True) -> None:
        super().__init__()
        self.pool = pool
        self.conv1 = Conv2d(3, out_channels, kernel, stride=2, padding=kernel // 2, bias=False,
                            norm=norm(out_channels), relu=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1) if self.pool else x


class ResNet(nn.Module):
    """The body ``body`` (``bodies.resnet_body`` / ``regnet_body``): returns ``{"res2": C2, ..., "res5": C5}`` at
    strides 4, 8, 16, 32 with ``body.out_channels``. Per stage (res2..res5): ``deform_stages`` whether its 3x3 convs
    are deformable, ``deform`` their (modulated, deformable groups); ``context_stages`` whether its blocks end in a GC
    block of ``context_ratio``."""

    def __init__(
        self, body: Body, norm: NormFn, stride_in_1x1: bool = False,
        deform_stages: tuple[bool, ...] = (False,) * 4, deform: tuple[bool, int] = (False, 1),
        context_stages: tuple[bool, ...] = (False,) * 4, context_ratio: float = 1 / 16,
    ) -> None:
        super().__init__()
        self.body = body  # its shapes, which a checkpoint's body is checked against (``families.check_body``)
        self.stem = Stem(norm, body.stem_channels, body.stem_kernel, body.stem_pool)
        in_ch = body.stem_channels
        self.out_channels = {}  # stage name -> channels, in order
        for i, st in enumerate(body.stages):
            name = f"res{i + 2}"
            more = {"deform": deform if deform_stages[i] else None, "context": context_ratio * context_stages[i]}
            blocks = []
            for k in range(st.blocks):
                stride = 1 if k or (i == 0 and body.stem_pool) else 2  # a ResNet's res2 follows the stem's pool
                se = st.se[k] if st.se else 0
                blocks.append(Bottleneck(in_ch, st.width, st.out, stride, norm, stride_in_1x1, st.groups, se=se,
                                         **more))
                in_ch = st.out
            self.add_module(name, nn.Sequential(*blocks))
            self.out_channels[name] = st.out

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.stem(x)
        out = {}
        for name in self.out_channels:
            x = getattr(self, name)(x)
            out[name] = x
        return out


def build(cfg, body: Body, norm: NormFn) -> ResNet:
    """The body of ``cfg`` (``bodies.BODIES``: ResNet, ResNeXt, RegNet) with its ``MODEL.RESNETS`` options: the
    stride's place, the deformable and GC stages."""
    rn = cfg.MODEL.RESNETS
    return ResNet(body, norm, rn.STRIDE_IN_1X1, tuple(rn.DEFORM_ON_PER_STAGE), (rn.DEFORM_MODULATED,
                  rn.DEFORM_NUM_GROUPS), tuple(rn.CONTEXT_ON_PER_STAGE), rn.CONTEXT_RATIO)
