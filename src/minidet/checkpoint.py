"""Checkpoint loading: one pure rename function per format, variant checks, a strict matcher, a ``LoadReport``.

Files are read by the safe readers of ``readers.py``; nothing in a checkpoint is executed (see SECURITY.md).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .norm import Affine, FrozenBN
from .readers import CheckpointError, read_checkpoint

logger = logging.getLogger("minidet")


@dataclass
class LoadReport:
    """What a load did. Keys are minidet parameter names unless stated."""

    path: str
    format: str
    layout: str = ""  # torchvision files: "v1 legacy", "v1" or "v2" (key layout)
    loaded: int = 0
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)  # checkpoint names (after renaming)
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # name, ckpt shape, model shape
    ignored: list[str] = field(default_factory=list)  # checkpoint names dropped by design

    @property
    def summary(self) -> str:
        """One line: ``/x/tv.pth (torchvision format, v1 legacy key layout, 313 tensors)``."""
        layout = f", {self.layout} key layout" if self.layout else ""
        return f"{os.path.abspath(self.path)} ({self.format} format{layout}, {self.loaded} tensors)"

    def __str__(self) -> str:
        lines = [f"loaded {self.loaded} tensors from {self.path} (format: {self.format})"]
        titles = ("missing in checkpoint", "unexpected in checkpoint", "ignored by design")
        listed = zip(titles, (self.missing, self.unexpected, self.ignored))
        lines += [f"{title} ({len(keys)}): {_group(keys)}" for title, keys in listed if keys]
        lines += [f"shape mismatch: {n}: checkpoint {tuple(a)} vs model {tuple(b)}" for n, a, b in self.mismatched]
        return "\n".join(lines)


def _group(keys: list[str]) -> str:
    """Compact listing grouped by module: ``backbone.res2.0.conv1.{weight, norm.bias}``."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        head, _, tail = k.rpartition(".")
        groups.setdefault(head, []).append(tail)
    parts = [f"{h}.{{{', '.join(v)}}}" if len(v) > 1 else f"{h}.{v[0]}" for h, v in groups.items()]
    if len(parts) > 12:
        parts = parts[:12] + [f"... {len(parts) - 12} more modules"]
    return "; ".join(parts)


def _rename(rules: list[tuple[str, str | Callable]], name: str) -> str:
    """``name`` with what the first matching rule's pattern matches replaced (a template or a function of the match)."""
    for pattern, rep in rules:
        if m := re.match(pattern, name):
            return (rep(m) if callable(rep) else m.expand(rep)) + name[m.end() :]
    return name


# output layer names shared by torchvision, maskrcnn-benchmark and Detectron
_RPN_OUT = {"cls_logits": "objectness_logits", "bbox_pred": "anchor_deltas"}
_MASK_OUT = {"conv5_mask": "deconv", "mask_fcn_logits": "predictor"}

_TV_RULES: list[tuple[str, str | Callable]] = [
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
    (r"^rpn\.head\.conv\.(\d)\.0\.", r"rpn.head.convs.\1."),
    (r"^rpn\.head\.conv\.(weight|bias)$", r"rpn.head.convs.0.\1"),  # legacy
    (r"^rpn\.head\.(cls_logits|bbox_pred)\.", lambda m: f"rpn.head.{_RPN_OUT[m[1]]}."),
    (r"^roi_heads\.box_head\.fc([67])\.", lambda m: f"box_head.fc{int(m[1]) - 5}."),
    (r"^roi_heads\.box_head\.([0-3])\.0\.", lambda m: f"box_head.conv{int(m[1]) + 1}."),  # v2 convs
    (r"^roi_heads\.box_head\.([0-3])\.1\.", lambda m: f"box_head.conv{int(m[1]) + 1}.norm."),
    (r"^roi_heads\.box_head\.5\.", "box_head.fc1."),  # v2: index 4 is Flatten
    (r"^roi_heads\.box_predictor\.", "box_predictor."),
    (r"^roi_heads\.mask_head\.mask_fcn(\d)\.", r"mask_head.mask_fcn\1."),  # legacy
    (r"^roi_heads\.mask_head\.(\d)\.0\.", lambda m: f"mask_head.mask_fcn{int(m[1]) + 1}."),
    (r"^roi_heads\.mask_head\.(\d)\.1\.", lambda m: f"mask_head.mask_fcn{int(m[1]) + 1}.norm."),
    (r"^roi_heads\.mask_predictor\.(conv5_mask|mask_fcn_logits)\.", lambda m: f"mask_head.{_MASK_OUT[m[1]]}."),
]


def rename_torchvision(name: str) -> str | None:
    """torchvision ``maskrcnn_resnet50_fpn`` (v1 legacy/current, v2) key -> minidet name; None for
    ``num_batches_tracked``; unknown keys come back unchanged for the matcher to report."""
    return None if name.endswith("num_batches_tracked") else _rename(_TV_RULES, name)


# the published COCO_V1 file's names (modules before torchvision's ``_version = 2``)
_TV_LEGACY = re.compile(
    r"^(backbone\.fpn\.(inner|layer)_blocks\.\d\.(weight|bias)|rpn\.head\.conv\.(weight|bias)"
    r"|roi_heads\.mask_head\.mask_fcn\d\.)"
)
_TV_V2 = re.compile(r"^(backbone\.fpn\.inner_blocks\.\d\.1\.|roi_heads\.box_head\.\d\.0\.)")


def torchvision_layout(keys) -> str:
    """``"v1 legacy"`` (the published COCO_V1 key layout), ``"v2"`` (normed FPN, conv box head) or ``"v1"``."""
    if any(_TV_LEGACY.match(k) for k in keys):
        return "v1 legacy"
    return "v2" if any(_TV_V2.match(k) for k in keys) else "v1"


# Detectron (Caffe2) blob name endings; a "bn" is an AffineChannel: an already folded frozen batch norm
_PARAM = {
    "w": "weight", "b": "bias", "bn_s": "norm.scale", "bn_b": "norm.shift", "gn_s": "norm.weight", "gn_b": "norm.bias"
}
_CONV = {"a": 1, "b": 2, "c": 3}

# whole blob name (pattern, its last group the ending) -> module (template or function of the match)
_DETECTRON_RULES: list[tuple[str, str | Callable]] = [
    (r"conv1_(w|gn_[sb])", "backbone.stem.conv1"),
    (r"res_conv1_(bn_[sb])", "backbone.stem.conv1"),
    (r"res(\d)_(\d+)_branch2([abc])_(w|[bg]n_[sb])", lambda m: f"backbone.res{m[1]}.{m[2]}.conv{_CONV[m[3]]}"),
    (r"res(\d)_0_branch1_(w|[bg]n_[sb])", r"backbone.res\1.0.shortcut"),
    (r"fpn_inner_res(\d)_\d+_sum(?:_lateral)?_([wb]|gn_[sb])", r"fpn.lateral\1"),
    (r"fpn_res(\d)_\d+_sum_([wb]|gn_[sb])", r"fpn.output\1"),
    # the RPN head is defined on P2 and shared by all levels
    (r"conv_rpn_fpn2_([wb])", "rpn.head.convs.0"),
    (r"rpn_(cls_logits|bbox_pred)_fpn2_([wb])", lambda m: f"rpn.head.{_RPN_OUT[m[1]]}"),
    (r"fc([67])_([wb])", lambda m: f"box_head.fc{int(m[1]) - 5}"),
    (r"head_conv(\d)_([wb]|gn_[sb])", r"box_head.conv\1"),
    (r"(cls_score|bbox_pred)_([wb])", r"box_predictor.\1"),
    # BN heads name the mask convs `_[mask]_fcn{j}`, GN heads `_mask_fcn{j}`
    (r"_(?:\[mask\]|mask)_fcn(\d)_([wb])", r"mask_head.mask_fcn\1"),
    (r"_mask_fcn(\d)_(gn_[sb])", r"mask_head.mask_fcn\1"),
    (r"(conv5_mask|mask_fcn_logits)_([wb])", lambda m: f"mask_head.{_MASK_OUT[m[1]]}"),
]
# preserved extras of real model-zoo files: the ImageNet classifier, and the zero biases that
# Detectron's Caffe-to-pickle converter added to bias-less convs (the model never uses them)
_DETECTRON_EXTRAS = re.compile(r"(fc1000_[wb]|pred_[wb]|conv1_b|res\d_\d+_branch(?:1|2[abc])_b)$")


def rename_detectron(name: str) -> str | None:
    """Detectron blob name -> minidet name; None for ``*_momentum`` (SGD state) and the extras above;
    unknown names come back unchanged for the matcher to report."""
    if name.endswith("_momentum") or _DETECTRON_EXTRAS.match(name):
        return None
    for pattern, rep in _DETECTRON_RULES:
        if m := re.match(pattern + "$", name):
            return f"{rep(m) if callable(rep) else m.expand(rep)}.{_PARAM[m.groups()[-1]]}"
    return name


def _check_depth(model: nn.Module, names, pattern: str, path: str) -> None:
    """Fail naming MODEL.RESNETS.DEPTH when the checkpoint's res4 has another number of blocks."""
    blocks = 1 + max((int(m[1]) for k in names if (m := re.match(pattern, k))), default=-1)
    if blocks and blocks != len(model.backbone.res4):
        depth = {6: 50, 23: 101}.get(blocks, "?")
        raise CheckpointError(
            f"{path}: ResNet-{depth} (res4 has {blocks} blocks) but the model has {len(model.backbone.res4)}; "
            f"set MODEL.RESNETS.DEPTH {depth}"
        )


def check_detectron_variant(model: nn.Module, blobs: dict, path: str) -> None:
    """Fail with the config key to change when the blobs describe another architecture."""
    stem_norm = getattr(model.backbone.stem.conv1, "norm", None)
    if "conv1_gn_s" in blobs and not isinstance(stem_norm, nn.GroupNorm):
        raise CheckpointError(
            f"{path}: a GroupNorm model (conv1_gn_s) but MODEL.NORM is {type(stem_norm).__name__}; "
            "use MODEL.NORM GN (configs/detectron/*_gn.yaml)"
        )
    if "res_conv1_bn_s" in blobs and isinstance(stem_norm, nn.GroupNorm):
        raise CheckpointError(
            f"{path}: a frozen-BN model (res_conv1_bn_s) but MODEL.NORM is GN; use MODEL.NORM Affine or FrozenBN"
        )
    _check_depth(model, blobs, r"res4_(\d+)_", path)
    convs, num_conv = "head_conv1_w" in blobs, model.box_head.num_conv
    if convs != (num_conv > 0):
        kind = "4conv1fc (head_conv1_w)" if convs else "2fc (fc7_w)"
        raise CheckpointError(f"{path}: box head is {kind} but MODEL.ROI_BOX_HEAD.NUM_CONV is {num_conv}")
    classes = model.box_predictor.cls_score.out_features
    if "cls_score_w" in blobs and (n := int(np.shape(blobs["cls_score_w"])[0])) != classes:
        raise CheckpointError(f"{path}: {n} classes (cls_score_w) but MODEL.ROI_HEADS.NUM_CLASSES is {classes}")
    w, groups = blobs.get("res2_0_branch2b_w"), model.backbone.res2[0].conv2.groups
    if w is not None and np.ndim(w) == 4 and (found := np.shape(w)[0] // np.shape(w)[1]) != groups:
        raise CheckpointError(
            f"{path}: grouped 3x3 convs with {found} groups (ResNeXt) but MODEL.RESNETS.NUM_GROUPS is {groups}"
        )


_D2_RULES: list[tuple[str, str]] = [
    (r"^backbone\.bottom_up\.", "backbone."),
    (r"^backbone\.fpn_(lateral|output)(\d)\.", r"fpn.\1\2."),
    (r"^proposal_generator\.rpn_head\.conv\.", "rpn.head.convs.0."),
    (r"^proposal_generator\.rpn_head\.", "rpn.head."),
    (r"^roi_heads\.(box_head|box_predictor|mask_head)\.", r"\1."),
]


def rename_detectron2(name: str) -> str | None:
    """detectron2 ``GeneralizedRCNN`` state-dict key -> minidet name; None for what is not a weight
    (``pixel_mean``/``pixel_std`` of old files, ``num_batches_tracked``); unknown keys come back unchanged."""
    if name in ("pixel_mean", "pixel_std") or name.endswith("num_batches_tracked"):
        return None
    return _rename(_D2_RULES, name)


# maskrcnn-benchmark / MLPerf (after the ``module.`` strip): ResNet body named as torchvision's but for the
# stem; `fpn_inner{j}` / `fpn_layer{j}` (j = 1 for C2), a Sequential (`.0` conv, `.1` GN) when normalized
_MB_LEVEL = {"inner": "lateral", "layer": "output"}
_MB_FX = r"^roi_heads\.box\.feature_extractor\."
_MB_RULES: list[tuple[str, str | Callable]] = [
    (r"^backbone\.body\.stem\.conv1\.", "backbone.stem.conv1."),
    (r"^backbone\.body\.stem\.bn1\.", "backbone.stem.conv1.norm."),
    *_TV_RULES[2:6],  # layer{1..4}: conv, bn, downsample as torchvision's
    (r"^backbone\.fpn\.fpn_(inner|layer)(\d)\.(?:0\.)?", lambda m: f"fpn.{_MB_LEVEL[m[1]]}{int(m[2]) + 1}."),
    (r"^rpn\.head\.conv\.", "rpn.head.convs.0."),
    (r"^rpn\.head\.(cls_logits|bbox_pred)\.", lambda m: f"rpn.head.{_RPN_OUT[m[1]]}."),
    (_MB_FX + r"fc([67])\.1\.", lambda m: f"box_head.fc{int(m[1]) - 5}_norm."),
    (_MB_FX + r"fc([67])\.(?:0\.)?", lambda m: f"box_head.fc{int(m[1]) - 5}."),
    (r"^roi_heads\.box\.predictor\.", "box_predictor."),
    (r"^roi_heads\.mask\.feature_extractor\.mask_fcn(\d)\.(?:0\.)?", r"mask_head.mask_fcn\1."),
    (r"^roi_heads\.mask\.predictor\.(conv5_mask|mask_fcn_logits)\.", lambda m: f"mask_head.{_MASK_OUT[m[1]]}."),
]
_MB_NORM = re.compile(r"^(backbone\.fpn\.fpn_(?:inner|layer)\d|roi_heads\.mask\.feature_extractor\.mask_fcn\d)\.1\.")
_MB_ANCHORS = re.compile(r"^rpn\.anchor_generator\.cell_anchors\.(\d+)$")


def is_maskrcnn_benchmark(keys) -> bool:
    return any(k.startswith(("backbone.body.stem.", "rpn.anchor_generator.", "roi_heads.box.")) for k in keys)


def maskrcnn_benchmark_renamer(keys) -> Callable[[str], str | None]:
    """maskrcnn-benchmark key -> minidet name, for a file with ``keys``: the 4conv1fc head's ``xconvs``
    Sequential holds (conv, GN, ReLU) per conv with GN, (conv, ReLU) without. None for the stored anchors."""
    step = 3 if any(re.search(r"\.xconvs\.1\.weight$", k) for k in keys) else 2

    def rename(name: str) -> str | None:
        if _MB_ANCHORS.match(name):
            return None
        if m := _MB_NORM.match(name):  # the GN of a normalized FPN or mask conv
            return rename(m[1] + ".0.")[:-1] + ".norm." + name[m.end() :]
        if m := re.match(_MB_FX + r"xconvs\.(\d+)\.", name):
            j, part = divmod(int(m[1]), step)
            return f"box_head.conv{j + 1}.{'norm.' if part else ''}{name[m.end() :]}"
        return _rename(_MB_RULES, name)

    return rename


def check_mb_anchors(model: nn.Module, src: dict[str, torch.Tensor], path: str) -> None:
    """maskrcnn-benchmark files store the anchors its strict load puts in place of the configured ones:
    one warning line when they are not minidet's."""
    for k, v in src.items():
        if m := _MB_ANCHORS.match(k):
            ours = model.rpn.cell_anchors[int(m[1])] if int(m[1]) < len(model.rpn.cell_anchors) else None
            if ours is None or tuple(v.shape) != tuple(ours.shape) or not torch.equal(v.float(), ours):
                what = "no such level" if ours is None else f"file {v.tolist()} vs {ours.tolist()}"
                logger.warning("%s: %s is not the anchors minidet generates (%s); minidet uses its own", path, k, what)
                return


_STAT_NAMES = ("weight", "bias", "running_mean", "running_var", "scale", "shift")


@torch.no_grad()
def match_state(
    model: nn.Module, src: dict[str, torch.Tensor], report: LoadReport, bn_eps: float, names: dict | None = None
) -> None:
    """Copy ``src`` (minidet names) into ``model`` by whole names; fill ``report``. Norm modules take batch-norm
    ``weight/bias/running_mean/running_var`` (with ``bn_eps``), a folded ``scale/shift`` (Caffe2 AffineChannel,
    exact: FrozenBN gets identity statistics and eps 0) or GroupNorm ``weight/bias``. A non-floating tensor where
    the model's is floating is refused, named as in the file (``names``: minidet -> checkpoint name)."""
    src, names = dict(src), names or {}
    norms = {n: m for n, m in model.named_modules() if isinstance(m, (FrozenBN, Affine, nn.GroupNorm))}
    own = {k: v for k, v in model.state_dict().items() if k.rpartition(".")[0] not in norms}
    floating = {k for k, v in own.items() if v.is_floating_point()} | {f"{p}.{s}" for p in norms for s in _STAT_NAMES}
    if (bad := next((k for k, v in src.items() if k in floating and not v.is_floating_point()), None)) is not None:
        raise CheckpointError(
            f"{report.path}: {names.get(bad, bad)} holds {src[bad].dtype} values where the model has "
            "floating-point weights (truncated by a conversion?)"
        )
    for path, mod in norms.items():
        got = {s: src.pop(f"{path}.{s}") for s in _STAT_NAMES if f"{path}.{s}" in src}
        if not got:
            report.missing.append(f"{path}.weight")
            continue
        c = mod.num_channels
        if wrong := [(f"{path}.{s}", tuple(v.shape), (c,)) for s, v in got.items() if v.shape != (c,)]:
            report.mismatched.extend(wrong)
            continue
        fields = "{" + ", ".join(sorted(got)) + "}"
        in_file = names.get(f"{path}.{next(iter(got))}", "").rpartition(".")[0]
        where = f"{report.path}: {in_file or path}.{fields}"  # named as in the file
        if "scale" in got and "shift" in got:
            if isinstance(mod, FrozenBN):
                mod.load_stats(got["scale"], got["shift"], torch.zeros(c), torch.ones(c), 0.0)
            elif isinstance(mod, Affine):
                mod.load_scale_shift(got["scale"], got["shift"])
            else:
                raise CheckpointError(f"{where} is a frozen affine (batch-norm) layer but MODEL.NORM is GN")
        elif {"weight", "bias", "running_mean", "running_var"} <= got.keys():
            if isinstance(mod, nn.GroupNorm):
                raise CheckpointError(f"{where} holds batch-norm statistics but MODEL.NORM is GN")
            mod.load_stats(got["weight"], got["bias"], got["running_mean"], got["running_var"], bn_eps)
        elif {"weight", "bias"} == got.keys():
            if not isinstance(mod, nn.GroupNorm):
                raise CheckpointError(
                    f"{where} has no running statistics (a GroupNorm checkpoint?) "
                    f"but MODEL.NORM is {type(mod).__name__}"
                )
            mod.weight.copy_(got["weight"])
            mod.bias.copy_(got["bias"])
        else:
            raise CheckpointError(f"{report.path}: incomplete norm parameters for {path}.{fields}")
        report.loaded += len(got)
    for name, tensor in own.items():
        if name in ("pixel_mean", "pixel_std"):
            continue
        if name not in src:
            report.missing.append(name)
        elif tuple((v := src.pop(name)).shape) != tuple(tensor.shape):
            report.mismatched.append((name, tuple(v.shape), tuple(tensor.shape)))
        else:
            tensor.copy_(v)
            report.loaded += 1
    report.unexpected.extend(sorted(src))


# (format, layout) -> {config key: the value the weights need}: what a file's format fixes in the arithmetic.
# torchvision runs its published v1 file with FrozenBN eps 0; a minidet state dict can come from any configuration.
FORMAT_CONFIG: dict[tuple[str, str], dict[str, object]] = {
    ("torchvision", "v1 legacy"): {"MODEL.CONVENTION": "torchvision", "MODEL.FROZEN_BN_EPS": 0.0},
    ("torchvision", "v1"): {"MODEL.CONVENTION": "torchvision"},
    ("torchvision", "v2"): {"MODEL.CONVENTION": "torchvision"},
    ("detectron", ""): {"MODEL.CONVENTION": "detectron"},
    ("detectron2", ""): {"MODEL.CONVENTION": "detectron2"},
    ("maskrcnn_benchmark", ""): {"MODEL.CONVENTION": "maskrcnn_benchmark", "MODEL.FROZEN_BN_EPS": 0.0},
    ("minidet", ""): {},
}


def check_format_config(report: LoadReport, config: dict[str, object]) -> None:
    """Fail naming the key and the value it needs where ``config`` (key -> value) conflicts with
    what the file's format fixes (``FORMAT_CONFIG``)."""
    for key, need in FORMAT_CONFIG[report.format, report.layout].items():
        if (have := config[key]) != need:
            what = f"{report.format} checkpoint" + (f" ({report.layout} key layout)" if report.layout else "")
            raise CheckpointError(  # the configs of a format are in configs/<format>/
                f"{report.path}: a {what} needs {key} {need}, the config has {have}; see configs/{report.format}/"
            )


def _to_tensors(src: dict, path: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Arrays as tensors (dense real numbers only); the names of entries that are not arrays."""
    out, dropped = {}, []
    for k, v in src.items():
        if isinstance(v, np.ndarray):
            if v.dtype.kind not in "biuf":
                raise CheckpointError(f"{path}: entry {k!r} is an array of {v.dtype}, not of numbers")
            v = torch.from_numpy(np.array(v))
        elif not isinstance(v, torch.Tensor):
            dropped.append(k)
            continue
        elif v.layout != torch.strided:
            kind = str(v.layout).removeprefix("torch.")
            raise CheckpointError(f"{path}: entry {k!r} is a {kind} tensor; weights must be dense (save .to_dense())")
        elif v.is_meta:
            raise CheckpointError(f"{path}: entry {k!r} is a meta tensor: a shape without values")
        elif v.is_complex():
            raise CheckpointError(f"{path}: entry {k!r} is a tensor of {v.dtype}, not of real numbers")
        out[k] = v
    return out, dropped


def load_checkpoint(
    model: nn.Module, path: str, bn_eps: float, allow_missing: bool = False, *, convention: str
) -> LoadReport:
    """Load ``path`` (read by :func:`read_checkpoint`) into ``model``; raise CheckpointError unless every
    weight is filled. ``bn_eps`` and ``convention`` are the config's ``MODEL.FROZEN_BN_EPS`` and
    ``MODEL.CONVENTION``, checked against ``FORMAT_CONFIG``. Also refused: arrays that are not dense real numbers,
    integer tensors for float weights, NaN or infinite weights, another ResNet depth."""
    src = read_checkpoint(path)
    author = src.author
    if all(k.startswith("module.") for k in src):  # saved from DistributedDataParallel
        src = {k[len("module.") :]: v for k, v in src.items()}
    keys = list(src)
    src, dropped = _to_tensors(src, path)
    if not src:
        raise CheckpointError(f"{path}: holds no weights (no arrays among {len(keys)} entries)")
    if "conv1_w" in keys and any(k.startswith("res2_0_") for k in keys):
        fmt, rename = "detectron", rename_detectron
    elif any(k.startswith(("backbone.bottom_up.", "proposal_generator.")) for k in keys) or author is not None:
        fmt, rename = "detectron2", rename_detectron2
    elif dropped:
        raise CheckpointError(f"{path}: not a checkpoint of known layout (entry {dropped[0]!r} is no array)")
    elif is_maskrcnn_benchmark(keys):
        fmt, rename = "maskrcnn_benchmark", maskrcnn_benchmark_renamer(keys)
    elif any(k.startswith("backbone.body.") for k in keys):
        fmt, rename = "torchvision", rename_torchvision
    elif any(k.startswith("backbone.stem.") for k in keys):
        fmt, rename = "minidet", lambda k: k
    elif prefixed := [k for k in keys if k.startswith("module.")]:
        plain = next(k for k in keys if not k.startswith("module."))
        raise CheckpointError(
            f"{path}: {len(prefixed)} of {len(keys)} keys start with 'module.' but {plain!r} does not, so the "
            "prefix was not stripped; a mixed file is no checkpoint of known layout"
        )
    else:
        raise CheckpointError(
            f"{path}: unrecognized checkpoint layout (first keys: {', '.join(keys[:3])}); expected a torchvision "
            "maskrcnn_resnet50_fpn[_v2], Detectron, detectron2 or maskrcnn-benchmark checkpoint, or a minidet "
            "state dict"
        )
    layout = torchvision_layout(keys) if fmt == "torchvision" else ""
    report = LoadReport(path=path, format=fmt, layout=layout, ignored=dropped)
    check_format_config(report, {"MODEL.CONVENTION": convention, "MODEL.FROZEN_BN_EPS": bn_eps})
    if check := {"detectron": check_detectron_variant, "maskrcnn_benchmark": check_mb_anchors}.get(fmt):
        check(model, src, path)
    renamed, names = {}, {}  # minidet name -> tensor, -> checkpoint name
    for k, v in src.items():
        if (new := rename(k)) is None:
            report.ignored.append(k)
            continue
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise CheckpointError(f"{path}: {k} holds NaN or infinite values; the file is corrupt")
        renamed[new] = v.float() if v.is_floating_point() else v
        names[new] = k
    _check_depth(model, renamed, r"backbone\.res4\.(\d+)\.", path)
    match_state(model, renamed, report, bn_eps, names)
    logger.info("%s", report)
    if report.mismatched:
        name, a, b = report.mismatched[0]
        more = f" (and {len(report.mismatched) - 1} more)" if len(report.mismatched) > 1 else ""
        hint = (
            f"; the checkpoint has {a[0]} class logits: MODEL.ROI_HEADS.NUM_CLASSES and MODEL.CATEGORY_LAYOUT "
            "belong to the weights" if name.startswith("box_predictor.cls_score.") else ""
        )
        raise CheckpointError(f"{path}: shape mismatch for {name}: checkpoint {a} vs model {b}{more}{hint}")
    if report.missing and not allow_missing:
        n = len(report.missing)
        raise CheckpointError(f"{path}: {n} model weights not in checkpoint: {_group(report.missing)}")
    if report.unexpected:
        logger.warning("%s: %d unexpected keys ignored: %s", path, len(report.unexpected), _group(report.unexpected))
    return report
