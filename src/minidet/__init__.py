"""minidet: a minimal, fast, exact Mask R-CNN inference engine.

The names below are imported on first use (``minidet.Predictor``), so that ``import minidet.apps.cli`` and the
``minidet`` command's help, ``configs`` and ``weights list`` need no torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "CheckpointError": "errors", "ConfigError": "errors", "InputError": "errors", "MinidetError": "errors",
    "RuntimeFailure": "errors", "MaskRCNN": "detector", "Predictor": "predictor", "build_model": "detector",
    "get_cfg": "config", "load_checkpoint": "checkpoint", "prepare_model": "predictor", "BoxMasks": "masks",
    "SlicedPredictor": "slicing", "Slicing": "slicing", "load_cfg": "config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
