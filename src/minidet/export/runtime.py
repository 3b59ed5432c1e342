"""``MODEL.RUNTIME onnxruntime`` / ``openvino``: the exported graph in place of the eager network, inside minidet.

``load_network(cfg, weights)`` opens and checks ``MODEL.GRAPH`` (``onnxfile.open_graph``: its SHA-256, its
weights', the precision the runtime compiled it in) and returns an ``ExportedNetwork``, which ``MaskRCNN`` calls
instead of its own ``_detect``: a padded chunk of images in, one ``Detections`` per image out. Everything around it
stays minidet's own code: the resize and normalization before (``Transform.preprocess``) and the rescale and mask
paste after (``Transform.postprocess``). ``ExportedNetwork.check_config`` holds the config to the graph: the keys
whose values the graph computes with (``fixed_keys``) must be those it was exported with.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import yaml

from ..checkpoint import LoadReport
from ..config import CfgNode, ConfigError, leaves
from ..heads.detections import FIELD_NAMES, Detections
from ..runtimes import RUNTIMES
from ..transform import ImageBatch
from . import ExportError
from .onnxfile import NO_WEIGHTS, Graph, graph_inputs, open_graph

# The keys an exported graph does not hold: what minidet computes around it (resize, normalization, rescale, paste
# threshold, names and category ids), where and how the graph runs, and what only the eager network reads (which
# runs the images the graph cannot take). Every other key's value is computed with inside the graph.
OUTSIDE_THE_GRAPH = (
    "MODEL.WEIGHTS", "MODEL.DEVICE", "MODEL.RUNTIME", "MODEL.GRAPH", "MODEL.GRAPH_SHA256", "MODEL.RUNTIME_PRECISION",
    "MODEL.CLASS_NAMES", "MODEL.CATEGORY_LAYOUT", "MODEL.PIXEL_MEAN", "MODEL.PIXEL_STD",
    "MODEL.ROI_MASK_HEAD.THRESHOLD", "MODEL.CHANNELS_LAST", "MODEL.FUSE_CONVS", "MODEL.FUSE_LINEAR",
    "MODEL.ROI_ALIGN_IMPL", "MODEL.RPN.TORCHVISION_TIE_ORDER",
    "INPUT.MIN_SIZE_TEST", "INPUT.MAX_SIZE_TEST", "INPUT.FORMAT", "INPUT.PIXEL_RANGE", "INPUT.MAX_PIXELS", "TEST.",
)


def fixed_keys(cfg: CfgNode) -> list[str]:
    """The keys of ``cfg`` whose values an exported graph holds (all but ``OUTSIDE_THE_GRAPH``)."""
    return [k for k in leaves(cfg) if not any(k == o or (o.endswith(".") and k.startswith(o))
                                               for o in OUTSIDE_THE_GRAPH)]


def _same(a: object, b: object) -> bool:
    seq = (list, tuple)
    return list(a) == list(b) if isinstance(a, seq) and isinstance(b, seq) else a == b


class ExportedNetwork:
    """``MaskRCNN._detect``'s contract run by an exported graph: ``network(images)`` of a padded ``ImageBatch`` ->
    per image its ``Detections`` (boxes in the graph's frame, scores, labels, and the fields the graph outputs:
    ``heads.detections.FIELDS``), each image's slice of the padded tensor through ``graph.run``. A chunk
    smaller than the graph takes (a side under ``graph.min_side``: a tiny or elongated image) runs on ``eager``, the
    eager network of the same weights, where one is given."""

    def __init__(self, graph: Graph, eager: Callable[[ImageBatch], list[Detections]] | None = None) -> None:
        self.graph, self.run, self.eager = graph, graph.run, eager

    def takes(self, images: ImageBatch) -> bool:
        """Whether the graph takes this padded chunk (each side at least ``graph.min_side``)."""
        return min(images.tensor.shape[-2:]) >= self.graph.min_side

    def __call__(self, images: ImageBatch) -> list[Detections]:
        if not self.takes(images):
            if self.eager is not None:
                return self.eager(images)
            h, w = images.tensor.shape[-2:]
            raise ValueError(f"the exported graph takes padded images of at least {self.graph.min_side} pixels a "
                             f"side; this one is {w} x {h}, and with MODEL.WEIGHTS none there is no eager network of "
                             "the graph's weights to run it")
        return [self.run_image(images, i)[0] for i in range(len(images.sizes))]

    def run_image(self, images: ImageBatch, i: int) -> tuple[Detections, dict[str, torch.Tensor]]:
        """Image ``i`` of the padded batch through the graph (``graph.run``, whatever its size): its ``Detections``
        (boxes in the graph's frame) and every output of the graph by name (``proposals`` too), as tensors."""
        out = {k: torch.from_numpy(v) for k, v in self.run(graph_inputs(images, i)).items()}
        fields = {f: out[f] for f in FIELD_NAMES if f in out}
        return Detections(out["boxes"], out["scores"], out["labels"], self.graph.frame, **fields), out

    def check_config(self, cfg: CfgNode) -> None:
        """``ConfigError`` naming the first key of ``fixed_keys`` whose value in ``cfg`` (fitted to the checkpoint)
        is not the one the graph was exported with (its metadata's config; a graph without one is not checked)."""
        text = self.graph.metadata.get("minidet.config")
        if not text:
            return
        exported, values = leaves(CfgNode(yaml.safe_load(text))), leaves(cfg)
        for key in fixed_keys(cfg):
            have, need = values[key], exported.get(key)
            if key in exported and not _same(have, need):
                raise ConfigError(f"{key} is {have!r} but the exported graph {self.graph.path} computes with {need!r} "
                                  f"(its value at the export); set {key} {need}, or export again with {have!r}")


def load_network(cfg: CfgNode, weights: str | None) -> tuple[ExportedNetwork, LoadReport]:
    """The network of ``cfg.MODEL.GRAPH`` for ``MODEL.RUNTIME onnxruntime`` or ``openvino``, checked against
    ``MODEL.GRAPH_SHA256`` and ``weights`` (the resolved ``MODEL.WEIGHTS`` file, None for ``none``), compiled in
    ``MODEL.RUNTIME_PRECISION``; and the load report naming it."""
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
    graph = open_graph(str(m.GRAPH), digest, runtime=m.RUNTIME, precision=m.RUNTIME_PRECISION, sha256=m.GRAPH_SHA256)
    meta = graph.metadata  # the eager load's report, kept by the export
    source = f"minidet export of {meta.get('minidet.weights', '?')}, {meta.get('minidet.weights_format', '?')}"
    report = LoadReport(path=graph.path, format=source, loaded=int(meta.get("minidet.tensors", 0)))
    return ExportedNetwork(graph), report
