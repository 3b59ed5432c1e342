"""``MODEL.RUNTIME onnxruntime``: the exported graph in place of the eager network, inside minidet.

``load_network(cfg, weights)`` opens and checks ``MODEL.GRAPH`` (``onnxfile.open_graph``) and returns an
``ExportedNetwork``, which ``MaskRCNN`` calls instead of its own ``_detect``: a padded chunk of images in, one
``Detections`` per image out. Everything around it stays minidet's own code: the resize and normalization
before (``Transform.preprocess``) and the rescale and mask paste after (``Transform.postprocess``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..checkpoint import LoadReport
from ..config import CfgNode, ConfigError
from ..roi_heads import Detections
from ..transform import ImageBatch
from . import ExportError, require
from .onnxfile import NO_WEIGHTS, Graph, graph_inputs, open_graph

RUNTIMES = ("torch", "onnxruntime")  # MODEL.RUNTIME


class ExportedNetwork:
    """``MaskRCNN._detect``'s contract run by an exported graph: ``network(images)`` of a padded ``ImageBatch`` ->
    per image its ``Detections`` (boxes in the graph's frame, scores, labels, mask probabilities or None).
    ``run``: the graph's inputs (``graph_inputs``) -> its outputs by name; default: ``graph``'s ONNX Runtime
    session (``openvino_runner``: the same file compiled by OpenVINO)."""

    def __init__(self, graph: Graph, run: Callable[[dict], dict[str, np.ndarray]] | None = None) -> None:
        self.graph = graph
        names = [o.name for o in graph.session.get_outputs()]
        self.run = run or (lambda feeds: dict(zip(names, graph.session.run(None, feeds))))

    def __call__(self, images: ImageBatch) -> list[Detections]:
        h, w = images.tensor.shape[-2:]
        if min(h, w) < self.graph.min_side:
            raise ValueError(f"the exported graph takes padded images of at least {self.graph.min_side} pixels a "
                             f"side; this one is {w} x {h} (an image this small or elongated runs on MODEL.RUNTIME "
                             "torch)")
        results = []
        for i in range(len(images.sizes)):
            out = {k: torch.from_numpy(v) for k, v in self.run(graph_inputs(images, i)).items()}
            results.append(Detections(out["boxes"], out["scores"], out["labels"], self.graph.frame, out.get("masks")))
        return results


def openvino_runner(path: str, threads: int | None = None) -> Callable[[dict], dict[str, np.ndarray]]:
    """The graph file ``path`` compiled by OpenVINO for the CPU (``threads`` inference threads, default torch's
    count): inputs by name -> outputs by name (labels as int64, as ONNX Runtime gives them)."""
    ov = require("openvino", "the OpenVINO runtime")
    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads or torch.get_num_threads()})
    request, names = compiled.create_infer_request(), [o.get_any_name() for o in compiled.outputs]

    def run(feeds: dict) -> dict[str, np.ndarray]:
        result = request.infer(feeds)
        out = {name: result[o] for name, o in zip(names, compiled.outputs)}
        out["labels"] = out["labels"].astype(np.int64)
        return out

    return run


def load_network(cfg: CfgNode, weights: str | None) -> tuple[ExportedNetwork, LoadReport]:
    """The network of ``cfg.MODEL.GRAPH`` for ``MODEL.RUNTIME onnxruntime``, checked against ``weights`` (the
    resolved ``MODEL.WEIGHTS`` file, None for ``none``), and the load report naming it."""
    m = cfg.MODEL
    if m.RUNTIME not in RUNTIMES[1:]:
        raise ConfigError(f"MODEL.RUNTIME {m.RUNTIME}: no exported runtime of that name; one of {', '.join(RUNTIMES)}")
    if not str(m.GRAPH).strip():
        raise ConfigError(f"MODEL.RUNTIME {m.RUNTIME} needs MODEL.GRAPH: the model.onnx that `minidet export` wrote "
                          "(its config.yaml names it)")
    if torch.device(m.DEVICE).type != "cpu":
        raise ConfigError(f"MODEL.RUNTIME {m.RUNTIME} runs on the CPU; set MODEL.DEVICE cpu (got {m.DEVICE})")
    if weights is None:
        digest = NO_WEIGHTS
    else:
        from ..hub import file_sha256

        try:
            digest = file_sha256(weights)
        except OSError as e:
            raise ExportError(f"MODEL.WEIGHTS {weights}: cannot read ({e.strerror})") from None
    graph = open_graph(str(m.GRAPH), digest)
    meta = graph.metadata  # the eager load's report, kept by the export
    source = f"minidet export of {meta.get('minidet.weights', '?')}, {meta.get('minidet.weights_format', '?')}"
    report = LoadReport(path=graph.path, format=source, loaded=int(meta.get("minidet.tensors", 0)))
    return ExportedNetwork(graph), report
