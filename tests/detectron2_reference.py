"""detectron2 itself as a test reference: its sources at commit 02b5c4e2 (``../shared/reference/``, as ``git archive``
wrote them; not on the package registry) extracted once per process into a temporary folder and put on
``sys.path``, with the pure-python packages they import from the ``reference`` extra (fvcore, iopath, omegaconf,
...). Its compiled ``detectron2._C`` is not built (a stand-in that fails by name takes its place): Mask R-CNN inference
on CPU calls torchvision's RoIAlign, NMS and (v1) deformable convolution.
Import this module only where the extra is installed and :data:`SOURCES` exists."""

from __future__ import annotations

import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from helpers import compiled_stand_in

SOURCES = Path(__file__).resolve().parents[2] / "shared" / "reference" / "detectron2-02b5c4e2.tar.gz"
_ROOT: Path | None = None


def root() -> Path:
    """The folder holding detectron2's ``detectron2/`` and ``configs/``, extracted on first use and importable."""
    global _ROOT
    if _ROOT is None:
        folder = Path(tempfile.mkdtemp(prefix="detectron2-reference-"))
        with tarfile.open(SOURCES) as tar:
            tar.extractall(folder, filter="data")
        sys.path.insert(0, str(folder))
        _install_compiled_stand_in()
        _ROOT = folder
    return _ROOT


def _install_compiled_stand_in() -> None:
    """A ``detectron2._C`` whose every op fails by name, in place of the unbuilt extension: with it importable,
    ``detectron2.layers.deform_conv`` defines its real ``DeformConv`` (not the dummy that refuses to be built), whose
    CPU forward (v1, one deformable group) is ``torchvision.ops.deform_conv2d``; its modulated (v2) convolution refuses
    CPUs itself. Nothing else on the CPU inference path reaches ``_C``."""
    module = compiled_stand_in("detectron2._C", "detectron2's compiled op {op} is not built here")
    sys.modules.setdefault("detectron2._C", module)


def zoo_config(zoo: str, min_size: int | None = None, max_size: int | None = None, fewer: bool = False):
    """detectron2's config ``configs/<zoo>``: a yaml file through ``get_cfg`` (on CPU; with ``min_size`` and
    ``max_size``, its ``INPUT.MIN_SIZE_TEST`` / ``MAX_SIZE_TEST`` replaced), or a LazyConfig ``.py`` file through
    ``LazyConfig.load`` (with the sizes, its test mapper's ``ResizeShortestEdge`` replaced); ``fewer``: at most
    helpers.PROPOSALS proposals and helpers.DETECTIONS detections an image (minidet's side: helpers.FEWER)."""
    from helpers import DETECTIONS, PROPOSALS

    folder = root()
    if zoo.endswith(".py"):
        from detectron2.config import LazyConfig

        lazy = LazyConfig.load(str(folder / "configs" / zoo))
        if min_size is not None:
            (resize,) = lazy.dataloader.test.mapper.augmentations
            resize.short_edge_length, resize.max_size = min_size, max_size
        if fewer:
            generator = lazy.model.proposal_generator
            generator.post_nms_topk = (generator.post_nms_topk[0], PROPOSALS)
            lazy.model.roi_heads.box_predictor.test_topk_per_image = DETECTIONS
        return lazy
    from detectron2.config import get_cfg

    cfg = get_cfg()
    cfg.merge_from_file(str(folder / "configs" / zoo))
    cfg.MODEL.DEVICE = "cpu"
    if min_size is not None:
        cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST = min_size, max_size
    if fewer:
        cfg.MODEL.RPN.POST_NMS_TOPK_TEST, cfg.TEST.DETECTIONS_PER_IMAGE = PROPOSALS, DETECTIONS
    return cfg


def predictor(cfg, weights: str | Path):
    """detectron2's ``DefaultPredictor`` of the yaml config ``cfg`` with the weights of ``weights`` (its own
    checkpointer); for a LazyConfig, the model it instantiates run as ``DefaultPredictor`` runs one (the test
    mapper's resize on the BGR image, flipped to the model's ``input_format``, float32 CHW)."""
    root()
    from detectron2.checkpoint import DetectionCheckpointer
    from detectron2.config import instantiate
    from detectron2.engine import DefaultPredictor

    if not hasattr(cfg, "clone"):  # a LazyConfig
        model = instantiate(cfg.model).eval()
        DetectionCheckpointer(model).load(str(weights))
        (resize,) = [instantiate(a) for a in cfg.dataloader.test.mapper.augmentations]
        rgb = cfg.model.input_format == "RGB"

        def run(bgr):
            image = resize.get_transform(bgr).apply_image(bgr[:, :, ::-1] if rgb else bgr)
            tensor = torch.as_tensor(image.astype("float32").transpose(2, 0, 1))
            return model([{"image": tensor, "height": bgr.shape[0], "width": bgr.shape[1]}])[0]

        run.model = model  # as DefaultPredictor holds it
        return run
    cfg = cfg.clone()
    cfg.MODEL.WEIGHTS = str(weights)
    return DefaultPredictor(cfg)


def state_shapes(pred) -> dict[str, tuple[int, ...]]:
    """The names and shapes of the state dict of the model ``predictor`` built (detectron2's module tree), without
    the pixel statistics buffers its files do not hold."""
    return {k: tuple(v.shape) for k, v in pred.model.state_dict().items() if not k.startswith("pixel_")}


def detect(pred, bgr) -> dict[str, torch.Tensor]:
    """``DefaultPredictor`` on the uint8 BGR image ``bgr``: boxes, scores, labels, masks (bool) of its instances (a
    Panoptic FPN's instance half)."""
    with torch.no_grad():
        found = pred(bgr)["instances"]
    return {"boxes": found.pred_boxes.tensor, "scores": found.scores, "labels": found.pred_classes,
            "masks": found.pred_masks}
