"""``Conv2d`` (conv -> norm -> + addend -> ReLU) and its oneDNN post-op fusion: the only users of the
private torch APIs ``torch.ops.mkldnn._convolution_pointwise`` and ``torch._C._select_conv_backend``."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` whose ``forward(x, add=None)`` computes ``relu(norm(conv(x)) + add)`` (each part when present;
    ``self.norm`` is what folding uses). With ``self.fuse`` (``fuse_convs``) and no norm, a float32 CPU call outside
    autocast that PyTorch would run on oneDNN anyway runs as one oneDNN convolution with the addition and ReLU as
    post-ops: the same kernel and arithmetic (bit-identical), one pass over the output instead of three."""

    def __init__(self, *args, norm: nn.Module | None = None, relu: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.norm, self.relu, self.fuse = norm, relu, False

    def _fusable(self, x: torch.Tensor, add: torch.Tensor | None) -> bool:
        return (
            self.fuse and self.norm is None and x.dtype == torch.float32 and x.device.type == "cpu"
            and self.weight.dtype == torch.float32
            and (add is None or (add.dtype == torch.float32 and add.device.type == "cpu"))
            and not torch.is_autocast_enabled("cpu") and _onednn_backend(x, self)
        )

    def forward(self, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        if self._fusable(x, add):
            args = (self.weight, self.bias, self.padding, self.stride, self.dilation, self.groups)
            if add is None:
                return torch.ops.mkldnn._convolution_pointwise(x, *args, "relu" if self.relu else "none", [], "")
            binary = torch.ops.mkldnn._convolution_pointwise.binary
            return binary(x, add, *args, "add", None, "relu" if self.relu else None, [], "")
        x = F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        if self.norm is not None:
            x = self.norm(x)
        if add is not None:
            x = x + add
        return F.relu_(x) if self.relu else x


def _onednn_backend(x: torch.Tensor, conv: nn.Conv2d) -> bool:
    """Whether PyTorch runs this convolution with oneDNN (its choice depends on sizes and threads)."""
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is None:
        return False
    args = (conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, False, (0, 0), conv.groups, None)
    return select(x, *args) == torch._C._ConvBackend.Mkldnn


def fuse_convs(model: nn.Module, enabled: bool = True) -> int:
    """Let every ``Conv2d`` of ``model`` run fused (see ``Conv2d``) where it can; returns the count.
    Without oneDNN (``torch.backends.mkldnn``) nothing changes."""
    enabled = enabled and torch.backends.mkldnn.is_available()
    convs = [m for m in model.modules() if isinstance(m, Conv2d)]
    for m in convs:
        m.fuse = enabled
    return sum(bool(enabled) and m.norm is None for m in convs)
