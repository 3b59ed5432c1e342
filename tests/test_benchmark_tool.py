"""tools/benchmark.py end to end (subprocess) at a tiny size: printed tables, JSON schema, chart; FLOPs
per stage, the machine's peaks and the floor, the busy-machine warning, the process memory setting and
the bf16 drift on real images."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import cv2
import pytest

from helpers import load_tool, needs_extra, run_tool
from minidet.apps.bench import report as benchreport
from minidet.apps.bench.report import Run
from minidet.timing import DETAILS, STAGES

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "benchmark.py"
TINY = ROOT.parent / "shared" / "data" / "coco_tiny" / "val2017"
BUSY = "warning: the machine was busy ("
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
    # never busy (the limits are out of reach): the warning's absence is deterministic
    args += ["--peak-seconds", "0.05", "--busy-load", "1000", "--busy-cpu", "0"]
    args += ["--vs-torchvision", "--json", str(out_json), "--plot", str(out_png), *FAST]
    proc = _run(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert BUSY not in proc.stdout
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
    assert vs["detections"]["images"] == vs["detections"]["same"] == vs["detections"]["judged_same"] == 2
    assert vs["detections"]["worst_box_px"] <= 1e-2 and vs["detections"]["worst_mask_iou"] >= 0.99
    # the last line: the verdict (after the files written)
    speed = ", ".join(f"{k} {runs[k]['vs_torchvision']['end_to_end']['ratio_of_medians']:.2f}x"
                      for k in ("FrozenBN", "Affine+fold"))
    assert lines[-1] == data["verdict"] == (
        f"verdict: speed, torchvision's time / minidet's: {speed}; the same detections as torchvision on every "
        "image (2 per variant); quiet machine"
    )

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

    _check_flops_peaks_floor(data, lines)
    # process memory: kept in the process (the default) for every model, stated and stored
    mem = data["env"]["process_memory"]
    assert data["settings"]["keep_memory"] == mem["mode"] == "on" and mem["applied"] is mem["keep_freed_memory"]
    assert any(ln.startswith("process memory (--keep-memory on, every model alike, torchvision too): ")
               for ln in lines)
    assert data["machine_busy"] is False and data["busy_check"]["reasons"] == []
    assert data["busy_check"]["load_limit"] == 1000 and data["busy_check"]["loop_cpu_s"] > 0


@pytest.mark.slow
def test_the_quick_run_has_no_step_table_and_ends_with_the_verdict(tmp_path):
    """``--quick`` (quickstart.sh), smaller: the step targets are the full benchmark's; the verdict is the last line."""
    args = ["--quick", "--size", "160", "--image", "120x160", "--iters", "1", "--warmup", "0", "--no-memory"]
    proc = _run(*args, "--peak-seconds", "0", "--busy-load", "1000", "--busy-cpu", "0", *FAST, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "interleaved (order rotating each iteration): torchvision, FrozenBN, Affine, Affine+fold" in proc.stdout
    assert not any(ln.startswith("steps where") for ln in lines)
    assert re.fullmatch(r"verdict: speed, torchvision's time / minidet's: FrozenBN [\d.]+x, Affine [\d.]+x, "
                        r"Affine\+fold [\d.]+x; .*; quiet machine", lines[-1]), lines[-1]


def _check_flops_peaks_floor(data: dict, lines: list[str]) -> None:
    """FLOPs per stage (positive where the network runs, adding up to the total; the same as torchvision's
    for the models on its weights), the peaks, each model's floor, and their printed lines."""
    runs = {r["label"]: r for r in data["runs"]}
    for r in runs.values():
        f = r["flops"]
        assert list(f["stages"]) == list(STAGES)
        assert sum(f["stages"].values()) == f["total"] > 0
        assert f["stages"]["preprocess"] == f["stages"]["paste"] == 0  # no convolution, no matrix product
        assert all(f["stages"][s] > 0 for s in ("backbone", "fpn", "rpn", "box_head", "mask_head"))
        for s, v in f["stages"].items():
            rate = f["gflop_per_s"][s]
            assert rate is None if v == 0 else rate == pytest.approx(v / r["stages"][s]["median"] / 1e9)
        assert f["gflop_per_s"]["total"] == pytest.approx(f["total"] / r["wall"]["median"] / 1e9)
    for label in ("FrozenBN", "Affine+fold"):  # oneDNN's fused convs counted: torchvision's FLOPs exactly
        assert runs[label]["flops"] == {**runs[label]["flops"], "stages": runs["torchvision"]["flops"]["stages"]}

    peaks = data["peaks"]
    assert peaks["threads"] == data["env"]["threads"] and peaks["seconds"] == 0.05
    for key in ("conv_fp32", "conv_bf16"):
        p = peaks[key]
        assert set(p["layouts"]) == {"contiguous", "channels_last"} and p["target"] == [1, 256, 64, 96]
        assert p["gflop_per_s"] == max(v["gflop_per_s"] for v in p["layouts"].values()) > 0
        assert all(v["calls"] >= 3 and v["shape"][:2] == [1, 256] for v in p["layouts"].values())
    lin = peaks["linear"]
    assert lin["target"] == [1000, 12544, 1024] and lin["plain"]["gflop_per_s"] > 0
    assert lin["variant"] is None and lin["variant_path"] == "minidet.layers.Linear, fuse off"  # MODEL.FUSE_LINEAR
    for label, r in runs.items():
        fl = r["floor"]
        assert fl["peak_gflop_per_s"] == peaks["conv_fp32"]["gflop_per_s"]
        assert fl["floor_s"] == pytest.approx(r["flops"]["total"] / (1e9 * fl["peak_gflop_per_s"]))
        assert fl["fraction"] == pytest.approx(fl["floor_s"] / r["wall"]["median"]) and 0 < fl["fraction"] < 1.5
        assert (
            f"floor {label}: {r['flops']['total'] / 1e9:.2f} GFLOP at the fp32 conv peak "
            f"{fl['peak_gflop_per_s']:.1f} GFLOP/s = {1e3 * fl['floor_s']:.0f} ms; median wall "
            f"{1e3 * r['wall']['median']:.0f} ms: floor / wall {fl['fraction']:.3f}"
        ) in lines

    assert any(ln.startswith("peaks of this machine, measured in this run (") for ln in lines)
    assert any(ln.startswith(f"  fp32 conv 3x3 256->256 at 64x96 (F.conv2d, oneDNN): "
                             f"{peaks['conv_fp32']['gflop_per_s']:.1f} GFLOP/s (contiguous ") for ln in lines)
    assert any(ln.startswith("  bf16 conv 3x3 256->256") for ln in lines)
    assert any(ln.startswith(f"  box head fc6 GEMM 1000x12544 -> 1024: plain nn.Linear "
                             f"{lin['plain']['gflop_per_s']:.1f} GFLOP/s") for ln in lines)
    # the FLOP table: per model a GFLOP line and a GFLOP/s line, the stages in order, then the total
    title = next(i for i, ln in enumerate(lines) if ln.startswith("FLOPs of one forward per stage"))
    assert lines[title + 1].split() == ["model", *STAGES, "total"]
    for k, (label, r) in enumerate(runs.items()):
        gflop, rate = lines[title + 2 + 2 * k].split(), lines[title + 3 + 2 * k].split()
        assert gflop == [label, "GFLOP", *(f"{r['flops']['stages'][s] / 1e9:.2f}" for s in STAGES),
                         f"{r['flops']['total'] / 1e9:.2f}"]
        assert rate[0] == "GFLOP/s" and rate[1] == "-" and rate[-2] == "-"  # preprocess, paste: no FLOPs
        assert rate[-1] == f"{r['flops']['gflop_per_s']['total']:.1f}"


def _drift_images(tmp_path: Path) -> Path:
    """The real COCO images of ../shared/data/coco_tiny where the checkout has them, else two synthetic ones."""
    if TINY.is_dir():
        return TINY
    from minidet.apps.synthetic import structured_image

    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(2):
        cv2.imwrite(str(folder / f"{i}.png"), structured_image(240, 320, seed=50 + i))
    return folder


@pytest.mark.slow
def test_benchmark_batch_throughput_busy_warning_and_bf16_drift(tmp_path):
    """Batch 3 against batch 1; the busy warning when the load limit is below any load (--busy-load -1);
    the bf16 drift on 2 real images; no peaks (--peak-seconds 0); glibc's defaults (--keep-memory off)."""
    out_json = tmp_path / "bench.json"
    args = ["--size", "160", "--image", "120x160", "--iters", "2", "--warmup", "0", "--no-memory"]
    args += ["--busy-load", "-1", "--peak-seconds", "0", "--keep-memory", "off"]
    args += ["--bf16-drift", "2", "--drift-images", str(_drift_images(tmp_path))]
    # channels-last: bf16 convolutions without hardware support are slow, far slower in the default layout
    proc = _run(*args, "--norms", "Affine+fold", "--batch", "1,3", "--json", str(out_json), *FAST,
                "MODEL.CHANNELS_LAST", "True", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out_json.read_text())
    runs = {r["label"]: r for r in data["runs"]}
    assert list(runs) == ["Affine+fold b1", "Affine+fold b3"]
    assert runs["Affine+fold b1"]["vs_batch1"] is None
    b = runs["Affine+fold b3"]["vs_batch1"]
    one, three = runs["Affine+fold b1"], runs["Affine+fold b3"]
    assert b["throughput_ratio"] == pytest.approx(three["images_per_s"] / one["images_per_s"])
    assert b["paired_min"] <= b["paired_median"] <= b["paired_max"]
    assert f"Affine+fold b3: throughput {b['throughput_ratio']:.3f}x batch 1's" in proc.stdout

    lines = proc.stdout.splitlines()
    busy = data["busy_check"]
    assert data["machine_busy"] is True and busy["load_limit"] == -1
    first = busy["reasons"][0]
    assert first.startswith("1-min load average ") and first.endswith(" before the timing, above -1")
    warning = [ln for ln in lines if ln.startswith(BUSY)]
    assert warning == [f"{BUSY}{'; '.join(busy['reasons'])}): ratios of this run are not results"]
    assert 0 < busy["cpu_utilization"] == pytest.approx(busy["loop_cpu_s"] / (busy["loop_wall_s"] * busy["threads"]))

    assert data["peaks"] is None and all(r["floor"] is None and r["flops"]["total"] > 0 for r in runs.values())
    assert not any(ln.startswith(("peaks of this machine", "floor ")) for ln in lines)
    assert data["env"]["process_memory"]["mode"] == "off" and data["env"]["process_memory"]["applied"] is False
    assert any(ln.startswith("process memory (--keep-memory off, every model alike, torchvision too): the "
                             "allocator's defaults") for ln in lines)

    # bf16 against fp32 on real images, once per model (batch 1's runner)
    assert runs["Affine+fold b3"]["bf16_drift"] is None
    d = runs["Affine+fold b1"]["bf16_drift"]
    assert d["images"] == 2 and d["detections_fp32"] == 20 and 0 <= d["matched"] <= 20  # 10 per image (FAST)
    assert d["matched_fraction"] == d["matched"] / 20
    assert set(d["coco"]) == {"bbox", "segm"} and all(0 <= v["AP"] <= v["AP50"] <= 1 for v in d["coco"].values())
    assert d["time_ratio"] == pytest.approx(d["bf16_s_median"] / d["fp32_s_median"]) and d["time_ratio"] > 0
    line = next(ln for ln in lines if ln.startswith("Affine+fold b1: bf16 vs fp32 on 2 real images ("))
    assert f"{d['matched']}/20 fp32 detections matched" in line and "COCO AP of bf16 with fp32 as ground truth" in line


@pytest.fixture(scope="module")
def graphs_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, list[str]]:
    """One ``minidet bench`` of the FrozenBN model beside its exported graph under each runtime installed
    (``--norms FrozenBN,onnxruntime,openvino,openvino-int8``, against torchvision): the float32 graph exported once,
    quantized once. ``(process, its JSON, the runtime variants run)``; the tests below read it."""
    import importlib.util

    from helpers import needs_extra

    needs_extra("onnxruntime", "export")  # CI: an error when missing
    if importlib.util.find_spec("onnxruntime") is None:
        pytest.skip("needs the minidet[export] extra")
    runtimes = ["onnxruntime"]
    if importlib.util.find_spec("openvino") is not None:
        runtimes.append("openvino")
        if importlib.util.find_spec("nncf") is not None:
            runtimes.append("openvino-int8")
    cwd = tmp_path_factory.mktemp("bench_graphs")
    out_json = cwd / "bench.json"
    proc = _run("--size", "128", "--image", "96x128", "--iters", "1", "--warmup", "0", "--no-memory",
                "--norms", ",".join(["FrozenBN", *runtimes]), "--vs-torchvision", "--calib-images", "1",
                "--peak-seconds", "0.02", "--json", str(out_json), *FAST, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out_json.read_text()), runtimes


@pytest.mark.slow
@pytest.mark.xdist_group("bench_graphs")  # one process of the parallel part runs graphs_run once for both tests
def test_the_exported_graph_runs_in_the_benchmark_like_any_variant(graphs_run):
    """``--norms onnxruntime`` (and ``openvino`` where installed): the FrozenBN model exported once, run by the
    runtime inside minidet, timed in the same interleaved loop, its network one stage, its FLOPs the eager
    network's, judged against torchvision like the other variants."""
    proc, data, runtimes = graphs_run
    rows = {r["variant"]: r for r in data["runs"]}
    for runtime in (r for r in runtimes if r != "openvino-int8"):
        row = rows[runtime]
        assert set(row["stages"]) == {"preprocess", "network", "paste", "total"}
        assert row["flops"]["total"] == rows["FrozenBN"]["flops"]["total"] > 0 and row["floor"]["fraction"] > 0
        assert row["vs_torchvision"]["detections"]["images"] == 1 and row["vs_frozenbn"]["speed"] > 0
        assert f"{runtime} " in proc.stdout.split("verdict:")[-1]
    assert proc.stderr.count("exporting the FrozenBN R-50 model") == 1  # one graph for every runtime


@pytest.mark.slow
def test_the_cascade_and_deformable_convs_cost_stage_by_stage_beside_the_plain_model(tmp_path):
    """``--norms FrozenBN,cascade,dcnv2`` on a detectron2 config: the config's plain Mask R-CNN, its Cascade R-CNN and
    its deformable-convolution variant timed in one run, each printed as its ratio to the plain one per stage; the
    cascade's FLOPs are the plain model's but for its box head, the deformable convs' counted in the backbone."""
    out_json = tmp_path / "bench.json"
    proc = _run("--config-file", "detectron2/mask_rcnn_R_50_FPN_1x", "--size", "160", "--image", "120x160", "--iters",
                "1", "--warmup", "0", "--no-memory", "--norms", "FrozenBN,cascade,dcnv2", "--peak-seconds", "0.05",
                "--json", str(out_json), *FAST, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {r["variant"]: r for r in json.loads(out_json.read_text())["runs"]}
    plain, cascade, dcn = (rows[v]["flops"]["stages"] for v in ("FrozenBN", "cascade", "dcnv2"))
    assert cascade["box_head"] > 2.5 * plain["box_head"] and cascade["backbone"] == plain["backbone"]
    assert dcn["backbone"] > plain["backbone"] and dcn["box_head"] == plain["box_head"]  # and the offset convs
    for variant in ("cascade", "dcnv2"):
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"{variant} / FrozenBN"))
        assert "(the plain Mask R-CNN): end to end " in line and " backbone " in line and " box_head " in line
        assert rows[variant]["vs_frozenbn"]["stages"]["box_head"] > 0


@pytest.mark.slow
def test_regnet_gc_blocks_and_mask_scoring_cost_stage_by_stage_beside_the_plain_model(tmp_path):
    """``--norms FrozenBN,regnety-4gf,gcb,maskiou`` on an mmdetection config (issue 45): a RegNetY body, GC blocks in
    res3 to res5 and Mask Scoring R-CNN's mask IoU head timed beside the plain Mask R-CNN in one run, each printed as
    its ratio to it per stage; their FLOPs differ from the plain model's only where the architecture does (the
    RegNet's grouped convs and SE, the GC blocks' convs and attention pooling, the mask IoU head in the mask stage)."""
    out_json = tmp_path / "bench.json"
    proc = _run("--config-file", "mmdetection/mask-rcnn_r50_fpn_1x_coco", "--size", "160", "--image", "120x160",
                "--iters", "1", "--warmup", "0", "--no-memory", "--norms", "FrozenBN,regnety-4gf,gcb,maskiou",
                "--peak-seconds", "0.05", "--json", str(out_json), *FAST, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {r["variant"]: r for r in json.loads(out_json.read_text())["runs"]}
    plain, regnet, gcb, maskiou = (rows[v]["flops"]["stages"] for v in ("FrozenBN", "regnety-4gf", "gcb", "maskiou"))
    assert regnet["backbone"] != plain["backbone"] and regnet["rpn"] == plain["rpn"]
    assert plain["backbone"] < gcb["backbone"] < 1.01 * plain["backbone"] and gcb["fpn"] == plain["fpn"]
    assert maskiou["backbone"] == plain["backbone"] and maskiou["mask_head"] > 1.5 * plain["mask_head"]
    for variant in ("regnety-4gf", "gcb", "maskiou"):
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"{variant} / FrozenBN"))
        assert "(the plain Mask R-CNN): end to end " in line and " backbone " in line and " mask_head " in line
        assert rows[variant]["detections_per_image"]["min"] == 10  # FAST's cap: calibrated as the plain model
    assert "the mask IoU head " in next(x for x in proc.stdout.splitlines() if x.startswith("maskiou / FrozenBN"))
    assert "mask_iou" in rows["maskiou"]["details"] and "mask_iou" not in rows["gcb"]["details"]


@pytest.mark.slow
@pytest.mark.xdist_group("bench_graphs")
@needs_extra("openvino", "openvino")
@needs_extra("nncf", "int8")
def test_the_int8_graph_runs_beside_the_float32_graph_with_its_facts_and_the_int8_peak(graphs_run):
    """``--norms openvino,openvino-int8``: the float32 graph exported once, quantized by NNCF on the calibration
    images, both run by OpenVINO in the same interleaved loop; the JSON holds the quantization's facts, the int8
    layers the runtime compiled, OpenVINO's float32 and int8 conv peaks (the int8 conv compiled in int8) and each
    graph's floor at its own precision's peak."""
    proc, data, runtimes = graphs_run
    assert "openvino-int8" in runtimes
    assert proc.stderr.count("exporting the FrozenBN R-50 model") == 1  # one float32 graph for both
    assert proc.stderr.count("quantizing the FrozenBN R-50 graph to int8 on 1 image (NNCF)") == 1
    assert data["settings"]["calib_images"] == 1
    rows = {r["variant"]: r for r in data["runs"]}
    assert [v for v in rows if v.startswith("openvino")] == ["openvino", "openvino-int8"]
    int8, fp32 = rows["openvino-int8"], rows["openvino"]
    for row in (int8, fp32):
        assert set(row["stages"]) == {"preprocess", "network", "paste", "total"}
        assert row["flops"]["total"] == fp32["flops"]["total"] > 0
    q = int8["quantize"]
    assert q["tool"] == "NNCF" and q["calibration_images"] == 1 and q["seconds"] > 0
    assert "coco_tiny" in q["calibration_source"] or "synthetic" in q["calibration_source"]
    assert q["layers"]["int8"] > 0 and set(q["kept_float"]) >= {"rpn.head", "mask_head"}
    assert fp32["quantize"] is None
    assert int8["runtime"]["precision"] == "int8" and int8["runtime"]["layers"]["int8"] == q["layers"]["int8"]
    assert fp32["runtime"]["precision"] == "fp32" and "int8" not in fp32["runtime"]["layers"]
    peaks = data["peaks"]
    assert peaks["conv_int8"]["gflop_per_s"] > 0 and peaks["conv_int8"]["layers"].get("int8") == 1
    assert peaks["conv_fp32_openvino"]["gflop_per_s"] > 0 and peaks["conv_fp32_openvino"]["layers"] == {"f32": 1}
    assert peaks["conv_fp32"]["gflop_per_s"] > 0 and "conv_bf16_openvino" not in peaks  # bf16 not asked
    assert int8["floor"]["peak"] == "conv_int8" and fp32["floor"]["peak"] == "conv_fp32_openvino"
    assert int8["floor"]["fraction"] < int8["floor"]["mixed"]["fraction"]  # its float32 stages at the fp32 peak
    out = proc.stdout
    assert "  OpenVINO int8 conv 3x3 256->256 at 64x96 (OpenVINO " in out and "floor openvino-int8: " in out
    assert "openvino-int8: quantized by NNCF " in out and "MODEL.RUNTIME_PRECISION int8, computes in int8" in out


def test_benchmark_arguments(capsys):
    tool = load_tool(TOOL)
    args = tool.parse_args(["--norms", "GN,Affine+fold,none", "--depths", "50,101", "--batch", "1,16", "--size", "512"])
    assert args.variants == ["GN", "Affine+fold", "none"]
    assert args.depth_list == [50, 101] and args.batch_list == [1, 16]
    assert args.max_size == 853 and args.opts == []
    # the defaults of the new options: memory kept (both models alike), peaks measured, drift off
    assert (args.keep_memory, args.peak_seconds, args.bf16_drift, args.busy_load) == ("on", 0.3, 0, None)
    assert args.busy_cpu == benchreport.BUSY_CPU and Path(args.drift_images) == tool.DRIFT_IMAGES
    assert tool.DRIFT_IMAGES == TINY
    bad_cases = [(["--norms", "FrozenBN,BatchNorm"], "unknown BatchNorm"), (["--batch", "0"], "--batch")]
    bad_cases += [(["--peak-seconds", "-1"], "--peak-seconds"), (["--keep-memory", "maybe"], "--keep-memory")]
    bad_cases += [(["--norms", "onnxruntime", "--amp", "bf16"], "an exported graph runs on the CPU in float32"),
                  (["--norms", "FrozenBN,openvino", "--device", "cuda"], "an exported graph runs on the CPU")]
    bad_cases += [(["--calib-images", "0"], "--calib-images >= 1")]
    for bad, msg in bad_cases:
        with pytest.raises(SystemExit) as e:
            tool.parse_args(bad)
        assert e.value.code == 2 and msg in capsys.readouterr().err
    assert tool.parse_args([]).calib_images == 8


def test_a_precision_the_machine_lacks_is_a_one_line_error(capsys, monkeypatch):
    """``--norms openvino-bf16`` (``openvino-int8``) where OpenVINO cannot compute in bf16 (int8) on this CPU, or the
    package that makes the int8 graph is missing: the argument check's one line, before anything runs."""
    tool = load_tool(TOOL)
    lacks = {"bf16": "MODEL.RUNTIME_PRECISION bf16: this CPU has no bf16 instructions OpenVINO computes with "
                     "(AVX512_BF16 or AMX); use fp32", "int8": ""}
    monkeypatch.setattr(tool, "precision_unavailable", lambda p: lacks.get(p, ""))
    assert tool.parse_args(["--norms", "openvino,openvino-int8"]).variants == ["openvino", "openvino-int8"]
    with pytest.raises(SystemExit) as e:
        tool.parse_args(["--norms", "FrozenBN,openvino-bf16"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and err.endswith(f"--norms openvino-bf16: {lacks['bf16']}")
    assert tool.RUNTIMES["openvino-int8"] == ("openvino", "int8") and tool.RUNTIMES["openvino-bf16"] == ("openvino",
                                                                                                        "bf16")


def test_detection_drift_matches_by_label_and_iou():
    import torch

    from minidet.apps.compare import detection_drift

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

    from minidet.apps.compare import assert_same_detections, compare_detections, paste_grid

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

    from minidet.apps.compare import compare_detections

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
    from minidet.apps.compare import DetectionMatch

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
    assert fb["tv_channels_last"] == {"images": 0, "changed": 0, "first_change": None, "no_larger": 0}
    assert fb["first_problem_image_seed"] is None and fb["judged_same"] == 4
    assert (fold["images"], fold["same"], fold["first_problem_image_seed"]) == (4, 2, 2)
    # image 2: torchvision itself moves as far under channels-last (the same difference): the same detections
    assert fold["tv_channels_last"] == {
        "images": 2, "changed": 1, "first_change": "no unmatched detection with label 32", "no_larger": 1
    }
    assert fold["judged_same"] == 3
    text = benchreport.report(rows).splitlines()
    i = text.index(
        "  same detections as torchvision on 4/4 images (worst box 0 px, score 0, mask IoU 1.0000, "
        "at most 0 mask pixels differ)"
    )
    assert text[i + 1].startswith("torchvision / Affine+fold: end to end")
    assert text[i + 2].startswith(
        "  DIFFERENT detections from torchvision on 1/4 images, further than torchvision itself moves under "
        "channels-last (worst box"
    )
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


def test_flop_formulas_count_the_fused_ops_as_pytorch_counts_the_plain_ones():
    """oneDNN's fused conv (both overloads) and linear are counted as the plain conv and linear they replace."""
    import torch
    from torch.nn import functional as F
    from torch.utils.flop_counter import FlopCounterMode

    tool = load_tool(TOOL)
    x, w, b = torch.randn(1, 8, 12, 10), torch.randn(16, 8, 3, 3), torch.randn(16)
    xl, wl, bl = torch.randn(5, 32), torch.randn(7, 32), torch.randn(7)
    args = ([1, 1], [1, 1], [1, 1], 1)
    with torch.inference_mode():
        with FlopCounterMode(display=False) as plain:
            F.conv2d(x, w, b, padding=1)
            F.linear(xl, wl, bl)
        with FlopCounterMode(display=False, custom_mapping=tool.FLOP_FORMULAS) as conv:
            torch.ops.mkldnn._convolution_pointwise(x, w, b, *args, "relu", [], "")
        with FlopCounterMode(display=False, custom_mapping=tool.FLOP_FORMULAS) as binary:
            other = torch.randn(1, 16, 12, 10)
            torch.ops.mkldnn._convolution_pointwise.binary(x, other, w, b, *args, "add", None, "relu", [], "")
        with FlopCounterMode(display=False, custom_mapping=tool.FLOP_FORMULAS) as linear:
            torch.ops.mkldnn._linear_pointwise(xl, wl, bl, "none", [], "")
    assert conv.get_total_flops() == binary.get_total_flops() == 2 * 16 * 12 * 10 * 8 * 9
    assert conv.get_total_flops() + linear.get_total_flops() == plain.get_total_flops()
    assert linear.get_total_flops() == 2 * 5 * 7 * 32


def test_peak_sizes_grow_to_the_target():
    tool = load_tool(TOOL)
    sizes = tool._halvings((1, 256, 64, 96), (2, 3), 4)
    assert sizes[0] == (1, 256, 4, 6) and sizes[-1] == (1, 256, 64, 96) and len(sizes) == 9
    assert all(a[2] * a[3] * 2 == b[2] * b[3] for a, b in zip(sizes, sizes[1:]))  # each twice the one before
    assert tool._halvings((1000,), (0,), 32) == [(62,), (125,), (250,), (500,), (1000,)]


def test_busy_check_and_its_warning_line():
    check = benchreport.busy_check((1.5, 1, 1), (1.9, 1, 1), 2, cpu_s=3.6, wall_s=2.0)
    assert check["busy"] is False and check["cpu_utilization"] == pytest.approx(0.9) and check["load_limit"] == 2
    assert benchreport.busy_line(check) is None
    check = benchreport.busy_check((1.5, 1, 1), (3.25, 1, 1), 2, cpu_s=1.0, wall_s=2.0)
    assert check["reasons"] == [
        "1-min load average 3.25 after the timing, above 2",
        "process CPU time 25% of wall time x 2 threads, below 70%",
    ]
    assert benchreport.busy_line(check) == (
        "warning: the machine was busy (1-min load average 3.25 after the timing, above 2; process CPU time 25% "
        "of wall time x 2 threads, below 70%): ratios of this run are not results"
    )
    # the limits are options: a load limit below any load makes every run busy; no CPU time (CUDA): not judged
    check = benchreport.busy_check((0.0, 0, 0), None, 2, cpu_s=None, wall_s=2.0, load_limit=-1)
    assert check["reasons"] == ["1-min load average 0.00 before the timing, above -1"]
    assert check["cpu_utilization"] is None


def test_coco_drift_is_one_for_the_same_detections_and_drops_with_changes():
    import torch

    masks = torch.zeros(3, 60, 80, dtype=torch.bool)
    boxes = torch.tensor([[5.0, 5, 25, 30], [30, 10, 70, 50], [10, 35, 40, 58]])
    for m, (x0, y0, x1, y1) in zip(masks, boxes.int().tolist()):
        m[y0:y1, x0:x1] = True
    ref = {"boxes": boxes, "scores": torch.tensor([0.9, 0.8, 0.3]), "labels": torch.tensor([1, 3, 3]), "masks": masks}
    same = benchreport.coco_drift([ref], [ref], [(60, 80)])
    assert same == {t: {"AP": pytest.approx(1.0), "AP50": pytest.approx(1.0), "AP75": pytest.approx(1.0)}
                    for t in ("bbox", "segm")}
    changed = {**ref, "labels": torch.tensor([1, 3, 1])}  # the third detection takes another class
    drift = benchreport.coco_drift([ref], [changed], [(60, 80)])
    assert drift["bbox"]["AP"] < 1 and drift["segm"]["AP"] < 1
    without_masks = {k: v for k, v in ref.items() if k != "masks"}
    assert set(benchreport.coco_drift([without_masks], [without_masks], [(60, 80)])) == {"bbox"}


def test_flops_floor_and_their_lines_from_records():
    ms = 1e-3
    stages = {s: 10 * ms for s in STAGES}
    flops = {"stages": {**{s: 0 for s in STAGES}, "backbone": 4e9, "fpn": 1e9}, "total": 5e9}
    runs = []
    for variant in ("torchvision", "Affine+fold"):
        r = _run_record(variant, [stages] * 3, [{}] * 3, [sum(stages.values())] * 3, [5] * 3)
        r.flops = flops
        runs.append(r)
    conv = {"gflop_per_s": 100.0, "layouts": {"contiguous": {"gflop_per_s": 100.0, "shape": [1, 256, 64, 96]}},
            "op": "conv 3x3 256->256 at 64x96 (F.conv2d, oneDNN)"}
    bf16 = {**conv, "gflop_per_s": 250.0}
    peaks = {"threads": 2, "seconds": 0.3, "grow_below_s": 0.1, "conv_fp32": conv, "conv_bf16": bf16}
    rows = benchreport.analyze(runs, peaks, amp="bf16")
    f = rows[1]["flops"]
    assert f["gflop_per_s"]["backbone"] == pytest.approx(400.0) and f["gflop_per_s"]["preprocess"] is None
    assert f["gflop_per_s"]["total"] == pytest.approx(5e9 / 70e-3 / 1e9)
    fl = rows[1]["floor"]
    assert fl["floor_s"] == pytest.approx(0.05) and fl["fraction"] == pytest.approx(0.05 / 0.07)
    assert fl["bf16_floor_s"] == pytest.approx(0.02) and fl["bf16_fraction"] == pytest.approx(0.02 / 0.07)
    text = benchreport.report(rows, amp="bf16", peaks=peaks).splitlines()
    assert (
        "floor Affine+fold: 5.00 GFLOP at the fp32 conv peak 100.0 GFLOP/s = 50 ms; median wall 70 ms: floor / "
        "wall 0.714 (at the bf16 conv peak 250.0 GFLOP/s: 20 ms, 0.286)"
    ) in text
    assert "  fp32 conv 3x3 256->256 at 64x96 (F.conv2d, oneDNN): 100.0 GFLOP/s (contiguous 100.0 at 1x256x64x96)" in [
        ln.rstrip() for ln in text
    ]
    # without peaks: FLOPs and rates, no floor
    rows = benchreport.analyze(runs)
    assert rows[0]["floor"] is None and rows[0]["flops"]["total"] == 5e9
    assert not any(ln.startswith(("floor ", "peaks of")) for ln in benchreport.report(rows).splitlines())


def test_each_graph_floor_is_at_its_own_precisions_peak():
    """An OpenVINO graph's floor is at OpenVINO's conv peak in its precision (the int8 graph's at the int8 peak, and
    with its float32 stages at OpenVINO's float32 peak: ``mixed``); eager models keep PyTorch's float32 peak; without
    OpenVINO's peaks every model falls back to that one. The peaks' lines name each."""
    ms = 1e-3
    stages = {s: 10 * ms for s in ("preprocess", "network", "paste")}
    flops = {"stages": {**{s: 0 for s in STAGES}, "backbone": 4e9, "rpn": 1e9, "mask_head": 1e9}, "total": 6e9}
    runs = []
    for variant in ("FrozenBN", "openvino", "openvino-int8"):
        r = _run_record(variant, [stages] * 3, [{}] * 3, [0.03] * 3, [5] * 3)
        r.flops = flops
        runs.append(r)
    runs[2].quantize = {"tool": "NNCF", "version": "3.4.0", "method": "post-training quantization",
                        "preset": "PERFORMANCE", "calibration_images": 2, "calibration_source": "2 synthetic images",
                        "seconds": 9.0, "layers": {"int8": 62, "float32": 11}, "kept_float": {"rpn.head": "why"}}
    conv = {"gflop_per_s": 100.0, "layouts": {"contiguous": {"gflop_per_s": 100.0, "shape": [1, 256, 64, 96]}},
            "op": "conv 3x3 256->256 at 64x96 (F.conv2d, oneDNN)"}
    ov32 = {"gflop_per_s": 200.0, "shape": [1, 256, 64, 96], "op": "conv 3x3 256->256 at 64x96 (OpenVINO 2026.4.1)"}
    int8 = {**ov32, "gflop_per_s": 1000.0}
    peaks = {"threads": 2, "seconds": 0.3, "grow_below_s": 0.1, "conv_fp32": conv, "conv_fp32_openvino": ov32,
             "conv_int8": int8}
    rows = {row["variant"]: row for row in benchreport.analyze(runs, peaks)}
    assert rows["FrozenBN"]["floor"]["peak"] == "conv_fp32"
    assert rows["FrozenBN"]["floor"]["floor_s"] == pytest.approx(0.06)
    assert rows["openvino"]["floor"]["peak"] == "conv_fp32_openvino"
    assert rows["openvino"]["floor"]["fraction"] == pytest.approx(0.03 / 0.03)
    fl = rows["openvino-int8"]["floor"]
    assert fl["peak"] == "conv_int8" and fl["floor_s"] == pytest.approx(0.006) and "mixed" in fl
    assert fl["mixed"]["float_flops"] == 2e9 and fl["mixed"]["floor_s"] == pytest.approx(2e9 / 200e9 + 4e9 / 1000e9)
    assert rows["openvino-int8"]["quantize"]["layers"]["int8"] == 62 and rows["FrozenBN"]["quantize"] is None
    text = benchreport.report(list(rows.values()), peaks=peaks).splitlines()
    assert ("floor openvino-int8: 6.00 GFLOP at the OpenVINO int8 conv peak 1000.0 GOP/s = 6 ms; median wall 30 ms: "
            "floor / wall 0.200 (its float32 stages rpn, mask_head, 2.00 GFLOP, at the OpenVINO fp32 peak 200.0 "
            "GFLOP/s, the rest at the int8 peak: 14 ms, 0.467)") in text
    assert "floor openvino: 6.00 GFLOP at the OpenVINO fp32 conv peak 200.0 GFLOP/s = 30 ms; median wall 30 ms: " \
           "floor / wall 1.000" in text
    assert "  OpenVINO int8 conv 3x3 256->256 at 64x96 (OpenVINO 2026.4.1): 1000.0 GOP/s (at 1x256x64x96)" in text
    assert any(ln.startswith("openvino-int8: quantized by NNCF 3.4.0 (post-training quantization, preset "
                             "PERFORMANCE, calibrated on 2 synthetic images; 9 s): 62 weighted layers in int8, 11 in "
                             "float32 (kept float: rpn.head)") for ln in text)
    # without OpenVINO's peaks: every model's floor at the float32 conv peak
    rows = benchreport.analyze(runs, {k: v for k, v in peaks.items() if k != "conv_int8"})
    assert rows[2]["floor"]["peak"] == "conv_fp32" and "mixed" not in rows[2]["floor"]


def test_a_difference_no_larger_than_the_references_own_is_the_same():
    """The verdict of the parity tests and the benchmark: a difference from the reference that is no larger than
    the reference's own under another float summation order (torchvision in channels-last) counts as the same
    detections; a larger one, or one where the reference does not move, does not."""
    import torch

    from minidet.apps.compare import assert_same_detections, compare_detections

    boxes = torch.tensor([[10.0, 10, 50, 50], [100, 100, 140, 150], [300, 20, 330, 60]])
    masks = torch.zeros(3, 200, 400, dtype=torch.bool)
    for m, (x0, y0, x1, y1) in zip(masks, boxes.int().tolist()):
        m[y0:y1, x0:x1] = True
    ref = {"boxes": boxes, "scores": torch.tensor([0.9, 0.5, 0.2]), "labels": torch.tensor([1, 2, 2]), "masks": masks}

    def changed(masks_moved: int = 0, box_px: float = 0.0, drop: int = 0) -> dict:
        out = {k: v.clone() for k, v in ref.items()}
        out["masks"][:masks_moved] = out["masks"][:masks_moved].roll(8, dims=2)  # IoU well below 0.99
        out["boxes"][2, 2] += box_px
        return {k: v[: len(v) - drop] for k, v in out.items()}

    ours = changed(masks_moved=1)
    assert compare_detections(ours, ref).extent() == (1, (1, pytest.approx(1 - 32 / 48)))
    for own, same in [
        (ref, False),  # torchvision does not move at all: any difference is larger
        (changed(masks_moved=1), True),  # the same difference
        (changed(masks_moved=2), True),  # more masks move
        (changed(box_px=0.5), True),  # a box moves: a larger kind of difference
        (changed(drop=1), True),  # a detection is lost
    ]:
        if same:
            assert assert_same_detections(ours, ref, own).problem().startswith("mask IoU 0.6667: 1 masks below")
        else:
            with pytest.raises(AssertionError, match=r"larger than the reference's own under another float order "
                                                     r"\(none\)"):
                assert_same_detections(ours, ref, own)
    with pytest.raises(AssertionError, match="box differs by 0.5 px; larger than the reference's own under another "
                                             "float order .mask IoU 0.6667"):
        assert_same_detections(changed(box_px=0.5), ref, ours)  # a moved box is more than torchvision's moved mask
    # other detections: as many as the reference's own is no larger (a lost one, one 2 px off: another detection)
    dropped, far = compare_detections(changed(drop=1), ref), compare_detections(changed(box_px=2.0), ref)
    assert dropped.extent() == far.extent() == (4, (1,))
    assert dropped.no_larger_than(far) and far.no_larger_than(dropped)
    assert not compare_detections(changed(drop=2), ref).no_larger_than(far)
    assert compare_detections(ref, ref).no_larger_than(None) and not dropped.no_larger_than(None)


def _verdict_rows(own_change, tv_seconds: float = 0.2) -> list[dict]:
    """torchvision, FrozenBN and Affine at 0.1 s per forward; Affine's detections differ from torchvision's on
    image 1 by one mask pasted a pixel apart, and torchvision in channels-last changes by ``own_change`` there."""
    from minidet.apps.compare import DetectionMatch

    stages = {s: 0.1 / len(STAGES) for s in STAGES}
    runs = []
    for variant in ("torchvision", "FrozenBN", "Affine"):
        t = tv_seconds if variant == "torchvision" else 0.1
        r = _run_record(variant, [{s: v * t / 0.1 for s, v in stages.items()}] * 4, [{}] * 4, [t] * 4, [5] * 4)
        if variant != "torchvision":
            r.checks = [DetectionMatch(5, 5) for _ in range(4)]
            r.check_images = [(k, 0) for k in range(4)]
            r.tv_channels_last = [None] * 4
        runs.append(r)
    affine = runs[2]
    affine.checks[1] = DetectionMatch(5, 5, worst_box=2e-3, worst_iou=0.61, worst_pixels=9, low_iou=1, grid_flips=1)
    affine.tv_channels_last[1] = own_change
    return benchreport.analyze(runs)


def test_the_quick_run_ends_with_one_verdict_line():
    """Same detections when Affine's difference is no larger than torchvision's own under channels-last; the
    verdict line gives each variant's speed against torchvision, the detections and the machine; the quick run's
    report has no step-target table (its targets are set for the full benchmark)."""
    from minidet.apps.compare import DetectionMatch

    quiet, busy = (benchreport.busy_check((0.5, 0, 0), (0.5, 0, 0), 2, cpu_s=3.6, wall_s=2.0, load_limit=limit)
                   for limit in (None, -1))
    moved_box = DetectionMatch(5, 5, worst_box=0.3, worst_iou=0.5, worst_pixels=40, low_iou=2)
    rows = _verdict_rows(moved_box)
    d = rows[2]["vs_torchvision"]["detections"]
    assert (d["images"], d["same"], d["judged_same"], d["tv_channels_last"]["no_larger"]) == (4, 3, 4, 1)
    text = benchreport.report(rows, steps=False).splitlines()
    assert "  same detections as torchvision on 4/4 images (3 within the tolerances, 1 no further from torchvision's " \
           "than torchvision itself moves under channels-last) (worst box 0.002 px, score 0, mask IoU 0.6100" in \
           "\n".join(text)
    assert not any(ln.startswith("steps where") for ln in text)
    assert any(ln.startswith("steps where") for ln in benchreport.report(rows).splitlines())  # the full benchmark's
    assert benchreport.verdict_line(rows, quiet) == (
        "verdict: speed, torchvision's time / minidet's: FrozenBN 2.00x, Affine 2.00x; the same detections as "
        "torchvision on every image (4 per variant); quiet machine"
    )
    # torchvision unchanged under channels-last there: a real difference; a busy machine
    rows = _verdict_rows(DetectionMatch(5, 5), tv_seconds=0.15)
    assert rows[2]["vs_torchvision"]["detections"]["judged_same"] == 3
    assert "  DIFFERENT detections from torchvision on 1/4 images, further than torchvision itself moves under " \
           "channels-last (worst box" in "\n".join(benchreport.report(rows, steps=False).splitlines())
    assert benchreport.verdict_line(rows, busy) == (
        "verdict: speed, torchvision's time / minidet's: FrozenBN 1.50x, Affine 1.50x; DIFFERENT detections from "
        "torchvision (Affine on 1/4 images; see above); busy machine: the ratios are rough, rerun on a quiet one"
    )
    amp = benchreport.verdict_line(rows, quiet, "bf16")
    assert "; detections moved by bf16 autocast (expected; see above); " in amp
    alone = [{**row, "vs_torchvision": None} for row in rows[1:]]  # without torchvision: no verdict
    assert benchreport.verdict_line(alone, quiet) is None
    # an int8 graph is not exact by design: its moved detections are named apart, not called DIFFERENT
    int8 = [{**row, "variant": "openvino-int8", "label": "openvino-int8"} if row["variant"] == "Affine" else row
            for row in rows]
    assert benchreport.verdict_line(int8, quiet) == (
        "verdict: speed, torchvision's time / minidet's: FrozenBN 1.50x, openvino-int8 1.50x; the same detections "
        "as torchvision on every image (4 per variant); detections moved (openvino-int8 on 1/4 images; not exact: "
        "expected); quiet machine"
    )
    assert "(int8: not exact, differences expected)" in benchreport.report(int8, steps=False)
    alone = [row for row in int8 if row["variant"] != "FrozenBN"]
    assert "; detections moved (openvino-int8 on 1/4 images; not exact: expected); quiet" in \
        benchreport.verdict_line(alone, quiet)
