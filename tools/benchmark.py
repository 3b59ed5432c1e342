"""Weight-free speed benchmark of the minidet Mask R-CNN: per-stage times, images/s, memory.

Usage::

    python tools/benchmark.py [--config-file CFG] [--size 800] [--image 480x640] [--iters 5]
        [--warmup 1] [--batch 1] [--norm FrozenBN|Affine|GN] [--fold] [--device cpu] [KEY VALUE ...]

No checkpoint is needed: the model gets realistic random weights (every frozen batch norm is
calibrated on its own input, class logits are sharpened so that about 100 detections per image
pass the score threshold, as with a trained model). The inputs are structured synthetic images
of ``--image`` pixels (COCO's most common size by default); the network sees them resized to a
short side of ``--size``. Trailing ``KEY VALUE`` pairs override the config last.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    import minidet
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import minidet

import torch

from minidet.config import ConfigError
from minidet.synthetic import calibrate_norm_stats, randomize_affine, structured_image
from minidet.timing import StageTimer, format_table, summarize

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmark.py", description="Weight-free Mask R-CNN speed benchmark.")
    p.add_argument("--config-file", default=str(DEFAULT_CONFIG), metavar="CFG", help="yaml config file")
    p.add_argument("--size", type=int, default=800, help="short side of the network input (INPUT.MIN_SIZE_TEST)")
    p.add_argument("--image", default="480x640", metavar="HxW", help="size of the synthetic input images")
    p.add_argument("--iters", type=int, default=5, help="timed iterations")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    p.add_argument("--batch", type=int, default=1, help="images per forward")
    p.add_argument("--norm", default="FrozenBN", choices=["FrozenBN", "Affine", "GN"], help="MODEL.NORM")
    p.add_argument("--fold", action="store_true", help="fold the norms into the convs (MODEL.FOLD_NORM)")
    p.add_argument("--device", default="cpu", help="MODEL.DEVICE, e.g. cpu, cuda")
    p.add_argument("opts", nargs=argparse.REMAINDER, metavar="KEY VALUE", help="config overrides")
    args = p.parse_args(argv)
    try:
        args.image_hw = tuple(int(v) for v in args.image.lower().split("x"))
        assert len(args.image_hw) == 2 and min(args.image_hw) > 0
    except (ValueError, AssertionError):
        p.error(f"--image must look like 480x640; got {args.image!r}")
    if args.iters < 1 or args.warmup < 0 or args.batch < 1 or args.size < 1:
        p.error("need --iters >= 1, --warmup >= 0, --batch >= 1, --size >= 1")
    return args


def make_cfg(args: argparse.Namespace):
    cfg = minidet.get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list([
        "MODEL.WEIGHTS", "", "MODEL.NORM", args.norm, "MODEL.FOLD_NORM", args.fold, "MODEL.DEVICE", args.device,
        "INPUT.MIN_SIZE_TEST", args.size, "INPUT.MAX_SIZE_TEST", round(args.size * 1333 / 800),
    ])  # fmt: skip
    cfg.merge_from_list(args.opts)
    return cfg


@torch.no_grad()
def random_model(cfg, calib_image, logit_std: float = 2.0) -> torch.nn.Module:
    """The model of ``cfg`` with realistic random weights (see the module docstring).

    Frozen batch norms take the statistics of their own input on ``calib_image``; in the same
    forward the class logits are measured and ``cls_score`` rescaled so that, per proposal, they
    spread with standard deviation ``logit_std`` over the classes (a trained model's confidence).
    """
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    base = cfg.clone()
    if cfg.MODEL.NORM != "GN":  # calibrate as FrozenBN on the CPU, then load into the requested norm
        base.merge_from_list(["MODEL.NORM", "FrozenBN", "MODEL.FOLD_NORM", False, "MODEL.DEVICE", "cpu"])
    model = minidet.build_model(base)
    randomize_affine(model, gen)
    feats = []
    hook = model.box_predictor.register_forward_pre_hook(lambda mod, args: feats.append(args[0]))
    if cfg.MODEL.NORM == "GN":
        model([calib_image])
    else:
        calibrate_norm_stats(model, lambda: model([calib_image]), gen)
    hook.remove()
    cls = model.box_predictor.cls_score
    cls.weight.mul_(logit_std / (feats[0] @ cls.weight.T).std(dim=1).mean())
    if cfg.MODEL.NORM == "GN":
        return model.to(cfg.MODEL.DEVICE)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "random.pth")
        torch.save(model.state_dict(), path)
        model, _ = minidet.prepare_model(cfg, weights=path)
    return model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = make_cfg(args)
        images = [
            structured_image(*args.image_hw, seed=i) for i in range(min(args.iters + args.warmup, 4) * args.batch)
        ]
        model = random_model(cfg, images[0])
    except (ConfigError, RuntimeError, ValueError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    device = torch.device(cfg.MODEL.DEVICE)
    model.timer = StageTimer(enabled=True, device=device)
    cuda = device.type == "cuda"

    norm = cfg.MODEL.NORM + (" folded" if cfg.MODEL.FOLD_NORM else "")
    print(
        f"torch {torch.__version__}, python {platform.python_version()}, {torch.get_num_threads()} threads, "
        f"device {device}" + (f" ({torch.cuda.get_device_name(device)})" if cuda else "")
    )
    print(
        f"config {args.config_file}, norm {norm}, input {args.image} -> short side {cfg.INPUT.MIN_SIZE_TEST}, "
        f"batch {args.batch}, warm-up {args.warmup}, iters {args.iters}"
    )

    records, walls, dets = [], [], []
    n_pool = len(images) // args.batch
    for it in range(args.warmup + args.iters):
        k = it % n_pool
        batch = images[k * args.batch : (k + 1) * args.batch]
        model.timer.reset()
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        outs = model(batch)
        if cuda:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
        if it >= args.warmup:
            records.append(dict(model.timer.times))
            walls.append(wall)
            dets.extend(len(o["boxes"]) for o in outs)

    print(format_table(summarize(records), title=f"per-forward stage times ({args.batch} image(s) each):"))
    med = statistics.median(walls)
    print(
        f"wall per forward: median {1e3 * med:.1f} ms, mean {1e3 * statistics.fmean(walls):.1f} ms"
        f" -> {args.batch / med:.2f} images/s (median)"
    )
    print(f"detections per image: mean {statistics.fmean(dets):.1f}, min {min(dets)}, max {max(dets)}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    rss_mib = rss / 2**20 if sys.platform == "darwin" else rss / 1024
    mem = f"peak RSS {rss_mib:.0f} MiB"
    if cuda:
        mem += f", peak CUDA memory allocated {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB"
    print(mem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
