"""Export (``minidet export``, ``MODEL.RUNTIME onnxruntime``): the graph's arithmetic, ONNX's operators, the
parity gate on every set of operators, and the one-line refusals.

Fast: ``NetworkGraph`` run by PyTorch gives the eager network's bits on every family (FrozenBN and folded, two
image sizes), with the reference RoIAlign path (``MODEL.ROI_ALIGN_IMPL torchvision``, the one the graph's
operator reproduces); ONNX Runtime's ``NonMaxSuppression`` and ``RoiAlign`` against torchvision's kernels;
refused files. Slow: exported and run by ONNX Runtime and OpenVINO, judged by the parity gate, once per set of
operators (``GATE_GROUPS``: a family per set, the sets checked by ``torch.export``); a wrong export failing it;
the program and the runtime in ``Predictor``, ``minidet infer`` and ``minidet eval``.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import minidet
from helpers import FEWER, ROOT, call_tool, config, images_bgr, load_tool, needs_extra, one_error_line
from minidet import runtimes
from minidet.apps.bench.reference import build_tv, legacy_v1_state_dict
from minidet.apps.synthetic import random_minidet_weights
from minidet.testing.checkpoints import (
    REFERENCE,
    d2_weights,
    make_blobs,
    mb_state_shapes,
    mb_weights,
    write_detectron_pkl,
    write_mb_checkpoint,
)
from minidet.testing.mmdet import mmdet_meta, mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint

for _module, _extra in (("onnx", "export"), ("onnxruntime", "export"), ("onnxscript", "export"),
                        ("openvino", "openvino")):
    needs_extra(_module, _extra)  # with MINIDET_REQUIRE_EXTRAS (CI) a missing one is an error, never a skip
onnx = pytest.importorskip("onnx", reason="the export extra (pip install 'minidet[export]')")
ort = pytest.importorskip("onnxruntime", reason="the export extra (pip install 'minidet[export]')")
pytest.importorskip("onnxscript", reason="the export extra (pip install 'minidet[export]')")

from minidet.apps.export.gate import eager_references, run_gate  # noqa: E402
from minidet.export import ExportError  # noqa: E402
from minidet.export.graph import NetworkGraph  # noqa: E402
from minidet.export.onnxfile import INTERFACE, export_onnx, graph_inputs, open_graph  # noqa: E402
from minidet.export.ops import batched_nms, strict_threshold  # noqa: E402
from minidet.export.runtime import ExportedNetwork  # noqa: E402

SIZE = ["INPUT.MIN_SIZE_TEST", 320, "INPUT.MAX_SIZE_TEST", 512]
SHAPES = [(240, 320), (180, 420)]  # two image sizes (and aspect ratios): two padded input sizes
# family -> (config, kind of synthetic checkpoint: as each family's own tests write them)
FAMILIES = {
    "torchvision_v1": ("configs/torchvision/maskrcnn_resnet50_fpn.yaml", "tv1"),
    "torchvision_v2": ("configs/torchvision/maskrcnn_resnet50_fpn_v2.yaml", "tv2"),
    "detectron": ("configs/detectron/e2e_mask_rcnn_R-50-FPN_1x.yaml", "detectron"),
    "detectron_gn": ("configs/detectron/e2e_mask_rcnn_R-50-FPN_2x_gn.yaml", "detectron_gn"),
    "detectron2": ("configs/detectron2/mask_rcnn_R_50_FPN_1x.yaml", "detectron2"),
    "maskrcnn_benchmark": ("configs/maskrcnn_benchmark/e2e_mask_rcnn_R_50_FPN_1x.yaml", "mb"),
    "mmdetection": ("configs/mmdetection/mask-rcnn_r50_fpn_1x_coco.yaml", "mmdet"),
    # a checkpoint fine-tuned on its own 3 classes (class count and names from the file)
    "mmdetection_own": ("configs/mmdetection/mask-rcnn_r50_fpn_1x_coco.yaml", "mmdet_own"),
    # Cascade Mask R-CNN in both flavours (mmdetection's three mask heads); deformable convolution v2 and v1
    "mmdetection_cascade": ("configs/mmdetection/cascade-mask-rcnn_r50_fpn_1x_coco.yaml", "mmdet_cascade"),
    "mmdetection_dcnv2": ("configs/mmdetection/mask-rcnn_r50-mdconv-c3-c5_fpn_1x_coco.yaml", "mmdet_dcnv2"),
    "detectron2_cascade_dcn": ("configs/detectron2/cascade_mask_rcnn_R_50_FPN_1x.yaml", "d2_cascade_dcn"),
    # issue 45: RegNetX (grouped convs, a stem without max-pool); Mask Scoring R-CNN (the mask IoU head rescoring the
    # detections: the box_scores output) on a GC r16 c3-c5 body (softmax attention pooling, matmul, LayerNorm); RegNetY
    # (squeeze-and-excitation: global average pooling), in detectron2's LSJ model (BN in the FPN and the heads too)
    "mmdetection_regnetx": ("configs/mmdetection/mask-rcnn_regnetx-3.2GF_fpn_1x_coco.yaml", "minidet"),
    "mmdetection_ms_gcb": ("configs/mmdetection/ms-rcnn_r50-caffe_fpn_1x_coco.yaml", "minidet"),
    "detectron2_regnety": ("configs/detectron2/mask_rcnn_regnety_4gf_dds_FPN_100ep_LSJ.yaml", "minidet"),
}
DEFORMABLE = {"mmdetection_dcnv2", "detectron2_cascade_dcn"}  # OpenVINO has no DeformConv
OPTS = {"detectron2_cascade_dcn": ["MODEL.RESNETS.DEFORM_ON_PER_STAGE", [False, True, True, True]],
        "mmdetection_ms_gcb": ["MODEL.RESNETS.CONTEXT_ON_PER_STAGE", [False, True, True, True]]}
NORMS = {"FrozenBN": [], "folded": ["MODEL.FOLD_NORM", True]}
# GN: no folding; own classes: the family's arithmetic is mmdetection's case, its head sizes are its own
CASES = [(f, n) for f in FAMILIES for n in NORMS if not (f.endswith(("_gn", "_own")) and n == "folded")]
# the gate: every family's FrozenBN export (each family's own head arithmetic; eager's folded network is one of the
# float-order variants its noise is measured under), and the folded export where folding differs: an Affine backbone
# (Detectron) and norms in the heads too (torchvision v2). Folding is one function of each conv's norm, the same in
# every family (norm.fold_norms), so the other families' folded graphs are these graphs' kind; their arithmetic is
# test_graph_in_pytorch_...'s case (bit for bit, every family x norm). Detectron2's FrozenBN gate under both runtimes
# is test_export_program_...'s (`minidet export`, then `--check` under each runtime): exported there once, not twice.
# The cascade's gate under both runtimes, deformable convolution's under ONNX Runtime (OpenVINO refuses it in one
# line); detectron2's cascade with deformable convs is the graph's case (bit for bit in PyTorch: its arithmetic).
# Issue 45: Mask Scoring R-CNN on GC blocks and RegNetY under both runtimes; RegNetX is the graph's case (its grouped
# convolutions are RegNetY's too).
FOLDED_GATE = {"detectron", "torchvision_v2"}
GATED = [(f, n) for f, n in CASES if (n == "FrozenBN" or f in FOLDED_GATE)
         and f not in ("detectron2_cascade_dcn", "mmdetection_regnetx")]
# One gate per set of operators. What the gate adds to test_graph_in_pytorch_...'s proof (every family x norm bit for
# bit in PyTorch: the rules and constants each family's graph computes with) is the runtimes' kernels of the graph's
# operators and ONNX's translation of them: the same for graphs of the same operators. So of the cases above, those
# whose graphs hold the same set of torch.export operators (test_gate_groups_share_their_operators: the set, not the
# counts) are gated once, by the first of their group (the key); the members keep their graph-in-PyTorch cases.
# The FrozenBN graphs of torchvision v1 and v2 (v2's norms in its heads too: FrozenBN's multiply and add) and v2's
# folded one are one set; Detectron's folded graph (its Affine folded) is maskrcnn-benchmark's set; mmdetection's own
# classes are its 80 classes' set (the keys: the graphs the later tests reuse, and the cheapest gate of the set). The
# others are each a set of their own (detectron2: its FrozenBN as a batch norm op, gated by test_export_program_...;
# Detectron's Affine: addcmul; GN; the cascade; DCNv2; GC blocks and mask scoring; RegNetY's SE, BN in FPN and heads).
GATE_GROUPS = {
    ("torchvision_v1", "FrozenBN"): [("torchvision_v2", "FrozenBN"), ("torchvision_v2", "folded")],
    ("maskrcnn_benchmark", "FrozenBN"): [("detectron", "folded")],
    ("mmdetection", "FrozenBN"): [("mmdetection_own", "FrozenBN")],
}
GATE_CASES = [c for c in GATED if c != ("detectron2", "FrozenBN") and not any(c in m for m in GATE_GROUPS.values())]


def _write(kind: str, path: Path, family: str) -> None:
    """A synthetic checkpoint of ``kind`` in its family's real format, realistic random weights; ``minidet``: a
    minidet state dict of ``family``'s config (``random_minidet_weights``: calibrated norms, class logits and mask
    IoUs), which every family's config loads."""
    if kind == "minidet":
        cfg = config(FAMILIES[family][0], *SIZE, *OPTS.get(family, []))
        random_minidet_weights(cfg, images_bgr(SHAPES[:1])[0], str(path))
    elif kind in ("tv1", "tv2"):
        sd = build_tv(int(kind[-1]), 320, 512).state_dict()
        torch.save(legacy_v1_state_dict(sd) if kind == "tv1" else sd, path)
    elif kind.startswith("detectron_") or kind == "detectron":
        write_detectron_pkl(str(path), make_blobs("R-50-FPN_gn" if kind.endswith("_gn") else "R-50-FPN"))
    elif kind == "detectron2":
        with open(path, "wb") as f:
            pickle.dump({"model": d2_weights(50)}, f)
    elif kind == "d2_cascade_dcn":
        with open(path, "wb") as f:
            pickle.dump({"model": d2_weights(50, stages=3, deform=True)}, f)
    elif kind in ("mmdet_cascade", "mmdet_dcnv2"):
        layout = {"stages": 3} if kind == "mmdet_cascade" else {"dcn": "DCNv2"}
        write_mmdet_checkpoint(path, mmdet_weights(mmdet_state_shapes(**layout)))
    elif kind.startswith("mmdet"):
        own = ("cell", "nucleus", "debris") if kind == "mmdet_own" else None
        state = mmdet_weights(mmdet_state_shapes(num_classes=len(own) if own else 80))
        write_mmdet_checkpoint(path, state, mmdet_meta(classes=own) if own else None)
    else:
        write_mb_checkpoint(str(path), mb_weights(mb_state_shapes(), seed=0))


@pytest.fixture(scope="module")
def checkpoints(session_cache):
    """family -> its checkpoint file, written on first use, once per test run (``session_cache``)."""
    made = {}

    def get(family: str) -> Path:
        if family.startswith("detectron") and family != "detectron2" and not Path(REFERENCE).is_dir():
            pytest.skip("needs ../shared/reference (Detectron's blob lists)")
        if family not in made:
            key = {"made": "checkpoint", "family": family, "kind": FAMILIES[family][1], "config": FAMILIES[family][0],
                   "opts": [*SIZE, *OPTS.get(family, [])], "shape": SHAPES[0]}
            folder = session_cache.get(key, lambda f: _write(FAMILIES[family][1], f / "model.ckpt", family))[0]
            made[family] = folder / "model.ckpt"
        return made[family]

    return get


def _model(checkpoints, family: str, norm: str = "FrozenBN", *opts):
    cfg = config(FAMILIES[family][0], *SIZE, *OPTS.get(family, []), *NORMS[norm], *FEWER, *opts,
                 weights=checkpoints(family))
    return minidet.prepare_model(cfg)[0]


def _graph_args(batch) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(v) for v in graph_inputs(batch, 0).values())


# --------------------------------------------------------------------------- the graph's arithmetic, in PyTorch


# the first check: a family with the background first, one with it last, a cascade with deformable convs (each case
# takes 5 s to 10 s; Mask Scoring R-CNN's twice that: its mask IoU head costs what the mask head does)
QUICK_GRAPH = {("torchvision_v1", "FrozenBN"), ("mmdetection", "FrozenBN"), ("detectron2_cascade_dcn", "FrozenBN")}


@pytest.mark.parametrize(("family", "norm"), [pytest.param(*c, marks=() if c in QUICK_GRAPH else pytest.mark.slow)
                                              for c in CASES])
def test_graph_in_pytorch_is_the_eager_network_bit_for_bit(checkpoints, family, norm):
    model = _model(checkpoints, family, norm, "MODEL.ROI_ALIGN_IMPL", "torchvision")
    graph = NetworkGraph(model).eval()
    for image in images_bgr(SHAPES):
        batch = model.preprocess([image])
        with torch.inference_mode():
            ref = model.detect(batch)[0]
            out = dict(zip(graph.outputs, graph(*_graph_args(batch))))
        assert len(ref.boxes) > 10
        assert graph.outputs[:5] == ("proposals", "boxes", "scores", "labels", "masks")
        for name in graph.outputs[1:]:
            assert torch.equal(out[name], getattr(ref, name)), name
        assert graph.frame == ref.frame
        if model.mask_iou_head is not None:  # Mask Scoring R-CNN: the box scores times the predicted mask IoUs
            assert graph.outputs[-1] == "box_scores" and not torch.equal(out["scores"], out["box_scores"])
            assert 0 < float(out["scores"].mean()) < float(out["box_scores"].mean())  # calibrated IoUs: about 0.7
        else:
            assert ref.box_scores is None and "box_scores" not in graph.outputs


def test_graph_takes_rules_from_the_model_not_from_names(checkpoints):
    """A family's rule changed on the built model (not its name) changes the graph the same way."""
    model = _model(checkpoints, "torchvision_v1", "FrozenBN", "MODEL.ROI_ALIGN_IMPL", "torchvision")
    model.box_predictor.ties_at_cap = True
    model.box_predictor.detections_per_image = 7
    model.rpn.box_rule = model.box_predictor.box_rule = minidet.boxes.BoxRule(offset=1, inclusive_nms=True)

    def lowest(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:  # a per-level top-k of its own
        low, idx = (-logits).topk(min(k, logits.shape[1]), dim=1)
        return -low, idx

    model.rpn.level_topk = lowest
    batch = model.preprocess(images_bgr(SHAPES[:1]))
    with torch.inference_mode():
        ref = model.detect(batch)[0]
        _, boxes, scores, _, _ = NetworkGraph(model).eval()(*_graph_args(batch))
    assert len(ref.boxes) >= 7 and torch.equal(boxes, ref.boxes) and torch.equal(scores, ref.scores)


class _LevelTopk(torch.nn.Module):
    """One level's logits map (1, A, H, W), flattened as the graph does, through a family's per-level top-k."""

    def __init__(self, rule, k: int) -> None:
        super().__init__()
        self.rule, self.k = rule, k

    def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rule(logits.permute(0, 2, 3, 1).reshape(1, -1), self.k)


@pytest.mark.parametrize("rule", ["topk_logits", "sorted_sigmoid"])
def test_each_familys_level_topk_exports_as_its_rule(rule):
    """The per-level top-k rules under ``torch.export`` (the level's size symbolic): the same scores and anchors as
    eager, on more anchors than ``k`` and on fewer (mmdetection's sigmoid scores, the others' logits; distinct
    values)."""
    from minidet.heads import rpn

    module = _LevelTopk(getattr(rpn, rule), 50)
    dims = {2: torch.export.Dim("h", min=2), 3: torch.export.Dim("w", min=2)}
    program = torch.export.export(module, (torch.randn(1, 3, 8, 8),), dynamic_shapes=(dims,), strict=False)
    for h, w in ((10, 10), (2, 6)):  # 300 and 36 anchors
        logits = (torch.randperm(3 * h * w).float() / (3 * h * w) * 8 - 4).view(1, 3, h, w)  # no saturated ties
        got, want = program.module()(logits), module(logits)
        order = want[0][0].argsort(descending=True)  # mmdetection keeps all of a small level in anchor order
        assert torch.equal(got[0][0], want[0][0][order]) and torch.equal(got[1][0], want[1][0][order])


# ------------------------------------------------------------------------- ONNX's operators, against torchvision


def _onnx_of(module: torch.nn.Module, args: tuple, dynamic: tuple) -> object:
    from minidet.export.ops import TRANSLATIONS

    program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic, verbose=False,
                                custom_translation_table=TRANSLATIONS)
    return ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])


class _NMS(torch.nn.Module):
    def __init__(self, thresh: float, groups: int) -> None:
        super().__init__()
        self.thresh, self.groups = thresh, groups

    def forward(self, boxes, scores, groups):
        return torch.ops.minidet.batched_nms(boxes, scores, groups, self.thresh, self.groups)


def _boxes(n: int, seed: int, grid: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    if grid:  # integer boxes: many pairs at IoU exactly 0.5 (touching halves), 1/3, ...
        xy = torch.randint(0, 8, (n, 2), generator=gen).float() * 4
        wh = torch.randint(1, 3, (n, 2), generator=gen).float() * 8
    else:
        xy, wh = torch.rand(n, 2, generator=gen) * 300, torch.rand(n, 2, generator=gen) * 80 + 1
    scores = torch.randperm(n, generator=gen).float() / n  # distinct scores
    return torch.cat([xy, xy + wh], 1), scores, torch.randint(0, 4, (n,), generator=gen)


@pytest.mark.parametrize("inclusive", [False, True])
def test_onnx_nms_keeps_what_torchvision_keeps_both_ways(inclusive):
    """Per group (more than 1000 boxes) and over shifted boxes (fewer), at and off exact-threshold IoUs."""
    t = strict_threshold(0.5, inclusive)
    session = _onnx_of(_NMS(t, 4), _boxes(50, 0), ({0: torch.export.Dim("n")},) * 3)
    for n, grid in ((300, True), (300, False), (1500, True), (1500, False), (0, False)):
        boxes, scores, groups = _boxes(n, n + grid, grid)
        ref = batched_nms(boxes, scores, groups, t, 4)
        got = session.run(None, {"boxes": boxes.numpy(), "scores": scores.numpy(), "groups": groups.numpy()})[0]
        assert np.array_equal(got, ref.numpy()), (n, grid)
        if grid and n:  # the rule is visible: >= keeps fewer than > on these boxes
            other = batched_nms(boxes, scores, groups, strict_threshold(0.5, not inclusive), 4)
            assert len(other) != len(ref)


def test_strict_threshold_is_each_familys_rule():
    ious = torch.tensor([0.5, np.nextafter(np.float32(0.5), 1), np.nextafter(np.float32(0.5), 0), 0.7, 0.3])
    for thresh in (0.5, 0.7, 0.3):
        for inclusive in (False, True):
            t = strict_threshold(thresh, inclusive)
            want = ious.double() >= thresh if inclusive else ious.double() > thresh
            assert torch.equal(ious > t, want) and np.float32(t) == t


class _RoIAlign(torch.nn.Module):
    def __init__(self, sampling: int, aligned: bool) -> None:
        super().__init__()
        self.sampling, self.aligned = sampling, aligned

    def forward(self, features, rois):
        return torch.ops.torchvision.roi_align(features, rois, 0.25, 7, 7, self.sampling, self.aligned)


@pytest.mark.parametrize(("sampling", "aligned"), [(2, False), (0, False), (0, True), (2, True)])
def test_onnx_roialign_is_torchvisions(sampling, aligned):
    gen = torch.Generator().manual_seed(1)
    feats = torch.randn(1, 8, 40, 56, generator=gen)
    xy = torch.rand(60, 2, generator=gen) * 200 - 10
    rois = torch.cat([torch.zeros(60, 1), xy, xy + torch.rand(60, 2, generator=gen) * 120], 1)
    rois[:5, 3:] = rois[:5, 1:3]  # empty boxes: under one cell (not aligned: one cell)
    session = _onnx_of(_RoIAlign(sampling, aligned), (feats, rois[:10]), ({2: torch.export.Dim("h"), 3:
                       torch.export.Dim("w")}, {0: torch.export.Dim("r")}))
    got = session.run(None, {"features": feats.numpy(), "rois": rois.numpy()})[0]
    assert np.array_equal(got, _RoIAlign(sampling, aligned)(feats, rois).numpy())


@pytest.mark.parametrize("shape", [(1, 256, 60, 88), (300, 1024)])
def test_exported_groupnorm_is_as_close_to_exact_as_pytorchs(shape):
    """GroupNorm over an FPN-like map and over an fc's rows (maskrcnn-benchmark's GN MLP head): ONNX Runtime's
    result from the float64 statistics is as near the exact one as PyTorch's own; run by PyTorch, the bits."""
    from minidet.export.graph import _GroupNorm64

    gen = torch.Generator().manual_seed(0)
    gn = torch.nn.GroupNorm(32, shape[1]).eval()
    with torch.no_grad():
        gn.weight.uniform_(0.5, 1.5, generator=gen), gn.bias.normal_(generator=gen)
    x = torch.randn(shape, generator=gen) * 3 + 5
    module = _GroupNorm64(gn).eval()
    session = _onnx_of(module, (x,), ({0: torch.export.Dim("n")},))
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    with torch.no_grad():
        exact = torch.nn.functional.group_norm(x.double(), 32, gn.weight.double(), gn.bias.double(), gn.eps)
        assert torch.equal(module(x), gn(x))
        assert (got.double() - exact).abs().max() <= 2 * (gn(x).double() - exact).abs().max() + 1e-7


# ------------------------------------------------------------------------------------------- refused files


def _tiny_onnx(path: Path, **metadata: str) -> Path:
    """A valid one-node ONNX model (Identity) with ``metadata``."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 18)])
    helper.set_model_props(model, metadata)
    path.write_bytes(model.SerializeToString())
    return path


def _minidet_meta(sha: str = "none", version: str = minidet.__version__) -> dict[str, str]:
    return {"minidet.version": version, "minidet.interface": INTERFACE, "minidet.frame": "resized",
            "minidet.weights_sha256": sha, "minidet.weights": "/somewhere/model.pth"}


RUNTIMES = [rt for rt in runtimes.RUNTIMES if importlib.util.find_spec(rt)]  # the installed ones (module: its name)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_refusals_are_one_line(tmp_path, runtime):
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07" + bytes(range(256)) * 40)
    cases = {
        str(corrupt): f"not an ONNX model {runtimes.RUNTIMES[runtime]} can load",
        str(_tiny_onnx(tmp_path / "foreign.onnx", author="someone")): "not one `minidet export` wrote",
        str(_tiny_onnx(tmp_path / "old.onnx", **_minidet_meta(version="0.0.1"))): "written by minidet 0.0.1, this "
        f"is minidet {minidet.__version__}",
        str(tmp_path / "missing.onnx"): "not found",
        str(tmp_path): "is a folder",
    }
    for path, expected in cases.items():
        with pytest.raises(ExportError) as e:
            open_graph(path, runtime=runtime)
        assert expected in str(e.value) and path in str(e.value) and "\n" not in str(e.value)
    graph = _tiny_onnx(tmp_path / "ok.onnx", **_minidet_meta("abc"))
    assert open_graph(str(graph), "abc", runtime=runtime).metadata["minidet.weights_sha256"] == "abc"
    with pytest.raises(ExportError, match="MODEL.WEIGHTS changed since the export"):
        open_graph(str(graph), "def", runtime=runtime)


def _runtime_cfg(tmp_path: Path, graph: Path, weights: str = "none", *opts) -> Path:
    cfg = config("configs/torchvision/maskrcnn_resnet50_fpn.yaml", *SIZE, "MODEL.RUNTIME", "onnxruntime",
                 "MODEL.GRAPH", str(graph), *opts, weights=weights)
    path = tmp_path / "config.yaml"
    path.write_text(cfg.dump())
    return path


def test_weights_changed_since_export_is_one_line_in_infer(tmp_path, capfd):
    weights = tmp_path / "model.pth"
    weights.write_bytes(b"the weights as exported")
    from minidet.hub import file_sha256

    graph = _tiny_onnx(tmp_path / "model.onnx", **_minidet_meta(file_sha256(weights)))
    weights.write_bytes(b"other weights, same name")
    cfg = _runtime_cfg(tmp_path, graph, str(weights))
    image = tmp_path / "a.png"
    import cv2

    cv2.imwrite(str(image), images_bgr(SHAPES[:1])[0])
    r = call_tool(ROOT / "tools" / "infer.py", "--config-file", str(cfg), "--input", str(image), "--output",
                  str(tmp_path / "out"), "--workers", "0", capture=capfd)
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "MODEL.WEIGHTS changed since the export" in line and str(graph) in line


def test_missing_extra_and_settings_are_one_line(tmp_path, monkeypatch):
    graph = _tiny_onnx(tmp_path / "model.onnx", **_minidet_meta())
    cfg = minidet.get_cfg(str(_runtime_cfg(tmp_path, graph)))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as in an environment without the extra
    with pytest.raises(ExportError, match=r"needs the package onnxruntime \(the export extra: pip install"):
        minidet.prepare_model(cfg)
    monkeypatch.undo()
    for key, value, expected in (("MODEL.GRAPH", "", "needs MODEL.GRAPH"), ("MODEL.DEVICE", "cuda", "runs on the CPU")):
        bad = cfg.clone()
        bad.merge_from_list([key, value])
        with pytest.raises(minidet.ConfigError, match=expected):
            minidet.prepare_model(bad)


def test_export_without_the_extra_is_one_line(tmp_path, capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as in an environment without the extra
    r = call_tool(ROOT / "tools" / "export.py", "--config-file", "torchvision/maskrcnn_resnet50_fpn", "--output",
                  str(tmp_path / "out"), "MODEL.WEIGHTS", "none", capture=capfd)
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "minidet export needs the package onnxscript" in line and "minidet[export]" in line


def test_export_takes_overrides_after_its_images_as_infer_does():
    args = load_tool(ROOT / "tools" / "export.py").parse_args(
        ["--config-file", "c.yaml", "--output", "out", "--images", "a.jpg", "b.jpg", "MODEL.WEIGHTS", "x.pth",
         "MODEL.NORM", "Affine", "--repeats", "0"])
    assert args.images == ["a.jpg", "b.jpg"] and args.opts == ["MODEL.WEIGHTS", "x.pth", "MODEL.NORM", "Affine"]
    assert args.repeats == 0


def test_an_export_folders_paths_resolve_beside_its_config(tmp_path, monkeypatch):
    """``MODEL.GRAPH`` and a ``./`` or ``../`` ``MODEL.WEIGHTS`` in a config file are the file's neighbours, from any
    folder; other relative weights (the shipped configs' ``weights/<file>``) and names stay as they are."""
    folder = tmp_path / "export"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)
    for weights, expected in (("../model.pth", tmp_path / "model.pth"), ("./model.pth", folder / "model.pth"),
                              ("weights/model.pth", "weights/model.pth"),
                              ("torchvision/maskrcnn_resnet50_fpn", "torchvision/maskrcnn_resnet50_fpn")):
        (folder / "config.yaml").write_text(f"MODEL:\n  GRAPH: model.onnx\n  WEIGHTS: {weights}\n")
        cfg = minidet.get_cfg(str(folder / "config.yaml"))
        assert cfg.MODEL.GRAPH == str(folder / "model.onnx") and cfg.MODEL.WEIGHTS == str(expected)


def test_a_damaged_or_replaced_graph_is_refused_before_use(tmp_path):
    from minidet.export.onnxfile import graph_sha256

    graph = _tiny_onnx(tmp_path / "model.onnx", **_minidet_meta())
    digest = graph_sha256(graph.read_bytes())
    assert open_graph(str(graph), sha256=digest).path == str(graph)
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte changed in the middle: still a loadable model, perhaps
    graph.write_bytes(bytes(data))
    cfg = _runtime_cfg(tmp_path, graph, "none", "MODEL.GRAPH_SHA256", digest)
    with pytest.raises(ExportError) as e:
        minidet.prepare_model(minidet.get_cfg(str(cfg)))
    assert "the file is damaged or was replaced" in str(e.value) and str(graph) in str(e.value)
    assert "MODEL.GRAPH_SHA256" in str(e.value) and "\n" not in str(e.value)


def test_the_config_must_be_the_graphs_where_the_graph_holds_it(tmp_path):
    """A key whose value the graph computes with (the family's arithmetic, thresholds) differs from the export's:
    one line naming the key and both values; a key outside the graph (the resize, the device's threads) may."""
    exported = config("configs/torchvision/maskrcnn_resnet50_fpn.yaml", *SIZE, weights="none")
    graph = _tiny_onnx(tmp_path / "model.onnx", **_minidet_meta(), **{"minidet.config": exported.dump()})
    for key, value in (("MODEL.CONVENTION", "detectron2"), ("MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.3),
                       ("MODEL.FROZEN_BN_EPS", 0.001)):
        cfg = minidet.get_cfg(str(_runtime_cfg(tmp_path, graph, "none", key, value)))
        with pytest.raises(minidet.ConfigError) as e:
            minidet.prepare_model(cfg)
        assert f"{key} is {value!r}" in str(e.value) and str(graph) in str(e.value), str(e.value)
    from minidet.export.runtime import fixed_keys

    free = {"INPUT.MIN_SIZE_TEST", "MODEL.WEIGHTS", "MODEL.CLASS_NAMES", "TEST.IMS_PER_BATCH", "MODEL.CHANNELS_LAST"}
    assert not free & set(fixed_keys(exported)) and "MODEL.CONVENTION" in fixed_keys(exported)


def test_onnxruntime_runs_float32_only(tmp_path):
    graph = _tiny_onnx(tmp_path / "model.onnx", **_minidet_meta())
    assert open_graph(str(graph)).runtime["precision"] == "fp32"
    for precision in ("bf16", "int8"):
        with pytest.raises(ExportError, match=f"MODEL.RUNTIME_PRECISION {precision} runs under MODEL.RUNTIME "
                                              "openvino, not onnxruntime"):
            open_graph(str(graph), precision=precision)
    with pytest.raises(minidet.ConfigError, match="MODEL.RUNTIME_PRECISION bf16 is the precision of an exported"):
        minidet.prepare_model(config("configs/torchvision/maskrcnn_resnet50_fpn.yaml", "MODEL.RUNTIME_PRECISION",
                                     "bf16", weights="none"))


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="needs the minidet[openvino] extra")
def test_openvino_is_told_every_numerics_option(tmp_path, monkeypatch):
    """What ``compile_model`` gets, whatever the CPU's defaults: float32 precision hint and accuracy mode (fp32), no
    denormals flushed, no dynamic quantization; and the precision the compiled layers got is recorded."""
    import openvino

    seen = []
    compile_model = openvino.Core.compile_model

    def spy(self, model, device=None, config=None, *rest):
        seen.append((device, dict(config or {})))
        return compile_model(self, model, device, config, *rest)

    monkeypatch.setattr(openvino.Core, "compile_model", spy)
    graph = _tiny_onnx(tmp_path / "model.onnx", **_minidet_meta())
    opened = open_graph(str(graph), runtime="openvino", threads=1)
    assert seen == [("CPU", {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32",
                             "EXECUTION_MODE_HINT": "ACCURACY", "CPU_DENORMALS_OPTIMIZATION": False,
                             "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})]
    assert opened.runtime["precision"] == "fp32" and opened.runtime["precision_asked"] == "fp32"
    assert set(opened.runtime["layers"]) <= {"f32"}
    if "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):  # bf16 on request only
        open_graph(str(graph), runtime="openvino", threads=1, precision="bf16")
        assert seen[-1][1]["INFERENCE_PRECISION_HINT"] == "bf16"
    else:
        with pytest.raises(ExportError, match="this CPU has no bf16 instructions"):
            open_graph(str(graph), runtime="openvino", precision="bf16")


# ------------------------------------------------------------------------- exported, run by ONNX Runtime (slow)


REUSED = {("torchvision_v1", "FrozenBN"), ("maskrcnn_benchmark", "FrozenBN")}  # exports the later tests take too


@pytest.fixture(scope="module")
def exports(checkpoints, session_cache):
    """(family, norm) -> the bytes of its model's export (its checkpoint's digest in the metadata); those in
    ``REUSED`` are exported once per test run for the tests after the gate's (``session_cache``: an export takes half
    a minute, and its file 170 MB: the others are not kept)."""
    from minidet.hub import file_sha256

    def export(family: str, norm: str, model) -> bytes:
        model = model or _model(checkpoints, family, norm)
        weights = checkpoints(family)
        return export_onnx(model, model.preprocess(images_bgr(SHAPES[:1])), {
            "minidet.weights_sha256": file_sha256(weights), "minidet.weights": str(weights)})

    def get(family: str, norm: str = "FrozenBN", model=None) -> bytes:
        if (family, norm) not in REUSED:
            return export(family, norm, model)

        def write(folder: Path) -> None:
            (folder / "model.onnx").write_bytes(export(family, norm, model))

        key = {"made": "graph", "family": family, "norm": norm, "config": FAMILIES[family][0],
               "opts": [*SIZE, *OPTS.get(family, []), *NORMS[norm]], "shape": SHAPES[0],
               "weights": str(checkpoints(family))}
        return (session_cache.get(key, write)[0] / "model.onnx").read_bytes()

    return get


def assert_judged(report: dict) -> None:
    """The gate passed on something: plenty of detections on every image, and the images it did not judge are
    those where one of eager's own float-order variants parts, or eager's own decision at the first stage that
    differs is a near-tie (CPU-dependent: which decision a float order tips); at least one image is judged."""
    images = report["images"]
    assert all(c["eager"] > 10 for c in images), report
    unjudged = [c["verdict"] for c in images if c["verdict"].startswith("unstable")]
    assert all(v.startswith(("unstable: eager's rpn decision is a near-tie", "unstable: eager's box_head decision "
                             "is a near-tie", "unstable: eager folded differs", "unstable: eager channels-last "
                             "differs", "unstable: eager contiguous differs")) for v in unjudged), report
    assert len(unjudged) < len(images), report


def test_every_gated_case_is_gated_or_in_a_gated_group():
    """The gate's groups: each key gated by test_exported_family_passes_the_gate, each member a case the gate took
    before the grouping, in one group only; detectron2's FrozenBN gate is test_export_program_...'s."""
    members = [c for m in GATE_GROUPS.values() for c in m]
    assert len(members) == len(set(members)) and not set(members) & set(GATE_GROUPS)
    assert set(GATE_CASES) | set(members) | {("detectron2", "FrozenBN")} == set(GATED)
    assert set(GATE_GROUPS) <= set(GATE_CASES)
    assert not set(GATE_CASES) & set(members)


def _operators(model) -> set[str]:
    """The operators of ``model``'s graph as ``export_onnx`` traces it (``torch.export``, the padded height and width
    dynamic): what ONNX's translation and the runtimes' kernels see."""
    from torch.export import Dim

    from minidet.export.onnxfile import MIN_SIDE

    graph = NetworkGraph(model).eval()
    d = model.transform.size_divisibility
    k = max(2, -(-MIN_SIDE // d))
    with torch.no_grad():
        program = torch.export.export(graph, _graph_args(model.preprocess(images_bgr(SHAPES[:1]))),
                                      dynamic_shapes=({2: d * Dim("h", min=k), 3: d * Dim("w", min=k)}, None, None,
                                                      None), strict=False)
    names = {str(n.target): n.target for n in program.graph_module.graph.nodes if n.op == "call_function"}
    return {t.__name__ if name.startswith("<") else name for name, t in names.items()}  # <function sym_min at 0x..>


@pytest.mark.slow
@pytest.mark.parametrize("gated", list(GATE_GROUPS), ids=lambda c: "-".join(c))
def test_gate_groups_share_their_operators(checkpoints, gated):
    """Each member of a gate group traces to its gated case's set of operators (a tenth of the cost of a gate case:
    torch.export alone, without ONNX's translation and the runtimes' runs)."""
    want = _operators(_model(checkpoints, *gated))
    assert {"aten.conv2d.default", "torchvision.roi_align.default"} <= want, sorted(want)
    for family, norm in GATE_GROUPS[gated]:
        assert _operators(_model(checkpoints, family, norm)) == want, (family, norm)


@pytest.mark.slow
@pytest.mark.parametrize(("family", "norm"), GATE_CASES)
def test_exported_family_passes_the_gate(checkpoints, exports, family, norm):
    """Every family's export passes the gate under ONNX Runtime and OpenVINO (float32, as on every CPU)."""
    model = _model(checkpoints, family, norm)
    data = exports(family, norm, model)
    images = [(str(i), im) for i, im in enumerate(images_bgr(SHAPES))]
    references = eager_references(model, images)  # eager's side of the gate, once for both runtimes
    for runtime in RUNTIMES:
        if runtime == "openvino" and family in DEFORMABLE:  # one line naming the op and the runtime
            with pytest.raises(ExportError) as e:
                open_graph("exported", data=data, runtime=runtime)
            assert str(e.value) == ("exported graph exported: OpenVINO cannot run deformable convolution (ONNX's "
                                    "DeformConv, opset 19): it has no conversion for it; ONNX Runtime runs it (export "
                                    "with --runtime onnxruntime, run with MODEL.RUNTIME onnxruntime)")
            continue
        network = ExportedNetwork(open_graph("exported", data=data, runtime=runtime))
        report = run_gate(model, network, images, repeats=0, references=references)
        assert report["passed"], (runtime, report)
        assert_judged(report)
        if model.mask_iou_head is not None:  # the box head's scores beside the rescored ones, as eager has them
            head, out = network.run_image(model.preprocess(images[:1][0][1:]), 0)
            assert head.box_scores is not None and torch.equal(head.box_scores, out["box_scores"])


@pytest.mark.slow
def test_mask_scoring_graph_runs_an_image_without_detections(checkpoints):
    """Mask Scoring R-CNN's graph on an image where nothing passes the score threshold (and on images with a few
    detections) under each runtime: eager's detections, none on the blank picture (OpenVINO's MaxPool, the mask IoU
    head's first step, refuses an empty batch: the graph gives the head one zero row more and drops its IoU)."""
    model = _model(checkpoints, "mmdetection_ms_gcb", "FrozenBN", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.9)
    data = export_onnx(model, model.preprocess(images_bgr(SHAPES[:1])), {"minidet.weights_sha256": "none"})
    batches = [model.preprocess([im]) for im in [np.full((240, 320, 3), 114, np.uint8), *images_bgr(SHAPES)]]
    with torch.inference_mode():
        refs = [model.detect(b)[0] for b in batches]
    assert len(refs[0].boxes) == 0 and sum(len(r.boxes) for r in refs[1:]) > 0
    for runtime in RUNTIMES:
        network = ExportedNetwork(open_graph("exported", data=data, runtime=runtime))
        for batch, ref in zip(batches, refs):
            head = network.run_image(batch, 0)[0]
            assert torch.equal(head.labels, ref.labels) and head.box_scores.shape == ref.box_scores.shape, runtime
            assert torch.allclose(head.scores, ref.scores, atol=1e-4) and head.masks.shape == ref.masks.shape


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="needs the minidet[openvino] extra")
def test_openvino_in_bf16_fails_the_gate(checkpoints, exports):
    """The negative control: the same graph that passes in float32, compiled by OpenVINO in bf16 (where the CPU has
    it: what OpenVINO picks by itself there unless told), is rejected by the gate; where the CPU has no bf16, asking
    for it is one line."""
    import openvino

    model = _model(checkpoints, "torchvision_v1")
    data = exports("torchvision_v1", "FrozenBN", model)
    if "BF16" not in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        with pytest.raises(ExportError, match="this CPU has no bf16 instructions"):
            open_graph("exported", data=data, runtime="openvino", precision="bf16")
        return
    network = ExportedNetwork(open_graph("exported", data=data, runtime="openvino", precision="bf16"))
    assert network.graph.runtime["precision"] == "bf16"
    report = run_gate(model, network, [(str(i), im) for i, im in enumerate(images_bgr(SHAPES))], repeats=0)
    assert not report["passed"] and any(c["verdict"] == "DIFFERS" for c in report["images"]), report


@pytest.mark.slow
def test_wrong_nms_threshold_fails_the_gate(checkpoints, exports):
    """The exported torchvision graph with its box head's NMS threshold 0.5 moved to 0.45: the gate says so."""
    model = _model(checkpoints, "torchvision_v1")
    proto = onnx.load_from_string(exports("torchvision_v1", "FrozenBN", model))
    from onnx import numpy_helper

    thresholds = {n.input[3] for n in proto.graph.node if n.op_type == "NonMaxSuppression"}
    held = [t for t in proto.graph.initializer if t.name in thresholds]  # the exporter folds them into initializers
    box_head = [t for t in held if numpy_helper.to_array(t).tolist() == [0.5]]
    assert len(box_head) == 1  # one constant for the box head's two NMS ways (per class, shifted)
    box_head[0].CopyFrom(numpy_helper.from_array(np.full_like(numpy_helper.to_array(box_head[0]), 0.45),
                                                 box_head[0].name))
    wrong = ExportedNetwork(open_graph("wrong", data=proto.SerializeToString()))
    report = run_gate(model, wrong, [(str(i), im) for i, im in enumerate(images_bgr(SHAPES))], repeats=0)
    assert not report["passed"]
    assert any(c["verdict"] == "DIFFERS" and c["first"] == "box_head" for c in report["images"])


def test_a_runtime_without_deformable_convolution_is_one_line_before_the_export(checkpoints, tmp_path, capfd):
    """``minidet export --runtime openvino`` of a model with deformable convs: OpenVINO has no conversion for ONNX's
    DeformConv, so the program says so in one line (status 2) before it spends a minute exporting; nothing written."""
    pytest.importorskip("openvino", reason="the openvino extra")
    weights = checkpoints("mmdetection_dcnv2")
    r = call_tool(ROOT / "tools" / "export.py", "--config-file", FAMILIES["mmdetection_dcnv2"][0], "--output",
                  str(tmp_path / "export"), "--runtime", "openvino", "MODEL.WEIGHTS", str(weights), *map(str, SIZE),
                  capture=capfd)
    assert r.returncode == 2, r.stderr
    assert one_error_line(r.stderr) == (
        "error: --runtime openvino: OpenVINO cannot run deformable convolution (ONNX's DeformConv, opset 19): it has "
        "no conversion for it; ONNX Runtime runs it (export with --runtime onnxruntime, run with MODEL.RUNTIME "
        "onnxruntime)")
    assert not (tmp_path / "export" / "model.onnx").exists()


@pytest.mark.slow
def test_export_program_and_the_runtime_in_infer_and_predictor(checkpoints, tmp_path, capfd):
    """``minidet export`` writes one self-checked folder: moved with its weights it runs from anywhere (infer, the
    Predictor, ``--check`` under both runtimes), a copy runs its own graph, a damaged graph is one line; the images
    the graph cannot take run on the eager network of the same weights."""
    import shutil

    import cv2

    from minidet.apps.compare import compare_detections

    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(checkpoints("detectron2"), work / "model.pth")
    images = [tmp_path / f"{i}.png" for i in range(2)]
    for path, image in zip(images, images_bgr(SHAPES)):
        cv2.imwrite(str(path), image)
    r = call_tool(ROOT / "tools" / "export.py", "--config-file", "detectron2/mask_rcnn_R_50_FPN_1x", "--output",
                  str(work / "export"), "--images", *map(str, images), "MODEL.WEIGHTS", str(work / "model.pth"),
                  *map(str, SIZE + FEWER), "--repeats", "1", capture=capfd)
    assert r.returncode == 0, r.stderr
    shutil.move(work, tmp_path / "moved")  # the folder and its weights, elsewhere
    out = tmp_path / "moved" / "export"
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] and report["written"] and report["frame"] == "resized"
    assert {"torch", "onnx", "onnxscript", "onnxruntime", "minidet"} <= set(report["versions"])
    assert report["runtime_facts"]["precision"] == "fp32" and report["cpu"]["model"] and "flags" in report["cpu"]
    assert report["not_exact"] and all(c["verdict"].startswith("same") for c in report["images"])
    text = (out / "config.yaml").read_text()
    assert "GRAPH: model.onnx" in text and "WEIGHTS: ../model.pth" in text and str(tmp_path) not in text
    cfg = minidet.get_cfg(str(out / "config.yaml"))
    assert cfg.MODEL.RUNTIME == "onnxruntime" and Path(cfg.MODEL.GRAPH) == out / "model.onnx"
    assert cfg.MODEL.GRAPH_SHA256 == report["graph_sha256"]
    exported = minidet.Predictor(cfg)
    eager = minidet.Predictor(config(FAMILIES["detectron2"][0], *SIZE, *FEWER,
                                     weights=tmp_path / "moved" / "model.pth"))
    assert "minidet export of" in exported.weights_summary and "network" in exported(cv2.imread(str(images[0])))[
        "timings"]
    for path in images:
        image = cv2.imread(str(path))
        problem = compare_detections(exported(image), eager(image)).problem()
        assert not problem or problem.startswith("mask IoU"), problem  # masks: float noise at the paste only
    long = images_bgr([(30, 2400)])[0]  # padded to 32 x 512 at short side 320: under the graph's 64 a side
    got, want = exported(long), eager(long)
    assert "network" not in got["timings"] and len(want["boxes"]) and all(
        torch.equal(got[k], want[k]) for k in ("boxes", "scores", "labels"))
    assert torch.equal(got["masks"].dense(), want["masks"].dense())
    r = call_tool(ROOT / "tools" / "infer.py", "--config-file", str(out / "config.yaml"), "--input",
                  str(images[0]), "--output", str(tmp_path / "infer"), "--workers", "0", "--no-vis", capture=capfd,
                  cwd=ROOT)  # another folder: the config's paths are its neighbours
    assert r.returncode == 0, r.stderr
    infer_record = json.loads((tmp_path / "infer" / "0.json").read_text())
    assert infer_record["instances"]
    if importlib.util.find_spec("starlette") is not None:  # the serve extra: the graph behind HTTP answers the same
        from servers import Server

        served = Server("--config-file", str(out / "config.yaml"), "--threads", str(torch.get_num_threads()),
                        cwd=tmp_path)
        try:
            served.wait_ready()
            status, _, body = served.predict(images[0].read_bytes(), query=f"file={images[0]}")
            assert status == 200 and json.loads(body) == infer_record
            meta = json.loads(served.request("GET", "/v2/models/config")[2])
            assert meta["runtime"] == "onnxruntime" and meta["family"] == "detectron2"
        finally:
            assert served.stop() == 0, "".join(served.err)
    for runtime in RUNTIMES:  # the gate again, where the folder is now
        r = call_tool(ROOT / "tools" / "export.py", "--check", str(out), "--images", *map(str, images),
                      "--repeats", "0", "--json", str(tmp_path / "check.json"), "MODEL.RUNTIME", runtime, capture=capfd)
        assert r.returncode == 0 and "gives eager's detections" in r.stdout, (runtime, r.stdout, r.stderr)
        checked = json.loads((tmp_path / "check.json").read_text())
        assert checked["passed"] and checked["runtime_facts"]["name"] == runtime
        assert_judged(checked)  # detectron2's case of test_exported_family_passes_the_gate
    shutil.copytree(out, out.with_name("copy"))
    damaged = bytearray((out / "model.onnx").read_bytes())
    damaged[len(damaged) // 2 : len(damaged) // 2 + 4096] = bytes(4096)  # 4 KiB zeroed in the middle
    (out / "model.onnx").write_bytes(bytes(damaged))
    r = call_tool(ROOT / "tools" / "infer.py", "--config-file", str(out / "config.yaml"), "--input",
                  str(images[0]), "--output", str(tmp_path / "damaged"), "--workers", "0", "--no-vis", capture=capfd)
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "the file is damaged or was replaced" in line and str(out / "model.onnx") in line
    copy = minidet.Predictor(minidet.get_cfg(str(out.with_name("copy") / "config.yaml")))  # its own graph
    assert copy.model.network.graph.path == str(out.with_name("copy") / "model.onnx")


@pytest.mark.slow
def test_eval_under_the_runtime_gives_eagers_ap(checkpoints, exports, tmp_path, capfd):
    """COCO AP on coco_tiny's first images: the exported graph (ONNX Runtime) and eager minidet."""
    tiny = ROOT.parent / "shared" / "data" / "coco_tiny"
    if not tiny.is_dir():
        pytest.skip("needs ../shared/data/coco_tiny")
    weights = checkpoints("maskrcnn_benchmark")
    graph = tmp_path / "model.onnx"
    graph.write_bytes(exports("maskrcnn_benchmark"))
    metrics = {}
    for runtime in ("torch", "onnxruntime"):
        out = tmp_path / runtime
        r = call_tool(ROOT / "tools" / "eval_coco.py", "--config-file", str(ROOT / FAMILIES["maskrcnn_benchmark"][0]),
                      "--ann", str(tiny / "annotations" / "instances_val2017.json"), "--images", str(tiny / "val2017"),
                      "--output", str(out), "--max-images", "4", "--workers", "0", "MODEL.WEIGHTS", str(weights),
                      *map(str, SIZE), "MODEL.RUNTIME", runtime, "MODEL.GRAPH", str(graph), capture=capfd)
        assert r.returncode == 0, r.stderr
        metrics[runtime] = json.loads((out / "metrics.json").read_text())
    for kind in ("bbox", "segm"):
        ours, ref = metrics["onnxruntime"][kind]["stats"], metrics["torch"][kind]["stats"]
        assert np.allclose(ours, ref, atol=2e-3), (kind, ours, ref)


@pytest.mark.slow
def test_export_writes_nothing_when_the_gate_checks_nothing(tmp_path, capfd):
    """No image with a detection to judge (a blank picture, a threshold nothing passes): status 1, one error
    line, only report.json, before anything is traced; with --force the export is written and marked."""
    import cv2

    blank = tmp_path / "blank.png"
    cv2.imwrite(str(blank), np.full((240, 320, 3), 114, np.uint8))
    args = ["--config-file", "torchvision/maskrcnn_resnet50_fpn", "--images", str(blank), "--repeats", "0",
            "MODEL.WEIGHTS", "none", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "1.0", *map(str, SIZE)]
    out = tmp_path / "out"
    r = call_tool(ROOT / "tools" / "export.py", "--output", str(out), *args, capture=capfd)
    line = one_error_line(r.stderr)
    assert r.returncode == 1 and "the parity gate has nothing to judge" in line and "nothing exported" in line
    assert "export: graph of" not in r.stdout, r.stdout  # refused before the export traced the model
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]
    report = json.loads((out / "report.json").read_text())
    assert not report["passed"] and not report["written"] and report["images"][0]["eager"] == 0
    forced = tmp_path / "forced"
    r = call_tool(ROOT / "tools" / "export.py", "--output", str(forced), "--force", *args, capture=capfd)
    assert r.returncode == 0 and "written anyway (--force)" in r.stderr, r.stderr
    assert sorted(p.name for p in forced.iterdir()) == ["config.yaml", "model.onnx", "report.json"]
    assert "FAILED (written with --force)" in (forced / "config.yaml").read_text().splitlines()[0]
    assert json.loads((forced / "report.json").read_text())["forced"]


@pytest.mark.slow
def test_sliced_inference_runs_the_graph_tile_by_tile(checkpoints, exports, tmp_path):
    """``--slice`` under an exported graph (ONNX Runtime): each tile is the graph's run of that crop; with merge
    nms every detection is one of those runs', moved by its tile's offset."""
    from minidet.slicing import SlicedPredictor, Slicing

    graph = tmp_path / "model.onnx"
    graph.write_bytes(exports("maskrcnn_benchmark"))
    cfg = config(FAMILIES["maskrcnn_benchmark"][0], *SIZE, "MODEL.RUNTIME", "onnxruntime", "MODEL.GRAPH", str(graph),
                 weights=checkpoints("maskrcnn_benchmark"))
    predictor = minidet.Predictor(cfg)
    image = images_bgr([(300, 460)], seed=4)[0]
    sliced = SlicedPredictor(predictor, Slicing(256, merge="nms"))
    out = sliced(image)
    assert out["tiles"] == 4 and len(out["scores"]) > 0
    runs = []
    for x0, y0, x1, y1 in sliced.windows(300, 460):
        o = predictor(np.ascontiguousarray(image[y0:y1, x0:x1]))
        runs.append((o["boxes"] + torch.tensor([x0, y0, x0, y0], dtype=torch.float32), o["scores"], o["labels"]))
    for k in range(len(out["scores"])):
        assert any(torch.equal(b[j], out["boxes"][k]) and torch.equal(s[j], out["scores"][k])
                   and int(lab[j]) == int(out["labels"][k]) for b, s, lab in runs for j in range(len(s))), k
