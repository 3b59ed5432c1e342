"""minidet's licence: the LICENSE file (Apache-2.0 with minidet's copyright line), declared in pyproject.toml as
PEP 639 asks, and carried by the wheel a user installs."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LICENSE = ROOT / "LICENSE"


def test_license_file_is_apache_2_with_minidets_copyright():
    lines = LICENSE.read_text().splitlines()
    assert lines[0] == "Copyright 2026 the minidet authors"
    text = "\n".join(lines[1:])
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "http://www.apache.org/licenses/LICENSE-2.0" in text


def test_pyproject_declares_the_licence():
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is not in Python 3.10)
    project = text.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^license = "Apache-2.0"$', project, re.M)
    assert re.search(r'^license-files = \["LICENSE"\]$', project, re.M)
    assert "License ::" not in text  # PEP 639: no licence classifier beside the expression


@pytest.mark.slow
def test_wheel_carries_the_licence(tmp_path):
    """The wheel pip builds from the checkout (its own build environment, as a user's pip builds it) names the
    licence in its metadata and carries the file."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path),
                        str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("minidet-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = z.read(meta).decode().split("\n\n", 1)[0].splitlines()
        (carried,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert z.read(carried) == LICENSE.read_bytes()
    assert "License-Expression: Apache-2.0" in headers and "License-File: LICENSE" in headers
