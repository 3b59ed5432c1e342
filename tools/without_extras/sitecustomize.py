"""Imported by every Python process started with this folder on PYTHONPATH (``tools/without_extras.py`` does so):
the modules named in ``MINIDET_HIDE_MODULES`` (comma-separated) are absent for it, as where their extra is not
installed: ``import`` raises ModuleNotFoundError and ``importlib.util.find_spec`` gives None (a None entry in
``sys.modules`` is Python's own way to say that a module cannot be imported)."""

import os
import sys

for _name in filter(None, os.environ.get("MINIDET_HIDE_MODULES", "").split(",")):
    sys.modules[_name] = None
