"""Paths for the tests' helper modules, the session-scoped torchvision checkpoints, and the suite's two parts.

``tools/test.sh`` runs the suite in two parts: the tests not marked ``serial`` in parallel processes (pytest-xdist,
``--part parallel``), then those marked ``serial`` (timed by the wall clock) in one process (``--part serial``); a
plain ``pytest`` runs them all in one process (``--part all``). The int8 export is made once per run whichever
processes ask for it (``session_cache``: exported graphs, int8 folders and their checkpoints, shared by pytest-xdist's
processes under a file lock); test_infer_ray.py's tests carry ``xdist_group("ray")`` (``--dist loadgroup``):
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
def int8_export(session_cache, tv_file):
    """``minidet export --precision int8`` of ``tv_file`` (short side 320), calibrated on two coco_tiny photos and
    verified on two others, its drift gate set so that it must refuse (everything matched, AP 1.0) and ``--force``:
    ``(folder, the export's CompletedProcess, verification images)``, made once per test run (``session_cache``).
    Skipped without coco_tiny."""
    from pathlib import Path

    tiny = Path(ROOT).parent / "shared" / "data" / "coco_tiny" / "val2017"
    if not tiny.is_dir():
        pytest.skip("needs ../shared/data/coco_tiny")
    photos = sorted(tiny.glob("*.jpg"))
    key = {"made": "int8 export", "config": "torchvision/maskrcnn_resnet50_fpn", "weights": "tv_file",
           "size": INT8_SIZE, "calib": [p.name for p in photos[10:12]], "images": [p.name for p in photos[:2]]}
    return (*_made_once(session_cache, key, lambda folder: _int8_export(folder, tv_file, photos)), photos[:2])


class SessionCache:
    """Things a test run makes once, whichever of its processes asks first: exported graphs, int8 folders, the
    checkpoints they are made of. Each is a folder under ``root`` named by a digest of its key (the JSON of what
    determines it: what it is, its config and overrides, its checkpoint's kind), made by ``make(folder)`` under an
    exclusive ``fcntl.flock`` of ``<folder>.lock`` (the other processes wait), and recorded (``<folder>.json``: the key
    and what ``make`` returned, JSON) only when ``make`` returned: a failed make is made again by the next to ask.
    Under pytest-xdist ``root`` is beside the workers' own temporary folders (``pytest-N/cache/``, shared by them);
    a lone pytest process has its own."""

    def __init__(self, root):
        from pathlib import Path

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.made: list[str] = []  # the keys this process made (the others it read)

    def get(self, key: dict, make) -> tuple:
        """``(folder, make(folder))`` for ``key``, made once per test run."""
        import fcntl
        import hashlib
        import json

        text = json.dumps(key, sort_keys=True, default=str)
        folder = self.root / hashlib.sha256(text.encode()).hexdigest()[:16]
        record = folder.with_suffix(".json")
        with open(folder.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not record.exists():
                if folder.exists():  # a make that failed before
                    import shutil

                    shutil.rmtree(folder)
                folder.mkdir()
                made = make(folder)
                record.write_text(json.dumps({"key": json.loads(text), "made": made}))
                self.made.append(text)
        return folder, json.loads(record.read_text())["made"]


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> SessionCache:
    """The test run's ``SessionCache``: shared by pytest-xdist's workers, a lone process's own otherwise."""
    base = tmp_path_factory.getbasetemp()
    return SessionCache(base.parent / "cache" if os.environ.get("PYTEST_XDIST_WORKER") else base / "cache")


def _made_once(session_cache: SessionCache, key: dict, make) -> tuple:
    """``make(folder)``'s ``(output, CompletedProcess)`` made once per test run (``session_cache``)."""
    import subprocess
    from pathlib import Path

    def made(folder):
        out, r = make(folder)
        return {"out": str(out), "args": [str(a) for a in r.args], "returncode": r.returncode, "stdout": r.stdout,
                "stderr": r.stderr}

    made = session_cache.get(key, made)[1]
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
