"""The Python form of ``--engine ray`` under its first name: ``from minidet.apps.raydata import Detect`` (now
``minidet.apps.bulk.raydata``)."""

from minidet.apps.bulk.raydata import Detect

__all__ = ["Detect"]
