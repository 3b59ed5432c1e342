"""The parity gate of ``minidet export``: the exported graph against the eager model it came from.

Each verification image is preprocessed once by the model's own ``Transform``; the eager network, the exported
graph and the eager network under each float-order change minidet has (``float_order_variants``: its norms folded
into the convolutions where it has foldable norms; channels-last with the other RoIAlign path) run on the same
padded tensor, and minidet's own post-processing (rescale, paste) turns each into detections. The verdict is the
rule of the parity tests (``minidet.apps.compare``: same count and labels, boxes within 1e-2 px, scores within
1e-4, masks with IoU >= 0.99) with "a difference no larger than eager's own float-order noise is equal" made
concrete:

- the tolerances of boxes, scores and the M x M mask probabilities grow to twice the largest difference eager
  shows against any of its float-order variants on the verification images (``Tolerances``), where that is larger;
- pasted masks that differ only by pixels at the threshold or on another paste grid, from network outputs within
  the tolerances, are the same (any float-order change can do that to a mask);
- a Mask Scoring R-CNN's box head is judged on its box scores (``Detections.box_scores``), the rescored scores
  (box score x predicted mask IoU) with its mask head (stage ``mask_head``), and its final detections on both;
- an image where one of eager's variants does not give eager's detections either (another count or other
  detections: near-equal scores at a cut) is unstable: the exported graph's detections are not judged on it.

- an image whose first differing stage parts at one of eager's own decisions that sits on a near-tie is unstable
  too (``near_tie``): the highest-scored proposal or detection that one side has and the other lacks is one whose
  IoU with a higher-scored box is within float noise of the NMS threshold, or whose score is within the score
  tolerance of the score threshold or of the last place under the cap. Any float order may decide such a
  decision either way (the variants may happen not to), and what follows it (the boxes it suppresses, the last
  places) follows that decision, so the image says nothing about the graph's arithmetic; the verdict names it.
  A near-tie moves a few boxes, never most of them: where fewer than half of either side's proposals (or
  detections) have a counterpart, the stage differs wholesale and no near-tie is looked for (a graph computed in
  bf16 moves every box by pixels; its first moved proposal is no swap).

Several variants, not one: folding keeps eager's convolution kernels (only the weights' rounding changes), so its
differences from eager are the smallest a float-order change makes; a runtime's own kernels (OpenVINO's brgemm
convolutions, another CPU's blocking) sum in another order altogether, as channels-last does. Measured on an AMD
EPYC (Zen 4, AVX-512): OpenVINO's backbone features are as far from a float64 run as channels-last eager's (1.2 to
1.3 times eager's own float32 error), and on one image two detections 1.4e-7 apart in score competed for the
100th place: channels-last eager swapped them as OpenVINO did, folded eager did not.

Where an image differs, the first stage that does is named: ``rpn`` (the proposals, as sets), ``box_head`` (the
detections before rescale), ``mask_head`` (their mask probabilities; a Mask Scoring R-CNN's rescored scores),
``paste``. Then eager and exported run every image ``repeats`` times, interleaved, for the speed of each. Used by
``minidet.apps.export.program``.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torchvision.ops import box_iou

from minidet.apps.compare import BOX_TOL, FAR_PX, SCORE_TOL, DetectionMatch, compare_detections
from minidet.detector import MaskRCNN
from minidet.export.runtime import ExportedNetwork
from minidet.heads.detections import FIELDS, Detections
from minidet.norm import fold_norms
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
    """``ours`` against ``ref`` on one image, each stage: proposals unmatched (count), the head's (box scores) and the
    final detections' ``DetectionMatch``, the matched pairs' largest mask probability difference and, with a mask
    IoU head, their largest difference of the rescored scores (box score x predicted mask IoU)."""

    proposals: str
    head: DetectionMatch
    mask: float
    final: DetectionMatch
    mask_scores: float = 0.0

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


def float_order_variants(model: MaskRCNN) -> dict[str, MaskRCNN]:
    """Copies of ``model`` computing the same in other float orders, by name: ``folded`` (its FrozenBN / Affine
    norms folded into the convolutions, where it has them) and ``channels-last`` (``contiguous`` for a channels-last
    model: the other memory layout) with the other RoIAlign path."""
    variants = {}
    folded = copy.deepcopy(model)
    if fold_norms(folded):
        variants["folded"] = folded
    variant = copy.deepcopy(model)
    variant.set_runtime(channels_last=not model.channels_last)
    for pooler in (variant.box_pooler, variant.mask_pooler):
        if pooler is not None:
            pooler.impl = "torchvision" if pooler.impl == "gather" else "gather"
    variants["channels-last" if not model.channels_last else "contiguous"] = variant
    return variants


def eager_outputs(model: MaskRCNN, batch: ImageBatch) -> Outputs:
    """The eager network of ``model`` on a padded batch of one image (``MaskRCNN.detect``, its proposals too)."""
    proposals: list[torch.Tensor] = []
    head = model.detect(batch, proposals)[0]
    return Outputs(proposals[0], head, model.transform.postprocess([head], batch)[0])


def exported_outputs(model: MaskRCNN, network: ExportedNetwork, batch: ImageBatch) -> Outputs:
    """The exported graph on a padded batch of one image, post-processed by ``model``'s ``Transform``."""
    head, out = network.run_image(batch, 0)
    return Outputs(out["proposals"], head, model.transform.postprocess([head], batch)[0])


def _box_head(d: Detections) -> Detections:
    """The box head's detections of ``d``: a Mask Scoring R-CNN's with their box scores (``box_scores``; its
    ``scores`` are those times the mask IoU head's IoUs, the ``mask_head`` stage's), any other's as they are."""
    return d if d.box_scores is None else d._replace(scores=d.box_scores)


def _fields(d: Detections) -> dict[str, torch.Tensor]:
    d = _box_head(d)
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
    mask = mask_scores = 0.0
    if ref.head.masks is not None and head.pairs:
        j, i = (torch.tensor(x) for x in zip(*head.pairs))
        mask = float((ours.head.masks[j] - ref.head.masks[i]).abs().max())
        if ref.head.box_scores is not None and ours.head.box_scores is not None:
            mask_scores = float((ours.head.scores[j] - ref.head.scores[i]).abs().max())
    final = compare_detections(ours.final, ref.final)
    for f in FIELDS:  # the detections' other scores (a Mask Scoring R-CNN's box scores) as their scores
        if f.score and final.pairs and f.name in ours.final and f.name in ref.final:
            j, i = (torch.tensor(x) for x in zip(*final.pairs))
            gap = float((ours.final[f.name][j] - ref.final[f.name][i]).abs().max())
            final.worst_score = max(final.worst_score, gap)
    return Difference(_unmatched_proposals(ours.proposals, ref.proposals, tol.box), head, mask, final, mask_scores)


def tolerances(noise: list[Difference]) -> Tolerances:
    """The tolerances that cover eager's own float-order differences ``noise`` (every variant's, on the images where
    it keeps the same detections) ``NOISE_FACTOR`` times."""
    steady = [d for d in noise if not d.discrete()]
    level = {"box": max((d.final.worst_box for d in steady), default=0.0),
             "score": max((d.final.worst_score for d in steady), default=0.0),
             "mask": max((d.mask for d in steady), default=0.0)}
    return Tolerances(max(BOX_TOL, NOISE_FACTOR * level["box"]), max(SCORE_TOL, NOISE_FACTOR * level["score"]),
                      max(MASK_PROB_TOL, NOISE_FACTOR * level["mask"]), level)


def _iou(a: torch.Tensor, b: torch.Tensor, offset: int) -> torch.Tensor:
    """IoU (N, M) of boxes ``a`` (N, 4) and ``b`` (M, 4) with the box rule's +``offset`` sizes, in float64."""
    a, b = a.double(), b.double()
    if offset:
        a, b = (x + x.new_tensor([0.0, 0.0, offset, offset]) for x in (a, b))
    return box_iou(a, b)


def _iou_noise(box: torch.Tensor, tol: Tolerances) -> float:
    """How far float noise can move an IoU of ``box`` (4,): its coordinates moved by up to ``tol.box`` px each,
    over its sides (an IoU moves by at most about twice the coordinates' change over each side)."""
    w, h = (float(box[2] - box[0]), float(box[3] - box[1]))
    return 2.0 * tol.box * (1.0 / max(w, 1e-3) + 1.0 / max(h, 1e-3))


def _counterparts(ours: torch.Tensor, ref: torch.Tensor, tol: float, same: torch.Tensor | None = None) -> torch.Tensor:
    """For each box of ``ours`` (N,), whether a box of ``ref`` lies within ``tol`` px (of the same label where
    ``same`` (len(ours), len(ref)) says which pairs may match)."""
    if not len(ref):
        return torch.zeros(len(ours), dtype=torch.bool)
    far = torch.cdist(ours.double(), ref.double(), p=float("inf")) > tol
    if same is not None:
        far |= ~same
    return ~far.all(dim=1)


def _first_unmatched(matched: torch.Tensor) -> int:
    """The index of the first box without a counterpart (``_counterparts``' answer, in the boxes' order); the
    count of boxes when every one has one."""
    lone = (~matched).nonzero().flatten()
    return int(lone[0]) if len(lone) else len(matched)


MOSTLY = 0.5  # the share of each side's boxes with a counterpart below which a stage differs wholesale


def _wholesale(*matched: torch.Tensor) -> bool:
    """Whether fewer than ``MOSTLY`` of either side's boxes have a counterpart on the other (each side's
    ``_counterparts``; a side without boxes has them all): no near-tie does that."""
    return any(len(m) and float(m.double().mean()) < MOSTLY for m in matched)


def _apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether boxes ``a`` and ``b`` are two boxes, not one moved (``FAR_PX`` apart, as the comparison has it)."""
    return float((a.double() - b.double()).abs().max()) > FAR_PX


def _nms_tie(box: torch.Tensor, above: torch.Tensor, thresh: float, offset: int, tol: Tolerances) -> str:
    """The near-tie that may decide whether NMS keeps ``box`` beside the higher-scored kept boxes ``above``: its
    largest IoU with them within float noise of ``thresh`` ('' none)."""
    if not len(above):
        return ""
    iou = float(_iou(box[None], above, offset).max())
    return f"IoU {iou:.7f} with a higher-scored box, NMS threshold {thresh:g}" \
        if abs(iou - thresh) <= _iou_noise(box, tol) else ""


def near_tie(stage: str, ours: Outputs, ref: Outputs, model: MaskRCNN, tol: Tolerances) -> str:
    """'' unless the first difference of ``stage`` (``rpn``: the proposals, ``box_head``: the detections before
    rescale) is one of eager's decisions on a near-tie (see the module docstring), then that decision in words.
    Both sides are score-sorted; the first proposal or detection one side has and the other lacks is looked at,
    against the boxes both have above it."""
    if stage == "rpn":
        rpn, p, q = model.rpn, ref.proposals, ours.proposals
        in_q, in_p = _counterparts(p, q, tol.box), _counterparts(q, p, tol.box)
        i, j = _first_unmatched(in_q), _first_unmatched(in_p)
        if i == len(p) and j == len(q) or _wholesale(in_q, in_p):
            return ""
        offset = rpn.box_rule.offset
        if i < len(p) and (tie := _nms_tie(p[i], q[:i], rpn.nms_thresh, offset, tol)):
            return f"eager's proposal #{i}, which the graph lacks: {tie}"
        if j < len(q) and (tie := _nms_tie(q[j], p[:j], rpn.nms_thresh, offset, tol)):
            return f"the graph's proposal #{j}, which eager lacks: {tie}"
        if i == j < min(len(p), len(q)) and _apart(p[i], q[j]) and \
                (iou := float(_iou(p[i, None], q[j, None], offset))) > rpn.nms_thresh:
            return (f"eager's proposal #{i} and the graph's #{j} overlap (IoU {iou:.3f} > NMS threshold "
                    f"{rpn.nms_thresh:g}) and every proposal above them is the same: NMS kept the one scored higher, "
                    "two scores within float noise")
        if i == len(p) - 1 and j == len(q) - 1 and len(p) == rpn.post_nms_topk:
            return f"the last place under the cap of {rpn.post_nms_topk} proposals only"
        return ""
    if stage != "box_head":
        return ""
    head, a, b = model.final_predictor, _box_head(ref.head), _box_head(ours.head)
    same = a.labels[:, None] == b.labels[None, :]
    in_b, in_a = _counterparts(a.boxes, b.boxes, tol.box, same), _counterparts(b.boxes, a.boxes, tol.box, same.T)
    i, j = _first_unmatched(in_b), _first_unmatched(in_a)
    if _wholesale(in_b, in_a):
        return ""
    offset, cap = head.box_rule.offset, head.detections_per_image
    if i < len(a.boxes) and j < len(b.boxes) and int(a.labels[i]) == int(b.labels[j]):
        iou, gap = float(_iou(a.boxes[i, None], b.boxes[j, None], offset)), abs(float(a.scores[i] - b.scores[j]))
        if iou > head.nms_thresh and gap <= tol.score and _apart(a.boxes[i], b.boxes[j]):
            return (f"eager's detection #{i} and the graph's #{j} (label {int(a.labels[i])}) overlap (IoU {iou:.3f} "
                    f"> NMS threshold {head.nms_thresh:g}), scores {gap:.2g} apart: NMS kept the one scored higher")
    for side, k, dets, other in (("eager's", i, a, b), ("the graph's", j, b, a)):
        if k == len(dets.boxes):
            continue
        score, label = float(dets.scores[k]), int(dets.labels[k])
        what = f"{side} detection #{k} (label {label}, score {score:.7f}), which the other lacks"
        above = other.boxes[(other.labels == label) & (other.scores > score - tol.score)]
        if tie := _nms_tie(dets.boxes[k], above, head.nms_thresh, offset, tol):
            return f"{what}: {tie}"
        if abs(score - head.score_thresh) <= tol.score:
            return f"{what}: score threshold {head.score_thresh:g}"
        if len(other.scores) == cap and abs(score - float(other.scores.min())) <= tol.score:
            return f"{what}: the last place under the cap of {cap} detections (the other's last scores " \
                f"{float(other.scores.min()):.7f})"
    return ""


def judge(name: str, image: np.ndarray, ours: Difference, noise: dict[str, Difference], tol: Tolerances,
          tie: Callable[[str], str] = lambda stage: "") -> ImageCheck:
    """The verdict on one image from the exported graph's difference and eager's own under each float-order variant
    (``noise``, by name) and the near-tie, if any, at the first stage that differs (``tie(stage)``; see the module
    docstring)."""
    stages = {
        "rpn": ours.proposals,
        "box_head": ours.head.problem(tol.box, tol.score),
        "mask_head": f"mask probabilities differ by up to {ours.mask:.3g}" if ours.mask > tol.mask else
        f"the mask-IoU-rescored scores differ by up to {ours.mask_scores:.3g}" if ours.mask_scores > tol.score else "",
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
    elif parted := [k for k, d in noise.items() if d.discrete()]:
        check.verdict = f"unstable: eager {parted[0]} differs too ({noise[parted[0]].final.problem()})"
    elif decision := tie(check.first):
        check.verdict = f"unstable: eager's {check.first} decision is a near-tie ({decision})"
    else:
        check.verdict = "DIFFERS"
    return check


def time_networks(model: MaskRCNN, networks: dict[str, ExportedNetwork | None], images: list[np.ndarray],
                  repeats: int) -> dict[str, float]:
    """Median seconds per image of the whole call (preprocess, network, paste) with each of ``networks`` in the
    model (None: its eager network), interleaved: each image runs every way in turn, ``repeats`` times after one
    untimed run, the order reversing every other round."""
    times: dict[str, list[float]] = {k: [] for k in networks}
    for r in range(repeats + 1):
        for image in images:
            for which in list(networks) if r % 2 else list(networks)[::-1]:
                with model.running(networks[which]):
                    t0 = time.perf_counter()
                    model([image])
                    if r:
                        times[which].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items() if v}


def time_both(model: MaskRCNN, network: ExportedNetwork, images: list[np.ndarray], repeats: int) -> dict[str, float]:
    """``time_networks`` of eager and ``network``: ``{"eager", "exported"}``."""
    return time_networks(model, {"eager": None, "exported": network}, images, repeats)


References = list[tuple[Outputs, dict[str, Outputs]]]  # per image: eager's outputs, each variant's by name


def eager_references(model: MaskRCNN, images: list[tuple[str, np.ndarray]]) -> References:
    """Eager's outputs on each image and those of each float-order variant: what ``run_gate`` holds a graph to (made
    once, they serve the same graph under several runtimes)."""
    variants = float_order_variants(model)
    references = []
    for _, image in images:
        batch = model.preprocess([image])
        references.append((eager_outputs(model, batch), {k: eager_outputs(v, batch) for k, v in variants.items()}))
    return references


def run_gate(model: MaskRCNN, network: ExportedNetwork, images: list[tuple[str, np.ndarray]],
             repeats: int = 2, references: References | None = None) -> dict:
    """The gate on ``images`` ((name, HxWx3 uint8 BGR) pairs): ``{"passed", "tolerances", "variants", "images":
    [ImageCheck as dicts], "seconds_per_image": {"eager", "exported"}}``. Passed: no image ``DIFFERS`` and at least
    one image with detections was judged (not unstable). ``references``: ``eager_references(model, images)``, where
    made already."""
    references = references or eager_references(model, images)
    runs = [(ref, own, exported_outputs(model, network, model.preprocess([image])))
            for (_, image), (ref, own) in zip(images, references)]
    # each variant's difference once: the tolerances read its amounts, the verdict whether its detections part
    # (neither depends on the tolerances it was compared under)
    noise = [{k: difference(o, ref, Tolerances()) for k, o in own.items()} for ref, own, _ in runs]
    tol = tolerances([d for own in noise for d in own.values()])
    checks = [judge(name, image, difference(ours, ref, tol), own, tol,
                    lambda stage, ours=ours, ref=ref: near_tie(stage, ours, ref, model, tol))
              for (name, image), (ref, _, ours), own in zip(images, runs, noise)]
    judged = [c for c in checks if c.eager and not c.verdict.startswith("unstable")]
    passed = bool(judged) and all(c.verdict != "DIFFERS" for c in checks)
    speed = time_both(model, network, [im for _, im in images], repeats) if repeats else {}
    return {"passed": passed, "tolerances": asdict(tol), "variants": list(references[0][1]) if references else [],
            "images": [asdict(c) for c in checks], "seconds_per_image": speed}


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
                 f"(eager's own float-order differences, {' and '.join(report.get('variants', [])) or 'no variant'}: "
                 f"{', '.join(f'{k} {v:.3g}' for k, v in t['noise'].items())})")
    speed = report.get("seconds_per_image") or {}
    if speed:
        e, x = speed["eager"], speed["exported"]
        lines.append(f"median per image: eager {1e3 * e:.0f} ms, exported {1e3 * x:.0f} ms "
                     f"({e / x:.2f}x eager's speed)")
    return "\n".join(lines)
