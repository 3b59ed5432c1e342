"""A damaged video (a real mp4 written here by OpenCV, its middle bytes overwritten): decoding stops before the
frame count its container announces. It is one ``error:`` line (the file, frames read of announced, where it
stopped), counted as incomplete in the summary (exit status 1), its outputs of the frames read kept and redone by
``--resume``; FFmpeg's messages are captured (on stderr only with ``--debug``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import pytest

from helpers import call_tool
from minidet.apps.outputs.video import VideoReader
from minidet.apps.synthetic import structured_image
from minidet.imageio import native_messages

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "infer.py"
CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
FAST = ["INPUT.MIN_SIZE_TEST", "120", "INPUT.MAX_SIZE_TEST", "160", "MODEL.RPN.PRE_NMS_TOPK_TEST", "100",
        "MODEL.RPN.POST_NMS_TOPK_TEST", "50", "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "5"]
FRAMES, FPS, SIZE = 12, 10.0, (160, 120)
FFMPEG_LINE = re.compile(r"^\[\w[\w,]* @ 0x[0-9a-f]+\]", re.M)  # FFmpeg's own "[mpeg4 @ 0x55d0...] ..." lines
SHORT = re.compile(r"damaged video: (\d+) of its 12 frames read, decoding stopped at frame (\d+) \((\d+\.\d\d) s\)")

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _write(path: Path) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, SIZE)
    assert writer.isOpened()
    for k in range(FRAMES):
        writer.write(structured_image(SIZE[1], SIZE[0], seed=k))
    writer.release()


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> tuple[Path, Path]:
    """``(good.mp4, damaged.mp4)``: 12 frames each; the damaged one has its middle third zeroed (its index, at the
    end of the file, still announces 12 frames)."""
    folder = tmp_path_factory.mktemp("videos")
    good, damaged = folder / "good.mp4", folder / "damaged.mp4"
    _write(good)
    data = bytearray(good.read_bytes())
    n = len(data)
    data[n // 3 : 2 * n // 3] = bytes(2 * n // 3 - n // 3)
    damaged.write_bytes(bytes(data))
    cap = cv2.VideoCapture(str(damaged))
    assert cap.get(cv2.CAP_PROP_FRAME_COUNT) == FRAMES
    cap.release()
    return good, damaged


def test_reader_says_where_a_damaged_video_stops(videos, capfd):
    good, damaged = videos
    reader = VideoReader(str(good))
    assert len(list(reader)) == FRAMES and reader.shortfall() is None and reader.warning() is None

    reader = VideoReader(str(damaged), every=2)
    frames = list(reader)
    read = reader.decoded
    assert 0 < read < FRAMES and [k for k, _ in frames] == list(range(0, read, 2))
    line = reader.shortfall()
    assert line.startswith(f"{damaged}: ") and "\n" not in line, line
    m = SHORT.search(line)
    assert m is not None and (int(m[1]), int(m[2]), m[3]) == (read, read, f"{read / FPS:.2f}"), line
    assert "; FFmpeg: [mpeg4] " in line  # what FFmpeg said first, without its context address
    assert reader.warning() is None  # the shortfall says it all
    assert not capfd.readouterr().err  # captured: nothing of FFmpeg's reached fd 2

    with native_messages(True):  # --debug: FFmpeg's own lines, as they are
        reader = VideoReader(str(damaged))
        list(reader)
    assert reader.decoded == read and reader.native == ""
    assert FFMPEG_LINE.search(capfd.readouterr().err)


def test_infer_reports_a_damaged_video_as_incomplete(videos, tv_file_init, tmp_path, capfd):
    damaged = tmp_path / "damaged.mp4"  # beside the image: outputs out/damaged.* and out/photo.*
    damaged.write_bytes(videos[1].read_bytes())
    image = tmp_path / "photo.png"
    cv2.imwrite(str(image), structured_image(120, 160, seed=3))
    out = tmp_path / "out"
    args = ["--config-file", str(CONFIG), "--input", str(image), str(damaged), "--output", str(out), "--workers",
            "0"]
    opts = ["MODEL.WEIGHTS", str(tv_file_init), *FAST]
    res = call_tool(TOOL, *args, *opts, capture=capfd, cwd=tmp_path, threads=1)
    assert res.returncode == 1, res.stderr
    assert not FFMPEG_LINE.search(res.stderr) and "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith(("error:", "warning:"))]
    assert len(errors) == 1 and errors[0].startswith(f"error: {damaged}: damaged video: "), res.stderr
    m = SHORT.search(errors[0])
    assert m is not None, errors[0]
    read = int(m[1])
    assert 0 < read < FRAMES
    assert errors[0].endswith("; the records and drawing of the frames read are kept, --resume redoes it")
    assert f"this run {1 + read} images and video frames" in res.stdout

    # the frames read are valid: their records and drawing are kept, whole, and their instances counted
    records = [json.loads(line) for line in (out / "damaged.jsonl").read_text().splitlines()]
    assert [r["frame"] for r in records] == list(range(read))
    instances = len(json.loads((out / "photo.json").read_text())["instances"]) + sum(len(r["instances"])
                                                                                     for r in records)
    summary = f"infer: 2 inputs, 0 failed, 1 incomplete, {instances} instances, output in {out}"
    assert instances > len(records) and summary in res.stdout.splitlines(), res.stdout
    drawn = [p for p in out.iterdir() if p.stem == "damaged" and p.suffix in (".mp4", ".avi")]
    assert len(drawn) == 1
    cap = cv2.VideoCapture(str(drawn[0]))
    assert cap.get(cv2.CAP_PROP_FRAME_COUNT) == read
    cap.release()

    # not done: --resume redoes it (and only it), with the same line and the same outputs
    before = (out / "damaged.jsonl").read_bytes()
    res = call_tool(TOOL, *args, "--resume", *opts, capture=capfd, cwd=tmp_path, threads=1)
    assert res.returncode == 1, res.stderr
    assert "infer: resuming: 1 of 2 inputs done, 1 to go" in res.stdout
    assert [line for line in res.stderr.splitlines() if line.startswith(("error:", "warning:"))] == errors
    assert f"this run {read} images and video frames" in res.stdout
    assert summary in res.stdout.splitlines() and not FFMPEG_LINE.search(res.stderr)  # the photo's, and the video's
    assert (out / "damaged.jsonl").read_bytes() == before
