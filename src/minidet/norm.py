"""Normalization layers, the norm factory, and conv->norm folding. Four frozen forms of the per-channel
``y = x * s + t``: ``FrozenBN`` recomputes ``s``, ``t`` from its statistics in every forward; ``BatchNorm`` hands
the statistics to torch's batch-norm kernel (what ``nn.BatchNorm2d`` computes in eval mode); ``Affine`` holds them
precomputed (Detectron's AffineChannel); ``fold_norms`` multiplies them into the conv before."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from .layers import Conv2d

NormFn = Callable[[int], nn.Module | None]  # channels -> a norm layer, or None for no norm


class FrozenBN(nn.Module):
    """Batch norm with fixed statistics, (N, C, H, W) -> same; ``eps`` (added to ``running_var``)
    belongs to the weights' source."""

    def __init__(self, num_channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.num_channels, self.eps = num_channels, eps
        self.register_buffer("weight", torch.ones(num_channels))
        self.register_buffer("bias", torch.zeros(num_channels))
        self.register_buffer("running_mean", torch.zeros(num_channels))
        self.register_buffer("running_var", torch.ones(num_channels))

    def scale_shift(self) -> tuple[torch.Tensor, torch.Tensor]:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        return scale, self.bias - self.running_mean * scale

    def load_stats(self, weight, bias, mean, var, eps: float) -> None:
        """Set the four statistics and the eps they were trained with."""
        with torch.no_grad():
            for name, v in (("weight", weight), ("bias", bias), ("running_mean", mean), ("running_var", var)):
                getattr(self, name).copy_(v)
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, shift = self.scale_shift()
        return x * scale.view(1, -1, 1, 1).to(x.dtype) + shift.view(1, -1, 1, 1).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}"


class BatchNorm(FrozenBN):
    """Batch norm at inference, (N, C, H, W) -> same: the statistics of ``FrozenBN`` run by torch's batch-norm kernel
    (``F.batch_norm``, not training), the arithmetic of ``nn.BatchNorm2d`` and SyncBN in eval mode, with which
    mmdetection runs its norms at test time (and detectron2 its ``FrozenBatchNorm2d`` when no gradient is needed). Its
    values differ from ``FrozenBN``'s in the last bits (the kernel's own order of the same products and sums)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


class Affine(nn.Module):
    """Per-channel ``x * scale + shift`` with precomputed buffers, (N, C, H, W) -> same; one fused op."""

    def __init__(self, num_channels: int) -> None:
        super().__init__()
        self.num_channels = num_channels
        self.register_buffer("scale", torch.ones(num_channels, 1, 1))
        self.register_buffer("shift", torch.zeros(num_channels, 1, 1))

    def scale_shift(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.scale.view(-1), self.shift.view(-1)

    def load_stats(self, weight, bias, mean, var, eps: float) -> None:
        """Precompute scale = w / sqrt(var + eps), shift = b - mean * scale."""
        with torch.no_grad():
            scale = weight * (var + eps).rsqrt()
            self.load_scale_shift(scale, bias - mean * scale)

    def load_scale_shift(self, scale: torch.Tensor, shift: torch.Tensor) -> None:
        """Load an already-folded affine (Caffe2 AffineChannel ``_s``/``_b``)."""
        with torch.no_grad():
            self.scale.copy_(scale.view(-1, 1, 1))
            self.shift.copy_(shift.view(-1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.shift.to(x.dtype), x, self.scale.to(x.dtype))

    def extra_repr(self) -> str:
        return str(self.num_channels)


def get_norm(norm: str | NormFn | None, channels: int, **kwargs) -> nn.Module | None:
    """The norm factory: ``"FrozenBN" | "BN" | "Affine" | "GN" | "" | None | callable``. kwargs: ``eps``
    (FrozenBN, BN, default 1e-5), ``num_groups`` (GN, default 32), ``gn_eps`` (GN, default 1e-5)."""
    if norm is None or norm == "":
        return None
    if callable(norm) and not isinstance(norm, str):
        return norm(channels)
    if norm == "FrozenBN":
        return FrozenBN(channels, eps=kwargs.get("eps", 1e-5))
    if norm == "BN":
        return BatchNorm(channels, eps=kwargs.get("eps", 1e-5))
    if norm == "Affine":
        return Affine(channels)
    if norm == "GN":
        return nn.GroupNorm(kwargs.get("num_groups", 32), channels, eps=kwargs.get("gn_eps", 1e-5))
    raise ValueError(f"unknown norm {norm!r}; choose one of FrozenBN, BN, Affine, GN, ''")


@torch.no_grad()
def fold_norms(model: nn.Module) -> int:
    """Fold every ``Conv2d.norm`` that is a FrozenBN, BatchNorm or Affine into its conv (``w' = w * s`` per output
    channel, ``b' = b * s + t``; GroupNorm is left alone); returns the number of folded pairs."""
    convs = [m for m in model.modules() if isinstance(m, Conv2d) and isinstance(m.norm, (FrozenBN, Affine))]
    for m in convs:
        scale, shift = m.norm.scale_shift()
        m.weight.mul_(scale.view(-1, 1, 1, 1))
        bias = shift.clone() if m.bias is None else m.bias * scale + shift
        m.bias = nn.Parameter(bias, requires_grad=False)
        m.norm = None
    return len(convs)


@torch.no_grad()
def standardize_weights(model: nn.Module, eps: float = 1e-5) -> int:
    """Weight standardization (mmcv's ``ConvWS``), once: every ``Conv2d`` followed by a norm gets the kernel
    ``(w - mean) / (std + eps)``, with the mean and the (unbiased) standard deviation of each output channel's
    weights: the kernel that ConvWS computes from its weights in every forward, by the same operations, so the conv
    computes what ConvWS does. Run after the weights are loaded and before ``fold_norms``; returns the count."""
    convs = [m for m in model.modules() if isinstance(m, Conv2d) and m.norm is not None]
    for m in convs:
        flat = m.weight.view(m.weight.shape[0], -1)
        mean = flat.mean(dim=1, keepdim=True).view(-1, 1, 1, 1)
        std = flat.std(dim=1, keepdim=True).view(-1, 1, 1, 1)
        m.weight.copy_((m.weight - mean) / (std + eps))
    return len(convs)
