"""The shipped configs of the zoos' published files are what tools/zoo_configs.py makes of each family's table
(src/minidet/families/zoo/) and, for mmdetection and detectron2, of the zoo's own config files (the ``reference``
extra, which CI installs): a table, a zoo config or a mapping changed without running the tool fails here. And each
mmdetection and detectron2 config computes what its zoo config computes at test time (moved here from
test_mmdetection_reference.py and test_detectron2_reference.py; the check that the config's body has the output
channels of the zoo's, the FPN's inputs, is the tool's own: ``make`` fails otherwise)."""

import functools
import importlib
import sys

import pytest

import minidet
from helpers import ROOT, needs_extra
from minidet.config import cfg_value, config_names
from minidet.families import FAMILIES


@functools.cache
def _tool():
    """tools/zoo_configs.py as a module, loaded once (its readers keep the zoos' sources they extracted)."""
    if str(ROOT / "tools") not in sys.path:
        sys.path.append(str(ROOT / "tools"))
    return importlib.import_module("zoo_configs")


def _shipped_as_made(family: str) -> list:
    """The family's made configs, each asserted equal to the shipped file, and no shipped made config left over."""
    tool = _tool()
    if (reader := tool.READERS.get(family)) is not None and (why := reader.missing()):
        pytest.skip(why)  # the extra's packages are there (needs_extra): detectron2's sources are not
    made = tool.make(family)
    for m in made:
        assert m.path.is_file() and m.path.read_text(encoding="utf-8") == m.text, (
            f"{m.path.name} is not what `python tools/zoo_configs.py --family {family}` makes")
    assert tool.stale(family, made) == []
    assert [m.name for m in made] == [e.name for e in FAMILIES[family].weights]  # one per registry entry
    return made


@pytest.mark.parametrize("family", ["torchvision", "detectron", "maskrcnn_benchmark"])
def test_the_configs_of_the_written_tables_are_shipped(family):
    _shipped_as_made(family)


def _computes_what_its_zoo_config_computes(family: str) -> None:
    made = _shipped_as_made(family)
    assert len(made) == len([n for n in config_names() if n.startswith(f"{family}/")])
    for m in made:
        cfg = minidet.get_cfg(m.name)
        got = {k: cfg_value(cfg, k) for k in m.zoo_keys}
        got = {k: list(v) if isinstance(v, tuple) else v for k, v in got.items()}
        assert got == m.zoo_keys, (m.name, {k: (got[k], v) for k, v in m.zoo_keys.items() if got[k] != v})


@needs_extra("mmdet", "reference")
@needs_extra("mmengine", "reference")
def test_each_mmdetection_config_computes_what_its_zoo_config_computes():
    """Every shipped mmdetection config (one per registry entry) against the config file of mmdetection 3.3.0 it
    restates: the pixel statistics and order, the test scale, the backbone (its stage widths the FPN's inputs),
    its plugins, anchors, RPN and head thresholds, the class count, the mask IoU head."""
    _computes_what_its_zoo_config_computes("mmdetection")


@needs_extra("fvcore", "reference")
@needs_extra("omegaconf", "reference")
def test_each_detectron2_config_computes_what_its_zoo_config_computes():
    """Every shipped detectron2 config (one per registry entry) against the zoo config detectron2 ships."""
    _computes_what_its_zoo_config_computes("detectron2")


def test_a_made_config_reads_back_as_its_keys(tmp_path):
    """The tool's YAML: floats YAML 1.1 reads as floats (1e-05 is a string to it), nested keys in the defaults'
    order, lists of lists."""
    tool = _tool()
    keys = {"MODEL.FROZEN_BN_EPS": 1e-5, "MODEL.RESNETS.DEPTH": 101, "INPUT.FORMAT": "BGR", "MODEL.NORM": "GN",
            "MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS": [[10.0, 10.0, 5.0, 5.0], [20.0, 20.0, 10.0, 10.0]],
            "MODEL.RESNETS.DEFORM_ON_PER_STAGE": [False, True, True, True]}
    text = tool.render("Made by a test.", "", str(ROOT / "src" / "minidet" / "configs" / "Base-RCNN-FPN.yaml"), keys)
    assert "FROZEN_BN_EPS: 1.0e-05" in text and text.index("MODEL:") < text.index("INPUT:")
    path = tmp_path / "made.yaml"
    path.write_text(text, encoding="utf-8")
    cfg = minidet.get_cfg(str(path))
    assert {k: cfg_value(cfg, k) for k in keys} == keys
