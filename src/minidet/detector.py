"""The Mask R-CNN meta-architecture and ``build_model(cfg)``, the one reader of the conventions."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from functools import partial
from typing import Protocol

import torch
from torch import nn

from .bodies import body_kind
from .config import CfgNode, body_of, check_cfg
from .families import FAMILIES, convention
from .heads.box import BoxHead, BoxPredictor
from .heads.detections import Detections
from .heads.mask import MaskHead
from .heads.mask_iou import MaskIoUHead
from .heads.roi import ROI_HEADS, StandardROIHeads
from .heads.rpn import RPN
from .necks.fpn import FPN
from .norm import NormFn, get_norm
from .poolers import MultiScaleRoIAlign
from .timing import StageTimer
from .transform import ImageBatch, Transform


class Network(Protocol):
    """What may run in place of the eager network (``export.runtime``'s ``ExportedNetwork``: an exported graph
    under a runtime); typed here so that the engine does not import the exporter."""

    def takes(self, images: ImageBatch) -> bool:
        """Whether the padded chunk ``images`` fits the graph (else the eager network runs it)."""

    def __call__(self, images: ImageBatch) -> list[Detections]:
        """Per image of the padded chunk its ``Detections`` before post-processing."""


class MaskRCNN(nn.Module):
    """ResNet-FPN Mask R-CNN, inference only: transform, backbone, FPN, RPN, then ``roi_heads`` (``heads.roi``: the
    box stage or a cascade, the mask stage(s), an optional scorer), whose modules are the detector's own children by
    their own names (``box_head``, ``box_predictor``, ``cascade``, ``mask_head``, ``mask_iou_head``...: the
    checkpoints' key names; setting one on the detector sets it on ``roi_heads``). ``amp_dtype``: autocast for the
    network layers (box math stays float32); ``chunk_images``: images per network run (``chunk_size``)."""

    def __init__(
        self, transform: Transform, backbone: nn.Module, fpn: FPN, rpn: RPN, roi_heads: StandardROIHeads, *,
        amp_dtype: torch.dtype | None = None, chunk_images: int = 0,
    ) -> None:
        super().__init__()
        self.transform, self.backbone, self.fpn, self.rpn = transform, backbone, fpn, rpn
        self.__dict__["roi_heads"] = roi_heads  # not a child of its own: its parts are
        for name in roi_heads.PARTS:
            setattr(self, name, getattr(roi_heads, name))
        self.amp_dtype, self.chunk_images = amp_dtype, chunk_images
        self.channels_last, self.timer = False, StageTimer(enabled=False)
        self._network = None  # runs in place of ``_detect`` when set (``use_network``, ``running``)

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name in StandardROIHeads.PARTS and "roi_heads" in self.__dict__:  # one module, held by both
            setattr(self.roi_heads, name, value)

    def set_runtime(self, *, timer: StageTimer | None = None, channels_last: bool | None = None,
                    amp_dtype: torch.dtype | None | str = "keep") -> MaskRCNN:
        """The settings that do not change the weights, set after moving the model: ``timer`` gets the stage times;
        ``channels_last`` converts the weights and runs on channels-last inputs; ``amp_dtype`` autocasts the network
        layers (None: float32). None (``"keep"`` for ``amp_dtype``) keeps a setting."""
        if timer is not None:
            self.timer = timer
        if channels_last:
            self.to(memory_format=torch.channels_last)
        if channels_last is not None:
            self.channels_last = channels_last
        if amp_dtype != "keep":
            self.amp_dtype = amp_dtype
        return self

    @property
    def network(self) -> Network | None:
        """What runs in place of the eager network (``_detect``): an exported graph (``export.runtime``'s
        ``ExportedNetwork``), or None for the eager network. Set with ``use_network`` or ``running``."""
        return self._network

    def use_network(self, network: Network | None) -> MaskRCNN:
        """Run ``network`` (an ``ExportedNetwork``: a padded chunk in, per image its ``Detections`` out) in place of
        the eager network from now on; None: the eager network again."""
        self._network = network
        return self

    @contextlib.contextmanager
    def running(self, network: Network | None) -> Iterator[MaskRCNN]:
        """``with model.running(network):`` the block runs ``network`` (None: the eager network); the one set
        before is back after it."""
        saved, self._network = self._network, network
        try:
            yield self
        finally:
            self._network = saved

    @property
    def final_predictor(self) -> BoxPredictor:
        """The box predictor whose post-processing gives the detections (a cascade's last stage's)."""
        return self.roi_heads.final_predictor

    @property
    def device(self) -> torch.device:
        return self.transform.device

    def preprocess(self, images: list) -> ImageBatch:
        """``transform.preprocess``: the padded batch of ``images`` (tensor, sizes, original sizes, scales)."""
        return self.transform.preprocess(images)

    def _amp(self):
        on = self.amp_dtype is not None
        return torch.autocast(self.device.type, dtype=self.amp_dtype) if on else contextlib.nullcontext()

    def _to_layout(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def chunk_size(self, n: int) -> int:
        """Images per network run for a batch of ``n`` (``chunk_images``; 0: one on CPU, all on GPU)."""
        c = self.chunk_images or (n if self.device.type == "cuda" else 1)
        return max(1, min(c, n))

    @torch.inference_mode()
    def forward(self, images: list) -> list[dict[str, torch.Tensor]]:
        """HxWx3 uint8 arrays (or tensors) in the input's (BGR) channel order -> per image a dict of
        ``boxes`` (D, 4) float32 xyxy in input pixels, ``scores`` (D,), ``labels`` (D,) int64 and, with a
        mask head, ``masks`` (``minidet.masks.BoxMasks``: D bool masks of the H x W image, each kept as the crop of
        the pixels around its box; ``dense()`` gives the (D, H, W) stack). The network runs on chunks of
        ``chunk_size`` images."""
        t = self.timer
        with t.stage("preprocess"):
            batch = self.transform.preprocess(images)
        dets = self.detect(batch)
        with t.stage("paste"):
            return self.transform.postprocess(dets, batch)

    @torch.inference_mode()
    def detect(self, images: ImageBatch, proposals: list[torch.Tensor] | None = None) -> list[Detections]:
        """The network alone on a padded batch (``preprocess``'s), chunk by chunk as ``forward`` runs it: per image
        its ``Detections`` before post-processing (boxes in the network's frame, mask probabilities; rescale and
        paste are ``transform.postprocess``), as detectron2's ``inference(do_postprocess=False)`` gives them to its
        exporters. ``proposals``: a list that gets each image's RPN proposals (P, 4), from the eager network (an
        exported graph's runtime gives none: ValueError)."""
        if proposals is not None and self.network is not None:
            raise ValueError("proposals come from the eager network; this model runs an exported graph")
        images = images._replace(tensor=self._to_layout(images.tensor))
        step, dets = self.chunk_size(len(images.sizes)), []
        for i in range(0, len(images.sizes), step):
            chunk = images.part(slice(i, i + step))
            dets += self._detect(chunk, proposals) if self.network is None else self._run_network(chunk)
        return dets

    def _run_network(self, images: ImageBatch) -> list[Detections]:
        if not self.network.takes(images):  # too small for the graph: its eager network runs it, timed by stage
            return self.network(images)
        with self.timer.stage("network"):
            return self.network(images)

    def _detect(self, images: ImageBatch, proposals: list[torch.Tensor] | None = None) -> list[Detections]:
        """The network on one padded chunk: per image its ``Detections`` (with mask probabilities); ``proposals``
        gets each image's proposals where given (``detect``)."""
        t = self.timer
        with t.stage("backbone"), self._amp():
            feats = self.backbone(images.tensor)
        with t.stage("fpn"), self._amp():
            pyramid = list(self.fpn(feats).values())
        with t.stage("rpn"):
            with self._amp():
                logits, deltas = self.rpn.head(pyramid)
            with t.detail("rpn_select"):
                padded = tuple(images.tensor.shape[-2:])
                selected = self.rpn.select(logits, deltas, padded, images.sizes, images.scales)
                if proposals is not None:
                    proposals.extend(selected)
        return self.roi_heads(pyramid, selected, images, t, self._amp, self._to_layout)


def build_model(cfg: CfgNode) -> MaskRCNN:
    """The detector described by ``cfg`` (weights not loaded), the arithmetic of ``MODEL.CONVENTION``
    (its family's ``Convention``, ``minidet.families``) handed to the parts as plain arguments."""
    check_cfg(cfg)  # a config that prepare_model or load_cfg validated is not validated again
    m = cfg.MODEL
    conv = convention(m.CONVENTION)

    def norm(on: bool = True, kind: str = "") -> NormFn:  # ``kind`` or MODEL.NORM, or no norm where not ``on``
        kind = (kind or m.NORM) if on else ""
        return partial(get_norm, kind, eps=m.FROZEN_BN_EPS, num_groups=m.GN_NUM_GROUPS, gn_eps=m.GN_EPS)

    inp = cfg.INPUT
    transform = Transform(
        conv.resize, inp.MIN_SIZE_TEST, inp.MAX_SIZE_TEST, inp.SIZE_DIVISIBILITY, list(m.PIXEL_MEAN),
        list(m.PIXEL_STD), inp.PIXEL_RANGE, flip_channels=inp.FORMAT != "BGR",  # the input is BGR
        rescale=conv.rescale, paste=conv.paste, mask_threshold=m.ROI_MASK_HEAD.THRESHOLD,
    )
    kind = body_kind(m)  # bodies.BODIES: the body's module and its neck's
    backbone = importlib.import_module(f".bodies.{kind.module}", __package__).build(cfg, body_of(cfg), norm())
    fpn = importlib.import_module(f".necks.{kind.neck}", __package__).build(cfg, backbone.out_channels, norm)
    ch = m.FPN.OUT_CHANNELS
    r = m.RPN
    rpn = RPN(
        ch, m.ANCHOR_GENERATOR.SIZES, m.ANCHOR_GENERATOR.ASPECT_RATIOS, r.CONV_DEPTH, r.PRE_NMS_TOPK_TEST,
        r.POST_NMS_TOPK_TEST, r.NMS_THRESH, r.MIN_SIZE, anchor_generator=conv.anchors,
        fixed_strides=conv.fixed_strides, rank_by_logit=conv.rank_by_logit, box_rule=conv.box_rule,
        clip_to_padded=conv.clip_to_padded, proposal_filter=conv.proposal_filter,
        topk_per_level=conv.topk_per_level, level_topk=conv.level_topk, tv_tie_order=r.TORCHVISION_TIE_ORDER,
    )
    scales = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    pool = {"aligned": conv.aligned_roi, "level_rule": conv.fpn_levels, "impl": m.ROI_ALIGN_IMPL}
    bh, rh = m.ROI_BOX_HEAD, m.ROI_HEADS
    box_pooler = MultiScaleRoIAlign(bh.POOLER_RESOLUTION, scales, bh.POOLER_SAMPLING_RATIO, **pool)

    def box_head() -> BoxHead:
        return BoxHead(ch, bh.POOLER_RESOLUTION, bh.NUM_CONV, bh.CONV_DIM, bh.NUM_FC, bh.FC_DIM,
                       norm(bh.USE_NORM, m.HEAD_NORM), norm(True, m.HEAD_NORM) if bh.NORM_FC else None)

    num_classes = rh.NUM_CLASSES
    bg_last = FAMILIES[m.CONVENTION].background_last
    # a family with the background last counts the classes without it: its logits have one more column. One set
    # of class-agnostic deltas (background-last families), or two (background and foreground: Detectron's)
    reg_classes = (1 if bg_last else 2) if bh.CLS_AGNOSTIC_BBOX_REG else num_classes
    def predictor(in_dim: int, weights: list[float]) -> BoxPredictor:
        return BoxPredictor(
            in_dim, num_classes + 1 if bg_last else num_classes, reg_classes,
            bbox_reg_weights=tuple(weights), score_thresh=rh.SCORE_THRESH_TEST,
            nms_thresh=rh.NMS_THRESH_TEST, detections_per_image=rh.DETECTIONS_PER_IMAGE,
            min_box_size=rh.MIN_BOX_SIZE if conv.small_box_filter else None, bg_last=bg_last,
            box_rule=conv.box_rule, ties_at_cap=conv.ties_at_cap, original_frame=conv.original_frame,
            class_agnostic_nms=rh.NMS_CLASS_AGNOSTIC,
        )

    # the box stages' regression weights: a cascade's, one per stage, else the one box head's
    stages = [list(w) for w in m.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS] or [list(bh.BBOX_REG_WEIGHTS)]
    heads = [box_head() for _ in stages]
    boxes = [(h, predictor(h.out_dim, w)) for h, w in zip(heads, stages)]
    mh = m.ROI_MASK_HEAD
    mask_pooler = MultiScaleRoIAlign(mh.POOLER_RESOLUTION, scales, mh.POOLER_SAMPLING_RATIO, **pool) \
        if m.MASK_ON else None
    mask_classes = 1 if mh.CLS_AGNOSTIC_MASK else num_classes

    def mask_head() -> MaskHead:
        return MaskHead(ch, mh.NUM_CONV, mh.CONV_DIM, mask_classes, norm(mh.USE_NORM, m.HEAD_NORM))

    def mask_iou_head() -> MaskIoUHead:
        return MaskIoUHead(ch, num_classes, mh.POOLER_RESOLUTION)

    # the scorer scores the masks: without them (MODEL.MASK_ON False) the detections keep their box scores
    roi_heads = ROI_HEADS[rh.NAME].build(box_pooler, boxes, mask_pooler, mask_head if m.MASK_ON else None,
                                         mask_iou_head if m.MASKIOU_ON and m.MASK_ON else None, conv.cascade,
                                         m.CONVENTION)
    amp_dtype = {"": None, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.TEST.AMP]
    return MaskRCNN(transform, backbone, fpn, rpn, roi_heads.eval(), amp_dtype=amp_dtype,
                    chunk_images=cfg.TEST.CHUNK_IMAGES).eval()
