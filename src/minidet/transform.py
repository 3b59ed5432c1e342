"""Pre- and post-processing around the network (torchvision's ``GeneralizedRCNNTransform``). Each weight
family's algorithms are plain functions: resizers ``(transform, image) -> ((3, h, w) float32 normalized,
scale)``; rescalers ``(Detections, resized size, original size) -> Detections`` of boxes in the resized
frame; pasters ``(probs (D, M, M), boxes (D, 4), height, width, threshold) -> (D, H, W) bool``."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .boxes import clip_boxes
from .heads.detections import FIELDS
from .masks import BoxMasks


class ImageBatch(NamedTuple):
    """A padded batch: ``tensor`` (N, 3, H, W), per image the resized (unpadded) ``sizes`` and
    ``orig_sizes`` as (h, w), and the resize factors ``scales``. ``part(slice)`` is a chunk."""

    tensor: torch.Tensor
    sizes: list[tuple[int, int]]
    orig_sizes: list[tuple[int, int]]
    scales: list[float]

    def part(self, s: slice) -> ImageBatch:
        return ImageBatch(self.tensor[s], self.sizes[s], self.orig_sizes[s], self.scales[s])


def resize_torch(tf: Transform, img) -> tuple[torch.Tensor, float]:
    """torchvision: normalize on the device, then bilinear resize (output size floored). One channels-last
    float image, normalized in place: the CPU kernels' values do not depend on the memory layout."""
    t = (torch.as_tensor(np.ascontiguousarray(img)) if isinstance(img, np.ndarray) else img).to(tf.device)
    h, w = t.shape[:2]
    x = torch.empty((h, w, 3), dtype=torch.float32, device=tf.device)
    for c in range(3):
        x[:, :, c] = t[:, :, 2 - c if tf.flip_channels else c]
    if tf.pixel_range != 255.0:
        x.div_(255.0 / tf.pixel_range)
    x.sub_(tf.pixel_mean.view(3)).div_(tf.pixel_std.view(3))
    x = x.permute(2, 0, 1)[None]
    x = x.contiguous() if x.is_cuda else x
    scale = min(tf.min_size / min(h, w), tf.max_size / max(h, w))
    x = F.interpolate(x, scale_factor=scale, mode="bilinear", recompute_scale_factor=True, align_corners=False)
    return x[0], scale


def resize_cv2(tf: Transform, img) -> tuple[torch.Tensor, float]:
    """Detectron: subtract the mean from the float image (normalized in place), then cv2 INTER_LINEAR (size rounded)."""
    import cv2

    a = img.cpu().numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
    if tf.flip_channels:
        a = a[:, :, ::-1]
    x = a.astype(np.float32, order="C")
    if tf.pixel_range != 255.0:
        x /= np.float32(255.0 / tf.pixel_range)
    x -= tf.pixel_mean.view(-1).cpu().numpy()
    std = tf.pixel_std.view(-1).cpu().numpy()
    if np.any(std != 1):
        x /= std
    h, w = a.shape[:2]
    scale = float(tf.min_size) / float(min(h, w))
    if np.round(scale * max(h, w)) > tf.max_size:
        scale = float(tf.max_size) / float(max(h, w))
    x = cv2.resize(x, None, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)
    return torch.from_numpy(x).permute(2, 0, 1).to(tf.device), scale


def _resize_planes(tf: Transform, img, newh: int, neww: int) -> tuple[torch.Tensor, float]:
    """PIL bilinear resize of the uint8 image to (newh, neww), then normalize; the scale is newh / h. One channel
    at a time as 8-bit grayscale: the same integer arithmetic as an RGB resize, without its copy."""
    from PIL import Image

    a = img.cpu().numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
    planes = [Image.fromarray(np.ascontiguousarray(a[:, :, 2 - c if tf.flip_channels else c])) for c in range(3)]
    planes = [np.asarray(p.resize((neww, newh), Image.BILINEAR)) for p in planes]
    x = torch.as_tensor(np.stack(planes).astype("float32")).to(tf.device)
    if tf.pixel_range != 255.0:
        x = x / (255.0 / tf.pixel_range)
    return (x - tf.pixel_mean) / tf.pixel_std, newh / a.shape[0]


def resize_pil(tf: Transform, img) -> tuple[torch.Tensor, float]:
    """detectron2: PIL bilinear resize of the uint8 image (size rounded half up), then normalize."""
    h, w = img.shape[:2]
    size = tf.min_size * 1.0
    scale = size / min(h, w)
    newh, neww = (size, scale * w) if h < w else (scale * h, size)
    if max(newh, neww) > tf.max_size:
        scale = tf.max_size * 1.0 / max(newh, neww)
        newh, neww = newh * scale, neww * scale
    return _resize_planes(tf, img, int(newh + 0.5), int(neww + 0.5))


def mmcv_size(h: int, w: int, min_size: int, max_size: int) -> tuple[int, int]:
    """mmcv's ``rescale_size`` for ``Resize(scale=(max_size, min_size), keep_ratio=True)`` (mmdetection's test
    pipeline): factor min(long edge cap / long side, short edge / short side), each side ``int(side * f + 0.5)``."""
    f = min(max(min_size, max_size) / max(h, w), min(min_size, max_size) / min(h, w))
    return int(h * f + 0.5), int(w * f + 0.5)


def resize_mmdet(tf: Transform, img) -> tuple[torch.Tensor, float]:
    """mmdetection: cv2 INTER_LINEAR resize of the uint8 image to ``mmcv_size``, then (its ``DetDataPreprocessor``)
    the channels flipped, float, ``(x - mean) / std``."""
    import cv2

    a = img.cpu().numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
    newh, neww = mmcv_size(*a.shape[:2], tf.min_size, tf.max_size)
    r = cv2.resize(np.ascontiguousarray(a), (neww, newh), interpolation=cv2.INTER_LINEAR)
    x = torch.from_numpy(np.ascontiguousarray(r.transpose(2, 0, 1))).to(tf.device)
    x = (x[[2, 1, 0]] if tf.flip_channels else x).float()
    if tf.pixel_range != 255.0:
        x = x / (255.0 / tf.pixel_range)
    return (x - tf.pixel_mean) / tf.pixel_std, newh / a.shape[0]


def mb_size(h: int, w: int, min_size: int, max_size: int) -> tuple[int, int]:
    """maskrcnn-benchmark's ``Resize.get_size``: the short side ``min_size`` unless the long side would
    pass ``max_size`` (then the short side is ``round`` half-to-even), the long side truncated."""
    size, short, long = min_size, float(min(w, h)), float(max(w, h))
    if long / short * size > max_size:
        size = int(round(max_size * short / long))
    if (w <= h and w == size) or (h <= w and h == size):
        return h, w
    return (int(size * h / w), size) if w < h else (size, int(size * w / h))


def resize_pil_mb(tf: Transform, img) -> tuple[torch.Tensor, float]:
    """maskrcnn-benchmark: PIL bilinear resize of the uint8 image to ``mb_size``, then normalize (its
    ToTensor's /255 and TO_BGR255's *255 give back every uint8 value exactly)."""
    return _resize_planes(tf, img, *mb_size(*img.shape[:2], tf.min_size, tf.max_size))


def rescale_per_axis(det, size: tuple[int, int], orig: tuple[int, int]):
    """torchvision: boxes times (original / resized) per axis, as float32 tensor ratios."""
    rh, rw = (torch.tensor(o, dtype=torch.float32) / torch.tensor(s, dtype=torch.float32) for o, s in zip(orig, size))
    return det._replace(boxes=det.boxes * torch.stack((rw, rh, rw, rh)).to(det.boxes.device), frame="original")


def rescale_divide(det, size: tuple[int, int], orig: tuple[int, int]):
    """mmdetection: boxes divided per axis by the resize factors (resized / original, as mmcv's ``Resize`` records
    them) as float32; nothing clipped, empty boxes kept."""
    (h, w), (oh, ow) = size, orig
    factor = torch.tensor([w / ow, h / oh], dtype=torch.float32).repeat(2).to(det.boxes.device)
    return det._replace(boxes=det.boxes / factor, frame="original")


def rescale_clip_nonempty(det, size: tuple[int, int], orig: tuple[int, int]):
    """detectron2: scale by output / input size per axis, clip to the image, drop empty boxes."""
    (h, w), (oh, ow) = size, orig
    boxes = det.boxes.clone()
    boxes[:, 0::2] *= ow / w
    boxes[:, 1::2] *= oh / h
    boxes = clip_boxes(boxes, oh, ow)
    keep = ((boxes[:, 2] - boxes[:, 0]) > 0) & ((boxes[:, 3] - boxes[:, 1]) > 0)
    return det._replace(boxes=boxes, frame="original").select(keep)


def paste_masks(
    masks: torch.Tensor, boxes: torch.Tensor, height: int, width: int, threshold: float = 0.5
) -> BoxMasks:
    """torchvision/Detectron: (N, M, M) mask probabilities -> N bool masks of the height x width frame, each kept as
    the crop of the pixels around its box (``BoxMasks``). The mask is padded by one pixel, the box expanded by
    (M + 2) / M about its centre and truncated to integers, the padded mask resized bilinearly (align_corners=False)
    to the box's (x2 - x1 + 1, y2 - y1 + 1) size and binarized with ``> threshold``."""
    m = masks.shape[-1]
    padded = F.pad(masks, (1, 1, 1, 1))
    scale = float(m + 2) / m
    w_half, h_half = (boxes[:, 2] - boxes[:, 0]) * 0.5 * scale, (boxes[:, 3] - boxes[:, 1]) * 0.5 * scale
    x_c, y_c = (boxes[:, 2] + boxes[:, 0]) * 0.5, (boxes[:, 3] + boxes[:, 1]) * 0.5
    ib = torch.stack((x_c - w_half, y_c - h_half, x_c + w_half, y_c + h_half), dim=1).to(torch.int64).tolist()
    crops, origins = [], []
    for i, (x0, y0, x1, y1) in enumerate(ib):
        w, h = max(x1 - x0 + 1, 1), max(y1 - y0 + 1, 1)
        xa, xb = max(x0, 0), min(x1 + 1, width)
        ya, yb = max(y0, 0), min(y1 + 1, height)
        if xa >= xb or ya >= yb:
            crops.append(masks.new_zeros((0, 0), dtype=torch.bool))
            origins.append((0, 0))
            continue
        res = F.interpolate(padded[i][None, None], size=(h, w), mode="bilinear", align_corners=False)[0, 0]
        crops.append(res[ya - y0 : yb - y0, xa - x0 : xb - x0] > threshold)
        origins.append((xa, ya))
    return BoxMasks(crops, origins, (height, width))


def paste_masks_aligned(
    masks: torch.Tensor, boxes: torch.Tensor, height: int, width: int, threshold: float = 0.5
) -> BoxMasks:
    """detectron2: each (M, M) mask sampled at the pixel centres in its box (pixel (x + 0.5, y + 0.5) maps to [-1, 1]
    across the float box) with ``grid_sample`` (bilinear, zeros outside, align_corners=False); ``>= threshold``."""
    return _grid_sample_paste(masks, boxes, height, width, threshold, inf_to_centre=False)


def paste_masks_mmdet(
    masks: torch.Tensor, boxes: torch.Tensor, height: int, width: int, threshold: float = 0.5
) -> BoxMasks:
    """mmdetection: detectron2's paste, but an infinite grid coordinate (a box without width or height, which
    mmdetection keeps) becomes 0, the mask's centre: such a box gets the mask's middle column or row."""
    return _grid_sample_paste(masks, boxes, height, width, threshold, inf_to_centre=True)


def _grid_sample_paste(masks, boxes, height: int, width: int, threshold: float, inf_to_centre: bool) -> BoxMasks:
    """The grid-sample paste of ``paste_masks_aligned``, one box at a time over the pixels around it (each mask's
    crop); with ``inf_to_centre`` an infinite grid coordinate is set to 0 (NaN, from 0 / 0, stays)."""
    crops, origins = [], []
    for i in range(masks.shape[0]):
        box = boxes[i : i + 1]
        x0i, y0i = torch.clamp(box.min(dim=0).values.floor()[:2] - 1, min=0).to(torch.int32).tolist()
        x1i = int(torch.clamp(box[:, 2].max().ceil() + 1, max=width).to(torch.int32))
        y1i = int(torch.clamp(box[:, 3].max().ceil() + 1, max=height).to(torch.int32))
        if x1i <= x0i or y1i <= y0i:
            crops.append(masks.new_zeros((0, 0), dtype=torch.bool))
            origins.append((0, 0))
            continue
        x0, y0, x1, y1 = torch.split(box, 1, dim=1)
        img_y = (torch.arange(y0i, y1i, device=masks.device, dtype=torch.float32) + 0.5 - y0) / (y1 - y0) * 2 - 1
        img_x = (torch.arange(x0i, x1i, device=masks.device, dtype=torch.float32) + 0.5 - x0) / (x1 - x0) * 2 - 1
        if inf_to_centre:
            img_x, img_y = (torch.where(torch.isinf(t), torch.zeros_like(t), t) for t in (img_x, img_y))
        shape = (1, img_y.size(1), img_x.size(1))
        grid = torch.stack([img_x[:, None, :].expand(shape), img_y[:, :, None].expand(shape)], dim=3)
        sampled = F.grid_sample(masks[i : i + 1, None].float(), grid, align_corners=False)
        crops.append(sampled[0, 0] >= threshold)
        origins.append((x0i, y0i))
    return BoxMasks(crops, origins, (height, width))


class Transform(nn.Module):
    """``preprocess``: resize to short side ``min_size``, long side <= ``max_size``, normalize, pad to
    ``size_divisibility``; ``postprocess``: boxes to original-image pixels, masks pasted and binarized at
    ``mask_threshold``. ``pixel_mean``/``pixel_std``: in the network's channel order and ``pixel_range``'s scale;
    ``flip_channels``: the input's channel order (BGR) is not the network's. ``resize``, ``rescale``, ``paste``: the
    weight family's (see the module docstring)."""

    def __init__(
        self, resize: Callable, min_size: int, max_size: int, size_divisibility: int, pixel_mean: list[float],
        pixel_std: list[float], pixel_range: float = 255.0, flip_channels: bool = False,
        rescale: Callable = rescale_per_axis, paste: Callable = paste_masks, mask_threshold: float = 0.5,
    ) -> None:
        super().__init__()
        self.resize, self.rescale, self.paste = resize, rescale, paste
        self.min_size, self.max_size, self.size_divisibility = min_size, max_size, size_divisibility
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32).view(-1, 1, 1), False)
        self.pixel_range, self.flip_channels, self.mask_threshold = pixel_range, flip_channels, mask_threshold

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    def check_size(self, height: int, width: int) -> None:
        """ValueError (one line) when an image of this size cannot be resized: empty, or so elongated that its short
        side would be under one pixel once its long side is at most ``max_size``."""
        if height == 0 or width == 0:
            raise ValueError(f"empty ({width} x {height} pixels)")
        short, long = min(height, width), max(height, width)
        if short * min(self.min_size / short, self.max_size / long) < 1:
            raise ValueError(f"{width} x {height} is too elongated: with its long side resized to at most "
                             f"INPUT.MAX_SIZE_TEST {self.max_size}, its short side would be under one pixel")

    def preprocess(self, images: list) -> ImageBatch:
        """HxWx3 uint8 arrays (or tensors) in the input's channel order -> the padded batch."""
        resized = [self.resize(self, img) for img in images]  # (image, scale) pairs
        sizes = [(x.shape[-2], x.shape[-1]) for x, _ in resized]
        d = self.size_divisibility
        ph, pw = (int(-(-max(s[k] for s in sizes) // d) * d) for k in (0, 1))
        batch = resized[0][0].new_zeros((len(resized), 3, ph, pw))
        for i, (x, _) in enumerate(resized):
            batch[i, :, : x.shape[1], : x.shape[2]].copy_(x)
        orig_sizes = [(int(im.shape[0]), int(im.shape[1])) for im in images]
        return ImageBatch(batch, sizes, orig_sizes, [scale for _, scale in resized])

    def postprocess(self, dets: list, images: ImageBatch) -> list[dict[str, torch.Tensor]]:
        """Per image ``Detections`` -> a dict of ``boxes`` (D, 4) in original-image pixels, ``scores``,
        ``labels`` and each field the detections carry (``heads.detections.FIELDS``): as it is, or, where ``pasted``
        (the mask probabilities), pasted (``BoxMasks``: D bool masks of the H x W frame, each kept as its box's
        crop), after the others."""
        results = []
        for det, size, (oh, ow) in zip(dets, images.sizes, images.orig_sizes):
            if det.frame == "resized":
                det = self.rescale(det, size, (oh, ow))
            r = {"boxes": det.boxes, "scores": det.scores, "labels": det.labels}
            fields = det.fields()
            r.update((f.name, fields[f.name]) for f in FIELDS if f.name in fields and not f.pasted)
            r.update((f.name, self.paste(fields[f.name], det.boxes, oh, ow, self.mask_threshold))
                     for f in FIELDS if f.name in fields and f.pasted)
            results.append(r)
        return results
