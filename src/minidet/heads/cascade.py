"""Cascade R-CNN's box stages."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from .box import BoxHead, BoxPredictor

if TYPE_CHECKING:
    from ..conventions import CascadeRule


class Cascade(nn.Module):
    """Cascade R-CNN's box stages: stage k pools the boxes that stage k - 1 regressed (class-agnostic, with its own
    ``bbox_reg_weights``, clipped to the image), from the RPN's proposals for the first; ``heads.k``, ``predictors.k``
    are each stage's ``BoxHead`` and ``BoxPredictor``. The last stage's predictor turns the combined scores
    (``rule``) and its deltas into detections."""

    def __init__(self, heads: list[BoxHead], predictors: list[BoxPredictor], rule: CascadeRule) -> None:
        super().__init__()
        self.heads, self.predictors, self.rule = nn.ModuleList(heads), nn.ModuleList(predictors), rule

    def forward(self, pool, proposals: list[torch.Tensor], sizes: list[tuple[int, int]], amp) -> tuple:
        """Run the stages: ``pool(boxes)`` gives the pooled features of per-image ``boxes``, ``amp()`` the network
        layers' autocast. -> (scores (R, K) float32: the mean logits, or the mean probabilities (``rule``), the last
        stage's deltas (R, 4) float32, the last stage's per-image boxes)."""
        outputs, deltas = [], None
        for k, (head, predictor) in enumerate(zip(self.heads, self.predictors)):
            if deltas is not None:  # the previous stage's boxes
                proposals = self.predictors[k - 1].refine(deltas, proposals, sizes)
            with amp():
                logits, deltas = predictor(head(pool(proposals)))
            logits, deltas = logits.float(), deltas.float()
            outputs.append(logits if self.rule.mean_logits else F.softmax(logits, -1))
        total = sum(outputs)  # 0 + the first + ...: the sources' Python sum
        scores = total / float(len(outputs)) if self.rule.mean_logits else total * (1.0 / len(outputs))
        return scores, deltas, proposals
