"""One image's detections before post-processing, as the RoI heads give them, and the table of their fields.

``boxes``, ``scores``, ``labels`` and ``frame`` every head gives; the rest are ``FIELDS``, one row each: a head that
gives a new output adds one ``Field`` here, and the record has it (``Detections.<name>``, None where no head of the
model sets it). Everything downstream reads the table: ``Transform.postprocess`` (a field is carried as it is, or
pasted into the image where ``pasted``), the exported graph's outputs (``export.graph``, in the table's order) and
its runtime's ``Detections``, the Predictor's output dict, sliced inference's merge (the kept detection's row) and
the writers (``record``: the key of its value in infer's records). Importing it needs no torch.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Field:
    """An output of the RoI heads beside boxes, scores and labels: one row per detection. ``name``: the attribute of
    ``Detections``, the exported graph's output and the Predictor's key; ``pasted``: made into the image's masks by
    ``Transform.postprocess`` (else carried as it is); ``record``: the key of its value (one number per detection) in
    infer's records ('' none); ``score``: a score, compared within the scores' tolerance by the export gate."""

    name: str
    doc: str
    pasted: bool = False
    record: str = ""
    score: bool = False


# in the exported graph's order: a field added last leaves the outputs of the graphs without it as they were
FIELDS = (
    Field("masks", "(D, M, M) float32 probabilities of each box's class (the mask stage's; pasted into the image)",
          pasted=True),
    Field("box_scores", "(D,) the box stage's scores, where a scorer rescored ``scores`` (Mask Scoring R-CNN: "
          "``scores`` = box score x predicted mask IoU, sorted by the box scores, as mmdetection keeps them)",
          record="box_score", score=True),
)
FIELD_NAMES = tuple(f.name for f in FIELDS)
RECORDED = tuple(f for f in FIELDS if f.record)  # the fields infer's records carry


class Detections(namedtuple("Detections", ("boxes", "scores", "labels", "frame", *FIELD_NAMES),
                            defaults=(None,) * len(FIELDS))):
    """One image's detections, sorted by decreasing score: ``boxes`` (D, 4) xyxy in ``frame`` (``"resized"``: the
    network input's pixels, or ``"original"``); ``scores`` (D,); ``labels`` (D,) int64, the checkpoint's class index;
    then each of ``FIELDS`` (its ``doc``), None where the model gives none."""

    __slots__ = ()

    def fields(self) -> dict[str, torch.Tensor]:
        """The ``FIELDS`` this record has (not None), by name, in the table's order."""
        return {f.name: getattr(self, f.name) for f in FIELDS if getattr(self, f.name) is not None}

    def select(self, keep: torch.Tensor) -> Detections:
        """The detections ``keep`` (indices or a bool mask): every row of boxes, scores, labels and each field."""
        rows = {k: v[keep] for k, v in self.fields().items()}
        return self._replace(boxes=self.boxes[keep], scores=self.scores[keep], labels=self.labels[keep], **rows)
