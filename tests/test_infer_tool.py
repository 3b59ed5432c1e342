"""tools/infer.py end to end on a random-init torchvision checkpoint, plus its helpers: in this process, and in
a real one where the process is what is tested (Ctrl-C)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from helpers import call_tool, load_tool
from minidet.apps.synthetic import structured_image
from minidet.categories import COCO_CATEGORIES

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "infer.py"
CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
# Small inputs and few proposals keep the CPU run short; score threshold 0 so that a
# random-init model still yields instances to check the output schema on.
FAST = [
    "INPUT.MIN_SIZE_TEST", "320", "INPUT.MAX_SIZE_TEST", "512",
    "MODEL.RPN.PRE_NMS_TOPK_TEST", "300", "MODEL.RPN.POST_NMS_TOPK_TEST", "100",
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.0", "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "5",
]

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _run(capfd, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The tool in this process, its status and output as a subprocess run would give them."""
    return call_tool(TOOL, *args, capture=capfd, cwd=cwd)


# tv_file_init (conftest.py): torchvision's Mask R-CNN as initialized, no trained weights


@pytest.mark.slow
def test_end_to_end(tmp_path, capfd, tv_file_init):
    (tmp_path / "sub").mkdir()
    a = tmp_path / "scene.png"
    b = tmp_path / "sub" / "scene.jpg"  # same stem as a, another folder: written as sub/scene.*
    bad = tmp_path / "broken.jpg"
    cv2.imwrite(str(a), structured_image(240, 320, seed=1))
    cv2.imwrite(str(b), structured_image(300, 200, seed=2))
    bad.write_text("this is not a jpeg\n")
    out = tmp_path / "out"

    res = _run(
        capfd, "--config-file", str(CONFIG), "--input", str(a), str(b), str(bad), "--output", str(out),
        "MODEL.WEIGHTS", str(tv_file_init), *FAST, cwd=tmp_path,
    )
    assert res.returncode == 1, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {bad}: not a recognized image format"]
    assert "Traceback" not in res.stderr

    # timing table and summary
    assert "stage" in res.stdout and "mean ms" in res.stdout
    for stage in ("backbone", "rpn", "box_head", "mask_head", "total"):
        assert f"\n{stage}" in res.stdout, stage
    assert f"infer: 3 inputs, 1 failed, 10 instances, output in {out}" in res.stdout
    assert "infer: this run 2 images and video frames in " in res.stdout

    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and ".chunks" not in p.parts)
    assert written == ["scene.jpg", "scene.json", "sub/scene.jpg", "sub/scene.json"]
    by_id = dict(COCO_CATEGORIES)
    for stem, src, (h, w) in [("scene", a, (240, 320)), ("sub/scene", b, (300, 200))]:
        vis = cv2.imread(str(out / f"{stem}.jpg"))
        assert vis is not None and vis.shape == (h, w, 3)
        doc = json.loads((out / f"{stem}.json").read_text())
        assert set(doc) == {"file", "height", "width", "instances"}
        assert (doc["file"], doc["height"], doc["width"]) == (str(src), h, w)
        assert len(doc["instances"]) == 5
        scores = [inst["score"] for inst in doc["instances"]]
        assert scores == sorted(scores, reverse=True)
        for inst in doc["instances"]:
            assert set(inst) == {"bbox", "score", "category_id", "category_name", "segmentation"}
            x, y, bw, bh = inst["bbox"]
            assert all(isinstance(v, float) for v in inst["bbox"])
            assert 0 <= x <= x + bw <= w + 1e-3 and 0 <= y <= y + bh <= h + 1e-3
            assert 0.0 <= inst["score"] <= 1.0
            # a random model may pick one of coco91's ten unused slots: id -1, name "N/A"
            assert by_id.get(inst["category_id"], "N/A") == inst["category_name"]
            seg = inst["segmentation"]
            assert seg["size"] == [h, w] and isinstance(seg["counts"], str)
            mask = mask_utils.decode(seg)
            assert mask.shape == (h, w) and mask.dtype == np.uint8


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_leaves_complete_outputs_and_no_traceback(tmp_path, tv_file_init, signum, status):
    """Ctrl-C (status 130) and SIGTERM (143: ``errors.Interrupted``) stop the run between files, one line."""
    images = []  # enough inputs that the run is still going when the SIGINT comes, even on a loaded machine
    for k in range(24):
        images.append(tmp_path / f"img{k}.png")
        cv2.imwrite(str(images[-1]), structured_image(240, 320, seed=k))
    out = tmp_path / "out"
    cmd = [sys.executable, str(TOOL), "--config-file", str(CONFIG), "--input", *map(str, images),
           "--output", str(out), "MODEL.WEIGHTS", str(tv_file_init), *FAST]
    env = {**os.environ, "PYTHONPATH": ""}
    # SIGINT as at a terminal, whatever the suite was started from: a background job ignores it, and Python turns
    # it into KeyboardInterrupt only where it is not ignored
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline and not (out.is_dir() and list(out.glob("*.json"))):
        time.sleep(0.05)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"error: interrupted; finished work is kept in {out / '.chunks'}: rerun the same command with --resume "
        "to do the rest")
    done = sorted(out.glob("*.json"))
    assert 1 <= len(done) < len(images)
    for path in done:  # whatever was written is whole
        assert json.loads(path.read_text())["height"] == 240
        assert cv2.imread(str(path.with_suffix(".jpg"))).shape == (240, 320, 3)
    assert not [p for p in out.iterdir() if p.suffix == ".tmp"]


def test_bad_config_key(tmp_path, capfd, tv_file_init):
    img = tmp_path / "a.png"
    cv2.imwrite(str(img), structured_image(64, 64, seed=0))
    res = _run(
        capfd, "--config-file", str(CONFIG), "--input", str(img), "--output", str(tmp_path / "o"),
        "MODEL.WEIGHTS", str(tv_file_init), "MODEL.NO_SUCH_KEY", "1", cwd=tmp_path,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == "error: unknown config key: MODEL.NO_SUCH_KEY"
    assert not (tmp_path / "o").exists()


def test_missing_weights_and_inputs(tmp_path, capfd):
    img = tmp_path / "a.png"
    cv2.imwrite(str(img), structured_image(64, 64, seed=0))
    missing = tmp_path / "missing.pth"
    res = _run(
        capfd, "--config-file", str(CONFIG), "--input", str(img), "--output", str(tmp_path / "o"),
        "MODEL.WEIGHTS", str(missing), cwd=tmp_path,
    )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(missing) in lines[0]
    assert "Traceback" not in res.stderr

    res = _run(
        capfd, "--config-file", str(CONFIG), "--input", str(tmp_path / "nope.jpg"), "--output", str(tmp_path / "o"),
        cwd=tmp_path,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: no such file or folder: {tmp_path / 'nope.jpg'}"


def test_unique_stems():
    from minidet.apps.bulk import infer_job as tool

    got = tool.unique_stems(["x.jpg", "x.png", "x_1.jpg", "x.jpeg", "a/x.jpg", "y.jpg"])
    assert got == ["x", "x_1", "x_1_1", "x_2", "a/x", "y"]


def test_overrides_after_input_are_recovered(tmp_path):
    tool = load_tool(TOOL)
    args = tool.parse_args(
        ["--config-file", "c.yaml", "--output", "o", "--input", "a.jpg", "b.jpg", "MODEL.DEVICE", "cpu"]
    )
    assert args.input == ["a.jpg", "b.jpg"] and args.opts == ["MODEL.DEVICE", "cpu"]
    args = tool.parse_args(["--config-file", "c.yaml", "--input", "a.jpg", "--output", "o", "INPUT.MIN_SIZE_TEST", "9"])
    assert args.input == ["a.jpg"] and args.opts == ["INPUT.MIN_SIZE_TEST", "9"]


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e300"])
def test_polygon_tolerance_out_of_range_is_one_usage_line(value, capsys):
    """OpenCV refuses a huge simplification (1e300 took the run down): the option's range is checked first."""
    tool = load_tool(TOOL)
    with pytest.raises(SystemExit) as e:
        tool.parse_args(["--config-file", "c.yaml", "--input", "a.jpg", "--output", "o", "--polygon-tolerance", value])
    assert e.value.code == 2
    assert "--polygon-tolerance must be a number of pixels from 0 to 10000" in capsys.readouterr().err


def test_dumps_record_and_atomic_write(tmp_path):
    from minidet.apps.outputs import fileio, records

    doc = {
        "file": "a.jpg",
        "height": 2,
        "width": 3,
        "instances": [{"bbox": [0.0, 1.0, 2.0, 1.0], "score": 0.5}],
    }
    assert json.loads(records.dumps_record(doc)) == doc
    empty = {**doc, "instances": []}
    assert json.loads(records.dumps_record(empty)) == empty
    target = tmp_path / "r.json"
    fileio.atomic_write(str(target), b"first")
    fileio.atomic_write(str(target), b"second")
    assert target.read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["r.json"]
