"""Verified, resumable downloads and the files kept beside a download.

A download goes to ``<file>.partial``, resumes with an HTTP ``Range`` request (after a dropped connection, also
within the same call), must look like a checkpoint minidet reads (:func:`not_a_checkpoint`), is checked against the
expected SHA-256 and size before the rename onto ``<file>``, and is serialized between processes (torchrun ranks)
by a lock file that its holder removes. Beside a file: ``<file>.sha256`` (the digest recorded at the first download
of a source that publishes none, ``sha256sum -c`` format), ``<file>.url`` (where it came from) and
``<file>.verified`` (the file state whose digest was last checked).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from ..errors import CheckpointError
from ..families.base import digest_prefix

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no inter-process lock
    fcntl = None

RETRIES = 3  # automatic resumes after a connection dropped mid-file, per download call
RETRY_DELAY = 0.5  # seconds before the first resume; doubles with each further one
TIMEOUT = 30.0  # seconds without an answer (connect or read) before the attempt fails
CHUNK = 1 << 20
MIN_CHECKPOINT_BYTES = 64 << 10  # far below any Mask R-CNN checkpoint (tens of MB): a stub, an error page


class DownloadError(CheckpointError):
    """A download failed, or the downloaded file is not the expected one (one-line message)."""


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def sidecar(dest: Path, suffix: str) -> Path:
    return dest.with_name(dest.name + suffix)


def digest_file(dest: Path) -> Path:
    return sidecar(dest, ".sha256")


def source_file(dest: Path) -> Path:
    return sidecar(dest, ".url")


def recorded_digest(dest: str | os.PathLike) -> str | None:
    """The digest recorded at the first download of a file whose source publishes none (``<file>.sha256``)."""
    record = digest_file(Path(dest))
    if not record.is_file():
        return None
    fields = record.read_text().split()
    return fields[0].lower() if fields and re.fullmatch(r"[0-9a-fA-F]{64}", fields[0]) else None


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """Hold ``<dest>.lock`` exclusively: other processes downloading the same file wait, then find it there. The
    holder removes the lock file before it lets go, so none stays behind. A lock counts only on the file that is at
    the path: a waiter whose file was removed meanwhile (by its holder, the only one that removes it) locks the
    file now at the path instead, so two processes never hold the lock at once."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    path, waited = sidecar(dest, ".lock"), False
    while True:
        lock = open(path, "a+")
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waited:
                    print(f"minidet: waiting for another process downloading {dest}", file=sys.stderr, flush=True)
                    waited = True
                fcntl.flock(lock, fcntl.LOCK_EX)
            if _same_file(lock.fileno(), path):
                break
        except BaseException:
            lock.close()
            raise
        lock.close()  # it was removed by the process that held it: lock the one at the path now
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # while still holding it
        lock.close()  # lets go of the lock


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


class _Dropped(Exception):
    """The connection broke off mid-file (resumable)."""


_DROPS = (http.client.IncompleteRead, http.client.HTTPException, ConnectionError, TimeoutError, socket.timeout,
          _Dropped)


def download(url: str, dest: str | os.PathLike, *, sha256: str | None = None, size: int | None = None,
             progress: bool | None = None, about: str | None = None) -> Path:
    """Download ``url`` to ``dest`` (a Path is returned): into ``<dest>.partial``, resumed with ``Range`` if one is
    there (and after a connection drop, up to ``RETRIES`` times), verified against ``sha256``/``size`` (or, without
    ``sha256``, against a digest recorded by an earlier download; else the digest is recorded), then renamed onto
    ``dest``. ``progress``: a tqdm bar on stderr (None: if stderr is a terminal). If ``dest`` exists (e.g. another
    process finished it while this one waited for the lock), it is returned as it is. ``about``: a line printed
    under the "downloading" line (a registry file's licence). Raises ``DownloadError``."""
    dest = Path(dest).absolute()
    if sha256 is not None:
        sha256 = sha256.lower()
        prefix = digest_prefix(url)
        if prefix is not None and not sha256.startswith(prefix):
            raise DownloadError(f"{url}: the expected SHA-256 {sha256} does not start with {prefix}, the prefix in "
                                "the file name (registry error)")
    if progress is None:
        progress = sys.stderr.isatty()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create the folder {dest.parent} for {url}: {e}") from None
    with _locked(dest):
        if dest.is_file():
            return dest
        partial = sidecar(dest, ".partial")
        print(f"minidet: downloading {url} to {dest}", file=sys.stderr, flush=True)
        if about:
            print(f"minidet: {about}", file=sys.stderr, flush=True)
        _fetch_partial(url, dest, partial, progress)
        digest = _verify_partial(url, dest, partial, sha256, size)
        with contextlib.suppress(OSError):
            source_file(dest).write_text(url + "\n")
        os.replace(partial, dest)
        remember_verified(dest, dest.stat(), digest)  # the first use does not hash it again
    return dest


def _by_hand(dest: Path) -> str:
    return f"download it by other means and put it at {dest}"


def _fetch_partial(url: str, dest: Path, partial: Path, progress: bool) -> None:
    """Bring ``partial`` to the server's full file (resuming, retrying drops)."""
    attempt = 0
    while True:
        have = partial.stat().st_size if partial.is_file() else 0
        try:
            if _fetch_once(url, dest, partial, have, progress):
                return
        except _DROPS as e:
            attempt += 1
            now = partial.stat().st_size if partial.is_file() else 0
            if attempt > RETRIES:
                reason = _reason(e)
                raise DownloadError(f"download of {url} failed {attempt} times ({reason}); {now} bytes are kept in "
                                    f"{partial}: run it again to resume, or {_by_hand(dest)}") from None
            delay = RETRY_DELAY * 2 ** (attempt - 1)
            print(f"minidet: connection to {url} dropped at {now} bytes ({_reason(e)}); resuming in {delay:g} s "
                  f"(try {attempt} of {RETRIES})", file=sys.stderr, flush=True)
            time.sleep(delay)


def _reason(e: BaseException) -> str:
    if isinstance(e, http.client.IncompleteRead):
        return f"incomplete read, {len(e.partial)} bytes"
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _fetch_once(url: str, dest: Path, partial: Path, have: int, progress: bool) -> bool:
    """One request; True when the partial file is complete (as far as the server says)."""
    from .. import __version__

    headers = {"User-Agent": f"minidet/{__version__}", "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and have:  # nothing after byte `have`: the partial file is all there is
            m = re.match(r"bytes \*/(\d+)", e.headers.get("Content-Range", "") if e.headers else "")
            if m is not None and int(m[1]) != have:  # longer than the server's file: start over
                partial.unlink(missing_ok=True)
                raise _Dropped(f"{partial} has {have} bytes, the server's file {m[1]}") from None
            return True
        raise DownloadError(f"HTTP {e.code} {e.reason} for {url}") from None
    except urllib.error.URLError as e:
        reason = e.reason if not isinstance(e.reason, BaseException) else _reason(e.reason)
        raise DownloadError(f"cannot download {url} ({reason}); {_by_hand(dest)}") from None
    except (ValueError, http.client.InvalidURL) as e:  # a malformed URL
        raise DownloadError(f"cannot download {url}: {e}") from None
    with response:
        status = response.status
        length = response.headers.get("Content-Length")
        length = int(length) if length and length.isdigit() else None
        start, total = 0, length
        if have and status == 206:
            m = re.match(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range", ""))
            if m is None or int(m[1]) != have:  # not the part asked for: start over
                partial.unlink(missing_ok=True)
                raise _Dropped(f"server answered the range request with {response.headers.get('Content-Range')}")
            start = have
            total = int(m[2]) if m[2] != "*" else (have + length if length is not None else None)
        elif status != 200:
            raise DownloadError(f"HTTP {status} {response.reason} for {url}")
        received = 0
        with open(partial, "ab" if start else "wb") as f, tqdm(
            total=total, initial=start, unit="B", unit_scale=True, unit_divisor=1024, desc=dest.name,
            file=sys.stderr, disable=not progress,
        ) as bar:
            while block := response.read(CHUNK):
                f.write(block)
                received += len(block)
                bar.update(len(block))
        if length is not None and received < length:
            raise _Dropped(f"connection closed after {start + received} of {start + length} bytes")
    return True


def _verify_partial(url: str, dest: Path, partial: Path, sha256: str | None, size: int | None) -> str:
    """Format, size and digest of the finished ``partial`` (deleted if wrong); a digest is recorded if none is
    known. Returns the digest."""
    if (other := not_a_checkpoint(partial)) is not None:
        partial.unlink(missing_ok=True)
        raise DownloadError(f"{url}: the server sent {other}, not a checkpoint (minidet reads torch.save files and "
                            f"pickles); deleted it, nothing recorded; check the URL (a login or error page can come "
                            f"with status 200), or {_by_hand(dest)}")
    actual_size = partial.stat().st_size
    if size is not None and actual_size != size:
        partial.unlink(missing_ok=True)
        raise DownloadError(f"{url}: the downloaded file {dest} has {actual_size} bytes, expected {size}; deleted "
                            f"it; run it again, or {_by_hand(dest)}")
    actual = file_sha256(partial)
    recorded = recorded_digest(dest)
    if sha256 is not None:
        expected, what = sha256, "published"
    elif recorded is not None:
        expected, what = recorded, f"recorded at its first download in {digest_file(dest)}"
    else:
        expected, what = None, ""
    bad = expected is not None and actual != expected
    prefix = digest_prefix(url)
    if not bad and prefix is not None and not actual.startswith(prefix):
        bad, expected, what = True, f"{prefix}...", "the prefix in the file name"
    if bad:
        partial.unlink(missing_ok=True)
        hint = f"; if the source really changed, delete {digest_file(dest)}" if recorded and not sha256 else ""
        raise DownloadError(f"{url}: the downloaded file {dest} has SHA-256 {actual}, expected {expected} ({what}); "
                            f"deleted it{hint}")
    if expected is None:
        record = digest_file(dest)
        try:
            record.write_text(f"{actual}  {dest.name}\n")
        except OSError as e:
            print(f"minidet: warning: could not record the SHA-256 of {dest} in {record}: {e}", file=sys.stderr)
        else:
            print(f"minidet: warning: {url} publishes no SHA-256; recorded this first download's digest {actual} "
                  f"in {record} (later checks compare against it)", file=sys.stderr, flush=True)
    return actual


# ----------------------------------------------------------------------------------------------------------------
# what a download is

_MAGIC = (  # binary formats a wrong URL gives, by their first bytes
    (b"\x1f\x8b", "a gzip file"), (b"BZh", "a bzip2 file"), (b"\xfd7zXZ\x00", "an xz file"),
    (b"\x28\xb5\x2f\xfd", "a zstd file"), (b"7z\xbc\xaf\x27\x1c", "a 7z archive"), (b"%PDF", "a PDF document"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file"), (b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"),
)


def zip_without_pickle(path: str | os.PathLike) -> str | None:
    """For a zip archive that is no ``torch.save`` file (no ``data.pkl`` record): what it holds (its first names,
    ``a.txt, b.txt, c.txt and 2 more``; ``nothing``); None for a ``torch.save`` archive; ``zipfile.BadZipFile`` or
    ``OSError`` for one that cannot be read. Here and in ``readers``' message for what ``torch.load`` refused."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return None
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more if names else "nothing"


def not_a_checkpoint(path: str | os.PathLike) -> str | None:
    """None if ``path`` starts like a checkpoint minidet reads and is not implausibly small (``MIN_CHECKPOINT_BYTES``):
    a zip archive with a ``data.pkl`` record (``torch.save``) or a pickle of protocol 2 or later (a legacy
    ``torch.save`` file, Detectron's and detectron2's ``.pkl``). Else what it is, for a message: ``an HTML page
    ("Sign in", 1234 bytes)``, ``a gzip file (812 bytes)``, ``56 bytes of text ('Not Found')``, ..."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(4096)
    if head[:4] == b"PK\x03\x04":
        try:
            held = zip_without_pickle(path)
        except (OSError, zipfile.BadZipFile):
            return f"a damaged zip archive ({size} bytes)"
        if held is not None:
            return f"a zip archive that is no torch.save file (no data.pkl; it holds {held})"
    elif not (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5):  # pickle: PROTO opcode, protocol 2..5
        return _describe(head, size)
    if size < MIN_CHECKPOINT_BYTES:
        return f"a file of only {size} bytes (a checkpoint has megabytes)"
    return None


def _describe(head: bytes, size: int) -> str:
    """What a file that is no checkpoint is, from its first bytes."""
    if not size:
        return "an empty file"
    magic = next((what for sign, what in _MAGIC if head.startswith(sign)), None)
    if magic is None and head[257:262] == b"ustar":
        magic = "a tar archive"
    if magic is None and len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8:
        magic = "a safetensors file (convert it with torch.save first)"
    if magic is not None:
        return f"{magic} ({size} bytes)"
    text = head.decode("utf-8", "replace")
    if "\x00" in text or text.count("\ufffd") > len(text) // 100:
        return f"{size} bytes of binary data in no format minidet reads"
    start = text.lstrip("\ufeff \t\r\n")
    lower = start[:200].lower()
    if lower.startswith(("<!doctype html", "<html")) or "<html" in lower:
        title = re.search(r"<title[^>]*>([^<]*)</title>", start, re.I)
        shown = f'"{" ".join(title[1].split())[:60]}", ' if title and title[1].strip() else ""
        return f"an HTML page ({shown}{size} bytes)"
    if start.startswith("<"):
        return f"an XML document ({' '.join(start.split())[:80]!r}, {size} bytes)"
    if start.startswith(("{", "[")):
        return f"a JSON document ({' '.join(start.split())[:80]!r}, {size} bytes)"
    return f"{size} bytes of text ({' '.join(start.split())[:60]!r})"


def verified_digest(path: Path, st: os.stat_result) -> str | None:
    """The digest ``<file>.verified`` remembers for the file as it is now (same size and mtime), else None."""
    try:
        state = json.loads(sidecar(path, ".verified").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or (state.get("size"), state.get("mtime_ns")) != (st.st_size, st.st_mtime_ns):
        return None
    return state.get("sha256")


def remember_verified(path: Path, st: os.stat_result, digest: str) -> None:
    """Write ``<file>.verified`` (atomically) if the file is still as ``st`` saw it; a read-only cache is hashed
    at every use instead."""
    record = sidecar(path, ".verified")
    temp = record.with_name(f"{record.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        now = path.stat()
        if (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            return
        temp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}) + "\n")
        os.replace(temp, record)
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
