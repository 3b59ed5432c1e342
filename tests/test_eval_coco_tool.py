"""tools/eval_coco.py end to end on coco_tiny with a random-init torchvision checkpoint.

No trained weights exist here, so AP is near 0 on the real annotations; what is checked is the
machinery: every image accounted for, metrics equal to pycocotools run independently on the
written results, timing of every stage, resume, torchrun, bad files. One test turns the model's
own detections into ground truth, so that the AP to reproduce is not 0. Real processes where the
process is what is tested (Ctrl-C, SIGKILL, torchrun); the other runs call the tool in this one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from helpers import call_tool, load_tool, needs_extra, run_tool
from minidet.timing import STAGES

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "eval_coco.py"
CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
SHARED = ROOT.parent / "shared" / "data"
TINY = SHARED / "coco_tiny"
ANN = TINY / "annotations" / "instances_val2017.json"
IMAGES = TINY / "val2017"
FAKE = SHARED / "cocoapi_fake"
N = 6  # images per model run
RESULTS_FILE = "coco_instances_results.json"
FAST = [
    "INPUT.MIN_SIZE_TEST", "160", "INPUT.MAX_SIZE_TEST", "320",
    "MODEL.RPN.PRE_NMS_TOPK_TEST", "300", "MODEL.RPN.POST_NMS_TOPK_TEST", "100",
    "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "20",
]
# The same intra-op thread count in every run (a 2-process torchrun gets half the cores each):
# float sums may round differently with another thread count.
THREADS = str(max(1, (os.cpu_count() or 2) // 2))

pytestmark = [
    pytest.mark.skipif(not TINY.is_dir(), reason=f"needs ../shared/data/coco_tiny ({TINY} is absent)"),
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": THREADS}  # the tool finds minidet itself


def _run(*args: str, cwd: Path, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return run_tool(TOOL, *args, cwd=cwd, threads=THREADS, launcher=launcher)


def _main(capture, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """What ``_run`` gives, from the tool run in this process at the same thread count (``capture``: pytest's
    ``capfd``, or None in a module fixture)."""
    return call_tool(TOOL, *args, capture=capture, cwd=cwd, threads=THREADS)


def _model_args(out: Path, weights: Path, *extra: str, ann: Path = ANN, images: Path = IMAGES) -> list[str]:
    return [
        "--config-file", str(CONFIG), "--ann", str(ann), "--images", str(images), "--output", str(out),
        "--workers", "1", *extra, "MODEL.WEIGHTS", str(weights), *FAST,
    ]


def _load(path: Path):
    return json.loads(path.read_text())


def _pycocotools_stats(ann: Path, results_file: Path, image_ids: list[int], keep_box: bool = False
                       ) -> dict[str, list[float]]:
    """COCOeval run directly on a results file. For masks the boxes are left out, so that the
    mask area (not the box area) decides small / medium / large (minidet's rule), unless ``keep_box``
    (mmdetection's: pycocotools then takes the box's area)."""
    gt = COCO(str(ann))
    results = _load(results_file)
    out = {}
    for iou_type, drop in (("bbox", "segmentation"), ("segm", None if keep_box else "bbox")):
        dets = [{k: v for k, v in r.items() if k != drop} for r in results]
        ev = COCOeval(gt, gt.loadRes(dets), iou_type)
        ev.params.imgIds = sorted(image_ids)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
        out[iou_type] = [float(v) for v in ev.stats]
    return out


@pytest.fixture(scope="module")
def weights(tv_file) -> Path:
    """torchvision's initial weights with confident classes: detections to check (conftest.py)."""
    return tv_file


@pytest.fixture(scope="module")
def reference(tmp_path_factory, weights) -> tuple[Path, subprocess.CompletedProcess]:
    """One uninterrupted single-process run over the first N images, in chunks of 2."""
    out = tmp_path_factory.mktemp("ref") / "out"
    res = _main(None, *_model_args(out, weights, "--max-images", str(N), "--chunk-size", "2"), cwd=out.parent)
    return out, res


def _first_ids(n: int = N) -> list[int]:
    return sorted(im["id"] for im in _load(ANN)["images"])[:n]


def test_run_writes_results_metrics_timing(reference):
    out, res = reference
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "error:" not in res.stderr
    images = _load(out / "images.json")
    assert images == {"evaluated": _first_ids(), "skipped": []}

    gt = _load(ANN)
    sizes = {im["id"]: [im["height"], im["width"]] for im in gt["images"]}
    cats = {c["id"] for c in gt["categories"]}
    results = _load(out / "coco_instances_results.json")
    assert len(results) > N  # the sharpened random model detects things
    for r in results:
        assert set(r) == {"image_id", "category_id", "bbox", "score", "segmentation"}
        assert r["image_id"] in images["evaluated"] and r["category_id"] in cats
        h, w = sizes[r["image_id"]]
        x, y, bw, bh = r["bbox"]
        assert 0 <= x <= x + bw <= w + 1e-3 and 0 <= y <= y + bh <= h + 1e-3
        assert r["segmentation"]["size"] == [h, w] and isinstance(r["segmentation"]["counts"], str)
    assert results == sorted(results, key=lambda r: (r["image_id"], -r["score"]))

    metrics = _load(out / "metrics.json")
    assert set(metrics) == {"bbox", "segm", "scoring"}
    assert _pycocotools_stats(ANN, out / "coco_instances_results.json", images["evaluated"]) == {
        t: metrics[t]["stats"] for t in ("bbox", "segm")
    }  # whichever backend auto took: each is equal to pycocotools
    assert metrics["segm"]["AP50"] == metrics["segm"]["stats"][1] and len(metrics["bbox"]) == 13
    # a torchvision model: masks sized by their mask's area, as torchvision's evaluation does
    assert metrics["scoring"]["format"] == "coco" and metrics["scoring"]["mask_area"] == "mask"

    timing = _load(out / "timing.json")
    assert set(timing["stages"]) == {*STAGES, "total"}
    assert set(timing["pipeline"]) == {"data", "model", "encode", "total"}
    for row in [*timing["stages"].values(), *timing["pipeline"].values()]:
        assert set(row) == {"mean", "median", "std", "min", "max", "n"} and row["n"] == N - 2  # 2 warm-up batches
        assert 0 <= row["min"] <= row["median"] <= row["max"] and row["min"] <= row["mean"] <= row["max"]
    assert timing["stages"]["total"]["mean"] == pytest.approx(timing["pipeline"]["model"]["mean"])
    assert (timing["images"], timing["images_evaluated"], timing["images_skipped"]) == (N, N, 0)
    assert timing["images_timed"] == N - 2 and timing["world_size"] == 1 and timing["runs"] == 1
    assert timing["last_run"]["images"] == N and timing["last_run"]["wall_s"] > timing["last_run"]["loop_s"] > 0
    assert set(timing["totals_s"]) == {"data", "model", "encode", "eval"}
    scoring = timing["scoring"]
    assert {k: v for k, v in scoring.items() if k != "stages_s"} == metrics["scoring"]
    assert list(scoring["stages_s"]) == ["bbox", "segm"]
    for stages in scoring["stages_s"].values():
        assert list(stages) == ["load", "match", "accumulate", "summarize"] and min(stages.values()) >= 0
    assert sum(sum(st.values()) for st in scoring["stages_s"].values()) <= timing["totals_s"]["eval"]

    lines = res.stdout.splitlines()
    assert f"eval_coco: images {N} | evaluated {N} | skipped 0 | detections {len(results)} |" in res.stdout
    assert any(line.startswith("eval_coco: bbox AP ") for line in lines)
    assert any(line.startswith("eval_coco: segm AP ") for line in lines)
    assert any(line.startswith("eval_coco: time wall ") for line in lines)
    assert "Average Precision" in res.stdout and f"bbox ({metrics['scoring']['backend']} " in res.stdout
    for t in ("bbox", "segm"):
        assert any(line.startswith(f"eval_coco: scoring {t}: load ") for line in lines)
    for stage in (*STAGES, "data", "encode"):
        assert any(line.startswith(f"{stage:<11}: ") and line.rstrip().endswith("%") for line in lines), stage


@pytest.mark.slow
def test_ap_of_the_model_on_its_own_detections(reference, weights, tmp_path, capfd):
    """Ground truth = the reference run's detections on its N images, the real annotations on the
    others: with --max-images N the same model must score box AP 1 (the evaluation covers the
    images run, not the whole file), and metrics.json must equal pycocotools on the written results."""
    out, _ = reference
    from pycocotools import mask as mask_utils

    src = _load(ANN)
    ids = set(_first_ids())
    own = [
        {**r, "iscrowd": 0, "area": float(mask_utils.area(r["segmentation"]))}
        for r in _load(out / "coco_instances_results.json")
    ]
    others = [a for a in src["annotations"] if a["image_id"] not in ids]
    gt = {
        "images": src["images"],
        "annotations": [{**a, "id": k + 1} for k, a in enumerate(own + others)],
        "categories": src["categories"],
    }
    ann = tmp_path / "own.json"
    ann.write_text(json.dumps(gt))
    res = _main(capfd, *_model_args(tmp_path / "own", weights, "--max-images", str(N), ann=ann), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert _load(tmp_path / "own" / "images.json")["evaluated"] == sorted(ids)
    metrics = _load(tmp_path / "own" / "metrics.json")
    assert metrics["bbox"]["AP"] == 1.0 and metrics["bbox"]["AP50"] == 1.0
    assert metrics["segm"]["AP50"] > 0.5  # an empty mask (random weights) matches nothing, not even itself
    ref = _pycocotools_stats(ann, tmp_path / "own" / "coco_instances_results.json", sorted(ids))
    assert ref == {t: metrics[t]["stats"] for t in ("bbox", "segm")}


def _ctrl_c_on() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python turns it into KeyboardInterrupt only if not ignored


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_files(reference, weights, tmp_path, capfd):
    ref_out, _ = reference
    out = tmp_path / "out"
    args = _model_args(out, weights, "--max-images", str(N), "--chunk-size", "1")
    proc = subprocess.Popen(
        [sys.executable, str(TOOL), *args], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=_ctrl_c_on,  # whatever the suite was started from (a background job ignores SIGINT)
    )
    deadline = time.monotonic() + 300
    while not list((out / "chunks").glob("run001-*.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)  # Ctrl-C after the first image
    _, stderr = proc.communicate(timeout=300)
    stderr = stderr.decode()
    assert proc.returncode == 130, stderr
    assert f"error: interrupted; finished work is kept in {out / 'chunks'}" in stderr
    done = sum(len(_load(p)["image_ids"]) for p in (out / "chunks").glob("run001-*.json"))
    assert 1 <= done < N
    assert not (out / "coco_instances_results.json").exists()

    res = _main(capfd, *args, cwd=tmp_path)  # the same command without --resume refuses to mix runs
    assert res.returncode == 2 and "rerun with --resume" in res.stderr

    res = _main(capfd, *args, "--resume", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"eval_coco: resuming: {done} of {N} images done, {N - done} to go" in res.stdout
    for name in ("coco_instances_results.json", "metrics.json", "images.json"):
        assert (out / name).read_bytes() == (ref_out / name).read_bytes(), name
    timing = _load(out / "timing.json")
    assert timing["runs"] == 2 and timing["last_run"]["images"] == N - done

    res = _main(capfd, *args, "--resume", "INPUT.MIN_SIZE_TEST", "200", cwd=tmp_path)
    assert res.returncode == 2
    assert "cannot resume: the earlier run in" in res.stderr and "MIN_SIZE_TEST: 160" in res.stderr


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_files(reference, weights, tmp_path, capfd):
    """SIGKILL (no handler runs, nothing is saved on the way out) after the first chunk: no process
    of the run survives it (its DataLoader worker included), the chunks written so far are whole,
    and --resume finishes with the same files as an uninterrupted run."""
    from procs import descendants, survivors

    ref_out, _ = reference
    out = tmp_path / "out"
    args = _model_args(out, weights, "--max-images", str(N), "--chunk-size", "1")
    with open(tmp_path / "stdout", "wb") as so, open(tmp_path / "stderr", "wb") as se:
        proc = subprocess.Popen([sys.executable, str(TOOL), *args], cwd=tmp_path, env=_env(), stdout=so, stderr=se)
        deadline = time.monotonic() + 300
        while not list((out / "chunks").glob("run001-*.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        procs = descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "stderr").read_text()
    assert len(procs) == 1  # the loader's worker (--workers 1)
    left = survivors(procs)
    for pid in left:  # not left behind on a failure either
        os.kill(pid, signal.SIGKILL)
    assert left == [], "a process of the killed run is still running"
    chunks = sorted((out / "chunks").glob("run001-*.json"))
    done = sum(len(_load(p)["image_ids"]) for p in chunks)  # every chunk there is complete JSON
    assert 1 <= done < N
    assert not (out / "coco_instances_results.json").exists()

    res = _main(capfd, *args, "--resume", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"eval_coco: resuming: {done} of {N} images done, {N - done} to go" in res.stdout
    for name in ("coco_instances_results.json", "metrics.json", "images.json"):
        assert (out / name).read_bytes() == (ref_out / name).read_bytes(), name
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.slow
@pytest.mark.serial  # two ranks, each on a core of its own
def test_torchrun_two_processes_equal_one(reference, weights, tmp_path):
    ref_out, _ = reference
    out = tmp_path / "out"
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
    res = _run(*_model_args(out, weights, "--max-images", str(N), "--chunk-size", "2"), cwd=tmp_path, launcher=launcher)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("coco_instances_results.json", "metrics.json", "images.json"):
        assert (out / name).read_bytes() == (ref_out / name).read_bytes(), name
    ranks = {p.name.split("-")[1] for p in (out / "chunks").glob("run001-*.json")}
    assert ranks == {"rank0000", "rank0001"}
    timing = _load(out / "timing.json")
    assert timing["world_size"] == 2 and timing["images"] == N
    assert timing["stages"]["backbone"]["n"] == N - 2 * 2  # two warm-up batches per process
    assert res.stdout.count("eval_coco: images ") == 1  # rank 0 alone reports


@pytest.mark.slow
def test_bad_files_are_reported_counted_skipped(weights, tmp_path, capfd):
    pil = pytest.importorskip("PIL.Image")
    src = _load(ANN)
    images = tmp_path / "images"
    images.mkdir()
    first = sorted(src["images"], key=lambda m: m["id"])[:2]
    entries, anns = [], []

    def add(base: dict, new_id: int, name: str, with_anns: bool = True) -> None:
        entries.append({**base, "id": new_id, "file_name": name})
        if with_anns:
            anns.extend({**a, "id": 10**8 + len(anns), "image_id": new_id} for a in src["annotations"]
                        if a["image_id"] == base["id"])

    for im in first:
        shutil.copy(IMAGES / im["file_name"], images)
        add(im, im["id"], im["file_name"])
    a, b = (cv2.imread(str(IMAGES / im["file_name"])) for im in first)
    cv2.imwrite(str(images / "gray.png"), cv2.cvtColor(a, cv2.COLOR_BGR2GRAY))
    cv2.imwrite(str(images / "deep.png"), b.astype(np.uint16) * 257)
    cv2.imwrite(str(images / "rgba.png"), np.dstack([a, np.full(a.shape[:2], 255, np.uint8)]))
    pil.fromarray(b[:, :, ::-1]).convert("CMYK").save(images / "cmyk.jpg", "JPEG")
    data = (IMAGES / first[0]["file_name"]).read_bytes()
    (images / "trunc.jpg").write_bytes(data[: len(data) // 2])
    (images / "zero.jpg").write_bytes(b"")
    for k, (base, name) in enumerate([(0, "gray.png"), (1, "deep.png"), (0, "rgba.png"), (1, "cmyk.jpg")]):
        add(first[base], 1 + k, name)
    for k, name in enumerate(["trunc.jpg", "zero.jpg", "missing.jpg"]):
        add(first[0], 11 + k, name, with_anns=False)
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps({"images": entries, "annotations": anns, "categories": src["categories"]}))

    res = _main(capfd, *_model_args(tmp_path / "out", weights, "--workers", "2", ann=ann, images=images),
                cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    errors = sorted(line for line in res.stderr.splitlines() if line.startswith("error:"))
    assert errors == [
        f"error: {images / 'missing.jpg'}: file not found (skipped)",
        f"error: {images / 'trunc.jpg'}: cannot decode JPEG data (truncated or corrupt) (skipped)",
        f"error: {images / 'zero.jpg'}: empty file (0 bytes) (skipped)",
    ]
    out = _load(tmp_path / "out" / "images.json")
    assert out["evaluated"] == sorted([1, 2, 3, 4, *(im["id"] for im in first)])
    assert [(s["image_id"], Path(s["file"]).name) for s in out["skipped"]] == [
        (11, "trunc.jpg"), (12, "zero.jpg"), (13, "missing.jpg")
    ]
    assert "| skipped 3 |" in res.stdout and _load(tmp_path / "out" / "timing.json")["images_skipped"] == 3
    metrics = _load(tmp_path / "out" / "metrics.json")
    ref = _pycocotools_stats(ann, tmp_path / "out" / "coco_instances_results.json", out["evaluated"])
    assert ref == {t: metrics[t]["stats"] for t in ("bbox", "segm")}


@pytest.mark.skipif(not FAKE.is_dir(), reason=f"needs ../shared/data/cocoapi_fake ({FAKE} is absent)")
def test_results_mode_on_cocoapi_fake(tmp_path, capfd):
    ann = FAKE / "instances_val2014_100.json"
    bbox, segm = (
        FAKE / "instances_val2014_fakebbox100_results.json",
        FAKE / "instances_val2014_fakesegm100_results.json",
    )
    res = _main(capfd, "--ann", str(ann), "--results", str(bbox), str(segm), "--output", str(tmp_path / "o"),
                cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    metrics = _load(tmp_path / "o" / "metrics.json")
    gt = COCO(str(ann))
    for iou_type, path in (("bbox", bbox), ("segm", segm)):
        ev = COCOeval(gt, gt.loadRes(str(path)), iou_type)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
        assert metrics[iou_type]["stats"] == [float(v) for v in ev.stats]
    assert "eval_coco: bbox AP 0.5046 AP50 0.6970" in res.stdout  # the official printout: 0.505, 0.697

    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([{"image_id": 42, "category_id": 18, "bbox": [1, 2, 3, 4]}]))
    res = _main(capfd, "--ann", str(ann), "--results", str(wrong), "--output", str(tmp_path / "o2"), cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith(f"error: {wrong}: entry 0: no 'score'") and len(res.stderr.splitlines()) == 1
    res = _main(capfd, "--ann", str(ann), "--results", str(bbox), str(bbox), "--output", str(tmp_path / "o2"),
                cwd=tmp_path)
    assert res.returncode == 2 and f"{bbox}: bbox results already given by {bbox}" in res.stderr


def test_dataset_and_checkpoint_categories_must_match(weights, tmp_path, capfd):
    src = _load(ANN)
    src["categories"].append({"id": 91, "name": "hair brush"})
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(src))
    res = _main(capfd, *_model_args(tmp_path / "out", weights, ann=ann), cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {ann}: category 91 ('hair brush') is not a category of the checkpoint "
        "(MODEL.CATEGORY_LAYOUT coco91: COCO ids 1..90); the dataset does not match the model"
    ]
    assert not (tmp_path / "out").exists()


def test_arguments(capsys):
    tool = load_tool(TOOL)
    args = tool.parse_args(["--config-file", "c.yaml", "--ann", "a.json", "--images", "d", "--output", "o",
                            "MODEL.DEVICE", "cuda", "--resume", "INPUT.MIN_SIZE_TEST", "-1"])
    assert args.resume and args.opts == ["MODEL.DEVICE", "cuda", "INPUT.MIN_SIZE_TEST", "-1"]
    assert (args.warmup, args.workers, args.chunk_size, args.max_images) == (2, 2, 50, None)
    for argv, message in [
        (["--ann", "a", "--results", "r.json", "--config-file", "c", "--output", "o"], "--config-file do not apply"),
        (["--ann", "a", "--output", "o"], "give --config-file and --images"),
        (["--ann", "a", "--results", "r", "--output", "o", "--chunk-size", "0"], "--chunk-size >= 1"),
    ]:
        with pytest.raises(SystemExit) as e:
            tool.parse_args(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_timing_summary_leaves_out_warmup_batches():
    tool = load_tool(TOOL)
    recs = [
        {"seq": s, "n": 2, "data": 0.2, "model": 4.0 * (s + 1), "encode": 0.1, "stages": {"backbone": 4.0 * (s + 1)}}
        for s in range(3)
    ]
    stages, pipeline, timed = tool.timing_summary(recs, warmup=2)
    assert timed == recs[2:] and stages["backbone"]["mean"] == 6.0 and pipeline["data"]["mean"] == 0.1
    stages, _, timed = tool.timing_summary(recs, warmup=5)  # fewer batches than the warm-up: keep them all
    assert timed == recs and stages["backbone"]["n"] == 3 and stages["total"]["median"] == 4.0


@pytest.mark.slow
def test_all_of_coco_tiny_in_batches_of_two(weights, tmp_path, capfd):
    """Every image of coco_tiny, two per forward, two loader workers: all accounted for, metrics
    equal to pycocotools on the written results. At short side 96 (the images' count is the subject, not their
    size: 80 forwards)."""
    out = tmp_path / "out"
    res = _main(capfd, *_model_args(out, weights, "--workers", "2", "TEST.IMS_PER_BATCH", "2"), "INPUT.MIN_SIZE_TEST",
                "96", "INPUT.MAX_SIZE_TEST", "192", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    images = _load(out / "images.json")
    assert images == {"evaluated": _first_ids(80), "skipped": []}
    metrics = _load(out / "metrics.json")
    ref = _pycocotools_stats(ANN, out / "coco_instances_results.json", images["evaluated"])
    assert ref == {t: metrics[t]["stats"] for t in ("bbox", "segm")}
    timing = _load(out / "timing.json")
    assert timing["ims_per_batch"] == 2 and timing["stages"]["backbone"]["n"] == 40 - 2


def test_an_mmdetection_model_sizes_masks_by_box_as_mmdetection(tmp_path, capfd):
    """An mmdetection model's mask AP by size follows mmdetection's rule (its mask results carry their boxes, so
    pycocotools sizes them by the box), named in the report; ``--mask-area mask`` gives detectron2's rule, and each
    equals pycocotools run by hand with that rule."""
    from minidet.testing.mmdet import mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint

    weights = tmp_path / "mm.pth"
    write_mmdet_checkpoint(weights, mmdet_weights(mmdet_state_shapes(), seed=1))
    config = "mmdetection/mask-rcnn_r50_fpn_1x_coco"
    stats = {}
    for rule in ("auto", "mask"):
        out = tmp_path / rule
        args = ["--config-file", config, "--ann", str(ANN), "--images", str(IMAGES), "--output", str(out),
                "--workers", "0", "--max-images", "3", "--mask-area", rule, "MODEL.WEIGHTS", str(weights), *FAST,
                "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.0", "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "50"]
        res = _main(capfd, *args, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        metrics = _load(out / "metrics.json")
        named = "box" if rule == "auto" else "mask"
        assert metrics["scoring"]["mask_area"] == named and f"masks sized by their {named}'s area" in res.stdout
        ids = _load(out / "images.json")["evaluated"]
        by_hand = _pycocotools_stats(ANN, out / RESULTS_FILE, ids, keep_box=named == "box")
        assert {t: metrics[t]["stats"] for t in ("bbox", "segm")} == by_hand
        stats[named] = metrics["segm"]["stats"]
    assert _load(tmp_path / "auto" / RESULTS_FILE) == _load(tmp_path / "mask" / RESULTS_FILE) != []
    assert stats["box"][:3] == stats["mask"][:3]  # AP, AP50, AP75 do not depend on the rule


def test_lvis_note_names_a_config_that_keeps_fewer_detections(capsys):
    """A model run on an LVIS file with a COCO config's cap and threshold is told that LVIS scores 300 detections
    from 0.0001; an LVIS config is not."""
    from minidet.config import config_file, config_names, load_cfg

    tool = load_tool(TOOL)
    tool._lvis_config_note(load_cfg(str(CONFIG)))
    err = capsys.readouterr().err
    assert err.startswith("warning: LVIS is scored on up to 300 detections per image") and "lowers the AP" in err
    lvis_configs = [n for n in config_names() if "lvis" in n]
    assert len(lvis_configs) >= 2  # detectron2's and mmdetection's
    for name in lvis_configs:  # every LVIS config keeps what LVIS scores: 300 detections from 0.0001
        tool._lvis_config_note(load_cfg(config_file(name)))
        assert capsys.readouterr().err == "", name


@pytest.mark.slow
@needs_extra("hotcoco", "eval")  # LVIS scoring: hotcoco (auto's choice), or the LVIS API (test-only here)
@pytest.mark.filterwarnings("ignore:The 'warn' method is deprecated:DeprecationWarning")  # the LVIS API's logger
def test_a_model_run_on_an_lvis_file_is_scored_as_lvis(tmp_path, capfd):
    """An LVIS model (mmdetection's LVIS v1 config, its 1203 classes named in the file) run on an LVIS v1 file made
    from coco_tiny: the images found by their ``coco_url`` under the COCO folder, the detections scored by LVIS's
    rules (the 13 results, the format named), equal to the LVIS API (where installed) on the written results."""
    from minidet.testing.mmdet import mmdet_meta, mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint

    names = tuple(f"lvis_class_{k}" for k in range(1, 1204))
    weights = tmp_path / "lvis.pth"
    write_mmdet_checkpoint(weights, mmdet_weights(mmdet_state_shapes(num_classes=1203), seed=2), mmdet_meta(
        classes=names))
    coco = _load(ANN)
    images = sorted(coco["images"], key=lambda m: m["id"])[:2]
    ids = {m["id"] for m in images}
    anns = [{k: v for k, v in a.items() if k != "iscrowd"} for a in coco["annotations"]
            if a["image_id"] in ids and not a["iscrowd"]]
    lvis = {
        "images": [{"id": m["id"], "height": m["height"], "width": m["width"], "neg_category_ids": [1203],
                    "not_exhaustive_category_ids": [], "coco_url": f"http://images.cocodataset.org/val2017/{m['file_name']}"}
                   for m in images],
        "annotations": anns,
        "categories": [{"id": k, "name": n, "frequency": "rcf"[k % 3]} for k, n in enumerate(names, 1)],
    }
    ann = tmp_path / "lvis_v1_val.json"
    ann.write_text(json.dumps(lvis))
    out = tmp_path / "out"
    config = "mmdetection/mask-rcnn_r50_fpn_sample1e-3_ms-1x_lvis-v1"
    res = _main(capfd, "--config-file", config, "--ann", str(ann), "--images", str(TINY), "--output", str(out),
                "--workers", "0", "MODEL.WEIGHTS", str(weights), *FAST[:8], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "warning: LVIS" not in res.stderr  # an LVIS config: 300 detections from 0.0001
    metrics = _load(out / "metrics.json")
    assert metrics["scoring"]["format"] == "lvis" and metrics["scoring"]["mask_area"] == "box"
    assert [k for k in metrics["bbox"] if k != "stats"][6:9] == ["APr", "APc", "APf"]
    assert _load(out / "images.json") == {"evaluated": sorted(ids), "skipped": []}
    results = _load(out / RESULTS_FILE)
    assert results and max(sum(r["image_id"] == i for r in results) for i in ids) <= 300
    if importlib.util.find_spec("lvis") is None:
        return
    import lvis

    gt = lvis.LVIS(str(ann))
    for t in ("bbox", "segm"):
        ev = lvis.LVISEval(gt, lvis.LVISResults(gt, [dict(r) for r in results]), t)
        added = "float" not in np.__dict__
        if added:  # lvis 0.5.3 calls np.float (numpy removed the alias): the builtin it stood for
            np.float = float
        try:
            ev.run()
        finally:
            if added:
                del np.float
        ref = ev.get_results()
        assert [ref[k] for k in metrics[t] if k != "stats"] == metrics[t]["stats"]
