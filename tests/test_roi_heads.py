"""The RoI heads as one module (``heads.roi``): chosen by ``MODEL.ROI_HEADS.NAME``, their parts the detector's own
children by the checkpoints' names; ``Detections`` built from its field table (``heads.detections.FIELDS``)."""

from __future__ import annotations

import torch

import minidet
from minidet.heads.detections import FIELD_NAMES, FIELDS, Detections
from minidet.heads.roi import CascadeROIHeads, StandardROIHeads


def test_detections_have_every_field_of_the_table_and_select_each_row():
    assert Detections._fields == ("boxes", "scores", "labels", "frame", *FIELD_NAMES)
    assert len({f.name for f in FIELDS}) == len(FIELDS) and all(f.doc for f in FIELDS)
    det = Detections(torch.arange(12.0).view(3, 4), torch.tensor([0.9, 0.5, 0.2]), torch.tensor([1, 2, 3]), "resized",
                     box_scores=torch.tensor([0.95, 0.6, 0.3]))
    assert det.masks is None and list(det.fields()) == ["box_scores"]
    kept = det.select(torch.tensor([True, False, True]))
    assert torch.equal(kept.boxes, det.boxes[[0, 2]]) and torch.equal(kept.labels, torch.tensor([1, 3]))
    assert torch.equal(kept.box_scores, torch.tensor([0.95, 0.3])) and kept.frame == "resized" and kept.masks is None


def test_the_config_string_picks_the_heads_whose_parts_are_the_detectors():
    cfg = minidet.get_cfg("mmdetection/cascade-mask-rcnn_r50_fpn_1x_coco")
    cfg.merge_from_list(["MODEL.WEIGHTS", "none", "MODEL.MASKIOU_ON", True])
    model = minidet.build_model(cfg)
    heads = model.roi_heads
    assert type(heads) is CascadeROIHeads and cfg.MODEL.ROI_HEADS.NAME == "CascadeROIHeads"
    assert heads.final_predictor is model.final_predictor is model.cascade.predictors[-1]
    assert len(heads.mask_stages) == 3 and heads.outputs == ("masks", "box_scores")  # mmdetection: a head per stage
    children = dict(model.named_children())
    assert all(children[name] is getattr(heads, name) for name in StandardROIHeads.PARTS if name in children)
    assert not any(k.startswith("roi_heads.") for k in model.state_dict())  # the checkpoints' names
    model.mask_iou_head = None  # one module, held by both
    assert heads.mask_iou_head is None and heads.outputs == ("masks",)
    plain = minidet.build_model(minidet.get_cfg())
    assert type(plain.roi_heads) is StandardROIHeads and plain.roi_heads.mask_stages == [plain.mask_head]
