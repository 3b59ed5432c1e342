"""``minidet export``: the loaded model to ONNX, run by ONNX Runtime or OpenVINO, checked against eager by a parity
gate; ``minidet export --check DIR``: that gate again, where the export runs.

Usage::

    minidet export --config-file CFG --output DIR [--images IMG ...] [--runtime onnxruntime|openvino]
        [--repeats N] [--force] [KEY VALUE ...]
    minidet export ... --precision bf16|int8 [--calib IMG ...] [--calib-count N] [--min-matched F] [--min-ap F]
        [--drift-score S]
    minidet export --check DIR [--images IMG ...] [--repeats N] [--json FILE] [KEY VALUE ...]
    python tools/export.py ...   # the same program

Builds and loads the model of ``CFG`` (any family, any norm, folded or not) on the CPU in float32, exports its
network (``minidet.export.graph.NetworkGraph``: backbone to mask probabilities, any padded image size) and
runs the parity gate (``minidet.apps.export.gate``) on the verification images: the ``--images`` given, else five
real COCO photos of several sizes and aspect ratios from the checkout's ``../shared/data/coco_tiny`` (synthetic
pictures of the same sizes where it is absent; photos are not shipped in the package) and one blank picture
(no objects). It writes into ``DIR``, one unit that can be copied or moved (its paths are relative to it):

- ``model.onnx``: the graph, weights inside, with minidet's metadata (version, weights' SHA-256, config);
- ``config.yaml``: the resolved config with ``MODEL.RUNTIME`` (``--runtime``: ONNX Runtime, the default, or
  OpenVINO, which runs the same file; the gate runs it), ``MODEL.GRAPH: model.onnx`` and its ``MODEL.GRAPH_SHA256``,
  ``MODEL.WEIGHTS`` relative to ``DIR`` (or the registry name or URL given), ``MODEL.RUNTIME_PRECISION fp32``, so
  that ``minidet infer|eval --config-file DIR/config.yaml`` runs it (minidet's resize and normalization before it,
  rescale and mask paste after it);
- ``report.json``: the gate per image and stage, the steps the graph cannot compute exactly, the exporter's and
  the runtime's versions, the runtime's options and the precision its compiled layers got, the CPU and its flags,
  the speed of each.

The gate's table is printed. When an image's exported detections are not the eager ones, ``model.onnx`` and
``config.yaml`` are not written (``report.json`` is), one ``error:`` line says so and the exit status is 1;
``--force`` writes them anyway, marked in the report and in the config's first line. Where eager finds no
detection on any verification image, no gate can judge the graph: the export stops before it traces (``report.json``
with eager's counts, one ``error:`` line, status 1; ``--force`` exports anyway). A bad config, checkpoint
or image, or a missing ``minidet[export]`` extra, is one ``error:`` line (status 2). ``--check DIR`` loads
``DIR/config.yaml`` as ``minidet infer`` does (overrides such as ``MODEL.RUNTIME openvino`` change what runs) and
runs the same gate with this machine's runtime and CPU: status 0 when it passes, 1 when it fails.

``--precision bf16|int8`` (``minidet.runtimes``; OpenVINO): bf16 compiles the float32 graph in bf16; int8
quantizes it with NNCF on the ``--calib`` images (``minidet.export.quantize``) and writes ``model.xml`` and
``model.bin`` instead of ``model.onnx``. Neither is exact, so instead of the parity gate the drift report against
eager float32 (``minidet.apps.export.drift``) is printed and put into ``report.json``, and its gate
(``--min-matched``, ``--min-ap``) decides whether the export is written (``--force`` as above); ``--check`` runs
that report and gate for such a folder.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

import minidet
from minidet.apps import fail, parse_with_overrides, run_app
from minidet.apps.export.drift import MIN_AP, MIN_MATCHED, SCORE
from minidet.apps.outputs.fileio import OutputDir, atomic_write, write_json
from minidet.errors import ConfigError
from minidet.export.quantize import DEFAULT_CALIBRATION
from minidet.hub import weights_path
from minidet.hub.cache import NO_WEIGHTS
from minidet.imageio import read_image
from minidet.machine import cpu_facts
from minidet.runtimes import DEFAULT, PRECISIONS, RUNTIMES, precision_problem

# the checkout's real photos (../shared/data/coco_tiny) and the verification set taken from them
PHOTOS = Path(minidet.__file__).resolve().parents[2].parent / "shared" / "data" / "coco_tiny" / "val2017"
VERIFY = {  # file -> (height, width): small, wide, tall, square, the common 4:3
    "000000404484.jpg": (240, 320), "000000417285.jpg": (320, 640), "000000125952.jpg": (640, 358),
    "000000436738.jpg": (486, 500), "000000005001.jpg": (480, 640),
}
BLANK = (300, 400)  # the picture without objects
GRAPH = "model.onnx"  # the graph's file in the export folder
PROG = "export"


def parse_args(argv: list[str] | None = None, prog: str = "export.py") -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description="Export a model to ONNX, checked against eager minidet; or "
                                "check an export where it runs (--check DIR).")
    p.add_argument("--config-file", metavar="CFG", help="config name or yaml file of the model")
    p.add_argument("--output", metavar="DIR", help="output folder (created if needed)")
    p.add_argument("--check", metavar="DIR", help="instead of exporting: run the gate (parity, or drift for bf16 / "
                   "int8) of the export in DIR "
                   "(its config.yaml, with the KEY VALUE overrides) here, with this machine's runtime")
    p.add_argument("--json", metavar="FILE", help="--check: write its report (as report.json's) to FILE")
    p.add_argument("--images", nargs="+", metavar="IMG", help="verification images (default: a built-in set)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs of each image per runtime (0: no timing)")
    p.add_argument("--force", action="store_true",
                   help="write the export even when its gate (parity, or drift for bf16 / int8) fails")
    p.add_argument("--runtime", choices=list(RUNTIMES),
                   help="what runs the graph in the gate and in the written config.yaml (MODEL.RUNTIME; default "
                   "onnxruntime for fp32, openvino for the other precisions)")
    p.add_argument("--precision", choices=list(PRECISIONS), default=DEFAULT,
                   help="what the graph computes in (MODEL.RUNTIME_PRECISION): fp32 (exact, the parity gate), bf16 "
                   "or int8 (faster, not exact: the drift report and its gate)")
    p.add_argument("--calib", nargs="+", metavar="IMG", help="--precision int8: calibration images (files or folders)")
    p.add_argument("--calib-count", type=int, default=DEFAULT_CALIBRATION, metavar="N",
                   help=f"--precision int8: calibrate on at most N of them, spread evenly (default "
                   f"{DEFAULT_CALIBRATION})")
    p.add_argument("--min-matched", type=float, default=MIN_MATCHED, metavar="F",
                   help=f"drift gate: the fraction of eager float32's detections the graph must keep (default "
                   f"{MIN_MATCHED})")
    p.add_argument("--min-ap", type=float, default=MIN_AP, metavar="F",
                   help=f"drift gate: mask AP (box AP without masks) against float32's detections (default {MIN_AP})")
    p.add_argument("--drift-score", type=float, default=SCORE, metavar="S",
                   help=f"drift report: eager's detections judged are those scoring at least S (default {SCORE})")
    p.add_argument("--debug", action="store_true", help="print tracebacks for errors")
    p.add_argument("--keep-memory", action=argparse.BooleanOptionalAction, default=True,
                   help="keep freed memory in the process (minidet.memory)")
    p.add_argument("opts", nargs=argparse.REMAINDER, metavar="KEY VALUE", help="config overrides (last)")
    # overrides as infer takes them: after --images too (`--images a.jpg MODEL.WEIGHTS x.pth`), options after them
    args = parse_with_overrides(p, argv, lists=("images", "calib"))
    if args.check:
        if args.config_file or args.output or args.force:
            p.error("--check DIR takes the export's own config.yaml: no --config-file, --output or --force")
    elif not (args.config_file and args.output):
        p.error("give --config-file CFG --output DIR (to export), or --check DIR (to check an export)")
    elif args.json:
        p.error("--json goes with --check (an export writes report.json)")
    if args.repeats < 0:
        p.error("--repeats must be >= 0")
    if args.calib_count < 1 or not (0 <= args.min_matched <= 1 and 0 <= args.min_ap <= 1 and 0 <= args.drift_score
                                    <= 1):
        p.error("need --calib-count >= 1 and --min-matched, --min-ap, --drift-score in [0, 1]")
    if not args.check:
        args.runtime = args.runtime or PRECISIONS[args.precision].runtimes[0]
        if problem := precision_problem(args.precision, args.runtime):
            p.error(f"--precision {args.precision} --runtime {args.runtime}: {problem}")
        if args.precision == "int8" and not args.calib:
            p.error("--precision int8 needs --calib IMG ... (calibration images: a folder or files, ideally like "
                    "those the model will see)")
        if args.calib and args.precision != "int8":
            p.error("--calib goes with --precision int8")
    return args


def calibration_images(paths: list[str], count: int) -> list[str]:
    """The image files of ``paths`` (files, or folders: their images, sorted), at most ``count`` spread evenly."""
    from minidet.imageio import IMAGE_EXTENSIONS

    files = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(os.path.join(path, n) for n in os.listdir(path) if n.lower().endswith(IMAGE_EXTENSIONS))
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ConfigError(f"--calib {path}: not found")
    if not files:
        raise ConfigError(f"--calib {' '.join(paths)}: no image files there")
    if len(files) > count:
        files = [files[(i * len(files)) // count] for i in range(count)]
    return files


def calibration_inputs(model, paths: list[str], count: int, max_pixels: int) -> tuple[list[dict], list[str]]:
    """The graph's inputs of each calibration image (minidet's own preprocessing), and the files used; an image
    that cannot be read is a warning line and skipped."""
    from minidet.export.onnxfile import graph_inputs
    from minidet.imageio import ImageReadError

    inputs, used = [], []
    for path in calibration_images(paths, count):
        try:
            image = read_image(path, max_pixels)
        except (ImageReadError, OSError, ValueError) as e:
            print(f"warning: --calib {path}: skipped ({' '.join(str(e).split())})", file=sys.stderr)
            continue
        inputs.append(graph_inputs(model.preprocess([image]), 0))
        used.append(path)
    if not inputs:
        raise ConfigError("--calib: none of the images could be read")
    return inputs, used


def verification_images(paths: list[str] | None, max_pixels: int) -> tuple[list[tuple[str, np.ndarray]], str]:
    """(name, HxWx3 uint8 BGR) pairs and where they came from."""
    from minidet.apps.synthetic import structured_image

    if paths:
        return [(os.path.basename(p), read_image(p, max_pixels)) for p in paths], "given"
    blank = [(f"blank {BLANK[1]}x{BLANK[0]}", np.full((*BLANK, 3), 114, np.uint8))]
    if all((PHOTOS / name).is_file() for name in VERIFY):
        return [(name, read_image(str(PHOTOS / name), max_pixels)) for name in VERIFY] + blank, f"photos in {PHOTOS}"
    synthetic = [(f"synthetic {w}x{h}", structured_image(h, w, i)) for i, (h, w) in enumerate(VERIFY.values())]
    return synthetic + blank, f"synthetic (no {PHOTOS})"


# what the eager model of an export runs with, whatever the config and the overrides say
EAGER_ON_CPU = ["TEST.AMP", "", "MODEL.DEVICE", "cpu", "MODEL.RUNTIME", "torch", "MODEL.GRAPH", "",
                "MODEL.GRAPH_SHA256", "", "MODEL.RUNTIME_PRECISION", "fp32"]


def source_config(args: argparse.Namespace) -> tuple[minidet.config.CfgNode, list[str]]:
    """The eager model's config (``load_cfg``: the config, the overrides, then ``EAGER_ON_CPU``) and what was
    changed for that (the notes read the config and the overrides as given; only the eager model's is validated)."""
    asked = minidet.get_cfg(args.config_file)
    asked.merge_from_list(args.opts)
    notes = []
    if asked.TEST.AMP:
        notes.append(f"TEST.AMP {asked.TEST.AMP}: the graph runs float32 and is checked against float32 eager")
    if asked.MODEL.DEVICE != "cpu":
        notes.append(f"MODEL.DEVICE {asked.MODEL.DEVICE}: exported and checked on the CPU (ONNX Runtime's CPU "
                     "kernels)")
    return minidet.load_cfg(args.config_file, [*args.opts, *EAGER_ON_CPU]), notes


def weights_reference(value: str, resolved: str | None, output: str) -> str:
    """How the export's config.yaml names its weights, so that the folder can be moved: a registry name or URL as
    given (found or downloaded on any machine), else the file's path relative to the folder (``./`` or ``../``:
    resolved beside the config, ``config._beside``); ``none`` for random weights."""
    from minidet.hub import REGISTRY, is_url

    if resolved is None:
        return NO_WEIGHTS
    if is_url(value) or value.strip() in REGISTRY:
        return value.strip()
    rel = os.path.relpath(resolved, os.path.abspath(output))
    return rel if rel.startswith("..") else f"./{rel}"


def versions(runtime: str) -> dict[str, str]:
    """The versions of minidet, the exporter's parts and ``runtime``."""
    from minidet.export.onnxfile import exporter_versions

    return {"minidet": minidet.__version__, **exporter_versions(), runtime: __import__(runtime).__version__,
            "python": platform.python_version()}


def eager_counts(model, images: list[tuple[str, np.ndarray]], precision) -> tuple[list[int], object]:
    """Eager's detection count per verification image, before the export traces anything, and the parity gate's
    eager references (``gate.eager_references``, made here once) for an exact precision (None for the others, whose
    drift report runs eager itself; their counts stop at the first image with a detection)."""
    from minidet.apps.export.gate import eager_references

    if precision.exact:
        references = eager_references(model, images)
        return [len(ref.final["scores"]) for ref, _ in references], references
    counts = []
    for _, image in images:
        counts.append(len(model([image])[0]["scores"]))
        if counts[-1]:
            break
    return counts, None


def nothing_to_judge(args: argparse.Namespace, images: list[tuple[str, np.ndarray]], precision) -> int:
    """Eager finds no detection on any verification image: no gate can judge a graph of it (it would fail), so the
    export stops before it traces: ``report.json`` with eager's count per image, one error line, status 1."""
    what = "the parity gate" if precision.exact else f"the {precision.name} drift gate"
    where = "the one verification image" if len(images) == 1 else f"any of the {len(images)} verification images"
    write_json(os.path.join(args.output, "report.json"), {
        "config": args.config_file, "overrides": list(args.opts), "runtime": args.runtime,
        "precision": precision.name, "passed": False, "written": False, "forced": False,
        "images": [{"name": name, "size": list(image.shape[:2]), "eager": 0} for name, image in images]}, indent=1)
    fail(f"{what} has nothing to judge: eager finds no detection on {where}; nothing exported (details: "
         f"{args.output}/report.json; --force writes it anyway)", args.debug)
    return 1


def gate(model, network, images: list[tuple[str, np.ndarray]], repeats: int, report: dict,
         references=None) -> dict:
    """The parity gate of ``network`` against eager ``model`` (``export_gate.run_gate``; ``references``: eager's
    side, where made already), printed, and ``report`` with it, what ran the graph (runtime, precision, options)
    and on which CPU."""
    from minidet.apps.export.gate import format_table, run_gate

    facts, cpu = network.graph.runtime, cpu_facts()
    print(f"{PROG}: parity gate on {len(images)} images ({facts.get('name')} {facts.get('version')}, "
          f"{facts.get('precision')}, {torch.get_num_threads()} threads, {cpu['model']})")
    result = run_gate(model, network, images, repeats, references)
    print(format_table(result))
    report.update(frame=network.graph.frame, min_side=network.graph.min_side, runtime_facts=facts, cpu=cpu,
                  threads=torch.get_num_threads(), **result)
    return report


def export(args: argparse.Namespace) -> int:
    from minidet.export import require
    from minidet.export.graph import FLOAT_ORDER, inexact_steps
    from minidet.export.onnxfile import (
        cpu_lacks,
        export_onnx,
        graph_files,
        graph_ops,
        graph_sha256,
        open_graph,
        runtime_lacks,
    )
    from minidet.export.runtime import ExportedNetwork
    from minidet.hub import file_sha256

    for module in ("onnx", "onnxscript", args.runtime) + (("nncf",) if args.precision == "int8" else ()):
        require(module, "minidet export", {"openvino": "openvino", "nncf": "int8"}.get(module, "export"))
    if problem := cpu_lacks(args.precision, asked="--precision"):
        raise ConfigError(problem)
    cfg, notes = source_config(args)
    images, image_source = verification_images(args.images, cfg.INPUT.MAX_PIXELS)
    weights = weights_path(cfg.MODEL.WEIGHTS)  # None: MODEL.WEIGHTS none
    predictor = minidet.Predictor(cfg, weights)  # its config fitted to the checkpoint (class count, agnostic heads)
    model, load, cfg = predictor.model, predictor.load_report, predictor.cfg
    if problem := runtime_lacks(args.runtime, graph_ops(model)):  # before the export and its minute
        raise ConfigError(f"--runtime {args.runtime}: {problem}")
    digest = NO_WEIGHTS if weights is None else file_sha256(weights)
    precision = PRECISIONS[args.precision]
    graph_path = os.path.abspath(os.path.join(args.output, precision.graph))
    out_cfg = cfg.clone()
    out_cfg.defrost()  # the paths relative to the folder: it can be copied or moved (config._beside)
    out_cfg.merge_from_list(["MODEL.RUNTIME", args.runtime, "MODEL.GRAPH", precision.graph, "MODEL.WEIGHTS",
                             weights_reference(cfg.MODEL.WEIGHTS, weights, args.output),
                             "MODEL.RUNTIME_PRECISION", precision.name])
    metadata = {"minidet.weights": weights or NO_WEIGHTS, "minidet.weights_sha256": digest,
                "minidet.weights_format": load.format if load else "random",
                "minidet.tensors": str(load.loaded if load else 0), "minidet.config": out_cfg.dump()}
    print(f"export: {args.config_file}, weights {load.summary if load else 'none (random)'}")
    if predictor.classes_summary:
        print(f"export: {predictor.classes_summary}")
    counts, references = eager_counts(model, images, precision)
    if not any(counts) and not args.force:
        return nothing_to_judge(args, images, precision)
    t0 = time.perf_counter()
    data = export_onnx(model, model.preprocess([images[0][1]]), metadata)
    t_export = time.perf_counter() - t0
    print(f"export: graph of {len(data) / 2**20:.0f} MiB in {t_export:.0f} s")
    report = {"config": args.config_file, "overrides": list(args.opts), "runtime": args.runtime,
              "precision": precision.name, "exact": precision.exact,
              "weights": {"path": weights or NO_WEIGHTS, "sha256": digest},
              "export_seconds": t_export, "versions": versions(args.runtime), "images_from": image_source,
              "not_exact": inexact_steps(model) + notes, "float_order": FLOAT_ORDER}
    if precision.exact:
        files = data
        sha = graph_sha256(files)
        network = ExportedNetwork(open_graph(graph_path, digest, data=files, runtime=args.runtime, sha256=sha))
        gate(model, network, images, args.repeats, report, references)
    else:
        files, sha = lower_precision(args, model, data, digest, graph_path, images, cfg.INPUT.MAX_PIXELS, report)
    out_cfg.merge_from_list(["MODEL.GRAPH_SHA256", sha])
    written = report["passed"] or args.force
    report.update(graph_sha256=sha, written=written, forced=written and not report["passed"],
                  graph_files=[os.path.basename(path) for path, _ in graph_files(graph_path, files)])
    if written:
        for path, content in graph_files(graph_path, files):  # int8: model.bin, then model.xml
            atomic_write(path, content)
        what = "parity gate" if precision.exact else f"{precision.name} drift gate"
        mark = f"{what} passed" if report["passed"] else f"{what} FAILED (written with --force)"
        source = "random weights" if weights is None else f"{out_cfg.MODEL.WEIGHTS} (SHA-256 {digest[:12]}...)"
        text = f"# minidet export of {source}: {mark}\n{out_cfg.dump()}"
        atomic_write(os.path.join(args.output, "config.yaml"), text.encode())
    write_json(os.path.join(args.output, "report.json"), report, indent=1)
    for line in report["not_exact"]:
        print(f"not exact: {line}")
    return finish(args, report)


def lower_precision(args: argparse.Namespace, model, data: bytes, digest: str, graph_path: str,
                    images: list[tuple[str, np.ndarray]], max_pixels: int, report: dict):
    """A bf16 or int8 export: the float32 graph ``data`` compiled in bf16, or quantized to int8 by NNCF on the
    ``--calib`` images; its drift report against eager float32 printed and put into ``report``; returns the
    graph's bytes (int8: model.xml's and model.bin's) and their SHA-256."""
    from minidet.apps.export.drift import Probes
    from minidet.export.onnxfile import graph_sha256, open_graph, openvino_options
    from minidet.export.quantize import named_model, quantize, serialize
    from minidet.export.runtime import ExportedNetwork

    name = args.precision
    float32 = ExportedNetwork(open_graph(graph_path, digest, data=data, runtime="openvino", precision="fp32"))
    reference = named_model(data)
    if name == "int8":
        calibration, used = calibration_inputs(model, args.calib, args.calib_count, max_pixels)
        print(f"{PROG}: calibrating on {len(used)} images (NNCF post-training quantization)", flush=True)
        t0 = time.perf_counter()
        other, facts = quantize(reference, calibration, float32.graph.metadata)
        facts.update(seconds=time.perf_counter() - t0, images=[os.path.basename(p) for p in used],
                     overlaps_verification=sorted({os.path.basename(p) for p in used} & {n for n, _ in images}))
        report["quantization"] = facts
        print(f"{PROG}: {facts['layers']['int8']} weighted layers in int8, {facts['layers']['float32']} kept "
              f"float32 ({', '.join(facts['kept_float'])}) in {facts['seconds']:.0f} s")
        files = serialize(other)
    else:
        other, files = reference, data
    sha = graph_sha256(files)
    network = ExportedNetwork(open_graph(graph_path, digest, data=files, runtime="openvino", precision=name,
                                         sha256=sha))
    threads = torch.get_num_threads()
    probes = Probes(reference, other, openvino_options("fp32", threads), openvino_options(name, threads))
    drift_gate(args, name, model, network, images, report, float32, probes)
    return files, sha


def drift_gate(args: argparse.Namespace, precision: str, model, network, images: list[tuple[str, np.ndarray]],
               report: dict, float32=None, probes=None) -> dict:
    """The drift report and gate (``drift.run_drift``) of ``network``, the graph in ``precision``, against eager
    ``model`` with the thresholds of ``args``, printed, and ``report`` with it, what ran the graph and on which CPU
    (as ``gate`` for the parity gate). ``float32``: the float32 graph, timed beside it; ``probes``: the feature
    stages' probes (None: an export folder without the float32 graph, ``--check``)."""
    from minidet.apps.export.drift import Thresholds, format_drift, run_drift

    facts = network.graph.runtime
    print(f"{PROG}: {precision} drift against eager float32 on {len(images)} images ({facts.get('name')} "
          f"{facts.get('version')}, {torch.get_num_threads()} threads)")
    thresholds = Thresholds(args.min_matched, args.min_ap, args.drift_score)
    drift = run_drift(model, network, float32, images, probes, thresholds, args.repeats)
    print(format_drift(drift, precision))
    report.update(precision=precision, frame=network.graph.frame, min_side=network.graph.min_side,
                  runtime_facts=facts, cpu=cpu_facts(), threads=torch.get_num_threads(), drift=drift,
                  passed=drift["passed"])
    return report


def check(args: argparse.Namespace) -> int:
    """``--check DIR``: the export's config.yaml (and the overrides) loaded as ``minidet infer`` loads it (the graph
    and its checks, the eager network of the same weights beside it), and the parity gate run here."""
    from minidet.export.graph import FLOAT_ORDER, inexact_steps

    path = os.path.join(args.check, "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"--check {args.check}: no config.yaml there (the folder `minidet export --output` wrote)")
    cfg = minidet.load_cfg(path, args.opts)
    if cfg.MODEL.RUNTIME == "torch":
        raise ConfigError(f"--check {args.check}: its config runs MODEL.RUNTIME torch, no exported graph")
    images, image_source = verification_images(args.images, cfg.INPUT.MAX_PIXELS)
    predictor = minidet.Predictor(cfg)
    model = predictor.model
    network = model.network  # the graph; the model runs the eager network of the same weights beside it
    print(f"{PROG}: {predictor.weights_summary}")
    report = {"check": os.path.abspath(args.check), "overrides": list(args.opts), "runtime": cfg.MODEL.RUNTIME,
              "versions": versions(cfg.MODEL.RUNTIME), "images_from": image_source,
              "not_exact": inexact_steps(model), "float_order": FLOAT_ORDER}
    precision = PRECISIONS[cfg.MODEL.RUNTIME_PRECISION]
    with model.running(None):
        if precision.exact:
            gate(model, network, images, args.repeats, report)
        else:  # no float32 graph in the folder to time and probe beside it
            drift_gate(args, precision.name, model, network, images, report)
    if args.json:
        write_json(args.json, report, indent=1)
    facts = report["runtime_facts"]
    where = f"{facts.get('name')} {facts.get('version')} ({facts.get('precision')}) on {report['cpu']['model']}"
    if report["passed"]:
        done = "gives eager's detections" if precision.exact else f"passes the {precision.name} drift gate"
        print(f"{PROG}: the graph of {args.check} {done} under {where}")
        return 0
    fail(f"--check {args.check}: {gate_name(report)} failed {why_failed(report)} under {where}", args.debug)
    return 1


def gate_name(report: dict) -> str:
    return f"the {report['precision']} drift gate" if "drift" in report else "the parity gate"


def why_failed(report: dict) -> str:
    if "drift" in report:
        return f"({report['drift']['why']})"
    bad = [c for c in report["images"] if c["verdict"] == "DIFFERS"]
    return (f"on {len(bad)} of {len(report['images'])} images (first: {bad[0]['name']}, at {bad[0]['first']}: "
            f"{bad[0]['problem']})" if bad else "to check anything: no image with detections was judged")


def finish(args: argparse.Namespace, report: dict) -> int:
    """The last line: what was written, or why not (status 1 when the gate failed without ``--force``)."""
    config = os.path.join(args.output, "config.yaml")
    if report["passed"]:
        print(f"export: wrote {', '.join(report['graph_files'])}, config.yaml and report.json into {args.output}; "
              f"run it with --config-file {config}; check it where it runs with `minidet export --check {args.output}`")
        return 0
    if report["written"]:
        print(f"warning: {gate_name(report)} failed {why_failed(report)}; written anyway (--force), marked in "
              f"report.json and {config}", file=sys.stderr)
        return 0
    fail(f"{gate_name(report)} failed {why_failed(report)}; nothing exported (details: {args.output}/report.json; "
         "--force writes it anyway; the thresholds are options)", args.debug)
    return 1


def main(argv: list[str] | None = None, prog: str = "export.py") -> int:
    """Run the program; return the exit status (0 written or checked, 1 the gate failed, 2 error, 130 Ctrl-C)."""
    args = parse_args(argv, prog)
    if args.check:
        return run_app(args, contextlib.nullcontext, lambda: check(args))
    return run_app(args, lambda: OutputDir(args.output, "--output"), lambda: export(args))


if __name__ == "__main__":
    sys.exit(main())
