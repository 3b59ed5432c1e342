"""One image's detections before post-processing, as the RoI heads give them."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Detections(NamedTuple):
    """One image's detections, sorted by decreasing score (a Mask Scoring R-CNN's by decreasing box score, which its
    rescoring keeps, as mmdetection does): boxes (D, 4) xyxy in ``frame``
    (``"resized"``: the network input's pixels, or ``"original"``); scores (D,); labels (D,) int64,
    the checkpoint's class index; masks (D, M, M) probabilities of each box's class, or None; box_scores (D,): where
    a mask IoU head rescored the detections (Mask Scoring R-CNN; ``scores`` = box score x predicted mask IoU), the box
    head's scores, else None."""

    boxes: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor
    frame: str
    masks: torch.Tensor | None = None
    box_scores: torch.Tensor | None = None
