"""Scoring at dataset scale: ``minidet eval --results`` with each scoring backend on one synthetic COCO set.

Usage::

    python tools/bench_scoring.py --output DIR [--images 5000] [--per-image 100] [--seed 0]
        [--backends pycocotools,hotcoco] [--runs 1]

Writes a synthetic COCO set at Mask R-CNN density (``minidet.apps.synthetic.dense_coco_set``: ``--images`` 480x640
images, about 7 polygon objects each, a crowd region in every tenth, ``--per-image`` detections per image with boxes
and RLE masks) once to ``DIR/annotations.json`` and ``DIR/results.json``, its parameters and counts in
``DIR/set.json`` (a later run with the same parameters reuses the files; 5,000 images take about a minute to make).
Then, ``--runs`` times, each backend in turn (the order rotating by one backend per run) scores it in a child process,

    minidet eval --ann DIR/annotations.json --results DIR/results.json --output DIR/<backend> --backend <backend>

(``python -m minidet.apps.cli``, with this interpreter; its output in ``DIR/<backend>.log``). Measured per child: its
wall time (process start to exit: the interpreter, the imports, reading and checking both files, the scoring), its
peak resident set (``os.wait4``'s ``ru_maxrss``) and, from its ``timing.json``, the seconds of each scoring stage
(load, match, accumulate, summarize) for boxes and masks. Every backend's 12 + 12 statistics (``metrics.json``) must
equal (``==``) the first backend's: otherwise a ``FAILURE`` line and exit status 1.

Prints the CPU, its cores and the load average before and after each child, then one table: per backend its version,
each stage's seconds and their sum (the scoring time) per IoU type, the wall time and the peak memory (medians over
the runs; the peak memory the largest), with the first backend's value over each other backend's (for times: the
speed-up). Everything also goes to ``DIR/bench_scoring.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import minidet
except ImportError:  # a source checkout that is not installed
    sys.path.insert(0, str(ROOT / "src"))
    import minidet

from minidet.apps.scoring import BACKENDS, IOU_TYPES, STAGES, version  # noqa: E402
from minidet.machine import cores, cpu_model, load_average  # noqa: E402

SET_FILES = ("annotations.json", "results.json")


def cpu_line() -> str:
    """The CPU's model name with its family, model and stepping numbers (``/proc/cpuinfo``) and the cores."""
    numbers = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("cpu family", "model", "stepping") and value.strip():
                    numbers.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    ids = ", ".join(f"{k} {v}" for k, v in numbers.items())
    return f"{cpu_model()}" + (f" ({ids})" if ids else "") + f", {cores()} cores"


def load_line() -> str:
    load = load_average()
    return "n/a" if load is None else " ".join(f"{v:.2f}" for v in load)


def make_set(out: Path, images: int, per_image: int, seed: int) -> dict:
    """The synthetic set in ``out`` (made, or reused where ``set.json`` names the same parameters); its description."""
    params = {"generator": "minidet.apps.synthetic.dense_coco_set", "images": images, "per_image": per_image,
              "seed": seed}
    meta_path = out / "set.json"
    if meta_path.exists() and all((out / n).exists() for n in SET_FILES):
        meta = json.loads(meta_path.read_text())
        if {k: meta.get(k) for k in params} == params:
            print(f"bench_scoring: reusing the set in {out} ({meta_path})")
            return meta
    from minidet.apps.synthetic import dense_coco_set

    print(f"bench_scoring: making the set: {images} images, {per_image} detections per image (seed {seed}) ...",
          flush=True)
    t0 = time.perf_counter()
    ann, results = dense_coco_set(images=images, per_image=per_image, seed=seed)
    t_make = time.perf_counter() - t0
    meta_path.unlink(missing_ok=True)  # written last: a set cut off while writing is made again
    for name, data in zip(SET_FILES, (ann, results)):
        with open(out / name, "w") as f:
            json.dump(data, f)
    crowd = sum(a["iscrowd"] for a in ann["annotations"])
    meta = {**params, "image_size": [ann["images"][0]["height"], ann["images"][0]["width"]] if ann["images"] else [],
            "categories": len(ann["categories"]), "annotations": len(ann["annotations"]), "crowd": crowd,
            "detections": len(results), "bytes": {n: (out / n).stat().st_size for n in SET_FILES},
            "make_s": round(t_make, 1)}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"bench_scoring: made in {t_make:.0f} s")
    return meta


def child_env() -> dict:
    """The environment of the children: this process's, with the folder of the minidet imported here first on
    ``PYTHONPATH`` (a checkout that is not installed scores with its own code)."""
    env = dict(os.environ)
    here = str(Path(minidet.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_backend(out: Path, backend: str) -> dict:
    """One ``minidet eval`` of the set with ``backend`` in a child process: its wall time, peak memory, stages,
    statistics. Exits with the child's status (its log's tail printed) when it fails."""
    dest, log_path = out / backend, out / f"{backend}.log"
    cmd = [sys.executable, "-m", "minidet.apps.cli", "eval", "--ann", str(out / SET_FILES[0]),
           "--results", str(out / SET_FILES[1]), "--output", str(dest), "--backend", backend]
    for name in ("timing.json", "metrics.json"):  # a failed run must not leave an earlier run's numbers to read
        (dest / name).unlink(missing_ok=True)
    load_before = load_line()
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env())
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    load_after = load_line()
    if proc.returncode != 0:
        tail = log_path.read_text().splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        print(f"bench_scoring: FAILURE: `{' '.join(cmd)}` exited with {proc.returncode} (log: {log_path})",
              file=sys.stderr)
        sys.exit(1)
    timing = json.loads((dest / "timing.json").read_text())
    metrics = json.loads((dest / "metrics.json").read_text())
    scoring = timing["scoring"]
    stages = {t: scoring["stages_s"][t] for t in IOU_TYPES}
    print(f"bench_scoring: {backend} {scoring['version']}: wall {wall:.1f} s, scoring "
          + ", ".join(f"{t} {sum(stages[t].values()):.1f} s" for t in IOU_TYPES)
          + f", peak {usage.ru_maxrss / 2**20:.2f} GiB; load average {load_before} before, {load_after} after",
          flush=True)
    return {"backend": backend, "version": scoring["version"], "command": cmd, "wall_s": wall,
            "peak_rss_kib": usage.ru_maxrss, "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
            "eval_s": timing["eval_s"], "stages_s": stages, "stats": {t: metrics[t]["stats"] for t in IOU_TYPES},
            "names": {t: [k for k in metrics[t] if k != "stats"] for t in IOU_TYPES},
            "load_before": load_before, "load_after": load_after}


def summarize(runs: list[dict]) -> dict:
    """One backend's runs: the median of each time, the largest peak memory."""
    med = statistics.median
    stages = {t: {s: med(r["stages_s"][t][s] for r in runs) for s in STAGES} for t in IOU_TYPES}
    return {"version": runs[0]["version"], "wall_s": med(r["wall_s"] for r in runs), "stages_s": stages,
            "scoring_s": {t: med(sum(r["stages_s"][t].values()) for r in runs) for t in IOU_TYPES},
            "peak_gib": max(r["peak_rss_kib"] for r in runs) / 2**20, "runs": len(runs)}


def table(summary: dict[str, dict], ref: str) -> str:
    """Rows: each stage and the scoring time per IoU type, the wall time, the peak memory; columns: each backend,
    then ``ref`` over each other backend."""
    names = list(summary)
    rows: list[tuple[str, list[float], str]] = []
    for t in IOU_TYPES:
        rows += [(f"{t} {s} s", [summary[n]["stages_s"][t][s] for n in names], "{:.2f}") for s in STAGES]
        rows.append((f"{t} scoring s (sum)", [summary[n]["scoring_s"][t] for n in names], "{:.2f}"))
    rows.append(("wall s (the command)", [summary[n]["wall_s"] for n in names], "{:.1f}"))
    rows.append(("peak memory GiB", [summary[n]["peak_gib"] for n in names], "{:.2f}"))
    others = [n for n in names if n != ref]
    head = ["", *(f"{n} {summary[n]['version']}" for n in names), *(f"{ref} / {n}" for n in others)]
    body = []
    for label, values, fmt in rows:
        ref_value = values[names.index(ref)]
        ratios = [f"{ref_value / v:.2f}x" if v > 0 else "-" for n, v in zip(names, values) if n != ref]
        body.append([label, *(fmt.format(v) for v in values), *ratios])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head, *body]]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", required=True, metavar="DIR", help="the set, each backend's output, the summary")
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--per-image", type=int, default=100, help="detections per image")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backends", default="pycocotools,hotcoco",
                   help="comma-separated; the first is the reference of the equality check and the ratios")
    p.add_argument("--runs", type=int, default=1, help="times each backend scores the set")
    args = p.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or len(set(backends)) < len(backends):
        p.error("--backends: one or more distinct backend names")
    for b in backends:
        if b not in BACKENDS:
            p.error(f"--backends: unknown backend {b!r}; one of {', '.join(BACKENDS)}")
        if BACKENDS[b].refused:
            p.error(f"--backends: minidet refuses {b}: {BACKENDS[b].refused}")
        if version(BACKENDS[b]) is None:
            p.error(f"--backends: {b} is not installed ({BACKENDS[b].install})")
    if args.images < 1 or args.per_image < 0 or args.runs < 1:
        p.error("need --images >= 1, --per-image >= 0, --runs >= 1")
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)

    print(f"bench_scoring: CPU {cpu_line()}; Python {sys.version.split()[0]}; load average {load_line()}")
    meta = make_set(out, args.images, args.per_image, args.seed)
    size_mb = {n: b / 1e6 for n, b in meta["bytes"].items()}
    print(f"bench_scoring: set: {meta['images']} images, {meta['annotations']} annotations ({meta['crowd']} crowd), "
          f"{meta['detections']} detections; annotations.json {size_mb['annotations.json']:.1f} MB, "
          f"results.json {size_mb['results.json']:.1f} MB")

    runs: dict[str, list[dict]] = {b: [] for b in backends}
    for k in range(args.runs):
        for b in backends[k % len(backends):] + backends[: k % len(backends)]:
            runs[b].append(run_backend(out, b))

    ref = backends[0]
    failures = []
    first = runs[ref][0]
    for b in backends:
        for k, r in enumerate(runs[b]):
            for t in IOU_TYPES:
                if r["stats"][t] != first["stats"][t]:
                    names = first["names"][t] if len(first["names"][t]) == len(first["stats"][t]) else []
                    diff = [f"{names[i] if names else f'stats[{i}]'} {v!r} (not {w!r})"
                            for i, (v, w) in enumerate(zip(r["stats"][t], first["stats"][t])) if v != w]
                    if len(r["stats"][t]) != len(first["stats"][t]):
                        diff.append(f"{len(r['stats'][t])} statistics (not {len(first['stats'][t])})")
                    failures.append(f"{b} (run {k + 1}) {t} differs from {ref}: {', '.join(diff)}")
    summary = {b: summarize(runs[b]) for b in backends}
    n = len(runs[ref][0]["stats"]["bbox"]) + len(runs[ref][0]["stats"]["segm"])
    what = "medians of " if args.runs > 1 else ""
    print(f"\nscoring {meta['detections']} detections of {meta['images']} images, {args.runs} run(s) per backend "
          f"({what}seconds; peak memory: the child's largest resident set):")
    print(table(summary, ref))
    with open(out / "bench_scoring.json", "w") as f:
        json.dump({"cpu": cpu_line(), "set": meta, "backends": backends, "runs": runs, "summary": summary,
                   "equal": not failures}, f, indent=1)
    if failures:
        for line in failures:
            print(f"bench_scoring: FAILURE: NOT EQUAL: {line}", file=sys.stderr)
        return 1
    print(f"bench_scoring: the {n} statistics of every backend and run equal those of {ref} (==)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
