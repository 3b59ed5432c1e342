"""The Mask R-CNN detector: preprocessing, the stages, and ``build_model(cfg)``."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .boxes import clip_boxes, paste_masks, paste_masks_aligned
from .config import CfgNode, validate_cfg
from .fpn import FPN
from .norm import get_norm
from .resnet import ResNet
from .roi_heads import BoxHead, BoxPredictor, MaskHead, MultiScaleRoIAlign, box_postprocess, select_class_masks
from .rpn import RPN
from .timing import StageTimer


class MaskRCNN(nn.Module):
    """ResNet-FPN Mask R-CNN, inference only.

    ``forward(images)`` takes a list of HxWx3 uint8 arrays (or tensors) in ``input_format``
    channel order and returns one dict per image with ``boxes`` (D, 4) float32 xyxy in
    input pixels, ``scores`` (D,), ``labels`` (D,) int64 and, with a mask head,
    ``masks`` (D, H, W) bool. Stage times go to ``self.timer``.

    ``legacy=True`` runs Detectron's arithmetic around the same layers: cv2 resizing of the
    mean-subtracted image (output size rounded), and box decoding, clipping and NMS with
    +1 sizes in original-image coordinates (see ``RPN`` and ``box_postprocess``).
    """

    def __init__(
        self,
        backbone: ResNet,
        fpn: FPN,
        rpn: RPN,
        box_pooler: MultiScaleRoIAlign,
        box_head: BoxHead,
        box_predictor: BoxPredictor,
        mask_pooler: MultiScaleRoIAlign | None,
        mask_head: MaskHead | None,
        *,
        pixel_mean: list[float],
        pixel_std: list[float],
        pixel_range: float,
        input_format: str,
        network_format: str,
        min_size: int,
        max_size: int,
        size_divisibility: int,
        bbox_reg_weights: tuple[float, float, float, float],
        score_thresh: float,
        nms_thresh: float,
        detections_per_image: int,
        min_box_size: float,
        bg_last: bool = False,
        mask_threshold: float = 0.5,
        legacy: bool = False,
        amp_dtype: torch.dtype | None = None,
        convention: str = "",
        chunk_images: int = 0,
    ) -> None:
        super().__init__()
        self.backbone, self.fpn, self.rpn = backbone, fpn, rpn
        self.box_pooler, self.box_head, self.box_predictor = box_pooler, box_head, box_predictor
        self.mask_pooler, self.mask_head = mask_pooler, mask_head
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32).view(-1, 1, 1), False)
        self.pixel_range = pixel_range
        self.flip_channels = input_format != network_format
        self.min_size, self.max_size = min_size, max_size
        self.size_divisibility = size_divisibility
        self.bbox_reg_weights = tuple(bbox_reg_weights)
        self.score_thresh, self.nms_thresh = score_thresh, nms_thresh
        self.detections_per_image = detections_per_image
        self.min_box_size = min_box_size
        self.bg_last = bg_last
        self.mask_threshold = mask_threshold
        self.legacy = legacy
        self.d2 = convention == "detectron2"
        self.channels_last = False  # set by prepare_model with the weights in that layout
        self.amp_dtype: torch.dtype | None = amp_dtype
        self.chunk_images = chunk_images
        self.timer = StageTimer(enabled=False)

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    def _resize_torch(self, img) -> tuple[torch.Tensor, float]:
        """torchvision: normalize on the device, then bilinear resize (output size floored).

        The float image is made once, channels last, and normalized in place: 12 bytes per
        input pixel where three NCHW temporaries and the kernel's channels-last copy took about
        36. The values are the same: the CPU kernels do not depend on the input's memory layout
        (the CUDA kernel is given the NCHW layout it had).
        """
        t = torch.as_tensor(np.ascontiguousarray(img)) if isinstance(img, np.ndarray) else img
        t = t.to(self.device)
        h, w = t.shape[:2]
        x = torch.empty((h, w, 3), dtype=torch.float32, device=self.device)
        for c in range(3):
            x[:, :, c] = t[:, :, 2 - c if self.flip_channels else c]
        if self.pixel_range != 255.0:
            x.div_(255.0 / self.pixel_range)
        x.sub_(self.pixel_mean.view(3)).div_(self.pixel_std.view(3))
        x = x.permute(2, 0, 1)[None]
        if x.is_cuda:
            x = x.contiguous()
        scale = min(self.min_size / min(h, w), self.max_size / max(h, w))
        x = F.interpolate(x, scale_factor=scale, mode="bilinear", recompute_scale_factor=True, align_corners=False)
        return x[0], scale

    def _resize_cv2(self, img) -> tuple[torch.Tensor, float]:
        """Detectron: subtract the mean from the float image, then cv2 INTER_LINEAR (size rounded).

        One float copy of the image (12 bytes per pixel), normalized in place.
        """
        import cv2

        a = img.cpu().numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
        if self.flip_channels:
            a = a[:, :, ::-1]
        x = a.astype(np.float32, order="C")
        if self.pixel_range != 255.0:
            x /= np.float32(255.0 / self.pixel_range)
        x -= self.pixel_mean.view(-1).cpu().numpy()
        std = self.pixel_std.view(-1).cpu().numpy()
        if np.any(std != 1):
            x /= std
        h, w = a.shape[:2]
        scale = float(self.min_size) / float(min(h, w))
        if np.round(scale * max(h, w)) > self.max_size:
            scale = float(self.max_size) / float(max(h, w))
        x = cv2.resize(x, None, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)
        return torch.from_numpy(x).permute(2, 0, 1).to(self.device), scale

    def _resize_pil(self, img) -> tuple[torch.Tensor, float]:
        """detectron2: PIL bilinear resize of the uint8 image (size rounded half up), then normalize.

        One channel at a time, as 8-bit grayscale images: PIL resamples each band with the same
        integer arithmetic, so the values are those of the RGB resize, without PIL's 4-byte-per-
        pixel RGB copy of the full image.
        """
        from PIL import Image

        a = img.cpu().numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
        h, w = a.shape[:2]
        size = self.min_size * 1.0
        scale = size / min(h, w)
        newh, neww = (size, scale * w) if h < w else (scale * h, size)
        if max(newh, neww) > self.max_size:
            scale = self.max_size * 1.0 / max(newh, neww)
            newh, neww = newh * scale, neww * scale
        neww, newh = int(neww + 0.5), int(newh + 0.5)
        planes = []
        for c in range(3):
            plane = Image.fromarray(np.ascontiguousarray(a[:, :, 2 - c if self.flip_channels else c]))
            planes.append(np.asarray(plane.resize((neww, newh), Image.BILINEAR)))
        x = torch.as_tensor(np.stack(planes).astype("float32")).to(self.device)
        if self.pixel_range != 255.0:
            x = x / (255.0 / self.pixel_range)
        return (x - self.pixel_mean) / self.pixel_std, newh / h

    def preprocess(
        self, images: list
    ) -> tuple[torch.Tensor, list[tuple[int, int]], list[tuple[int, int]], list[float]]:
        """Normalize, resize (short side ``min_size``, long side <= ``max_size``) and pad.

        Returns the padded batch (N, 3, H, W), the resized sizes, the original sizes and
        the resize factors.
        """
        resized, sizes, orig, scales = [], [], [], []
        for img in images:
            orig.append((int(img.shape[0]), int(img.shape[1])))
            if self.legacy:
                x, scale = self._resize_cv2(img)
            elif self.d2:
                x, scale = self._resize_pil(img)
            else:
                x, scale = self._resize_torch(img)
            resized.append(x)
            sizes.append((x.shape[-2], x.shape[-1]))
            scales.append(scale)
        d = self.size_divisibility
        ph = int(-(-max(s[0] for s in sizes) // d) * d)
        pw = int(-(-max(s[1] for s in sizes) // d) * d)
        batch = resized[0].new_zeros((len(resized), 3, ph, pw))
        for i, x in enumerate(resized):
            batch[i, :, : x.shape[1], : x.shape[2]].copy_(x)
        return batch, sizes, orig, scales

    def _amp(self):
        """Autocast for the network layers when ``amp_dtype`` is set; box math stays float32."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _to_layout(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def chunk_size(self, n: int) -> int:
        """Images per network run for a batch of ``n`` (``chunk_images``; 0: one on CPU, all on GPU)."""
        c = self.chunk_images or (n if self.device.type == "cuda" else 1)
        return max(1, min(c, n))

    @torch.inference_mode()
    def forward(self, images: list) -> list[dict[str, torch.Tensor]]:
        """Detections per image: a dict of boxes (in original-image pixels), scores, labels, masks.

        The batch is resized and padded as one; the network then runs on chunks of
        ``chunk_size`` images (stage times add up over the chunks).
        """
        t = self.timer
        with t.stage("preprocess"):
            batch, sizes, orig, scales = self.preprocess(images)
        if self.channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        step = self.chunk_size(len(images))
        dets, mask_probs = [], []
        for i in range(0, len(images), step):
            part = slice(i, i + step)
            d, m = self._detect(batch[part], sizes[part], orig[part], scales[part])
            dets += d
            mask_probs += m
        return self._paste(dets, mask_probs if self.mask_head is not None else None, sizes, orig)

    def _detect(
        self,
        batch: torch.Tensor,
        sizes: list[tuple[int, int]],
        orig: list[tuple[int, int]],
        scales: list[float],
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], list[torch.Tensor]]:
        """The network on one padded chunk: per image (boxes, scores, labels) in the resized
        frame (Detectron: original frame) and the mask probabilities (M, M) of its class."""
        t = self.timer
        with t.stage("backbone"), self._amp():
            feats = self.backbone(batch)
        with t.stage("fpn"), self._amp():
            pyramid = list(self.fpn(feats).values())
        with t.stage("rpn"):
            with self._amp():
                logits, deltas = self.rpn.head(pyramid)
            with t.detail("rpn_select"):
                proposals = self.rpn.select(logits, deltas, tuple(batch.shape[-2:]), sizes, scales)
        with t.stage("box_head"):
            # torchvision's RoIAlign reads NCHW (convert the pooled levels once for both heads);
            # the gather RoIAlign reads channels-last
            if self.box_pooler.impl == "torchvision":
                pooled_levels = [p.contiguous() for p in pyramid[:4]]
            else:
                pooled_levels = [p.contiguous(memory_format=torch.channels_last) for p in pyramid[:4]]
            with self._amp():
                with t.detail("box_roi_align"):
                    pooled = self._to_layout(self.box_pooler(pooled_levels, proposals))
                logits, deltas = self.box_predictor(self.box_head(pooled))
            logits, deltas = logits.float(), deltas.float()
            if self.legacy:  # Detectron decodes and clips in original-image coordinates
                frames, sizes_for_boxes = [p / s for p, s in zip(proposals, scales)], orig
            else:
                frames, sizes_for_boxes = proposals, sizes
            with t.detail("box_postprocess"):
                dets = box_postprocess(
                    logits,
                    deltas,
                    frames,
                    sizes_for_boxes,
                    self.bbox_reg_weights,
                    self.score_thresh,
                    self.nms_thresh,
                    self.detections_per_image,
                    None if (self.legacy or self.d2) else self.min_box_size,
                    self.bg_last,
                    self.legacy,
                )
        mask_probs: list[torch.Tensor] = []
        if self.mask_head is not None:
            with t.stage("mask_head"):
                if self.legacy:
                    rois = [d[0] * s for d, s in zip(dets, scales)]
                else:
                    rois = [d[0] for d in dets]
                if sum(len(b) for b in rois):
                    with self._amp():
                        with t.detail("mask_roi_align"):
                            pooled = self._to_layout(self.mask_pooler(pooled_levels, rois))
                        mask_logits = self.mask_head(pooled)
                    mask_logits = mask_logits.float()
                    probs = select_class_masks(mask_logits, torch.cat([d[2] for d in dets]))
                else:
                    probs = batch.new_zeros((0, 28, 28))
                mask_probs = list(probs.split([len(b) for b in rois]))
        return dets, mask_probs

    def _paste(
        self,
        dets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        mask_probs: list[torch.Tensor] | None,
        sizes: list[tuple[int, int]],
        orig: list[tuple[int, int]],
    ) -> list[dict[str, torch.Tensor]]:
        t = self.timer
        results = []
        with t.stage("paste"):
            for i, ((boxes, scores, labels), (h, w), (oh, ow)) in enumerate(zip(dets, sizes, orig)):
                probs = mask_probs[i] if mask_probs is not None else None
                if self.d2:  # detectron2: scale by output/input size, clip, drop empty boxes
                    boxes = boxes.clone()
                    boxes[:, 0::2] *= ow / w
                    boxes[:, 1::2] *= oh / h
                    boxes = clip_boxes(boxes, oh, ow)
                    keep = ((boxes[:, 2] - boxes[:, 0]) > 0) & ((boxes[:, 3] - boxes[:, 1]) > 0)
                    boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
                    probs = probs[keep] if probs is not None else None
                elif not self.legacy:  # torchvision rescales per axis from the resized frame
                    rh = torch.tensor(oh, dtype=torch.float32) / torch.tensor(h, dtype=torch.float32)
                    rw = torch.tensor(ow, dtype=torch.float32) / torch.tensor(w, dtype=torch.float32)
                    boxes = boxes * torch.stack((rw, rh, rw, rh)).to(boxes.device)
                r = {"boxes": boxes, "scores": scores, "labels": labels}
                if probs is not None:
                    paste = paste_masks_aligned if self.d2 else paste_masks
                    r["masks"] = paste(probs, boxes, oh, ow, self.mask_threshold)
                results.append(r)
        return results


def build_model(cfg: CfgNode) -> MaskRCNN:
    """Build the detector described by ``cfg`` (weights are not loaded here)."""
    validate_cfg(cfg)
    m = cfg.MODEL
    kw = {"eps": m.FROZEN_BN_EPS, "num_groups": m.GN_NUM_GROUPS, "gn_eps": m.GN_EPS}

    def norm(c: int) -> nn.Module | None:
        return get_norm(m.NORM, c, **kw)

    def no_norm(c: int) -> None:
        return None

    legacy = m.CONVENTION == "detectron"
    d2 = m.CONVENTION == "detectron2"
    pool_rule = "detectron2" if d2 else legacy

    backbone = ResNet(m.RESNETS.DEPTH, norm, m.RESNETS.STRIDE_IN_1X1, m.RESNETS.NUM_GROUPS, m.RESNETS.WIDTH_PER_GROUP)
    ch = m.FPN.OUT_CHANNELS
    fpn = FPN(backbone.out_channels, ch, norm if m.FPN.USE_NORM else no_norm)
    rpn = RPN(
        ch,
        m.ANCHOR_GENERATOR.SIZES,
        m.ANCHOR_GENERATOR.ASPECT_RATIOS,
        m.RPN.CONV_DEPTH,
        m.RPN.PRE_NMS_TOPK_TEST,
        m.RPN.POST_NMS_TOPK_TEST,
        m.RPN.NMS_THRESH,
        m.RPN.MIN_SIZE,
        legacy=legacy,
        style=m.CONVENTION,
        tv_tie_order=m.RPN.TORCHVISION_TIE_ORDER,
    )
    scales = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    bh = m.ROI_BOX_HEAD
    box_pooler = MultiScaleRoIAlign(
        bh.POOLER_RESOLUTION, scales, bh.POOLER_SAMPLING_RATIO, aligned=d2, legacy=pool_rule, impl=m.ROI_ALIGN_IMPL
    )
    box_head = BoxHead(
        ch, bh.POOLER_RESOLUTION, bh.NUM_CONV, bh.CONV_DIM, bh.NUM_FC, bh.FC_DIM, norm if bh.USE_NORM else no_norm
    )
    num_classes = m.ROI_HEADS.NUM_CLASSES
    bg_last = m.CATEGORY_LAYOUT == "coco80"
    # detectron2 counts classes without background; its logits have one more column
    predictor = BoxPredictor(
        box_head.out_dim, num_classes + 1 if bg_last else num_classes, num_classes if bg_last else None
    )
    mask_pooler = mask_head = None
    if m.MASK_ON:
        mh = m.ROI_MASK_HEAD
        mask_pooler = MultiScaleRoIAlign(
            mh.POOLER_RESOLUTION, scales, mh.POOLER_SAMPLING_RATIO, aligned=d2, legacy=pool_rule, impl=m.ROI_ALIGN_IMPL
        )
        mask_head = MaskHead(ch, mh.NUM_CONV, mh.CONV_DIM, num_classes, norm if mh.USE_NORM else no_norm)
    model = MaskRCNN(
        backbone,
        fpn,
        rpn,
        box_pooler,
        box_head,
        predictor,
        mask_pooler,
        mask_head,
        pixel_mean=list(m.PIXEL_MEAN),
        pixel_std=list(m.PIXEL_STD),
        pixel_range=cfg.INPUT.PIXEL_RANGE,
        input_format="BGR",
        network_format=cfg.INPUT.FORMAT,
        min_size=cfg.INPUT.MIN_SIZE_TEST,
        max_size=cfg.INPUT.MAX_SIZE_TEST,
        size_divisibility=cfg.INPUT.SIZE_DIVISIBILITY,
        bbox_reg_weights=tuple(bh.BBOX_REG_WEIGHTS),
        score_thresh=m.ROI_HEADS.SCORE_THRESH_TEST,
        nms_thresh=m.ROI_HEADS.NMS_THRESH_TEST,
        detections_per_image=m.ROI_HEADS.DETECTIONS_PER_IMAGE,
        min_box_size=m.ROI_HEADS.MIN_BOX_SIZE,
        bg_last=bg_last,
        mask_threshold=m.ROI_MASK_HEAD.THRESHOLD,
        legacy=legacy,
        amp_dtype={"": None, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.TEST.AMP],
        convention=m.CONVENTION,
        chunk_images=cfg.TEST.CHUNK_IMAGES,
    )
    return model.eval()
