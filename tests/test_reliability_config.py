"""Issue 12, §1.6 and §3.11: every config value is checked against its range before a model is
built, and a broken config file is one line naming the file, line and column, as the user of
tools/infer.py and tools/eval_coco.py meets them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import pytest
import torch

import minidet
from helpers import load_tool, one_error_line
from minidet.apps.synthetic import structured_image
from minidet.config import RULES, ConfigError, leaves, validate_cfg

ROOT = Path(__file__).resolve().parent.parent
INFER = ROOT / "tools" / "infer.py"
EVAL = ROOT / "tools" / "eval_coco.py"
TV_CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"


@pytest.fixture
def weights(tmp_path) -> Path:
    """A real (if tiny) torch file: the config must be refused before any weights are read."""
    path = tmp_path / "w.pth"
    torch.save({"backbone.body.conv1.weight": torch.zeros(1)}, path)
    return path


def _infer(capsys, tmp_path: Path, config: Path, *opts: str) -> tuple[int, str]:
    img = tmp_path / "a.png"
    cv2.imwrite(str(img), structured_image(32, 32, seed=0))
    argv = ["--config-file", str(config), "--input", str(img), "--output", str(tmp_path / "out"), *opts]
    rc = load_tool(INFER).main(argv)
    return rc, capsys.readouterr().err


# ------------------------------------------------------------------------------ value ranges

# One bad value per class of key: (key, value on the command line, what the line must show).
BAD_VALUES = [
    ("MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "-1", "an integer in [1, 100000]; got -1"),
    ("MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "0", "got 0"),
    ("MODEL.ROI_HEADS.SCORE_THRESH_TEST", "1.5", "a number in [0, 1]; got 1.5"),
    ("MODEL.ROI_MASK_HEAD.THRESHOLD", "-0.5", "a number in [0, 1]; got -0.5"),
    ("MODEL.ROI_HEADS.NMS_THRESH_TEST", "0.0", "a number in (0, 1]; got 0.0"),
    ("MODEL.RPN.NMS_THRESH", "1.2", "a number in (0, 1]; got 1.2"),
    ("MODEL.RPN.PRE_NMS_TOPK_TEST", "0", "an integer in [1, 1000000]; got 0"),
    ("MODEL.RPN.POST_NMS_TOPK_TEST", "-5", "got -5"),
    ("MODEL.RPN.MIN_SIZE", "-1.0", "a number >= 0; got -1.0"),
    ("MODEL.ROI_HEADS.MIN_BOX_SIZE", "-0.01", "a number >= 0; got -0.01"),
    ("INPUT.MIN_SIZE_TEST", "0", "an integer in [1, 16384]; got 0"),
    ("INPUT.MAX_SIZE_TEST", "133300", "an integer in [1, 16384]; got 133300"),
    ("INPUT.SIZE_DIVISIBILITY", "0", "an integer in [1, 1024]; got 0"),
    ("INPUT.MAX_PIXELS", "-1", "an integer >= 0; got -1"),
    ("INPUT.PIXEL_RANGE", "0.0", "a number > 0; got 0.0"),
    ("MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION", "0", "got 0"),
    ("MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO", "-1", "an integer in [0, 64]; got -1"),
    ("MODEL.FPN.OUT_CHANNELS", "0", "got 0"),
    ("MODEL.ROI_BOX_HEAD.FC_DIM", "-1024", "got -1024"),
    ("MODEL.ROI_MASK_HEAD.CONV_DIM", "0", "got 0"),
    ("MODEL.RESNETS.NUM_GROUPS", "0", "got 0"),
    ("MODEL.ANCHOR_GENERATOR.SIZES", "[32, 64, 128]", "5 numbers, each in (0, 16384]; got [32, 64, 128]"),
    ("MODEL.ANCHOR_GENERATOR.SIZES", "[32, 64, 128, 256, -512]", "got [32, 64, 128, 256, -512]"),
    ("MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", "[0.5, 0.0, 2.0]", "one or more numbers, each > 0; got [0.5, 0.0, 2.0]"),
    ("MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", "[]", "got []"),
    ("MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS", "[10.0, 10.0, 5.0]", "4 numbers, each > 0; got [10.0, 10.0, 5.0]"),
    ("MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS", "[10.0, 10.0, 5.0, 0.0]", "got [10.0, 10.0, 5.0, 0.0]"),
    ("MODEL.PIXEL_STD", "[0.229, 0.0, 0.225]", "3 numbers, each > 0"),
    ("MODEL.PIXEL_MEAN", "[0.485, 0.456]", "3 finite numbers; got [0.485, 0.456]"),
    ("MODEL.FROZEN_BN_EPS", "-1e-5", "a number in [0, 1); got -1e-05"),
    ("MODEL.FROZEN_BN_EPS", "1e5", "a number in [0, 1); got 100000.0"),  # a typo of 1e-5
    ("MODEL.FROZEN_BN_EPS", "nan", "got nan"),
    ("MODEL.GN_EPS", "-1.0", "a number in [0, 1); got -1.0"),
    ("MODEL.GN_NUM_GROUPS", "0", "an integer in [1, 1024]; got 0"),
    ("TEST.IMS_PER_BATCH", "0", "an integer in [1, 1024]; got 0"),
    ("TEST.CHUNK_IMAGES", "-1", "an integer >= 0; got -1"),
    ("MODEL.ROI_HEADS.NUM_CLASSES", "0", "got 0"),
    ("MODEL.ROI_HEADS.NUM_CLASSES", "1", "must be >= 2; got 1"),  # coco91 counts the background
    ("MODEL.DEVICE", "gpu", "one of cpu, cuda, cuda:N; got 'gpu'"),
    ("MODEL.DEVICE", "cuda:x", "got 'cuda:x'"),
    ("TEST.AMP", "fp8", "one of '', bf16, fp16; got 'fp8'"),
]


@pytest.mark.parametrize("key,value,shown", BAD_VALUES, ids=[f"{k}={v}" for k, v, _ in BAD_VALUES])
def test_a_value_out_of_range_is_one_line_naming_the_key(tmp_path, capsys, weights, key, value, shown):
    rc, err = _infer(capsys, tmp_path, TV_CONFIG, "MODEL.WEIGHTS", str(weights), key, value)
    line = one_error_line(err)
    assert rc == 2 and line.startswith(f"error: {key} ") and shown in line, line
    assert not (tmp_path / "out" / "a.jpg").exists()


def test_group_norm_groups_must_divide_the_channels(tmp_path, capsys, weights):
    gn = ROOT / "configs" / "detectron" / "e2e_mask_rcnn_R-50-FPN_2x_gn.yaml"
    rc, err = _infer(capsys, tmp_path, gn, "MODEL.WEIGHTS", str(weights), "MODEL.GN_NUM_GROUPS", "48")
    assert rc == 2 and "MODEL.GN_NUM_GROUPS 48 must divide the channels" in one_error_line(err)
    opts = ["MODEL.WEIGHTS", str(weights), "MODEL.GN_NUM_GROUPS", "16", "MODEL.FPN.OUT_CHANNELS", "200"]
    rc, err = _infer(capsys, tmp_path, gn, *opts)
    assert rc == 2 and "GroupNorm normalizes: MODEL.FPN.OUT_CHANNELS is 200" in one_error_line(err)


def test_a_value_set_through_the_python_api_is_checked_too():
    cfg = minidet.get_cfg()
    cfg.MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE = 2.5
    with pytest.raises(ConfigError, match=r"DETECTIONS_PER_IMAGE must be an integer in \[1, 100000\]; got 2.5"):
        minidet.build_model(cfg)
    cfg = minidet.get_cfg()
    cfg.MODEL.MASK_ON = "no"
    with pytest.raises(ConfigError, match="MODEL.MASK_ON must be True or False; got 'no'"):
        minidet.Predictor(cfg)


@pytest.mark.parametrize(
    "opts",
    [
        ["MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0, "MODEL.ROI_HEADS.NMS_THRESH_TEST", 1.0],
        ["MODEL.ROI_MASK_HEAD.THRESHOLD", 1.0, "MODEL.RPN.MIN_SIZE", 0.0, "MODEL.ROI_HEADS.MIN_BOX_SIZE", 0.0],
        ["INPUT.MAX_PIXELS", 0, "TEST.CHUNK_IMAGES", 0, "INPUT.SIZE_DIVISIBILITY", 1],
        ["INPUT.MIN_SIZE_TEST", 1, "INPUT.MAX_SIZE_TEST", 16, "MODEL.RPN.POST_NMS_TOPK_TEST", 1],
        ["MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", 1, "MODEL.RPN.PRE_NMS_TOPK_TEST", 1],
        ["MODEL.FROZEN_BN_EPS", 0.0, "MODEL.DEVICE", "cuda:3"],
        ["MODEL.CONVENTION", "detectron2", "MODEL.ROI_HEADS.NUM_CLASSES", 1],  # background last: not counted
        ["MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO", 0, "MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO", 0],
        ["MODEL.ANCHOR_GENERATOR.SIZES", [16.0, 32, 64, 128, 256], "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", [1.0]],
        ["MODEL.NORM", "GN", "MODEL.GN_NUM_GROUPS", 16, "MODEL.ROI_BOX_HEAD.USE_NORM", True],
    ],
)
def test_values_at_the_ends_of_their_ranges_are_accepted(opts):
    cfg = minidet.get_cfg()
    cfg.merge_from_list(opts)
    validate_cfg(cfg)


def test_every_key_has_a_rule():
    """A new key cannot be added without saying what it may hold (booleans: True or False)."""
    keys = leaves(minidet.get_cfg())
    free = {k for k, v in keys.items() if k not in RULES and not isinstance(v, bool)}
    # CLASS_NAMES: distinct non-empty names, GRAPH_SHA256: 64 hex digits or empty, DEFORM_ON_PER_STAGE and
    # CONTEXT_ON_PER_STAGE: 4 booleans, the cascade's weights: 4 numbers > 0 per stage (validate_cfg); WEIGHTS and
    # GRAPH: files, checked where they are opened
    assert free == {"MODEL.WEIGHTS", "MODEL.CLASS_NAMES", "MODEL.GRAPH", "MODEL.GRAPH_SHA256",
                    "MODEL.RESNETS.DEFORM_ON_PER_STAGE", "MODEL.RESNETS.CONTEXT_ON_PER_STAGE",
                    "MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS"}
    bad = minidet.get_cfg()
    bad.merge_from_list(["MODEL.GRAPH_SHA256", "abc"])
    with pytest.raises(ConfigError, match="MODEL.GRAPH_SHA256 must be a SHA-256"):
        validate_cfg(bad)
    assert set(RULES) <= set(keys)
    validate_cfg(minidet.get_cfg())


def test_every_shipped_config_validates():
    paths = sorted((ROOT / "configs").rglob("*.yaml"))
    assert len(paths) >= 20
    for path in paths:
        cfg = minidet.get_cfg()
        cfg.merge_from_file(str(path))
        validate_cfg(cfg)


def test_eval_coco_refuses_ims_per_batch_zero_without_resume_advice(tmp_path, capsys, weights):
    """Today's failure: a DataLoader with batch_size 0 failed in the loop, and the message said to
    rerun with --resume. It must be one set-up line naming the key."""
    images = tmp_path / "images"
    images.mkdir()
    for i in (1, 2):
        cv2.imwrite(str(images / f"{i}.jpg"), structured_image(20, 30, seed=i))
    ann = tmp_path / "ann.json"
    box = {"iscrowd": 0, "area": 100.0, "bbox": [1, 1, 10, 10], "segmentation": [[1, 1, 11, 1, 11, 11, 1, 11]]}
    ann.write_text(json.dumps({
        "images": [{"id": i, "file_name": f"{i}.jpg", "height": 20, "width": 30} for i in (1, 2)],
        "annotations": [{"id": k, "image_id": k, "category_id": c, **box} for k, c in ((1, 1), (2, 3))],
        "categories": [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}],
    }))
    argv = ["--config-file", str(TV_CONFIG), "--ann", str(ann), "--images", str(images), "--output",
            str(tmp_path / "o"), "--workers", "0", "MODEL.WEIGHTS", str(weights),
            "TEST.IMS_PER_BATCH", "0"]
    rc = load_tool(EVAL).main(argv)
    line = one_error_line(capsys.readouterr().err)
    assert rc == 2 and line.startswith("error: TEST.IMS_PER_BATCH must be an integer in [1, 1024]; got 0"), line
    assert "--resume" not in line
    assert not (tmp_path / "o" / "metrics.json").exists()


# ------------------------------------------------------------------------------ config files

YAML_CASES = {
    # name: (file bytes, the line's text after "error: <file>")
    "tab.yaml": (b"_BASE_: {base}\nMODEL:\n\tNORM: Affine\n", ":3:1: not valid YAML: a tab character"),
    "tab_after_key.yaml": (b"_BASE_: {base}\nMODEL:\n  NORM:\tAffine\n", ":3:8: not valid YAML: a tab character"),
    "latin1.yaml": (b"_BASE_: {base}\n# r\xe9glages\nMODEL:\n  NORM: Affine\n", ":2:4: not UTF-8 text (byte 0xe9)"),
    "base_list.yaml": (b"_BASE_: [a.yaml, b.yaml]\n", ":1:9: _BASE_ must name one file (a string); got a list: ['a"),
    "base_number.yaml": (
        b"MODEL:\n  NORM: Affine\n_BASE_: 3\n",
        ":3:9: _BASE_ must name one file (a string); got a number: 3",
    ),
    "duplicate.yaml": (
        b"_BASE_: {base}\nMODEL:\n  NORM: Affine\n  MASK_ON: False\n  NORM: GN\n",
        ":5:3: key NORM given twice in one mapping (first on line 3)",
    ),
    "duplicate_group.yaml": (
        b"_BASE_: {base}\nINPUT:\n  MIN_SIZE_TEST: 600\nINPUT:\n  MAX_SIZE_TEST: 1000\n",
        ":4:1: key INPUT given twice in one mapping (first on line 2)",
    ),
    "control_char.yaml": (b"MODEL:\n  NORM: Aff\x07ine\n", ":2:12: not valid YAML: character U+0007"),
}


@pytest.mark.parametrize("name", list(YAML_CASES))
def test_a_broken_config_file_is_one_line_with_file_line_and_column(tmp_path, capsys, weights, name):
    data, message = YAML_CASES[name]
    path = tmp_path / name
    path.write_bytes(data.replace(b"{base}", str(TV_CONFIG).encode()))
    rc, err = _infer(capsys, tmp_path, path, "MODEL.WEIGHTS", str(weights))
    line = one_error_line(err)
    assert rc == 2 and line.startswith(f"error: {path}{message}"), line


def test_a_folder_as_config_file_says_so(tmp_path, capsys, weights):
    folder = tmp_path / "configs.yaml"
    folder.mkdir()
    rc, err = _infer(capsys, tmp_path, folder, "MODEL.WEIGHTS", str(weights))
    assert rc == 2 and one_error_line(err) == f"error: {folder}: is a folder, not a config file"
    child = tmp_path / "child.yaml"
    child.write_text("_BASE_: configs.yaml\n")
    rc, err = _infer(capsys, tmp_path, child, "MODEL.WEIGHTS", str(weights))
    assert rc == 2 and one_error_line(err) == f"error: {child}: _BASE_ configs.yaml is a folder, not a config file"


def test_a_large_file_as_config_file_is_not_read_whole(tmp_path, capsys, weights):
    """E.g. a checkpoint given to --config-file by mistake."""
    big = tmp_path / "model.yaml"
    with open(big, "wb") as f:
        f.truncate(64 << 20)
    rc, err = _infer(capsys, tmp_path, big, "MODEL.WEIGHTS", str(weights))
    assert rc == 2 and one_error_line(err) == f"error: {big}: larger than 1 MiB: not a config file"
    rc, err = _infer(capsys, tmp_path, weights)
    line = one_error_line(err)  # a zip archive of binary bytes
    assert rc == 2 and re.match(rf"error: {re.escape(str(weights))}:\d+:\d+: not (UTF-8 text|valid YAML)", line), line


def test_legitimate_yaml_still_loads(tmp_path):
    """A UTF-8 byte-order mark, non-ASCII comments, and a merge key whose entries the mapping
    then overrides (not a duplicate)."""
    path = tmp_path / "ok.yaml"
    text = f"_BASE_: {TV_CONFIG}\n# réglages, 設定\nMODEL:\n  <<: {{NORM: GN}}\n  NORM: Affine\n"
    path.write_bytes(("\ufeff" + text).encode())
    cfg = minidet.get_cfg()
    cfg.merge_from_file(str(path))
    assert cfg.MODEL.NORM == "Affine" and cfg.MODEL.FROZEN_BN_EPS == 0.0
    validate_cfg(cfg)


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (["MODEL.RESNETS.DEFORM_ON_PER_STAGE", [False, True, True]], "DEFORM_ON_PER_STAGE must be 4 booleans"),
        (["MODEL.RESNETS.DEFORM_ON_PER_STAGE", [0, 1, 1, 1]], "DEFORM_ON_PER_STAGE must be 4 booleans"),
        (["MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS", [[10.0, 10.0, 5.0], [20.0, 20.0, 10.0]]],
         "a list of 4 numbers > 0 per cascade stage"),
        (["MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS", [[10.0, 10.0, 5.0, 0.0], [20.0, 20.0, 10.0, 10.0]]],
         "a list of 4 numbers > 0 per cascade stage"),
        (["MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS", [[10.0, 10.0, 5.0, 5.0]], "MODEL.ROI_BOX_HEAD."
          "CLS_AGNOSTIC_BBOX_REG", True], "a cascade has 2 or more stages"),
        (["MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS", [[10.0, 10.0, 5.0, 5.0], [20.0, 20.0, 10.0, 10.0]]],
         "needs MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG True"),
        (["MODEL.HEAD_NORM", "GN", "MODEL.ROI_BOX_HEAD.USE_NORM", True, "MODEL.ROI_BOX_HEAD.NUM_CONV", 2,
          "MODEL.ROI_BOX_HEAD.CONV_DIM", 100], "MODEL.ROI_BOX_HEAD.CONV_DIM is 100"),
        # issue 45: GC blocks, RegNet bodies, mask scoring
        (["MODEL.RESNETS.CONTEXT_ON_PER_STAGE", [False, True]], "CONTEXT_ON_PER_STAGE must be 4 booleans"),
        (["MODEL.RESNETS.CONTEXT_RATIO", 0.0], "MODEL.RESNETS.CONTEXT_RATIO must be a number in (0, 1]"),
        (["MODEL.REGNET.DEPTH", 6, "MODEL.REGNET.W_A", 8.0, "MODEL.REGNET.W_0", 16, "MODEL.REGNET.W_M", 2.0],
         "MODEL.REGNET: these RegNet parameters give 3 stages; an FPN body has 4"),
        (["MODEL.REGNET.DEPTH", 22, "MODEL.REGNET.W_0", 20], "MODEL.REGNET: RegNet parameters out of range"),
        (["MODEL.REGNET.DEPTH", 25, "MODEL.REGNET.W_A", 26.31, "MODEL.REGNET.W_0", 88, "MODEL.REGNET.W_M", 2.25,
          "MODEL.REGNET.GROUP_WIDTH", 48, "MODEL.NORM", "GN", "MODEL.GN_NUM_GROUPS", 64],
         "MODEL.GN_NUM_GROUPS 64 must divide the channels GroupNorm normalizes: the RegNet stem is 32"),
    ],
)
def test_cascade_and_deformable_keys_are_checked(opts, message):
    """The keys of the cascade and the deformable convs, and the heads' own norm, fail naming the key."""
    cfg = minidet.get_cfg()
    cfg.merge_from_list(opts)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_cfg(cfg)


def test_a_cascade_needs_a_family_that_has_one():
    """Cascade R-CNN's stages combine by its family's rule; a family without one refuses it when the model is built."""
    cfg = minidet.get_cfg()  # torchvision's convention
    cfg.merge_from_list(["MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS", [[10.0, 10.0, 5.0, 5.0], [20.0, 20.0, 10.0,
                         10.0]], "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG", True, "MODEL.ROI_HEADS.NAME",
                         "CascadeROIHeads"])
    with pytest.raises(ConfigError, match="MODEL.CONVENTION torchvision has no Cascade R-CNN"):
        minidet.build_model(cfg)
