"""``minidet export --precision int8``: the exported graph quantized to int8 by NNCF, run by OpenVINO.

Post-training quantization (NNCF's ``quantize`` on the OpenVINO model read from the float32 ONNX graph): NNCF runs
the graph on the calibration images (``graph_inputs`` of minidet's own preprocessing), takes each quantized
layer's activation range from them, quantizes weights per output channel and corrects the biases. Which layers
compute in int8 is minidet's choice, by module (the graph's nodes are named after the model's modules from the
exporter's scopes: ``name_by_module``):

- int8: the weighted layers of ``QUANTIZED`` (the body's stages, the FPN, the box head's fully connected layers:
  nearly all of the arithmetic);
- float32 (``KEPT_FLOAT`` and ``KEPT_FLOAT_BLOCKS``, each with why; the facts name those the model has; each
  architecture's int8 policy in families/architectures.py): the first
  convolution, the RPN head, the box predictor, the mask head, a Mask Scoring R-CNN's mask IoU head, GC blocks
  (``*.context``), and every step without weights (box decoding, NMS, RoIAlign, the mask paste's inputs).

The result is written as an OpenVINO model (``model.xml`` + ``model.bin``, weights uncompressed) with minidet's
metadata (``minidet.precision int8``, the float modules), which ``onnxfile.open_graph`` opens under ``MODEL.RUNTIME
openvino`` and ``MODEL.RUNTIME_PRECISION int8``. ``nncf`` is the optional extra ``minidet[int8]``.
"""

from __future__ import annotations

import ast
import logging
import os
import tempfile
import warnings
from collections.abc import Sequence

from ..families.architectures import ARCHITECTURES
from . import require

# each architecture's int8 policy (families/architectures.py: ``Architecture.int8``), the table's entries in order:
# the modules whose weighted layers compute in int8; what stays float32 inside them, and why (everything outside
# QUANTIZED is float too); blocks kept float32 inside the quantized modules, wherever they are (a module path with this
# name in it), and why
QUANTIZED = tuple(m for a in ARCHITECTURES for m in a.int8.quantized)
KEPT_FLOAT = {k: why for a in ARCHITECTURES for k, why in a.int8.kept_float.items()}
KEPT_FLOAT_BLOCKS = {k: why for a in ARCHITECTURES for k, why in a.int8.kept_blocks.items()}
DEFAULT_CALIBRATION = 100  # calibration images used at most (spread evenly over those given)
SCOPE = "pkg.torch.onnx.name_scopes"  # the torch exporter's node metadata: the modules a node was traced in
WEIGHTED = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "MatMul")


def module_of(scopes: Sequence[str]) -> str:
    """The module a node belongs to from its exporter scopes (``['', 'backbone', 'backbone.stem', ...,
    'conv2d']``: the last is the operator's own name): the innermost module path, '' for the top."""
    return scopes[-2] if len(scopes) >= 2 else ""


def name_by_module(proto) -> int:
    """Prefix each node of the ONNX model ``proto`` with its module (``backbone.res2.0.conv1/node_Conv_12``), in
    place; returns how many were named."""
    named = 0
    for node in proto.graph.node:
        for prop in node.metadata_props:
            if prop.key == SCOPE:
                try:
                    module = module_of(ast.literal_eval(prop.value))
                except (ValueError, SyntaxError):
                    module = ""
                if module:
                    node.name = f"{module}/{node.name}"
                    named += 1
    return named


def module_named(name: str) -> str:
    """The module of the op named ``name`` (``module/op``, ``name_by_module``); '' for an op outside any module."""
    return name.split("/", 1)[0] if "/" in name else ""


def under(module: str, prefixes) -> bool:
    """Whether ``module`` is one of ``prefixes`` (module paths) or inside one."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def in_kept_block(module: str) -> str:
    """The ``KEPT_FLOAT_BLOCKS`` name ``module`` is in or inside, '' for none."""
    return next((part for part in module.split(".") if part in KEPT_FLOAT_BLOCKS), "")


def is_quantized(name: str) -> bool:
    """Whether the op named ``name`` (``module/op``, ``name_by_module``) is in a module whose layers are int8."""
    module = module_named(name)
    return under(module, QUANTIZED) and not under(module, KEPT_FLOAT) and not in_kept_block(module)


_WEIGHT_PATH = ("Convert", "Reshape", "Transpose", "Multiply", "Subtract")  # between a layer and its weights


def _source(node):
    """The node behind ``node`` through the conversions that stand between a layer and its weights."""
    while node.get_type_name() in _WEIGHT_PATH and node.get_input_size():
        node = node.input(0).get_source_output().get_node()
    return node


def weighted_layers(model) -> dict[str, list[str]]:
    """The weighted layers of an OpenVINO model by whether their weights are quantized: ``{"int8": [module, ...],
    "float32": [...]}`` (module names, each once, in graph order). A layer whose second input is no constant (an index
    op, a product of two activations such as a GC block's attention pooling) holds no weights and is not listed."""
    seen: dict[str, dict[str, None]] = {"int8": {}, "float32": {}}
    for op in model.get_ordered_ops():
        if op.get_type_name() not in WEIGHTED or op.get_input_size() < 2:
            continue
        source = _source(op.input(1).get_source_output().get_node())
        quantized = source.get_type_name() == "FakeQuantize"
        held = _source(source.input(0).get_source_output().get_node()) if quantized else source
        module = module_named(op.get_friendly_name())
        if held.get_type_name() != "Constant" or not module:  # data, not weights
            continue
        kind = "int8" if quantized or source.get_element_type().get_type_name() in ("i8", "u8") else "float32"
        seen[kind][module] = None
    return {k: list(v) for k, v in seen.items()}


def named_model(onnx_data: bytes):
    """The OpenVINO model of the ONNX graph ``onnx_data`` with its nodes named by module (``name_by_module``)."""
    onnx = require("onnx", "minidet export --precision int8")
    ov = require("openvino", "minidet export --precision int8", "openvino")
    proto = onnx.load_from_string(onnx_data)
    name_by_module(proto)
    return ov.Core().read_model(proto.SerializeToString())


def quantize(model, calibration: Sequence[dict], metadata: dict[str, str]):
    """The float32 graph ``model`` (``named_model``; not changed) quantized by NNCF on ``calibration`` (each the
    graph's inputs of one image, ``graph_inputs``): ``(ov.Model, facts)``, the model carrying ``metadata`` (and
    ``minidet.precision``), ``facts`` what was done (NNCF's version and settings, the calibration count, the
    layers in int8 and in float32 with why)."""
    nncf = require("nncf", "minidet export --precision int8", "int8")
    inputs = {n for i in model.inputs for n in i.get_names()}
    items = [{k: v for k, v in feeds.items() if k in inputs} for feeds in calibration]
    ops = [op.get_friendly_name() for op in model.get_ordered_ops()]
    names = sorted({n for n in ops if not is_quantized(n)})
    modules = {module_named(n) for n in ops}
    kept = {k: why for k, why in KEPT_FLOAT.items() if any(under(m, (k,)) for m in modules)}  # those the model has
    kept.update({f"*.{b}": KEPT_FLOAT_BLOCKS[b] for b in dict.fromkeys(filter(None, map(in_kept_block, modules)))})
    settings = {"preset": "PERFORMANCE", "target_device": "CPU", "fast_bias_correction": True,
                "subset_size": len(items)}
    nncf.set_log_level(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = nncf.quantize(model, nncf.Dataset(items), preset=nncf.QuantizationPreset.PERFORMANCE,
                                  target_device=nncf.TargetDevice.CPU, subset_size=len(items),
                                  fast_bias_correction=True, ignored_scope=nncf.IgnoredScope(names=names,
                                                                                              validate=False))
    for key, value in {**metadata, "minidet.precision": "int8",
                       "minidet.kept_float": ",".join(kept)}.items():
        quantized.set_rt_info(str(value), ["framework", key])
    layers = weighted_layers(quantized)
    facts = {"tool": "NNCF", "version": nncf.__version__, "method": "post-training quantization", **settings,
             "calibration_images": len(items), "int8_modules": QUANTIZED, "kept_float": kept,
             "layers": {k: len(v) for k, v in layers.items()}, "float32_layers": layers["float32"]}
    return quantized, facts


def serialize(model) -> tuple[bytes, bytes]:
    """An OpenVINO model's ``(model.xml, model.bin)`` bytes (weights as they are: not compressed to fp16)."""
    from .onnxfile import read_graph

    ov = require("openvino", "minidet export --precision int8", "openvino")
    with tempfile.TemporaryDirectory(prefix="minidet-int8-") as tmp:
        xml = os.path.join(tmp, "model.xml")
        ov.save_model(model, xml, compress_to_fp16=False)
        return read_graph(xml)
