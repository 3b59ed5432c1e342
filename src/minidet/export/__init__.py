"""Export to ONNX and the runtime that runs the export inside minidet.

- ``graph``: ``NetworkGraph``, the network of one image (backbone to mask probabilities) with the loaded model's
  modules and family rules, in operators ``torch.export`` follows through data-dependent sizes.
- ``ops``: ``minidet::batched_nms`` (torchvision's batched NMS in PyTorch, ONNX's ``NonMaxSuppression`` in the
  graph) and the float32 form of each family's NMS threshold rule.
- ``onnxfile``: ``export_onnx`` (model -> the bytes of ``model.onnx`` with minidet's metadata), ``open_graph`` (the
  file -> checked, opened by ONNX Runtime or OpenVINO), ``graph_inputs``.
- ``runtime``: ``ExportedNetwork``, what ``MaskRCNN`` runs in place of its own network under ``MODEL.RUNTIME
  onnxruntime`` or ``openvino`` (pre- and post-processing stay minidet's), and ``load_network``.

The parity gate of ``minidet export`` is a program's part (``minidet.apps.export.gate``). The engine imports
``runtime`` (and through it ``onnxfile``) only when ``MODEL.RUNTIME`` is not ``torch``; ``onnx``, ``onnxruntime``
and ``onnxscript`` are the optional extra ``minidet[export]``, ``openvino`` ``minidet[openvino]``.
"""

from __future__ import annotations

from ..errors import CheckpointError, RuntimeFailure


class ExportError(CheckpointError, RuntimeFailure):
    """An exported graph cannot be made or used (missing extra, a file that is not minidet's export, another
    minidet version, changed weights); ``str(err)`` is one line naming the file."""


def require(module: str, what: str, extra: str = "export"):
    """``import module`` for ``what``; a missing package is an ``ExportError`` naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ExportError(f"{what} needs the package {e.name or module} (the {extra} extra: pip install "
                          f"'minidet[{extra}]')") from None
