"""Import a script of tools/ as a module (they are scripts, not a package) for in-process tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def load_tool(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem + "_tool", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
