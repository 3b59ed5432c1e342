"""Fine-tuned checkpoints with their own classes: the class count (and class-agnostic heads) read from the
checkpoint, names from MODEL.CLASS_NAMES / the file / the dataset / by index, category ids mapped to a dataset's.

The references: torchvision's own ``MaskRCNN(num_classes=K)``; for Detectron, detectron2 and maskrcnn-benchmark,
the family's COCO-sized model (whose arithmetic the family tests restate) with the same predictor rows and every
other class made impossible (a logit bias of -1e4: probability exactly 0), so that only the class handling of a
K-class model is under test (the background first or last, class-specific or agnostic deltas and masks).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import minidet
from helpers import FEWER, ROOT, config, images_bgr, load_tool, one_error_line
from minidet.apps.bench.reference import build_tv, run_tv
from minidet.apps.compare import assert_same_detections, compare_detections
from minidet.checkpoint import CheckpointError
from minidet.config import ConfigError, validate_cfg
from minidet.predictor import classes_of
from minidet.testing.checkpoints import d2_weights, make_blobs, mb_state_shapes, mb_weights, write_detectron_pkl
from minidet.testing.mmdet import mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint

SIZE = ["INPUT.MIN_SIZE_TEST", 240, "INPUT.MAX_SIZE_TEST", 400]
SHAPES = [(200, 260), (240, 180)]
TINY = ROOT.parent / "shared" / "data" / "coco_tiny"
NAMES = ["cell", "nucleus", "debris"]
FAST = ["INPUT.MIN_SIZE_TEST", 120, "INPUT.MAX_SIZE_TEST", 200, "MODEL.RPN.PRE_NMS_TOPK_TEST", 100,
        "MODEL.RPN.POST_NMS_TOPK_TEST", 50, "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", 10]  # runs that test no numbers


# ----------------------------------------------------------------------------------------------- torchvision


@pytest.fixture(scope="module")
def tv_three(tmp_path_factory):
    """torchvision's Mask R-CNN for 3 classes (+ background) as its tutorial fine-tunes one: its file, detections."""
    model = build_tv(1, 240, 400, seed=3, num_classes=4)
    path = tmp_path_factory.mktemp("tv3") / "model.pth"
    torch.save(model.state_dict(), path)
    return path, run_tv(model, images_bgr(SHAPES))


def test_torchvision_fine_tuned_runs_unedited_and_equals_torchvision(tv_three):
    path, ref = tv_three
    p = minidet.Predictor(config("configs/torchvision/maskrcnn_resnet50_fpn.yaml", *SIZE, weights=path))
    assert p.cfg.MODEL.ROI_HEADS.NUM_CLASSES == 4  # the shipped config says 91: the checkpoint decides
    assert p.classes.own and p.class_names == ["__background__", "class_1", "class_2", "class_3"]
    assert p.classes_summary.startswith("3 classes (background excluded) from the checkpoint: class_1, class_2")
    outs = p.predict_batch(images_bgr(SHAPES))
    assert sum(len(o["scores"]) for o in outs) > 0
    for ours, theirs in zip(outs, ref):
        assert_same_detections(ours, theirs)
        assert ours["category_ids"].tolist() == ours["labels"].tolist()  # ids 1..3: the index


def test_names_come_from_the_config_and_their_count_is_checked(tv_three):
    path, _ = tv_three
    cfg = config("configs/torchvision/maskrcnn_resnet50_fpn.yaml", *SIZE, "MODEL.CLASS_NAMES", ",".join(NAMES),
                 weights=path)
    p = minidet.Predictor(cfg)
    assert p.class_names == ["__background__", *NAMES]
    assert "cell, nucleus, debris (names: MODEL.CLASS_NAMES)" in p.classes_summary
    with pytest.raises(ConfigError, match="MODEL.CLASS_NAMES gives 2 class names but the checkpoint has 3 classes"):
        minidet.Predictor(config("configs/torchvision/maskrcnn_resnet50_fpn.yaml", *SIZE,
                                 "MODEL.CLASS_NAMES", "cell,nucleus", weights=path))


def test_infer_writes_the_own_names_and_ids(tv_three, tmp_path, capsys):
    path, _ = tv_three
    image = tmp_path / "a.jpg"
    cv2.imwrite(str(image), images_bgr(SHAPES)[0])
    out = tmp_path / "out"
    argv = ["--config-file", "torchvision/maskrcnn_resnet50_fpn", "--input", str(image), "--output", str(out),
            "--results", str(tmp_path / "all.json"), "--classes", "cell,debris", "--vis-thresh", "0",
            "MODEL.WEIGHTS", str(path), "MODEL.CLASS_NAMES", ",".join(NAMES), *map(str, SIZE)]
    assert load_tool(Path("infer.py")).main(argv) == 0
    stdout = capsys.readouterr().out
    assert "infer: 3 classes (background excluded) from the checkpoint: cell, nucleus, debris" in stdout
    insts = json.loads((out / "a.json").read_text())["instances"]
    assert insts and {(i["category_id"], i["category_name"]) for i in insts} <= {(1, "cell"), (3, "debris")}
    doc = json.loads((tmp_path / "all.json").read_text())
    assert doc["categories"] == [{"id": k, "name": n} for k, n in enumerate(NAMES, 1)]
    drawn = cv2.imread(str(out / "a.jpg"))
    assert drawn is not None and drawn.shape[:2] == SHAPES[0]


# ------------------------------------------------------------------ Detectron, detectron2, maskrcnn-benchmark


def _rows(v, idx):
    return v[idx] if isinstance(v, np.ndarray) else v[torch.as_tensor(idx)]


def _impossible(v, keep, bias: bool):
    """``v`` (rows = classes) with the rows not in ``keep`` impossible: zero weights, a -1e4 bias."""
    out = v.copy() if isinstance(v, np.ndarray) else v.clone()
    other = [k for k in range(len(out)) if k not in keep]
    out[other] = -1e4 if bias else 0
    return out


def _tile(v, n: int):
    """``v`` repeated ``n`` times along its first axis."""
    if isinstance(v, np.ndarray):
        return np.tile(v, (n,) + (1,) * (v.ndim - 1))
    return v.repeat(n, *([1] * (v.ndim - 1)))


def _blocks(rows: list[int]) -> list[int]:
    """The 4 delta rows of each class in ``rows``."""
    return [4 * k + j for k in rows for j in range(4)]


FAMILIES = {  # config, the predictor's (class logits, deltas, mask logits) keys, background last, file writer
    "detectron": ("configs/detectron/e2e_mask_rcnn_R-50-FPN_1x.yaml",
                  ("cls_score_{}", "bbox_pred_{}", "mask_fcn_logits_{}"), False, ("w", "b")),
    "detectron2": ("configs/detectron2/mask_rcnn_R_50_FPN_3x.yaml",
                   ("roi_heads.box_predictor.cls_score.{}", "roi_heads.box_predictor.bbox_pred.{}",
                    "roi_heads.mask_head.predictor.{}"), True, ("weight", "bias")),
    "maskrcnn_benchmark": ("configs/maskrcnn_benchmark/e2e_mask_rcnn_R_50_FPN_1x.yaml",
                           ("roi_heads.box.predictor.cls_score.{}", "roi_heads.box.predictor.bbox_pred.{}",
                            "roi_heads.mask.predictor.mask_fcn_logits.{}"), False, ("weight", "bias")),
    "mmdetection": ("configs/mmdetection/mask-rcnn_r50_fpn_1x_coco.yaml",
                    ("roi_head.bbox_head.fc_cls.{}", "roi_head.bbox_head.fc_reg.{}",
                     "roi_head.mask_head.conv_logits.{}"), True, ("weight", "bias")),
}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Each family's COCO-sized synthetic weights."""
    return {
        "detectron": make_blobs("R-50-FPN", seed=7),
        "detectron2": d2_weights(50, seed=7),
        "maskrcnn_benchmark": mb_weights(mb_state_shapes(50), seed=7),
        "mmdetection": mmdet_weights(mmdet_state_shapes(50), seed=7),
    }


def _write(family: str, state: dict, path: Path) -> Path:
    if family == "detectron":
        write_detectron_pkl(str(path), state)
    elif family == "detectron2":
        path.write_bytes(pickle.dumps({"model": state, "__author__": "fine-tuned"}))
    elif family == "mmdetection":  # its meta names the COCO classes: the fine-tuned file's must not (none here)
        write_mmdet_checkpoint(path, state, meta={"mmdet_version": "3.3.0"})
    else:
        torch.save({"model": state}, path)
    return path


def _variants(family: str, state: dict, picked: list[int], agnostic: bool) -> tuple[dict, dict]:
    """(a checkpoint of the classes ``picked`` (indices into the zoo model's foreground), the zoo-sized reference
    with the same rows and every other class impossible); ``agnostic``: one set of deltas and one mask channel
    (the reference repeats them for every class)."""
    _, (cls, box, mask), bg_last, (w, b) = FAMILIES[family]
    total = len(state[cls.format(w)])  # classes + background
    bg = total - 1 if bg_last else 0
    fg = [k + (0 if bg_last else 1) for k in picked]  # their rows
    rows = fg + [bg] if bg_last else [bg] + fg
    small, ref = dict(state), dict(state)
    for part in (w, b):
        small[cls.format(part)] = _rows(state[cls.format(part)], rows)
        ref[cls.format(part)] = _impossible(state[cls.format(part)], set(rows), bias=part == b)
    own = fg if bg_last else [bg] + fg  # deltas and mask channels: detectron2 has none for the background
    for part in (w, b):
        deltas, masks = state[box.format(part)], state[mask.format(part)]
        if not agnostic:
            small[box.format(part)] = _rows(deltas, _blocks(own))
            small[mask.format(part)] = _rows(masks, own)
            continue
        one = fg[0]  # the deltas and mask channel every class shares
        small[box.format(part)] = _rows(deltas, _blocks([one] if bg_last else [bg, one]))  # Detectron: bg and fg
        small[mask.format(part)] = _rows(masks, [one])
        ref[box.format(part)] = _tile(_rows(deltas, _blocks([one])), len(deltas) // 4)
        ref[mask.format(part)] = _tile(_rows(masks, [one]), len(masks))
    return small, ref


# the first check runs a family with the background first and one with it last; the rest is slow (5 s each)
QUICK_OWN = {("torchvision", "3-classes"), ("mmdetection", "3-classes")}
OWN_CASES = [pytest.param(family, picked, agnostic, id=f"{name}-{family}",
                          marks=() if (family, name) in QUICK_OWN else pytest.mark.slow)
             for name, picked, agnostic in (("3-classes", [0, 2, 16], False), ("2-classes", [5, 1], False),
                                            ("3-classes-agnostic", [0, 2, 16], True))
             for family in FAMILIES]


@pytest.mark.parametrize(("family", "picked", "agnostic"), OWN_CASES)
def test_each_family_runs_its_own_classes(zoo, tmp_path, family, picked, agnostic):
    config_file, _, bg_last, _ = FAMILIES[family]
    small, ref = _variants(family, zoo[family], picked, agnostic)
    fine = minidet.Predictor(config(config_file, *SIZE, *FEWER, weights=_write(family, small, tmp_path / "fine.bin")))
    coco = minidet.Predictor(config(config_file, *SIZE, *FEWER, weights=_write(family, ref, tmp_path / "ref.bin")))
    k = len(picked)
    assert fine.classes.own and fine.classes.count == k and not coco.classes.own
    assert fine.cfg.MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG == agnostic
    assert fine.cfg.MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK == agnostic
    # the fine-tuned model's label of each zoo label it keeps
    label = {z + (0 if bg_last else 1): j + (0 if bg_last else 1) for j, z in enumerate(picked)}
    n = 0
    for image in images_bgr(SHAPES, seed=5):
        ours, theirs = fine(image), coco(image)
        theirs = {**theirs, "labels": torch.tensor([label[int(t)] for t in theirs["labels"]], dtype=torch.int64)}
        # the two predictors are layers of other widths (K vs 81 outputs), whose sums BLAS may order otherwise: a
        # mask probability at the threshold can flip one pixel, which the "same detections" rule counts on a
        # small mask; nothing else may differ
        m = compare_detections(ours, theirs)
        assert not m.problem() or (m.problem().startswith("mask IoU") and m.worst_pixels <= 1), m.problem()
        n += len(ours["scores"])
    assert n > 0


@pytest.mark.slow
def test_a_detectree2_style_checkpoint_runs_unedited(tmp_path, capsys):
    """What detectree2 (tree crowns on aerial tiles) trains and ships: detectron2's R-101-FPN Mask R-CNN fine-tuned
    to one class, saved by detectron2's Checkpointer (``model_final.pth``: torch tensors with the optimizer's and
    scheduler's state beside them). It loads unedited: one class found, the same detections as the COCO-sized
    model with every other class impossible, and ``minidet infer --slice`` runs it over a tile set's image."""
    state = d2_weights(101, seed=11)
    small, ref = _variants("detectron2", state, [0], False)
    path = tmp_path / "model_final.pth"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in small.items()},
                "optimizer": {"state": {}, "param_groups": [{"lr": 0.01, "momentum": 0.9, "params": [0, 1]}]},
                "scheduler": {"base_lrs": [0.01], "last_epoch": 2999}, "iteration": 2999}, path)
    cfg_file = "configs/detectron2/mask_rcnn_R_101_FPN_3x.yaml"
    fine = minidet.Predictor(config(cfg_file, *SIZE, weights=path))
    coco = minidet.Predictor(config(cfg_file, *SIZE, weights=_write("detectron2", ref, tmp_path / "ref.pkl")))
    assert fine.classes.own and fine.classes.count == 1 and fine.cfg.MODEL.RESNETS.DEPTH == 101
    n = 0
    for image in images_bgr(SHAPES, seed=5):
        ours, theirs = fine(image), coco(image)
        m = compare_detections(ours, theirs)
        assert not m.problem() or (m.problem().startswith("mask IoU") and m.worst_pixels <= 1), m.problem()
        n += len(ours["scores"])
    assert n > 0
    image = tmp_path / "tile.png"
    cv2.imwrite(str(image), images_bgr([(300, 420)], seed=6)[0])
    argv = ["--config-file", "detectron2/mask_rcnn_R_101_FPN_3x", "--input", str(image), "--output",
            str(tmp_path / "out"), "--no-vis", "--workers", "0", "--slice", "256", "MODEL.WEIGHTS", str(path),
            "MODEL.CLASS_NAMES", "tree", *map(str, SIZE)]
    assert load_tool(ROOT / "tools" / "infer.py").main(argv) == 0, capsys.readouterr().err
    record = json.loads((tmp_path / "out" / "tile.json").read_text())
    assert record["instances"] and {i["category_name"] for i in record["instances"]} == {"tree"}


# ----------------------------------------------------------------------------- evaluation on a dataset of its own


@pytest.fixture(scope="module")
def own_dataset(tmp_path_factory):
    """4 coco_tiny images with persons, cups and chairs as a dataset of its own: ids 7, 9, 12, other names."""
    if not TINY.is_dir():
        pytest.skip(f"needs ../shared/data/coco_tiny ({TINY} is absent)")
    src = json.loads((TINY / "annotations" / "instances_val2017.json").read_text())
    mapping = {1: (7, "walker"), 47: (9, "mug"), 62: (12, "seat")}
    anns = [a for a in src["annotations"] if a["category_id"] in mapping]
    ids = sorted({a["image_id"] for a in anns})[:4]
    folder = tmp_path_factory.mktemp("own")
    (folder / "images").mkdir()
    images = [im for im in src["images"] if im["id"] in ids]
    for im in images:
        (folder / "images" / im["file_name"]).write_bytes((TINY / "val2017" / im["file_name"]).read_bytes())
    doc = {
        "images": images,
        "annotations": [{**a, "category_id": mapping[a["category_id"]][0]} for a in anns if a["image_id"] in ids],
        "categories": [{"id": i, "name": n, "supercategory": "x"} for i, n in mapping.values()],
    }
    (folder / "ann.json").write_text(json.dumps(doc))
    return folder


def _eval(capsys, own_dataset, tv_three, out: Path, *opts: str) -> tuple[int, str, str]:
    path, _ = tv_three
    argv = ["--config-file", "torchvision/maskrcnn_resnet50_fpn", "--ann", str(own_dataset / "ann.json"),
            "--images", str(own_dataset / "images"), "--output", str(out), "--workers", "0",
            "MODEL.WEIGHTS", str(path), *map(str, SIZE), *opts]
    rc = load_tool(Path("eval_coco.py")).main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.slow
def test_eval_maps_named_classes_by_name(capsys, own_dataset, tv_three, tmp_path):
    rc, out, err = _eval(capsys, own_dataset, tv_three, tmp_path / "named", "MODEL.CLASS_NAMES", "seat,walker,mug")
    assert rc == 0, err
    results = json.loads((tmp_path / "named" / "coco_instances_results.json").read_text())
    assert results and {r["category_id"] for r in results} <= {7, 9, 12}
    # the model's classes 1, 2, 3 are seat, walker, mug: the dataset's 12, 7, 9
    p = minidet.Predictor(config("configs/torchvision/maskrcnn_resnet50_fpn.yaml", *SIZE, weights=tv_three[0]))
    image = cv2.imread(str(next((own_dataset / "images").iterdir())))
    labels = set(p(image)["labels"].tolist())
    assert labels  # some detections, of model labels that must map as named
    metrics = json.loads((tmp_path / "named" / "metrics.json").read_text())
    assert set(metrics) == {"bbox", "segm", "scoring"}
    # evaluating the infer results file of the same model: the same metrics (its categories map by name)
    infer_out = tmp_path / "infer"
    argv = ["--config-file", "torchvision/maskrcnn_resnet50_fpn", "--input", str(own_dataset / "images"),
            "--output", str(infer_out), "--no-vis", "--results", str(tmp_path / "all.json"),
            "MODEL.WEIGHTS", str(tv_three[0]), "MODEL.CLASS_NAMES", "seat,walker,mug", *map(str, SIZE)]
    assert load_tool(Path("infer.py")).main(argv) == 0
    capsys.readouterr()
    argv = ["--ann", str(own_dataset / "ann.json"), "--results", str(tmp_path / "all.json"),
            "--output", str(tmp_path / "files")]
    assert load_tool(Path("eval_coco.py")).main(argv) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "files" / "metrics.json").read_text()) == metrics


def test_eval_maps_unnamed_classes_by_order_and_names_them(capsys, own_dataset, tv_three, tmp_path):
    rc, out, err = _eval(capsys, own_dataset, tv_three, tmp_path / "order")
    assert rc == 0, err
    results = json.loads((tmp_path / "order" / "coco_instances_results.json").read_text())
    assert results and {r["category_id"] for r in results} <= {7, 9, 12}


def test_eval_mismatch_is_one_line_with_both_sides(capsys, own_dataset, tv_three, tmp_path):
    rc, _, err = _eval(capsys, own_dataset, tv_three, tmp_path / "bad", "MODEL.CLASS_NAMES", "seat,walker,cup")
    assert rc == 2
    line = one_error_line(err)
    assert "'cup' is not a category of the dataset" in line and "the model's 3: 'seat', 'walker', 'cup'" in line
    assert "7 'walker', 9 'mug', 12 'seat'" in line
    assert not (tmp_path / "bad").exists()


def test_mmdetection_names_come_from_the_files_meta(zoo, tmp_path):
    small, _ = _variants("mmdetection", zoo["mmdetection"], [0, 2, 16], agnostic=False)
    path = tmp_path / "fine.pth"
    write_mmdet_checkpoint(path, small, meta={"mmdet_version": "3.3.0", "dataset_meta": {"classes": NAMES}})
    config_file = FAMILIES["mmdetection"][0]
    p = minidet.Predictor(config(config_file, *SIZE, weights=path))
    assert p.class_names == NAMES and p.classes.ids == (1, 2, 3)
    assert p.classes_summary.endswith(f"cell, nucleus, debris (names: {path} (its meta))")
    p = minidet.Predictor(config(config_file, *SIZE, "MODEL.CLASS_NAMES", "a,b,c", weights=path))
    assert p.class_names == ["a", "b", "c"]  # the config's names come first


# --------------------------------------------------------------- names that cannot name classes, and what can


def _mm_box_predictor(path: Path, k: int, meta: dict) -> Path:
    """An mmdetection file (``{"meta", "state_dict"}``, torch's legacy format, as mmdetection publishes them) of a
    ``k``-class model's box predictor alone: what the classes are read from (``classes_of`` builds no model)."""
    head = "roi_head.bbox_head"
    state = {f"{head}.fc_cls.weight": torch.zeros(k + 1, 16), f"{head}.fc_cls.bias": torch.zeros(k + 1),
             f"{head}.fc_reg.weight": torch.zeros(4 * k, 16), f"{head}.fc_reg.bias": torch.zeros(4 * k)}
    write_mmdet_checkpoint(path, state, meta={"mmdet_version": "3.3.0", **meta})
    return path


BAD_META = {  # the meta of a 3-class file -> the entry named and what is wrong with it
    "3.x-twice": ({"dataset_meta": {"classes": ("cell", "nucleus", "cell")}},
                  "(meta dataset_meta.classes): 'cell' is given twice (names 1 and 3)"),
    "2.x-empty": ({"CLASSES": ("cell", "", "debris")}, "(meta CLASSES): name 2 is empty"),
    "blank": ({"CLASSES": ["cell", " ", "debris"]}, "(meta CLASSES): name 2 is blank (' ')"),
    "numbers": ({"dataset_meta": {"classes": [1, 2, 3]}},
                "(meta dataset_meta.classes): name 1 is 1 (int), not a string"),
    "mapping": ({"dataset_meta": {"classes": {"cell": 1}}}, "(meta dataset_meta.classes): a dict, not a list of names"),
    "none-at-all": ({"CLASSES": ()}, "(meta CLASSES): an empty tuple, no names"),
    "upper-case-3.x": ({"dataset_meta": {"CLASSES": ["a", "a", "b"]}},  # mmdetection lowercases dataset_meta's keys
                       "(meta dataset_meta.CLASSES): 'a' is given twice (names 1 and 2)"),
}


@pytest.mark.parametrize("case", list(BAD_META))
def test_a_files_names_are_checked_as_model_class_names_is(tmp_path, case):
    meta, reason = BAD_META[case]
    path = _mm_box_predictor(tmp_path / "fine.pth", 3, meta)
    with pytest.raises(CheckpointError) as e:
        classes_of(config(FAMILIES["mmdetection"][0], weights=path))
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{path}: its class names {reason}; "), line
    assert line.endswith("set MODEL.CLASS_NAMES (names separated by commas), which overrides the file's names"), line
    classes, summary = classes_of(config(FAMILIES["mmdetection"][0], "MODEL.CLASS_NAMES", "x,y,z", weights=path))
    assert classes.names == ("x", "y", "z") and summary.endswith("x, y, z (names: MODEL.CLASS_NAMES)")


def test_a_single_string_names_one_class_as_mmdetection_reads_it(tmp_path):
    """``classes = ('balloon')`` in an mmdetection config is a string, not a tuple; its datasets match it as one
    category name, and the file keeps the string: one class named balloon, not seven named by its letters."""
    path = _mm_box_predictor(tmp_path / "balloon.pth", 1, {"dataset_meta": {"classes": "balloon"}})
    classes, summary = classes_of(config(FAMILIES["mmdetection"][0], weights=path))
    assert classes.names == ("balloon",) and summary.endswith(f"balloon (names: {path} (its meta))")
    three = _mm_box_predictor(tmp_path / "three.pth", 3, {"CLASSES": "balloon"})
    with pytest.raises(ConfigError) as e:
        classes_of(config(FAMILIES["mmdetection"][0], weights=three))
    assert str(e.value) == (f"{three} (its meta) gives 1 class names but the checkpoint has 3 classes (background "
                            "excluded); set MODEL.CLASS_NAMES, which overrides the file's names")


def test_class_names_from_the_command_line_and_python_are_checked(tmp_path, capsys):
    cfg = minidet.get_cfg()
    for given, item in (("a,,b", 2), ("a,b,", 3), (",a", 1)):
        with pytest.raises(ConfigError, match=rf"^config key MODEL.CLASS_NAMES: item {item} of '{given}' is empty "):
            cfg.merge_from_list(["MODEL.CLASS_NAMES", given])
    cfg.merge_from_list(["MODEL.CLASS_NAMES", " cell , nucleus "])
    assert cfg.MODEL.CLASS_NAMES == ["cell", "nucleus"]
    cfg.merge_from_list(["MODEL.CLASS_NAMES", ""])  # none: the checkpoint's or the dataset's names
    assert cfg.MODEL.CLASS_NAMES == []
    cfg.MODEL.CLASS_NAMES = "dog"  # in Python, not through a list: one string, not the names d, o, g
    with pytest.raises(ConfigError, match="MODEL.CLASS_NAMES must be distinct, non-empty names: the string 'dog', "
                                          "not a list of names"):
        validate_cfg(cfg)
    cfg.MODEL.CLASS_NAMES = ["cell", "nucleus", "cell"]
    with pytest.raises(ConfigError, match=r"names: 'cell' is given twice \(names 1 and 3\); got \['cell', "):
        validate_cfg(cfg)
    # as a user meets it: one line, before any weights are read
    image = tmp_path / "a.png"
    cv2.imwrite(str(image), images_bgr([(40, 40)])[0])
    argv = ["--config-file", "torchvision/maskrcnn_resnet50_fpn", "--input", str(image), "--output",
            str(tmp_path / "out"), "MODEL.WEIGHTS", str(tmp_path / "absent.pth"), "MODEL.CLASS_NAMES", "cell,,debris"]
    assert load_tool(Path("infer.py")).main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == ("error: config key MODEL.CLASS_NAMES: item 2 of 'cell,,debris' is empty (a list here is "
                    "comma-separated values, none of them empty)")


def test_infer_with_a_files_duplicated_names_is_one_line_until_the_config_names_them(tmp_path, capsys):
    state = mmdet_weights(mmdet_state_shapes(50, num_classes=3), seed=7)
    path = tmp_path / "fine.pth"
    write_mmdet_checkpoint(path, state, meta={"mmdet_version": "3.3.0",
                                              "dataset_meta": {"classes": ("cell", "nucleus", "cell")}})
    image = tmp_path / "a.png"
    cv2.imwrite(str(image), images_bgr(SHAPES)[0])
    argv = ["--config-file", "mmdetection/mask-rcnn_r50_fpn_1x_coco", "--input", str(image), "--output",
            str(tmp_path / "out"), "--workers", "0", "MODEL.WEIGHTS", str(path), *map(str, SIZE)]
    assert load_tool(Path("infer.py")).main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {path}: its class names (meta dataset_meta.classes): 'cell' is given twice"), line
    assert load_tool(Path("infer.py")).main([*argv, "--no-vis", "MODEL.CLASS_NAMES", "cell,nucleus,debris"]) == 0
    assert "3 classes (background excluded) from the checkpoint: cell, nucleus, debris" in capsys.readouterr().out


def test_names_the_drawing_cannot_show_are_one_warning_per_run(tv_three, tmp_path, capsys):
    """Greek and CJK letters are in no font OpenCV draws labels with (4.x: ASCII only; 5.x: also Latin, Cyrillic,
    Hebrew, Arabic): one warning for the run, whatever the number of images, naming those names only; the JSON
    records have them in full. None when no label is drawn or those classes are filtered out."""
    path, _ = tv_three
    for k, image in enumerate(images_bgr(SHAPES)):
        cv2.imwrite(str(tmp_path / f"{k}.jpg"), image)
    names = "cell,αβγ,中文"

    def infer(out: str, *opts: str, pattern: str = "*.jpg") -> str:
        argv = ["--config-file", "torchvision/maskrcnn_resnet50_fpn", "--input", str(tmp_path / pattern),
                "--output", str(tmp_path / out), "--workers", "0", "--vis-thresh", "0", *opts,
                "MODEL.WEIGHTS", str(path), *map(str, FAST)]
        assert load_tool(Path("infer.py")).main(argv) == 0
        return capsys.readouterr().err

    err = infer("out", "MODEL.CLASS_NAMES", names)  # two images, one line
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: the drawings show 2 class names with '?' for the characters OpenCV "
                        f"{cv2.__version__}'s font lacks: 'αβγ', '中文'; the JSON records have the names in full"], err
    recorded = {i["category_name"] for k in range(2) for i in json.loads((tmp_path / f"out/{k}.json").read_text(
        encoding="utf-8"))["instances"]}
    assert recorded and recorded <= {"cell", "αβγ", "中文"}
    for out, opts in (("labels", ["--no-labels"]), ("vis", ["--no-vis"]), ("kept", ["--classes", "cell"])):
        assert "warning:" not in infer(out, *opts, "MODEL.CLASS_NAMES", names, pattern="0.jpg"), opts
    assert "warning:" not in infer("ascii", "MODEL.CLASS_NAMES", ",".join(NAMES), pattern="0.jpg")
