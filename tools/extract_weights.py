"""Extract the model weights of a training checkpoint that ``torch.load(weights_only=True)`` refuses.

Usage::

    python tools/extract_weights.py CKPT OUT.pth

A trainer's checkpoint (maskrcnn-benchmark, MLPerf, ...) can hold Python objects beside the weights (a
pickled config object, a logger's state) that torch's weights-only loader refuses, and loading it the
plain way would run whatever those objects' pickles call. This tool reads the file with torch's own
weights-only allowlist (tensors, storages, dicts, lists, numbers, strings) and replaces every other
object by an inert placeholder: no constructor, ``__setstate__`` or function named in the file is called.
It then writes ``{"model": state_dict}`` (the tensors of the ``model`` entry, or of the file itself when
it is a plain dict of tensors), which minidet reads with ``torch.load(weights_only=True)``; an mmdetection
checkpoint's ``state_dict`` entry comes out as ``{"state_dict": ..., "meta": ...}``, its ``meta`` (class names,
config text) kept when no placeholder is in it.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import types

import torch
from torch import _weights_only_unpickler  # torch's allowlist of what a weights-only load may build

ALLOWED = _weights_only_unpickler._get_allowed_globals()


class Inert(dict):
    """What a refused object becomes: it accepts any construction, state and items, and does nothing."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def __setstate__(self, state) -> None:
        pass

    def append(self, item) -> None:
        pass

    def extend(self, items) -> None:
        pass


class _Unpickler(pickle.Unpickler):
    refused: set[str] = set()

    def find_class(self, module: str, name: str):
        if f"{module}.{name}" in ALLOWED:
            return super().find_class(module, name)
        _Unpickler.refused.add(f"{module}.{name}")
        return Inert


restricted_pickle = types.ModuleType("restricted_pickle")
restricted_pickle.Unpickler = _Unpickler
restricted_pickle.load = lambda f, **kw: _Unpickler(f, **kw).load()


def _has_placeholder(obj) -> bool:
    """Whether an ``Inert`` placeholder is anywhere in ``obj`` (dicts, lists and tuples looked into)."""
    if isinstance(obj, Inert):
        return True
    if isinstance(obj, dict):
        return any(_has_placeholder(k) or _has_placeholder(v) for k, v in obj.items())
    return isinstance(obj, (list, tuple)) and any(_has_placeholder(v) for v in obj)


def extract(path: str) -> tuple[dict, list[str]]:
    """What to save of ``path``: ``{"model": tensors}`` of its ``model`` entry (or of the file, if it is a dict
    of tensors), or ``{"state_dict": tensors, "meta": ...}`` of an mmdetection checkpoint (``meta`` only when it
    holds no placeholder); and the names of the objects replaced by placeholders."""
    _Unpickler.refused = set()
    obj = torch.load(path, map_location="cpu", weights_only=False, pickle_module=restricted_pickle)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a dict, got {type(obj).__name__}")
    key = next((k for k in ("model", "state_dict") if k in obj), None)
    model = obj[key] if key else obj
    if not isinstance(model, dict):
        raise ValueError(f"entry {key!r} is a {type(model).__name__}, not a dict of tensors")
    weights = {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}
    if not weights:
        raise ValueError(f"no tensors in {f'its {key} entry' if key else 'the file'}")
    out: dict = {key or "model": weights}
    if key == "state_dict" and isinstance(obj.get("meta"), dict) and not _has_placeholder(obj["meta"]):
        out["meta"] = obj["meta"]
    return out, sorted(_Unpickler.refused)


def _why(e: Exception) -> str:
    """What went wrong, without the path (the error line names it once): an OSError's reason, else the first
    line of the message."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e).splitlines()[0] if str(e).strip() else type(e).__name__


def _error(path: str, what: str) -> int:
    print(f"error: {path}: {what}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("output")
    args = ap.parse_args(argv)
    if os.path.abspath(args.output) == os.path.abspath(args.checkpoint):
        return _error(args.output, "would replace the input; choose another name")
    try:
        data, refused = extract(args.checkpoint)
    except Exception as e:  # noqa: BLE001 - one line for any unreadable file
        return _error(args.checkpoint, _why(e))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(args.output)), suffix=".tmp")
        os.close(fd)
        torch.save(data, tmp)
        os.replace(tmp, args.output)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        return _error(args.output, f"cannot write ({_why(e)})")
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    skipped = f"; replaced by placeholders: {', '.join(refused)}" if refused else ""
    count = len(data.get("model", data.get("state_dict", {})))
    print(f"extract_weights: {count} tensors -> {args.output}{skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
