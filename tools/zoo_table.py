"""The coverage table ``docs/zoo.md``: every Mask R-CNN-family checkpoint the five zoos publish, and whether minidet
runs it, made from the census ``docs/zoo_census.tsv`` (one row per published file: its zoo, the zoo's name for it,
its published box and mask AP, and either the name minidet's registry gives it or what minidet still needs to run
it) joined with the registry (``minidet weights list``) and the shipped configs.

The README's "What it runs" part (between its ``zoo-table`` markers) is made here too: the count per zoo and what
the files minidet runs hold (read from each one's shipped config), with what runs each part beside eager PyTorch.

Usage::

    python tools/zoo_table.py           # (re)writes docs/zoo.md and the README's part
    python tools/zoo_table.py --check   # exit status 1 when either is not what the census and registry make

Both refuse (one line) a census that disagrees with the registry: a registry entry that no row names or that two
rows name, a row naming no registry entry or no shipped config, a row whose AP is not its registry entry's.
"""

from __future__ import annotations

import csv
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CENSUS = ROOT / "docs" / "zoo_census.tsv"
TABLE = ROOT / "docs" / "zoo.md"
README = ROOT / "README.md"
BEGIN = "<!-- zoo-table: made by tools/zoo_table.py from docs/zoo_census.tsv, the registry and the configs -->"
END = "<!-- zoo-table: end -->"
ZOOS = ("torchvision", "Detectron", "maskrcnn-benchmark", "detectron2", "mmdetection")  # the table's order
NEEDS = "needs: "


def read_census(path: Path = CENSUS) -> list[dict[str, str]]:
    """The census rows (``zoo``, ``name``, ``box``, ``mask``, ``minidet``), comment lines (``#``) skipped."""
    with open(path, newline="", encoding="utf-8") as f:
        lines = [line for line in f if line.strip() and not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t"))


def _ap(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def check(rows: list[dict[str, str]]) -> None:
    """Raise ValueError (one line) where the census and the registry or the shipped configs disagree."""
    from minidet.config import config_names
    from minidet.hub import REGISTRY

    named = Counter(r["minidet"] for r in rows if not r["minidet"].startswith(NEEDS))
    if twice := [n for n, k in named.items() if k > 1]:
        raise ValueError(f"{CENSUS.name}: {twice[0]} is the minidet name of {named[twice[0]]} rows")
    if missing := sorted(set(REGISTRY) - set(named)):
        raise ValueError(f"{CENSUS.name}: no row names the registry entry {missing[0]} ({len(missing)} such)")
    configs = set(config_names())
    for r in rows:
        if r["zoo"] not in ZOOS:
            raise ValueError(f"{CENSUS.name}: {r['name']}: unknown zoo {r['zoo']!r}")
        name = r["minidet"]
        if name.startswith(NEEDS):
            if not name[len(NEEDS):].strip():
                raise ValueError(f"{CENSUS.name}: {r['name']}: 'needs:' names nothing")
            continue
        if name not in REGISTRY or name not in configs:
            raise ValueError(f"{CENSUS.name}: {r['name']}: {name} is no registry entry with a shipped config")
        e = REGISTRY[name]
        if (r["box"], r["mask"]) != (_ap(e.box_ap), _ap(e.mask_ap)):
            raise ValueError(f"{CENSUS.name}: {r['name']}: AP {r['box']} / {r['mask']} but the registry's {name} "
                             f"has {_ap(e.box_ap)} / {_ap(e.mask_ap)}")


def render(rows: list[dict[str, str]]) -> str:
    """docs/zoo.md's text."""
    check(rows)
    runs = [r for r in rows if not r["minidet"].startswith(NEEDS)]
    out = [
        "# The zoos' Mask R-CNN-family checkpoints",
        "",
        "Every checkpoint of the Mask R-CNN family (two-stage, RoI-based models with a mask head: Mask R-CNN,",
        "its cascades and variants, the instance half of Panoptic FPN) that the five zoos publish, and whether",
        "minidet runs it. Made by `python tools/zoo_table.py` from `docs/zoo_census.tsv` (its sources and what it",
        "counts are in its first lines) and the registry (`minidet weights list`); `tests/test_zoo_table.py` fails",
        "when they disagree. A file minidet runs has a registry entry and a shipped config of that name (`minidet",
        "weights get NAME`, `--config-file NAME`); each of the others names what minidet lacks for it.",
        "",
        f"**minidet runs {len(runs)} of the {len(rows)} files.**",
        "",
        "| zoo | files | runs |",
        "|---|---|---|",
    ]
    for zoo in ZOOS:
        mine = [r for r in rows if r["zoo"] == zoo]
        out.append(f"| {zoo} | {len(mine)} | {sum(1 for r in mine if r in runs)} |")
    needs = Counter(part.strip() for r in rows if r["minidet"].startswith(NEEDS)
                    for part in r["minidet"][len(NEEDS):].split(","))
    out += ["", "What the other files need (a file may need several):", ""]
    out += [f"- {what}: {count}" for what, count in sorted(needs.items(), key=lambda kv: (-kv[1], kv[0]))]
    for zoo in ZOOS:
        out += ["", f"## {zoo}", "", "| file | box / mask AP | minidet |", "|---|---|---|"]
        for r in (r for r in rows if r["zoo"] == zoo):
            status = r["minidet"] if r["minidet"].startswith(NEEDS) else f"runs: `{r['minidet']}`"
            out.append(f"| {r['name']} | {r['box']} / {r['mask']} | {status} |")
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Part:
    """A part a file may hold, as the README's support table shows it: ``holds(architectures, model)`` tells it from
    the file's architectures (``hub.registry.ARCHITECTURES``' names, as ``minidet weights list --arch`` reads them)
    and its shipped config's ``MODEL`` node; ``ops``: the ONNX operators of its graph that not every runtime runs
    (``onnxfile.UNSUPPORTED``); ``kept_float``: the int8 export's name for what it keeps in float32
    (``quantize.KEPT_FLOAT``/``_BLOCKS``); ``bench``: its ``minidet bench --norms`` variants."""

    name: str
    holds: Callable[[tuple[str, ...], Any], bool]
    ops: frozenset[str] = frozenset()
    kept_float: str = ""
    bench: tuple[str, ...] = ()


def _has(arch: str) -> Callable[[tuple[str, ...], Any], bool]:
    return lambda archs, _: arch in archs


PARTS = (
    Part("ResNet or ResNeXt body, FPN, RPN, box and mask heads", lambda archs, _: "regnet" not in archs,
         bench=("FrozenBN", "Affine", "GN")),
    Part("RegNet body", _has("regnet"), bench=("regnetx-3.2gf", "regnetx-4gf", "regnety-4gf")),
    Part("GroupNorm (and weight standardization)", lambda _, m: "GN" in (m.NORM, m.HEAD_NORM), bench=("GN",)),
    Part("Cascade R-CNN", _has("cascade"), bench=("cascade",)),
    Part("deformable convolution (v1, v2)", _has("dcn"), ops=frozenset({"DeformConv"}), bench=("dcn", "dcnv2")),
    Part("GC blocks", _has("gcb"), kept_float="context", bench=("gcb",)),
    Part("Mask Scoring R-CNN", _has("ms-rcnn"), kept_float="mask_iou_head", bench=("maskiou",)),
)


def parts_table(names: list[str]) -> list[str]:
    """The support table's lines for the registry files ``names`` (the files minidet runs)."""
    from minidet.apps.bench.report import ARCHITECTURES, VARIANTS
    from minidet.config import get_cfg
    from minidet.export.onnxfile import UNSUPPORTED
    from minidet.export.quantize import KEPT_FLOAT, KEPT_FLOAT_BLOCKS
    from minidet.hub.registry import REGISTRY, traits

    files = [(traits(name).architectures, get_cfg(REGISTRY[name].config).MODEL) for name in names]
    out = ["| the file holds | files | ONNX Runtime | OpenVINO | int8 (OpenVINO) | `minidet bench --norms` |",
           "|---|---|---|---|---|---|"]
    for part in PARTS:
        if missing := [v for v in part.bench if v not in VARIANTS and v not in ARCHITECTURES]:
            raise ValueError(f"{part.name}: no bench variant {missing[0]!r}")
        if part.kept_float and part.kept_float not in {**KEPT_FLOAT, **KEPT_FLOAT_BLOCKS}:
            raise ValueError(f"{part.name}: the int8 export keeps no {part.kept_float!r} in float32")
        lacks = sorted(UNSUPPORTED["openvino"][op] for op in part.ops if op in UNSUPPORTED["openvino"])
        openvino = f"no ({', '.join(lacks)})" if lacks else "yes"
        int8 = "no" if lacks else ("yes (this part in float32)" if part.kept_float else "yes")
        count = sum(1 for archs, model in files if part.holds(archs, model))
        out.append(f"| {part.name} | {count} | yes | {openvino} | {int8} | {', '.join(part.bench)} |")
    return out


def readme_block(rows: list[dict[str, str]]) -> str:
    """The README's part between ``BEGIN`` and ``END`` (markers included)."""
    check(rows)
    runs = [r for r in rows if not r["minidet"].startswith(NEEDS)]
    per_zoo = [f"{sum(1 for r in runs if r['zoo'] == z)} of {sum(1 for r in rows if r['zoo'] == z)}" for z in ZOOS]
    wrap = textwrap.TextWrapper(width=116, break_on_hyphens=False, break_long_words=False).wrap
    out = [
        BEGIN,
        *wrap(f"Of the {len(rows)} Mask R-CNN-family checkpoints that the five zoos publish, minidet runs {len(runs)} "
              f"of the {len(rows)}, each by name: a shipped config and a registry entry (`--config-file NAME`, "
              "`MODEL.WEIGHTS NAME`). Every file, its published AP and what the others need: "
              "[docs/zoo.md](docs/zoo.md)."),
        "",
        "| " + " | ".join(ZOOS) + " |",
        "|" + "---|" * len(ZOOS),
        "| " + " | ".join(per_zoo) + " |",
        "",
        *wrap("What the files minidet runs hold (a file holds several parts), what runs each part beside eager "
              "PyTorch (an exported graph under ONNX Runtime or OpenVINO, OpenVINO's int8; every export passes its "
              "parity gate first) and `minidet bench`'s variants of it:"),
        "",
        *parts_table([r["minidet"] for r in runs]),
        END,
    ]
    return "\n".join(out) + "\n"


def with_block(readme: str, block: str) -> str:
    """``readme`` with its part between the markers replaced by ``block``; ValueError without the markers."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{README.name}: no {BEGIN!r} ... {END!r} markers")
    return readme[:start] + block + readme[end + len(END) + 1:]


def main(argv: list[str]) -> int:
    try:
        rows = read_census()
        made = {TABLE: render(rows), README: with_block(README.read_text(encoding="utf-8"), readme_block(rows))}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path, text in made.items():
        if "--check" in argv:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                print(f"error: {path} is not what {CENSUS.name} and the registry make; run python tools/zoo_table.py",
                      file=sys.stderr)
                return 1
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
