"""Synthetic mmdetection Mask R-CNN checkpoints in the real format: ``{"meta": {...}, "state_dict": {...}}`` as
mmdetection's ``publish_model.py`` keeps it, written by ``torch.save`` in the pre-zip format as the model-zoo files
were. Names and shapes follow mmdetection's module tree (``mmdet_state_shapes``); the values are realistic random
weights (``checkpoints._sane_value``) with non-trivial batch-norm statistics, or caffe-style ones.
"""

from __future__ import annotations

import re

import numpy as np

from ..bodies import regnet_body, resnet_body
from ..categories import COCO_CATEGORIES
from .checkpoints import _sane_value

COCO_CLASSES = tuple(name for _, name in COCO_CATEGORIES)
# mmdetection's RegNet ``arch`` names -> ``regnet_body``'s parameters (the RegNetX models of Radosavovic et al. 2020,
# bottleneck ratio 1, as its ``RegNet.arch_settings`` gives them; its stem is 32 wide)
MMDET_REGNETS = {
    "regnetx_400mf": {"depth": 22, "w_a": 24.48, "w_0": 24, "w_m": 2.54, "group_width": 16},
    "regnetx_800mf": {"depth": 16, "w_a": 35.73, "w_0": 56, "w_m": 2.28, "group_width": 16},
    "regnetx_1.6gf": {"depth": 18, "w_a": 34.01, "w_0": 80, "w_m": 2.25, "group_width": 24},
    "regnetx_3.2gf": {"depth": 25, "w_a": 26.31, "w_0": 88, "w_m": 2.25, "group_width": 48},
    "regnetx_4.0gf": {"depth": 23, "w_a": 38.65, "w_0": 96, "w_m": 2.43, "group_width": 40},
    "regnetx_6.4gf": {"depth": 17, "w_a": 60.83, "w_0": 184, "w_m": 2.07, "group_width": 56},
    "regnetx_8.0gf": {"depth": 23, "w_a": 49.56, "w_0": 80, "w_m": 2.88, "group_width": 120},
    "regnetx_12gf": {"depth": 19, "w_a": 73.36, "w_0": 168, "w_m": 2.37, "group_width": 112},
}


def mmdet_state_shapes(depth: int = 50, groups: int = 1, base_width: int = 4, num_classes: int = 80, norm: str = "bn",
                       neck_norm: str | None = None, head_norm: str | None = None, box_convs: int = 0,
                       rpn_convs: int = 1, stages: int = 0, dcn: str = "", arch: str = "", context: float = 0.0,
                       context_stages: tuple[bool, ...] = (False, True, True, True), mask_iou: bool = False) -> dict:
    """Names and shapes of mmdetection's ``MaskRCNN`` state dict (R-50/101, or ResNeXt with ``groups`` > 1), from its
    module tree: ``backbone`` (``ResNet``/``ResNeXt``: ``conv1``, ``bn1``, ``layer1..4`` of ``Bottleneck``s with
    ``conv1..3``, ``bn1..3``, ``downsample`` = (conv, BN); BN with ``num_batches_tracked``; a ResNeXt block is
    ``floor(planes * base_width / 64) * groups`` wide), ``neck`` (``FPN``: ``lateral_convs.i`` and ``fpn_convs.i``,
    ``ConvModule``s holding ``.conv``), ``rpn_head`` (``rpn_conv``, ``rpn_cls`` of 3 sigmoid scores, ``rpn_reg``),
    ``roi_head.bbox_head`` (``Shared2FCBBoxHead``: ``shared_fcs.0/1``, ``fc_cls`` with the background last,
    ``fc_reg`` class-specific without it), ``roi_head.mask_head`` (``FCNMaskHead``: ``convs.i.conv``, ``upsample``
    (a ConvTranspose2d), ``conv_logits``). ``norm``: the backbone's norms, ``bn`` (BatchNorm or SyncBN) or ``gn``
    (GroupNorm: ``gn1``..., weight and bias only); ``neck_norm``/``head_norm``: a norm in each ConvModule of the FPN /
    of the box and mask heads (``.bn`` or ``.gn``, the conv then bias-free); ``box_convs``: 4 for
    ``Shared4Conv1FCBBoxHead`` (``shared_convs.i`` ConvModules, one fc); ``rpn_convs`` > 1: ``rpn_conv.i``
    ConvModules; ``stages``: a ``CascadeRoIHead`` of that many stages (``bbox_head.k``, class-agnostic ``fc_reg``,
    and ``mask_head.k``); ``dcn``: ``DCN`` or ``DCNv2`` in layer2..4 (each ``conv2`` an mmcv ``DeformConv2dPack`` /
    ``ModulatedDeformConv2dPack`` holding its ``conv_offset``, 18 or 27 outputs, its own input not grouped); ``arch``:
    a ``RegNet`` body of that name (``MMDET_REGNETS``: ResNet's module tree, a 3x3 stem of 32, each block's convs
    as wide as its output, grouped by the group width; ``depth``, ``groups``, ``base_width`` unused); ``context``:
    mmcv's ``ContextBlock`` of this ratio after conv3 of the blocks of the ``context_stages`` (``context_block``:
    ``conv_mask`` to one channel, ``channel_add_conv`` = conv to ``int(C x ratio)``, LayerNorm over (planes, 1, 1),
    ReLU, conv back); ``mask_iou``: Mask Scoring R-CNN's ``roi_head.mask_iou_head`` (``MaskIoUHead``: ``convs.0..3``
    3x3 on the RoI features plus the pooled mask, ``fcs.0/1``, ``fc_mask_iou`` of one IoU per class)."""
    out: dict[str, tuple] = {}

    def conv(name: str, cout: int, cin: int, k: int, bias: bool = True, g: int = 1) -> None:
        out[f"{name}.weight"] = (cout, cin // g, k, k)
        if bias:
            out[f"{name}.bias"] = (cout,)

    def bn(name: str, c: int, kind: str = norm) -> None:  # name: where a BatchNorm is (bn1, downsample.1, .bn)
        if kind == "gn":
            name = re.sub(r"(^|\.)bn(\d?)$", r"\1gn\2", name)
            out[f"{name}.weight"], out[f"{name}.bias"] = (c,), (c,)
            return
        for s in ("weight", "bias", "running_mean", "running_var"):
            out[f"{name}.{s}"] = (c,)
        out[f"{name}.num_batches_tracked"] = ()

    def module(name: str, cout: int, cin: int, k: int, kind: str | None) -> None:  # a ConvModule
        conv(f"{name}.conv", cout, cin, k, bias=kind is None)
        if kind is not None:
            bn(f"{name}.bn", cout, kind)

    body = regnet_body(**MMDET_REGNETS[arch]) if arch else resnet_body(depth, groups, base_width if groups > 1 else 64)
    conv("backbone.conv1", body.stem_channels, 3, body.stem_kernel, bias=False)
    bn("backbone.bn1", body.stem_channels)
    cin = body.stem_channels
    for stage, st in enumerate(body.stages):
        width, g = st.width, st.groups
        for i in range(st.blocks):
            pre = f"backbone.layer{stage + 1}.{i}"
            conv(f"{pre}.conv1", width, cin, 1, bias=False)
            bn(f"{pre}.bn1", width)
            conv(f"{pre}.conv2", width, width, 3, bias=False, g=g)
            if dcn and stage > 0:
                conv(f"{pre}.conv2.conv_offset", {"DCN": 18, "DCNv2": 27}[dcn], width, 3)
            bn(f"{pre}.bn2", width)
            conv(f"{pre}.conv3", st.out, width, 1, bias=False)
            bn(f"{pre}.bn3", st.out)
            if context and context_stages[stage]:
                gc, planes = f"{pre}.context_block", int(st.out * context)
                conv(f"{gc}.conv_mask", 1, st.out, 1)
                conv(f"{gc}.channel_add_conv.0", planes, st.out, 1)
                out[f"{gc}.channel_add_conv.1.weight"] = out[f"{gc}.channel_add_conv.1.bias"] = (planes, 1, 1)
                conv(f"{gc}.channel_add_conv.3", st.out, planes, 1)
            if i == 0:
                conv(f"{pre}.downsample.0", st.out, cin, 1, bias=False)
                bn(f"{pre}.downsample.1", st.out)
            cin = st.out
    for i, c in enumerate(body.out_channels):
        module(f"neck.lateral_convs.{i}", 256, c, 1, neck_norm)
        module(f"neck.fpn_convs.{i}", 256, 256, 3, neck_norm)
    if rpn_convs == 1:
        conv("rpn_head.rpn_conv", 256, 256, 3)
    for i in range(rpn_convs if rpn_convs > 1 else 0):
        module(f"rpn_head.rpn_conv.{i}", 256, 256, 3, None)
    conv("rpn_head.rpn_cls", 3, 256, 1)
    conv("rpn_head.rpn_reg", 12, 256, 1)
    for k in [f".{k}" for k in range(stages)] or [""]:
        bh, mh = f"roi_head.bbox_head{k}", f"roi_head.mask_head{k}"
        for i in range(box_convs):
            module(f"{bh}.shared_convs.{i}", 256, 256, 3, head_norm)
        fcs = [(f"{bh}.shared_fcs.0", (1024, 256 * 49))] + ([(f"{bh}.shared_fcs.1", (1024, 1024))] * (not box_convs))
        deltas = 4 if stages else 4 * num_classes
        for name, shape in (*fcs, (f"{bh}.fc_cls", (num_classes + 1, 1024)), (f"{bh}.fc_reg", (deltas, 1024))):
            out[f"{name}.weight"], out[f"{name}.bias"] = shape, shape[:1]
        for i in range(4):
            module(f"{mh}.convs.{i}", 256, 256, 3, head_norm)
        out[f"{mh}.upsample.weight"], out[f"{mh}.upsample.bias"] = (256, 256, 2, 2), (256,)
        conv(f"{mh}.conv_logits", num_classes, 256, 1)
    if mask_iou:
        for i in range(4):  # the first takes the RoI features and the pooled mask
            conv(f"roi_head.mask_iou_head.convs.{i}", 256, 257 if i == 0 else 256, 3)
        fcs = [(f"fcs.{i}", (1024, d_in)) for i, d_in in enumerate((256 * 49, 1024))] + [
            ("fc_mask_iou", (num_classes, 1024))]
        for name, shape in fcs:
            out[f"roi_head.mask_iou_head.{name}.weight"], out[f"roi_head.mask_iou_head.{name}.bias"] = shape, shape[:1]
    return out


# weights scaled from He's: a GC block's attention logits (conv_mask) and channel-add term (its last conv), a mask IoU
# head's IoU outputs
_GAINS = {"context_block.conv_mask": 4.0, "channel_add_conv.3": 0.3, "fc_mask_iou": 0.1}


def mmdet_weights(shapes: dict[str, tuple], seed: int = 0, caffe: bool = False) -> dict:
    """Realistic random float32 tensors for ``mmdet_state_shapes``: He-scaled convs and fcs, non-trivial batch-norm
    statistics (small scale on each block's last norm), class logits spread so that detections pass 0.05. With
    ``caffe``: the backbone's norms have running mean 0 and variance 1 (as mmdetection converts Caffe2 weights, and
    its caffe-style configs keep them) and its stem takes 0-255 BGR pixels. A GC block's attention logits are spread
    (sharply weighted context, not a plain mean) and its channel-add term is of the size of the block's residual
    branch; its LayerNorm has a norm's values. A mask IoU head predicts IoUs spread over about (0.3, 1)."""
    import torch

    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        module, _, leaf = name.rpartition(".")
        if leaf == "num_batches_tracked":
            out[name] = torch.tensor(0, dtype=torch.int64)
            continue
        # a norm's weight is 1-D, a conv's or fc's not; a GC block's LayerNorm's is (planes, 1, 1)
        norm = len(shapes.get(f"{module}.weight", (0, 0))) == 1 or module.endswith("channel_add_conv.1")
        role = ("norm." + leaf if leaf in ("weight", "bias") else leaf) if norm else leaf
        hint = name.replace("fc_cls", "cls_score").replace("fc_reg", "bbox_pred")  # the roles _sane_value knows
        fan_in = int(np.prod(shape[1:])) if "upsample" not in name else shape[0] * 4
        last = module.endswith(("bn3", "gn3"))  # a residual branch's last norm
        v = _sane_value(rng, hint, shape, role, small_norm=bool(norm and last), fan_in=fan_in,
                        stem=caffe and name == "backbone.conv1.weight", damp=name.startswith("neck."), spread=3.0)
        if caffe and norm and name.startswith("backbone.") and leaf in ("running_mean", "running_var"):
            v = np.full(shape, 1.0 if leaf == "running_var" else 0.0)
        if leaf == "weight" and module.endswith(tuple(_GAINS)):
            v = v * _GAINS[next(k for k in _GAINS if module.endswith(k))]
        if name.endswith("fc_mask_iou.bias"):  # a trained head's IoUs: about 0.65 +- 0.15
            v = rng.uniform(0.55, 0.75, shape)
        out[name] = torch.from_numpy(np.asarray(v, dtype=np.float32))
    return out


def mmdet_meta(version: str = "3.3.0", classes: tuple[str, ...] = COCO_CLASSES, style: str = "pytorch") -> dict:
    """A ``meta`` entry as mmdetection writes it: 3.x (mmengine's runner) names the classes in ``dataset_meta``
    and keeps the config text under ``cfg``; 2.x under ``CLASSES`` and ``config``."""
    text = f"model = dict(type='MaskRCNN', backbone=dict(type='ResNet', depth=50, style='{style}'))\n"
    if version.startswith("2."):
        return {"mmdet_version": version, "CLASSES": tuple(classes), "config": text, "epoch": 12, "iter": 87960}
    palette = [(i % 256, (7 * i) % 256, (13 * i) % 256) for i in range(len(classes))]
    return {"dataset_meta": {"classes": tuple(classes), "palette": palette}, "cfg": text, "epoch": 12, "iter": 87960,
            "mmengine_version": "0.10.4", "seed": 0, "experiment_name": "mask-rcnn_r50_fpn_1x_coco"}


def write_mmdet_checkpoint(path, state: dict, meta: dict | None = None, extra: dict | None = None) -> None:
    """``{"meta": meta, "state_dict": state, **extra}`` saved as ``publish_model.py`` saves it (PyTorch's pre-zip
    format); ``meta`` defaults to ``mmdet_meta()``, ``extra`` is what a training checkpoint adds (``optimizer``,
    ``message_hub``, ...)."""
    import torch

    data = {"meta": mmdet_meta() if meta is None else meta, "state_dict": dict(state), **(extra or {})}
    torch.save(data, path, _use_new_zipfile_serialization=False)
