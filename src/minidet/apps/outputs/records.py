"""One image's detections as ``minidet infer`` hands them on: its JSON record (``to_record``, ``dumps_record``), its
drawing (``draw``, ``render``), the ``--classes`` filter (``keep_classes``), a score threshold (``keep_scores``),
as the run's :class:`~minidet.apps.outputs.options.OutputOptions` ask. The one serializer of infer's files, its Ray
actors' rows, its results file and the server's answers."""

from __future__ import annotations

import json

import cv2
import numpy as np
import torch

from minidet.apps.outputs.instances import record_instances
from minidet.apps.outputs.options import OutputOptions
from minidet.apps.outputs.vis import draw_instances
from minidet.masks import BoxMasks


def dumps_record(doc: dict) -> str:
    """JSON text of a record with one instance per line (compact but still diff-friendly)."""
    head = json.dumps({k: v for k, v in doc.items() if k != "instances"})[:-1]
    items = ",\n  ".join(json.dumps(inst) for inst in doc["instances"])
    body = f"[\n  {items}\n]" if items else "[]"
    return f'{head}, "instances": {body}}}\n'


def to_record(path: str, image: np.ndarray, out: dict, mask_format: str = "rle", tolerance: float = 0.0) -> dict:
    """The JSON document for one image's detections, masks in ``mask_format`` (``instances.MASK_FORMATS``)."""
    return {"file": path, "height": int(image.shape[0]), "width": int(image.shape[1]),
            "instances": record_instances(out, mask_format, tolerance)}


def keep_classes(out: dict, keep: set[int] | None) -> dict:
    """``out`` with only the detections whose class index is in ``keep`` (None: all)."""
    return out if keep is None else _select(out, np.isin(out["labels"].numpy(), sorted(keep)))


def keep_scores(out: dict, thresh: float) -> dict:
    """``out`` with only the detections scoring at least ``thresh`` (0: all)."""
    return out if thresh <= 0 else _select(out, out["scores"].numpy() >= thresh)


def _select(out: dict, sel: np.ndarray) -> dict:
    """``out`` with its per-detection tensors cut to the detections ``sel`` (a bool array) keeps."""
    return {k: (v[sel] if isinstance(v, (torch.Tensor, BoxMasks)) else v) for k, v in out.items()}


def draw(image: np.ndarray, out: dict, options: OutputOptions) -> np.ndarray:
    """The drawing of one image's detections as ``options`` asks (``no_labels``, ``vis_thresh``, ``mask_alpha``,
    ``no_boxes``)."""
    labels = None if options.no_labels else [out["class_names"][int(k)] for k in out["labels"]]
    masks = out.get("masks")
    return draw_instances(image, out["boxes"].numpy(), out["scores"].numpy(), labels, masks, options.vis_thresh,
                          options.mask_alpha, draw_boxes=not options.no_boxes)


def render(path: str, image: np.ndarray, out: dict, options: OutputOptions) -> tuple[dict, bytes | None]:
    """One image's record (:func:`to_record`, masks as ``options.mask_format``) and, unless ``options.no_vis``, its
    drawing as JPEG bytes."""
    record = to_record(path, image, out, options.mask_format, options.tolerance)
    if options.no_vis:
        return record, None
    ok, jpg = cv2.imencode(".jpg", draw(image, out, options), [cv2.IMWRITE_JPEG_QUALITY, 90])
    if not ok:
        raise RuntimeError("cannot encode the visualization as JPEG")
    return record, jpg.tobytes()
