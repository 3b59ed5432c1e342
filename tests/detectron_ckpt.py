"""Synthetic Detectron (Caffe2) ``model_final.pkl`` files in the real format, for tests.

Blob names and shapes come from ``../shared/reference/detectron_*.blobs.txt`` (derived from
Detectron's source). The file is written the way Detectron's Python 2 ``cPickle`` wrote it:
protocol 2, ``numpy.core.multiarray._reconstruct`` globals and array payloads as py2 byte
strings (BINSTRING), so reading it needs ``encoding='latin1'``.
"""

from __future__ import annotations

import io
import os
import pickle
import struct

import numpy as np

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "reference")
CLASS_SPREAD = 3.0  # logit scale: scores spread over (0.05, 1)


def blob_list(variant: str) -> list[tuple[str, tuple[int, ...]]]:
    """[(name, shape)] of ``detectron_e2e_mask_rcnn_<variant>.blobs.txt`` (e.g. ``R-50-FPN_gn``)."""
    path = os.path.join(REFERENCE, f"detectron_e2e_mask_rcnn_{variant}.blobs.txt")
    out = []
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        name, shape = line.split()[:2]
        out.append((name, tuple(int(s) for s in shape.split("x"))))
    return out


def make_blobs(variant: str, seed: int = 0, num_groups: int = 1) -> dict[str, np.ndarray]:
    """Random but sane float32 blobs for every name of the variant.

    Convs and fcs are He-scaled; AffineChannel ``_bn_s`` is non-trivial (and small on the
    last conv of each residual branch, as in trained ResNets), ``_bn_b`` / ``_gn_b`` non-zero;
    the class logits are scaled so detections pass 0.05 with spread-out scores. With
    ``num_groups`` > 1 every ``branch2b`` conv is grouped (ResNeXt shapes).
    """
    rng = np.random.default_rng(seed)
    blobs = {}
    for name, shape in blob_list(variant):
        if num_groups > 1 and name.endswith("branch2b_w"):
            shape = (shape[0], shape[1] // num_groups, *shape[2:])
        if name.endswith(("_bn_s", "_gn_s")):
            low, high = (0.1, 0.3) if "branch2c" in name else (0.6, 1.2)
            v = rng.uniform(low, high, shape)
        elif name.endswith(("_bn_b", "_gn_b")):
            v = rng.normal(0.0, 0.1, shape)
        elif name.endswith("_w"):
            fan_in = int(np.prod(shape[1:])) if name != "conv5_mask_w" else shape[0] * 4
            v = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
            if name.startswith("fpn_") and not variant.endswith("_gn"):  # no norm after the FPN convs
                v *= 0.4
            if name == "conv1_w":  # Caffe2 models take 0-255 pixels: about 60x smaller weights
                v /= 60.0
            if name == "cls_score_w":  # zero-mean rows: no class wins on the mean of ReLU features
                v = (v - v.mean(axis=1, keepdims=True)) * CLASS_SPREAD
            if name.startswith("bbox_pred"):
                v *= 0.3
        else:  # conv / fc biases
            v = rng.normal(0.0, 0.05, shape)
        blobs[name] = v.astype(np.float32)
    return blobs


def add_real_file_extras(blobs: dict[str, np.ndarray], seed: int = 1) -> dict:
    """What real model-zoo files also carry: SGD momenta, preserved ImageNet blobs, None."""
    rng = np.random.default_rng(seed)
    out = dict(blobs)
    for name in ("res5_2_branch2c_w", "fc6_w", "cls_score_b", "conv_rpn_fpn2_w"):
        if name in blobs:
            out[name + "_momentum"] = rng.normal(0, 1e-3, blobs[name].shape).astype(np.float32)
    out["fc1000_w"] = rng.normal(0, 0.01, (1000, 2048)).astype(np.float32)
    out["fc1000_b"] = np.zeros(1000, np.float32)
    out["conv1_b"] = np.zeros(64, np.float32)
    out["res3_2_branch2a_b"] = np.zeros(128, np.float32)
    out["res3_0_branch1_b"] = np.zeros(512, np.float32)
    out["pred_b"] = None
    return out


class _Py2Pickler(pickle._Pickler):
    """Protocol 2 as Python 2 wrote it: str/bytes as BINSTRING, numpy.core globals."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_string(self, obj):
        data = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[str] = save_py2_string
    dispatch[bytes] = save_py2_string

    def save_global(self, obj, name=None):
        module = getattr(obj, "__module__", "")
        if module.startswith("numpy._core"):
            module = module.replace("numpy._core", "numpy.core")
        self.write(pickle.GLOBAL + f"{module}\n{name or obj.__qualname__}\n".encode("ascii"))
        self.memoize(obj)


def write_detectron_pkl(path: str, blobs: dict, cfg_yaml: str = "MODEL:\n  TYPE: generalized_rcnn\n") -> None:
    """``{'blobs': ..., 'cfg': ...}`` as a py2-style protocol-2 pickle."""
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump({"blobs": blobs, "cfg": cfg_yaml})
    with open(path, "wb") as f:
        f.write(buf.getvalue())
