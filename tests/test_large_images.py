"""Large images: memory that follows the boxes, not detections x frame (issue 35's item 1), measured as the peak
resident memory of a real ``minidet infer`` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import pytest

from helpers import ROOT
from minidet.apps.synthetic import structured_image

CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
# the process's peak resident memory (VmHWM, KiB; ru_maxrss would carry the forking parent's peak over exec),
# printed after the command's own output
PEAK = ("import re, sys\nfrom minidet.apps.cli import main\nrc = main(sys.argv[1:])\n"
        "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
        "print('peak-kib', hwm, file=sys.stderr)\nsys.exit(rc)")


def infer_peak(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """``minidet infer args`` in a process of its own (one thread); its peak resident memory in GB."""
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", PEAK, "infer", "--workers", "0", *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stderr
    kib = int(r.stderr.strip().splitlines()[-1].split()[1])
    return r, kib * 1024 / 1e9


@pytest.mark.slow
def test_an_8000_by_8000_image_with_100_detections_within_4_gb(tmp_path, tv_file):
    """64 megapixels (inside the default INPUT.MAX_PIXELS) and 100 detections: at most 4 GB at the peak, without
    and with the drawing (the full-frame masks of before took 100 x 64 MB for the masks alone)."""
    image = tmp_path / "big.jpg"
    cv2.imwrite(str(image), structured_image(8000, 8000, seed=1), [cv2.IMWRITE_JPEG_QUALITY, 90])
    peaks = {}
    for vis in (False, True):
        out = tmp_path / f"out{vis}"
        _, peaks[vis] = infer_peak(tmp_path, "--config-file", str(CONFIG), "--input", str(image), "--output",
                                   str(out), *([] if vis else ["--no-vis"]), "MODEL.WEIGHTS", str(tv_file))
        record = json.loads((out / "big.json").read_text())
        assert len(record["instances"]) == 100 and all("segmentation" in i for i in record["instances"])
        assert (out / "big.jpg").exists() == vis
    print(f"8000 x 8000, 100 detections: peak {peaks[False]:.2f} GB (--no-vis), {peaks[True]:.2f} GB (drawing)")
    assert max(peaks.values()) <= 4.0, peaks
