"""The benchmark's analysis, printed report and chart, from plain records (``Run``).

``tools/benchmark.py`` times the models and fills one ``Run`` per model; ``analyze`` turns the
runs into rows of statistics with the relations between models of a group (the same depth and
batch): each variant against FrozenBN, against the model without norm layers (``none``), against
batch 1 and against torchvision on the same weights (stage and step ratios, and whether the
detections are the same: ``minidet.apps.compare``; an exported graph in bf16 or int8 is not exact by
design and is named apart), and the FLOPs of each stage with the rate achieved and the floor of the
machine's measured peaks (``peaks``: each model at the conv peak of its runtime and precision,
``FLOOR_PEAK``; the int8 graph's quantization facts ride along). ``report`` prints the rows,
``draw_chart`` draws their stage times; ``busy_check`` judges whether the machine was too busy
for the ratios to mean anything, ``coco_drift`` scores one set of detections against another
with pycocotools. What the benchmark measures and why is in docs/exactness.md ("The benchmark").
"""

from __future__ import annotations

import contextlib
import io
import statistics
from dataclasses import dataclass, field

import cv2
import numpy as np
from pycocotools.coco import COCO

from minidet.apps.compare import DetectionMatch
from minidet.apps.evaluation import coco_metrics, instances_to_coco
from minidet.apps.outputs.fileio import atomic_write
from minidet.config import own_settings
from minidet.families.architectures import ARCHITECTURES as ARCHITECTURE_TABLE
from minidet.masks import BoxMasks
from minidet.runtimes import DEFAULT, PRECISIONS
from minidet.timing import DETAILS, STAGES, format_table, summarize

# variants whose network is the exported graph (one stage): variant -> (MODEL.RUNTIME, MODEL.RUNTIME_PRECISION);
# each runtime of each precision (minidet.runtimes), named by the runtime and, past fp32, the precision: the FrozenBN
# model exported (minidet export's graph, the same weights), the float32 graph compiled by OpenVINO in bf16, and
# quantized to int8 by NNCF (minidet.export.quantize)
RUNTIMES = {rt if pr == DEFAULT else f"{rt}-{pr}": (rt, pr) for pr, p in PRECISIONS.items() for rt in p.runtimes}
# the architectures beside the plain Mask R-CNN of the config (its FrozenBN variant): each variant of the architecture
# table (families/architectures.py: ``Architecture.bench``) is the config with the keys its shipped configs set
# themselves, then its own KEY VALUE pairs (a config of a family with a cascade: detectron2's or mmdetection's);
# randomized weights of their own
ARCHITECTURES = {v.name: [*(kv for c in v.configs for kv in own_settings(c)), *v.then]
                 for a in ARCHITECTURE_TABLE for v in a.bench}
VARIANTS = {  # name -> (MODEL.NORM, MODEL.FOLD_NORM)
    "FrozenBN": ("FrozenBN", False),
    "FrozenBN+fold": ("FrozenBN", True),
    "Affine": ("Affine", False),
    "Affine+fold": ("Affine", True),
    "GN": ("GN", False),
    "none": ("", False),  # no norm layer at all (see strip_norms)
    **dict.fromkeys(RUNTIMES, ("FrozenBN", False)),
    **dict.fromkeys(ARCHITECTURES, ("FrozenBN", False)),
}
# the conv peaks of ``peaks`` (the benchmark's micro-benchmarks), as the report names them
PEAKS = {
    "conv_fp32": "fp32",
    "conv_bf16": "bf16",
    "conv_fp32_openvino": "OpenVINO fp32",
    "conv_bf16_openvino": "OpenVINO bf16",
    "conv_int8": "OpenVINO int8",
}
# the peak a model's floor is measured against: its runtime's in its precision (every other model: conv_fp32)
FLOOR_PEAK = {"openvino": "conv_fp32_openvino", "openvino-bf16": "conv_bf16_openvino", "openvino-int8": "conv_int8"}
# the stages of the int8 graph whose layers stay float32 (minidet.export.quantize.KEPT_FLOAT: the RPN head, the
# mask head; its stem and box predictor, small parts of backbone and box_head, are counted with the int8 layers)
INT8_FLOAT_STAGES = ("rpn", "mask_head")


def inexact(variant: str) -> str:
    """The precision of a variant whose detections are not exact by design (an exported graph in bf16 or int8:
    judged by drift, not by parity), else ''."""
    precision = RUNTIMES.get(variant, ("", "fp32"))[1]
    return "" if precision == "fp32" else precision
# the stage columns: an exported graph's network is one stage between preprocess and paste
COLUMNS = (STAGES[0], "network", *STAGES[1:])
OWN_WEIGHTS = ("GN", "none", *ARCHITECTURES)  # variants that cannot load the frozen-BN weights: randomized models
TV = "torchvision"
# the steps where torchvision does avoidable work (timed steps inside stages, and the paste stage):
# the target is that minidet takes at most 1 / STEP_TARGET of torchvision's time in each
STEPS = (*DETAILS, "paste")
STEP_TARGET = 2.0  # "half" in the printed table
PAIRED_MIN = 3  # iterations needed before per-iteration ratios are called within or beyond the noise
# the machine counts as busy when the timing loop's process CPU time is below this fraction of
# wall time x threads (its threads waited for cores), or the 1-minute load average exceeds the threads
BUSY_CPU = 0.7


@dataclass
class Run:
    """What the benchmark measured for one model (a minidet variant or torchvision) at one depth and
    batch size: the plain record ``analyze`` takes. Times are seconds, one entry per timed call."""

    label: str  # as printed: the variant, with R<depth> and b<batch> where several are run
    impl: str  # "minidet" or TV
    variant: str  # a key of VARIANTS, or TV
    depth: int
    batch: int
    source: str  # where its weights come from, in words
    records: list[dict[str, float]]  # per call: {stage: seconds}
    detail_records: list[dict[str, float]]  # per call: {step inside a stage: seconds}
    walls: list[float]  # per call: wall time
    cpus: list[float]  # per call: process CPU time (all threads)
    dets: list[int]  # detections per image, over every call
    memory: dict | None = None  # {"forward_mib": ...} (CPU) or {"cuda_forward_mib": ...}
    drift: dict | None = None  # ``detection_drift`` of --amp against float32
    checks: list[DetectionMatch] = field(default_factory=list)  # per image: against torchvision
    check_images: list[tuple[int, int]] = field(default_factory=list)  # per check: (pool batch, image in it)
    tv_channels_last: list | None = None  # per check where ours differs: torchvision-CL vs torchvision, else None
    flops: dict | None = None  # {"stages": {stage: FLOPs}, "total": FLOPs} of one forward (FlopCounterMode)
    bf16_drift: dict | None = None  # bf16 against fp32 on real images (``--bf16-drift``): matches, COCO AP, times
    runtime: dict | None = None  # an exported graph's runtime as it opened it (``Graph.runtime``: precision, layers)
    quantize: dict | None = None  # the int8 graph's quantization (``minidet.export.quantize``'s facts)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _increase(a: float, b: float) -> float | None:
    """How much longer ``a`` takes than ``b``, as a fraction of ``b``."""
    return a / b - 1 if b > 0 else None


def _median(row: dict, stage: str) -> float | None:
    """``stage``'s median seconds in ``row``; None where the row has no such stage (an exported graph's)."""
    return row["stages"][stage]["median"] if stage in row["stages"] else None


def _detail_stats(records: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """``summarize`` of the per-step records, in ``DETAILS`` order and without a total (steps lie inside stages)."""
    stats = summarize(records)
    names = [d for d in DETAILS if d in stats] + sorted(set(stats) - set(DETAILS) - {"total"})
    return {d: stats[d] for d in names}


def _steps(row: dict) -> dict[str, dict[str, float]]:
    """A row's statistics of the ``STEPS`` it has: the timed steps and the paste stage."""
    both = {**row["details"], **{s: v for s, v in row["stages"].items() if s != "total"}}
    return {s: both[s] for s in STEPS if s in both}


def _flops(r: Run, stats: dict, wall: dict, peaks: dict | None, amp: str | None) -> tuple[dict | None, dict | None]:
    """A run's FLOPs per stage with the achieved rate (FLOPs / median stage time; the total's over the
    median wall time), and its floor: the total FLOPs at the measured conv peak of its runtime and precision
    (``FLOOR_PEAK``: OpenVINO's graphs at OpenVINO's conv in their precision; every other model at PyTorch's
    float32 conv, with ``--amp bf16`` also at the bf16 peak), as a fraction of the median wall time. The int8
    graph's also ``mixed``: its float32 stages (``INT8_FLOAT_STAGES``) at OpenVINO's float32 peak, the rest at the
    int8 peak."""
    if not r.flops:
        return None, None
    rate = lambda f, t: f / t / 1e9 if f > 0 and t > 0 else None  # noqa: E731
    stages = {s: f for s, f in r.flops["stages"].items()}
    total = r.flops["total"]
    out = {
        "stages": stages,
        "total": total,
        "gflop_per_s": {
            **{s: rate(f, stats[s]["median"]) if s in stats else None for s, f in stages.items()},
            "total": rate(total, wall["median"]),
        },
    }
    peaks = peaks or {}
    key = FLOOR_PEAK.get(r.variant, "conv_fp32")
    key = key if peaks.get(key) else "conv_fp32"  # not measured (no OpenVINO peak): the float32 one
    conv = peaks.get(key)
    if not conv:
        return out, None
    floor_s = total / (1e9 * conv["gflop_per_s"])
    floor = {"peak": key, "peak_gflop_per_s": conv["gflop_per_s"], "floor_s": floor_s,
             "fraction": floor_s / wall["median"]}
    bf16 = peaks.get("conv_bf16")
    if amp == "bf16" and bf16 and key == "conv_fp32":
        floor["bf16_peak_gflop_per_s"] = bf16["gflop_per_s"]
        floor["bf16_floor_s"] = total / (1e9 * bf16["gflop_per_s"])
        floor["bf16_fraction"] = floor["bf16_floor_s"] / wall["median"]
    f32 = peaks.get("conv_fp32_openvino")
    if key == "conv_int8" and f32:
        kept = sum(stages.get(s, 0) for s in INT8_FLOAT_STAGES)
        mixed_s = kept / (1e9 * f32["gflop_per_s"]) + (total - kept) / (1e9 * conv["gflop_per_s"])
        floor["mixed"] = {"float_stages": list(INT8_FLOAT_STAGES), "float_flops": kept,
                          "float_peak": "conv_fp32_openvino", "float_peak_gflop_per_s": f32["gflop_per_s"],
                          "floor_s": mixed_s, "fraction": mixed_s / wall["median"]}
    return out, floor


def analyze(runs: list[Run], peaks: dict | None = None, amp: str | None = None) -> list[dict]:
    """All numbers per run (one row each, ready for JSON), with the relations to FrozenBN, the
    no-norm model, batch 1 and torchvision of its group; with ``peaks`` (the benchmark's
    micro-benchmarks) each run's floor."""
    rows = []
    for r in runs:
        stats = summarize(r.records)
        wall = summarize([{"wall": w} for w in r.walls])["wall"]
        cpu = summarize([{"cpu": c} for c in r.cpus])["cpu"]
        flops, floor = _flops(r, stats, wall, peaks, amp)
        rows.append(
            {
                "label": r.label,
                "impl": r.impl,
                "variant": r.variant,
                "depth": r.depth,
                "batch": r.batch,
                "weights": r.source,
                "stages": stats,
                "details": _detail_stats(r.detail_records),
                "wall": wall,
                "cpu": cpu,
                "images_per_s": r.batch / wall["median"],
                "memory": r.memory,
                "amp_drift": r.drift,
                "flops": flops,
                "floor": floor,
                "bf16_drift": r.bf16_drift,
                "runtime": r.runtime,
                "quantize": r.quantize,
                "detections_per_image": {"mean": statistics.fmean(r.dets), "min": min(r.dets), "max": max(r.dets)},
                "vs_frozenbn": None,
                "vs_torchvision": None,
                "norm_share_of_backbone": None,
                "vs_none": None,
                "vs_batch1": None,
            }
        )
    for row, r in zip(rows, runs):
        one = next((x for x in runs if (x.variant, x.depth, x.batch) == (r.variant, r.depth, 1)), None)
        if r.batch > 1 and one is not None:  # throughput over the same model's at batch 1, same rounds
            paired = [a * r.batch / b for a, b in zip(one.walls, r.walls)]  # batch-1 time / per-image time
            row["vs_batch1"] = {
                "throughput_ratio": _ratio(statistics.median(one.walls), statistics.median(r.walls) / r.batch),
                "paired_median": statistics.median(paired),
                "paired_min": min(paired),
                "paired_max": max(paired),
            }
        group = [(o, x) for o, x in zip(rows, runs) if (x.depth, x.batch) == (r.depth, r.batch)]
        by = {x.variant: o for o, x in group}
        base = by.get("FrozenBN")
        layers = "backbone" in row["stages"]  # else an exported graph: the network is one stage
        if base is not None and r.impl != TV:
            bb, bb_fb = _median(row, "backbone"), _median(base, "backbone")
            row["vs_frozenbn"] = {
                "speed": _ratio(base["wall"]["median"], row["wall"]["median"]),
                "stages": {s: _ratio(v["median"], base["stages"][s]["median"])
                           for s, v in row["stages"].items() if s in base["stages"]},
                # this variant's extra time over FrozenBN's, as a fraction of FrozenBN's (0.25: 25% slower)
                "backbone_increase": None if bb is None else _increase(bb, bb_fb),
                "end_to_end_increase": _increase(row["wall"]["median"], base["wall"]["median"]),
            }
        folded = by.get("Affine+fold") or by.get("FrozenBN+fold")
        if folded is not None and layers and r.impl != TV and r.variant not in OWN_WEIGHTS:
            bb, bf = row["stages"]["backbone"]["median"], folded["stages"]["backbone"]["median"]
            row["norm_share_of_backbone"] = (bb - bf) / bb
        none = by.get("none")
        if none is not None and layers and r.impl != TV and r.variant != "none":
            none_r = next(x for o, x in group if o is none)
            bb, bn = row["stages"]["backbone"]["median"], none["stages"]["backbone"]["median"]
            paired = [_ratio(a["backbone"], b["backbone"]) for a, b in zip(r.records, none_r.records)]
            paired = [v for v in paired if v is not None]
            row["vs_none"] = {
                "backbone_s": bb,
                "none_backbone_s": bn,
                "backbone_ratio": _ratio(bb, bn),
                "norm_cost": _increase(bb, bn),  # the norm's time as a fraction of the no-norm backbone's
                "paired_backbone_ratio": {  # per iteration (the models run in the same rounds)
                    "n": len(paired),
                    "median": statistics.median(paired) if paired else None,
                    "min": min(paired, default=None),
                    "max": max(paired, default=None),
                },
            }
        tv = by.get(TV)
        if tv is not None and r.impl != TV and r.variant not in OWN_WEIGHTS:
            tv_r = next(x for o, x in group if o is tv)
            paired = [a / b for a, b in zip(tv_r.walls, r.walls)]
            problems = [c.problem() for c in r.checks]
            steps, tv_steps = _steps(row), _steps(tv)
            step_ratios = {s: _ratio(tv_steps[s]["median"], v["median"]) for s, v in steps.items() if s in tv_steps}
            row["vs_torchvision"] = {
                "end_to_end": {
                    "ratio_of_medians": _ratio(tv["wall"]["median"], row["wall"]["median"]),
                    "ratio_of_mins": _ratio(tv["wall"]["min"], row["wall"]["min"]),
                    "ratio_of_cpu_medians": _ratio(tv["cpu"]["median"], row["cpu"]["median"]),
                    "paired_median": statistics.median(paired),
                    "paired_sd": statistics.stdev(paired) if len(paired) > 1 else 0.0,
                },
                "stages": {
                    s: _ratio(tv["stages"][s]["median"], v["median"])
                    for s, v in row["stages"].items()
                    if s in tv["stages"]
                },
                "steps": step_ratios,  # torchvision's median / minidet's, per step where it does avoidable work
                "steps_target": STEP_TARGET,
                "steps_met": {s: v is not None and v >= STEP_TARGET for s, v in step_ratios.items()},
                "detections": {
                    "images": len(r.checks),
                    "same": problems.count(""),
                    "first_problem": next((p for p in problems if p), None),
                    "first_problem_image_seed": next(
                        (k * r.batch + i for p, (k, i) in zip(problems, r.check_images) if p), None
                    ),  # structured_image(H, W, seed=...) of the first image that differs
                    "worst_box_px": max((c.worst_box for c in r.checks), default=None),
                    "worst_score": max((c.worst_score for c in r.checks), default=None),
                    "worst_mask_iou": min((c.worst_iou for c in r.checks), default=None),
                    "worst_mask_pixels": max((c.worst_pixels for c in r.checks), default=None),
                    "paste_grid_flips": sum(c.grid_flips for c in r.checks),
                    "tv_channels_last": (cl := _tv_channels_last(r.checks, r.tv_channels_last)),
                    # the verdict: the same within the tolerances, or no further from torchvision's than
                    # torchvision itself moves under channels-last (float summation order)
                    "judged_same": problems.count("") + (cl["no_larger"] if cl else 0),
                },
            }
    return rows


def _tv_channels_last(checks: list[DetectionMatch], changes: list | None) -> dict | None:
    """Of the images where a variant differs from torchvision, those on which torchvision itself
    changes when its model is converted to channels-last, and those on which the variant's difference
    is no larger than that change (``DetectionMatch.no_larger_than``); None where not measured (``--amp``)."""
    if changes is None:
        return None
    pairs = [(c, own) for c, own in zip(checks, changes) if c.problem() and own is not None]
    runs = [own.problem() for _, own in pairs]
    return {
        "images": len(runs),  # differing images on which torchvision ran in channels-last too
        "changed": sum(map(bool, runs)),  # ... and gave detections different from its default layout
        "first_change": next((p for p in runs if p), None),
        "no_larger": sum(c.no_larger_than(own) for c, own in pairs),  # ... by at least as much as the variant
    }


def _fmt(v: float | None, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def report(
    rows: list[dict], device: str = "cpu", amp: str | None = None, peaks: dict | None = None, steps: bool = True
) -> str:
    """The printed summary: per-model tables, a comparison table, ratios, the step table (``steps``: its
    targets are set for the full benchmark at short side 800), verdicts; then the machine's peaks, the
    FLOPs per stage with the achieved rates, and the floor."""
    out = []
    for row in rows:
        title = f"{row['label']} ({row['impl']}, R-{row['depth']}, batch {row['batch']}), ms per forward:"
        out += [format_table(row["stages"], title=title), ""]
    stages = [s for s in COLUMNS if any(s in row["stages"] for row in rows)]
    width = max(12, *(len(row["label"]) + 1 for row in rows))
    cols = [*(s[:9] for s in stages), "wall", "(sd)", "min", "cpu", "img/s", "vs FrozenBN", "vs tv", "dets", "mem MiB"]
    out.append(f"{'median ms':<{width}}" + "".join(f"{c:>{max(9, len(c) + 1)}}" for c in cols))
    for row in rows:
        mem = row["memory"] or {}
        ratio_fb = (row["vs_frozenbn"] or {}).get("speed")
        ratio_tv = (row["vs_torchvision"] or {}).get("end_to_end", {}).get("ratio_of_medians")
        cells = [f"{1e3 * row['stages'][s]['median']:.1f}" if s in row["stages"] else "-" for s in stages]
        cells += [f"{1e3 * row['wall'][k]:.1f}" for k in ("median", "std", "min")]
        cells += [f"{1e3 * row['cpu']['median']:.1f}", f"{row['images_per_s']:.2f}"]
        cells += [
            _fmt(ratio_fb, ".2f") + "x" * (ratio_fb is not None),
            _fmt(ratio_tv, ".2f") + "x" * (ratio_tv is not None),
        ]
        cells += [
            f"{row['detections_per_image']['mean']:.0f}",
            _fmt(mem.get("forward_mib", mem.get("cuda_forward_mib")), ".0f"),
        ]
        out.append(f"{row['label']:<{width}}" + "".join(f"{v:>{max(9, len(c) + 1)}}" for v, c in zip(cells, cols)))
    out.append(
        "(wall: per forward, median (sd) and min; cpu: median process CPU time per forward; vs FrozenBN: "
        "FrozenBN's median wall / this one's; vs tv: "
        "torchvision's / minidet's; mem: peak of "
        + ("the resident set" if device == "cpu" else "CUDA memory allocated")
        + " during a forward, above the loaded model)"
    )
    for row in rows:
        vs = row["vs_torchvision"]
        if vs:
            e = vs["end_to_end"]
            ratios = "  ".join(f"{s} {_fmt(v, '.2f')}" for s, v in vs["stages"].items() if s != "total")
            out.append(
                f"torchvision / {row['label']}: end to end {e['ratio_of_medians']:.2f}x (paired "
                f"{e['paired_median']:.2f} sd {e['paired_sd']:.2f}; minima {e['ratio_of_mins']:.2f}x; CPU time "
                f"{e['ratio_of_cpu_medians']:.2f}x); "
                f"per stage: {ratios}"
            )
            d = vs["detections"]
            cl = d["tv_channels_last"]
            if d["judged_same"] == d["images"]:
                verdict = f"same detections as torchvision on {d['images']}/{d['images']} images"
                if d["same"] < d["images"]:
                    verdict += (
                        f" ({d['same']} within the tolerances, {d['images'] - d['same']} no further from "
                        "torchvision's than torchvision itself moves under channels-last)"
                    )
            else:
                verdict = (
                    f"DIFFERENT detections from torchvision on {d['images'] - d['judged_same']}/{d['images']} images"
                    + (", further than torchvision itself moves under channels-last" if cl else "")
                )
            verdict += " (autocast: differences expected)" if amp else ""
            if p := inexact(row["variant"]):
                verdict += f" ({p}: not exact, differences expected)"
            out.append(
                f"  {verdict} (worst box {_fmt(d['worst_box_px'], '.2g')}"
                f" px, score {_fmt(d['worst_score'], '.2g')}, mask IoU {_fmt(d['worst_mask_iou'], '.4f')}, "
                f"at most {_fmt(d['worst_mask_pixels'], 'd')} mask pixels differ"
                + (
                    f"; {d['paste_grid_flips']} masks pasted 1 px apart: box at a paste-grid boundary"
                    * bool(d["paste_grid_flips"])
                )
                + ")"
                + (
                    f"; first difference (image seed {d['first_problem_image_seed']}): {d['first_problem']}"
                    if d["first_problem"]
                    else ""
                )
            )
            if cl and cl["images"]:
                out.append(
                    f"  on {cl['changed']} of these {cl['images']} images torchvision itself changes under "
                    "channels-last (float summation order)"
                    + (f"; first change: {cl['first_change']}" if cl["first_change"] else "")
                )
    for row in rows:
        b = row["vs_batch1"]
        if b:
            out.append(
                f"{row['label']}: throughput {b['throughput_ratio']:.3f}x batch 1's (images/s, ratio of medians; "
                f"per iteration {b['paired_median']:.3f}, {b['paired_min']:.3f} to {b['paired_max']:.3f})"
            )
    out += step_table(rows) if steps else []
    for row in rows:
        if row["norm_share_of_backbone"] is not None and row["variant"] in ("FrozenBN", "Affine"):
            out.append(
                f"{row['label']}: norm share of backbone time {100 * row['norm_share_of_backbone']:.1f}% "
                "(backbone median vs the folded variant, which runs no norm op)"
            )
        out += _vs_none_lines(row)
        fb = row["vs_frozenbn"]
        if row["variant"] in ARCHITECTURES and fb:  # what the architecture costs, stage by stage
            ratios = "  ".join(f"{s} {_fmt(v, '.2f')}x" for s, v in fb["stages"].items() if s != "total")
            line = (f"{row['label']} / FrozenBN{row['label'][len(row['variant']) :]} (the plain Mask R-CNN): "
                    f"end to end {_fmt(fb['end_to_end_increase'], '+.1%')}; per stage: {ratios}")
            iou, mask = row["details"].get("mask_iou"), _median(row, "mask_head")
            if iou and mask:  # Mask Scoring R-CNN: its mask IoU head, a step of the mask stage
                line += f"; the mask IoU head {1e3 * iou['median']:.1f} ms ({iou['median'] / mask:.0%} of mask_head)"
            out.append(line)
        if row["variant"] == "GN" and fb and fb["backbone_increase"] is not None:
            out.append(
                f"{row['label']} over FrozenBN{row['label'][len(row['variant']) :]}: backbone "
                f"{100 * fb['backbone_increase']:+.1f}%, end to end {_fmt(fb['end_to_end_increase'], '+.1%')}"
            )
        if row["amp_drift"]:
            d = row["amp_drift"]
            out.append(
                f"{row['label']}: {amp} vs fp32: {d['detections_amp']} vs {d['detections_fp32']} "
                f"detections, {d['matched']} matched (IoU>=0.5, same label); box change median "
                f"{_fmt(d['box_diff_px_median'], '.3g')} max {_fmt(d['box_diff_px_max'], '.3g')} px, "
                f"score change max {_fmt(d['score_diff_max'], '.3g')}"
            )
        out += _bf16_drift_lines(row)
        out += _graph_lines(row)
    out += peak_lines(peaks)
    out += flop_table(rows)
    out += floor_lines(rows, amp)
    return "\n".join(out)


def _graph_lines(row: dict) -> list[str]:
    """An exported graph's runtime as it compiled the graph (the precision of its layers) and, for the int8 graph,
    how it was quantized."""
    out = []
    rt = row.get("runtime")
    if rt:
        layers = ", ".join(f"{n} {p}" for p, n in sorted((rt.get("layers") or {}).items()))
        out.append(f"{row['label']}: {rt['name']} {str(rt['version']).split('-')[0]}, MODEL.RUNTIME_PRECISION "
                   f"{rt['precision_asked']}, "
                   f"computes in {rt['precision']}" + (f" (compiled layers: {layers})" if layers else ""))
    q = row.get("quantize")
    if q:
        layers = q.get("layers", {})
        out.append(
            f"{row['label']}: quantized by {q['tool']} {q['version']} ({q['method']}, preset {q['preset']}, "
            f"calibrated on {q.get('calibration_source') or str(q['calibration_images']) + ' images'}; "
            f"{_fmt(q.get('seconds'), '.0f')} s): {layers.get('int8', 0)} weighted layers in int8, "
            f"{layers.get('float32', 0)} in float32 (kept float: {', '.join(q.get('kept_float', {}))})"
        )
    return out


def _bf16_drift_lines(row: dict) -> list[str]:
    d = row["bf16_drift"]
    if not d:
        return []
    ap = d["coco"]
    aps = ", ".join(
        f"{'box' if t == 'bbox' else 'mask'} {_fmt(ap[t]['AP'], '.3f')} (AP50 {_fmt(ap[t]['AP50'], '.3f')})"
        for t in ("bbox", "segm")
        if t in ap
    )
    return [
        f"{row['label']}: bf16 vs fp32 on {d['images']} real images ({d['source']}): {d['matched']}/"
        f"{d['detections_fp32']} fp32 detections matched ({_fmt(d['matched_fraction'], '.1%')}; same label, "
        f"IoU >= 0.5; bf16 has {d['detections_amp']}); COCO AP of bf16 with fp32 as ground truth: {aps}; "
        f"bf16 takes {_fmt(d['time_ratio'], '.2f')}x fp32's time per image (median {1e3 * d['bf16_s_median']:.0f} "
        f"vs {1e3 * d['fp32_s_median']:.0f} ms)"
    ]


def peak_lines(peaks: dict | None) -> list[str]:
    """The micro-benchmarks of this run: the float32 and bf16 conv peaks (PyTorch's; with an OpenVINO variant also
    OpenVINO's float32 and int8 conv, and bf16 with ``openvino-bf16``), the box head's GEMM."""
    if not peaks:
        return []

    def layouts(p: dict) -> str:
        return ", ".join(
            f"{k.replace('_', '-')} {v['gflop_per_s']:.1f} at {'x'.join(map(str, v['shape']))}"
            for k, v in p["layouts"].items()
        )

    out = [
        f"peaks of this machine, measured in this run ({peaks['threads']} threads; GFLOP/s of the best call in "
        f"~{peaks['seconds']:g} s of calls each, at the target size or the largest whose call is expected "
        f"under {1e3 * peaks['grow_below_s']:g} ms):"
    ]
    for key, what in PEAKS.items():
        p = peaks.get(key)
        if p:
            where = layouts(p) if "layouts" in p else f"at {'x'.join(map(str, p['shape']))}"
            unit = "GOP/s" if key == "conv_int8" else "GFLOP/s"
            out.append(f"  {what} {p['op']}: {p['gflop_per_s']:.1f} {unit} ({where})")
    if peaks.get("openvino_skipped"):
        out.append(f"  not measured under OpenVINO: {peaks['openvino_skipped']}")
    lin = peaks.get("linear")
    if lin:
        plain = lin["plain"]
        text = f"  box head fc6 GEMM {lin['op']}: plain nn.Linear {plain['gflop_per_s']:.1f} GFLOP/s"
        if plain["shape"][0] != lin["target"][0]:
            text += f" (at {plain['shape'][0]} rows)"
        v = lin["variant"]
        if v:
            text += f"; the variants' fc6 ({lin['variant_path']}) {v['gflop_per_s']:.1f} GFLOP/s"
            if v["shape"][0] != lin["target"][0]:
                text += f" (at {v['shape'][0]} rows)"
        else:
            text += f"; the variants' fc6 is plain nn.Linear ({lin['variant_path']})"
        out.append(text)
    return out


def flop_table(rows: list[dict]) -> list[str]:
    """Per model two lines: GFLOP per stage of one forward, and the achieved GFLOP/s (FLOPs / median
    stage time; the total's over the median wall time)."""
    counted = [row for row in rows if row["flops"]]
    if not counted:
        return []
    stages = [s for s in STAGES if any(s in row["flops"]["stages"] for row in counted)]
    width = max(12, *(len(row["label"]) + 1 for row in counted))
    out = [
        "FLOPs of one forward per stage (torch.utils.flop_counter: convolutions and matrix products, "
        "oneDNN's fused ops included; the first input batch, untimed) and the rate achieved (FLOPs / "
        "median stage time; total: over the median wall time):",
        f"{'model':<{width}}{'':<9}" + "".join(f"{s:>11}" for s in stages) + f"{'total':>11}",
    ]
    for row in counted:
        f = row["flops"]
        gf = [f["stages"].get(s) for s in stages]
        cells = [_fmt(None if v is None else v / 1e9, ".2f") for v in gf] + [f"{f['total'] / 1e9:.2f}"]
        out.append(f"{row['label']:<{width}}{'GFLOP':<9}" + "".join(f"{c:>11}" for c in cells))
        rates = [f["gflop_per_s"].get(s) for s in stages] + [f["gflop_per_s"]["total"]]
        out.append(f"{'':<{width}}{'GFLOP/s':<9}" + "".join(f"{_fmt(v, '.1f'):>11}" for v in rates))
    return out


def floor_lines(rows: list[dict], amp: str | None = None) -> list[str]:
    """Per model: its FLOPs at the measured conv peak of its runtime and precision, and that floor over its median
    wall time (the int8 graph's also with its float32 stages at OpenVINO's float32 peak)."""
    out = []
    for row in rows:
        fl = row["floor"]
        if not fl:
            continue
        unit = "GOP/s" if fl["peak"] == "conv_int8" else "GFLOP/s"
        text = (
            f"floor {row['label']}: {row['flops']['total'] / 1e9:.2f} GFLOP at the {PEAKS[fl['peak']]} conv peak "
            f"{fl['peak_gflop_per_s']:.1f} {unit} = {1e3 * fl['floor_s']:.0f} ms; median wall "
            f"{1e3 * row['wall']['median']:.0f} ms: floor / wall {fl['fraction']:.3f}"
        )
        if "bf16_fraction" in fl:
            text += (
                f" (at the bf16 conv peak {fl['bf16_peak_gflop_per_s']:.1f} GFLOP/s: "
                f"{1e3 * fl['bf16_floor_s']:.0f} ms, {fl['bf16_fraction']:.3f})"
            )
        if m := fl.get("mixed"):
            text += (
                f" (its float32 stages {', '.join(m['float_stages'])}, {m['float_flops'] / 1e9:.2f} GFLOP, at the "
                f"{PEAKS[m['float_peak']]} peak {m['float_peak_gflop_per_s']:.1f} GFLOP/s, the rest at the int8 "
                f"peak: {1e3 * m['floor_s']:.0f} ms, {m['fraction']:.3f})"
            )
        out.append(text)
    if out:
        out.append(
            "(floor / wall: 1.0 would be every counted FLOP at the conv peak of the model's runtime and precision "
            "and nothing else; what is missing is the rest of the work (norms, RoIAlign, NMS, paste, memory "
            "traffic) and layers that run below the peak)"
        )
    return out


def busy_check(
    load_before: tuple | None, load_after: tuple | None, threads: int, cpu_s: float | None, wall_s: float | None,
    load_limit: float | None = None, cpu_limit: float = BUSY_CPU,
) -> dict:
    """Whether the machine was busy during the timing: the 1-minute load average above ``load_limit``
    (default: the benchmark's own ``threads``) before or after the timing loop, or the loop's process
    CPU time below ``cpu_limit`` x its wall time x ``threads`` (``cpu_s`` None: not judged, e.g. on
    CUDA). Returns the verdict (``busy``), its reasons and the numbers."""
    limit = float(threads if load_limit is None else load_limit)
    util = cpu_s / (wall_s * threads) if cpu_s is not None and wall_s and threads else None
    reasons = []
    for when, load in (("before", load_before), ("after", load_after)):
        if load and load[0] > limit:
            reasons.append(f"1-min load average {load[0]:.2f} {when} the timing, above {limit:g}")
    if util is not None and util < cpu_limit:
        reasons.append(f"process CPU time {util:.0%} of wall time x {threads} threads, below {cpu_limit:.0%}")
    return {
        "busy": bool(reasons), "reasons": reasons, "threads": threads, "load_limit": limit, "cpu_limit": cpu_limit,
        "load_before": list(load_before) if load_before else None,
        "load_after": list(load_after) if load_after else None,
        "loop_cpu_s": cpu_s, "loop_wall_s": wall_s, "cpu_utilization": util,
    }


def busy_line(check: dict) -> str | None:
    """The one warning line of a busy machine (``busy_check``), else None."""
    if not check["busy"]:
        return None
    return f"warning: the machine was busy ({'; '.join(check['reasons'])}): ratios of this run are not results"


def verdict_line(rows: list[dict], busy: dict, amp: str | None = None) -> str | None:
    """The run's last line, with torchvision compared: each variant's speed against torchvision (torchvision's
    median time per forward over its own), whether its detections are the same (``judged_same`` on every image;
    an exported graph in bf16 or int8, not exact by design, is named apart where its detections moved), and whether
    the machine was busy (``busy_check``). None without torchvision."""
    compared = [row for row in rows if row["vs_torchvision"]]
    if not compared:
        return None
    speed = ", ".join(
        f"{row['label']} {_fmt(row['vs_torchvision']['end_to_end']['ratio_of_medians'], '.2f')}x" for row in compared
    )
    dets = [row["vs_torchvision"]["detections"] for row in compared]
    exact = [(row, d) for row, d in zip(compared, dets) if not inexact(row["variant"])]
    different = [f"{row['label']} on {d['images'] - d['judged_same']}/{d['images']} images"
                 for row, d in exact if d["judged_same"] < d["images"]]
    moved = [f"{row['label']} on {d['images'] - d['judged_same']}/{d['images']} images"
             for row, d in zip(compared, dets) if inexact(row["variant"]) and d["judged_same"] < d["images"]]
    if amp:
        same = f"detections moved by {amp} autocast (expected; see above)"
    elif different:
        same = f"DIFFERENT detections from torchvision ({', '.join(different)}; see above)"
    elif exact or not moved:
        n = max(d["images"] for d in ([d for _, d in exact] or dets))
        same = f"the same detections as torchvision on every image ({n} per variant)"
    else:
        same = ""
    if moved and not amp:
        same += ("; " if same else "") + f"detections moved ({', '.join(moved)}; not exact: expected)"
    machine = "busy machine: the ratios are rough, rerun on a quiet one" if busy["busy"] else "quiet machine"
    return f"verdict: speed, torchvision's time / minidet's: {speed}; {same}; {machine}"


def _coco_output(d: dict) -> dict:
    """A detector's output for one image (tensors) as ``minidet.apps.evaluation.instances_to_coco`` reads it (the
    benchmark runs torchvision's weights: plain box sizes)."""
    out = {
        "box_offset": 0,
        "boxes": d["boxes"].detach().float().cpu().numpy(),
        "scores": d["scores"].detach().float().cpu().numpy(),
        "category_ids": d["labels"].detach().cpu().numpy(),
    }
    if "masks" in d:
        masks = d["masks"]  # minidet's BoxMasks, torchvision's (N, H, W) tensor
        out["masks"] = masks.cpu() if isinstance(masks, BoxMasks) else masks.detach().cpu().numpy().astype(bool)
    return out


def coco_drift(refs: list[dict], news: list[dict], sizes: list[tuple[int, int]]) -> dict:
    """COCO AP (pycocotools, ``minidet.apps.evaluation.coco_metrics``) of the detections ``news`` scored
    against ``refs`` taken as ground truth, per image (``sizes``: (height, width)); boxes, and masks
    where the detections have them. 1.0 for identical detections; a measure of drift that needs no
    annotations. Labels serve as category ids. Returns ``{"bbox": {"AP", "AP50", "AP75"}, "segm": ...}``
    (-1 where ``refs`` has no detection)."""
    images = [{"id": i + 1, "file_name": str(i + 1), "height": h, "width": w} for i, (h, w) in enumerate(sizes)]
    anns, results = [], []
    for i, (ref, new) in enumerate(zip(refs, news)):
        ref_out = _coco_output(ref)
        for k, a in enumerate(instances_to_coco(i + 1, ref_out)[0]):
            area = float(ref_out["masks"][k].sum()) if "masks" in ref_out else a["bbox"][2] * a["bbox"][3]
            anns.append({**a, "id": len(anns) + 1, "iscrowd": 0, "area": area})
        results += instances_to_coco(i + 1, _coco_output(new))[0]
    cats = sorted({a["category_id"] for a in anns + results})
    gt = COCO()
    gt.dataset = {"images": images, "annotations": anns, "categories": [{"id": c, "name": str(c)} for c in cats]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    types = ("bbox", "segm") if all("masks" in d for d in [*refs, *news]) else ("bbox",)
    metrics, _ = coco_metrics(gt, results, types)
    return {t: {k: m[k] for k in ("AP", "AP50", "AP75")} for t, m in metrics.items()}


def _vs_none_lines(row: dict) -> list[str]:
    """The norm's cost measured against the model without norm layers; for a folded variant
    also whether it is distinguishable from that model."""
    vn = row["vs_none"]
    if not vn or vn["norm_cost"] is None:
        return []
    none_label = "none" + row["label"][len(row["variant"]) :]
    ms, none_ms = 1e3 * vn["backbone_s"], 1e3 * vn["none_backbone_s"]
    out = [
        f"{row['label']}: norm share measured against no norm: backbone {100 * vn['norm_cost']:+.1f}% "
        f"({ms:.1f} ms vs {none_ms:.1f} ms of {none_label}, which has no norm layers)"
    ]
    if VARIANTS.get(row["variant"], ("", False))[1]:
        p = vn["paired_backbone_ratio"]
        spread = f"; per iteration {p['min']:.3f} to {p['max']:.3f}" if p["n"] > 1 else ""
        if p["n"] < PAIRED_MIN:
            spread += f": too few iterations to judge (< {PAIRED_MIN})"
        elif p["min"] <= 1 <= p["max"]:
            spread += ": within the noise"
        else:
            spread += f": folded {'slower' if p['min'] > 1 else 'faster'} in each of {p['n']} iterations"
        out.append(
            f"folded vs no norm: backbone {ms:.1f} ms vs {none_ms:.1f} ms (ratio {vn['backbone_ratio']:.3f}"
            f"{spread}; {row['label']} vs {none_label})"
        )
    return out


def step_table(rows: list[dict]) -> list[str]:
    """Lines of the per-step comparison with torchvision (``STEPS``), one block per minidet variant;
    none without torchvision."""
    compared = [row for row in rows if row["vs_torchvision"]]
    if not compared:
        return []
    tv_rows = {(row["depth"], row["batch"]): row for row in rows if row["impl"] == TV}
    width = max(12, *(len(row["label"]) + 1 for row in compared))
    out = [
        "steps where torchvision does avoidable work (target: minidet at most half of torchvision's time), median ms:",
        f"{'model':<{width}}{'step':<16}{'torchvision':>12}{'minidet':>10}{'tv/minidet':>12}  target",
    ]
    for row in compared:
        tv_steps, steps = _steps(tv_rows[row["depth"], row["batch"]]), _steps(row)
        vs = row["vs_torchvision"]
        for i, (s, ratio) in enumerate(vs["steps"].items()):
            verdict = "-" if ratio is None else "met" if vs["steps_met"][s] else "not met"
            out.append(
                f"{row['label'] if i == 0 else '':<{width}}{s:<16}{1e3 * tv_steps[s]['median']:12.2f}"
                f"{1e3 * steps[s]['median']:10.2f}{_fmt(ratio, '.2f') + 'x' * (ratio is not None):>12}  {verdict}"
            )
    out.append(
        "(steps inside stages: rpn_select = RPN without its head convs (top-k, decode, clip, NMS), box_roi_align = "
        "multi-scale RoIAlign of the box head, box_postprocess = softmax, decode, clip, per-class NMS, top-k, "
        "mask_roi_align = RoIAlign of the mask head; paste is the stage)"
    )
    return out


_COLORS = {  # BGR
    "preprocess": (160, 160, 160),
    "backbone": (180, 119, 31),
    "network": (0, 170, 200),
    "fpn": (14, 127, 255),
    "rpn": (44, 160, 44),
    "box_head": (40, 39, 214),
    "mask_head": (189, 103, 148),
    "paste": (75, 86, 140),
}


def _nice_step(top: float, ticks: int = 6) -> float:
    raw = top / ticks
    mag = 10 ** np.floor(np.log10(raw))
    return float(next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw))


def draw_chart(rows: list[dict], title: str, path: str) -> None:
    """Stacked bars, one per model: the median time of each stage per image, in ms."""
    font, aa = cv2.FONT_HERSHEY_SIMPLEX, cv2.LINE_AA
    stages = [s for s in COLUMNS if any(s in r["stages"] for r in rows)]
    vals = [[1e3 * r["stages"].get(s, {"median": 0.0})["median"] / r["batch"] for s in stages] for r in rows]
    top = max(sum(v) for v in vals) * 1.08 or 1.0
    step = _nice_step(top)
    top = step * np.ceil(top / step)
    slot, left, legend_w, y0, y1 = 120, 90, 170, 70, 470
    width, height = left + slot * len(rows) + legend_w + 20, 560
    img = np.full((height, width, 3), 255, np.uint8)
    cv2.putText(img, title, (left - 70, 28), font, 0.6, (0, 0, 0), 1, aa)
    cv2.putText(
        img, "ms per image: median of each stage, bar = their sum", (left - 70, 55), font, 0.45, (60, 60, 60), 1, aa
    )
    ys = lambda v: int(round(y1 - (y1 - y0) * v / top))  # noqa: E731
    for k in range(int(round(top / step)) + 1):
        y = ys(k * step)
        cv2.line(img, (left, y), (left + slot * len(rows), y), (225, 225, 225), 1, aa)
        label = f"{k * step:g}"
        (tw, _), _ = cv2.getTextSize(label, font, 0.42, 1)
        cv2.putText(img, label, (left - 8 - tw, y + 5), font, 0.42, (60, 60, 60), 1, aa)
    cv2.line(img, (left, y0), (left, y1), (0, 0, 0), 1, aa)
    cv2.line(img, (left, y1), (left + slot * len(rows), y1), (0, 0, 0), 1, aa)
    for i, (row, v) in enumerate(zip(rows, vals)):
        x0 = left + slot * i + 25
        x1, acc = x0 + slot - 50, 0.0
        for s, ms in zip(stages, v):
            ya, yb = ys(acc + ms), ys(acc)
            cv2.rectangle(img, (x0, ya), (x1, yb), _COLORS.get(s, (120, 120, 120)), -1)
            if yb - ya >= 14:
                text = f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}"
                (tw, th), _ = cv2.getTextSize(text, font, 0.38, 1)
                cv2.putText(img, text, ((x0 + x1 - tw) // 2, (ya + yb + th) // 2), font, 0.38, (255, 255, 255), 1, aa)
            acc += ms
        text = f"{acc:.0f}" if acc >= 10 else f"{acc:.1f}"
        (tw, _), _ = cv2.getTextSize(text, font, 0.45, 1)
        cv2.putText(img, text, ((x0 + x1 - tw) // 2, ys(acc) - 6), font, 0.45, (0, 0, 0), 1, aa)
        lines = row["label"].split(" ") + ([f"R{row['depth']} b{row['batch']}"] if " " not in row["label"] else [])
        for j, part in enumerate(lines[:3]):
            (tw, _), _ = cv2.getTextSize(part, font, 0.45, 1)
            cv2.putText(img, part, (x0 + (x1 - x0 - tw) // 2, y1 + 22 + 18 * j), font, 0.45, (0, 0, 0), 1, aa)
    lx = left + slot * len(rows) + 20
    for j, s in enumerate(reversed(stages)):
        y = y0 + 22 * j
        cv2.rectangle(img, (lx, y), (lx + 16, y + 14), _COLORS.get(s, (120, 120, 120)), -1)
        cv2.putText(img, s, (lx + 24, y + 12), font, 0.45, (0, 0, 0), 1, aa)
    ok, png = cv2.imencode(".png", img)
    if not ok:
        raise RuntimeError(f"could not encode the chart for {path}")
    atomic_write(path, png.tobytes())
