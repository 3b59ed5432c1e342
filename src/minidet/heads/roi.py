"""The RoI heads as one module, run by the eager detector and by the exported graph alike: the box stage (one box
head and predictor, or Cascade R-CNN's stages), then the mask stage(s) on the detections, then an optional scorer
(Mask Scoring R-CNN's mask IoU head). ``ROI_HEADS`` is the table of ``MODEL.ROI_HEADS.NAME``'s values (as
detectron2's, without a registry): a new kind of RoI heads is one class here and one row.

Both paths share each head's arithmetic: ``forward`` runs a chunk of images (batched RoIAlign, the stage timer's
details, autocast, the memory layout), ``forward_image`` one image in operators that ``torch.export`` follows
(``export.graph.NetworkGraph`` gives it its RoIAlign and NMS); the box stage, the mask stages' mean, the scorer are
the same methods on both. Where the graph needs other operators, they are in the head's own module
(``BoxPredictor.inference_image``, ``MaskIoUHead``'s zero row).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import ConfigError
from ..poolers import MultiScaleRoIAlign
from ..timing import StageTimer
from .box import BoxHead, BoxPredictor
from .cascade import Cascade
from .detections import Detections
from .mask import MaskHead
from .mask_iou import MaskIoUHead

if TYPE_CHECKING:
    from ..conventions import CascadeRule

# a pool of boxes: (pooler, per image its boxes (R_i, 4)) -> the pooled features (sum R_i, C, S, S)
Pool = Callable[[MultiScaleRoIAlign, list[torch.Tensor]], torch.Tensor]
OFF = StageTimer(enabled=False)


def _per_image(t: torch.Tensor, dets: list[Detections]) -> tuple[torch.Tensor, ...]:
    """``t`` split into each image's rows of ``dets``; one image's whole, uncounted (the graph's count of boxes is
    a symbol ``len`` cannot give)."""
    return (t,) if len(dets) == 1 else t.split([len(d.boxes) for d in dets])


class StandardROIHeads(nn.Module):
    """One box head and predictor (``box_head``, ``box_predictor``) on the RPN's proposals, the mask head
    (``mask_head``: a ``MaskHead``, a ``nn.ModuleList`` of one per cascade stage, or None: no masks) on the detected
    boxes, and ``mask_iou_head`` (Mask Scoring R-CNN, or None): each detection's score becomes its box score times its
    mask's predicted IoU, the box score kept as ``Detections.box_scores``. The children's names are the checkpoints'
    key prefixes (``box_head.``, ``cascade.heads.k.``, ``mask_head.``, ``mask_iou_head.``; ``PARTS``)."""

    PARTS = ("box_pooler", "box_head", "box_predictor", "mask_pooler", "mask_head", "cascade", "mask_iou_head")

    def __init__(self, box_pooler: MultiScaleRoIAlign, box_head: BoxHead | None, box_predictor: BoxPredictor | None,
                 mask_pooler: MultiScaleRoIAlign | None = None, mask_heads: list[MaskHead] = (),
                 mask_iou_head: MaskIoUHead | None = None, cascade: Cascade | None = None) -> None:
        super().__init__()
        self.box_pooler, self.box_head, self.box_predictor = box_pooler, box_head, box_predictor
        self.mask_pooler = mask_pooler if mask_heads else None
        self.mask_head = (mask_heads[0] if len(mask_heads) == 1 else nn.ModuleList(mask_heads)) if mask_heads else None
        self.cascade, self.mask_iou_head = cascade, mask_iou_head

    @classmethod
    def build(cls, box_pooler: MultiScaleRoIAlign, boxes: list[tuple[BoxHead, BoxPredictor]],
              mask_pooler: MultiScaleRoIAlign | None, mask_head: Callable[[], MaskHead] | None,
              scorer: Callable[[], MaskIoUHead] | None, rule: CascadeRule | None, family: str = "") -> StandardROIHeads:
        """The heads of ``build_model``: ``boxes`` its box head and predictor (one pair), ``mask_head()`` makes a mask
        head (None: no masks), ``scorer()`` the mask IoU head (None: none); ``rule``: the cascade rule of the weight
        ``family`` (None: it has no cascade), which plain heads do not read. Made in that order."""
        if len(boxes) != 1:
            raise ConfigError(f"MODEL.ROI_HEADS.NAME StandardROIHeads has one box stage; got {len(boxes)}")
        masks = [mask_head()] if mask_head is not None else []
        return cls(box_pooler, *boxes[0], mask_pooler, masks, scorer() if scorer is not None else None)

    @property
    def final_predictor(self) -> BoxPredictor:
        """The box predictor whose post-processing gives the detections (a cascade's last stage's)."""
        return self.box_predictor

    @property
    def mask_stages(self) -> list[MaskHead]:
        """The mask heads: none, one, or a cascade's one per stage (their probabilities' mean is the mask)."""
        heads = self.mask_head
        return list(heads) if isinstance(heads, nn.ModuleList) else [heads] * (heads is not None)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The ``Detections`` fields these heads set (``detections.FIELDS``' names), in the table's order."""
        return ("masks",) * bool(self.mask_stages) + ("box_scores",) * (self.mask_iou_head is not None)

    @property
    def frame(self) -> str:
        """The frame of the boxes the heads give: ``"original"`` (image pixels) or ``"resized"``."""
        return "original" if self.final_predictor.original_frame else "resized"

    def box_stage(self, pool: Callable[[list[torch.Tensor]], torch.Tensor], proposals: list[torch.Tensor],
                  sizes: list[tuple[int, int]], amp: Callable) -> tuple:
        """The box head and predictor on per-image ``proposals``: ``pool(boxes)`` pools them, ``amp()`` is the
        layers' autocast -> (logits (R, K) float32, deltas (R, 4K') float32, the boxes they refine (per image),
        whether the scores are probabilities already)."""
        with amp():
            logits, deltas = self.box_predictor(self.box_head(pool(proposals)))
        return logits.float(), deltas.float(), proposals, False

    def forward(self, pyramid: list[torch.Tensor], proposals: list[torch.Tensor], images,
                timer: StageTimer = OFF, amp: Callable = contextlib.nullcontext,
                layout: Callable[[torch.Tensor], torch.Tensor] = lambda x: x) -> list[Detections]:
        """A chunk of images: the FPN ``pyramid``, per image its ``proposals`` (P_i, 4) in the resized frame, the
        chunk's ``transform.ImageBatch`` -> per image its ``Detections`` (before post-processing). ``timer`` gets
        the stages ``box_head``, ``mask_head`` and their details; ``amp()``: the layers' autocast; ``layout``: the
        pooled features' memory layout."""
        t = timer

        def pool(pooler: MultiScaleRoIAlign, boxes: list[torch.Tensor], name: str = "box") -> torch.Tensor:
            with t.detail(f"{name}_roi_align"), amp():
                return layout(pooler(levels, boxes))

        with t.stage("box_head"):
            levels = self.box_pooler.layout(pyramid)  # converted once for both heads
            scores, deltas, boxes, probabilities = self.box_stage(lambda b: pool(self.box_pooler, b), proposals,
                                                                  images.sizes, amp)
            with t.detail("box_postprocess"):
                dets = self.final_predictor.inference(scores, deltas, boxes, images, probabilities=probabilities)
        if not self.mask_stages:
            return dets
        with t.stage("mask_head"):
            rois = [d.boxes * s if d.frame == "original" else d.boxes for d, s in zip(dets, images.scales)]
            if sum(len(b) for b in rois):
                return self.mask_stage(dets, pool(self.mask_pooler, rois, "mask"), amp, t)
            m = 2 * self.mask_pooler.output_size[0]  # the mask head's output: twice the pooled size
            masks = images.tensor.new_zeros((0, m, m))
            return self.finish(dets, masks, masks.new_zeros((0,)) if self.mask_iou_head is not None else None)

    def forward_image(self, pool: Pool, proposals: torch.Tensor, size: tuple, original_size: tuple, scale,
                      nms: Callable) -> Detections:
        """One image in operators that ``torch.export`` follows (the exported graph's): its ``proposals`` (P, 4) in
        the resized frame, its resized and original sizes (h, w) and resize factor -> its ``Detections``.
        ``pool(pooler, [boxes])``: the graph's multi-scale RoIAlign; ``nms``: its NMS
        (``BoxPredictor.inference_image``)."""
        scores, deltas, (boxes,), probabilities = self.box_stage(lambda b: pool(self.box_pooler, b), [proposals],
                                                                 [size], contextlib.nullcontext)
        det = self.final_predictor.inference_image(scores, deltas, boxes, size, original_size, scale, nms,
                                                   probabilities=probabilities)
        if not self.mask_stages:
            return det
        rois = det.boxes * scale if det.frame == "original" else det.boxes
        return self.mask_stage([det], pool(self.mask_pooler, [rois]), contextlib.nullcontext, OFF)[0]

    def mask_stage(self, dets: list[Detections], pooled: torch.Tensor, amp: Callable,
                   timer: StageTimer) -> list[Detections]:
        """The mask heads on the detections' pooled features (sum D_i, C, S, S), the mean of their probabilities
        (a cascade's one per stage, mmdetection's), and the scorer -> the detections with ``masks`` (and
        ``box_scores``)."""
        labels = dets[0].labels if len(dets) == 1 else torch.cat([d.labels for d in dets])
        with amp():
            logits = [head(pooled, labels) for head in self.mask_stages]
        probs = [MaskHead.select(m.float(), labels) for m in logits]
        probs = probs[0] if len(probs) == 1 else torch.stack(probs).mean(0)
        iou = None
        if self.mask_iou_head is not None:
            with timer.detail("mask_iou"), amp():
                iou = self.mask_iou_head(pooled, probs, labels).float()
        return self.finish(dets, probs, iou)

    @staticmethod
    def finish(dets: list[Detections], masks: torch.Tensor, iou: torch.Tensor | None) -> list[Detections]:
        """Each image's share of the ``masks`` (sum D_i, M, M); with the scorer's ``iou`` (sum D_i,), its scores
        times those, its box scores kept."""
        if iou is not None:
            dets = [d._replace(scores=d.scores * i, box_scores=d.scores) for d, i in zip(dets, _per_image(iou, dets))]
        return [d._replace(masks=p) for d, p in zip(dets, _per_image(masks, dets))]


class CascadeROIHeads(StandardROIHeads):
    """Cascade R-CNN: ``cascade``'s box stages in place of the one box head and predictor (its last stage's
    predictor gives the detections, from the stages' scores combined by the family's ``CascadeRule``), then the mask
    stage(s) and scorer as ``StandardROIHeads``."""

    def __init__(self, box_pooler: MultiScaleRoIAlign, cascade: Cascade, mask_pooler: MultiScaleRoIAlign | None = None,
                 mask_heads: list[MaskHead] = (), mask_iou_head: MaskIoUHead | None = None) -> None:
        super().__init__(box_pooler, None, None, mask_pooler, mask_heads, mask_iou_head, cascade)

    @classmethod
    def build(cls, box_pooler: MultiScaleRoIAlign, boxes: list[tuple[BoxHead, BoxPredictor]],
              mask_pooler: MultiScaleRoIAlign | None, mask_head: Callable[[], MaskHead] | None,
              scorer: Callable[[], MaskIoUHead] | None, rule: CascadeRule | None, family: str = "") -> CascadeROIHeads:
        """As ``StandardROIHeads.build``, ``boxes`` one pair per stage, combined by the family's ``rule``: one mask
        head per stage where it says so (``mask_per_stage``), else one."""
        if rule is None:
            raise ConfigError(f"MODEL.ROI_HEADS.NAME CascadeROIHeads: MODEL.CONVENTION {family} has no Cascade R-CNN "
                              "(detectron2's and mmdetection's have)")
        cascade = Cascade([h for h, _ in boxes], [p for _, p in boxes], rule)
        masks = [mask_head() for _ in (boxes if rule.mask_per_stage else [0])] if mask_head is not None else []
        return cls(box_pooler, cascade, mask_pooler, masks, scorer() if scorer is not None else None)

    @property
    def final_predictor(self) -> BoxPredictor:
        return self.cascade.predictors[-1]

    def box_stage(self, pool: Callable[[list[torch.Tensor]], torch.Tensor], proposals: list[torch.Tensor],
                  sizes: list[tuple[int, int]], amp: Callable) -> tuple:
        scores, deltas, boxes = self.cascade(pool, proposals, sizes, amp)
        return scores, deltas, boxes, not self.cascade.rule.mean_logits


# MODEL.ROI_HEADS.NAME -> its class (config.RULES lists the names: configs are read without torch)
ROI_HEADS: dict[str, type[StandardROIHeads]] = {"StandardROIHeads": StandardROIHeads,
                                                 "CascadeROIHeads": CascadeROIHeads}
