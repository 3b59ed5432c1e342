"""tools/benchmark.py end to end (subprocess) at a tiny size: printed tables, JSON schema, chart."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import cv2
import pytest

from helpers import load_tool, run_tool
from minidet.testing import benchreport
from minidet.testing.benchreport import Run
from minidet.timing import DETAILS, STAGES

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "benchmark.py"
# few proposals and detections keep the three models' forwards short on a CPU
FAST = [
    "MODEL.RPN.PRE_NMS_TOPK_TEST", "200", "MODEL.RPN.POST_NMS_TOPK_TEST", "50",
    "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "10",
]


# a row of the step table: [label] step torchvision-ms minidet-ms ratio verdict
STEP_LINE = re.compile(
    r"^(?P<label>\S*)\s+(?P<step>\w+)\s+(?P<tv>[\d.]+)\s+(?P<md>[\d.]+)\s+(?P<ratio>[\d.]+)x"
    r"\s+(?P<verdict>met|not met)$"
)


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_tool(TOOL, *args, cwd=cwd)


def _run_record(variant: str, stages: list[dict], details: list[dict], walls: list[float], dets: list[int]) -> Run:
    """A plain record of one model at R-50, batch 1 (what the tool fills while it times)."""
    impl = "torchvision" if variant == "torchvision" else "minidet"
    cpus = [0.1] * len(walls)
    return Run(variant, impl, variant, 50, 1, "test", stages, details, walls, cpus, dets)


@pytest.mark.slow
def test_benchmark_vs_torchvision_json_and_plot(tmp_path):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    args = ["--size", "160", "--image", "120x160", "--iters", "2", "--warmup", "0"]
    args += ["--norms", "FrozenBN,Affine+fold,none"]
    args += ["--vs-torchvision", "--json", str(out_json), "--plot", str(out_png), *FAST]
    proc = _run(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "same detections as torchvision on 2/2 images" in proc.stdout, proc.stdout
    assert "torchvision / Affine+fold: end to end" in proc.stdout
    lines = proc.stdout.splitlines()
    title = lines.index(
        "steps where torchvision does avoidable work (target: minidet at most half of torchvision's time), median ms:"
    )
    assert lines[title + 1].split() == ["model", "step", "torchvision", "minidet", "tv/minidet", "target"]
    # one block per compared variant: its label on the first of the 5 steps
    table = [STEP_LINE.match(ln) for ln in lines[title + 2 : title + 12]]
    assert all(table), lines[title : title + 13]
    assert [m["label"] for m in table] == ["FrozenBN", "", "", "", "", "Affine+fold", "", "", "", ""]
    assert [m["step"] for m in table] == [*DETAILS, "paste"] * 2
    assert lines[title + 12].startswith("(steps inside stages:")

    data = json.loads(out_json.read_text())
    assert {"torch", "torchvision", "threads", "cpu", "gpu", "git", "command", "load_average"} <= set(data["env"])
    assert data["settings"]["variants"] == ["FrozenBN", "Affine+fold", "none"] and data["settings"]["opts"] == FAST
    runs = {r["label"]: r for r in data["runs"]}
    assert list(runs) == ["torchvision", "FrozenBN", "Affine+fold", "none"]
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
        # steps inside stages: statistics like the stages', no total, each within its stage
        assert list(r["details"]) == list(DETAILS)
        for s in r["details"].values():
            assert s["n"] == 2 and 0 < s["min"] <= s["median"] <= s["max"]
        for step, stage in (("rpn_select", "rpn"), ("box_roi_align", "box_head"), ("box_postprocess", "box_head")):
            assert r["details"][step]["median"] <= r["stages"][stage]["median"]
        assert r["details"]["mask_roi_align"]["median"] <= r["stages"]["mask_head"]["median"]
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
    assert list(vs["steps"]) == [*DETAILS, "paste"] and vs["steps"]["paste"] == vs["stages"]["paste"]
    tv_details = runs["torchvision"]["details"]
    for step in DETAILS:
        assert vs["steps"][step] == pytest.approx(tv_details[step]["median"] / fold["details"][step]["median"])
    assert vs["steps_target"] == 2.0
    assert vs["steps_met"] == {s: v >= 2.0 for s, v in vs["steps"].items()}
    # the printed step table shows these numbers
    steps_of = lambda r: {**r["details"], "paste": r["stages"]["paste"]}  # noqa: E731
    for m, label in zip(table, ["FrozenBN"] * 5 + ["Affine+fold"] * 5):
        step, row = m["step"], runs[label]
        assert m["tv"] == f"{1e3 * steps_of(runs['torchvision'])[step]['median']:.2f}"
        assert m["md"] == f"{1e3 * steps_of(row)[step]['median']:.2f}"
        assert m["ratio"] == f"{row['vs_torchvision']['steps'][step]:.2f}"
        assert m["verdict"] == ("met" if row["vs_torchvision"]["steps_met"][step] else "not met")
    assert vs["detections"]["images"] == vs["detections"]["same"] == 2
    assert vs["detections"]["worst_box_px"] <= 1e-2 and vs["detections"]["worst_mask_iou"] >= 0.99

    # no norm layers: its own random weights (full detections above), not compared with torchvision
    none = runs["none"]
    assert none["weights"].startswith("minidet R-50 without norm layers") and none["vs_torchvision"] is None
    assert none["vs_none"] is None and none["norm_share_of_backbone"] is None
    for label in ("FrozenBN", "Affine+fold"):
        vn = runs[label]["vs_none"]
        assert vn["backbone_s"] == runs[label]["stages"]["backbone"]["median"]
        assert vn["none_backbone_s"] == none["stages"]["backbone"]["median"]
        assert vn["norm_cost"] == pytest.approx(vn["backbone_ratio"] - 1)
        assert vn["paired_backbone_ratio"]["n"] == 2
        assert f"{label}: norm share measured against no norm: backbone {100 * vn['norm_cost']:+.1f}%" in proc.stdout
    assert "\nfolded vs no norm: backbone " in proc.stdout and "too few iterations to judge" in proc.stdout

    img = cv2.imread(str(out_png))
    assert img is not None and img.shape[0] >= 400 and img.shape[1] >= 400
    assert (img < 250).any(axis=2).mean() > 0.05  # something is drawn


@pytest.mark.slow
def test_benchmark_batch_throughput_against_batch_1(tmp_path):
    out_json = tmp_path / "bench.json"
    args = ["--size", "160", "--image", "120x160", "--iters", "2", "--warmup", "0", "--no-memory"]
    proc = _run(*args, "--norms", "Affine+fold", "--batch", "1,3", "--json", str(out_json), *FAST, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = {r["label"]: r for r in json.loads(out_json.read_text())["runs"]}
    assert list(runs) == ["Affine+fold b1", "Affine+fold b3"]
    assert runs["Affine+fold b1"]["vs_batch1"] is None
    b = runs["Affine+fold b3"]["vs_batch1"]
    one, three = runs["Affine+fold b1"], runs["Affine+fold b3"]
    assert b["throughput_ratio"] == pytest.approx(three["images_per_s"] / one["images_per_s"])
    assert b["paired_min"] <= b["paired_median"] <= b["paired_max"]
    assert f"Affine+fold b3: throughput {b['throughput_ratio']:.3f}x batch 1's" in proc.stdout


def test_benchmark_arguments(capsys):
    tool = load_tool(TOOL)
    args = tool.parse_args(["--norms", "GN,Affine+fold,none", "--depths", "50,101", "--batch", "1,16", "--size", "512"])
    assert args.variants == ["GN", "Affine+fold", "none"]
    assert args.depth_list == [50, 101] and args.batch_list == [1, 16]
    assert args.max_size == 853 and args.opts == []
    for bad, msg in ((["--norms", "FrozenBN,BatchNorm"], "unknown BatchNorm"), (["--batch", "0"], "--batch")):
        with pytest.raises(SystemExit) as e:
            tool.parse_args(bad)
        assert e.value.code == 2 and msg in capsys.readouterr().err


def test_detection_drift_matches_by_label_and_iou():
    import torch

    from minidet.testing.compare import detection_drift

    ref = {"boxes": torch.tensor([[0.0, 0, 10, 10], [20, 20, 40, 40]]), "scores": torch.tensor([0.9, 0.8]),
           "labels": torch.tensor([1, 2])}
    new = {"boxes": torch.tensor([[21.0, 20, 40, 40], [0, 0, 10, 10], [50, 50, 60, 60]]),
           "scores": torch.tensor([0.7, 0.9, 0.1]), "labels": torch.tensor([2, 3, 1])}
    d = detection_drift([ref], [new])
    assert (d["detections_fp32"], d["detections_amp"], d["matched"]) == (2, 3, 1)  # box 0 changed label
    assert d["box_diff_px_max"] == pytest.approx(1.0) and d["score_diff_max"] == pytest.approx(0.1)


def test_compare_detections_names_paste_grid_flips_and_excuses_no_mask():
    """One verdict for the tests and the benchmark: every mask needs IoU >= 0.99. A mask pasted one
    pixel apart because the two boxes (equal within 2e-3 px) truncate to different paste grids is
    a difference, which the message names; so is one flipped pixel in a small mask."""
    import torch
    from torchvision.models.detection.roi_heads import expand_boxes

    from minidet.testing.compare import assert_same_detections, compare_detections, paste_grid

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
    assert m.worst_iou == 0.0 and m.low_iou == 1 and m.grid_flips == 1
    assert m.problem() == (
        "mask IoU 0.0000: 1 masks below 0.99 (at most 400 pixels differ), 1 of them pasted 1 px apart"
        " (boxes on different paste grids)"
    )
    same_grid = compare_detections({**ours, "boxes": box + 1e-5}, ref)
    assert same_grid.grid_flips == 0 and same_grid.problem().endswith("(at most 400 pixels differ)")
    with pytest.raises(AssertionError, match="mask IoU 0.0000"):
        assert_same_detections(ours, ref)

    small = torch.zeros(1, 40, 40, dtype=torch.bool)
    small[0, 10:16, 10:23] = True  # 78 pixels: one flipped pixel is IoU 77 / 78 < 0.99
    flipped = small.clone()
    flipped[0, 10, 10] = False
    one = compare_detections({**ref, "masks": flipped}, {**ref, "masks": small})
    assert one.worst_pixels == 1 and one.problem().startswith("mask IoU 0.9872: 1 masks below 0.99")
    assert assert_same_detections(ref, ref).problem() == ""


def test_compare_detections_names_a_different_detection():
    """A detection replaced by another of the same label is reported as such, not as a 'moved box'."""
    import torch

    from minidet.testing.compare import compare_detections

    boxes = torch.tensor([[10.0, 10, 50, 50], [100, 100, 140, 150], [300, 20, 330, 60]])
    ref = {"boxes": boxes, "scores": torch.tensor([0.9, 0.5, 0.2]), "labels": torch.tensor([1, 2, 2])}
    ours = {**ref, "boxes": boxes.clone()}
    ours["boxes"][2] = torch.tensor([400.0, 300, 420, 330])
    problem = compare_detections(ours, ref).problem()
    assert problem.startswith("1 of 3 detections have no counterpart of the same label within 1.0 px")
    assert "reference #2 label 2 score 0.2000" in problem
    moved = {**ref, "boxes": boxes + torch.tensor([0.0, 0.0, 0.5, 0.0])}
    assert compare_detections(moved, ref).problem() == "box differs by 0.5 px"


def test_step_table_against_torchvision_only():
    ms = 1e-3
    tv_stages, md_stages = {s: 10 * ms for s in STAGES}, {s: 5 * ms for s in STAGES}
    tv_stages["paste"], md_stages["paste"] = 40 * ms, 10 * ms
    tv_details = {"rpn_select": 4 * ms, "box_roi_align": 4 * ms, "box_postprocess": 3 * ms, "mask_roi_align": 2 * ms}
    md_details = {"rpn_select": 1 * ms, "box_roi_align": 2 * ms, "box_postprocess": 2 * ms, "mask_roi_align": 2 * ms}
    runs = [
        _run_record(variant, [stages] * 2, [details] * 2, [sum(stages.values())] * 2, [5, 5])
        for variant, stages, details in (("torchvision", tv_stages, tv_details), ("Affine+fold", md_stages, md_details))
    ]

    rows = benchreport.analyze(runs)
    fold = rows[1]
    assert fold["stages"]["total"]["median"] == pytest.approx(sum(md_stages.values()))  # details not in the total
    assert list(fold["details"]) == list(DETAILS) and fold["details"]["rpn_select"]["median"] == 1 * ms
    vs = fold["vs_torchvision"]
    assert vs["steps"] == pytest.approx(
        {"rpn_select": 4.0, "box_roi_align": 2.0, "box_postprocess": 1.5, "mask_roi_align": 1.0, "paste": 4.0}
    )
    assert vs["steps_met"] == {
        "rpn_select": True, "box_roi_align": True, "box_postprocess": False, "mask_roi_align": False, "paste": True
    }
    text = benchreport.report(rows).splitlines()
    i = text.index(
        "steps where torchvision does avoidable work (target: minidet at most half of torchvision's time), median ms:"
    )
    assert [ln.split() for ln in text[i + 2 : i + 7]] == [
        ["Affine+fold", "rpn_select", "4.00", "1.00", "4.00x", "met"],
        ["box_roi_align", "4.00", "2.00", "2.00x", "met"],
        ["box_postprocess", "3.00", "2.00", "1.50x", "not", "met"],
        ["mask_roi_align", "2.00", "2.00", "1.00x", "not", "met"],
        ["paste", "40.00", "10.00", "4.00x", "met"],
    ]
    # without torchvision there is no step table
    alone = benchreport.analyze(runs[1:])
    assert alone[0]["vs_torchvision"] is None and list(alone[0]["details"]) == list(DETAILS)
    assert not any(ln.startswith("steps where") for ln in benchreport.report(alone).splitlines())


def test_norm_cost_against_no_norm_and_gn_over_frozenbn():
    ms = 1e-3
    backbone = {"FrozenBN": [12] * 3, "Affine": [11] * 3, "Affine+fold": [10, 10.5, 9.5], "GN": [15] * 3}
    backbone["none"] = [10] * 3

    def rows_of(variants):
        runs = []
        for v in variants:
            records = [{**{s: 5 * ms for s in STAGES}, "backbone": b * ms} for b in backbone[v]]
            runs.append(_run_record(v, records, [{}] * 3, [sum(rec.values()) for rec in records], [100] * 3))
        rows = benchreport.analyze(runs)
        return {row["label"]: row for row in rows}, benchreport.report(rows).splitlines()

    rows, text = rows_of(["FrozenBN", "Affine", "Affine+fold", "GN", "none"])
    assert rows["FrozenBN"]["vs_none"]["norm_cost"] == pytest.approx(0.2)
    assert rows["Affine"]["vs_none"]["backbone_ratio"] == pytest.approx(1.1)
    fold = rows["Affine+fold"]["vs_none"]
    assert fold["norm_cost"] == pytest.approx(0.0) and fold["backbone_s"] == pytest.approx(10 * ms)
    assert fold["paired_backbone_ratio"] == pytest.approx({"n": 3, "median": 1.0, "min": 0.95, "max": 1.05})
    assert rows["GN"]["vs_none"]["norm_cost"] == pytest.approx(0.5)
    assert rows["none"]["vs_none"] is None and rows["none"]["norm_share_of_backbone"] is None
    gn = rows["GN"]["vs_frozenbn"]
    assert gn["backbone_increase"] == pytest.approx(0.25) and gn["end_to_end_increase"] == pytest.approx(45 / 42 - 1)
    against = "norm share measured against no norm: backbone"
    assert text[-8:] == [
        "FrozenBN: norm share of backbone time 16.7% (backbone median vs the folded variant, which runs no norm op)",
        f"FrozenBN: {against} +20.0% (12.0 ms vs 10.0 ms of none, which has no norm layers)",
        "Affine: norm share of backbone time 9.1% (backbone median vs the folded variant, which runs no norm op)",
        f"Affine: {against} +10.0% (11.0 ms vs 10.0 ms of none, which has no norm layers)",
        f"Affine+fold: {against} +0.0% (10.0 ms vs 10.0 ms of none, which has no norm layers)",
        "folded vs no norm: backbone 10.0 ms vs 10.0 ms (ratio 1.000; per iteration 0.950 to 1.050: within the noise; "
        "Affine+fold vs none)",
        f"GN: {against} +50.0% (15.0 ms vs 10.0 ms of none, which has no norm layers)",
        "GN over FrozenBN: backbone +25.0%, end to end +7.1%",
    ]

    # without the no-norm model: the lines measured against the folded variant and FrozenBN only
    rows, text = rows_of(["FrozenBN", "Affine+fold", "GN"])
    assert all(row["vs_none"] is None for row in rows.values())
    assert text[-2:] == [
        "FrozenBN: norm share of backbone time 16.7% (backbone median vs the folded variant, which runs no norm op)",
        "GN over FrozenBN: backbone +25.0%, end to end +7.1%",
    ]
    assert not any("no norm" in ln and "no norm op" not in ln for ln in text)


def test_torchvision_channels_last_baseline_report_and_json():
    from minidet.testing.compare import DetectionMatch

    tool = load_tool(TOOL)
    args = tool.parse_args(["--norms", "FrozenBN,Affine+fold", "--vs-torchvision"])
    same, moved = DetectionMatch(5, 5), DetectionMatch(5, 5, unmatched_label=32)
    differs = {"FrozenBN": [], "Affine+fold": [2, 3]}  # pool batches (batch 1: image seeds) that differ
    runners = []
    for variant in ("torchvision", "FrozenBN", "Affine+fold"):
        r = tool.Runner(variant, 50, 1, "w.pth", 1, "test")
        r.records, r.detail_records = [{s: 1e-3 for s in STAGES}] * 4, [{}] * 4
        r.walls, r.cpus, r.dets = [7e-3] * 4, [0.1] * 4, [5] * 4
        if variant != "torchvision":
            r.checks = [moved if k in differs[variant] else same for k in range(4)]
            r.check_images = [(k, 0) for k in range(4)]
        runners.append(r)
    calls = []

    def channels_last_changes(images):  # torchvision itself changes under channels-last on image 2 only
        calls.append(images)
        return [moved if images == ["img2"] else same]

    runners[0].channels_last_changes = channels_last_changes
    tool.channels_last_baseline(runners, {1: [[f"img{k}"] for k in range(4)]})
    assert calls == [["img2"], ["img3"]]  # only where a variant differs, once per image
    assert runners[1].tv_channels_last == [None] * 4

    records = [r.record(args.depth_list, args.batch_list) for r in runners]  # what the tool hands on
    rows = json.loads(json.dumps(benchreport.analyze(records)))  # as --json writes them
    fb, fold = (rows[i]["vs_torchvision"]["detections"] for i in (1, 2))
    assert fb["tv_channels_last"] == {"images": 0, "changed": 0, "first_change": None}
    assert fb["first_problem_image_seed"] is None
    assert (fold["images"], fold["same"], fold["first_problem_image_seed"]) == (4, 2, 2)
    assert fold["tv_channels_last"] == {
        "images": 2, "changed": 1, "first_change": "no unmatched detection with label 32"
    }
    text = benchreport.report(rows).splitlines()
    i = text.index(
        "  same detections as torchvision on 4/4 images (worst box 0 px, score 0, mask IoU 1.0000, "
        "at most 0 mask pixels differ)"
    )
    assert text[i + 1].startswith("torchvision / Affine+fold: end to end")
    assert text[i + 2].startswith("  DIFFERENT detections from torchvision on 2/4 images (worst box")
    assert text[i + 2].endswith("; first difference (image seed 2): no unmatched detection with label 32")
    assert text[i + 3] == (
        "  on 1 of these 2 images torchvision itself changes under channels-last (float summation order); "
        "first change: no unmatched detection with label 32"
    )
    # not measured (--amp): no counts, no line
    records[2].tv_channels_last = None
    rows = benchreport.analyze(records)
    assert rows[2]["vs_torchvision"]["detections"]["tv_channels_last"] is None
    assert not any("torchvision itself changes" in ln for ln in benchreport.report(rows).splitlines())
