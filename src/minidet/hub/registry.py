"""The pre-trained weights registry: every weight family's published checkpoints (``Family.weights``) by name."""

from __future__ import annotations

import difflib

from ..families import FAMILIES, WeightsEntry

# every family's published weights, by name
REGISTRY: dict[str, WeightsEntry] = {e.name: e for f in FAMILIES.values() for e in f.weights}


def entry_for(value: str) -> WeightsEntry | None:
    """The registry entry named ``value``, or whose URL is ``value``; None if neither."""
    value = value.strip()
    if value in REGISTRY:
        return REGISTRY[value]
    return next((e for e in REGISTRY.values() if e.url == value), None)


def close_names(text: str) -> str:
    """`` (close: a, b)``: the registry names near ``text``, or '' if none is."""
    close = difflib.get_close_matches(text, list(REGISTRY), n=3, cutoff=0.5)
    return f" (close: {', '.join(close)})" if close else ""


