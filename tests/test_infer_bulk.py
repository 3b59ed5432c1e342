"""tools/infer.py for bulk work, end to end: inputs (folders with sub-folders, ``--recursive``, ``**``,
``--input-list``), one results file that ``eval_coco.py --results`` evaluates, torchrun with two processes equal
to one, SIGKILL then ``--resume`` equal to a clean run, ``--no-vis`` and ``--classes``, videos. Real processes for
torchrun and SIGKILL; the other runs call the tools in this process at the same thread count."""

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

from helpers import call_tool, run_tool
from minidet.apps.synthetic import structured_image
from procs import rss_mb

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "infer.py"
EVAL = ROOT / "tools" / "eval_coco.py"
CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
TINY = ROOT.parent / "shared" / "data" / "coco_tiny"
FAST = [
    "INPUT.MIN_SIZE_TEST", "160", "INPUT.MAX_SIZE_TEST", "320",
    "MODEL.RPN.PRE_NMS_TOPK_TEST", "300", "MODEL.RPN.POST_NMS_TOPK_TEST", "100",
    "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "20",
]
# the same intra-op thread count in every run (a 2-process torchrun gets half the cores each)
THREADS = str(max(1, (os.cpu_count() or 2) // 2))
N = 6  # images of the sharding and resume runs
RESULTS = "coco_instances_results.json"  # eval_coco.py's

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _run(*args: str, cwd: Path, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return run_tool(TOOL, *args, cwd=cwd, threads=THREADS, launcher=launcher)


def _main(capture, *args: str, cwd: Path, tool: Path = TOOL) -> subprocess.CompletedProcess:
    """What ``_run`` gives, from ``tool`` run in this process at the same thread count (``capture``: pytest's
    ``capfd``, or None in a module fixture)."""
    return call_tool(tool, *args, capture=capture, cwd=cwd, threads=THREADS)


def _args(weights: Path, out: Path, *inputs: str, extra: tuple[str, ...] = ()) -> list[str]:
    return ["--config-file", str(CONFIG), "--input", *inputs, "--output", str(out), "--workers", "1", *extra,
            "MODEL.WEIGHTS", str(weights), *FAST]


def _files(folder: Path) -> dict[str, bytes]:
    """Every output file under ``folder`` by relative path, the chunk store left out."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".chunks" not in p.parts and p.name != ".minidet.lock"}


def _tree(root: Path, n: int = N) -> list[Path]:
    """``n`` images in sub-folders of ``root`` with repeated names (a/img.png, b/img.png, ...), and a note."""
    paths = []
    for k in range(n):
        path = root / "abc"[k % 3] / ("deep" if k >= 3 else "") / "img.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(path), structured_image(120 + 20 * k, 160, seed=k))
        paths.append(path)
    (root / "a" / "notes.txt").write_text("not an image\n")
    return paths


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree") / "photos"
    _tree(root)
    return root


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tree, tv_file) -> Path:
    """One uninterrupted single-process run over the tree (recursive), in chunks of 2, with a JSONL results file."""
    out = tmp_path_factory.mktemp("ref") / "out"
    res = _main(None, *_args(tv_file, out, str(tree), extra=("--recursive", "--chunk-size", "2", "--results",
                                                              str(out / "all.jsonl"))), cwd=out.parent)
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.slow
def test_inputs_keep_their_folders(reference, tree, tv_file, tmp_path, capfd):
    names = sorted(str(p.relative_to(tree).with_suffix("")) for p in tree.rglob("*.png"))
    assert names == ["a/deep/img", "a/img", "b/deep/img", "b/img", "c/deep/img", "c/img"]
    files = _files(reference)
    assert sorted(files) == sorted(["all.jsonl"] + [n + e for n in names for e in (".jpg", ".json")])
    lines = [json.loads(line) for line in files["all.jsonl"].decode().splitlines()]
    assert [r["image_id"] for r in lines] == list(range(1, N + 1))  # sorted path order
    assert [r["file"] for r in lines] == sorted(str(p) for p in tree.rglob("*.png"))
    for r, name in zip(lines, names):  # the results file holds each image's own record
        assert json.loads(files[name + ".json"]) == {k: v for k, v in r.items() if k != "image_id"}

    # a ** pattern and a list file name the same images: the same outputs
    out = tmp_path / "glob"
    res = _main(capfd, *_args(tv_file, out, str(tree / "**" / "*.png"), extra=("--no-vis",)), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert _files(out) == {k: v for k, v in files.items() if k.endswith(".json")}
    listing = tmp_path / "list.txt"
    listing.write_text("# the tree, relative to this file\n\n" +
                       "".join(f"{os.path.relpath(p, tmp_path)}\n" for p in sorted(tree.rglob("*.png"))))
    out = tmp_path / "list"
    cmd = _args(tv_file, out, "--input-list", str(listing), extra=("--no-vis",))
    cmd.remove("--input")
    res = _main(capfd, *cmd, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(_files(out)) == sorted(n + ".json" for n in names)
    for name, data in _files(out).items():  # same detections; the file field is the list's path
        doc = json.loads(data)
        assert doc["instances"] == json.loads(files[name])["instances"]
        assert os.path.samefile(tmp_path / doc["file"], tree / name.replace(".json", ".png"))

    # without --recursive a folder gives its own images only
    res = _main(capfd, *_args(tv_file, tmp_path / "flat", str(tree / "a"), extra=("--no-vis",)), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(_files(tmp_path / "flat")) == ["img.json"]
    assert f"infer: skipped 1 entries in {tree / 'a'}: 1 .txt (not an image or video extension: .jpg," in res.stdout


@pytest.mark.slow
@pytest.mark.serial  # two ranks, each on a core of its own
def test_torchrun_two_processes_equal_one(reference, tree, tv_file, tmp_path):
    out = tmp_path / "out"
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
    res = _run(*_args(tv_file, out, str(tree), extra=("--recursive", "--chunk-size", "2", "--results",
                                                      str(out / "all.jsonl"))), cwd=tmp_path, launcher=launcher)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _files(out) == _files(reference)
    ranks = {p.name.split("-")[1] for p in (out / ".chunks").glob("run001-*.json")}
    assert ranks == {"rank0000", "rank0001"}
    assert res.stdout.count("infer: 6 inputs") == 1  # rank 0 alone reports


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_files(reference, tree, tv_file, tmp_path, capfd):
    """SIGKILL after the first chunk (nothing runs on the way out): ``--resume`` finishes with the same bytes in
    every per-image file and in the results file as an uninterrupted run; another config is refused."""
    out = tmp_path / "out"
    args = _args(tv_file, out, str(tree), extra=("--recursive", "--chunk-size", "1", "--results",
                                                  str(out / "all.jsonl")))
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": THREADS}
    with open(tmp_path / "stderr", "wb") as se:
        proc = subprocess.Popen([sys.executable, str(TOOL), *args], cwd=tmp_path, env=env, stdout=se, stderr=se)
        deadline = time.monotonic() + 300
        while not list(out.glob(".chunks/run001-*.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "stderr").read_text()
    assert not (out / "all.jsonl").exists()

    resume = ["--resume", *args]  # options before the trailing KEY VALUE overrides
    res = _main(capfd, *resume, "INPUT.MIN_SIZE_TEST", "200", cwd=tmp_path)
    assert res.returncode == 2
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: cannot resume: the earlier run in") and "MIN_SIZE_TEST: 160" in line, res.stderr

    res = _main(capfd, *resume, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "infer: resuming: " in res.stdout
    assert _files(out) == _files(reference)
    assert not [p for p in out.rglob("*") if ".tmp" in p.name or p.name.endswith(".partial")]


def test_no_vis_and_classes(reference, tree, tv_file, tmp_path, capfd):
    ref = json.loads((reference / "a" / "img.json").read_text())["instances"]
    names = sorted({inst["category_name"] for inst in ref} - {"N/A"})[:2]  # N/A: coco91's unused slots
    out = tmp_path / "out"
    res = _main(capfd, *_args(tv_file, out, str(tree / "a" / "img.png"),
                              extra=("--no-vis", "--classes", ",".join(names))), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(out)) == [".chunks", "img.json"]
    kept = json.loads((out / "img.json").read_text())["instances"]
    assert kept == [inst for inst in ref if inst["category_name"] in names] and kept

    res = _main(capfd, *_args(tv_file, tmp_path / "o2", str(tree / "a" / "img.png"), extra=("--classes", "persn")),
                cwd=tmp_path)
    assert res.returncode == 2
    line = res.stderr.strip()
    assert line.startswith("error: --classes: unknown class 'persn' (the model's classes: person, bicycle,"), line


def _write_video(path: Path, frames: int, size=(160, 120), fps: float = 10.0) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, size)
    assert writer.isOpened()
    for k in range(frames):
        writer.write(structured_image(size[1], size[0], seed=k))
    writer.release()


@pytest.mark.slow
def test_video(tv_file_init, tmp_path, capfd):
    clip, broken = tmp_path / "clip.avi", tmp_path / "broken.mp4"
    _write_video(clip, 7)
    broken.write_bytes(b"\x00\x00\x00\x18ftypmp42 but nothing else")
    out = tmp_path / "out"
    res = _main(capfd, *_args(tv_file_init, out, str(clip), str(broken), extra=("--every", "2")), cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: {broken}: OpenCV cannot open this video (unreadable, or no decoder for its format); FFmpeg: ["), errors
    assert "@ 0x" not in res.stderr  # FFmpeg's lines, captured: what it said is in the one line, its address not
    drawn = [p for p in out.iterdir() if p.stem == "clip" and p.suffix in (".mp4", ".avi")]
    assert len(drawn) == 1
    cap = cv2.VideoCapture(str(drawn[0]))
    assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(5.0)  # every 2nd frame: it lasts as long as the input
    shapes = []
    while (frame := cap.read()[1]) is not None:
        shapes.append(frame.shape)
    assert shapes == [(120, 160, 3)] * 4
    records = [json.loads(line) for line in (out / "clip.jsonl").read_text().splitlines()]
    assert [(r["frame"], r["time"]) for r in records] == [(0, 0.0), (2, 0.2), (4, 0.4), (6, 0.6)]
    assert all(set(r) == {"frame", "time", "instances"} for r in records)

    # no codec that works: one line naming the video, no file half-written
    out = tmp_path / "nocodec"
    res = _main(capfd, *_args(tv_file_init, out, str(clip), extra=("--codecs", "NONE")), cwd=tmp_path)
    assert res.returncode == 1
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {out / 'clip'}.mp4: no video codec works here (tried NONE); not written "
                      "(--no-vis writes the records alone)"], res.stderr
    assert sorted(os.listdir(out)) == [".chunks"]


@pytest.mark.slow
@pytest.mark.skipif(not TINY.is_dir(), reason=f"needs ../shared/data/coco_tiny ({TINY} is absent)")
def test_coco_results_file_is_evaluated_as_eval_coco_does(tv_file, tmp_path, capfd):
    """``--results x.json`` (COCO results with an images list) evaluated by ``eval_coco.py --results`` gives the
    metrics of ``eval_coco.py`` running the model on the same images."""
    ann = TINY / "annotations" / "instances_val2017.json"
    images = sorted(json.loads(ann.read_text())["images"], key=lambda m: m["id"])[:3]
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{TINY / 'val2017' / m['file_name']}\n" for m in images))
    out = tmp_path / "infer"
    res = _main(capfd, "--config-file", str(CONFIG), "--input-list", str(listing), "--output", str(out), "--no-vis",
                "--results", str(out / "results.json"), "MODEL.WEIGHTS", str(tv_file), *FAST, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads((out / "results.json").read_text())
    assert [m["file_name"] for m in doc["images"]] == [m["file_name"] for m in images]
    assert [m["id"] for m in doc["images"]] == [1, 2, 3]

    res = _main(capfd, "--ann", str(ann), "--results", str(out / "results.json"), "--only-result-images",
                "--output", str(tmp_path / "from_file"), cwd=tmp_path, tool=EVAL)
    assert res.returncode == 0, res.stderr
    res = _main(capfd, "--config-file", str(CONFIG), "--ann", str(ann), "--images", str(TINY / "val2017"),
                "--max-images", "3", "--output", str(tmp_path / "model"), "MODEL.WEIGHTS", str(tv_file), *FAST,
                cwd=tmp_path, tool=EVAL)
    assert res.returncode == 0, res.stderr
    got = json.loads((tmp_path / "from_file" / "metrics.json").read_text())
    want = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert got == want  # near 0 (random weights on real annotations): the detections must be the same too
    name_of = {m["id"]: m["file_name"] for m in doc["images"]}
    gt_id = {m["file_name"]: m["id"] for m in images}
    known = {c["id"] for c in json.loads(ann.read_text())["categories"]}

    def key(d: dict, image_id: int) -> tuple:
        return image_id, d["category_id"], d["score"], d["bbox"], d["segmentation"]["counts"]

    mine = sorted(key(d, gt_id[name_of[d["image_id"]]]) for d in doc["annotations"] if d["category_id"] in known)
    theirs = sorted(key(d, d["image_id"]) for d in json.loads((tmp_path / "model" / RESULTS).read_text()))
    assert mine == theirs and len(mine) > 10


@pytest.mark.slow
@pytest.mark.skipif(not TINY.is_dir(), reason=f"needs ../shared/data/coco_tiny ({TINY} is absent)")
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc to read the resident memory")
def test_memory_stays_flat_over_passes_of_coco_tiny(tv_file, tmp_path):
    """20 of its images read, run, drawn, written and kept for the results file, five times in one process
    (``--workers 0``): the resident memory stays flat after the first pass (``helpers.assert_flat``)."""
    import torch

    from helpers import PASS_IMAGES, PASSES, assert_flat, load_tool

    images = [str(p) for p in sorted((TINY / "val2017").glob("*.jpg"))[:PASS_IMAGES]]  # each pass's
    tool = load_tool(TOOL)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # memory does not depend on it; one thread is faster on a busy machine
    try:
        rss = []
        for k in range(PASSES):
            out = tmp_path / f"pass{k}"
            rc = tool.main(["--config-file", str(CONFIG), "--input", *images, "--output", str(out),
                            "--workers", "0", "--chunk-size", "20", "--results", str(out / "r.jsonl"),
                            "MODEL.WEIGHTS", str(tv_file), *FAST])
            assert rc == 0
            rss.append(rss_mb())
    finally:
        torch.set_num_threads(threads)
    assert all(len((tmp_path / f"pass{k}" / "r.jsonl").read_text().splitlines()) == PASS_IMAGES
               for k in range(PASSES))
    assert_flat(rss)


def test_video_reader_and_writer(tmp_path):
    """The video module alone: every N-th frame from 0, a writer that checks its frame count, a codec probe."""
    from minidet.apps.outputs.video import VideoReader, VideoWriter, count_frames, working_codec

    clip = tmp_path / "c.avi"
    _write_video(clip, 5, size=(64, 48))
    reader = VideoReader(str(clip), every=3)
    assert reader.size == (64, 48) and reader.fps == pytest.approx(10.0)
    frames = list(reader)
    assert [k for k, _ in frames] == [0, 3] and frames[0][1].shape == (48, 64, 3)
    codec = working_codec(str(tmp_path), (64, 48), 10.0, ["NONE", "MJPG"])
    assert codec == "MJPG" and sorted(os.listdir(tmp_path)) == ["c.avi"]  # the probes are gone
    writer = VideoWriter(str(tmp_path / "d"), codec, 10.0, (64, 48))
    for _, frame in frames:
        writer.write(frame)
    assert writer.close() == str(tmp_path / "d.avi") and count_frames(str(tmp_path / "d.avi")) == 2
    writer = VideoWriter(str(tmp_path / "e"), codec, 10.0, (64, 48))
    with pytest.raises(Exception, match="frame of 32 x 48"):
        writer.write(np.zeros((48, 32, 3), np.uint8))
    writer.abort()
    assert sorted(os.listdir(tmp_path)) == ["c.avi", "d.avi"]


class _TermsTheLoaderWorker:
    """A model that, while it runs, kills the loader's worker (SIGKILL: a worker's SIGTERM may end it with status
    0, which the loader does not report) and waits for the loader's SIGCHLD handler to say so: the first call only."""

    def __init__(self) -> None:
        self.calls = 0

    def _run(self, n: int) -> list[dict]:
        self.calls += 1
        if self.calls == 1:
            import multiprocessing
            for child in multiprocessing.active_children():
                os.kill(child.pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.01)  # the handler raises here
        return [{"timings": {}} for _ in range(n)]

    def predict_batch(self, images):
        return self._run(len(images))

    def __call__(self, image):
        return self._run(1)[0]


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_loader_worker_ended_while_the_model_runs_stops_the_run(tmp_path, batch_size):
    """A loader worker that dies while the model runs is the run's problem, not the images': ``run_batches`` raises
    the loader's error (the run's stop line names it, or the rank that died) instead of reporting the images of
    that batch as failed and going on."""
    from minidet.apps.bulk.engines import loader_died, run_batches
    from minidet.apps.bulk.loader import ImageFiles

    paths = []
    for k in range(4):
        paths.append(str(tmp_path / f"{k}.png"))
        cv2.imwrite(paths[-1], structured_image(40, 60, seed=k))
    model = _TermsTheLoaderWorker()
    with pytest.raises(RuntimeError) as info:
        for batch in run_batches(model, ImageFiles(list(enumerate(paths, 1))), batch_size, workers=1):
            assert not batch.errors, batch.errors
    assert loader_died(info.value), info.value
    assert model.calls == 1
