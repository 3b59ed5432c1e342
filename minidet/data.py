"""Reading a dataset's images in DataLoader workers, where a bad file is data, not an exception."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
from torch.utils.data import Dataset

from .imageio import DEFAULT_MAX_PIXELS, ImageReadError, read_image


class ImageFiles(Dataset):
    """``(image_id, path)`` pairs read as HxWx3 uint8 BGR arrays.

    ``dataset[i]`` is ``(image_id, image)`` where ``image`` is the array, or a one-line
    ``"<path>: <what is wrong>"`` string when the file is missing, truncated or unreadable,
    or (with ``sizes``: image id -> (height, width)) not the size the annotations expect,
    so that no exception has to cross the worker boundary and one bad file stops nothing.
    """

    def __init__(
        self,
        items: Sequence[tuple[int, str]],
        max_pixels: int = DEFAULT_MAX_PIXELS,
        sizes: Mapping[int, tuple[int, int]] | None = None,
    ) -> None:
        self.items = list(items)
        self.max_pixels = max_pixels
        self.sizes = dict(sizes) if sizes is not None else {}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray | str]:
        image_id, path = self.items[index]
        try:
            image = read_image(path, self.max_pixels)
        except ImageReadError as e:
            return image_id, str(e)
        except Exception as e:  # noqa: BLE001 - anything else about this one file is reported the same way
            return image_id, " ".join(f"{path}: {type(e).__name__}: {e}".split())
        expected = self.sizes.get(image_id)
        if expected is not None and tuple(image.shape[:2]) != tuple(expected):
            (h, w), (eh, ew) = image.shape[:2], expected
            hint = " (EXIF-rotated?)" if (h, w) == (ew, eh) else ""
            return image_id, f"{path}: image is {w} x {h} but the annotation file says {ew} x {eh}{hint}"
        return image_id, image


def collate(batch: list) -> list:
    """Keep a batch as the list of ``(image_id, image or error)`` items (images differ in size)."""
    return list(batch)


def coco_image_files(images: list[dict], image_root: str) -> list[tuple[int, str]]:
    """``(id, image_root/file_name)`` for the ``images`` entries of a COCO annotation file, by id."""
    return [(int(im["id"]), os.path.join(image_root, im["file_name"])) for im in sorted(images, key=lambda m: m["id"])]
