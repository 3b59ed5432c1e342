"""Region Proposal Network: shared head over P2..P6, anchors, proposal selection."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .boxes import batched_nms, clip_boxes, decode_boxes, detectron2_cell_anchors, detectron_cell_anchors, nonempty
from .norm import Conv2d


def cell_anchors(size: float, aspect_ratios: Sequence[float]) -> torch.Tensor:
    """(A, 4) anchors centred at 0 for one size, rounded to integers (torchvision's form).

    For aspect ratio r = h / w: h = size * sqrt(r), w = size / sqrt(r).
    """
    ratios = torch.as_tensor(aspect_ratios, dtype=torch.float32)
    h_ratios = torch.sqrt(ratios)
    w_ratios = 1 / h_ratios
    ws = w_ratios * size
    hs = h_ratios * size
    return (torch.stack([-ws, -hs, ws, hs], dim=1) / 2).round()


class RPNHead(nn.Module):
    """``conv_depth`` 3x3 conv+ReLU layers, then per-anchor objectness and box deltas.

    Shapes: P_k (N, C, H, W) -> logits (N, A, H, W), deltas (N, 4A, H, W).
    """

    def __init__(self, in_channels: int, num_anchors: int, conv_depth: int = 1) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            *[Conv2d(in_channels, in_channels, 3, padding=1, relu=True) for _ in range(conv_depth)]
        )
        self.objectness_logits = nn.Conv2d(in_channels, num_anchors, 1)
        self.anchor_deltas = nn.Conv2d(in_channels, num_anchors * 4, 1)

    def forward(self, features: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        logits, deltas = [], []
        for x in features:
            t = self.convs(x)
            logits.append(self.objectness_logits(t))
            deltas.append(self.anchor_deltas(t))
        return logits, deltas


class RPN(nn.Module):
    """Proposals per image from the FPN levels.

    Per level, the ``pre_nms_topk`` highest logits are kept, decoded against their
    anchors (weights 1,1,1,1), clipped, filtered by ``min_size``, and NMS-ed per level at
    ``nms_thresh``; the ``post_nms_topk`` best over all levels are returned.

    ``legacy=True`` is Detectron's arithmetic: its quantized anchors at fixed strides
    2^level, +1 box sizes, clipping to the padded input, a minimum size of one
    original-image pixel with the box centre inside the input, NMS suppressing at
    IoU >= ``nms_thresh``, and ``post_nms_topk`` per level before the overall cut.
    ``style="detectron2"``: exact-area anchors centred at 0 at fixed strides, and boxes
    kept only when wider and taller than ``min_size`` (strictly).
    ``tv_tie_order``: proposals of exactly equal score in torchvision's (unstable-sort) order
    rather than in level/rank order; the same proposals either way (``boxes.batched_nms``).
    """

    def __init__(
        self,
        in_channels: int,
        anchor_sizes: Sequence[float],
        aspect_ratios: Sequence[float],
        conv_depth: int = 1,
        pre_nms_topk: int = 1000,
        post_nms_topk: int = 1000,
        nms_thresh: float = 0.7,
        min_size: float = 1e-3,
        legacy: bool = False,
        min_level: int = 2,
        style: str = "",
        tv_tie_order: bool = False,
    ) -> None:
        super().__init__()
        self.head = RPNHead(in_channels, len(aspect_ratios), conv_depth)
        self.legacy = legacy
        self.d2 = style == "detectron2"
        self.strides = [2 ** (min_level + i) for i in range(len(anchor_sizes))]
        if self.d2:
            self.cell_anchors = [detectron2_cell_anchors(s, aspect_ratios) for s in anchor_sizes]
        elif legacy:
            self.cell_anchors = [
                detectron_cell_anchors(st, s, aspect_ratios) for st, s in zip(self.strides, anchor_sizes)
            ]
        else:
            self.cell_anchors = [cell_anchors(s, aspect_ratios) for s in anchor_sizes]
        self.pre_nms_topk = pre_nms_topk
        self.post_nms_topk = post_nms_topk
        self.nms_thresh = nms_thresh
        self.min_size = min_size
        self.tv_tie_order = tv_tie_order
        self._grid_cache: dict[tuple, torch.Tensor] = {}

    def grid_anchors(self, level: int, grid: tuple[int, int], stride: tuple[int, int], device) -> torch.Tensor:
        """(H*W*A, 4) anchors of one level, location-major then anchor."""
        key = (level, grid, stride, str(device))
        a = self._grid_cache.get(key)
        if a is None:
            (gh, gw), (sh, sw) = grid, stride
            xs = torch.arange(gw, dtype=torch.int32, device=device) * sw
            ys = torch.arange(gh, dtype=torch.int32, device=device) * sh
            sy, sx = torch.meshgrid(ys, xs, indexing="ij")
            shifts = torch.stack((sx.reshape(-1), sy.reshape(-1)) * 2, dim=1)
            base = self.cell_anchors[level].to(device)
            a = (shifts.view(-1, 1, 4) + base.view(1, -1, 4)).reshape(-1, 4)
            if len(self._grid_cache) > 64:
                self._grid_cache.clear()
            self._grid_cache[key] = a
        return a

    def forward(
        self,
        features: list[torch.Tensor],
        padded_size: tuple[int, int],
        image_sizes: list[tuple[int, int]],
        image_scales: list[float] | None = None,
    ) -> list[torch.Tensor]:
        """Proposals in input (resized) coordinates: a list of (R_i, 4), sorted by score.

        ``image_sizes`` are the resized, unpadded sizes; ``image_scales`` the resize factors
        (used by the legacy minimum-size rule).
        """
        logits, deltas = self.head(features)
        return self.select(logits, deltas, padded_size, image_sizes, image_scales)

    def select(
        self,
        logits: list[torch.Tensor],
        deltas: list[torch.Tensor],
        padded_size: tuple[int, int],
        image_sizes: list[tuple[int, int]],
        image_scales: list[float] | None = None,
    ) -> list[torch.Tensor]:
        """Proposal selection from the head's per-level outputs (computed in float32)."""
        logits = [x.float() for x in logits]
        deltas = [x.float() for x in deltas]
        n = logits[0].shape[0]
        sel_scores, sel_deltas, sel_anchors, sel_levels = [], [], [], []
        for lvl, (lg, dl) in enumerate(zip(logits, deltas)):
            a, h, w = lg.shape[1:]
            if self.legacy or self.d2:
                stride = (self.strides[lvl], self.strides[lvl])
            else:  # padded size // grid size, as torchvision computes it
                stride = (padded_size[0] // h, padded_size[1] // w)
            anchors = self.grid_anchors(lvl, (h, w), stride, lg.device)
            lg = lg.permute(0, 2, 3, 1).reshape(n, -1)
            dl = dl.view(n, a, 4, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, 4)
            k = min(self.pre_nms_topk, lg.shape[1])
            top, idx = lg.topk(k, dim=1)
            sel_scores.append(top)
            sel_deltas.append(dl.gather(1, idx[..., None].expand(n, k, 4)))
            sel_anchors.append(anchors[idx])
            sel_levels.append(torch.full((k,), lvl, dtype=torch.int64, device=lg.device))
        scores = torch.cat(sel_scores, dim=1)
        if not self.d2:  # detectron2 ranks by logits; sigmoid can tie saturated scores
            scores = torch.sigmoid(scores)
        # one decode for all levels (row by row: the same values as per level)
        deltas_all = torch.cat(sel_deltas, dim=1).reshape(-1, 4)
        anchors_all = torch.cat(sel_anchors, dim=1).reshape(-1, 4)
        boxes = decode_boxes(deltas_all, anchors_all, (1.0, 1.0, 1.0, 1.0), int(self.legacy)).view(n, -1, 4)
        levels = torch.cat(sel_levels)
        if self.legacy:
            return [
                self._select_legacy(boxes[i], scores[i], levels, padded_size, image_scales[i])
                for i in range(len(image_sizes))
            ]
        proposals = []
        for i, (hh, ww) in enumerate(image_sizes):
            b = clip_boxes(boxes[i], hh, ww)
            if self.d2:
                keep = ((b[:, 2] - b[:, 0]) > self.min_size) & ((b[:, 3] - b[:, 1]) > self.min_size)
            else:
                keep = nonempty(b, self.min_size)
            b, s, lv = b[keep], scores[i][keep], levels[keep]
            keep = batched_nms(b, s, lv, self.nms_thresh, topk=self.post_nms_topk, tv_tie_order=self.tv_tie_order)
            keep = keep[: self.post_nms_topk]
            proposals.append(b[keep])
        return proposals

    def _select_legacy(self, boxes, scores, levels, padded_size, scale: float) -> torch.Tensor:
        ph, pw = padded_size
        b = clip_boxes(boxes, ph, pw, offset=1)
        ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        min_size = max(self.min_size, 1.0)
        keep = (
            (ws / scale + 1 >= min_size)
            & (hs / scale + 1 >= min_size)
            & (b[:, 0] + (ws + 1) / 2.0 < pw)
            & (b[:, 1] + (hs + 1) / 2.0 < ph)
        )
        b, s, lv = b[keep], scores[keep], levels[keep]
        keep = batched_nms(b, s, lv, self.nms_thresh, offset=1, inclusive=True)
        lv = lv[keep]
        # rank of each kept box within its level (keep is score-sorted): per-level cap
        onehot = torch.nn.functional.one_hot(lv, len(self.strides))
        rank = (onehot.cumsum(0) * onehot).sum(1) - 1
        keep = keep[rank < self.post_nms_topk][: self.post_nms_topk]
        return b[keep]
