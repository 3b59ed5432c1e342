"""Reference torchvision Mask R-CNN models with realistic random weights, for parity tests.

The model builder, the input conversion and the detection comparison live in ``minidet.tvref``
(the benchmark tool uses them too); this module adds the test images and assertions.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from minidet.synthetic import structured_image
from minidet.tvref import build_tv, compare_detections, to_tv_input

__all__ = ["IMAGE_SHAPES", "build_tv", "images_bgr", "legacy_v1_state_dict", "match_detections", "run_tv"]

# the three test images: (height, width) of different sizes and aspect ratios
IMAGE_SHAPES = [(240, 320), (300, 200), (180, 420)]


def images_bgr(shapes=IMAGE_SHAPES, seed: int = 0) -> list[np.ndarray]:
    return [structured_image(h, w, seed + i) for i, (h, w) in enumerate(shapes)]


def legacy_v1_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The key layout of the published COCO_V1 file (pre-``_version = 2`` modules)."""
    out = {}
    for k, v in sd.items():
        k = re.sub(r"^(backbone\.fpn\.(?:inner|layer)_blocks\.\d)\.0\.", r"\1.", k)
        k = re.sub(r"^rpn\.head\.conv\.0\.0\.", "rpn.head.conv.", k)
        k = re.sub(r"^roi_heads\.mask_head\.(\d)\.0\.", lambda m: f"roi_heads.mask_head.mask_fcn{int(m[1]) + 1}.", k)
        out[k] = v
    return out


def run_tv(model, imgs_bgr: list[np.ndarray]) -> list[dict[str, torch.Tensor]]:
    with torch.inference_mode():
        outs = model([to_tv_input(im) for im in imgs_bgr])
    for o in outs:
        o["masks"] = o["masks"][:, 0] > 0.5
    return outs


def match_detections(ours: dict, ref: dict, box_tol: float = 1e-2, score_tol: float = 1e-4, iou_min: float = 0.99):
    """Assert same count; match each reference detection to one of ours (same label, closest box)."""
    m = compare_detections(ours, ref)
    assert m.n_ours == m.n_ref, f"{m.n_ours} detections vs torchvision {m.n_ref}"
    assert m.unmatched_label is None, f"no unmatched detection with label {m.unmatched_label}"
    assert m.worst_box <= box_tol, f"box differs by {m.worst_box} px"
    assert m.worst_score <= score_tol, f"score differs by {m.worst_score}"
    assert m.worst_iou >= iou_min, f"mask IoU {m.worst_iou}"
    return m.worst_box, m.worst_score, m.worst_iou
