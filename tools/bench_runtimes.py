"""minidet's exported graph run by ONNX Runtime and by OpenVINO, against eager minidet and torchvision, interleaved.

Usage::

    python tools/bench_runtimes.py [--size 800] [--images N] [--iters 3] [--warmup 1] [--threads T] [--json OUT]

torchvision's own ``maskrcnn_resnet50_fpn`` with realistic random weights (``minidet.apps.bench.reference.build_tv``, as
``tools/benchmark.py`` makes them) is saved, loaded by minidet (``torchvision/maskrcnn_resnet50_fpn``, FrozenBN,
and the fast config: Affine folded, channels-last) and exported from the FrozenBN model (``minidet.export``); the
one ``model.onnx`` runs in minidet's pipeline (its preprocess and paste around it) under ONNX Runtime and under
OpenVINO. Each iteration runs every image through every model in turn, the order rotating by one model per
iteration; ``--warmup`` iterations are not recorded. The images are the first ``N`` real photos of the export's
verification set (the checkout's ``../shared/data/coco_tiny``), resized by each to short side ``--size``. Prints
the median seconds per image, each against torchvision and against eager minidet, whether each model's detections
are eager minidet's (the parity gate's rule without its noise allowance) and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
try:
    import minidet
except ImportError:  # a source checkout that is not installed
    sys.path.insert(0, str(ROOT / "src"))
    import minidet

from minidet.apps.bench.reference import binarize_masks, build_tv, legacy_v1_state_dict, to_tv_input  # noqa: E402
from minidet.apps.compare import compare_detections  # noqa: E402
from minidet.apps.export.program import PHOTOS, VERIFY  # noqa: E402
from minidet.export.onnxfile import export_onnx, open_graph  # noqa: E402
from minidet.export.runtime import ExportedNetwork  # noqa: E402
from minidet.imageio import read_image  # noqa: E402
from minidet.machine import cpu_model, load_average  # noqa: E402
from minidet.runtimes import RUNTIMES  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=800)
    p.add_argument("--images", type=int, default=3, help="how many of the verification photos")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    max_size = round(args.size * 1333 / 800)
    images = [read_image(str(PHOTOS / name)) for name in list(VERIFY)[: args.images]]
    tmp = tempfile.mkdtemp(prefix="bench_runtimes.")
    tv = build_tv(1, args.size, max_size)
    weights = os.path.join(tmp, "tv.pth")
    torch.save(legacy_v1_state_dict(tv.state_dict()), weights)

    def minidet_model(config: str):
        opts = ["MODEL.WEIGHTS", weights, "INPUT.MIN_SIZE_TEST", args.size, "INPUT.MAX_SIZE_TEST", max_size]
        return minidet.prepare_model(minidet.load_cfg(config, opts))[0]

    eager = minidet_model("torchvision/maskrcnn_resnet50_fpn")
    fast = minidet_model("torchvision/maskrcnn_resnet50_fpn_fast")
    t0 = time.perf_counter()
    graph_path = os.path.join(tmp, "model.onnx")
    with open(graph_path, "wb") as f:
        f.write(export_onnx(eager, eager.preprocess(images[:1]), {"minidet.weights_sha256": "bench"}))
    print(f"exported in {time.perf_counter() - t0:.0f} s")
    networks = {rt: ExportedNetwork(open_graph(graph_path, runtime=rt)) for rt in RUNTIMES}

    def on(network):
        def run(image):
            with eager.running(network):
                return eager([image])[0]
        return run

    @torch.inference_mode()
    def torchvision(image):
        return binarize_masks(tv([to_tv_input(image)]))[0]

    runners = {"torchvision": torchvision, "minidet eager": lambda im: eager([im])[0],
               "minidet eager fast": lambda im: fast([im])[0], **{f"minidet {k}": on(n) for k, n in networks.items()}}
    names = list(runners)
    times: dict[str, list[float]] = {n: [] for n in names}
    load_before = load_average()[0]
    for it in range(args.warmup + args.iters):
        order = names[it % len(names):] + names[: it % len(names)]
        for image in images:
            for n in order:
                t = time.perf_counter()
                runners[n](image)
                if it >= args.warmup:
                    times[n].append(time.perf_counter() - t)
    load_after = load_average()[0]
    refs = [runners["minidet eager"](im) for im in images]
    problems = {n: [compare_detections(runners[n](im), r).problem() for im, r in zip(images, refs)]
                for n in names if n != "minidet eager"}
    same = {n: sum(not p for p in v) for n, v in problems.items()}
    med = {n: statistics.median(v) for n, v in times.items()}
    print(f"{cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}; short side {args.size}; "
          f"{len(images)} photos x {args.iters} iterations (+{args.warmup} warm-up); load average {load_before:.1f} "
          f"before, {load_after:.1f} after")
    print(f"{'model':<22} {'median s/image':>15} {'vs torchvision':>15} {'vs eager':>9}  same detections as eager")
    for n in names:
        agree = f"{same[n]} of {len(images)}" if n in same else "-"
        print(f"{n:<22} {med[n]:>15.3f} {med['torchvision'] / med[n]:>14.2f}x {med['minidet eager'] / med[n]:>8.2f}x"
              f"  {agree}")
    for n, found in problems.items():
        for name, problem in zip(VERIFY, found):
            if problem:
                print(f"  {n} on {name}: {problem}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "threads": torch.get_num_threads(), "size": args.size, "times": times,
                       "median": med, "differences": problems, "load": [load_before, load_after]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
