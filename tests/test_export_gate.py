"""The parity gate's judgement (``minidet.apps.export.gate``) on hand-made outputs, and the float-order variants it
measures eager's own noise with. No runtime is needed: the graph's side is given as its outputs.

The cases are the two that an AMD EPYC (Zen 4) showed under OpenVINO, where eager's folded variant happened not to
part: a proposal whose IoU with a higher-scored one sat 5e-6 under the RPN's NMS threshold, and two detections 1.4e-7
apart in score for the last place under the cap. Such an image is unstable (any float order decides it), named with
its decision; a difference that is not at such a decision still fails.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import minidet
from helpers import config
from minidet.apps.export.gate import (
    Outputs,
    Tolerances,
    difference,
    float_order_variants,
    judge,
    near_tie,
)
from minidet.boxes import PLAIN_BOX_RULE
from minidet.heads.detections import Detections

IMAGE = torch.zeros(64, 64, 3, dtype=torch.uint8).numpy()


def _model(cap: int = 100) -> SimpleNamespace:
    """The thresholds the judgement reads, as torchvision's model has them."""
    rpn = SimpleNamespace(nms_thresh=0.7, box_rule=PLAIN_BOX_RULE, post_nms_topk=1000)
    head = SimpleNamespace(nms_thresh=0.5, score_thresh=0.05, detections_per_image=cap, box_rule=PLAIN_BOX_RULE)
    return SimpleNamespace(rpn=rpn, final_predictor=head)  # the predictor whose rules give the detections


def _outputs(proposals, boxes, scores, labels) -> Outputs:
    boxes, scores, labels = torch.tensor(boxes), torch.tensor(scores), torch.tensor(labels)
    head = Detections(boxes, scores, labels, "resized", None)
    return Outputs(torch.tensor(proposals), head, {"boxes": boxes, "scores": scores, "labels": labels})


def _verdict(ours: Outputs, ref: Outputs, model: SimpleNamespace, variant: Outputs | None = None) -> str:
    tol = Tolerances()
    noise = {"folded": difference(variant or ref, ref, tol)}
    check = judge("x", IMAGE, difference(ours, ref, tol), noise, tol,
                  lambda stage: near_tie(stage, ours, ref, model, tol))
    return check.verdict if check.verdict == "same" or check.verdict.startswith("unstable") else \
        f"{check.verdict} at {check.first}"


B = [10.0, 10.0, 110.0, 110.0]  # 100 x 100
D = [300.0, 300.0, 340.0, 360.0]  # far from both
DETS = ([[10.0, 10.0, 110.0, 110.0], [300.0, 300.0, 340.0, 360.0]], [0.9, 0.6], [1, 2])


def _beside_b(iou: float) -> list[float]:
    """A box of B's width whose IoU with B is ``iou`` (B's top part)."""
    return [10.0, 10.0, 110.0, 10.0 + 100.0 * iou]


def test_a_proposal_on_the_nms_threshold_is_a_near_tie_not_a_difference():
    """Eager kept a proposal whose IoU with a higher-scored one is 5e-6 under the RPN's NMS threshold (0.7); the
    graph suppressed it and the detections that follow differ: unstable, the decision named."""
    model = _model()
    ref = _outputs([B, _beside_b(0.699995), D], *DETS)
    ours = _outputs([B, D], [DETS[0][0], [200.0, 20.0, 260.0, 80.0]], [0.9, 0.6], [1, 3])
    verdict = _verdict(ours, ref, model)
    assert verdict.startswith("unstable: eager's rpn decision is a near-tie (eager's proposal #1, which the graph "
                              "lacks: IoU 0.69999"), verdict
    assert "NMS threshold 0.7" in verdict


def test_a_proposal_far_from_the_nms_threshold_still_differs():
    """The same difference where the proposal the graph lacks has IoU 0.6 with the one above it: no float order
    decides that, so the graph computes something else: DIFFERS, at the RPN."""
    ref = _outputs([B, _beside_b(0.6), D], *DETS)
    ours = _outputs([B, D], [DETS[0][0], [200.0, 20.0, 260.0, 80.0]], [0.9, 0.6], [1, 3])
    assert _verdict(ours, ref, _model()) == "DIFFERS at rpn"


def test_a_moved_proposal_is_not_a_tie():
    """A proposal moved by 0.05 px (5 times the box tolerance), nothing else: DIFFERS at the RPN."""
    moved = [300.05, 300.0, 340.0, 360.0]
    ref = _outputs([B, D], *DETS)
    ours = _outputs([B, moved], [DETS[0][0], [300.05, 300.0, 340.0, 360.0]], [0.9, 0.6], [1, 2])
    assert _verdict(ours, ref, _model()) == "DIFFERS at rpn"


def test_two_overlapping_proposals_swapped_at_one_rank_are_a_score_tie():
    """Eager's proposal #1 and the graph's #1 overlap above the NMS threshold, everything above is the same: NMS
    kept whichever scored higher, and the two runs ranked them apart by float noise."""
    a, c = [200.0, 20.0, 260.0, 80.0], [204.0, 20.0, 264.0, 80.0]  # IoU 0.875
    ref = _outputs([B, a, D], *DETS)
    ours = _outputs([B, c, D], [DETS[0][0], [200.0, 20.0, 260.0, 80.0]], [0.9, 0.6], [1, 3])
    verdict = _verdict(ours, ref, _model())
    assert verdict.startswith("unstable: eager's rpn decision is a near-tie (eager's proposal #1 and the graph's #1 "
                              "overlap (IoU 0.875 > NMS threshold 0.7)"), verdict


def test_every_box_moved_by_pixels_is_no_swap():
    """A graph run in bf16 (OpenVINO on an Intel Xeon with AMX): every proposal and detection moved by 3 px. The
    first pair overlaps above the NMS threshold with nothing above it, the shape of a swap, but no near-tie moves
    every box: DIFFERS, at the RPN (the swap rule alone called it unstable, and the bf16 gate test failed there)."""
    e = [150.0, 150.0, 190.0, 210.0]
    ref = _outputs([B, D, e], *DETS)
    ours = _outputs([[x + 3.0 for x in box] for box in (B, D, e)], [[x + 3.0 for x in box] for box in DETS[0]],
                    DETS[1], DETS[2])
    assert _verdict(ours, ref, _model()) == "DIFFERS at rpn"


def test_the_last_place_under_the_cap_between_near_equal_scores_is_a_near_tie():
    """Two detections 1.4e-7 apart in score for the last of 2 places (the cap): whichever a float order ranks
    first is kept; another label at a score 0.01 lower is a difference."""
    model, proposals = _model(cap=2), [B, D]
    ref = _outputs(proposals, [B, [50.0, 50.0, 90.0, 90.0]], [0.9, 0.1007259], [1, 23])
    tied = _outputs(proposals, [B, [300.0, 300.0, 340.0, 360.0]], [0.9, 0.10072576], [1, 49])
    verdict = _verdict(tied, ref, model)
    assert verdict.startswith("unstable: eager's box_head decision is a near-tie (eager's detection #1 (label 23, "
                              "score 0.1007259), which the other lacks: the last place under the cap of 2"), verdict
    apart = _outputs(proposals, [B, [300.0, 300.0, 340.0, 360.0]], [0.9, 0.0907], [1, 49])
    assert _verdict(apart, ref, model) == "DIFFERS at box_head"


def test_a_variant_that_parts_makes_the_image_unstable_before_any_tie_is_looked_for():
    ref = _outputs([B, D], *DETS)
    ours = _outputs([B, D], [DETS[0][0], [200.0, 20.0, 260.0, 80.0]], [0.9, 0.6], [1, 3])
    verdict = _verdict(ours, ref, _model(), variant=ours)
    assert verdict.startswith("unstable: eager folded differs too"), verdict


@pytest.mark.parametrize(("cfg", "opts", "names"), [
    ("configs/torchvision/maskrcnn_resnet50_fpn.yaml", [], ["folded", "channels-last"]),
    ("configs/torchvision/maskrcnn_resnet50_fpn.yaml", ["MODEL.FOLD_NORM", True], ["channels-last"]),
    ("configs/torchvision/maskrcnn_resnet50_fpn.yaml", ["MODEL.CHANNELS_LAST", True], ["folded", "contiguous"]),
    ("configs/detectron/e2e_mask_rcnn_R-50-FPN_2x_gn.yaml", [], ["channels-last"]),
])
def test_eager_noise_comes_from_every_float_order_change(cfg, opts, names):
    """Folding keeps eager's convolution kernels, so its differences from eager are the smallest; the gate measures
    eager's noise under every change it has (the folded norms where there are any, and the other layout with the
    other RoIAlign path), each a copy: the model itself is left as it is."""
    model = minidet.prepare_model(config(cfg, "MODEL.WEIGHTS", "none", *opts))[0]
    variants = float_order_variants(model)
    assert list(variants) == names
    if "channels-last" in variants:
        assert variants["channels-last"].channels_last and not model.channels_last
    assert all(v is not model for v in variants.values())


def _scored(box_scores: list[float], ious: list[float]) -> Outputs:
    """``DETS`` as a Mask Scoring R-CNN gives them: the box scores kept, ``scores`` times the predicted mask IoUs."""
    boxes, labels = torch.tensor(DETS[0]), torch.tensor(DETS[2])
    box_scores = torch.tensor(box_scores)
    scores = box_scores * torch.tensor(ious)
    head = Detections(boxes, scores, labels, "resized", torch.full((2, 4, 4), 0.5), box_scores)
    return Outputs(torch.tensor([B, D]), head, {"boxes": boxes, "scores": scores, "labels": labels,
                                                "box_scores": box_scores})


def test_mask_scoring_rcnns_box_and_mask_stages_are_judged_apart():
    """Issue 45: a Mask Scoring R-CNN's box head is held to its box scores, its rescored scores (box score x mask IoU)
    to the mask stage: the same box scores with other predicted IoUs differ at ``mask_head``, other box scores at
    ``box_head``; the same outputs are the same."""
    model, ref = _model(), _scored([0.9, 0.6], [0.8, 0.7])
    assert _verdict(_scored([0.9, 0.6], [0.8, 0.7]), ref, model) == "same"
    assert _verdict(_scored([0.9, 0.6], [0.8, 0.5]), ref, model) == "DIFFERS at mask_head"
    assert _verdict(_scored([0.9, 0.5], [0.8, 0.84]), ref, model) == "DIFFERS at box_head"
    tol = Tolerances()
    d = difference(_scored([0.9, 0.6], [0.8, 0.5]), ref, tol)
    assert d.mask_scores == pytest.approx(0.12) and not d.head.problem(tol.box, tol.score)
