"""The ``minidet`` command: ``minidet infer|eval|bench|export|weights|configs ...``; ``minidet CMD --help`` for each.

``infer``, ``eval``, ``bench`` and ``export`` are the programs that ``tools/infer.py``, ``tools/eval_coco.py``,
``tools/benchmark.py`` and ``tools/export.py`` run (``minidet.apps``), with the same options."""

from __future__ import annotations

import importlib
import os
import sys

# command -> (module of minidet.apps, one line for the overview)
COMMANDS = {
    "infer": ("infer", "detect in images, folders and videos: drawings, JSON, one results file (tools/infer.py)"),
    "eval": ("eval_coco", "COCO box and mask AP with the time of every stage (tools/eval_coco.py)"),
    "bench": ("benchmark", "weight-free speed benchmark against torchvision (tools/benchmark.py)"),
    "export": ("export", "the model to ONNX (ONNX Runtime), checked against eager by a parity gate (tools/export.py)"),
    "weights": ("weights", "pre-trained weights by name: list, get (download, verified), verify the cache"),
    "configs": ("", "the configs shipped with minidet, by name (--config-file NAME)"),
}


def usage() -> str:
    lines = ["usage: minidet COMMAND [options]   (minidet COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "A config is a file or a name from `minidet configs`; MODEL.WEIGHTS a file, a name from",
              "`minidet weights list` or a URL (names and URLs download once into $MINIDET_HOME, default",
              "~/.cache/minidet, checked against the published SHA-256)."]
    return "\n".join(lines)


def configs(argv: list[str]) -> int:
    """``minidet configs [--bases]``: one config name a line, with the weights it names."""
    import argparse

    from ..config import config_names, get_cfg

    p = argparse.ArgumentParser(prog="minidet configs", description="The configs shipped with minidet, by name.")
    p.add_argument("--bases", action="store_true", help="list the Base-* files that configs inherit from too")
    args = p.parse_args(argv)
    for name in config_names(bases=args.bases):
        weights = "" if name.rpartition("/")[2].startswith("Base-") else get_cfg(name).MODEL.WEIGHTS
        print(f"{name:<52} {weights}".rstrip())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from .. import __version__

        print(f"minidet {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; one of {', '.join(COMMANDS)} (minidet --help)", file=sys.stderr)
        return 2
    try:
        if name == "configs":
            return configs(rest)
        return importlib.import_module(f"minidet.apps.{COMMANDS[name][0]}").main(rest, prog=f"minidet {name}")
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly, as other commands do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
