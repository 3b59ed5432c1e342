"""Test support, one helper per purpose: a config from a file plus overrides, a tool of tools/ run
in a subprocess or imported in-process, the one-line error a failed set-up prints, the parity
tests' images.

Weights, images and the detection comparison shared with the benchmark are in ``minidet.testing``;
the session-scoped checkpoint files are fixtures in ``conftest.py``; ``procs`` reads processes.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

import minidet
from minidet.apps.synthetic import structured_image

ROOT = Path(__file__).resolve().parent.parent
# the parity tests' three images: (height, width) of different sizes and aspect ratios
IMAGE_SHAPES = [(240, 320), (300, 200), (180, 420)]
# the memory tests: PASSES passes over PASS_IMAGES of coco_tiny's images in one process (the passes after the first: 80
# images, as many as coco_tiny's); together they may grow the resident memory by less than MEMORY_BOUND_MB, each by
# less than half of it
MEMORY_BOUND_MB, PASS_IMAGES, PASSES = 200, 20, 5
# cases that compare two runs where the count of proposals and detections is not the subject (test_export's graph and
# gate cases, test_own_classes' class mapping, the bit-for-bit cases against the sources): 300 proposals and 30
# detections an image. The families' 1000 and 100 are caps, not rules: the same top-k, NMS and caps run on fewer rows;
# the heads on 1000 proposals and 100 detections were most of each case's time. The reference tests run their sources
# at the same caps (``fewer`` of tests/mmdet_reference.py's and tests/detectron2_reference.py's ``zoo_config``)
PROPOSALS, DETECTIONS = 300, 30
FEWER = ["MODEL.RPN.POST_NMS_TOPK_TEST", PROPOSALS, "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", DETECTIONS]
# minidet's side of the bit-for-bit cases against mmdetection and detectron2: their test scale (short side 320, long
# 512, which the sources' ``zoo_config`` sets too), mmcv's and detectron2's RoIAlign arithmetic, FEWER's caps
REFERENCE_SCALE = ["INPUT.MIN_SIZE_TEST", 320, "INPUT.MAX_SIZE_TEST", 512, "MODEL.ROI_ALIGN_IMPL", "torchvision",
                   *FEWER]


def assert_flat(rss: list[float]) -> None:
    """The resident memory (MB) after each pass of a memory test is flat: the passes after the first grow it by less
    than ``MEMORY_BOUND_MB`` together (a generous bound: it measured a few MB, up to 42 MB in infer's second pass),
    each by less than half of that."""
    grown = [b - a for a, b in zip(rss, rss[1:])]
    print("resident memory after each pass: " + ", ".join(f"{r:.0f} MB" for r in rss))
    assert len(rss) == PASSES and rss[-1] - rss[0] < MEMORY_BOUND_MB, rss
    assert all(g < MEMORY_BOUND_MB / 2 for g in grown), rss


def images_bgr(shapes=IMAGE_SHAPES, seed: int = 0) -> list[np.ndarray]:
    """``structured_image`` of each shape, seeds ``seed``, ``seed + 1``, ..."""
    return [structured_image(h, w, seed + i) for i, (h, w) in enumerate(shapes)]


def config(path: str | Path, *opts, weights: str | Path = "") -> minidet.config.CfgNode:
    """``minidet.load_cfg``: the file ``path`` (absolute, or relative to the repository root), then
    ``MODEL.WEIGHTS weights`` and the ``KEY VALUE`` pairs ``opts``, in that order; validated and frozen."""
    return minidet.load_cfg(str(ROOT / path), ["MODEL.WEIGHTS", str(weights), *opts])


def load_tool(path: Path):
    """The code of the script ``tools/<name>.py`` (``minidet.apps.<name>``) as a fresh module on every
    call, for in-process tests."""
    from minidet.apps.cli import SCRIPTS

    module = SCRIPTS[Path(path).stem].replace(".", "/") + ".py"
    path = Path(minidet.__file__).parent / "apps" / module
    spec = importlib.util.spec_from_file_location(path.stem + "_tool", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_tool(
    tool: Path,
    *args: str,
    cwd: Path,
    threads: int | str | None = None,
    launcher: tuple[str, ...] = (),
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """``python [launcher...] tool args...`` in ``cwd``, output captured as text, never raising on
    a failure. ``PYTHONPATH`` is emptied: a tool must find minidet by itself. ``threads`` sets
    ``OMP_NUM_THREADS`` (one thread is many times faster than two OpenMP threads fighting other
    jobs for two cores; the same count in every run keeps float sums alike)."""
    env = {**os.environ, "PYTHONPATH": ""}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, *launcher, str(tool), *args]
    return subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def one_error_line(err: str) -> str:
    """The single line a failed set-up prints (and nothing else, no traceback)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def call_tool(
    tool: Path,
    *args: str,
    capture=None,
    cwd: Path | None = None,
    threads: int | str | None = None,
) -> subprocess.CompletedProcess:
    """``run_tool`` in this process, for a test that is not about the process: ``load_tool(tool).main(
    ["--no-keep-memory", *args])`` (glibc's settings are the whole process's: left alone) in ``cwd``, with
    torch's intra-op thread count ``threads`` (what ``OMP_NUM_THREADS`` sets in a subprocess). Output is read
    with ``capture`` (pytest's ``capfd`` or ``capsys``; what was printed before the call is dropped), else
    caught from ``sys.stdout`` / ``sys.stderr`` (for a module-scoped fixture). A ``SystemExit`` (argparse)
    becomes the status. The current folder, torch's thread count, the SIGTERM handler and OpenCV's log level,
    which ``main`` changes, are put back afterwards."""
    import contextlib
    import io
    import signal

    import cv2
    import torch

    saved = os.getcwd(), torch.get_num_threads(), signal.getsignal(signal.SIGTERM), cv2.utils.logging.getLogLevel()
    out, err = io.StringIO(), io.StringIO()
    if capture is not None:
        capture.readouterr()
    try:
        if cwd is not None:
            os.chdir(cwd)
        if threads is not None:
            torch.set_num_threads(int(threads))
        with contextlib.ExitStack() as stack:
            if capture is None:
                stack.enter_context(contextlib.redirect_stdout(out))
                stack.enter_context(contextlib.redirect_stderr(err))
            try:
                rc = load_tool(tool).main(["--no-keep-memory", *args])
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        os.chdir(saved[0])
        torch.set_num_threads(saved[1])
        signal.signal(signal.SIGTERM, saved[2])
        cv2.utils.logging.setLogLevel(saved[3])
    if capture is not None:
        text = capture.readouterr()
        return subprocess.CompletedProcess([str(tool), *args], rc, text.out, text.err)
    return subprocess.CompletedProcess([str(tool), *args], rc, out.getvalue(), err.getvalue())


def assert_bit_identical(out: dict, ref: dict, what: str) -> None:
    """A Predictor's detections (``out``) are the reference's bit for bit: ``ref``'s boxes, scores and labels
    tensors and its masks (bool, the image's size); the reference detects something. ``what`` names the case."""
    import torch

    assert len(ref["boxes"]) > 0, what
    assert torch.equal(out["boxes"], ref["boxes"]) and torch.equal(out["scores"], ref["scores"]), what
    assert torch.equal(out["labels"], ref["labels"]), what
    assert torch.equal(torch.as_tensor(out["masks"].dense()).bool(), ref["masks"]), what


def needs_extra(module: str, extra: str):
    """A skip marker for tests of an optional extra (``minidet[extra]``) that is not installed; where
    ``MINIDET_REQUIRE_EXTRAS`` is set (CI), a missing extra is an error instead: its tests must run."""
    import pytest

    missing = importlib.util.find_spec(module) is None
    if missing and os.environ.get("MINIDET_REQUIRE_EXTRAS"):
        raise RuntimeError(f"MINIDET_REQUIRE_EXTRAS is set but {module} (pip install 'minidet[{extra}]') is missing")
    return pytest.mark.skipif(missing, reason=f"needs the minidet[{extra}] extra")


def compiled_stand_in(name: str, refusal: str, **ops) -> types.ModuleType:
    """A module ``name`` standing in for a reference's unbuilt compiled extension: ``ops`` are its pure-PyTorch
    stand-ins; any other op it is asked for fails when called, ``refusal`` (with ``{op}``) naming it."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def missing(op: str):
        if op.startswith("__"):
            raise AttributeError(op)

        def refuse(*args, **kwargs):
            raise NotImplementedError(refusal.format(op=op))

        return refuse

    module.__getattr__ = missing
    module.__dict__.update(ops)
    return module
