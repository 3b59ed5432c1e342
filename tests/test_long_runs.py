"""Long runs: memory stays flat over repeated evaluation, and no write, however interrupted,
leaves a file that a later run would trust."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import PASS_IMAGES, PASSES, assert_flat, config
from minidet.apps.bulk.chunks import ChunkStore, merge_chunks
from minidet.apps.outputs import fileio
from minidet.apps.outputs.fileio import atomic_write, remove_temp_files, write_json
from procs import descendants, rss_mb, survivors

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT.parent / "shared" / "data" / "coco_tiny"
CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


@pytest.mark.slow
@pytest.mark.skipif(not TINY.is_dir(), reason=f"needs ../shared/data/coco_tiny ({TINY} is absent)")
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc to read the resident memory")
def test_memory_stays_flat_over_passes_of_coco_tiny(tv_file):
    """20 of its images read, run, RLE-encoded and evaluated, five times in one process, as eval_coco does
    (masks become RLE per image, the evaluator is emptied after each pass): the resident memory stays flat after the
    first pass (``helpers.assert_flat``)."""
    import torch

    import minidet
    from minidet.apps.bulk.loader import ImageFiles, coco_image_files
    from minidet.apps.evaluation import COCOEvaluator, load_coco_annotations

    # tv_file: torchvision's initial weights with confident classes (conftest.py): the 20 detections are kept
    cfg = config(CONFIG, "INPUT.MIN_SIZE_TEST", 160, "INPUT.MAX_SIZE_TEST", 320,
                 "MODEL.RPN.PRE_NMS_TOPK_TEST", 300, "MODEL.RPN.POST_NMS_TOPK_TEST", 100,
                 "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", 20, weights=tv_file)
    predictor = minidet.Predictor(cfg)
    gt = load_coco_annotations(str(TINY / "annotations" / "instances_val2017.json"))
    files = ImageFiles(coco_image_files(gt.dataset["images"], str(TINY / "val2017")))
    assert len(files) == 80
    evaluator = COCOEvaluator(gt)

    def one_pass() -> tuple[float, int]:
        for k in range(PASS_IMAGES):
            image_id, image = files[k]
            assert not isinstance(image, str), image
            evaluator.process([image_id], [predictor(image)])
        n = len(evaluator.results)
        evaluator.evaluate()
        evaluator.reset()
        return rss_mb(), n

    # one intra-op thread: memory does not depend on it, and on a busy shared machine two OpenMP
    # threads on two cores ran this loop up to 8 times slower than one
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = rss_mb()
        passes = [one_pass() for _ in range(PASSES)]
    finally:
        torch.set_num_threads(threads)
    counts = [n for _, n in passes]
    assert len(set(counts)) == 1 and counts[0] > PASS_IMAGES * 10, counts  # the same, plentiful detections each time
    print(f"resident memory at the start: {start:.0f} MB")
    assert_flat([r for r, _ in passes])


# ------------------------------------------------------------------------------ atomic writes


def test_a_failed_rename_keeps_the_previous_file(tmp_path, monkeypatch):
    """The last step of an atomic write fails (disk full, permissions): the old file is intact and
    the temporary file is gone."""
    target = tmp_path / "metrics.json"
    write_json(str(target), {"AP": 0.5})
    before = target.read_bytes()

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_json(str(target), {"AP": 0.9, "more": list(range(1000))})
    with pytest.raises(OSError):
        atomic_write(str(tmp_path / "new.jpg"), b"\xff\xd8" * 100)
    assert target.read_bytes() == before
    assert os.listdir(tmp_path) == ["metrics.json"]


_WRITER = textwrap.dedent(
    """
    import sys
    from minidet.apps.outputs.fileio import write_json

    class Slow(list):  # serialized element by element, slowly: the kill lands mid-write
        def __iter__(self):
            import time
            for i in range(10**6):
                if i % 1000 == 0:
                    time.sleep(0.01)
                yield {"image_id": i, "score": 0.5}

        def __len__(self):
            return 1

    write_json(sys.argv[1], Slow())
    """
)


@pytest.mark.slow
def test_a_write_killed_midway_leaves_the_old_file_and_a_temp_that_nothing_reads(tmp_path):
    """SIGKILL while a large JSON is being written: the target keeps its previous complete
    content, the partial data is only in a temporary file, which the chunk store never reads and
    removes when a run opens the folder."""
    folder = tmp_path / "chunks"
    store = ChunkStore(str(folder))
    manifest = {"config": "x"}
    store.begin(manifest, store.check(manifest, resume=False), resume=False)
    store.write(1, 0, 0, {"image_ids": [7], "skipped": [], "dropped": 0, "detections": [], "timings": []})
    target = folder / "run001-rank0000-00001.json"  # the next chunk, and an older version of it in place
    write_json(str(target), {"run": 1, "rank": 0, "image_ids": [8], "skipped": [], "detections": []})
    before = target.read_bytes()

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], env=env)
    deadline = time.monotonic() + 120
    temps: list[Path] = []
    while time.monotonic() < deadline and proc.poll() is None:
        temps = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
        if temps and temps[0].stat().st_size > 4096:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the writer ended before it could be killed"
    procs = descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert survivors(procs) == []  # no process of the killed writer lives on

    assert target.read_bytes() == before and json.loads(before)["image_ids"] == [8]
    assert len(temps) == 1 and temps[0].exists() and temps[0].stat().st_size > 4096
    with pytest.raises(ValueError):
        json.loads(temps[0].read_text())  # truncated: it must never be read as a chunk
    assert store.names() == ["run001-rank0000-00000.json", "run001-rank0000-00001.json"]
    assert sorted(merge_chunks(store.read_all()).image_ids) == [7, 8]
    assert store.check(manifest, resume=True) == 2
    store.begin(manifest, 2, resume=True)  # a resumed run clears what killed writers left
    assert not temps[0].exists()
    assert sorted(os.listdir(folder)) == ["manifest.json", "run001-rank0000-00000.json", "run001-rank0000-00001.json"]


def test_remove_temp_files_takes_only_temp_files(tmp_path):
    keep = ["results.json", ".hidden", "a.tmp", ".x.json.12.zz.tmp", "run001-rank0000-00000.json"]
    for name in keep:
        (tmp_path / name).write_text("{}")
    left = fileio._temp_name()  # what a writer killed inside atomic_open leaves
    (tmp_path / left).write_text("[")
    assert remove_temp_files(str(tmp_path)) == [left]
    assert sorted(os.listdir(tmp_path)) == sorted(keep)
    assert remove_temp_files(str(tmp_path / "absent")) == []
