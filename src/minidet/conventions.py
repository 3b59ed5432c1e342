"""A weight family's arithmetic as data: one field per behaviour that differs between families.

Each family module (``minidet.families``) builds one instance; ``build_model`` reads it and hands the fields to
the modules as plain arguments (they never import this file). The fields every family has an opinion on come first
and have no default; the others default to the plain rule (torchvision's, or the most common one), so that a
family states only where it differs and a new field is one line here, not an edit of every family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import transform
from .boxes import PLAIN_BOX_RULE, BoxRule
from .heads import rpn


@dataclass(frozen=True)
class CascadeRule:
    """How a family's Cascade R-CNN (a ``Cascade`` of box stages) combines its stages at test time.
    ``mean_logits``: the final class scores are the softmax of the stages' mean logits (mmdetection), else the mean
    of the stages' softmax probabilities, summed and times 1 / stages (detectron2); ``mask_per_stage``: every stage
    has a mask head and the mask is the mean of their probabilities on the final boxes (mmdetection), else one mask
    head (detectron2)."""

    mean_logits: bool
    mask_per_stage: bool


@dataclass(frozen=True)
class Convention:
    resize: Callable  # image -> normalized, resized tensor and scale (transform.resize_*)
    anchors: Callable  # one FPN level's cell anchors: (size, aspect_ratios, stride) -> (A, 4)
    proposal_filter: Callable  # which clipped proposals stay: (boxes, MIN_SIZE, scale, padded size) -> keep
    fpn_levels: Callable  # FPN level of each RoI: (boxes, min_level, max_level) -> 0-based index
    fixed_strides: bool = True  # anchors at strides 2^level (else padded size // grid size)
    level_topk: Callable = rpn.topk_logits  # one level's RPN logits (N, L), PRE_NMS_TOPK -> (N, k) scores, indices
    rank_by_logit: bool = False  # the RPN ranks by level_topk's scores (else by their sigmoid: saturated ties)
    box_rule: BoxRule = PLAIN_BOX_RULE  # +1 box sizes and NMS suppressing at IoU >= thresh (RPN and box head)
    clip_to_padded: bool = False  # the RPN clips proposals to the padded input (else to each image)
    topk_per_level: bool = False  # POST_NMS_TOPK proposals per level before the overall cut
    aligned_roi: bool = False  # RoIAlign shifted by half a pixel (ROIAlignV2)
    original_frame: bool = False  # the box head decodes and clips in original-image pixels
    small_box_filter: bool = False  # the box head drops boxes under ROI_HEADS.MIN_BOX_SIZE
    ties_at_cap: bool = False  # every detection scoring >= the DETECTIONS_PER_IMAGE-th best is kept
    rescale: Callable = transform.rescale_per_axis  # boxes in the resized frame -> original pixels (rescale_*)
    paste: Callable = transform.paste_masks  # (D, M, M) mask probabilities -> D box-cropped masks (paste_*)
    cascade: CascadeRule | None = None  # how Cascade R-CNN's stages combine (None: the family has no cascade)
