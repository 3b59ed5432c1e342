"""Run a minidet Mask R-CNN over images and videos: per image a drawing and a COCO-style JSON, per video a drawn
video and per-frame records, optionally one results file for the whole run; batched, decoded in loader workers
while the model runs, sharded under torchrun, resumable.

Usage::

    python tools/infer.py --config-file CFG --input PATH [PATH ...] --output DIR [options] [KEY VALUE ...]
    python tools/infer.py --config-file CFG --input-list FILES.txt --output DIR --results DIR/results.jsonl
    torchrun --nproc_per_node N tools/infer.py --config-file CFG --input DIR --recursive --output DIR ...

Inputs (``--input`` and ``--input-list``, together or alone): image files (jpg, png, bmp, tif, webp) and video
files (mp4, avi, mkv, mov), folders (their images and videos; sub-folders too with ``--recursive``), quoted glob
patterns (``**`` matches any depth), and a list file of paths, one per line (``#`` comments and blank lines
skipped; relative paths are relative to the list file). They are taken in sorted path order, repeats dropped;
the image ids of ``--results`` follow that order. Each output keeps the input's folders relative to its root (the
folder given, a pattern's fixed part, or the common folder of the files named directly or in a list): ``a/x.jpg``
and ``b/x.jpg`` become ``DIR/a/x.*`` and ``DIR/b/x.*``; two inputs that still meet get ``x_1`` etc.

Per image: ``<name>.json`` (file, height, width, instances with bbox [x, y, w, h], score, category id and name,
RLE segmentation) and, unless ``--no-vis``, ``<name>.jpg`` (``--vis-thresh``, ``--mask-alpha``, ``--no-boxes``,
``--no-labels``). Per video (every ``--every``-th frame): ``<name>.jsonl`` (one line a frame: frame index, time in
seconds, instances) and the drawn ``<name>.mp4`` (``.avi`` with MJPG) at the input's size and frame rate (divided
by ``--every``, so that it lasts as long), written with the first of ``--codecs`` that works and read back to
check its frame count. ``--classes person,dog`` keeps only those classes in every output (after detection: the
detections kept are those of an unfiltered run). ``--results FILE``: ``.jsonl``, one image record a line, streamed
to ``FILE.partial`` as images finish and written in image order at the end; or ``.json`` in COCO results format
with an ``images`` list (id, file name, size), which ``eval_coco.py --results`` evaluates against annotations.

Finished inputs are recorded in ``DIR/.chunks/`` every ``--chunk-size`` images per process, as soon as their
files are written (synced to the disk): after a crash, Ctrl-C, SIGKILL, a full disk or a dead torchrun process the
same command with ``--resume`` (options may follow the ``KEY VALUE`` overrides) skips the inputs whose outputs are
complete and writes the same files as an uninterrupted run. The run's identity (config, checkpoint by content,
inputs, output options) is recorded when it starts: ``--resume`` with another one is refused, saying what differs,
even when the earlier run was killed before its first chunk. Without ``--resume`` a run starts over. Under torchrun
each process takes every N-th input and writes its own chunks; rank 0 writes the results file (``DIR`` on a file
system all processes see). ``--engine ray`` runs the images on a pool of ``--actors`` actors of a Ray cluster
instead, with the same outputs (``minidet.apps.bulk.raydata``).

An input that cannot be read or run gets one ``error: <file>: <what>`` line and the run goes on (exit status 1);
a folder's entries that are neither images nor videos are counted on one ``infer: skipped ...`` line. Bad configs,
weights or arguments stop the run with one ``error:`` line (exit status 2; ``--debug`` adds the traceback);
Ctrl-C exits with 130, SIGTERM with 143, every file written being complete (temporary name, then rename). At the
end: the per-stage timing table and images per second. Freed memory stays in the process for the next image (no
page faults; the process keeps its peak memory): ``--no-keep-memory`` leaves glibc's defaults (``minidet.memory``).
"""

from __future__ import annotations

import argparse
import os
import sys

from minidet.apps import fail, parse_with_overrides, run_app
from minidet.apps.bulk import dist, sliced
from minidet.apps.bulk.engines import LocalEngine
from minidet.apps.bulk.infer_job import Job
from minidet.apps.bulk.job import drive
from minidet.apps.outputs import options
from minidet.apps.outputs.fileio import OutputDir
from minidet.apps.outputs.options import MASK_FORMATS
from minidet.apps.outputs.video import CODECS


def parse_args(argv: list[str] | None = None, prog: str = "infer.py") -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog=prog, description="Mask R-CNN inference over images and videos.")
    p.add_argument("--config-file", required=True, metavar="CFG", help="yaml config file")
    p.add_argument("--input", nargs="+", default=[], metavar="PATH", help="image or video files, folders, globs")
    p.add_argument("--input-list", metavar="FILE", help="a file of input paths, one per line")
    p.add_argument("--recursive", action="store_true", help="folders: their sub-folders too")
    p.add_argument("--output", required=True, metavar="DIR", help="output folder (created if needed)")
    p.add_argument("--results", metavar="FILE", help="one results file for the run: .jsonl or .json (COCO)")
    p.add_argument("--no-vis", action="store_true", help="write no drawings (JSON only)")
    p.add_argument("--vis-thresh", type=float, default=0.5, help="draw instances scoring at least this")
    p.add_argument("--mask-alpha", type=float, default=0.5, help="opacity of the drawn masks (0 to 1)")
    p.add_argument("--no-boxes", action="store_true", help="draw no boxes")
    p.add_argument("--no-labels", action="store_true", help="draw no class labels")
    p.add_argument("--mask-format", choices=MASK_FORMATS, default="rle",
                   help="masks in the records: COCO RLE (exact), COCO polygons (outlines; holes filled) or none")
    p.add_argument("--polygon-tolerance", type=float, default=0.0, metavar="PX",
                   help="--mask-format polygon: simplify outlines by up to PX pixels (0: exact pixel edges)")
    p.add_argument("--classes", metavar="NAMES", help="comma-separated class names to keep, e.g. person,dog")
    sliced.add_options(p)
    p.add_argument("--every", type=int, default=1, metavar="N", help="videos: every N-th frame")
    p.add_argument("--codecs", default=",".join(CODECS), help="video codecs (FourCC) to try, in order")
    p.add_argument("--workers", type=int, default=2, help="image decoding processes per process (0: none)")
    p.add_argument("--chunk-size", type=int, default=100, help="images per saved progress chunk")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run into DIR")
    p.add_argument("--warmup", type=int, default=1, help="batches per process left out of the timing statistics")
    p.add_argument("--debug", action="store_true", help="print tracebacks for errors")
    p.add_argument("--keep-memory", action=argparse.BooleanOptionalAction, default=True,
                   help="keep freed memory in the process for reuse (no page faults; it keeps its peak memory)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: this process (or torchrun's); ray: an actor pool on a Ray cluster (minidet[ray])")
    p.add_argument("--ray-address", metavar="ADDR", help="--engine ray: the cluster, HOST:PORT, ray://HOST:PORT, auto "
                   "or local (default: RAY_ADDRESS, else a local Ray instance)")
    p.add_argument("--actors", type=int, default=1, metavar="N", help="--engine ray: model actors")
    p.add_argument("--gpus-per-actor", type=float, metavar="G",
                   help="--engine ray: GPUs per actor (default: 1 with MODEL.DEVICE cuda, else 0)")
    p.add_argument("opts", nargs=argparse.REMAINDER, metavar="KEY VALUE", help="config overrides")
    # overrides are taken as they are (e.g. MODEL.FROZEN_BN_EPS -1e-5), options may follow them
    args = parse_with_overrides(p, argv, lists=("input",))
    if not (args.input or args.input_list):
        p.error("give --input PATH ... or --input-list FILE")
    if args.warmup < 0 or args.workers < 0 or args.chunk_size < 1 or args.every < 1:
        p.error("need --warmup >= 0, --workers >= 0, --chunk-size >= 1, --every >= 1")
    args.options = options.from_args(args, p)  # the run's output options, checked: what every engine reads
    if args.actors < 1 or (args.gpus_per_actor or 0) < 0:
        p.error("need --actors >= 1, --gpus-per-actor >= 0")
    if args.results and os.path.splitext(args.results)[1] not in (".json", ".jsonl"):
        p.error(f"--results {args.results}: the name must end in .jsonl (a record per line) or .json (COCO)")
    args.codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    if not args.codecs or any(len(c) != 4 for c in args.codecs):
        p.error("--codecs: FourCC codes of four characters, comma-separated, e.g. avc1,mp4v,MJPG")
    return args


def run(args: argparse.Namespace) -> int:
    """Set up, run this process's share, then rank 0 finishes (a set-up error is ``run_app``'s one line)."""
    if args.engine == "ray":
        from minidet.apps.bulk.raydata import RayEngine  # Ray itself is imported there, only when installed

        job = Job(args, RayEngine(args))
    else:
        job = Job(args, LocalEngine(args))
    return drive(job, lambda message: fail(message, args.debug), "--output", job.finish)


def main(argv: list[str] | None = None, prog: str = "infer.py") -> int:
    """Run the tool; return the exit status (0 ok, 1 some inputs failed, 2 error, 130 Ctrl-C, 143 SIGTERM)."""
    args = parse_args(argv, prog)
    # DIR locked for the run by rank 0; libjpeg / libpng / FFmpeg lines only with --debug
    folders = lambda: OutputDir(args.output, "--output", lock=dist.from_env().is_main)  # noqa: E731
    return run_app(args, folders, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
