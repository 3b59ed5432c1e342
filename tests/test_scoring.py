"""Scoring backends (``minidet.apps.scoring``) against the reference API of each format, exactly.

"A backend whose statistics differ from pycocotools' on the same files is a failed test, not a tolerance": every
comparison here is ``==`` of the stat lists, and every reference is computed here, by the reference API run by hand
(pycocotools' ``COCO`` / ``loadRes`` / ``COCOeval`` for COCO, the LVIS API's ``LVIS`` / ``LVISResults`` /
``LVISEval`` for LVIS) on the same files, with the mask size rule made by hand (a mask result's box dropped: sized
by its mask; kept: sized by its box). No expected number is written down.

The data: a model's real detections on coco_tiny (with crowd regions) plus answers made from its ground truth (so
that the AP to reproduce is not 0), the synthetic set at Mask R-CNN density (``dense_coco_set``), results with
polygons, empty images, images without detections, a subset of images, cocoapi's fake results, no detections at
all, and an LVIS v1 file made from the synthetic set (federated lists, frequency groups, an image over the LVIS
API's 300 detections with a tie at the cap). Also: faster-coco-eval still differs from pycocotools (why it is
refused), and the command line's refusals are one line.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

import minidet
from helpers import ROOT, call_tool, config, needs_extra, one_error_line
from minidet.apps.evaluation import instances_to_coco, load_coco_annotations
from minidet.apps.scoring import (
    BACKENDS,
    LVIS_METRIC_NAMES,
    METRIC_NAMES,
    EvaluationError,
    Scorer,
    dataset_format,
    version,
)
from minidet.apps.synthetic import dense_coco_set

SHARED = ROOT.parent / "shared" / "data"
TINY = SHARED / "coco_tiny"
TINY_ANN = TINY / "annotations" / "instances_val2017.json"
FAKE = SHARED / "cocoapi_fake"
FAKE_ANN = FAKE / "instances_val2014_100.json"
TOOL = ROOT / "tools" / "eval_coco.py"
CONFIG = "configs/torchvision/maskrcnn_resnet50_fpn.yaml"
FAST = ["INPUT.MIN_SIZE_TEST", "160", "INPUT.MAX_SIZE_TEST", "320",
        "MODEL.RPN.PRE_NMS_TOPK_TEST", "300", "MODEL.RPN.POST_NMS_TOPK_TEST", "100"]
RULES = ("mask", "box")
LVIS_CAP = 300  # the LVIS API's detections per image (LVISResults' max_dets default)

needs_tiny = pytest.mark.skipif(not TINY.is_dir(), reason=f"needs ../shared/data/coco_tiny ({TINY} is absent)")
needs_fake = pytest.mark.skipif(not FAKE.is_dir(), reason=f"needs ../shared/data/cocoapi_fake ({FAKE} is absent)")
needs_hotcoco = needs_extra("hotcoco", "eval")
needs_lvis = needs_extra("lvis", "reference")
needs_fce = needs_extra("faster_coco_eval", "reference")
pytestmark = [
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The 'warn' method is deprecated:DeprecationWarning"),  # the LVIS API's logger
]


# --------------------------------------------------------------------------------------------- the references


def _silent(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` without its progress prints."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def _reference_dets(results: list[dict], iou_type: str, rule: str, to_rle) -> list[dict]:
    """The results as a reference API gets them, the mask size rule made by hand: boxes for ``bbox``; for ``segm``
    the mask alone (``mask``: the API takes the mask's area; polygons made RLE by ``to_rle``, the API's own
    rasterization), or the mask with the result's box (``box``: the API takes the box's area; a result without a box
    gets its mask's bounding box). New dicts (the APIs write into them)."""
    dets = []
    for r in results:
        d = {"image_id": r["image_id"], "category_id": r["category_id"], "score": r["score"]}
        if iou_type == "bbox":
            d["bbox"] = list(r["bbox"])
        else:
            seg = copy.deepcopy(r["segmentation"])
            if rule == "mask":
                d["segmentation"] = to_rle(r) if isinstance(seg, list) else seg
            else:
                d["segmentation"] = seg
                d["bbox"] = list(r["bbox"]) if "bbox" in r else [float(v) for v in mask_utils.toBbox(to_rle(r))]
        dets.append(d)
    return dets


def _pycocotools(ann: Path, results: list[dict], iou_type: str, rule: str = "mask",
                 image_ids=None) -> list[float]:
    """pycocotools on its own: ``COCO(ann)``, ``loadRes`` (no detections: a results API without annotations, as
    ``loadRes`` refuses an empty list), ``COCOeval`` over ``image_ids`` (default: every image); its 12 stats."""
    gt = _silent(COCO, str(ann))
    dets = _reference_dets(results, iou_type, rule, gt.annToRLE)
    if dets:
        dt = _silent(gt.loadRes, dets)
    else:
        dt = COCO()
        dt.dataset = {"images": list(gt.dataset["images"]), "categories": copy.deepcopy(gt.dataset["categories"]),
                      "annotations": []}
        _silent(dt.createIndex)
    ev = COCOeval(gt, dt, iou_type)
    if image_ids is not None:
        ev.params.imgIds = sorted(set(image_ids))
    _silent(ev.evaluate)
    _silent(ev.accumulate)
    _silent(ev.summarize)
    return [float(v) for v in ev.stats]


@contextlib.contextmanager
def _numpy_float():
    """The LVIS API 0.5.3's ``accumulate`` calls ``np.float``, an alias of the builtin ``float`` that numpy 1.24
    removed: the alias back while the reference runs (what it was: the same numbers), removed afterwards."""
    added = "float" not in np.__dict__
    if added:
        np.float = float
    try:
        yield
    finally:
        if added:
            del np.float


def _lvis_api(ann: Path, results: list[dict], iou_type: str, rule: str = "mask", max_dets: int = LVIS_CAP,
              image_ids=None) -> dict[str, float]:
    """The LVIS API on its own: ``LVIS(ann)``, ``LVISResults(max_dets=300)`` (each image's 300 best), ``LVISEval``
    run over ``image_ids`` (default: every image); ``get_results()`` in its order."""
    from lvis import LVIS, LVISEval, LVISResults

    gt = LVIS(str(ann))
    dets = _reference_dets(results, iou_type, rule, gt.ann_to_rle)
    with _numpy_float():
        ev = LVISEval(gt, LVISResults(gt, dets, max_dets=max_dets), iou_type)
        if image_ids is not None:
            ev.params.img_ids = sorted(set(image_ids))
        ev.run()
    return {k: float(v) for k, v in ev.get_results().items()}


def _assert_same(got: list[float], ref: list[float], names, what: str) -> None:
    """``got == ref`` exactly; the message names each statistic that differs, with both values in full."""
    diff = [f"{n}: {g!r} != {r!r}" for n, g, r in zip(names, got, ref) if g != r]
    assert got == ref, f"{what} differs from the reference: {'; '.join(diff) or f'{got} != {ref}'}"


def _assert_telling(stats: list[float], what: str) -> None:
    """The reference is not a degenerate one (all 0 or -1), so that equality to it says something."""
    assert any(0 < v < 1 for v in stats), f"{what}: the reference stats {stats} would prove nothing"


def _check_coco(gt: COCO, ann: Path, results: list[dict], what: str, image_ids=None, backend: str = "hotcoco",
                rules=RULES, telling: bool = True) -> dict:
    """``Scorer(gt, backend, rule)`` == pycocotools by hand, bbox and segm, under each of ``rules``; the references
    (``{"bbox": stats, ("segm", rule): stats}``)."""
    refs = {"bbox": _pycocotools(ann, results, "bbox", image_ids=image_ids)}
    for rule in rules:
        refs["segm", rule] = _pycocotools(ann, results, "segm", rule, image_ids)
        scores = Scorer(gt, backend, rule).score(results, ["bbox", "segm"], image_ids)
        assert (scores.backend, scores.format, scores.mask_area) == (backend, "coco", rule)
        for key, t in (("bbox", "bbox"), (("segm", rule), "segm")):
            if telling:
                _assert_telling(refs[key], f"{what} {t}")
            _assert_same(scores.metrics[t]["stats"], refs[key], METRIC_NAMES,
                         f"{what}: {backend} {scores.version} {t} (masks sized by their {rule})")
            assert [scores.metrics[t][k] for k in METRIC_NAMES] == refs[key]
    return refs


# ------------------------------------------------------------------------------------------------ the data


def _rle_string(rle: dict) -> dict:
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def _result(image: dict, category: int, polygons: list[list[float]], score: float, as_polygons: bool) -> dict:
    """A COCO result of the polygons (clipped to the image): its box, and its mask as RLE or as the polygons."""
    h, w = image["height"], image["width"]
    polys = []
    for p in polygons:
        xy = np.asarray(p, np.float64).reshape(-1, 2).clip(0, [w, h])
        polys.append(xy.round(2).ravel().tolist())
    rle = mask_utils.merge(mask_utils.frPyObjects(polys, h, w))
    box = [round(float(v), 2) for v in mask_utils.toBbox(rle)]
    return {"image_id": image["id"], "category_id": category, "bbox": box, "score": score,
            "segmentation": polys if as_polygons else _rle_string(rle)}


def _answers(data: dict, seed: int, per_object: int = 2, noise: int = 10, as_polygons: bool = False,
             image_ids=None) -> list[dict]:
    """Detections made from an annotation dict's ground truth: ``per_object`` jittered copies of each polygon object
    (scaled, shifted, 1 in 5 of another category), a rectangle inside each crowd region (matched to it: ignored),
    ``noise`` random ellipses per image; scores of two decimals (ties, as real results have)."""
    rng = np.random.default_rng(seed)
    cats = [c["id"] for c in data["categories"]]
    images = {im["id"]: im for im in data["images"]}
    keep = set(images) if image_ids is None else set(image_ids)
    out = []

    def score() -> float:
        return round(float(rng.uniform(0.05, 1.0)), 2)

    for a in data["annotations"]:
        image = images[a["image_id"]]
        if a["image_id"] not in keep:
            continue
        x, y, w, h = a["bbox"]
        if a.get("iscrowd"):
            x1, y1 = x + w * rng.uniform(0, 0.3), y + h * rng.uniform(0, 0.3)
            x2, y2 = x + w * rng.uniform(0.7, 1), y + h * rng.uniform(0.7, 1)
            out.append(_result(image, a["category_id"], [[x1, y1, x2, y1, x2, y2, x1, y2]], score(), as_polygons))
            continue
        cx, cy = x + w / 2, y + h / 2
        for _ in range(per_object):
            s = rng.uniform(0.8, 1.2, 2)
            dx, dy = rng.uniform(-0.15, 0.15, 2) * [w, h]
            polys = [(((np.asarray(p).reshape(-1, 2) - [cx, cy]) * s) + [cx + dx, cy + dy]).ravel().tolist()
                     for p in a["segmentation"]]
            cat = a["category_id"] if rng.uniform() > 0.2 else int(rng.choice(cats))
            out.append(_result(image, cat, polys, score(), as_polygons))
    for i in sorted(keep):
        image = images[i]
        for _ in range(noise):
            rx, ry = rng.uniform(3, image["width"] / 4), rng.uniform(3, image["height"] / 4)
            cx, cy = rng.uniform(rx, image["width"] - rx), rng.uniform(ry, image["height"] - ry)
            t = np.linspace(0, 2 * np.pi, 10, endpoint=False)
            poly = np.stack([cx + rx * np.cos(t), cy + ry * np.sin(t)], 1).ravel().tolist()
            out.append(_result(image, int(rng.choice(cats)), [poly], score(), as_polygons))
    return out


def _write(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def tiny_results(tv_file) -> tuple[list[int], list[dict]]:
    """coco_tiny's first images and its crowd images (10 in all): minidet's Predictor's detections on them
    (torchvision's Mask R-CNN with the suite's confident random weights, short side 160, up to 100 per image; AP 0 on
    the real ground truth), plus answers made from their ground truth (AP not 0)."""
    if not TINY.is_dir():
        pytest.skip(f"needs ../shared/data/coco_tiny ({TINY} is absent)")
    data = json.loads(TINY_ANN.read_text())
    ids = sorted(im["id"] for im in data["images"])
    crowd = sorted({a["image_id"] for a in data["annotations"] if a["iscrowd"]})
    chosen = sorted(set(crowd[:3]) | set(ids[:7]))[:10]
    images = {im["id"]: im for im in data["images"]}
    predictor = minidet.Predictor(config(CONFIG, *FAST, weights=tv_file))
    keep = {c["id"] for c in data["categories"]}
    results = []
    for i in chosen:
        out = predictor(cv2.imread(str(TINY / "val2017" / images[i]["file_name"])))
        results += instances_to_coco(i, out, keep=keep)[0]
    assert len(results) > 10 * len(chosen), "the model should detect things (about 100 per image)"
    return chosen, results + _answers(data, seed=1, image_ids=chosen)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, list[dict]]:
    """``dense_coco_set(60, 100)``: its annotation file and results (polygon ground truth, crowd RLE regions every
    10th image, no objects every 20th, 100 detections per image)."""
    data, results = dense_coco_set(60, 100, seed=5)
    return _write(tmp_path_factory.mktemp("synthetic") / "ann.json", data), results


@pytest.fixture(scope="module")
def synthetic_refs(synthetic) -> dict:
    """pycocotools by hand on the synthetic set: bbox, and segm under each mask rule."""
    ann, results = synthetic
    refs = {"bbox": _pycocotools(ann, results, "bbox")}
    for rule in RULES:
        refs["segm", rule] = _pycocotools(ann, results, "segm", rule)
    return refs


def _mixed_set(tmp_path: Path) -> tuple[Path, dict, list[dict]]:
    """A small synthetic set whose results mix RLE masks and polygons: the set's own results on every 3rd image,
    polygon answers on the next, both on the one after; no detections on every 7th image (images without
    detections), while the images without objects (every 20th) have some; crowd regions every 10th."""
    data, own = dense_coco_set(40, 20, seed=7)
    answers = _answers(data, seed=2, noise=3, as_polygons=True)
    results = [r for r in own if r["image_id"] % 3 != 1] + [r for r in answers if r["image_id"] % 3 != 0]
    results = [r for r in results if r["image_id"] % 7 != 0]
    assert any(isinstance(r["segmentation"], list) for r in results)
    assert any(isinstance(r["segmentation"], dict) for r in results)
    return _write(tmp_path / "mixed.json", data), data, results


# ------------------------------------------------------------------------------------ hotcoco == pycocotools


@pytest.mark.slow
@needs_hotcoco
@needs_tiny
def test_hotcoco_equals_pycocotools_on_a_models_results_on_coco_tiny(tiny_results):
    """On a model's real detections (plus ground-truth answers) on 10 coco_tiny images with crowd regions, hotcoco's
    12 bbox and 12 segm stats are pycocotools' exactly, masks sized by their mask and by their box."""
    ids, results = tiny_results
    gt = load_coco_annotations(str(TINY_ANN))
    _check_coco(gt, TINY_ANN, results, "coco_tiny", image_ids=ids)


@needs_hotcoco
def test_hotcoco_equals_pycocotools_on_the_synthetic_set(synthetic, synthetic_refs):
    """On the synthetic set at Mask R-CNN density (60 images x 100 detections), hotcoco's stats are pycocotools'
    exactly, bbox and segm, under both mask rules."""
    ann, results = synthetic
    gt = load_coco_annotations(str(ann))
    for rule in RULES:
        scores = Scorer(gt, "hotcoco", rule).score(results, ["bbox", "segm"])
        for key, t in (("bbox", "bbox"), (("segm", rule), "segm")):
            _assert_telling(synthetic_refs[key], f"synthetic {t}")
            _assert_same(scores.metrics[t]["stats"], synthetic_refs[key], METRIC_NAMES,
                         f"synthetic set: hotcoco {scores.version} {t} (masks sized by their {rule})")


@needs_hotcoco
def test_hotcoco_equals_pycocotools_with_polygons_empty_images_crowds_and_a_subset(tmp_path):
    """Results mixing polygons and RLE, images without objects, images without detections and crowd regions: hotcoco
    == pycocotools over every image and over the images with detections only, under both mask rules (pycocotools
    rasterizes the polygons itself where the box is kept)."""
    ann, data, results = _mixed_set(tmp_path)
    gt = load_coco_annotations(str(ann))
    with_dets = {r["image_id"] for r in results}
    assert any(i % 20 == 0 for i in with_dets) and len(with_dets) < len(data["images"])
    assert any(a["iscrowd"] for a in data["annotations"] if a["image_id"] in with_dets)
    before = copy.deepcopy(results)
    _check_coco(gt, ann, results, "mixed set, every image")
    _check_coco(gt, ann, results, "mixed set, images with detections", image_ids=with_dets)
    assert results == before  # the scorer converts copies


@needs_hotcoco
def test_the_command_line_only_result_images_hotcoco_equals_pycocotools(tmp_path, capfd):
    """``minidet eval --results --only-result-images``: metrics.json's stats under ``--backend hotcoco`` and under
    ``--backend auto`` (which takes hotcoco) are those of ``--backend pycocotools``, which are pycocotools' by hand
    over the images with detections."""
    ann, _, results = _mixed_set(tmp_path)
    res = _write(tmp_path / "results.json", results)
    metrics = {}
    for backend in ("pycocotools", "hotcoco", "auto"):
        out = tmp_path / backend
        r = call_tool(TOOL, "--ann", str(ann), "--results", str(res), "--output", str(out), "--only-result-images",
                      "--backend", backend, capture=capfd, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "--only-result-images" in r.stderr  # the coverage line: only those images are evaluated
        metrics[backend] = json.loads((out / "metrics.json").read_text())
        assert set(metrics[backend]) == {"bbox", "segm", "scoring"}
    ids = {r["image_id"] for r in results}
    ref = {"bbox": _pycocotools(ann, results, "bbox", image_ids=ids),
           "segm": _pycocotools(ann, results, "segm", "mask", ids)}
    for backend, m in metrics.items():
        for t in ("bbox", "segm"):
            _assert_same(m[t]["stats"], ref[t], METRIC_NAMES, f"minidet eval --backend {backend} {t}")
        assert m["scoring"]["format"] == "coco" and m["scoring"]["mask_area"] == "mask"
    assert metrics["pycocotools"]["scoring"]["backend"] == "pycocotools"
    assert metrics["hotcoco"]["scoring"] == metrics["auto"]["scoring"]
    assert metrics["auto"]["scoring"]["backend"] == "hotcoco"  # auto takes hotcoco where it is installed


@needs_hotcoco
@needs_fake
def test_hotcoco_equals_pycocotools_on_cocoapi_fake():
    """On cocoapi's own fake results (100 val2014 images), hotcoco == pycocotools: the bbox file's stats, and the segm
    file's (masks without boxes: the box rule takes their bounding box) under both mask rules."""
    gt = load_coco_annotations(str(FAKE_ANN))
    for t in ("bbox", "segm"):
        results = json.loads((FAKE / f"instances_val2014_fake{t}100_results.json").read_text())
        for rule in RULES if t == "segm" else ("mask",):
            ref = _pycocotools(FAKE_ANN, results, t, rule)
            _assert_telling(ref, f"cocoapi_fake {t}")
            got = Scorer(gt, "hotcoco", rule).score(results, [t]).metrics[t]["stats"]
            _assert_same(got, ref, METRIC_NAMES, f"cocoapi_fake: hotcoco {t} (masks sized by their {rule})")


@needs_hotcoco
def test_no_detections_at_all_hotcoco_equals_pycocotools(tmp_path):
    """An empty results list: hotcoco's stats are pycocotools' (a results API without annotations), bbox and segm,
    both mask rules, over every image and over a subset."""
    ann, data, _ = _mixed_set(tmp_path)
    gt = load_coco_annotations(str(ann))
    _check_coco(gt, ann, [], "no detections", telling=False)
    _check_coco(gt, ann, [], "no detections, 5 images", image_ids=[1, 2, 3, 20, 21], telling=False)


@needs_hotcoco
def test_hotcoco_equals_pycocotools_at_the_100_cap_with_ties_and_odd_results(tmp_path):
    """COCOeval keeps each image's 100 best detections per category: 150 of one category on one image with 40 tied
    at the cap give pycocotools' stats in hotcoco, in file order and reversed (which pycocotools scores otherwise);
    so do empty masks, zero-size and out-of-image boxes, duplicates and a category the file lacks."""
    data, own = dense_coco_set(10, 20, seed=3)
    ann = _write(tmp_path / "ann.json", data)
    gt = load_coco_annotations(str(ann))
    rng = np.random.default_rng(0)
    busy = max(range(1, 11), key=lambda i: sum(a["image_id"] == i and not a["iscrowd"] for a in data["annotations"]))
    objects = [a for a in data["annotations"] if a["image_id"] == busy and not a["iscrowd"]]
    cat = objects[0]["category_id"]
    many = _answers({**data, "annotations": objects}, seed=0, per_object=30, noise=0, image_ids=[busy])[:150]
    assert len(many) == 150
    scores = np.concatenate([rng.uniform(0.6, 1, 80).round(3) + 1e-3, np.full(40, 0.5), rng.uniform(0, 0.4, 30)])
    rng.shuffle(scores)
    many = [{**r, "category_id": cat, "score": float(s)} for r, s in zip(many, scores)]
    in_order = _check_coco(gt, ann, own + many, "150 detections of a category on one image")
    reversed_ = _check_coco(gt, ann, own + many[::-1], "the same, reversed")
    assert in_order != reversed_, "the order of the detections tied at the cap should matter"
    h, w = data["images"][0]["height"], data["images"][0]["width"]
    empty = _rle_string(mask_utils.encode(np.zeros((h, w, 1), np.uint8, order="F"))[0])
    odd = [
        {"image_id": 1, "category_id": own[0]["category_id"], "bbox": [10, 10, 0, 0], "score": 0.9,
         "segmentation": empty},
        {"image_id": 2, "category_id": own[0]["category_id"], "bbox": [5, 5, 0, 20], "score": 0.95,
         "segmentation": empty},
        {**own[0], "bbox": [100.3, 100.2, 0.4, 0.5], "score": 0.97},
        {**own[1], "bbox": [-50, -50, 1000, 1000], "score": 0.98},
        {**own[2], "category_id": 999, "score": 0.99},  # not a category of the file: never matched
    ]
    _check_coco(gt, ann, own + own[:50] + odd, "odd results and duplicates")


def test_the_pycocotools_backend_equals_pycocotools_by_hand(tmp_path):
    """``Scorer(gt, "pycocotools", rule)`` is pycocotools by hand with the rule made by hand (the box dropped from mask
    results, or kept), on the mixed set (polygons, empty images, crowds), every image and a subset."""
    ann, _, results = _mixed_set(tmp_path)
    gt = load_coco_annotations(str(ann))
    _check_coco(gt, ann, results, "mixed set", backend="pycocotools")
    _check_coco(gt, ann, results, "mixed set, 10 images", image_ids=range(1, 11), backend="pycocotools")


# ------------------------------------------------------------------------------------------- the mask rule


def test_the_mask_rule_changes_the_mask_ap_by_size(synthetic, synthetic_refs):
    """On the synthetic set the box rule gives other segm APs/APm/APl than the mask rule (the option does
    something; AP, AP50, AP75 over all sizes are the same), and pycocotools' backend under each rule is pycocotools
    by hand on results with the box dropped (mask) or kept (box)."""
    ann, results = synthetic
    by_mask, by_box = synthetic_refs["segm", "mask"], synthetic_refs["segm", "box"]
    assert by_mask[:3] == by_box[:3]
    assert by_mask[3:6] != by_box[3:6], "the box rule should change the segm AP by size on the synthetic set"
    assert all(a != b for a, b in zip(by_mask[3:6], by_box[3:6])), (by_mask[3:6], by_box[3:6])
    gt = load_coco_annotations(str(ann))
    for rule in RULES:
        got = Scorer(gt, "pycocotools", rule).score(results, ["segm"]).metrics["segm"]["stats"]
        _assert_same(got, synthetic_refs["segm", rule], METRIC_NAMES, f"pycocotools backend, masks by their {rule}")


# ---------------------------------------------------------------------------------------- faster-coco-eval


@needs_fce
@needs_fake
def test_faster_coco_eval_still_differs_from_pycocotools():
    """faster-coco-eval's precision on cocoapi's fake results is not pycocotools' (its precision has no epsilon): the
    reason minidet refuses it. The day a release is equal this fails, and the refusal can be lifted."""
    import faster_coco_eval

    for t in ("bbox", "segm"):
        res = str(FAKE / f"instances_val2014_fake{t}100_results.json")
        gt = _silent(COCO, str(FAKE_ANN))
        ev = COCOeval(gt, _silent(gt.loadRes, res), t)
        fgt = _silent(faster_coco_eval.COCO, str(FAKE_ANN))
        fev = faster_coco_eval.COCOeval_faster(fgt, _silent(fgt.loadRes, res), t)
        for e in (ev, fev):
            _silent(e.evaluate)
            _silent(e.accumulate)
            _silent(e.summarize)
        ours, theirs = ev.eval["precision"], np.asarray(fev.eval["precision"])
        assert ours.shape == theirs.shape
        assert not np.array_equal(ours, theirs), (
            f"faster-coco-eval {faster_coco_eval.__version__} now gives pycocotools' {t} precision on cocoapi_fake: "
            "check its stats on the other sets here and lift its refusal in minidet.apps.scoring.BACKENDS")


def test_faster_coco_eval_is_refused_in_one_line(tmp_path, capfd):
    """``Scorer(gt, "faster-coco-eval")`` raises an EvaluationError of one line naming the reason, and ``minidet eval
    --backend faster-coco-eval`` exits with status 2 and one ``error:`` line saying it."""
    data, results = dense_coco_set(3, 5, seed=1)
    ann, res = _write(tmp_path / "ann.json", data), _write(tmp_path / "res.json", results)
    gt = load_coco_annotations(str(ann))
    with pytest.raises(EvaluationError) as err:
        Scorer(gt, "faster-coco-eval")
    text = str(err.value)
    assert "\n" not in text and "faster-coco-eval" in text and "epsilon" in text
    r = call_tool(TOOL, "--ann", str(ann), "--results", str(res), "--output", str(tmp_path / "out"),
                  "--backend", "faster-coco-eval", capture=capfd, cwd=tmp_path)
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert "--backend faster-coco-eval" in line and "epsilon" in line
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_auto_without_hotcoco_takes_pycocotools(tmp_path, capfd, monkeypatch):
    """With hotcoco not importable, ``auto`` scores COCO with pycocotools, and ``--backend hotcoco`` is one line
    (status 2) saying how to install it."""
    monkeypatch.setitem(sys.modules, "hotcoco", None)  # import hotcoco: ImportError
    data, results = dense_coco_set(3, 5, seed=1)
    ann, res = _write(tmp_path / "ann.json", data), _write(tmp_path / "res.json", results)
    gt = load_coco_annotations(str(ann))
    assert Scorer(gt).backend.name == "pycocotools"
    with pytest.raises(EvaluationError, match=r"hotcoco is not installed: pip install 'minidet\[eval\]'"):
        Scorer(gt, "hotcoco")
    r = call_tool(TOOL, "--ann", str(ann), "--results", str(res), "--output", str(tmp_path / "out"),
                  "--backend", "hotcoco", capture=capfd, cwd=tmp_path)
    assert r.returncode == 2 and "minidet[eval]" in one_error_line(r.stderr)


# --------------------------------------------------------------------------------------------------- LVIS


def _lvis_url(image_id: int) -> str:
    return f"http://images.cocodataset.org/val2017/{image_id:012d}.jpg"


def _lvis_set(seed: int = 11) -> tuple[dict, list[dict], int]:
    """An LVIS v1 annotation dict made from the synthetic set, and results: images with ``coco_url`` and no
    ``file_name``; ``neg_category_ids`` (8 categories absent from the image), ``not_exhaustive_category_ids`` (every
    third present category); no crowd, no ``iscrowd``; categories with ``frequency`` r/c/f, ``image_count`` and
    ``instance_count``. The image with the most objects gets 250 more detections (350: over the 300 cap), 40 of them
    tied at the cap's score, in file order. Returns (annotations, results, that image's id)."""
    data, results = dense_coco_set(40, 100, seed=seed)
    rng = np.random.default_rng(seed)
    anns = [{k: v for k, v in a.items() if k != "iscrowd"} for a in data["annotations"] if not a["iscrowd"]]
    present: dict[int, set[int]] = {}
    for a in anns:
        present.setdefault(a["image_id"], set()).add(a["category_id"])
    cat_ids = [c["id"] for c in data["categories"]]
    images = []
    for im in data["images"]:
        here = sorted(present.get(im["id"], ()))
        absent = sorted(set(cat_ids) - set(here))
        images.append({"id": im["id"], "height": im["height"], "width": im["width"], "coco_url": _lvis_url(im["id"]),
                       "not_exhaustive_category_ids": here[::3],
                       "neg_category_ids": sorted(int(c) for c in rng.choice(absent, 8, replace=False))})
    categories = [{**c, "frequency": "rcf"[c["id"] % 3],
                   "image_count": len({a["image_id"] for a in anns if a["category_id"] == c["id"]}),
                   "instance_count": sum(a["category_id"] == c["id"] for a in anns)} for c in data["categories"]]
    lvis = {"info": {"description": "LVIS v1 shape, made from minidet's synthetic set"}, "images": images,
            "annotations": anns, "categories": categories}
    # the crowded image: 350 detections; scores: 280 above 0.5, 40 at 0.5 (the cap cuts this tie), 30 below
    busy = max(present, key=lambda i: len(present[i]))
    near = _answers(lvis, seed, per_object=20, noise=0, image_ids=[busy])[:200]  # 1 in 5 of another category
    neg = next(im for im in images if im["id"] == busy)["neg_category_ids"]
    anywhere = _answers({**lvis, "annotations": []}, seed, noise=50, image_ids=[busy])
    extra = near + [{**r, "category_id": neg[k % len(neg)]} for k, r in enumerate(anywhere)]  # negatives: FPs
    mine = [r for r in results if r["image_id"] == busy] + extra
    assert len(mine) == 350
    scores = np.concatenate([rng.uniform(0.5, 1.0, 280).round(4) + 1e-4, np.full(40, 0.5),
                             rng.uniform(0.01, 0.5, 30).round(4) - 1e-4])
    rng.shuffle(scores)
    mine = [{**r, "score": float(s)} for r, s in zip(mine, scores)]
    others = [r for r in results if r["image_id"] != busy]
    return lvis, others[: len(others) // 2] + mine + others[len(others) // 2:], busy


@pytest.fixture(scope="module")
def lvis_set(tmp_path_factory) -> tuple[Path, list[dict], int]:
    """The LVIS file written (see ``_lvis_set``), its results, the image over the cap."""
    data, results, busy = _lvis_set()
    return _write(tmp_path_factory.mktemp("lvis") / "lvis_v1.json", data), results, busy


@pytest.fixture(scope="module")
def lvis_refs(lvis_set) -> dict:
    """The LVIS API by hand on the LVIS file: bbox, and segm under each mask rule."""
    ann, results, _ = lvis_set
    refs = {"bbox": _lvis_api(ann, results, "bbox")}
    for rule in RULES:
        refs["segm", rule] = _lvis_api(ann, results, "segm", rule)
    return refs


def test_an_lvis_file_is_recognized_and_read(lvis_set):
    """An LVIS v1 file is ``lvis`` (its COCO counterpart ``coco``), and load_coco_annotations reads it: annotations
    without ``iscrowd``, each image's ``file_name`` from its ``coco_url`` (``val2017/000000000139.jpg``)."""
    ann, _, _ = lvis_set
    data = json.loads(ann.read_text())
    assert dataset_format(data) == "lvis"
    assert dataset_format({**data, "images": [{"id": 1, "file_name": "a.jpg", "height": 1, "width": 1}]}) == "lvis"
    coco, _ = dense_coco_set(2, 1, seed=0)
    assert dataset_format(coco) == "coco"
    assert all("file_name" not in im for im in data["images"])
    assert all("iscrowd" not in a for a in data["annotations"])
    data["images"][0]["coco_url"] = _lvis_url(139)
    gt = load_coco_annotations(str(_write(ann.with_name("lvis_139.json"), data)))
    first = data["images"][0]["id"]
    assert gt.imgs[first]["file_name"] == "val2017/000000000139.jpg"
    assert all(gt.imgs[im["id"]]["file_name"] == f"val2017/{im['id']:012d}.jpg" for im in data["images"][1:])


@needs_hotcoco
@needs_lvis
def test_hotcoco_lvis_equals_the_lvis_api(lvis_set, lvis_refs):
    """hotcoco's LVIS scoring (federated rules, 300 detections per image with the tie at the cap in file order) is
    the LVIS API's exactly: the 13 results for boxes and for masks under both mask rules, also with the tie
    reversed and over half of the images; the image over the cap matters (without the cap, or with the tie in
    another order, the LVIS API says otherwise)."""
    ann, results, busy = lvis_set
    assert sum(r["image_id"] == busy for r in results) > LVIS_CAP
    gt = load_coco_annotations(str(ann))
    for rule in RULES:
        scores = Scorer(gt, "hotcoco", rule).score(results, ["bbox", "segm"])
        assert (scores.format, scores.mask_area) == ("lvis", rule)
        for key, t in (("bbox", "bbox"), (("segm", rule), "segm")):
            ref = lvis_refs[key]
            assert tuple(ref) == LVIS_METRIC_NAMES
            _assert_telling(list(ref.values()), f"LVIS {t}")
            _assert_same(scores.metrics[t]["stats"], list(ref.values()), LVIS_METRIC_NAMES,
                         f"LVIS: hotcoco {scores.version} {t} (masks sized by their {rule})")
            assert {k: scores.metrics[t][k] for k in LVIS_METRIC_NAMES} == ref
    assert lvis_refs["segm", "mask"] != lvis_refs["segm", "box"]
    uncapped = _lvis_api(ann, results, "bbox", max_dets=-1)
    assert uncapped != lvis_refs["bbox"], "the image over 300 detections should change the LVIS API's results"
    # the tie at the cap: the same results with the tied detections in reverse order keep others (file order)
    ties = [k for k, r in enumerate(results) if r["image_id"] == busy and r["score"] == 0.5]
    reordered = list(results)
    for k, j in zip(ties, reversed(ties)):
        reordered[k] = results[j]
    ref = _lvis_api(ann, reordered, "bbox")
    assert ref != lvis_refs["bbox"], "the order of the detections tied at the cap should matter"
    got = Scorer(gt, "hotcoco").score(reordered, ["bbox"]).metrics["bbox"]["stats"]
    _assert_same(got, list(ref.values()), LVIS_METRIC_NAMES, "LVIS: hotcoco bbox, the tie at the cap reversed")
    # a subset of the images (as --only-result-images), the busy one among them
    ids = [i for i in sorted(gt.getImgIds()) if i % 2 == busy % 2]
    for t in ("bbox", "segm"):
        ref = _lvis_api(ann, results, t, image_ids=ids)
        got = Scorer(gt, "hotcoco").score(results, [t], ids).metrics[t]["stats"]
        _assert_same(got, list(ref.values()), LVIS_METRIC_NAMES, f"LVIS: hotcoco {t}, half of the images")


@needs_lvis
def test_the_lvis_backend_equals_the_lvis_api(lvis_set, lvis_refs):
    """``Scorer(gt, "lvis", rule)`` (the LVIS API as minidet drives it, on the validated file) gives what the LVIS API
    run by hand gives, boxes and masks under both mask rules."""
    ann, results, _ = lvis_set
    gt = load_coco_annotations(str(ann))
    for rule in RULES:
        scores = Scorer(gt, "lvis", rule).score(results, ["bbox", "segm"])
        for key, t in (("bbox", "bbox"), (("segm", rule), "segm")):
            _assert_same(scores.metrics[t]["stats"], list(lvis_refs[key].values()), LVIS_METRIC_NAMES,
                         f"LVIS: the lvis backend {t} (masks sized by their {rule})")


@needs_hotcoco
@needs_lvis
def test_the_command_line_on_an_lvis_file(lvis_set, lvis_refs, tmp_path, capfd):
    """``minidet eval`` on an LVIS file: metrics.json has LVIS's 13 results per IoU type (the LVIS API's), scoring
    format ``lvis``; ``--backend pycocotools`` is refused with one ``error:`` line (status 2)."""
    ann, results, _ = lvis_set
    res = _write(tmp_path / "results.json", results)
    r = call_tool(TOOL, "--ann", str(ann), "--results", str(res), "--output", str(tmp_path / "out"),
                  capture=capfd, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert set(metrics) == {"bbox", "segm", "scoring"}
    for t, key in (("bbox", "bbox"), ("segm", ("segm", "mask"))):
        assert list(metrics[t]) == ["stats", *LVIS_METRIC_NAMES]
        assert LVIS_METRIC_NAMES[-1] == "ARl@300" and {"APr", "APc", "APf"} <= set(metrics[t])
        _assert_same(metrics[t]["stats"], list(lvis_refs[key].values()), LVIS_METRIC_NAMES, f"minidet eval LVIS {t}")
    assert metrics["scoring"]["format"] == "lvis" and metrics["scoring"]["mask_area"] == "mask"
    assert metrics["scoring"]["backend"] == "hotcoco"


def test_pycocotools_is_refused_on_an_lvis_file(lvis_set, tmp_path, capfd):
    """``--backend pycocotools`` on an LVIS file: status 2, one ``error:`` line saying it scores COCO only."""
    ann, results, _ = lvis_set
    res = _write(tmp_path / "results.json", results[:50])
    r = call_tool(TOOL, "--ann", str(ann), "--results", str(res), "--output", str(tmp_path / "out"),
                  "--backend", "pycocotools", capture=capfd, cwd=tmp_path)
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert "--backend pycocotools does not score LVIS annotations" in line
    gt = load_coco_annotations(str(ann))
    with pytest.raises(EvaluationError, match="does not score LVIS"):
        Scorer(gt, "pycocotools")


# ------------------------------------------------------------- issue 56: ground truth read alike for every backend


def _small_set(seed: int = 3) -> tuple[dict, list[dict]]:
    """A small synthetic COCO set (8 images of 480 x 640, polygons, crowd RLE) and its results."""
    return dense_coco_set(8, 30, seed=seed)


def _installed(*backends: str) -> list[str]:
    """Those of ``backends`` that can be imported here (hotcoco is the ``eval`` extra's)."""
    return [b for b in backends if version(BACKENDS[b])]


def _first_polygon(data: dict) -> int:
    """The index of the first annotation with polygons (not a crowd)."""
    return next(i for i, a in enumerate(data["annotations"]) if isinstance(a["segmentation"], list) and a["area"])


# each a change to one polygon annotation of the 480 x 640 images, and what the one line says of it
BAD_GT = {
    "polygon far outside": ({"segmentation": [[5, 5, 1e5, 5, 1e5, 1e5]]}, "lies outside the image extended by its "
                            "size on each side (x in [-640, 1280], y in [-480, 960])"),
    "7-number polygon": ({"segmentation": [[5, 5, 25, 5, 25, 25, 5]]}, "an even count"),
    "one-point polygon": ({"segmentation": [[5, 5]]}, "at least 3 points"),
    "two-point polygon": ({"segmentation": [[5, 5, 25, 25]]}, "at least 3 points"),
    "polygon with NaN": ({"segmentation": [[5, 5, 25, float("nan"), 25, 25]]}, "finite numbers"),
    "RLE of another size": ({"segmentation": {"size": [10, 10], "counts": "0:"}},
                            "segmentation size [10, 10] is not the image's [height, width] [480, 640]"),
    "garbage counts": ({"segmentation": {"size": [480, 640], "counts": "zzzz"}}, "is not a compressed COCO RLE"),
    "short counts": ({"segmentation": {"size": [480, 640], "counts": "P1"}}, "do not decode to the image's"),
    "empty counts": ({"segmentation": {"size": [480, 640], "counts": ""}}, "(runs covering 0 pixels)"),
    "counts list of another total": ({"segmentation": {"size": [480, 640], "counts": [5, 6]}},
                                     "non-negative integers summing to H*W"),
    "negative area": ({"area": -5.0}, "'area' must be a finite number >= 0, got -5.0"),
    "negative width": ({"bbox": [5, 5, -1, 20]}, "'bbox' must be [x, y, width, height] with width, height >= 0"),
    "iscrowd 2": ({"iscrowd": 2}, "'iscrowd' must be 0 or 1, got 2"),
}


@pytest.mark.parametrize("case", list(BAD_GT))
def test_bad_ground_truth_is_refused_alike_by_every_backend(case, tmp_path, capfd):
    """A broken annotation is refused in one line naming the file and ``annotations[i] (id ...)`` before any backend
    runs: the same line whatever ``--backend`` (before, pycocotools and hotcoco scored most of these silently, or
    one of them failed with a line that names nothing)."""
    data, results = _small_set()
    i = _first_polygon(data)
    change, says = BAD_GT[case]
    data["annotations"][i].update(change)
    ann, res = _write(tmp_path / "gt.json", data), _write(tmp_path / "r.json", results)
    lines = set()
    for backend in _installed("pycocotools", "hotcoco"):
        r = call_tool(TOOL, "--ann", str(ann), "--results", str(res), "--output", str(tmp_path / backend),
                      "--backend", backend, capture=capfd, cwd=tmp_path)
        lines.add(one_error_line(r.stderr))
        assert r.returncode == 2 and not (tmp_path / backend / "metrics.json").exists()
    (line,) = lines
    assert line.startswith(f"error: {ann}: annotations[{i}]: ") and says in line
    assert line.endswith(f" (annotation id {data['annotations'][i]['id']})")


@needs_hotcoco
@needs_lvis
@pytest.mark.parametrize("case", ["polygon far outside", "7-number polygon", "RLE of another size", "negative area"])
def test_bad_lvis_ground_truth_is_refused_alike_by_hotcoco_and_the_lvis_api(case, tmp_path):
    data, _, _ = _lvis_set()
    i = _first_polygon(data)
    change, says = BAD_GT[case]
    data["annotations"][i].update(change)
    ann = _write(tmp_path / "lvis.json", data)
    with pytest.raises(EvaluationError) as err:
        load_coco_annotations(str(ann))
    line = str(err.value)
    assert line.startswith(f"{ann}: annotations[{i}]: ") and says in line
    assert line.endswith(f" (annotation id {data['annotations'][i]['id']})")


@needs_hotcoco
def test_borderline_ground_truth_scores_alike_on_every_backend(tmp_path):
    """What a COCO file may hold and pycocotools rasterizes as it is (``_reach_outside``: a polygon past the image's
    edge, clipped; an area of 0; a polygon at the extended image's corners) and a crowd region given as polygons:
    accepted, and hotcoco == pycocotools by hand, bbox and segm under both mask rules (the set's crowd regions are
    uncompressed RLE)."""
    data, results = _small_set()
    _reach_outside(data)
    crowd = [a for a in data["annotations"] if isinstance(a["segmentation"], list) and a["area"]][3]
    crowd["iscrowd"] = 1
    ann = _write(tmp_path / "gt.json", data)
    gt = load_coco_annotations(str(ann))
    _check_coco(gt, ann, results, "borderline ground truth")
    _check_coco(gt, ann, results, "borderline ground truth", backend="pycocotools", rules=("mask",))


def _reach_outside(data: dict) -> None:
    """Borderline ground truth in place: the first polygon annotation reaches 12.5 pixels past the image's left edge,
    the second has an area of 0, the third a second polygon at the corners of the image extended by its size."""
    polys = [a for a in data["annotations"] if isinstance(a["segmentation"], list) and a["area"]]
    a, b, c = polys[:3]
    x, y, w, h = a["bbox"]
    a["segmentation"] = [[-12.5, y, x + w, y, x + w, y + h, -12.5, y + h]]
    b["area"] = 0
    im = next(m for m in data["images"] if m["id"] == c["image_id"])
    wd, ht = im["width"], im["height"]
    c["segmentation"] = [c["segmentation"][0], [-wd, -ht, 2 * wd, -ht, 2 * wd, 2 * ht]]


@pytest.mark.slow
@needs_hotcoco
@needs_lvis
def test_borderline_lvis_ground_truth_scores_alike_on_hotcoco_and_the_lvis_api(tmp_path):
    """The borderline cases of an LVIS file (a polygon past the image's edge, an area of 0, a polygon at the extended
    image's corners) are read, and hotcoco == the LVIS API by hand; an empty polygon list is a box-only annotation
    for both (the LVIS API failed on it with an IndexError, hotcoco took an empty mask)."""
    data, results, _ = _lvis_set()
    _reach_outside(data)
    ann = _write(tmp_path / "lvis.json", data)
    gt = load_coco_annotations(str(ann))
    for t in ("bbox", "segm"):
        ref = _lvis_api(ann, results, t)
        _assert_telling(list(ref.values()), f"borderline LVIS {t}")
        for backend in ("hotcoco", "lvis"):
            _assert_same(Scorer(gt, backend).score(results, [t]).metrics[t]["stats"], list(ref.values()),
                         LVIS_METRIC_NAMES, f"borderline LVIS: {backend} {t}")
    data["annotations"][5]["segmentation"] = []
    gt = load_coco_annotations(str(_write(tmp_path / "lvis_empty.json", data)))
    for backend in ("hotcoco", "lvis"):
        with pytest.raises(EvaluationError, match=r"has no segmentation \(an empty polygon list\)"):
            Scorer(gt, backend).score(results, ["segm"])


@pytest.mark.slow
@needs_hotcoco
@needs_lvis
def test_lvis_detections_of_area_0_score_alike_on_hotcoco_and_the_lvis_api(lvis_set):
    """Detections of area 0 (a box of width 0; an empty mask), some on the image over the 300 cap: the LVIS API keeps
    them in its cap and leaves them out afterwards, hotcoco kept them; now hotcoco == the LVIS API by hand, boxes and
    masks under both mask rules."""
    ann, results, busy = lvis_set
    results = copy.deepcopy(results)
    mine = [r for r in results if r["image_id"] == busy]
    h, w = mine[0]["segmentation"]["size"]
    empty = mask_utils.encode(np.zeros((h, w, 1), np.uint8, order="F"))[0]["counts"].decode()
    for r in mine[:40:2] + [r for r in results if r["image_id"] != busy][:30:3]:
        r["bbox"][2] = 0.0
        r["segmentation"] = {"size": [h, w], "counts": empty}
    gt = load_coco_annotations(str(ann))
    for rule in RULES:
        scores = Scorer(gt, "hotcoco", rule).score(results, ["bbox", "segm"])
        for t in ("bbox", "segm"):
            ref = _lvis_api(ann, results, t, rule)
            _assert_same(scores.metrics[t]["stats"], list(ref.values()), LVIS_METRIC_NAMES,
                         f"LVIS with detections of area 0: hotcoco {t} (masks sized by their {rule})")


def test_an_empty_polygon_list_is_a_box_only_annotation(tmp_path):
    """``"segmentation": []`` (box-only datasets write it) is read: boxes score alike on pycocotools and hotcoco;
    masks are refused in one line by both (pycocotools failed with an IndexError, hotcoco took an empty mask)."""
    data, results = _small_set()
    i = _first_polygon(data)
    data["annotations"][i]["segmentation"] = []
    ann = _write(tmp_path / "gt.json", data)
    gt = load_coco_annotations(str(ann))
    ref = _pycocotools(ann, results, "bbox")
    for backend in _installed("pycocotools", "hotcoco"):
        _assert_same(Scorer(gt, backend).score(results, ["bbox"]).metrics["bbox"]["stats"], ref, METRIC_NAMES,
                     f"{backend} bbox with an empty polygon list")
        with pytest.raises(EvaluationError) as err:
            Scorer(gt, backend, source=str(ann)).score(results, ["segm"])
        assert str(err.value) == (f"{ann}: annotations[{i}] (id {data['annotations'][i]['id']}) has no segmentation "
                                  "(an empty polygon list); cannot evaluate masks")


def test_lvis_is_told_from_the_whole_file(lvis_set, tmp_path):
    """An LVIS file is LVIS whatever its first image holds; one that mixes images with and without LVIS's lists is
    refused naming the first image that lacks them (index and id); a category ``frequency`` outside r/c/f too."""
    ann, _, _ = lvis_set
    data = json.loads(ann.read_text())
    plain = [{k: v for k, v in im.items() if k not in ("neg_category_ids", "not_exhaustive_category_ids")}
             for im in data["images"]]
    coco_cats = [{k: v for k, v in c.items() if k != "frequency"} for c in data["categories"]]
    mixed = {**data, "images": plain[:3] + data["images"][3:], "categories": coco_cats}
    assert dataset_format(mixed) == "lvis"
    path = _write(tmp_path / "mixed.json", mixed)
    with pytest.raises(EvaluationError) as err:
        load_coco_annotations(str(path))
    assert str(err.value) == (f"{path}: images[0] (id {plain[0]['id']}) has no 'neg_category_ids' list, which every "
                              "image of an LVIS file needs (the file is LVIS: images[3] has LVIS's lists)")
    half = {**data, "images": data["images"][:3] + [{**plain[3], "neg_category_ids": []}] + data["images"][4:]}
    path = _write(tmp_path / "half.json", half)
    with pytest.raises(EvaluationError, match=r"images\[3\] \(id \d+\) has no 'not_exhaustive_category_ids' list"):
        load_coco_annotations(str(path))
    odd = copy.deepcopy(data)
    odd["categories"][2]["frequency"] = "x"
    path = _write(tmp_path / "odd.json", odd)
    with pytest.raises(EvaluationError) as err:
        load_coco_annotations(str(path))
    assert str(err.value) == (f"{path}: categories[2] (id {odd['categories'][2]['id']}): 'frequency' must be 'r', "
                              "'c' or 'f' (LVIS's rare, common, frequent), got 'x'")


@pytest.mark.slow
@needs_lvis
def test_the_lvis_backend_names_the_module_that_failed_to_import(lvis_set, tmp_path):
    """``--backend lvis`` where the LVIS API is installed but matplotlib (which it imports) is not: one line naming
    matplotlib, not the LVIS API's install hint; ``auto`` without hotcoco either says what each backend lacks."""
    import subprocess

    ann, results, _ = lvis_set
    res = _write(tmp_path / "r.json", results[:20])
    lvis = ("lvis cannot be imported: No module named 'matplotlib.pyplot'; 'matplotlib' is not a package (lvis needs "
            "the module 'matplotlib': pip install matplotlib)")
    cases = {("lvis", "matplotlib"): f"error: --backend {lvis}",
             ("auto", "matplotlib,hotcoco"): "error: no backend for LVIS annotations can be used: hotcoco is not "
                                             f"installed: pip install 'minidet[eval]'; {lvis}"}
    for (backend, hidden), line in cases.items():
        env = {**os.environ, "PYTHONPATH": str(ROOT / "tools" / "without_extras"), "MINIDET_HIDE_MODULES": hidden}
        r = subprocess.run([sys.executable, str(TOOL), "--ann", str(ann), "--results", str(res), "--output",
                            str(tmp_path / "o"), "--backend", backend], env=env, capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
        assert r.returncode == 2 and one_error_line(r.stderr) == line
