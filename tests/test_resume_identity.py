"""Resume keeps what it promises (issue 24, §2) and the rough edges of bulk runs (§3): a run's identity is recorded
when it starts and a finished chunk as soon as its images are written, so that a SIGKILL after three of four images
keeps them and ``--resume`` with other weights is refused, saying what differs; options after the ``KEY VALUE``
overrides; a torchrun rank that dies is named by the others; a full disk, a failed set-up, symlink loops,
``--vis-thresh`` and ``tools/extract_weights.py``'s messages. Real processes for SIGKILL, torchrun and a full disk
(a small tmpfs in a user namespace); the other runs call the tools in this process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cv2
import pytest

from helpers import ROOT, call_tool, load_tool, one_error_line
from minidet.apps.bulk.chunks import ChunkError, ChunkStore, identity_differences
from minidet.apps.bulk.inputs import describe_skipped, find_inputs
from minidet.apps.synthetic import structured_image
from procs import descendants, survivors

INFER = ROOT / "tools" / "infer.py"
EVAL = ROOT / "tools" / "eval_coco.py"
CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
FAST = [
    "INPUT.MIN_SIZE_TEST", "160", "INPUT.MAX_SIZE_TEST", "320",
    "MODEL.RPN.PRE_NMS_TOPK_TEST", "300", "MODEL.RPN.POST_NMS_TOPK_TEST", "100",
    "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "20",
]
THREADS = str(max(1, (os.cpu_count() or 2) // 2))  # a 2-process torchrun gets half the cores each

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _images(folder: Path, names: list[str]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / n for n in names]
    for k, p in enumerate(paths):
        assert cv2.imwrite(str(p), structured_image(120, 160, seed=k))
    return paths


def _args(weights: Path, out: Path, inputs: list[Path], *extra: str) -> list[str]:
    return ["--config-file", str(CONFIG), "--input", *map(str, inputs), "--output", str(out), *extra,
            "MODEL.WEIGHTS", str(weights), *FAST]


def _outputs(out: Path) -> dict[str, bytes]:
    """The per-image files of a run (the chunk store and the lock left out)."""
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.suffix in (".jpg", ".json")}


def _done(out: Path) -> list[int]:
    return sorted(i for p in (out / ".chunks").glob("run*.json") for i in json.loads(p.read_text())["image_ids"])


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": THREADS}  # the tool finds minidet itself


def _wait(condition, proc: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


# ------------------------------------------------------------------------------ §2 resume keeps what it promises


@pytest.mark.slow
def test_sigkill_after_three_of_four_images_keeps_them_and_their_run(tv_file, tv_file_init, tmp_path, capfd):
    """``--chunk-size 1``, four inputs of which the last is a pipe that nobody writes: the run writes three images,
    then waits. SIGKILL there (nothing runs on the way out): each written image has its chunk, and the run's
    identity is on disk. ``--resume`` with other weights is refused naming both files and their digests, and
    changes no output; the same command with ``--resume`` after the overrides does only the fourth image."""
    photos = tmp_path / "photos"
    inputs = _images(photos, ["a.png", "b.png", "c.png"]) + [photos / "d.png"]
    os.mkfifo(inputs[-1])  # read last (sorted order): the run blocks there, after three images
    out = tmp_path / "out"
    args = _args(tv_file, out, inputs, "--chunk-size", "1", "--workers", "0")
    with open(tmp_path / "stderr", "wb") as se:
        proc = subprocess.Popen([sys.executable, str(INFER), *args], cwd=tmp_path, env=_env(), stdout=se, stderr=se)
        try:
            written = _wait(lambda: len([p for p in out.glob("*.json")]) == 3, proc, 300)
            _wait(lambda: len(_done(out)) == 3, proc, 5)  # the chunks follow at once (before: none came)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=120)
    assert written and proc.returncode == -signal.SIGKILL, (tmp_path / "stderr").read_text()
    assert _done(out) == [1, 2, 3]
    manifest = json.loads((out / ".chunks" / "manifest.json").read_text())
    assert manifest["weights"]["path"] == str(tv_file) and manifest["inputs"] == [str(p) for p in inputs]
    before = _outputs(out)
    assert sorted(before) == ["a.jpg", "a.json", "b.jpg", "b.json", "c.jpg", "c.json"]

    inputs[-1].unlink()
    _images(photos, ["d.png"])
    res = call_tool(INFER, *_args(tv_file_init, out, inputs, "--chunk-size", "1", "--workers", "0"), "--resume",
                    capture=capfd, cwd=tmp_path, threads=THREADS)
    assert res.returncode == 2
    line = one_error_line(res.stderr)
    assert line.startswith(f"error: cannot resume: the earlier run in {out / '.chunks'} differs: it used weights "
                           f"{tv_file} (sha256 {manifest['weights']['sha256'][:16]}...), this run uses "
                           f"{tv_file_init} (sha256 "), line
    assert _outputs(out) == before and _done(out) == [1, 2, 3]

    res = call_tool(INFER, *args, "--resume", capture=capfd, cwd=tmp_path, threads=THREADS)  # after the overrides
    assert res.returncode == 0, res.stderr
    assert "infer: resuming: 3 of 4 inputs done, 1 to go" in res.stdout
    assert {k: v for k, v in _outputs(out).items() if k in before} == before and "d.json" in _outputs(out)


def test_identity_is_checked_without_chunks_and_says_what_differs(tmp_path):
    """A run killed before its first chunk left its manifest alone: ``--resume`` still compares with it. Each
    difference is named: other weights (both files, both digests), the same file changed, a config key, an output
    option, the inputs."""
    store = ChunkStore(str(tmp_path / ".chunks"))
    weights = {"path": "/w/a.pth", "size": 1, "mtime": 1.0, "sha256": "a" * 64}
    run = {"weights": weights, "config": {"MODEL.NORM": "FrozenBN", "INPUT.MIN_SIZE_TEST": 800},
           "options": {"--vis-thresh": 0.5, "--no-vis": False}, "inputs": ["x/1.jpg", "x/2.jpg"]}
    store.begin(run, store.check(run, resume=False), resume=False)
    assert store.names() == []

    other = {**weights, "path": "/w/b.pth", "sha256": "b" * 64}
    with pytest.raises(ChunkError) as info:
        store.check({**run, "weights": other}, resume=True)
    assert str(info.value) == (f"cannot resume: the earlier run in {store.folder} differs: it used weights /w/a.pth "
                               f"(sha256 {'a' * 16}...), this run uses /w/b.pth (sha256 {'b' * 16}...)")
    assert store.check({**run, "weights": {**weights, "mtime": 2.0}}, resume=True) == 1  # touched: the same
    assert store.check({**run, "weights": {**weights, "path": "/copy/a.pth"}}, resume=True) == 1  # a copy
    assert store.check({**run, "weights": other}, resume=False) == 1  # without --resume: a new run

    changed = {**run, "weights": {**weights, "sha256": "c" * 64}, "config": {**run["config"], "MODEL.NORM": "GN"},
               "options": {**run["options"], "--vis-thresh": 0.3}, "inputs": ["x/1.jpg", "x/3.jpg", "x/4.jpg"]}
    assert identity_differences(json.loads((tmp_path / ".chunks" / "manifest.json").read_text()),
                                {"format": 2, **changed}) == [
        f"the weights /w/a.pth changed since the earlier run (sha256 {'a' * 16}... then, {'c' * 16}... now)",
        "config MODEL.NORM: FrozenBN then, GN now",
        "options --vis-thresh: 0.5 then, 0.3 now",
        "inputs: 2 then, 3 now (2 new, e.g. x/3.jpg; 1 gone, e.g. x/2.jpg)",
    ]
    with pytest.raises(ChunkError, match="differs: .* now; and 1 more$"):
        store.check(changed, resume=True)
    old = {"config": "MODEL:\n  NORM: FrozenBN\n", "checkpoint": None}  # what an earlier minidet wrote
    (tmp_path / ".chunks" / "manifest.json").write_text(json.dumps(old))
    with pytest.raises(ChunkError, match="differs: its manifest.json was written by another minidet version$"):
        store.check(run, resume=True)


def test_options_after_the_overrides():
    """The last command with ``--resume`` (or any option) appended after ``KEY VALUE`` overrides, in both tools;
    an override's value is taken as it is (``-1e-5``)."""
    infer, evaluate = load_tool(INFER), load_tool(EVAL)
    args = infer.parse_args(["--config-file", "c.yaml", "--input", "a.jpg", "b.jpg", "--output", "o",
                             "MODEL.DEVICE", "cpu", "MODEL.FROZEN_BN_EPS", "-1e-5", "--resume", "--chunk-size", "3",
                             "INPUT.MIN_SIZE_TEST", "200", "--input-list", "l.txt"])
    assert args.resume and args.chunk_size == 3 and args.input == ["a.jpg", "b.jpg"] and args.input_list == "l.txt"
    assert args.opts == ["MODEL.DEVICE", "cpu", "MODEL.FROZEN_BN_EPS", "-1e-5", "INPUT.MIN_SIZE_TEST", "200"]
    args = infer.parse_args(["--config-file", "c.yaml", "--output", "o", "MODEL.DEVICE", "cpu", "--input", "a.jpg",
                             "MODEL.NORM", "Affine"])  # an option among the overrides, its list given back
    assert args.input == ["a.jpg"] and args.opts == ["MODEL.DEVICE", "cpu", "MODEL.NORM", "Affine"]
    args = evaluate.parse_args(["--config-file", "c.yaml", "--images", "i", "--output", "o",
                                "MODEL.FROZEN_BN_EPS", "-1e-5", "--ann", "a.json", "--resume"])  # a required one
    assert args.resume and args.ann == "a.json" and args.opts == ["MODEL.FROZEN_BN_EPS", "-1e-5"]


@pytest.mark.slow
def test_a_dead_torchrun_rank_is_named_and_the_run_resumes(tv_file, tmp_path, capfd):
    """torchrun, two processes (gloo, CPU), a loader worker each; one of rank 0's inputs is a pipe that nobody
    writes, so rank 0 is still running when rank 1, after its first chunk, is killed with SIGKILL. Rank 0 says
    which rank died and that the run can be resumed (not what its loader worker saw), and ``--resume`` in one
    process finishes the run."""
    photos = tmp_path / "photos"
    names = [f"{k}.png" for k in range(1, 7)]
    inputs = _images(photos, names[:4]) + [photos / names[4]] + _images(photos, names[5:])
    os.mkfifo(inputs[4])  # id 5: rank 0's third input
    out = tmp_path / "out"
    args = _args(tv_file, out, inputs, "--chunk-size", "1", "--workers", "1")
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    with open(tmp_path / "stderr", "wb") as se:
        proc = subprocess.Popen([sys.executable, *launcher, str(INFER), *args], cwd=tmp_path, env=_env(),
                                stdout=se, stderr=se)
        try:
            started = _wait(lambda: any((out / ".chunks").glob("run001-rank0001-*.json")), proc, 400)
            # rank 1: torchrun's child (its loader worker, a child of the rank, has the same environment)
            rank1 = [p for p in descendants(proc.pid) if _parent(p) == proc.pid and _environ(p).get("RANK") == "1"]
            assert started and len(rank1) == 1, (tmp_path / "stderr").read_text()[-3000:]
            victim = rank1[0]
            os.kill(victim, signal.SIGKILL)
            proc.wait(timeout=120)
        finally:
            left = survivors(descendants(proc.pid), wait_s=0) if proc.poll() is None else []
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait(timeout=60)
    err = (tmp_path / "stderr").read_text()
    assert f"error: rank 1 (pid {victim}) of the run died; finished work is kept in {out / '.chunks'}: rerun the " \
           "same command with --resume to do the rest" in err, err[-3000:]
    assert "DataLoader" not in err, err[-3000:]
    assert 1 <= len(_done(out)) < 6

    inputs[4].unlink()
    _images(photos, names[4:5])
    res = call_tool(INFER, *args, "--resume", capture=capfd, cwd=tmp_path, threads=THREADS)
    assert res.returncode == 0, res.stderr
    assert "infer: resuming: " in res.stdout and _done(out) == list(range(1, 7))


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


# ------------------------------------------------------------------------------ §3 rough edges


def test_symlink_loops_in_a_tree_are_counted_and_never_followed(tmp_path):
    """``--recursive`` and ``**`` walk the tree without following links to folders: a link to a folder above it (a
    loop), links that point at each other and a link to another folder are each counted on the skipped line; the
    images are listed once."""
    root = tmp_path / "tree"
    _images(root, ["top.png"])
    _images(root / "sub", ["a.png"])
    _images(tmp_path / "elsewhere", ["b.png"])
    (root / "sub" / "up").symlink_to("..")
    (root / "p").symlink_to("q")
    (root / "q").symlink_to("p")
    (root / "other").symlink_to(tmp_path / "elsewhere")
    images = [(str(root / "sub" / "a.png"), "sub/a.png"), (str(root / "top.png"), "top.png")]
    found, skipped = find_inputs([str(root)], recursive=True)
    assert sorted(found) == images
    assert describe_skipped([r for _, r in skipped[str(root)]]) == "1 link to a folder (not followed), 3 symlink loops"
    pattern = str(root / "**" / "*.png")
    found, skipped = find_inputs([pattern])
    assert found == images  # not sub/up/sub/a.png, sub/up/sub/up/sub/a.png, ...
    assert sorted(skipped[pattern]) == [(str(root / "other"), "folder link"), (str(root / "sub" / "up"), "loop")]
    assert find_inputs([str(root)])[1] == {str(root): [(str(root / "p"), "loop"), (str(root / "q"), "loop")]}


def test_vis_thresh_outside_zero_to_one_is_refused(capsys):
    infer = load_tool(INFER)
    for value in ("1.5", "-0.1", "nan"):
        with pytest.raises(SystemExit) as info:
            infer.parse_args(["--config-file", "c.yaml", "--input", "a.jpg", "--output", "o", "--vis-thresh", value])
        assert info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith("error: --vis-thresh must be between 0 and 1")
    assert infer.parse_args(["--config-file", "c.yaml", "--input", "a.jpg", "--output", "o", "--vis-thresh", "1"])


def test_a_failed_set_up_leaves_no_output_folder(tmp_path, capfd):
    """Weights that cannot be loaded: both tools stop with one line, and the folders this run created (``--output``
    and its parents, ``--results``'s) are gone again; a folder that was there before stays."""
    bad = tmp_path / "bad.pth"
    bad.write_text("not a checkpoint\n")
    photo = _images(tmp_path / "photos", ["a.png"])[0]
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png", "height": 120, "width": 160}],
                               "annotations": [], "categories": [{"id": 1, "name": "person"}]}))
    existing = tmp_path / "existing"
    existing.mkdir()
    runs = {
        "infer": (INFER, _args(bad, tmp_path / "new" / "out", [photo], "--results", str(tmp_path / "res" / "r.json"))),
        "infer, existing folder": (INFER, _args(bad, existing, [photo])),
        "eval": (EVAL, ["--config-file", str(CONFIG), "--ann", str(ann), "--images", str(photo.parent), "--output",
                        str(tmp_path / "new" / "eval"), "MODEL.WEIGHTS", str(bad), *FAST]),
    }
    for what, (tool, argv) in runs.items():
        res = call_tool(tool, *argv, capture=capfd, cwd=tmp_path)
        assert res.returncode == 2 and str(bad) in one_error_line(res.stderr), (what, res.stderr)
    assert sorted(os.listdir(tmp_path)) == ["ann.json", "bad.pth", "existing", "photos"]
    assert os.listdir(existing) == []


_FULL_DISK = textwrap.dedent("""
    # in a user namespace (unshare -Urm): OUT is a small tmpfs; the run, then the same with --resume in a larger one
    import json, os, subprocess, sys
    out, small, big, *cmd = sys.argv[1:]
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={small}", "tmpfs", out], check=True)
    runs = [subprocess.run(cmd, capture_output=True, text=True)]
    kept = sorted(os.listdir(out))
    subprocess.run(["mount", "-o", f"remount,size={big}", out], check=True)
    runs.append(subprocess.run(cmd + ["--resume"], capture_output=True, text=True))
    done = sorted(n for n in os.listdir(out) if n.endswith((".jpg", ".json")))
    print(json.dumps({"runs": [[r.returncode, r.stdout, r.stderr] for r in runs], "kept": kept, "done": done}))
""")


def _user_namespaces() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt || "
                            "mount -t tmpfs -o size=64k tmpfs /tmp"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a tmpfs in a user namespace is Linux's")
def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_finished_work(tv_file, tmp_path):
    """A real ENOSPC: ``--output`` on a tmpfs with room for the run's record and about one image (in a user
    namespace, no root needed where the kernel allows them). One line names the folder and the file, says that
    the finished work is kept and that ``--resume`` does the rest; with room again it does."""
    if not _user_namespaces():
        pytest.skip("no user namespaces here (unshare -Urm with a tmpfs mount fails)")
    inputs = _images(tmp_path / "photos", ["a.png", "b.png", "c.png", "d.png"])
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, str(INFER), *_args(tv_file, out, inputs, "--chunk-size", "1", "--workers", "0")]
    res = subprocess.run(["unshare", "-Urm", sys.executable, "-c", _FULL_DISK, str(out), "64k", "4m", *cmd],
                         capture_output=True, text=True, env=_env(), timeout=600)
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout)
    (rc, _, err), (rc2, out2, err2) = found["runs"]
    line = one_error_line(err)
    assert rc == 2 and line.startswith(f"error: {out}: no space left on device (writing {out}/"), line
    assert line.endswith(f"; finished work is kept in {out / '.chunks'}: make room, then rerun the same command with "
                         "--resume to do the rest"), line
    assert ".chunks" in found["kept"] and not [n for n in found["kept"] if ".tmp" in n]
    assert rc2 == 0 and "infer: resuming: " in out2, err2
    assert found["done"] == sorted(f"{p.stem}{e}" for p in inputs for e in (".jpg", ".json"))


_WRITE_LIMITED = textwrap.dedent("""
    import importlib.util, resource, signal, sys
    spec = importlib.util.spec_from_file_location("fileio", sys.argv[2])  # the module alone: no torch to import
    fileio = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fileio)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    try:
        fileio.write_json(sys.argv[1], list(range(10000)), durable=True)
    except fileio.OutputError as e:
        print(e.errno, e.path, e, sep="|")
""")


def test_a_write_the_file_system_refuses_names_the_file_and_leaves_no_temp(tmp_path):
    """A write the file system refuses part-way (here: a file-size limit, EFBIG) is an OutputError naming the
    target, with its errno, and leaves no temporary file."""
    target = tmp_path / "results.json"
    fileio = ROOT / "src" / "minidet" / "apps" / "outputs" / "fileio.py"
    res = subprocess.run([sys.executable, "-c", _WRITE_LIMITED, str(target), str(fileio)], capture_output=True,
                         text=True)
    errno_, path, message = res.stdout.strip().split("|")
    assert int(errno_) == 27 and path == str(target), res.stderr  # EFBIG
    assert message == f"{target}: cannot write (File too large)"
    assert os.listdir(tmp_path) == []


def test_extract_weights_names_a_path_once(tmp_path, capsys):
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("extract_weights", ROOT / "tools" / "extract_weights.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    cases = {"list.pth": [1, 2], "model_list.pth": {"model": [1]}, "no_tensors.pth": {"a": 1}}
    for name, obj in cases.items():
        torch.save(obj, tmp_path / name)
    (tmp_path / "folder.pth").mkdir()
    for name in [*cases, "missing.pth", "folder.pth"]:
        path = str(tmp_path / name)
        assert tool.main([path, str(tmp_path / "out.pth")]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: {path}: ") and line.count(name) == 1, line
    torch.save({"w": torch.zeros(2)}, tmp_path / "good.pth")
    target = tmp_path / "no_such_folder" / "out.pth"
    assert tool.main([str(tmp_path / "good.pth"), str(target)]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {target}: cannot write (No such file or directory)"


def test_chunks_hold_whole_forwards(tv_file, tmp_path, capfd):
    """``TEST.IMS_PER_BATCH 2`` with ``--chunk-size 1``: the images of one forward are padded together, so each
    chunk holds whole forwards ([1, 2], [bad, 4], [5]; an unreadable file is one of its forward's images), never
    one image of a forward without the other: ``--resume`` after any stop runs the forwards left as they were."""
    photos = tmp_path / "photos"
    inputs = _images(photos, ["1.png", "2.png"]) + [photos / "3.png"] + _images(photos, ["4.png", "5.png"])
    inputs[2].write_bytes(b"not an image")
    out = tmp_path / "out"
    res = call_tool(INFER, *_args(tv_file, out, inputs, "--chunk-size", "1", "--workers", "0", "--no-vis"),
                    "TEST.IMS_PER_BATCH", "2", capture=capfd, cwd=tmp_path, threads=THREADS)
    assert res.returncode == 1 and "3.png" in res.stderr, res.stderr
    chunks = []
    for p in sorted((out / ".chunks").glob("run*.json")):
        data = json.loads(p.read_text())
        chunks.append(sorted(data["image_ids"] + [e["image_id"] for e in data["skipped"]]))
    assert chunks == [[1, 2], [3, 4], [5]], chunks


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_every_process_runs_the_forwards_of_one_process(batch):
    """torchrun's shares (:func:`minidet.apps.bulk.ledger.shard`) are whole forwards of one process's run (videos run by
    themselves), for any process count; and the inputs left when whole forwards are done form the same forwards
    again (a resumed run pads each image with the images it had)."""
    import random

    from minidet.apps.bulk.ledger import shard

    items = [(i, f"{i}.mp4" if i % 5 == 0 else f"{i}.jpg") for i in range(1, 24)]
    video = lambda path: path.endswith(".mp4")  # noqa: E731

    def forwards(todo):
        images = [x for x in shard(todo, 0, 1, batch, video) if not video(x[1])]
        return [tuple(images[k : k + batch]) for k in range(0, len(images), batch)]

    whole = forwards(items)
    for world in (1, 2, 3):
        shares = [shard(items, rank, world, batch, video) for rank in range(world)]
        assert sorted(x for s in shares for x in s) == items
        for s in shares:
            images = [x for x in s if not video(x[1])]
            assert {tuple(images[k : k + batch]) for k in range(0, len(images), batch)} <= set(whole)
    done = {x for f in random.Random(batch).sample(whole, len(whole) // 2) for x in f}
    assert set(forwards([x for x in items if x not in done])) <= set(whole)
