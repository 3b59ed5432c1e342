"""torchvision's Mask R-CNN as the reference: its models and weights, its input, its stage times.

Used by the parity tests and ``tools/benchmark.py``; nothing here runs with a real checkpoint.
``build_tv`` gives torchvision's own model with weights that behave like trained ones (see
``minidet.apps.synthetic``), ``tv_init_state`` its default-initialized weights (the tests' quick
checkpoints), ``legacy_v1_state_dict`` the key layout of the published v1 file, and
``TorchvisionStages`` times torchvision's unmodified forward per minidet stage and per step that
minidet times inside its stages (``minidet.timing.DETAILS``).
"""

from __future__ import annotations

import re
import time

import numpy as np
import torch
from torch import nn
from torchvision.models import resnet
from torchvision.models.detection import MaskRCNN, maskrcnn_resnet50_fpn, maskrcnn_resnet50_fpn_v2
from torchvision.models.detection._utils import overwrite_eps
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.ops.misc import FrozenBatchNorm2d

from minidet.apps.synthetic import calibrate_norm_stats, randomize_affine, structured_image
from minidet.timing import STAGES


def to_tv_input(img_bgr: np.ndarray) -> torch.Tensor:
    """What a torchvision user feeds: RGB float in [0, 1], (3, H, W), from HxWx3 uint8 BGR."""
    return torch.from_numpy(np.ascontiguousarray(img_bgr[:, :, ::-1])).permute(2, 0, 1).float() / 255


def tv_skeleton(version: int, min_size: int, max_size: int, depth: int = 50, num_classes: int = 91) -> nn.Module:
    """torchvision's Mask R-CNN architecture with untouched initial weights, in eval mode.

    v1 is built the way torchvision builds it for its COCO_V1 weights: ResNet with
    ``FrozenBatchNorm2d``, then ``overwrite_eps(model, 0.0)``. ``depth`` 101 uses torchvision's
    own ``resnet101`` body in the same ``MaskRCNN`` class (torchvision publishes no R-101 Mask
    R-CNN builder or weights). v2 is ``maskrcnn_resnet50_fpn_v2`` (ResNet-50 only). ``num_classes`` (background
    included): a model fine-tuned on its own classes, as torchvision's tutorial makes one (the COCO model with
    new predictors).
    """
    if version == 1:
        if depth not in (50, 101):
            raise ValueError(f"torchvision reference: depth {depth} not supported (50 or 101)")
        body = getattr(resnet, f"resnet{depth}")(weights=None, norm_layer=FrozenBatchNorm2d)
        model = MaskRCNN(_resnet_fpn_extractor(body, 3), num_classes=num_classes, min_size=min_size, max_size=max_size)
        overwrite_eps(model, 0.0)
    elif version == 2 and depth == 50:
        model = maskrcnn_resnet50_fpn_v2(weights=None, weights_backbone=None, min_size=min_size, max_size=max_size,
                                         num_classes=num_classes)
    else:
        raise ValueError(f"torchvision reference: no v{version} model of depth {depth}")
    return model.eval()


def build_tv(version: int, min_size: int, max_size: int, seed: int = 0, depth: int = 50,
             num_classes: int = 91) -> nn.Module:
    """torchvision's own Mask R-CNN (``tv_skeleton``) with randomized norms and sharpened heads.

    Every batch norm gets non-trivial weight/bias and running statistics calibrated on its own
    input (then perturbed); the last norm of each residual branch gets a small gamma, as in a
    trained ResNet; class logits are scaled so that more than 100 detections per image pass the
    0.05 threshold with spread-out scores (the 100-detection cap is reached at short sides 160
    to 800); mask logits so that masks are mixed.
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = tv_skeleton(version, min_size, max_size, depth, num_classes)
    randomize_affine(model, gen)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name.endswith(".bn3") or name.endswith(".downsample.1"):
                mod.weight.mul_(0.3)
        p = model.roi_heads.box_predictor
        p.cls_score.weight.mul_(3.0)
        p.cls_score.bias.copy_(torch.randn(num_classes, generator=gen))
        model.roi_heads.mask_predictor.mask_fcn_logits.weight.mul_(8.0)
    calib = [to_tv_input(structured_image(256, 256, seed=100 + seed))]
    calibrate_norm_stats(model, lambda: model(calib), gen)
    return model.eval()


def tv_init_state(version: int = 1, seed: int = 0, class_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The state dict of torchvision's ``maskrcnn_resnet50_fpn`` (v1) or ``_v2`` as its builder
    initializes it (no pretrained weights) after ``torch.manual_seed(seed)``: a quick checkpoint in
    the current key layout. ``class_scale`` multiplies the class-logit weights (30: confident
    classes, so that detections pass the 0.05 score threshold and there are detections to check).
    """
    build = {1: maskrcnn_resnet50_fpn, 2: maskrcnn_resnet50_fpn_v2}[version]
    torch.manual_seed(seed)
    model = build(weights=None, weights_backbone=None)
    if class_scale != 1.0:
        with torch.no_grad():
            model.roi_heads.box_predictor.cls_score.weight.mul_(class_scale)
    return model.state_dict()


def legacy_v1_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The key layout of the published COCO_V1 file (pre-``_version = 2`` modules)."""
    out = {}
    for k, v in sd.items():
        k = re.sub(r"^(backbone\.fpn\.(?:inner|layer)_blocks\.\d)\.0\.", r"\1.", k)
        k = re.sub(r"^rpn\.head\.conv\.0\.0\.", "rpn.head.conv.", k)
        k = re.sub(r"^roi_heads\.mask_head\.(\d)\.0\.", lambda m: f"roi_heads.mask_head.mask_fcn{int(m[1]) + 1}.", k)
        out[k] = v
    return out


def binarize_masks(outs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """torchvision's pasted mask probabilities (D, 1, H, W) -> (D, H, W) bool, thresholded at 0.5 as
    minidet thresholds them; in place, returns ``outs``."""
    for o in outs:
        o["masks"] = o["masks"][:, 0] > 0.5
    return outs


def run_tv(model: nn.Module, imgs_bgr: list[np.ndarray]) -> list[dict[str, torch.Tensor]]:
    """torchvision's detections on HxWx3 uint8 BGR images, masks binarized (``binarize_masks``)."""
    with torch.inference_mode():
        return binarize_masks(model([to_tv_input(im) for im in imgs_bgr]))


# minidet's stage names, in the order torchvision's forward reaches them


class TorchvisionStages:
    """Calls torchvision's Mask R-CNN and splits the call into minidet's stages and steps.

    ``stages(images)`` runs torchvision's own, unmodified ``GeneralizedRCNN.forward`` (under
    ``torch.inference_mode``) on a list of (3, H, W) float RGB tensors in [0, 1] and returns its
    detections, ``{stage: seconds}`` for minidet's stages (``minidet.timing.STAGES``, adding up to the wall
    time of the call) and ``{step: seconds}`` for the steps minidet times inside its stages
    (``minidet.timing.DETAILS``; they lie inside stages and do not add to the wall time). Forward
    hooks take a time stamp (after ``torch.cuda.synchronize`` on CUDA) where each stage ends;
    which submodule call bounds which stage and step is set out in docs/exactness.md
    ("torchvision's stage boundaries"). ``remove()`` takes the hooks off the model.
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
        for name in STAGES:
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
