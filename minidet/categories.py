"""COCO category ids and names, and how each checkpoint family indexes its classes.

* ``coco91`` (torchvision): 91 outputs, the index *is* the COCO id; index 0 is the background and
  the ten ids COCO never used are placeholders named ``"N/A"`` (their id is their index; no COCO
  category has it, so evaluation ignores them).
* ``coco81`` (Detectron): 81 outputs, index 0 is the background, 1..80 the categories by increasing id.
* ``coco80`` (detectron2): 80 outputs, 0..79 the categories by increasing id (the background score
  is the extra last output and has no index here).
"""

from __future__ import annotations

BACKGROUND = "__background__"
UNUSED = "N/A"
LAYOUTS = ("coco91", "coco81", "coco80")

_COCO_NAMES = {
    1: "person", 2: "bicycle", 3: "car", 4: "motorcycle", 5: "airplane", 6: "bus", 7: "train", 8: "truck",
    9: "boat", 10: "traffic light", 11: "fire hydrant", 13: "stop sign", 14: "parking meter", 15: "bench",
    16: "bird", 17: "cat", 18: "dog", 19: "horse", 20: "sheep", 21: "cow", 22: "elephant", 23: "bear", 24: "zebra",
    25: "giraffe", 27: "backpack", 28: "umbrella", 31: "handbag", 32: "tie", 33: "suitcase", 34: "frisbee",
    35: "skis", 36: "snowboard", 37: "sports ball", 38: "kite", 39: "baseball bat", 40: "baseball glove",
    41: "skateboard", 42: "surfboard", 43: "tennis racket", 44: "bottle", 46: "wine glass", 47: "cup", 48: "fork",
    49: "knife", 50: "spoon", 51: "bowl", 52: "banana", 53: "apple", 54: "sandwich", 55: "orange", 56: "broccoli",
    57: "carrot", 58: "hot dog", 59: "pizza", 60: "donut", 61: "cake", 62: "chair", 63: "couch",
    64: "potted plant", 65: "bed", 67: "dining table", 70: "toilet", 72: "tv", 73: "laptop", 74: "mouse",
    75: "remote", 76: "keyboard", 77: "cell phone", 78: "microwave", 79: "oven", 80: "toaster", 81: "sink",
    82: "refrigerator", 84: "book", 85: "clock", 86: "vase", 87: "scissors", 88: "teddy bear", 89: "hair drier",
    90: "toothbrush",
}
COCO_CATEGORIES: list[tuple[int, str]] = list(_COCO_NAMES.items())


def _layout_table(layout: str) -> list[tuple[int, str]]:
    """``(category_id, name)`` per class index of ``layout``; id -1 marks background."""
    if layout == "coco91":
        return [(-1, BACKGROUND)] + [(cid, _COCO_NAMES.get(cid, UNUSED)) for cid in range(1, 91)]
    if layout == "coco81":
        return [(-1, BACKGROUND), *COCO_CATEGORIES]
    if layout == "coco80":
        return list(COCO_CATEGORIES)
    raise ValueError(f"unknown category layout {layout!r}; expected one of {', '.join(LAYOUTS)}")


def class_names(layout: str) -> list[str]:
    """Name of each class index of a model using ``layout``."""
    return [name for _, name in _layout_table(layout)]


def category_ids(layout: str) -> list[int]:
    """COCO category id of each class index of ``layout``; -1 for background."""
    return [cid for cid, _ in _layout_table(layout)]
