"""``Conv2d`` (conv -> norm -> + addend -> ReLU) and its oneDNN post-op fusion (``fuse_convs``, same values); the
``fuse_linears`` layers (same values up to the float summation order): ``Linear`` (linear -> ReLU), ``Deconv``
(a stride = kernel transposed conv -> ReLU) and ``ClassConv1x1`` (a per-class 1x1 predictor). The only users of the
private torch APIs ``torch.ops.mkldnn._convolution_pointwise``, ``torch._C._select_conv_backend``,
``torch.ops.mkldnn._linear_pointwise`` and ``torch.ops.mkldnn._reorder_linear_weight``."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.ops import deform_conv2d


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


class DeformConv2d(Conv2d):
    """A deformable convolution (v1; ``modulated``: v2) through ``torchvision.ops.deform_conv2d``, then norm, addend
    and ReLU as ``Conv2d`` (never fused: oneDNN has no deformable convolution). Its sampling offsets come from
    ``self.offset``, a plain conv of the same kernel, stride and padding on the same input: per deformable group and
    kernel tap a (dy, dx) pair, then (``modulated``) the taps' mask logits, which a sigmoid turns into their weights
    (the layout of mmcv's, detectron2's and torchvision's kernels alike)."""

    def __init__(self, *args, deform_groups: int = 1, modulated: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.modulated, self.deform_groups = modulated, deform_groups
        taps = self.kernel_size[0] * self.kernel_size[1]
        self.offset = nn.Conv2d(self.in_channels, (3 if modulated else 2) * deform_groups * taps, self.kernel_size,
                                stride=self.stride, padding=self.padding, dilation=self.dilation)

    def forward(self, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        out, mask = self.offset(x), None
        if self.modulated:  # the first two thirds are the offsets, the last the mask logits
            n = out.shape[1] // 3
            out, mask = out[:, : 2 * n], out[:, 2 * n :].sigmoid()
        x = deform_conv2d(x, out, self.weight, self.bias, self.stride, self.padding, self.dilation, mask)
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
    convs = [m for m in model.modules() if isinstance(m, Conv2d) and not isinstance(m, DeformConv2d)]
    for m in convs:
        m.fuse = enabled
    return sum(bool(enabled) and m.norm is None for m in convs)


def _cpu_float32(*tensors: torch.Tensor | None) -> bool:
    """Whether a call on ``tensors`` (None: absent) takes a ``fuse_linears`` path: float32 CPU tensors, outside
    autocast and autograd."""
    return (
        all(t is None or (t.dtype == torch.float32 and t.device.type == "cpu") for t in tensors)
        and not torch.is_autocast_enabled("cpu") and not torch.is_grad_enabled()
    )


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> torch.Tensor:
    """oneDNN inner product of rows x (N, K) with a ``_reorder_linear_weight`` (M, K) weight, bias and ReLU fused."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "relu" if relu else "none", [], "")


class _PackedWeights:
    """Mixin: the module's ``weight`` reordered for oneDNN, in ``self._prepared`` by a key, built by
    ``self._pack(weight, key)``: a cache, not a parameter, used while the weight is the same tensor at the same
    version (the alias kept holds its memory, so no other tensor can take its address), dropped when the module
    moves or converts (``_apply``) and left out of pickles and copies (oneDNN's opaque tensors have no storage)."""

    def _packed(self, key) -> torch.Tensor:
        w = self.weight
        try:
            version = w._version
        except RuntimeError:  # an inference tensor (made under inference_mode): no version counter, no cache
            version = None
        hit = self._prepared.get(key)
        if version is not None and hit is not None and hit[0].data_ptr() == w.data_ptr() and hit[1] == version:
            return hit[2]
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(self._pack(w.detach(), key).contiguous())
        if version is not None:
            self._prepared[key] = (w.detach(), version, packed)
        return packed

    def _apply(self, fn, recurse=True):
        self._prepared = {}  # moved or converted: rebuilt on the next fused call
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_prepared": {}}


class Linear(_PackedWeights, nn.Linear):
    """``nn.Linear`` (the same parameters and state-dict keys) whose forward computes ``relu(linear(x))`` with
    ``relu``; ``flat(x)`` is ``self(x.flatten(1))``. With ``self.fuse`` (``fuse_linears``), a float32 CPU call
    outside autocast and autograd runs as one oneDNN inner product, bias and ReLU as post-ops, on the weight
    reordered once to oneDNN's blocked layout; ``flat`` of a channels-last input reads it as it lies (no copy)
    against the weight's columns permuted once to (H, W, C) order. Each product and sum is the same; only the order
    of the float additions differs from PyTorch's (MKL) path, so it is off by default. The reordered weights
    (``_PackedWeights``) cost one more copy of the weight: 49 MiB for the box head's first fc."""

    def __init__(self, *args, relu: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.relu, self.fuse = relu, False
        self._prepared: dict = {}  # column order (None or (C, H, W)) -> (weight alias, its version, packed weight)

    def _fusable(self, x: torch.Tensor) -> bool:
        return self.fuse and x.dim() == 2 and _cpu_float32(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fusable(x):
            return _linear(x, self._packed(None), self.bias, self.relu)
        x = F.linear(x, self.weight, self.bias)
        return F.relu_(x) if self.relu else x

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """``self(x.flatten(1))`` of x (N, C, H, W); fused, a channels-last x is read without the flatten's copy."""
        if self.fuse and x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            rows = x.permute(0, 2, 3, 1).flatten(1)  # a view: each row in (H, W, C) order
            if rows.shape[1] == self.in_features and self._fusable(rows):
                return _linear(rows, self._packed(tuple(x.shape[1:])), self.bias, self.relu)
        return self(x.flatten(1))

    def _pack(self, w: torch.Tensor, chw: tuple[int, int, int] | None) -> torch.Tensor:
        return w if chw is None else w.view(-1, *chw).permute(0, 2, 3, 1).reshape(len(w), -1)


class Deconv(_PackedWeights, nn.ConvTranspose2d):
    """``nn.ConvTranspose2d`` (same parameters and keys) whose forward computes ``relu(conv_transpose2d(x))`` with
    ``relu``. With stride = kernel (no overlap; the mask head's 2x2/2) and ``self.fuse`` (``fuse_linears``),
    ``blocks(x)`` of a float32 CPU x outside autocast and autograd computes the same outputs as one oneDNN inner
    product (bias and ReLU fused) of the input pixels with the packed weight: (N, H, W, kh, kw, C_out), output
    pixel (kh * i + a, kw * j + b) at [:, i, j, a, b], for a consumer that takes pixels in any order; None where
    that path does not apply."""

    def __init__(self, *args, relu: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.relu, self.fuse = relu, False
        self._prepared: dict = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        return F.relu_(x) if self.relu else x

    def blocks(self, x: torch.Tensor) -> torch.Tensor | None:
        if not (
            self.fuse and x.dim() == 4 and self.stride == self.kernel_size and self.padding == (0, 0)
            and self.output_padding == (0, 0) and self.dilation == (1, 1) and self.groups == 1
            and _cpu_float32(x, self.weight, self.bias)
        ):
            return None
        n, c, h, w = x.shape
        kh, kw = self.kernel_size
        bias = None if self.bias is None else self.bias.repeat(kh * kw)
        y = _linear(x.permute(0, 2, 3, 1).reshape(n * h * w, c), self._packed(None), bias, self.relu)
        return y.view(n, h, w, kh, kw, self.out_channels)

    def _pack(self, w: torch.Tensor, key: None) -> torch.Tensor:
        return w.permute(2, 3, 1, 0).reshape(-1, self.in_channels)  # (C_in, C_out, kh, kw) -> (kh kw C_out, C_in)


class ClassConv1x1(nn.Conv2d):
    """A 1x1 ``nn.Conv2d`` predictor of one channel per class (the mask head's; same parameters and keys), where
    each row needs only its own class: with ``self.fuse`` (``fuse_linears``), on float32 CPU input outside autocast
    and autograd (``selects``), ``forward(x, classes)`` computes just channel ``classes[r]`` of row ``r`` -> (R, 1,
    H, W) and ``pixels(p, classes)`` the same of pixels p (R, P, C) -> (R, P): one matrix-vector product per row
    instead of all K channels. The same sums in another float order; otherwise the plain convolution, all K."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.kernel_size != (1, 1) or self.stride != (1, 1) or self.padding != (0, 0) or self.groups != 1:
            raise ValueError("ClassConv1x1: a 1x1 convolution (stride 1, no padding, one group)")
        self.fuse = False

    def selects(self, x: torch.Tensor, classes: torch.Tensor | None) -> bool:
        return classes is not None and self.fuse and self.out_channels > 1 and _cpu_float32(x, self.weight, self.bias)

    def pixels(self, p: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        rows = self.weight.reshape(self.out_channels, -1)[classes]  # (R, C): each row's class
        y = torch.bmm(p, rows[:, :, None]).squeeze(2)
        return y if self.bias is None else y.add_(self.bias[classes, None])

    def forward(self, x: torch.Tensor, classes: torch.Tensor | None = None) -> torch.Tensor:
        if not (x.dim() == 4 and len(x) and self.selects(x, classes)):
            return super().forward(x)
        r, c, h, w = x.shape
        if x.is_contiguous(memory_format=torch.channels_last):
            return self.pixels(x.permute(0, 2, 3, 1).reshape(r, h * w, c), classes).view(r, 1, h, w)
        rows = self.weight.reshape(self.out_channels, c)[classes]  # (R, 1, C) @ (R, C, HW)
        y = torch.bmm(rows[:, None, :], x.reshape(r, c, h * w)).view(r, 1, h, w)
        return y if self.bias is None else y.add_(self.bias[classes].view(r, 1, 1, 1))


def fuse_linears(model: nn.Module, enabled: bool = True) -> int:
    """Let the ``Linear``, ``Deconv`` and ``ClassConv1x1`` layers of ``model`` take their oneDNN / selected-class
    paths (see each) where they can; returns the count. Without oneDNN (``torch.backends.mkldnn``) nothing
    changes."""
    enabled = enabled and torch.backends.mkldnn.is_available()
    layers = [m for m in model.modules() if isinstance(m, (Linear, Deconv, ClassConv1x1))]
    for m in layers:
        m.fuse = enabled
        if isinstance(m, _PackedWeights):
            m._prepared = {}
    return len(layers) if enabled else 0
