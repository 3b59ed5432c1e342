"""``minidet infer --engine ray`` on a real Ray cluster that this module starts on 127.0.0.1 (2 CPUs, a small object
store): two actors write the same files as one process, byte for byte, a bad file being one error; an actor killed
by PID while it works, or the driver killed by SIGKILL and rerun with ``--resume``, still give the same files (the
finished images not run again); a ``file://`` URI folder; the Python form (``read_binary_files`` and
``map_batches(Detect)``); without Ray, one line naming the extra. A cluster that cannot be reached (nothing listening,
an unknown host, ``auto`` with none running or only the address file of one that is gone) is one line within seconds
and leaves no output folder; run as a user runs it, stdout on a terminal, the command prints none of Ray's lines nor
colour codes, also when the actors fail. Every run uses one thread per model (the reference in this process, each
actor by Ray's one CPU), the forwards two images each."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import call_tool, needs_extra, one_error_line, run_tool
from procs import descendants, survivors

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "infer.py"
CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
TINY = ROOT.parent / "shared" / "data" / "coco_tiny" / "val2017"
FAST = [
    "INPUT.MIN_SIZE_TEST", "160", "INPUT.MAX_SIZE_TEST", "320", "TEST.IMS_PER_BATCH", "2",
    "MODEL.RPN.PRE_NMS_TOPK_TEST", "300", "MODEL.RPN.POST_NMS_TOPK_TEST", "100",
    "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "20",
]
GOOD = 4  # coco_tiny images; a bad file sorts between the second and the third: forwards [1, 2], [bad, 3], [4]
BAD = "000000020000_bad.jpg"

needs_ray = needs_extra("ray", "ray")
# one process of the parallel part runs this file: one Ray cluster on the machine at a time
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray"),
              pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ray") / "images"
    folder.mkdir()
    for path in sorted(TINY.glob("*.jpg"))[:GOOD]:
        shutil.copy(path, folder)
    (folder / BAD).write_bytes(b"not a jpeg at all")
    return folder


def _args(weights: Path, out: Path, *inputs: str, extra: tuple[str, ...] = ()) -> list[str]:
    return ["--config-file", str(CONFIG), "--input", *inputs, "--output", str(out), *extra,
            "MODEL.WEIGHTS", str(weights), *FAST]


def _files(folder: Path) -> dict[str, bytes]:
    """Every output file under ``folder`` by relative path, the chunk store left out."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".chunks" not in p.parts and p.name != ".minidet.lock"}


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def reference(images, tv_file, tmp_path_factory) -> tuple[Path, str]:
    """One single-process run (one thread) with drawings and a JSONL results file: (output folder, stderr)."""
    out = tmp_path_factory.mktemp("ref") / "out"
    res = call_tool(TOOL, *_args(tv_file, out, str(images), extra=("--workers", "0", "--results",
                                                                   str(out / "all.jsonl"))), threads=1)
    assert res.returncode == 1 and len(_errors(res.stderr)) == 1, res.stderr
    return out, res.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Ray head on 127.0.0.1 with 2 CPUs and a 100 MB object store, its workers importing this checkout's
    minidet with one thread each: yields (address, pid of ``ray start --block``); stopped at the end, and what it
    started that is still running killed by pid."""
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    log = tmp_path_factory.mktemp("cluster") / "head.log"
    port = _free_port()
    # RAY_AUTH_MODE: the same cluster whether or not a Ray token is in ~/.ray (a `ray start` uses one found there)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled"}
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--port", str(port), "--num-cpus", "2", "--object-store-memory", str(100 * 2**20),
           "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp]
    with open(log, "wb") as f:
        head = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while b"Ray runtime started" not in log.read_bytes():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", head.pid
    finally:
        started = descendants(head.pid)
        head.terminate()  # ray start --block stops what it started, gracefully: in up to half a minute
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=5)
        head.kill()
        head.wait()
        for pid in survivors(started, wait_s=1):  # by pid: Ray's workers have process groups of their own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


# a driver process, like the cluster's workers, imports this checkout's minidet (not one installed elsewhere)
DRIVER_ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "RAY_AUTH_MODE": "disabled"}


def _driver(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    """``tools/infer.py args`` started in a process of its own, output to ``log``."""
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, str(TOOL), *args], cwd=cwd, env=DRIVER_ENV, stdout=f,
                                stderr=subprocess.STDOUT)


def _actors(head_pid: int) -> dict[int, str]:
    """The Detect actors of the cluster now: pid -> process title (``...(Detect)).submit`` while running a task)."""
    found = {}
    for pid in descendants(head_pid):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if title.startswith("ray::MapWorker(MapBatches(Detect))"):
            found[pid] = title
    return found


@pytest.fixture
def driver_env(monkeypatch):
    """For a driver run in this process: the cluster's authentication mode; the environment it changes (Ray's log
    level) put back afterwards."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_BACKEND_LOG_LEVEL", raising=False)


def _ray(capfd, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A driver run in this process (its process is not what the test is about)."""
    return call_tool(TOOL, *args, capture=capfd, cwd=cwd)


def _user(args: list[str], cwd: Path, timeout: float = 90, **env: str) -> tuple[int, str, str, float]:
    """``tools/infer.py args`` as a user runs it, stdout on a terminal (a pseudo-terminal; a pipe where there is
    none), with the environment variables ``env`` and no ``RAY_ADDRESS``: (status, stdout, stderr, seconds). A run
    that lasts more than ``timeout`` seconds is killed and fails the test."""
    environ = {k: v for k, v in {**DRIVER_ENV, **env}.items() if k != "RAY_ADDRESS"}
    try:
        reader, writer = pty.openpty()
    except OSError:
        reader, writer = os.pipe()
    t0 = time.monotonic()
    with open(cwd / "stderr.txt", "w+b") as err:
        proc = subprocess.Popen([sys.executable, str(TOOL), *args], cwd=cwd, env=environ, stdin=subprocess.DEVNULL,
                                stdout=writer, stderr=err)
        os.close(writer)
        out = bytearray()
        try:
            while True:  # until every writer has closed it (EIO on a terminal)
                assert time.monotonic() - t0 < timeout, f"no end after {timeout} s: {out.decode(errors='replace')}"
                if select.select([reader], [], [], 1.0)[0]:
                    try:
                        data = os.read(reader, 65536)
                    except OSError:
                        data = b""
                    if not data:
                        break
                    out += data
            proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        finally:
            proc.kill()
            proc.wait()
            os.close(reader)
        err.seek(0)
        text = err.read().decode(errors="replace")
    return proc.returncode, out.decode(errors="replace").replace("\r\n", "\n"), text, time.monotonic() - t0


def _gcs_running() -> bool:
    """Whether a Ray cluster's GCS server runs on this machine (``auto`` would find it)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/gcs_server"):
                return True
    return False


@needs_ray
@pytest.mark.parametrize("address, why", [
    ("127.0.0.1:{port}", "connection refused"),
    ("nosuchhost.invalid:6379", "unknown host nosuchhost.invalid"),
], ids=["nothing-listens", "unknown-host"])
def test_a_cluster_that_cannot_be_reached_is_one_line_within_seconds(images, tv_file, tmp_path, address, why):
    """Nothing listening at the address, or a host no one knows: one line naming --ray-address, within seconds
    (Ray alone waits many minutes), status 2, and no output folder (a set-up failure: nothing to resume)."""
    address = address.format(port=_free_port())
    out = tmp_path / "out"
    rc, stdout, stderr, seconds = _user(_args(tv_file, out, str(images), extra=("--engine", "ray", "--ray-address",
                                                                                address)), tmp_path)
    assert rc == 2, stderr
    line = one_error_line(stderr)  # an unknown host: the resolver's words follow
    assert line.startswith(f"error: --ray-address {address}: cannot reach a Ray cluster there: {why}"), line
    assert stdout == "" and not out.exists()
    assert seconds < 60  # importing torch and Ray, on a busy machine


@needs_ray
@pytest.mark.serial  # no Ray cluster may run on this machine meanwhile: none of the parallel part's
def test_auto_without_a_cluster_is_one_line_within_seconds(images, tv_file, tmp_path):
    """``--ray-address auto`` with no cluster on this machine, or only the address file of one that is gone (a
    killed ``ray start``): one line in minidet's words naming --ray-address, within seconds, and no output folder.
    Runs before this module starts its cluster; not while another one runs here (auto would find it)."""
    if _gcs_running():
        pytest.skip("a Ray cluster runs on this machine: --ray-address auto finds it")
    args = _args(tv_file, tmp_path / "out", str(images), extra=("--engine", "ray", "--ray-address", "auto"))
    empty = tmp_path / "none"  # Ray's temporary folder: no address file (a stale one in /tmp/ray is not read)
    empty.mkdir()
    rc, stdout, stderr, seconds = _user(args, tmp_path, RAY_TMPDIR=str(empty))
    assert rc == 2 and stdout == "" and not (tmp_path / "out").exists(), stderr
    assert one_error_line(stderr) == ("error: --ray-address auto: no Ray cluster is running on this machine; start "
                                      "one (ray start --head) or give the head node's address: --ray-address "
                                      "HOST:PORT")
    assert seconds < 60

    stale = tmp_path / "stale"
    (stale / "ray").mkdir(parents=True)
    gone = f"127.0.0.1:{_free_port()}"
    (stale / "ray" / "ray_current_cluster").write_text(gone + "\n")
    rc, stdout, stderr, seconds = _user(args, tmp_path, RAY_TMPDIR=str(stale))
    assert rc == 2 and stdout == "" and not (tmp_path / "out").exists(), stderr
    line = one_error_line(stderr)
    assert line.startswith("error: --ray-address auto (the cluster found at ") and line.endswith(
        "): cannot reach a Ray cluster there: connection refused"), line  # Ray names this host by its address
    assert seconds < 60


@needs_ray
def test_two_actors_write_what_one_process_writes(reference, images, tv_file, cluster, tmp_path, capfd, driver_env):
    ref, ref_err = reference
    out = tmp_path / "out"
    res = _ray(capfd, *_args(tv_file, out, str(images), extra=("--engine", "ray", "--actors", "2", "--ray-address",
                                                               cluster[0], "--results", str(out / "all.jsonl"))),
               cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-3000:]
    assert _files(out) == _files(ref)  # the results file, every JSON document and every drawing
    assert _errors(res.stderr) == _errors(ref_err) == [f"error: {images / BAD}: not a recognized image format"]
    chunks = [json.loads(p.read_text()) for p in sorted((out / ".chunks").glob("run*.json"))]
    assert [s["file"] for c in chunks for s in c["skipped"]] == [str(images / BAD)]
    assert sorted(i for c in chunks for i in c["image_ids"]) == [1, 2, 4, 5]
    assert "infer: 5 inputs, 1 failed" in res.stdout and "infer: ray: 2 actors with 0 GPU each" in res.stdout


@needs_ray
def test_sliced_inference_on_ray_writes_what_one_process_writes(images, tv_file, cluster, tmp_path, capfd,
                                                                driver_env):
    """``--slice`` (and polygons) through the actors: the same files as one local process."""
    extra = ("--slice", "256", "--overlap", "0.25", "--mask-format", "polygon", "--no-vis")
    local = tmp_path / "local"
    res = call_tool(TOOL, *_args(tv_file, local, str(images), extra=(*extra, "--workers", "0")), threads=1)
    assert res.returncode == 1, res.stderr
    out = tmp_path / "ray"
    res = _ray(capfd, *_args(tv_file, out, str(images), extra=(*extra, "--engine", "ray", "--ray-address",
                                                               cluster[0])), cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-3000:]
    assert _files(out) == _files(local) and len(_files(out)) == GOOD
    record = json.loads(next(iter(_files(out).values())))
    assert record["instances"] and isinstance(record["instances"][0]["segmentation"], list)


@needs_ray
@needs_extra("nncf", "int8")
def test_an_int8_export_runs_on_ray_as_in_one_process(images, int8_export, cluster, tmp_path, capfd, driver_env):
    """The folder of ``minidet export --precision int8`` (its config: OpenVINO, int8) through the actors: the same
    files as one local process with one thread (the actors' count)."""
    folder = int8_export[0]
    args = ["--config-file", str(folder / "config.yaml"), "--input", str(images), "--no-vis"]
    local = tmp_path / "local"
    res = run_tool(TOOL, *args, "--output", str(local), "--workers", "0", cwd=tmp_path, threads=1)  # int8 kernels
    assert res.returncode == 1, res.stderr  # in a process of their own, as in the actors
    out = tmp_path / "ray"
    res = _ray(capfd, *args, "--output", str(out), "--engine", "ray", "--ray-address", cluster[0], cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-3000:]
    assert _files(out) == _files(local) and len(_files(out)) == GOOD
    assert json.loads(next(iter(_files(out).values())))["instances"]


@needs_ray
def test_an_actor_killed_while_it_works_is_replaced(reference, images, tv_file, cluster, tmp_path):
    """SIGKILL to the actor while it runs a task: Ray restarts it and reruns the task; the files are the same."""
    out = tmp_path / "out"
    proc = _driver(_args(tv_file, out, str(images), extra=("--engine", "ray", "--actors", "1", "--ray-address",
                                                           cluster[0], "--results", str(out / "all.jsonl"))),
                   tmp_path, tmp_path / "log")
    try:
        deadline, victim = time.monotonic() + 300, None
        while victim is None and proc.poll() is None and time.monotonic() < deadline:
            victim = next((pid for pid, title in _actors(cluster[1]).items() if title.endswith(".submit")), None)
            time.sleep(0.05)
        assert victim is not None and proc.poll() is None, (tmp_path / "log").read_text()
        os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=400)
    finally:
        proc.kill()
    assert proc.returncode == 1, (tmp_path / "log").read_text()[-3000:]
    assert victim not in _actors(cluster[1])
    assert _files(out) == _files(reference[0])


@needs_ray
def test_a_killed_driver_resumes_without_redoing_finished_images(reference, images, tv_file, cluster, tmp_path, capfd,
                                                                 driver_env):
    """SIGKILL to the driver after its first chunk; ``--resume`` runs only the images not finished (counted) and
    leaves the finished ones' files as they were; the files are the same as one process's."""
    out = tmp_path / "out"
    args = _args(tv_file, out, str(images), extra=("--engine", "ray", "--ray-address", cluster[0], "--chunk-size",
                                                   "1", "--results", str(out / "all.jsonl")))
    proc = _driver(args, tmp_path, tmp_path / "log")
    try:
        deadline = time.monotonic() + 300
        while not list(out.glob(".chunks/run001-*.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "log").read_text()
    assert not (out / "all.jsonl").exists()
    done = {i for p in out.glob(".chunks/run001-*.json") for i in json.loads(p.read_text())["image_ids"]}
    names = sorted(p.name for p in images.iterdir())
    kept = {i: (out / names[i - 1]).with_suffix(".json").stat() for i in done}
    assert 1 <= len(done) < GOOD

    res = _ray(capfd, "--resume", *args, cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-3000:]
    assert f"infer: resuming: {len(done)} of 5 inputs done, {5 - len(done)} to go" in res.stdout
    ran = re.search(r"infer: this run (\d+) images", res.stdout)
    assert ran and int(ran.group(1)) == GOOD - len(done), res.stdout
    for i, st in kept.items():  # not written again
        now = (out / names[i - 1]).with_suffix(".json").stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert _files(out) == _files(reference[0])


@pytest.fixture(scope="module")
def two(images, tmp_path_factory) -> Path:
    """The first two images (the reference's first forward) in a folder of their own."""
    folder = tmp_path_factory.mktemp("two")
    for path in sorted(images.glob("*.jpg"))[:2]:
        shutil.copy(path, folder)
    return folder


def _same_but_file(doc: dict, ref: dict) -> bool:
    return {k: v for k, v in doc.items() if k != "file"} == {k: v for k, v in ref.items() if k != "file"}


@needs_ray
def test_uri_folder(reference, two, tv_file, cluster, tmp_path, capfd, driver_env):
    """A ``file://`` folder URI is read through pyarrow: the same documents, the URI as the file."""
    out = tmp_path / "out"
    uri = two.as_uri()
    res = _ray(capfd, *_args(tv_file, out, uri, extra=("--engine", "ray", "--ray-address", cluster[0], "--no-vis",
                                                       "--results", str(out / "r.jsonl"))), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    names = sorted(p.name for p in two.iterdir())
    assert sorted(_files(out)) == sorted([n.replace(".jpg", ".json") for n in names] + ["r.jsonl"])
    lines = [json.loads(line) for line in (out / "r.jsonl").read_text().splitlines()]
    refs = [json.loads(line) for line in (reference[0] / "all.jsonl").read_text().splitlines()][:2]
    assert [r["file"] for r in lines] == [f"{uri}/{n}" for n in names]
    assert all(_same_but_file(a, b) for a, b in zip(lines, refs)) and len(lines) == 2


_RAY_LINE = re.compile(r"\x1b\[|\((raylet|autoscaler|[^)]*pid=)|^\d{4}-\d\d-\d\d[ T][\d:,.]+\s+(INFO|WARNING|ERROR)",
                       re.M)  # a colour code, a line a Ray process sent to the driver, Ray's log format


@needs_ray
def test_without_debug_stdout_holds_minidet_lines_only(two, tv_file, cluster, tmp_path):
    """The real command, its stdout on a terminal: minidet's lines, none of Ray's and no colour code (Ray's colour
    library writes a reset there when the process ends)."""
    rc, stdout, stderr, _ = _user(_args(tv_file, tmp_path / "out", str(two), extra=(
        "--engine", "ray", "--ray-address", cluster[0], "--no-vis")), tmp_path, timeout=300)
    assert rc == 0, stderr[-3000:]
    assert not _RAY_LINE.search(stdout) and not _RAY_LINE.search(stderr), stdout + stderr
    lines = stdout.splitlines()
    assert lines[0] == f"infer: ray: 1 actor with 0 GPU each, cluster {cluster[0]}", stdout
    assert lines[-2].startswith("infer: 2 inputs, 0 failed") and lines[-1].startswith("infer: this run 2 images")


@needs_ray
def test_actors_that_cannot_load_the_model_print_no_ray_lines(two, tv_state, cluster, tmp_path):
    """Actors that fail to start (a checkpoint whose mask head does not fit the config: the driver reads only the
    classes) make the cluster report each retry to the driver, which Ray prints on stdout in colour: without
    --debug, stdout has minidet's line only and the run ends with one error line naming the cause."""
    import torch

    state = dict(tv_state)
    for key in [k for k in state if k.startswith("roi_heads.mask_predictor.")]:
        state[key] = state[key][:5]
    weights = tmp_path / "bad_mask_head.pth"
    torch.save(state, weights)
    rc, stdout, stderr, _ = _user(_args(weights, tmp_path / "out", str(two), extra=(
        "--engine", "ray", "--ray-address", cluster[0], "--no-vis")), tmp_path, timeout=300)
    assert rc == 2, stderr[-3000:]
    assert stdout == f"infer: ray: 1 actor with 0 GPU each, cluster {cluster[0]}\n", stdout
    assert "shape mismatch" in one_error_line(stderr) and not _RAY_LINE.search(stderr), stderr


@needs_ray
def test_python_map_batches_on_bytes(reference, two, tv_file, cluster, driver_env):
    """The documented Python form: ``read_binary_files`` then ``map_batches(Detect)``; each row's record is the
    image's ``minidet infer`` document."""
    import ray

    from minidet.apps.bulk.raydata import Detect

    ray.init(address=cluster[0], logging_level="ERROR", log_to_driver=False)
    try:
        paths = [str(p) for p in sorted(two.iterdir())]
        ds = ray.data.read_binary_files(paths, include_paths=True, override_num_blocks=1)
        ds = ds.map_batches(Detect, fn_constructor_kwargs={"config_file": str(CONFIG),
                                                           "opts": ["MODEL.WEIGHTS", str(tv_file), *FAST]},
                            batch_size=2, compute=ray.data.ActorPoolStrategy(size=1))
        rows = sorted(ds.take_all(), key=lambda r: r["path"])
    finally:
        ray.shutdown()
    assert [r["path"] for r in rows] == paths and all(r["error"] == "" and r["jpg"] == b"" for r in rows)
    for row, path in zip(rows, paths):
        doc = json.loads(row["record"])
        assert doc["file"] == path
        ref = json.loads((reference[0] / Path(path).name).with_suffix(".json").read_text())
        assert _same_but_file(doc, ref)


def test_without_ray_one_line_names_the_extra(images, tv_file, tmp_path, capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    res = call_tool(TOOL, *_args(tv_file, tmp_path / "out", str(images), extra=("--engine", "ray")), capture=capfd)
    assert res.returncode == 2
    assert "pip install 'minidet[ray]'" in one_error_line(res.stderr)


@needs_ray
def test_gpus_per_actor_must_fit_the_device_and_videos_are_left_to_local(images, tv_file, tmp_path, capfd):
    res = call_tool(TOOL, *_args(tv_file, tmp_path / "out", str(images), extra=("--engine", "ray",
                                                                              "--gpus-per-actor", "1")),
                    capture=capfd)
    assert res.returncode == 2
    assert one_error_line(res.stderr) == ("error: --gpus-per-actor 1 with MODEL.DEVICE cpu: add MODEL.DEVICE cuda "
                                          "to run on the GPUs")
    clip = tmp_path / "clip.mp4"  # never opened: no Ray either, with no image to run
    clip.write_bytes(b"not read")
    res = call_tool(TOOL, *_args(tv_file, tmp_path / "out", str(clip), extra=("--engine", "ray")), capture=capfd)
    assert res.returncode == 1
    assert _errors(res.stderr) == [f"error: {clip}: videos run with --engine local only"]


@needs_ray
def test_uri_listing_and_reading(tmp_path):
    """A folder URI lists its images (subfolders with ``recursive``; hidden entries left out, other files
    counted), a file URI is kept as it is, a missing one is an error naming it; reading one that is gone is
    an image error naming it."""
    from minidet.apps.bulk.raydata import _fetch, find_uri_inputs
    from minidet.imageio import ImageReadError

    (tmp_path / "sub").mkdir()
    for name in ("a.jpg", "sub/b.PNG", ".hidden.jpg", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    uri = tmp_path.as_uri()
    assert find_uri_inputs([uri]) == ([(f"{uri}/a.jpg", "a.jpg")], {uri: [(f"{uri}/notes.txt", ".txt")]})
    found, _ = find_uri_inputs([uri, f"{uri}/sub/b.PNG"], recursive=True)
    assert found == [(f"{uri}/a.jpg", "a.jpg"), (f"{uri}/sub/b.PNG", "sub/b.PNG")]  # named twice: once
    with pytest.raises(FileNotFoundError, match=f"no such file or folder: {uri}/gone"):
        find_uri_inputs([f"{uri}/gone"])
    with pytest.raises(ImageReadError, match=f"^{uri}/gone.jpg: cannot read"):
        _fetch(f"{uri}/gone.jpg", 1000)
