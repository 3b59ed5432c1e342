"""infer's results read back (``minidet convert``): one validating reader of its ``.jsonl`` records, its COCO ``.json``
and one image's record, so that every format written from them gets the same checks.

Each record is checked against its own image size before any writer sees it: ``file`` a name (no control character),
``height`` and ``width`` whole numbers of at least one pixel whose product is within ``max_pixels``
(``INPUT.MAX_PIXELS``'s default: the same bound as infer's images), ``instances`` a list of objects with a finite
``score`` (and the detections' fields records carry, each a finite number: ``heads.detections.RECORDED``, a Mask
Scoring R-CNN's ``box_score``, the box head's), an integer ``category_id``, a
``category_name`` (a name, as ``file``), a ``bbox`` [x, y, w, h] inside the image, and a ``segmentation`` that is
absent, COCO RLE of the record's size whose runs cover exactly its pixels (checked before pycocotools decodes it), or
COCO polygons of x, y pairs inside the image. A record that fails is left out with one line naming it, the file's line
(or image) and the key; the others are read.
"""

from __future__ import annotations

import json
import math
import unicodedata
from dataclasses import dataclass, field

from minidet.apps.outputs.rle import NOT_RLE, rle_string_totals
from minidet.errors import InputError
from minidet.heads.detections import RECORDED
from minidet.imageio import DEFAULT_MAX_PIXELS

RECORD_KEYS = ("file", "height", "width", "instances")
INSTANCE_KEYS = ("bbox", "score", "category_id")
FIELD_KEYS = tuple(f.record for f in RECORDED)  # the detections' fields an instance may carry: finite numbers
SLACK = 1.0  # pixels a box or polygon may reach past the image's edge (pixel-inclusive box widths)


class FormatError(InputError):
    """A results file that cannot be read, or results a format cannot hold: one line naming the file."""


class RecordError(ValueError):
    """One record that cannot be converted: what is wrong, naming the key (the caller names the record)."""


@dataclass
class Results:
    """``images``: the records read (``file``, ``height``, ``width``, ``instances`` of ``bbox``, ``score``,
    ``category_id``, ``category_name``, ``segmentation`` or None, and ``box_score`` where the record has one);
    ``categories``: (id, name) in id order;
    ``problems``: one line per record (or annotation) left out, naming it; ``total``: the records in the file."""

    images: list[dict]
    categories: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    total: int = 0


def is_real(v) -> bool:
    """Whether a JSON value is a finite number (``true`` and ``false`` are not numbers), here and in evaluation's
    checks of datasets and results."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_int(v) -> bool:
    """Whether a JSON value is an integer (``true`` and ``false`` are not)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _name(value, key: str) -> str:
    """``value`` as a name (a file, a category): text without control characters, surrogates or noncharacters
    (XML cannot hold them; CVAT and Label Studio files would not load)."""
    if not isinstance(value, str) or not value:
        raise RecordError(f"{key} must be a non-empty string, got {value!r}")
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cs") or c in "\ufffe\uffff"), None)
    if bad is not None:
        raise RecordError(f"{key} {value!r} has the control character U+{ord(bad):04X}")
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _points_inside(values: list, h: int, w: int) -> bool:
    return all(-SLACK <= x <= w + SLACK and -SLACK <= y <= h + SLACK for x, y in zip(values[::2], values[1::2]))


def _segmentation(seg, h: int, w: int):
    """``seg`` checked against an h x w image: None, an RLE dict (``counts`` a string or a list of runs) or a list of
    polygons. Compressed counts are checked by the caller, all of a record's together."""
    if seg is None:
        return None
    if isinstance(seg, list):
        for k, p in enumerate(seg):
            if not (isinstance(p, list) and all(is_real(v) for v in p)):
                raise RecordError(f"segmentation polygon {k} must be a list of numbers, got {_short(p)}")
            if len(p) % 2 or len(p) < 6:
                raise RecordError(f"segmentation polygon {k} has {len(p)} values (x, y pairs: an even number, at "
                                  "least 6)")
            if not _points_inside(p, h, w):
                raise RecordError(f"segmentation polygon {k} has points outside the {w} x {h} image")
        return seg
    if not (isinstance(seg, dict) and "size" in seg and "counts" in seg):
        raise RecordError("segmentation must be an RLE object {'size': [H, W], 'counts': ...}, COCO polygons or "
                          f"null, got {_short(seg)}")
    if seg["size"] != [h, w]:
        raise RecordError(f"segmentation size {_short(seg['size'])} is not the record's [height, width] {[h, w]}")
    counts = seg["counts"]
    if isinstance(counts, list):
        if not all(is_int(c) and c >= 0 for c in counts) or sum(counts) != h * w:
            raise RecordError(f"segmentation counts must be non-negative run lengths covering the {w} x {h} pixels")
    elif not isinstance(counts, str):
        raise RecordError(f"segmentation counts must be an RLE string or a list of runs, got {_short(counts)}")
    return {"size": [h, w], "counts": counts}


def _instance(inst, h: int, w: int) -> dict:
    if not isinstance(inst, dict):
        raise RecordError(f"must be an object, got {_short(inst)}")
    if key := next((k for k in INSTANCE_KEYS if k not in inst), None):
        raise RecordError(f"no {key!r} (an instance has {', '.join(INSTANCE_KEYS)}; category_name, segmentation)")
    score, cid, box = inst["score"], inst["category_id"], inst["bbox"]
    for key in ("score", *FIELD_KEYS):
        if key in inst and not is_real(inst[key]):
            raise RecordError(f"{key} must be a finite number, got {_short(inst[key])}")
    if not is_int(cid):
        raise RecordError(f"category_id must be an integer, got {_short(cid)}")
    if not (isinstance(box, list) and len(box) == 4 and all(is_real(v) for v in box) and box[2] >= 0
            and box[3] >= 0):
        raise RecordError(f"bbox must be [x, y, width, height] with width, height >= 0, got {_short(box)}")
    if not _points_inside([box[0], box[1], box[0] + box[2], box[1] + box[3]], h, w):
        raise RecordError(f"bbox {box} is outside the {w} x {h} image")
    name = _name(inst["category_name"], "category_name") if "category_name" in inst else str(cid)
    kept = {"bbox": box, "score": score, "category_id": cid, "category_name": name,
            "segmentation": _segmentation(inst.get("segmentation"), h, w)}
    return {**kept, **{key: inst[key] for key in FIELD_KEYS if key in inst}}


def check_record(doc, max_pixels: int = DEFAULT_MAX_PIXELS, labels: list[str] | None = None) -> dict:
    """One record checked (module docstring) and normalized (every instance with its ``category_name`` and
    ``segmentation``); :class:`RecordError` naming the key otherwise. ``labels``: how to name each instance in a
    message (default ``instance k``); ``max_pixels`` 0: no bound."""
    if not isinstance(doc, dict):
        raise RecordError(f"expected a record (an object of {', '.join(RECORD_KEYS)}), got {_short(doc)}")
    if key := next((k for k in RECORD_KEYS if k not in doc), None):
        raise RecordError(f"no {key!r} (a record has {', '.join(RECORD_KEYS)})")
    file, h, w, insts = _name(doc["file"], "file"), doc["height"], doc["width"], doc["instances"]
    if not (is_int(h) and is_int(w) and h >= 1 and w >= 1):
        raise RecordError(f"height {_short(h)}, width {_short(w)}: an image's height and width are whole numbers "
                          "of at least 1")
    if max_pixels and h * w > max_pixels:
        raise RecordError(f"{w} x {h} = {w * h} pixels exceeds --max-pixels ({max_pixels}, INPUT.MAX_PIXELS's "
                          "default; 0: no limit)")
    if not isinstance(insts, list):
        raise RecordError(f"instances must be a list, got {_short(insts)}")
    labels = labels or [f"instance {k}" for k in range(len(insts))]
    found = []
    for label, inst in zip(labels, insts):
        try:
            found.append(_instance(inst, h, w))
        except RecordError as e:
            raise RecordError(f"{label}: {e}") from None
    strings = [(label, i["segmentation"]["counts"]) for label, i in zip(labels, found)
               if isinstance(i["segmentation"], dict) and isinstance(i["segmentation"]["counts"], str)]
    for (label, counts), total in zip(strings, rle_string_totals([c for _, c in strings]).tolist()):
        if total == NOT_RLE:
            raise RecordError(f"{label}: segmentation counts {_short(counts)} are not a compressed COCO RLE string")
        if total != h * w:
            raise RecordError(f"{label}: segmentation counts do not cover the record's {w} x {h} pixels")
    return {"file": file, "height": h, "width": w, "instances": found}


def read_results(path: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> Results:
    """infer's ``--results`` file (``.jsonl`` records, or the COCO ``.json``), or one image's record (``.json``),
    every record checked (:func:`check_record`). A file that cannot be read at all is a :class:`FormatError`; a bad
    record is left out, its line in ``problems``."""
    results = Results([])
    named: dict[int, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".jsonl"):
                for n, line in enumerate(f, 1):
                    if line.strip():
                        results.total += 1
                        _take(results, f"{path}: line {n}", lambda line=line: json.loads(line), max_pixels)
                return _categories(results, named)
            doc = json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: cannot read the results file ({e})") from None
    except (ValueError, RecursionError) as e:
        raise FormatError(f"{path}: not valid JSON ({e})") from None
    if isinstance(doc, dict) and "annotations" in doc:
        named = _from_coco(doc, path, results, max_pixels)
    elif isinstance(doc, dict) and set(RECORD_KEYS) <= set(doc):
        results.total = 1
        _take(results, path, lambda: doc, max_pixels)
    else:
        raise FormatError(f"{path}: not infer's results (each image a record of {', '.join(RECORD_KEYS)}; or a COCO "
                          "results document of images, annotations, categories)")
    return _categories(results, named)


def _take(results: Results, where: str, load, max_pixels: int, labels: list[str] | None = None) -> None:
    """Add the record ``load()`` gives, or its problem, named ``where``."""
    try:
        results.images.append(check_record(load(), max_pixels, labels))
    except RecordError as e:
        results.problems.append(f"{where}: {e}")
    except (ValueError, RecursionError) as e:
        results.problems.append(f"{where}: not valid JSON ({e})")


def _categories(results: Results, named: dict[int, str]) -> Results:
    cats: dict[int, str] = {}
    for r in results.images:
        for inst in r["instances"]:
            cats.setdefault(inst["category_id"], inst["category_name"])
    cats.update(named)
    results.categories = sorted(cats.items())
    return results


def _from_coco(doc: dict, path: str, results: Results, max_pixels: int) -> dict[int, str]:
    """The records of infer's COCO results document (``images``, ``annotations``, ``categories``) into ``results``;
    returns the categories' names by id."""
    images, anns, cats = doc.get("images"), doc["annotations"], doc.get("categories", [])
    if not (isinstance(images, list) and all(isinstance(m, dict) and is_int(m.get("id")) for m in images)):
        raise FormatError(f"{path}: 'images' must be a list of objects with an integer 'id'")
    if not (isinstance(anns, list) and all(isinstance(a, dict) for a in anns)):
        raise FormatError(f"{path}: 'annotations' must be a list of objects")
    named = {}
    for k, c in enumerate(cats if isinstance(cats, list) else [None]):
        if not (isinstance(c, dict) and is_int(c.get("id"))):
            raise FormatError(f"{path}: categories[{k}] must be an object with an integer 'id'")
        try:
            named[c["id"]] = _name(c.get("name"), "name")
        except RecordError as e:
            raise FormatError(f"{path}: categories[{k}]: {e}") from None
    by_id: dict[int, list[int]] = {m["id"]: [] for m in images}
    for j, a in enumerate(anns):
        if is_int(a.get("image_id")) and a["image_id"] in by_id:
            by_id[a["image_id"]].append(j)
        else:
            results.problems.append(f"{path}: annotations[{j}]: image_id {_short(a.get('image_id'))} is not in "
                                    "'images'")
    results.total = len(images)
    seen: set[int] = set()
    for k, m in enumerate(images):
        where = f"{path}: images[{k}] (id {m['id']})"
        if m["id"] in seen:
            results.problems.append(f"{where}: the id of an earlier image")
            continue
        seen.add(m["id"])
        if key := next((key for key in ("file_name", "height", "width") if key not in m), None):
            results.problems.append(f"{where}: no {key!r}")
            continue
        js = by_id[m["id"]]
        insts = [anns[j] for j in js]
        insts = [{**a, "category_name": named[a["category_id"]]} if is_int(a.get("category_id"))
                 and a["category_id"] in named else a for a in insts]
        record = {"file": m["file_name"], "height": m["height"], "width": m["width"], "instances": insts}
        _take(results, where, lambda record=record: record, max_pixels, [f"annotations[{j}]" for j in js])
    return named
