"""Acceptance: minidet on a torchvision checkpoint == torchvision itself.

The reference model is built by torchvision (v1 as for its COCO_V1 weights: FrozenBN with
eps 0; v2: BatchNorm), with randomized norm statistics; its ``state_dict`` is saved (v1 in
the published legacy key layout) and run by both implementations on three images of
different sizes in one batch.
"""

import pytest
import torch

import minidet
from tvref import IMAGE_SHAPES, build_tv, images_bgr, legacy_v1_state_dict, match_detections, run_tv

MIN_SIZE, MAX_SIZE = 320, 512
CONFIGS = {1: "configs/torchvision/maskrcnn_resnet50_fpn.yaml", 2: "configs/torchvision/maskrcnn_resnet50_fpn_v2.yaml"}


@pytest.fixture(scope="module", params=[1, 2], ids=["v1", "v2"])
def reference(request, tmp_path_factory):
    version = request.param
    model = build_tv(version, MIN_SIZE, MAX_SIZE)
    imgs = images_bgr()
    ref = run_tv(model, imgs)
    sd = model.state_dict()
    if version == 1:
        sd = legacy_v1_state_dict(sd)
        assert "rpn.head.conv.weight" in sd and "roi_heads.mask_head.mask_fcn1.weight" in sd
    path = tmp_path_factory.mktemp(f"tv{version}") / "model.pth"
    torch.save(sd, path)
    return version, str(path), imgs, ref


def _predictor(version, path, **overrides):
    cfg = minidet.get_cfg()
    cfg.merge_from_file(CONFIGS[version])
    opts = ["MODEL.WEIGHTS", path, "INPUT.MIN_SIZE_TEST", MIN_SIZE, "INPUT.MAX_SIZE_TEST", MAX_SIZE]
    for k, v in overrides.items():
        opts += [k, v]
    cfg.merge_from_list(opts)
    return minidet.Predictor(cfg)


@pytest.mark.slow
@pytest.mark.parametrize(
    "norm,fold,channels_last,roi_align",
    [
        ("FrozenBN", False, False, "torchvision"),
        ("FrozenBN", False, False, "gather"),
        ("Affine", False, False, "gather"),
        ("FrozenBN", True, False, "gather"),
        ("Affine", True, True, "gather"),
    ],
)
def test_same_detections_as_torchvision(reference, norm, fold, channels_last, roi_align):
    version, path, imgs, ref = reference
    opts = {
        "MODEL.NORM": norm,
        "MODEL.FOLD_NORM": fold,
        "MODEL.CHANNELS_LAST": channels_last,
        "MODEL.ROI_ALIGN_IMPL": roi_align,
    }
    predictor = _predictor(version, path, **opts)
    assert not predictor.load_report.missing and not predictor.load_report.unexpected
    outs = predictor.predict_batch(imgs)
    assert len(outs) == len(IMAGE_SHAPES)
    for out, r, (h, w) in zip(outs, ref, IMAGE_SHAPES):
        assert len(r["boxes"]) > 20, "the reference should detect plenty"
        assert out["masks"].shape[1:] == (h, w) and out["masks"].dtype == torch.bool
        assert out["boxes"].dtype == torch.float32 and out["labels"].dtype == torch.int64
        assert torch.equal(out["category_ids"], out["labels"])  # coco91: index == COCO id
        match_detections(out, r)
        if norm == "FrozenBN" and not fold and not channels_last and roi_align == "torchvision" and version == 1:
            # same op sequence as torchvision (FrozenBatchNorm2d, its RoIAlign; the fused convs of
            # FPN, RPN and mask head run the same oneDNN kernel): bit-identical
            assert torch.equal(out["boxes"], r["boxes"]) and torch.equal(out["scores"], r["scores"])


@pytest.mark.slow
@pytest.mark.parametrize("reference", [1], indirect=True, ids=["v1"])
def test_v1_current_key_layout_loads_the_same(reference, tmp_path):
    """The published v1 file uses the legacy layout; the current layout must give the same."""
    version, path, imgs, ref = reference
    sd = torch.load(path, weights_only=True)
    current = tmp_path / "current.pth"
    tv = build_tv(1, MIN_SIZE, MAX_SIZE)
    tv.load_state_dict(sd)  # torchvision's own version hooks accept the legacy layout
    torch.save(tv.state_dict(), current)
    assert "rpn.head.conv.0.0.weight" in torch.load(current, weights_only=True)
    outs = _predictor(1, str(current), **{"MODEL.ROI_ALIGN_IMPL": "torchvision"}).predict_batch(imgs)
    for out, r in zip(outs, ref):
        assert torch.equal(out["boxes"], r["boxes"]) and torch.equal(out["scores"], r["scores"])


def test_torchvision_configs_pin_eps():
    for version, eps in ((1, 0.0), (2, 1e-5)):
        cfg = minidet.get_cfg()
        cfg.merge_from_file(CONFIGS[version])
        assert cfg.MODEL.FROZEN_BN_EPS == eps
