"""``minidet weights``: the pre-trained weights registry and the download cache.

Usage::

    minidet weights list                   # every registry name, its config, published AP, size, weights licence,
                                           # cached or not
    minidet weights get NAME|URL [...]     # download into the cache (resumable, verified); print the paths
    minidet weights verify [NAME ...]      # check the cached files' SHA-256 (exit status 1 on a mismatch)

The cache is ``$MINIDET_HOME/weights`` (default ``~/.cache/minidet/weights``). A registry name is the name of
the config the checkpoint belongs to; ``MODEL.WEIGHTS NAME`` (or a URL) downloads on first use too. Errors:
one ``error:`` line on stderr, exit status 2. See weights/README.md.
"""

from __future__ import annotations

import argparse
import sys

from .. import hub
from ..errors import MinidetError
from . import fail


def parse_args(argv: list[str] | None = None, prog: str = "minidet weights") -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog, description="The pre-trained weights registry and the download cache "
        f"({hub.weights_dir()}; set MINIDET_HOME to move it).")
    sub = p.add_subparsers(dest="command", metavar="{list,get,verify}", required=True)
    sub.add_parser("list", help="list the registry: name, config, published AP, size, licence, cached, digest",
                   description="List the registry: name, config, published COCO box/mask AP, size, the licence its "
                   "zoo states for the weights, whether the file is cached and whether its source publishes a "
                   "SHA-256.")
    g = sub.add_parser("get", help="download checkpoints into the cache and print their paths",
                       description="Download registry names or http(s) URLs into the cache (resuming a partial "
                       "download, checking the SHA-256) and print each file's path. A cached file is not "
                       "downloaded again. A download says, on stderr, the licence its zoo states for the weights.")
    g.add_argument("names", nargs="+", metavar="NAME|URL", help="registry name (`list`) or http(s) URL")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: if stderr is a terminal)")
    v = sub.add_parser("verify", help="check the cached files' SHA-256 (exit status 1 on a mismatch)",
                       description="Check each cached registry file against its published SHA-256 and size, or, "
                       "for sources that publish none, against the digest recorded at its first download. Exit "
                       "status 1 if any file does not match.")
    v.add_argument("names", nargs="*", metavar="NAME", help="registry names (default: all)")
    return p.parse_args(argv)


def _ap(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _size(size: int | None) -> str:
    return "?" if size is None else f"{size / 2**20:.1f} MiB"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def list_weights() -> int:
    rows = [("name", "config", "box/mask AP", "size", "weights licence", "cached", "sha256")]
    for e in hub.REGISTRY.values():
        path = hub.weights_dir() / e.filename
        prefix = f"{e.name_prefix}..." if e.name_prefix else "none"  # the digest's start, from the file name
        digest = "published" if e.sha256 else ("recorded" if hub.recorded_digest(path) else prefix)
        cached = "yes" if path.is_file() else "no"
        licence = z.licence if (z := hub.licence_of(e)) is not None else "?"
        rows.append((e.name, e.config, f"{_ap(e.box_ap)} / {_ap(e.mask_ap)}", _size(e.size), licence, cached,
                     digest))
    print(_table(rows))
    print(f"\ncache: {hub.weights_dir()} (MINIDET_HOME={hub.home()}); sha256 'recorded': the source publishes "
          "none, the first download's digest was recorded; 'abcd1234...': only the start in the file name is known")
    print("weights licence: as each zoo states it for its published weights ('not stated': the zoo says nothing "
          "of it); the zoos' words and where they say them: weights/README.md")
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
            return list_weights()
        if args.command == "get":
            return get_weights(args.names, args.progress)
        return verify_weights(args.names)
    except (MinidetError, OSError) as e:
        return fail(str(e), debug=False)
    except KeyboardInterrupt:
        fail("interrupted", debug=False)
        return 130


if __name__ == "__main__":
    sys.exit(main())
