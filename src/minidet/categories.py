"""COCO category ids and names, and how each checkpoint family indexes its classes:

* ``coco91`` (torchvision): 91 outputs, the index *is* the COCO id; index 0 is the background and the ten ids
  COCO never used are placeholders named ``"N/A"`` (no COCO category has their id: evaluation ignores them).
* ``coco81`` (Detectron): 81 outputs, index 0 is the background, 1..80 the categories by increasing id.
* ``coco80`` (detectron2): 80 outputs, 0..79 the categories by increasing id (the background is the extra last one).
"""

from __future__ import annotations

BACKGROUND = "__background__"
UNUSED = "N/A"
LAYOUTS = ("coco91", "coco81", "coco80")

_COCO91_NAMES = (  # the name of each COCO id 1..90, UNUSED for the ids COCO never used
    "person,bicycle,car,motorcycle,airplane,bus,train,truck,boat,traffic light,fire hydrant,N/A,stop sign,"
    "parking meter,bench,bird,cat,dog,horse,sheep,cow,elephant,bear,zebra,giraffe,N/A,backpack,umbrella,N/A,N/A,"
    "handbag,tie,suitcase,frisbee,skis,snowboard,sports ball,kite,baseball bat,baseball glove,skateboard,surfboard,"
    "tennis racket,bottle,N/A,wine glass,cup,fork,knife,spoon,bowl,banana,apple,sandwich,orange,broccoli,carrot,"
    "hot dog,pizza,donut,cake,chair,couch,potted plant,bed,N/A,dining table,N/A,N/A,toilet,N/A,tv,laptop,mouse,"
    "remote,keyboard,cell phone,microwave,oven,toaster,sink,refrigerator,N/A,book,clock,vase,scissors,teddy bear,"
    "hair drier,toothbrush"
).split(",")
COCO_CATEGORIES: list[tuple[int, str]] = [(cid, name) for cid, name in enumerate(_COCO91_NAMES, 1) if name != UNUSED]


def _layout_table(layout: str) -> list[tuple[int, str]]:
    """``(category_id, name)`` per class index of ``layout``; id -1 marks background."""
    if layout == "coco91":
        return [(-1, BACKGROUND), *enumerate(_COCO91_NAMES, 1)]
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
