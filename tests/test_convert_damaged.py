"""``minidet convert`` fed damaged or hostile results: every record is checked by one reader before any format is
written (one ``error:`` line naming the file, its line and the key; the record left out, the others converted, exit
status 1); an image's size bounds what a record may make it allocate; a GeoJSON's coordinate system is read from the
image the record names, or refused in one line; empty masks a format cannot hold are counted; an instance of
several parts stays one instance (CVAT groups, Label Studio relations)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from helpers import ROOT, needs_extra
from minidet.apps.outputs.rle import encode_masks

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

FORMATS = ("coco-dataset", "cvat", "labelstudio", "yolo-seg", "geojson")


def _mask(h: int, w: int, *boxes) -> np.ndarray:
    m = np.zeros((h, w), bool)
    for x0, y0, x1, y1 in boxes:
        m[y0:y1, x0:x1] = True
    return m


def _instance(mask: np.ndarray, score: float = 0.9, cid: int = 1, name: str = "person") -> dict:
    ys, xs = np.nonzero(mask)
    box = [float(xs.min()), float(ys.min()), float(xs.max() - xs.min() + 1), float(ys.max() - ys.min() + 1)] \
        if len(xs) else [0.0, 0.0, 0.0, 0.0]
    return {"bbox": box, "score": score, "category_id": cid, "category_name": name,
            "segmentation": encode_masks(mask[None])[0]}


def _record(name: str, h: int = 40, w: int = 60) -> dict:
    return {"file": name, "height": h, "width": w, "instances": [_instance(_mask(h, w, (5, 5, 20, 15)))]}


def _write(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def _convert(capsys, *args: str) -> tuple[int, str, str]:
    from minidet.apps.cli import main

    rc = main(["convert", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _bad_instance(**change) -> dict:
    rec = _record("b.jpg")
    inst = rec["instances"][0]
    for k, v in change.items():
        if v is _DROP:
            del inst[k]
        else:
            inst[k] = v
    return rec


_DROP = object()
_RLE = encode_masks(_mask(40, 60, (5, 5, 20, 15))[None])[0]
_SHORT_RLE = encode_masks(_mask(40, 50, (5, 5, 20, 15))[None])[0]["counts"]  # runs of 40 x 50 pixels

# a damaged record (line 2 of three) and the words its one error line must have
DAMAGED = {
    "no score": (_bad_instance(score=_DROP), "instance 0: no 'score'"),
    "no category_id": (_bad_instance(category_id=_DROP), "instance 0: no 'category_id'"),
    "instances a string": ({**_record("b.jpg"), "instances": "person"}, "instances must be a list, got 'person'"),
    "counts not RLE": (_bad_instance(segmentation={"size": [40, 60], "counts": "not an RLE!"}),
                       "instance 0: segmentation counts 'not an RLE!' are not a compressed COCO RLE string"),
    "counts too short": (_bad_instance(segmentation={"size": [40, 60], "counts": _SHORT_RLE}),
                         "instance 0: segmentation counts do not cover the record's 60 x 40 pixels"),
    "RLE size not the record's": (_bad_instance(segmentation={"size": [100000, 100000], "counts": "0"}),
                                  "instance 0: segmentation size [100000, 100000] is not the record's [height, "
                                  "width] [40, 60]"),
    "odd polygon": (_bad_instance(segmentation=[[1, 1, 10, 1, 10, 10, 4]]),
                    "instance 0: segmentation polygon 0 has 7 values (x, y pairs: an even number, at least 6)"),
    "polygon outside": (_bad_instance(segmentation=[[1, 1, 1e9, 1, 10, 10]]),
                        "instance 0: segmentation polygon 0 has points outside the 60 x 40 image"),
    "score a string": (_bad_instance(score="0.9"), "instance 0: score must be a finite number, got '0.9'"),
    "score NaN": (_bad_instance(score=float("nan")), "instance 0: score must be a finite number, got nan"),
    "box_score a string": (_bad_instance(box_score="high"), "instance 0: box_score must be a finite number, got "
                                                             "'high'"),
    "category_id a float": (_bad_instance(category_id=1.5), "instance 0: category_id must be an integer, got 1.5"),
    "bbox a string": (_bad_instance(bbox="1,2,3,4"), "instance 0: bbox must be [x, y, width, height]"),
    "bbox outside": (_bad_instance(bbox=[5, 5, 1e6, 10]), "instance 0: bbox [5, 5, 1000000.0, 10] is outside"),
    "size 0": ({**_record("b.jpg"), "height": 0, "width": 0, "instances": []},
               "height 0, width 0: an image's height and width are whole numbers of at least 1"),
    "control character": (_bad_instance(category_name="per\x01son"),
                          "instance 0: category_name 'per\\x01son' has the control character U+0001"),
    "file with a control character": ({**_record("b\x07.jpg")}, "file 'b\\x07.jpg' has the control character U+0007"),
    "too many pixels": ({**_record("b.jpg"), "height": 100000, "width": 100000, "instances": []},
                        "100000 x 100000 = 10000000000 pixels exceeds --max-pixels (125000000"),
    "not JSON": ('{"file": "b.jpg", "height": 40,', "not valid JSON"),
    "a list": ([1, 2], "expected a record"),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_record_is_one_line_and_the_others_are_converted(tmp_path, capsys, case):
    bad, words = DAMAGED[case]
    src = _write(tmp_path / "all.jsonl", [_record("a.jpg"), bad, _record("c.jpg")])
    out = tmp_path / "out.json"
    rc, stdout, err = _convert(capsys, src, "--to", "labelstudio", "--output", str(out))
    assert rc == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {src}: line 2: {words}"), err
    assert "convert: 3 images, 1 failed, 2 instances ->" in stdout
    tasks = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the output"))
    assert [t["data"]["image"] for t in tasks] == ["a.jpg", "c.jpg"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_gets_the_same_checks(tmp_path, capsys, fmt):
    """Label Studio used to write Infinity for a record of size 0, CVAT an XML that does not parse for a name with a
    control character; each format now refuses both records alike and writes the others whole."""
    records = [_record("a.jpg"), {**_record("b.jpg"), "height": 0, "width": 0},
               _bad_instance(category_name="do\x01g"), _record("d.jpg")]
    src = _write(tmp_path / "all.jsonl", records)
    out = tmp_path / ("out" if fmt == "yolo-seg" else f"out.{fmt}")
    rc, stdout, err = _convert(capsys, src, "--to", fmt, "--output", str(out))
    assert rc == 1 and len(err.splitlines()) == 2, err
    assert err.splitlines()[0].startswith(f"error: {src}: line 2: height 0, width 0")
    assert err.splitlines()[1].startswith(f"error: {src}: line 3: instance 0: category_name 'do\\x01g'")
    assert "convert: 4 images, 2 failed, 2 instances ->" in stdout
    if fmt == "cvat":
        assert [i.get("name") for i in ET.parse(out).getroot().iter("image")] == ["a.jpg", "d.jpg"]
    elif fmt == "yolo-seg":
        assert sorted(os.listdir(out / "labels")) == ["a.txt", "d.txt"]
    else:
        json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the output"))


def test_a_file_none_of_whose_records_can_be_read_writes_nothing(tmp_path, capsys):
    src = _write(tmp_path / "all.jsonl", [_bad_instance(score=_DROP), {**_record("b.jpg"), "instances": 3}])
    out = tmp_path / "out.xml"
    rc, _, err = _convert(capsys, src, "--to", "cvat", "--output", str(out))
    assert rc == 2 and not out.exists()
    assert err.splitlines() == [f"error: {src}: line 1: instance 0: no 'score' (an instance has bbox, score, "
                                "category_id; category_name, segmentation)",
                                f"error: {src}: line 2: instances must be a list, got 3 (none of its 2 records could "
                                "be read: nothing written)"]


def test_coco_results_json_gets_the_same_checks(tmp_path, capsys):
    rec = _record("a.jpg")
    doc = {"images": [{"id": 1, "file_name": "a.jpg", "height": 40, "width": 60},
                      {"id": 2, "file_name": "b.jpg", "height": 40, "width": 60}],
           "annotations": [{"image_id": 1, **rec["instances"][0]},
                           {"image_id": 2, **{**rec["instances"][0], "segmentation": {"size": [9, 9], "counts": "0"}}},
                           {"image_id": 7, **rec["instances"][0]}],
           "categories": [{"id": 1, "name": "person"}]}
    src = tmp_path / "all.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    rc, stdout, err = _convert(capsys, str(src), "--to", "coco-dataset", "--output", str(out))
    assert rc == 1 and err.splitlines() == [
        f"error: {src}: annotations[2]: image_id 7 is not in 'images'",
        f"error: {src}: images[1] (id 2): annotations[1]: segmentation size [9, 9] is not the record's [height, width] "
        "[40, 60]"], err
    assert "convert: 2 images, 1 failed, 1 instances ->" in stdout
    assert [i["file_name"] for i in json.loads(out.read_text())["images"]] == ["a.jpg"]


@pytest.mark.slow
def test_a_200_byte_file_cannot_make_convert_allocate_gigabytes(tmp_path):
    """A record that claims a 100000 x 100000 image (its RLE of that size, one run) used to make pycocotools
    allocate 10 GB per instance: refused from the record's size, in a process allowed 2 GiB of address space
    beyond what its imports took."""
    h = w = 100000
    rec = {"file": "a.jpg", "height": h, "width": w, "instances": [
        {"bbox": [0, 0, 1, 1], "score": 0.9, "category_id": 1, "segmentation": {"size": [h, w], "counts": [h * w]}}]}
    src = tmp_path / "big.json"
    src.write_text(json.dumps(rec))
    assert src.stat().st_size < 200
    code = ("import resource, sys; from minidet.apps.convert import main; import minidet.apps.outputs.formats; "
            "kb = int(next(x for x in open('/proc/self/status') if x.startswith('VmSize')).split()[1]); "
            "resource.setrlimit(resource.RLIMIT_AS, ((kb << 10) + (2 << 30),) * 2); sys.exit(main(sys.argv[1:]))")
    res = subprocess.run([sys.executable, "-c", code, str(src), "--to", "geojson", "--output",
                          str(tmp_path / "x.geojson")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr == (
        f"error: {src}: 100000 x 100000 = 10000000000 pixels exceeds --max-pixels (125000000, INPUT.MAX_PIXELS's "
        "default; 0: no limit) (nothing written)\n"), res.stderr
    assert not (tmp_path / "x.geojson").exists()


def test_empty_masks_left_out_are_counted(tmp_path, capsys):
    """YOLO-seg, CVAT and Label Studio have no empty shape: an instance whose mask is empty is left out, and the
    summary line says how many; COCO and GeoJSON keep it (no polygon)."""
    rec = _record("a.jpg")
    rec["instances"] += [_instance(_mask(40, 60)), _instance(_mask(40, 60), 0.5)]
    src = _write(tmp_path / "all.jsonl", [rec])
    for fmt, left in (("yolo-seg", 2), ("cvat", 2), ("labelstudio", 2), ("coco-dataset", 0), ("geojson", 0)):
        out = tmp_path / ("yolo" if fmt == "yolo-seg" else f"out.{fmt}")
        rc, stdout, _ = _convert(capsys, src, "--to", fmt, "--output", str(out))
        said = f", {left} with an empty mask left out ({fmt} has no empty shape)" if left else ""
        assert rc == 0 and f"convert: 1 images, 0 failed, {3 - left} instances{said} -> {out}" in stdout, stdout
    assert len((tmp_path / "yolo" / "labels" / "a.txt").read_text().splitlines()) == 1
    _, stdout, _ = _convert(capsys, src, "--to", "yolo-seg", "--output", str(tmp_path / "yolo"), "--score-thresh",
                            "0.7")
    assert "1 instances, 1 with an empty mask left out" in stdout


def test_an_instance_of_several_parts_stays_one_instance(tmp_path, capsys):
    """CVAT: the parts' polygons share a ``group_id``; Label Studio: a ``relation`` from the first part's region to
    each other part's."""
    rec = _record("a.jpg")
    rec["instances"].append(_instance(_mask(40, 60, (30, 2, 40, 8), (45, 20, 55, 30), (2, 30, 8, 38)), 0.8, 2,
                                      "dog"))
    rec["instances"].append(_instance(_mask(40, 60, (22, 20, 28, 26), (22, 30, 28, 36)), 0.7, 2, "dog"))
    src = _write(tmp_path / "all.jsonl", [rec])
    assert _convert(capsys, src, "--to", "cvat", "--output", str(tmp_path / "c.xml"))[0] == 0
    polys = ET.parse(tmp_path / "c.xml").getroot().findall("./image/polygon")
    assert [(p.get("label"), p.get("group_id")) for p in polys] == [("person", None), ("dog", "1"), ("dog", "1"),
                                                                   ("dog", "1"), ("dog", "2"), ("dog", "2")]
    assert _convert(capsys, src, "--to", "labelstudio", "--output", str(tmp_path / "ls.json"))[0] == 0
    result = json.loads((tmp_path / "ls.json").read_text())[0]["predictions"][0]["result"]
    regions = [r["id"] for r in result if r["type"] == "polygonlabels"]
    relations = [(r["from_id"], r["to_id"]) for r in result if r["type"] == "relation"]
    assert len(regions) == len(set(regions)) == 6
    assert relations == [(regions[1], regions[2]), (regions[1], regions[3]), (regions[4], regions[5])]


def _geotiff(path, h: int, w: int) -> None:
    import rasterio
    from rasterio.transform import from_origin

    with rasterio.open(path, "w", driver="GTiff", height=h, width=w, count=1, dtype="uint8", crs="EPSG:32633",
                       transform=from_origin(500000.0, 4500000.0, 10.0, 10.0)) as dst:
        dst.write(np.zeros((1, h, w), np.uint8))


@needs_extra("rasterio", "geo")
def test_geojson_reads_the_records_raster_or_refuses_in_one_line(tmp_path, capsys, monkeypatch):
    """The record's ``file`` is relative to the folder infer ran in: from there the polygons are in the raster's CRS;
    from another folder (no such file, or another image of that name) convert refuses instead of writing pixel
    coordinates without a CRS."""
    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir(), other.mkdir()
    _geotiff(run / "ortho.tif", 40, 60)
    src = _write(run / "all.jsonl", [_record("ortho.tif")])
    out = tmp_path / "out.geojson"
    monkeypatch.chdir(run)
    assert _convert(capsys, src, "--to", "geojson", "--output", str(out))[0] == 0
    assert json.loads(out.read_text())["crs"]["properties"]["name"] == "EPSG:32633"
    out.unlink()
    monkeypatch.chdir(other)
    rc, _, err = _convert(capsys, src, "--to", "geojson", "--output", str(out))
    assert rc == 2 and not out.exists() and err == (
        f"error: geojson: ortho.tif: not found from {other}, so its coordinate system cannot be read (a record's file "
        "is where minidet infer read it: run minidet convert in the folder infer ran in)\n")
    _geotiff(other / "ortho.tif", 30, 60)
    rc, _, err = _convert(capsys, src, "--to", "geojson", "--output", str(out))
    assert rc == 2 and not out.exists() and err.startswith(
        "error: geojson: ortho.tif is 60 x 30 pixels, its record's image 60 x 40: not the image infer read")


@pytest.mark.slow
@needs_extra("rasterio", "geo")
def test_a_record_whose_file_is_a_fifo_does_not_hang_geojson(tmp_path):
    os.mkfifo(tmp_path / "ortho.tif")
    src = _write(tmp_path / "all.jsonl", [_record("ortho.tif")])
    res = subprocess.run([sys.executable, "-m", "minidet.apps.convert", src, "--to", "geojson", "--output",
                          str(tmp_path / "x.geojson")], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: geojson: ortho.tif: not a regular file"), res.stderr


def test_security_md_states_the_codes_max_pixels():
    """SECURITY.md's default of ``INPUT.MAX_PIXELS`` is the code's."""
    from minidet.config import get_cfg

    text = (ROOT / "SECURITY.md").read_text()
    assert f"`INPUT.MAX_PIXELS` (default {get_cfg().INPUT.MAX_PIXELS:,};" in text


@pytest.mark.parametrize("option", [("--score-thresh", "nan"), ("--max-pixels", "-1")])
def test_convert_options_out_of_range_are_one_line(tmp_path, capsys, option):
    """``--score-thresh nan`` used to keep no detection without a word, ``--max-pixels -1`` to refuse every
    record."""
    src = _write(tmp_path / "all.jsonl", [_record("a.jpg")])
    with pytest.raises(SystemExit) as stop:
        _convert(capsys, src, "--to", "cvat", "--output", str(tmp_path / "x.xml"), *option)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.splitlines()[-1].startswith(f"minidet convert: error: argument {option[0]}:")
    assert not (tmp_path / "x.xml").exists()


@pytest.mark.parametrize("value", ["5", "1.01"])
def test_convert_score_thresh_above_1_is_one_usage_line(tmp_path, capsys, value):
    """Issue 56 item 7: ``--score-thresh 5`` was accepted (and kept no detection); scores are from 0 to 1."""
    src = _write(tmp_path / "all.jsonl", [_record("a.jpg")])
    with pytest.raises(SystemExit) as stop:
        _convert(capsys, src, "--to", "cvat", "--output", str(tmp_path / "x.xml"), "--score-thresh", value)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.splitlines()[-1] == f"minidet convert: error: argument --score-thresh: must be a score from 0 to 1, " \
                                   f"got {value}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("how", ["same", "dot", "symlink", "hardlink"])
def test_convert_refuses_to_overwrite_its_own_results_file(tmp_path, capsys, monkeypatch, fmt, how):
    """CV17: ``--output`` naming the results file itself (as written, through ``./``, a symbolic or a hard link;
    for yolo-seg, whose output is a folder: the folder whose data.yaml that is) is refused in one line before
    anything is written: the file is intact."""
    monkeypatch.chdir(tmp_path)
    name = "data.yaml" if fmt == "yolo-seg" else "all.jsonl"
    src = _write(tmp_path / name, [_record("a.jpg")])
    before = open(src, "rb").read()
    if how in ("symlink", "hardlink"):
        os.mkdir("out")
        (os.symlink if how == "symlink" else os.link)(src, os.path.join("out", name))
    target = {"same": name, "dot": f"./{name}", "symlink": "out/all.jsonl", "hardlink": "out/all.jsonl"}[how]
    if fmt == "yolo-seg":
        target = {"same": ".", "dot": "./"}.get(how, "out")
    rc, stdout, err = _convert(capsys, src, "--to", fmt, "--output", target)
    assert rc == 2 and stdout == "", (stdout, err)
    assert err.splitlines() == [f"error: --output {target}: would overwrite the results file being converted ({src}); "
                                "choose another path"]
    assert open(src, "rb").read() == before and not os.path.exists("labels") and not os.path.exists("out/labels")
