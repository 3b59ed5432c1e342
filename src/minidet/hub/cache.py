"""The download cache and ``MODEL.WEIGHTS`` resolution.

``MODEL.WEIGHTS`` (and ``minidet weights get``) take a registry name (``torchvision/maskrcnn_resnet50_fpn``, the
name of the config the file belongs to), an ``http(s)://`` URL, or a path. Names and URLs are downloaded on first
use into ``home() / "weights"`` (``$MINIDET_HOME``, default ``~/.cache/minidet``); a path is never downloaded. A
cached file is checked before each use (:func:`check_cached`: its size every time, its digest once per file state).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from ..errors import CheckpointError
from ..families import WeightsEntry
from ..families.base import digest_prefix
from .downloads import (
    DownloadError,
    digest_file,
    download,
    file_sha256,
    not_a_checkpoint,
    recorded_digest,
    remember_verified,
    source_file,
    verified_digest,
)
from .registry import REGISTRY, close_hint, entry_for, licence_line

NO_WEIGHTS = "none"  # MODEL.WEIGHTS value (any case) that runs the network with random weights


def home() -> Path:
    """minidet's cache folder: ``$MINIDET_HOME``, else ``~/.cache/minidet`` (absolute)."""
    value = os.environ.get("MINIDET_HOME", "").strip()
    return Path(os.path.expanduser(value) if value else os.path.expanduser("~/.cache/minidet")).absolute()


def weights_dir() -> Path:
    """Where downloads go: ``home() / "weights"``."""
    return home() / "weights"


def is_url(value: str) -> bool:
    return value.strip().lower().startswith(("http://", "https://"))


def cache_path(value: str) -> Path:
    """Where the download of a registry name or URL is (or will be) kept."""
    entry = entry_for(value)
    if entry is not None:
        return weights_dir() / entry.filename
    if not is_url(value):
        raise CheckpointError(f"{value} is neither a registry name nor an http(s) URL{close_hint(value)}")
    name = urllib.parse.unquote(PurePosixPath(urllib.parse.urlsplit(value.strip()).path).name)
    if not name or name in (".", ".."):
        raise CheckpointError(f"{value}: the URL names no file (its path has no last part)")
    return weights_dir() / name


def fetch(value: str, *, progress: bool | None = None) -> str:
    """The cached file of a registry name or URL, downloaded (and verified) first if it is not there yet."""
    value = value.strip()
    dest = cache_path(value)
    entry = entry_for(value)
    url = entry.url if entry is not None else value
    if dest.is_file():
        _check_source(dest, url)
        check_cached(dest, entry, url)
        return str(dest)
    sha256, size = (entry.sha256, entry.size) if entry is not None else (None, None)
    about = licence_line(entry) if entry is not None else None
    return str(download(url, dest, sha256=sha256, size=size, progress=progress, about=about))


def _check_source(dest: Path, url: str) -> None:
    """A cached file recorded as downloaded from another URL (two URLs ending in ``model_final.pkl``) is refused."""
    recorded = recorded_source(dest)
    if recorded is not None and recorded != url:
        raise CheckpointError(f"{dest} was downloaded from {recorded}, not from {url}; pass the file's path, or "
                              f"delete it (and {source_file(dest).name}) to download {url}")


def _repo_root() -> Path | None:
    root = Path(__file__).resolve().parents[3]  # src/minidet/hub/cache.py in a checkout
    return root if (root / "pyproject.toml").is_file() else None


def resolve_weights(value: str, *, progress: bool | None = None) -> str:
    """The absolute path of an existing checkpoint file for ``value``: an http(s) URL or a registry name
    (downloaded on first use), or a path. A relative path is tried against the current folder, then ``home()``
    (``weights/x.pth`` finds ``~/.cache/minidet/weights/x.pth``), then the repository root of a checkout. Nothing
    is downloaded for a path. Raises ``CheckpointError`` (one line) if nothing is found."""
    text = str(value).strip()
    if not text:
        raise CheckpointError("no weights given (empty name / path)")
    if is_url(text) or text in REGISTRY:
        return fetch(text, progress=progress)
    path = Path(os.path.expanduser(text))
    if path.is_absolute():
        candidates = [path]
    else:
        bases = [Path.cwd(), home()] + ([r] if (r := _repo_root()) is not None else [])
        candidates = list(dict.fromkeys((b / path).absolute() for b in bases))
    for candidate in candidates:
        if candidate.is_file():
            if candidate.parent.resolve() == weights_dir().resolve():  # a download, reached by its path
                check_cached(candidate, next((e for e in REGISTRY.values() if e.filename == candidate.name), None))
            return str(candidate)
    tried = ", ".join(str(c) for c in candidates)
    owners = [e.name for e in REGISTRY.values() if e.filename == path.name]
    if owners:
        hint = f"; `minidet weights get {owners[0]}` downloads it (or set MODEL.WEIGHTS {owners[0]})"
    elif "/" in text and not path.suffix:
        hint = f"; it is not a registry name either{close_hint(text)}"
    else:
        hint = "; `minidet weights list` names the official weights (weights/README.md: URLs and sha256)"
    what = "directory, not a checkpoint file" if any(c.is_dir() for c in candidates) else "not found"
    raise CheckpointError(f"weights {text}: {what} (tried {tried}){hint}")


def weights_path(value: str) -> str | None:
    """The absolute path of the checkpoint a ``MODEL.WEIGHTS`` value names (a path, a registry name or a URL, see
    :func:`resolve_weights`; a name or URL is downloaded on first use); None for ``none`` (random weights). An empty
    value is an error: random weights give detections that look real."""
    text = str(value).strip()
    if not text:
        raise CheckpointError("MODEL.WEIGHTS is empty; name a checkpoint file, or set MODEL.WEIGHTS none to run with "
                              "random weights (e.g. for benchmarks)")
    return None if text.lower() == NO_WEIGHTS else resolve_weights(text)


# ----------------------------------------------------------------------------------------------------------------
# a cached file before its use


def check_cached(path: Path, entry: WeightsEntry | None = None, url: str | None = None) -> None:
    """Check a cached download before it is used: its size against ``entry``'s published size, every time; its
    SHA-256 against the published digest (else the one recorded at its first download) and the digest prefix in its
    name (``-bf2d0c1e.pth`` of a host that names its files so, :func:`digest_prefix`) and, for a recorded digest, its
    format, once per file state: a passed check is remembered beside the file in ``<file>.verified`` (size,
    mtime_ns, digest), so that a 170 MB file is hashed again only after it changed. With neither a digest nor a
    prefix known (a file put there by hand) only the size is checked. ``url``: where a file of no registry ``entry``
    comes from (else its ``<file>.url``). Raises ``DownloadError``: one line with both digests and the command that
    fetches a fresh copy."""
    st = path.stat()
    full, prefix, published = _expected(path, entry, url)
    size = entry.size if entry is not None else None
    known = verified_digest(path, st)
    if (size is None or st.st_size == size) and (
            (full is None and prefix is None) or (known is not None and _contradicts(known, full, prefix) is None)):
        return
    actual = file_sha256(path)
    what = " (published)" if published else f" (recorded at its first download in {digest_file(path)})"
    if size is not None and st.st_size != size:
        raise DownloadError(f"{path}: the cached file has {st.st_size} bytes and SHA-256 {actual}, expected {size} "
                            f"bytes and SHA-256 {full or '(not published)'}{what}; {_fresh_copy(path, entry)}")
    if (wrong := _contradicts(actual, full, prefix, what)) is not None:
        raise DownloadError(f"{path}: the cached file has SHA-256 {actual}, expected {wrong}; "
                            f"{_fresh_copy(path, entry)}")
    if full is not None and not published and (other := not_a_checkpoint(path)) is not None:  # an older minidet's
        raise DownloadError(f"{path}: the cached file is {other}, not a checkpoint, and its digest was recorded "
                            f"from it; {_fresh_copy(path, entry, digest_file(path))}")
    remember_verified(path, st, actual)


def _expected(path: Path, entry: WeightsEntry | None, url: str | None = None) -> tuple[str | None, str | None, bool]:
    """What a cached file's SHA-256 must be: the full digest (published, else recorded at its first download), the
    prefix its name carries where none is published (from its URL: ``entry``'s, else ``url``, else the recorded
    ``<file>.url``; a published digest says more), and whether the full one is published."""
    published = entry.sha256 if entry is not None else None
    source = entry.url if entry is not None else url or recorded_source(path)
    prefix = digest_prefix(source) if source and published is None else None
    return published or recorded_digest(path), prefix, published is not None


def _contradicts(actual: str, full: str | None, prefix: str | None, what: str = "") -> str | None:
    """``<expected digest><what>`` when ``actual`` is not the ``full`` digest, ``<prefix>... (the prefix in the file
    name)`` when it does not begin with ``prefix``; None when it agrees with both."""
    if full is not None and actual != full:
        return f"{full}{what}"
    if prefix is not None and not actual.startswith(prefix):
        return f"{prefix}... (the prefix in the file name)"
    return None


def recorded_source(path: Path) -> str | None:
    """The URL a cached file was downloaded from (``<file>.url``), else None."""
    source = source_file(path)
    return (source.read_text().strip() or None) if source.is_file() else None


def _fresh_copy(path: Path, entry: WeightsEntry | None, *also: Path) -> str:
    """How to replace a bad cached file: ``for a fresh copy: rm FILE && minidet weights get NAME|URL``."""
    source = entry.name if entry is not None else recorded_source(path)
    get = f" && minidet weights get {source}" if source else ", then download it again"
    return f"for a fresh copy: rm {' '.join(map(str, (path, *also)))}{get}"


def verify_file(path: str | os.PathLike, entry: WeightsEntry | None = None) -> str:
    """``ok``, ``ok (recorded digest)``, ``ok (digest prefix in its name)`` (no full digest known), ``unverified``
    (no digest known), ``missing`` or ``MISMATCH ...``."""
    path = Path(path)
    if not path.is_file():
        return "missing"
    full, prefix, published = _expected(path, entry)
    size = entry.size if entry is not None else None
    if size is not None and path.stat().st_size != size:
        return f"MISMATCH expected {size} bytes got {path.stat().st_size}"
    if full is None and prefix is None:
        return "unverified"
    actual = file_sha256(path)
    if (wrong := _contradicts(actual, full, prefix, "" if published else " (recorded)")) is not None:
        return f"MISMATCH expected {wrong} got {actual}"
    return "ok" if published else "ok (recorded digest)" if full else "ok (digest prefix in its name)"


def verify_cached(names: Iterable[str] | None = None) -> list[tuple[str, str, str]]:
    """``(name, path, status)`` for the cache file of every registry entry (or of ``names``); status as
    ``verify_file``. An unknown name raises ``CheckpointError``."""
    names = list(REGISTRY) if names is None else list(names)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise CheckpointError(f"{unknown[0]} is not a registry name{close_hint(unknown[0])}")
    rows = []
    for name in names:
        entry = REGISTRY[name]
        path = weights_dir() / entry.filename
        rows.append((name, str(path), verify_file(path, entry)))
    return rows
