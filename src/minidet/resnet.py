"""The bottom-up body (stem + res2..res5 of residual bottleneck blocks) with a pluggable norm: ResNet-50/101/152,
ResNeXt and RegNetX/Y alike (``bodies.Body`` gives the shapes), and per stage deformable 3x3 convs and GC blocks
(mmcv's ``ContextBlock``); RegNetY's squeeze-and-excitation."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .bodies import Body
from .layers import Conv2d, DeformConv2d
from .norm import NormFn


class SqueezeExcite(nn.Module):
    """x * sigmoid(expand(relu(reduce(mean of x over H, W)))), (N, C, H, W) -> same: RegNetY's SE (detectron2's,
    after pycls), ``reduce`` C -> ``channels``, ``expand`` back, both 1x1 convs with bias."""

    def __init__(self, in_channels: int, channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(in_channels, channels, 1)
        self.expand = nn.Conv2d(channels, in_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.expand(F.relu(self.reduce(F.adaptive_avg_pool2d(x, 1)))))


class ContextBlock(nn.Module):
    """GCNet's global context block (mmcv's ``ContextBlock``, attention pooling, channel add), (N, C, H, W) -> same:
    a softmax over the positions of ``mask`` (a 1x1 conv to one channel) weights the pixels into one context vector,
    which ``reduce`` (C -> C x ``ratio``), a LayerNorm, a ReLU and ``expand`` turn into a per-channel term added to
    every pixel. The operations of mmcv's, in its order."""

    def __init__(self, in_channels: int, ratio: float) -> None:
        super().__init__()
        planes = int(in_channels * ratio)
        self.mask = nn.Conv2d(in_channels, 1, 1)
        self.reduce = nn.Conv2d(in_channels, planes, 1)
        self.norm = nn.LayerNorm([planes, 1, 1])
        self.expand = nn.Conv2d(planes, in_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        weights = F.softmax(self.mask(x).reshape(n, 1, h * w), dim=2).unsqueeze(-1)  # (N, 1, HW, 1)
        context = torch.matmul(x.reshape(n, 1, c, h * w), weights).reshape(n, c, 1, 1)
        return x + self.expand(F.relu(self.norm(self.reduce(context))))


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
