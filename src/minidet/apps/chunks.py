"""A resumable store of per-image results: every few images a run writes ``<folder>/run<R>-rank<K>-<N>.json``
atomically (the images it finished, those it skipped and why, detections, timings); the next run (``R + 1``)
does only the images not done. ``manifest.json`` records what the chunks were made from (files by
:func:`file_identity`), so that a resumed run cannot mix results of another model, config or dataset."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .fileio import remove_temp_files, write_json

MANIFEST = "manifest.json"
_CHUNK_RE = re.compile(r"^run(\d+)-rank(\d+)-(\d+)\.json$")


class ChunkError(RuntimeError):
    """The chunk folder does not fit the run (another run's results, an unreadable chunk)."""


def file_identity(path: str) -> dict | None:
    """``{"path", "size", "mtime", "sha256"}`` of a file; None if ``path`` is not a file (``MODEL.WEIGHTS none``).
    Two identities are the same file when their digests are equal (a touched file has a new mtime only)."""
    if not path or not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        while block := f.read(1 << 20):
            digest.update(block)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime": st.st_mtime, "sha256": digest.hexdigest()}


def _digest(v) -> str | None:  # the digest of a manifest value that is a file_identity, else None
    return v.get("sha256") if isinstance(v, dict) else None


class ChunkStore:
    """The chunk files of one output folder (see the module docstring)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def names(self) -> list[str]:
        """Chunk file names in run, rank, index order."""
        if not os.path.isdir(self.folder):
            return []
        found = [(tuple(map(int, m.groups())), n) for n in os.listdir(self.folder) if (m := _CHUNK_RE.match(n))]
        return [n for _, n in sorted(found)]

    def open(self, manifest: dict, resume: bool) -> int:
        """Prepare the folder for a run made from ``manifest``; returns the new run's number. The folder must hold
        no chunks, or with ``resume`` chunks made from an equal manifest; else :class:`ChunkError`."""
        names = self.names()
        path = os.path.join(self.folder, MANIFEST)
        if names and not resume:
            raise ChunkError(f"{self.folder} holds {len(names)} result chunks of an earlier run; rerun with --resume "
                             "to finish that run, or remove the folder to start again")
        if names:
            try:
                with open(path, encoding="utf-8") as f:
                    old = json.load(f)
            except (OSError, ValueError) as e:
                raise ChunkError(f"{path}: cannot read the earlier run's manifest ({e})") from None
            if changed := _changed_file(old, manifest):
                raise ChunkError(f"cannot resume: {changed}")
            if diff := _first_difference(old, manifest):
                raise ChunkError(f"cannot resume: the earlier run in {self.folder} differs: {diff}")
        os.makedirs(self.folder, exist_ok=True)
        remove_temp_files(self.folder)  # half-written chunks of a killed run: never read, now gone
        write_json(path, manifest, indent=1)
        return 1 + max((int(_CHUNK_RE.match(n).group(1)) for n in names), default=0)

    def write(self, run: int, rank: int, index: int, chunk: dict) -> str:
        """Write one chunk atomically; returns its file name."""
        name = f"run{run:03d}-rank{rank:04d}-{index:05d}.json"
        write_json(os.path.join(self.folder, name), {"run": run, "rank": rank, **chunk})
        return name

    def read(self, name: str) -> dict:
        path = os.path.join(self.folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise ChunkError(f"{path}: cannot read result chunk ({e}); remove it and rerun with --resume") from None

    def read_all(self) -> Iterator[dict]:
        yield from map(self.read, self.names())

    def done_ids(self) -> set[int]:
        """Ids of the images some chunk finished (skipped images are not done: a rerun retries them)."""
        return {i for c in self.read_all() for i in c["image_ids"]}


def _changed_file(old: dict, new: dict) -> str:
    """The first manifest entry that is a :func:`file_identity` whose content changed (or went)."""
    for key in sorted(set(old) | set(new)):
        a, b = _digest(old.get(key)), _digest(new.get(key))
        if a == b:
            continue
        path = (new if b else old)[key]["path"]
        then, now = (f"{d[:16]}..." if d else "(no file)" for d in (a, b))
        return f"the {key} {path} changed since the earlier run (sha256 {then} then, {now} now)"
    return ""


def _first_difference(old: dict, new: dict) -> str:
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b or (_digest(a) and _digest(a) == _digest(b)):  # the same file content, maybe touched
            continue
        if isinstance(a, str) and isinstance(b, str) and "\n" in a + b:
            for la, lb in itertools.zip_longest(a.splitlines(), b.splitlines(), fillvalue=""):
                if la != lb:
                    return f"{key}: {la.strip()!r} then, {lb.strip()!r} now"
        return f"{key}: {a!r} then, {b!r} now"
    return ""


@dataclass
class Merged:
    """All chunks together: each image is evaluated (with its detections) or skipped."""

    image_ids: list[int] = field(default_factory=list)
    results: list[dict] = field(default_factory=list)
    skipped: dict[int, dict] = field(default_factory=dict)
    dropped: int = 0
    timings: list[dict] = field(default_factory=list)
    images_per_run: dict[int, int] = field(default_factory=dict)


def merge_chunks(chunks: Iterable[dict]) -> Merged:
    """Merge chunks in run order. An image skipped by one run and done by a later one is done."""
    m = Merged()
    done: set[int] = set()
    for c in chunks:
        new = [i for i in c["image_ids"] if i not in done]
        keep = set(new)
        done.update(new)
        m.image_ids.extend(new)
        m.results.extend(r for r in c["detections"] if r["image_id"] in keep)
        m.skipped.update((s["image_id"], s) for s in c["skipped"])
        m.dropped += c.get("dropped", 0)
        m.timings.extend(c.get("timings", []))
        m.images_per_run[c["run"]] = m.images_per_run.get(c["run"], 0) + len(new) + len(c["skipped"])
    for i in done:
        m.skipped.pop(i, None)
    return m
