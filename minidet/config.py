"""Configuration: yacs defaults, ``_BASE_`` inheritance, validation.

Only the ``build_*`` functions read a config; modules take plain arguments.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from yacs.config import CfgNode as _YacsNode

NORM_CHOICES = ("FrozenBN", "Affine", "GN")
CONVENTIONS = ("torchvision", "detectron", "detectron2")
CATEGORY_LAYOUTS = ("coco91", "coco81", "coco80")


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key or file."""


class CfgNode(_YacsNode):
    """yacs node with ``_BASE_`` inheritance, int->float coercion and one-line errors."""

    def merge_from_file(self, cfg_filename: str) -> None:
        """Merge a yaml file (and, first, the chain of ``_BASE_`` files it names)."""
        for path in _base_chain(cfg_filename):
            with open(path) as f:
                try:
                    data = yaml.safe_load(f) or {}
                except yaml.YAMLError as e:
                    raise ConfigError(f"{path}: not valid YAML ({e.__class__.__name__})") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: expected a mapping of config keys at top level")
            data.pop("_BASE_", None)
            try:
                _merge_dict(self, data, [])
            except ConfigError as e:
                raise ConfigError(f"{path}: {e}") from None

    def merge_from_list(self, cfg_list: list[Any]) -> None:
        """Merge ``KEY VALUE`` pairs, e.g. ``["MODEL.NORM", "Affine"]``."""
        if len(cfg_list) % 2:
            raise ConfigError(f"overrides must be KEY VALUE pairs; got an odd number: {cfg_list}")
        for full_key, raw in zip(cfg_list[0::2], cfg_list[1::2]):
            node = self
            parts = str(full_key).split(".")
            for i, p in enumerate(parts):
                if not isinstance(node, _YacsNode) or p not in node:
                    raise ConfigError(f"unknown config key: {full_key}")
                if i < len(parts) - 1:
                    node = node[p]
            value = _coerce(_YacsNode._decode_cfg_value(raw), node[parts[-1]], full_key)
            node[parts[-1]] = value


def _base_chain(path: str, seen: tuple[str, ...] = ()) -> list[str]:
    """Files to merge in order: the deepest ``_BASE_`` first, ``path`` last."""
    path = os.path.abspath(path)
    if path in seen:
        raise ConfigError(f"{path}: _BASE_ cycle")
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    with open(path) as f:
        try:
            data = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e.__class__.__name__})") from None
    base = data.get("_BASE_") if isinstance(data, dict) else None
    if base is None:
        return [path]
    base_path = base if os.path.isabs(base) else os.path.join(os.path.dirname(path), base)
    if not os.path.isfile(base_path):
        raise ConfigError(f"{path}: _BASE_ file not found: {base}")
    return _base_chain(base_path, (*seen, path)) + [path]


def _coerce(value: Any, original: Any, key: str) -> Any:
    if original is None or value is None:
        return value
    if isinstance(original, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(original, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif isinstance(original, float) and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-5" (no dot) as a string
            return float(value)
        except ValueError:
            pass
    elif isinstance(original, int) and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif isinstance(original, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(original)(value)
    elif isinstance(original, str) and isinstance(value, str):
        return value
    raise ConfigError(f"config key {key}: expected {type(original).__name__} (like {original!r}), got {value!r}")


def _merge_dict(node: _YacsNode, data: dict, prefix: list[str]) -> None:
    for k, v in data.items():
        full = ".".join([*prefix, str(k)])
        if k not in node:
            raise ConfigError(f"unknown config key: {full}")
        if isinstance(node[k], _YacsNode):
            if not isinstance(v, dict):
                raise ConfigError(f"config key {full}: expected a mapping, got {v!r}")
            _merge_dict(node[k], v, [*prefix, str(k)])
        else:
            node[k] = _coerce(v, node[k], full)


_C = CfgNode()
_C.MODEL = CfgNode()
_C.MODEL.WEIGHTS = ""
_C.MODEL.DEVICE = "cpu"
_C.MODEL.MASK_ON = True
# Normalization implementation wherever the architecture normalizes: FrozenBN | Affine | GN
_C.MODEL.NORM = "FrozenBN"
# Fold FrozenBN/Affine into the preceding conv at load time (the norm then costs no op).
_C.MODEL.FOLD_NORM = False
# Run the convolutions in channels-last (NHWC) memory layout: faster oneDNN kernels on CPU
# and tensor cores on GPU; only the floating-point summation order changes.
_C.MODEL.CHANNELS_LAST = False
# On CPU in float32, run each conv with its ReLU / residual or top-down addition as one oneDNN
# call (same kernel, same values; fewer passes over memory). No effect on CUDA or under AMP.
_C.MODEL.FUSE_CONVS = True
# RoIAlign implementation: "gather" (one vectorized weighted gather per FPN level, the same
# values up to float summation order) or "torchvision" (torchvision.ops.roi_align, serial on CPU).
_C.MODEL.ROI_ALIGN_IMPL = "gather"
# eps of the frozen batch-norm statistics; it belongs to the weight source
# (torchvision COCO_V1: 0.0, torchvision v2 / detectron2: 1e-5).
_C.MODEL.FROZEN_BN_EPS = 1e-5
_C.MODEL.GN_NUM_GROUPS = 32
_C.MODEL.GN_EPS = 1e-5
# Pixel statistics in the units of INPUT.PIXEL_RANGE, in INPUT.FORMAT channel order.
_C.MODEL.PIXEL_MEAN = [123.675, 116.28, 103.53]
_C.MODEL.PIXEL_STD = [58.395, 57.12, 57.375]
# How the class index of the checkpoint maps to COCO categories:
# coco91 = torchvision (index == COCO id, 0 = background), coco81 = Detectron
# (0 = background, 1..80 contiguous), coco80 = detectron2 (0..79, background last).
_C.MODEL.CATEGORY_LAYOUT = "coco91"
# Inference arithmetic of the implementation that trained the weights:
# "torchvision" (no +1, torch resize, centred anchors, IoU > thr) or "detectron"
# (Caffe2 Detectron: +1 box sizes, cv2 resize, Detectron anchors, IoU >= thr, decode in
# original-image coordinates, score ties kept at the detection cap) or "detectron2" (PIL
# resize, exact-area anchors, aligned RoIAlign, grid_sample mask paste, boxes clipped and
# emptied ones dropped after rescaling).
_C.MODEL.CONVENTION = "torchvision"

_C.MODEL.RESNETS = CfgNode()
_C.MODEL.RESNETS.DEPTH = 50
_C.MODEL.RESNETS.STRIDE_IN_1X1 = False
_C.MODEL.RESNETS.NUM_GROUPS = 1
_C.MODEL.RESNETS.WIDTH_PER_GROUP = 64

_C.MODEL.FPN = CfgNode()
_C.MODEL.FPN.OUT_CHANNELS = 256
_C.MODEL.FPN.USE_NORM = False

_C.MODEL.ANCHOR_GENERATOR = CfgNode()
_C.MODEL.ANCHOR_GENERATOR.SIZES = [32, 64, 128, 256, 512]
_C.MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS = [0.5, 1.0, 2.0]

_C.MODEL.RPN = CfgNode()
_C.MODEL.RPN.CONV_DEPTH = 1
_C.MODEL.RPN.PRE_NMS_TOPK_TEST = 1000
_C.MODEL.RPN.POST_NMS_TOPK_TEST = 1000
_C.MODEL.RPN.NMS_THRESH = 0.7
_C.MODEL.RPN.MIN_SIZE = 1e-3
# Order proposals of exactly equal objectness as torchvision's batched NMS does (an unstable
# sort over every level's kept boxes: a full NMS of each level whenever kept scores tie).
# Off: equal scores stay in level/rank order; the proposal set and every detection are the
# same either way (each proposal's detections are computed independently of its position).
_C.MODEL.RPN.TORCHVISION_TIE_ORDER = False

_C.MODEL.ROI_HEADS = CfgNode()
_C.MODEL.ROI_HEADS.NUM_CLASSES = 91
_C.MODEL.ROI_HEADS.SCORE_THRESH_TEST = 0.05
_C.MODEL.ROI_HEADS.NMS_THRESH_TEST = 0.5
_C.MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE = 100
_C.MODEL.ROI_HEADS.MIN_BOX_SIZE = 1e-2

_C.MODEL.ROI_BOX_HEAD = CfgNode()
_C.MODEL.ROI_BOX_HEAD.NUM_CONV = 0
_C.MODEL.ROI_BOX_HEAD.CONV_DIM = 256
_C.MODEL.ROI_BOX_HEAD.NUM_FC = 2
_C.MODEL.ROI_BOX_HEAD.FC_DIM = 1024
_C.MODEL.ROI_BOX_HEAD.USE_NORM = False
_C.MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION = 7
_C.MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO = 2
_C.MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS = [10.0, 10.0, 5.0, 5.0]

_C.MODEL.ROI_MASK_HEAD = CfgNode()
_C.MODEL.ROI_MASK_HEAD.NUM_CONV = 4
_C.MODEL.ROI_MASK_HEAD.CONV_DIM = 256
_C.MODEL.ROI_MASK_HEAD.USE_NORM = False
_C.MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION = 14
_C.MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO = 2
_C.MODEL.ROI_MASK_HEAD.THRESHOLD = 0.5

_C.INPUT = CfgNode()
_C.INPUT.MIN_SIZE_TEST = 800
_C.INPUT.MAX_SIZE_TEST = 1333
# Channel order the network expects: RGB (torchvision) or BGR (Detectron, detectron2).
_C.INPUT.FORMAT = "RGB"
# Pixels are scaled to [0, PIXEL_RANGE] before mean/std (torchvision: 1.0, Caffe2 models: 255).
_C.INPUT.PIXEL_RANGE = 255.0
_C.INPUT.SIZE_DIVISIBILITY = 32
# Refuse images with more pixels than this (0 = no limit) instead of exhausting memory.
_C.INPUT.MAX_PIXELS = 100_000_000

_C.TEST = CfgNode()
_C.TEST.IMS_PER_BATCH = 1
# The network runs on at most this many images of a batch at a time; 0: one image on CPU (a
# batch's activations far exceed the caches, and every stage is compute-bound there, so a
# whole batch runs slower per image), the whole batch on CUDA. The batch is padded as one
# either way, so each image's detections are those of the whole batch.
_C.TEST.CHUNK_IMAGES = 0
# Record per-stage times (CUDA-synchronized on GPU).
_C.TEST.TIMING = True
# Mixed precision for the network layers: "" (off, float32), "bf16" or "fp16" (CUDA; bf16 also
# on CPU). Box, anchor and mask arithmetic stays float32. Changes detections: off by default.
_C.TEST.AMP = ""


def get_cfg() -> CfgNode:
    """Return a fresh copy of minidet's default config."""
    return _C.clone()


def validate_cfg(cfg: CfgNode) -> None:
    """Check values that yacs' type checks cannot; raise ConfigError naming the key."""
    m = cfg.MODEL
    if m.NORM not in NORM_CHOICES:
        raise ConfigError(f"MODEL.NORM must be one of {', '.join(NORM_CHOICES)}; got {m.NORM!r}")
    if m.FOLD_NORM and m.NORM == "GN":
        raise ConfigError("MODEL.FOLD_NORM applies to FrozenBN/Affine only; GroupNorm cannot be folded")
    if m.RESNETS.DEPTH not in (50, 101):
        raise ConfigError(f"MODEL.RESNETS.DEPTH must be 50 or 101; got {m.RESNETS.DEPTH}")
    if m.CATEGORY_LAYOUT not in CATEGORY_LAYOUTS:
        raise ConfigError(
            f"MODEL.CATEGORY_LAYOUT must be one of {', '.join(CATEGORY_LAYOUTS)}; got {m.CATEGORY_LAYOUT!r}"
        )
    if m.CONVENTION not in CONVENTIONS:
        raise ConfigError(f"MODEL.CONVENTION must be one of {', '.join(CONVENTIONS)}; got {m.CONVENTION!r}")
    if m.ROI_ALIGN_IMPL not in ("gather", "torchvision"):
        raise ConfigError(f"MODEL.ROI_ALIGN_IMPL must be gather or torchvision; got {m.ROI_ALIGN_IMPL!r}")
    if cfg.INPUT.FORMAT not in ("RGB", "BGR"):
        raise ConfigError(f"INPUT.FORMAT must be RGB or BGR; got {cfg.INPUT.FORMAT!r}")
    for key in ("PIXEL_MEAN", "PIXEL_STD"):
        if len(m[key]) != 3:
            raise ConfigError(f"MODEL.{key} needs 3 values; got {list(m[key])}")
    if any(s <= 0 for s in m.PIXEL_STD):
        raise ConfigError(f"MODEL.PIXEL_STD must be positive; got {list(m.PIXEL_STD)}")
    if m.ROI_BOX_HEAD.NUM_CONV == 0 and m.ROI_BOX_HEAD.NUM_FC == 0:
        raise ConfigError("MODEL.ROI_BOX_HEAD needs at least one conv or fc layer")
    if m.FROZEN_BN_EPS < 0:
        raise ConfigError(f"MODEL.FROZEN_BN_EPS must be >= 0; got {m.FROZEN_BN_EPS}")
    if cfg.TEST.AMP not in ("", "bf16", "fp16"):
        raise ConfigError(f"TEST.AMP must be '', 'bf16' or 'fp16'; got {cfg.TEST.AMP!r}")
    if cfg.TEST.CHUNK_IMAGES < 0:
        raise ConfigError(f"TEST.CHUNK_IMAGES must be >= 0 (0: automatic); got {cfg.TEST.CHUNK_IMAGES}")
    if cfg.INPUT.MIN_SIZE_TEST <= 0 or cfg.INPUT.MAX_SIZE_TEST <= 0:
        raise ConfigError("INPUT.MIN_SIZE_TEST and INPUT.MAX_SIZE_TEST must be positive")
