"""Each weight family's arithmetic as data: one field per behaviour that differs between families.

Read by ``build_model`` (and, by argument, the checkpoint loader); the modules get the fields as
plain arguments and never import this file. A new family is one more instance here (and in
``CONVENTIONS``) plus a rename table in ``checkpoint.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import poolers, rpn, transform
from .boxes import PLAIN_BOX_RULE, BoxRule


@dataclass(frozen=True)
class Convention:
    resize: Callable  # image -> normalized, resized tensor and scale (transform.resize_*)
    anchors: Callable  # one FPN level's cell anchors: (size, aspect_ratios, stride) -> (A, 4)
    fixed_strides: bool  # anchors at strides 2^level (else padded size // grid size)
    rank_by_logit: bool  # the RPN ranks proposals by logit (else by sigmoid, which ties saturated scores)
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


TORCHVISION = Convention(
    resize=transform.resize_torch, anchors=rpn.torchvision_cell_anchors, fixed_strides=False, rank_by_logit=False,
    box_rule=PLAIN_BOX_RULE, clip_to_padded=False, proposal_filter=rpn.keep_min_size, topk_per_level=False,
    aligned_roi=False, fpn_levels=poolers.torchvision_levels, original_frame=False, small_box_filter=True,
    ties_at_cap=False, rescale=transform.rescale_per_axis, paste=transform.paste_masks,
)
DETECTRON = Convention(
    resize=transform.resize_cv2, anchors=rpn.detectron_cell_anchors, fixed_strides=True, rank_by_logit=False,
    box_rule=BoxRule(offset=1, inclusive_nms=True), clip_to_padded=True, proposal_filter=rpn.keep_original_pixels,
    topk_per_level=True, aligned_roi=False, fpn_levels=poolers.detectron_levels, original_frame=True,
    small_box_filter=False, ties_at_cap=True, rescale=transform.rescale_per_axis, paste=transform.paste_masks,
)
DETECTRON2 = Convention(
    resize=transform.resize_pil, anchors=rpn.detectron2_cell_anchors, fixed_strides=True, rank_by_logit=True,
    box_rule=PLAIN_BOX_RULE, clip_to_padded=False, proposal_filter=rpn.keep_above_min_size, topk_per_level=False,
    aligned_roi=True, fpn_levels=poolers.detectron2_levels, original_frame=False, small_box_filter=False,
    ties_at_cap=False, rescale=transform.rescale_clip_nonempty, paste=transform.paste_masks_aligned,
)
# maskrcnn-benchmark (and MLPerf): Detectron's anchors, +1 sizes and levels, but PIL resizing by its own
# size rule, NMS suppressing at IoU > thresh (its CUDA kernel; the CPU kernel uses >=), clipping to each
# image, boxes decoded in the resized frame and scaled per axis, torchvision's paste (which came from it)
MASKRCNN_BENCHMARK = Convention(
    resize=transform.resize_pil_mb, anchors=rpn.detectron_cell_anchors, fixed_strides=True, rank_by_logit=False,
    box_rule=BoxRule(offset=1, inclusive_nms=False), clip_to_padded=False, proposal_filter=rpn.keep_min_size_inclusive,
    topk_per_level=True, aligned_roi=False, fpn_levels=poolers.detectron_levels, original_frame=False,
    small_box_filter=False, ties_at_cap=True, rescale=transform.rescale_per_axis, paste=transform.paste_masks,
)
# MODEL.CONVENTION -> its arithmetic (Detectron's boxes arrive in the original frame: no rescale)
CONVENTIONS: dict[str, Convention] = {
    "torchvision": TORCHVISION, "detectron": DETECTRON, "detectron2": DETECTRON2,
    "maskrcnn_benchmark": MASKRCNN_BENCHMARK,
}
