"""torchvision's Mask R-CNN as the reference: random realistic weights, its input, stage times.

Used by the parity tests and ``tools/benchmark.py``; nothing here runs with a real checkpoint.
``build_tv`` gives torchvision's own model with weights that behave like trained ones (see
``minidet.synthetic``), ``TorchvisionStages`` times torchvision's unmodified forward per minidet
stage and per step that minidet times inside its stages (``minidet.timing.DETAILS``), and
``compare_detections`` measures how far two detection sets are apart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torchvision.models import resnet
from torchvision.models.detection import MaskRCNN, maskrcnn_resnet50_fpn_v2
from torchvision.models.detection._utils import overwrite_eps
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.ops.misc import FrozenBatchNorm2d

from .synthetic import calibrate_norm_stats, randomize_affine, structured_image


def to_tv_input(img_bgr: np.ndarray) -> torch.Tensor:
    """What a torchvision user feeds: RGB float in [0, 1], (3, H, W), from HxWx3 uint8 BGR."""
    return torch.from_numpy(np.ascontiguousarray(img_bgr[:, :, ::-1])).permute(2, 0, 1).float() / 255


def tv_skeleton(version: int, min_size: int, max_size: int, depth: int = 50) -> nn.Module:
    """torchvision's Mask R-CNN architecture with untouched initial weights, in eval mode.

    v1 is built the way torchvision builds it for its COCO_V1 weights: ResNet with
    ``FrozenBatchNorm2d``, then ``overwrite_eps(model, 0.0)``. ``depth`` 101 uses torchvision's
    own ``resnet101`` body in the same ``MaskRCNN`` class (torchvision publishes no R-101 Mask
    R-CNN builder or weights). v2 is ``maskrcnn_resnet50_fpn_v2`` (ResNet-50 only).
    """
    if version == 1:
        if depth not in (50, 101):
            raise ValueError(f"torchvision reference: depth {depth} not supported (50 or 101)")
        body = getattr(resnet, f"resnet{depth}")(weights=None, norm_layer=FrozenBatchNorm2d)
        model = MaskRCNN(_resnet_fpn_extractor(body, 3), num_classes=91, min_size=min_size, max_size=max_size)
        overwrite_eps(model, 0.0)
    elif version == 2 and depth == 50:
        model = maskrcnn_resnet50_fpn_v2(weights=None, weights_backbone=None, min_size=min_size, max_size=max_size)
    else:
        raise ValueError(f"torchvision reference: no v{version} model of depth {depth}")
    return model.eval()


def build_tv(version: int, min_size: int, max_size: int, seed: int = 0, depth: int = 50) -> nn.Module:
    """torchvision's own Mask R-CNN (``tv_skeleton``) with randomized norms and sharpened heads.

    Every batch norm gets non-trivial weight/bias and running statistics calibrated on its own
    input (then perturbed); the last norm of each residual branch gets a small gamma, as in a
    trained ResNet; class logits are scaled so that more than 100 detections per image pass the
    0.05 threshold with spread-out scores (the 100-detection cap is reached at short sides 160
    to 800); mask logits so that masks are mixed.
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = tv_skeleton(version, min_size, max_size, depth)
    randomize_affine(model, gen)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name.endswith(".bn3") or name.endswith(".downsample.1"):
                mod.weight.mul_(0.3)
        p = model.roi_heads.box_predictor
        p.cls_score.weight.mul_(3.0)
        p.cls_score.bias.copy_(torch.randn(91, generator=gen))
        model.roi_heads.mask_predictor.mask_fcn_logits.weight.mul_(8.0)
    calib = [to_tv_input(structured_image(256, 256, seed=100 + seed))]
    calibrate_norm_stats(model, lambda: model(calib), gen)
    return model.eval()


# minidet's stage names, in the order torchvision's forward reaches them
_TV_STAGES = ("preprocess", "backbone", "fpn", "rpn", "box_head", "mask_head", "paste")


class TorchvisionStages:
    """Calls torchvision's Mask R-CNN and splits the call into minidet's stages and steps.

    The call is torchvision's own, unmodified ``GeneralizedRCNN.forward`` (under
    ``torch.inference_mode``). Hooks take a time stamp (after ``torch.cuda.synchronize`` on
    CUDA) where each stage ends: ``transform`` returns (preprocess: resize, normalize, batch),
    ``backbone.body`` returns (backbone), ``backbone.fpn`` returns (fpn), ``rpn`` returns (rpn),
    ``roi_heads.mask_roi_pool`` starts (box_head: multi-scale RoIAlign, box head, predictor,
    ``postprocess_detections``), ``roi_heads`` returns (mask_head: RoIAlign, mask head,
    predictor, class selection). The rest of the call is ``transform.postprocess`` (paste: box
    rescaling and mask pasting). The stage times add up to the wall time of the call.

    More stamps, at the start and end of submodules, time the steps inside stages that minidet
    times with ``StageTimer(detail=True)`` (``minidet.timing.DETAILS``): ``rpn_select`` is the
    rpn stage minus ``rpn.head`` (anchors, top-k, decode, clip, NMS), ``box_roi_align`` is
    ``roi_heads.box_roi_pool`` (multi-scale RoIAlign for the box head), ``box_postprocess``
    runs from the end of ``roi_heads.box_predictor`` to the start of ``mask_roi_pool`` (to the
    end of ``roi_heads`` without a mask head: ``postprocess_detections``, i.e. softmax, decode,
    clip, per-class NMS, top-k), ``mask_roi_align`` is ``roi_heads.mask_roi_pool``. Steps lie
    inside stages: they do not add to the wall time.
    """

    def __init__(self, model: nn.Module, device: torch.device | str = "cpu") -> None:
        self.model = model
        self.sync = torch.device(device).type == "cuda"
        self.marks: dict[str, float] = {}
        rh = model.roi_heads
        box_end = "mask_head" if rh.has_mask() else "box_head"
        ends = [(model.transform, "preprocess"), (model.backbone.body, "backbone"), (model.backbone.fpn, "fpn")]
        ends += [(model.rpn, "rpn"), (rh, box_end), (model.rpn.head, "rpn.head>")]
        ends += [(rh.box_roi_pool, "box_roi_pool>"), (rh.box_predictor, "box_predictor>")]
        starts = [(model.rpn.head, "rpn.head<"), (rh.box_roi_pool, "box_roi_pool<")]
        if rh.has_mask():
            ends.append((rh.mask_roi_pool, "mask_roi_pool>"))
            starts.append((rh.mask_roi_pool, "box_head"))  # the box_head stage ends where mask_roi_pool starts
        self._handles = [m.register_forward_hook(self._marker(name)) for m, name in ends]
        self._handles += [m.register_forward_pre_hook(self._marker(name)) for m, name in starts]

    def _marker(self, name: str):
        def mark(*_) -> None:
            if self.sync:
                torch.cuda.synchronize()
            self.marks[name] = time.perf_counter()

        return mark

    def __call__(
        self, images: list[torch.Tensor]
    ) -> tuple[list[dict[str, torch.Tensor]], dict[str, float], dict[str, float]]:
        """Returns torchvision's detections, ``{stage: seconds}`` and ``{step: seconds}`` for this call."""
        self.marks = {}
        if self.sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            outs = self.model(images)
        if self.sync:
            torch.cuda.synchronize()
        m = self.marks
        m["paste"] = time.perf_counter()
        times, prev = {}, start
        for name in _TV_STAGES:
            if name in m:
                times[name] = m[name] - prev
                prev = m[name]
        details = {}
        if "rpn.head>" in m and "rpn" in times:
            details["rpn_select"] = times["rpn"] - (m["rpn.head>"] - m["rpn.head<"])
        if "box_roi_pool>" in m:
            details["box_roi_align"] = m["box_roi_pool>"] - m["box_roi_pool<"]
        if "box_predictor>" in m and "box_head" in m:
            details["box_postprocess"] = m["box_head"] - m["box_predictor>"]
        if "mask_roi_pool>" in m:
            details["mask_roi_align"] = m["mask_roi_pool>"] - m["box_head"]
        return outs, times, details

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


FAR_PX = 1.0  # a matched box farther than this is another detection, not the same one moved


@dataclass
class DetectionMatch:
    """How far one image's detections (``ours``) are from the reference's."""

    n_ours: int
    n_ref: int
    unmatched_label: int | None = None  # first reference label left without a detection of ours
    worst_box: float = 0.0  # px, max over matched pairs of the largest coordinate difference
    worst_score: float = 0.0
    worst_iou: float = 1.0  # smallest mask IoU over matched pairs
    worst_pixels: int = 0  # most mask pixels that differ in one matched pair
    iou_min: float = 0.99
    low_iou_pixels: int = 0  # most differing pixels among the pairs with mask IoU < iou_min, same paste grid
    grid_flips: int = 0  # pairs with mask IoU < iou_min whose boxes truncate to different paste grids
    n_far: int = 0  # reference detections whose matched box is more than ``FAR_PX`` away: a different detection
    first_far: str = ""  # the first of them, described

    def problem(self, box_tol: float = 1e-2, score_tol: float = 1e-4, pixel_tol: int = 0) -> str:
        """'' when the detections are the same within the tolerances, else the first difference.

        Masks agree when their IoU is at least ``iou_min`` or at most ``pixel_tol`` pixels differ
        (a pixel whose probability is within rounding of the 0.5 threshold can flip, and in a
        small mask one pixel is more than 1% of the union), or when the two boxes, equal within
        ``box_tol``, fall on different integer paste grids (``paste_grid``): then the whole mask
        is pasted one pixel apart, which is the paste's own discontinuity, not a difference.
        """
        if self.n_ours != self.n_ref:
            return f"{self.n_ours} detections vs reference {self.n_ref}"
        if self.unmatched_label is not None:
            return f"no unmatched detection with label {self.unmatched_label}"
        if self.n_far:
            return (
                f"{self.n_far} of {self.n_ref} detections have no counterpart of the same label within"
                f" {FAR_PX} px (a different detection, not a moved box); first: {self.first_far}"
            )
        if self.worst_box > box_tol:
            return f"box differs by {self.worst_box} px"
        if self.worst_score > score_tol:
            return f"score differs by {self.worst_score}"
        if self.low_iou_pixels > pixel_tol:
            return f"mask IoU {self.worst_iou:.4f} ({self.low_iou_pixels} pixels differ)"
        return ""


def paste_grid(boxes: torch.Tensor, mask_size: int = 28) -> torch.Tensor:
    """The integer box (D, 4) int64 into which torchvision pastes each ``mask_size``² mask.

    The mask gets a one-pixel border, so the box (D, 4) xyxy float is widened about its centre
    by (M + 2) / M, and the corners are truncated to integers. Two boxes a hair apart around an
    integer boundary thus paste the same mask one pixel apart.
    """
    half = (boxes[:, 2:] - boxes[:, :2]) * 0.5 * ((mask_size + 2) / mask_size)
    centre = (boxes[:, 2:] + boxes[:, :2]) * 0.5
    return torch.cat([centre - half, centre + half], dim=1).to(torch.int64)


def compare_detections(ours: dict, ref: dict, iou_min: float = 0.99) -> DetectionMatch:
    """Match each reference detection to one of ours: same label, closest box, each used once.

    Both dicts hold ``boxes`` (D, 4), ``scores`` (D,), ``labels`` (D,) and optionally ``masks``
    (D, H, W) bool. Counts must agree before anything is matched.
    """
    n = len(ref["boxes"])
    m = DetectionMatch(len(ours["boxes"]), n, iou_min=iou_min)
    if m.n_ours != n:
        return m
    used: set[int] = set()
    for i in range(n):
        cand = [j for j in (ours["labels"] == ref["labels"][i]).nonzero().flatten().tolist() if j not in used]
        if not cand:
            m.unmatched_label = int(ref["labels"][i])
            return m
        d = [float((ours["boxes"][j] - ref["boxes"][i]).abs().max()) for j in cand]
        j = cand[int(np.argmin(d))]
        used.add(j)
        m.worst_box = max(m.worst_box, min(d))
        if min(d) > FAR_PX:
            m.n_far += 1
            if m.n_far == 1:
                box = [round(v, 1) for v in ref["boxes"][i].tolist()]
                label, score = int(ref["labels"][i]), float(ref["scores"][i])
                m.first_far = f"reference #{i} label {label} score {score:.4f} box {box}"
        m.worst_score = max(m.worst_score, float((ours["scores"][j] - ref["scores"][i]).abs()))
        if "masks" in ours and "masks" in ref:
            a, b = ours["masks"][j], ref["masks"][i]
            union, differ = int((a | b).sum()), int((a ^ b).sum())
            iou = 1.0 - differ / union if union else 1.0
            m.worst_iou, m.worst_pixels = min(m.worst_iou, iou), max(m.worst_pixels, differ)
            if iou < iou_min and torch.equal(paste_grid(ours["boxes"][j : j + 1]), paste_grid(ref["boxes"][i : i + 1])):
                m.low_iou_pixels = max(m.low_iou_pixels, differ)
            elif iou < iou_min:
                m.grid_flips += 1
    return m
