"""Safe checkpoint readers: ``torch.load(weights_only=True)`` and a numpy-only unpickler.

Nothing in a checkpoint file is executed (see SECURITY.md); every failure is a one-line ``CheckpointError``.
"""

from __future__ import annotations

import codecs
import collections
import os
import pickle
import re
import struct
import warnings
import zipfile

import numpy as np
import torch

from .errors import CheckpointError

WEIGHTS_HELP = "`minidet weights list` names the official weights; weights/README.md has their URLs and sha256"


class StateDict(dict):
    """A checkpoint's entries by name; ``meta``: what its wrapper holds beside them (``{"state_dict": ..., "meta":
    {...}}`` gives ``{"meta": {...}}``; empty for a bare state dict)."""

    meta: dict = {}


def _zip_without_pickle(path: str) -> str | None:
    """For a zip archive that is no ``torch.save`` file (no ``data.pkl`` record): what it holds; None for any other
    file (the hub's check, imported on this failure's path only: reading a checkpoint needs no download code)."""
    from .hub.downloads import zip_without_pickle

    try:
        return zip_without_pickle(path)
    except (OSError, zipfile.BadZipFile):
        return None


_AGAIN = "download or copy it again"
# torch.save's legacy (non-zip) format begins with this number, pickled (protocol 2, torch's default: LONG1 of 10 bytes)
_LEGACY_HEAD = b"\x80\x02\x8a\x0a" + torch.serialization.MAGIC_NUMBER.to_bytes(10, "little")


def _legacy(head: bytes) -> bool:
    """Whether a file beginning with ``head`` is in torch's legacy format (or a cut piece of its first bytes)."""
    return head.startswith(_LEGACY_HEAD) or (4 <= len(head) < len(_LEGACY_HEAD) and _LEGACY_HEAD.startswith(head))


def _torch_load_error(path: str, e: Exception, legacy: bool = False, at_end: bool = False) -> CheckpointError:
    """One line from a ``torch.load`` failure: the refused global, a file cut short, the unpickler's complaint, or
    the first sentence of anything else (torch's texts run over several lines and paragraphs). ``legacy``: the file
    begins as torch's legacy format does; ``at_end``: the reader had reached its end when it failed, out of data
    (an end of file inside a pickle or a tensor: the file is truncated)."""
    text = re.sub(r"^\[enforce fail at [^\]]*\]\s*\.?\s*", "", str(e))  # c10's source location
    head = f"{path}: cannot read as a torch checkpoint"
    if refused := re.search(r"GLOBAL ([\w.]+)", text):
        what = f"the pickle asks for {refused[1]}, outside torch's weights_only allow-list (nothing was run)"
        fix = f"; to take out only the weights, without running it: python tools/extract_weights.py {path} OUT.pth"
        return CheckpointError(f"{head}: refused: {what}{fix}", refused[1])
    if legacy and at_end and (isinstance(e, (EOFError, IndexError, struct.error)) or "unexpected EOF" in text):
        where = "a tensor's data" if "unexpected EOF" in text else "its pickled entries"
        return CheckpointError(f"{head}: the file is truncated: it ends after {os.path.getsize(path)} bytes, inside "
                               f"{where} (torch's legacy non-zip format); {_AGAIN}")
    if "failed finding central directory" in text:  # a zip archive ends with its directory
        first = " ".join(text.split()).split(". ")[0].rstrip(".")
        return CheckpointError(f"{head}: {first}: the file is truncated or damaged (a zip archive without the "
                               f"directory at its end); {_AGAIN}")
    if (held := _zip_without_pickle(path)) is not None:
        return CheckpointError(f"{head}: a zip archive but not a torch.save file (no data.pkl; it holds {held})")
    if detail := re.search(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|$)", text, re.S):
        return CheckpointError(f"{head}: not a torch.save file, or a corrupt one ({' '.join(detail[1].split())})")
    return CheckpointError(f"{head}: {' '.join(text.split()).split('. ')[0].rstrip('.') or type(e).__name__}")


def _check_file(path: str) -> bytes:
    """The first 16 bytes of ``path``; refuses a missing file, and a safetensors file by its content (8-byte
    little-endian header length, then JSON): torch reads it only through ``safetensors``, not a minidet dependency."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {os.path.abspath(path)} ({WEIGHTS_HELP})")
    with open(path, "rb") as f:
        head = f.read(16)
    if len(head) >= 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= os.path.getsize(path) - 8:
        raise CheckpointError(
            f"{path}: the .safetensors format is not supported; convert it where the safetensors package is "
            f"installed: torch.save(safetensors.torch.load_file({path!r}), {os.path.splitext(path)[0] + '.pth'!r})",
            content=True,
        )
    return head


def _state_dict(obj, path: str, wrappers: tuple[str, ...]) -> StateDict:
    """The dict of weights in a loaded file: unwrap ``{wrapper: {...}}``, keeping the wrapper's other entries."""
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors, got {type(obj).__name__}", content=True)
    key = next((k for k in wrappers if isinstance(obj.get(k), dict)), None)
    if key is None and {"optimizer", "iteration"} & obj.keys():
        raise CheckpointError(
            f"{path}: a training checkpoint without its 'model' entry (it holds {', '.join(map(str, obj))})",
            content=True,
        )
    out = StateDict(obj if key is None else obj[key])
    out.meta = {} if key is None else {k: v for k, v in obj.items() if k != key}
    if not out:
        raise CheckpointError(f"{path}: holds no weights (an empty dict)", content=True)
    return out


def read_torch_file(path: str) -> StateDict:
    """Read a ``torch.save`` state dict safely; unwrap ``{"model"|"state_dict": ...}``. A file of torch's legacy
    format that ends before its data does is said to be truncated."""
    head = _check_file(path)
    legacy = _legacy(head)
    at_end = False
    try:  # from an open file: torch.load would take a path named .safetensors for one, whatever it holds
        with warnings.catch_warnings(), open(path, "rb") as f:  # warnings: noise around a one-line error
            warnings.simplefilter("ignore")
            try:
                obj = torch.load(f, map_location="cpu", weights_only=True)
            finally:
                at_end = f.tell() >= os.fstat(f.fileno()).st_size  # where the reader stopped
    except Exception as e:  # noqa: BLE001 - any failure here means "not a safe torch file"
        raise _torch_load_error(path, e, legacy, at_end) from None
    obj = _state_dict(obj, path, ("model", "state_dict"))
    if bad := [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]:
        raise CheckpointError(f"{path}: entry {bad[0]!r} is not a tensor ({type(obj[bad[0]]).__name__})", content=True)
    return obj


_multiarray = (getattr(np, "_core", None) or np.core).multiarray
# the only globals a pickle of numpy arrays needs, and what they resolve to; anything else is refused
# unexecuted. An OrderedDict is built from the pickle's own (already safe) items and runs no code of the file.
_PICKLE_ALLOWED = {
    **{(f"numpy.{core}.multiarray", "_reconstruct"): _multiarray._reconstruct for core in ("core", "_core")},
    **{(f"numpy.{core}.multiarray", "scalar"): _multiarray.scalar for core in ("core", "_core")},
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
    ("collections", "OrderedDict"): collections.OrderedDict,
}


class _Refused(pickle.UnpicklingError):
    """The pickle names a global outside the allow-list; ``str(e)`` is ``module.name``."""


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _PICKLE_ALLOWED:
            raise _Refused(f"{module}.{name}")
        return _PICKLE_ALLOWED[module, name]


def read_pickle_file(path: str) -> StateDict:
    """Read a pickle of numpy arrays (Detectron's py2 ``.pkl``; ``latin1`` maps its byte strings 1:1)
    without running code. Returns ``obj['blobs']`` (Detectron), ``obj['model']`` (detectron2) or the flat dict."""
    _check_file(path)
    try:
        with open(path, "rb") as f:
            obj = _NumpyOnlyUnpickler(f, encoding="latin1").load()
    except _Refused as e:
        what = f"the pickle asks for {e}, outside the numpy allow-list (nothing was run)"
        raise CheckpointError(f"{path}: refused: {what}", str(e)) from None
    except Exception as e:  # noqa: BLE001 - truncated/garbage files raise many types
        detail = " ".join(str(e).split()) or type(e).__name__
        raise CheckpointError(f"{path}: cannot read as a Detectron pickle: {detail}") from None
    return _state_dict(obj, path, ("model", "blobs"))


def read_checkpoint(path: str) -> StateDict:
    """Read a checkpoint with the safe reader its content calls for: a zip archive, or a file that begins as torch's
    legacy (non-zip) format does, is a ``torch.save`` file whatever its name; another file goes to the numpy-only
    unpickler first if named ``.pkl``, else to ``torch.load`` first, then to the other reader; if both fail, the
    more telling error is raised (``_rank``)."""
    head = _check_file(path)
    if head[:4] == b"PK\x03\x04" or _legacy(head):  # a zip archive, or torch's legacy format
        return read_torch_file(path)
    pkl = str(path).endswith(".pkl")
    first, second = (read_pickle_file, read_torch_file) if pkl else (read_torch_file, read_pickle_file)
    try:
        return first(path)
    except CheckpointError as e:
        error = e
    try:
        return second(path)
    except CheckpointError as e:
        raise max(error, e, key=_rank) from None  # max: the first one on a tie


def _rank(e: CheckpointError) -> int:
    """How much a reader's error says about the file: a refused global that no reader allows (3),
    a file read whose content is wrong (2), a file the reader cannot parse (1), a refused global
    that the other reader allows (0)."""
    if e.refused is not None:
        module, _, name = e.refused.rpartition(".")
        return 0 if (module, name) in _PICKLE_ALLOWED else 3
    return 2 if e.content else 1
