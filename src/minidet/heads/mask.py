"""The mask head: convs, deconv, a 1x1 predictor per class, and the class selection."""

from __future__ import annotations

import torch
from torch import nn

from ..layers import ClassConv1x1, Conv2d, Deconv
from ..norm import NormFn


class MaskHead(nn.Module):
    """``num_conv`` 3x3 conv(+norm)+ReLU, 2x2/2 deconv+ReLU, 1x1 predictor: (R, C, 14, 14) -> (R, K, 28, 28). With
    ``labels`` (R,) and ``fuse_linears``, only each box's class channel: (R, 1, 28, 28), the predictor taking the
    deconv's pixels in the order its one inner product gives them (``Deconv.blocks``, ``ClassConv1x1.pixels``)."""

    def __init__(self, in_channels: int, num_conv: int, conv_dim: int, num_classes: int, norm: NormFn) -> None:
        super().__init__()
        self.num_conv = num_conv
        c = in_channels
        for i in range(num_conv):
            nm = norm(conv_dim)
            self.add_module(f"mask_fcn{i + 1}", Conv2d(c, conv_dim, 3, padding=1, bias=nm is None, norm=nm, relu=True))
            c = conv_dim
        self.deconv = Deconv(c, conv_dim, 2, stride=2, relu=True)
        self.predictor = ClassConv1x1(conv_dim, num_classes, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        for i in range(self.num_conv):
            x = getattr(self, f"mask_fcn{i + 1}")(x)
        if self.predictor.selects(x, labels) and len(x):
            y = self.deconv.blocks(x)  # (R, H, W, 2, 2, C): pixel (2i + a, 2j + b) at [:, i, j, a, b]
            if y is not None:
                r, h, w, kh, kw = y.shape[:5]
                logits = self.predictor.pixels(y.view(r, h * w * kh * kw, -1), labels).view(r, h, w, kh, kw)
                return logits.permute(0, 1, 3, 2, 4).reshape(r, 1, kh * h, kw * w)
        return self.predictor(self.deconv(x), labels)

    @staticmethod
    def select(mask_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(R, K, M, M) logits, (R,) labels -> (R, M, M) probabilities of each box's class (or the one channel:
        class-agnostic masks, or the class already selected by ``forward``)."""
        if mask_logits.shape[1] > 1:  # a gather: any count of boxes, in an export too
            mask_logits = mask_logits.gather(1, labels.view(-1, 1, 1, 1).expand(-1, 1, *mask_logits.shape[2:]))
        return mask_logits[:, 0].sigmoid()
