"""Instance masks kept as the crops of their boxes: what a mask costs follows its box's area, not the frame's.

The paste (``transform.paste_*``) writes each mask into the pixels around its box only; ``BoxMasks`` keeps exactly
those pixels, with where they lie in the frame, so that an 8000 x 8000 image with 100 detections holds 100 box-sized
arrays instead of 100 frames (6.4 GB). Everything that reads masks works from the crops (COCO RLE, drawings,
polygons, sliced inference's merge); ``dense()`` gives the (N, H, W) stack where a caller wants it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class BoxMasks:
    """N binary masks of an ``size`` = (H, W) frame. Mask ``i`` is ``crops[i]`` (an (h, w) bool tensor) placed with
    its top-left pixel at ``origins[i]`` = (x, y); every pixel outside its crop is 0. Crops lie inside the frame.

    It reads like the (N, H, W) bool tensor it stands for where that is cheap: ``len``, ``shape``, ``masks[i]`` (one
    full-frame (H, W) tensor), ``masks[rows]`` (a ``BoxMasks`` of those rows: a slice, indices, or a bool selection),
    ``.cpu()``, ``np.asarray(masks)`` and ``dense()`` (the whole stack)."""

    dtype = torch.bool

    def __init__(self, crops: Sequence[torch.Tensor], origins: Sequence[tuple[int, int]], size: tuple[int, int]):
        if len(crops) != len(origins):
            raise ValueError(f"{len(crops)} crops but {len(origins)} origins")
        self.crops = list(crops)
        self.origins = [(int(x), int(y)) for x, y in origins]
        self.size = (int(size[0]), int(size[1]))
        h, w = self.size
        for c, (x, y) in zip(self.crops, self.origins):
            if c.ndim != 2 or x < 0 or y < 0 or x + c.shape[1] > w or y + c.shape[0] > h:
                raise ValueError(f"a crop of shape {tuple(c.shape)} at ({x}, {y}) is not inside the {w} x {h} frame")

    @classmethod
    def from_dense(cls, masks: torch.Tensor | np.ndarray) -> BoxMasks:
        """The (N, H, W) stack ``masks`` (nonzero = in), each cut to the rows and columns it touches."""
        masks = torch.as_tensor(np.asarray(masks) if not isinstance(masks, torch.Tensor) else masks)
        if masks.ndim != 3:
            raise ValueError(f"expected an (N, H, W) mask stack, got shape {tuple(masks.shape)}")
        masks = masks != 0 if masks.dtype != torch.bool else masks
        crops, origins = [], []
        for m in masks:
            rows, cols = m.any(dim=1).nonzero().flatten(), m.any(dim=0).nonzero().flatten()
            if len(rows) == 0:
                crops.append(m[:0, :0])
                origins.append((0, 0))
                continue
            y0, y1, x0, x1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
            crops.append(m[y0:y1, x0:x1].clone())
            origins.append((x0, y0))
        return cls(crops, origins, tuple(masks.shape[1:]))

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.crops), *self.size))

    @property
    def device(self) -> torch.device:
        return self.crops[0].device if self.crops else torch.device("cpu")

    def __len__(self) -> int:
        return len(self.crops)

    def __repr__(self) -> str:
        return f"BoxMasks({len(self)} masks of a {self.size[1]} x {self.size[0]} frame, {self.nbytes()} bytes held)"

    def nbytes(self) -> int:
        """Bytes the crops hold (one per pixel)."""
        return sum(c.numel() for c in self.crops)

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)) or (isinstance(key, torch.Tensor) and key.ndim == 0
                                                  and not key.dtype.is_floating_point and key.dtype != torch.bool):
            return self.frame(int(key))
        if isinstance(key, slice):
            rows = range(len(self))[key]
        else:
            rows = np.arange(len(self))[np.asarray(key.cpu() if isinstance(key, torch.Tensor) else key)]
        return BoxMasks([self.crops[k] for k in rows], [self.origins[k] for k in rows], self.size)

    def region(self, i: int) -> tuple[int, int, int, int]:
        """Mask ``i``'s crop in frame pixels: x0, y0, x1, y1 (exclusive ends)."""
        (x, y), c = self.origins[i], self.crops[i]
        return x, y, x + int(c.shape[1]), y + int(c.shape[0])

    def frame(self, i: int) -> torch.Tensor:
        """Mask ``i`` as a full (H, W) bool tensor."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"mask {i} of {len(self)}")
        i %= len(self)
        out = torch.zeros(self.size, dtype=torch.bool, device=self.crops[i].device)
        x0, y0, x1, y1 = self.region(i)
        out[y0:y1, x0:x1] = self.crops[i]
        return out

    def dense(self) -> torch.Tensor:
        """The (N, H, W) bool stack (N frames: what the crops save)."""
        out = torch.zeros(self.shape, dtype=torch.bool, device=self.device)
        for i, c in enumerate(self.crops):
            x0, y0, x1, y1 = self.region(i)
            out[i, y0:y1, x0:x1] = c
        return out

    def numpy(self) -> np.ndarray:
        return self.dense().cpu().numpy()

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def areas(self) -> torch.Tensor:
        """(N,) int64: the pixels of each mask."""
        return torch.tensor([int(c.sum()) for c in self.crops], dtype=torch.int64)

    def to(self, device) -> BoxMasks:
        return BoxMasks([c.to(device) for c in self.crops], self.origins, self.size)

    def cpu(self) -> BoxMasks:
        return self.to("cpu")

    def shifted(self, dx: int, dy: int, size: tuple[int, int]) -> BoxMasks:
        """The same masks placed ``dx``, ``dy`` pixels further right and down in a frame of ``size`` (a tile's masks
        in the whole image)."""
        return BoxMasks(self.crops, [(x + dx, y + dy) for x, y in self.origins], size)

    @staticmethod
    def cat(parts: Sequence[BoxMasks], size: tuple[int, int] | None = None) -> BoxMasks:
        """The masks of ``parts`` (all of frame ``size``, else of the first part's) one after another."""
        size = size or (parts[0].size if parts else (0, 0))
        if any(p.size != size for p in parts):
            raise ValueError("masks of different frames cannot be joined")
        return BoxMasks([c for p in parts for c in p.crops], [o for p in parts for o in p.origins], size)
