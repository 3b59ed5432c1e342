"""Checkpoint loading: safe readers, one pure rename function per format, a strict matcher.

Every load ends with a ``LoadReport`` (missing / unexpected / wrong-shape keys grouped by
module). Files are read with ``torch.load(weights_only=True)``; nothing in a checkpoint
is executed.
"""

from __future__ import annotations

import logging
import os
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .norm import Affine, FrozenBN

logger = logging.getLogger("minidet")

WEIGHTS_HELP = "official weights are listed in weights/README.md (URLs and sha256)"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit the model; one-line message."""


@dataclass
class LoadReport:
    """What a load did. Keys are minidet parameter names unless stated."""

    path: str
    format: str
    loaded: int = 0
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)  # checkpoint names (after renaming)
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # name, ckpt shape, model shape
    ignored: list[str] = field(default_factory=list)  # checkpoint names dropped by design

    def __str__(self) -> str:
        lines = [f"loaded {self.loaded} tensors from {self.path} (format: {self.format})"]
        for title, keys in (
            ("missing in checkpoint", self.missing),
            ("unexpected in checkpoint", self.unexpected),
            ("ignored by design", self.ignored),
        ):
            if keys:
                lines.append(f"{title} ({len(keys)}): {_group(keys)}")
        for name, a, b in self.mismatched:
            lines.append(f"shape mismatch: {name}: checkpoint {tuple(a)} vs model {tuple(b)}")
        return "\n".join(lines)


def _group(keys: list[str]) -> str:
    """Compact listing grouped by module: ``backbone.res2.0.conv1.{weight, norm.bias}``."""
    groups: dict[str, list[str]] = defaultdict(list)
    for k in keys:
        head, _, tail = k.rpartition(".")
        groups[head].append(tail)
    parts = [f"{h}.{{{', '.join(v)}}}" if len(v) > 1 else f"{h}.{v[0]}" for h, v in groups.items()]
    if len(parts) > 12:
        parts = parts[:12] + [f"... {len(parts) - 12} more modules"]
    return "; ".join(parts)


# --------------------------------------------------------------------------- readers


def read_torch_file(path: str) -> dict[str, torch.Tensor]:
    """Read a ``torch.save`` state dict safely; unwrap ``{"model"|"state_dict": ...}``."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path} ({WEIGHTS_HELP})")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure here means "not a safe torch file"
        msg = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            msg = "refused: the pickle asks for objects outside the tensor allow-list (weights_only=True)"
        raise CheckpointError(f"{path}: cannot read as a torch checkpoint: {msg}") from None
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]
    elif isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"{path}: expected a non-empty dict of tensors, got {type(obj).__name__}")
    bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: entry {bad[0]!r} is not a tensor ({type(obj[bad[0]]).__name__})")
    return obj


# --------------------------------------------------------------------------- torchvision

_TV_RULES: list[tuple[str, str]] = [
    (r"^backbone\.body\.conv1\.", "backbone.stem.conv1."),
    (r"^backbone\.body\.bn1\.", "backbone.stem.conv1.norm."),
    (r"^backbone\.body\.layer(\d)\.(\d+)\.conv(\d)\.", lambda m: f"backbone.res{int(m[1]) + 1}.{m[2]}.conv{m[3]}."),
    (r"^backbone\.body\.layer(\d)\.(\d+)\.bn(\d)\.", lambda m: f"backbone.res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.norm."),
    (r"^backbone\.body\.layer(\d)\.0\.downsample\.0\.", lambda m: f"backbone.res{int(m[1]) + 1}.0.shortcut."),
    (r"^backbone\.body\.layer(\d)\.0\.downsample\.1\.", lambda m: f"backbone.res{int(m[1]) + 1}.0.shortcut.norm."),
    # FPN: current layout `inner_blocks.i.0.` (conv) / `.1.` (norm, v2); legacy `inner_blocks.i.`
    (r"^backbone\.fpn\.inner_blocks\.(\d)\.(?:0\.)?(weight|bias)$", lambda m: f"fpn.lateral{int(m[1]) + 2}.{m[2]}"),
    (r"^backbone\.fpn\.inner_blocks\.(\d)\.1\.", lambda m: f"fpn.lateral{int(m[1]) + 2}.norm."),
    (r"^backbone\.fpn\.layer_blocks\.(\d)\.(?:0\.)?(weight|bias)$", lambda m: f"fpn.output{int(m[1]) + 2}.{m[2]}"),
    (r"^backbone\.fpn\.layer_blocks\.(\d)\.1\.", lambda m: f"fpn.output{int(m[1]) + 2}.norm."),
    (r"^rpn\.head\.conv\.(\d)\.0\.", lambda m: f"rpn.head.convs.{m[1]}."),
    (r"^rpn\.head\.conv\.(weight|bias)$", lambda m: f"rpn.head.convs.0.{m[1]}"),  # legacy
    (r"^rpn\.head\.cls_logits\.", "rpn.head.objectness_logits."),
    (r"^rpn\.head\.bbox_pred\.", "rpn.head.anchor_deltas."),
    (r"^roi_heads\.box_head\.fc6\.", "box_head.fc1."),
    (r"^roi_heads\.box_head\.fc7\.", "box_head.fc2."),
    (r"^roi_heads\.box_head\.([0-3])\.0\.", lambda m: f"box_head.conv{int(m[1]) + 1}."),  # v2 convs
    (r"^roi_heads\.box_head\.([0-3])\.1\.", lambda m: f"box_head.conv{int(m[1]) + 1}.norm."),
    (r"^roi_heads\.box_head\.5\.", "box_head.fc1."),  # v2: index 4 is Flatten
    (r"^roi_heads\.box_predictor\.", "box_predictor."),
    (r"^roi_heads\.mask_head\.mask_fcn(\d)\.", lambda m: f"mask_head.mask_fcn{m[1]}."),  # legacy
    (r"^roi_heads\.mask_head\.(\d)\.0\.", lambda m: f"mask_head.mask_fcn{int(m[1]) + 1}."),
    (r"^roi_heads\.mask_head\.(\d)\.1\.", lambda m: f"mask_head.mask_fcn{int(m[1]) + 1}.norm."),
    (r"^roi_heads\.mask_predictor\.conv5_mask\.", "mask_head.deconv."),
    (r"^roi_heads\.mask_predictor\.mask_fcn_logits\.", "mask_head.predictor."),
]
_TV_COMPILED = [(re.compile(p), r) for p, r in _TV_RULES]


def rename_torchvision(name: str) -> str | None:
    """torchvision ``maskrcnn_resnet50_fpn`` (v1 legacy/current, v2) key -> minidet name.

    Returns None for keys dropped by design (``num_batches_tracked``); unknown keys are
    returned unchanged so the matcher reports them as unexpected.
    """
    if name.endswith("num_batches_tracked"):
        return None
    for pat, rep in _TV_COMPILED:
        m = pat.match(name)
        if m:
            new = rep(m) if callable(rep) else rep
            return new + name[m.end() :]
    return name


def is_torchvision(keys) -> bool:
    return any(k.startswith("backbone.body.") for k in keys)


def is_minidet(keys) -> bool:
    return any(k.startswith("backbone.stem.") for k in keys)


# --------------------------------------------------------------------------- matcher

_STAT_NAMES = ("weight", "bias", "running_mean", "running_var", "scale", "shift")


def match_state(
    model: nn.Module,
    src: dict[str, torch.Tensor],
    report: LoadReport,
    bn_eps: float,
) -> None:
    """Copy ``src`` (minidet names) into ``model`` by whole names; fill ``report``.

    Norm modules are filled from the statistics the checkpoint carries: batch-norm
    ``weight/bias/running_mean/running_var`` (with ``bn_eps``) or an already folded
    ``scale/shift`` (Caffe2 AffineChannel, taken as exact: FrozenBN gets identity
    statistics and eps 0). GroupNorm takes ``weight/bias``.
    """
    src = dict(src)
    norms = {n: m for n, m in model.named_modules() if isinstance(m, (FrozenBN, Affine, nn.GroupNorm))}
    for path, mod in norms.items():
        got = {s: src.pop(f"{path}.{s}") for s in _STAT_NAMES if f"{path}.{s}" in src}
        full = f"{path}.{{{', '.join(sorted(got))}}}"
        c = mod.num_channels
        for s, v in got.items():
            if v.shape != (c,):
                report.mismatched.append((f"{path}.{s}", tuple(v.shape), (c,)))
        if len(report.mismatched) and any(n.startswith(path + ".") for n, _, _ in report.mismatched):
            continue
        kind = type(mod).__name__ if not isinstance(mod, nn.GroupNorm) else "GN"
        if not got:
            report.missing.append(f"{path}.weight")
            continue
        if "scale" in got and "shift" in got:
            if isinstance(mod, FrozenBN):
                mod.load_stats(got["scale"], got["shift"], torch.zeros(c), torch.ones(c), 0.0)
            elif isinstance(mod, Affine):
                mod.load_scale_shift(got["scale"], got["shift"])
            else:
                raise CheckpointError(
                    f"{report.path}: {full} is a frozen affine (batch-norm) layer but MODEL.NORM is GN"
                )
        elif {"weight", "bias", "running_mean", "running_var"} <= got.keys():
            if isinstance(mod, nn.GroupNorm):
                raise CheckpointError(f"{report.path}: {full} holds batch-norm statistics but MODEL.NORM is GN")
            mod.load_stats(got["weight"], got["bias"], got["running_mean"], got["running_var"], bn_eps)
        elif {"weight", "bias"} == got.keys():
            if not isinstance(mod, nn.GroupNorm):
                raise CheckpointError(
                    f"{report.path}: {full} has no running statistics (a GroupNorm checkpoint?) "
                    f"but MODEL.NORM is {kind}"
                )
            with torch.no_grad():
                mod.weight.copy_(got["weight"])
                mod.bias.copy_(got["bias"])
        else:
            raise CheckpointError(f"{report.path}: incomplete norm parameters for {full}")
        report.loaded += len(got)
    own = {k: v for k, v in model.state_dict().items() if not _is_norm_key(k, norms)}
    for name, tensor in own.items():
        if name in ("pixel_mean", "pixel_std"):
            continue
        if name not in src:
            report.missing.append(name)
            continue
        v = src.pop(name)
        if tuple(v.shape) != tuple(tensor.shape):
            report.mismatched.append((name, tuple(v.shape), tuple(tensor.shape)))
            continue
        with torch.no_grad():
            tensor.copy_(v)
        report.loaded += 1
    report.unexpected.extend(sorted(src))


def _is_norm_key(key: str, norms: dict) -> bool:
    head = key.rpartition(".")[0]
    return head in norms


def load_checkpoint(
    model: nn.Module,
    path: str,
    bn_eps: float,
    allow_missing: bool = False,
    reader: Callable[[str], dict] | None = None,
) -> LoadReport:
    """Load ``path`` into ``model``; raise CheckpointError unless every weight is filled."""
    src = (reader or read_torch_file)(path)
    keys = list(src)
    if is_torchvision(keys):
        fmt, rename = "torchvision", rename_torchvision
    elif is_minidet(keys):
        fmt, rename = "minidet", lambda k: k
    else:
        raise CheckpointError(
            f"{path}: unrecognized checkpoint layout (first keys: {', '.join(keys[:3])}); "
            "expected a torchvision maskrcnn_resnet50_fpn[_v2] or minidet state dict"
        )
    report = LoadReport(path=path, format=fmt)
    renamed: dict[str, torch.Tensor] = {}
    for k, v in src.items():
        new = rename(k)
        if new is None:
            report.ignored.append(k)
        else:
            renamed[new] = v.float() if v.is_floating_point() else v
    match_state(model, renamed, report, bn_eps)
    logger.info("%s", report)
    if report.mismatched:
        name, a, b = report.mismatched[0]
        more = f" (and {len(report.mismatched) - 1} more)" if len(report.mismatched) > 1 else ""
        raise CheckpointError(f"{path}: shape mismatch for {name}: checkpoint {a} vs model {b}{more}")
    if report.missing and not allow_missing:
        raise CheckpointError(
            f"{path}: {len(report.missing)} model weights not in checkpoint: {_group(report.missing)}"
        )
    if report.unexpected:
        logger.warning("%s: %d unexpected keys ignored: %s", path, len(report.unexpected), _group(report.unexpected))
    return report
