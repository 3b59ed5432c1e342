"""``minidet.memory``: freed memory kept in the process (glibc), only where an application asks for it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import ROOT, load_tool
from minidet import memory

# allocates and frees blocks of up to 64 MiB (over glibc's largest mmap threshold, 32 MiB), five times as five
# forwards would, first with glibc's defaults, then after keep_freed_memory(); prints the page faults of the last
# time of each (one process: the settings are process-wide and only ever switched on)
_FAULTS = r"""
import json, resource, sys
import torch
import minidet
from minidet import memory
assert not memory.memory_settings()["keep_freed_memory"]  # importing minidet changes nothing

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def run(mode):
    kept = memory.keep_freed_memory() if mode == "keep" else None
    for _ in range(5):
        before = faults()
        xs = [torch.ones(n * 2**18) for n in (40, 64, 48, 2)]  # MiB
        del xs
        n = faults() - before
    return {"kept": kept, "faults": n, "settings": memory.memory_settings()}

print(json.dumps([run(mode) for mode in sys.argv[1:]]))
"""


def _run(*modes: str) -> list[dict]:
    res = subprocess.run([sys.executable, "-c", _FAULTS, *modes], capture_output=True, text=True, cwd=ROOT,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_keep_freed_memory_removes_the_page_faults():
    if memory.memory_settings()["allocator"] is None:
        pytest.skip("not glibc")
    default, kept = _run("default", "keep")
    assert default["faults"] > 30_000  # 154 MiB of fresh pages: 39k faults
    assert kept["kept"] is True and kept["faults"] < 1_000
    assert kept["settings"]["keep_freed_memory"] and kept["settings"]["heap_free_mib"] >= 150
    assert default["settings"]["allocator"].startswith("glibc ")


def test_without_glibc_nothing_changes(monkeypatch):
    monkeypatch.setattr(memory, "_glibc", lambda: None)
    assert memory.keep_freed_memory() is False
    assert memory.release_freed_memory() is False
    settings = memory.memory_settings()
    assert settings["allocator"] is None and set(settings) == {"allocator", "keep_freed_memory", "env"}


@pytest.mark.parametrize("tool,required", [
    ("infer.py", ["--config-file", "c.yaml", "--input", "x.jpg", "--output", "out"]),
    ("eval_coco.py", ["--config-file", "c.yaml", "--images", ".", "--ann", "a.json", "--output", "out"]),
])
def test_applications_keep_memory_by_default(tool, required):
    mod = load_tool(ROOT / "tools" / tool)
    assert mod.parse_args(required).keep_memory is True
    assert mod.parse_args([*required, "--no-keep-memory"]).keep_memory is False
