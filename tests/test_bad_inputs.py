"""A corpus of bad inputs, generated here: checkpoints (corrupt, empty, code-execution payloads,
other formats and architectures), configs, annotation and results files, and images run through
tools/infer.py and tools/eval_coco.py. Each case must give one line naming the file or key and
what is wrong, run no code from a file, and let the tools go on with the rest where they can.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
from functools import cache
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import minidet
from helpers import call_tool, config, load_tool, one_error_line, run_tool
from minidet.apps.synthetic import structured_image
from minidet.checkpoint import CheckpointError, load_checkpoint
from minidet.imageio import DEFAULT_MAX_PIXELS
from minidet.testing.checkpoints import d2_weights
from test_imageio import _forged_png, _with_exif
from test_infer_tool import FAST as INFER_FAST

ROOT = Path(__file__).resolve().parent.parent
INFER = ROOT / "tools" / "infer.py"
EVAL = ROOT / "tools" / "eval_coco.py"
TV_CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
D2_CONFIG = ROOT / "configs" / "detectron2" / "mask_rcnn_R_50_FPN_3x.yaml"
TINY = ROOT.parent / "shared" / "data" / "coco_tiny"
# test_infer_tool's quick settings (few proposals, 5 detections at any score), with a smaller short
# side and the default long-side cap, which keeps a 10000 x 16 image 2 pixels wide
FAST = [*INFER_FAST, "INPUT.MIN_SIZE_TEST", "160", "INPUT.MAX_SIZE_TEST", "1333"]

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _run(tool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_tool(tool, *args, cwd=cwd, threads=1, timeout=900)


def _main(capfd, tool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``_run`` in this process: the status and output a subprocess would give."""
    return call_tool(tool, *args, capture=capfd, cwd=cwd, threads=1)


# tv_state, tv_file (conftest.py): torchvision's initial weights with confident classes: detections to check


def _cfg(path: Path = TV_CONFIG, *opts) -> minidet.config.CfgNode:
    return config(path, *opts)


@cache
def _model(config: Path = TV_CONFIG, *opts):
    """One model per configuration for the whole module (a failed load leaves it usable)."""
    return minidet.build_model(_cfg(config, *opts))


def _load_error(path: Path, config: Path = TV_CONFIG, *opts) -> str:
    cfg = _cfg(config, *opts)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(_model(config, *opts), str(path), cfg.MODEL.FROZEN_BN_EPS, convention=cfg.MODEL.CONVENTION)
    text = str(info.value)
    assert "\n" not in text and str(path) in text
    return text


# ------------------------------------------------------------------------------ checkpoints


class _Payload:
    """Pickles as a call of ``func(arg)``: what a malicious checkpoint carries."""

    def __init__(self, func, arg: str) -> None:
        self.func, self.arg = func, arg

    def __reduce__(self):
        return (self.func, (self.arg,))


def _payloads(marker: Path) -> dict[str, bytes]:
    """Pickles that would create ``marker`` if anything in them ran."""
    touch = f"touch {marker}"
    code = f"open({str(marker)!r}, 'w').close()"
    arrays = {"conv1_w": np.zeros((2, 3), np.float32), "res2_0_branch2a_w": np.ones(4, np.float32)}
    return {
        "os.system, protocol 2, among arrays": pickle.dumps({"blobs": {**arrays, "x": _Payload(os.system, touch)}}, 2),
        "os.system, protocol 0": pickle.dumps(_Payload(os.system, touch), 0),
        "builtins.eval, protocol 4": pickle.dumps({"model": {"w": _Payload(eval, code)}}, 4),
        "builtins.exec, protocol 5": pickle.dumps([_Payload(exec, code)], 5),
        # hand-written: a known numpy gadget that execs its argument (never imported here)
        "numpy runstring, protocol 0": b"cnumpy.testing._private.utils\nrunstring\n(V" + code.encode() + b"\n(dtR.",
    }


@pytest.mark.parametrize("ext", [".pkl", ".pth"])
def test_code_execution_payloads_are_refused_unrun(tmp_path, ext):
    """Whatever the name and protocol, a pickle asking for a callable is refused, naming it."""
    marker = tmp_path / "payload_ran"
    for k, (what, data) in enumerate(_payloads(marker).items()):
        path = tmp_path / f"evil{k}{ext}"
        path.write_bytes(data)
        text = _load_error(path)
        assert re.search(r"refused: the pickle asks for (posix\.system|os\.system|builtins\.eval|builtins\.exec|"
                         r"numpy\.testing\._private\.utils\.runstring)", text), (what, text)
        assert "nothing was run" in text, (what, text)
    path = tmp_path / f"evil_zip{ext}"  # a torch.save archive, the usual .pth, carrying the payload
    torch.save({"backbone.body.conv1.weight": torch.zeros(1), "x": _Payload(os.system, f"touch {marker}")}, path)
    assert re.search(r"refused: the pickle asks for (posix|os)\.system", _load_error(path))
    assert not marker.exists()


def test_corrupt_and_empty_files(tmp_path, tv_file):
    data = tv_file.read_bytes()
    rng = np.random.default_rng(0)
    d2 = pickle.dumps({"model": {"backbone.bottom_up.stem.conv1.weight": np.zeros(1, np.float32)}}, 2)
    cases = {
        "truncated.pth": (data[: len(data) // 2], "cannot read as a torch checkpoint: PytorchStreamReader failed"),
        "truncated.pkl": (d2[: len(d2) // 2], "cannot read as a Detectron pickle: pickle data was truncated"),
        "random.pth": (rng.bytes(4096), "cannot read as a torch checkpoint: not a torch.save file, or a corrupt one"),
        "random.pkl": (rng.bytes(4096), "cannot read as a Detectron pickle"),
        "zero.pth": (b"", "cannot read as a torch checkpoint"),
        "empty_dict.pkl": (pickle.dumps({}), "holds no weights (an empty dict)"),
        "empty_blobs.pkl": (pickle.dumps({"blobs": {}}), "holds no weights (an empty dict)"),
        "strings.pkl": (pickle.dumps({"conv1_w": np.array(["a", "b"])}), "entry 'conv1_w' is an array of <U1"),
        "list.pkl": (pickle.dumps([1, 2, 3]), "expected a dict of tensors, got list"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        assert message in _load_error(path), name
    torch.save({}, tmp_path / "empty_dict.pth")
    assert "holds no weights (an empty dict)" in _load_error(tmp_path / "empty_dict.pth")
    torch.save({"features.0.weight": torch.zeros(3)}, tmp_path / "other_model.pth")
    assert "unrecognized checkpoint layout (first keys: features.0.weight)" in _load_error(tmp_path / "other_model.pth")
    bad = {k: v.clone() if k == "backbone.body.conv1.weight" else v for k, v in torch.load(tv_file).items()}
    bad["backbone.body.conv1.weight"][0, 0, 0, 0] = float("nan")
    torch.save(bad, tmp_path / "nan.pth")
    assert "backbone.body.conv1.weight holds NaN or infinite values" in _load_error(tmp_path / "nan.pth")


@pytest.mark.slow
def test_file_content_decides_the_reader(tmp_path, tv_file):
    """A torch archive named .pkl and a numpy pickle named .pth both load, by their content."""
    model = _model()
    (tmp_path / "tv.pkl").write_bytes(tv_file.read_bytes())
    assert load_checkpoint(model, str(tmp_path / "tv.pkl"), 0.0, convention="torchvision").format == "torchvision"
    d2_path = tmp_path / "d2.pth"
    d2_path.write_bytes(pickle.dumps({"model": d2_weights(50)}, 4))
    assert load_checkpoint(_model(D2_CONFIG), str(d2_path), 1e-5, convention="detectron2").format == "detectron2"
    text = _load_error(d2_path)  # the same file with a torchvision config
    assert text.endswith("a detectron2 checkpoint needs MODEL.CONVENTION detectron2, the config has torchvision; "
                         "see configs/detectron2/")


@pytest.mark.slow
def test_architecture_mismatches_name_the_key_to_change(tmp_path, tv_state):
    torch.save(tv_state, tmp_path / "r50.pth")
    text = _load_error(tmp_path / "r50.pth", TV_CONFIG, "MODEL.RESNETS.DEPTH", 101)
    assert text.endswith("r50.pth: ResNet-50 (res4 has 6 blocks) but the model has 23; set MODEL.RESNETS.DEPTH 50")
    deeper = dict(tv_state)  # res4 (torchvision layer3) with 23 blocks: a ResNet-101 (shared tensors, small file)
    for b in range(6, 23):
        for k, v in tv_state.items():
            if k.startswith("backbone.body.layer3.5."):
                deeper[k.replace("layer3.5.", f"layer3.{b}.")] = v
    torch.save(deeper, tmp_path / "r101.pth")
    assert "ResNet-101 (res4 has 23 blocks) but the model has 6; set MODEL.RESNETS.DEPTH 101" in _load_error(
        tmp_path / "r101.pth"
    )
    text = _load_error(tmp_path / "r50.pth", TV_CONFIG, "MODEL.ROI_HEADS.NUM_CLASSES", 81)
    assert "shape mismatch for box_predictor.cls_score.weight: checkpoint (91, 1024) vs model (81, 1024)" in text
    assert "the checkpoint has 91 class logits: MODEL.ROI_HEADS.NUM_CLASSES" in text
    odd = dict(tv_state)
    odd["backbone.body.layer2.0.conv2.weight"] = torch.zeros(128, 128, 5, 5)
    torch.save(odd, tmp_path / "odd.pth")
    assert _load_error(tmp_path / "odd.pth").endswith(
        "odd.pth: shape mismatch for backbone.res3.0.conv2.weight: "
        "checkpoint (128, 128, 5, 5) vs model (128, 128, 3, 3)"
    )


def test_norm_kind_mismatch(tmp_path, tv_file):
    gn = minidet.build_model(_cfg(TV_CONFIG, "MODEL.NORM", "GN"))
    torch.save(gn.state_dict(), tmp_path / "gn.pth")
    assert "backbone.stem.conv1.norm.{bias, weight} has no running statistics (a GroupNorm checkpoint?) but " \
           "MODEL.NORM is FrozenBN" in _load_error(tmp_path / "gn.pth")
    assert "holds batch-norm statistics but MODEL.NORM is GN" in _load_error(tv_file, TV_CONFIG, "MODEL.NORM", "GN")


# ------------------------------------------------------------------------------ configs


def _infer_in_process(capsys, tmp_path, config: Path, *opts: str, debug: bool = False) -> tuple[int, str]:
    img = tmp_path / "a.png"
    cv2.imwrite(str(img), structured_image(32, 32, seed=0))
    argv = ["--config-file", str(config), "--input", str(img), "--output", str(tmp_path / "out"), *opts]
    rc = load_tool(INFER).main(argv + (["--debug"] if debug else []))
    return rc, capsys.readouterr().err


def test_config_errors_one_line_each(tmp_path, capsys):
    cases = {
        "unknown_key.yaml": (
            "_BASE_: {base}\nMODEL:\n  NROM: GN\n",
            "unknown_key.yaml: unknown config key: MODEL.NROM",
        ),
        "wrong_type.yaml": (
            "_BASE_: {base}\nINPUT:\n  MIN_SIZE_TEST: large\n",
            "wrong_type.yaml: config key INPUT.MIN_SIZE_TEST: expected int (like 800), got 'large'",
        ),
        "bad_norm.yaml": (
            "_BASE_: {base}\nMODEL:\n  NORM: BatchNorm\n",
            "MODEL.NORM must be one of FrozenBN, BN, Affine, GN",
        ),
        "fold_gn.yaml": (
            "_BASE_: {base}\nMODEL:\n  NORM: GN\n  FOLD_NORM: True\n",
            "MODEL.FOLD_NORM applies to FrozenBN/BN/Affine only; GroupNorm cannot be folded",
        ),
        "no_base.yaml": ("_BASE_: nowhere/base.yaml\n", "no_base.yaml: _BASE_ file not found: nowhere/base.yaml"),
        "not_yaml.yaml": ("MODEL: [unclosed\n", "not_yaml.yaml:2:1: not valid YAML"),
        "a_list.yaml": ("- MODEL\n", "a_list.yaml: expected a mapping of config keys at top level"),
        "group_as_value.yaml": ("MODEL:\n  RESNETS: 50\n", "config key MODEL.RESNETS: expected a mapping, got 50"),
        "cycle.yaml": ("_BASE_: cycle.yaml\n", "cycle.yaml: _BASE_ cycle"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text.format(base=TV_CONFIG))
        rc, err = _infer_in_process(capsys, tmp_path, path, "MODEL.WEIGHTS", "")
        assert rc == 2 and message in one_error_line(err), (name, err)
    rc, err = _infer_in_process(capsys, tmp_path, TV_CONFIG, "MODEL.WEIGHTS", "", "MODEL.RESNETS.DEPTH", "34")
    assert rc == 2 and "MODEL.RESNETS.DEPTH must be one of 50, 101, 152; got 34" in one_error_line(err)
    rc, err = _infer_in_process(capsys, tmp_path, tmp_path / "absent.yaml")
    assert rc == 2 and one_error_line(err) == f"error: config file not found: {tmp_path / 'absent.yaml'}"
    rc, err = _infer_in_process(capsys, tmp_path, tmp_path / "unknown_key.yaml", debug=True)
    assert rc == 2 and "Traceback" in err and err.strip().endswith("unknown config key: MODEL.NROM")


def test_checkpoint_errors_through_the_tool(tmp_path, capsys):
    marker = tmp_path / "payload_ran"
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps({"blobs": {"x": _Payload(os.system, f"touch {marker}")}}, 2))
    rc, err = _infer_in_process(capsys, tmp_path, TV_CONFIG, "MODEL.WEIGHTS", str(evil))
    assert rc == 2 and one_error_line(err).startswith(f"error: {evil}: refused: the pickle asks for ")
    assert not marker.exists()


# ------------------------------------------------------------------------------ annotation and results files


@pytest.fixture
def dataset(tmp_path) -> Path:
    """A valid two-image annotation file."""
    ann = tmp_path / "ann.json"
    box = {"iscrowd": 0, "area": 100.0, "bbox": [1, 1, 10, 10], "segmentation": [[1, 1, 11, 1, 11, 11, 1, 11]]}
    anns = [{"id": k, "image_id": k, "category_id": c, **box} for k, c in ((1, 1), (2, 3))]
    ann.write_text(json.dumps({
        "images": [{"id": i, "file_name": f"{i}.jpg", "height": 20, "width": 30} for i in (1, 2)],
        "annotations": anns,
        "categories": [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}],
    }))
    return ann


def _eval_in_process(capsys, *argv: str) -> tuple[int, str]:
    rc = load_tool(EVAL).main(list(argv))
    return rc, capsys.readouterr().err


def test_annotation_file_errors_one_line_each(tmp_path, capsys, dataset):
    good = json.loads(dataset.read_text())

    def variant(change) -> dict:
        data = json.loads(json.dumps(good))
        change(data)
        return data

    cases = {
        "truncated.json": (dataset.read_text()[:70], "not valid JSON ("),
        "no_images.json": ({"annotations": [], "categories": []}, "not a COCO annotation file (no 'images' list)"),
        "no_height.json": (
            variant(lambda d: d["images"][1].pop("height")),
            "images[1] needs 'id', 'file_name', 'height'",
        ),
        "string_id.json": (
            variant(lambda d: d["images"][0].update(id="one")),
            "images[0]: 'id', 'height' and 'width' must",
        ),
        "unknown_category.json": (
            variant(lambda d: d["annotations"][1].update(category_id=7)),
            "annotations[1]: category_id 7 is not in 'categories'",
        ),
        "unknown_image.json": (
            variant(lambda d: d["annotations"][0].update(image_id=9)),
            "annotations[0]: image_id 9 is not in 'images'",
        ),
        "repeated_id.json": (
            variant(lambda d: d["annotations"][1].update(id=1)),
            "annotations[1]: annotation id 1 is not an integer or appears twice",
        ),
        "bad_bbox.json": (variant(lambda d: d["annotations"][0].update(bbox=[1, 2])), "annotations[0]: 'bbox' must be"),
        "missing.json": (None, "annotation file not found"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
        for argv in (
            ["--ann", str(path), "--results", str(tmp_path / "r.json"), "--output", str(tmp_path / "o")],
            ["--config-file", str(TV_CONFIG), "--ann", str(path), "--images", str(tmp_path), "--output",
             str(tmp_path / "o")],
        ):
            rc, err = _eval_in_process(capsys, *argv)
            line = one_error_line(err)
            assert rc == 2 and str(path) in line and message in line, (name, line)
    assert not (tmp_path / "o").exists()
    rc, err = _eval_in_process(capsys, "--ann", str(tmp_path / "truncated.json"), "--results", "r.json",
                               "--output", str(tmp_path / "o"), "--debug")
    assert rc == 2 and "Traceback" in err and "not valid JSON" in err.strip().splitlines()[-1]


def test_results_file_errors_one_line_each(tmp_path, capsys, dataset):
    det = {"image_id": 1, "category_id": 1, "bbox": [1, 1, 10, 10], "score": 0.9}
    cases = {
        "empty.json": ([], "no detections (empty list); nothing to evaluate"),
        "object.json": ({"annotations": [det]}, "COCO results must be a JSON list of detections, got dict"),
        "no_score.json": ([det, {k: v for k, v in det.items() if k != "score"}], "entry 1: no 'score'"),
        "other_image.json": ([{**det, "image_id": 5}], "entry 0: image_id 5 is not an image of the annotation file"),
        "broken.json": ('[{"image_id": 1, "category', "not valid JSON"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        rc, err = _eval_in_process(
            capsys, "--ann", str(dataset), "--results", str(path), "--output", str(tmp_path / "o")
        )
        line = one_error_line(err)
        assert rc == 2 and line.startswith(f"error: {path}: ") and message in line, (name, line)
    # detections of categories the dataset does not have: told in one line, left out, the rest evaluated
    path = tmp_path / "other_category.json"
    path.write_text(json.dumps([det, {**det, "category_id": 90}, {**det, "category_id": 2}]))
    rc, err = _eval_in_process(capsys, "--ann", str(dataset), "--results", str(path), "--output", str(tmp_path / "o"))
    assert rc == 0 and err.strip().splitlines() == [
        f"warning: {path}: results cover 1 of 2 annotated images; the other 1 count as images without detections "
        "(--only-result-images evaluates the 1 alone)",
        f"warning: {path}: 2 detections of categories that are not in {dataset} (e.g. 90) are left out",
    ]
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["bbox"]["AP"] == pytest.approx(
        0.5
    )  # person 1, car 0


# ------------------------------------------------------------------------------ images through the tools


def _image_corpus(folder: Path) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Write every kind of image file into ``folder``. Returns the readable ones with their
    displayed (height, width), and the bad ones with the message each must get."""
    from PIL import Image

    folder.mkdir()
    base = structured_image(96, 128, seed=4)
    good: dict[str, tuple[int, int]] = {}

    def png(name, arr):
        cv2.imwrite(str(folder / name), arr)
        good[name] = arr.shape[:2]

    png("gray.png", cv2.cvtColor(base, cv2.COLOR_BGR2GRAY))
    png("rgba.png", np.dstack([base, np.full(base.shape[:2], 128, np.uint8)]))
    png("deep16.png", base.astype(np.uint16) * 257)
    png("one_pixel.png", base[:1, :1])
    png("tall.png", np.ascontiguousarray(np.tile(base[:, :16], (105, 1, 1))[:10000]))  # 10000 x 16
    pal = Image.fromarray(base[:, :, ::-1]).convert("P", palette=Image.ADAPTIVE, colors=16)
    pal.save(folder / "palette.png")
    good["palette.png"] = (96, 128)
    Image.fromarray(base[:, :, ::-1]).convert("CMYK").save(folder / "cmyk.jpg", "JPEG")
    good["cmyk.jpg"] = (96, 128)
    ok, jpg = cv2.imencode(".jpg", base)
    (folder / "rotated.jpg").write_bytes(_with_exif(jpg.tobytes(), 6))  # stored 128 wide, shown 96 wide
    good["rotated.jpg"] = (128, 96)
    ok, png_bytes = cv2.imencode(".png", base)
    (folder / "png_named.jpg").write_bytes(png_bytes.tobytes())
    good["png_named.jpg"] = (96, 128)

    bad = {
        "zero.jpg": "empty file (0 bytes)",
        "truncated.jpg": "cannot decode JPEG data (truncated or corrupt)",
        "text.jpg": "not a recognized image format",
        "bomb.png": f"60000 x 60000 = 3600000000 pixels exceeds INPUT.MAX_PIXELS ({DEFAULT_MAX_PIXELS})",
        "sliver.png": "ValueError: image 0: 4000 x 1 is too elongated: with its long side resized to at most "
        "INPUT.MAX_SIZE_TEST 1333, its short side would be under one pixel",
    }
    (folder / "zero.jpg").write_bytes(b"")
    (folder / "truncated.jpg").write_bytes(jpg.tobytes()[: len(jpg) // 2])
    (folder / "text.jpg").write_text("this is a text file with a .jpg name\n")
    (folder / "bomb.png").write_bytes(_forged_png(60000, 60000))
    cv2.imwrite(str(folder / "sliver.png"), np.ascontiguousarray(np.tile(base[:1], (1, 32, 1))[:, :4000]))
    return good, bad


def test_infer_on_the_image_corpus(tmp_path, capfd, tv_file):
    """One run over every kind of image: an error line per bad file, outputs for every good one
    (EXIF-rotated: in the displayed frame), exit 1, no traceback; --debug adds the model's tracebacks."""
    images = tmp_path / "images"
    good, bad = _image_corpus(images)
    out = tmp_path / "out"
    res = _main(capfd, INFER, "--config-file", str(TV_CONFIG), "--input", str(images), "--output", str(out),
                "MODEL.WEIGHTS", str(tv_file), *FAST, cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    errors = sorted(line for line in res.stderr.splitlines() if line.startswith("error:"))
    assert errors == sorted(f"error: {images / name}: {message}" for name, message in bad.items())
    assert f"infer: {len(good) + len(bad)} inputs, {len(bad)} failed," in res.stdout
    stems = {Path(n).stem for n in good}
    assert sorted(os.listdir(out)) == [".chunks", *sorted(f"{s}{e}" for s in stems for e in (".jpg", ".json"))]
    for name, (h, w) in good.items():
        doc = json.loads((out / f"{Path(name).stem}.json").read_text())
        assert (doc["height"], doc["width"]) == (h, w), name
        assert cv2.imread(str(out / f"{Path(name).stem}.jpg")).shape == (h, w, 3)
        assert len(doc["instances"]) == 5, name
        for inst in doc["instances"]:
            x, y, bw, bh = inst["bbox"]
            assert 0 <= x <= x + bw <= w + 1e-3 and 0 <= y <= y + bh <= h + 1e-3, (name, inst["bbox"])
            assert inst["segmentation"]["size"] == [h, w]

    res = _main(capfd, INFER, "--config-file", str(TV_CONFIG), "--input", str(images / "text.jpg"),
                str(images / "sliver.png"), "--output", str(out), "--debug", "MODEL.WEIGHTS", str(tv_file),
                *FAST, cwd=tmp_path)
    # the model's failure gets its traceback; a file the loader cannot read is its one line (as in eval_coco)
    assert res.returncode == 1 and res.stderr.count("Traceback") == 1, res.stderr
    assert [line for line in res.stderr.splitlines() if line.startswith("error:")] == [  # in sorted path order
        f"error: {images / 'sliver.png'}: {bad['sliver.png']}",
        f"error: {images / 'text.jpg'}: {bad['text.jpg']}",
    ]


@pytest.mark.skipif(not TINY.is_dir(), reason=f"needs ../shared/data/coco_tiny ({TINY} is absent)")
def test_eval_skips_an_image_the_model_cannot_take(tmp_path, capfd, tv_file):
    """An image that reads fine but that the model refuses (too elongated) is skipped with one
    line, in a batch with a good image that is still evaluated; exit 1."""
    src = json.loads((TINY / "annotations" / "instances_val2017.json").read_text())
    first = min(src["images"], key=lambda m: m["id"])
    images = tmp_path / "images"
    images.mkdir()
    (images / first["file_name"]).write_bytes((TINY / "val2017" / first["file_name"]).read_bytes())
    cv2.imwrite(str(images / "sliver.png"), np.full((1, 4000, 3), 90, np.uint8))
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps({
        "images": [first, {"id": 1, "file_name": "sliver.png", "height": 1, "width": 4000}],
        "annotations": [a for a in src["annotations"] if a["image_id"] == first["id"]],
        "categories": src["categories"],
    }))
    res = _main(capfd, EVAL, "--config-file", str(TV_CONFIG), "--ann", str(ann), "--images", str(images),
                "--output", str(tmp_path / "out"), "--workers", "0", "MODEL.WEIGHTS", str(tv_file),
                "TEST.IMS_PER_BATCH", "2", *FAST, cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert [line for line in res.stderr.splitlines() if line.startswith("error:")] == [
        f"error: {images / 'sliver.png'}: ValueError: image 0: 4000 x 1 is too elongated: with its long side "
        "resized to at most INPUT.MAX_SIZE_TEST 1333, its short side would be under one pixel (skipped)"
    ]
    done = json.loads((tmp_path / "out" / "images.json").read_text())
    assert done["evaluated"] == [first["id"]] and [s["image_id"] for s in done["skipped"]] == [1]
    results = json.loads((tmp_path / "out" / "coco_instances_results.json").read_text())
    assert results and {r["image_id"] for r in results} == {first["id"]}
