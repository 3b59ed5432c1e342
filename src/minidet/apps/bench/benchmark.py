"""Weight-free speed benchmark: minidet's norm variants side by side, and against torchvision.

Usage::

    python tools/benchmark.py [--config-file CFG]
        [--norms FrozenBN,Affine,Affine+fold,GN,none,onnxruntime,openvino,openvino-bf16,openvino-int8,
                 dcn,dcnv2,gcb,regnetx-3.2gf,regnetx-4gf,regnety-4gf,cascade,cascade+dcn,maskiou]
        [--depths 50,101] [--batch 1,16] [--device cpu|cuda] [--amp bf16|fp16] [--size 800]
        [--image 480x640] [--iters N] [--warmup K] [--threads T] [--vs-torchvision] [--no-memory]
        [--keep-memory on|off] [--peak-seconds S] [--busy-load L] [--busy-cpu F]
        [--bf16-drift N] [--drift-images DIR] [--calib-images N] [--json OUT.json] [--plot OUT.png] [KEY VALUE ...]

No checkpoint is needed: every depth gets realistic random weights (torchvision's own model from
``minidet.apps.bench.reference.build_tv`` for a torchvision config, which minidet loads in each
``--norms`` variant and ``--vs-torchvision`` runs too; randomized minidet models for ``GN``,
``none`` and configs torchvision cannot build). ``onnxruntime`` and ``openvino`` are the FrozenBN model
exported as ``minidet export`` exports it (once per depth, the same weights) and run by that runtime inside
minidet (``MODEL.RUNTIME``: minidet's pre- and post-processing around the graph, the network one stage); the
``export`` / ``openvino`` extras. ``openvino-bf16`` is the same graph compiled by OpenVINO in bf16
(``MODEL.RUNTIME_PRECISION bf16``, CPUs with bf16 instructions), ``openvino-int8`` that graph quantized by NNCF
(``minidet.export.quantize``, calibrated on ``--calib-images`` images; the ``int8`` extra) and run in int8
(``MODEL.RUNTIME_PRECISION int8``). ``dcn``, ``dcnv2``, ``gcb``, ``regnetx-3.2gf``, ``regnetx-4gf``,
``regnety-4gf``, ``cascade``, ``cascade+dcn`` and ``maskiou`` are other architectures beside the config's plain Mask
R-CNN (``report.ARCHITECTURES``: the architecture table's variants, each the keys that shipped configs set: deformable
convolution v1 or v2 in res3 to res5, GC blocks in res3 to res5, a RegNet body of about R-50's cost in place of the
ResNet, Cascade R-CNN's three box stages, Mask Scoring R-CNN's mask IoU head; a detectron2 or mmdetection config),
randomized and calibrated as the plain one, each printed as its ratio to
``FrozenBN`` stage by stage. Each iteration runs every model once, in turn,
the order rotating by one model per iteration; ``--warmup`` iterations are not recorded. This
file holds the command line, the models (``Runner``), the interleaved timing loop, the
torchvision channels-last baseline, the memory probe, the FLOP count per stage, the peak
micro-benchmarks, the busy-machine check and the bf16 drift on real images;
``minidet.apps.bench.report`` the analysis, the printed report and the chart. What is measured,
how the stages of the two implementations line up and how the detections are judged:
docs/exactness.md ("The benchmark").
Trailing ``KEY VALUE`` pairs override the minidet config last.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

import minidet
from minidet import machine
from minidet.apps import fail
from minidet.apps.bench import report as benchreport
from minidet.apps.bench.reference import TorchvisionStages, binarize_masks, build_tv, to_tv_input, tv_skeleton
from minidet.apps.bench.report import ARCHITECTURES, FLOOR_PEAK, OWN_WEIGHTS, RUNTIMES, TV, VARIANTS, Run
from minidet.apps.compare import compare_detections, detection_drift
from minidet.apps.outputs.fileio import atomic_write, write_json
from minidet.apps.synthetic import random_minidet_weights, strip_norms, structured_image
from minidet.checkpoint import CheckpointError, load_checkpoint
from minidet.errors import ConfigError, MinidetError
from minidet.imageio import IMAGE_EXTENSIONS, ImageReadError, read_image
from minidet.timing import STAGES, StageTimer

DEFAULT_CONFIG = "torchvision/maskrcnn_resnet50_fpn"  # a config name (``minidet configs``)
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# the real images of --bf16-drift: the checkout's ../shared/data/coco_tiny (80 COCO val2017 images)
DRIFT_IMAGES = Path(minidet.__file__).resolve().parents[2].parent / "shared" / "data" / "coco_tiny" / "val2017"
CONV_PEAK = (256, 256, 64, 96)  # the peak's 3x3 conv: in and out channels, height, width (FPN / backbone-like)
FC6 = (1000, 12544, 1024)  # the box head's fc6 GEMM: proposals x (256 x 7 x 7) -> 1024
PEAK_CALL_S = 0.1  # a peak's problem size grows to its target while a call of the next size is expected below this
CALIB_SEED = 10_000  # structured_image seeds of the int8 calibration images (without --drift-images photos)


# --quick: short side 320, three variants against torchvision, channels-last convolutions
QUICK = ("--size", "320", "--iters", "3", "--warmup", "1", "--norms", "FrozenBN,Affine,Affine+fold", "--vs-torchvision",
         "MODEL.CHANNELS_LAST", "True")
_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)+$")  # a KEY of the trailing KEY VALUE pairs


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv: list[str] | None = None, prog: str = "benchmark.py") -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description="Weight-free Mask R-CNN speed benchmark.")
    p.add_argument("--config-file", default=DEFAULT_CONFIG, metavar="CFG", help="config name or yaml file")
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
    p.add_argument(
        "--keep-memory", choices=["on", "off"], default="on",
        help="keep freed memory in the process (minidet.memory.keep_freed_memory: glibc mallopt), as minidet's "
        "applications do, for the whole run and every model alike, torchvision too (default: on; off: glibc's "
        "defaults)",
    )
    p.add_argument(
        "--peak-seconds", type=float, default=0.3, metavar="S",
        help="time per micro-benchmark of the machine's peaks (fp32 and bf16 conv, the box head's GEMM; with an "
        "OpenVINO variant also OpenVINO's fp32 and int8 conv); 0: skip",
    )
    p.add_argument(
        "--busy-load", type=float, metavar="L",
        help="warn that the machine was busy when the 1-min load average exceeds L (default: the thread count)",
    )
    p.add_argument(
        "--busy-cpu", type=float, default=benchreport.BUSY_CPU, metavar="F",
        help="... or when the timing loop's CPU time is below F x wall time x threads (default %(default)s)",
    )
    p.add_argument(
        "--bf16-drift", type=int, default=0, metavar="N",
        help="also run every model in fp32 and bf16 on the first N real images of --drift-images (untimed): "
        "matched detections and COCO AP of bf16 against fp32 (default 0: off)",
    )
    p.add_argument("--drift-images", default=str(DRIFT_IMAGES), metavar="DIR",
                   help="images of --bf16-drift and of --calib-images")
    p.add_argument(
        "--calib-images", type=int, default=8, metavar="N",
        help="openvino-int8: quantize on the first N images of --drift-images (synthetic images where that folder "
        "has none) (default %(default)s)",
    )
    p.add_argument("--json", metavar="OUT.json", help="write all numbers to this file")
    p.add_argument("--plot", metavar="OUT.png", help="draw a stacked bar chart of the stage times")
    p.add_argument("--memory-probe", help=argparse.SUPPRESS)  # internal: one model's memory, in a child
    p.add_argument(
        "--quick", action="store_true",
        help=f"the quick run of tools/quickstart.sh (minutes on 2 cores; ends with one verdict line, no step "
        f"table): {' '.join(QUICK)} (options given too win)",
    )
    p.add_argument("opts", nargs=argparse.REMAINDER, metavar="KEY VALUE", help="config overrides")
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--quick" in argv[: argv.index("--") if "--" in argv else len(argv)]:
        argv = [*QUICK[:-2], *argv]  # the options first (later ones win), the override before the given ones
        split = next((i for i, a in enumerate(argv) if _KEY_RE.match(a)), len(argv))
        argv[split:split] = QUICK[-2:]
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
    runtimes = [v for v in args.variants if v in RUNTIMES]
    if runtimes and (args.device != "cpu" or args.amp):
        p.error(f"--norms {','.join(runtimes)}: an exported graph runs on the CPU in float32 or the precision its "
                f"variant names (no --device {args.device}{', no --amp' if args.amp else ''})")
    for v in runtimes:
        if problem := precision_unavailable(RUNTIMES[v][1]):
            p.error(f"--norms {v}: {problem}")
    if args.calib_images < 1:
        p.error("need --calib-images >= 1")
    if not args.batch_list or min(args.batch_list) < 1 or not args.depth_list:
        p.error("--batch and --depths need at least one value; batch sizes >= 1")
    if "TEST.AMP" in args.opts[::2]:
        p.error("set mixed precision with --amp (it applies to torchvision too), not TEST.AMP")
    if args.iters < 1 or args.warmup < 0 or args.size < 1:
        p.error("need --iters >= 1, --warmup >= 0, --size >= 1")
    if args.peak_seconds < 0 or args.bf16_drift < 0:
        p.error("need --peak-seconds >= 0 and --bf16-drift >= 0")
    args.max_size = round(args.size * 1333 / 800)
    return args


def precision_unavailable(precision: str) -> str:
    """'' when this machine runs an exported graph in ``precision`` (``MODEL.RUNTIME_PRECISION``; OpenVINO's CPU
    plugin computes in it, and NNCF, which makes the int8 graph, is installed), else why not (one line)."""
    if precision == "fp32":
        return ""
    from minidet.export import ExportError, require
    from minidet.export.onnxfile import cpu_lacks

    try:
        if precision == "int8":
            require("nncf", "the int8 graph (NNCF's quantization)", "int8")
        return cpu_lacks(precision)
    except ExportError as e:
        return str(e)


def make_cfg(args: argparse.Namespace, norm: str = "FrozenBN", fold: bool = False, depth: int = 50,
             then: list | tuple = ()):
    """A model's config (``load_cfg``: validated, frozen): ``--config-file``, then ``norm``, ``fold``, ``depth``,
    the device and the sizes, then the ``KEY VALUE`` overrides, then ``then``."""
    return minidet.load_cfg(args.config_file, [
        "MODEL.WEIGHTS", "", "MODEL.NORM", norm, "MODEL.FOLD_NORM", fold, "MODEL.DEVICE", args.device,
        "MODEL.RESNETS.DEPTH", depth, "INPUT.MIN_SIZE_TEST", args.size, "INPUT.MAX_SIZE_TEST", args.max_size,
        *args.opts, *then,
    ])


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


def prepare_without_norm(cfg, weights: str):
    """``minidet.prepare_model`` for the ``none`` variant (no norm layers): built as FrozenBN, stripped, then loaded."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.merge_from_list(["MODEL.NORM", "FrozenBN", "MODEL.FOLD_NORM", False, "MODEL.WEIGHTS", "none"])
    model, _ = minidet.prepare_model(cfg)
    strip_norms(model)
    return model, load_checkpoint(model, weights, bn_eps=cfg.MODEL.FROZEN_BN_EPS, convention=cfg.MODEL.CONVENTION)


class Runner:
    """One model of the benchmark (a minidet variant or torchvision) at one depth and batch size."""

    def __init__(self, variant: str, depth: int, batch: int, weights: str, tv_version: int | None, source: str,
                 graph: str | None = None):
        self.variant, self.depth, self.batch, self.graph = variant, depth, batch, graph  # graph: RUNTIMES' file
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
        self.flops: dict | None = None  # {"stages": {stage: FLOPs}, "total": FLOPs} of one forward
        self.bf16_drift: dict | None = None  # bf16 vs fp32 on real images (--bf16-drift)
        self.runtime: dict | None = None  # an exported graph's runtime as it opened it (RUNTIMES' variants)
        self.quantize: dict | None = None  # how the int8 graph was quantized (openvino-int8)

    def label(self, depths: list[int], batches: list[int]) -> str:
        parts = [self.variant]
        if len(depths) > 1:
            parts.append(f"R{self.depth}")
        if len(batches) > 1:
            parts.append(f"b{self.batch}")
        return " ".join(parts)

    def record(self, depths: list[int], batches: list[int]) -> Run:
        """What this model measured, as the plain record of ``minidet.apps.bench.report``."""
        return Run(
            label=self.label(depths, batches), impl=self.impl, variant=self.variant, depth=self.depth,
            batch=self.batch, source=self.source, records=self.records, detail_records=self.detail_records,
            walls=self.walls, cpus=self.cpus, dets=self.dets, memory=self.memory, drift=self.drift,
            checks=self.checks, check_images=self.check_images, tv_channels_last=self.tv_channels_last,
            flops=self.flops, bf16_drift=self.bf16_drift, runtime=self.runtime, quantize=self.quantize,
        )

    def spec(self) -> dict:
        return {
            "variant": self.variant,
            "depth": self.depth,
            "batch": self.batch,
            "weights": self.weights,
            "tv_version": self.tv_version,
            "source": self.source,
            "graph": self.graph,
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
            if self.variant in RUNTIMES:
                model, report = self._exported(args)
                self.runtime = model.network.graph.runtime
            elif norm:
                cfg = make_cfg(args, norm, fold, self.depth, ARCHITECTURES.get(self.variant, ()))
                model, report = minidet.prepare_model(cfg, weights=self.weights)
            else:
                model, report = prepare_without_norm(make_cfg(args, depth=self.depth), self.weights)
            if report is not None and (report.missing or report.unexpected):
                raise CheckpointError(f"{self.variant}: weights do not fit: {report}")
            model.set_runtime(timer=StageTimer(enabled=True, device=device, detail=True))

            def forward(images: list[np.ndarray]) -> tuple[list[dict], dict[str, float], dict[str, float]]:
                model.timer.reset()
                outs = model(images)
                return outs, dict(model.timer.times), dict(model.timer.details)

            self._prepare, self._forward = list, forward
        self._model, self._args = model, args
        self.set_amp(args.amp)

    def _exported(self, args: argparse.Namespace):
        """The FrozenBN model exported as ``minidet export`` does (once per depth: ``self.graph``, not yet written)
        and prepared to run that graph under the runtime and in the precision this variant names (``RUNTIMES``:
        ``MODEL.RUNTIME``, ``MODEL.RUNTIME_PRECISION``); ``openvino-int8``: that graph quantized (``quantized``)."""
        from minidet.export.onnxfile import export_onnx

        runtime, precision = RUNTIMES[self.variant]
        cfg = make_cfg(args, "FrozenBN", False, self.depth)
        eager = None
        if not os.path.exists(self.graph):
            from minidet.hub import file_sha256

            print(f"exporting the FrozenBN R-{self.depth} model for {self.variant} (minidet.export)", file=sys.stderr,
                  flush=True)
            eager, _ = minidet.prepare_model(cfg, weights=self.weights)
            example = eager.preprocess([structured_image(*args.image_hw, seed=0)])
            data = export_onnx(eager, example, {"minidet.weights": self.weights,
                                                "minidet.weights_sha256": file_sha256(self.weights)})
            atomic_write(self.graph, data)
        graph = self.graph
        if precision == "int8":
            graph, self.quantize = self.quantized(args, cfg, eager)
        cfg = make_cfg(args, "FrozenBN", False, self.depth,
                       ["MODEL.RUNTIME", runtime, "MODEL.RUNTIME_PRECISION", precision, "MODEL.GRAPH", graph])
        return minidet.prepare_model(cfg, weights=self.weights)

    def quantized(self, args: argparse.Namespace, cfg, eager=None) -> tuple[str, dict]:
        """The float32 graph ``self.graph`` quantized to int8 as ``minidet export --precision int8`` does
        (``minidet.export.quantize``, on ``calibration_images``; once per depth): the path of its ``.xml`` (the
        ``.bin`` beside it) and the quantization's facts (kept beside them in a ``.json``)."""
        xml = self.graph[: -len(".onnx")] + "_int8.xml"
        facts_path = xml[: -len(".xml")] + ".json"
        if not os.path.exists(xml):
            from minidet.export.onnxfile import graph_files, graph_inputs
            from minidet.export.quantize import named_model, quantize, serialize

            if eager is None:  # the graph exists: the eager model only preprocesses the calibration images
                eager, _ = minidet.prepare_model(cfg, weights=self.weights)
            images, source = calibration_images(args)
            print(f"quantizing the FrozenBN R-{self.depth} graph to int8 on {len(images)} "
                  f"image{'s' * (len(images) != 1)} (NNCF)",
                  file=sys.stderr, flush=True)
            with open(self.graph, "rb") as f:
                data = f.read()
            t0 = time.perf_counter()
            model, facts = quantize(named_model(data), [graph_inputs(eager.preprocess([im]), 0) for im in images],
                                    {"minidet.calibration": source})
            facts = {**facts, "calibration_source": source, "seconds": time.perf_counter() - t0}
            del data
            for path, content in graph_files(xml, serialize(model)):  # model.bin, then model.xml
                atomic_write(path, content)
            write_json(facts_path, facts)
        with open(facts_path) as f:
            return xml, json.load(f)

    def set_amp(self, amp: str | None) -> None:
        """Mixed precision: minidet's own ``TEST.AMP`` (network layers only, box math float32);
        torchvision's whole call under ``torch.autocast``, the way its users run it."""
        self.amp = AMP_DTYPES.get(amp or "")
        if self.impl != TV:
            self._model.set_runtime(amp_dtype=self.amp)

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

    def count_flops(self, images: list[np.ndarray]) -> dict:
        """FLOPs of one forward on ``images`` (untimed), per stage: ``{"stages": {stage: FLOPs}, "total": FLOPs}``.

        ``torch.utils.flop_counter.FlopCounterMode`` counts the convolutions and matrix products (plus
        ``FLOP_FORMULAS``: oneDNN's fused ops); its running total is read where each stage ends, at
        minidet's stage timer (a stand-in, ``_FlopStages``) and at torchvision's stage hooks
        (``_TvFlopMarks``, the boundaries of ``TorchvisionStages``). The stages add up to the total.
        """
        inputs = self._prepare(images)
        counter = FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)
        if self.impl == TV:
            autocast = contextlib.nullcontext()
            if self.amp is not None:
                autocast = torch.autocast(self.device.type, dtype=self.amp)
            marks = _TvFlopMarks(self._model, counter)
            try:
                with counter, autocast, torch.inference_mode():
                    self._model(inputs)
            finally:
                marks.remove()
            ends = {**marks.flop_marks, "paste": counter.get_total_flops()}
            stages, prev = {}, 0
            for name in STAGES:
                if name in ends:
                    stages[name], prev = ends[name] - prev, ends[name]
        else:  # an exported graph runs the eager FrozenBN network's FLOPs: counted on that model
            model = self._model if self.variant not in RUNTIMES else minidet.prepare_model(
                make_cfg(self._args, "FrozenBN", False, self.depth), weights=self.weights)[0]
            timer, flop_stages = model.timer, _FlopStages(counter)
            model.set_runtime(timer=flop_stages)
            try:
                with counter:
                    model(inputs)
            finally:
                model.set_runtime(timer=timer)
            stages = {s: flop_stages.flops[s] for s in STAGES if s in flop_stages.flops}
        return {"stages": stages, "total": counter.get_total_flops()}

    def channels_last_changes(self, images: list[np.ndarray]) -> list:
        """torchvision only: per image, how its detections move when its model is converted to
        channels-last (``DetectionMatch`` of channels-last vs its default layout, both run now).

        Untimed, after the timing loop; the model is converted back to the default layout.
        """
        ref = binarize_masks(self(images)[0])
        self._model.to(memory_format=torch.channels_last)
        try:
            new = binarize_masks(self(images)[0])
        finally:
            self._model.to(memory_format=torch.contiguous_format)
        return list(map(compare_detections, new, ref))


def _conv_pointwise_flops(x, a1, a2, *_, out_shape=None, **__) -> int:
    """oneDNN's fused convolution (``minidet.layers.Conv2d``), as PyTorch counts a convolution: 2 x output
    elements x C_in / groups x kh x kw. ``default(x, weight, bias, ...)``, ``binary(x, other, weight, ...)``:
    the weight is the 4-d one of the two arguments after x that is not a 1-d bias."""
    w = a2 if a2 is not None and len(a2) == 4 else a1
    return 2 * math.prod(out_shape) * math.prod(w[1:])


def _linear_flops(x, *_, out_shape=None, **__) -> int:
    """A oneDNN / MKL linear layer (x first): 2 x output elements x in_features."""
    return 2 * math.prod(out_shape) * x[-1]


def _deform_conv_flops(x, weight, *_, out_shape=None, **__) -> int:
    """torchvision's ``deform_conv2d`` (``minidet.layers.DeformConv2d``) counted as the convolution it is, 2 x output
    elements x C_in / groups x kh x kw; its bilinear sampling (4 reads and weights per tap) is not counted."""
    return 2 * math.prod(out_shape) * math.prod(weight[1:])


def _flop_formulas() -> dict:
    """FLOP formulas for ``FlopCounterMode`` of the fused CPU ops it does not know (those this PyTorch has), and of
    torchvision's deformable convolution."""
    formulas = {}
    for ns, name, f in (
        ("torchvision", "deform_conv2d", _deform_conv_flops),
        ("mkldnn", "_convolution_pointwise", _conv_pointwise_flops),
        ("mkldnn", "_linear_pointwise", _linear_flops),
        ("mkl", "_mkl_linear", _linear_flops),
        ("aten", "mkldnn_linear", _linear_flops),
    ):
        with contextlib.suppress(AttributeError, RuntimeError):
            formulas[getattr(getattr(torch.ops, ns), name)] = f
    return formulas


FLOP_FORMULAS = _flop_formulas()


class _FlopStages:
    """Stands in for a minidet model's ``StageTimer`` in ``Runner.count_flops``: adds, per stage, the FLOPs
    ``counter`` counts inside it (a stage entered once per image chunk adds up)."""

    def __init__(self, counter: FlopCounterMode) -> None:
        self.counter, self.flops = counter, {}

    @contextlib.contextmanager
    def stage(self, name: str):
        start = self.counter.get_total_flops()
        try:
            yield
        finally:
            self.flops[name] = self.flops.get(name, 0) + self.counter.get_total_flops() - start

    def detail(self, name: str):
        return contextlib.nullcontext()


class _TvFlopMarks(TorchvisionStages):
    """``TorchvisionStages``' hooks (the same stage boundaries) noting ``counter``'s total instead of a time."""

    def __init__(self, model: torch.nn.Module, counter: FlopCounterMode) -> None:
        self.counter, self.flop_marks = counter, {}
        super().__init__(model)

    def _marker(self, name: str):
        def mark(*_) -> None:
            self.flop_marks[name] = self.counter.get_total_flops()

        return mark


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call_time(fn, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _best_rate(make, sizes: list[tuple[int, ...]], flops, seconds: float, device: torch.device) -> dict:
    """GFLOP/s of the fastest call of ``make(size)()``: the size grows through ``sizes`` (the last is the
    target) while a call of the next size, at the best rate seen so far, is expected to take under
    ``PEAK_CALL_S`` (so that a slow kernel, such as bf16 without hardware support, stays short, and
    one call slowed by other processes does not stop the growth), then calls of that size are timed
    for ``seconds`` (at least 3); each size's first call is a warm-up."""
    best = 0.0
    for i, size in enumerate(sizes):
        fn = make(size)
        _call_time(fn, device)  # kernel selection, oneDNN primitive creation
        times = [_call_time(fn, device), _call_time(fn, device)]
        best = max(best, flops(size) / min(times))
        if i + 1 < len(sizes) and flops(sizes[i + 1]) / best >= PEAK_CALL_S:
            break
    end = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < end:
        times.append(_call_time(fn, device))
    best = min(times)
    return {"gflop_per_s": flops(size) / best / 1e9, "shape": list(size), "calls": len(times), "best_s": best}


def _halvings(target: tuple[int, ...], dims: tuple[int, ...], smallest: int) -> list[tuple[int, ...]]:
    """``target`` and smaller sizes, each half the one after it (halving ``dims`` in turn down to
    ``smallest``), smallest first."""
    sizes, size, k = [tuple(target)], list(target), 0
    while any(size[d] // 2 >= smallest for d in dims):
        d = dims[k % len(dims)]
        k += 1
        if size[d] // 2 >= smallest:
            size[d] //= 2
            sizes.append(tuple(size))
    return sizes[::-1]


def _fc6_path(runners: list[Runner]) -> tuple[torch.nn.Module | None, str]:
    """The box head's first fc layer (fc6) of the first minidet model, and in words the path it runs:
    ``None`` where that is plain ``nn.Linear`` (``minidet.layers.Linear`` without ``fuse``:
    ``MODEL.FUSE_LINEAR False``)."""
    model = next((r._model for r in runners if r.impl != TV), None)
    fc = getattr(getattr(model, "box_head", None), "fc1", None)
    if fc is None:
        return None, "no minidet model"
    cls = type(fc)
    name = "nn.Linear" if cls is torch.nn.Linear else f"{cls.__module__}.{cls.__qualname__}"
    fuse = getattr(fc, "fuse", None)
    if fuse is not None:
        name += f", fuse {'on' if fuse else 'off'}"
    plain = "forward" not in vars(fc) and not fuse and (cls is torch.nn.Linear or fuse is not None)
    return (None if plain else fc), name


def openvino_conv(precision: str, threads: int, layers: dict):
    """``make(size)`` for ``_best_rate``: ``CONV_PEAK``'s 3x3 conv (no bias) as an OpenVINO model of input size
    ``size``, compiled for the CPU with ``openvino_options(precision, threads)`` (what ``MODEL.RUNTIME openvino``
    compiles a graph with), as a call of one inference. int8: the conv's input and weights quantized as NNCF
    quantizes a ResNet conv for the CPU (``minidet.export.quantize``, preset PERFORMANCE): the input through a
    FakeQuantize of 256 levels from 0 (a conv's input after a ReLU: u8), the weights int8 per output channel (an
    i8 constant converted and scaled, NNCF's form), so that OpenVINO computes the conv in u8 x i8. ``layers``
    gets the compiled model's layer precisions (``onnxfile.layer_precisions``)."""
    import openvino as ov
    from openvino import opset13 as ops

    from minidet.export.onnxfile import layer_precisions, openvino_options

    core, options = ov.Core(), openvino_options(precision, threads)
    cin, cout, _, _ = CONV_PEAK
    rng = np.random.default_rng(0)
    weights = (0.02 * rng.standard_normal((cout, cin, 3, 3))).astype(np.float32)
    high = np.float32(4.0)  # the input's range: [0, high)

    def make(size):
        x = ops.parameter(list(size), np.float32, name="x")
        data, kernel = x, ops.constant(weights)
        if precision == "int8":
            zero, top = ops.constant(np.float32(0)), ops.constant(high)
            data = ops.fake_quantize(x, zero, top, zero, top, 256)
            scale = (np.abs(weights).max(axis=(1, 2, 3), keepdims=True) / 127).astype(np.float32)
            q = np.clip(np.round(weights / scale), -127, 127).astype(np.int8)
            kernel = ops.multiply(ops.convert(ops.constant(q), np.float32), ops.constant(scale))
        conv = ops.convolution(data, kernel, [1, 1], [1, 1], [1, 1], [1, 1])
        compiled = core.compile_model(ov.Model([conv.output(0)], [x], "conv_peak"), "CPU", options)
        layers.clear()
        layers.update(layer_precisions(compiled))
        request = compiled.create_infer_request()
        request.set_input_tensor(ov.Tensor(rng.uniform(0, high, size).astype(np.float32)))

        def call() -> None:
            request.start_async()
            request.wait()

        return call

    return make


def openvino_peaks(args: argparse.Namespace, runners: list[Runner], sizes, flops) -> dict:
    """With an OpenVINO variant: ``CONV_PEAK``'s conv under OpenVINO (``openvino_conv``) in float32 and int8 (where
    OpenVINO's CPU plugin computes in int8), and in bf16 with ``openvino-bf16``; the peaks of the OpenVINO
    variants' floors (``FLOOR_PEAK``), timed as the PyTorch convs are."""
    precisions = {RUNTIMES[r.variant][1] for r in runners if RUNTIMES.get(r.variant, ("",))[0] == "openvino"}
    if not precisions or args.device != "cpu":
        return {}
    import openvino as ov

    from minidet.export.onnxfile import cpu_lacks, openvino_options

    cin, cout, h, w = CONV_PEAK
    threads, out, skipped = torch.get_num_threads(), {}, []
    for precision in ("fp32", "bf16", "int8"):
        if precision == "bf16" and precision not in precisions:
            continue
        if problem := cpu_lacks(precision):
            skipped.append(problem)
            continue
        layers: dict = {}
        rate = _best_rate(openvino_conv(precision, threads, layers), sizes, flops, args.peak_seconds,
                          torch.device("cpu"))
        what = "u8 input (FakeQuantize, 256 levels) x i8 weights per channel, " if precision == "int8" else ""
        version = ov.__version__.split("-")[0]
        out[FLOOR_PEAK["openvino" if precision == "fp32" else f"openvino-{precision}"]] = {
            "op": f"conv 3x3 {cin}->{cout} at {h}x{w} (OpenVINO {version}, {what}MODEL.RUNTIME_PRECISION {precision})",
            "target": [1, cin, h, w], "runtime": "openvino", "precision": precision, **rate, "layers": layers,
            "options": {k: str(v) for k, v in openvino_options(precision, threads).items()},
        }
    if skipped:
        out["openvino_skipped"] = "; ".join(skipped)
    return out


@torch.inference_mode()
def measure_peaks(args: argparse.Namespace, runners: list[Runner]) -> dict:
    """Micro-benchmarks of this machine, in this process with the benchmark's threads: a 3x3 conv
    (``CONV_PEAK``) in float32 and in bf16, each contiguous and channels-last (the best is the peak;
    on CPU PyTorch runs it with oneDNN), and the box head's fc6 GEMM (``FC6``) as plain ``nn.Linear``
    and as the minidet variants' own fc6 module where that is not plain ``nn.Linear``
    (``MODEL.FUSE_LINEAR``); with an OpenVINO variant the same conv under OpenVINO in float32 and int8
    (``openvino_peaks``). About ``--peak-seconds`` each."""
    device, seconds = torch.device(args.device), args.peak_seconds
    cin, cout, h, w = CONV_PEAK
    gen = torch.Generator().manual_seed(0)

    def conv(dtype: torch.dtype, layout: torch.memory_format):
        def make(size):
            x = torch.randn(size, generator=gen).to(device, dtype).contiguous(memory_format=layout)
            wt = (0.02 * torch.randn(cout, cin, 3, 3, generator=gen)).to(device, dtype).contiguous(memory_format=layout)
            b = torch.zeros(cout, device=device, dtype=dtype)
            return lambda: F.conv2d(x, wt, b, padding=1)

        return make

    conv_sizes = _halvings((1, cin, h, w), (2, 3), 4)
    conv_flops = lambda size: 2 * size[0] * cout * size[2] * size[3] * cin * 9  # noqa: E731
    peaks: dict = {"threads": torch.get_num_threads(), "seconds": seconds, "grow_below_s": PEAK_CALL_S,
                   "device": str(device)}
    engine = "oneDNN" if device.type == "cpu" and torch.backends.mkldnn.is_available() else device.type
    for key, dtype in (("conv_fp32", torch.float32), ("conv_bf16", torch.bfloat16)):
        layouts = {
            name: _best_rate(conv(dtype, layout), conv_sizes, conv_flops, seconds, device)
            for name, layout in (("contiguous", torch.contiguous_format), ("channels_last", torch.channels_last))
        }
        peaks[key] = {
            "op": f"conv 3x3 {cin}->{cout} at {h}x{w} (F.conv2d, {engine})",
            "target": [1, cin, h, w],
            "gflop_per_s": max(v["gflop_per_s"] for v in layouts.values()),
            "layouts": layouts,
        }
    peaks.update(openvino_peaks(args, runners, conv_sizes, conv_flops))
    m, k, n = FC6
    fc, path = _fc6_path(runners)
    k = fc.in_features if fc is not None and hasattr(fc, "in_features") else k
    plain_fc = torch.nn.Linear(k, n).to(device).eval()

    def linear(module: torch.nn.Module):
        def make(size):
            x = torch.randn(size[0], k, generator=gen).to(device)
            return lambda: module(x)

        return make

    rows = _halvings((m,), (0,), 32)
    lin_flops = lambda size: 2 * size[0] * k * n  # noqa: E731
    peaks["linear"] = {
        "op": f"{m}x{k} -> {n}",
        "target": [m, k, n],
        "plain": _best_rate(linear(plain_fc), rows, lin_flops, seconds, device),
        "variant": None if fc is None else _best_rate(linear(fc), rows, lin_flops, seconds, device),
        "variant_path": path,
    }
    return peaks


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
    # the child keeps glibc's defaults whatever --keep-memory says: freed memory must leave the resident set
    cmd = [sys.executable, "-m", "minidet.apps.bench.benchmark", "--config-file", args.config_file,
           "--size", str(args.size), "--image", args.image, "--device", "cpu", "--keep-memory", "off",
           "--memory-probe", specs]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    cmd += ["--amp", args.amp] if args.amp else []
    # the child imports this module as the parent did, installed or from a checkout's src/
    path = os.pathsep.join(filter(None, [str(Path(minidet.__file__).parents[1]), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": path}
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
                source = f"torchvision v{version} R-{depth}, randomized (minidet.apps.bench.reference.build_tv)"
                paths["frozen"] = (path, source)
            else:
                path = os.path.join(tmp, f"minidet_r{depth}.pth")
                random_minidet_weights(make_cfg(args, depth=depth), calib_image, path)
                paths["frozen"] = (path, f"minidet R-{depth}, randomized (FrozenBN calibrated)")
        if "GN" in args.variants:
            path = os.path.join(tmp, f"gn_r{depth}.pth")
            random_minidet_weights(make_cfg(args, "GN", depth=depth), calib_image, path)
            paths["GN"] = (path, f"minidet GN R-{depth}, randomized")
        for v in [v for v in args.variants if v in ARCHITECTURES]:
            path = os.path.join(tmp, f"{v}_r{depth}.pth")
            random_minidet_weights(make_cfg(args, depth=depth, then=ARCHITECTURES[v]), calib_image, path)
            body = "" if "MODEL.REGNET.DEPTH" in ARCHITECTURES[v] else f" R-{depth}"  # a RegNet has no ResNet depth
            paths[v] = (path, f"minidet {v}{body}, randomized (FrozenBN calibrated)")
        if "none" in args.variants:
            path = os.path.join(tmp, f"none_r{depth}.pth")
            random_minidet_weights(make_cfg(args, depth=depth), calib_image, path, without_norms=True)
            paths["none"] = (path, f"minidet R-{depth} without norm layers (bias-free ResNet convs), randomized")
        for batch in args.batch_list:
            if args.vs_torchvision and version:
                runners.append(Runner(TV, depth, batch, paths["frozen"][0], version, paths["frozen"][1]))
            for v in args.variants:
                path, source = paths[v if v in OWN_WEIGHTS else "frozen"]
                graph = os.path.join(tmp, f"frozenbn_r{depth}.onnx") if v in RUNTIMES else None  # one per depth
                runners.append(Runner(v, depth, batch, path, version, source, graph))
    return runners


def image_pools(args: argparse.Namespace) -> dict[int, list[list[np.ndarray]]]:
    """Per batch size, the input batches the iterations take in turn (at most 4)."""
    n_pool = min(args.iters + args.warmup, 4)
    h, w = args.image_hw
    return {
        b: [[structured_image(h, w, seed=k * b + i) for i in range(b)] for k in range(n_pool)] for b in args.batch_list
    }


def run_benchmark(args: argparse.Namespace, runners: list[Runner], pools: dict[int, list[list[np.ndarray]]]) -> dict:
    """The timing loop: every iteration runs each model once, in turn, and checks detections; then,
    untimed, torchvision's channels-last baseline where they differ (``channels_last_baseline``).
    Returns the wall and process CPU time of the timed iterations (``loop_wall_s``, ``loop_cpu_s``)."""
    device = torch.device(args.device)
    n_pool = len(next(iter(pools.values())))
    if args.amp:  # detection change of AMP vs fp32, on the first batch (also warms up)
        for r in runners:
            r.set_amp(None)
            ref = r(pools[r.batch][0])[0]
            r.set_amp(args.amp)
            new = r(pools[r.batch][0])[0]
            if r.impl == TV:
                ref, new = binarize_masks(ref), binarize_masks(new)
            r.drift = detection_drift(ref, new)
    with_ref = {(r.depth, r.batch) for r in runners if r.impl == TV}
    for it in range(args.warmup + args.iters):
        if it == args.warmup:
            t0, c0 = time.perf_counter(), time.process_time()
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
                refs[group] = binarize_masks(outs)
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
    loop = {"loop_wall_s": time.perf_counter() - t0, "loop_cpu_s": time.process_time() - c0}
    if not args.amp:
        channels_last_baseline(runners, pools)
    return loop


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
            if not check.problem():
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


def drift_images(args: argparse.Namespace) -> tuple[list[np.ndarray], str]:
    """The first ``--bf16-drift`` images of ``--drift-images`` (by file name), BGR uint8, and their source in words."""
    folder = Path(args.drift_images)
    if not folder.is_dir():
        raise ConfigError(f"--bf16-drift: no image folder {folder} (set --drift-images)")
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
    if len(paths) < args.bf16_drift:
        raise ConfigError(f"--bf16-drift {args.bf16_drift}: {folder} has only {len(paths)} images")
    try:
        images = [read_image(str(p)) for p in paths[: args.bf16_drift]]
    except ImageReadError as e:
        raise ConfigError(f"--bf16-drift: {e}") from None
    return images, folder.parent.name if folder.name == "val2017" else folder.name


def calibration_images(args: argparse.Namespace) -> tuple[list[np.ndarray], str]:
    """The int8 graph's calibration images (``--calib-images`` N), BGR uint8, and their source in words: the first N
    photos of ``--drift-images`` (by file name; all of them where it has fewer), or, where that folder has none,
    N synthetic images of the benchmark's input size (``structured_image``, seeds from ``CALIB_SEED``)."""
    folder = Path(args.drift_images)
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS) if folder.is_dir() else []
    if paths:
        paths = paths[: args.calib_images]
        try:
            images = [read_image(str(p)) for p in paths]
        except ImageReadError as e:
            raise ConfigError(f"--calib-images: {e}") from None
        name = folder.parent.name if folder.name == "val2017" else folder.name
        return images, f"the first {len(images)} of {name}'s photos (--drift-images {folder})"
    h, w = args.image_hw
    images = [structured_image(h, w, seed=CALIB_SEED + i) for i in range(args.calib_images)]
    return images, (f"{len(images)} synthetic {h}x{w} images (structured_image, seeds {CALIB_SEED} to "
                    f"{CALIB_SEED + len(images) - 1}; no photos in {folder})")


def measure_bf16_drift(args: argparse.Namespace, runners: list[Runner]) -> None:
    """``--bf16-drift``, untimed: each model (once per variant and depth) runs every image alone in
    float32 and then in bf16 (minidet's ``TEST.AMP``, torchvision under ``torch.autocast``); sets
    ``runner.bf16_drift``: the matches of ``detection_drift``, the COCO AP of the bf16 detections with
    the float32 ones as ground truth (``benchreport.coco_drift``) and the median time per image of each."""
    images, source = drift_images(args)
    done = set()
    for r in runners:
        if (r.variant, r.depth) in done:
            continue
        done.add((r.variant, r.depth))
        print(f"bf16 drift (untimed): {r.variant} R-{r.depth} on {len(images)} images", file=sys.stderr, flush=True)
        refs, news, t32, t16 = [], [], [], []
        try:
            for im in images:
                for amp, outs, times in ((None, refs, t32), ("bf16", news, t16)):
                    r.set_amp(amp)
                    out, _, _, wall, _ = r([im])
                    outs.extend(binarize_masks(out) if r.impl == TV else out)
                    times.append(wall)
        finally:
            r.set_amp(args.amp)
        d = detection_drift(refs, news)
        f32, f16 = statistics.median(t32), statistics.median(t16)
        r.bf16_drift = {
            **d,
            "images": len(images),
            "source": source,
            "matched_fraction": d["matched"] / d["detections_fp32"] if d["detections_fp32"] else None,
            "coco": benchreport.coco_drift(refs, news, [im.shape[:2] for im in images]),
            "fp32_s_median": f32,
            "bf16_s_median": f16,
            "time_ratio": f16 / f32,
        }


def keep_memory(mode: str) -> dict:
    """``--keep-memory on``: freed memory stays in the process for the rest of the run, for every model
    alike. Returns what is in force (``minidet.memory.memory_settings``, with ``mode`` and ``applied``)."""
    from minidet import memory

    applied = memory.keep_freed_memory() if mode == "on" else False
    return {"mode": mode, "applied": applied, **memory.memory_settings()}


def environment(args: argparse.Namespace) -> dict:
    git, here = {}, Path(minidet.__file__).parent
    for key, cmd in (("commit", ["git", "rev-parse", "HEAD"]), ("dirty", ["git", "status", "--porcelain", "-uno"])):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(cmd, cwd=here, capture_output=True, text=True, check=True, timeout=20).stdout.strip()
            git[key] = out if key == "commit" else bool(out)
    device = torch.device(args.device)
    return {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu": machine.cpu_model(),
        "cpu_count": machine.cores(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "git": git,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "load_average": machine.load_average(),
        "keep_memory": args.keep_memory,
    }


def settings(args: argparse.Namespace) -> dict:
    keys = ("config_file", "variants", "depth_list", "batch_list", "device", "amp", "size", "max_size", "image")
    keys += ("iters", "warmup", "threads", "vs_torchvision", "no_memory", "keep_memory", "peak_seconds")
    keys += ("busy_load", "busy_cpu", "bf16_drift", "drift_images", "calib_images", "quick", "opts")
    return {k: getattr(args, k) for k in keys}


def main(argv: list[str] | None = None, prog: str = "benchmark.py") -> int:
    args = parse_args(argv, prog)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        return memory_probe(args)
    device = torch.device(args.device)
    peaks = None
    try:
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"--device {args.device} but CUDA is not available")
        kept = keep_memory(args.keep_memory)  # first: for the whole run, torchvision's models too
        if args.bf16_drift:
            drift_images(args)  # fail early
        with tempfile.TemporaryDirectory(prefix="minidet-bench-") as tmp:
            runners = build_runners(args, tmp, structured_image(*args.image_hw, seed=1000))
            if args.vs_torchvision and not any(r.impl == TV for r in runners):
                raise ConfigError("--vs-torchvision needs a torchvision config (configs/torchvision/*)")
            for r in runners:
                r.load(args)
            env = environment(args)
            env["process_memory"] = kept
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
            if kept["applied"]:
                how = "freed memory kept in the process (minidet.memory.keep_freed_memory: glibc mallopt)"
            elif args.keep_memory == "on":
                how = f"not applied (allocator {kept['allocator'] or 'not glibc'}): the C library's defaults"
            else:
                how = f"the allocator's defaults ({kept['allocator'] or 'not glibc'})"
            env_vars = " ".join(f"{k}={v}" for k, v in kept["env"].items())
            print(
                f"process memory (--keep-memory {args.keep_memory}, every model alike, torchvision too): {how}"
                + (f"; environment {env_vars}" if env_vars else "")
            )
            if 101 in args.depth_list and args.vs_torchvision:
                print(
                    "note: torchvision has no R-101 Mask R-CNN builder; its reference at R-101 is its MaskRCNN "
                    "class on its resnet101, built like maskrcnn_resnet50_fpn"
                )
            pools = image_pools(args)
            loop = run_benchmark(args, runners, pools)
            env["load_average_after"] = machine.load_average()
            for r in runners:  # untimed, after the timing
                r.flops = r.count_flops(pools[r.batch][0])
            if args.peak_seconds:
                print("micro-benchmarks of the machine's peaks", file=sys.stderr, flush=True)
                peaks = measure_peaks(args, runners)
            if args.bf16_drift:
                measure_bf16_drift(args, runners)
            if device.type == "cpu" and not args.no_memory:
                measure_memory_cpu(args, runners)
    except (MinidetError, RuntimeError, ValueError) as e:  # RuntimeError, ValueError: torch's refusals of a setting
        return fail(str(e), debug=False)
    rows = benchreport.analyze([r.record(args.depth_list, args.batch_list) for r in runners], peaks, args.amp)
    # the step targets are set for the full benchmark (short side 800): the quick run leaves their table out
    print(benchreport.report(rows, device=args.device, amp=args.amp, peaks=peaks, steps=not args.quick))
    if env["load_average"]:
        before, after = (" ".join(f"{v:.1f}" for v in env[k]) for k in ("load_average", "load_average_after"))
        print(f"load average (1, 5, 15 min) before the timing: {before}; after: {after} ({env['cpu_count']} cpus)")
    busy = benchreport.busy_check(
        env["load_average"], env["load_average_after"], env["threads"],
        loop["loop_cpu_s"] if device.type == "cpu" else None, loop["loop_wall_s"], args.busy_load, args.busy_cpu,
    )
    if line := benchreport.busy_line(busy):
        print(line)
    verdict = benchreport.verdict_line(rows, busy, args.amp)
    if args.json:
        write_json(
            args.json,
            {"env": env, "settings": settings(args), "machine_busy": busy["busy"], "busy_check": busy,
             "peaks": peaks, "runs": rows, "verdict": verdict},
            indent=1,
        )
        print(f"wrote {args.json}")
    if args.plot:
        dev = env["gpu"] or f"{env['cpu']}, {env['threads']} threads"
        benchreport.draw_chart(rows, f"Mask R-CNN stage times, short side {args.size}, {dev}", args.plot)
        print(f"wrote {args.plot}")
    if verdict:
        print(verdict)  # the last line
    return 0


if __name__ == "__main__":
    sys.exit(main())
