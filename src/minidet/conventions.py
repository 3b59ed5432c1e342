"""A weight family's arithmetic as data: one field per behaviour that differs between families.

Each family module (``minidet.families``) builds one instance; ``build_model`` reads it and hands the fields to
the modules as plain arguments (they never import this file).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .boxes import BoxRule


@dataclass(frozen=True)
class Convention:
    resize: Callable  # image -> normalized, resized tensor and scale (transform.resize_*)
    anchors: Callable  # one FPN level's cell anchors: (size, aspect_ratios, stride) -> (A, 4)
    fixed_strides: bool  # anchors at strides 2^level (else padded size // grid size)
    level_topk: Callable  # one level's RPN logits (N, L), PRE_NMS_TOPK -> (N, k) scores and indices (rpn.topk_logits)
    rank_by_logit: bool  # the RPN ranks by level_topk's scores (else by their sigmoid, which ties saturated scores)
    box_rule: BoxRule  # +1 box sizes and NMS suppressing at IoU >= thresh, in the RPN and the box head
    clip_to_padded: bool  # the RPN clips proposals to the padded input (else to each image)
    proposal_filter: Callable  # which clipped proposals stay: (boxes, MIN_SIZE, scale, padded size) -> keep
    topk_per_level: bool  # POST_NMS_TOPK proposals per level before the overall cut
    aligned_roi: bool  # RoIAlign shifted by half a pixel (ROIAlignV2)
    fpn_levels: Callable  # FPN level of each RoI: (boxes, min_level, max_level) -> 0-based index
    original_frame: bool  # the box head decodes and clips in original-image pixels
    small_box_filter: bool  # the box head drops boxes under ROI_HEADS.MIN_BOX_SIZE
    ties_at_cap: bool  # every detection scoring >= the DETECTIONS_PER_IMAGE-th best is kept
    rescale: Callable  # boxes in the resized frame -> original pixels (transform.rescale_*)
    paste: Callable  # (D, M, M) mask probabilities -> (D, H, W) bool masks (transform.paste_*)
