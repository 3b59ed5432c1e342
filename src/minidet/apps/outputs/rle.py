"""COCO run-length encoding of masks, ready for JSON, made from the masks' box crops; and the check of compressed
RLE strings read from files (``rle_string_totals``: eval's results, convert's records)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from pycocotools import mask as mask_utils

from minidet.masks import BoxMasks


def encode_mask(mask: np.ndarray) -> dict:
    """COCO compressed RLE ``{"size": [H, W], "counts": str}`` of one HxW mask (nonzero = in)."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"expected an HxW mask, got shape {mask.shape}")
    return encode_masks(mask[None])[0]


def encode_masks(masks: BoxMasks | np.ndarray) -> list[dict]:
    """COCO RLE of each mask of a ``BoxMasks`` (or of an (N, H, W) stack, cut to its masks' extents first): the
    string pycocotools' ``encode`` makes of the whole frame, byte for byte, made from each mask's crop
    (:func:`crop_counts`), so that the cost follows the masks' boxes, not N x H x W."""
    if not isinstance(masks, BoxMasks):
        masks = np.asarray(masks)
        if masks.ndim != 3:
            raise ValueError(f"expected an (N, H, W) mask stack, got shape {masks.shape}")
        masks = BoxMasks.from_dense(masks)
    h, w = masks.size
    found = []
    for crop, (x, y) in zip(masks.crops, masks.origins):
        counts = crop_counts(crop.cpu().numpy(), x, y, h, w)
        rle = mask_utils.frPyObjects({"size": [h, w], "counts": counts}, h, w)  # pycocotools' own compression
        found.append({"size": [h, w], "counts": rle["counts"].decode("utf-8")})
    return found


def crop_counts(crop: np.ndarray, x0: int, y0: int, height: int, width: int) -> list[int]:
    """The run lengths of a height x width frame (column-major, COCO's order: a run of 0s first, possibly empty, then
    1s and 0s in turn, none other empty) that is 0 everywhere but the bool ``crop`` placed at (x0, y0)."""
    total = height * width
    if crop.size == 0:
        return [total]
    # per crop column (transposed: column-major), +1 where a run of 1s starts and -1 where one has ended
    d = np.diff(crop.T.astype(np.int8), axis=1, prepend=0, append=0)
    col, row = np.nonzero(d)  # in column-major order; starts and ends alternate within each column
    if len(col) == 0:
        return [total]
    pos = (x0 + col.astype(np.int64)) * height + y0 + row
    joined = pos[1:] == pos[:-1]  # a run that ends at a column's bottom and goes on at the next column's top
    if joined.any():
        drop = np.zeros(len(pos), bool)
        drop[1:] |= joined
        drop[:-1] |= joined
        pos = pos[~drop]
    runs = np.diff(np.concatenate(([0], pos, [total])))
    if runs[-1] == 0:  # the last run of 1s reaches the frame's last pixel
        runs = runs[:-1]
    return runs.tolist()


NOT_RLE, NEGATIVE_RUN = -1, -2  # rle_string_totals of a string that is not RLE, that has a negative run


def rle_string_totals(strings: Sequence[str]) -> np.ndarray:
    """The pixels covered by the runs of each compressed COCO RLE ``counts`` string (int64), decoded all together
    (numpy); :data:`NOT_RLE` for a string that is not one, :data:`NEGATIVE_RUN` where a run is below 0. The format:
    each run length is a little-endian sequence of 5-bit groups stored as characters ``chr(48 + g)``, bit 0x20 of a
    character meaning "more groups follow" and bit 0x10 of the last one the sign; from the fourth run on, a run is
    stored as its difference to the run two before."""
    out = np.zeros(len(strings), np.int64)
    bad = np.array([not s.isascii() for s in strings], bool)
    texts = ["" if b else s for s, b in zip(strings, bad.tolist())]
    lens = np.fromiter(map(len, texts), np.int64, len(strings))
    if lens.sum():
        c = np.frombuffer("".join(texts).encode("ascii"), np.uint8) - np.uint8(48)  # below "0": wraps to > 63
        offsets = np.cumsum(lens)
        last = (offsets - 1)[lens > 0]  # the last character of each string
        entry = functools.partial(np.searchsorted, offsets, side="right")  # entry(i): the string of character i
        end = (c & 0x20) == 0  # the last character of a run length
        bad[entry(np.flatnonzero(c > 63))] = True
        bad[entry(last[~end[last]])] = True  # the string ends inside a run length
        end[last] = True  # so that no run length reaches into the next string
        ends = np.flatnonzero(end)
        starts = np.concatenate([[0], ends[:-1] + 1])
        glen = ends - starts + 1
        bad[entry(starts[glen > 8])] = True  # over 40 bits: more than any image has pixels
        shift = 5 * np.minimum(np.arange(c.size) - np.repeat(starts, glen), 8)
        val = np.add.reduceat((c & 0x1F).astype(np.int64) << shift, starts)
        val -= np.where(c[ends] & 0x10, np.int64(1) << (5 * np.minimum(glen, 8)), 0)
        run_entry = entry(starts)
        first = np.flatnonzero(np.concatenate([[True], run_entry[1:] != run_entry[:-1]]))
        j = np.arange(val.size) - np.repeat(first, np.diff(np.append(first, val.size)))  # run index in its string
        runs = val.copy()
        for sel in (np.flatnonzero(j % 2 == 1), np.flatnonzero((j % 2 == 0) & (j > 0))):
            if sel.size:  # undo the differences: odd runs add up from run 1, even ones from run 2
                cs = np.cumsum(val[sel])
                e = run_entry[sel]
                seg = np.flatnonzero(np.concatenate([[True], e[1:] != e[:-1]]))
                runs[sel] = cs - np.repeat((cs - val[sel])[seg], np.diff(np.append(seg, sel.size)))
        out[run_entry[first]] = np.add.reduceat(runs, first)
        out[np.unique(run_entry[runs < 0])] = NEGATIVE_RUN
    out[bad] = NOT_RLE
    return out
