"""Pre-trained weights: the registry (``registry``: every family's published checkpoints by name), the cache and
``MODEL.WEIGHTS`` resolution (``cache``: paths, names and URLs; a cached file checked before each use) and the
verified, resumable download (``downloads``). See weights/README.md.

The names below are the package's interface (``from minidet import hub``; ``hub.resolve_weights(...)``).
"""

from __future__ import annotations

from .cache import (
    cache_path,
    check_cached,
    fetch,
    home,
    is_url,
    resolve_weights,
    verify_cached,
    verify_file,
    weights_dir,
    weights_path,
)
from .downloads import DownloadError, download, file_sha256, not_a_checkpoint, recorded_digest
from .registry import REGISTRY, WeightsEntry, entry_for

__all__ = [
    "REGISTRY", "DownloadError", "WeightsEntry", "cache_path", "check_cached", "download", "entry_for", "fetch",
    "file_sha256", "home", "is_url", "not_a_checkpoint", "recorded_digest", "resolve_weights", "verify_cached",
    "verify_file", "weights_dir", "weights_path",
]
