# ruff: noqa: F811 - `weights` is a pytest fixture imported from test_eval_coco_tool
"""Output folders and inputs as users meet them through tools/infer.py and tools/eval_coco.py
(issue 12, §1.1, §2.10, §3.14, §3.16): no output replaces an input, an output folder that cannot be
written (or an --images folder that is missing) is one set-up error before the model loads, folder
inputs say what they skipped, short temp names, and a lock against two runs in one folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import pytest

from helpers import load_tool, one_error_line
from minidet.apps.bulk.inputs import describe_skipped, find_inputs
from minidet.apps.bulk.writer import InputGuard
from minidet.apps.outputs import fileio
from minidet.apps.outputs.fileio import LOCK_NAME, OutputDir, OutputError, remove_temp_files
from minidet.apps.outputs.video import VIDEO_EXTENSIONS
from minidet.apps.synthetic import structured_image
from minidet.imageio import IMAGE_EXTENSIONS
from test_bad_inputs import EVAL, FAST, INFER, TV_CONFIG, _run
from test_eval_coco_tool import weights  # noqa: F401 - a fixture: a torchvision checkpoint file

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def find_images(inputs: list[str]) -> tuple[list[str], dict]:
    found, skipped = find_inputs(inputs)
    return [p for p, _ in found], skipped


def _image(path: Path, seed: int = 0) -> Path:
    assert cv2.imwrite(str(path), structured_image(48, 64, seed=seed))
    return path


def _infer(capsys, weights: Path, inputs: list[Path], out: Path | str) -> tuple[int, str, str]:
    argv = ["--config-file", str(TV_CONFIG), "--input", *map(str, inputs), "--output", str(out),
            "MODEL.WEIGHTS", str(weights), *FAST]
    rc = load_tool(INFER).main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _eval(capsys, *argv: str) -> tuple[int, str]:
    rc = load_tool(EVAL).main(list(argv))
    return rc, capsys.readouterr().err


@pytest.fixture
def dataset(tmp_path) -> tuple[Path, Path, Path]:
    """A one-image annotation file, its image folder and a results file for it."""
    images = tmp_path / "images"
    images.mkdir()
    _image(images / "1.jpg")
    ann = tmp_path / "ann.json"
    box = {"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0, "area": 100.0, "bbox": [1, 1, 10, 10]}
    ann.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "1.jpg", "height": 48, "width": 64}],
        "annotations": [box], "categories": [{"id": 1, "name": "person"}],
    }))
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 1, "category_id": 1, "bbox": [1, 1, 10, 10], "score": 0.9}]))
    return ann, images, results


# ------------------------------------------------------------------------------ §1.1 never write over an input


def test_an_output_folder_that_would_replace_an_input_is_refused(tmp_path, capsys, weights):
    photos = tmp_path / "photos"
    photos.mkdir()
    photo = _image(photos / "photo.jpg")
    before = photo.read_bytes()
    (photos / "link").symlink_to(".")  # photos/link/photo.jpg is photos/photo.jpg
    (tmp_path / "alias").symlink_to("photos")
    other = tmp_path / "other"
    other.mkdir()
    os.link(photo, other / "photo.jpg")  # a hard link: the same file under another name
    cases = [
        ([photos], photos),  # the user's own case: --output is the input folder
        ([photo], photos / "link"),
        ([tmp_path / "alias" / "photo.jpg"], photos),
        ([photo], other),
    ]
    for inputs, out in cases:
        rc, _, err = _infer(capsys, weights, inputs, out)
        line = one_error_line(err)
        assert rc == 2, (inputs, out, err)
        assert line.startswith(f"error: --output {out}: photo.jpg would replace the input file {inputs[0]}"), line
        assert photo.read_bytes() == before
    assert sorted(os.listdir(photos)) == ["link", "photo.jpg"]  # no output, no lock, no temp file left
    assert sorted(os.listdir(other)) == ["photo.jpg"]


def test_the_write_itself_refuses_an_input_file(tmp_path):
    photo = _image(tmp_path / "photo.jpg")
    before = photo.read_bytes()
    guard = InputGuard([str(photo)])
    with pytest.raises(OutputError, match="is the input file"):
        guard.write(str(tmp_path / "." / "photo.jpg"), b"drawing")
    assert photo.read_bytes() == before
    guard.write(str(tmp_path / "photo.json"), b"{}")
    assert (tmp_path / "photo.json").read_bytes() == b"{}"


# ------------------------------------------------------------------------------ §3.14 with §1.1, §2.10: one real run


@pytest.mark.slow
def test_folder_input_with_odd_entries_long_names_and_output_inside_it(tmp_path, capsys, weights):
    """Output inside the input folder without collision runs; a 240-byte name is written; the
    folder's odd entries are counted on one line; a folder named x.jpg is one error, not the end."""
    photos = tmp_path / "photos"
    photos.mkdir()
    photo = _image(photos / "photo.jpg")
    before = photo.read_bytes()
    long_stem = "a" * 236
    _image(photos / f"{long_stem}.jpg", seed=1)  # 240 bytes: the old temp name could not hold it
    (photos / "gone.jpg").symlink_to("nowhere.jpg")
    (photos / "loop.jpg").symlink_to("loop.jpg")
    (photos / "dir.jpg").mkdir()
    (photos / "anim.gif").write_bytes(b"GIF89a")
    (photos / "notes.txt").write_text("not an image\n")
    (photos / ".DS_Store").write_bytes(b"\0")  # hidden: not worth a word
    (photos / "sub").mkdir()  # a plain subfolder: not recursive, not worth a word
    named = tmp_path / "named.jpg"
    named.mkdir()
    out = photos / "out"

    rc, stdout, err = _infer(capsys, weights, [named, photos], out)
    assert rc == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {named}: ") and "director" in errors[0], err
    assert "Traceback" not in err
    skipped = [line for line in stdout.splitlines() if line.startswith("infer: skipped")]
    assert skipped == [
        f"infer: skipped 5 entries in {photos}: 1 dangling link, 1 folder named like an image, 1 symlink loop, "
        f"1 .gif, 1 .txt (not an image or video extension: {', '.join(IMAGE_EXTENSIONS + VIDEO_EXTENSIONS)})"
    ]
    assert "infer: 3 inputs, 1 failed," in stdout
    outputs = sorted(f"{s}{e}" for s in ("photo", long_stem) for e in (".jpg", ".json"))
    assert sorted(os.listdir(out)) == [".chunks", *outputs]
    assert json.loads((out / f"{long_stem}.json").read_text())["file"] == str(photos / f"{long_stem}.jpg")
    assert photo.read_bytes() == before


def test_find_images_reports_what_it_skipped(tmp_path):
    _image(tmp_path / "a.png")
    (tmp_path / "b.gif").write_bytes(b"GIF89a")
    (tmp_path / "c.gif").write_bytes(b"GIF89a")
    (tmp_path / "README").write_text("x")
    (tmp_path / "d.jpg").symlink_to("missing.jpg")
    (tmp_path / "e.jpg").mkdir()
    paths, skipped = find_images([str(tmp_path / "*")])
    assert paths == [str(tmp_path / "a.png")]
    assert sorted(skipped[str(tmp_path / "*")]) == sorted([
        (str(tmp_path / "b.gif"), ".gif"), (str(tmp_path / "c.gif"), ".gif"), (str(tmp_path / "README"), ""),
        (str(tmp_path / "d.jpg"), "dangling"), (str(tmp_path / "e.jpg"), "folder"),
    ])

    assert describe_skipped(["folder", ".gif", "", ".gif"]).startswith(
        "1 folder named like an image, 1 file without extension, 2 .gif (not an image extension: .jpg,"
    )
    # a folder named like an image, given by name, is kept as an input (read_image reports it);
    # with a trailing slash it is a folder to list
    _image(tmp_path / "e.jpg" / "inner.png")
    assert find_images([str(tmp_path / "e.jpg")]) == ([str(tmp_path / "e.jpg")], {})
    assert find_images([str(tmp_path / "e.jpg") + os.sep])[0] == [os.path.join(str(tmp_path / "e.jpg") + os.sep,
                                                                                "inner.png")]


# ------------------------------------------------------------------------------ §2.10 output folders, --images


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder where creating a file really fails: chmod 555, or (as root, which chmod does not
    stop) the immutable attribute. Skips where neither can be had."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], check=False).returncode:
            pytest.skip("running as root without chattr +i: cannot make a folder read-only")
    else:
        folder.chmod(0o555)
    try:
        (folder / "probe").write_text("x")
    except OSError:
        pass
    else:
        pytest.skip("this file system lets the test write into a read-only folder")
    yield folder
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    folder.chmod(0o755)


def _unwritable_folders(read_only_dir: Path, tmp_path: Path) -> dict[Path, str]:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return {
        read_only_dir: "cannot write in the folder (",
        read_only_dir / "new": "cannot create the folder (",
        a_file: "exists and is not a folder",
        a_file / "below": "cannot create the folder (Not a directory)",
        Path("/sys/minidet-test"): "cannot create the folder (",  # sysfs: mkdir fails, even for root
    }


def test_unwritable_output_is_one_setup_error_in_both_tools(tmp_path, capsys, weights, read_only_dir, dataset):
    ann, images, results = dataset
    photo = _image(tmp_path / "photo.jpg")
    for out, message in _unwritable_folders(read_only_dir, tmp_path).items():
        runs = {
            "infer": _infer(capsys, weights, [photo], out)[::2],
            "eval model": _eval(capsys, "--config-file", str(TV_CONFIG), "--ann", str(ann), "--images", str(images),
                                "--output", str(out), "MODEL.WEIGHTS", str(weights), *FAST),
            "eval results": _eval(capsys, "--ann", str(ann), "--results", str(results), "--output", str(out)),
        }
        for tool, (rc, err) in runs.items():
            line = one_error_line(err)
            assert rc == 2 and line.startswith(f"error: --output {out}: {message}"), (tool, line)
            assert ".tmp" not in line and ".md-" not in line
    assert os.listdir(read_only_dir) == []


def test_missing_images_folder_is_one_setup_error(tmp_path, capsys, weights, dataset):
    ann, images, _ = dataset
    for given, what in ((tmp_path / "no_such_folder", "no such folder"), (images / "1.jpg", "not a folder")):
        out = tmp_path / "out"
        rc, err = _eval(capsys, "--config-file", str(TV_CONFIG), "--ann", str(ann), "--images", str(given),
                        "--output", str(out), "MODEL.WEIGHTS", str(weights), *FAST)
        assert rc == 2 and one_error_line(err) == f"error: --images {given}: {what}"
        assert not out.exists()


def test_a_failed_temp_file_names_the_target_and_temp_names_are_short(tmp_path, read_only_dir):
    target = read_only_dir / "metrics.json"
    with pytest.raises(OutputError) as info:
        fileio.write_json(str(target), {"AP": 1.0})
    assert str(info.value).startswith(f"{target}: cannot write (") and ".tmp" not in str(info.value)
    assert isinstance(info.value, OSError) and info.value.errno is not None
    assert len(fileio._temp_name()) <= 32  # whatever the target's name (a 250-byte name must fit 255 bytes)
    old = ".results.json.123.0123abcd.tmp"  # what earlier versions left
    new = fileio._temp_name()
    for name in (old, new, "keep.json", ".hidden", LOCK_NAME):
        (tmp_path / name).write_text("x")
    assert sorted(remove_temp_files(str(tmp_path))) == sorted([old, new])


# ------------------------------------------------------------------------------ §3.16 one run per output folder

# another run, as far as the folder is concerned: takes the lock, says so, waits to be killed
_HOLDER = (
    "import sys, time; from minidet.apps.outputs.fileio import OutputDir; d = OutputDir(sys.argv[1]); "
    "print('locked', flush=True); time.sleep(600)"
)


@pytest.mark.slow
def test_a_second_run_on_a_locked_folder_is_refused_and_a_killed_run_frees_it(tmp_path, capsys, weights, dataset,
                                                                               monkeypatch):
    ann, images, results = dataset
    out = tmp_path / "out"
    root = str(Path(__file__).resolve().parent.parent)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root})
    try:
        assert holder.stdout.readline().strip() == "locked"
        refused = f"error: --output {out}: another minidet run (pid {holder.pid}) is writing into this folder"
        photo = _image(tmp_path / "photo.jpg")
        res = _run(INFER, "--config-file", str(TV_CONFIG), "--input", str(photo), "--output", str(out),
                   "MODEL.WEIGHTS", str(weights), *FAST, cwd=tmp_path)  # a second real process
        assert res.returncode == 2 and one_error_line(res.stderr).startswith(refused), res.stderr
        rc, err = _eval(capsys, "--config-file", str(TV_CONFIG), "--ann", str(ann), "--images", str(images),
                        "--output", str(out), "MODEL.WEIGHTS", str(weights), *FAST)
        assert rc == 2 and one_error_line(err).startswith(refused)
        rc, err = _eval(capsys, "--ann", str(ann), "--results", str(results), "--output", str(out))
        assert rc == 2 and one_error_line(err).startswith(refused)
        assert sorted(os.listdir(out)) == [LOCK_NAME]

        with monkeypatch.context() as env:  # a torchrun rank other than 0 writes into the folder of rank 0
            env.setenv("WORLD_SIZE", "2")
            env.setenv("RANK", "1")
            rc, err = _eval(capsys, "--ann", str(ann), "--results", str(results), "--output", str(out))
        assert rc == 0, err
        assert (out / "metrics.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert (out / LOCK_NAME).exists()  # the killed run could not clean up; its lock went with it
    deadline = time.monotonic() + 30
    while True:
        try:
            lock = OutputDir(str(out))
            break
        except OutputError:
            assert time.monotonic() < deadline, "the lock of a killed process is still held"
            time.sleep(0.1)
    lock.close()
    rc, err = _eval(capsys, "--ann", str(ann), "--results", str(results), "--output", str(out))
    assert rc == 0, err
    assert sorted(os.listdir(out)) == ["metrics.json", "timing.json"]  # the lock is gone
