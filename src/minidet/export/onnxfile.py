"""The exported graph's file, ``model.onnx``: written by ``export_onnx``, opened and checked by ``open_graph``.

The file is one self-contained ONNX model (weights inside) of ``graph.NetworkGraph`` with minidet's metadata
(``metadata_props``, keys ``minidet.*``): the minidet version that wrote it, the graph's interface version, the
frame of its boxes, the SHA-256 of the weights it holds and the resolved config. ``open_graph`` refuses, in one
line each, a file that is not ONNX, an ONNX file that minidet did not export, one of another minidet version and
one whose weights are not those of ``MODEL.WEIGHTS`` any more.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import __version__
from ..detector import MaskRCNN
from ..families.architectures import unsupported_ops
from ..runtimes import PRECISIONS, RUNTIMES, precision_problem
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
GraphBytes = bytes | tuple[bytes, bytes]  # an ONNX model's bytes, or an OpenVINO model's (model.xml, model.bin)


class RuntimeCannot(ExportError):
    """What a runtime cannot do with a graph, in one line (``open_graph`` names the graph before it)."""


class PrecisionError(RuntimeCannot):
    """A runtime that cannot compute, or did not compute, in the precision asked (``MODEL.RUNTIME_PRECISION``)."""


# ONNX operators of minidet's graphs that a runtime has no kernel or conversion for: runtime -> {op: what it is}, from
# the architectures that add them (families/architectures.py: ``Architecture.lacks``)
UNSUPPORTED = unsupported_ops()


def graph_ops(model: MaskRCNN) -> set[str]:
    """The ONNX operators of ``model``'s graph that not every runtime runs (``UNSUPPORTED``'s)."""
    from ..layers import DeformConv2d

    return {"DeformConv"} if any(isinstance(m, DeformConv2d) for m in model.modules()) else set()


def runtime_lacks(runtime: str, ops: set[str]) -> str:
    """'' when ``runtime`` runs every operator of ``ops``, else one line naming the runtime and what it cannot run."""
    missing = sorted(set(UNSUPPORTED.get(runtime, {})) & ops)
    if not missing:
        return ""
    what = ", ".join(f"{UNSUPPORTED[runtime][op]} (ONNX's {op}, opset 19)" for op in missing)
    return (f"{RUNTIMES[runtime]} cannot run {what}: it has no conversion for it; ONNX Runtime runs it (export with "
            "--runtime onnxruntime, run with MODEL.RUNTIME onnxruntime)")


@dataclass
class Graph:
    """An opened, checked ``model.onnx``: ``run`` (its runtime: inputs by name -> outputs by name), minidet's
    ``metadata`` and ``runtime``, what opened it (name, version, the options that fix its numerics, the precision
    asked and the one its compiled layers got)."""

    path: str
    run: Runner
    metadata: dict[str, str]
    runtime: dict[str, object] = field(default_factory=dict)

    @property
    def frame(self) -> str:
        return self.metadata["minidet.frame"]

    @property
    def min_side(self) -> int:
        return int(self.metadata.get("minidet.min_side", MIN_SIDE))


def _feeding(accepted: set[str]) -> Callable[[dict], dict]:
    """The graph's inputs cut to those the runtime kept (a runtime may drop an input the graph does not use: the
    torchvision graph's ``original_size`` under OpenVINO)."""
    return lambda feeds: {k: v for k, v in feeds.items() if k in accepted}


# ONNX Runtime's session settings that bear on numerics, set whatever its defaults are: no denormals flushed to
# zero, no bf16 fast-math GEMMs (Arm); spinning off (the cores are the pipeline's between runs)
ORT_ENTRIES = {"session.set_denormal_as_zero": "0", "mlas.enable_gemm_fastmath_arm64_bfloat16": "0",
               "session.intra_op.allow_spinning": "0"}


def _onnxruntime(source: GraphBytes, threads: int, precision: str) -> tuple[Runner, dict[str, str], dict[str, object]]:
    """The graph in an ONNX Runtime session on the CPU, float32 (its CPU provider's only precision for this graph),
    every graph optimization (float order only), ``threads`` intra-op threads; its runner, metadata and facts."""
    ort = require("onnxruntime", "MODEL.RUNTIME onnxruntime")
    if problem := precision_problem(precision, "onnxruntime"):
        raise PrecisionError(problem)
    if isinstance(source, tuple):
        raise PrecisionError("an OpenVINO model (model.xml), which MODEL.RUNTIME openvino runs, not ONNX Runtime")
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    for key, value in ORT_ENTRIES.items():
        so.add_session_config_entry(key, value)
    session = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    names, feed = [o.name for o in session.get_outputs()], _feeding({i.name for i in session.get_inputs()})
    facts = {"name": "onnxruntime", "version": ort.__version__, "device": "CPU", "precision_asked": precision,
             "precision": "fp32", "options": {**ORT_ENTRIES, "graph_optimization_level": "ORT_ENABLE_ALL",
                                               "intra_op_num_threads": threads}}
    meta = dict(session.get_modelmeta().custom_metadata_map)
    return lambda feeds: dict(zip(names, session.run(None, feed(feeds)))), meta, facts


def openvino_options(precision: str, threads: int) -> dict[str, object]:
    """What ``compile_model`` gets for ``MODEL.RUNTIME_PRECISION`` ``precision``: every CPU-plugin property that
    changes numerics, set (its defaults differ by CPU: bf16 by itself where the CPU has AVX512_BF16 or AMX). The
    float layers compute in the table's ``hint`` (int8: float32; the int8 layers are the quantized model's own)."""
    hint = PRECISIONS[precision].hint
    return {
        "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": hint,
        "EXECUTION_MODE_HINT": "ACCURACY" if hint == "f32" else "PERFORMANCE",  # ACCURACY: no lower float precision
        "CPU_DENORMALS_OPTIMIZATION": False,  # denormals computed, not flushed to zero
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,  # no run-time int8 of activations
    }


# OpenVINO's compiled layers that multiply weights (where an int8 model's int8 arithmetic is)
WEIGHTED_LAYERS = ("Convolution", "Deconvolution", "FullyConnected", "MatMul")


def layer_precisions(compiled) -> dict[str, int]:
    """How many layers of OpenVINO's compiled model compute in each floating precision (``f32``, ``bf16``, ``f16``)
    and how many weighted layers (``WEIGHTED_LAYERS``) in int8 (``i8``/``u8``, counted as ``int8``), read from its
    runtime model (what the plugin will run, not what was asked). Other integer layers (indices, masks) are not
    counted."""
    counts: dict[str, int] = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "runtimePrecision" in info.keys() and "layerType" in info.keys():
            kind, p = info["layerType"].astype(str), info["runtimePrecision"].astype(str)
            if p in ("i8", "u8") and kind in WEIGHTED_LAYERS:
                counts["int8"] = counts.get("int8", 0) + 1
            elif p in ("f32", "bf16", "f16") and kind not in ("Input", "Output", "Const", "Reorder"):
                counts[p] = counts.get(p, 0) + 1
    return counts


def _read_openvino(core, source: GraphBytes):
    """An ``ov.Model`` from an ONNX model's bytes or an OpenVINO model's (xml, bin) bytes."""
    if isinstance(source, tuple):
        import openvino as ov

        xml, weights = source
        return core.read_model(xml, ov.Tensor(np.frombuffer(weights, np.uint8)))
    return core.read_model(source)


def cpu_lacks(precision: str, core=None, asked: str = "MODEL.RUNTIME_PRECISION") -> str:
    """'' when OpenVINO's CPU plugin computes in ``precision`` on this CPU, else one line saying it cannot, naming
    the setting ``asked`` (the config key, or a program's option) that asked for it."""
    need = PRECISIONS[precision].capability
    if not need:
        return ""
    if core is None:
        core = require("openvino", f"MODEL.RUNTIME_PRECISION {precision}", "openvino").Core()
    if need in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        return ""
    which = {"BF16": "bf16 instructions OpenVINO computes with (AVX512_BF16 or AMX)",
             "INT8": "int8 instructions OpenVINO computes with"}[need]
    return f"{asked} {precision}: this CPU has no {which}; use fp32"


def _openvino(source: GraphBytes, threads: int, precision: str) -> tuple[Runner, dict[str, str], dict[str, object]]:
    """The graph compiled by OpenVINO for the CPU in ``precision`` (``openvino_options``), checked: its compiled
    layers compute in the precisions ``PRECISIONS[precision]`` allows (int8: some weighted layers in int8, the
    float ones in float32); its runner (labels as int64, as ONNX Runtime gives them), metadata, facts."""
    ov = require("openvino", "MODEL.RUNTIME openvino", "openvino")
    core = ov.Core()
    if problem := cpu_lacks(precision, core):
        raise PrecisionError(problem)
    try:
        model = _read_openvino(core, source)
    except Exception as e:  # noqa: BLE001 - OpenVINO's frontends raise their own types
        if problem := runtime_lacks("openvino", {op for op in UNSUPPORTED["openvino"] if op in str(e)}):
            raise RuntimeCannot(problem) from None
        raise
    info = model.get_rt_info()
    framework = info["framework"] if "framework" in info.keys() else {}
    meta = {k: framework[k].astype(str) for k in framework.keys()} if framework else {}
    if "minidet.interface" in meta and (mismatch := precision_mismatch(graph_precision(meta), precision)):
        raise PrecisionError(mismatch)  # before compiling it (open_graph checks every runtime's graph again)
    options = openvino_options(precision, threads)
    compiled = core.compile_model(model, "CPU", options)
    layers = layer_precisions(compiled)
    allowed = PRECISIONS[precision].layers | ({"int8"} if "i8" in PRECISIONS[precision].layers else set())
    if set(layers) - allowed:
        other = ", ".join(f"{n} in {p}" for p, n in layers.items() if p not in allowed)
        raise PrecisionError(f"OpenVINO {ov.__version__} compiled {other} of {sum(layers.values())} layers although "
                             f"{precision} was asked (MODEL.RUNTIME_PRECISION {precision}: INFERENCE_PRECISION_HINT "
                             f"{options['INFERENCE_PRECISION_HINT']}, EXECUTION_MODE_HINT "
                             f"{options['EXECUTION_MODE_HINT']}); its detections would not be the exported model's")
    if precision == "int8" and not layers.get("int8"):
        raise PrecisionError(f"OpenVINO {ov.__version__} compiled no layer in int8 (MODEL.RUNTIME_PRECISION int8): "
                             "this model holds no quantized layer")
    got = "fp32" if set(layers) <= {"f32"} else precision if precision != "fp32" else "+".join(sorted(layers))
    facts = {"name": "openvino", "version": ov.__version__, "device": "CPU", "precision_asked": precision,
             "precision": got, "layers": layers, "options": {k: str(v) for k, v in options.items()},
             "capabilities": list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))}
    request, outputs = compiled.create_infer_request(), compiled.outputs
    feed = _feeding({name for i in compiled.inputs for name in i.get_names()})

    def run(feeds: dict) -> dict:
        result = request.infer(feed(feeds))
        out = {o.get_any_name(): result[o] for o in outputs}
        out["labels"] = out["labels"].astype(np.int64)
        return out

    return run, meta, facts


OPENERS = {"onnxruntime": _onnxruntime, "openvino": _openvino}  # MODEL.RUNTIME (RUNTIMES) -> how it opens a graph


def graph_sha256(data: GraphBytes) -> str:
    """The SHA-256 of a graph's bytes (``MODEL.GRAPH_SHA256``): an ONNX file's, or an OpenVINO model's ``.xml``
    followed by its ``.bin``."""
    digest = hashlib.sha256()
    for part in data if isinstance(data, tuple) else (data,):
        digest.update(part)
    return digest.hexdigest()


def _read(path: str) -> bytes:
    if not os.path.isfile(path):
        what = "is a folder, not a model file" if os.path.isdir(path) else "not found"
        raise ExportError(f"exported graph {path}: {what}")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ExportError(f"exported graph {path}: cannot read ({e.strerror})") from None


def _weights_beside(xml: str) -> str:
    """The ``.bin`` of the OpenVINO model ``xml`` (its weights, beside it under the same name)."""
    return os.path.splitext(xml)[0] + ".bin"


def read_graph(path: str) -> GraphBytes:
    """The bytes of the graph at ``path``: an ONNX file, or an OpenVINO model (``.xml`` and the ``.bin`` beside it,
    as ``minidet export --precision int8`` writes it)."""
    if path.lower().endswith(".xml"):
        return _read(path), _read(_weights_beside(path))
    return _read(path)


def graph_files(path: str, data: GraphBytes) -> list[tuple[str, bytes]]:
    """``read_graph``'s inverse: the files that hold ``data`` as the graph ``path``, in the order to write them (an
    OpenVINO model's ``.bin`` before its ``.xml``)."""
    if isinstance(data, tuple):
        return [(_weights_beside(path), data[1]), (path, data[0])]
    return [(path, data)]


def graph_precision(metadata: dict[str, str]) -> str:
    """The precision a graph was exported in (``minidet.precision``; graphs without it are float32)."""
    return metadata.get("minidet.precision", "fp32")


def precision_mismatch(held: str, asked: str) -> str:
    """'' when a graph exported in ``held`` runs in ``MODEL.RUNTIME_PRECISION`` ``asked`` (a float32 ONNX graph runs
    in any precision computed from it: fp32, bf16), else why not."""
    if asked == held or (held == "fp32" and PRECISIONS[asked].graph == PRECISIONS["fp32"].graph):
        return ""
    if held == "fp32":
        return (f"a float32 graph; MODEL.RUNTIME_PRECISION {asked} runs the graph of `minidet export --precision "
                f"{asked}`")
    return (f"a graph exported with --precision {held}; set MODEL.RUNTIME_PRECISION {held} (a precision is named "
            "in the config, never implied by the graph)")


def open_graph(path: str, weights_sha256: str | None = None, threads: int | None = None,
               data: GraphBytes | None = None, runtime: str = "onnxruntime", precision: str = "fp32",
               sha256: str = "") -> Graph:
    """``path`` (or the serialized model ``data``, named ``path``) opened by ``runtime`` (``RUNTIMES``; CPU, ``threads``
    threads, default torch's count, so that ``OMP_NUM_THREADS`` and ``torch.set_num_threads`` govern both) in
    ``precision`` (``MODEL.RUNTIME_PRECISION``) and checked: its bytes of SHA-256 ``sha256`` where given (read once:
    the bytes checked are the bytes run), an ONNX model, exported by this minidet version's ``export`` with this
    interface, and, where ``weights_sha256`` is given (the SHA-256 of the file ``MODEL.WEIGHTS`` names, or
    ``NO_WEIGHTS``), holding those weights; compiled in the precision asked. Anything else: ``ExportError``, one
    line naming ``path``."""
    if data is None:
        data = read_graph(path)
    if sha256 and (got := graph_sha256(data)) != sha256.strip().lower():
        raise ExportError(f"exported graph {path}: its SHA-256 is {got[:12]}..., not the {sha256.strip()[:12]}... "
                          "recorded when it was exported (MODEL.GRAPH_SHA256): the file is damaged or was replaced; "
                          "copy the export folder again, or export again")
    load = OPENERS[runtime]
    try:
        run, meta, facts = load(data, threads or torch.get_num_threads(), precision)
    except RuntimeCannot as e:
        raise ExportError(f"exported graph {path}: {e}") from None
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001 - each runtime raises its own types for unreadable models
        reason = " ".join(str(e).split())
        what = f"not an ONNX model {RUNTIMES[runtime]} can load"
        raise ExportError(f"exported graph {path}: {what} ({reason[:200]})") from None
    if "minidet.interface" not in meta:
        raise ExportError(f"exported graph {path}: an ONNX model, but not one `minidet export` wrote (no minidet "
                          "metadata); export the model with `minidet export`")
    version = meta.get("minidet.version", "?")
    if version != __version__ or meta["minidet.interface"] != INTERFACE:
        raise ExportError(f"exported graph {path}: written by minidet {version}, this is minidet {__version__}; "
                          "export it again with this version (`minidet export`)")
    if mismatch := precision_mismatch(graph_precision(meta), precision):
        raise ExportError(f"exported graph {path}: {mismatch}")
    held = meta.get("minidet.weights_sha256", "")
    if weights_sha256 is not None and held != weights_sha256:
        source = meta.get("minidet.weights", "?")
        raise ExportError(
            f"exported graph {path}: MODEL.WEIGHTS changed since the export (the graph holds the weights of "
            f"{source}, SHA-256 {held[:12]}; MODEL.WEIGHTS is now SHA-256 {weights_sha256[:12]}); export again")
    return Graph(os.path.abspath(path), run, meta, facts)
