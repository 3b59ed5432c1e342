"""Blocks that a body's stages may add to each residual block: RegNetY's squeeze-and-excitation, GCNet's global
context block (mmcv's ``ContextBlock``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


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
