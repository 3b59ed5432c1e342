"""minidet's detections in other libraries' types: ``to_supervision`` (supervision's ``sv.Detections``)."""

from __future__ import annotations

from .supervision import to_supervision

__all__ = ["to_supervision"]
