"""``minidet.integrations.to_supervision``: a Predictor's output as supervision's ``sv.Detections``, masks as its
``CompactMask`` made from minidet's crops (or dense), usable by its annotators."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import minidet
from helpers import ROOT, needs_extra
from minidet.apps.synthetic import structured_image
from minidet.integrations import to_supervision
from minidet.masks import BoxMasks

pytestmark = [needs_extra("supervision", "supervision"),
              pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")]


def test_a_predictors_output_in_supervision(tv_file):
    import supervision as sv

    cfg = minidet.get_cfg()
    cfg.merge_from_file(str(ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"))
    cfg.merge_from_list(["MODEL.WEIGHTS", str(tv_file), "INPUT.MIN_SIZE_TEST", "320", "INPUT.MAX_SIZE_TEST", "512"])
    predictor = minidet.Predictor(cfg)
    image = structured_image(240, 320, seed=9)
    out = predictor(image)
    dets = to_supervision(out)
    assert isinstance(dets, sv.Detections) and len(dets) == len(out["scores"]) > 10
    assert np.array_equal(dets.xyxy, out["boxes"].numpy()) and np.array_equal(dets.confidence, out["scores"].numpy())
    assert list(dets.data["class_name"]) == [out["class_names"][k] for k in out["labels"].tolist()]
    assert np.array_equal(dets.data["category_id"], out["category_ids"].numpy())
    assert isinstance(dets.mask, sv.CompactMask) and dets.mask.shape == (len(dets), 240, 320)
    assert np.array_equal(np.asarray(dets.mask), out["masks"].numpy())
    dense = to_supervision(out, compact=False)
    assert isinstance(dense.mask, np.ndarray) and np.array_equal(dense.mask, out["masks"].numpy())
    top = dets[dets.confidence >= 0.5]  # supervision's own filtering keeps masks with their detections
    assert np.array_equal(np.asarray(top.mask), out["masks"].numpy()[out["scores"].numpy() >= 0.5])
    drawn = sv.MaskAnnotator().annotate(image.copy(), dets)
    assert drawn.shape == image.shape and not np.array_equal(drawn, image)


def test_empty_masks_and_no_detections():
    out = {"boxes": torch.zeros((1, 4)), "scores": torch.tensor([0.5]), "labels": torch.tensor([1]),
           "category_ids": torch.tensor([1]), "class_names": ["bg", "a"],
           "masks": BoxMasks([torch.zeros((0, 0), dtype=torch.bool)], [(0, 0)], (20, 30))}
    dets = to_supervision(out)
    assert len(dets) == 1 and not np.asarray(dets.mask).any() and dets.mask.shape == (1, 20, 30)
    none = {k: v[:0] for k, v in out.items() if k != "class_names"}
    assert len(to_supervision({**none, "class_names": ["bg", "a"]})) == 0
