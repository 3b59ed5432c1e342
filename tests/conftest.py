"""Paths for the tests' helper modules, and the session-scoped torchvision checkpoints.

Each checkpoint is torchvision's own Mask R-CNN as its builder initializes it after
``torch.manual_seed(0)`` (``minidet.apps.bench.reference.tv_init_state``), built once per session and
saved once; tests that change it change a copy (``dict(state)``), never its tensors.
"""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

CONFIDENT = 30.0  # class-logit scale of the confident checkpoints: detections pass the 0.05 threshold


def _saved(tmp_path_factory, name: str, state: dict):
    import torch

    path = tmp_path_factory.mktemp("ckpt") / name
    torch.save(state, path)
    return path


@pytest.fixture(scope="session")
def tv_state() -> dict:
    """v1 (``maskrcnn_resnet50_fpn``) state dict with confident classes (class logits x 30)."""
    from minidet.apps.bench.reference import tv_init_state

    return tv_init_state(1, class_scale=CONFIDENT)


@pytest.fixture(scope="session")
def tv_file(tmp_path_factory, tv_state):
    """``tv_state`` saved with ``torch.save``: a Path."""
    return _saved(tmp_path_factory, "tv.pth", tv_state)


@pytest.fixture(scope="session")
def tv_state_init() -> dict:
    """v1 state dict exactly as torchvision initializes it (few detections pass 0.05)."""
    from minidet.apps.bench.reference import tv_init_state

    return tv_init_state(1)


@pytest.fixture(scope="session")
def tv_file_init(tmp_path_factory, tv_state_init):
    """``tv_state_init`` saved with ``torch.save``: a Path."""
    return _saved(tmp_path_factory, "tv_init.pth", tv_state_init)


@pytest.fixture(scope="session")
def tv_v2_state_init() -> dict:
    """v2 (``maskrcnn_resnet50_fpn_v2``) state dict exactly as torchvision initializes it."""
    from minidet.apps.bench.reference import tv_init_state

    return tv_init_state(2)


INT8_SIZE = ["INPUT.MIN_SIZE_TEST", "320", "INPUT.MAX_SIZE_TEST", "512"]


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


@pytest.fixture(scope="session")
def int8_export(tmp_path_factory, tv_file):
    """``minidet export --precision int8`` of ``tv_file`` (short side 320), calibrated on two coco_tiny photos and
    verified on two others, its drift gate set so that it must refuse (everything matched, AP 1.0) and ``--force``:
    ``(folder, the export's CompletedProcess, verification images)``. Skipped without coco_tiny."""
    from pathlib import Path

    from helpers import run_tool

    tiny = Path(ROOT).parent / "shared" / "data" / "coco_tiny" / "val2017"
    if not tiny.is_dir():
        pytest.skip("needs ../shared/data/coco_tiny")
    photos = sorted(tiny.glob("*.jpg"))
    out = tmp_path_factory.mktemp("int8") / "export"
    # a process of its own: NNCF's quantization is kept out of the test process (a pytest process that had run it
    # after the export tests' OpenVINO work crashed with SIGSEGV in a later test)
    r = run_tool(Path(ROOT) / "tools" / "export.py", "--config-file", "torchvision/maskrcnn_resnet50_fpn",
                 "--output", str(out), "--precision", "int8", "--calib", *map(str, photos[10:12]), "--images",
                 *map(str, photos[:2]), "--repeats", "1", "--min-matched", "1", "--min-ap", "1", "--force",
                 "MODEL.WEIGHTS", str(tv_file), *INT8_SIZE, cwd=out.parent, threads=torch_threads())
    return out, r, photos[:2]
