"""Mask Scoring R-CNN (``MODEL.MASKIOU_ON``): a detection's score is its box score times its mask's predicted IoU,
and the box score stays beside it, named, through every output: the Python API (``box_scores``), infer's records
(``box_score``) and sliced inference. Its equality with mmdetection's own code: tests/test_regnet_gc_ms_reference.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import minidet
from helpers import ROOT, config
from minidet.apps.outputs.instances import record_instances
from minidet.apps.synthetic import random_minidet_weights, structured_image
from minidet.errors import CheckpointError
from minidet.slicing import SlicedPredictor, Slicing

SMALL = ["INPUT.MIN_SIZE_TEST", 256, "INPUT.MAX_SIZE_TEST", 384, "MODEL.ROI_ALIGN_IMPL", "torchvision"]
MS = ["MODEL.MASKIOU_ON", True, "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", 30]

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """A predictor of mmdetection's Mask R-CNN with a mask IoU head, realistic random weights, and an image."""
    image = structured_image(240, 320, seed=3)
    path = tmp_path_factory.mktemp("ms") / "ms.pth"
    base = ROOT / "configs" / "mmdetection" / "mask-rcnn_r50_fpn_1x_coco.yaml"
    random_minidet_weights(config(base, *SMALL, *MS), image, str(path))
    predictor = minidet.Predictor(config(base, *SMALL, *MS, weights=path))
    return predictor, image, predictor(image), path


def test_scores_are_box_scores_times_the_predicted_iou(scored):
    predictor, image, out, _ = scored
    assert len(out["scores"]) > 5 and "box_scores" in out
    model = predictor.model
    with torch.inference_mode():
        batch = model.preprocess([image])
        (dets,) = model.detect(batch)
        head, model.mask_iou_head = model.mask_iou_head, None
        try:
            (plain,) = model.detect(batch)  # the same network without the mask IoU head: the box scores
        finally:
            model.mask_iou_head = head
    assert torch.equal(dets.box_scores, plain.scores) and torch.equal(dets.boxes, plain.boxes)
    assert torch.equal(dets.labels, plain.labels) and torch.equal(dets.masks, plain.masks)
    iou = dets.scores / dets.box_scores
    assert not torch.allclose(iou, torch.ones_like(iou), atol=0.05)  # the rescoring changed the scores
    # the scores the API gives are the rescored ones, the box scores beside them
    np.testing.assert_array_equal(out["box_scores"].numpy(), plain.scores.numpy()[: len(out["box_scores"])])


def test_records_carry_the_box_score_named(scored):
    _, _, out, _ = scored
    found = record_instances(out)
    assert [i["score"] for i in found] == [float(s) for s in out["scores"]]
    assert [i["box_score"] for i in found] == [float(s) for s in out["box_scores"]]
    plain = dict(out)
    del plain["box_scores"]
    assert all("box_score" not in i for i in record_instances(plain))  # other models: no such key


def test_sliced_inference_keeps_the_box_scores(scored):
    predictor, image, _, _ = scored
    sliced = SlicedPredictor(predictor, Slicing(240, 0.25))  # two tiles
    out = sliced(image)
    assert len(out["box_scores"]) == len(out["scores"]) > 0


def test_without_masks_a_mask_scoring_file_gives_its_box_scores(scored):
    """MODEL.MASK_ON False: no mask to score, so the mask and mask IoU heads are set aside (named in the load report)
    and the scores are the box head's: the mask-scored run's ``box_scores``."""
    _, image, out, path = scored
    base = ROOT / "configs" / "mmdetection" / "mask-rcnn_r50_fpn_1x_coco.yaml"
    boxes = minidet.Predictor(config(base, *SMALL, *MS, "MODEL.MASK_ON", False, weights=path))
    assert boxes.model.mask_iou_head is None
    assert any("mask IoU head (MODEL.MASK_ON False)" in why for why in boxes.load_report.why.values())
    got = boxes(image)
    assert "masks" not in got and "box_scores" not in got
    assert torch.equal(got["scores"], out["box_scores"]) and torch.equal(got["boxes"], out["boxes"])


def test_a_plain_file_under_a_mask_scoring_config_says_which_switch(scored, tmp_path):
    predictor, *_ = scored
    plain = {k: v for k, v in predictor.model.state_dict().items() if not k.startswith("mask_iou_head.")}
    path = tmp_path / "plain.pth"
    torch.save(plain, path)
    base = ROOT / "configs" / "mmdetection" / "mask-rcnn_r50_fpn_1x_coco.yaml"
    with pytest.raises(CheckpointError, match="has no mask IoU head .*: MODEL.MASKIOU_ON False runs it"):
        minidet.Predictor(config(base, *SMALL, *MS, weights=path))
