"""Detections in the files annotation and GIS tools import (``minidet convert``): read infer's results (a ``.jsonl``
of records, its COCO ``.json``, or one image's record), write one of ``FORMATS``.

Every writer takes the same :class:`Results` (images with their instances, the categories) and an output path, and
writes whole files only (temporary name, then rename). Masks come as infer wrote them (RLE, polygons, or none: the
box stands for the mask); outlines are ``outputs.polygons``' (on the pixels' edges, so rasterized again they give
the pixels back). What each format cannot hold is said where it is written: COCO, CVAT, Label Studio and YOLO
polygons have no holes (a hole's pixels come back as the mask's); a YOLO-seg line is one polygon, so the parts of a
mask are joined by zero-width bridges (as ultralytics joins them); GeoJSON keeps holes as interior rings.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from pycocotools import mask as mask_utils

from minidet.apps.outputs.fileio import atomic_open
from minidet.apps.outputs.polygons import polygons_with_holes
from minidet.errors import InputError
from minidet.rasters import georeference


class FormatError(InputError):
    """A results file that cannot be read, or results a format cannot hold: one line naming the file."""


@dataclass
class Results:
    """``images``: dicts of ``file``, ``height``, ``width``, ``instances`` (infer's records); ``categories``: (id,
    name) in id order."""

    images: list[dict]
    categories: list[tuple[int, str]] = field(default_factory=list)


def read_results(path: str) -> Results:
    """infer's ``--results`` file (``.jsonl`` records or the COCO ``.json``), or one image's record (``.json``)."""
    named: dict[int, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".jsonl"):
                images = [json.loads(line) for line in f if line.strip()]
            else:
                doc = json.load(f)
                coco = isinstance(doc, dict) and "annotations" in doc
                images = _from_coco(doc) if coco else [doc]
                named = {int(c["id"]): c["name"] for c in doc.get("categories", [])} if coco else {}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FormatError(f"{path}: {type(e).__name__}: {e}") from None
    if not all(isinstance(r, dict) and {"file", "height", "width", "instances"} <= set(r) for r in images):
        raise FormatError(f"{path}: not infer's results (each image a record of file, height, width, instances)")
    cats = {}
    for r in images:
        for inst in r["instances"]:
            cats.setdefault(int(inst["category_id"]), inst.get("category_name", str(inst["category_id"])))
    cats.update(named)
    return Results(images, sorted(cats.items()))


def _from_coco(doc: dict) -> list[dict]:
    names = {c["id"]: c["name"] for c in doc.get("categories", [])}
    images = {im["id"]: {"file": im["file_name"], "height": im["height"], "width": im["width"], "instances": []}
              for im in doc["images"]}
    for a in doc["annotations"]:
        images[a["image_id"]]["instances"].append({**a, "category_name": names.get(a["category_id"],
                                                                                  str(a["category_id"]))})
    return list(images.values())


def outline(inst: dict, height: int, width: int) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """One instance's parts as (outer ring, hole rings), (K, 2) x, y pixel-edge coordinates: from its RLE, its
    polygons (no holes), or its box where it has no mask."""
    seg = inst.get("segmentation")
    if isinstance(seg, dict):
        rle = {"size": seg["size"], "counts": seg["counts"].encode() if isinstance(seg["counts"], str)
               else seg["counts"]}
        if isinstance(seg["counts"], list):
            rle = mask_utils.frPyObjects(seg, height, width)
        mask = mask_utils.decode(rle).astype(bool)
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        if not len(rows):
            return []
        y0, x0 = int(rows[0]), int(cols[0])
        return polygons_with_holes(mask[y0 : rows[-1] + 1, x0 : cols[-1] + 1], x0, y0)
    if isinstance(seg, list):
        return [(np.asarray(p, np.float64).reshape(-1, 2), []) for p in seg if len(p) >= 6]
    x, y, w, h = inst["bbox"]
    return [(np.array([[x, y], [x, y + h], [x + w, y + h], [x + w, y]], np.float64), [])]


def _kept(results: Results, score_thresh: float):
    for r in results.images:
        yield r, [i for i in r["instances"] if i["score"] >= score_thresh]


def _flat(ring: np.ndarray) -> list[float]:
    return [round(float(v), 2) for v in ring.ravel()]


def write_coco_dataset(results: Results, out: str, score_thresh: float = 0.0) -> None:
    """A COCO dataset (``images``, ``annotations`` with polygon ``segmentation``, ``area`` and ``iscrowd`` 0, the
    detection's ``score`` kept, ``categories``) for importing the detections as annotations."""
    images, anns = [], []
    for k, (r, insts) in enumerate(_kept(results, score_thresh), 1):
        images.append({"id": k, "file_name": r["file"], "height": r["height"], "width": r["width"]})
        for inst in insts:
            polys = [_flat(outer) for outer, _ in outline(inst, r["height"], r["width"])]
            area = float(mask_utils.area(mask_utils.merge(mask_utils.frPyObjects(polys, r["height"], r["width"]))))\
                if polys else 0.0
            anns.append({"id": len(anns) + 1, "image_id": k, "category_id": int(inst["category_id"]),
                         "bbox": inst["bbox"], "area": area, "iscrowd": 0, "segmentation": polys,
                         "score": inst["score"]})
    cats = [{"id": i, "name": n, "supercategory": ""} for i, n in results.categories]
    with atomic_open(out) as f:
        json.dump({"images": images, "annotations": anns, "categories": cats}, f)


def write_cvat(results: Results, out: str, score_thresh: float = 0.0) -> None:
    """CVAT for images 1.1 XML: per image its polygons (``points`` "x,y;x,y;..."), the label, ``source`` auto and
    a ``score`` attribute (declared on every label)."""
    root = ET.Element("annotations")
    ET.SubElement(root, "version").text = "1.1"
    labels = ET.SubElement(ET.SubElement(ET.SubElement(root, "meta"), "task"), "labels")
    for _, name in results.categories:
        label = ET.SubElement(labels, "label")
        ET.SubElement(label, "name").text = name
        ET.SubElement(label, "type").text = "polygon"
        attr = ET.SubElement(ET.SubElement(label, "attributes"), "attribute")
        for key, value in (("name", "score"), ("mutable", "False"), ("input_type", "text"), ("default_value", ""),
                           ("values", "")):
            ET.SubElement(attr, key).text = value
    for k, (r, insts) in enumerate(_kept(results, score_thresh)):
        image = ET.SubElement(root, "image", id=str(k), name=r["file"], width=str(r["width"]),
                              height=str(r["height"]))
        for inst in insts:
            for outer, _ in outline(inst, r["height"], r["width"]):
                points = ";".join(f"{x:.2f},{y:.2f}" for x, y in outer)
                poly = ET.SubElement(image, "polygon", label=inst["category_name"], source="auto", occluded="0",
                                     points=points, z_order="0")
                ET.SubElement(poly, "attribute", name="score").text = f"{inst['score']:.4f}"
    ET.indent(root)
    with atomic_open(out, "wb") as f:
        f.write(b'<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="utf-8") + b"\n")


def write_labelstudio(results: Results, out: str, score_thresh: float = 0.0, image_prefix: str = "") -> None:
    """Label Studio tasks with predictions: per image ``data.image`` (``image_prefix`` + its file) and one
    prediction (``model_version`` minidet, its mean score) whose results are ``polygonlabels`` in percent of the
    image (``from_name`` label, ``to_name`` image: a labeling config with <PolygonLabels name="label"
    toName="image"> and <Image name="image" value="$image">)."""
    tasks = []
    for r, insts in _kept(results, score_thresh):
        h, w = r["height"], r["width"]
        found = []
        for inst in insts:
            for outer, _ in outline(inst, h, w):
                points = [[round(100.0 * x / w, 4), round(100.0 * y / h, 4)] for x, y in outer]
                found.append({"id": f"r{len(found)}", "type": "polygonlabels", "from_name": "label",
                              "to_name": "image", "original_width": w, "original_height": h, "image_rotation": 0,
                              "score": inst["score"], "value": {"points": points, "closed": True,
                                                                "polygonlabels": [inst["category_name"]]}})
        score = float(np.mean([i["score"] for i in insts])) if insts else 0.0
        tasks.append({"data": {"image": image_prefix + r["file"]},
                      "predictions": [{"model_version": "minidet", "score": score, "result": found}]})
    with atomic_open(out) as f:
        json.dump(tasks, f)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """Rings joined into one by zero-width bridges: from the first point of each ring to the next ring's first point
    and back at the end, so that a fill (even-odd or nonzero) covers each ring as alone."""
    if len(parts) == 1:
        return parts[0]
    seq = []
    for ring in parts:
        seq += [*ring, ring[0]]
    for ring in reversed(parts[1:]):
        seq.append(ring[0])
    return np.asarray(seq)


def write_yolo_seg(results: Results, out: str, score_thresh: float = 0.0) -> None:
    """A folder: ``labels/<image stem>.txt`` (a line per instance: class index, then its polygon's x, y normalized to
    0..1) and ``data.yaml`` with the class ``names`` (indices 0.. in category id order)."""
    index = {cid: k for k, (cid, _) in enumerate(results.categories)}
    os.makedirs(os.path.join(out, "labels"), exist_ok=True)
    stems: set[str] = set()
    for r, insts in _kept(results, score_thresh):
        stem = os.path.splitext(os.path.basename(r["file"]))[0]
        if stem in stems:
            raise FormatError(f"yolo-seg: two images named {stem}: one labels folder cannot hold both")
        stems.add(stem)
        h, w = r["height"], r["width"]
        lines = []
        for inst in insts:
            parts = [outer for outer, _ in outline(inst, h, w)]
            if parts:
                ring = _joined(parts) / (w, h)
                lines.append(f"{index[int(inst['category_id'])]} " + " ".join(f"{v:.6f}" for v in ring.ravel()))
        with atomic_open(os.path.join(out, "labels", stem + ".txt")) as f:
            f.write("".join(line + "\n" for line in lines))
    with atomic_open(os.path.join(out, "data.yaml")) as f:
        f.write("names:\n" + "".join(f"  {k}: {json.dumps(n)}\n" for k, (_, n) in enumerate(results.categories)))


def _oriented(ring: np.ndarray, ccw: bool) -> list[list[float]]:
    """A closed GeoJSON ring, counter-clockwise (``ccw``) or clockwise."""
    x, y = ring[:, 0], ring[:, 1]
    area = 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))
    if (area > 0) != ccw:
        ring = ring[::-1]
    return [[float(a), float(b)] for a, b in [*ring, ring[0]]]


def write_geojson(results: Results, out: str, score_thresh: float = 0.0) -> None:
    """A FeatureCollection: a MultiPolygon Feature per instance (holes as interior rings; exterior rings
    counter-clockwise as RFC 7946 asks), properties ``file``, ``score``, ``category_id``, ``category_name``. In
    pixel coordinates (x right, y down), or in the raster's CRS where the image is a georeferenced raster (a GeoTIFF;
    the geo extra's rasterio reads it), named in a ``crs`` member."""
    features, crss = [], set()
    for r, insts in _kept(results, score_thresh):
        geo = georeference(r["file"]) if os.path.exists(r["file"]) else None
        to_crs = geo[0] if geo else (lambda xy: xy)
        crss.add(geo[1] if geo else None)
        for inst in insts:
            polygons = [[_oriented(to_crs(outer), True), *(_oriented(to_crs(h), False) for h in holes)]
                        for outer, holes in outline(inst, r["height"], r["width"])]
            features.append({"type": "Feature", "geometry": {"type": "MultiPolygon", "coordinates": polygons},
                             "properties": {"file": r["file"], "score": inst["score"],
                                            "category_id": int(inst["category_id"]),
                                            "category_name": inst["category_name"]}})
    if len(crss) > 1:
        raise FormatError(f"geojson: the images are in {len(crss)} coordinate systems ({', '.join(map(str, crss))}); "
                          "convert them one system at a time")
    doc = {"type": "FeatureCollection", "features": features}
    if (crs := next(iter(crss), None)) is not None:
        doc["crs"] = {"type": "name", "properties": {"name": crs}}
    with atomic_open(out) as f:
        json.dump(doc, f)


FORMATS: dict[str, Callable] = {"coco-dataset": write_coco_dataset, "cvat": write_cvat,
                                "labelstudio": write_labelstudio, "yolo-seg": write_yolo_seg, "geojson": write_geojson}
