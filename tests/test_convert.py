"""``minidet convert``: infer's results as a COCO dataset, CVAT XML, Label Studio tasks, YOLO-seg labels and
GeoJSON, each read back (pycocotools for COCO; the formats' published layouts for the others) and rasterized again:
the masks come back (holes filled where the format has none; GeoJSON keeps them)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from helpers import ROOT, call_tool, needs_extra
from minidet.apps.outputs.records import dumps_record
from minidet.apps.outputs.rle import encode_masks

TOOL = ROOT / "tools" / "infer.py"
CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _masks(h: int, w: int) -> list[np.ndarray]:
    ring = np.zeros((h, w), bool)
    ring[10:50, 10:60] = True
    ring[20:30, 25:40] = False  # a hole
    parts = np.zeros((h, w), bool)
    parts[60:75, 5:20] = True
    parts[62:70, 40:70] = True  # a second part
    blob = np.zeros((h, w), np.uint8)
    cv2.ellipse(blob, (90, 40), (20, 12), 30, 0, 360, 1, -1)
    return [ring, parts, blob.astype(bool)]


def _records(tmp_path) -> tuple[str, list[list[np.ndarray]]]:
    """A .jsonl of two images' records as infer writes them (RLE masks of known shapes), and the masks."""
    lines, truth = [], []
    for k, (h, w) in enumerate([(80, 120), (90, 130)]):
        masks = _masks(h, w)
        rles = encode_masks(np.stack(masks))
        insts = []
        for j, (m, rle) in enumerate(zip(masks, rles)):
            ys, xs = np.nonzero(m)
            insts.append({"bbox": [float(xs.min()), float(ys.min()), float(xs.max() - xs.min() + 1),
                                   float(ys.max() - ys.min() + 1)], "score": 0.9 - 0.2 * j,
                          "category_id": [1, 18, 1][j], "category_name": ["person", "dog", "person"][j],
                          "segmentation": rle})
        record = {"file": f"img{k}.jpg", "height": h, "width": w, "instances": insts, "image_id": k + 1}
        lines.append(json.dumps(json.loads(dumps_record(record))))
        truth.append(masks)
    path = tmp_path / "all.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path), truth


def _filled(m: np.ndarray) -> np.ndarray:
    contours, _ = cv2.findContours(m.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    out = np.zeros(m.shape, np.uint8)
    cv2.drawContours(out, contours, -1, 1, -1)
    return out.astype(bool) | m


def _raster(polygons: list[list[float]], h: int, w: int) -> np.ndarray:
    return mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(polygons, h, w))).astype(bool)


def _convert(capsys, *args: str) -> tuple[int, str, str]:
    from minidet.apps.cli import main

    rc = main(["convert", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_coco_dataset_loads_in_pycocotools_and_gives_the_masks_back(tmp_path, capsys):
    src, truth = _records(tmp_path)
    out = tmp_path / "coco.json"
    rc, stdout, _ = _convert(capsys, src, "--to", "coco-dataset", "--output", str(out))
    assert rc == 0 and "2 images, 0 failed, 6 instances ->" in stdout
    coco = COCO(str(out))
    assert sorted(c["name"] for c in coco.loadCats(coco.getCatIds())) == ["dog", "person"]
    for img_id, masks in zip(sorted(coco.getImgIds()), truth):
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[img_id]))
        assert [a["score"] for a in anns] == pytest.approx([0.9, 0.7, 0.5])
        for a, m in zip(anns, masks):
            assert np.array_equal(coco.annToMask(a).astype(bool), _filled(m))
            assert a["area"] == _filled(m).sum() and a["iscrowd"] == 0
    rc, _, _ = _convert(capsys, src, "--to", "coco-dataset", "--output", str(out), "--score-thresh", "0.8")
    assert len(COCO(str(out)).getAnnIds()) == 2


def test_cvat_xml(tmp_path, capsys):
    src, truth = _records(tmp_path)
    out = tmp_path / "cvat.xml"
    assert _convert(capsys, src, "--to", "cvat", "--output", str(out))[0] == 0
    root = ET.parse(out).getroot()
    assert root.tag == "annotations" and root.findtext("version") == "1.1"
    labels = root.findall("./meta/task/labels/label")
    assert sorted(label.findtext("name") for label in labels) == ["dog", "person"]
    assert all(label.find("./attributes/attribute").findtext("name") == "score" for label in labels)
    images = root.findall("image")
    assert [(i.get("name"), i.get("width"), i.get("height")) for i in images] == [("img0.jpg", "120", "80"),
                                                                                 ("img1.jpg", "130", "90")]
    for image, masks in zip(images, truth):
        h, w = int(image.get("height")), int(image.get("width"))
        polys = image.findall("polygon")
        assert [p.get("label") for p in polys] == ["person", "dog", "dog", "person"]  # two parts: two polygons
        got = [[float(v) for pt in p.get("points").split(";") for v in pt.split(",")] for p in polys]
        assert np.array_equal(_raster(got[:1], h, w), _filled(masks[0]))
        assert np.array_equal(_raster(got[1:3], h, w), masks[1])
        assert polys[0].find("attribute").get("name") == "score" and polys[0].find("attribute").text == "0.9000"


def test_labelstudio_tasks(tmp_path, capsys):
    src, truth = _records(tmp_path)
    out = tmp_path / "ls.json"
    assert _convert(capsys, src, "--to", "labelstudio", "--output", str(out), "--image-prefix", "/data/")[0] == 0
    tasks = json.loads(out.read_text())
    assert [t["data"]["image"] for t in tasks] == ["/data/img0.jpg", "/data/img1.jpg"]
    for task, masks in zip(tasks, truth):
        (pred,) = task["predictions"]
        assert pred["model_version"] == "minidet" and pred["score"] == pytest.approx(0.7)
        results = [r for r in pred["result"] if r["type"] != "relation"]
        assert len({r["id"] for r in results}) == len(results) == 4
        h, w = results[0]["original_height"], results[0]["original_width"]
        for r in results:
            assert r["type"] == "polygonlabels" and r["from_name"] == "label" and r["to_name"] == "image"
            assert all(0 <= x <= 100 and 0 <= y <= 100 for x, y in r["value"]["points"])
        pixels = [[v * s / 100 for x, y in r["value"]["points"] for v, s in ((x, w), (y, h))] for r in results]
        assert np.array_equal(_raster(pixels[:1], h, w), _filled(masks[0]))
        assert results[0]["value"]["polygonlabels"] == ["person"]


def test_yolo_seg_labels(tmp_path, capsys):
    src, truth = _records(tmp_path)
    out = tmp_path / "yolo"
    assert _convert(capsys, src, "--to", "yolo-seg", "--output", str(out))[0] == 0
    assert (out / "data.yaml").read_text() == 'names:\n  0: "person"\n  1: "dog"\n'
    for k, masks in enumerate(truth):
        h, w = masks[0].shape
        lines = (out / "labels" / f"img{k}.txt").read_text().splitlines()
        assert [line.split()[0] for line in lines] == ["0", "1", "0"]  # one line per instance
        for line, m in zip(lines, masks):
            values = [float(v) for v in line.split()[1:]]
            assert len(values) % 2 == 0 and len(values) >= 6 and all(0 <= v <= 1 for v in values)
            pixels = [v * (w if i % 2 == 0 else h) for i, v in enumerate(values)]
            # one polygon, the parts joined by zero-width bridges: filled, it is the parts (holes filled)
            assert np.array_equal(_raster([pixels], h, w), _filled(m))


def _rings_raster(polygons, h: int, w: int, to_pixels=lambda xy: xy) -> np.ndarray:
    """A MultiPolygon's pixels: each polygon's outer ring less its own holes, the polygons united (a part may lie
    in another's hole: a hole takes nothing from the other parts)."""
    got = np.zeros((h, w), bool)
    for rings in polygons:
        outer, *holes = [to_pixels(np.asarray(r, np.float64)[:-1]) for r in rings]
        part = _raster([outer.ravel().tolist()], h, w)
        for hole in holes:
            part &= ~_raster([hole.ravel().tolist()], h, w)
        got |= part
    return got


def _signed_area(ring) -> float:
    x, y = np.asarray(ring, np.float64)[:-1].T
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))


def test_geojson_keeps_holes(tmp_path, capsys):
    src, truth = _records(tmp_path)
    out = tmp_path / "out.geojson"
    assert _convert(capsys, src, "--to", "geojson", "--output", str(out))[0] == 0
    doc = json.loads(out.read_text())
    assert doc["type"] == "FeatureCollection" and "crs" not in doc and len(doc["features"]) == 6
    for k, masks in enumerate(truth):
        feats = [f for f in doc["features"] if f["properties"]["file"] == f"img{k}.jpg"]
        for f, m in zip(feats, masks):
            geom = f["geometry"]
            assert geom["type"] == "MultiPolygon"
            for rings in geom["coordinates"]:
                assert all(r[0] == r[-1] and len(r) >= 4 for r in rings)
                assert _signed_area(rings[0]) > 0 and all(_signed_area(r) < 0 for r in rings[1:])
            assert np.array_equal(_rings_raster(geom["coordinates"], *m.shape), m)  # holes kept
        assert len(feats[0]["geometry"]["coordinates"][0]) == 2 and len(feats[1]["geometry"]["coordinates"]) == 2


def test_unreadable_results_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    rc, _, err = _convert(capsys, str(bad), "--to", "cvat", "--output", str(tmp_path / "x.xml"))
    assert rc == 2 and err.startswith(f"error: {bad}: ") and len(err.strip().splitlines()) == 1
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    rc, _, err = _convert(capsys, str(other), "--to", "geojson", "--output", str(tmp_path / "x.geojson"))
    assert rc == 2 and "not infer's results" in err and not (tmp_path / "x.geojson").exists()


@pytest.mark.slow
@needs_extra("rasterio", "geo")
def test_geotiff_in_geojson_out_in_the_rasters_crs(tmp_path, capsys, tv_file):
    """A GeoTIFF (UTM zone 33N, 10 m pixels) through ``minidet infer --slice`` (its tiles read window by window
    from the file: the same records as the same pixels in a PNG) and ``minidet convert --to geojson``: the polygons
    in the raster's CRS, where its transform puts the pixels."""
    import rasterio
    from rasterio.transform import from_origin

    from minidet.apps.synthetic import structured_image

    image = structured_image(300, 400, seed=8)
    path = tmp_path / "ortho.tif"
    transform = from_origin(500000.0, 4500000.0, 10.0, 10.0)
    with rasterio.open(path, "w", driver="GTiff", height=300, width=400, count=3, dtype="uint8", crs="EPSG:32633",
                       transform=transform) as dst:
        dst.write(image[:, :, ::-1].transpose(2, 0, 1))  # bands in RGB order
    out = tmp_path / "out"
    png = tmp_path / "png" / "ortho.png"
    png.parent.mkdir()
    cv2.imwrite(str(png), image)
    for source, folder in ((path, out), (png, tmp_path / "png_out")):
        res = call_tool(TOOL, "--config-file", str(CONFIG), "--input", str(source), "--output", str(folder),
                        "--no-vis", "--workers", "1", "--slice", "256", "--results", str(folder / "all.jsonl"),
                        "MODEL.WEIGHTS", str(tv_file), "INPUT.MIN_SIZE_TEST", "320", "INPUT.MAX_SIZE_TEST", "512",
                        threads=1)
        assert res.returncode == 0, res.stderr
    from_png = json.loads((tmp_path / "png_out" / "ortho.json").read_text())
    assert {**json.loads((out / "ortho.json").read_text()), "file": ""} == {**from_png, "file": ""}
    geo = tmp_path / "trees.geojson"
    assert _convert(capsys, str(out / "all.jsonl"), "--to", "geojson", "--output", str(geo))[0] == 0
    doc = json.loads(geo.read_text())
    assert doc["crs"]["properties"]["name"] == "EPSG:32633" and len(doc["features"]) > 10
    record = json.loads((out / "ortho.json").read_text())
    to_pixels = lambda xy: np.stack([(xy[:, 0] - 500000.0) / 10.0, (4500000.0 - xy[:, 1]) / 10.0], 1)  # noqa: E731
    for f, inst in zip(doc["features"], record["instances"]):
        xs = [p[0] for rings in f["geometry"]["coordinates"] for r in rings for p in r]
        assert 500000.0 <= min(xs, default=500000.0) and max(xs, default=500000.0) <= 504000.0  # empty: no mask
        m = mask_utils.decode(inst["segmentation"]).astype(bool)
        got = _rings_raster(f["geometry"]["coordinates"], 300, 400, to_pixels)
        # outlines exact: the random weights' ragged masks (parts inside other parts' holes too) come back
        assert np.array_equal(got, m), ((got ^ m).sum(), m.sum())


def test_infers_coco_json_results_read_as_its_jsonl(tmp_path, capsys):
    """infer's two results files (``.jsonl`` records; COCO ``.json`` with images, annotations and categories) give
    the same converted files."""
    src, _ = _records(tmp_path)
    records = [json.loads(line) for line in open(src)]
    doc = {"images": [{"id": r["image_id"], "file_name": r["file"], "height": r["height"], "width": r["width"]}
                      for r in records],
           "annotations": [{"image_id": r["image_id"], **{k: v for k, v in i.items() if k != "category_name"}}
                           for r in records for i in r["instances"]],
           "categories": [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}]}
    coco_src = tmp_path / "all.json"
    coco_src.write_text(json.dumps(doc))
    for fmt in ("coco-dataset", "geojson", "labelstudio"):
        a, b = tmp_path / f"a.{fmt}", tmp_path / f"b.{fmt}"
        assert _convert(capsys, src, "--to", fmt, "--output", str(a))[0] == 0
        assert _convert(capsys, str(coco_src), "--to", fmt, "--output", str(b))[0] == 0
        assert a.read_bytes() == b.read_bytes(), fmt


def _box_scored(tmp_path) -> tuple[str, list[list[float]]]:
    """``_records`` as a Mask Scoring R-CNN writes them: a ``box_score`` (the box head's) beside each ``score``."""
    src, _ = _records(tmp_path)
    records = [json.loads(line) for line in open(src)]
    box_scores = []
    for r in records:
        for j, inst in enumerate(r["instances"]):
            inst["box_score"] = round(0.95 - 0.1 * j, 4)
        box_scores.append([i["box_score"] for i in r["instances"]])
    path = tmp_path / "scored.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path), box_scores


@pytest.mark.parametrize("fmt", ["coco-dataset", "cvat", "labelstudio", "geojson"])
def test_box_score_of_mask_scored_records_is_kept_where_the_format_has_attributes(tmp_path, capsys, fmt):
    """Issue 56 item 7: a Mask Scoring R-CNN's ``box_score`` was dropped by every format; each format that carries
    an attribute keeps it (read back as its tool reads it), without a word; records without one write none."""
    src, box_scores = _box_scored(tmp_path)
    out = tmp_path / f"out.{fmt}"
    rc, _, err = _convert(capsys, src, "--to", fmt, "--output", str(out))
    assert rc == 0 and err == ""
    flat = [s for image in box_scores for s in image]
    if fmt == "coco-dataset":
        coco = COCO(str(out))
        assert [a["box_score"] for a in coco.loadAnns(sorted(coco.getAnnIds()))] == flat
    elif fmt == "cvat":
        root = ET.parse(out).getroot()
        for label in root.findall("./meta/task/labels/label"):  # declared on every label, as CVAT asks
            assert [a.findtext("name") for a in label.findall("./attributes/attribute")] == ["score", "box_score"]
        for image, scores in zip(root.findall("image"), box_scores):
            got = [float(p.find("attribute[@name='box_score']").text) for p in image.findall("polygon")]
            assert got == [scores[0], scores[1], scores[1], scores[2]]  # a part of two: both carry it
    elif fmt == "labelstudio":
        for task, scores in zip(json.loads(out.read_text()), box_scores):
            regions = [r for r in task["predictions"][0]["result"] if r["type"] != "relation"]
            got = [r["meta"]["text"] for r in regions]
            assert got == [[f"box_score {s:.4f}"] for s in (scores[0], scores[1], scores[1], scores[2])]
    else:
        doc = json.loads(out.read_text())
        assert [f["properties"]["box_score"] for f in doc["features"]] == flat
    plain, _ = _records(tmp_path)
    assert _convert(capsys, plain, "--to", fmt, "--output", str(out))[0] == 0
    assert "box_score" not in out.read_text()


def test_yolo_seg_says_it_cannot_carry_box_score(tmp_path, capsys):
    """YOLO-seg labels carry no attribute: one note says the box scores are not carried (the labels as without)."""
    src, _ = _box_scored(tmp_path)
    rc, stdout, err = _convert(capsys, src, "--to", "yolo-seg", "--output", str(tmp_path / "yolo"))
    assert rc == 0 and err == ""
    notes = [line for line in stdout.splitlines() if "box_score" in line]
    assert notes == ["convert: note: yolo-seg labels hold no attributes: the instances' box_score (the box head's "
                     "score beside a Mask Scoring R-CNN's mask score) is not carried"]
    plain, _ = _records(tmp_path)
    rc, stdout, _ = _convert(capsys, plain, "--to", "yolo-seg", "--output", str(tmp_path / "yolo2"))
    assert rc == 0 and "box_score" not in stdout
    for k in range(2):
        assert (tmp_path / "yolo" / "labels" / f"img{k}.txt").read_text() == \
            (tmp_path / "yolo2" / "labels" / f"img{k}.txt").read_text()
