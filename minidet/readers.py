"""Safe checkpoint readers: ``torch.load(weights_only=True)`` and a numpy-only unpickler.

Nothing in a checkpoint file is executed (see SECURITY.md). ``read_checkpoint`` picks the reader by the
file's content; every failure is a one-line ``CheckpointError``. Renaming and matching: ``checkpoint.py``.
"""

from __future__ import annotations

import collections
import os
import pickle
import re
import warnings
import zipfile

import numpy as np
import torch

WEIGHTS_HELP = "official weights are listed in weights/README.md (URLs and sha256)"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit the model; one-line message.

    ``refused`` names the global (``module.name``) a refused pickle asked for, else None;
    ``content`` is True when a reader parsed the file and what it holds is wrong.
    """

    def __init__(self, message: str, refused: str | None = None, content: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        self.content = content


class StateDict(dict):
    """A checkpoint's entries by name; ``author`` is the ``__author__`` of a detectron2 wrapper, else None."""

    author: str | None = None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or e.__class__.__name__


def _zip_without_pickle(path: str) -> str | None:
    """For a zip archive that is no ``torch.save`` file (no ``data.pkl`` record): what it holds."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return None
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more if names else "nothing"


def _torch_load_error(path: str, e: Exception) -> CheckpointError:
    """One line from a ``torch.load`` failure: the refused global, the unpickler's complaint, or
    the first sentence of anything else (torch's texts run over several lines and paragraphs)."""
    text = re.sub(r"^\[enforce fail at [^\]]*\]\s*\.?\s*", "", str(e))  # c10's source location
    head = f"{path}: cannot read as a torch checkpoint"
    refused = re.search(r"GLOBAL ([\w.]+)", text)
    if refused:
        what = f"the pickle asks for {refused[1]}, outside torch's weights_only allow-list (nothing was run)"
        return CheckpointError(f"{head}: refused: {what}", refused[1])
    held = _zip_without_pickle(path)
    if held is not None:
        return CheckpointError(f"{head}: a zip archive but not a torch.save file (no data.pkl; it holds {held})")
    detail = re.search(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|$)", text, re.S)
    if detail:
        return CheckpointError(f"{head}: not a torch.save file, or a corrupt one ({' '.join(detail[1].split())})")
    return CheckpointError(f"{head}: {' '.join(text.split()).split('. ')[0].rstrip('.') or type(e).__name__}")


def _refuse_safetensors(path: str) -> None:
    """Refuse a safetensors file by its content (8-byte little-endian header length, then JSON):
    torch reads it only through the ``safetensors`` package, which minidet does not depend on."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= os.path.getsize(path) - 8:
        raise CheckpointError(
            f"{path}: the .safetensors format is not supported; convert it where the safetensors package is "
            f"installed: torch.save(safetensors.torch.load_file({path!r}), {os.path.splitext(path)[0] + '.pth'!r})",
            content=True,
        )


def _state_dict(obj, path: str, wrappers: tuple[str, ...]) -> StateDict:
    """The dict of weights in a loaded file: unwrap ``{wrapper: {...}}``; keep detectron2's ``__author__``."""
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors, got {type(obj).__name__}", content=True)
    out = StateDict(obj)
    for key in wrappers:
        if isinstance(obj.get(key), dict):
            out = StateDict(obj[key])
            if key == "model" and "__author__" in obj:  # detectron2: {'model': ..., '__author__': ...}
                out.author = str(obj["__author__"])[:80]
            break
    if not out:
        raise CheckpointError(f"{path}: holds no weights (an empty dict)", content=True)
    return out


def read_torch_file(path: str) -> StateDict:
    """Read a ``torch.save`` state dict safely; unwrap ``{"model"|"state_dict": ...}``."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path} ({WEIGHTS_HELP})")
    _refuse_safetensors(path)
    try:  # from an open file: torch.load would take a path named .safetensors for one, whatever it holds
        with warnings.catch_warnings(), open(path, "rb") as f:  # warnings: noise around a one-line error
            warnings.simplefilter("ignore")
            obj = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure here means "not a safe torch file"
        raise _torch_load_error(path, e) from None
    obj = _state_dict(obj, path, ("model", "state_dict"))
    bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: entry {bad[0]!r} is not a tensor ({type(obj[bad[0]]).__name__})", content=True)
    return obj


def _numpy_global(name: str):
    core = getattr(np, "_core", None) or np.core
    return {
        "_reconstruct": core.multiarray._reconstruct,
        "scalar": core.multiarray.scalar,
        "ndarray": np.ndarray,
        "dtype": np.dtype,
    }[name]


# the only globals a pickle of numpy arrays needs; anything else is refused unexecuted. An
# OrderedDict is built from the pickle's own (already safe) items and runs no code of the file.
_PICKLE_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
    ("collections", "OrderedDict"),
}


def _allowed_global(name: str) -> bool:
    module, _, attr = name.rpartition(".")
    return (module, attr) in _PICKLE_ALLOWED


class _Refused(pickle.UnpicklingError):
    """The pickle names a global outside the allow-list; ``str(e)`` is ``module.name``."""


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _PICKLE_ALLOWED:
            raise _Refused(f"{module}.{name}")
        if module == "_codecs":
            import codecs

            return codecs.encode
        if module == "collections":
            return collections.OrderedDict
        return _numpy_global(name)


def read_pickle_file(path: str) -> StateDict:
    """Read a Caffe2 Detectron ``.pkl`` (Python-2 protocol-2 pickle) without running code.

    Only numpy array reconstruction (and ``OrderedDict``) is allowed (``encoding='latin1'`` maps
    py2 byte strings 1:1). Returns the blob dict: ``obj['blobs']`` for detection models, the flat
    dict for ImageNet init files, ``obj['model']`` for detectron2 pickles.
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path} ({WEIGHTS_HELP})")
    _refuse_safetensors(path)
    try:
        with open(path, "rb") as f:
            obj = _NumpyOnlyUnpickler(f, encoding="latin1").load()
    except _Refused as e:
        raise CheckpointError(
            f"{path}: refused: the pickle asks for {e}, outside the numpy allow-list (nothing was run)", str(e)
        ) from None
    except Exception as e:  # noqa: BLE001 - truncated/garbage files raise many types
        raise CheckpointError(f"{path}: cannot read as a Detectron pickle: {_one_line(e)}") from None
    return _state_dict(obj, path, ("model", "blobs"))


_ZIP_MAGIC = b"PK\x03\x04"


def read_checkpoint(path: str) -> StateDict:
    """Read any supported checkpoint file with the safe reader its content calls for.

    A zip archive is a ``torch.save`` file whatever its name; a safetensors file is refused.
    Another file is a pickle: a ``.pkl`` is read by the numpy-only unpickler first, anything else
    by ``torch.load`` (legacy non-zip torch files) first; if that reader fails the other one is
    tried (both run no code). When both fail, the more telling error is reported (``_rank``).
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path} ({WEIGHTS_HELP})")
    _refuse_safetensors(path)
    with open(path, "rb") as f:
        head = f.read(4)
    if head == _ZIP_MAGIC:
        return read_torch_file(path)
    first, second = (
        (read_pickle_file, read_torch_file) if str(path).endswith(".pkl") else (read_torch_file, read_pickle_file)
    )
    try:
        return first(path)
    except CheckpointError as e:
        error = e
    try:
        return second(path)
    except CheckpointError as e:
        if _rank(e) > _rank(error):
            error = e
    raise error


def _rank(e: CheckpointError) -> int:
    """How much a reader's error says about the file: a refused global that no reader allows (3),
    a file read whose content is wrong (2), a file the reader cannot parse (1), a refused global
    that the other reader allows (0)."""
    if e.refused is not None:
        return 0 if _allowed_global(e.refused) else 3
    return 2 if e.content else 1
