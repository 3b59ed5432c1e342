"""Weight-free speed benchmark: minidet's norm variants side by side, and against torchvision.

Usage::

    python tools/benchmark.py [--config-file CFG] [--norms FrozenBN,Affine,Affine+fold,GN,none]
        [--depths 50,101] [--batch 1,16] [--device cpu|cuda] [--amp bf16|fp16] [--size 800]
        [--image 480x640] [--iters N] [--warmup K] [--threads T] [--vs-torchvision] [--no-memory]
        [--json OUT.json] [--plot OUT.png] [KEY VALUE ...]

No checkpoint is needed. With a torchvision config (the default, v1), every depth gets one set
of weights from torchvision's own Mask R-CNN with realistic random weights (``minidet.tvref.
build_tv``: batch-norm statistics calibrated on their own input, class logits that give about
100 detections per image); minidet loads that file with each ``--norms`` variant
(``Affine+fold`` = ``MODEL.NORM Affine`` + ``MODEL.FOLD_NORM True``), and ``--vs-torchvision``
runs torchvision on the very same weights. ``GN`` (and configs torchvision cannot build) use a
randomized minidet model instead, not compared with torchvision; so does ``none``, the model
without norm layers (what ``MODEL.NORM ""`` describes: bias-free ResNet convs), against which
the norm's share of the backbone time is measured (FrozenBN, Affine, the folded variants, GN),
and which a folded model should match. The inputs are structured synthetic ``--image``
pictures, resized by both detectors to a short side of ``--size``.

Timing is interleaved: each iteration runs every model once, in turn (the order rotates by one
model per iteration), so that load on a shared machine hits all of them alike; ``--warmup``
iterations are not recorded. Per model and stage the tool prints mean, sd and median, images/s
(batch / median wall time), each variant relative to FrozenBN (GN: its extra time over FrozenBN)
and, with ``--vs-torchvision``, torchvision's time over minidet's per stage and end to end, plus
whether the detections are the same (``minidet.tvref.compare_detections``; the first difference
names the image's ``structured_image`` seed), and a table of the steps where torchvision does
avoidable work (RPN proposal selection, multi-scale RoIAlign of the box head, box post-processing,
RoIAlign of the mask head, mask paste): minidet times the steps inside its stages with
``StageTimer(detail=True)``, torchvision's are timed with hooks
(``minidet.tvref.TorchvisionStages``); the target is half of torchvision's time. Where a variant's
detections differ from torchvision's (float32 only), torchvision runs that image again after the
timing, untimed, as it is and with its model converted to channels-last, and the report says on
how many of those images torchvision itself changes: a decision (RPN NMS between two proposals of
nearly equal objectness, the top-k proposal cut, the detection cap) within float noise, flipped by
another summation order, as channels-last and folded norms have. ``--amp`` runs minidet with its
``TEST.AMP`` (network layers in bf16/fp16, box arithmetic in float32) and torchvision's whole call
under ``torch.autocast``, and reports how the detections moved from float32. Peak memory is
measured per model, as the peak during a forward above what was in use before it: on CPU in a
separate process that runs the models one after another (resident set, with freed buffers
returned to the system at once), on CUDA as memory allocated. Trailing ``KEY VALUE`` pairs
override the minidet config last.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import minidet
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import minidet

import cv2
import numpy as np
import torch
import torchvision
from torchvision.ops import box_iou

from minidet.checkpoint import CheckpointError, load_checkpoint
from minidet.config import ConfigError
from minidet.fileio import atomic_write, write_json
from minidet.norm import Conv2d, FrozenBN
from minidet.synthetic import calibrate_norm_stats, randomize_affine, structured_image
from minidet.timing import DETAILS, STAGES, StageTimer, format_table, summarize
from minidet.tvref import TorchvisionStages, build_tv, compare_detections, to_tv_input, tv_skeleton

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
VARIANTS = {  # name -> (MODEL.NORM, MODEL.FOLD_NORM)
    "FrozenBN": ("FrozenBN", False),
    "FrozenBN+fold": ("FrozenBN", True),
    "Affine": ("Affine", False),
    "Affine+fold": ("Affine", True),
    "GN": ("GN", False),
    "none": ("", False),  # no norm layer at all (see strip_norms)
}
OWN_WEIGHTS = ("GN", "none")  # variants that cannot load the frozen-BN weights: randomized minidet models
TV = "torchvision"
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# same detections: count, labels, boxes within 1e-2 px, scores within 1e-4, and per mask an IoU
# >= 0.99 or at most this many differing pixels (threshold rounding flips single pixels)
MASK_PIXEL_TOL = 2
# the steps where torchvision does avoidable work (timed steps inside stages, and the paste stage):
# the target is that minidet takes at most 1 / STEP_TARGET of torchvision's time in each
STEPS = (*DETAILS, "paste")
STEP_TARGET = 2.0  # "half" in the printed table
PAIRED_MIN = 3  # iterations needed before per-iteration ratios are called within or beyond the noise


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmark.py", description="Weight-free Mask R-CNN speed benchmark.")
    p.add_argument("--config-file", default=str(DEFAULT_CONFIG), metavar="CFG", help="yaml config file")
    p.add_argument("--norms", default="FrozenBN,Affine,Affine+fold,GN", help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--depths", default="50", help="comma list of ResNet depths (50, 101)")
    p.add_argument("--batch", default="1", help="comma list of batch sizes (images per forward)")
    p.add_argument("--device", default="cpu", help="MODEL.DEVICE, e.g. cpu, cuda")
    p.add_argument(
        "--amp", choices=["bf16", "fp16"], help="mixed precision: minidet's TEST.AMP, torchvision under torch.autocast"
    )
    p.add_argument("--size", type=int, default=800, help="short side of the network input (INPUT.MIN_SIZE_TEST)")
    p.add_argument("--image", default="480x640", metavar="HxW", help="size of the synthetic input images")
    p.add_argument("--iters", type=int, default=5, help="timed iterations")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--vs-torchvision", action="store_true", help="also run torchvision on the same weights")
    p.add_argument("--no-memory", action="store_true", help="skip the per-model peak memory measurement")
    p.add_argument("--json", metavar="OUT.json", help="write all numbers to this file")
    p.add_argument("--plot", metavar="OUT.png", help="draw a stacked bar chart of the stage times")
    p.add_argument("--memory-probe", help=argparse.SUPPRESS)  # internal: one model's memory, in a child
    p.add_argument("opts", nargs=argparse.REMAINDER, metavar="KEY VALUE", help="config overrides")
    args = p.parse_args(argv)
    try:
        args.image_hw = tuple(int(v) for v in args.image.lower().split("x"))
        args.depth_list, args.batch_list = _int_list(args.depths), _int_list(args.batch)
        assert len(args.image_hw) == 2 and min(args.image_hw) > 0
    except (ValueError, AssertionError):
        p.error(f"--image must look like 480x640, --depths and --batch like 1,16; got {args.image!r}")
    args.variants = [v.strip() for v in args.norms.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        p.error(f"--norms: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(VARIANTS)}")
    if not args.batch_list or min(args.batch_list) < 1 or not args.depth_list:
        p.error("--batch and --depths need at least one value; batch sizes >= 1")
    if "TEST.AMP" in args.opts[::2]:
        p.error("set mixed precision with --amp (it applies to torchvision too), not TEST.AMP")
    if args.iters < 1 or args.warmup < 0 or args.size < 1:
        p.error("need --iters >= 1, --warmup >= 0, --size >= 1")
    args.max_size = round(args.size * 1333 / 800)
    return args


def make_cfg(args: argparse.Namespace, norm: str = "FrozenBN", fold: bool = False, depth: int = 50):
    cfg = minidet.get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list([
        "MODEL.WEIGHTS", "", "MODEL.NORM", norm, "MODEL.FOLD_NORM", fold, "MODEL.DEVICE", args.device,
        "MODEL.RESNETS.DEPTH", depth, "INPUT.MIN_SIZE_TEST", args.size, "INPUT.MAX_SIZE_TEST", args.max_size,
    ])  # fmt: skip
    cfg.merge_from_list(args.opts)
    return cfg


def tv_version(cfg, depth: int) -> int | None:
    """torchvision's model version (1, 2) with the architecture of ``cfg`` at ``depth``, or None."""
    m = cfg.MODEL
    if m.CONVENTION != "torchvision" or m.CATEGORY_LAYOUT != "coco91" or m.ROI_HEADS.NUM_CLASSES != 91:
        return None
    if m.RESNETS.NUM_GROUPS != 1 or m.RESNETS.STRIDE_IN_1X1:
        return None
    version = 2 if m.FPN.USE_NORM else 1
    return version if version == 1 or depth == 50 else None


def apply_test_settings(model: torch.nn.Module, cfg) -> None:
    """Give torchvision's model minidet's proposal and detection settings (``KEY VALUE`` overrides too)."""
    m = model.rpn
    m._pre_nms_top_n["testing"], m._post_nms_top_n["testing"] = (
        cfg.MODEL.RPN.PRE_NMS_TOPK_TEST,
        cfg.MODEL.RPN.POST_NMS_TOPK_TEST,
    )
    m.nms_thresh, m.min_size = cfg.MODEL.RPN.NMS_THRESH, cfg.MODEL.RPN.MIN_SIZE
    h, rh = model.roi_heads, cfg.MODEL.ROI_HEADS
    h.score_thresh, h.nms_thresh, h.detections_per_img = (
        rh.SCORE_THRESH_TEST,
        rh.NMS_THRESH_TEST,
        rh.DETECTIONS_PER_IMAGE,
    )


@torch.no_grad()
def strip_norms(model: torch.nn.Module) -> int:
    """Remove the norm of every conv: the model ``MODEL.NORM ""`` describes; returns the count.

    minidet's config admits only FrozenBN, Affine and GN, so the ``none`` variant is built as a
    FrozenBN model and stripped here. Without a norm minidet builds the ResNet's convs without a
    bias and those of the FPN and heads with one; so does this (a zero bias where a norm goes).
    """
    n = 0
    for name, m in model.named_modules():
        if isinstance(m, Conv2d) and m.norm is not None:
            m.norm = None
            if m.bias is None and not name.startswith("backbone."):
                m.bias = torch.nn.Parameter(m.weight.new_zeros(m.out_channels), requires_grad=False)
            n += 1
    return n


@torch.no_grad()
def _calibrate_scales(model: torch.nn.Module, run) -> None:
    """Turn every FrozenBN into a pure per-channel scale by the root mean square of its input.

    ``run()`` executes one forward; each layer is set when the forward reaches it, so later layers
    see calibrated activations. Mean and shift are zero: folded into its conv, the scale leaves a
    conv without bias, as a model without norm layers has.
    """

    def hook(mod, args):
        x = args[0]
        mod.running_mean.zero_()
        mod.bias.zero_()
        mod.running_var.copy_(x.pow(2).mean(dim=[d for d in range(x.dim()) if d != 1]).clamp(min=1e-2))

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, FrozenBN)]
    model.eval()
    run()
    for h in handles:
        h.remove()


@torch.no_grad()
def random_minidet_weights(cfg, calib_image: np.ndarray, path: str, logit_std: float = 2.0) -> None:
    """Save a minidet state dict of ``cfg``'s architecture with realistic random weights.

    Frozen batch norms (GN is left as randomized) take the statistics of their own input on
    ``calib_image``; in the same forward the class logits are measured and ``cls_score`` is
    rescaled so that, per proposal, they spread with standard deviation ``logit_std`` over the
    classes (a trained model's confidence: about 100 detections per image). With ``MODEL.NORM
    ""`` (no norm layers) each frozen norm is calibrated as a pure scale (``_calibrate_scales``),
    multiplied into its conv and removed (``strip_norms``): the activations keep a sane range.
    """
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    base = cfg.clone()
    base.merge_from_list(["MODEL.FOLD_NORM", False, "MODEL.DEVICE", "cpu"])
    if cfg.MODEL.NORM != "GN":  # calibrate as FrozenBN; minidet loads it into any frozen norm
        base.merge_from_list(["MODEL.NORM", "FrozenBN"])
    model = minidet.build_model(base)
    randomize_affine(model, gen)
    feats = []
    hook = model.box_predictor.register_forward_pre_hook(lambda mod, args: feats.append(args[0]))
    if cfg.MODEL.NORM == "":
        _calibrate_scales(model, lambda: model([calib_image]))
        for m in model.modules():
            if isinstance(m, Conv2d) and isinstance(m.norm, FrozenBN):
                m.weight.mul_(m.norm.scale_shift()[0].view(-1, 1, 1, 1))
        strip_norms(model)
    else:
        calibrate_norm_stats(model, lambda: model([calib_image]), gen)
    hook.remove()
    cls = model.box_predictor.cls_score
    cls.weight.mul_(logit_std / (feats[0] @ cls.weight.T).std(dim=1).mean())
    torch.save(model.state_dict(), path)


def prepare_without_norm(cfg, weights: str):
    """``minidet.prepare_model`` for ``MODEL.NORM ""``: built as FrozenBN, stripped, then loaded."""
    cfg = cfg.clone()
    cfg.merge_from_list(["MODEL.NORM", "FrozenBN", "MODEL.FOLD_NORM", False, "MODEL.WEIGHTS", "none"])
    model, _ = minidet.prepare_model(cfg)
    strip_norms(model)
    return model, load_checkpoint(model, weights, bn_eps=cfg.MODEL.FROZEN_BN_EPS)


class Runner:
    """One model of the benchmark (a minidet variant or torchvision) at one depth and batch size."""

    def __init__(self, variant: str, depth: int, batch: int, weights: str, tv_version: int | None, source: str):
        self.variant, self.depth, self.batch = variant, depth, batch
        self.impl = TV if variant == TV else "minidet"
        self.weights, self.tv_version, self.source = weights, tv_version, source
        self.records: list[dict[str, float]] = []  # per timed call: {stage: seconds}
        self.detail_records: list[dict[str, float]] = []  # per timed call: {step inside a stage: seconds}
        self.walls: list[float] = []
        self.cpus: list[float] = []
        self.dets: list[int] = []
        self.memory: dict | None = None
        self.checks: list = []  # DetectionMatch per image, against torchvision
        self.check_images: list[tuple[int, int]] = []  # per check: (batch in the image pool, image in it)
        self.tv_channels_last: list | None = None  # per check where ours differs: torchvision-CL vs torchvision
        self.drift: dict | None = None

    def label(self, depths: list[int], batches: list[int]) -> str:
        parts = [self.variant]
        if len(depths) > 1:
            parts.append(f"R{self.depth}")
        if len(batches) > 1:
            parts.append(f"b{self.batch}")
        return " ".join(parts)

    def spec(self) -> dict:
        return {
            "variant": self.variant,
            "depth": self.depth,
            "batch": self.batch,
            "weights": self.weights,
            "tv_version": self.tv_version,
            "source": self.source,
        }

    def load(self, args: argparse.Namespace) -> None:
        """Build the model on ``args.device``; ``self(images)`` then runs it on BGR uint8 images."""
        self.device = device = torch.device(args.device)
        if self.impl == TV:
            model = tv_skeleton(self.tv_version, args.size, args.max_size, self.depth)
            model.load_state_dict(torch.load(self.weights, weights_only=True))
            apply_test_settings(model, make_cfg(args, depth=self.depth))
            self._prepare = lambda images: [to_tv_input(im).to(device) for im in images]  # its own input format
            self._forward = TorchvisionStages(model.to(device), device)
        else:
            norm, fold = VARIANTS[self.variant]
            if norm:
                model, report = minidet.prepare_model(make_cfg(args, norm, fold, self.depth), weights=self.weights)
            else:
                model, report = prepare_without_norm(make_cfg(args, depth=self.depth), self.weights)
            if report is not None and (report.missing or report.unexpected):
                raise CheckpointError(f"{self.variant}: weights do not fit: {report}")
            model.timer = StageTimer(enabled=True, device=device, detail=True)

            def forward(images: list[np.ndarray]) -> tuple[list[dict], dict[str, float], dict[str, float]]:
                model.timer.reset()
                outs = model(images)
                return outs, dict(model.timer.times), dict(model.timer.details)

            self._prepare, self._forward = list, forward
        self._model = model
        self.set_amp(args.amp)

    def set_amp(self, amp: str | None) -> None:
        """Mixed precision: minidet's own ``TEST.AMP`` (network layers only, box math float32);
        torchvision's whole call under ``torch.autocast``, the way its users run it."""
        self.amp = AMP_DTYPES.get(amp or "")
        if self.impl != TV:
            self._model.amp_dtype = self.amp

    def __call__(self, images: list[np.ndarray]):
        """One forward -> (detections, {stage: seconds}, {step: seconds}, wall s, process CPU s).

        The steps (``minidet.timing.DETAILS``) lie inside the stages and do not add to the wall
        time. The input conversion is not timed. CPU time (all threads) hardly grows when other
        processes take the cores, so it is a second, load-robust view of the cost on CPU.
        """
        inputs = self._prepare(images)
        cuda = self.device.type == "cuda"
        autocast = contextlib.nullcontext()
        if self.impl == TV and self.amp is not None:
            autocast = torch.autocast(self.device.type, dtype=self.amp)
        if cuda:
            torch.cuda.synchronize(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        with autocast:
            outs, times, details = self._forward(inputs)
        if cuda:
            torch.cuda.synchronize(self.device)
        return outs, times, details, time.perf_counter() - t0, time.process_time() - c0

    def channels_last_changes(self, images: list[np.ndarray]) -> list:
        """torchvision only: per image, how its detections move when its model is converted to
        channels-last (``DetectionMatch`` of channels-last vs its default layout, both run now).

        Untimed, after the timing loop; the model is converted back to the default layout.
        """
        ref = binarize_tv(self(images)[0])
        self._model.to(memory_format=torch.channels_last)
        try:
            new = binarize_tv(self(images)[0])
        finally:
            self._model.to(memory_format=torch.contiguous_format)
        return list(map(compare_detections, new, ref))


def binarize_tv(outs: list[dict]) -> list[dict]:
    """torchvision's pasted mask probabilities (D, 1, H, W) -> (D, H, W) bool, as minidet thresholds."""
    for o in outs:
        o["masks"] = o["masks"][:, 0] > 0.5
    return outs


def detection_drift(refs: list[dict], news: list[dict], iou_min: float = 0.5) -> dict:
    """How much ``news`` detections moved from ``refs`` (e.g. AMP vs fp32), image by image.

    Each reference detection, in score order, takes the unused new detection of its label with
    the highest box IoU (at least ``iou_min``). Returns counts, matches and box/score changes.
    """
    n_ref = n_new = matched = 0
    box_diffs, score_diffs = [], []
    for ref, new in zip(refs, news):
        n_ref, n_new = n_ref + len(ref["boxes"]), n_new + len(new["boxes"])
        if not len(ref["boxes"]) or not len(new["boxes"]):
            continue
        iou = box_iou(ref["boxes"].float(), new["boxes"].float())
        iou[ref["labels"][:, None] != new["labels"][None, :]] = -1
        for i in ref["scores"].argsort(descending=True).tolist():
            j = int(iou[i].argmax())
            if iou[i, j] >= iou_min:
                iou[:, j] = -1
                matched += 1
                box_diffs.append(float((new["boxes"][j].float() - ref["boxes"][i].float()).abs().max()))
                score_diffs.append(float((new["scores"][j].float() - ref["scores"][i].float()).abs()))
    return {
        "detections_fp32": n_ref,
        "detections_amp": n_new,
        "matched": matched,
        "box_diff_px_median": statistics.median(box_diffs) if box_diffs else None,
        "box_diff_px_max": max(box_diffs) if box_diffs else None,
        "score_diff_max": max(score_diffs) if score_diffs else None,
    }


def _status(key: str) -> int:
    """A ``/proc/self/status`` field in KiB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _trim() -> None:
    """Give the C heap's free memory back to the system, so the resident set is live memory."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def memory_probe(args: argparse.Namespace) -> int:
    """Child process: per model, load it, run two forwards, measure the second; print JSON.

    The parent starts it with ``MALLOC_MMAP_THRESHOLD_`` fixed, so freed buffers go back to the
    system and the resident set follows live memory. Before the second forward the peak is
    reset (``/proc/self/clear_refs``): ``forward_mib`` is the peak resident set during that
    forward minus the resident set before it (activations, outputs, kernel workspaces).
    """
    images: dict[int, list[np.ndarray]] = {}
    results = []
    for spec in json.loads(args.memory_probe):
        runner = Runner(**spec)
        runner.load(args)
        if runner.batch not in images:
            images[runner.batch] = [structured_image(*args.image_hw, seed=i) for i in range(runner.batch)]
        runner(images[runner.batch])
        gc.collect()
        _trim()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status("VmRSS")
        runner(images[runner.batch])
        results.append({"forward_mib": (_status("VmHWM") - before) / 1024})
        del runner
        gc.collect()
    print(json.dumps(results))
    return 0


def measure_memory_cpu(args: argparse.Namespace, runners: list[Runner]) -> None:
    """Set ``runner.memory`` of every runner, measured in one fresh process (see ``memory_probe``)."""
    specs = json.dumps([r.spec() for r in runners])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--config-file", args.config_file, "--size", str(args.size),
           "--image", args.image, "--device", "cpu", "--memory-probe", specs]  # fmt: skip
    cmd += ["--threads", str(args.threads)] if args.threads else []
    cmd += ["--amp", args.amp] if args.amp else []
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run([*cmd, *args.opts], env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        print(f"warning: memory measurement failed: {proc.stderr.strip()[-400:]}", file=sys.stderr)
        return
    for r, mem in zip(runners, json.loads(proc.stdout.strip().splitlines()[-1])):
        r.memory = mem


def build_runners(args: argparse.Namespace, tmp: str, calib_image: np.ndarray) -> list[Runner]:
    """Make the weights of every depth and the runners, torchvision first in each group."""
    runners = []
    for depth in args.depth_list:
        version = tv_version(make_cfg(args, depth=depth), depth)
        frozen = [v for v in args.variants if v not in OWN_WEIGHTS]
        paths: dict[str, tuple[str, str]] = {}
        if frozen or (args.vs_torchvision and version):
            if version:
                path = os.path.join(tmp, f"tv{version}_r{depth}.pth")
                torch.save(build_tv(version, args.size, args.max_size, depth=depth).state_dict(), path)
                paths["frozen"] = (path, f"torchvision v{version} R-{depth}, randomized (minidet.tvref.build_tv)")
            else:
                path = os.path.join(tmp, f"minidet_r{depth}.pth")
                random_minidet_weights(make_cfg(args, depth=depth), calib_image, path)
                paths["frozen"] = (path, f"minidet R-{depth}, randomized (FrozenBN calibrated)")
        if "GN" in args.variants:
            path = os.path.join(tmp, f"gn_r{depth}.pth")
            random_minidet_weights(make_cfg(args, "GN", depth=depth), calib_image, path)
            paths["GN"] = (path, f"minidet GN R-{depth}, randomized")
        if "none" in args.variants:
            path = os.path.join(tmp, f"none_r{depth}.pth")
            random_minidet_weights(make_cfg(args, "", depth=depth), calib_image, path)
            paths["none"] = (path, f"minidet R-{depth} without norm layers (bias-free ResNet convs), randomized")
        for batch in args.batch_list:
            if args.vs_torchvision and version:
                runners.append(Runner(TV, depth, batch, paths["frozen"][0], version, paths["frozen"][1]))
            for v in args.variants:
                path, source = paths[v if v in OWN_WEIGHTS else "frozen"]
                runners.append(Runner(v, depth, batch, path, version, source))
    return runners


def run_benchmark(args: argparse.Namespace, runners: list[Runner]) -> None:
    """The timing loop: every iteration runs each model once, in turn, and checks detections; then,
    untimed, torchvision's channels-last baseline where they differ (``channels_last_baseline``)."""
    device = torch.device(args.device)
    n_pool = min(args.iters + args.warmup, 4)
    h, w = args.image_hw
    pools = {
        b: [[structured_image(h, w, seed=k * b + i) for i in range(b)] for k in range(n_pool)] for b in args.batch_list
    }
    if args.amp:  # detection change of AMP vs fp32, on the first batch (also warms up)
        for r in runners:
            r.set_amp(None)
            ref = r(pools[r.batch][0])[0]
            r.set_amp(args.amp)
            new = r(pools[r.batch][0])[0]
            if r.impl == TV:
                ref, new = binarize_tv(ref), binarize_tv(new)
            r.drift = detection_drift(ref, new)
    with_ref = {(r.depth, r.batch) for r in runners if r.impl == TV}
    for it in range(args.warmup + args.iters):
        k = it % len(runners)
        refs: dict[tuple[int, int], list[dict]] = {}  # torchvision's detections in this iteration, per group
        pending: dict[tuple[int, int], list] = {}  # (runner, detections) that ran before torchvision
        for r in runners[k:] + runners[:k]:  # the order rotates: no model always follows the same one
            group = (r.depth, r.batch)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
            outs, times, details, wall, cpu = r(pools[r.batch][it % n_pool])
            if device.type == "cuda":
                peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20
                r.memory = {"cuda_forward_mib": max(peak, (r.memory or {}).get("cuda_forward_mib", 0.0))}
            if it >= args.warmup:
                r.records.append(times)
                r.detail_records.append(details)
                r.walls.append(wall)
                r.cpus.append(cpu)
                r.dets.extend(len(o["boxes"]) for o in outs)
            if r.impl == TV:
                refs[group] = binarize_tv(outs)
                for other, other_outs in pending.pop(group, []):
                    _check(other, other_outs, refs[group], it % n_pool)
            elif r.variant not in OWN_WEIGHTS and group in with_ref:
                if group in refs:
                    _check(r, outs, refs[group], it % n_pool)
                else:
                    pending.setdefault(group, []).append((r, outs))
        print(
            f"iteration {it + 1}/{args.warmup + args.iters}" + (" (warm-up)" if it < args.warmup else ""),
            file=sys.stderr,
            flush=True,
        )
    if not args.amp:
        channels_last_baseline(runners, pools)


def _check(r: Runner, outs: list[dict], ref: list[dict], pool_index: int) -> None:
    """Compare a minidet runner's detections with torchvision's, image by image, and note the images."""
    r.checks.extend(map(compare_detections, outs, ref))
    r.check_images.extend((pool_index, i) for i in range(len(outs)))


def channels_last_baseline(runners: list[Runner], pools: dict[int, list[list[np.ndarray]]]) -> None:
    """Where a minidet variant's detections differ from torchvision's, does torchvision itself change
    its detections on that image when its model is converted to channels-last? (fp32 only.)

    Decisions such as NMS between two proposals of nearly equal objectness, the top-k proposal cut
    or the detection cap can sit within float noise; a different summation order (channels-last,
    folded norms) then flips them. Sets ``runner.tv_channels_last``: per check, torchvision-CL vs
    torchvision (``DetectionMatch``) where the check failed, else None. Each image pool batch is
    run once per torchvision model (a cache shared by the variants), after the timing: untimed.
    """
    tvs = {(r.depth, r.batch): r for r in runners if r.impl == TV}
    cache: dict[tuple[int, int, int], list] = {}  # (depth, batch, pool index) -> DetectionMatch per image
    for r in runners:
        tv = tvs.get((r.depth, r.batch))
        if r.impl == TV or tv is None or not r.checks:
            continue
        r.tv_channels_last = []
        for check, (k, i) in zip(r.checks, r.check_images):
            if not check.problem(pixel_tol=MASK_PIXEL_TOL):
                r.tv_channels_last.append(None)
                continue
            key = (r.depth, r.batch, k)
            if key not in cache:
                seeds = f"{k * r.batch}" + (f"-{k * r.batch + r.batch - 1}" if r.batch > 1 else "")
                print(
                    f"torchvision in channels-last (untimed): R-{r.depth}, image seed {seeds}",
                    file=sys.stderr,
                    flush=True,
                )
                cache[key] = tv.channels_last_changes(pools[r.batch][k])
            r.tv_channels_last.append(cache[key][i])


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _increase(a: float, b: float) -> float | None:
    """How much longer ``a`` takes than ``b``, as a fraction of ``b``."""
    return a / b - 1 if b > 0 else None


def _detail_stats(records: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """``summarize`` of the per-step records, in ``DETAILS`` order and without a total (steps lie inside stages)."""
    stats = summarize(records)
    names = [d for d in DETAILS if d in stats] + sorted(set(stats) - set(DETAILS) - {"total"})
    return {d: stats[d] for d in names}


def _steps(row: dict) -> dict[str, dict[str, float]]:
    """A row's statistics of the ``STEPS`` it has: the timed steps and the paste stage."""
    both = {**row["details"], **{s: v for s, v in row["stages"].items() if s != "total"}}
    return {s: both[s] for s in STEPS if s in both}


def analyze(args: argparse.Namespace, runners: list[Runner]) -> list[dict]:
    """All numbers per runner, with the relations to FrozenBN and torchvision of its group."""
    rows = []
    for r in runners:
        stats = summarize(r.records)
        wall = summarize([{"wall": w} for w in r.walls])["wall"]
        cpu = summarize([{"cpu": c} for c in r.cpus])["cpu"]
        rows.append(
            {
                "label": r.label(args.depth_list, args.batch_list),
                "impl": r.impl,
                "variant": r.variant,
                "depth": r.depth,
                "batch": r.batch,
                "weights": r.source,
                "stages": stats,
                "details": _detail_stats(r.detail_records),
                "wall": wall,
                "cpu": cpu,
                "images_per_s": r.batch / wall["median"],
                "memory": r.memory,
                "amp_drift": r.drift,
                "detections_per_image": {"mean": statistics.fmean(r.dets), "min": min(r.dets), "max": max(r.dets)},
                "vs_frozenbn": None,
                "vs_torchvision": None,
                "norm_share_of_backbone": None,
                "vs_none": None,
                "vs_batch1": None,
            }
        )
    for row, r in zip(rows, runners):
        one = next((x for x in runners if (x.variant, x.depth, x.batch) == (r.variant, r.depth, 1)), None)
        if r.batch > 1 and one is not None:  # throughput over the same model's at batch 1, same rounds
            paired = [a * r.batch / b for a, b in zip(one.walls, r.walls)]  # batch-1 time / per-image time
            row["vs_batch1"] = {
                "throughput_ratio": _ratio(statistics.median(one.walls), statistics.median(r.walls) / r.batch),
                "paired_median": statistics.median(paired),
                "paired_min": min(paired),
                "paired_max": max(paired),
            }
        group = [(o, x) for o, x in zip(rows, runners) if (x.depth, x.batch) == (r.depth, r.batch)]
        by = {x.variant: o for o, x in group}
        base = by.get("FrozenBN")
        if base is not None and r.impl != TV:
            bb, bb_fb = row["stages"]["backbone"]["median"], base["stages"]["backbone"]["median"]
            row["vs_frozenbn"] = {
                "speed": _ratio(base["wall"]["median"], row["wall"]["median"]),
                "stages": {s: _ratio(v["median"], base["stages"][s]["median"]) for s, v in row["stages"].items()},
                # this variant's extra time over FrozenBN's, as a fraction of FrozenBN's (0.25: 25% slower)
                "backbone_increase": _increase(bb, bb_fb),
                "end_to_end_increase": _increase(row["wall"]["median"], base["wall"]["median"]),
            }
        folded = by.get("Affine+fold") or by.get("FrozenBN+fold")
        if folded is not None and r.variant in VARIANTS and r.variant not in OWN_WEIGHTS:
            bb, bf = row["stages"]["backbone"]["median"], folded["stages"]["backbone"]["median"]
            row["norm_share_of_backbone"] = (bb - bf) / bb
        none = by.get("none")
        if none is not None and r.impl != TV and r.variant != "none":
            none_r = next(x for o, x in group if o is none)
            bb, bn = row["stages"]["backbone"]["median"], none["stages"]["backbone"]["median"]
            paired = [_ratio(a["backbone"], b["backbone"]) for a, b in zip(r.records, none_r.records)]
            paired = [v for v in paired if v is not None]
            row["vs_none"] = {
                "backbone_s": bb,
                "none_backbone_s": bn,
                "backbone_ratio": _ratio(bb, bn),
                "norm_cost": _increase(bb, bn),  # the norm's time as a fraction of the no-norm backbone's
                "paired_backbone_ratio": {  # per iteration (the models run in the same rounds)
                    "n": len(paired),
                    "median": statistics.median(paired) if paired else None,
                    "min": min(paired, default=None),
                    "max": max(paired, default=None),
                },
            }
        tv = by.get(TV)
        if tv is not None and r.impl != TV and r.variant not in OWN_WEIGHTS:
            tv_r = next(x for o, x in group if o is tv)
            paired = [a / b for a, b in zip(tv_r.walls, r.walls)]
            problems = [c.problem(pixel_tol=MASK_PIXEL_TOL) for c in r.checks]
            steps, tv_steps = _steps(row), _steps(tv)
            step_ratios = {s: _ratio(tv_steps[s]["median"], v["median"]) for s, v in steps.items() if s in tv_steps}
            row["vs_torchvision"] = {
                "end_to_end": {
                    "ratio_of_medians": _ratio(tv["wall"]["median"], row["wall"]["median"]),
                    "ratio_of_mins": _ratio(tv["wall"]["min"], row["wall"]["min"]),
                    "ratio_of_cpu_medians": _ratio(tv["cpu"]["median"], row["cpu"]["median"]),
                    "paired_median": statistics.median(paired),
                    "paired_sd": statistics.stdev(paired) if len(paired) > 1 else 0.0,
                },
                "stages": {
                    s: _ratio(tv["stages"][s]["median"], v["median"])
                    for s, v in row["stages"].items()
                    if s in tv["stages"]
                },
                "steps": step_ratios,  # torchvision's median / minidet's, per step where it does avoidable work
                "steps_target": STEP_TARGET,
                "steps_met": {s: v is not None and v >= STEP_TARGET for s, v in step_ratios.items()},
                "detections": {
                    "images": len(r.checks),
                    "same": problems.count(""),
                    "first_problem": next((p for p in problems if p), None),
                    "first_problem_image_seed": next(
                        (k * r.batch + i for p, (k, i) in zip(problems, r.check_images) if p), None
                    ),  # structured_image(H, W, seed=...) of the first image that differs
                    "worst_box_px": max((c.worst_box for c in r.checks), default=None),
                    "worst_score": max((c.worst_score for c in r.checks), default=None),
                    "worst_mask_iou": min((c.worst_iou for c in r.checks), default=None),
                    "worst_mask_pixels": max((c.worst_pixels for c in r.checks), default=None),
                    "paste_grid_flips": sum(c.grid_flips for c in r.checks),
                    "tv_channels_last": _tv_channels_last(problems, r.tv_channels_last),
                },
            }
    return rows


def _tv_channels_last(problems: list[str], changes: list | None) -> dict | None:
    """Of the images where a variant differs from torchvision, those on which torchvision itself
    changes when its model is converted to channels-last; None where not measured (``--amp``)."""
    if changes is None:
        return None
    runs = [c.problem(pixel_tol=MASK_PIXEL_TOL) for p, c in zip(problems, changes) if p and c is not None]
    return {
        "images": len(runs),  # differing images on which torchvision ran in channels-last too
        "changed": sum(map(bool, runs)),  # ... and gave detections different from its default layout
        "first_change": next((p for p in runs if p), None),
    }


def _load() -> tuple[float, float, float] | None:
    """The system load average: other processes competing for the cores during the timing."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def environment(args: argparse.Namespace) -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    git = {}
    for key, cmd in (("commit", ["git", "rev-parse", "HEAD"]), ("dirty", ["git", "status", "--porcelain", "-uno"])):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True, timeout=20).stdout.strip()
            git[key] = out if key == "commit" else bool(out)
    device = torch.device(args.device)
    return {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "git": git,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "load_average": _load(),
    }


def settings(args: argparse.Namespace) -> dict:
    keys = ("config_file", "variants", "depth_list", "batch_list", "device", "amp", "size", "max_size", "image")
    keys += ("iters", "warmup", "threads", "vs_torchvision", "no_memory", "opts")
    return {k: getattr(args, k) for k in keys}


def _fmt(v: float | None, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def report(args: argparse.Namespace, rows: list[dict]) -> str:
    """The printed summary: per-model tables, a comparison table, ratios, the step table, verdicts."""
    out = []
    for row in rows:
        title = f"{row['label']} ({row['impl']}, R-{row['depth']}, batch {row['batch']}), ms per forward:"
        out += [format_table(row["stages"], title=title), ""]
    stages = [s for s in STAGES if any(s in row["stages"] for row in rows)]
    width = max(12, *(len(row["label"]) + 1 for row in rows))
    cols = [*(s[:9] for s in stages), "wall", "(sd)", "min", "cpu", "img/s", "vs FrozenBN", "vs tv", "dets", "mem MiB"]
    out.append(f"{'median ms':<{width}}" + "".join(f"{c:>{max(9, len(c) + 1)}}" for c in cols))
    for row in rows:
        mem = row["memory"] or {}
        ratio_fb = (row["vs_frozenbn"] or {}).get("speed")
        ratio_tv = (row["vs_torchvision"] or {}).get("end_to_end", {}).get("ratio_of_medians")
        cells = [f"{1e3 * row['stages'][s]['median']:.1f}" if s in row["stages"] else "-" for s in stages]
        cells += [f"{1e3 * row['wall'][k]:.1f}" for k in ("median", "std", "min")]
        cells += [f"{1e3 * row['cpu']['median']:.1f}", f"{row['images_per_s']:.2f}"]
        cells += [
            _fmt(ratio_fb, ".2f") + "x" * (ratio_fb is not None),
            _fmt(ratio_tv, ".2f") + "x" * (ratio_tv is not None),
        ]
        cells += [
            f"{row['detections_per_image']['mean']:.0f}",
            _fmt(mem.get("forward_mib", mem.get("cuda_forward_mib")), ".0f"),
        ]
        out.append(f"{row['label']:<{width}}" + "".join(f"{v:>{max(9, len(c) + 1)}}" for v, c in zip(cells, cols)))
    out.append(
        "(wall: per forward, median (sd) and min; cpu: median process CPU time per forward; vs FrozenBN: "
        "FrozenBN's median wall / this one's; vs tv: "
        "torchvision's / minidet's; mem: peak of "
        + ("the resident set" if args.device == "cpu" else "CUDA memory allocated")
        + " during a forward, above the loaded model)"
    )
    for row in rows:
        vs = row["vs_torchvision"]
        if vs:
            e = vs["end_to_end"]
            ratios = "  ".join(f"{s} {_fmt(v, '.2f')}" for s, v in vs["stages"].items() if s != "total")
            out.append(
                f"torchvision / {row['label']}: end to end {e['ratio_of_medians']:.2f}x (paired "
                f"{e['paired_median']:.2f} sd {e['paired_sd']:.2f}; minima {e['ratio_of_mins']:.2f}x; CPU time "
                f"{e['ratio_of_cpu_medians']:.2f}x); "
                f"per stage: {ratios}"
            )
            d = vs["detections"]
            if d["same"] == d["images"]:
                verdict = f"same detections as torchvision on {d['same']}/{d['images']} images"
            else:
                verdict = f"DIFFERENT detections from torchvision on {d['images'] - d['same']}/{d['images']} images"
            verdict += " (autocast: differences expected)" if args.amp else ""
            out.append(
                f"  {verdict} (worst box {_fmt(d['worst_box_px'], '.2g')}"
                f" px, score {_fmt(d['worst_score'], '.2g')}, mask IoU {_fmt(d['worst_mask_iou'], '.4f')}, "
                f"at most {_fmt(d['worst_mask_pixels'], 'd')} mask pixels differ"
                + (
                    f"; {d['paste_grid_flips']} masks pasted 1 px apart: box at a paste-grid boundary"
                    * bool(d["paste_grid_flips"])
                )
                + ")"
                + (
                    f"; first difference (image seed {d['first_problem_image_seed']}): {d['first_problem']}"
                    if d["first_problem"]
                    else ""
                )
            )
            cl = d["tv_channels_last"]
            if cl and cl["images"]:
                out.append(
                    f"  on {cl['changed']} of these {cl['images']} images torchvision itself changes under "
                    "channels-last (float summation order)"
                    + (f"; first change: {cl['first_change']}" if cl["first_change"] else "")
                )
    for row in rows:
        b = row["vs_batch1"]
        if b:
            out.append(
                f"{row['label']}: throughput {b['throughput_ratio']:.3f}x batch 1's (images/s, ratio of medians; "
                f"per iteration {b['paired_median']:.3f}, {b['paired_min']:.3f} to {b['paired_max']:.3f})"
            )
    out += step_table(rows)
    for row in rows:
        if row["norm_share_of_backbone"] is not None and row["variant"] in ("FrozenBN", "Affine"):
            out.append(
                f"{row['label']}: norm share of backbone time {100 * row['norm_share_of_backbone']:.1f}% "
                "(backbone median vs the folded variant, which runs no norm op)"
            )
        out += _vs_none_lines(row)
        fb = row["vs_frozenbn"]
        if row["variant"] == "GN" and fb and fb["backbone_increase"] is not None:
            out.append(
                f"{row['label']} over FrozenBN{row['label'][len(row['variant']) :]}: backbone "
                f"{100 * fb['backbone_increase']:+.1f}%, end to end {_fmt(fb['end_to_end_increase'], '+.1%')}"
            )
        if row["amp_drift"]:
            d = row["amp_drift"]
            out.append(
                f"{row['label']}: {args.amp} vs fp32: {d['detections_amp']} vs {d['detections_fp32']} "
                f"detections, {d['matched']} matched (IoU>=0.5, same label); box change median "
                f"{_fmt(d['box_diff_px_median'], '.3g')} max {_fmt(d['box_diff_px_max'], '.3g')} px, "
                f"score change max {_fmt(d['score_diff_max'], '.3g')}"
            )
    return "\n".join(out)


def _vs_none_lines(row: dict) -> list[str]:
    """The norm's cost measured against the model without norm layers; for a folded variant
    also whether it is distinguishable from that model."""
    vn = row["vs_none"]
    if not vn or vn["norm_cost"] is None:
        return []
    none_label = "none" + row["label"][len(row["variant"]) :]
    ms, none_ms = 1e3 * vn["backbone_s"], 1e3 * vn["none_backbone_s"]
    out = [
        f"{row['label']}: norm share measured against no norm: backbone {100 * vn['norm_cost']:+.1f}% "
        f"({ms:.1f} ms vs {none_ms:.1f} ms of {none_label}, which has no norm layers)"
    ]
    if VARIANTS.get(row["variant"], ("", False))[1]:
        p = vn["paired_backbone_ratio"]
        spread = f"; per iteration {p['min']:.3f} to {p['max']:.3f}" if p["n"] > 1 else ""
        if p["n"] < PAIRED_MIN:
            spread += f": too few iterations to judge (< {PAIRED_MIN})"
        elif p["min"] <= 1 <= p["max"]:
            spread += ": within the noise"
        else:
            spread += f": folded {'slower' if p['min'] > 1 else 'faster'} in each of {p['n']} iterations"
        out.append(
            f"folded vs no norm: backbone {ms:.1f} ms vs {none_ms:.1f} ms (ratio {vn['backbone_ratio']:.3f}"
            f"{spread}; {row['label']} vs {none_label})"
        )
    return out


def step_table(rows: list[dict]) -> list[str]:
    """Lines of the per-step comparison with torchvision (``STEPS``), one block per minidet variant;
    none without torchvision."""
    compared = [row for row in rows if row["vs_torchvision"]]
    if not compared:
        return []
    tv_rows = {(row["depth"], row["batch"]): row for row in rows if row["impl"] == TV}
    width = max(12, *(len(row["label"]) + 1 for row in compared))
    out = [
        "steps where torchvision does avoidable work (target: minidet at most half of torchvision's time), median ms:",
        f"{'model':<{width}}{'step':<16}{'torchvision':>12}{'minidet':>10}{'tv/minidet':>12}  target",
    ]
    for row in compared:
        tv_steps, steps = _steps(tv_rows[row["depth"], row["batch"]]), _steps(row)
        vs = row["vs_torchvision"]
        for i, (s, ratio) in enumerate(vs["steps"].items()):
            verdict = "-" if ratio is None else "met" if vs["steps_met"][s] else "not met"
            out.append(
                f"{row['label'] if i == 0 else '':<{width}}{s:<16}{1e3 * tv_steps[s]['median']:12.2f}"
                f"{1e3 * steps[s]['median']:10.2f}{_fmt(ratio, '.2f') + 'x' * (ratio is not None):>12}  {verdict}"
            )
    out.append(
        "(steps inside stages: rpn_select = RPN without its head convs (top-k, decode, clip, NMS), box_roi_align = "
        "multi-scale RoIAlign of the box head, box_postprocess = softmax, decode, clip, per-class NMS, top-k, "
        "mask_roi_align = RoIAlign of the mask head; paste is the stage)"
    )
    return out


_COLORS = {  # BGR
    "preprocess": (160, 160, 160),
    "backbone": (180, 119, 31),
    "fpn": (14, 127, 255),
    "rpn": (44, 160, 44),
    "box_head": (40, 39, 214),
    "mask_head": (189, 103, 148),
    "paste": (75, 86, 140),
}


def _nice_step(top: float, ticks: int = 6) -> float:
    raw = top / ticks
    mag = 10 ** np.floor(np.log10(raw))
    return float(next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw))


def draw_chart(rows: list[dict], title: str, path: str) -> None:
    """Stacked bars, one per model: the median time of each stage per image, in ms."""
    font, aa = cv2.FONT_HERSHEY_SIMPLEX, cv2.LINE_AA
    stages = [s for s in STAGES if any(s in r["stages"] for r in rows)]
    vals = [[1e3 * r["stages"].get(s, {"median": 0.0})["median"] / r["batch"] for s in stages] for r in rows]
    top = max(sum(v) for v in vals) * 1.08 or 1.0
    step = _nice_step(top)
    top = step * np.ceil(top / step)
    slot, left, legend_w, y0, y1 = 120, 90, 170, 70, 470
    width, height = left + slot * len(rows) + legend_w + 20, 560
    img = np.full((height, width, 3), 255, np.uint8)
    cv2.putText(img, title, (left - 70, 28), font, 0.6, (0, 0, 0), 1, aa)
    cv2.putText(
        img, "ms per image: median of each stage, bar = their sum", (left - 70, 55), font, 0.45, (60, 60, 60), 1, aa
    )
    ys = lambda v: int(round(y1 - (y1 - y0) * v / top))  # noqa: E731
    for k in range(int(round(top / step)) + 1):
        y = ys(k * step)
        cv2.line(img, (left, y), (left + slot * len(rows), y), (225, 225, 225), 1, aa)
        label = f"{k * step:g}"
        (tw, _), _ = cv2.getTextSize(label, font, 0.42, 1)
        cv2.putText(img, label, (left - 8 - tw, y + 5), font, 0.42, (60, 60, 60), 1, aa)
    cv2.line(img, (left, y0), (left, y1), (0, 0, 0), 1, aa)
    cv2.line(img, (left, y1), (left + slot * len(rows), y1), (0, 0, 0), 1, aa)
    for i, (row, v) in enumerate(zip(rows, vals)):
        x0 = left + slot * i + 25
        x1, acc = x0 + slot - 50, 0.0
        for s, ms in zip(stages, v):
            ya, yb = ys(acc + ms), ys(acc)
            cv2.rectangle(img, (x0, ya), (x1, yb), _COLORS.get(s, (120, 120, 120)), -1)
            if yb - ya >= 14:
                text = f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}"
                (tw, th), _ = cv2.getTextSize(text, font, 0.38, 1)
                cv2.putText(img, text, ((x0 + x1 - tw) // 2, (ya + yb + th) // 2), font, 0.38, (255, 255, 255), 1, aa)
            acc += ms
        text = f"{acc:.0f}" if acc >= 10 else f"{acc:.1f}"
        (tw, _), _ = cv2.getTextSize(text, font, 0.45, 1)
        cv2.putText(img, text, ((x0 + x1 - tw) // 2, ys(acc) - 6), font, 0.45, (0, 0, 0), 1, aa)
        lines = row["label"].split(" ") + ([f"R{row['depth']} b{row['batch']}"] if " " not in row["label"] else [])
        for j, part in enumerate(lines[:3]):
            (tw, _), _ = cv2.getTextSize(part, font, 0.45, 1)
            cv2.putText(img, part, (x0 + (x1 - x0 - tw) // 2, y1 + 22 + 18 * j), font, 0.45, (0, 0, 0), 1, aa)
    lx = left + slot * len(rows) + 20
    for j, s in enumerate(reversed(stages)):
        y = y0 + 22 * j
        cv2.rectangle(img, (lx, y), (lx + 16, y + 14), _COLORS.get(s, (120, 120, 120)), -1)
        cv2.putText(img, s, (lx + 24, y + 12), font, 0.45, (0, 0, 0), 1, aa)
    ok, png = cv2.imencode(".png", img)
    if not ok:
        raise RuntimeError(f"could not encode the chart for {path}")
    atomic_write(path, png.tobytes())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        return memory_probe(args)
    device = torch.device(args.device)
    try:
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"--device {args.device} but CUDA is not available")
        with tempfile.TemporaryDirectory(prefix="minidet-bench-") as tmp:
            runners = build_runners(args, tmp, structured_image(*args.image_hw, seed=1000))
            if args.vs_torchvision and not any(r.impl == TV for r in runners):
                raise ConfigError("--vs-torchvision needs a torchvision config (configs/torchvision/*)")
            for r in runners:
                r.load(args)
            env = environment(args)
            print(
                f"torch {env['torch']}, torchvision {env['torchvision']}, python {env['python']}, "
                f"{env['threads']} threads, {env['cpu']} ({env['cpu_count']} cpus), device {device}"
                + (f" ({env['gpu']})" if env["gpu"] else "")
                + (f", autocast {args.amp}" if args.amp else "")
            )
            print(
                f"config {args.config_file}; input {args.image} -> short side {args.size} (max {args.max_size}); "
                f"warm-up {args.warmup}, iters {args.iters}, interleaved (order rotating each iteration): "
                + ", ".join(r.label(args.depth_list, args.batch_list) for r in runners)
            )
            for source in dict.fromkeys(r.source for r in runners):
                print(f"weights: {source}")
            if 101 in args.depth_list and args.vs_torchvision:
                print(
                    "note: torchvision has no R-101 Mask R-CNN builder; its reference at R-101 is its MaskRCNN "
                    "class on its resnet101, built like maskrcnn_resnet50_fpn"
                )
            run_benchmark(args, runners)
            env["load_average_after"] = _load()
            if device.type == "cpu" and not args.no_memory:
                measure_memory_cpu(args, runners)
    except (ConfigError, CheckpointError, RuntimeError, ValueError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    rows = analyze(args, runners)
    print(report(args, rows))
    if env["load_average"]:
        before, after = (" ".join(f"{v:.1f}" for v in env[k]) for k in ("load_average", "load_average_after"))
        print(f"load average (1, 5, 15 min) before the timing: {before}; after: {after} ({env['cpu_count']} cpus)")
    if args.json:
        write_json(
            args.json,
            {"env": env, "settings": settings(args), "runs": rows},
            indent=1,
        )
        print(f"wrote {args.json}")
    if args.plot:
        dev = env["gpu"] or f"{env['cpu']}, {env['threads']} threads"
        draw_chart(rows, f"Mask R-CNN stage times, short side {args.size}, {dev}", args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
