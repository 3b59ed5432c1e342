"""Mask Scoring R-CNN's mask IoU head."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..layers import Conv2d, Linear


class MaskIoUHead(nn.Module):
    """Mask Scoring R-CNN's mask IoU head (mmdetection's ``MaskIoUHead``): the pooled mask features (R, C, M, M)
    beside each box's mask probabilities (R, 2M, 2M) max-pooled 2x2 to M x M, ``num_conv`` 3x3 convs + ReLU (the last
    of stride 2), ``num_fc`` fcs + ReLU, and one IoU per class; ``forward`` gives each box's own class's predicted
    IoU (R,), by which the box's score is multiplied. In an export it runs on one zero row more, whose IoU it drops:
    OpenVINO's MaxPool takes no empty batch, and the graph's count of boxes may be zero."""

    def __init__(self, in_channels: int, num_classes: int, resolution: int = 14, num_conv: int = 4,
                 conv_dim: int = 256, num_fc: int = 2, fc_dim: int = 1024) -> None:
        super().__init__()
        self.num_conv, self.num_fc = num_conv, num_fc
        c = in_channels + 1
        for i in range(num_conv):
            stride = 2 if i == num_conv - 1 else 1
            self.add_module(f"conv{i + 1}", Conv2d(c, conv_dim, 3, stride=stride, padding=1, relu=True))
            c = conv_dim
        d = c * (resolution // 2) ** 2
        for i in range(num_fc):
            self.add_module(f"fc{i + 1}", Linear(d, fc_dim, relu=True))
            d = fc_dim
        self.iou = Linear(d, num_classes)

    def forward(self, features: torch.Tensor, probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_exporting():  # one zero row more, its IoU dropped: OpenVINO's MaxPool takes no empty
            rows = [torch.cat((t, t.new_zeros((1, *t.shape[1:])))) for t in (features, probs, labels)]  # batch
            return self.ious(*rows)[:-1]
        return self.ious(features, probs, labels)

    def ious(self, features: torch.Tensor, probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The predicted IoU (R,) of each box's class (``forward``, on the rows as they are)."""
        x = torch.cat((features, F.max_pool2d(probs[:, None].to(features.dtype), 2, 2)), 1)
        for i in range(self.num_conv):
            x = getattr(self, f"conv{i + 1}")(x)
        x = x.flatten(1)
        for i in range(self.num_fc):
            x = getattr(self, f"fc{i + 1}")(x)
        iou = self.iou(x)
        return iou.gather(1, labels[:, None])[:, 0]
