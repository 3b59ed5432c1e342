"""``MODEL.RUNTIME onnxruntime``: the exported graph in place of the eager network, inside minidet.

``load_network(cfg, weights)`` opens and checks ``MODEL.GRAPH`` (``onnxfile.open_graph``) and returns an
``ExportedNetwork``, which ``MaskRCNN`` calls instead of its own ``_detect``: a padded chunk of images in, one
``Detections`` per image out. Everything around it stays minidet's own code: the resize and normalization
before (``Transform.preprocess``) and the rescale and mask paste after (``Transform.postprocess``).
"""

from __future__ import annotations

import torch

from ..checkpoint import LoadReport
from ..config import CfgNode, ConfigError
from ..roi_heads import Detections
from ..transform import ImageBatch
from . import ExportError
from .onnxfile import NO_WEIGHTS, RUNTIMES, Graph, graph_inputs, open_graph


class ExportedNetwork:
    """``MaskRCNN._detect``'s contract run by an exported graph: ``network(images)`` of a padded ``ImageBatch`` ->
    per image its ``Detections`` (boxes in the graph's frame, scores, labels, mask probabilities or None), each
    image's slice of the padded tensor through ``graph.run``."""

    def __init__(self, graph: Graph) -> None:
        self.graph, self.run = graph, graph.run

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


def load_network(cfg: CfgNode, weights: str | None) -> tuple[ExportedNetwork, LoadReport]:
    """The network of ``cfg.MODEL.GRAPH`` for ``MODEL.RUNTIME onnxruntime``, checked against ``weights`` (the
    resolved ``MODEL.WEIGHTS`` file, None for ``none``), and the load report naming it."""
    m = cfg.MODEL
    if m.RUNTIME not in RUNTIMES:
        raise ConfigError(f"MODEL.RUNTIME {m.RUNTIME}: no runtime of exported graphs; one of {', '.join(RUNTIMES)}")
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
    graph = open_graph(str(m.GRAPH), digest, runtime=m.RUNTIME)
    meta = graph.metadata  # the eager load's report, kept by the export
    source = f"minidet export of {meta.get('minidet.weights', '?')}, {meta.get('minidet.weights_format', '?')}"
    report = LoadReport(path=graph.path, format=source, loaded=int(meta.get("minidet.tensors", 0)))
    return ExportedNetwork(graph), report
