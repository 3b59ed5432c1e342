"""COCO evaluation pieces: pycocotools' own numbers, results schema, categories, chunks, data."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch.utils.data import DataLoader

from minidet.apps.bulk.chunks import ChunkError, ChunkStore, merge_chunks
from minidet.apps.bulk.dist import from_env
from minidet.apps.bulk.loader import ImageFiles, coco_image_files, collate
from minidet.apps.evaluation import (
    METRIC_NAMES,
    COCOEvaluator,
    EvaluationError,
    check_categories,
    coco_metrics,
    instances_to_coco,
    load_coco_annotations,
    load_results,
    validate_results,
)
from minidet.apps.outputs.fileio import atomic_open, write_json

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FAKE = SHARED / "cocoapi_fake"
TINY = SHARED / "coco_tiny"
needs_fake = pytest.mark.skipif(not FAKE.is_dir(), reason=f"needs ../shared/data/cocoapi_fake ({FAKE} is absent)")
needs_tiny = pytest.mark.skipif(not TINY.is_dir(), reason=f"needs ../shared/data/coco_tiny ({TINY} is absent)")
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _square(h: int, w: int, box: tuple[int, int, int, int]) -> np.ndarray:
    m = np.zeros((h, w), np.uint8)
    x1, y1, x2, y2 = box
    m[y1:y2, x1:x2] = 1
    return m


def _rle(mask: np.ndarray) -> dict:
    r = mask_utils.encode(np.asfortranarray(mask))
    return {"size": [int(v) for v in r["size"]], "counts": r["counts"].decode("ascii")}


@pytest.fixture
def small_gt(tmp_path) -> tuple[str, dict]:
    """Two 40x60 images, two categories, three instances (no info, no licenses); one image empty."""
    anns = []
    for k, (img, cat, box) in enumerate([(1, 1, (5, 5, 25, 30)), (1, 18, (30, 10, 55, 35)), (2, 1, (0, 0, 20, 20))]):
        m = _square(40, 60, box)
        x1, y1, x2, y2 = box
        anns.append({
            "id": k + 1, "image_id": img, "category_id": cat, "iscrowd": 0, "area": float(m.sum()),
            "bbox": [x1, y1, x2 - x1, y2 - y1], "segmentation": _rle(m),
        })
    data = {
        "images": [{"id": i, "file_name": f"{i}.png", "height": 40, "width": 60} for i in (1, 2, 3)],
        "annotations": anns,
        "categories": [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}],
    }
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(data))
    return str(path), data


def _parse_printout(path: Path) -> dict[str, list[float]]:
    """The 12 numbers of each ``type=...`` section of cocoapi's official printout."""
    out: dict[str, list[float]] = {}
    current = None
    for line in path.read_text().splitlines():
        if line.startswith("type="):
            current = out.setdefault(line[5:].strip(), [])
        elif current is not None and re.search(r"\] = -?\d", line):
            current.append(float(line.rsplit("=", 1)[1]))
    return out


@needs_fake
@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_cocoapi_fake_equals_pycocotools_and_the_official_printout(iou_type):
    ann = FAKE / "instances_val2014_100.json"
    res = FAKE / f"instances_val2014_fake{iou_type}100_results.json"
    gt = load_coco_annotations(str(ann))
    results, types = load_results(str(res), gt)
    assert types == (iou_type,)
    metrics, tables = coco_metrics(gt, results, types)
    got = metrics[iou_type]["stats"]

    # pycocotools on its own, the way its demo runs it
    ref_gt = COCO(str(ann))
    ev = COCOeval(ref_gt, ref_gt.loadRes(str(res)), iou_type)
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert got == [float(v) for v in ev.stats]  # exactly
    assert [metrics[iou_type][k] for k in METRIC_NAMES] == got
    official = _parse_printout(FAKE / "val2014_fake_eval_res.txt")[iou_type]
    assert len(official) == 12
    assert [f"{v:.3f}" for v in got] == [f"{v:.3f}" for v in official]
    assert tables[iou_type].count("Average Precision") == 6


def test_evaluator_on_perfect_detections(small_gt):
    path, data = small_gt
    gt = load_coco_annotations(path)
    ev = COCOEvaluator(gt)
    outputs, ids = [], [1, 2, 3]
    for img in ids:
        anns = [a for a in data["annotations"] if a["image_id"] == img]
        boxes = [[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]] for a in anns]
        masks = [mask_utils.decode(a["segmentation"]).astype(bool) for a in anns]
        outputs.append({
            "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
            "scores": torch.linspace(0.9, 0.5, len(anns)),
            "category_ids": torch.tensor([a["category_id"] for a in anns], dtype=torch.int64),
            "masks": torch.from_numpy(np.stack(masks)) if masks else torch.zeros((0, 40, 60), dtype=torch.bool),
            "box_offset": 0,  # as a Predictor's detections carry their family's box rule
        })
    new = ev.process(ids, outputs)
    assert len(new) == 3 and ev.dropped == 0
    metrics = ev.evaluate()
    assert set(metrics) == {"bbox", "segm"}
    for t in ("bbox", "segm"):
        assert metrics[t]["AP"] == 1.0 and metrics[t]["AP50"] == 1.0
        assert metrics[t]["APs"] == 1.0 and metrics[t]["APl"] == -1.0  # no large object: nothing to measure
    ev.reset()
    assert ev.results == [] and ev.image_ids == []
    ev.process(ids, [{**o, "boxes": o["boxes"] + 50} for o in outputs])
    assert ev.evaluate(("bbox",))["bbox"]["AP"] == 0.0


def test_no_detections_and_no_images_are_not_errors(small_gt):
    gt = load_coco_annotations(small_gt[0])
    metrics, _ = coco_metrics(gt, [], ["bbox", "segm"])
    zero = [0.0] * 4 + [-1.0, -1.0] + [0.0] * 4 + [-1.0, -1.0]  # only small objects in the ground truth
    assert metrics["bbox"]["stats"] == zero and metrics["segm"]["stats"] == zero
    metrics, _ = coco_metrics(gt, [], ["bbox"], image_ids=[])
    assert metrics["bbox"]["stats"] == [-1.0] * 12


def test_mask_ap_uses_the_mask_area_not_the_box_area(small_gt):
    """A false positive with a small mask in a large box counts against small-object mask AP.

    Given the box too, pycocotools would take the box's area, find the detection outside the
    small range and ignore it; the evaluation gives it only the mask.
    """
    path, data = small_gt
    gt = load_coco_annotations(path)
    res = [
        {
            "image_id": 1,
            "category_id": a["category_id"],
            "bbox": a["bbox"],
            "score": 0.8,
            "segmentation": a["segmentation"],
        }
        for a in data["annotations"][:2]
    ]
    fp = _rle(_square(40, 60, (40, 0, 50, 8)))
    res.append({"image_id": 1, "category_id": 1, "bbox": [0, 0, 60, 40], "score": 0.95, "segmentation": fp})
    metrics, _ = coco_metrics(gt, res, ["segm"], image_ids=[1])
    assert metrics["segm"]["APs"] == pytest.approx(0.75)  # person: FP first, then TP: AP 0.5; dog: 1
    ev = COCOeval(gt, gt.loadRes(json.loads(json.dumps(res))), "segm")
    ev.params.imgIds = [1]
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert ev.stats[3] == pytest.approx(1.0)  # what the box area would have said


def test_instances_to_coco_maps_and_drops_categories():
    masks = torch.zeros((3, 10, 12), dtype=torch.bool)
    masks[0, 2:5, 3:7] = True
    out = {
        "boxes": torch.tensor([[3.0, 2.0, 7.0, 5.0], [0, 0, 1, 1], [1.5, 1.0, 4.0, 6.0]]),
        "scores": torch.tensor([0.9, 0.8, 0.7]),
        "category_ids": torch.tensor([1, 12, 90]),  # 12: one of coco91's unused slots
        "masks": masks,
    }
    res, dropped = instances_to_coco(7, out, box_offset=0, keep={1, 90})
    assert dropped == 1 and [r["category_id"] for r in res] == [1, 90]
    assert res[0]["bbox"] == [3.0, 2.0, 4.0, 3.0] and res[1]["bbox"] == [1.5, 1.0, 2.5, 5.0]
    assert res[0]["image_id"] == 7 and res[0]["score"] == pytest.approx(0.9)
    assert np.array_equal(mask_utils.decode(res[0]["segmentation"]), masks[0].numpy().astype(np.uint8))
    assert isinstance(res[0]["segmentation"]["counts"], str)
    res, dropped = instances_to_coco(7, {k: v for k, v in out.items() if k != "masks"}, box_offset=1)
    assert dropped == 0 and res[0]["bbox"] == [3.0, 2.0, 5.0, 4.0] and "segmentation" not in res[0]


def test_check_categories(small_gt, tmp_path):
    gt = load_coco_annotations(small_gt[0])
    for layout in ("coco91", "coco81", "coco80"):
        check_categories(gt, layout, "gt.json")
    gt.dataset["categories"].append({"id": 12, "name": "street sign"})
    with pytest.raises(EvaluationError, match=r"^gt\.json: category 12 \('street sign'\) is not a category"):
        check_categories(gt, "coco91", "gt.json")
    gt.dataset["categories"][-1] = {"id": 2, "name": "motorbike"}
    with pytest.raises(EvaluationError, match=r"category 2 is 'motorbike' in the dataset but 'bicycle'"):
        check_categories(gt, "coco81", "gt.json")


@pytest.mark.parametrize(
    "results, message",
    [
        ({"image_id": 1}, "must be a JSON list of detections, got dict"),
        ([], "no detections"),
        ([{"image_id": 1, "category_id": 1, "score": 0.5}], "entry 0 has neither 'bbox' nor 'segmentation'"),
        ([{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1]}], "entry 0: no 'score'"),
        ([{"image_id": 9, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 1}], "image_id 9 is not an image"),
        ([{"image_id": 1, "category_id": True, "bbox": [0, 0, 1, 1], "score": 1}], "category_id must be an integer"),
        ([{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1], "score": 1}], "bbox must be [x, y, width, height]"),
        ([{"image_id": 1, "category_id": 1, "bbox": [0, 0, -1, 1], "score": 1}], "width, height >= 0"),
        ([{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": float("nan")}], "finite number"),
        (
            [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 1}, {"image_id": 1, "category_id": 1}],
            "entry 1: no 'score'",
        ),
        (
            [{"image_id": 1, "category_id": 1, "score": 1, "segmentation": [[0, 0, 1, 0]]}],
            "segmentation polygon 0 must be a list of x, y numbers (an even count, at least 3 points), got 4 numbers",
        ),
        (
            [{"image_id": 1, "category_id": 1, "score": 1, "segmentation": {"size": [10, 10], "counts": "01"}}],
            r"segmentation size [10, 10] is not the image's [height, width] [40, 60]",
        ),
        ([1, 2], "entry 0: expected an object, got int"),
    ],
)
def test_wrong_results_schema_is_a_clear_error(small_gt, results, message):
    gt = load_coco_annotations(small_gt[0])
    with pytest.raises(EvaluationError) as err:
        validate_results(results, gt, "res.json")
    text = str(err.value)
    assert text.startswith("res.json: ") and message in text and "\n" not in text


def test_results_files(small_gt, tmp_path):
    gt = load_coco_annotations(small_gt[0])
    bad = tmp_path / "bad.json"
    bad.write_text('[{"image_id": 1,')
    with pytest.raises(EvaluationError, match=rf"^{re.escape(str(bad))}: not valid JSON"):
        load_results(str(bad), gt)
    with pytest.raises(EvaluationError, match="results file not found"):
        load_results(str(tmp_path / "none.json"), gt)
    # uncompressed RLE counts are accepted and compressed
    m = _square(40, 60, (5, 5, 25, 30))
    flat = m.flatten(order="F")
    change = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    counts = np.diff(np.concatenate([[0], change])).tolist()
    assert sum(counts) == 40 * 60
    res = [{"image_id": 1, "category_id": 1, "score": 1.0, "segmentation": {"size": [40, 60], "counts": counts}}]
    assert validate_results(res, gt, "r") == ("segm",)
    assert np.array_equal(mask_utils.decode(res[0]["segmentation"]), m)


def test_annotation_file_errors(tmp_path, small_gt):
    with pytest.raises(EvaluationError, match="annotation file not found"):
        load_coco_annotations(str(tmp_path / "none.json"))
    p = tmp_path / "a.json"
    p.write_text(json.dumps({"images": [], "annotations": []}))
    with pytest.raises(EvaluationError, match=r"a\.json: not a COCO annotation file \(no 'categories' list\)"):
        load_coco_annotations(str(p))
    data = small_gt[1]
    del data["annotations"][1]["area"]
    p.write_text(json.dumps(data))
    with pytest.raises(EvaluationError, match=r"annotations\[1\] lacks 'area'"):
        load_coco_annotations(str(p))


@needs_tiny
def test_coco_tiny_annotations_crowd_rle_empty_images_no_info(tmp_path):
    """Ground truth given back as detections scores AP 1 on coco_tiny's file, also with an image
    without annotations and without 'licenses' (the file has no 'info' already)."""
    data = json.loads((TINY / "annotations" / "instances_val2017.json").read_text())
    assert "info" not in data and any(a["iscrowd"] for a in data["annotations"])
    data.pop("licenses", None)
    data["images"].append({"id": 1, "file_name": "empty.jpg", "height": 100, "width": 100})
    p = tmp_path / "gt.json"
    p.write_text(json.dumps(data))
    gt = load_coco_annotations(str(p))
    check_categories(gt, "coco91", str(p))
    res = []
    for a in data["annotations"]:
        if not a["iscrowd"]:
            rle = gt.annToRLE(a)
            seg = {"size": rle["size"], "counts": rle["counts"].decode("ascii")}
            res.append({"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"],
                        "score": 0.5, "segmentation": seg})
    assert validate_results(res, gt, "r") == ("bbox", "segm")
    metrics, _ = coco_metrics(gt, res, ["bbox", "segm"])
    assert metrics["bbox"]["AP"] == 1.0 and metrics["segm"]["AP"] == 1.0


def test_chunk_store_and_merge(tmp_path):
    store = ChunkStore(str(tmp_path / "chunks"))
    manifest = {"annotations": "a.json", "config": {"MODEL.NORM": "FrozenBN"}}
    assert store.check(manifest, resume=False) == 1
    store.begin(manifest, 1, resume=False)
    bad = {"image_id": 2, "file": "2.jpg", "error": "bad"}
    det = {"image_id": 1, "score": 0.5}
    store.write(1, 0, 0, {"image_ids": [1], "skipped": [bad], "dropped": 1, "detections": [det], "timings": [{}]})
    store.write(1, 1, 0, {"image_ids": [3], "skipped": [], "dropped": 0, "detections": [], "timings": []})
    assert store.done_ids() == {1, 3}  # the skipped image is retried by a resumed run
    with pytest.raises(ChunkError, match="holds 2 result chunks of an earlier run; rerun with --resume"):
        store.check(manifest, resume=False)
    with pytest.raises(ChunkError, match=r"differs: config MODEL.NORM: FrozenBN then, Affine now"):
        store.check({**manifest, "config": {"MODEL.NORM": "Affine"}}, resume=True)
    assert store.check(manifest, resume=True) == 2
    store.begin(manifest, 2, resume=True)
    det = {"image_id": 2, "score": 0.9}
    store.write(2, 0, 0, {"image_ids": [2], "skipped": [], "dropped": 0, "detections": [det], "timings": [{}]})
    assert store.names() == ["run001-rank0000-00000.json", "run001-rank0001-00000.json", "run002-rank0000-00000.json"]
    m = merge_chunks(store.read_all())
    assert m.image_ids == [1, 3, 2] and m.skipped == {} and m.dropped == 1
    assert [r["image_id"] for r in m.results] == [1, 2] and len(m.timings) == 2
    assert m.images_per_run == {1: 3, 2: 1}
    (tmp_path / "chunks" / "run002-rank0000-00000.json").write_text("{")
    with pytest.raises(ChunkError, match="cannot read result chunk"):
        store.done_ids()


def test_image_files_report_bad_files_as_data(tmp_path):
    pil = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "ok.jpg"), img)
    cv2.imwrite(str(tmp_path / "gray.png"), img[:, :, 0])
    cv2.imwrite(str(tmp_path / "rgba.png"), np.dstack([img, np.full((30, 40), 200, np.uint8)]))
    cv2.imwrite(str(tmp_path / "deep.png"), img.astype(np.uint16) * 257)
    pil.fromarray(img[:, :, ::-1]).convert("CMYK").save(tmp_path / "cmyk.jpg", "JPEG")
    data = (tmp_path / "ok.jpg").read_bytes()
    (tmp_path / "trunc.jpg").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.jpg").write_bytes(b"")
    names = ["ok.jpg", "gray.png", "rgba.png", "deep.png", "cmyk.jpg", "trunc.jpg", "empty.jpg", "missing.jpg"]
    items = coco_image_files([{"id": 10 - k, "file_name": n} for k, n in enumerate(names)], str(tmp_path))
    assert [i for i, _ in items] == list(range(3, 11))  # sorted by id
    sizes = {i: (30, 40) for i, _ in items}
    sizes[10] = (40, 30)
    loader = DataLoader(ImageFiles(items, sizes=sizes), batch_size=3, num_workers=1, collate_fn=collate)
    got = dict(item for batch in loader for item in batch)
    for i, name in [(9, "gray.png"), (8, "rgba.png"), (7, "deep.png"), (6, "cmyk.jpg")]:
        assert isinstance(got[i], np.ndarray) and got[i].shape == (30, 40, 3) and got[i].dtype == np.uint8, name
    assert np.array_equal(got[9][:, :, 1], img[:, :, 0]) and np.array_equal(got[7], img)
    assert got[10] == f"{tmp_path / 'ok.jpg'}: image is 40 x 30 but the annotation file says 30 x 40 (EXIF-rotated?)"
    assert got[5] == f"{tmp_path / 'trunc.jpg'}: cannot decode JPEG data (truncated or corrupt)"
    assert got[4] == f"{tmp_path / 'empty.jpg'}: empty file (0 bytes)"
    assert got[3] == f"{tmp_path / 'missing.jpg'}: file not found"


def test_atomic_json_and_dist_env(tmp_path):
    target = tmp_path / "m.json"
    write_json(str(target), {"a": 1})
    with pytest.raises(RuntimeError), atomic_open(str(target)) as f:
        f.write("half")
        raise RuntimeError("stop")
    assert json.loads(target.read_text()) == {"a": 1} and os.listdir(tmp_path) == ["m.json"]
    assert from_env({}).world_size == 1 and from_env({}).is_main
    info = from_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert info.distributed and not info.is_main


def test_the_box_rule_travels_with_the_detections():
    """Detections carry their family's box rule (``box_offset``); the conversion never assumes one."""
    out = {"boxes": torch.tensor([[3.0, 2.0, 7.0, 5.0]]), "scores": torch.tensor([0.9]),
           "category_ids": torch.tensor([1]), "labels": torch.tensor([1]), "class_names": ["bg", "person"]}
    with pytest.raises(KeyError, match="box_offset"):
        instances_to_coco(7, out)
    res, _ = instances_to_coco(7, {**out, "box_offset": 1})
    assert res[0]["bbox"] == [3.0, 2.0, 5.0, 4.0]
    from minidet.apps.outputs.instances import record_instances

    inst = record_instances({**out, "box_offset": 1})
    assert inst == [{"bbox": [3.0, 2.0, 5.0, 4.0], "score": pytest.approx(0.9), "category_id": 1,
                     "category_name": "person"}]
