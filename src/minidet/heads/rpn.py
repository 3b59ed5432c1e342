"""Region Proposal Network: shared head over P2..P6, anchors, proposal selection. Each weight family's algorithms are
plain functions: anchor generators ``(size, aspect_ratios, stride) -> (A, 4)`` float32 (one level's cell anchors,
centred at the origin (torchvision, detectron2) or at the first cell's centre (Detectron)); proposal filters
``(clipped proposals (R, 4), RPN.MIN_SIZE, resize factor, padded size (H, W)) -> (R,) bool`` (those that stay)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..boxes import PLAIN_BOX_RULE, BoxRule, nonempty
from ..layers import Conv2d


def torchvision_cell_anchors(size: float, aspect_ratios: Sequence[float], stride: int = 0) -> torch.Tensor:
    """torchvision: for aspect ratio r = h / w, h = size * sqrt(r), w = size / sqrt(r), rounded to integers."""
    h_ratios = torch.sqrt(torch.as_tensor(aspect_ratios, dtype=torch.float32))
    ws, hs = 1 / h_ratios * size, h_ratios * size
    return (torch.stack([-ws, -hs, ws, hs], dim=1) / 2).round()


def detectron2_cell_anchors(size: float, aspect_ratios: Sequence[float], stride: int = 0) -> torch.Tensor:
    """detectron2: exact areas; for r = h / w, w = sqrt(size^2 / r), h = r * w, in double, stored as float32."""
    ws = [math.sqrt(size * size / r) for r in aspect_ratios]
    sides = [(w, r * w) for r, w in zip(aspect_ratios, ws)]
    return torch.tensor([[-w / 2.0, -h / 2.0, w / 2.0, h / 2.0] for w, h in sides], dtype=torch.float32)


def mmdet_cell_anchors(size: float, aspect_ratios: Sequence[float], stride: int = 0) -> torch.Tensor:
    """mmdetection's ``AnchorGenerator``: base size ``stride``, octave scale ``size / stride``, for r = h / w the
    float32 sides w = stride * (1 / sqrt(r)) * scale, h = stride * sqrt(r) * scale, centred at 0, not rounded."""
    h_ratios = torch.sqrt(torch.tensor(list(aspect_ratios), dtype=torch.float32))
    scale = torch.tensor([size / stride], dtype=torch.float32)
    ws, hs = ((stride * r[:, None] * scale[None, :]).view(-1) for r in (1 / h_ratios, h_ratios))
    return torch.stack([0 - 0.5 * ws, 0 - 0.5 * hs, 0 + 0.5 * ws, 0 + 0.5 * hs], dim=-1)


def detectron_cell_anchors(size: float, aspect_ratios: Sequence[float], stride: int = 0) -> torch.Tensor:
    """Detectron's ``generate_anchors``: the base box [0, 0, stride-1, stride-1] reshaped to each aspect
    ratio r = h / w at constant area (sides rounded half-to-even), scaled by ``size / stride``, centred
    at ((stride-1)/2, (stride-1)/2) with +1 sizes."""
    ctr = 0.5 * (stride - 1)
    out = []
    for r in aspect_ratios:
        ws = float(np.round(np.sqrt(stride * stride / r)))
        hs = float(np.round(ws * r))
        ws, hs = ws * size / stride, hs * size / stride
        out.append([ctr - 0.5 * (ws - 1), ctr - 0.5 * (hs - 1), ctr + 0.5 * (ws - 1), ctr + 0.5 * (hs - 1)])
    return torch.tensor(out, dtype=torch.float32)


def topk_logits(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One level's (N, L) objectness logits -> the ``k`` highest per image, (N, k') logits and indices, by
    ``torch.topk`` (torchvision, Detectron, detectron2, maskrcnn-benchmark). Exportable: L may be symbolic."""
    return logits.topk(torch.sym_min(k, logits.shape[1]), dim=1)


def sorted_sigmoid(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """mmdetection's ``RPNHead``: per image the sigmoid of the level's (L,) logits; where L > ``k``, the first ``k``
    of ``sort(descending=True)`` (PyTorch's unstable sort: equal scores in its order), else all L in anchor order.
    Returns (N, k') probabilities and indices. Under ``torch.export`` (L symbolic, no branch on it): the
    ``min(k, L)`` highest probabilities by ``topk``, the same set but for the order of equal probabilities (the
    graph's top-k orders them by index; which of them the cut at ``k`` keeps is the one inexact step there)."""
    if torch.compiler.is_exporting():
        return logits.sigmoid().topk(torch.sym_min(k, logits.shape[1]), dim=1)
    probs = [lg.sigmoid() for lg in logits]  # one image at a time, as mmdetection computes them
    if logits.shape[1] <= k:
        idx = torch.arange(logits.shape[1], device=logits.device)
        return torch.stack(probs), idx.expand(len(probs), -1)
    ranked = [p.sort(descending=True) for p in probs]
    return torch.stack([v[:k] for v, _ in ranked]), torch.stack([i[:k] for _, i in ranked])


def keep_min_size(boxes: torch.Tensor, min_size: float, scale: float, padded_size: tuple[int, int]) -> torch.Tensor:
    """torchvision: width and height >= ``min_size``."""
    return nonempty(boxes, min_size)


def keep_min_size_inclusive(boxes: torch.Tensor, min_size: float, scale: float, padded_size) -> torch.Tensor:
    """maskrcnn-benchmark: +1 width and height >= ``min_size``."""
    return nonempty(boxes, min_size, offset=1)


def keep_above_min_size(boxes: torch.Tensor, min_size: float, scale: float, padded_size) -> torch.Tensor:
    """detectron2: width and height > ``min_size`` (strictly)."""
    return ((boxes[:, 2] - boxes[:, 0]) > min_size) & ((boxes[:, 3] - boxes[:, 1]) > min_size)


def keep_original_pixels(boxes: torch.Tensor, min_size: float, scale: float, padded_size) -> torch.Tensor:
    """Detectron: +1 sizes of at least max(``min_size``, 1) original-image pixels, centre inside the input."""
    ph, pw = padded_size
    ws, hs = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    min_size = max(min_size, 1.0)
    big_enough = (ws / scale + 1 >= min_size) & (hs / scale + 1 >= min_size)
    return big_enough & (boxes[:, 0] + (ws + 1) / 2.0 < pw) & (boxes[:, 1] + (hs + 1) / 2.0 < ph)


class RPNHead(nn.Module):
    """``conv_depth`` 3x3 conv+ReLU, then per anchor: P_k (N, C, H, W) -> logits (N, A, H, W), deltas (N, 4A, H, W)."""

    def __init__(self, in_channels: int, num_anchors: int, conv_depth: int = 1) -> None:
        super().__init__()
        convs = [Conv2d(in_channels, in_channels, 3, padding=1, relu=True) for _ in range(conv_depth)]
        self.convs = nn.Sequential(*convs)
        self.objectness_logits = nn.Conv2d(in_channels, num_anchors, 1)
        self.anchor_deltas = nn.Conv2d(in_channels, num_anchors * 4, 1)

    def forward(self, features: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        t = [self.convs(x) for x in features]
        return [self.objectness_logits(x) for x in t], [self.anchor_deltas(x) for x in t]


class RPN(nn.Module):
    """Proposals from the FPN levels (P2 onwards): ``head`` gives logits and deltas, ``select`` the proposals: per
    level the ``pre_nms_topk`` best (``level_topk``), decoded against their anchors, clipped, filtered, NMS-ed per
    level; the ``post_nms_topk`` best over all levels. ``anchor_generator`` to ``level_topk``: the weight family's
    arithmetic (``conventions.Convention``); ``tv_tie_order``: equal scores in torchvision's order (the same
    proposals)."""

    def __init__(
        self, in_channels: int, anchor_sizes: Sequence[float], aspect_ratios: Sequence[float], conv_depth: int = 1,
        pre_nms_topk: int = 1000, post_nms_topk: int = 1000, nms_thresh: float = 0.7, min_size: float = 1e-3, *,
        anchor_generator: Callable[..., torch.Tensor] = torchvision_cell_anchors, fixed_strides: bool = False,
        rank_by_logit: bool = False, box_rule: BoxRule = PLAIN_BOX_RULE, clip_to_padded: bool = False,
        proposal_filter: Callable[..., torch.Tensor] = keep_min_size, topk_per_level: bool = False,
        level_topk: Callable[..., tuple[torch.Tensor, torch.Tensor]] = topk_logits, tv_tie_order: bool = False,
    ) -> None:
        super().__init__()
        self.head = RPNHead(in_channels, len(aspect_ratios), conv_depth)
        self.strides = [2 ** (2 + i) for i in range(len(anchor_sizes))]
        self.cell_anchors = [anchor_generator(s, aspect_ratios, st) for s, st in zip(anchor_sizes, self.strides)]
        self.pre_nms_topk, self.post_nms_topk = pre_nms_topk, post_nms_topk
        self.nms_thresh, self.min_size = nms_thresh, min_size
        self.fixed_strides, self.rank_by_logit, self.box_rule = fixed_strides, rank_by_logit, box_rule
        self.clip_to_padded, self.proposal_filter = clip_to_padded, proposal_filter
        self.topk_per_level, self.level_topk, self.tv_tie_order = topk_per_level, level_topk, tv_tie_order
        self._grid_cache: dict[tuple, torch.Tensor] = {}

    def grid_anchors(self, level: int, grid: tuple[int, int], stride: tuple[int, int], device) -> torch.Tensor:
        """(H*W*A, 4) anchors of one level, location-major then anchor."""
        key = (level, grid, stride, str(device))
        if key not in self._grid_cache:
            if len(self._grid_cache) > 64:
                self._grid_cache.clear()
            self._grid_cache[key] = self.level_anchors(level, grid, stride, device)
        return self._grid_cache[key]

    def level_anchors(self, level: int, grid: tuple, stride: tuple, device=None) -> torch.Tensor:
        """``grid_anchors`` uncached, of any grid (sizes that are symbols in an export); ``device`` None: the
        cell anchors' own."""
        (gh, gw), (sh, sw) = grid, stride
        xs = torch.arange(gw, dtype=torch.int32, device=device) * sw
        ys = torch.arange(gh, dtype=torch.int32, device=device) * sh
        sy, sx = torch.meshgrid(ys, xs, indexing="ij")
        shifts = torch.stack((sx.reshape(-1), sy.reshape(-1)) * 2, dim=1)
        base = self.cell_anchors[level] if device is None else self.cell_anchors[level].to(device)
        return (shifts.view(-1, 1, 4) + base.view(1, -1, 4)).reshape(-1, 4)

    def select(
        self, logits: list[torch.Tensor], deltas: list[torch.Tensor], padded_size: tuple[int, int],
        image_sizes: list[tuple[int, int]], image_scales: list[float] | None = None,
    ) -> list[torch.Tensor]:
        """The head's per-level outputs -> per image its proposals (R_i, 4) in the resized frame, sorted by score
        (float32). ``image_sizes``: the resized, unpadded sizes; ``image_scales``: the resize factors (default 1)."""
        n = logits[0].shape[0]
        sel_scores, sel_deltas, sel_anchors, sel_levels = [], [], [], []
        for lvl, (lg, dl) in enumerate(zip(logits, deltas)):
            lg, dl = lg.float(), dl.float()
            a, h, w = lg.shape[1:]
            # fixed strides, or padded size // grid size as torchvision computes them
            stride = (self.strides[lvl],) * 2 if self.fixed_strides else (padded_size[0] // h, padded_size[1] // w)
            anchors = self.grid_anchors(lvl, (h, w), stride, lg.device)
            lg = lg.permute(0, 2, 3, 1).reshape(n, -1)
            dl = dl.view(n, a, 4, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, 4)
            top, idx = self.level_topk(lg, self.pre_nms_topk)
            k = idx.shape[1]
            sel_scores.append(top)
            sel_deltas.append(dl.gather(1, idx[..., None].expand(n, k, 4)))
            sel_anchors.append(anchors[idx])
            sel_levels.append(torch.full((k,), lvl, dtype=torch.int64, device=lg.device))
        scores = torch.cat(sel_scores, dim=1)
        if not self.rank_by_logit:
            scores = torch.sigmoid(scores)
        # one decode for all levels (row by row: the same values as per level)
        deltas_all, anchors_all = (torch.cat(x, dim=1).reshape(-1, 4) for x in (sel_deltas, sel_anchors))
        boxes = self.box_rule.decode(deltas_all, anchors_all, (1.0, 1.0, 1.0, 1.0)).view(n, -1, 4)
        levels = torch.cat(sel_levels)
        scales = image_scales or [1.0] * n
        return [self.select_image(boxes[i], scores[i], levels, size, padded_size, scales[i])
                for i, size in enumerate(image_sizes)]

    def select_image(self, boxes, scores, levels, image_size, padded_size, scale: float) -> torch.Tensor:
        """One image's decoded (R, 4) boxes, (R,) scores and levels -> its proposals (P, 4)."""
        h, w = padded_size if self.clip_to_padded else image_size
        b = self.box_rule.clip(boxes, h, w)
        keep = self.proposal_filter(b, self.min_size, scale, padded_size)
        b, s, lv = b[keep], scores[keep], levels[keep]
        topk = None if self.topk_per_level else self.post_nms_topk
        keep = self.box_rule.nms(b, s, lv, self.nms_thresh, topk=topk, tv_tie_order=self.tv_tie_order)
        if self.topk_per_level:  # rank of each kept box within its level (keep is score-sorted)
            onehot = torch.nn.functional.one_hot(lv[keep], len(self.strides))
            rank = (onehot.cumsum(0) * onehot).sum(1) - 1
            keep = keep[rank < self.post_nms_topk]
        return b[keep[: self.post_nms_topk]]

    def select_one(self, logits: list[torch.Tensor], deltas: list[torch.Tensor], padded: tuple, size: tuple, scale,
                   nms: Callable) -> torch.Tensor:
        """``select`` and ``select_image`` for one image in operators that ``torch.export`` follows through
        data-dependent sizes (the exported graph's): the head's per-level outputs of a batch of one -> (P, 4)
        proposals by decreasing score. ``nms(box_rule, boxes, scores, groups, thresh, num_groups)``: the graph's
        NMS (kept indices by decreasing score, no top-k shortcut), the levels its groups."""
        scores, boxes, anchors, levels = [], [], [], []
        for lvl, (lg, dl) in enumerate(zip(logits, deltas)):
            a, h, w = lg.shape[1:]
            stride = (self.strides[lvl],) * 2 if self.fixed_strides else (padded[0] // h, padded[1] // w)
            lg = lg.permute(0, 2, 3, 1).reshape(1, -1)
            dl = dl.view(a, 4, h, w).permute(2, 3, 0, 1).reshape(-1, 4)
            top, idx = (t[0] for t in self.level_topk(lg, self.pre_nms_topk))  # the family's rule (scores, ranks)
            scores.append(top)
            boxes.append(dl[idx])
            anchors.append(self.level_anchors(lvl, (h, w), stride)[idx])
            levels.append(torch.full_like(idx, lvl))
        score = torch.cat(scores)
        if not self.rank_by_logit:
            score = torch.sigmoid(score)
        rule = self.box_rule
        b = rule.decode(torch.cat(boxes), torch.cat(anchors), (1.0, 1.0, 1.0, 1.0))
        b = rule.clip(b, *(padded if self.clip_to_padded else size))
        keep = self.proposal_filter(b, self.min_size, scale, padded)
        b, score, level = b[keep], score[keep], torch.cat(levels)[keep]
        keep = nms(rule, b, score, level, self.nms_thresh, len(self.strides))
        if self.topk_per_level:  # rank of each kept box within its level
            onehot = torch.nn.functional.one_hot(level[keep], len(self.strides))
            keep = keep[(onehot.cumsum(0) * onehot).sum(1) - 1 < self.post_nms_topk]
        return b[keep[: self.post_nms_topk]]
