"""The drift report and gate of a non-float32 export (``minidet export --precision int8|bf16``).

A graph in a lower precision is not eager's arithmetic, so it is not held to the parity gate; what it costs is
measured instead, on the verification images, against eager float32:

- ``matched``: eager's detections scoring at least ``score`` that the graph also detects (same class, box IoU >=
  0.5, each of the graph's detections matched once, eager's in score order), as a fraction of them;
- of the matched pairs: the score change, the box change (largest coordinate, px) and box IoU, the mask IoU;
- ``ap``: COCO AP (pycocotools, IoU 0.5:0.95) of the graph's detections with eager's (score >= ``score``) as the
  ground truth, boxes and masks: 1.0 is "the same detections";
- ``stages``: how far each stage's output moved (backbone, FPN: relative L2 error of the tensors leaving them,
  the float32 graph against the other on the same input; rpn: eager's proposals without a counterpart at IoU
  0.7; box_head: eager's detections unmatched; mask_head: 1 - the median mask IoU), and ``parts_at``: the first
  stage whose drift reaches ``PART`` (where the outputs part);
- the speed of eager, the float32 graph and the graph, interleaved.

The gate passes when ``matched >= min_matched`` and the mask AP (the box AP for a model without masks) ``>=
min_ap`` over the images; an export whose gate fails is not written unless ``--force``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from torchvision.ops import box_iou

from minidet.apps.evaluation import _quiet, coco_metrics
from minidet.apps.export.gate import eager_outputs, exported_outputs, time_networks
from minidet.apps.outputs.instances import instances_to_coco

MIN_MATCHED = 0.97  # default: eager's detections the graph keeps
MIN_AP = 0.90  # default: mask AP (box AP without masks) of the graph's detections against eager's
SCORE = 0.5  # default: eager's detections judged are those scoring at least this
PART = 0.1  # a stage's drift from which its outputs "part" from eager's
FEATURE_STAGES = ("backbone", "fpn")  # the graph's modules whose outputs the report probes
STAGES = FEATURE_STAGES + ("rpn", "box_head", "mask_head")


@dataclass
class Thresholds:
    min_matched: float = MIN_MATCHED
    min_ap: float = MIN_AP
    score: float = SCORE


def _coco(image_id: int, out: dict) -> list[dict]:
    """Detections as COCO results (their labels as category ids; box sizes as the family counts them, which is the
    same for both sides of a comparison: the offset only shifts both)."""
    return instances_to_coco(image_id, {**out, "category_ids": out["labels"]}, box_offset=0)[0]


def match(ref: dict, ours: dict, score: float, ref_coco: list[dict] | None = None,
          our_coco: list[dict] | None = None) -> dict:
    """Eager's detections ``ref`` (those scoring >= ``score``) matched to the graph's ``ours`` as the module says:
    counts and the matched pairs' changes. ``ref_coco``, ``our_coco``: both as COCO results (``_coco``), where
    converted already."""
    keep = (ref["scores"] >= score).nonzero().flatten()
    pairs = []
    if len(keep) and len(ours["boxes"]):
        iou = box_iou(ref["boxes"][keep].double(), ours["boxes"].double())
        iou[ref["labels"][keep][:, None] != ours["labels"][None, :]] = -1
        for k in ref["scores"][keep].argsort(descending=True).tolist():
            j = int(iou[k].argmax())
            if iou[k, j] >= 0.5:
                pairs.append((int(keep[k]), j, float(iou[k, j])))
                iou[:, j] = -1
    changes = {"score": [], "box_px": [], "box_iou": [], "mask_iou": []}
    with_masks = pairs and ref.get("masks") is not None
    if with_masks:
        ref_coco = _coco(0, ref) if ref_coco is None else ref_coco
        our_coco = _coco(0, ours) if our_coco is None else our_coco
    for i, j, b in pairs:
        changes["score"].append(abs(float(ours["scores"][j]) - float(ref["scores"][i])))
        changes["box_px"].append(float((ours["boxes"][j].double() - ref["boxes"][i].double()).abs().max()))
        changes["box_iou"].append(b)
        if with_masks:
            iou = mask_utils.iou([our_coco[j]["segmentation"]], [ref_coco[i]["segmentation"]], [0])
            changes["mask_iou"].append(float(iou[0][0]))
    return {"float32": len(keep), "detections": len(ours["boxes"]), "matched": len(pairs), "changes": changes}


def _summary(values: list[float], low: bool = False) -> dict | None:
    if not values:
        return None
    ordered = sorted(values)
    edge = ordered[int(0.05 * (len(ordered) - 1))] if low else ordered[-1]
    return {"median": statistics.median(values), "p5" if low else "max": edge}


def ap_against(refs: list[list[dict]], ours: list[list[dict]], sizes: list[tuple[int, int]], score: float) -> dict:
    """COCO AP of ``ours`` with ``refs`` (scoring >= ``score``) as the ground truth, per IoU type the detections
    carry (``bbox``, ``segm``); None where eager has no detection to be the truth. Each list holds one image's
    detections as COCO results (``_coco``, its image id its index)."""
    images, annotations, results = [], [], []
    for image_id, (truth, out, (h, w)) in enumerate(zip(refs, ours, sizes)):
        images.append({"id": image_id, "height": h, "width": w})
        for r in truth:
            if r["score"] >= score:
                area = float(mask_utils.area(r["segmentation"])) if "segmentation" in r else r["bbox"][2] * r["bbox"][3]
                annotations.append({**r, "id": len(annotations) + 1, "area": area, "iscrowd": 0})
        results.extend(out)
    if not annotations:
        return {"bbox": None, "segm": None}
    gt = COCO()
    gt.dataset = {"images": images, "annotations": annotations,
                  "categories": [{"id": c} for c in sorted({a["category_id"] for a in annotations})]}
    _quiet(gt.createIndex)
    types = ("bbox", "segm") if "segmentation" in annotations[0] else ("bbox",)
    metrics, _ = coco_metrics(gt, results, types)
    return {"bbox": metrics["bbox"]["AP"], "segm": metrics["segm"]["AP"] if "segm" in metrics else None}


def _in_stage(name: str, stage: str) -> bool:
    from minidet.export.quantize import module_named, under

    return under(module_named(name), (stage,))


def boundaries(model, stage: str) -> list[str]:
    """The friendly names of the ops of OpenVINO ``model`` (named by module) in ``stage`` whose outputs leave it."""
    names = []
    for op in model.get_ordered_ops():
        name = op.get_friendly_name()
        if not _in_stage(name, stage) or op.get_type_name() in ("Constant", "ShapeOf"):
            continue
        consumers = [t.get_node() for o in op.outputs() for t in o.get_target_inputs()]
        if any(not _in_stage(c.get_friendly_name(), stage) and c.get_type_name() != "ShapeOf" for c in consumers):
            names.append(name)
    return names


class Probes:
    """The float32 graph and the other precision's, each compiled with the tensors leaving ``FEATURE_STAGES`` as
    extra outputs: ``drift(inputs)`` -> per stage the largest relative L2 error of those tensors."""

    def __init__(self, reference, other, options: dict, other_options: dict) -> None:
        import openvino as ov

        core = ov.Core()
        in_other = {op.get_friendly_name() for op in other.get_ordered_ops()}
        self.names = {s: [n for n in boundaries(reference, s) if n in in_other] for s in FEATURE_STAGES}
        self.requests = []
        for model, opts in ((reference, options), (other, other_options)):
            model = model.clone()
            ops = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
            outputs = [ops[n].output(0) for s in FEATURE_STAGES for n in self.names[s]]
            model.add_outputs(outputs)
            compiled = core.compile_model(model, "CPU", opts)
            self.requests.append((compiled.create_infer_request(), compiled.outputs[-len(outputs):], compiled))
        self.inputs = {n for i in reference.inputs for n in i.get_names()}

    def drift(self, feeds: dict) -> dict[str, float]:
        runs = []
        for request, outputs, _ in self.requests:
            result = request.infer({k: v for k, v in feeds.items() if k in self.inputs})
            runs.append([np.asarray(result[o], np.float64) for o in outputs])
        drift, k = {}, 0
        for stage in FEATURE_STAGES:
            errors = []
            for a, b in zip(runs[0][k: k + len(self.names[stage])], runs[1][k: k + len(self.names[stage])]):
                errors.append(float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-12)))
            drift[stage] = max(errors, default=0.0)
            k += len(self.names[stage])
        return drift


def _proposal_loss(ours: torch.Tensor, ref: torch.Tensor) -> float:
    if not len(ref):
        return 0.0
    if not len(ours):
        return 1.0
    return float((box_iou(ref.double(), ours.double()).max(dim=1).values < 0.7).double().mean())


def run_drift(model, network, reference_network, images: list[tuple[str, np.ndarray]], probes: Probes | None,
              thresholds: Thresholds, repeats: int = 2) -> dict:
    """The drift report of ``network`` (the graph in its precision) against eager ``model`` on ``images``;
    ``reference_network``: the float32 graph (timed beside it); ``probes``: the feature stages' probes (None: not
    measured). Returns the report's ``drift`` part with ``passed``."""
    from minidet.export.onnxfile import graph_inputs

    per_image, refs, outs, sizes = [], [], [], []
    changes: dict[str, list[float]] = {"score": [], "box_px": [], "box_iou": [], "mask_iou": []}
    stage_values: dict[str, list[float]] = {s: [] for s in STAGES}
    for name, image in images:
        batch = model.preprocess([image])
        ref, ours = eager_outputs(model, batch), exported_outputs(model, network, batch)
        coco = _coco(len(refs), ref.final), _coco(len(refs), ours.final)  # the image's id: its index
        m = match(ref.final, ours.final, thresholds.score, *coco)
        for k in changes:
            changes[k].extend(m["changes"][k])
        stages = probes.drift(graph_inputs(batch, 0)) if probes else {}
        stages["rpn"] = _proposal_loss(ours.proposals, ref.proposals)
        stages["box_head"] = 1 - m["matched"] / m["float32"] if m["float32"] else 0.0
        stages["mask_head"] = 1 - statistics.median(m["changes"]["mask_iou"]) if m["changes"]["mask_iou"] else 0.0
        for s, v in stages.items():
            stage_values[s].append(v)
        per_image.append({"name": name, "size": image.shape[:2], "float32": m["float32"], "matched": m["matched"],
                          "detections": m["detections"], "stages": stages})
        refs.append(coco[0])
        outs.append(coco[1])
        sizes.append(image.shape[:2])
    total = sum(c["float32"] for c in per_image)
    matched = sum(c["matched"] for c in per_image) / total if total else None
    ap = ap_against(refs, outs, sizes, thresholds.score)
    stages = {s: max(v) for s, v in stage_values.items() if v}
    parts_at = next((s for s in STAGES if stages.get(s, 0.0) >= PART), "")
    judged_ap = ap["segm"] if ap.get("segm") is not None else ap["bbox"]
    why = []
    if matched is None:
        why.append(f"no detection of eager scored >= {thresholds.score} on the verification images: nothing judged")
    else:
        if matched < thresholds.min_matched:
            why.append(f"{matched:.1%} of eager's detections matched (< {thresholds.min_matched:.0%})")
        if judged_ap is None or judged_ap < thresholds.min_ap:
            what = "mask" if ap.get("segm") is not None else "box"
            why.append(f"{what} AP against float32 {judged_ap:.3f} (< {thresholds.min_ap})")
    networks = {"eager": None, "float32 graph": reference_network, "graph": network}
    if reference_network is None:
        del networks["float32 graph"]
    speed = time_networks(model, networks, [im for _, im in images], repeats) if repeats else {}
    return {
        "passed": not why, "why": "; ".join(why), "thresholds": vars(thresholds), "part": PART,
        "float32_detections": total, "matched": matched, "ap": ap,
        "score_change": _summary(changes["score"]), "box_change_px": _summary(changes["box_px"]),
        "box_iou": _summary(changes["box_iou"], low=True), "mask_iou": _summary(changes["mask_iou"], low=True),
        "stages": stages, "parts_at": parts_at, "images": per_image, "seconds_per_image": speed,
    }


def format_drift(report: dict, precision: str) -> str:
    """The drift report as ``minidet export`` prints it."""
    t = report["thresholds"]
    lines = [f"{'image':<24} {'size':>9} {'fp32':>5} {'matched':>7}  stage drift (backbone fpn rpn box mask)"]
    for c in report["images"]:
        size = f"{c['size'][1]}x{c['size'][0]}"
        drift = " ".join(f"{c['stages'].get(s, float('nan')):.3f}" for s in STAGES)
        lines.append(f"{c['name'][:24]:<24} {size:>9} {c['float32']:>5} {c['matched']:>7}  {drift}")
    m = report["matched"]
    lines.append(f"{precision} against eager float32 (detections scoring >= {t['score']}): "
                 + ("nothing to match" if m is None else
                    f"{m:.1%} of {report['float32_detections']} matched"))
    ap = report["ap"]
    lines.append("AP with float32's detections as ground truth: "
                 + ", ".join(f"{k} {v:.3f}" for k, v in (("box", ap["bbox"]), ("mask", ap["segm"])) if v is not None))
    for key, label in (("score_change", "score change"), ("box_change_px", "box change (px)"),
                       ("box_iou", "box IoU"), ("mask_iou", "mask IoU")):
        if report[key]:
            lines.append(f"  {label}: " + ", ".join(f"{k} {v:.4g}" for k, v in report[key].items()))
    lines.append("first stage whose outputs part (drift >= {:.2f}): {}".format(report["part"], report["parts_at"]
                                                                              or "none"))
    speed = report.get("seconds_per_image") or {}
    if speed:
        e, g, f = speed["eager"], speed["graph"], speed.get("float32 graph")
        versus = f"{f / g:.2f}x the float32 graph, " if f else ""
        lines.append(f"median per image: eager {1e3 * e:.0f} ms, " + (f"float32 graph {1e3 * f:.0f} ms, " if f else "")
                     + f"{precision} {1e3 * g:.0f} ms ({versus}{e / g:.2f}x eager)")
    lines.append(f"gate (matched >= {t['min_matched']}, AP >= {t['min_ap']}): "
                 + ("passed" if report["passed"] else f"FAILED: {report['why']}"))
    return "\n".join(lines)
