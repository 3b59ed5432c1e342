"""tools/benchmark.py end to end (subprocess) at a tiny size: printed tables, JSON schema, chart."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import pytest

from minidet.timing import STAGES

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "benchmark.py"
# few proposals and detections keep the three models' forwards short on a CPU
FAST = [
    "MODEL.RPN.PRE_NMS_TOPK_TEST", "200", "MODEL.RPN.POST_NMS_TOPK_TEST", "50",
    "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "10",
]  # fmt: skip


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ""}  # the tool must find minidet by itself
    cmd = [sys.executable, str(TOOL), *args]
    return subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_benchmark_vs_torchvision_json_and_plot(tmp_path):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    args = ["--size", "160", "--image", "120x160", "--iters", "2", "--warmup", "0", "--norms", "FrozenBN,Affine+fold"]
    args += ["--vs-torchvision", "--json", str(out_json), "--plot", str(out_png), *FAST]
    proc = _run(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "same detections as torchvision on 2/2 images" in proc.stdout, proc.stdout
    assert "torchvision / Affine+fold: end to end" in proc.stdout

    data = json.loads(out_json.read_text())
    assert {"torch", "torchvision", "threads", "cpu", "gpu", "git", "command", "load_average"} <= set(data["env"])
    assert data["settings"]["variants"] == ["FrozenBN", "Affine+fold"] and data["settings"]["opts"] == FAST
    runs = {r["label"]: r for r in data["runs"]}
    assert list(runs) == ["torchvision", "FrozenBN", "Affine+fold"]
    for r in runs.values():
        assert list(r["stages"]) == [*STAGES, "total"]
        for s in r["stages"].values():
            assert s["n"] == 2 and 0 < s["min"] <= s["median"] <= s["max"]
        # the stage times add up to the timed call
        assert r["stages"]["total"]["median"] == pytest.approx(r["wall"]["median"], rel=0.05)
        assert r["images_per_s"] == pytest.approx(1 / r["wall"]["median"])
        assert r["cpu"]["n"] == 2 and r["cpu"]["median"] > 0
        assert r["detections_per_image"] == {"mean": 10, "min": 10, "max": 10}
        assert r["memory"]["forward_mib"] > 0
    assert runs["torchvision"]["impl"] == "torchvision" and runs["torchvision"]["vs_torchvision"] is None
    assert runs["FrozenBN"]["vs_frozenbn"]["speed"] == 1.0
    fold = runs["Affine+fold"]
    assert fold["weights"] == runs["torchvision"]["weights"]  # one set of weights for all
    assert set(fold["vs_frozenbn"]["stages"]) == {*STAGES, "total"}
    assert runs["FrozenBN"]["norm_share_of_backbone"] < 1  # (FrozenBN - folded) / FrozenBN backbone time
    vs = fold["vs_torchvision"]
    assert vs["end_to_end"]["ratio_of_medians"] > 0 and vs["end_to_end"]["paired_sd"] >= 0
    assert vs["end_to_end"]["ratio_of_mins"] > 0 and vs["end_to_end"]["ratio_of_cpu_medians"] > 0
    assert set(vs["stages"]) == {*STAGES, "total"}
    assert vs["detections"]["images"] == vs["detections"]["same"] == 2
    assert vs["detections"]["worst_box_px"] <= 1e-2 and vs["detections"]["worst_mask_iou"] >= 0.99

    img = cv2.imread(str(out_png))
    assert img is not None and img.shape[0] >= 400 and img.shape[1] >= 400
    assert (img < 250).any(axis=2).mean() > 0.05  # something is drawn


def _load_tool():
    spec = importlib.util.spec_from_file_location("benchmark_tool", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_arguments(capsys):
    tool = _load_tool()
    args = tool.parse_args(["--norms", "GN,Affine+fold", "--depths", "50,101", "--batch", "1,16", "--size", "512"])
    assert args.variants == ["GN", "Affine+fold"] and args.depth_list == [50, 101] and args.batch_list == [1, 16]
    assert args.max_size == 853 and args.opts == []
    for bad, msg in ((["--norms", "FrozenBN,BatchNorm"], "unknown BatchNorm"), (["--batch", "0"], "--batch")):
        with pytest.raises(SystemExit) as e:
            tool.parse_args(bad)
        assert e.value.code == 2 and msg in capsys.readouterr().err


def test_detection_drift_matches_by_label_and_iou():
    import torch

    tool = _load_tool()
    ref = {"boxes": torch.tensor([[0.0, 0, 10, 10], [20, 20, 40, 40]]), "scores": torch.tensor([0.9, 0.8]),
           "labels": torch.tensor([1, 2])}  # fmt: skip
    new = {"boxes": torch.tensor([[21.0, 20, 40, 40], [0, 0, 10, 10], [50, 50, 60, 60]]),
           "scores": torch.tensor([0.7, 0.9, 0.1]), "labels": torch.tensor([2, 3, 1])}  # fmt: skip
    d = tool.detection_drift([ref], [new])
    assert (d["detections_fp32"], d["detections_amp"], d["matched"]) == (2, 3, 1)  # box 0 changed label
    assert d["box_diff_px_max"] == pytest.approx(1.0) and d["score_diff_max"] == pytest.approx(0.1)


def test_compare_detections_tolerates_paste_grid_flips():
    import torch
    from torchvision.models.detection.roi_heads import expand_boxes

    from minidet.tvref import compare_detections, paste_grid

    boxes = torch.rand(200, 4) * 300
    boxes[:, 2:] += boxes[:, :2] + 1
    assert torch.equal(paste_grid(boxes), expand_boxes(boxes, 30 / 28).to(torch.int64))

    # widened by 30/28, y0 = 430 - 21 * 28 / 29 lands on 409: 2e-3 px apart, the grids differ by a pixel
    box = torch.tensor([[96.8765, 430 - 21 * 28 / 29 - 1e-3, 138.2999, 430.0]])
    other = box + torch.tensor([[0.0, 2e-3, 0.0, 0.0]])
    assert paste_grid(box)[0, 1] == 408 and paste_grid(other)[0, 1] == 409
    masks = torch.zeros(1, 40, 40, dtype=torch.bool)
    masks[0, 10:30:2, 10:30] = True  # thin stripes: a one-pixel shift changes every pixel
    ref = {"boxes": box, "scores": torch.tensor([0.5]), "labels": torch.tensor([3]), "masks": masks}
    ours = {**ref, "boxes": other, "masks": masks.roll(1, dims=1)}
    m = compare_detections(ours, ref)
    assert m.worst_iou == 0.0 and m.grid_flips == 1 and m.problem() == ""
    same_grid = {**ours, "boxes": box + 1e-5}
    assert compare_detections(same_grid, ref).problem(pixel_tol=2).startswith("mask IoU 0.0000")
