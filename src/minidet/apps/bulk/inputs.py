"""Input listing for the applications: files, folders, glob patterns and list files as the images (and videos) to
run, in a stable order, with what was left out and why."""

from __future__ import annotations

import errno
import fnmatch
import glob
import os
from collections import Counter

from minidet.apps.outputs.video import VIDEO_EXTENSIONS
from minidet.imageio import IMAGE_EXTENSIONS


def _has_extension(name: str, extensions: tuple[str, ...]) -> bool:
    return os.path.splitext(name)[1].lower() in extensions


# why a folder or glob entry is not listed ({s}: "s" for several); other entries are skipped for their extension
_SKIP_LABELS = {"dangling": "dangling link{s}", "loop": "symlink loop{s}", "folder": "folder{s} named like an image",
                "special": "special file{s} named like an image", "": "file{s} without extension",
                "unreadable": "unreadable folder{s}", "folder link": "link{s} to a folder (not followed)"}


def _is_loop(link: str) -> bool:
    """Whether the folder ``link`` points to holds the link itself (following it would never end)."""
    target, here = os.path.realpath(link), os.path.realpath(os.path.dirname(link) or ".")
    return here == target or here.startswith(target.rstrip(os.sep) + os.sep)


def _skip_reason(path: str, extensions: tuple[str, ...] = IMAGE_EXTENSIONS, tree: bool = False) -> str | None:
    """Why ``path`` (a folder entry or glob match) is not listed; None for an input, hidden file, plain subfolder.
    With ``tree`` (a walk through sub-folders, which does not follow links to folders) a link to a folder is
    counted too: a symlink loop or a folder link."""
    name = os.path.basename(path)
    ext = os.path.splitext(name)[1].lower()
    if ext not in extensions and name.startswith("."):
        return None
    if os.path.islink(path) and not os.path.exists(path):
        try:
            os.stat(path)
        except OSError as e:
            return "loop" if e.errno == errno.ELOOP else "dangling"
    if tree and os.path.islink(path) and os.path.isdir(path):
        return "loop" if _is_loop(path) else "folder link"
    if os.path.isdir(path):
        return "folder" if ext in extensions else None
    if ext not in extensions:
        return ext
    return None if os.path.isfile(path) else "special"


def describe_skipped(reasons: list[str], videos: bool = False) -> str:
    """``"2 dangling links, 1 .gif (not an image extension: .jpg, ...)"`` for the reasons of :func:`find_inputs`."""
    counts = Counter(sorted(reasons, key=lambda r: (r[:1] in ("", "."), r)))  # the kinds first, then extensions
    parts = [f"{n} {_SKIP_LABELS[r].format(s='s' if n > 1 else '') if r in _SKIP_LABELS else r}"
             for r, n in counts.items()]
    if any(r[:1] in ("", ".") for r in counts):
        kind, exts = ("image or video", IMAGE_EXTENSIONS + VIDEO_EXTENSIONS) if videos else ("image", IMAGE_EXTENSIONS)
        parts[-1] += f" (not an {kind} extension: {', '.join(exts)})"
    return ", ".join(parts)


def _entries(folder: str, recursive: bool) -> tuple[list[str], list[str]]:
    """A folder's entries, sorted (with ``recursive``: those of every non-hidden subfolder too, links to folders not
    followed), and the subfolders that could not be read."""
    if not recursive:
        return [os.path.join(folder, n) for n in sorted(os.listdir(folder))], []
    found: list[str] = []
    unreadable: list[str] = []
    for top, subfolders, files in os.walk(folder, onerror=lambda e: unreadable.append(e.filename)):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        found.extend(os.path.join(top, n) for n in sorted(files + subfolders))
    return found, [u for u in unreadable if u != folder]


def _fixed_part(pattern: str) -> str:
    """The folder of a glob pattern before its first wildcard (the root its matches are named from)."""
    while any(c in pattern for c in "*?["):
        pattern = os.path.dirname(pattern)
    return pattern or "."


def _matches(parts: list[str], pattern: list[str]) -> bool:
    """Whether path components ``parts`` match glob components ``pattern`` (``**``: any number of folders; a
    hidden name only where its component starts with a dot), as :func:`glob.glob` matches them."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        shown = next((k for k, p in enumerate(parts) if p.startswith(".")), len(parts))  # ** skips hidden names
        return any(_matches(parts[k:], rest) for k in range(shown + 1))
    return (bool(parts) and (head.startswith(".") or not parts[0].startswith("."))
            and fnmatch.fnmatch(parts[0], head) and _matches(parts[1:], rest))


def _glob(pattern: str) -> tuple[list[str], bool]:
    """The matches of a glob pattern, sorted, and whether its folders were walked (a ``**`` pattern: like
    ``--recursive``, links to folders are not followed, so that a symlink loop cannot repeat the tree without end;
    those links come with the matches, for the skipped line)."""
    if "**" not in pattern.split(os.sep):
        return sorted(glob.glob(pattern)), False
    root = _fixed_part(pattern)
    if not os.path.isdir(root):
        return [], True
    prefix = root if pattern.startswith(root) else ""  # "**/x.jpg": matches named without "./"
    want = os.path.relpath(pattern, root).split(os.sep)
    found = []
    for path in _entries(root, recursive=True)[0]:
        rel = os.path.relpath(path, root)
        if _matches(rel.split(os.sep), want) or (os.path.islink(path) and os.path.isdir(path)):
            found.append(os.path.join(prefix, rel))
    return sorted(found), True


def _listed(path: str) -> list[str]:
    """The paths of an input list file: one a line, blank lines and ``#`` comments skipped, relative to its folder."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise FileNotFoundError(f"{path}: cannot read the input list ({getattr(e, 'strerror', None) or e})") from None
    paths = [p if os.path.isabs(p) else os.path.join(os.path.dirname(path), p)
             for p in lines if p and not p.startswith("#")]
    if not paths:
        raise FileNotFoundError(f"{path}: the input list names no file")
    return paths


def find_inputs(inputs: list[str], recursive: bool = False, list_file: str | None = None, videos: bool = False
                ) -> tuple[list[tuple[str, str]], dict[str, list[tuple[str, str]]]]:
    """Files, folders (their images, with ``videos`` their videos too, any case; with ``recursive`` those of their
    subfolders too), glob patterns (``**``: any depth) and the paths in ``list_file`` (see :func:`_listed`) as
    ``(path, name)`` in the inputs' order, each folder's and pattern's sorted, repeats dropped. ``name`` is the path
    relative to the input's root: the folder, the pattern's fixed part, or the folder that the files named (here or
    in the list) all share. A path named is kept whatever it is (a folder ``x.jpg``, a missing listed file) for the
    reader to report. Also returns what folders and patterns left out, ``{input: [(path, reason), ...]}``, a reason
    being a key of ``_SKIP_LABELS`` or an extension (hidden files and plain subfolders are not listed).
    FileNotFoundError names the first input that yields nothing."""
    extensions = IMAGE_EXTENSIONS + (VIDEO_EXTENSIONS if videos else ())
    found: list[list[str | None]] = []  # [path, name]; a named file's name is set at the end
    skipped: dict[str, list[tuple[str, str]]] = {}
    for item in map(os.fspath, inputs):
        if os.path.lexists(item) and not (os.path.isdir(item) and not _has_extension(item, extensions)):
            found.append([item, None])  # named explicitly: kept whatever it is
            continue
        unreadable: list[str] = []
        if os.path.isdir(item):
            root, tree = item, recursive
            entries, unreadable = _entries(item, recursive)
        elif any(c in item for c in "*?["):  # a glob pattern
            root, (entries, tree) = _fixed_part(item), _glob(item)
        else:
            raise FileNotFoundError(f"no such file or folder: {item}")
        media = [p for p in entries if _has_extension(p, extensions) and os.path.isfile(p)]
        if not media:
            what = "image or video files" if videos else "image files"
            raise FileNotFoundError(f"no {what} ({', '.join(extensions)}) in folder: {item}"
                                    if os.path.isdir(item) else f"no {what} match: {item}")
        found.extend([p, os.path.relpath(p, root)] for p in media)
        gone = [(p, r) for p in entries if (r := _skip_reason(p, extensions, tree)) is not None]
        if gone := gone + [(u, "unreadable") for u in unreadable]:
            skipped[item] = gone
    if list_file is not None:
        found.extend([p, None] for p in _listed(list_file))
    named = [entry for entry in found if entry[1] is None]
    if named:
        root = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p, _ in named])
        for entry in named:
            entry[1] = os.path.relpath(os.path.abspath(entry[0]), root)
    unique: dict[str, tuple[str, str]] = {}  # the first of the paths naming one file
    for p, name in found:
        unique.setdefault(os.path.abspath(p), (p, name))
    return list(unique.values()), skipped

