"""The parity gate of ``minidet export``: the exported graph against the eager model it came from.

Each verification image is preprocessed once by the model's own ``Transform``; the eager network and the
exported graph run on the same padded tensor, and minidet's own post-processing (rescale, paste) turns both into
detections, judged by ``minidet.testing.compare.compare_detections``, the rule of the parity tests (same count and
labels, boxes within 1e-2 px, scores within 1e-4, masks with IoU >= 0.99). A difference no larger than eager's
own float-order noise counts as equal, in two cases only:

- at the paste: the network's outputs agree (boxes and scores within the rule, every matched pair's M x M mask
  probabilities within ``MASK_PROB_TOL``) and only pasted masks differ, by pixels whose probability sits at the
  threshold or boxes that truncate to another paste grid: what any float-order change can do there;
- an unstable image: eager itself, run in another float order (``noise``: folded norms, or the other RoIAlign
  path and memory layout), does not give its own detections on it either (near-equal scores at a cut).

Where an image differs, the first stage that does is named: ``rpn`` (the proposals, as sets), ``box_head`` (the
detections before rescale), ``mask_head`` (their mask probabilities), ``paste``. Then both run every image
``repeats`` times, interleaved, for the speed of each. Used by ``minidet.apps.export``; the engine does not
import it.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..detector import MaskRCNN
from ..norm import fold_norms
from ..roi_heads import Detections
from ..testing.compare import BOX_TOL, SCORE_TOL, DetectionMatch, compare_detections
from .onnxfile import graph_inputs
from .runtime import ExportedNetwork

STAGES = ("rpn", "box_head", "mask_head", "paste")
MASK_PROB_TOL = 1e-2  # M x M mask probabilities of two matched detections that are the same (folding alone: 2e-3)


@dataclass
class ImageCheck:
    """One verification image. ``problem``: the final detections' difference ('' none); ``verdict``: ``same``,
    ``same: ...`` (excused, with why) or ``DIFFERS``; ``first``: the first stage that differs ('' none); ``stages``:
    each stage's difference ('' none)."""

    name: str
    size: tuple[int, int]
    eager: int
    exported: int
    problem: str
    verdict: str = "same"
    first: str = ""
    stages: dict[str, str] = field(default_factory=dict)


def _fields(d: Detections) -> dict[str, torch.Tensor]:
    return {"boxes": d.boxes, "scores": d.scores, "labels": d.labels}


def proposal_difference(ours: torch.Tensor, ref: torch.Tensor) -> str:
    """'' when every eager proposal (P, 4) has an exported one within ``BOX_TOL`` px and the counts agree (the
    order of near-equal scores aside), else how many do not."""
    if len(ours) != len(ref):
        return f"{len(ours)} proposals vs eager {len(ref)}"
    if not len(ref):
        return ""
    nearest = torch.cdist(ref.double(), ours.double(), p=float("inf")).min(dim=1).values
    missing = int((nearest > BOX_TOL).sum())
    return f"{missing} of {len(ref)} proposals have no counterpart within {BOX_TOL} px" if missing else ""


def mask_difference(ours: Detections, ref: Detections, match: DetectionMatch) -> str:
    """The largest difference of matched pairs' mask probabilities, where it passes ``MASK_PROB_TOL``."""
    if ref.masks is None or not match.pairs:
        return ""
    j, i = (torch.tensor(x) for x in zip(*match.pairs))
    worst = float((ours.masks[j] - ref.masks[i]).abs().max())
    return f"mask probabilities differ by up to {worst:.3g}" if worst > MASK_PROB_TOL else ""


def _only_masks(m: DetectionMatch) -> bool:
    """Whether ``m``'s one difference is its masks (the detections themselves the same)."""
    same = m.n_ours == m.n_ref and m.unmatched_label is None and not m.n_far
    return same and m.worst_box <= BOX_TOL and m.worst_score <= SCORE_TOL and m.low_iou > 0


def float_order_variant(model: MaskRCNN) -> MaskRCNN:
    """A copy of ``model`` computing the same in another float order: its FrozenBN / Affine norms folded into
    the convolutions where it has them, else channels-last and the other RoIAlign path."""
    variant = copy.deepcopy(model)
    if not fold_norms(variant):
        variant.set_runtime(channels_last=not model.channels_last)
        for pooler in (variant.box_pooler, variant.mask_pooler):
            if pooler is not None:
                pooler.impl = "torchvision" if pooler.impl == "gather" else "gather"
    return variant


@torch.inference_mode()
def eager_run(model: MaskRCNN, image: np.ndarray):
    """The eager network on one image: (padded batch, its proposals (P, 4), its ``Detections``)."""
    batch = model.preprocess([image])
    batch = batch._replace(tensor=model._to_layout(batch.tensor))
    captured: list[list[torch.Tensor]] = []
    select = model.rpn.select
    model.rpn.select = lambda *a, **k: captured.append(select(*a, **k)) or captured[-1]
    try:
        return batch, captured, model._detect(batch)[0]
    finally:
        del model.rpn.select


def check_image(model: MaskRCNN, network: ExportedNetwork, name: str, image: np.ndarray,
                noise: Callable[[], MaskRCNN] | None = None) -> ImageCheck:
    """Eager against exported on one HxWx3 uint8 BGR image, stage by stage (see the module docstring); ``noise``:
    the eager model in another float order, built on first use, for an image that differs."""
    batch, proposals, ref = eager_run(model, image)
    out = dict(zip(network.outputs, network.graph.session.run(None, graph_inputs(batch, 0))))
    ours = Detections(*(torch.from_numpy(out[k]) for k in ("boxes", "scores", "labels")), network.graph.frame,
                      torch.from_numpy(out["masks"]) if "masks" in out else None)
    final_ref, final_ours = (model.transform.postprocess([d], batch)[0] for d in (ref, ours))
    head = compare_detections(_fields(ours), _fields(ref))
    final = compare_detections(final_ours, final_ref)
    stages = {
        "rpn": proposal_difference(torch.from_numpy(out["proposals"]), proposals[0][0]),
        "box_head": head.problem(),
        "mask_head": mask_difference(ours, ref, head) if not head.problem() else "",
        "paste": final.problem(),
    }
    h, w = image.shape[:2]
    check = ImageCheck(name, (h, w), len(final_ref["boxes"]), len(final_ours["boxes"]), final.problem(),
                       stages=stages)
    if not check.problem:
        return check
    check.first = next(s for s in STAGES if stages[s])
    if check.first == "paste" and _only_masks(final):
        check.verdict = (f"same: {final.low_iou} pasted masks differ at the threshold or paste grid only, from "
                         f"network outputs within the rule (masks within {MASK_PROB_TOL})")
    elif noise is not None:
        _, _, own = eager_run(noise(), image)
        own_problem = compare_detections(model.transform.postprocess([own], batch)[0], final_ref).problem()
        check.verdict = f"same: unstable image, eager in another float order differs too ({own_problem})" \
            if own_problem else "DIFFERS"
    else:
        check.verdict = "DIFFERS"
    return check


def time_both(model: MaskRCNN, network: ExportedNetwork, images: list[np.ndarray], repeats: int) -> dict[str, float]:
    """Median seconds per image of the whole call (preprocess, network, paste), eager and exported, interleaved:
    each image runs both ways in turn, ``repeats`` times after one untimed run, the order alternating."""
    times: dict[str, list[float]] = {"eager": [], "exported": []}
    saved = model.network
    try:
        for r in range(repeats + 1):
            for image in images:
                for which in ("eager", "exported") if r % 2 else ("exported", "eager"):
                    model.network = network if which == "exported" else None
                    t0 = time.perf_counter()
                    model([image])
                    if r:
                        times[which].append(time.perf_counter() - t0)
    finally:
        model.network = saved
    return {k: statistics.median(v) for k, v in times.items() if v}


def run_gate(model: MaskRCNN, network: ExportedNetwork, images: list[tuple[str, np.ndarray]],
             repeats: int = 2) -> dict:
    """The gate on ``images`` ((name, HxWx3 uint8 BGR) pairs): ``{"passed", "images": [ImageCheck as dicts],
    "seconds_per_image": {"eager", "exported"}}``. Passed: no image ``DIFFERS`` and at least one with detections
    was judged by the rule itself (not excused as unstable). The noise reference is ``float_order_variant``."""
    built: list[MaskRCNN] = []

    def noise() -> MaskRCNN:
        if not built:
            built.append(float_order_variant(model))
        return built[0]

    checks = [check_image(model, network, name, im, noise) for name, im in images]
    judged = [c for c in checks if c.eager and "unstable" not in c.verdict]
    passed = bool(judged) and all(c.verdict != "DIFFERS" for c in checks)
    speed = time_both(model, network, [im for _, im in images], repeats) if repeats else {}
    return {"passed": passed, "images": [asdict(c) for c in checks], "seconds_per_image": speed}


def format_table(report: dict) -> str:
    """The gate as printed by ``minidet export``: one line per image, then the speed."""
    lines = [f"{'image':<24} {'size':>9} {'eager':>6} {'export':>6}  verdict"]
    for c in report["images"]:
        size = f"{c['size'][1]}x{c['size'][0]}"
        verdict = f"DIFFERS at {c['first']}: {c['problem']}" if c["verdict"] == "DIFFERS" else c["verdict"]
        lines.append(f"{c['name'][:24]:<24} {size:>9} {c['eager']:>6} {c['exported']:>6}  {verdict}")
    if not any(c["eager"] and "unstable" not in c["verdict"] for c in report["images"]):
        lines.append("no image with detections was judged by the rule: nothing was checked")
    speed = report.get("seconds_per_image") or {}
    if speed:
        e, x = speed["eager"], speed["exported"]
        lines.append(f"median per image: eager {1e3 * e:.0f} ms, exported (onnxruntime) {1e3 * x:.0f} ms "
                     f"({e / x:.2f}x eager's speed)")
    return "\n".join(lines)
