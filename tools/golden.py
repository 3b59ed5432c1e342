"""Golden outputs: save every detection of a fixed set of cases, then check a later commit gives the same bits.

Usage::

    python tools/golden.py save DIR [--programs]    # on the commit before a change (e.g. in a `git worktree`)
    python tools/golden.py check DIR [--programs]   # on the changed tree: every tensor must be torch.equal

``--programs`` adds the programs' outputs, compared byte for byte: ``minidet infer`` on five pictures and a file
that is no image with ``TEST.IMS_PER_BATCH 2`` (drawings, per-image records, ``--results`` as ``.jsonl`` and as
COCO ``.json``), the same run through ``--engine ray`` with 2 actors (a local Ray instance; needs the ray extra),
``minidet eval`` on six coco_tiny images (results, metrics, images lists; ``../shared/data`` beside the checkout),
and an infer run killed (SIGKILL) after its first chunk, then resumed. The programs run as ``python -c`` of
``minidet.apps.cli`` under this interpreter with one thread, so that ``PYTHONPATH=<worktree>/src`` runs a
worktree's code.

``GOLDEN_THREADS`` (default 1) sets torch's intra-op threads for ``save``; ``check`` runs with the
thread count the outputs were saved with (float sums depend on it).

``--only PATTERN[,PATTERN...]`` runs only the cases whose names match one of the ``fnmatch`` patterns (``save``
then records the outputs of those cases alone, beside what the folder holds; ``check`` lists the others as
skipped), e.g. ``--only 'd2_*,mmdet_*'``.

``save`` writes the checkpoints (a torchvision v1 file in the published key layout, a v2 file, synthetic
Detectron R-50-FPN BN and GN pickles, a synthetic detectron2 pickle, a maskrcnn-benchmark training file, an
mmdetection file; and one file per architecture below, in the real format its family loads: detectron2's pickle of
numpy arrays under ``model``, mmdetection's ``{"meta", "state_dict"}``), the input images and, per case, the
complete outputs (boxes, scores, labels, category ids, masks per image, and ``box_scores`` where the model has a mask
IoU head) into ``DIR`` (a family's file only when it is not there yet). ``check`` runs the same cases on the same
files and compares; the cases of a family added after ``DIR`` was saved are listed as not saved. The first families
(the plain Mask R-CNN of each source) run with FrozenBN, Affine and Affine + FOLD_NORM + CHANNELS_LAST (GN and GN +
CHANNELS_LAST for the GN file); every other architecture minidet runs has its own family, under the shipped config of
its zoo file, with the config's own norm (``default``) and, where it has batch norms, Affine + FOLD_NORM +
CHANNELS_LAST:

- ``d2_cascade`` / ``mmdet_cascade``: Cascade Mask R-CNN in detectron2's rule (one mask head on the last stage's
  boxes, mean class scores) and in mmdetection's (a mask head per stage, their mean logits), 3 stages, R-50;
- ``d2_dconv`` / ``mmdet_dconv``: deformable convolution v1 in res3..res5 (detectron2's and mmdetection's dconv);
- ``mmdet_mdconv``: modulated deformable convolution (v2, mmdetection's mdconv);
- ``mmdet_regnetx`` / ``d2_regnetx`` / ``d2_regnety``: RegNet bodies: mmdetection's RegNetX-400MF, detectron2's
  RegNetX-4GF and RegNetY-4GF (squeeze-and-excitation) LSJ baselines (SyncBN, 4conv1fc heads, two RPN convs);
- ``mmdet_gcb``: GC blocks (mmcv's ``ContextBlock``, ratio 1/16) after conv3 in res3..res5;
- ``mmdet_ms``: Mask Scoring R-CNN (caffe-style R-50; its outputs carry ``box_scores``, compared too);
- ``d2_panoptic`` / ``mmdet_panoptic``: Panoptic FPN's instance half (each file with its semantic head, which
  minidet sets aside; mmdetection's under its panoptic test settings);
- ``mmdet_gn_ws``: GroupNorm + weight standardization everywhere (mmdetection's gn+ws, GN and GN + CHANNELS_LAST);
- ``mmdet_lvis``: an LVIS v1 file of 1203 classes (named in its meta), score threshold 0.0001, 300 detections.

Each case runs on one image and on a 3-image batch with ``TEST.CHUNK_IMAGES`` 0 and 3. The saved outputs compare
two commits; they are never committed as expected values. ``save`` builds the checkpoints with ``minidet.testing``
(for a commit before it existed, use this file as of commit 45e20a9, which built them with the test helpers of that
time; the architecture families need the ``minidet.testing`` of commit 82c3267 or later).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import pickle
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
try:
    import minidet
except ImportError:  # a source checkout that is not installed: the package is in src/
    sys.path.insert(0, str(ROOT / "src"))
    import minidet

CONFIGS = ROOT / "configs"
SIZE = ["INPUT.MIN_SIZE_TEST", 320, "INPUT.MAX_SIZE_TEST", 512]
FAST = ["MODEL.NORM", "Affine", "MODEL.FOLD_NORM", True, "MODEL.CHANNELS_LAST", True]
BN_VARIANTS = {"FrozenBN": ["MODEL.NORM", "FrozenBN"], "Affine": ["MODEL.NORM", "Affine"], "Affine+fold+cl": FAST}
GN_VARIANTS = {"GN": [], "GN+cl": ["MODEL.CHANNELS_LAST", True]}
# the architecture families: the config's own norm, and the fast variant where it has batch norms
ARCH_BN = {"default": [], "Affine+fold+cl": FAST}
ARCH_GN = {"default": [], "GN+cl": ["MODEL.CHANNELS_LAST", True]}
# family: (config, checkpoint file in DIR, norm variants)
FAMILIES = {
    "tv_v1": ("torchvision/maskrcnn_resnet50_fpn.yaml", "tv_v1_legacy.pth", BN_VARIANTS),
    "tv_v2": ("torchvision/maskrcnn_resnet50_fpn_v2.yaml", "tv_v2.pth", BN_VARIANTS),
    "detectron_bn": ("detectron/e2e_mask_rcnn_R-50-FPN_1x.yaml", "detectron_R-50-FPN.pkl", BN_VARIANTS),
    "detectron_gn": ("detectron/e2e_mask_rcnn_R-50-FPN_2x_gn.yaml", "detectron_R-50-FPN_gn.pkl", GN_VARIANTS),
    "detectron2": ("detectron2/mask_rcnn_R_50_FPN_3x.yaml", "detectron2_R_50.pkl", BN_VARIANTS),
    "mb": ("maskrcnn_benchmark/e2e_mask_rcnn_R_50_FPN_1x.yaml", "maskrcnn_benchmark_R_50.pth", BN_VARIANTS),
    "mmdet": ("mmdetection/mask-rcnn_r50_fpn_1x_coco.yaml", "mmdetection_r50.pth", BN_VARIANTS),
    # fine-tuned on its own 3 classes, its names in its meta
    "mmdet_own": ("mmdetection/mask-rcnn_r50_fpn_1x_coco.yaml", "mmdetection_r50_own.pth", BN_VARIANTS),
    # every other architecture minidet runs, each under the shipped config of its zoo file
    "d2_cascade": ("detectron2/cascade_mask_rcnn_R_50_FPN_1x.yaml", "detectron2_cascade_R_50.pkl", ARCH_BN),
    "mmdet_cascade": ("mmdetection/cascade-mask-rcnn_r50_fpn_1x_coco.yaml", "mmdetection_cascade_r50.pth", ARCH_BN),
    "d2_dconv": ("detectron2/mask_rcnn_R_50_FPN_1x_dconv_c3-c5.yaml", "detectron2_dconv_R_50.pkl", ARCH_BN),
    "mmdet_dconv": ("mmdetection/mask-rcnn_r50-dconv-c3-c5_fpn_1x_coco.yaml", "mmdetection_dconv_r50.pth", ARCH_BN),
    "mmdet_mdconv": ("mmdetection/mask-rcnn_r50-mdconv-c3-c5_fpn_1x_coco.yaml", "mmdetection_mdconv_r50.pth",
                     ARCH_BN),
    "mmdet_regnetx": ("mmdetection/mask-rcnn_regnetx-400MF_fpn_ms-poly-3x_coco.yaml", "mmdetection_regnetx_400mf.pth",
                      ARCH_BN),
    "d2_regnetx": ("detectron2/mask_rcnn_regnetx_4gf_dds_FPN_100ep_LSJ.yaml", "detectron2_regnetx_4gf.pkl", ARCH_BN),
    "d2_regnety": ("detectron2/mask_rcnn_regnety_4gf_dds_FPN_100ep_LSJ.yaml", "detectron2_regnety_4gf.pkl", ARCH_BN),
    "mmdet_gcb": ("mmdetection/mask-rcnn_r50-gcb-r16-c3-c5_fpn_1x_coco.yaml", "mmdetection_gcb_r16_r50.pth", ARCH_BN),
    "mmdet_ms": ("mmdetection/ms-rcnn_r50-caffe_fpn_1x_coco.yaml", "mmdetection_ms_rcnn_r50_caffe.pth", ARCH_BN),
    "d2_panoptic": ("detectron2/panoptic_fpn_R_50_1x.yaml", "detectron2_panoptic_fpn_R_50.pkl", ARCH_BN),
    "mmdet_panoptic": ("mmdetection/panoptic-fpn_r50_fpn_1x_coco.yaml", "mmdetection_panoptic_fpn_r50.pth", ARCH_BN),
    "mmdet_gn_ws": ("mmdetection/mask-rcnn_r50_fpn_gn-ws-all_2x_coco.yaml", "mmdetection_gn_ws_r50.pth", ARCH_GN),
    "mmdet_lvis": ("mmdetection/mask-rcnn_r50_fpn_sample1e-3_ms-1x_lvis-v1.yaml", "mmdetection_lvis_v1_r50.pth",
                   ARCH_BN),
}
OWN_CLASSES = ("cell", "nucleus", "debris")
# batch: (indices of the input images, TEST.CHUNK_IMAGES)
BATCHES = {"b1": ([0], 0), "b3_chunk0": ([0, 1, 2], 0), "b3_chunk3": ([0, 1, 2], 3)}
IMAGE_SHAPES = [(240, 320), (300, 200), (180, 420)]
# compared where a case's outputs have them (box_scores: a mask IoU head's; the folders saved before it have none)
KEYS = ("boxes", "scores", "labels", "category_ids", "masks", "box_scores")


def _write_d2(path: Path) -> None:
    from minidet.testing.checkpoints import d2_weights

    with open(path, "wb") as f:
        pickle.dump({"model": d2_weights(50, seed=4), "__author__": "golden"}, f)


def _write_d2_model(path: Path, weights: dict) -> None:
    """A detectron2 model-zoo ``.pkl``: numpy arrays under ``model``."""
    with open(path, "wb") as f:
        pickle.dump({"model": weights, "__author__": "golden"}, f)


# detectron2's new baselines (LSJ): SyncBN with its counters everywhere, the FPN's and the 4conv1fc heads' norms, two
# RPN convs; their RegNet bodies (regnet_body's parameters)
D2_LSJ = {"fpn_norm": True, "head_norm": True, "box_convs": 4, "rpn_convs": 2, "counters": True}
D2_REGNETS = {"d2_regnetx": {"depth": 23, "w_a": 38.65, "w_0": 96, "w_m": 2.43, "group_width": 40},
              "d2_regnety": {"depth": 22, "w_a": 31.41, "w_0": 96, "w_m": 2.24, "group_width": 64, "se_ratio": 0.25}}
# mmdetection's families: mmdet_state_shapes' layout, mmdet_weights' caffe flag, the meta's mmdetection version
MMDET_ARCHS = {
    "mmdet_cascade": ({"stages": 3}, False, "2.0.0"),
    "mmdet_dconv": ({"dcn": "DCN"}, False, "2.0.0"),
    "mmdet_mdconv": ({"dcn": "DCNv2"}, False, "2.0.0"),
    "mmdet_regnetx": ({"arch": "regnetx_400mf"}, False, "2.0.0"),
    "mmdet_gcb": ({"context": 1 / 16}, False, "2.0.0"),
    "mmdet_ms": ({"mask_iou": True}, True, "2.0.0"),
    "mmdet_panoptic": ({}, False, "2.0.0"),
    "mmdet_gn_ws": ({"norm": "gn", "neck_norm": "gn", "head_norm": "gn", "box_convs": 4}, False, "2.0.0"),
    "mmdet_lvis": ({"num_classes": 1203}, False, "2.0.0"),
}
LVIS_V1_NAMES = tuple(f"lvis_{k}" for k in range(1, 1204))  # LVIS v1's 1203 classes, named by index


def _d2_semantic_head() -> dict[str, tuple]:
    """detectron2's Panoptic FPN semantic head (``SemSegFPNHead``): per level p2..p5 its 3x3 convs of 128 with
    GroupNorm (1, 1, 2, 3 of them, an upsampling after each where the level is coarser than 1/4), a 1x1 predictor of
    53 stuff classes + 1."""
    out = {}
    for lvl, n in zip(range(2, 6), (1, 1, 2, 3)):
        for j in range(n):
            pre = f"sem_seg_head.p{lvl}.{2 * j if lvl > 2 else 0}"
            out[f"{pre}.weight"] = (128, 256 if j == 0 else 128, 3, 3)
            out[f"{pre}.norm.weight"] = out[f"{pre}.norm.bias"] = (128,)
    out["sem_seg_head.predictor.weight"], out["sem_seg_head.predictor.bias"] = (54, 128, 1, 1), (54,)
    return out


def _mmdet_semantic_head() -> dict[str, tuple]:
    """mmdetection's Panoptic FPN semantic head (``PanopticFPNHead``): per level a ``ConvUpsample`` of 1, 1, 2, 3
    ConvModules (3x3 to 128, GroupNorm), ``conv_logits`` to 53 stuff classes + 1."""
    out = {}
    for i, n in enumerate((1, 1, 2, 3)):
        for j in range(n):
            pre = f"semantic_head.conv_upsample_layers.{i}.conv.{j}"
            out[f"{pre}.conv.weight"] = (128, 256 if j == 0 else 128, 3, 3)
            out[f"{pre}.gn.weight"] = out[f"{pre}.gn.bias"] = (128,)
    out["semantic_head.conv_logits.weight"], out["semantic_head.conv_logits.bias"] = (54, 128, 1, 1), (54,)
    return out


def _arch_writers() -> dict:
    """The architecture families' writers: family -> function(path), realistic random weights of fixed seeds (random
    norm statistics, deformable offsets of about a pixel, GC context terms and SE gates that count, spread mask IoUs:
    ``minidet.testing``'s values), in the real format of the family's zoo files."""
    from minidet.testing.checkpoints import d2_random_weights, d2_state_shapes, d2_weights
    from minidet.testing.mmdet import (
        COCO_CLASSES,
        mmdet_meta,
        mmdet_state_shapes,
        mmdet_weights,
        write_mmdet_checkpoint,
    )

    def d2(seed: int, **layout):
        return lambda p: _write_d2_model(p, d2_weights(50, seed=seed, **layout))

    def d2_regnet(family: str, seed: int):  # the stem takes pixels over their std; normalized heads: wide logits
        shapes = d2_state_shapes(0, regnet=D2_REGNETS[family], **D2_LSJ)
        return lambda p: _write_d2_model(p, d2_random_weights(shapes, seed=seed, normalized_input=True, spread=10.0))

    def d2_panoptic(p: Path) -> None:
        weights = d2_weights(50, seed=24)
        weights.update(d2_random_weights(_d2_semantic_head(), seed=25))
        _write_d2_model(p, weights)

    def mmdet(family: str, seed: int):
        layout, caffe, version = MMDET_ARCHS[family]

        def write(p: Path) -> None:
            state = mmdet_weights(mmdet_state_shapes(**layout), seed=seed, caffe=caffe)
            classes = COCO_CLASSES
            if family == "mmdet_panoptic":  # 2.x: COCO panoptic's 133 names, its 80 things first
                state.update(mmdet_weights(_mmdet_semantic_head(), seed=seed + 100))
                classes = COCO_CLASSES + tuple(f"stuff_{k}" for k in range(53))
            elif family == "mmdet_lvis":
                classes = LVIS_V1_NAMES
            meta = mmdet_meta(version, classes=classes, style="caffe" if caffe else "pytorch")
            write_mmdet_checkpoint(p, state, meta)
        return write

    return {
        "d2_cascade": d2(11, stages=3),
        "mmdet_cascade": mmdet("mmdet_cascade", 12),
        "d2_dconv": d2(13, deform=True),
        "mmdet_dconv": mmdet("mmdet_dconv", 14),
        "mmdet_mdconv": mmdet("mmdet_mdconv", 15),
        "mmdet_regnetx": mmdet("mmdet_regnetx", 16),
        "d2_regnetx": d2_regnet("d2_regnetx", 17),
        "d2_regnety": d2_regnet("d2_regnety", 18),
        "mmdet_gcb": mmdet("mmdet_gcb", 19),
        "mmdet_ms": mmdet("mmdet_ms", 20),
        "d2_panoptic": d2_panoptic,
        "mmdet_panoptic": mmdet("mmdet_panoptic", 21),
        "mmdet_gn_ws": mmdet("mmdet_gn_ws", 22),
        "mmdet_lvis": mmdet("mmdet_lvis", 23),
    }


def _writers() -> dict:
    """family -> the function that writes its checkpoint to a path (built with ``minidet.testing``)."""
    from minidet.apps.bench.reference import build_tv, legacy_v1_state_dict
    from minidet.testing.checkpoints import (
        make_blobs,
        mb_state_shapes,
        mb_weights,
        write_detectron_pkl,
        write_mb_checkpoint,
    )
    from minidet.testing.mmdet import mmdet_meta, mmdet_state_shapes, mmdet_weights, write_mmdet_checkpoint

    return {
        "tv_v1": lambda p: torch.save(legacy_v1_state_dict(build_tv(1, 320, 512, seed=0).state_dict()), p),
        "tv_v2": lambda p: torch.save(build_tv(2, 320, 512, seed=1).state_dict(), p),
        "detectron_bn": lambda p: write_detectron_pkl(str(p), make_blobs("R-50-FPN", seed=2)),
        "detectron_gn": lambda p: write_detectron_pkl(str(p), make_blobs("R-50-FPN_gn", seed=3)),
        "detectron2": _write_d2,
        "mb": lambda p: write_mb_checkpoint(str(p), mb_weights(mb_state_shapes(50), seed=5)),
        "mmdet": lambda p: write_mmdet_checkpoint(p, mmdet_weights(mmdet_state_shapes(50), seed=6)),
        "mmdet_own": lambda p: write_mmdet_checkpoint(
            p, mmdet_weights(mmdet_state_shapes(50, num_classes=3), seed=7),
            mmdet_meta(classes=OWN_CLASSES)),
        **_arch_writers(),
    }


def write_inputs(folder: Path, families: set[str] | None = None) -> None:
    """The checkpoints (those not in ``folder`` yet; of ``families`` alone when given) and the images of every
    case."""
    import numpy as np

    from minidet.apps.synthetic import structured_image

    for family, write in _writers().items():
        if (families is None or family in families) and not (folder / FAMILIES[family][1]).exists():
            write(folder / FAMILIES[family][1])
    if not (folder / "images.pt").exists():
        images = [np.ascontiguousarray(structured_image(h, w, seed=10 + i)) for i, (h, w) in enumerate(IMAGE_SHAPES)]
        torch.save([torch.from_numpy(im) for im in images], folder / "images.pt")


def run_case(folder: Path, family: str, opts: list, batch: str) -> list[dict[str, torch.Tensor]]:
    config, ckpt, _ = FAMILIES[family]
    indices, chunk = BATCHES[batch]
    cfg = minidet.load_cfg(str(CONFIGS / config),
                           ["MODEL.WEIGHTS", str(folder / ckpt), *SIZE, *opts, "TEST.CHUNK_IMAGES", chunk])
    predictor = minidet.Predictor(cfg)
    images = torch.load(folder / "images.pt")
    with torch.inference_mode():
        outs = predictor.predict_batch([images[i].numpy() for i in indices])
    # masks as the whole (N, H, W) stack (box-cropped ``BoxMasks`` since issue 35): every pixel compared
    return [{k: (o[k].dense() if hasattr(o[k], "dense") else o[k]) for k in KEYS if k in o} for o in outs]


def cases():
    for family, (_, _, variants) in FAMILIES.items():
        for variant, opts in variants.items():
            for batch in BATCHES:
                yield f"{family}.{variant}.{batch}", family, opts, batch


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+changes" if dirty else "")
    except OSError:
        return "?"


def first_difference(saved: list[dict], now: list[dict]) -> str:
    """'' when every tensor is torch.equal, else where the first difference is."""
    if len(saved) != len(now):
        return f"{len(saved)} images saved, {len(now)} now"
    for i, (a, b) in enumerate(zip(saved, now)):
        if sorted(a) != sorted(b):
            return f"image {i}: keys {sorted(a)} saved, {sorted(b)} now"
        for k in KEYS:
            if k in a and not (a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k])):
                return f"image {i}: {k} differs (shape {tuple(a[k].shape)} saved, {tuple(b[k].shape)} now)"
    return ""


# ---------------------------------------------------------------------------------------------- the programs

SHARED = ROOT.parent / "shared" / "data" / "coco_tiny"
PROGRAM_SIZE = ["INPUT.MIN_SIZE_TEST", "160", "INPUT.MAX_SIZE_TEST", "320", "MODEL.RPN.PRE_NMS_TOPK_TEST", "300",
                "MODEL.RPN.POST_NMS_TOPK_TEST", "100", "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "20"]
KEPT = (".json", ".jsonl", ".jpg")  # the outputs compared (timing.json, chunks and locks left out)


def _program_inputs(folder: Path) -> Path:
    """Five pictures of several sizes and one file that is no image, in ``folder/program_inputs``."""
    import cv2

    from minidet.apps.synthetic import structured_image

    inputs = folder / "program_inputs"
    if not inputs.is_dir():
        inputs.mkdir()
        for k, (h, w) in enumerate([(120, 160), (160, 120), (100, 200), (150, 150), (90, 240)]):
            cv2.imwrite(str(inputs / f"img{k}.png"), structured_image(h, w, seed=20 + k))
        (inputs / "img5_broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a JPEG after all" * 4)
    return inputs


def _cli(args: list[str], cwd: Path, kill_after_chunk: Path | None = None) -> subprocess.CompletedProcess:
    """``minidet ARGS`` under this interpreter, one thread (PYTHONPATH as it is: a worktree's src/ runs its code);
    with ``kill_after_chunk``, SIGKILLed as soon as that folder holds a chunk."""
    import signal
    import time

    code = "import sys; from minidet.apps.cli import main; sys.exit(main())"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if kill_after_chunk is not None:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline and not list(kill_after_chunk.glob("run*.json")):
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=1200)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _programs(folder: Path, work: Path) -> dict[str, tuple[Path, int]]:
    """Run every program case into ``work``; case -> (its output folder, exit status)."""
    inputs, ckpt = _program_inputs(folder), str(folder / FAMILIES["tv_v1"][1])
    config = str(CONFIGS / FAMILIES["tv_v1"][0])
    infer = ["infer", "--config-file", config, "--input", str(inputs), "--workers", "1", "MODEL.WEIGHTS", ckpt,
             "TEST.IMS_PER_BATCH", "2", *PROGRAM_SIZE]
    runs: dict[str, tuple[Path, int]] = {}

    def run(case: str, args: list[str], **kw) -> Path:
        out = work / case
        result = _cli([*args[:1], "--output", str(out), *args[1:]], work, **kw)
        runs[case] = (out, result.returncode)
        print(f"ran     {case}: exit status {result.returncode}")
        return out

    run("infer", [*infer[:1], "--results", str(work / "infer" / "all.jsonl"), *infer[1:]])
    run("infer_coco", [*infer[:1], "--no-vis", "--results", str(work / "infer_coco" / "all.json"), *infer[1:]])
    import importlib.util

    if importlib.util.find_spec("ray") is not None:
        run("ray", [*infer[:1], "--engine", "ray", "--actors", "2", "--no-vis", "--results",
                    str(work / "ray" / "all.jsonl"), *infer[1:]])
    if SHARED.is_dir():
        run("eval", ["eval", "--config-file", config, "--ann", str(SHARED / "annotations" / "instances_val2017.json"),
                     "--images", str(SHARED / "val2017"), "--max-images", "6", "--workers", "1",
                     "MODEL.WEIGHTS", ckpt, "TEST.IMS_PER_BATCH", "2", *PROGRAM_SIZE])
    resumed = [*infer[:1], "--chunk-size", "1", "--results", str(work / "resumed" / "all.jsonl"), *infer[1:]]
    run("resumed", resumed, kill_after_chunk=work / "resumed" / ".chunks")
    run("resumed", [*resumed, "--resume"])
    return runs


def _kept_files(out: Path) -> dict[str, bytes]:
    """The outputs of a run that are compared: every record, drawing and results file, by relative path."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.suffix in KEPT and p.name != "timing.json" and ".chunks" not in p.parts
            and "chunks" not in p.relative_to(out).parts[:1]}


def programs(mode: str, folder: Path) -> int:
    """``save``: the program cases' outputs into ``folder/programs``; ``check``: run them again and compare the
    bytes of every kept file. Returns the count of cases that differ."""
    import shutil
    import tempfile

    saved = folder / "programs"
    failed = 0
    with tempfile.TemporaryDirectory(prefix="golden-programs-") as tmp:
        for case, (out, rc) in _programs(folder, Path(tmp)).items():
            files = _kept_files(out) if out.is_dir() else {}
            files["exit-status"] = str(rc).encode()
            if mode == "save":
                target = saved / case
                shutil.rmtree(target, ignore_errors=True)
                for name, data in files.items():
                    (target / name).parent.mkdir(parents=True, exist_ok=True)
                    (target / name).write_bytes(data)
                print(f"saved   programs.{case}: {len(files) - 1} files, exit status {rc}")
                continue
            if not (saved / case).is_dir():
                print(f"not saved programs.{case}")
                continue
            before = _kept_files(saved / case)
            before["exit-status"] = (saved / case / "exit-status").read_bytes()
            diff = sorted(n for n in set(before) | set(files) if before.get(n) != files.get(n))
            failed += bool(diff)
            what = f": {len(diff)} files differ, first {diff[0]}" if diff else ""
            print(f"{'DIFFERS' if diff else 'equal  '} programs.{case}: {len(files) - 1} files{what}")
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="golden.py", description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("save", "check"))
    p.add_argument("dir", type=Path)
    p.add_argument("--programs", action="store_true", help="the programs' outputs too, byte for byte")
    p.add_argument("--programs-only", action="store_true", help="check: the programs' outputs alone")
    p.add_argument("--only", metavar="PATTERN[,PATTERN...]", default="",
                   help="only the cases whose names match one of these fnmatch patterns (e.g. 'mmdet_ms.*')")
    args = p.parse_args(argv)
    only = [pat for pat in args.only.split(",") if pat]
    args.programs = args.programs or args.programs_only
    folder = args.dir
    threads = int(os.environ.get("GOLDEN_THREADS", 1))  # float sums depend on the thread count
    if args.mode == "check" and (folder / "meta.pt").exists():
        threads = torch.load(folder / "meta.pt").get("threads", threads)  # as the outputs were saved
    torch.set_num_threads(threads)
    chosen = [c for c in cases() if not only or any(fnmatch.fnmatchcase(c[0], pat) for pat in only)]
    if args.mode == "save":
        folder.mkdir(parents=True, exist_ok=True)
        needed = {c[1] for c in chosen} | ({"tv_v1"} if args.programs else set())  # the programs run tv_v1's file
        write_inputs(folder, needed if only else None)
    elif not (folder / "meta.pt").exists():
        print(f"error: {folder} holds no saved golden outputs (run `golden.py save {folder}` first)", file=sys.stderr)
        return 2
    failed, n, unsaved, skipped = 0, 0, [], len(list(cases())) - len(chosen)
    for name, family, opts, batch in chosen:
        if args.programs_only and args.mode == "check":
            break
        if args.mode == "check" and not (folder / f"{name}.pt").exists():
            unsaved.append(name)
            print(f"not saved {name}")
            continue
        outs = run_case(folder, family, opts, batch)
        n_det = sum(len(o["scores"]) for o in outs)
        if args.mode == "save":
            torch.save(outs, folder / f"{name}.pt")
            print(f"saved   {name}: {n_det} detections")
        else:
            diff = first_difference(torch.load(folder / f"{name}.pt"), outs)
            failed += bool(diff)
            print(f"{'DIFFERS' if diff else 'equal  '} {name}: {n_det} detections{': ' + diff if diff else ''}")
        n += 1
    failed_programs = programs(args.mode, folder) if args.programs else 0
    if args.mode == "save":
        if (folder / "meta.pt").exists():  # cases saved before (--only) stay, of the thread count recorded then
            before = torch.load(folder / "meta.pt")
            if before.get("threads", threads) != threads:
                print(f"warning: {folder} holds cases saved with {before.get('threads')} threads, these with "
                      f"{threads}; check runs them all with {threads}", file=sys.stderr)
        torch.save({"commit": _commit(), "cases": n, "threads": threads}, folder / "meta.pt")
        print(f"golden: saved {n} cases from commit {_commit()} in {folder}")
        return 0
    saved = torch.load(folder / "meta.pt")
    later = f"; {len(unsaved)} cases not saved in {folder} (families added since)" if unsaved else ""
    later += f"; {skipped} cases left out (--only)" if skipped else ""
    print(f"golden: {n - failed} of {n} cases bit-identical ({saved['commit']} saved, {_commit()} now){later}")
    if args.programs:
        print(f"golden: programs {'the same' if not failed_programs else f'{failed_programs} cases DIFFER'}")
    return 1 if failed or failed_programs else 0


if __name__ == "__main__":
    sys.exit(main())
