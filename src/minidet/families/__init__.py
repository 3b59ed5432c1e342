"""Weight families: everything that one source of checkpoints (torchvision, Detectron, detectron2,
maskrcnn-benchmark, ...) is, one module each, gathered in ``FAMILIES``.

A family module defines one :class:`Family`: its inference arithmetic (a ``Convention``, built on first use), how
its files are recognised from their key names, its rename table, the config values its format fixes, its checks,
its published weights (``WeightsEntry``) and where its configs are (``configs/<name>/``). The rest of minidet asks
this table and names no family. Importing it needs no torch: the arithmetic is imported when it is first asked for
(``convention(name)``), so that the ``minidet`` command's help, ``configs`` and ``weights list`` start at once.

A new family is one more module here (listed in ``_MODULES``), its configs and its tests.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Collection
from typing import TYPE_CHECKING

from .base import NOT_STATED, Family, WeightsEntry, check_body

if TYPE_CHECKING:
    from ..conventions import Convention

__all__ = ["FAMILIES", "Family", "NOT_STATED", "WeightsEntry", "check_body", "convention", "entry_for",
           "family_mismatch", "recognize", "REGISTRY", "FAMILY_OF"]

# the family modules, in the order of MODEL.CONVENTION's choices and of the weights registry
_MODULES = ("torchvision", "detectron", "detectron2", "maskrcnn_benchmark", "mmdetection")

FAMILIES: dict[str, Family] = {
    f.name: f for f in (importlib.import_module(f"{__name__}.{m}").FAMILY for m in _MODULES)
}


@functools.cache
def convention(name: str) -> Convention:
    """The arithmetic of the family ``name`` (``MODEL.CONVENTION``), built once."""
    return FAMILIES[name].arithmetic()


def recognize(keys: Collection[str]) -> tuple[Family, str] | None:
    """``(family, key layout)`` of the family whose recogniser claims ``keys`` (the recognisers are written so that
    no real file is claimed by two; the first in ``FAMILIES`` wins), else None."""
    for family in FAMILIES.values():
        if (layout := family.recognize(keys)) is not None:
            return family, layout
    return None



# every family's published weights by name (``minidet.hub``'s ``REGISTRY`` is this dict), and each one's family
REGISTRY: dict[str, WeightsEntry] = {e.name: e for f in FAMILIES.values() for e in f.weights}
FAMILY_OF: dict[str, str] = {e.name: f.name for f in FAMILIES.values() for e in f.weights}


def entry_for(value: str) -> WeightsEntry | None:
    """The registry entry named ``value``, or whose URL is ``value``; None if neither."""
    value = value.strip()
    if value in REGISTRY:
        return REGISTRY[value]
    return next((e for e in REGISTRY.values() if e.url == value), None)


def family_mismatch(weights: str, convention: str) -> str | None:
    """Why ``MODEL.WEIGHTS weights`` (a registry name, or a registry file's URL) cannot run under ``MODEL.CONVENTION
    convention``: one line naming both families and the config that runs the file (said before anything is
    downloaded; the loader would refuse the file after its download); None for any other value. A file's family
    fixes the config's family, whatever classes it was fine-tuned on."""
    entry = entry_for(str(weights))
    family = FAMILY_OF.get(entry.name) if entry is not None else None
    if family is None or family == convention:
        return None
    return (f"MODEL.WEIGHTS {str(weights).strip()} is a {family} checkpoint but the config is of the {convention} "
            f"family (MODEL.CONVENTION {convention}); the config that runs it: --config-file {entry.config} (nothing "
            "was downloaded)")
