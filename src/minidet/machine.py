"""The machine's facts that programs record beside their numbers: the CPU's model, its numeric flags, the cores,
the load average. Standard library only (no torch): every program and tool reads them here, so they agree.

The CPU's model is ``/proc/cpuinfo``'s ``model name`` (``cpu model`` on MIPS); where it has none (Linux on 64-bit
ARM) ``lscpu``'s ``Model name`` (util-linux names ARM's cores from their implementer and part), else its
``Hardware``, else its ``CPU implementer`` and ``CPU part``; elsewhere (macOS, Windows) ``platform.processor()``.
"""

from __future__ import annotations

import os
import platform
import subprocess

# the CPU flags that decide which kernels (and so which float arithmetic) a runtime picks by itself, as
# /proc/cpuinfo spells them (x86's "flags", ARM's "Features")
NUMERIC_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16",
                 "amx_fp16", "amx_int8", "asimd", "bf16", "i8mm", "sve")


def _cpuinfo(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """``/proc/cpuinfo``'s first non-empty value of each key (keys lower-cased); {} where there is none."""
    facts: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if value.strip():
                    facts.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return facts


def _lscpu_model() -> str:
    """``lscpu``'s ``Model name`` ('' where there is no lscpu or it names none)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False, timeout=10,
                             env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in out.splitlines():
        if line.startswith("Model name:") and (model := line.split(":", 1)[1].strip()) != "-":
            return model
    return ""


def cpu_model(info: dict[str, str] | None = None) -> str:
    """The CPU's model name (see the module's docstring for where it comes from); ``info``: ``/proc/cpuinfo``'s
    values, read when not given."""
    info = _cpuinfo() if info is None else info
    if model := info.get("model name") or info.get("cpu model"):
        return model
    if info and (model := _lscpu_model() or info.get("hardware")):
        return model
    if "cpu part" in info:
        return f"{platform.machine()} (CPU implementer {info.get('cpu implementer', '?')}, part {info['cpu part']})"
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_facts() -> dict[str, object]:
    """The CPU's model, the machine (``platform.machine()``) and which of ``NUMERIC_FLAGS`` the CPU has, in that
    list's order: what an export's ``report.json`` records."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("features", "")).split())
    return {"model": cpu_model(info), "machine": platform.machine(), "flags": [f for f in NUMERIC_FLAGS if f in flags]}


def cores() -> int | None:
    """The logical cores of the machine (``os.cpu_count()``; None where unknown)."""
    return os.cpu_count()


def load_average() -> tuple[float, float, float] | None:
    """The load average over 1, 5 and 15 minutes (other processes competing for the cores); None where the system
    keeps none (Windows)."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None
