"""COCO evaluation: detections to COCO results (RLE as each image finishes), checks of annotation and results
files (COCO and LVIS), scoring by :mod:`minidet.apps.scoring`'s backends.
Metrics: ``{"bbox": {"stats": [12 floats], "AP": ..., "AP50": ..., ..., "ARl": ...}, "segm": {...}}`` in
COCOeval's units (fractions; -1 where the ground truth has nothing to measure); LVIS's names for an LVIS file."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence

from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from minidet.apps.outputs.instances import instances_to_coco
from minidet.apps.outputs.results import is_int, is_real
from minidet.apps.outputs.rle import NEGATIVE_RUN, NOT_RLE, rle_string_totals  # noqa: F401 (evaluation's API)
from minidet.apps.scoring import (  # noqa: F401 (evaluation's API)
    IOU_TYPES,
    METRIC_NAMES,
    RESULT_FIELD,
    EvaluationError,
    Scorer,
    Scores,
    _quiet,
    check_lvis,
    dataset_format,
    polygons_as_rle,
)

from ..categories import (
    BACKGROUND,
    COCO_CATEGORIES,
    UNUSED,
    Classes,
    category_ids,
    class_names,
    own_classes,
    placeholder_names,
)

_GT_KEYS = ("id", "image_id", "category_id", "bbox", "area", "iscrowd")
_PLAIN_REALS = frozenset((int, float))  # JSON's numbers (bool is neither)


def _load_json(path: str, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise EvaluationError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise EvaluationError(f"{path}: cannot read {what} ({e})") from None
    except json.JSONDecodeError as e:
        raise EvaluationError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def _lvis_file_name(image: dict) -> None:
    """An LVIS v1 image has no ``file_name``: its ``coco_url``'s folder and name (``val2017/000000000139.jpg``), as
    detectron2 finds LVIS images under a COCO folder (``--images coco/``)."""
    url = image.get("coco_url")
    if "file_name" not in image and isinstance(url, str) and url.count("/") >= 1:
        image["file_name"] = "/".join(url.rstrip("/").split("/")[-2:])


def load_coco_annotations(path: str) -> COCO:
    """Read a COCO instances annotation file (or an LVIS one: :func:`minidet.apps.scoring.dataset_format`) into a
    pycocotools ``COCO``: ids must be unique integers, every annotation must name a listed image and category
    (``info``, ``licenses``, crowd RLE and images without annotations are fine; LVIS has no ``iscrowd``, and its
    images' ``coco_url`` gives their ``file_name``); each annotation's box, area, ``iscrowd`` and segmentation are
    checked as :func:`_check_annotation` says, an LVIS file's lists as :func:`minidet.apps.scoring.check_lvis`, so
    that every backend gets the same file or none. Raises :class:`EvaluationError` naming ``path`` and the entry
    otherwise."""
    data = _load_json(path, "annotation file")
    if not isinstance(data, dict):
        raise EvaluationError(f"{path}: not a COCO annotation file (expected a JSON object at top level)")
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise EvaluationError(f"{path}: not a COCO annotation file (no {key!r} list)")
    lvis = dataset_format(data) == "lvis"
    if lvis:
        check_lvis(data, path)
    gt_keys = tuple(k for k in _GT_KEYS if not (lvis and k == "iscrowd"))
    image_ids: set[int] = set()
    for i, im in enumerate(data["images"]):
        if lvis and isinstance(im, dict):
            _lvis_file_name(im)
        if not (isinstance(im, dict) and all(k in im for k in ("id", "file_name", "height", "width"))):
            raise EvaluationError(f"{path}: images[{i}] needs 'id', 'file_name', 'height' and 'width'")
        if not (is_int(im["id"]) and is_int(im["height"]) and is_int(im["width"])):
            raise EvaluationError(f"{path}: images[{i}]: 'id', 'height' and 'width' must be integers")
        if im["height"] < 1 or im["width"] < 1 or not isinstance(im["file_name"], str):
            raise EvaluationError(f"{path}: images[{i}]: needs a positive size and a 'file_name' string")
        if im["id"] in image_ids:
            raise EvaluationError(f"{path}: images[{i}]: image id {im['id']} appears twice")
        image_ids.add(im["id"])
    category_ids: set[int] = set()
    for i, cat in enumerate(data["categories"]):
        if not (isinstance(cat, dict) and "id" in cat and "name" in cat):
            raise EvaluationError(f"{path}: categories[{i}] needs 'id' and 'name'")
        if not is_int(cat["id"]) or cat["id"] in category_ids:
            raise EvaluationError(f"{path}: categories[{i}]: id {cat['id']!r} is not an integer or appears twice")
        category_ids.add(cat["id"])
    if not category_ids:
        raise EvaluationError(f"{path}: no categories (the 'categories' list is empty); nothing to evaluate")
    _check_annotations(data, path, gt_keys, category_ids)
    coco = COCO()
    coco.dataset = data
    _quiet(coco.createIndex)
    return coco


def _check_annotations(data: dict, path: str, gt_keys: tuple[str, ...], category_ids: set[int]) -> None:
    """Check every annotation of ``data`` (:func:`_check_annotation`), then their compressed RLE counts all at once."""
    anns, images = data["annotations"], {im["id"]: im for im in data["images"]}
    ann_ids: set[int] = set()
    strings: list[tuple[int, str, int, int]] = []  # compressed RLE counts: (annotation, counts, H, W)
    for i, ann in enumerate(anns):
        if missing := [k for k in gt_keys if not isinstance(ann, dict) or k not in ann]:
            raise EvaluationError(f"{path}: annotations[{i}] lacks {', '.join(map(repr, missing))}")
        if not is_int(ann["id"]) or ann["id"] in ann_ids:  # pycocotools finds annotations by id
            raise EvaluationError(f"{path}: annotations[{i}]: annotation id {ann['id']!r} is not an integer or "
                                  "appears twice")
        ann_ids.add(ann["id"])
        try:
            counts = _check_annotation(ann, f"{path}: annotations[{i}]", images, category_ids)
        except EvaluationError as e:
            raise EvaluationError(f"{e} (annotation id {ann['id']})") from None
        if counts is not None:
            image = images[ann["image_id"]]
            strings.append((i, counts, image["height"], image["width"]))
    _check_rle_strings(strings, lambda i: f"{path}: annotations[{i}]", lambda i: f" (annotation id {anns[i]['id']})")


def _check_annotation(ann: dict, where: str, images: dict[int, dict], category_ids: set[int]) -> str | None:
    """Check one ground-truth annotation: a listed image and category, ``bbox`` [x, y, w, h] with w, h >= 0, ``area``
    a finite number >= 0, ``iscrowd`` 0 or 1 (where given), ``segmentation`` (where given) as
    :func:`check_segmentation` says (an empty polygon list is a box-only annotation). Returns its compressed RLE
    counts (checked later), else None; raises :class:`EvaluationError` naming ``where``."""
    if not is_int(ann["image_id"]) or ann["image_id"] not in images:
        raise EvaluationError(f"{where}: image_id {ann['image_id']!r} is not in 'images'")
    if not is_int(ann["category_id"]) or ann["category_id"] not in category_ids:
        raise EvaluationError(f"{where}: category_id {ann['category_id']!r} is not in 'categories'")
    b = ann["bbox"]
    if not (isinstance(b, list) and len(b) == 4 and all(is_real(v) for v in b) and b[2] >= 0 and b[3] >= 0):
        raise EvaluationError(f"{where}: 'bbox' must be [x, y, width, height] with width, height >= 0; got {b!r}")
    if not (is_real(ann["area"]) and ann["area"] >= 0):
        raise EvaluationError(f"{where}: 'area' must be a finite number >= 0, got {ann['area']!r}")
    if ann.get("iscrowd", 0) not in (0, 1) or isinstance(ann.get("iscrowd"), (bool, float)):
        raise EvaluationError(f"{where}: 'iscrowd' must be 0 or 1, got {ann['iscrowd']!r}")
    if "segmentation" not in ann:
        return None
    return check_segmentation(ann["segmentation"], images[ann["image_id"]], where)


def check_categories(coco_gt: COCO, layout: str, source: str) -> None:
    """Raise :class:`EvaluationError` naming ``source`` unless every dataset category is the checkpoint's (id, name)."""
    classes = zip(category_ids(layout), class_names(layout))
    known = {cid: name for cid, name in classes if name not in (BACKGROUND, UNUSED)}
    for cat in sorted(coco_gt.dataset["categories"], key=lambda c: c["id"]):
        cid, name = cat["id"], cat["name"]
        if cid not in known:
            raise EvaluationError(f"{source}: category {cid} ({name!r}) is not a category of the checkpoint "
                                  f"(MODEL.CATEGORY_LAYOUT {layout}: COCO ids {min(known)}..{max(known)}); "
                                  "the dataset does not match the model")
        if name != known[cid]:
            raise EvaluationError(f"{source}: category {cid} is {name!r} in the dataset but {known[cid]!r} for the "
                                  f"checkpoint (MODEL.CATEGORY_LAYOUT {layout}); the dataset does not match the model")


def match_dataset(classes: Classes, coco_gt: COCO, source: str, layout: str = "") -> Classes:
    """The model's ``classes`` with the dataset's category ids (and, where the model has none, its names). A COCO
    layout is checked as it is (:func:`check_categories` with ``layout``). A checkpoint's own classes map to the
    dataset's categories by name when they have names, else by order of increasing category id; another count or
    a name the dataset lacks is one line listing both sides (:class:`EvaluationError`)."""
    if not classes.own:
        check_categories(coco_gt, layout, source)
        return classes
    cats = sorted(coco_gt.dataset["categories"], key=lambda c: c["id"])
    model = [name for _, _, name in classes.real()]
    named = model != placeholder_names(len(model))
    theirs = ", ".join(f"{c['id']} {c['name']!r}" for c in cats)
    both = f"the model's {len(model)}: {', '.join(map(repr, model))}; {source}'s {len(cats)}: {theirs}"
    if named:
        by_name = {c["name"]: c["id"] for c in cats}
        unknown = [n for n in model if n not in by_name]
        if unknown or len(cats) != len(model):
            what = f"{unknown[0]!r} is not a category of the dataset" if unknown else "other counts"
            raise EvaluationError(f"{source}: the model's classes do not match the dataset's ({what}): {both}")
        return classes.with_categories([by_name[n] for n in model], model)
    if len(cats) != len(model):
        raise EvaluationError(f"{source}: the model has {len(model)} unnamed classes but the dataset {len(cats)} "
                              f"categories (unnamed classes map by order of increasing id): {both}")
    return classes.with_categories([c["id"] for c in cats], [c["name"] for c in cats])


def result_iou_types(results: Sequence[dict]) -> tuple[str, ...]:
    """The evaluations a results list allows: ``bbox`` and/or ``segm``, by its first entry."""
    return tuple(t for t in IOU_TYPES if RESULT_FIELD[t] in results[0]) if results else ()


def validate_results(results, coco_gt: COCO, source: str) -> tuple[str, ...]:
    """Check a results list against the COCO results schema and the annotation file; returns its IoU types.
    Every entry needs an ``image_id`` of the annotation file, an integer ``category_id``, a finite ``score``, and
    the same of ``bbox`` ([x, y, w, h], w, h >= 0) and ``segmentation`` (RLE of the image's size whose runs add up
    to H*W; uncompressed counts are compressed in place) as the first entry. Raises :class:`EvaluationError`."""
    if not isinstance(results, list):
        raise EvaluationError(f"{source}: COCO results must be a JSON list of detections, got {type(results).__name__}")
    if not results:
        raise EvaluationError(f"{source}: no detections (empty list); nothing to evaluate")
    if not isinstance(results[0], dict):
        raise EvaluationError(f"{source}: entry 0: expected an object, got {type(results[0]).__name__}")
    if not (types := result_iou_types(results)):
        raise EvaluationError(f"{source}: entry 0 has neither 'bbox' nor 'segmentation'; nothing to evaluate")
    needed = ("image_id", "category_id", "score", *(RESULT_FIELD[t] for t in types))
    strings: list[tuple[int, str, int, int]] = []  # compressed RLE counts: (entry, counts, H, W)
    sizes = {k: [m["height"], m["width"]] for k, m in coco_gt.imgs.items()}
    box, mask, real, finite, keys = "bbox" in needed, "segmentation" in needed, _PLAIN_REALS, math.isfinite, set(needed)
    for i, r in enumerate(results):
        # the usual entry (JSON's types, compressed RLE of the image's size) in one expression, at dataset scale;
        # anything else (an error, numpy numbers, polygons, uncompressed counts) is checked one field at a time
        if (
            type(r) is dict and r.keys() >= keys and type(image_id := r["image_id"]) is int
            and image_id in sizes and type(r["category_id"]) is int and type(score := r["score"]) in real
            and finite(score)
            and (not box or (type(b := r["bbox"]) is list and len(b) == 4 and all(type(v) in real for v in b)
                             and all(map(finite, b)) and b[2] >= 0 and b[3] >= 0))
            and (not mask or (type(seg := r["segmentation"]) is dict and type(counts := seg.get("counts")) is str
                              and seg.get("size") == sizes[image_id]))
        ):
            if mask:
                strings.append((i, counts, *sizes[image_id]))
        elif rle := _check_entry(r, f"{source}: entry {i}", needed, coco_gt):
            strings.append((i, *rle))
    _check_rle_strings(strings, lambda i: f"{source}: entry {i}")
    return types


def _check_entry(r, where: str, needed: tuple[str, ...], coco_gt: COCO) -> tuple[str, int, int] | None:
    """Check one results entry field by field (raises :class:`EvaluationError` at the first problem); returns its
    compressed RLE ``(counts, H, W)`` (checked later), else None."""
    if not isinstance(r, dict):
        raise EvaluationError(f"{where}: expected an object, got {type(r).__name__}")
    if key := next((k for k in needed if k not in r), None):
        raise EvaluationError(f"{where}: no {key!r} (every entry needs {', '.join(map(repr, needed))})")
    image_id = r["image_id"]
    if not is_int(image_id) or image_id not in coco_gt.imgs:
        raise EvaluationError(f"{where}: image_id {image_id!r} is not an image of the annotation file")
    if not is_int(r["category_id"]):
        raise EvaluationError(f"{where}: category_id must be an integer, got {r['category_id']!r}")
    if not is_real(r["score"]):
        raise EvaluationError(f"{where}: score must be a finite number, got {r['score']!r}")
    if "bbox" in needed:
        b = r["bbox"]
        if not (isinstance(b, list) and len(b) == 4 and all(is_real(v) for v in b) and b[2] >= 0 and b[3] >= 0):
            raise EvaluationError(f"{where}: bbox must be [x, y, width, height] with width, height >= 0; got {b!r}")
    return _check_rle(r, coco_gt.imgs[image_id], where) if "segmentation" in needed else None


def _check_rle(r: dict, image: dict, where: str) -> tuple[str, int, int] | None:
    """Check one results entry's segmentation (:func:`check_segmentation`); returns ``(counts, H, W)`` of compressed
    counts (their runs are checked later), None for polygons and uncompressed counts (made compressed RLE in place:
    the results APIs take RLE)."""
    seg = r["segmentation"]
    counts = check_segmentation(seg, image, where)
    if isinstance(seg, list):  # COCO polygons: scored as pycocotools rasterizes them
        r["segmentation"] = polygons_as_rle(r, image)["segmentation"]
    elif counts is None:
        size = seg["size"]
        compressed = mask_utils.frPyObjects(seg, size[0], size[1])
        r["segmentation"] = {"size": size, "counts": compressed["counts"].decode("ascii")}
    return None if counts is None else (counts, image["height"], image["width"])


def check_segmentation(seg, image: dict, where: str) -> str | None:
    """Check one segmentation of ``image`` (a results entry's or an annotation's) before any rasterizer sees it:
    COCO polygons (:func:`polygon_problem`), or RLE ``{"size": [H, W], "counts": ...}`` of the image's size whose
    uncompressed counts are non-negative integers summing to H*W. Returns compressed counts (a string, checked by
    :func:`_check_rle_strings`), else None; raises :class:`EvaluationError` naming ``where``."""
    h, w = image["height"], image["width"]
    if isinstance(seg, list):
        if problem := polygon_problem(seg, h, w):
            raise EvaluationError(f"{where}: segmentation {problem}")
        return None
    if not (isinstance(seg, dict) and "size" in seg and "counts" in seg):
        raise EvaluationError(f"{where}: segmentation must be an RLE object {{'size': [H, W], 'counts': ...}} or "
                              "COCO polygons")
    size, counts = seg["size"], seg["counts"]
    if not (isinstance(size, list) and size == [h, w]):
        raise EvaluationError(f"{where}: segmentation size {size!r} is not the image's [height, width] {[h, w]}")
    if isinstance(counts, list):
        if not all(is_int(c) and c >= 0 for c in counts) or sum(counts) != h * w:
            raise EvaluationError(f"{where}: uncompressed RLE counts must be non-negative integers summing to H*W "
                                  f"({h} x {w} = {h * w})")
        return None
    if not isinstance(counts, str):
        raise EvaluationError(f"{where}: segmentation counts must be an RLE string or a list of run lengths")
    return counts


def polygon_problem(polygons: list, height: int, width: int) -> str | None:
    """What makes COCO ``polygons`` of a height x width image unfit to rasterize, or None. Each polygon is a list of
    x, y numbers (an even count, at least 3 points), finite, within the image extended by its size on each side
    (x in [-W, 2W], y in [-H, 2H]). pycocotools' ``rleFrPoly`` clips a polygon to the image, so a point outside it
    is fine; but it scales each coordinate by 5 into a C int and walks every edge one point per fifth of a pixel:
    a huge coordinate overflows (a crash) or takes memory in proportion, NaN is undefined, fewer than 6 numbers
    are read as a box or refused, and an odd count loses its last number."""
    for k, p in enumerate(polygons):
        if not (isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0):
            what = f"{len(p)} numbers" if isinstance(p, list) else type(p).__name__
            return (f"polygon {k} must be a list of x, y numbers (an even count, at least 3 points), got {what}")
        if not all(is_real(v) for v in p):
            return f"polygon {k} must hold finite numbers, got {next(v for v in p if not is_real(v))!r}"
        xs, ys = p[0::2], p[1::2]
        if min(xs) < -width or max(xs) > 2 * width or min(ys) < -height or max(ys) > 2 * height:
            x, y = next((x, y) for x, y in zip(xs, ys) if not (-width <= x <= 2 * width and -height <= y <= 2 * height))
            return (f"polygon {k}: point ({x:g}, {y:g}) lies outside the image extended by its size on each side "
                    f"(x in [{-width}, {2 * width}], y in [{-height}, {2 * height}])")
    return None


def _check_rle_strings(entries: list[tuple[int, str, int, int]], name: Callable[[int], str],
                       tail: Callable[[int], str] = lambda i: "", batch: int = 4096) -> None:
    """Compressed counts ``(entry, counts, H, W)`` must decode to runs covering H*W pixels: of another total,
    pycocotools' decode leaves pixels uninitialized or fails naming no entry. ``name(entry)`` says where an entry is
    (``r.json: entry 3``), ``tail(entry)`` ends the line."""
    for k in range(0, len(entries), batch):
        part = entries[k : k + batch]
        totals = rle_string_totals([c for _, c, _, _ in part])
        for (i, counts, h, w), total in zip(part, totals.tolist()):
            if total == h * w:
                continue
            where = f"{name(i)}: segmentation counts"
            if total == NOT_RLE:
                text = counts if len(counts) <= 20 else counts[:20] + "..."
                raise EvaluationError(f"{where} {text!r} is not a compressed COCO RLE string{tail(i)}")
            what = "a run below 0" if total == NEGATIVE_RUN else f"runs covering {total} pixels"
            raise EvaluationError(f"{where} do not decode to the image's {h} x {w} pixels ({what}){tail(i)}")


def load_results(path: str, coco_gt: COCO) -> tuple[list[dict], tuple[str, ...]]:
    """Read and validate a COCO results file (a list of detections, or ``{"images", "annotations"}`` as
    ``tools/infer.py --results x.json`` writes it: see :func:`_by_file_name`); returns the detections and their
    IoU types."""
    results = _load_json(path, "results file")
    if isinstance(results, dict) and {"images", "annotations"} <= set(results):
        results = _by_category(_by_file_name(results, coco_gt, path), results.get("categories"), coco_gt, path)
    return results, validate_results(results, coco_gt, path)


def _by_category(dets: list, categories, coco_gt: COCO, source: str) -> list:
    """Detections of a results document that lists its own ``categories`` (a model's own classes), their category
    ids changed to the dataset's of the same name (else by order of increasing id: :func:`match_dataset`); a
    document whose categories are the dataset's (or all COCO's) keeps its ids."""
    if not (isinstance(categories, list) and all(isinstance(c, dict) and {"id", "name"} <= set(c) for c in categories)):
        return dets
    known = {c["id"]: c["name"] for c in coco_gt.dataset["categories"]}
    pairs = {(c["id"], c["name"]) for c in categories}
    if pairs <= set(known.items()) or pairs == set(COCO_CATEGORIES):  # the dataset's ids, or COCO's
        return dets
    ours = sorted(categories, key=lambda c: c["id"])
    classes = own_classes([str(c["name"]) for c in ours], True, [c["id"] for c in ours])
    mapped = match_dataset(classes, coco_gt, source)
    ids = dict(zip(classes.ids, mapped.ids))
    return [{**d, "category_id": ids.get(d.get("category_id"), d.get("category_id"))} for d in dets]


def _by_file_name(doc: dict, coco_gt: COCO, source: str) -> list:
    """The detections of a results document with its own ``images`` list, their image ids changed to those of the
    annotation file's images of the same ``file_name`` (else of the one image with that base name)."""
    images, dets = doc["images"], doc["annotations"]
    if not (isinstance(images, list) and all(isinstance(m, dict) and {"id", "file_name"} <= set(m) for m in images)):
        raise EvaluationError(f"{source}: 'images' must be a list of {{'id', 'file_name', ...}} entries")
    exact = {m["file_name"]: m["id"] for m in coco_gt.dataset["images"]}
    base: dict[str, list[int]] = {}
    for m in coco_gt.dataset["images"]:
        base.setdefault(os.path.basename(m["file_name"]), []).append(m["id"])
    ids = {}
    for m in images:
        name = str(m["file_name"])
        same_base = base.get(os.path.basename(name), [])
        found = exact.get(name, same_base[0] if len(same_base) == 1 else None)
        if found is None:
            raise EvaluationError(f"{source}: image {name!r} (id {m['id']}) is not in the annotation file")
        ids[m["id"]] = found
    if not (isinstance(dets, list) and all(isinstance(d, dict) for d in dets)):
        raise EvaluationError(f"{source}: 'annotations' must be a list of detections")
    if stray := [d.get("image_id") for d in dets if d.get("image_id") not in ids]:
        raise EvaluationError(f"{source}: a detection of image id {stray[0]!r}, which its 'images' list lacks")
    return [{**d, "image_id": ids[d["image_id"]]} for d in dets]


def coco_metrics(coco_gt: COCO, results: Sequence[dict], iou_types: Sequence[str],
                 image_ids: Iterable[int] | None = None) -> tuple[dict[str, dict], dict[str, str]]:
    """Run pycocotools' COCOeval per IoU type on ``results`` (not modified) over ``image_ids`` (default: every
    image), masks sized by their mask's area. Returns ``(metrics, tables)``: ``metrics[iou_type]`` is
    ``{"stats": [12 floats], "AP": ...}`` (see :data:`METRIC_NAMES`), ``tables[iou_type]`` the summary pycocotools
    prints. :class:`minidet.apps.scoring.Scorer` offers the other backends and rules."""
    scores = Scorer(coco_gt, "pycocotools").score(results, iou_types, image_ids)
    return scores.metrics, scores.tables


class COCOEvaluator:
    """Collects one dataset's detections as COCO results and scores them: ``process`` converts a batch of predictor
    outputs (masks to RLE right away), ``extend`` adds results converted earlier, ``evaluate()`` returns the metrics
    over the processed images (the backend's printouts in ``tables``). Detections of categories
    the annotation file lacks are dropped and counted in ``dropped``."""

    def __init__(self, coco_gt: COCO, mask_format: str = "rle") -> None:
        self.coco_gt, self.mask_format = coco_gt, mask_format
        self.category_ids = frozenset(coco_gt.getCatIds())
        self.reset()

    def reset(self) -> None:
        self.results: list[dict] = []
        self.image_ids: list[int] = []
        self.dropped = 0
        self.tables: dict[str, str] = {}

    def process(self, image_ids: Sequence[int], outputs: Sequence[Mapping]) -> list[dict]:
        """Convert and keep one batch; returns the new results."""
        new: list[dict] = []
        for image_id, out in zip(image_ids, outputs):
            res, dropped = instances_to_coco(image_id, out, keep=self.category_ids, mask_format=self.mask_format)
            new.extend(res)
            self.dropped += dropped
        self.extend(image_ids, new)
        return new

    def extend(self, image_ids: Iterable[int], results: Iterable[dict], dropped: int = 0) -> None:
        """Add already converted results of ``image_ids``."""
        self.image_ids.extend(int(i) for i in image_ids)
        self.results.extend(results)
        self.dropped += dropped

    def sorted_results(self) -> list[dict]:
        """The results sorted in place by image id, then decreasing score (what is written and evaluated)."""
        self.results.sort(key=lambda r: (r["image_id"], -r["score"]))  # stable; linear when already sorted
        return self.results

    def evaluate(self, iou_types: Sequence[str] | None = None, scorer: Scorer | None = None) -> dict[str, dict]:
        """Metrics over the processed images by ``scorer`` (default: pycocotools, masks sized by their mask's area;
        the whole scoring, stage times included, in ``scores``); ``iou_types`` default: what the results carry."""
        results = self.sorted_results()
        if iou_types is None:
            iou_types = result_iou_types(results) or ("bbox",)
        scorer = scorer or Scorer(self.coco_gt, "pycocotools")
        self.scores = scorer.score(results, iou_types, self.image_ids)
        self.tables = self.scores.tables
        return self.scores.metrics
