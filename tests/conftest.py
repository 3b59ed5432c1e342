"""Paths for the tests' helper modules, the session-scoped torchvision checkpoints, and the suite's two parts.

``tools/test.sh`` runs the suite in two parts: the tests not marked ``serial`` in parallel processes (pytest-xdist,
``--part parallel``), then those marked ``serial`` (timed by the wall clock) in one process (``--part serial``); a
plain ``pytest`` runs them all in one process (``--part all``). The int8 export is made once per run whichever
processes ask for it (``_made_once``); test_infer_ray.py's tests carry ``xdist_group("ray")`` (``--dist loadgroup``):
one process runs them, with one Ray cluster.

Each checkpoint is torchvision's own Mask R-CNN as its builder initializes it after
``torch.manual_seed(0)`` (``minidet.apps.bench.reference.tv_init_state``), built once per session and
saved once; tests that change it change a copy (``dict(state)``), never its tensors.
"""

import os
import sys

import pytest

# under pytest-xdist each of the two workers runs torch with one thread (and so do the processes it starts): two
# workers of two OpenMP threads each on 2 cores fight over them and are slower than one worker of two
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

PARTS = ("all", "parallel", "serial")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

CONFIDENT = 30.0  # class-logit scale of the confident checkpoints: detections pass the 0.05 threshold


def pytest_addoption(parser):
    parser.addoption("--part", choices=PARTS, default="all",
                     help="which tests to run: all (default), those not marked serial (parallel), or those marked "
                          "serial (serial): tools/test.sh runs the parallel part under pytest-xdist, then the serial")


def pytest_collection_modifyitems(config, items):
    part = config.getoption("--part")
    if part == "all":
        return
    keep = [item for item in items if (item.get_closest_marker("serial") is not None) == (part == "serial")]
    if len(keep) < len(items):
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = keep


@pytest.fixture(autouse=True, scope="module")
def _freed_memory_returned():
    """After each test module, what it freed goes back to the system (``gc``, then glibc's ``malloc_trim``): a
    process that runs many modules otherwise keeps every module's high-water mark, and two such processes (the
    parallel part on 2 cores) outgrew a 24 GB machine."""
    yield
    import gc

    from minidet.memory import release_freed_memory

    gc.collect()
    release_freed_memory()


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
    ``(folder, the export's CompletedProcess, verification images)``, made once per test run (``_made_once``).
    Skipped without coco_tiny."""
    from pathlib import Path

    tiny = Path(ROOT).parent / "shared" / "data" / "coco_tiny" / "val2017"
    if not tiny.is_dir():
        pytest.skip("needs ../shared/data/coco_tiny")
    photos = sorted(tiny.glob("*.jpg"))
    return (*_made_once(tmp_path_factory, "int8", lambda folder: _int8_export(folder, tv_file, photos)), photos[:2])


def _made_once(tmp_path_factory, name: str, make) -> tuple:
    """``make(folder)``'s ``(output, CompletedProcess)`` made once per test run: under pytest-xdist the first
    process to ask makes it in a folder that the run's processes share (a file lock keeps the others waiting), the
    others read what it recorded; a lone pytest process makes it in its own temporary folder."""
    import json
    import subprocess
    from pathlib import Path

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    folder, record = base.parent / name, base.parent / f"{name}.json"  # pytest-N/, beside each worker's popen-gwK/
    with FileLock(str(base.parent / f"{name}.lock")):
        if not record.exists():
            folder.mkdir()
            out, r = make(folder)
            record.write_text(json.dumps({"out": str(out), "args": [str(a) for a in r.args],
                                          "returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr}))
    made = json.loads(record.read_text())
    return Path(made["out"]), subprocess.CompletedProcess(made["args"], made["returncode"], made["stdout"],
                                                          made["stderr"])


def _int8_export(folder, tv_file, photos) -> tuple:
    import shutil
    from pathlib import Path

    from helpers import run_tool

    weights, out = folder / "tv.pth", folder / "export"  # the weights beside it: a worker's own folder may go first
    shutil.copyfile(tv_file, weights)
    # a process of its own: NNCF's quantization is kept out of the test process (a pytest process that had run it
    # after the export tests' OpenVINO work crashed with SIGSEGV in a later test)
    r = run_tool(Path(ROOT) / "tools" / "export.py", "--config-file", "torchvision/maskrcnn_resnet50_fpn",
                 "--output", str(out), "--precision", "int8", "--calib", *map(str, photos[10:12]), "--images",
                 *map(str, photos[:2]), "--repeats", "1", "--min-matched", "1", "--min-ap", "1", "--force",
                 "MODEL.WEIGHTS", str(weights), *INT8_SIZE, cwd=folder, threads=torch_threads())
    return out, r
