"""docs/zoo.md, the coverage table of the zoos' Mask R-CNN-family checkpoints, is what tools/zoo_table.py makes of
the census (docs/zoo_census.tsv), the registry and the architecture table (minidet.families.architectures); the
README's "What it runs" part and its support matrix are what the tool makes of them and the shipped configs."""

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
    assert tool.readme_text(readme, rows) == readme  # the support matrix too


def test_the_support_matrix_counts_what_the_configs_hold():
    """One row per architecture minidet runs; each count is that of the shipped configs of the files minidet runs
    that turn it on, the runtimes' and int8 cells are the table's, and a README without the markers is one line."""
    from minidet.config import get_cfg
    from minidet.export.onnxfile import UNSUPPORTED
    from minidet.export.quantize import KEPT_FLOAT_BLOCKS
    from minidet.families import architectures
    from minidet.hub import REGISTRY

    tool = _tool()
    rows = tool.read_census()
    block = tool.matrix_block(rows)
    lines = {line.split(" | ")[0][2:]: line.split(" | ") for line in block.splitlines() if line.startswith("| ")}
    assert [a.name for a in architectures.RUNS] == [n for n in lines if n != "architecture"]
    names = [r["minidet"] for r in rows if not r["minidet"].startswith(tool.NEEDS)]
    on = [[a.name for a in architectures.turned_on(get_cfg(REGISTRY[n].config), get_cfg())] for n in names]
    for arch in architectures.RUNS[1:]:
        assert lines[arch.name][1] == str(sum(arch.name in o for o in on)), arch.name
    assert lines[architectures.MASK_RCNN.name][1] == str(sum(not o for o in on))
    dcn = lines[architectures.DCN.name]
    assert dcn[4] == "no (deformable convolution)" and "DeformConv" in UNSUPPORTED["openvino"]  # no DeformConv
    assert dcn[5] == "no (deformable convolution)" and dcn[3] == "yes"  # int8 runs under OpenVINO only
    assert "`*.context`" in lines[architectures.GC_BLOCKS.name][5] and "context" in KEPT_FLOAT_BLOCKS
    assert lines[architectures.CASCADE.name][6].startswith("cascade, cascade+dcn")
    for begin, end in ((tool.BEGIN, tool.END), (tool.MATRIX_BEGIN, tool.MATRIX_END)):
        with pytest.raises(ValueError, match="no .* markers"):
            tool.with_block("# a README\n", block, begin, end)


def test_check_fails_on_a_stale_part(tmp_path, monkeypatch, capsys):
    """``--check`` exits 1 when docs/zoo.md's "needs" or either README part is not what the tool makes now."""
    tool = _tool()
    table, readme = tmp_path / "zoo.md", tmp_path / "README.md"
    table.write_text((ROOT / "docs" / "zoo.md").read_text(encoding="utf-8"), encoding="utf-8")
    readme.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(tool, "TABLE", table)
    monkeypatch.setattr(tool, "README", readme)
    assert tool.main(["--check"]) == 0
    for path, old, new in ((table, "- ResNeXt-152: 1", "- ResNeXt-152: 2"),
                           (readme, "| no (deformable convolution) |", "| yes |"),
                           (readme, "| 2 of 2 |", "| 1 of 2 |")):
        text = path.read_text(encoding="utf-8")
        assert old in text, old
        path.write_text(text.replace(old, new, 1), encoding="utf-8")
        assert tool.main(["--check"]) == 1, old
        assert "is not what" in capsys.readouterr().err
        path.write_text(text, encoding="utf-8")
        assert tool.main(["--check"]) == 0


def test_a_census_that_disagrees_with_the_registry_is_one_line(tmp_path):
    tool = _tool()
    rows = tool.read_census()
    first = next(i for i, r in enumerate(rows) if not r["minidet"].startswith(tool.NEEDS))
    needing = {**rows[first], "box": "-", "mask": "-"}  # a row of a file minidet does not run has its AP here
    cases = {
        "no row names the registry entry": rows[:first] + rows[first + 1:],
        "is the minidet name of 2 rows": [*rows, rows[first]],
        "is no registry entry": [*rows, {**rows[first], "minidet": "detectron2/no_such_model"}],
        "has its AP written once": [{**r, "box": "99.9"} if i == first else r for i, r in enumerate(rows)],
        "no box or mask AP": [*rows, {**needing, "minidet": "needs: Cascade R-CNN", "box": ""}],
        "no architecture of minidet.families.architectures": [*rows, {**needing, "minidet": "needs: a new neck"}],
        "which minidet runs": [*rows, {**needing, "minidet": "needs: Cascade R-CNN"}],
    }
    for message, changed in cases.items():
        with pytest.raises(ValueError, match=message) as e:
            tool.render(changed)
        assert "\n" not in str(e.value)
