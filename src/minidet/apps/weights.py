"""``minidet weights``: the pre-trained weights registry and the download cache.

Usage::

    minidet weights list                   # every registry name, its published AP, size, weights licence
    minidet weights list --arch cascade --dataset coco --sort ap   # filtered (--family too), best mask AP first
    minidet weights list --long            # also config, architecture, dataset, cached or not, digest, URL
    minidet weights list --format json     # every field, for programs (or tsv)
    minidet weights get NAME|URL [...]     # download into the cache (resumable, verified); print the paths
    minidet weights verify [NAME ...]      # check the cached files' SHA-256 (exit status 1 on a mismatch)

The cache is ``$MINIDET_HOME/weights`` (default ``~/.cache/minidet/weights``). A registry name is the name of
the config the checkpoint belongs to; ``MODEL.WEIGHTS NAME`` (or a URL) downloads on first use too. Errors:
one ``error:`` line on stderr, exit status 2. See weights/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import hub
from ..errors import ConfigError
from . import FAILURES, failure

FORMATS = ("short", "long", "tsv", "json")
SORTS = ("registry", "name", "ap")


def parse_args(argv: list[str] | None = None, prog: str = "minidet weights") -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog, description="The pre-trained weights registry and the download cache "
        f"({hub.weights_dir()}; set MINIDET_HOME to move it).")
    sub = p.add_subparsers(dest="command", metavar="{list,get,verify}", required=True)
    lst = sub.add_parser(
        "list", help="list the registry: name, published AP, size, licence (filters, --long)",
        description="List the registry: each file's name (= its config), published COCO box/mask AP, size "
        "(published, else of the cached file) and the licence its zoo states for the weights. --long adds its "
        "config, architecture, dataset, whether it is cached, its digest and URL.")
    lst.add_argument("--family", metavar="F", help=f"only this family's files ({', '.join(_families())})")
    lst.add_argument("--arch", metavar="A", help=f"only files of this architecture ({', '.join(_archs())})")
    lst.add_argument("--dataset", metavar="D", help=f"only files trained on this dataset ({', '.join(_datasets())})")
    lst.add_argument("--sort", choices=SORTS, default="registry",
                     help="registry order (by family, the default), name, or ap: mask AP, then box AP, highest first")
    lst.add_argument("--format", choices=FORMATS, default="short",
                     help="short (default), long (every column), tsv or json (every field, for programs)")
    lst.add_argument("-l", "--long", dest="format", action="store_const", const="long", help="same as --format long")
    g = sub.add_parser("get", help="download checkpoints into the cache and print their paths",
                       description="Download registry names or http(s) URLs into the cache (resuming a partial "
                       "download, checking the SHA-256) and print each file's path. A cached file is not "
                       "downloaded again. A download says, on stderr, the licence its zoo states for the weights.")
    g.add_argument("names", nargs="+", metavar="NAME|URL", help="registry name (`list`) or http(s) URL")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: if stderr is a terminal)")
    v = sub.add_parser("verify", help="check the cached files' SHA-256 (exit status 1 on a mismatch)",
                       description="Check each cached registry file against its published SHA-256 and size, or, "
                       "for sources that publish none, against the digest recorded at its first download, and "
                       "against the digest prefix in its name. Exit status 1 if any file does not match.")
    v.add_argument("names", nargs="*", metavar="NAME", help="registry names (default: all)")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------------------------
# minidet weights list


def _families() -> list[str]:
    return list(dict.fromkeys(f for e in hub.REGISTRY.values() if (f := hub.family_of(e)) is not None))


def _archs() -> list[str]:
    return [hub.PLAIN, *hub.ARCHITECTURES]


def _datasets() -> list[str]:
    names = list(dict.fromkeys(hub.DATASETS.values()))
    return sorted({*names, *(n.partition("-")[0] for n in names)})


def _has_family(e: hub.WeightsEntry, value: str) -> bool:
    return hub.family_of(e) == value


def _has_arch(e: hub.WeightsEntry, value: str) -> bool:
    return value in hub.traits(e.name).architectures


def _has_dataset(e: hub.WeightsEntry, value: str) -> bool:
    """``lvis`` is ``lvis-v0.5`` and ``lvis-v1``."""
    return value in (dataset := hub.traits(e.name).dataset, dataset.partition("-")[0])


class Filter(NamedTuple):
    """A ``list`` filter: ``what`` its values are (for messages), its ``choices()`` and whether a file ``has`` a
    value."""

    what: str
    choices: Callable[[], list[str]]
    has: Callable[[hub.WeightsEntry, str], bool]


# by option name (--family, --arch, --dataset)
FILTERS: dict[str, Filter] = {
    "family": Filter("family", _families, _has_family),
    "arch": Filter("architecture", _archs, _has_arch),
    "dataset": Filter("dataset", _datasets, _has_dataset),
}


def _check_filters(given: dict[str, str]) -> None:
    """A filter value that is none of its choices: one line with the choices."""
    for option, value in given.items():
        f = FILTERS[option]
        if value not in f.choices():
            raise ConfigError(f"--{option} {value}: no such {f.what}; choices: {', '.join(f.choices())}")


def _select(given: dict[str, str], skip: str = "") -> list[hub.WeightsEntry]:
    """The registry files that pass every filter in ``given`` but ``skip``."""
    return [e for e in hub.REGISTRY.values() if all(FILTERS[o].has(e, v) for o, v in given.items() if o != skip)]


def _nothing_matches(given: dict[str, str]) -> str:
    """One line: no file passes all the filters; for each, the values the files passing the others have."""
    shown = " ".join(f"--{o} {v}" for o, v in given.items())
    parts = []
    for option in given:
        others = " ".join(f"--{o} {v}" for o, v in given.items() if o != option)
        files = _select(given, skip=option)
        f = FILTERS[option]
        values = [c for c in f.choices() if any(f.has(e, c) for e in files)]
        parts.append(f"with {others}: --{option} {', '.join(values) or '(none)'}")
    return f"no registry file matches {shown}; {'; '.join(parts)}"


def _ap(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _mib(size: int | None) -> str:
    return "-" if size is None else f"{size / 2**20:.1f} MiB"


def _whole_mib(size: int | None) -> str:
    return "-" if size is None else f"{size / 2**20:.0f}"


def _record(e: hub.WeightsEntry, full: bool) -> dict:
    """What ``list`` says of the registry file ``e``; ``full``: its architecture and dataset too (read from its
    config)."""
    path = hub.weights_dir() / e.filename
    cached = path.is_file()
    z = hub.licence_of(e)
    recorded = hub.recorded_digest(path)
    digest = "published" if e.sha256 else "recorded" if recorded else "prefix" if e.name_prefix else "none"
    record = {"name": e.name, "family": hub.family_of(e), "config": e.config, "box_ap": e.box_ap,
              "mask_ap": e.mask_ap, "size": e.size if e.size is not None else path.stat().st_size if cached else None,
              "licence": z.licence if z is not None else None, "cached": cached, "digest": digest,
              "sha256": e.sha256 or recorded or (f"{e.name_prefix}..." if e.name_prefix else None), "url": e.url,
              "path": str(path)}
    if full:
        t = hub.traits(e.name)
        record |= {"architecture": "+".join(t.architectures), "dataset": t.dataset}
    return record


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _short(records: list[dict], total: int) -> str:
    rows = [("name", "box/mask AP", "MiB", "licence")]
    rows += [(r["name"], f"{_ap(r['box_ap'])}/{_ap(r['mask_ap'])}", _whole_mib(r["size"]),
              r["licence"] or "?") for r in records]
    return (f"{_table(rows)}\n\n{len(records)} of {total} files; --long: config, architecture, dataset, cached, "
            "digest, URL; licences: weights/README.md")


def _long(records: list[dict], total: int) -> str:
    digest = {"prefix": lambda r: r["sha256"], "none": lambda r: "none"}
    rows = [("name", "config", "arch", "dataset", "box/mask AP", "size", "weights licence", "cached", "sha256",
             "url")]
    rows += [(r["name"], r["config"], r["architecture"], r["dataset"], f"{_ap(r['box_ap'])} / {_ap(r['mask_ap'])}",
              _mib(r["size"]), r["licence"] or "?", "yes" if r["cached"] else "no",
              digest.get(r["digest"], lambda r: r["digest"])(r), r["url"]) for r in records]
    return (f"{_table(rows)}\n\n{len(records)} of {total} registry files; cache: {hub.weights_dir()} "
            f"(MINIDET_HOME={hub.home()}); sha256 'recorded': the source publishes none, the first download's digest "
            "was recorded; 'abcd1234...': only the start in the file name is known\nweights licence: as each zoo "
            "states it for its published weights ('not stated': the zoo says nothing of it); the zoos' words and "
            "where they say them: weights/README.md")


def _cell(value: Any) -> str:
    return "" if value is None else ("yes" if value else "no") if isinstance(value, bool) else str(value)


def _tsv(records: list[dict], total: int) -> str:
    keys = list(_record(next(iter(hub.REGISTRY.values())), full=True))
    return "\n".join(["\t".join(keys)] + ["\t".join(_cell(r[k]) for k in keys) for r in records])


def _json(records: list[dict], total: int) -> str:
    return json.dumps(records, indent=1)


# --format -> how the records are printed
PRINTERS: dict[str, Callable[[list[dict], int], str]] = {"short": _short, "long": _long, "tsv": _tsv, "json": _json}
SORT_KEYS: dict[str, Callable[[dict], Any] | None] = {
    "registry": None,
    "name": lambda r: r["name"],
    "ap": lambda r: (-(r["mask_ap"] if r["mask_ap"] is not None else -1.0),
                     -(r["box_ap"] if r["box_ap"] is not None else -1.0)),
}


def list_weights(family: str | None = None, arch: str | None = None, dataset: str | None = None,
                 sort: str = "registry", form: str = "short") -> int:
    """Print the registry files that pass the filters, sorted, in ``form`` (``FORMATS``); a filter value that is
    none of its choices is an error, filters that no file passes all are one line (on stderr) saying so."""
    given = {o: v for o, v in (("family", family), ("arch", arch), ("dataset", dataset)) if v is not None}
    _check_filters(given)
    records = [_record(e, full=form != "short") for e in _select(given)]
    if (key := SORT_KEYS[sort]) is not None:
        records.sort(key=key)
    if not records:
        print(f"minidet: {_nothing_matches(given)}", file=sys.stderr)
        if form in ("short", "long"):
            return 0
    print(PRINTERS[form](records, len(hub.REGISTRY)))
    return 0


def get_weights(names: list[str], progress: bool | None) -> int:
    for name in names:
        print(hub.fetch(name, progress=progress), flush=True)
    return 0


def verify_weights(names: list[str]) -> int:
    rows = hub.verify_cached(names or None)
    print(_table([("name", "status", "path")] + [(n, s, p) for n, p, s in rows]))
    bad = [n for n, _, s in rows if s.startswith("MISMATCH")]
    if bad:
        print(f"{len(bad)} cached file(s) do not match: delete them and run `minidet weights get NAME` again",
              file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None, prog: str = "minidet weights") -> int:
    """Run ``minidet weights``; return the exit status (0 ok, 1 verify found a mismatch, 2 error)."""
    args = parse_args(argv, prog)
    try:
        if args.command == "list":
            return list_weights(args.family, args.arch, args.dataset, args.sort, args.format)
        if args.command == "get":
            return get_weights(args.names, args.progress)
        return verify_weights(args.names)
    except BrokenPipeError:  # `minidet weights list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except FAILURES as e:
        return failure(e, debug=False)


if __name__ == "__main__":
    sys.exit(main())
