"""The runtimes of an exported graph (``MODEL.RUNTIME``, ``minidet export --runtime``) and the precisions they
compute in (``MODEL.RUNTIME_PRECISION``, ``minidet export --precision``): one table each, importable without torch
(the config's check reads them; ``minidet.export`` opens the graphs).

``RUNTIMES`` names each runtime, in the order that every choice and message lists them. Each ``Precision`` says
which runtimes run it, whether it is exact, which file the export folder holds, what the CPU must offer (OpenVINO's
``OPTIMIZATION_CAPABILITIES``), the inference-precision hint OpenVINO gets for its float layers, and which
precisions its compiled layers may report. Everything that differs between precisions is read
from here (the config's check, ``onnxfile``'s runtimes, the export program), so a precision is one row.

- ``fp32``: the ONNX graph in float32 under ONNX Runtime or OpenVINO, on every CPU: equal to eager up to float
  order (the parity gate proves it); the default everywhere.
- ``bf16``: the same ONNX graph compiled by OpenVINO in bf16, on CPUs with bf16 instructions (AVX512_BF16, AMX);
  not exact: judged by the drift report and its gate.
- ``int8``: an OpenVINO model (``model.xml`` + ``model.bin``) quantized by NNCF after training on calibration
  images (``minidet.export.quantize``); its float layers stay float32. Not exact: the drift report and gate.
"""

from __future__ import annotations

from dataclasses import dataclass

RUNTIMES = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}  # MODEL.RUNTIME of an exported graph -> its name


@dataclass(frozen=True)
class Precision:
    name: str  # MODEL.RUNTIME_PRECISION
    runtimes: tuple[str, ...]  # the MODEL.RUNTIME values that run it
    exact: bool  # equal to eager up to float order (the parity gate); else the drift report and its gate
    graph: str  # the graph's file in the export folder
    capability: str  # what OpenVINO's CPU plugin must list in OPTIMIZATION_CAPABILITIES ('' none)
    hint: str  # OpenVINO's INFERENCE_PRECISION_HINT (the precision of its float layers)
    layers: frozenset[str]  # the runtime precisions its compiled layers may have


PRECISIONS = {
    "fp32": Precision("fp32", tuple(RUNTIMES), True, "model.onnx", "", "f32", frozenset({"f32"})),
    "bf16": Precision("bf16", ("openvino",), False, "model.onnx", "BF16", "bf16", frozenset({"f32", "bf16"})),
    "int8": Precision("int8", ("openvino",), False, "model.xml", "INT8", "f32", frozenset({"f32", "i8", "u8"})),
}
DEFAULT = "fp32"


def precision_problem(name: str, runtime: str) -> str:
    """'' when ``MODEL.RUNTIME`` ``runtime`` runs ``MODEL.RUNTIME_PRECISION`` ``name``, else why not (one line)."""
    p = PRECISIONS[name]
    if runtime == "torch" and name != DEFAULT:
        return (f"MODEL.RUNTIME_PRECISION {name} is the precision of an exported graph's runtime (MODEL.RUNTIME "
                f"{' or '.join(p.runtimes)}); the eager network's is TEST.AMP")
    if runtime != "torch" and runtime not in p.runtimes:
        return f"MODEL.RUNTIME_PRECISION {name} runs under MODEL.RUNTIME {' or '.join(p.runtimes)}, not {runtime}"
    return ""
