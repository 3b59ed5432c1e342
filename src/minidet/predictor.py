"""``Predictor``: config in, detections out, one image or a batch."""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from .categories import category_ids, class_names
from .checkpoint import CheckpointError, LoadReport, load_checkpoint
from .config import CfgNode, ConfigError, get_cfg
from .detector import MaskRCNN, build_model
from .hub import REGISTRY, resolve_weights
from .layers import fuse_convs, fuse_linears
from .norm import fold_norms
from .timing import StageTimer

logger = logging.getLogger("minidet")
NO_WEIGHTS = "none"  # MODEL.WEIGHTS value (any case) that runs the network with random weights


def weights_path(cfg: CfgNode, weights: str | None = None) -> str | None:
    """The absolute path of the checkpoint to load (``weights``, default ``MODEL.WEIGHTS``: a path, a registry name
    or a URL, see ``hub.resolve_weights``; a name or URL is downloaded on first use); None for ``none``. An empty
    value is an error: random weights give detections that look real."""
    path = cfg.MODEL.WEIGHTS if weights is None else weights
    if not str(path).strip():
        raise CheckpointError("MODEL.WEIGHTS is empty; name a checkpoint file, or set MODEL.WEIGHTS none to run with "
                              "random weights (e.g. for benchmarks)")
    return None if str(path).strip().lower() == NO_WEIGHTS else resolve_weights(str(path))


def prepare_model(cfg: CfgNode, weights: str | None = None) -> tuple[MaskRCNN, LoadReport | None]:
    """Build the model, load ``weights`` (default ``MODEL.WEIGHTS``; ``none``: random weights, report None), fold
    norms, move to the device, eval mode. Under ``MODEL.RUNTIME onnxruntime`` or ``openvino`` the graph
    ``MODEL.GRAPH`` (``minidet export``) runs the network instead, checked against ``weights``; the model keeps
    minidet's pre- and post-processing."""
    model = build_model(cfg)
    path = weights_path(cfg, weights)
    if cfg.MODEL.RUNTIME != "torch":  # the exported graph runs the network (it holds the weights: checked, not loaded)
        from .export.runtime import load_network

        model.network, report = load_network(cfg, path)
        return model.set_runtime(timer=StageTimer(enabled=cfg.TEST.TIMING)).eval(), report
    report = None if path is None else load_checkpoint(model, path, bn_eps=cfg.MODEL.FROZEN_BN_EPS,
                                                       convention=cfg.MODEL.CONVENTION)
    if cfg.MODEL.FOLD_NORM:
        logger.info("folded %d norm layers into their convs", fold_norms(model))
    fuse_convs(model, cfg.MODEL.FUSE_CONVS)
    fuse_linears(model, cfg.MODEL.FUSE_LINEAR)
    device = torch.device(cfg.MODEL.DEVICE)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"MODEL.DEVICE is {cfg.MODEL.DEVICE} but CUDA is not available")
    model.to(device)
    model.set_runtime(timer=StageTimer(enabled=cfg.TEST.TIMING, device=device), channels_last=cfg.MODEL.CHANNELS_LAST)
    return model.eval(), report


class Predictor:
    """Built and loaded from a config, on ``MODEL.DEVICE``: ``predictor(image)`` takes an HxWx3 uint8 BGR array (as
    ``cv2.imread`` gives) and returns ``boxes`` (N, 4) float32 xyxy in input pixels, ``scores`` (N,), ``labels``
    (N,) int64 (the checkpoint's class index), ``category_ids`` (N,) int64 COCO ids, ``masks`` (N, H, W) bool
    (``MODEL.MASK_ON``) and ``timings`` (stage -> seconds). ``weights_summary`` names what was loaded."""

    def __init__(self, cfg: CfgNode) -> None:
        self.cfg = cfg.clone()
        self.cfg.freeze()
        self.model, self.load_report = prepare_model(self.cfg)
        random = "none (random weights: MODEL.WEIGHTS none)"
        self.weights_summary: str = self.load_report.summary if self.load_report is not None else random
        # JSON widths as the weights' family counts them: pixel-inclusive (x2 - x1 + 1) for +1 box rules
        self.box_offset: int = self.model.box_predictor.box_rule.offset
        layout = self.cfg.MODEL.CATEGORY_LAYOUT
        self.class_names: list[str] = class_names(layout)
        self._cat_ids = torch.tensor(category_ids(layout), dtype=torch.int64)

    @classmethod
    def from_pretrained(cls, name: str, device: str = "cpu", **overrides) -> Predictor:
        """A Predictor for a registry name (``minidet weights list``; its config and its weights, downloaded and
        verified on first use) or a config name (its own ``MODEL.WEIGHTS``), on ``device``; ``overrides`` are
        config keys, ``**{"TEST.AMP": "bf16"}`` or with ``__`` for the dots: ``TEST__IMS_PER_BATCH=4``."""
        entry = REGISTRY.get(name)
        cfg = get_cfg(entry.config if entry is not None else name)
        file = os.path.basename(cfg.MODEL.WEIGHTS)  # a config name: the registry's file of the same name, if any
        entry = entry or next((e for e in REGISTRY.values() if e.filename == file), None)
        opts = [x for k, v in overrides.items() for x in (k.replace("__", "."), v)]
        cfg.merge_from_list([*(["MODEL.WEIGHTS", entry.name] if entry else []), "MODEL.DEVICE", device, *opts])
        return cls(cfg)

    def __call__(self, image: np.ndarray) -> dict:
        return self.predict_batch([image])[0]

    def predict_batch(self, images: list[np.ndarray]) -> list[dict]:
        """Run several images in one forward; ``timings`` are for the whole batch."""
        for i, im in enumerate(images):
            if not (isinstance(im, np.ndarray) and im.ndim == 3 and im.shape[2] == 3 and im.dtype == np.uint8):
                desc = f"{type(im).__name__} {getattr(im, 'shape', '')} {getattr(im, 'dtype', '')}".strip()
                raise ValueError(f"image {i}: expected an HxWx3 uint8 BGR array, got {desc}")
            h, w = im.shape[:2]
            if h == 0 or w == 0:
                raise ValueError(f"image {i}: empty ({w} x {h} pixels)")
            cin = self.cfg.INPUT
            if min(h, w) * min(cin.MIN_SIZE_TEST / min(h, w), cin.MAX_SIZE_TEST / max(h, w)) < 1:
                raise ValueError(f"image {i}: {w} x {h} is too elongated: with its long side resized to at most "
                                 f"INPUT.MAX_SIZE_TEST {cin.MAX_SIZE_TEST}, its short side would be under one pixel")
        self.model.timer.reset()
        outs = self.model(images)
        timings = dict(self.model.timer.times)
        results = [{k: v.cpu() for k, v in o.items()} for o in outs]
        for r in results:
            r["category_ids"] = self._cat_ids[r["labels"]] if len(r["labels"]) else r["labels"].clone()
            r["timings"] = timings
        return results
