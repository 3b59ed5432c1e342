"""Realistic random weights and structured images, for tests and weight-free benchmarks.

Nothing here is used when running a real checkpoint. Random conv weights with
mean-0 / var-1 batch-norm statistics would hide a wrong norm implementation, so
``calibrate_norm_stats`` gives every frozen batch norm the statistics of its own
input (then perturbs them), which keeps activations sane and the stats non-trivial.
``random_minidet_weights`` saves such weights for any minidet architecture (the benchmark's
GroupNorm and no-norm models, and configs torchvision cannot build); ``strip_norms`` turns a
model into one without norm layers (the benchmark's ``none``).
"""

from __future__ import annotations

import numpy as np
import torch
from pycocotools import mask as mask_utils
from torch import nn

import minidet
from minidet.layers import Conv2d
from minidet.norm import FrozenBN


def _is_bn(m: nn.Module) -> bool:
    return all(hasattr(m, a) for a in ("weight", "bias", "running_mean", "running_var")) and not isinstance(
        m, nn.GroupNorm
    )


@torch.no_grad()
def randomize_affine(model: nn.Module, gen: torch.Generator) -> None:
    """Non-trivial weight/bias on every batch norm, GroupNorm and LayerNorm (a GC block's) of ``model``."""
    for m in model.modules():
        if _is_bn(m) or isinstance(m, (nn.GroupNorm, nn.LayerNorm)):
            shape = m.weight.shape  # (C,); a GC block's LayerNorm: (C, 1, 1)
            m.weight.copy_(torch.rand(shape, generator=gen) * 1.0 + 0.5)
            m.bias.copy_(torch.randn(shape, generator=gen) * 0.2)


@torch.no_grad()
def calibrate_norm_stats(model: nn.Module, run, gen: torch.Generator, jitter: float = 0.1) -> None:
    """Set each batch norm's running stats to the stats of its actual input, perturbed.

    ``run()`` must execute one eval-mode forward of ``model``. A forward pre-hook
    on every batch-norm-like module (torchvision ``FrozenBatchNorm2d``, ``BatchNorm2d``,
    minidet's ``FrozenBN``) measures the per-channel mean/var of its input, writes them
    (mean shifted by ``jitter``·std noise, var scaled by a factor in [0.7, 1.4]) into the
    buffers, and removes itself, so later layers see calibrated activations.
    """
    handles = []

    def hook(mod, args):
        x = args[0]
        dims = [d for d in range(x.dim()) if d != 1]
        mean = x.mean(dim=dims)
        var = x.var(dim=dims, unbiased=False).clamp(min=1e-2)
        c = mean.shape[0]
        mod.running_mean.copy_(mean + jitter * var.sqrt() * torch.randn(c, generator=gen))
        mod.running_var.copy_(var * (0.7 + 0.7 * torch.rand(c, generator=gen)))
        handles[ids[id(mod)]].remove()

    ids = {}
    for m in model.modules():
        if _is_bn(m):
            ids[id(m)] = len(handles)
            handles.append(m.register_forward_pre_hook(hook))
    was_training = model.training
    model.eval()
    run()
    model.train(was_training)
    for h in handles:  # modules never reached keep their stats
        h.remove()


def structured_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """An HxWx3 uint8 BGR image with gradients, rectangles, ellipses and noise."""
    import cv2

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.stack(
        [127 + 100 * np.sin(xx / (13 + 7 * c) + c) * np.cos(yy / (17 + 5 * c)) for c in range(3)],
        axis=-1,
    )
    img = np.clip(img, 0, 255).astype(np.uint8)
    for _ in range(12):
        color = tuple(int(v) for v in rng.integers(0, 256, 3))
        x1, y1 = int(rng.integers(0, width)), int(rng.integers(0, height))
        w = int(rng.integers(width // 12, width // 3 + 2))
        h = int(rng.integers(height // 12, height // 3 + 2))
        if rng.random() < 0.5:
            cv2.rectangle(img, (x1, y1), (x1 + w, y1 + h), color, -1)
        else:
            cv2.ellipse(img, (x1, y1), (w // 2, h // 2), float(rng.uniform(0, 180)), 0, 360, color, -1)
    noise = rng.normal(0, 6, img.shape)
    return np.clip(img.astype(np.float32) + noise, 0, 255).astype(np.uint8)


@torch.no_grad()
def strip_norms(model: torch.nn.Module) -> int:
    """Remove the norm of every conv (the benchmark's ``none`` variant); returns the count.

    minidet's config admits only FrozenBN, Affine and GN, so the ``none`` variant is built as a
    FrozenBN model and stripped here. Without a norm minidet builds the ResNet's convs without a
    bias and those of the FPN and heads with one; so does this (a zero bias where a norm goes).
    """
    n = 0
    for name, m in model.named_modules():
        if isinstance(m, Conv2d) and m.norm is not None:
            m.norm = None
            if m.bias is None and not name.startswith("backbone."):
                m.bias = torch.nn.Parameter(m.weight.new_zeros(m.out_channels), requires_grad=False)
            n += 1
    return n


@torch.no_grad()
def _calibrate_scales(model: torch.nn.Module, run) -> None:
    """Turn every FrozenBN into a pure per-channel scale by the root mean square of its input.

    ``run()`` executes one forward; each layer is set when the forward reaches it, so later layers
    see calibrated activations. Mean and shift are zero: folded into its conv, the scale leaves a
    conv without bias, as a model without norm layers has.
    """

    def hook(mod, args):
        x = args[0]
        mod.running_mean.zero_()
        mod.bias.zero_()
        mod.running_var.copy_(x.pow(2).mean(dim=[d for d in range(x.dim()) if d != 1]).clamp(min=1e-2))

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, FrozenBN)]
    model.eval()
    run()
    for h in handles:
        h.remove()


IOU_MEAN, IOU_STD = 0.7, 0.1  # a mask IoU head's predicted IoUs on the synthetic weights


@torch.no_grad()
def _calibrate_iou(layer: nn.Linear, x: torch.Tensor) -> None:
    """Scale and shift the mask IoU head's last layer so that on its inputs ``x`` (R, D) each class's predicted IoU
    has mean ``IOU_MEAN`` and the row's spread about ``IOU_STD``."""
    out = x @ layer.weight.T
    layer.weight.mul_(IOU_STD / out.std(dim=1).mean().clamp(min=1e-12))
    layer.bias.copy_(IOU_MEAN - (x @ layer.weight.T).mean(dim=0))


@torch.no_grad()
def random_minidet_weights(cfg, calib_image: np.ndarray, path: str, logit_std: float = 2.0, *,
                           without_norms: bool = False) -> None:
    """Save a minidet state dict of ``cfg``'s architecture with realistic random weights.

    Frozen batch norms (GN is left as randomized) take the statistics of their own input on
    ``calib_image``; in the same forward the class logits are measured and ``cls_score`` (each cascade stage's) is
    rescaled so that, per proposal, they spread with standard deviation ``logit_std`` over the
    classes (a trained model's confidence: about 100 detections per image), and a mask IoU head's (Mask Scoring
    R-CNN) predicted IoUs are set, in one more forward, to spread around ``IOU_MEAN`` with standard deviation
    ``IOU_STD`` (``_calibrate_iou``: the rescored scores keep a trained model's order of magnitude). With
    ``without_norms`` (no norm layers, which no config describes: the benchmark's ``none``), each frozen norm is
    calibrated as a pure scale (``_calibrate_scales``), multiplied into its conv and removed (``strip_norms``): the
    activations keep a sane range.
    """
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    base = cfg.clone()
    base.defrost()  # a loaded config is frozen
    base.merge_from_list(["MODEL.FOLD_NORM", False, "MODEL.DEVICE", "cpu"])
    if cfg.MODEL.NORM != "GN":  # calibrate as FrozenBN; minidet loads it into any frozen norm
        base.merge_from_list(["MODEL.NORM", "FrozenBN"])
    model = minidet.build_model(base)
    randomize_affine(model, gen)
    predictors = [model.box_predictor] if model.cascade is None else list(model.cascade.predictors)
    feats: dict[int, list] = {i: [] for i in range(len(predictors))}  # per (cascade stage's) predictor: its input
    hooks = [p.register_forward_pre_hook(lambda mod, args, i=i: feats[i].append(args[0]))
             for i, p in enumerate(predictors)]
    if without_norms:
        _calibrate_scales(model, lambda: model([calib_image]))
        for m in model.modules():
            if isinstance(m, Conv2d) and isinstance(m.norm, FrozenBN):
                m.weight.mul_(m.norm.scale_shift()[0].view(-1, 1, 1, 1))
        strip_norms(model)
    else:
        calibrate_norm_stats(model, lambda: model([calib_image]), gen)
    for hook in hooks:
        hook.remove()
    for i, p in enumerate(predictors):
        p.cls_score.weight.mul_(logit_std / (feats[i][0] @ p.cls_score.weight.T).std(dim=1).mean())
    iou_head = getattr(model, "mask_iou_head", None)
    if iou_head is not None:  # on the detections of the calibrated model: one more forward
        iou_in: list[torch.Tensor] = []
        hook = iou_head.iou.register_forward_pre_hook(lambda mod, args: iou_in.append(args[0]))
        model.eval()
        model([calib_image])
        hook.remove()
        if iou_in and len(iou_in[0]) > 1:
            _calibrate_iou(iou_head.iou, iou_in[0])
    torch.save(model.state_dict(), path)


def _ellipse(cx: float, cy: float, rx: float, ry: float, points: int = 12) -> list[float]:
    t = np.linspace(0, 2 * np.pi, points, endpoint=False)
    return np.stack([cx + rx * np.cos(t), cy + ry * np.sin(t)], 1).ravel().round(2).tolist()


def _rect_counts(h: int, w: int, x1: int, y1: int, x2: int, y2: int) -> list[int]:
    """Uncompressed (column-major) RLE counts of the rectangle [x1, x2) x [y1, y2) of an h x w image, as COCO's crowd
    regions are stored."""
    counts, zeros = [], x1 * h + y1
    for _ in range(x1, x2):
        counts += [zeros, y2 - y1]
        zeros = h - (y2 - y1)
    counts.append(h * w - sum(counts))
    return counts


def dense_coco_set(images: int = 5000, per_image: int = 100, seed: int = 0, height: int = 480, width: int = 640,
                   categories: int = 80) -> tuple[dict, list[dict]]:
    """A COCO annotation file and results at Mask R-CNN density, for scoring benchmarks and tests: ``images`` of
    ``height`` x ``width`` with 0 to 14 polygon objects each (7 on average, as COCO's val2017; every tenth image also
    a crowd region as uncompressed RLE, every twentieth image none at all) of ``categories`` classes, and
    ``per_image`` detections per image (boxes and compressed RLE masks): about a third near an object (jittered,
    sometimes of another class), the rest anywhere, with random scores. Returns ``(annotations, results)``."""
    rng = np.random.default_rng(seed)
    cats = [{"id": k + 1, "name": f"class_{k + 1}", "supercategory": "thing"} for k in range(categories)]
    imgs, anns, results = [], [], []

    def blob(cx, cy, rx, ry):
        poly = _ellipse(cx, cy, rx, ry)
        rle = mask_utils.frPyObjects([poly], height, width)[0]
        return poly, rle

    for i in range(1, images + 1):
        imgs.append({"id": i, "file_name": f"{i:06d}.jpg", "height": height, "width": width})
        objects = [] if i % 20 == 0 else list(range(int(rng.integers(0, 15))))
        placed = []
        for _ in objects:
            rx, ry = rng.uniform(4, width / 4), rng.uniform(4, height / 4)
            cx, cy = rng.uniform(rx, width - rx), rng.uniform(ry, height - ry)
            poly, rle = blob(cx, cy, rx, ry)
            cat = int(rng.integers(1, categories + 1))
            x, y, w, h = (float(v) for v in mask_utils.toBbox(rle))
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": cat, "iscrowd": 0,
                         "area": float(mask_utils.area(rle)), "bbox": [x, y, w, h], "segmentation": [poly]})
            placed.append((cx, cy, rx, ry, cat))
        if i % 10 == 0:
            x1, y1 = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
            x2, y2 = x1 + int(rng.integers(8, width // 2)), y1 + int(rng.integers(8, height // 2))
            counts = _rect_counts(height, width, x1, y1, x2, y2)
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": int(rng.integers(1, categories + 1)),
                         "iscrowd": 1, "area": float((x2 - x1) * (y2 - y1)), "bbox": [x1, y1, x2 - x1, y2 - y1],
                         "segmentation": {"size": [height, width], "counts": counts}})
        shapes = []
        for k in range(per_image):
            if placed and k < per_image // 3:
                cx, cy, rx, ry, cat = placed[k % len(placed)]
                j = rng.uniform(0.7, 1.3, 4)
                cx, cy = cx + (j[0] - 1) * rx, cy + (j[1] - 1) * ry
                rx, ry = rx * j[2], ry * j[3]
                if rng.uniform() < 0.2:
                    cat = int(rng.integers(1, categories + 1))
            else:
                rx, ry = rng.uniform(2, width / 4), rng.uniform(2, height / 4)
                cx, cy, cat = rng.uniform(0, width), rng.uniform(0, height), int(rng.integers(1, categories + 1))
            shapes.append((_ellipse(cx, cy, rx, ry), cat))
        rles = mask_utils.frPyObjects([p for p, _ in shapes], height, width)
        boxes = mask_utils.toBbox(rles)
        scores = np.sort(rng.uniform(0.05, 1.0, per_image))[::-1]
        for (_, cat), rle, box, score in zip(shapes, rles, boxes, scores):
            results.append({"image_id": i, "category_id": cat, "bbox": [round(float(v), 2) for v in box],
                            "score": round(float(score), 5),
                            "segmentation": {"size": [height, width], "counts": rle["counts"].decode("ascii")}})
    return {"images": imgs, "annotations": anns, "categories": cats}, results
