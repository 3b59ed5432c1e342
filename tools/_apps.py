"""What ``tools/infer.py``, ``eval_coco.py``, ``benchmark.py`` and ``export.py`` run: the code of the ``minidet``
command (``minidet.apps``), installed or, in a checkout that is not installed, from ``src/``."""

import importlib.util
import sys
from pathlib import Path


def main(app: str) -> int:
    """Run the program of the script ``tools/<app>.py`` (its module: ``minidet.apps.cli.SCRIPTS``) as
    ``minidet.apps.cli.run`` does (Ctrl-C: one line, status 130), with this script's arguments."""
    try:
        if importlib.util.find_spec("minidet") is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        from minidet.apps.cli import SCRIPTS, run
    except KeyboardInterrupt:  # Ctrl-C while the package itself loads (torch), before run() can catch it
        print("error: interrupted", file=sys.stderr)
        return 130
    return run(SCRIPTS[app], sys.argv[1:], prog=f"{app}.py")
