"""minidet: a minimal, fast, exact Mask R-CNN inference engine."""

from .checkpoint import CheckpointError, load_checkpoint
from .config import ConfigError, get_cfg
from .detector import MaskRCNN, build_model
from .predictor import Predictor, prepare_model

__all__ = [
    "CheckpointError", "ConfigError", "MaskRCNN", "Predictor", "build_model", "get_cfg", "load_checkpoint",
    "prepare_model",
]
__version__ = "0.1.0"
