"""minidet.machine: the CPU's model and flags as every program records them, x86 and ARM alike, without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minidet import machine

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse avx avx2 fma avx512f avx512_bf16 avx512_vnni
"""
ARM64 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimddp bf16 i8mm sve
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1
"""


def facts(monkeypatch, tmp_path, text: str, lscpu: str = "") -> dict:
    (tmp_path / "cpuinfo").write_text(text)
    parsed = machine._cpuinfo(str(tmp_path / "cpuinfo"))
    monkeypatch.setattr(machine, "_cpuinfo", lambda: parsed)
    monkeypatch.setattr(machine, "_lscpu_model", lambda: lscpu)
    return machine.cpu_facts()


def test_x86_model_and_flags_in_numeric_flags_order(monkeypatch, tmp_path):
    got = facts(monkeypatch, tmp_path, X86)
    assert got["model"] == "AMD EPYC 9R14 96-Core Processor"
    assert got["flags"] == ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"]


@pytest.mark.parametrize(("lscpu", "model"), [("Neoverse-V1", "Neoverse-V1"), ("", None)])
def test_arm_model_from_lscpu_else_its_part_and_flags_from_features(monkeypatch, tmp_path, lscpu, model):
    got = facts(monkeypatch, tmp_path, ARM64, lscpu)
    assert got["model"] == (model or f"{got['machine']} (CPU implementer 0x41, part 0xd40)")
    assert got["flags"] == ["asimd", "bf16", "i8mm", "sve"]
    assert machine.cpu_model(machine._cpuinfo()) == got["model"]  # the same name for every program


def test_no_cpuinfo(monkeypatch, tmp_path):
    got = facts(monkeypatch, tmp_path, "")
    assert got["model"] and got["flags"] == []


def test_imports_no_torch():
    code = "import sys, minidet.machine, minidet.runtimes; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
