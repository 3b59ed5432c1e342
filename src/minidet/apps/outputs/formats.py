"""Detections in the files annotation and GIS tools import (``minidet convert``): infer's results, read and checked
by ``outputs.results``, written as one of ``FORMATS``.

Every writer takes the same checked :class:`Results` (images with their instances, the categories) and an output
path, writes whole files only (temporary name, then rename), and returns the instances it left out for an empty
mask (a format without empty shapes). Masks come as infer wrote them (RLE, polygons, or none: the box stands for
the mask); outlines are ``outputs.polygons``' (on the pixels' edges, so rasterized again they give the pixels back).
What each format cannot hold is said where it is written: COCO, CVAT, Label Studio and YOLO polygons have no holes
(a hole's pixels come back as the mask's); a YOLO-seg line is one polygon, so the parts of a mask are joined by
zero-width bridges (as ultralytics joins them); CVAT groups an instance's parts, Label Studio relates them; GeoJSON
keeps holes as interior rings.

A Mask Scoring R-CNN's records carry ``box_score`` (the box head's score) beside ``score`` (its product with the
predicted mask IoU): kept as an attribute where the format has them (:data:`BOX_SCORE_IN`); YOLO-seg labels have
none (:data:`NO_ATTRIBUTES`: ``minidet convert`` says so in a note).
"""

from __future__ import annotations

import importlib.util
import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable

import numpy as np
from pycocotools import mask as mask_utils

from minidet.apps.outputs.fileio import atomic_open
from minidet.apps.outputs.polygons import polygons_with_holes
from minidet.apps.outputs.results import FIELD_KEYS, FormatError, Results
from minidet.rasters import GEO_EXTENSIONS, georeference


def outline(inst: dict, height: int, width: int) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """One instance's parts as (outer ring, hole rings), (K, 2) x, y pixel-edge coordinates: from its RLE, its
    polygons (no holes), or its box where it has no mask; none for an empty mask. ``inst`` is a checked record's
    (``results.check_record``): its RLE is of the image's size and covers its pixels exactly."""
    seg = inst.get("segmentation")
    if isinstance(seg, dict):
        counts = seg["counts"]
        rle = mask_utils.frPyObjects(seg, height, width) if isinstance(counts, list) else \
            {"size": seg["size"], "counts": counts.encode()}
        mask = mask_utils.decode(rle).astype(bool)
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        if not len(rows):
            return []
        y0, x0 = int(rows[0]), int(cols[0])
        return polygons_with_holes(mask[y0 : rows[-1] + 1, x0 : cols[-1] + 1], x0, y0)
    if isinstance(seg, list):
        return [(np.asarray(p, np.float64).reshape(-1, 2), []) for p in seg]
    x, y, w, h = inst["bbox"]
    return [(np.array([[x, y], [x, y + h], [x + w, y + h], [x + w, y]], np.float64), [])]


BOX_SCORE_IN = {"coco-dataset": "each annotation's box_score field", "cvat": "a box_score attribute of each polygon",
                "labelstudio": "each region's meta text (box_score 0.1234)", "geojson": "each feature's box_score "
                "property"}
"""Where each format keeps a record's ``box_score``."""
NO_ATTRIBUTES = ("yolo-seg",)
"""The formats that hold no attribute beside a shape and its class (a record's ``box_score`` is not carried)."""


def has_box_scores(results: Results) -> bool:
    """Whether any instance of ``results`` has a ``box_score`` (a Mask Scoring R-CNN's records)."""
    return any("box_score" in i for r in results.images for i in r["instances"])


def _recorded(inst: dict) -> dict:
    """The detection's fields an instance carries beside its score (``results.FIELD_KEYS``: a Mask Scoring R-CNN's
    ``box_score``), by key: the fields a format's JSON adds."""
    return {key: inst[key] for key in FIELD_KEYS if key in inst}


def _kept(results: Results, score_thresh: float):
    for r in results.images:
        yield r, [i for i in r["instances"] if i["score"] >= score_thresh]


def _flat(ring: np.ndarray) -> list[float]:
    return [round(float(v), 2) for v in ring.ravel()]


def write_coco_dataset(results: Results, out: str, score_thresh: float = 0.0) -> int:
    """A COCO dataset (``images``, ``annotations`` with polygon ``segmentation``, ``area`` and ``iscrowd`` 0, the
    detection's ``score`` and ``box_score`` kept, ``categories``) for importing the detections as annotations. An empty
    mask is an annotation without polygons (area 0). Returns 0: no instance is left out."""
    images, anns = [], []
    for k, (r, insts) in enumerate(_kept(results, score_thresh), 1):
        images.append({"id": k, "file_name": r["file"], "height": r["height"], "width": r["width"]})
        for inst in insts:
            polys = [_flat(outer) for outer, _ in outline(inst, r["height"], r["width"])]
            area = float(mask_utils.area(mask_utils.merge(mask_utils.frPyObjects(polys, r["height"], r["width"]))))\
                if polys else 0.0
            anns.append({"id": len(anns) + 1, "image_id": k, "category_id": inst["category_id"],
                         "bbox": inst["bbox"], "area": area, "iscrowd": 0, "segmentation": polys,
                         "score": inst["score"], **_recorded(inst)})
    cats = [{"id": i, "name": n, "supercategory": ""} for i, n in results.categories]
    with atomic_open(out) as f:
        json.dump({"images": images, "annotations": anns, "categories": cats}, f)
    return 0


def write_cvat(results: Results, out: str, score_thresh: float = 0.0) -> int:
    """CVAT for images 1.1 XML: per image its polygons (``points`` "x,y;x,y;..."), the label, ``source`` auto and a
    ``score`` attribute, and a ``box_score`` one where the records have it (each declared on every label); the polygons
    of an instance of several parts share a ``group_id`` (CVAT's grouping of shapes; 1, 2, ... through the file).
    Returns the instances left out for an empty mask (CVAT has no empty polygon)."""
    root = ET.Element("annotations")
    ET.SubElement(root, "version").text = "1.1"
    labels = ET.SubElement(ET.SubElement(ET.SubElement(root, "meta"), "task"), "labels")
    declared = ("score", *(k for k in FIELD_KEYS if any(k in i for r in results.images for i in r["instances"])))
    for _, name in results.categories:
        label = ET.SubElement(labels, "label")
        ET.SubElement(label, "name").text = name
        ET.SubElement(label, "type").text = "polygon"
        attrs = ET.SubElement(label, "attributes")
        for attr_name in declared:
            attr = ET.SubElement(attrs, "attribute")
            for key, value in (("name", attr_name), ("mutable", "False"), ("input_type", "text"),
                               ("default_value", ""), ("values", "")):
                ET.SubElement(attr, key).text = value
    empty = groups = 0
    for k, (r, insts) in enumerate(_kept(results, score_thresh)):
        image = ET.SubElement(root, "image", id=str(k), name=r["file"], width=str(r["width"]),
                              height=str(r["height"]))
        for inst in insts:
            parts = outline(inst, r["height"], r["width"])
            empty += not parts
            groups += len(parts) > 1
            for outer, _ in parts:
                points = ";".join(f"{x:.2f},{y:.2f}" for x, y in outer)
                poly = ET.SubElement(image, "polygon", label=inst["category_name"], source="auto", occluded="0",
                                     points=points, z_order="0")
                if len(parts) > 1:
                    poly.set("group_id", str(groups))
                for key, value in {"score": inst["score"], **_recorded(inst)}.items():
                    ET.SubElement(poly, "attribute", name=key).text = f"{value:.4f}"
    ET.indent(root)
    with atomic_open(out, "wb") as f:
        f.write(b'<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="utf-8") + b"\n")
    return empty


def write_labelstudio(results: Results, out: str, score_thresh: float = 0.0, image_prefix: str = "") -> int:
    """Label Studio tasks with predictions: per image ``data.image`` (``image_prefix`` + its file) and one
    prediction (``model_version`` minidet, its mean score) whose results are ``polygonlabels`` in percent of the
    image (``from_name`` label, ``to_name`` image; a ``box_score`` as the region's ``meta`` text, which Label Studio
    shows with the region: a labeling config with <PolygonLabels name="label"
    toName="image"> and <Image name="image" value="$image">). A Label Studio polygon is one ring, so an instance of
    several parts is a region per part, tied as Label Studio ties regions: a ``relation`` result from its first part
    to each other one (no <Relations> tag needed: the relations carry no label). Returns the instances left out for
    an empty mask (Label Studio has no empty polygon)."""
    tasks, empty = [], 0
    for r, insts in _kept(results, score_thresh):
        h, w = r["height"], r["width"]
        found, regions = [], 0
        for inst in insts:
            parts = outline(inst, h, w)
            empty += not parts
            ids = [f"r{regions + k}" for k in range(len(parts))]
            regions += len(parts)
            for rid, (outer, _) in zip(ids, parts):
                points = [[round(100.0 * x / w, 4), round(100.0 * y / h, 4)] for x, y in outer]
                found.append({"id": rid, "type": "polygonlabels", "from_name": "label",
                              "to_name": "image", "original_width": w, "original_height": h, "image_rotation": 0,
                              "score": inst["score"], "value": {"points": points, "closed": True,
                                                                "polygonlabels": [inst["category_name"]]},
                              **_region_meta(inst)})
            found += [{"type": "relation", "from_id": ids[0], "to_id": rid, "direction": "right", "labels": []}
                      for rid in ids[1:]]
        score = float(np.mean([i["score"] for i in insts])) if insts else 0.0
        tasks.append({"data": {"image": image_prefix + r["file"]},
                      "predictions": [{"model_version": "minidet", "score": score, "result": found}]})
    with atomic_open(out) as f:
        json.dump(tasks, f)
    return empty


def _region_meta(inst: dict) -> dict:
    """A Label Studio region's ``meta`` (its text shown with the region) for an instance's recorded fields
    (``box_score``)."""
    return {"meta": {"text": [f"{key} {value:.4f}" for key, value in extra.items()]}} if (extra := _recorded(inst)) \
        else {}


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


def write_yolo_seg(results: Results, out: str, score_thresh: float = 0.0) -> int:
    """A folder: ``labels/<image stem>.txt`` (a line per instance: class index, then its polygon's x, y normalized to
    0..1) and ``data.yaml`` with the class ``names`` (indices 0.. in category id order). Returns the instances left
    out for an empty mask (a YOLO-seg line needs a polygon)."""
    index = {cid: k for k, (cid, _) in enumerate(results.categories)}
    os.makedirs(os.path.join(out, "labels"), exist_ok=True)
    stems: set[str] = set()
    empty = 0
    for r, insts in _kept(results, score_thresh):
        stem = os.path.splitext(os.path.basename(r["file"]))[0]
        if stem in stems:
            raise FormatError(f"yolo-seg: two images named {stem}: one labels folder cannot hold both")
        stems.add(stem)
        h, w = r["height"], r["width"]
        lines = []
        for inst in insts:
            parts = [outer for outer, _ in outline(inst, h, w)]
            empty += not parts
            if parts:
                ring = _joined(parts) / (w, h)
                lines.append(f"{index[inst['category_id']]} " + " ".join(f"{v:.6f}" for v in ring.ravel()))
        with atomic_open(os.path.join(out, "labels", stem + ".txt")) as f:
            f.write("".join(line + "\n" for line in lines))
    with atomic_open(os.path.join(out, "data.yaml")) as f:
        f.write("names:\n" + "".join(f"  {k}: {json.dumps(n)}\n" for k, (_, n) in enumerate(results.categories)))
    return empty


def _oriented(ring: np.ndarray, ccw: bool) -> list[list[float]]:
    """A closed GeoJSON ring, counter-clockwise (``ccw``) or clockwise."""
    x, y = ring[:, 0], ring[:, 1]
    area = 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))
    if (area > 0) != ccw:
        ring = ring[::-1]
    return [[float(a), float(b)] for a, b in [*ring, ring[0]]]


def _georeference(r: dict):
    """The record's image's pixel -> CRS map and CRS name (``rasters.georeference``), None for pixel coordinates.
    Refused (:class:`FormatError`) where the answer cannot be known: a raster's file (``GEO_EXTENSIONS``) without
    rasterio, not found from here (a relative ``file`` is relative to the folder infer ran in), not a regular file
    (a FIFO would block), or not of the record's size (another image of that name)."""
    path, h, w = r["file"], r["height"], r["width"]
    if not path.lower().endswith(GEO_EXTENSIONS):
        return None
    if importlib.util.find_spec("rasterio") is None:
        raise FormatError(f"geojson: {path} may be a georeferenced raster, and reading its coordinate system needs "
                          "rasterio (pip install 'minidet[geo]')")
    if not os.path.isfile(path):
        what = "not a regular file" if os.path.exists(path) else f"not found from {os.getcwd()}"
        raise FormatError(f"geojson: {path}: {what}, so its coordinate system cannot be read (a record's file is "
                          "where minidet infer read it: run minidet convert in the folder infer ran in)")
    geo = georeference(path)
    if geo is not None and geo[2] != (h, w):
        raise FormatError(f"geojson: {path} is {geo[2][1]} x {geo[2][0]} pixels, its record's image {w} x {h}: not "
                          "the image infer read (run minidet convert in the folder infer ran in)")
    return geo


def write_geojson(results: Results, out: str, score_thresh: float = 0.0) -> int:
    """A FeatureCollection: a MultiPolygon Feature per instance (holes as interior rings; exterior rings
    counter-clockwise as RFC 7946 asks; an empty mask has none), properties ``file``, ``score`` (and ``box_score`` where
    the record has it), ``category_id``, ``category_name``. In pixel coordinates (x right, y down), or in the raster's
    CRS where the image is a georeferenced raster (a GeoTIFF; the geo extra's rasterio reads it), named in a ``crs``
    member. Returns 0: no instance is left out."""
    features, crss = [], set()
    for r, insts in _kept(results, score_thresh):
        geo = _georeference(r)
        to_crs = geo[0] if geo else (lambda xy: xy)
        crss.add(geo[1] if geo else None)
        for inst in insts:
            polygons = [[_oriented(to_crs(outer), True), *(_oriented(to_crs(h), False) for h in holes)]
                        for outer, holes in outline(inst, r["height"], r["width"])]
            features.append({"type": "Feature", "geometry": {"type": "MultiPolygon", "coordinates": polygons},
                             "properties": {"file": r["file"], "score": inst["score"], **_recorded(inst),
                                            "category_id": inst["category_id"],
                                            "category_name": inst["category_name"]}})
    if len(crss) > 1:
        raise FormatError(f"geojson: the images are in {len(crss)} coordinate systems ({', '.join(map(str, crss))}); "
                          "convert them one system at a time")
    doc = {"type": "FeatureCollection", "features": features}
    if (crs := next(iter(crss), None)) is not None:
        doc["crs"] = {"type": "name", "properties": {"name": crs}}
    with atomic_open(out) as f:
        json.dump(doc, f)
    return 0


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing (or cannot be looked at): not one file
        return False


def overwrites(fmt: str, out: str, path: str) -> bool:
    """Whether writing ``fmt`` to ``out`` would replace the file ``path``, named in any way (``./x``, a symbolic or
    a hard link): ``out`` itself, or for yolo-seg (a folder) its ``data.yaml`` or a label file of that name."""
    names = [out] if fmt != "yolo-seg" else [os.path.join(out, "data.yaml"),
                                              os.path.join(out, "labels", os.path.basename(path))]
    return any(_same_file(path, name) for name in names)


FORMATS: dict[str, Callable[..., int]] = {"coco-dataset": write_coco_dataset, "cvat": write_cvat,
                                          "labelstudio": write_labelstudio, "yolo-seg": write_yolo_seg,
                                          "geojson": write_geojson}
"""The writers by ``--to`` name: each writes its file(s) whole and returns the instances it left out for an empty
mask."""
