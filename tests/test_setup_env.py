"""tools/setup_env.sh: where torch comes from (``--torch-index``, which installs nothing). Without an NVIDIA GPU the
CPU wheel index, if it answers (a real HTTP server on 127.0.0.1 stands in for it), else the default index with one
line saying so, quickly; with a GPU the default index; a set ``TORCH_INDEX_URL`` always."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from httpserver import FileServer

ROOT = Path(__file__).resolve().parent.parent
NVIDIA_DRIVER = Path("/proc/driver/nvidia")


def torch_index(tmp_path: Path, gpu: bool, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """``bash tools/setup_env.sh --torch-index`` with a PATH that has an ``nvidia-smi`` only if ``gpu``; its time."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    if gpu:
        fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200'\n")
        fake.chmod(0o755)
    else:
        fake.unlink(missing_ok=True)
    dirs = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    full = {k: v for k, v in os.environ.items() if k != "TORCH_INDEX_URL"}  # only where a test sets it
    # VENV: were --torch-index ever ignored, the set-up would not touch the checkout's .venv
    full.update(PATH=os.pathsep.join([str(bin_dir), *dirs]), PYTHON=sys.executable, VENV=str(tmp_path / "venv"), **env)
    start = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "tools" / "setup_env.sh"), "--torch-index"], env=full,
                          capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - start


@pytest.fixture
def index():
    """A wheel index on 127.0.0.1 that answers for torch."""
    server = FileServer()
    server.files["/whl/cpu/torch/"] = b"<html><body></body></html>"
    yield server
    server.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(NVIDIA_DRIVER.exists(), reason="an NVIDIA driver is loaded on this machine")
def test_without_a_gpu_the_cpu_index_if_it_answers(tmp_path, index):
    url = index.url + "/whl/cpu"
    proc, _ = torch_index(tmp_path, gpu=False, TORCH_CPU_INDEX_URL=url)
    assert proc.returncode == 0 and (proc.stdout, proc.stderr) == (url + "\n", ""), proc.stderr
    assert [p for p, _ in index.requests] == ["/whl/cpu/torch/"]


@pytest.mark.skipif(NVIDIA_DRIVER.exists(), reason="an NVIDIA driver is loaded on this machine")
def test_without_a_gpu_the_default_index_if_the_cpu_index_does_not_answer(tmp_path):
    for url in (f"http://127.0.0.1:{closed_port()}/whl/cpu", "http://no-such-host.invalid/whl/cpu"):
        proc, seconds = torch_index(tmp_path, gpu=False, TORCH_CPU_INDEX_URL=url)
        assert proc.returncode == 0 and proc.stdout == "\n", proc.stderr
        assert proc.stderr == (
            f"setup: no NVIDIA GPU here, but the CPU wheel index {url} does not answer: torch comes from the default "
            "index, with its CUDA libraries (set TORCH_INDEX_URL to choose)\n"
        )
        assert seconds < 15


def test_with_a_gpu_the_default_index_unasked(tmp_path, index):
    proc, _ = torch_index(tmp_path, gpu=True, TORCH_CPU_INDEX_URL=index.url + "/whl/cpu")
    assert proc.returncode == 0 and (proc.stdout, proc.stderr) == ("\n", "")
    assert index.requests == []


@pytest.mark.parametrize("gpu", [False, True])
def test_torch_index_url_wins(tmp_path, index, gpu):
    proc, _ = torch_index(tmp_path, gpu=gpu, TORCH_INDEX_URL="https://mirror.example/whl/cu130",
                          TORCH_CPU_INDEX_URL=index.url + "/whl/cpu")
    assert proc.returncode == 0 and (proc.stdout, proc.stderr) == ("https://mirror.example/whl/cu130\n", "")
    assert index.requests == []
