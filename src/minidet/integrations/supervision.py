"""A Predictor's output as supervision's ``sv.Detections`` (``pip install 'minidet[supervision]'``), so that minidet
drops into supervision's annotators, trackers and zone counters."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from minidet.masks import BoxMasks


def to_supervision(output: Mapping, compact: bool = True):
    """``sv.Detections`` of one image's detections (a ``Predictor``'s output): ``xyxy`` (its boxes), ``confidence``,
    ``class_id`` (the model's class index), ``data["class_name"]`` and ``data["category_id"]``, and ``mask``: with
    ``compact`` supervision's ``CompactMask`` made from minidet's box crops (memory follows the boxes, as minidet's
    does), else the dense (N, H, W) bool array."""
    try:
        import supervision as sv
    except ImportError:
        raise ImportError("to_supervision needs supervision: pip install 'minidet[supervision]'") from None
    boxes = np.asarray(output["boxes"], dtype=np.float32).reshape(-1, 4)
    labels = np.asarray(output["labels"]).astype(np.int64).reshape(-1)
    names = output.get("class_names")
    data = {"class_name": np.array([names[k] for k in labels] if names is not None else [], dtype=object),
            "category_id": np.asarray(output["category_ids"]).astype(np.int64).reshape(-1)}
    if names is None:
        data.pop("class_name")
    mask = None
    if "masks" in output:
        masks = output["masks"]
        if compact and isinstance(masks, BoxMasks) and hasattr(sv, "CompactMask") and len(masks):
            parts = []
            for crop, (x, y) in zip(masks.crops, masks.origins):
                c = crop.cpu().numpy()
                if c.size == 0:  # an empty mask: one pixel, not set
                    c, x, y = np.zeros((1, 1), bool), 0, 0
                h, w = c.shape
                one = sv.CompactMask.from_dense(c[None], np.array([[0, 0, w - 1, h - 1]], np.float32), (h, w))
                parts.append(one.with_offset(x, y, masks.size))
            mask = sv.CompactMask.merge(parts)
        else:
            mask = np.asarray(masks).astype(bool)
    return sv.Detections(xyxy=boxes, mask=mask, confidence=np.asarray(output["scores"], dtype=np.float32).reshape(-1),
                         class_id=labels, data=data)
