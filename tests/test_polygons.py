"""Masks as polygons (``--mask-format polygon``): outlines on the pixels' edges, checked by rasterizing them back
with pycocotools; the round trip measured on real object shapes (coco_tiny's annotations) and on the model's
masks, and the format through infer and eval."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from helpers import ROOT, run_tool
from minidet.apps.outputs.instances import record_instances, segmentations
from minidet.apps.outputs.polygons import coco_polygons, polygons_with_holes
from minidet.masks import BoxMasks

TINY = ROOT.parent / "shared" / "data" / "coco_tiny"
ANN = TINY / "annotations" / "instances_val2017.json"

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _rasterized(polygons: list[list[float]], h: int, w: int) -> np.ndarray:
    if not polygons:
        return np.zeros((h, w), bool)
    return mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(polygons, h, w))).astype(bool)


def _filled(mask: np.ndarray) -> np.ndarray:
    """The mask with its holes filled (what COCO polygons can hold)."""
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    out = np.zeros(mask.shape, np.uint8)
    cv2.drawContours(out, contours, -1, 1, -1)
    return out.astype(bool) | mask


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max((a | b).sum(), 1))


def test_outlines_go_around_the_pixels():
    """A square's outline is its pixels' edges; one pixel is a unit square; diagonal neighbours, parts, a mask at the
    frame's edges: rasterized again, each outline gives back exactly the pixels (holes filled)."""
    m = np.zeros((10, 12), bool)
    m[2:9, 3:7] = True
    assert coco_polygons(m) == [[3.0, 2.0, 3.0, 9.0, 7.0, 9.0, 7.0, 2.0]]
    assert coco_polygons(m[2:9, 3:7], 3, 2) == coco_polygons(m)  # from a crop placed in the frame
    one = np.zeros((5, 5), bool)
    one[2, 3] = True
    assert _rasterized(coco_polygons(one), 5, 5).tolist() == one.tolist()
    rng = np.random.default_rng(0)
    for _ in range(50):
        h, w = rng.integers(3, 40, 2)
        noisy = rng.random((h, w)) < rng.uniform(0.2, 0.9)
        assert np.array_equal(_rasterized(coco_polygons(noisy), h, w), _filled(noisy))


def test_holes_are_kept_as_rings_and_filled_in_coco_polygons():
    m = np.zeros((30, 30), bool)
    m[5:25, 5:25] = True
    m[10:15, 10:15] = False  # a hole
    m[18:21, 18:21] = False  # another
    m[27:29, 1:4] = True  # a second part
    parts = polygons_with_holes(m)
    assert len(parts) == 2 and sorted(len(holes) for _, holes in parts) == [0, 2]
    # outer ring minus its holes, rasterized: the mask
    got = np.zeros_like(m)
    for outer, holes in parts:
        got |= _rasterized([outer.ravel().tolist()], 30, 30)
        for hole in holes:
            got &= ~_rasterized([hole.ravel().tolist()], 30, 30)
    assert _iou(got, m) > 0.97
    assert np.array_equal(_rasterized(coco_polygons(m), 30, 30), _filled(m))
    simpler = coco_polygons(m, tolerance=1.5)
    assert sum(map(len, simpler)) <= sum(map(len, coco_polygons(m)))


def _coco_tiny_masks(min_area: int = 50) -> list[np.ndarray]:
    coco = COCO(str(ANN))
    masks = []
    for ann in coco.dataset["annotations"]:
        m = coco.annToMask(ann).astype(bool)
        if m.sum() >= min_area:
            masks.append(m)
    return masks


def test_round_trip_iou_on_real_shapes():
    """The issue's measure: polygons rasterized by pycocotools against the mask, on masks of at least 50 px (every
    annotation of coco_tiny: real object shapes, holes included): median >= 0.98, 5th percentile >= 0.90."""
    masks = _coco_tiny_masks()
    assert len(masks) > 200
    ious = []
    for m in masks:
        crop = BoxMasks.from_dense(m[None])
        polys = segmentations(crop, "polygon")[0]
        ious.append(_iou(_rasterized(polys, *m.shape), m))
    ious = np.array(ious)
    print(f"round trip on {len(ious)} coco_tiny masks: median IoU {np.median(ious):.4f}, 5th percentile "
          f"{np.percentile(ious, 5):.4f}, lowest {ious.min():.4f}")
    assert np.median(ious) >= 0.98 and np.percentile(ious, 5) >= 0.90
    simplified = np.array([_iou(_rasterized(segmentations(BoxMasks.from_dense(m[None]), "polygon", 1.0)[0],
                                            *m.shape), m) for m in masks])
    print(f"with tolerance 1 px: median {np.median(simplified):.4f}, 5th percentile {np.percentile(simplified, 5):.4f}")
    assert np.median(simplified) >= 0.95


def test_record_instances_in_each_format():
    m = np.zeros((2, 20, 30), bool)
    m[0, 2:8, 3:9] = True
    out = {"boxes": torch.tensor([[3.0, 2.0, 9.0, 8.0], [0.0, 0.0, 1.0, 1.0]]), "scores": torch.tensor([0.9, 0.5]),
           "labels": torch.tensor([1, 2]), "category_ids": torch.tensor([1, 2]), "box_offset": 0,
           "class_names": ["bg", "a", "b"], "masks": BoxMasks.from_dense(m)}
    rle = record_instances(out)
    poly = record_instances(out, "polygon")
    none = record_instances(out, "none")
    assert rle[0]["segmentation"]["size"] == [20, 30]
    assert poly[0]["segmentation"] == [[3.0, 2.0, 3.0, 8.0, 9.0, 8.0, 9.0, 2.0]] and poly[1]["segmentation"] == []
    assert all("segmentation" not in i for i in none)
    assert [{k: v for k, v in i.items() if k != "segmentation"} for i in rle] == none
    with pytest.raises(ValueError, match="mask format"):
        record_instances(out, "png")


@pytest.mark.slow
def test_infer_and_eval_write_polygons(tmp_path, tv_file):
    """``minidet infer --mask-format polygon|none`` and ``minidet eval --mask-format polygon``: the records' masks
    as polygons that rasterize to the RLE run's masks (holes aside), none at all; eval scores the polygons."""
    config = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
    images = sorted((TINY / "val2017").glob("*.jpg"))[:2]
    # short side 224: the masks are pasted at the photos' own size whatever the network's (more than 10 of them at
    # 50 pixels or more), and their outlines are the subject, not the network's input
    small = ["INPUT.MIN_SIZE_TEST", "224", "INPUT.MAX_SIZE_TEST", "352", "MODEL.WEIGHTS", str(tv_file)]

    def infer(name: str, *opts: str) -> dict:
        out = tmp_path / name
        r = run_tool(ROOT / "tools" / "infer.py", "--config-file", str(config), "--input", *map(str, images),
                     "--output", str(out), "--no-vis", "--workers", "0", *opts, *small, cwd=tmp_path, threads=1)
        assert r.returncode == 0, r.stderr
        return {p.name: json.loads((out / (p.stem + ".json")).read_text()) for p in images}

    rle, poly, none = infer("rle"), infer("poly", "--mask-format", "polygon"), infer("none", "--mask-format", "none")
    ious = []
    for name in rle:
        for a, b, c in zip(rle[name]["instances"], poly[name]["instances"], none[name]["instances"], strict=True):
            assert {k: v for k, v in a.items() if k != "segmentation"} == c and "segmentation" not in c
            mask = mask_utils.decode(a["segmentation"]).astype(bool)
            if mask.sum() >= 50:
                ious.append(_iou(_rasterized(b["segmentation"], *mask.shape), mask))
                assert np.array_equal(_rasterized(b["segmentation"], *mask.shape), _filled(mask))
    assert len(ious) > 10
    print(f"the model's masks (>= 50 px): median round-trip IoU {np.median(ious):.4f}, 5th percentile "
          f"{np.percentile(ious, 5):.4f} over {len(ious)}")

    ann = ANN
    out = tmp_path / "eval"
    r = run_tool(ROOT / "tools" / "eval_coco.py", "--config-file", str(config), "--ann", str(ann), "--images",
                 str(images[0].parent), "--output", str(out), "--max-images", "2", "--workers", "0",
                 "--mask-format", "polygon", *small, cwd=tmp_path, threads=1)
    assert r.returncode == 0, r.stderr
    results = json.loads((out / "coco_instances_results.json").read_text())
    assert results and all(isinstance(d["segmentation"], list) for d in results)
    assert "segm" in json.loads((out / "metrics.json").read_text())
    again = tmp_path / "again"
    r = run_tool(ROOT / "tools" / "eval_coco.py", "--ann", str(ann), "--output", str(again), "--results",
                 str(out / "coco_instances_results.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((again / "metrics.json").read_text())["segm"] == json.loads((out / "metrics.json").read_text())[
        "segm"]
