"""``Predictor``: config in, detections out, one image or a batch."""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from .categories import Classes, resolve_classes
from .checkpoint import Checkpoint, LoadReport, check_architecture, head_config, load_checkpoint, open_checkpoint
from .config import CfgNode, ConfigError, cfg_value, check_cfg, get_cfg, load_cfg, validate_cfg
from .detector import MaskRCNN, build_model
from .families import FAMILIES
from .layers import fuse_convs, fuse_linears
from .norm import fold_norms, standardize_weights
from .timing import StageTimer

logger = logging.getLogger("minidet")


def checkpoint_file(cfg: CfgNode, weights: str | None = None) -> str | None:
    """The checkpoint to load: ``weights`` when the caller resolved it (a path), else ``MODEL.WEIGHTS`` resolved by
    ``hub.weights_path`` (a path, a registry name or a URL, downloaded on first use; None for ``none``)."""
    if weights is not None:
        return weights
    from .hub import weights_path  # only where the caller did not resolve the weights itself

    return weights_path(cfg.MODEL.WEIGHTS)


def fit_to_checkpoint(cfg: CfgNode, ckpt: Checkpoint | None) -> tuple[CfgNode, dict[str, object]]:
    """``cfg`` (a copy) with what the checkpoint's predictor shapes fix (``checkpoint.head_config``: the class
    count, class-agnostic deltas and masks), so that a shipped config runs a fine-tuned checkpoint unedited; and the
    keys that changed."""
    if ckpt is None:
        return cfg, {}
    check_architecture(ckpt, cfg)  # a file of another architecture than the config's: that, before its shapes
    family = ckpt.family or FAMILIES[cfg.MODEL.CONVENTION]  # a minidet state dict: the config's family
    fixed = head_config(ckpt, family.background_last)
    changed = {k: v for k, v in fixed.items() if cfg_value(cfg, k) != v}
    if changed:
        cfg = cfg.clone()
        cfg.defrost()
        cfg.merge_from_list([x for kv in changed.items() for x in kv])
        validate_cfg(cfg)
    return cfg, changed


def _load(cfg: CfgNode, weights: str | None) -> tuple[MaskRCNN, LoadReport | None, CfgNode, Checkpoint | None]:
    """The model of ``cfg`` fitted to the checkpoint (:func:`fit_to_checkpoint`) and loaded (see
    :func:`prepare_model`); also the fitted config and the opened checkpoint. Under ``MODEL.RUNTIME onnxruntime``
    or ``openvino`` the graph ``MODEL.GRAPH`` (``minidet export``) runs the network instead, checked against the
    checkpoint and the config (``ExportedNetwork.check_config``); the eager model is loaded all the same (every check
    of the weights against the config applies), for the images the graph cannot take, and keeps minidet's pre- and
    post-processing; the report names the graph."""
    check_cfg(cfg)  # every value in range before anything is read (once: load_cfg's config is not checked again)
    path = checkpoint_file(cfg, weights)
    network = None
    if cfg.MODEL.RUNTIME != "torch":  # the exported graph runs the network
        from .export.runtime import load_network

        network, graph_report = load_network(cfg, path)  # first: a weights file changed since the export is that error
    ckpt = open_checkpoint(path) if path is not None else None
    cfg, _ = fit_to_checkpoint(cfg, ckpt)
    if network is not None:
        network.check_config(cfg)
    model = build_model(cfg)
    report = None if ckpt is None else load_checkpoint(model, ckpt, bn_eps=cfg.MODEL.FROZEN_BN_EPS,
                                                       convention=cfg.MODEL.CONVENTION)
    if cfg.MODEL.WEIGHT_STANDARDIZATION:  # on the loaded kernels, before any norm is folded into them
        logger.info("standardized the kernels of %d convs", standardize_weights(model))
    if cfg.MODEL.FOLD_NORM:
        logger.info("folded %d norm layers into their convs", fold_norms(model))
    fuse_convs(model, cfg.MODEL.FUSE_CONVS)
    fuse_linears(model, cfg.MODEL.FUSE_LINEAR)
    device = torch.device(cfg.MODEL.DEVICE)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"MODEL.DEVICE is {cfg.MODEL.DEVICE} but CUDA is not available")
    model.to(device)
    model.set_runtime(timer=StageTimer(enabled=cfg.TEST.TIMING, device=device), channels_last=cfg.MODEL.CHANNELS_LAST)
    if network is not None:  # the eager network of the same weights takes what the graph cannot (not random ones)
        network.eager = model._detect if ckpt is not None else None
        model.use_network(network)
        report = graph_report
    return model.eval(), report, cfg, ckpt


def prepare_model(cfg: CfgNode, weights: str | None = None) -> tuple[MaskRCNN, LoadReport | None]:
    """Build the model (its class count and class-agnostic heads as the checkpoint has them), load the checkpoint
    (``checkpoint_file``: ``weights``, a resolved path, or ``MODEL.WEIGHTS``; ``none``: random weights, report
    None), fold norms, move to the device, eval mode."""
    model, report, _, _ = _load(cfg, weights)
    return model, report


def checkpoint_classes(cfg: CfgNode, ckpt: Checkpoint | None) -> tuple[Classes, str]:
    """The classes of the (fitted) ``cfg``'s model: COCO's for a checkpoint of its ``MODEL.CATEGORY_LAYOUT``'s size,
    else the checkpoint's own, named by ``MODEL.CLASS_NAMES``, else by the names the file carries, else ``class_1``
    ...; and, for own classes, the line that says so (else ""). The file's names are read only when
    ``MODEL.CLASS_NAMES`` gives none: names it cannot take (``Checkpoint.class_names``: CheckpointError) or of another
    count are one line that says ``MODEL.CLASS_NAMES`` overrides them."""
    m = cfg.MODEL
    background_last = FAMILIES[m.CONVENTION].background_last
    count = m.ROI_HEADS.NUM_CLASSES - (0 if background_last else 1)
    sources = [("MODEL.CLASS_NAMES", m.CLASS_NAMES)]
    if ckpt is not None and not m.CLASS_NAMES:
        sources.append((f"{ckpt.path} (its meta)", ckpt.class_names()))
    try:
        classes, where = resolve_classes(m.CATEGORY_LAYOUT, count, background_last, *sources)
    except ValueError as e:
        hint = "; set MODEL.CLASS_NAMES, which overrides the file's names" if len(sources) > 1 else ""
        raise ConfigError(f"{e}{hint}") from None
    if not classes.own:
        return classes, ""
    shown = ", ".join(n for _, _, n in classes.real()[:12]) + (", ..." if count > 12 else "")
    return classes, f"{count} classes (background excluded) from the checkpoint: {shown} (names: {where})"


def classes_of(cfg: CfgNode, weights: str | None = None) -> tuple[Classes, str]:
    """The classes a Predictor of ``cfg`` would have (:func:`checkpoint_classes`), from the checkpoint alone: no
    model is built."""
    check_cfg(cfg)
    path = checkpoint_file(cfg, weights)
    ckpt = open_checkpoint(path) if path is not None else None
    return checkpoint_classes(fit_to_checkpoint(cfg, ckpt)[0], ckpt)


class Predictor:
    """Built and loaded from a config, on ``MODEL.DEVICE``: ``predictor(image)`` takes an HxWx3 uint8 BGR array (as
    ``cv2.imread`` gives) and returns ``boxes`` (N, 4) float32 xyxy in input pixels, ``scores`` (N,), ``labels``
    (N,) int64 (the checkpoint's class index), ``category_ids`` (N,) int64 COCO ids, ``masks`` (``MODEL.MASK_ON``;
    ``minidet.masks.BoxMasks``: N bool masks of the H x W image, each kept as its box's crop, ``dense()`` the
    (N, H, W) stack), each other field the model's heads give (``heads.detections.FIELDS``: ``box_scores`` (N,)
    where a mask IoU head rescored the detections, Mask Scoring R-CNN: ``scores`` = box score x predicted mask IoU),
    ``timings`` (stage -> seconds) and what turns them into COCO
    instances: ``box_offset`` (1 where the weights' family counts box sizes pixel-inclusively) and ``class_names``
    (the name of each class index; ``minidet.apps.outputs.instances``). ``weights_summary`` names what was loaded.
    ``weights``: the checkpoint's path when the caller resolved ``MODEL.WEIGHTS`` already (see ``checkpoint_file``)."""

    def __init__(self, cfg: CfgNode, weights: str | None = None) -> None:
        self.model, self.load_report, fitted, ckpt = _load(cfg.clone(), weights)
        fitted.freeze()
        self.cfg = fitted
        random = "none (random weights: MODEL.WEIGHTS none)"
        self.weights_summary: str = self.load_report.summary if self.load_report is not None else random
        # JSON widths as the weights' family counts them: pixel-inclusive (x2 - x1 + 1) for +1 box rules
        self.box_offset: int = self.model.final_predictor.box_rule.offset
        classes, self.classes_summary = checkpoint_classes(fitted, ckpt)
        if self.classes_summary:
            logger.info("%s", self.classes_summary)
        self.classes = classes

    @property
    def classes(self) -> Classes:
        """What the model's class indices are: names and category ids (``categories.Classes``). Set it to map them
        to a dataset's categories (``minidet eval`` does)."""
        return self._classes

    @classes.setter
    def classes(self, classes: Classes) -> None:
        self._classes = classes
        self.class_names: list[str] = list(classes.names)
        self._cat_ids = torch.tensor(classes.ids, dtype=torch.int64)

    @classmethod
    def from_pretrained(cls, name: str, device: str = "cpu", **overrides) -> Predictor:
        """A Predictor for a registry name (``minidet weights list``; its config and its weights, downloaded and
        verified on first use) or a config name (its own ``MODEL.WEIGHTS``), on ``device``; ``overrides`` are
        config keys, ``**{"TEST.AMP": "bf16"}`` or with ``__`` for the dots: ``TEST__IMS_PER_BATCH=4``."""
        from .hub import REGISTRY

        entry = REGISTRY.get(name)
        config = entry.config if entry is not None else name
        if entry is None:  # a config name: the registry's file of the name its MODEL.WEIGHTS ends with, if any
            file = os.path.basename(get_cfg(config).MODEL.WEIGHTS)
            entry = next((e for e in REGISTRY.values() if e.filename == file), None)
        opts = [x for k, v in overrides.items() for x in (k.replace("__", "."), v)]
        return cls(load_cfg(config, [*(["MODEL.WEIGHTS", entry.name] if entry else []), "MODEL.DEVICE", device, *opts]))

    def __call__(self, image: np.ndarray) -> dict:
        return self.predict_batch([image])[0]

    def predict_batch(self, images: list[np.ndarray]) -> list[dict]:
        """Run several images in one forward; ``timings`` are for the whole batch."""
        for i, im in enumerate(images):
            if not (isinstance(im, np.ndarray) and im.ndim == 3 and im.shape[2] == 3 and im.dtype == np.uint8):
                desc = f"{type(im).__name__} {getattr(im, 'shape', '')} {getattr(im, 'dtype', '')}".strip()
                raise ValueError(f"image {i}: expected an HxWx3 uint8 BGR array, got {desc}")
            try:
                self.model.transform.check_size(*im.shape[:2])
            except ValueError as e:
                raise ValueError(f"image {i}: {e}") from None
        self.model.timer.reset()
        outs = self.model(images)
        timings = dict(self.model.timer.times)
        results = [{k: v.cpu() for k, v in o.items()} for o in outs]
        for r in results:
            r["category_ids"] = self._cat_ids[r["labels"]] if len(r["labels"]) else r["labels"].clone()
            r["timings"] = timings
            r["box_offset"], r["class_names"] = self.box_offset, self.class_names
        return results
