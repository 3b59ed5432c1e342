"""COCO category table and the three class-index layouts."""

from __future__ import annotations

import pytest

from minidet.categories import COCO_CATEGORIES, LAYOUTS, category_ids, class_names

COCO_IDS = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27, 28,
    31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55,
    56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84,
    85, 86, 87, 88, 89, 90,
]
UNUSED_IDS = [12, 26, 29, 30, 45, 66, 68, 69, 71, 83]
BY_ID = dict(COCO_CATEGORIES)


def test_coco_table():
    assert [cid for cid, _ in COCO_CATEGORIES] == COCO_IDS
    names = [n for _, n in COCO_CATEGORIES]
    assert len(set(names)) == 80
    assert all(n == n.strip().lower() and n for n in names)
    spot = {1: "person", 3: "car", 10: "traffic light", 13: "stop sign", 44: "bottle", 62: "chair"}
    spot.update({67: "dining table", 72: "tv", 77: "cell phone", 89: "hair drier", 90: "toothbrush"})
    for cid, name in spot.items():
        assert BY_ID[cid] == name


def test_coco91_torchvision():
    names, ids = class_names("coco91"), category_ids("coco91")
    assert len(names) == len(ids) == 91
    assert names[0] == "__background__" and ids[0] == -1
    for cid in UNUSED_IDS:
        assert names[cid] == "N/A" and ids[cid] == cid  # torchvision: index == id
    for cid in COCO_IDS:
        assert ids[cid] == cid and names[cid] == BY_ID[cid]
    assert names.count("N/A") == 10


def test_coco81_detectron():
    names, ids = class_names("coco81"), category_ids("coco81")
    assert len(names) == len(ids) == 81
    assert names[0] == "__background__" and ids[0] == -1
    assert ids[1:] == COCO_IDS
    assert names[1] == "person" and names[12] == "stop sign" and names[80] == "toothbrush"


def test_coco80_detectron2():
    names, ids = class_names("coco80"), category_ids("coco80")
    assert len(names) == len(ids) == 80
    assert ids == COCO_IDS
    assert names[0] == "person" and names[11] == "stop sign" and names[79] == "toothbrush"
    assert "__background__" not in names


@pytest.mark.parametrize("layout", LAYOUTS)
def test_names_and_ids_agree(layout):
    for name, cid in zip(class_names(layout), category_ids(layout), strict=True):
        if cid == -1:
            assert name == "__background__"
        elif name == "N/A":
            assert cid in UNUSED_IDS
        else:
            assert BY_ID[cid] == name


def test_fresh_lists():
    a = class_names("coco80")
    a[0] = "changed"
    assert class_names("coco80")[0] == "person"


@pytest.mark.parametrize("func", [class_names, category_ids])
def test_unknown_layout(func):
    with pytest.raises(ValueError, match="coco90"):
        func("coco90")
