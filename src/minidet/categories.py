"""COCO category ids and names, and how each checkpoint family indexes its classes:

* ``coco91`` (torchvision): 91 outputs, the index *is* the COCO id; index 0 is the background and the ten ids
  COCO never used are placeholders named ``"N/A"`` (no COCO category has their id: evaluation ignores them).
* ``coco81`` (Detectron): 81 outputs, index 0 is the background, 1..80 the categories by increasing id.
* ``coco80`` (detectron2): 80 outputs, 0..79 the categories by increasing id (the background is the extra last one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def layout_count(layout: str) -> int:
    """Classes of ``layout`` without the background (coco91: 90 slots, of which 10 unused)."""
    return sum(1 for cid in category_ids(layout) if cid != -1)


@dataclass(frozen=True)
class Classes:
    """What the model's class indices (its ``labels``) are: ``names`` and category ``ids`` per index (the background,
    first or last as the weights' family has it, is named ``BACKGROUND`` with id -1 where it has an index); ``own``:
    a checkpoint's own classes rather than a COCO layout (``MODEL.CATEGORY_LAYOUT``)."""

    names: tuple[str, ...]
    ids: tuple[int, ...]
    own: bool = False

    @property
    def count(self) -> int:
        """Classes without the background (and, in coco91, with its unused slots)."""
        return sum(1 for i in self.ids if i != -1)

    def real(self) -> list[tuple[int, int, str]]:
        """``(index, category id, name)`` of each class a detection can have (no background, no unused slot)."""
        return [(k, i, n) for k, (i, n) in enumerate(zip(self.ids, self.names)) if i != -1 and n != UNUSED]

    def with_categories(self, ids: list[int], names: list[str]) -> Classes:
        """These classes (own classes: every index but the background's) with other category ids and names."""
        slots = [k for k, i in enumerate(self.ids) if i != -1]
        new_ids, new_names = list(self.ids), list(self.names)
        for k, i, n in zip(slots, ids, names, strict=True):
            new_ids[k], new_names[k] = int(i), str(n)
        return Classes(tuple(new_names), tuple(new_ids), self.own)


def coco_classes(layout: str) -> Classes:
    """The COCO layout ``layout``'s classes (``class_names``, ``category_ids``)."""
    return Classes(tuple(class_names(layout)), tuple(category_ids(layout)))


def own_classes(names: list[str], background_last: bool, ids: list[int] | None = None) -> Classes:
    """A checkpoint's own classes, ``names`` in class order; ``ids`` their category ids (default 1, 2, ...); the
    background index first or last."""
    ids = list(range(1, len(names) + 1)) if ids is None else list(ids)
    if background_last:
        return Classes(tuple(names), tuple(ids), own=True)
    return Classes((BACKGROUND, *names), (-1, *ids), own=True)


def placeholder_names(count: int) -> list[str]:
    """The names of classes nothing names: ``class_1``, ``class_2``, ... (never COCO's)."""
    return [f"class_{k}" for k in range(1, count + 1)]


def names_problem(names: Any) -> str | None:
    """What keeps ``names`` from naming classes, in a few words (``"'cell' is given twice (names 1 and 3)"``), or
    None when it is a list (or tuple) of distinct, non-empty strings. The one rule for every source of class names:
    ``MODEL.CLASS_NAMES``, the names a checkpoint carries, :func:`resolve_classes`."""
    if not isinstance(names, (list, tuple)):
        kind = f"the string {names!r}" if isinstance(names, str) else f"a {type(names).__name__}"
        return f"{kind}, not a list of names"
    first: dict[str, int] = {}
    for k, name in enumerate(names, 1):
        if not isinstance(name, str):
            return f"name {k} is {name!r} ({type(name).__name__}), not a string"
        if not name.strip():
            return f"name {k} is empty" if not name else f"name {k} is blank ({name!r})"
        if name in first:
            return f"{name!r} is given twice (names {first[name]} and {k})"
        first[name] = k
    return None


def resolve_classes(layout: str, count: int, background_last: bool, *sources: tuple[str, list[str] | None]
                    ) -> tuple[Classes, str]:
    """The classes of a checkpoint with ``count`` classes (background excluded): the first of ``sources`` (``(what,
    names)``: the config's ``MODEL.CLASS_NAMES``, the checkpoint's own, ...) that gives names names them; with none,
    ``class_1`` ... A checkpoint of the config's COCO ``layout`` size whose names (if any) are COCO's keeps the COCO
    layout. Returns the classes and where their names came from ("" for a COCO layout). ValueError (one line naming
    ``what``) when the names are no list of distinct, non-empty strings (:func:`names_problem`), or another number
    of names than the checkpoint has classes."""
    what, names = next(((w, n) for w, n in sources if n), ("", None))
    if names is not None and (problem := names_problem(names)):
        raise ValueError(f"{what}: the class names must be distinct, non-empty strings: {problem}")
    names = None if names is None else list(names)
    if names is not None and len(names) != count:
        raise ValueError(f"{what} gives {len(names)} class names but the checkpoint has {count} classes "
                         "(background excluded)")
    coco = coco_classes(layout)
    same = lambda a, b: [n.lower().replace("_", " ") for n in a] == [n.lower().replace("_", " ") for n in b]  # noqa: E731
    if count == layout_count(layout) and (names is None or same(names, [n for _, _, n in coco.real()])):
        return coco, ""
    if names is None:
        return own_classes(placeholder_names(count), background_last), "none given: named by index"
    return own_classes(names, background_last), what
