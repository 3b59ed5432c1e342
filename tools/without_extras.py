"""Run pytest as on a machine with only the default extras installed, in a venv that has them all: the modules of
every optional extra of pyproject.toml but ``test`` (the README's set-up installs ``test`` alone) are hidden from the
pytest process and every Python process it starts (``tools/without_extras/sitecustomize.py``), so a test that needs
an extra and does not skip without it fails here. CI runs the first check so (``.ci/run``).

    python tools/without_extras.py [PYTEST ARGS]      # e.g. -m "not slow"
    python tools/without_extras.py --naming-extras [PYTEST ARGS]

``--naming-extras``: only the test files that name an optional extra (``needs_extra``, ``importorskip``,
``find_spec``, or one of the hidden modules imported or quoted) and the CLI smoke run (``SMOKE``): what CI runs so
(the other files need no extra, and run with every extra in CI's first part).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EXTRAS = {"test"}
SMOKE = ["tests/test_cli.py"]  # the minidet command as a newcomer first runs it


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def hidden_modules() -> list[str]:
    """The top-level modules of the distributions that the optional extras require and neither the dependencies
    nor the default extras do, where installed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    kept = {_name(r) for r in project["dependencies"]} | {_name(r) for e in DEFAULT_EXTRAS for r in extras[e]}
    optional = {_name(r) for e, reqs in extras.items() if e not in DEFAULT_EXTRAS for r in reqs} - kept
    modules = set()
    for module, dists in importlib.metadata.packages_distributions().items():
        if any(d.lower().replace("_", "-") in optional for d in dists) and module.isidentifier():
            modules.add(module)
    return sorted(modules)


def files_naming_extras(modules: list[str]) -> list[str]:
    """The test files (relative to the checkout) that name an optional extra or one of ``modules``."""
    names = "|".join(map(re.escape, modules))
    naming = re.compile(r"needs_extra\(|importorskip\(|find_spec\(" + (
        rf"|^\s*(?:import|from)\s+(?:{names})\b|[\"'](?:{names})[\"'.]" if names else ""), re.MULTILINE)
    return [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").glob("test_*.py"))
            if naming.search(p.read_text(encoding="utf-8"))]


def main(args: list[str]) -> int:
    modules = hidden_modules()
    if "--naming-extras" in args:
        files = files_naming_extras(modules)
        args = [a for a in args if a != "--naming-extras"] + sorted(set(files) | set(SMOKE))
        print(f"without extras: {len(files)} test files name an extra, and the CLI smoke run ({', '.join(SMOKE)})",
              flush=True)
    env = {k: v for k, v in os.environ.items() if k != "MINIDET_REQUIRE_EXTRAS"}  # missing extras skip here
    env["MINIDET_HIDE_MODULES"] = ",".join(modules)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tools" / "without_extras"), env.get("PYTHONPATH")]))
    print(f"without extras: hiding {len(modules)} modules of the optional extras ({', '.join(modules) or 'none'})",
          flush=True)
    return subprocess.call([sys.executable, "-m", "pytest", *args], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
