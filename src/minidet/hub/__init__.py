"""Pre-trained weights: the registry (``registry``: every family's published checkpoints by name, and the licence
each zoo states for them), the cache and ``MODEL.WEIGHTS`` resolution (``cache``: paths, names and URLs; a cached
file checked before each use) and the verified, resumable download (``downloads``). See weights/README.md.

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
from .registry import (
    ARCHITECTURES,
    DATASETS,
    NOT_STATED,
    PLAIN,
    REGISTRY,
    ZOO_LICENCES,
    Traits,
    WeightsEntry,
    ZooLicence,
    entry_for,
    family_of,
    licence_of,
    traits,
)

__all__ = [
    "ARCHITECTURES", "DATASETS", "NOT_STATED", "PLAIN", "REGISTRY", "ZOO_LICENCES", "DownloadError", "Traits",
    "WeightsEntry", "ZooLicence", "cache_path", "check_cached", "download", "entry_for", "family_of", "fetch",
    "file_sha256", "home", "is_url", "licence_of", "not_a_checkpoint", "recorded_digest", "resolve_weights", "traits",
    "verify_cached", "verify_file", "weights_dir", "weights_path",
]
