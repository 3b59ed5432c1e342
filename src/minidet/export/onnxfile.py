"""The exported graph's file, ``model.onnx``: written by ``export_onnx``, opened and checked by ``open_graph``.

The file is one self-contained ONNX model (weights inside) of ``graph.NetworkGraph`` with minidet's metadata
(``metadata_props``, keys ``minidet.*``): the minidet version that wrote it, the graph's interface version, the
frame of its boxes, the SHA-256 of the weights it holds and the resolved config. ``open_graph`` refuses, in one
line each, a file that is not ONNX, an ONNX file that minidet did not export, one of another minidet version and
one whose weights are not those of ``MODEL.WEIGHTS`` any more.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .. import __version__
from ..detector import MaskRCNN
from ..transform import ImageBatch
from . import ExportError, require

INTERFACE = "1"  # graph.INPUTS -> graph.OUTPUTS, as graph_inputs feeds them
MIN_SIDE = 64  # the smallest padded side the graph takes (a smaller one would make the coarsest level 0 or 1 cells)
NO_WEIGHTS = "none"  # minidet.weights_sha256 of a graph exported from random weights (MODEL.WEIGHTS none)


def graph_inputs(images: ImageBatch, i: int) -> dict[str, np.ndarray]:
    """The graph's inputs for image ``i`` of a padded batch (its slice of the padded tensor, as the eager network
    sees it in a chunk of one): ``image`` (1, 3, H, W) float32, ``image_size``, ``original_size`` (2,) int64 (h, w),
    ``scale`` () float32."""
    return {
        "image": np.ascontiguousarray(images.tensor[i : i + 1].detach().cpu().float().numpy()),
        "image_size": np.asarray(images.sizes[i], dtype=np.int64),
        "original_size": np.asarray(images.orig_sizes[i], dtype=np.int64),
        "scale": np.asarray(images.scales[i], dtype=np.float32),
    }


def exporter_versions() -> dict[str, str]:
    """The versions of what makes the graph: torch (``torch.export``, its ONNX exporter), onnxscript, onnx."""
    import onnx
    import onnxscript

    return {"torch": torch.__version__, "onnxscript": onnxscript.__version__, "onnx": onnx.__version__}


def export_onnx(model: MaskRCNN, example: ImageBatch, metadata: dict[str, str]) -> bytes:
    """``model``'s network as the serialized ONNX model (``torch.export`` with the padded height and width dynamic,
    multiples of ``SIZE_DIVISIBILITY`` from ``MIN_SIDE``; ``torch.onnx.export`` with ``ops.TRANSLATIONS``), its
    ``metadata_props`` minidet's (``metadata`` added). ``example``: one padded image that the export traces."""
    require("onnxscript", "minidet export")
    onnx = require("onnx", "minidet export")
    from torch.export import Dim

    from .graph import INPUTS, NetworkGraph
    from .ops import TRANSLATIONS

    graph = NetworkGraph(model).eval()
    d = model.transform.size_divisibility
    k = max(2, -(-MIN_SIDE // d))  # torch.export treats sizes 0 and 1 apart
    h, w = d * Dim("h", min=k), d * Dim("w", min=k)
    args = tuple(torch.from_numpy(v) for v in graph_inputs(example, 0).values())
    with torch.no_grad():
        program = torch.export.export(graph, args, dynamic_shapes=({2: h, 3: w}, None, None, None), strict=False)
        onnx_program = torch.onnx.export(program, dynamo=True, custom_translation_table=TRANSLATIONS,
                                         input_names=list(INPUTS), output_names=list(graph.outputs), verbose=False)
    proto = onnx_program.model_proto
    meta = {"minidet.version": __version__, "minidet.interface": INTERFACE, "minidet.frame": graph.frame,
            "minidet.min_side": str(max(k * d, MIN_SIDE)), **metadata}
    onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props}, **meta})
    proto.producer_name = "minidet export"
    return proto.SerializeToString()


Runner = Callable[[dict], dict]  # the graph's inputs by name (``graph_inputs``) -> its outputs by name (numpy)


@dataclass
class Graph:
    """An opened, checked ``model.onnx``: ``run`` (its runtime: inputs by name -> outputs by name) and minidet's
    ``metadata``."""

    path: str
    run: Runner
    metadata: dict[str, str]

    @property
    def frame(self) -> str:
        return self.metadata["minidet.frame"]

    @property
    def min_side(self) -> int:
        return int(self.metadata.get("minidet.min_side", MIN_SIDE))


def _onnxruntime(source: str | bytes, threads: int) -> tuple[Runner, dict[str, str]]:
    """The graph in an ONNX Runtime session on the CPU: ``threads`` intra-op threads, which sleep between runs (no
    spinning that would take the cores from the rest of the pipeline); its runner and metadata."""
    ort = require("onnxruntime", "MODEL.RUNTIME onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(None, feeds))), dict(session.get_modelmeta().custom_metadata_map)


def _openvino(source: str | bytes, threads: int) -> tuple[Runner, dict[str, str]]:
    """The graph compiled by OpenVINO for the CPU with ``threads`` inference threads; its runner (labels as int64,
    as ONNX Runtime gives them) and metadata."""
    ov = require("openvino", "MODEL.RUNTIME openvino", "openvino")
    core = ov.Core()
    model = core.read_model(source)
    info = model.get_rt_info()
    framework = info["framework"] if "framework" in info.keys() else {}
    meta = {k: framework[k].astype(str) for k in framework.keys()} if framework else {}
    compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads})
    request, outputs = compiled.create_infer_request(), compiled.outputs

    def run(feeds: dict) -> dict:
        result = request.infer(feeds)
        out = {o.get_any_name(): result[o] for o in outputs}
        out["labels"] = out["labels"].astype(np.int64)
        return out

    return run, meta


RUNTIMES = {"onnxruntime": _onnxruntime, "openvino": _openvino}  # MODEL.RUNTIME -> how it opens a graph
RUNTIME_NAMES = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}


def open_graph(path: str, weights_sha256: str | None = None, threads: int | None = None, data: bytes | None = None,
               runtime: str = "onnxruntime") -> Graph:
    """``path`` (or the serialized model ``data``, named ``path``) opened by ``runtime`` (``RUNTIMES``; CPU, ``threads``
    threads, default torch's count, so that ``OMP_NUM_THREADS`` and ``torch.set_num_threads`` govern both) and
    checked: an ONNX model, exported by this minidet version's ``export`` with this interface, and, where
    ``weights_sha256`` is given (the SHA-256 of the file ``MODEL.WEIGHTS`` names, or ``NO_WEIGHTS``), holding those
    weights. Anything else: ``ExportError``, one line naming ``path``."""
    if data is None and not os.path.isfile(path):
        what = "is a folder, not a model.onnx" if os.path.isdir(path) else "not found"
        raise ExportError(f"exported graph {path}: {what}")
    load = RUNTIMES[runtime]
    try:
        run, meta = load(path if data is None else data, threads or torch.get_num_threads())
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001 - each runtime raises its own types for unreadable models
        reason = " ".join(str(e).split())
        what = f"not an ONNX model {RUNTIME_NAMES[runtime]} can load"
        raise ExportError(f"exported graph {path}: {what} ({reason[:200]})") from None
    if "minidet.interface" not in meta:
        raise ExportError(f"exported graph {path}: an ONNX model, but not one `minidet export` wrote (no minidet "
                          "metadata); export the model with `minidet export`")
    version = meta.get("minidet.version", "?")
    if version != __version__ or meta["minidet.interface"] != INTERFACE:
        raise ExportError(f"exported graph {path}: written by minidet {version}, this is minidet {__version__}; "
                          "export it again with this version (`minidet export`)")
    held = meta.get("minidet.weights_sha256", "")
    if weights_sha256 is not None and held != weights_sha256:
        source = meta.get("minidet.weights", "?")
        raise ExportError(
            f"exported graph {path}: MODEL.WEIGHTS changed since the export (the graph holds the weights of "
            f"{source}, SHA-256 {held[:12]}; MODEL.WEIGHTS is now SHA-256 {weights_sha256[:12]}); export again")
    return Graph(os.path.abspath(path), run, meta)
