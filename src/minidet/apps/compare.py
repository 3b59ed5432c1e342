"""The one "same detections" verdict of the tests and the benchmark, and how far detections moved.

``compare_detections(ours, ref).problem()`` is '' when two detection sets of one image are the
same (exact arithmetic run in another order: same count and labels, boxes within 1e-2 px,
scores within 1e-4, every mask with IoU >= 0.99), else the first difference, in words. Where
they are not, the difference still counts as the same detections when it is no larger than the
reference's own under a change of float summation order (torchvision run in channels-last against
its default layout): ``DetectionMatch.no_larger_than``. The parity tests assert this verdict
(``assert_same_detections``) and ``tools/benchmark.py`` counts the images on which it holds.
``detection_drift`` measures a change that is expected (AMP against float32).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np
import torch
from torchvision.ops import box_iou

FAR_PX = 1.0  # a matched box farther than this is another detection, not the same one moved
BOX_TOL = 1e-2  # px: the largest coordinate difference of two boxes that are the same
SCORE_TOL = 1e-4
IOU_MIN = 0.99  # the smallest mask IoU of two masks that are the same
# the kinds of difference, from the smallest: a difference of a lesser kind is smaller than any of a greater one
KINDS = {"": 0, "mask": 1, "score": 2, "box": 3, "count": 4, "label": 4, "far": 4}


@dataclass
class DetectionMatch:
    """How far one image's detections (``ours``) are from the reference's."""

    n_ours: int
    n_ref: int
    unmatched_label: int | None = None  # first reference label left without a detection of ours
    worst_box: float = 0.0  # px, max over matched pairs of the largest coordinate difference
    worst_score: float = 0.0
    worst_iou: float = 1.0  # smallest mask IoU over matched pairs
    worst_pixels: int = 0  # most mask pixels that differ in one matched pair
    iou_min: float = IOU_MIN
    low_iou: int = 0  # matched pairs with mask IoU < iou_min
    grid_flips: int = 0  # of those, pairs whose boxes truncate to different paste grids (``paste_grid``)
    n_far: int = 0  # reference detections whose matched box is more than ``FAR_PX`` away: a different detection
    first_far: str = ""  # the first of them, described
    pairs: list[tuple[int, int]] = field(default_factory=list)  # (ours, reference) index of each matched pair

    def _first(self, box_tol: float = BOX_TOL, score_tol: float = SCORE_TOL) -> str:
        """The first difference's key of ``KINDS`` ('' for none), in the order ``problem`` checks them."""
        checks = (
            ("count", self.n_ours != self.n_ref), ("label", self.unmatched_label is not None),
            ("far", self.n_far > 0), ("box", self.worst_box > box_tol), ("score", self.worst_score > score_tol),
            ("mask", self.low_iou > 0),
        )
        return next((key for key, differs in checks if differs), "")

    def problem(self, box_tol: float = BOX_TOL, score_tol: float = SCORE_TOL) -> str:
        """'' when the detections are the same, else the first difference.

        Same: equal counts; each reference detection matched by one of ours with its label
        (the closest box, each used once) within ``FAR_PX``; boxes within ``box_tol`` px, scores
        within ``score_tol``; every matched pair of masks with IoU >= ``iou_min``. Nothing else
        is excused: a mask pasted one pixel apart because the two boxes, equal within ``box_tol``,
        truncate to different integer paste grids is a difference too, which the message names.
        """
        first = self._first(box_tol, score_tol)
        if first == "count":
            return f"{self.n_ours} detections vs reference {self.n_ref}"
        if first == "label":
            return f"no unmatched detection with label {self.unmatched_label}"
        if first == "far":
            return (
                f"{self.n_far} of {self.n_ref} detections have no counterpart of the same label within"
                f" {FAR_PX} px (a different detection, not a moved box); first: {self.first_far}"
            )
        if first == "box":
            return f"box differs by {self.worst_box} px"
        if first == "score":
            return f"score differs by {self.worst_score}"
        if first == "mask":
            flips = f", {self.grid_flips} of them pasted 1 px apart (boxes on different paste grids)"
            return (
                f"mask IoU {self.worst_iou:.4f}: {self.low_iou} masks below {self.iou_min}"
                f" (at most {self.worst_pixels} pixels differ){flips * bool(self.grid_flips)}"
            )
        return ""

    def extent(self) -> tuple[int, tuple[float, ...]]:
        """How large the difference is: its kind (``KINDS``: 0 none, 1 masks only, 2 a score, 3 a moved box,
        4 other detections) and the amounts of that kind, each the larger the further apart: masks below
        ``iou_min`` and 1 - the worst mask IoU; the worst score difference; the worst box difference in px; the
        number of detections that differ (the count difference, else those without a counterpart, at least 1)."""
        first = self._first()
        amounts = {
            "count": (abs(self.n_ours - self.n_ref),), "label": (1,), "far": (self.n_far,),
            "box": (self.worst_box,), "score": (self.worst_score,), "mask": (self.low_iou, 1.0 - self.worst_iou),
        }
        return KINDS[first], amounts.get(first, ())

    def no_larger_than(self, other: DetectionMatch | None) -> bool:
        """Whether this difference is no larger than ``other`` (the reference's own under a change of float
        summation order, on the same image; None: not measured): none at all, or of a lesser kind, or of the same
        kind with no amount larger. A difference where ``other`` has none is larger."""
        kind, amounts = self.extent()
        if kind == 0:
            return True
        if other is None:
            return False
        other_kind, other_amounts = other.extent()
        return kind < other_kind or (kind == other_kind and all(a <= b for a, b in zip(amounts, other_amounts)))


def paste_grid(boxes: torch.Tensor, mask_size: int = 28) -> torch.Tensor:
    """The integer box (D, 4) int64 into which torchvision pastes each ``mask_size``² mask.

    The mask gets a one-pixel border, so the box (D, 4) xyxy float is widened about its centre
    by (M + 2) / M, and the corners are truncated to integers. Two boxes a hair apart around an
    integer boundary thus paste the same mask one pixel apart.
    """
    half = (boxes[:, 2:] - boxes[:, :2]) * 0.5 * ((mask_size + 2) / mask_size)
    centre = (boxes[:, 2:] + boxes[:, :2]) * 0.5
    return torch.cat([centre - half, centre + half], dim=1).to(torch.int64)


def compare_detections(ours: dict, ref: dict, iou_min: float = IOU_MIN) -> DetectionMatch:
    """Match each reference detection to one of ours: same label, closest box, each used once.

    Both dicts hold ``boxes`` (D, 4), ``scores`` (D,), ``labels`` (D,) and optionally ``masks``
    (D, H, W) bool. Counts must agree before anything is matched.
    """
    n = len(ref["boxes"])
    m = DetectionMatch(len(ours["boxes"]), n, iou_min=iou_min)
    if m.n_ours != n:
        return m
    used: set[int] = set()
    for i in range(n):
        cand = [j for j in (ours["labels"] == ref["labels"][i]).nonzero().flatten().tolist() if j not in used]
        if not cand:
            m.unmatched_label = int(ref["labels"][i])
            return m
        d = [float((ours["boxes"][j] - ref["boxes"][i]).abs().max()) for j in cand]
        j = cand[int(np.argmin(d))]
        used.add(j)
        m.pairs.append((j, i))
        m.worst_box = max(m.worst_box, min(d))
        if min(d) > FAR_PX:
            m.n_far += 1
            if m.n_far == 1:
                box = [round(v, 1) for v in ref["boxes"][i].tolist()]
                label, score = int(ref["labels"][i]), float(ref["scores"][i])
                m.first_far = f"reference #{i} label {label} score {score:.4f} box {box}"
        m.worst_score = max(m.worst_score, float((ours["scores"][j] - ref["scores"][i]).abs()))
        if "masks" in ours and "masks" in ref:
            a, b = ours["masks"][j], ref["masks"][i]
            union, differ = int((a | b).sum()), int((a ^ b).sum())
            iou = 1.0 - differ / union if union else 1.0
            m.worst_iou, m.worst_pixels = min(m.worst_iou, iou), max(m.worst_pixels, differ)
            if iou < iou_min:
                m.low_iou += 1
                grids = paste_grid(ours["boxes"][j : j + 1]), paste_grid(ref["boxes"][i : i + 1])
                m.grid_flips += not torch.equal(*grids)
    return m


def assert_same_detections(ours: dict, ref: dict, ref_reordered: dict | None = None) -> DetectionMatch:
    """Assert that ``compare_detections(ours, ref).problem()`` is '', or, with ``ref_reordered`` (the reference
    model's detections on the same image under another float summation order, e.g. channels-last), that the
    difference is no larger than the reference's own (``DetectionMatch.no_larger_than``); the message is the
    problem."""
    m = compare_detections(ours, ref)
    problem = m.problem()
    if problem and ref_reordered is not None:
        own = compare_detections(ref_reordered, ref)
        if m.no_larger_than(own):
            return m
        problem += f"; larger than the reference's own under another float order ({own.problem() or 'none'})"
    assert not problem, problem
    return m


def assert_norm_forms_agree(make_cfg, images: list) -> None:
    """A FrozenBN checkpoint gives the same detections (some on every image) run as FrozenBN, Affine, Affine folded
    and FrozenBN folded into the convs; ``make_cfg(*opts)`` is its config with the ``KEY VALUE`` overrides."""
    from minidet.norm import Affine
    from minidet.predictor import Predictor

    ref = Predictor(make_cfg("MODEL.NORM", "FrozenBN")).predict_batch(images)
    assert all(len(r["boxes"]) > 0 for r in ref)
    for norm, fold in (("Affine", False), ("Affine", True), ("FrozenBN", True)):
        p = Predictor(make_cfg("MODEL.NORM", norm, "MODEL.FOLD_NORM", fold))
        assert fold or isinstance(p.model.backbone.res3[1].conv2.norm, Affine)
        for out, r in zip(p.predict_batch(images), ref):
            assert_same_detections(out, r)


def detection_drift(refs: list[dict], news: list[dict], iou_min: float = 0.5) -> dict:
    """How much ``news`` detections moved from ``refs`` (e.g. AMP vs fp32), image by image.

    Each reference detection, in score order, takes the unused new detection of its label with
    the highest box IoU (at least ``iou_min``). Returns counts, matches and box/score changes.
    """
    n_ref = n_new = matched = 0
    box_diffs, score_diffs = [], []
    for ref, new in zip(refs, news):
        n_ref, n_new = n_ref + len(ref["boxes"]), n_new + len(new["boxes"])
        if not len(ref["boxes"]) or not len(new["boxes"]):
            continue
        iou = box_iou(ref["boxes"].float(), new["boxes"].float())
        iou[ref["labels"][:, None] != new["labels"][None, :]] = -1
        for i in ref["scores"].argsort(descending=True).tolist():
            j = int(iou[i].argmax())
            if iou[i, j] >= iou_min:
                iou[:, j] = -1
                matched += 1
                box_diffs.append(float((new["boxes"][j].float() - ref["boxes"][i].float()).abs().max()))
                score_diffs.append(float((new["scores"][j].float() - ref["scores"][i].float()).abs()))
    return {
        "detections_fp32": n_ref,
        "detections_amp": n_new,
        "matched": matched,
        "box_diff_px_median": statistics.median(box_diffs) if box_diffs else None,
        "box_diff_px_max": max(box_diffs) if box_diffs else None,
        "score_diff_max": max(score_diffs) if score_diffs else None,
    }
