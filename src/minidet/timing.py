"""Per-stage wall-clock timing that synchronizes CUDA and costs nothing when off."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence

import torch

# the stages in pipeline order (MaskRCNN.forward, the benchmark, minidet.apps.bench.reference)
STAGES = ("preprocess", "backbone", "fpn", "rpn", "box_head", "mask_head", "paste")
# steps inside the stages, timed only with ``StageTimer(detail=True)`` (into ``timer.details``)
DETAILS = ("rpn_select", "box_roi_align", "box_postprocess", "mask_roi_align")
_NULL = contextlib.nullcontext()


class StageTimer:
    """Seconds per stage name for one call: ``with timer.stage("rpn"):`` adds to ``timer.times`` (nothing when not
    ``enabled``; on CUDA it synchronizes first, so GPU work is charged to the stage that launched it). With
    ``detail=True``, ``timer.detail("rpn_select")`` times a step inside a stage into ``timer.details`` (apart)."""

    def __init__(self, enabled: bool = True, device: torch.device | str = "cpu", detail: bool = False) -> None:
        self.enabled = enabled
        self.detailed = enabled and detail
        self.sync = enabled and torch.device(device).type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.times: dict[str, float] = {}
        self.details: dict[str, float] = {}

    @contextlib.contextmanager
    def _measure(self, name: str, into: dict[str, float]) -> Iterator[None]:
        if self.sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            into[name] = into.get(name, 0.0) + time.perf_counter() - t0

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self._measure(name, self.times) if self.enabled else _NULL

    def detail(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self._measure(name, self.details) if self.detailed else _NULL


def summarize(records: Sequence[Mapping[str, float]], skip: int = 0) -> dict[str, dict[str, float]]:
    """``{stage: {"mean", "median", "std", "min", "max", "n"}}`` plus a ``"total"`` row over per-call records
    (seconds), ignoring the first ``skip``."""
    recs = list(records)[skip:] if len(records) > skip else list(records)
    names = [s for s in STAGES if any(s in r for r in recs)]
    names += sorted({k for r in recs for k in r} - set(names) - {"total"})
    columns = {name: [r.get(name, 0.0) for r in recs] for name in names}
    columns["total"] = [sum(v for k, v in r.items() if k != "total") for r in recs]
    return {name: {"mean": statistics.fmean(vals), "median": statistics.median(vals),
                   "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "min": min(vals), "max": max(vals),
                   "n": len(vals)} for name, vals in columns.items() if vals}


def format_table(stats: Mapping[str, Mapping[str, float]], title: str = "") -> str:
    """Render ``summarize`` output: ``stage : mean (sd) median, share of total``, in ms."""
    total = stats.get("total", {}).get("mean", 0.0) or 1e-12
    lines = [title] if title else []
    n = int(next(iter(stats.values()))["n"]) if stats else 0
    lines.append(f"{'stage':<11}: {'mean ms':>9} {'(sd)':>9} {'median':>9} {'min':>9} {'share':>6}   [n={n}]")
    for name, s in stats.items():
        share = "" if name == "total" else f"{100 * s['mean'] / total:5.1f}%"
        lines.append(f"{name:<11}: {1e3 * s['mean']:9.2f} ({1e3 * s['std']:7.2f}) {1e3 * s['median']:9.2f}"
                     f" {1e3 * s['min']:9.2f} {share:>6}")
    return "\n".join(lines)
