"""Reference torchvision Mask R-CNN models with realistic random weights, for parity tests."""

from __future__ import annotations

import re

import numpy as np
import torch
from torchvision.models.detection import MaskRCNN, maskrcnn_resnet50_fpn_v2
from torchvision.models.detection._utils import overwrite_eps
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.models.resnet import resnet50
from torchvision.ops.misc import FrozenBatchNorm2d

from minidet.synthetic import calibrate_norm_stats, randomize_affine, structured_image

# the three test images: (height, width) of different sizes and aspect ratios
IMAGE_SHAPES = [(240, 320), (300, 200), (180, 420)]


def images_bgr(shapes=IMAGE_SHAPES, seed: int = 0) -> list[np.ndarray]:
    return [structured_image(h, w, seed + i) for i, (h, w) in enumerate(shapes)]


def to_tv_input(img_bgr: np.ndarray) -> torch.Tensor:
    """What a torchvision user feeds: RGB float in [0, 1], CHW."""
    return torch.from_numpy(np.ascontiguousarray(img_bgr[:, :, ::-1])).permute(2, 0, 1).float() / 255


def build_tv(version: int, min_size: int, max_size: int, seed: int = 0) -> torch.nn.Module:
    """torchvision's own Mask R-CNN with randomized norms and sharpened heads.

    v1 is built as torchvision builds it for its COCO_V1 weights: FrozenBatchNorm2d, then
    ``overwrite_eps(model, 0.0)``. Every batch norm gets non-trivial weight/bias and running
    statistics calibrated on its own input (then perturbed); class logits are scaled so many
    detections pass the 0.05 threshold with spread-out scores; mask logits so masks are mixed.
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if version == 1:
        backbone = _resnet_fpn_extractor(resnet50(weights=None, norm_layer=FrozenBatchNorm2d), 3)
        model = MaskRCNN(backbone, num_classes=91, min_size=min_size, max_size=max_size)
        overwrite_eps(model, 0.0)
    else:
        model = maskrcnn_resnet50_fpn_v2(weights=None, weights_backbone=None, min_size=min_size, max_size=max_size)
    model.eval()
    randomize_affine(model, gen)
    with torch.no_grad():  # trained ResNets end each residual branch with a small-gamma norm
        for name, mod in model.named_modules():
            if name.endswith(".bn3") or name.endswith(".downsample.1"):
                mod.weight.mul_(0.3)
    with torch.no_grad():
        p = model.roi_heads.box_predictor
        p.cls_score.weight.mul_(3.0)
        p.cls_score.bias.copy_(torch.randn(91, generator=gen))
        p.bbox_pred.weight.mul_(1.0)
        model.roi_heads.mask_predictor.mask_fcn_logits.weight.mul_(8.0)
    calib = [to_tv_input(im) for im in images_bgr([(256, 256)], seed=100 + seed)]
    calibrate_norm_stats(model, lambda: model(calib), gen)
    return model.eval()


def legacy_v1_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The key layout of the published COCO_V1 file (pre-``_version = 2`` modules)."""
    out = {}
    for k, v in sd.items():
        k = re.sub(r"^(backbone\.fpn\.(?:inner|layer)_blocks\.\d)\.0\.", r"\1.", k)
        k = re.sub(r"^rpn\.head\.conv\.0\.0\.", "rpn.head.conv.", k)
        k = re.sub(r"^roi_heads\.mask_head\.(\d)\.0\.", lambda m: f"roi_heads.mask_head.mask_fcn{int(m[1]) + 1}.", k)
        out[k] = v
    return out


def run_tv(model, imgs_bgr: list[np.ndarray]) -> list[dict[str, torch.Tensor]]:
    with torch.inference_mode():
        outs = model([to_tv_input(im) for im in imgs_bgr])
    for o in outs:
        o["masks"] = o["masks"][:, 0] > 0.5
    return outs


def match_detections(ours: dict, ref: dict, box_tol: float = 1e-2, score_tol: float = 1e-4, iou_min: float = 0.99):
    """Assert same count; match each reference detection to one of ours (same label, closest box)."""
    n = len(ref["boxes"])
    assert len(ours["boxes"]) == n, f"{len(ours['boxes'])} detections vs torchvision {n}"
    used = set()
    worst_box = worst_score = 0.0
    worst_iou = 1.0
    for i in range(n):
        same = (ours["labels"] == ref["labels"][i]).nonzero().flatten().tolist()
        cand = [j for j in same if j not in used]
        assert cand, f"no unmatched detection with label {int(ref['labels'][i])}"
        d = [float((ours["boxes"][j] - ref["boxes"][i]).abs().max()) for j in cand]
        j = cand[int(np.argmin(d))]
        used.add(j)
        worst_box = max(worst_box, min(d))
        worst_score = max(worst_score, float((ours["scores"][j] - ref["scores"][i]).abs()))
        a, b = ours["masks"][j], ref["masks"][i]
        union = int((a | b).sum())
        iou = int((a & b).sum()) / union if union else 1.0
        worst_iou = min(worst_iou, iou)
    assert worst_box <= box_tol, f"box differs by {worst_box} px"
    assert worst_score <= score_tol, f"score differs by {worst_score}"
    assert worst_iou >= iou_min, f"mask IoU {worst_iou}"
    return worst_box, worst_score, worst_iou
