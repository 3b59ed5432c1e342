"""Ctrl-C in every ``minidet`` command, at every phase (while torch loads, while the model loads, while it runs,
while a download waits): one ``error: interrupted`` line, no traceback, exit status 130. Real processes: each is
started in its own process group with the default SIGINT action (a test runner started in the background may
ignore SIGINT, and its children inherit that), and SIGINT goes to the whole group, as a terminal sends it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import pytest

import minidet
from minidet.apps.outputs.fileio import LOCK_NAME
from minidet.apps.synthetic import structured_image

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "torchvision/maskrcnn_resnet50_fpn"
pytestmark = pytest.mark.serial  # signals sent at moments the wall clock picks
SMALL = ["INPUT.MIN_SIZE_TEST", "160", "INPUT.MAX_SIZE_TEST", "240", "MODEL.RPN.POST_NMS_TOPK_TEST", "50",
         "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "10"]
# the code of the installed console script (`minidet ...`), run on the minidet these tests import
MINIDET = ("-c", "import sys; from minidet.apps.cli import main; sys.exit(main())")
# a short benchmark: one variant, no torchvision, no memory probe, no peaks
BENCH = ["--norms", "Affine", "--size", "160", "--image", "120x160", "--iters", "2", "--warmup", "1", "--no-memory",
         "--peak-seconds", "0", *SMALL]


class Started:
    """A command in its own process group, its output read line by line as it comes."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        # the minidet under test, wherever it is installed from; one thread: short on a busy machine too
        env = {**os.environ, "PYTHONPATH": str(Path(minidet.__file__).parents[1]), "OMP_NUM_THREADS": "1",
               "MINIDET_HOME": str(cwd / "home")}
        self.proc = subprocess.Popen(
            [sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(f, lines), daemon=True)
                         for f, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def interrupt_when(self, ready: Callable[[], bool], timeout: float = 300) -> None:
        """Send SIGINT to the process group as soon as ``ready()``; fail if the process ends first."""
        deadline = time.monotonic() + timeout
        while not ready():
            last = (self.out + self.err)[-5:]
            assert self.proc.poll() is None, f"ended (status {self.proc.returncode}) before: {last}"
            assert time.monotonic() < deadline, f"not ready after {timeout} s: {last}"
            time.sleep(0.005)
        os.killpg(self.proc.pid, signal.SIGINT)

    def finish(self, timeout: float = 300) -> tuple[int, list[str]]:
        rc = self.proc.wait(timeout=timeout)
        for t in self._readers:
            t.join(timeout=10)
        return rc, self.err

    def torch_loading(self) -> bool:
        """torch's native library is mapped into the process: its import has begun (torchvision, OpenCV and
        minidet's modules follow)."""
        try:
            with open(f"/proc/{self.proc.pid}/maps") as f:
                return "libtorch_cpu" in f.read()
        except OSError:
            return False

    def printed(self, text: str) -> Callable[[], bool]:
        return lambda: any(text in line for line in self.out + self.err)


def assert_one_interrupted_line(rc: int, err: list[str]) -> None:
    text = "\n".join(err)
    assert rc == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == err[-1] and err[-1].startswith("error: interrupted"), text


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tv_file_init) -> dict[str, Path]:
    """Twelve small images, a COCO annotation file for them, the session's torchvision checkpoint."""
    folder = tmp_path_factory.mktemp("interrupt")
    images = folder / "images"
    images.mkdir()
    entries = []
    for k in range(12):
        cv2.imwrite(str(images / f"{k}.png"), structured_image(120, 160, seed=k))
        entries.append({"id": k + 1, "file_name": f"{k}.png", "height": 120, "width": 160})
    anns = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 40, 50], "area": 2000, "iscrowd": 0,
             "segmentation": [[10, 10, 50, 10, 50, 60, 10, 60]]}]
    ann = folder / "ann.json"
    ann.write_text(json.dumps({"images": entries, "annotations": anns, "categories": [{"id": 1, "name": "person"}]}))
    return {"images": images, "ann": ann, "weights": Path(tv_file_init)}


def _infer(inputs: dict[str, Path], out: Path) -> list[str]:
    return ["--config-file", CONFIG, "--input", str(inputs["images"]), "--output", str(out), "--no-vis",
            "--workers", "1", "MODEL.WEIGHTS", str(inputs["weights"]), *SMALL]


def _eval(inputs: dict[str, Path], out: Path) -> list[str]:
    return ["--config-file", CONFIG, "--ann", str(inputs["ann"]), "--images", str(inputs["images"]), "--output",
            str(out), "--workers", "1", "MODEL.WEIGHTS", str(inputs["weights"]), *SMALL]


@pytest.mark.parametrize("tool", ["benchmark", "infer", "eval_coco"])
def test_ctrl_c_while_torch_loads_in_a_tool(tool, inputs, tmp_path):
    """``tools/*.py`` (``bash tools/quickstart.sh`` runs tools/benchmark.py): Ctrl-C in the first seconds, while
    torch and minidet's modules load."""
    out = tmp_path / "out"
    args = {"benchmark": BENCH, "infer": _infer(inputs, out), "eval_coco": _eval(inputs, out)}[tool]
    run = Started([str(ROOT / "tools" / f"{tool}.py"), *args], tmp_path)
    run.interrupt_when(run.torch_loading)
    assert_one_interrupted_line(*run.finish())


def test_ctrl_c_while_torch_loads_in_the_minidet_command(inputs, tmp_path):
    """The console script's first line, ``import minidet``, loads no torch: Ctrl-C while torch loads lands in
    ``minidet.apps.cli``, which says it in one line."""
    run = Started([*MINIDET, "infer", *_infer(inputs, tmp_path / "out")], tmp_path)
    run.interrupt_when(run.torch_loading)
    assert_one_interrupted_line(*run.finish())


@pytest.mark.slow
def test_ctrl_c_while_the_benchmark_runs(tmp_path):
    """`minidet bench` interrupted as its timing begins."""
    run = Started([*MINIDET, "bench", *BENCH], tmp_path)
    run.interrupt_when(run.printed("interleaved (order rotating"))  # the models are loaded
    assert_one_interrupted_line(*run.finish())


@pytest.mark.slow
@pytest.mark.parametrize("command", ["infer", "eval"])
def test_ctrl_c_while_the_model_loads(command, inputs, tmp_path):
    """Interrupted as soon as the output folder is locked: the model is being built and its weights loaded."""
    out = tmp_path / "out"
    args = _infer(inputs, out) if command == "infer" else _eval(inputs, out)
    run = Started([*MINIDET, command, *args], tmp_path)
    run.interrupt_when(lambda: (out / LOCK_NAME).exists())
    assert_one_interrupted_line(*run.finish())


def test_ctrl_c_while_a_download_waits(tmp_path):
    """`minidet weights get URL` from a server that accepts the connection and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(300)
        url = f"http://127.0.0.1:{server.getsockname()[1]}/model.pth"
        run = Started([*MINIDET, "weights", "get", url], tmp_path)
        conn, _ = server.accept()  # the request is on its way: the client waits for the answer
        with conn:
            run.interrupt_when(lambda: True)
            assert_one_interrupted_line(*run.finish())
