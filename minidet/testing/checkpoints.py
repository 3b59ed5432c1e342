"""Synthetic Detectron (Caffe2) ``model_final.pkl`` files in the real format, and detectron2 weights.

Detectron blob names and shapes come from ``../shared/reference/detectron_*.blobs.txt`` (derived
from Detectron's source; ``REFERENCE``, beside the repository). The file is written the way
Detectron's Python 2 ``cPickle`` wrote it: protocol 2, ``numpy.core.multiarray._reconstruct``
globals and array payloads as py2 byte strings (BINSTRING), so reading it needs
``encoding='latin1'``. detectron2's names and shapes (``d2_state_shapes``) follow its module tree.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import struct

import numpy as np

# ../shared/reference beside the repository (this file is minidet/testing/checkpoints.py)
REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "reference")
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


def d2_state_shapes(depth: int) -> dict[str, tuple]:
    """Names and shapes of detectron2's GeneralizedRCNN (R-FPN Mask R-CNN) state dict, from its
    module tree: backbone.bottom_up (ResNet: stem, res2..res5 with conv1..3, shortcut, FrozenBN
    `norm`), backbone.fpn_lateral/output{2..5}, proposal_generator.rpn_head (conv,
    objectness_logits, anchor_deltas), roi_heads.box_head (fc1, fc2), roi_heads.box_predictor
    (cls_score 81 with background last, bbox_pred 80 x 4), roi_heads.mask_head (mask_fcn1..4,
    deconv, predictor)."""
    out = {}

    def conv(name, cout, cin, k, norm=True, bias=False):
        out[f"{name}.weight"] = (cout, cin, k, k)
        if bias:
            out[f"{name}.bias"] = (cout,)
        if norm:
            for s in ("weight", "bias", "running_mean", "running_var"):
                out[f"{name}.norm.{s}"] = (cout,)

    conv("backbone.bottom_up.stem.conv1", 64, 3, 7)
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}[depth]
    cin, bott, cout = 64, 64, 256
    for stage, n in enumerate(blocks, start=2):
        for i in range(n):
            pre = f"backbone.bottom_up.res{stage}.{i}"
            if i == 0:
                conv(f"{pre}.shortcut", cout, cin, 1)
            conv(f"{pre}.conv1", bott, cin if i == 0 else cout, 1)
            conv(f"{pre}.conv2", bott, bott, 3)
            conv(f"{pre}.conv3", cout, bott, 1)
        cin, bott, cout = cout, bott * 2, cout * 2
    for lvl, c in zip(range(2, 6), (256, 512, 1024, 2048)):
        conv(f"backbone.fpn_lateral{lvl}", 256, c, 1, norm=False, bias=True)
        conv(f"backbone.fpn_output{lvl}", 256, 256, 3, norm=False, bias=True)
    conv("proposal_generator.rpn_head.conv", 256, 256, 3, norm=False, bias=True)
    conv("proposal_generator.rpn_head.objectness_logits", 3, 256, 1, norm=False, bias=True)
    conv("proposal_generator.rpn_head.anchor_deltas", 12, 256, 1, norm=False, bias=True)
    for name, shape in [
        ("box_head.fc1", (1024, 12544)),
        ("box_head.fc2", (1024, 1024)),
        ("box_predictor.cls_score", (81, 1024)),
        ("box_predictor.bbox_pred", (320, 1024)),
    ]:
        out[f"roi_heads.{name}.weight"], out[f"roi_heads.{name}.bias"] = shape, shape[:1]
    for j in range(1, 5):
        conv(f"roi_heads.mask_head.mask_fcn{j}", 256, 256, 3, norm=False, bias=True)
    out["roi_heads.mask_head.deconv.weight"], out["roi_heads.mask_head.deconv.bias"] = (256, 256, 2, 2), (256,)
    conv("roi_heads.mask_head.predictor", 80, 256, 1, norm=False, bias=True)
    return out


def d2_weights(depth: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random but sane values; non-trivial frozen-BN statistics."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in d2_state_shapes(depth).items():
        if name.endswith("norm.weight"):
            v = rng.uniform(0.1, 0.3, shape) if ".conv3." in name else rng.uniform(0.6, 1.2, shape)
        elif name.endswith(("norm.bias", "running_mean")):
            v = rng.normal(0, 0.1, shape)
        elif name.endswith("running_var"):
            v = rng.uniform(0.5, 2.0, shape)
        elif name.endswith("weight"):
            fan_in = int(np.prod(shape[1:])) if "deconv" not in name else shape[0] * 4
            v = rng.normal(0, math.sqrt(2.0 / fan_in), shape)
            if "stem" in name:
                v /= 60.0  # 0-255 pixels
            if "fpn_" in name:
                v *= 0.4
            if "cls_score" in name:
                v = (v - v.mean(axis=1, keepdims=True)) * 3.0
            if "bbox_pred" in name:
                v *= 0.3
        else:
            v = rng.normal(0, 0.05, shape)
        out[name] = v.astype(np.float32)
    return out
