"""The ``minidet`` command: ``minidet infer|eval|bench|export|serve|bench-serve|convert|weights|configs ...``;
``minidet CMD --help`` for each.

``infer``, ``eval``, ``bench``, ``export``, ``serve`` and ``bench-serve`` are the programs that ``tools/infer.py``,
``tools/eval_coco.py``, ``tools/benchmark.py``, ``tools/export.py``, ``tools/serve.py`` and ``tools/bench_serve.py``
run (``minidet.apps``), with the same options."""

from __future__ import annotations

import importlib
import os
import sys

from . import fail

# command -> (module of minidet.apps, one line for the overview)
COMMANDS = {
    "infer": ("infer", "detect in images, folders and videos: drawings, JSON, one results file (tools/infer.py)"),
    "eval": ("eval_coco", "COCO box and mask AP with the time of every stage (tools/eval_coco.py)"),
    "bench": ("bench.benchmark", "weight-free speed benchmark against torchvision (tools/benchmark.py)"),
    "export": ("export.program", "the model to ONNX (ONNX Runtime, OpenVINO), checked against eager by a parity gate "
               "(tools/export.py)"),
    "serve": ("serve.program", "the model behind HTTP: POST /predict answers what infer writes; a page at / "
              "(the serve extra)"),
    "bench-serve": ("serve.load", "load benchmark of a running `minidet serve`: latency at 0.5x, 1x, 2x its rate"),
    "convert": ("convert", "infer's results as a COCO dataset, CVAT XML, Label Studio tasks, YOLO-seg labels or "
                "GeoJSON"),
    "weights": ("weights", "pre-trained weights by name: list, get (download, verified), verify the cache"),
    "configs": ("", "the configs shipped with minidet, by name (--config-file NAME)"),
}


# the scripts of tools/ -> the module of minidet.apps each runs
SCRIPTS = {"infer": "infer", "eval_coco": "eval_coco", "benchmark": "bench.benchmark", "export": "export.program",
           "serve": "serve.program", "bench_serve": "serve.load"}


def usage() -> str:
    lines = ["usage: minidet COMMAND [options]   (minidet COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<11} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "A config is a file or a name from `minidet configs`; MODEL.WEIGHTS a file, a name from",
              "`minidet weights list` or a URL (names and URLs download once into $MINIDET_HOME, default",
              "~/.cache/minidet, checked against the published SHA-256)."]
    return "\n".join(lines)


def configs(argv: list[str], prog: str = "minidet configs") -> int:
    """``minidet configs [--bases]``: one config name a line, with the weights it names."""
    import argparse

    from ..config import config_names, get_cfg

    p = argparse.ArgumentParser(prog=prog, description="The configs shipped with minidet, by name.")
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
    return run(COMMANDS[name][0], rest, prog=f"minidet {name}")


def run(app: str, argv: list[str], prog: str) -> int:
    """The exit status of ``minidet.apps.<app>.main(argv, prog=prog)`` (``app`` "": ``configs``), the module
    imported here: Ctrl-C at any point from here on, while the application's modules (torch) load too, is the
    one line ``error: interrupted`` (with ``--debug`` the traceback first) and status 130, as the applications'
    own handling (``run_app``) has it; output piped into `head` and the like stops quietly (141).
    ``tools/*.py`` run their program through here."""
    try:
        main = importlib.import_module(f"minidet.apps.{app}").main if app else configs
        return main(argv, prog=prog)
    except KeyboardInterrupt:
        fail("interrupted", "--debug" in argv)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly, as other commands do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
