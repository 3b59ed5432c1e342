"""What ``tools/infer.py``, ``eval_coco.py`` and ``benchmark.py`` run: the code of the ``minidet`` command
(``minidet.apps``), installed or, in a checkout that is not installed, from ``src/``."""

import importlib
import sys
from pathlib import Path


def main(app: str) -> int:
    try:
        import minidet  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    return importlib.import_module(f"minidet.apps.{app}").main(prog=f"{app}.py")
