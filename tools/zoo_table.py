"""The coverage table ``docs/zoo.md``: every Mask R-CNN-family checkpoint the five zoos publish, and whether minidet
runs it, made from the census ``docs/zoo_census.tsv`` (one row per published file: its zoo, the zoo's name for it,
its published box and mask AP, and either the name minidet's registry gives it or the architectures minidet still
needs to run it) joined with the registry (``minidet weights list``), the shipped configs and the architecture table
(``minidet.families.architectures``: what each file needs is the name of an entry minidet does not run yet).

The README's two parts are made here too: "What it runs" (between its ``zoo-table`` markers: the count per zoo) and
the support matrix (between its ``support-matrix`` markers: each architecture minidet runs, how many of the files it
runs turn it on (read from each one's shipped config), the runtimes that run it beside eager PyTorch, its int8
policy and its ``minidet bench`` variants, all from the architecture table).

Usage::

    python tools/zoo_table.py           # (re)writes docs/zoo.md and the README's parts
    python tools/zoo_table.py --check   # exit status 1 when any is not what the census, registry and table make

Both refuse (one line) a census that disagrees with the registry or the table: a registry entry that no row names
or that two rows name, a row naming no registry entry or no shipped config, a row whose AP is not its registry
entry's, a row that needs what is no architecture minidet does not run yet.
"""

from __future__ import annotations

import csv
import sys
import textwrap
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CENSUS = ROOT / "docs" / "zoo_census.tsv"
TABLE = ROOT / "docs" / "zoo.md"
README = ROOT / "README.md"
BEGIN = "<!-- zoo-table: made by tools/zoo_table.py from docs/zoo_census.tsv, the registry and the configs -->"
END = "<!-- zoo-table: end -->"
MATRIX_BEGIN = "<!-- support-matrix: made by tools/zoo_table.py from minidet.families.architectures and the configs -->"
MATRIX_END = "<!-- support-matrix: end -->"
ZOOS = ("torchvision", "Detectron", "maskrcnn-benchmark", "detectron2", "mmdetection")  # the table's order
NEEDS = "needs: "


def read_census(path: Path = CENSUS) -> list[dict[str, str]]:
    """The census rows (``zoo``, ``name``, ``box``, ``mask``, ``minidet``), comment lines (``#``) skipped."""
    with open(path, newline="", encoding="utf-8") as f:
        lines = [line for line in f if line.strip() and not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t"))


def _needs(row: dict[str, str]) -> list[str]:
    """The architectures a census row needs (none for a file minidet runs)."""
    text = row["minidet"]
    return [p.strip() for p in text[len(NEEDS):].split(",")] if text.startswith(NEEDS) else []


def _ap(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def published_ap(row: dict[str, str]) -> str:
    """A census row's published box / mask AP: the registry's for a file minidet runs (written once, in its family's
    zoo table), the census's own for the others."""
    if row["minidet"].startswith(NEEDS):
        return f"{row['box']} / {row['mask']}"
    from minidet.hub import REGISTRY

    e = REGISTRY[row["minidet"]]
    return f"{_ap(e.box_ap)} / {_ap(e.mask_ap)}"


def check(rows: list[dict[str, str]]) -> None:
    """Raise ValueError (one line) where the census and the registry or the shipped configs disagree."""
    from minidet.config import config_names
    from minidet.families.architectures import NOT_YET, RUNS
    from minidet.hub import REGISTRY

    runs, not_yet = {a.name for a in RUNS}, {a.name for a in NOT_YET}

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
            if not (r["box"] and r["mask"]):
                raise ValueError(f"{CENSUS.name}: {r['name']}: no box or mask AP ('-': none published)")
            if not name[len(NEEDS):].strip():
                raise ValueError(f"{CENSUS.name}: {r['name']}: 'needs:' names nothing")
            for part in _needs(r):
                if part in runs:
                    raise ValueError(f"{CENSUS.name}: {r['name']}: needs {part!r}, which minidet runs")
                if part not in not_yet:
                    raise ValueError(f"{CENSUS.name}: {r['name']}: needs {part!r}, no architecture of "
                                     "minidet.families.architectures")
            continue
        if name not in REGISTRY or name not in configs:
            raise ValueError(f"{CENSUS.name}: {r['name']}: {name} is no registry entry with a shipped config")
        if r["box"] or r["mask"]:
            raise ValueError(f"{CENSUS.name}: {r['name']}: AP {r['box']} / {r['mask']}: a file minidet runs has its AP "
                             f"written once, in its family's table (minidet/families/zoo/, the registry's {name}); "
                             "leave it empty here")


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
        "counts are in its first lines), the registry (`minidet weights list`) and the architecture table",
        "(`minidet.families.architectures`); `tests/test_zoo_table.py` fails when they disagree. A file minidet runs",
        "has a registry entry and a shipped config of that name (`minidet weights get NAME`, `--config-file NAME`);",
        "each of the others names the architectures minidet lacks for it.",
        "",
        f"**minidet runs {len(runs)} of the {len(rows)} files.**",
        "",
        "| zoo | files | runs |",
        "|---|---|---|",
    ]
    for zoo in ZOOS:
        mine = [r for r in rows if r["zoo"] == zoo]
        out.append(f"| {zoo} | {len(mine)} | {sum(1 for r in mine if r in runs)} |")
    out += ["", *needs_part(rows)]
    for zoo in ZOOS:
        out += ["", f"## {zoo}", "", "| file | box / mask AP | minidet |", "|---|---|---|"]
        for r in (r for r in rows if r["zoo"] == zoo):
            status = r["minidet"] if r["minidet"].startswith(NEEDS) else f"runs: `{r['minidet']}`"
            out.append(f"| {r['name']} | {published_ap(r)} | {status} |")
    return "\n".join(out) + "\n"


def needs_part(rows: list[dict[str, str]]) -> list[str]:
    """docs/zoo.md's lines of what the files minidet does not run need: each architecture of the table that minidet
    does not run yet (``NOT_YET``) with the count of files that need it, most first, and whether minidet names it in
    a file it refuses (its key patterns, by family); then those the table knows by their keys that no census file
    needs."""
    from minidet.families.architectures import NOT_YET

    count = Counter(part for r in rows for part in _needs(r))
    out = [*_wrap("What the other files need: the architectures minidet does not run yet "
                  "(`minidet.families.architectures.NOT_YET`; a file may need several). Recognized in a family's "
                  "files: such a file is refused in one line naming the architecture."), ""]
    for a in sorted((a for a in NOT_YET if count[a.name]), key=lambda a: (-count[a.name], a.name)):
        named = f" (recognized in {', '.join(sorted(a.keys))} files)" if a.keys else ""
        out.append(f"- {a.name}: {count[a.name]}{named}")
    if known := [f"{a.name} ({', '.join(sorted(a.keys))})" for a in NOT_YET if a.keys and not count[a.name]]:
        out += ["", *_wrap("Recognized too, with no file in the census: " + "; ".join(known) + ".")]
    return out


def _yes_or_lacks(arch, runtime: str) -> str:
    lacks = arch.lacks.get(runtime)
    return f"no ({lacks[1]})" if lacks else "yes"


def matrix_rows(names: list[str]) -> list[str]:
    """The support matrix's lines for the registry files ``names`` (the files minidet runs): one row per
    architecture minidet runs, from the architecture table."""
    from minidet.apps.bench.report import ARCHITECTURES as BENCH_ARCHITECTURES
    from minidet.apps.bench.report import RUNTIMES as BENCH_RUNTIMES
    from minidet.apps.bench.report import VARIANTS
    from minidet.config import get_cfg
    from minidet.families.architectures import MASK_RCNN, RUNS, turned_on
    from minidet.hub.registry import REGISTRY
    from minidet.runtimes import PRECISIONS, RUNTIMES

    defaults = get_cfg()
    on = [{a.name for a in turned_on(get_cfg(REGISTRY[name].config), defaults)} for name in names]
    int8 = PRECISIONS["int8"].runtimes
    out = ["| architecture | files | eager PyTorch | " + " | ".join(RUNTIMES.values())
           + f" | int8 ({', '.join(RUNTIMES[r] for r in int8)}) | `minidet bench --norms` |",
           "|---|---|---|" + "---|" * len(RUNTIMES) + "---|---|"]
    for arch in RUNS:
        if missing := [v.name for v in arch.bench if v.name not in BENCH_ARCHITECTURES]:
            raise ValueError(f"{arch.name}: no bench variant {missing[0]!r}")
        if arch is MASK_RCNN:
            files = sum(1 for names_on in on if not names_on)
            bench = [v for v in VARIANTS if v not in BENCH_ARCHITECTURES]  # the norms and the runtimes
        else:
            files = sum(1 for names_on in on if arch.name in names_on)
            bench = [v.name for v in arch.bench]
        if all(r in arch.lacks for r in int8):
            quantized = f"no ({arch.lacks[int8[0]][1]})"
        else:
            kept = [*arch.int8.kept_float, *(f"*.{b}" for b in arch.int8.kept_blocks)]
            quantized = "yes" + (f" (float32: {', '.join(f'`{k}`' for k in kept)})" if kept else "")
        graph = " | ".join(_yes_or_lacks(arch, r) for r in RUNTIMES)
        assert set(bench) <= set(VARIANTS) | set(BENCH_RUNTIMES)
        out.append(f"| {arch.name} | {files} | yes | {graph} | {quantized} | {', '.join(bench) or '-'} |")
    return out


def readme_block(rows: list[dict[str, str]]) -> str:
    """The README's part between ``BEGIN`` and ``END`` (markers included)."""
    check(rows)
    runs = [r for r in rows if not r["minidet"].startswith(NEEDS)]
    per_zoo = [f"{sum(1 for r in runs if r['zoo'] == z)} of {sum(1 for r in rows if r['zoo'] == z)}" for z in ZOOS]
    out = [
        BEGIN,
        *_wrap(f"Of the {len(rows)} Mask R-CNN-family checkpoints that the five zoos publish, minidet runs "
               f"{len(runs)} of the {len(rows)}, each by name: a shipped config and a registry entry (`--config-file "
               "NAME`, `MODEL.WEIGHTS NAME`). Every file, its published AP and what the others need: "
               "[docs/zoo.md](docs/zoo.md)."),
        "",
        "| " + " | ".join(ZOOS) + " |",
        "|" + "---|" * len(ZOOS),
        "| " + " | ".join(per_zoo) + " |",
        END,
    ]
    return "\n".join(out) + "\n"


def matrix_block(rows: list[dict[str, str]]) -> str:
    """The README's support matrix between ``MATRIX_BEGIN`` and ``MATRIX_END`` (markers included)."""
    check(rows)
    out = [
        MATRIX_BEGIN,
        *_wrap("The architectures minidet runs (a file may hold several; files: how many of the files minidet runs "
               "turn it on in their configs, Mask R-CNN: those that turn none of the others on), what runs each "
               "beside eager PyTorch (an exported graph under ONNX Runtime or OpenVINO, OpenVINO's int8 with the "
               "modules it keeps in float32; every export passes its parity gate first) and `minidet bench`'s "
               "variants of it:"),
        "",
        *matrix_rows([r["minidet"] for r in rows if not r["minidet"].startswith(NEEDS)]),
        MATRIX_END,
    ]
    return "\n".join(out) + "\n"


def _wrap(text: str) -> list[str]:
    return textwrap.TextWrapper(width=116, break_on_hyphens=False, break_long_words=False).wrap(text)


def with_block(readme: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    """``readme`` with its part between the markers ``begin`` and ``end`` replaced by ``block``; ValueError without
    the markers."""
    start, stop = readme.find(begin), readme.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"{README.name}: no {begin!r} ... {end!r} markers")
    return readme[:start] + block + readme[stop + len(end) + 1:]


def readme_text(readme: str, rows: list[dict[str, str]]) -> str:
    """``readme`` with both its generated parts made anew."""
    return with_block(with_block(readme, readme_block(rows)), matrix_block(rows), MATRIX_BEGIN, MATRIX_END)


def main(argv: list[str]) -> int:
    try:
        rows = read_census()
        made = {TABLE: render(rows), README: readme_text(README.read_text(encoding="utf-8"), rows)}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path, text in made.items():
        if "--check" in argv:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                print(f"error: {path} is not what {CENSUS.name}, the registry and the architecture table make; run "
                      "python tools/zoo_table.py", file=sys.stderr)
                return 1
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
