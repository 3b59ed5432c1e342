"""The parity gate of ``minidet export``: the exported graph against the eager model it came from.

Each verification image is preprocessed once by the model's own ``Transform``; the eager network, the exported
graph and the eager network in another float order (``float_order_variant``: folded norms, or channels-last and
the other RoIAlign path) run on the same padded tensor, and minidet's own post-processing (rescale, paste) turns
each into detections. The verdict is the rule of the parity tests (``minidet.apps.compare``: same count and
labels, boxes within 1e-2 px, scores within 1e-4, masks with IoU >= 0.99) with "a difference no larger than
eager's own float-order noise is equal" made concrete:

- the tolerances of boxes, scores and the M x M mask probabilities grow to twice the largest difference eager
  shows against its own float-order variant on the verification images (``Tolerances``), where that is larger;
- pasted masks that differ only by pixels at the threshold or on another paste grid, from network outputs within
  the tolerances, are the same (any float-order change can do that to a mask);
- an image where eager's variant does not give eager's detections either (another count or other detections:
  near-equal scores at a cut) is unstable: the exported graph's detections are not judged on it.

Where an image differs, the first stage that does is named: ``rpn`` (the proposals, as sets), ``box_head`` (the
detections before rescale), ``mask_head`` (their mask probabilities), ``paste``. Then eager and exported run every
image ``repeats`` times, interleaved, for the speed of each. Used by ``minidet.apps.export.program``.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from minidet.apps.compare import BOX_TOL, SCORE_TOL, DetectionMatch, compare_detections
from minidet.detector import MaskRCNN
from minidet.export.onnxfile import graph_inputs
from minidet.export.runtime import ExportedNetwork
from minidet.norm import fold_norms
from minidet.roi_heads import Detections
from minidet.transform import ImageBatch

STAGES = ("rpn", "box_head", "mask_head", "paste")
MASK_PROB_TOL = 1e-3  # M x M mask probabilities of two matched detections that are the same (before the noise)
NOISE_FACTOR = 2.0  # tolerances grow to this times eager's own largest float-order difference


@dataclass
class Tolerances:
    """What counts as the same: box coordinates (px), scores, mask probabilities; ``noise``: eager's own largest
    differences against its float-order variant (the same three), which the tolerances cover twice."""

    box: float = BOX_TOL
    score: float = SCORE_TOL
    mask: float = MASK_PROB_TOL
    noise: dict[str, float] = field(default_factory=dict)


@dataclass
class Outputs:
    """One network's run on one image: ``proposals`` (P, 4), ``head`` (detections before rescale, with mask
    probabilities), ``final`` (minidet's post-processed detections)."""

    proposals: torch.Tensor
    head: Detections
    final: dict


@dataclass
class Difference:
    """``ours`` against ``ref`` on one image, each stage: proposals unmatched (count), the head's and the final
    detections' ``DetectionMatch``, the matched pairs' largest mask probability difference."""

    proposals: str
    head: DetectionMatch
    mask: float
    final: DetectionMatch

    def discrete(self) -> bool:
        """Whether the detections themselves differ (count, labels, or a detection with no counterpart)."""
        m = self.final
        return m.n_ours != m.n_ref or m.unmatched_label is not None or bool(m.n_far)


@dataclass
class ImageCheck:
    """One verification image. ``problem``: the final detections' difference under the tolerances ('' none);
    ``verdict``: ``same``, ``same: ...`` (excused, with why), ``unstable: ...`` (not judged) or ``DIFFERS``;
    ``first``: the first stage that differs ('' none); ``stages``: each stage's difference ('' none)."""

    name: str
    size: tuple[int, int]
    eager: int
    exported: int
    problem: str
    verdict: str = "same"
    first: str = ""
    stages: dict[str, str] = field(default_factory=dict)


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


def eager_outputs(model: MaskRCNN, batch: ImageBatch) -> Outputs:
    """The eager network of ``model`` on a padded batch of one image (``MaskRCNN.detect``, its proposals too)."""
    proposals: list[torch.Tensor] = []
    head = model.detect(batch, proposals)[0]
    return Outputs(proposals[0], head, model.transform.postprocess([head], batch)[0])


def exported_outputs(model: MaskRCNN, network: ExportedNetwork, batch: ImageBatch) -> Outputs:
    """The exported graph on a padded batch of one image, post-processed by ``model``'s ``Transform``."""
    out = {k: torch.from_numpy(v) for k, v in network.run(graph_inputs(batch, 0)).items()}
    head = Detections(out["boxes"], out["scores"], out["labels"], network.graph.frame, out.get("masks"))
    return Outputs(out["proposals"], head, model.transform.postprocess([head], batch)[0])


def _fields(d: Detections) -> dict[str, torch.Tensor]:
    return {"boxes": d.boxes, "scores": d.scores, "labels": d.labels}


def _unmatched_proposals(ours: torch.Tensor, ref: torch.Tensor, tol: float) -> str:
    """'' when every proposal of ``ref`` (P, 4) has one of ``ours`` within ``tol`` px and the counts agree (the
    order of near-equal scores aside), else how many do not."""
    if len(ours) != len(ref):
        return f"{len(ours)} proposals vs eager {len(ref)}"
    if not len(ref):
        return ""
    nearest = torch.cdist(ref.double(), ours.double(), p=float("inf")).min(dim=1).values
    missing = int((nearest > tol).sum())
    return f"{missing} of {len(ref)} proposals have no counterpart within {tol:.3g} px" if missing else ""


def difference(ours: Outputs, ref: Outputs, tol: Tolerances) -> Difference:
    """How ``ours`` differs from ``ref`` on one image, stage by stage."""
    head = compare_detections(_fields(ours.head), _fields(ref.head))
    mask = 0.0
    if ref.head.masks is not None and head.pairs:
        j, i = (torch.tensor(x) for x in zip(*head.pairs))
        mask = float((ours.head.masks[j] - ref.head.masks[i]).abs().max())
    final = compare_detections(ours.final, ref.final)
    return Difference(_unmatched_proposals(ours.proposals, ref.proposals, tol.box), head, mask, final)


def tolerances(noise: list[Difference]) -> Tolerances:
    """The tolerances that cover eager's own float-order differences ``noise`` (of the images where its variant
    keeps the same detections) ``NOISE_FACTOR`` times."""
    steady = [d for d in noise if not d.discrete()]
    level = {"box": max((d.final.worst_box for d in steady), default=0.0),
             "score": max((d.final.worst_score for d in steady), default=0.0),
             "mask": max((d.mask for d in steady), default=0.0)}
    return Tolerances(max(BOX_TOL, NOISE_FACTOR * level["box"]), max(SCORE_TOL, NOISE_FACTOR * level["score"]),
                      max(MASK_PROB_TOL, NOISE_FACTOR * level["mask"]), level)


def judge(name: str, image: np.ndarray, ours: Difference, noise: Difference, tol: Tolerances) -> ImageCheck:
    """The verdict on one image from the exported graph's and eager's own differences (see the module docstring)."""
    stages = {
        "rpn": ours.proposals,
        "box_head": ours.head.problem(tol.box, tol.score),
        "mask_head": f"mask probabilities differ by up to {ours.mask:.3g}" if ours.mask > tol.mask else "",
        "paste": ours.final.problem(tol.box, tol.score),
    }
    h, w = image.shape[:2]
    check = ImageCheck(name, (h, w), ours.final.n_ref, ours.final.n_ours, stages["paste"], stages=stages)
    if not check.problem:
        return check
    check.first = next(s for s in STAGES if stages[s])
    only_masks = not ours.discrete() and not stages["box_head"] and not stages["mask_head"]
    if only_masks and check.problem.startswith("mask IoU"):
        check.verdict = (f"same: {ours.final.low_iou} pasted masks differ at the threshold or paste grid only, "
                         "from network outputs within the tolerances")
    elif noise.discrete():
        check.verdict = f"unstable: eager in another float order differs too ({noise.final.problem()})"
    else:
        check.verdict = "DIFFERS"
    return check


def time_networks(model: MaskRCNN, networks: dict[str, ExportedNetwork | None], images: list[np.ndarray],
                  repeats: int) -> dict[str, float]:
    """Median seconds per image of the whole call (preprocess, network, paste) with each of ``networks`` in the
    model (None: its eager network), interleaved: each image runs every way in turn, ``repeats`` times after one
    untimed run, the order reversing every other round."""
    times: dict[str, list[float]] = {k: [] for k in networks}
    saved = model.network
    try:
        for r in range(repeats + 1):
            for image in images:
                for which in list(networks) if r % 2 else list(networks)[::-1]:
                    model.network = networks[which]
                    t0 = time.perf_counter()
                    model([image])
                    if r:
                        times[which].append(time.perf_counter() - t0)
    finally:
        model.network = saved
    return {k: statistics.median(v) for k, v in times.items() if v}


def time_both(model: MaskRCNN, network: ExportedNetwork, images: list[np.ndarray], repeats: int) -> dict[str, float]:
    """``time_networks`` of eager and ``network``: ``{"eager", "exported"}``."""
    return time_networks(model, {"eager": None, "exported": network}, images, repeats)


def eager_references(model: MaskRCNN, images: list[tuple[str, np.ndarray]]) -> list[tuple[Outputs, Outputs]]:
    """Eager's outputs on each image and those of its float-order variant: what ``run_gate`` holds a graph to (made
    once, they serve the same graph under several runtimes)."""
    variant = float_order_variant(model)
    references = []
    for _, image in images:
        batch = model.preprocess([image])
        references.append((eager_outputs(model, batch), eager_outputs(variant, batch)))
    return references


def run_gate(model: MaskRCNN, network: ExportedNetwork, images: list[tuple[str, np.ndarray]],
             repeats: int = 2, references: list[tuple[Outputs, Outputs]] | None = None) -> dict:
    """The gate on ``images`` ((name, HxWx3 uint8 BGR) pairs): ``{"passed", "tolerances", "images": [ImageCheck as
    dicts], "seconds_per_image": {"eager", "exported"}}``. Passed: no image ``DIFFERS`` and at least one image with
    detections was judged (not unstable). ``references``: ``eager_references(model, images)``, where made already."""
    references = references or eager_references(model, images)
    runs = [(ref, own, exported_outputs(model, network, model.preprocess([image])))
            for (_, image), (ref, own) in zip(images, references)]
    tol = tolerances([difference(own, ref, Tolerances()) for ref, own, _ in runs])
    checks = [judge(name, image, difference(ours, ref, tol), difference(own, ref, tol), tol)
              for (name, image), (ref, own, ours) in zip(images, runs)]
    judged = [c for c in checks if c.eager and not c.verdict.startswith("unstable")]
    passed = bool(judged) and all(c.verdict != "DIFFERS" for c in checks)
    speed = time_both(model, network, [im for _, im in images], repeats) if repeats else {}
    return {"passed": passed, "tolerances": asdict(tol), "images": [asdict(c) for c in checks],
            "seconds_per_image": speed}


def format_table(report: dict) -> str:
    """The gate as printed by ``minidet export``: one line per image, the tolerances, the speed."""
    lines = [f"{'image':<24} {'size':>9} {'eager':>6} {'export':>6}  verdict"]
    for c in report["images"]:
        size = f"{c['size'][1]}x{c['size'][0]}"
        verdict = f"DIFFERS at {c['first']}: {c['problem']}" if c["verdict"] == "DIFFERS" else c["verdict"]
        lines.append(f"{c['name'][:24]:<24} {size:>9} {c['eager']:>6} {c['exported']:>6}  {verdict}")
    if not any(c["eager"] and not c["verdict"].startswith("unstable") for c in report["images"]):
        lines.append("no image with detections was judged: nothing was checked")
    t = report["tolerances"]
    lines.append(f"tolerances: boxes {t['box']:.3g} px, scores {t['score']:.3g}, mask probabilities {t['mask']:.3g} "
                 f"(eager's own float-order differences: {', '.join(f'{k} {v:.3g}' for k, v in t['noise'].items())})")
    speed = report.get("seconds_per_image") or {}
    if speed:
        e, x = speed["eager"], speed["exported"]
        lines.append(f"median per image: eager {1e3 * e:.0f} ms, exported {1e3 * x:.0f} ms "
                     f"({e / x:.2f}x eager's speed)")
    return "\n".join(lines)
