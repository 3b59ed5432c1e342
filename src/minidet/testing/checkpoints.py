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

from ..bodies import regnet_body, resnet_body

# ../shared/reference beside the repository (this file is src/minidet/testing/checkpoints.py)
REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 4, "shared", "reference")
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


def d2_state_shapes(depth: int, groups: int = 1, width: int = 64, norm: str = "bn", fpn_norm: bool = False,
                    head_norm: bool = False, box_convs: int = 0, rpn_convs: int = 1, num_classes: int = 80,
                    counters: bool = False, stages: int = 0, deform: bool = False,
                    regnet: dict | None = None) -> dict[str, tuple]:
    """Names and shapes of detectron2's GeneralizedRCNN (R-FPN Mask R-CNN) state dict, from its
    module tree: backbone.bottom_up (ResNet: stem, res2..res5 with conv1..3, shortcut, each conv's
    `norm`), backbone.fpn_lateral/output{2..5}, proposal_generator.rpn_head (conv,
    objectness_logits, anchor_deltas), roi_heads.box_head (fc1, fc2), roi_heads.box_predictor
    (cls_score K + 1 with background last, bbox_pred K x 4), roi_heads.mask_head (mask_fcn1..4,
    deconv, predictor). ``groups`` x ``width``: a ResNeXt's grouped 3x3 convs (res2's bottleneck width, doubling
    per stage, as detectron2's NUM_GROUPS and WIDTH_PER_GROUP build them). ``norm``: ``bn`` (frozen BN, SyncBN:
    weight, bias and running statistics) or ``gn`` (GroupNorm: weight and bias), in the ResNet and, with
    ``fpn_norm`` / ``head_norm``, after the FPN's convs / the heads' convs (which then have no bias);
    ``box_convs``: the box head's 3x3 convs (``conv1``..; one fc then); ``rpn_convs`` > 1: the RPN head's
    ``conv.conv0``, ``conv.conv1``...; ``num_classes``: K; ``counters``: each batch norm's ``num_batches_tracked``
    (trained BatchNorm / SyncBN layers have one; FrozenBatchNorm2d has none); ``stages``: ``CascadeROIHeads`` of
    that many stages (``box_head.k``, ``box_predictor.k`` with class-agnostic ``bbox_pred``; one mask head);
    ``deform``: ``DeformBottleneckBlock`` (v1) in res3..res5, each ``conv2_offset`` beside its ``conv2``; ``regnet``:
    a ``RegNet`` body in place of the ResNet (``regnet_body``'s parameters; ``depth``, ``groups``, ``width`` unused),
    pycls's module tree: ``stem.conv`` / ``stem.bn``, stage ``sN``'s blocks ``bK`` (from 1) of ``f.a``, ``f.b``
    (grouped), ``f.c`` with their ``f.a_bn``..., RegNetY's ``f.se.f_ex.0`` / ``.2`` (1x1 convs with bias), the first
    block's ``proj`` + ``bn`` shortcut; its convs bias-free."""
    out = {}

    def conv(name, cout, cin, k, norm=True, bias=False, groups=1):
        out[f"{name}.weight"] = (cout, cin // groups, k, k)
        if bias:
            out[f"{name}.bias"] = (cout,)
        if norm:
            for s in ("weight", "bias") if norm_kind == "gn" else ("weight", "bias", "running_mean", "running_var"):
                out[f"{name}.norm.{s}"] = (cout,)
            if counters and norm_kind != "gn":
                out[f"{name}.norm.num_batches_tracked"] = ()

    def bn(name, c):  # a RegNet's norm beside its conv
        for s in ("weight", "bias") if norm_kind == "gn" else ("weight", "bias", "running_mean", "running_var"):
            out[f"{name}.{s}"] = (c,)
        if counters and norm_kind != "gn":
            out[f"{name}.num_batches_tracked"] = ()

    norm_kind = norm
    if regnet is not None:
        body = regnet_body(**regnet)
        conv("backbone.bottom_up.stem.conv", body.stem_channels, 3, 3, norm=False)
        bn("backbone.bottom_up.stem.bn", body.stem_channels)
        cin = body.stem_channels
        for stage, st in enumerate(body.stages, start=1):
            for i in range(st.blocks):
                pre = f"backbone.bottom_up.s{stage}.b{i + 1}"
                if i == 0:
                    conv(f"{pre}.proj", st.out, cin, 1, norm=False)
                    bn(f"{pre}.bn", st.out)
                conv(f"{pre}.f.a", st.width, cin, 1, norm=False)
                bn(f"{pre}.f.a_bn", st.width)
                conv(f"{pre}.f.b", st.width, st.width, 3, norm=False, groups=st.groups)
                bn(f"{pre}.f.b_bn", st.width)
                if st.se:
                    conv(f"{pre}.f.se.f_ex.0", st.se[i], st.width, 1, norm=False, bias=True)
                    conv(f"{pre}.f.se.f_ex.2", st.width, st.se[i], 1, norm=False, bias=True)
                conv(f"{pre}.f.c", st.out, st.width, 1, norm=False)
                bn(f"{pre}.f.c_bn", st.out)
                cin = st.out
        outs = body.out_channels
    else:
        conv("backbone.bottom_up.stem.conv1", 64, 3, 7)
        body, cin = resnet_body(depth, groups, width), 64
        for stage, st in enumerate(body.stages, start=2):
            for i in range(st.blocks):
                pre = f"backbone.bottom_up.res{stage}.{i}"
                if i == 0:
                    conv(f"{pre}.shortcut", st.out, cin, 1)
                conv(f"{pre}.conv1", st.width, cin if i == 0 else st.out, 1)
                conv(f"{pre}.conv2", st.width, st.width, 3, groups=groups)
                if deform and stage > 2:
                    conv(f"{pre}.conv2_offset", 18, st.width, 3, norm=False, bias=True)
                conv(f"{pre}.conv3", st.out, st.width, 1)
            cin = st.out
        outs = body.out_channels
    for lvl, c in zip(range(2, 6), outs):
        conv(f"backbone.fpn_lateral{lvl}", 256, c, 1, norm=fpn_norm, bias=not fpn_norm)
        conv(f"backbone.fpn_output{lvl}", 256, 256, 3, norm=fpn_norm, bias=not fpn_norm)
    for j in range(rpn_convs):
        conv(f"proposal_generator.rpn_head.conv{f'.conv{j}' if rpn_convs > 1 else ''}", 256, 256, 3, norm=False,
             bias=True)
    conv("proposal_generator.rpn_head.objectness_logits", 3, 256, 1, norm=False, bias=True)
    conv("proposal_generator.rpn_head.anchor_deltas", 12, 256, 1, norm=False, bias=True)
    for k in [f".{k}" for k in range(stages)] or [""]:
        for j in range(1, box_convs + 1):
            conv(f"roi_heads.box_head{k}.conv{j}", 256, 256, 3, norm=head_norm, bias=not head_norm)
        fcs = [(f"box_head{k}.fc1", (1024, 12544))] + ([] if box_convs else [(f"box_head{k}.fc2", (1024, 1024))])
        for name, shape in [
            *fcs,
            (f"box_predictor{k}.cls_score", (num_classes + 1, 1024)),
            (f"box_predictor{k}.bbox_pred", (4 if stages else 4 * num_classes, 1024)),
        ]:
            out[f"roi_heads.{name}.weight"], out[f"roi_heads.{name}.bias"] = shape, shape[:1]
    for j in range(1, 5):
        conv(f"roi_heads.mask_head.mask_fcn{j}", 256, 256, 3, norm=head_norm, bias=not head_norm)
    out["roi_heads.mask_head.deconv.weight"], out["roi_heads.mask_head.deconv.bias"] = (256, 256, 2, 2), (256,)
    conv("roi_heads.mask_head.predictor", num_classes, 256, 1, norm=False, bias=True)
    return out


def d2_weights(depth: int, seed: int = 0, groups: int = 1, width: int = 64, **layout) -> dict[str, np.ndarray]:
    """Random but sane values; non-trivial norm statistics (``groups`` x ``width`` and ``layout``:
    ``d2_state_shapes``)."""
    return d2_random_weights(d2_state_shapes(depth, groups, width, **layout), seed)


def d2_random_weights(shapes: dict[str, tuple], seed: int = 0, normalized_input: bool = False,
                      spread: float = 3.0) -> dict[str, np.ndarray]:
    """``d2_weights``'s values for any detectron2 module tree's names and ``shapes`` (a cascade's per-stage heads
    ``box_head.<k>.``, a deformable block's ``conv2_offset``: He-scaled, offsets of about a pixel; a RegNet's norms
    ``*bn``, small on each block's last, ``f.c_bn``; RegNetY's SE convs He-scaled, their gates spread over (0, 1)).
    ``normalized_input``: the stem takes pixels divided by their standard deviation (the RegNet baselines'), its
    weights not scaled down for 0-255 pixels. ``spread``: the class logits' scale (a box head whose convs are
    normalized with random statistics gives features of about a fifth of a plain one's: a wider spread keeps its
    scores over 0.05)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("num_batches_tracked"):
            out[name] = np.array(0, dtype=np.int64)
            continue
        module, _, leaf = name.rpartition(".")
        norm = len(shapes.get(f"{module}.weight", (0, 0))) == 1  # a norm's weight is 1-D, a conv's or fc's not
        role = ("norm." + leaf if leaf in ("weight", "bias") else leaf) if norm else leaf
        fan_in = int(np.prod(shape[1:])) if "deconv" not in name else shape[0] * 4
        v = _sane_value(rng, name, shape, role, small_norm=".conv3." in name or ".f.c_bn." in name, fan_in=fan_in,
                        stem="stem" in name and not normalized_input, damp="fpn_" in name, spread=spread)
        out[name] = v.astype(np.float32)
    return out


def _sane_value(rng, name: str, shape: tuple, role: str, *, small_norm: bool, fan_in: int, stem: bool, damp: bool,
                spread: float = CLASS_SPREAD) -> np.ndarray:
    """One tensor of realistic random weights by its ``role``: a norm's ``norm.weight`` (small on a residual
    branch's last norm), ``norm.bias`` / ``running_mean``, ``running_var``, a conv/fc ``weight`` (He-scaled by
    ``fan_in``; 60x smaller on the stem, which takes 0-255 pixels; ``damp``ed where no norm follows; zero-mean
    class-logit rows spread by ``spread``; small box deltas) or a ``bias``."""
    if role == "norm.weight":
        return rng.uniform(0.1, 0.3, shape) if small_norm else rng.uniform(0.6, 1.2, shape)
    if role in ("norm.bias", "running_mean"):
        return rng.normal(0, 0.1, shape)
    if role == "running_var":
        return rng.uniform(0.5, 2.0, shape)
    if role != "weight":
        return rng.normal(0, 0.05, shape)
    v = rng.normal(0, math.sqrt(2.0 / fan_in), shape)
    if stem:
        v /= 60.0
    if damp:
        v *= 0.4
    if "cls_score" in name:
        v = (v - v.mean(axis=1, keepdims=True)) * spread
    if "bbox_pred" in name:
        v *= 0.3
    return v


def mb_cell_anchors(stride: int, size: float, aspect_ratios=(0.5, 1.0, 2.0)) -> np.ndarray:
    """maskrcnn-benchmark's ``generate_anchors`` (a port of Detectron's), restated: (A, 4) float32."""
    base = np.array([0.0, 0.0, stride - 1.0, stride - 1.0])
    w, h = base[2] - base[0] + 1, base[3] - base[1] + 1
    cx, cy = base[0] + 0.5 * (w - 1), base[1] + 0.5 * (h - 1)
    ratios = np.array(aspect_ratios, dtype=np.float64)
    ws = np.round(np.sqrt(w * h / ratios))
    hs = np.round(ws * ratios)
    rows = []
    for wr, hr in zip(ws, hs):  # each ratio anchor keeps the base box's centre
        sw, sh = wr * (size / stride), hr * (size / stride)
        rows.append([cx - 0.5 * (sw - 1), cy - 0.5 * (sh - 1), cx + 0.5 * (sw - 1), cy + 0.5 * (sh - 1)])
    return np.array(rows, dtype=np.float32)


def mb_state_shapes(
    depth: int = 50, num_groups: int = 1, width_per_group: int = 64, gn: bool = False, box_head: str = "2fc"
) -> dict[str, tuple]:
    """Names and shapes of maskrcnn-benchmark's GeneralizedRCNN (R-FPN Mask R-CNN) state dict, from
    its module tree: backbone.body (ResNet: stem.conv1/bn1, layer1..4 with conv1..3, bn1..3,
    downsample.0/1), backbone.fpn (fpn_inner1..4, fpn_layer1..4), rpn.anchor_generator.cell_anchors,
    rpn.head (conv, cls_logits, bbox_pred), roi_heads.box (feature_extractor fc6/fc7, or xconvs + fc6
    for ``box_head="xconv1fc"``; predictor cls_score 81, bbox_pred 81 x 4), roi_heads.mask
    (feature_extractor mask_fcn1..4, predictor conv5_mask, mask_fcn_logits).

    ``gn``: the GroupNorm baselines: ``bn*`` are GroupNorm (weight, bias), the convs before a GN
    have no bias, and a conv (or fc) followed by GN becomes a Sequential (``.0`` conv, ``.1`` GN).
    """
    out: dict[str, tuple] = {}
    norm_keys = ("weight", "bias") if gn else ("weight", "bias", "running_mean", "running_var")

    def norm(name, c):
        for k in norm_keys:
            out[f"{name}.{k}"] = (c,)

    def conv(name, cout, cin, k, bias=True, groups=1):
        out[f"{name}.weight"] = (cout, cin // groups, k, k)
        if bias:
            out[f"{name}.bias"] = (cout,)

    def conv_gn(name, cout, cin, k):  # conv_with_kaiming_uniform / make_conv3x3 with and without GN
        if gn:
            conv(f"{name}.0", cout, cin, k, bias=False)
            norm(f"{name}.1", cout)
        else:
            conv(name, cout, cin, k)

    body = "backbone.body"
    conv(f"{body}.stem.conv1", 64, 3, 7, bias=False)
    norm(f"{body}.stem.bn1", 64)
    cin = 64
    for stage, st in enumerate(resnet_body(depth, num_groups, width_per_group).stages, start=1):
        for i in range(st.blocks):
            pre = f"{body}.layer{stage}.{i}"
            if i == 0:
                conv(f"{pre}.downsample.0", st.out, cin, 1, bias=False)
                norm(f"{pre}.downsample.1", st.out)
            conv(f"{pre}.conv1", st.width, cin if i == 0 else st.out, 1, bias=False)
            norm(f"{pre}.bn1", st.width)
            conv(f"{pre}.conv2", st.width, st.width, 3, bias=False, groups=num_groups)
            norm(f"{pre}.bn2", st.width)
            conv(f"{pre}.conv3", st.out, st.width, 1, bias=False)
            norm(f"{pre}.bn3", st.out)
        cin = st.out
    for j, c in enumerate((256, 512, 1024, 2048), start=1):
        conv_gn(f"backbone.fpn.fpn_inner{j}", 256, c, 1)
        conv_gn(f"backbone.fpn.fpn_layer{j}", 256, 256, 3)
    for j in range(5):
        out[f"rpn.anchor_generator.cell_anchors.{j}"] = (3, 4)
    conv("rpn.head.conv", 256, 256, 3)
    conv("rpn.head.cls_logits", 3, 256, 1)
    conv("rpn.head.bbox_pred", 12, 256, 1)
    fx = "roi_heads.box.feature_extractor"
    if box_head == "xconv1fc":
        for j in range(4):
            idx = 3 * j if gn else 2 * j
            conv(f"{fx}.xconvs.{idx}", 256, 256, 3, bias=not gn)
            if gn:
                norm(f"{fx}.xconvs.{idx + 1}", 256)
        out[f"{fx}.fc6.weight"], out[f"{fx}.fc6.bias"] = (1024, 256 * 49), (1024,)
    else:
        for name, d_in in (("fc6", 256 * 49), ("fc7", 1024)):
            if gn:  # make_fc with GN: bias-free Linear, then GroupNorm
                out[f"{fx}.{name}.0.weight"] = (1024, d_in)
                norm(f"{fx}.{name}.1", 1024)
            else:
                out[f"{fx}.{name}.weight"], out[f"{fx}.{name}.bias"] = (1024, d_in), (1024,)
    pr = "roi_heads.box.predictor"
    out[f"{pr}.cls_score.weight"], out[f"{pr}.cls_score.bias"] = (81, 1024), (81,)
    out[f"{pr}.bbox_pred.weight"], out[f"{pr}.bbox_pred.bias"] = (324, 1024), (324,)
    for j in range(1, 5):
        conv_gn(f"roi_heads.mask.feature_extractor.mask_fcn{j}", 256, 256, 3)
    out["roi_heads.mask.predictor.conv5_mask.weight"] = (256, 256, 2, 2)  # ConvTranspose2d: (in, out, k, k)
    out["roi_heads.mask.predictor.conv5_mask.bias"] = (256,)
    conv("roi_heads.mask.predictor.mask_fcn_logits", 81, 256, 1)
    return out


def mb_weights(shapes: dict[str, tuple], seed: int = 0) -> dict:
    """Random but sane float32 tensors for ``mb_state_shapes``: He-scaled convs and fcs, non-trivial
    frozen-BN statistics (small scale on each residual branch's last norm), maskrcnn-benchmark's own
    cell anchors, class logits spread so detections pass 0.05."""
    import torch

    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if ".cell_anchors." in name:
            j = int(name.rsplit(".", 1)[1])
            v = mb_cell_anchors(4 * 2**j, 32 * 2**j)
        else:
            norm = _is_mb_norm(name, shapes)
            last = name.rsplit(".", 1)[1]
            role = ("norm." + last if last in ("weight", "bias") else last) if norm else last
            fan_in = int(np.prod(shape[1:])) if "conv5_mask" not in name else shape[0] * 4
            damp = ".fpn." in name and not name.endswith(".0.weight")  # no norm after the FPN conv
            v = _sane_value(rng, name, shape, role, small_norm=name.endswith("bn3.weight"), fan_in=fan_in,
                            stem=".stem." in name, damp=damp)
        out[name] = torch.from_numpy(np.asarray(v, dtype=np.float32))
    return out


def _is_mb_norm(name: str, shapes: dict) -> bool:
    """A norm's tensor: it is 1-D and its module has no 4-D / 2-D weight (a conv's or fc's bias is
    1-D too, but its module's weight is not)."""
    module = name.rsplit(".", 1)[0]
    return len(shapes.get(f"{module}.weight", (0, 0))) == 1


def write_mb_checkpoint(
    path: str, model: dict, *, prefix: str = "module.", trainer_state: bool = True, legacy_format: bool = True
) -> None:
    """A training checkpoint as maskrcnn-benchmark's (and MLPerf's) ``Checkpointer.save`` writes it:
    ``{"model": state_dict, "optimizer": SGD state, "scheduler": WarmupMultiStepLR state, "iteration"}``,
    keys with ``prefix`` (``module.`` from DistributedDataParallel); ``legacy_format``: PyTorch 1.0's
    pre-zip serialization, as the model-zoo files were written."""
    from collections import OrderedDict

    import torch

    state = OrderedDict((prefix + k, v) for k, v in model.items())
    data: dict = {"model": state}
    if trainer_state:
        params = [k for k in model if ".cell_anchors." not in k and "running_" not in k]
        data["optimizer"] = {
            "state": {i: {"momentum_buffer": torch.zeros_like(model[k])} for i, k in enumerate(params[:3])},
            "param_groups": [
                {"lr": 0.0002, "momentum": 0.9, "dampening": 0, "weight_decay": 0.0001, "nesterov": False,
                 "params": list(range(len(params)))}
            ],
        }
        data["scheduler"] = {"milestones": [60000, 80000], "gamma": 0.1, "warmup_factor": 0.3333333333333333,
                             "warmup_iters": 500, "warmup_method": "linear", "base_lrs": [0.02], "last_epoch": 90000}
        data["iteration"] = 90000
    torch.save(data, path, _use_new_zipfile_serialization=not legacy_format)
