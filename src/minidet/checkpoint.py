"""Checkpoint loading: read (the safe readers of ``readers.py``), identify the weight family (``minidet.families``:
its rename table, checks and fixed config values), a strict matcher, a ``LoadReport``.

Nothing in a checkpoint is executed (see SECURITY.md).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from . import families
from .config import body_of, get_cfg
from .families import Family, architectures
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
    why: dict[str, str] = field(default_factory=dict)  # ignored name -> why it plays no part

    @property
    def summary(self) -> str:
        """One line: ``/x/tv.pth (torchvision format, v1 legacy key layout, 313 tensors)``."""
        layout = f", {self.layout} key layout" if self.layout else ""
        return f"{os.path.abspath(self.path)} ({self.format} format{layout}, {self.loaded} tensors)"

    def __str__(self) -> str:
        lines = [f"loaded {self.loaded} tensors from {self.path} (format: {self.format})"]
        titles = ("missing in checkpoint", "unexpected in checkpoint")
        lines += [f"{title} ({len(keys)}): {_group(keys)}" for title, keys in zip(titles, (self.missing,
                                                                                          self.unexpected)) if keys]
        if self.ignored:
            reasons: dict[str, list[str]] = {}
            for k in self.ignored:
                reasons.setdefault(self.why.get(k, "not arrays"), []).append(k)
            lines.append(f"ignored by design ({len(self.ignored)}):")
            lines += [f"  {why}: {_group(keys)}" for why, keys in reasons.items()]
        lines += [f"shape mismatch: {n}: checkpoint {tuple(a)} vs model {tuple(b)}" for n, a, b in self.mismatched]
        return "\n".join(lines)


def _group(keys: list[str]) -> str:
    """Compact listing grouped by module: ``backbone.res2.0.conv1.{weight, norm.bias}``."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        head, _, tail = k.rpartition(".")
        groups.setdefault(head, []).append(tail)
    parts = [f"{h}.{{{', '.join(v)}}}" if len(v) > 1 else f"{h}.{v[0]}" for h, v in groups.items() if h]
    parts += groups.get("", [])  # top-level names (pixel_mean): no module
    if len(parts) > 12:
        parts = parts[:12] + [f"... {len(parts) - 12} more modules"]
    return "; ".join(parts)


_STAT_NAMES = ("weight", "bias", "running_mean", "running_var", "scale", "shift")


def _own_and_norms(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, nn.Module]]:
    """The model's state outside its norm modules, and its norm modules by name (which take the statistics of any
    of the norm kinds, ``_STAT_NAMES``)."""
    norms = {n: m for n, m in model.named_modules() if isinstance(m, (FrozenBN, Affine, nn.GroupNorm))}
    own = {k: v for k, v in model.state_dict().items() if k.rpartition(".")[0] not in norms}
    return own, norms


def model_takes(model: nn.Module) -> set[str]:
    """Every name :func:`match_state` may fill in ``model`` (minidet names)."""
    own, norms = _own_and_norms(model)
    return set(own) | {f"{p}.{s}" for p in norms for s in _STAT_NAMES}


@torch.no_grad()
def match_state(
    model: nn.Module, src: dict[str, torch.Tensor], report: LoadReport, bn_eps: float, names: dict | None = None
) -> None:
    """Copy ``src`` (minidet names) into ``model`` by whole names; fill ``report``. Norm modules take batch-norm
    ``weight/bias/running_mean/running_var`` (with ``bn_eps``), a folded ``scale/shift`` (Caffe2 AffineChannel,
    exact: FrozenBN gets identity statistics and eps 0) or GroupNorm ``weight/bias``. A non-floating tensor where
    the model's is floating is refused, named as in the file (``names``: minidet -> checkpoint name)."""
    src, names = dict(src), names or {}
    own, norms = _own_and_norms(model)
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


def check_format_config(report: LoadReport, needs: dict[str, object], config: dict[str, object]) -> None:
    """Fail naming the key and the value it needs where ``config`` (key -> value) conflicts with what the file's
    format fixes (``needs``: key -> value, ``Family.config_values``)."""
    for key, need in needs.items():
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


def _identify(keys: list[str], dropped: list[str], path: str) -> tuple[Family | None, str]:
    """The family and key layout of a file with ``keys`` (``None``: a minidet state dict); refuses a file no family
    claims, and non-array entries where the family keeps none."""
    found = families.recognize(keys)
    if dropped and not (found and found[0].ignores_non_arrays):
        raise CheckpointError(f"{path}: not a checkpoint of known layout (entry {dropped[0]!r} is no array)")
    if found is not None:
        return found
    if any(k.startswith("backbone.stem.") for k in keys):
        return None, ""
    if prefixed := [k for k in keys if k.startswith("module.")]:
        plain = next(k for k in keys if not k.startswith("module."))
        raise CheckpointError(
            f"{path}: {len(prefixed)} of {len(keys)} keys start with 'module.' but {plain!r} does not, so the "
            "prefix was not stripped; a mixed file is no checkpoint of known layout"
        )
    *others, last = [f.files for f in families.FAMILIES.values()]
    raise CheckpointError(
        f"{path}: unrecognized checkpoint layout (first keys: {', '.join(keys[:3])}); expected a "
        f"{', '.join(others)} or {last} checkpoint, or a minidet state dict"
    )


@dataclass(frozen=True)
class Renamed:
    """A checkpoint's weights under minidet's names: the file's keys renamed once (its family's rename function over
    every key), what every check of the file against the config, :func:`head_config` and the matcher read.
    ``names``: the file's key -> minidet name (None: set aside by the family), in the file's order; ``tensors``:
    minidet name -> the file's tensor (as stored); ``keys``: minidet name -> the file's key (messages name the
    file's keys)."""

    names: dict[str, str | None]
    tensors: dict[str, torch.Tensor]
    keys: dict[str, str]

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor], rename: Callable[[str], str | None]) -> Renamed:
        names = {k: rename(k) for k in tensors}
        return cls(names, {n: tensors[k] for k, n in names.items() if n is not None},
                   {n: k for k, n in names.items() if n is not None})

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of minidet's ``name``, if the file has it."""
        return tuple(t.shape) if (t := self.tensors.get(name)) is not None else None


def _finite(v: torch.Tensor) -> bool:
    """Whether every value of the float tensor ``v`` is finite: its least and greatest are (aminmax propagates NaN;
    one pass, no tensor of flags)."""
    return not v.numel() or bool(torch.isfinite(torch.stack(torch.aminmax(v))).all())


def _as_loaded(view: Renamed, report: LoadReport) -> dict[str, torch.Tensor]:
    """``view``'s tensors as the matcher takes them (float tensors as float32); the entries the family drops by
    design (``architectures.SET_ASIDE``) go to ``report.ignored`` with the reason. NaN or infinite weights are
    refused."""
    out = {}
    for k, new in view.names.items():
        if new is None:
            report.ignored.append(k)
            report.why[k] = architectures.set_aside(report.format, k) or "set aside by the family"
            continue
        v = view.tensors[new]
        if v.is_floating_point() and not _finite(v):
            raise CheckpointError(f"{report.path}: {k} holds NaN or infinite values; the file is corrupt")
        out[new] = v.float() if v.is_floating_point() else v
    return out


@dataclass
class Checkpoint:
    """A checkpoint file read (safe readers) and identified: its ``family`` (None: a minidet state dict) and key
    ``layout``, its array entries as tensors (under the file's names, ``module.`` stripped), the names of its entries
    that are no arrays (``dropped``) and what its wrapper holds beside the weights (``meta``); ``view``: the same
    tensors under minidet's names (:class:`Renamed`, renamed on first use, once)."""

    path: str
    family: Family | None
    layout: str
    tensors: dict[str, torch.Tensor]
    dropped: list[str]
    meta: dict

    @property
    def format(self) -> str:
        return self.family.name if self.family else "minidet"

    @functools.cached_property
    def view(self) -> Renamed:
        """The tensors under minidet's names: the file's keys renamed once, with its family's rename function (a
        minidet state dict: its own names)."""
        return Renamed.of(self.tensors, self.family.renamer(list(self.tensors)) if self.family else (lambda k: k))

    def class_names(self) -> list[str] | None:
        """The class names the file carries (in its ``meta``), in class order; None where its family stores none.
        CheckpointError (one line naming the file, the entry and what is wrong) when they are no list of distinct,
        non-empty names."""
        if not (self.family and self.family.class_names):
            return None
        try:
            return self.family.class_names(self.meta)
        except ValueError as e:
            raise CheckpointError(f"{self.path}: {e}; set MODEL.CLASS_NAMES (names separated "
                                  "by commas), which overrides the file's names") from None


def open_checkpoint(path: str) -> Checkpoint:
    """Read ``path`` with the safe readers (:func:`read_checkpoint`; nothing in it is run) and ask the families which
    one it is (``families.recognize``, from its key names). Refused: a file of no known layout, arrays that are not
    dense real numbers, a file without weights."""
    path = os.path.abspath(path)
    src = read_checkpoint(path)
    meta = src.meta
    if all(k.startswith("module.") for k in src):  # saved from DistributedDataParallel
        src = {k[len("module.") :]: v for k, v in src.items()}
    keys = list(src)
    tensors, dropped = _to_tensors(src, path)
    if not tensors:
        raise CheckpointError(f"{path}: holds no weights (no arrays among {len(keys)} entries)")
    family, layout = _identify(keys, dropped, path)
    return Checkpoint(path, family, layout, tensors, dropped, meta)


def head_config(ckpt: Checkpoint, background_last: bool) -> dict[str, object]:
    """What the checkpoint's predictor shapes fix in the config: ``MODEL.ROI_HEADS.NUM_CLASSES`` (counting the
    background where it comes first, as the configs of those families do), class-agnostic box regression (4 deltas,
    or Detectron's 8: background and foreground) and class-agnostic masks (one channel). Empty for a file without
    a box predictor."""
    view, predictor = ckpt.view, "box_predictor."
    if (logits := view.shape(f"{predictor}cls_score.weight")) is None:  # a cascade: its first stage's
        predictor = "cascade.predictors.0."
        logits = view.shape(f"{predictor}cls_score.weight")
    if logits is None:
        return {}
    rows = logits[0]  # the classes and the background
    specific = rows - 1 if background_last else rows  # class-specific deltas and masks: one per class (and bg)
    out: dict[str, object] = {"MODEL.ROI_HEADS.NUM_CLASSES": specific}
    if (deltas := view.shape(f"{predictor}bbox_pred.weight")) is not None:
        out["MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG"] = deltas[0] // 4 in (1, 2) and deltas[0] // 4 != specific
    masks = view.shape("mask_head.predictor.weight") or view.shape("mask_head.0.predictor.weight")
    if masks is not None:
        out["MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK"] = masks[0] == 1 and specific != 1
    return out


_MASK_PARTS = ("mask_head.", "mask_iou_head.")  # what MODEL.MASK_ON False leaves out: the mask head and its scorer


def check_architecture(ckpt: Checkpoint, cfg) -> None:
    """Refuse in one line a file and a config (a ``CfgNode``) that disagree about an architecture minidet runs
    under its own config (``architectures.ARCHITECTURES``' entries with ``switches``): the file has its keys and the
    config leaves it off, or the config turns it on and the file has none of its keys; naming the file, what it
    holds and the shipped config that runs it (``architectures.refuse_config_mismatch``); then a body of other
    shapes than the config's (``families.check_body`` against ``config.body_of``: another body, depth, groups,
    RegNet). First of all checks, before the config is fitted to the file (:func:`head_config`) or a model built.
    What ``MODEL.MASK_ON False`` leaves out does not count."""
    view, family = ckpt.view, ckpt.family
    if family is not None:  # (a minidet state dict has the model's own names)
        on = {a.name for a in architectures.turned_on(cfg, get_cfg())}
        masks_off = () if cfg.MODEL.MASK_ON else _MASK_PARTS
        keys = [k for k, n in view.names.items() if not (n or "").startswith(masks_off)]
        architectures.refuse_config_mismatch(family.name, keys, on, ckpt.path)
    families.check_body(view.tensors, view.keys, body_of(cfg), ckpt.path,
                        family.name if family else cfg.MODEL.CONVENTION)


def load_checkpoint(
    model: nn.Module, path: str | Checkpoint, bn_eps: float, allow_missing: bool = False, *, convention: str
) -> LoadReport:
    """Load ``path`` into ``model``: read it and ask the families which one it is (:func:`open_checkpoint`; or a
    checkpoint opened already), check it against the config and the model, rename, match and report. Raises
    CheckpointError unless every weight is filled. ``bn_eps`` and ``convention`` are the config's
    ``MODEL.FROZEN_BN_EPS`` and ``MODEL.CONVENTION``, checked against what the file's family fixes. Refused
    first: a file holding layers of an architecture the model lacks (``architectures.ARCHITECTURES``, named with
    the config that runs it). Also refused: arrays that are not dense real numbers, integer tensors for float weights,
    NaN or infinite weights, another ResNet depth, and any key that no layer of the model takes unless it is known
    to play no part at inference (``architectures.SET_ASIDE``; the mask head's and a mask IoU head's weights under
    ``MODEL.MASK_ON False``)."""
    ckpt = path if isinstance(path, Checkpoint) else open_checkpoint(path)
    path, family, view = ckpt.path, ckpt.family, ckpt.view
    report = LoadReport(path=path, format=ckpt.format, layout=ckpt.layout, ignored=list(ckpt.dropped))
    # first: another body or architecture makes every other check moot, and the config it needs is what to say
    body = getattr(getattr(model, "backbone", None), "body", None)  # its shapes (bodies.Body)
    families.check_body(view.tensors, view.keys, body, path, family.name if family else convention)
    if family is not None:
        takes = model_takes(model)
        masks_off = _MASK_PARTS if getattr(model, "mask_head", True) is None else ()  # MODEL.MASK_ON False
        untaken = [k for k, n in view.names.items() if n is not None and n not in takes and not n.startswith(masks_off)]
        architectures.refuse_other_architecture(family.name, untaken, path)
        needs = family.config_values(ckpt.layout)
        check_format_config(report, needs, {"MODEL.CONVENTION": convention, "MODEL.FROZEN_BN_EPS": bn_eps})
        if family.check is not None:
            family.check(model, ckpt.tensors, path)
    renamed, names = _as_loaded(view, report), view.keys
    match_state(model, renamed, report, bn_eps, names)
    if getattr(model, "mask_head", True) is None:  # MODEL.MASK_ON False: a mask head that the config leaves out
        off = [k for k in report.unexpected if k.startswith(_MASK_PARTS)]
        report.unexpected = [k for k in report.unexpected if k not in off]
        report.ignored += [names[k] for k in off]
        report.why.update((names[k], f"the mask {'IoU ' * k.startswith('mask_iou_head.')}head (MODEL.MASK_ON False)")
                          for k in off)
    logger.info("%s", report)
    if report.mismatched:
        name, a, b = report.mismatched[0]
        more = f" (and {len(report.mismatched) - 1} more)" if len(report.mismatched) > 1 else ""
        hint = (
            f"; the checkpoint has {a[0]} class logits: MODEL.ROI_HEADS.NUM_CLASSES and MODEL.CATEGORY_LAYOUT "
            "belong to the weights" if re.match(r"(box_predictor|cascade\.predictors\.\d+)\.cls_score\.", name) else ""
        )
        raise CheckpointError(f"{path}: shape mismatch for {name}: checkpoint {a} vs model {b}{more}{hint}")
    if report.missing and not allow_missing:
        n = len(report.missing)
        hint = ""
        if all(k.startswith("mask_head.") for k in report.missing):  # the rest loaded: a Faster R-CNN
            hint = "; the checkpoint has no mask head (a Faster R-CNN?): MODEL.MASK_ON False runs it, boxes only"
        elif all(k.startswith("mask_iou_head.") for k in report.missing):  # a plain Mask R-CNN, a mask-scoring config
            hint = "; the checkpoint has no mask IoU head (not a Mask Scoring R-CNN): MODEL.MASKIOU_ON False runs it"
        raise CheckpointError(f"{path}: {n} model weights not in checkpoint: {_group(report.missing)}{hint}")
    if report.unexpected:
        first, n = names.get(report.unexpected[0], report.unexpected[0]), len(report.unexpected)
        keys, it, they, a_layer = (f"{first} and {n - 1} more keys", "them", "they", "layers") if n > 1 else \
            (first, "it", "it", "a layer")
        raise CheckpointError(
            f"{path}: no layer of the model takes {keys}, and {they} {'are' if n > 1 else 'is'} not among the keys "
            f"known to play no part at inference: {a_layer} minidet does not build (another architecture?), so it "
            f"does not run the file; if {they} play{'' if n > 1 else 's'} no part in inference, delete {it} from "
            "the file"
        )
    return report
