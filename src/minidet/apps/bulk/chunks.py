"""A resumable store of per-image results: every few images a run writes ``<folder>/run<R>-rank<K>-<N>.json``
atomically and durably (the images it finished, those it skipped and why, detections, timings); the next run
(``R + 1``) does only the images not done. ``manifest.json``, written when a run starts (before its first output),
is the run's identity: config, weights file (by content, :func:`file_identity`), inputs and output options, so that
a resumed run cannot mix results of another model, config or dataset, chunks or not."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from minidet.apps.outputs.fileio import remove_temp_files, write_json
from minidet.errors import InputError

MANIFEST = "manifest.json"
FORMAT = 2  # of the manifest (1: the config as yacs text, the weights under "checkpoint")
_CHUNK_RE = re.compile(r"^run(\d+)-rank(\d+)-(\d+)\.json$")


class ChunkError(InputError):
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


def config_entries(cfg: Mapping, prefix: str = "") -> dict[str, Any]:
    """Every key of a (nested) config as ``{"MODEL.ROI_HEADS.SCORE_THRESH": 0.05, ...}`` (sequences as lists), the
    form a manifest keeps it in, so that a difference names its key. ``MODEL.WEIGHTS`` is left out: the weights are
    compared by content (:func:`file_identity`), so a copy of the file elsewhere is the same model."""
    flat: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(config_entries(value, f"{name}."))
        elif name != "MODEL.WEIGHTS":
            flat[name] = list(value) if isinstance(value, tuple) else value
    return flat


def _is_file(v: Any) -> bool:  # a file_identity entry
    return isinstance(v, dict) and "sha256" in v


def _text(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def _file_difference(key: str, old: dict | None, new: dict | None) -> str | None:
    if (old or {}).get("sha256") == (new or {}).get("sha256"):
        return None  # the same content, maybe touched or copied
    then, now = (v["sha256"][:16] + "..." if v else "" for v in (old, new))
    if old and new and old["path"] == new["path"]:
        return f"the {key} {new['path']} changed since the earlier run (sha256 {then} then, {now} now)"
    then, now = (f"{v['path']} (sha256 {d})" if v else "none" for v, d in ((old, then), (new, now)))
    return f"it used {key} {then}, this run uses {now}"


def _list_difference(key: str, old: list, new: list) -> str | None:
    if old == new:
        return None
    seen_old, seen_new = set(map(_text, old)), set(map(_text, new))
    added = [_text(v) for v in new if _text(v) not in seen_old]
    gone = [_text(v) for v in old if _text(v) not in seen_new]
    what = [f"{len(vs)} {word}, e.g. {vs[0]}" for word, vs in (("new", added), ("gone", gone)) if vs]
    return f"{key}: {len(old)} then, {len(new)} now ({'; '.join(what) or 'another order'})"


def identity_differences(old: Mapping, new: Mapping) -> list[str]:
    """What differs between the manifests of an earlier run and this one, one phrase each: a file entry by its
    path and digest, a mapping (config, options) by its keys, a list (inputs) by what is new and what is gone."""
    if old.get("format") != new.get("format"):
        return [f"its {MANIFEST} was written by another minidet version"]
    found: list[str | None] = []
    for key in new:  # the same keys in both (one format)
        a, b = old.get(key), new[key]
        if _is_file(a) or _is_file(b):
            found.append(_file_difference(key, a, b))
        elif isinstance(a, dict) and isinstance(b, dict):
            found += [f"{key} {k}: {_text(a.get(k))} then, {_text(b.get(k))} now"
                      for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif isinstance(a, list) and isinstance(b, list):
            found.append(_list_difference(key, a, b))
        elif a != b:
            found.append(f"{key}: {_text(a)} then, {_text(b)} now")
    return [d for d in found if d]


def _run_of(name: str) -> int:
    return int(_CHUNK_RE.match(name).group(1))


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

    def check(self, manifest: dict, resume: bool, restart: bool = False) -> int:
        """Whether a run made from ``manifest`` may write here (nothing is written yet); returns its number. With
        ``resume`` the earlier run's manifest, if there is one, must equal it (chunks or not: the earlier run may
        have been killed before its first); without, the folder must hold no chunks, unless ``restart`` (they are
        then replaced, see :meth:`begin`). Else :class:`ChunkError` saying what differs."""
        names = self.names()
        path = os.path.join(self.folder, MANIFEST)
        if names and not (resume or restart):
            raise ChunkError(f"{self.folder} holds {len(names)} result chunks of an earlier run; rerun with --resume "
                             "to finish that run, or remove the folder to start again")
        if resume and (names or os.path.lexists(path)):
            try:
                with open(path, encoding="utf-8") as f:
                    old = json.load(f)
            except (OSError, ValueError) as e:
                raise ChunkError(f"{path}: cannot read the earlier run's manifest ({e})") from None
            if found := identity_differences(old, json.loads(json.dumps({"format": FORMAT, **manifest}))):
                more = f"; and {len(found) - 3} more" if len(found) > 3 else ""
                raise ChunkError(f"cannot resume: the earlier run in {self.folder} differs: {'; '.join(found[:3])}"
                                 f"{more}")
        return 1 + max(map(_run_of, names), default=0)

    def begin(self, manifest: dict, run: int, resume: bool) -> None:
        """Record run ``run`` (from :meth:`check`): the temporary files of a killed writer go, without ``resume``
        the chunks of earlier runs too, then ``manifest`` is written durably. Call it before the run writes any
        output, and on one process."""
        os.makedirs(self.folder, exist_ok=True)
        remove_temp_files(self.folder)  # half-written chunks of a killed run: never read, now gone
        if not resume:  # before the new manifest: never an earlier run's chunks under this run's identity
            for name in self.names():
                if _run_of(name) < run:
                    os.unlink(os.path.join(self.folder, name))
        write_json(os.path.join(self.folder, MANIFEST), {"format": FORMAT, **manifest}, indent=1, durable=True)

    def write(self, run: int, rank: int, index: int, chunk: dict) -> str:
        """Write one chunk atomically and durably; returns its file name."""
        name = f"run{run:03d}-rank{rank:04d}-{index:05d}.json"
        write_json(os.path.join(self.folder, name), {"run": run, "rank": rank, **chunk}, durable=True)
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
