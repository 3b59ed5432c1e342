"""One image's detections as ``minidet infer`` hands them on: its JSON record (``to_record``, ``dumps_record``), its
drawing (``draw``, ``render``), the ``--classes`` filter (``parse_classes``, ``keep_classes``), a score threshold
(``keep_scores``). The one serializer of infer's files, its Ray actors' rows, its results file and the server's
answers."""

from __future__ import annotations

import argparse
import json

import cv2
import numpy as np
import torch

from minidet.apps.outputs.instances import record_instances
from minidet.apps.outputs.vis import draw_instances
from minidet.categories import BACKGROUND, UNUSED
from minidet.errors import ConfigError
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


def mask_options(args: argparse.Namespace) -> tuple[str, float]:
    """The mask format and polygon tolerance ``args`` ask for (``--mask-format``, ``--polygon-tolerance``)."""
    return args.mask_format, args.polygon_tolerance


def keep_classes(out: dict, keep: set[int] | None) -> dict:
    """``out`` with only the detections whose class index is in ``keep`` (None: all)."""
    return out if keep is None else _select(out, np.isin(out["labels"].numpy(), sorted(keep)))


def keep_scores(out: dict, thresh: float) -> dict:
    """``out`` with only the detections scoring at least ``thresh`` (0: all)."""
    return out if thresh <= 0 else _select(out, out["scores"].numpy() >= thresh)


def _select(out: dict, sel: np.ndarray) -> dict:
    """``out`` with its per-detection tensors cut to the detections ``sel`` (a bool array) keeps."""
    return {k: (v[sel] if isinstance(v, (torch.Tensor, BoxMasks)) else v) for k, v in out.items()}


def draw(image: np.ndarray, out: dict, args: argparse.Namespace) -> np.ndarray:
    """The drawing of one image's detections as ``args`` asks (``no_labels``, ``vis_thresh``, ``mask_alpha``,
    ``no_boxes``)."""
    labels = None if args.no_labels else [out["class_names"][int(k)] for k in out["labels"]]
    masks = out.get("masks")
    return draw_instances(image, out["boxes"].numpy(), out["scores"].numpy(), labels, masks, args.vis_thresh,
                          args.mask_alpha, draw_boxes=not args.no_boxes)


def render(path: str, image: np.ndarray, out: dict, args: argparse.Namespace) -> tuple[dict, bytes | None]:
    """One image's record (:func:`to_record`, masks as ``args.mask_format``) and, unless ``args.no_vis``, its
    drawing as JPEG bytes."""
    record = to_record(path, image, out, *mask_options(args))
    if args.no_vis:
        return record, None
    ok, jpg = cv2.imencode(".jpg", draw(image, out, args), [cv2.IMWRITE_JPEG_QUALITY, 90])
    if not ok:
        raise RuntimeError("cannot encode the visualization as JPEG")
    return record, jpg.tobytes()


def parse_classes(text: str | None, names: list[str]) -> set[int] | None:
    """The class indices ``--classes`` names (any case), None for all; ConfigError for a name the model lacks."""
    if text is None:
        return None
    real = [(k, n) for k, n in enumerate(names) if n not in (BACKGROUND, UNUSED)]
    lower = {n.lower(): k for k, n in real}
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in wanted if w.lower() not in lower]
    if unknown or not wanted:
        listed = ", ".join(n for _, n in real)
        raise ConfigError(f"--classes: {'no class given' if not wanted else 'unknown class ' + repr(unknown[0])} "
                          f"(the model's classes: {listed})")
    return {lower[w.lower()] for w in wanted}


