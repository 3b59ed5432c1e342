"""Issue 12 cases of tools/eval_coco.py: a checkpoint replaced under a resumed run, loader workers that
outlive a killed run, results files that cover some of the images or carry broken RLE counts."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from helpers import one_error_line
from minidet.apps.bulk.chunks import file_identity
from minidet.apps.evaluation import NEGATIVE_RUN, NOT_RLE, rle_string_totals
from procs import descendants, survivors
from test_bad_inputs import _eval_in_process
from test_eval_coco_tool import ANN, TINY, _load, _main, _model_args, weights  # noqa: F401 - weights: a fixture

pytestmark = [
    pytest.mark.skipif(not TINY.is_dir(), reason=f"needs ../shared/data/coco_tiny ({TINY} is absent)"),
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
]


# ------------------------------------------------------------------------------ processes of a run


def test_process_helpers_see_a_child_and_its_end(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                               "print(c.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    child = int(parent.stdout.readline())
    procs = descendants(parent.pid)
    assert list(procs) == [child] and survivors(procs, wait_s=0) == [child]
    os.kill(child, 9)
    assert survivors(procs) == []  # a zombie until its parent reaps it: ended
    parent.kill()
    parent.wait()


_WORKER_INIT = """
import ctypes, sys
from minidet.apps.bulk import loader as data
data._die_with_parent(int(sys.argv[1]), 0)  # what worker_init_fn() of process argv[1] runs in a worker
sig = ctypes.c_int(0)
ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
print(sig.value)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_worker_init_sets_the_parent_death_signal_and_sees_a_dead_parent():
    from minidet.apps.bulk.loader import _die_with_parent, worker_init_fn

    init = worker_init_fn()
    assert init.func is _die_with_parent and init.args == (os.getpid(),)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}

    def worker(parent: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", _WORKER_INIT, parent], env=env, capture_output=True, text=True)

    res = worker(str(os.getpid()))  # its parent: this process
    assert res.returncode == 0 and res.stdout.strip() == str(int(signal.SIGKILL)), res.stderr
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    res = worker(dead.stdout.strip())  # the process it was made for died before the death signal was set
    assert res.returncode == 1 and res.stdout == "", res.stderr


# ------------------------------------------------------------------------------ resume and the checkpoint


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_replaced_at_the_same_path(weights, tmp_path, capfd):  # noqa: F811
    """A run over 2 images with chunks of 1, its second chunk and final files removed (what a run
    stopped after the first image leaves); the checkpoint then replaced by another one at the
    same path: --resume is refused in one line, before the model loads. The original content put
    back (a copy: new mtime, same bytes) resumes to the files of the uninterrupted run."""
    torch = pytest.importorskip("torch")
    ckpt = tmp_path / "model.pth"
    shutil.copyfile(weights, ckpt)
    out = tmp_path / "out"
    args = _model_args(out, ckpt, "--max-images", "2", "--chunk-size", "1", "--workers", "0")
    res = _main(capfd, *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    manifest = _load(out / "chunks" / "manifest.json")
    assert manifest["weights"] == {"path": str(ckpt), "size": ckpt.stat().st_size,
                                   "mtime": ckpt.stat().st_mtime, "sha256": _sha256(ckpt)}
    final = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert set(final) == {"coco_instances_results.json", "metrics.json", "images.json", "timing.json"}
    for name in final:
        (out / name).unlink()
    (out / "chunks" / "run001-rank0000-00001.json").unlink()

    state = torch.load(weights, map_location="cpu", weights_only=True)
    key = next(k for k, v in state.items() if v.is_floating_point())
    state[key] = state[key] + 1
    before = _sha256(ckpt)
    torch.save(state, ckpt)
    res = _main(capfd, *args, "--resume", cwd=tmp_path)
    assert res.returncode == 2
    assert one_error_line(res.stderr) == (
        f"error: cannot resume: the earlier run in {out / 'chunks'} differs: the weights {ckpt} changed since the "
        f"earlier run (sha256 {before[:16]}... then, {_sha256(ckpt)[:16]}... now)"
    )
    assert not (out / "metrics.json").exists()

    shutil.copyfile(weights, ckpt)
    os.utime(ckpt, (time.time() + 100, time.time() + 100))  # surely another mtime than the first run's
    res = _main(capfd, *args, "--resume", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "eval_coco: resuming: 1 of 2 images done, 1 to go" in res.stdout
    for name in ("coco_instances_results.json", "metrics.json", "images.json"):
        assert (out / name).read_bytes() == final[name], name
    assert _load(out / "chunks" / "manifest.json")["weights"]["mtime"] == ckpt.stat().st_mtime


def test_file_identity(tmp_path):
    p = tmp_path / "w.pth"
    p.write_bytes(os.urandom(3 << 20) + b"tail")  # more than one 1 MiB block, and a partial one
    ident = file_identity(str(p))
    assert ident == {"path": str(p), "size": (3 << 20) + 4, "mtime": p.stat().st_mtime, "sha256": _sha256(p)}
    for missing in ("", "none", str(tmp_path), str(tmp_path / "absent.pth")):
        assert file_identity(missing) is None


# ------------------------------------------------------------------------------ --results coverage and RLE


def _perfect_results(data: dict, image_ids: set[int]) -> list[dict]:
    """The ground truth of ``image_ids`` as detections of score 1 (boxes and RLE masks); crowd
    regions, which COCOeval ignores, left out."""
    gt = COCO()
    gt.dataset = data
    gt.createIndex()
    out = []
    for a in data["annotations"]:
        if a["image_id"] in image_ids and not a["iscrowd"]:
            rle = gt.annToRLE(a)
            out.append({"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0,
                        "segmentation": {"size": rle["size"], "counts": rle["counts"].decode("ascii")}})
    return out


def _pycocotools(results: Path, iou_type: str, image_ids: list[int] | None) -> list[float]:
    gt = COCO(str(ANN))
    drop = "segmentation" if iou_type == "bbox" else "bbox"
    ev = COCOeval(gt, gt.loadRes([{k: v for k, v in r.items() if k != drop} for r in _load(results)]), iou_type)
    if image_ids is not None:
        ev.params.imgIds = image_ids
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return [float(v) for v in ev.stats]


@pytest.mark.slow
def test_results_of_some_images_are_told_and_can_be_evaluated_alone(tmp_path, capsys):
    data = _load(ANN)
    n = len(data["images"])
    with_objects = sorted({a["image_id"] for a in data["annotations"] if not a["iscrowd"]})
    ids = with_objects[:10]
    results = tmp_path / "ten.json"
    results.write_text(json.dumps(_perfect_results(data, set(ids))))
    base = ["--ann", str(ANN), "--results", str(results)]

    rc, err = _eval_in_process(capsys, *base, "--output", str(tmp_path / "all"))
    assert rc == 0
    assert err.strip().splitlines() == [
        f"warning: {results}: results cover 10 of {n} annotated images; the other {n - 10} count as images "
        "without detections (--only-result-images evaluates the 10 alone)"
    ]
    every = _load(tmp_path / "all" / "metrics.json")
    for t in ("bbox", "segm"):
        assert every[t]["stats"] == _pycocotools(results, t, None)
        assert every[t]["AP"] < 0.5  # the other 70 images' objects are all missed

    rc, err = _eval_in_process(capsys, *base, "--output", str(tmp_path / "ten"), "--only-result-images")
    assert rc == 0
    assert err.strip() == (
        f"warning: {results}: results cover 10 of {n} annotated images; only those are evaluated "
        "(--only-result-images)"
    )
    alone = _load(tmp_path / "ten" / "metrics.json")
    for t in ("bbox", "segm"):
        assert alone[t]["AP"] == 1.0 and alone[t]["AP50"] == 1.0
        assert alone[t]["stats"] == _pycocotools(results, t, ids)

    assert len(with_objects) == n  # every image of coco_tiny has objects: results of all of them, no note
    everything = tmp_path / "all.json"
    everything.write_text(json.dumps(_perfect_results(data, set(with_objects))))
    rc, err = _eval_in_process(capsys, "--ann", str(ANN), "--results", str(everything), "--output",
                               str(tmp_path / "e"), "--only-result-images")
    assert rc == 0 and err.strip() == ""
    assert _load(tmp_path / "e" / "metrics.json")["bbox"]["AP"] == 1.0


def test_only_result_images_is_for_the_results_form(tmp_path, capsys):
    from test_eval_coco_tool import CONFIG, IMAGES

    rc, err = _eval_in_process(capsys, "--config-file", str(CONFIG), "--ann", str(ANN), "--images", str(IMAGES),
                               "--output", str(tmp_path / "o"), "--only-result-images")
    assert rc == 2 and "--only-result-images applies to --results" in one_error_line(err)


def test_annotation_file_without_categories(tmp_path, capsys):
    data = _load(ANN)
    data["annotations"], data["categories"] = [], []
    ann = tmp_path / "nocat.json"
    ann.write_text(json.dumps(data))
    results = tmp_path / "r.json"
    results.write_text(json.dumps([{"image_id": data["images"][0]["id"], "category_id": 1, "bbox": [0, 0, 1, 1],
                                    "score": 1.0}]))
    rc, err = _eval_in_process(capsys, "--ann", str(ann), "--results", str(results), "--output", str(tmp_path / "o"))
    assert rc == 2
    assert one_error_line(err) == f"error: {ann}: no categories (the 'categories' list is empty); nothing to evaluate"


def test_rle_counts_that_do_not_decode_to_the_image(tmp_path, capsys):
    data = _load(ANN)
    good = _perfect_results(data, {data["images"][0]["id"]})[:2]
    h, w = good[0]["segmentation"]["size"]
    counts = good[1]["segmentation"]["counts"]
    short = mask_utils.frPyObjects({"size": [h, w], "counts": [h * w - 7]}, h, w)["counts"].decode()
    long = mask_utils.frPyObjects({"size": [h, w], "counts": [h * w - 7, 14]}, h, w)["counts"].decode()
    cases = {
        short: f"do not decode to the image's {h} x {w} pixels (runs covering {h * w - 7} pixels)",
        long: f"do not decode to the image's {h} x {w} pixels (runs covering {h * w + 7} pixels)",
        counts[:-1] + "P": "is not a compressed COCO RLE string",  # ends inside a run length
        counts + "\x7f": "is not a compressed COCO RLE string",
        "é" + counts: "is not a compressed COCO RLE string",
        "": f"do not decode to the image's {h} x {w} pixels (runs covering 0 pixels)",
    }
    for bad, message in cases.items():
        entry = {**good[1], "segmentation": {"size": [h, w], "counts": bad}}
        path = tmp_path / "r.json"
        path.write_text(json.dumps([good[0], entry]))
        rc, err = _eval_in_process(capsys, "--ann", str(ANN), "--results", str(path), "--output", str(tmp_path / "o"))
        line = one_error_line(err)
        assert rc == 2 and line.startswith(f"error: {path}: entry 1: segmentation counts ") and message in line, line


def test_rle_string_totals_of_pycocotools_strings():
    """Run lengths of any total compressed by pycocotools (which takes them as they are): the total
    is their sum, also when it is not the image's size; broken strings are told apart."""
    rng = np.random.default_rng(0)
    strings, sums = [], []
    for t in range(400):
        runs = [int(v) for v in rng.integers(0, [3, 300, 10**6][t % 3], int(rng.integers(0, 40)))]
        w = max(1, sum(runs))
        strings.append(mask_utils.frPyObjects({"size": [1, w], "counts": runs}, 1, w)["counts"].decode())
        sums.append(sum(runs))
    for t in range(50):  # and masks as pycocotools encodes them
        h, w = (int(v) for v in rng.integers(1, 200, 2))
        m = rng.random((h, w)) < [0.5, 0.0, 1.0, 0.01][t % 4]
        strings.append(mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))["counts"].decode())
        sums.append(h * w)
    assert rle_string_totals(strings).tolist() == sums
    broken = ["PP", "zz", " ", "\x7f", "é", strings[1] + "P", "O"]  # "O" is one run of -1
    assert rle_string_totals([*broken, strings[1]]).tolist() == [NOT_RLE] * 6 + [NEGATIVE_RUN, sums[1]]


# ------------------------------------------------------------------------------ issue 56: polygons of 1e9


@pytest.mark.slow
def test_a_polygon_of_1e9_is_refused_before_pycocotools_rasterizes_it(tmp_path):
    """One polygon with coordinates of 1e9, in the results or in the ground truth: pycocotools' C code crashed the
    process (status 139, no output); now status 2 and one line naming the file and the entry, whatever the backend.
    Run as processes: a crash must not take pytest with it."""
    from helpers import run_tool
    from minidet.apps.synthetic import dense_coco_set
    from test_scoring import TOOL

    data, results = dense_coco_set(3, 5, seed=1)
    huge = [[5.0, 5.0, 1e9, 5.0, 1e9, 1e9]]
    i = next(k for k, a in enumerate(data["annotations"]) if isinstance(a["segmentation"], list))
    bad_gt, nan_gt = json.loads(json.dumps(data)), json.loads(json.dumps(data))
    bad_gt["annotations"][i]["segmentation"] = huge
    nan_gt["annotations"][i]["segmentation"] = [[5.0, 5.0, float("nan"), 5.0, 9.0, 9.0]]
    bad_results = [*results[:2], {**results[2], "segmentation": huge}]
    files = {name: tmp_path / f"{name}.json" for name in ("gt", "bad_gt", "nan_gt", "results", "bad_results")}
    for name, doc in zip(files, (data, bad_gt, nan_gt, results, bad_results)):
        files[name].write_text(json.dumps(doc))
    bound = ("segmentation polygon 0: point (1e+09, 5) lies outside the image extended by its size on each side "
             "(x in [-640, 1280], y in [-480, 960])")
    in_gt = f"{files['bad_gt']}: annotations[{i}]: {bound}"
    cases = [
        ("gt", "bad_results", "pycocotools", f"{files['bad_results']}: entry 2: {bound}"),
        ("bad_gt", "results", "pycocotools", in_gt),
        ("nan_gt", "results", "pycocotools", f"{files['nan_gt']}: annotations[{i}]: segmentation polygon 0 must hold "
                                             "finite numbers, got nan"),
    ]
    if importlib.util.find_spec("hotcoco"):  # the eval extra
        cases.append(("bad_gt", "results", "hotcoco", in_gt))
    for gt, res, backend, start in cases:  # the annotation file's line ends with the annotation's id
        r = run_tool(TOOL, "--ann", str(files[gt]), "--results", str(files[res]), "--output", str(tmp_path / "o"),
                     "--backend", backend, cwd=tmp_path, threads=1)
        assert r.returncode == 2, (gt, res, backend, r.returncode, r.stderr[-2000:])
        assert one_error_line(r.stderr).startswith(f"error: {start}")


def test_the_model_form_refuses_masks_against_box_only_annotations_before_running(tmp_path, capsys):
    """An annotation file with an empty polygon list (box-only datasets write one) and a mask model: refused in one
    line before the model runs (it was refused after the whole run), saying how to score the boxes alone."""
    from test_eval_coco_tool import CONFIG, IMAGES

    data = _load(ANN)
    i = next(k for k, a in enumerate(data["annotations"]) if not a["iscrowd"])
    data["annotations"][i]["segmentation"] = []
    ann = tmp_path / "boxes.json"
    ann.write_text(json.dumps(data))
    rc, err = _eval_in_process(capsys, "--config-file", str(CONFIG), "--ann", str(ann), "--images", str(IMAGES),
                               "--output", str(tmp_path / "o"))
    assert rc == 2 and one_error_line(err) == (
        f"error: {ann}: annotations[{i}] (id {data['annotations'][i]['id']}) has no segmentation (an empty polygon "
        "list); cannot evaluate masks (--mask-format none scores the boxes alone)")
