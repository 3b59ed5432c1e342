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
