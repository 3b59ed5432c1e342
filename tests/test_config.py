import numpy as np
import pytest
import torch

import minidet
from minidet.config import ConfigError, validate_cfg


def test_get_cfg_is_a_fresh_copy():
    a = minidet.get_cfg()
    a.MODEL.NORM = "Affine"
    assert minidet.get_cfg().MODEL.NORM == "FrozenBN"


def test_base_inheritance_and_overrides(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("MODEL:\n  NORM: Affine\n  FROZEN_BN_EPS: 0\nINPUT:\n  MIN_SIZE_TEST: 600\n")
    child = tmp_path / "sub" / "child.yaml"
    child.parent.mkdir()
    child.write_text("_BASE_: ../base.yaml\nINPUT:\n  MIN_SIZE_TEST: 512\n")
    cfg = minidet.get_cfg()
    cfg.merge_from_file(str(child))
    assert cfg.MODEL.NORM == "Affine" and cfg.INPUT.MIN_SIZE_TEST == 512
    assert cfg.MODEL.FROZEN_BN_EPS == 0.0 and isinstance(cfg.MODEL.FROZEN_BN_EPS, float)
    cfg.merge_from_list(["MODEL.FOLD_NORM", "True", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.3"])
    assert cfg.MODEL.FOLD_NORM is True and cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST == 0.3


def test_unknown_key_names_the_key(tmp_path):
    cfg = minidet.get_cfg()
    with pytest.raises(ConfigError, match="MODEL.NROM"):
        cfg.merge_from_list(["MODEL.NROM", "GN"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("MODEL:\n  RESNETS:\n    DEPHT: 101\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown config key: MODEL.RESNETS.DEPHT"):
        cfg.merge_from_file(str(bad))


def test_wrong_type_and_missing_base(tmp_path):
    cfg = minidet.get_cfg()
    with pytest.raises(ConfigError, match="INPUT.MIN_SIZE_TEST"):
        cfg.merge_from_list(["INPUT.MIN_SIZE_TEST", "big"])
    f = tmp_path / "c.yaml"
    f.write_text("_BASE_: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml"):
        cfg.merge_from_file(str(f))
    with pytest.raises(ConfigError, match="not found"):
        cfg.merge_from_file(str(tmp_path / "absent.yaml"))


@pytest.mark.parametrize(
    "opts,match",
    [
        (["MODEL.NORM", "SyncBN"], "FrozenBN, BN, Affine, GN"),
        (["MODEL.NORM", "GN", "MODEL.FOLD_NORM", True], "FOLD_NORM"),
        (["MODEL.RESNETS.DEPTH", 34], "DEPTH"),
        (["INPUT.FORMAT", "RGBA"], "INPUT.FORMAT"),
        (["MODEL.CATEGORY_LAYOUT", "voc"], "CATEGORY_LAYOUT"),
        (["TEST.CHUNK_IMAGES", -1], "TEST.CHUNK_IMAGES"),
    ],
)
def test_validate_names_the_key(opts, match):
    cfg = minidet.get_cfg()
    cfg.merge_from_list(opts)
    with pytest.raises(ConfigError, match=match):
        validate_cfg(cfg)
    with pytest.raises(ConfigError, match=match):
        minidet.build_model(cfg)


@pytest.mark.parametrize("name", minidet.config.config_names(bases=True))
def test_shipped_configs_build(name):
    """Every shipped config (the bases too) is valid and builds its model (on the meta device: no weights made)."""
    cfg = minidet.get_cfg(name)
    validate_cfg(cfg)
    with torch.device("meta"):
        model = minidet.build_model(cfg)
    assert (model.mask_head is not None) == cfg.MODEL.MASK_ON


# the values of a config that are not its network: the weights, what goes in (the input's size and pixels) and how
# detections are named or kept; shipped configs alike in every other value run one network (a zoo's schedules, its
# datasets' class names, its weights' pixel statistics)
NOT_THE_NETWORK = ("MODEL.WEIGHTS", "INPUT.", "MODEL.PIXEL_MEAN", "MODEL.PIXEL_STD", "MODEL.CLASS_NAMES",
                   "MODEL.CATEGORY_LAYOUT", "MODEL.ROI_HEADS.SCORE_THRESH_TEST")


def _values(node, prefix: str = "") -> dict:
    """A config's values by full key."""
    out = {}
    for key, value in node.items():
        out.update(_values(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": repr(value)})
    return out


def network_key(cfg) -> tuple:
    """What fixes a config's network: its values but those of ``NOT_THE_NETWORK``."""
    return tuple(sorted((k, v) for k, v in _values(cfg).items() if not k.startswith(NOT_THE_NETWORK)))


def networks() -> dict[tuple, list[str]]:
    """The shipped configs by distinct network: its ``network_key`` -> the configs that have it, in name order."""
    groups: dict[tuple, list[str]] = {}
    for name in minidet.config.config_names():
        groups.setdefault(network_key(minidet.get_cfg(name)), []).append(name)
    return groups


GROUPS = networks()  # read once per process (each config's file read and checked: about 5 s for 187)
NETWORKS = {names[0]: names for names in GROUPS.values()}  # the first config of each network -> its group


def test_configs_are_grouped_by_their_network():
    """Every shipped config is in one group of ``NETWORKS`` (each built on the meta device by
    test_shipped_configs_build, the first of each group run by test_shipped_configs_run), the groups' keys differ,
    and a config's values outside ``NOT_THE_NETWORK`` are its group's."""
    grouped = [name for names in NETWORKS.values() for name in names]
    assert sorted(grouped) == sorted(minidet.config.config_names()) and len(set(grouped)) == len(grouped)
    assert len(GROUPS) == len(NETWORKS)
    cfg = minidet.get_cfg("torchvision/maskrcnn_resnet50_fpn")
    for key, value in (("MODEL.WEIGHTS", "other.pth"), ("INPUT.MIN_SIZE_TEST", 600), ("MODEL.PIXEL_STD", [1., 1., 1.]),
                       ("MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.5)):
        other = cfg.clone()
        other.merge_from_list([key, value])
        assert network_key(other) == network_key(cfg), key
    for key, value in (("MODEL.RESNETS.DEPTH", 101), ("MODEL.CONVENTION", "detectron2"), ("MODEL.FOLD_NORM", True),
                       ("MODEL.ROI_HEADS.NUM_CLASSES", 3)):
        other = cfg.clone()
        other.merge_from_list([key, value])
        assert network_key(other) != network_key(cfg), key


@pytest.mark.slow
@pytest.mark.parametrize("name", list(NETWORKS))
def test_shipped_configs_run(name):
    """Every shipped network's model runs on a small picture (random weights: each module's shapes fit together):
    the first config of each group of ``NETWORKS``; the group's other configs are the same network (their other
    values are the input's, the weights' and the detections' names)."""
    cfg = minidet.get_cfg(name)
    cfg.merge_from_list(["MODEL.WEIGHTS", "none", "INPUT.MIN_SIZE_TEST", 96, "INPUT.MAX_SIZE_TEST", 128,  # small: quick
                         "MODEL.RPN.PRE_NMS_TOPK_TEST", 50, "MODEL.RPN.POST_NMS_TOPK_TEST", 20,
                         "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", 5])
    out = minidet.Predictor(cfg)(np.full((90, 120, 3), 114, np.uint8))
    assert out["boxes"].shape[1:] == (4,) and (out["masks"].shape[1:] == (90, 120)) == cfg.MODEL.MASK_ON


@pytest.mark.parametrize(("longer", "shorter"), [
    ("detectron/e2e_mask_rcnn_X-101-64x4d-FPN_2x", "detectron/e2e_mask_rcnn_X-101-64x4d-FPN_1x"),
    ("detectron/e2e_mask_rcnn_X-101-32x8d-FPN_2x", "detectron/e2e_mask_rcnn_X-101-32x8d-FPN_1x"),
    ("detectron/e2e_mask_rcnn_R-50-FPN_3x_gn", "detectron/e2e_mask_rcnn_R-50-FPN_2x_gn"),
])
def test_a_longer_schedules_config_is_the_same_network_at_test_time(longer, shorter):
    """A zoo file trained on a longer schedule runs as its shorter schedule's does: only the weights' file differs."""
    a, b = minidet.get_cfg(longer), minidet.get_cfg(shorter)
    assert (a.MODEL.WEIGHTS, b.MODEL.WEIGHTS) == (f"weights/{longer.split('/')[1]}.pkl",
                                                  f"weights/{shorter.split('/')[1]}.pkl")
    b.defrost()
    b.MODEL.WEIGHTS = a.MODEL.WEIGHTS
    assert a == b


@pytest.mark.parametrize("version", ["", "_v2"])
def test_fast_configs_are_the_base_with_the_exact_speed_options(version):
    """The _fast configs change only what the parity tests check (Affine + fold + channels-last)."""
    fast, base = minidet.get_cfg(), minidet.get_cfg()
    fast.merge_from_file(f"configs/torchvision/maskrcnn_resnet50_fpn{version}_fast.yaml")
    base.merge_from_file(f"configs/torchvision/maskrcnn_resnet50_fpn{version}.yaml")
    base.merge_from_list(["MODEL.NORM", "Affine", "MODEL.FOLD_NORM", True, "MODEL.CHANNELS_LAST", True])
    assert fast == base
    validate_cfg(fast)


def test_load_cfg_is_the_dance_frozen_and_a_load_validates_it_once(monkeypatch):
    """``load_cfg(file, opts)``: the file, then the overrides, validated and frozen. ``prepare_model`` and
    ``build_model`` take its config without validating it again; a config changed since is validated again."""
    opts = ["MODEL.WEIGHTS", "none", "INPUT.MIN_SIZE_TEST", 96, "INPUT.MAX_SIZE_TEST", 128]
    by_hand = minidet.get_cfg()
    by_hand.merge_from_file("torchvision/maskrcnn_resnet50_fpn")
    by_hand.merge_from_list(opts)
    cfg = minidet.load_cfg("torchvision/maskrcnn_resnet50_fpn", opts)
    assert cfg == by_hand and cfg.is_frozen() and not by_hand.is_frozen()
    with pytest.raises(ConfigError, match="^MODEL.FOLD_NORM applies to FrozenBN/BN/Affine only"):
        minidet.load_cfg("torchvision/maskrcnn_resnet50_fpn", ["MODEL.NORM", "GN", "MODEL.FOLD_NORM", True])
    calls = []
    monkeypatch.setattr(minidet.config, "validate_cfg", lambda c: calls.append(c) or validate_cfg(c))
    minidet.prepare_model(cfg)  # build_model inside: not validated again
    minidet.prepare_model(cfg.clone())
    assert calls == []
    minidet.build_model(by_hand)  # a config nobody validated: validated
    assert len(calls) == 1
    changed = cfg.clone()
    changed.defrost()
    changed.MODEL.FOLD_NORM = 1  # an int where a boolean belongs: the same values but for their type
    with pytest.raises(ConfigError, match="^MODEL.FOLD_NORM must be True or False; got 1$"):
        minidet.build_model(changed)


def test_chunk_and_tie_order_reach_the_model():
    cfg = minidet.get_cfg()
    model = minidet.build_model(cfg)
    assert model.chunk_size(16) == 1 and model.chunk_size(0) == 1  # CPU: one image at a time
    assert not model.rpn.tv_tie_order
    cfg.merge_from_list(["TEST.CHUNK_IMAGES", 4, "MODEL.RPN.TORCHVISION_TIE_ORDER", True])
    model = minidet.build_model(cfg)
    assert [model.chunk_size(n) for n in (1, 3, 16)] == [1, 3, 4]
    assert model.rpn.tv_tie_order


def test_roi_align_choices_are_the_poolers():
    from minidet.config import RULES
    from minidet.poolers import ROI_ALIGN_IMPLS

    assert RULES["MODEL.ROI_ALIGN_IMPL"] == ROI_ALIGN_IMPLS


def test_roi_heads_choices_are_the_table():
    from minidet.config import RULES
    from minidet.heads.roi import ROI_HEADS

    assert RULES["MODEL.ROI_HEADS.NAME"] == tuple(ROI_HEADS)


@pytest.mark.parametrize("name", ["StandardROIHeads", "CascadeROIHeads"])
def test_roi_heads_name_and_the_cascade_weights_agree_both_ways(name):
    """A cascade's stages under StandardROIHeads, or CascadeROIHeads without stages: one line naming both keys."""
    cfg = minidet.get_cfg()
    cfg.merge_from_list(["MODEL.ROI_HEADS.NAME", name, "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG", True])
    if name == "StandardROIHeads":
        cfg.merge_from_list(["MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS", [[10.0, 10.0, 5.0, 5.0]] * 2])
    with pytest.raises(ConfigError, match=r"^MODEL.ROI_HEADS.NAME .* MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS"):
        validate_cfg(cfg)
