"""Reading a dataset's images in DataLoader workers, where a bad file is data, not an exception."""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from torch.utils.data import Dataset

from minidet.apps.bulk.dist import process_alive
from minidet.imageio import DEFAULT_MAX_PIXELS, ImageReadError, read_image

PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ImageFiles(Dataset):
    """``(image_id, path)`` pairs read as HxWx3 uint8 BGR arrays: ``dataset[i]`` is ``(image_id, image)``, the image
    being the array or, for a file that cannot be read or (``sizes``: id -> (height, width)) has another size than
    the annotations say, a one-line ``"<path>: <what is wrong>"``, so that no exception crosses the worker boundary.
    ``read(path, max_pixels)`` reads one image (default :func:`read_image`)."""

    def __init__(self, items: Sequence[tuple[int, str]], max_pixels: int = DEFAULT_MAX_PIXELS,
                 sizes: Mapping[int, tuple[int, int]] | None = None,
                 read: Callable[[str, int], np.ndarray] = read_image) -> None:
        self.items = list(items)
        self.max_pixels = max_pixels
        self.sizes = dict(sizes) if sizes is not None else {}
        self.read = read

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray | str]:
        image_id, path = self.items[index]
        try:
            image = self.read(path, self.max_pixels)
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


def _die_with_parent(parent_pid: int, worker_id: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl to call: torch's own parent check remains
        return
    if os.getppid() != parent_pid and not process_alive(parent_pid):  # it died before prctl: no signal will come
        os._exit(1)


def worker_init_fn() -> Callable[[int], None]:
    """A DataLoader ``worker_init_fn``: on Linux the kernel sends each worker SIGKILL when the process that started
    it dies, however it dies (a worker whose parent died before that was set exits at once); elsewhere a no-op.
    The kernel watches the thread that started the worker: iterate from the main thread."""
    return functools.partial(_die_with_parent, os.getpid())


def collate(batch: list) -> list:
    """Keep a batch as the list of ``(image_id, image or error)`` items (images differ in size)."""
    return list(batch)


def coco_image_files(images: list[dict], image_root: str) -> list[tuple[int, str]]:
    """``(id, image_root/file_name)`` for the ``images`` entries of a COCO annotation file, by id."""
    return [(int(im["id"]), os.path.join(image_root, im["file_name"])) for im in sorted(images, key=lambda m: m["id"])]
