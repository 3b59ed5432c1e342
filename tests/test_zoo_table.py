"""docs/zoo.md, the coverage table of the zoos' Mask R-CNN-family checkpoints, is what tools/zoo_table.py makes of
the census (docs/zoo_census.tsv) and the registry; the README's "What it runs" part is what the tool makes of them and
the shipped configs."""

import importlib.util
import re
import sys

import pytest

from helpers import ROOT


def _tool():
    spec = importlib.util.spec_from_file_location("zoo_table", ROOT / "tools" / "zoo_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_table_is_what_the_census_and_the_registry_make():
    tool = _tool()
    rows = tool.read_census()
    assert (ROOT / "docs" / "zoo.md").read_text(encoding="utf-8") == tool.render(rows)
    runs = sum(1 for r in rows if not r["minidet"].startswith(tool.NEEDS))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(rf"\b{runs} of the {len(rows)}\b", readme) and "docs/zoo.md" in readme
    assert tool.with_block(readme, tool.readme_block(rows)) == readme


def test_the_readme_part_counts_what_the_configs_hold():
    """Each part's count is that of the shipped configs of the files minidet runs that turn it on, and a README
    without the markers is one line."""
    tool = _tool()
    block = tool.readme_block(tool.read_census())
    assert "| Cascade R-CNN | " in block and "| deformable convolution (v1, v2) | " in block
    dcn = next(line for line in block.splitlines() if line.startswith("| deformable convolution"))
    assert "no (deformable convolution)" in dcn  # OpenVINO has no DeformConv: onnxfile.UNSUPPORTED
    with pytest.raises(ValueError, match="no .* markers"):
        tool.with_block("# a README\n", block)


def test_a_census_that_disagrees_with_the_registry_is_one_line(tmp_path):
    tool = _tool()
    rows = tool.read_census()
    first = next(i for i, r in enumerate(rows) if not r["minidet"].startswith(tool.NEEDS))
    cases = {
        "no row names the registry entry": rows[:first] + rows[first + 1:],
        "is the minidet name of 2 rows": [*rows, rows[first]],
        "is no registry entry": [*rows, {**rows[first], "minidet": "detectron2/no_such_model"}],
        "but the registry's": [{**r, "box": "99.9"} if i == first else r for i, r in enumerate(rows)],
    }
    for message, changed in cases.items():
        with pytest.raises(ValueError, match=message) as e:
            tool.render(changed)
        assert "\n" not in str(e.value)
