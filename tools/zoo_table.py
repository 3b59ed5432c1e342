"""The coverage table ``docs/zoo.md``: every Mask R-CNN-family checkpoint the five zoos publish, and whether minidet
runs it, made from the census ``docs/zoo_census.tsv`` (one row per published file: its zoo, the zoo's name for it,
its published box and mask AP, and either the name minidet's registry gives it or what minidet still needs to run
it) joined with the registry (``minidet weights list``) and the shipped configs.

Usage::

    python tools/zoo_table.py           # (re)writes docs/zoo.md
    python tools/zoo_table.py --check   # exit status 1 when docs/zoo.md is not what the census and registry make

Both refuse (one line) a census that disagrees with the registry: a registry entry that no row names or that two
rows name, a row naming no registry entry or no shipped config, a row whose AP is not its registry entry's.
"""

from __future__ import annotations

import csv
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CENSUS = ROOT / "docs" / "zoo_census.tsv"
TABLE = ROOT / "docs" / "zoo.md"
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


def main(argv: list[str]) -> int:
    try:
        text = render(read_census())
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "--check" in argv:
        if not TABLE.is_file() or TABLE.read_text(encoding="utf-8") != text:
            print(f"error: {TABLE} is not what {CENSUS.name} and the registry make; run python tools/zoo_table.py",
                  file=sys.stderr)
            return 1
        return 0
    TABLE.write_text(text, encoding="utf-8")
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
