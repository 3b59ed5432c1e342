"""Predictor API, batches, stage timing, GN models, input checks."""

import numpy as np
import pytest
import torch

import minidet
from helpers import config
from minidet.apps.synthetic import structured_image
from minidet.timing import STAGES, StageTimer, format_table, summarize

SIZE = ["INPUT.MIN_SIZE_TEST", 224, "INPUT.MAX_SIZE_TEST", 320]


@pytest.fixture(scope="module")
def weights(tv_file):
    """torchvision's initial weights with confident classes (conftest.py), as a str path."""
    return str(tv_file)


def _predictor(weights, *opts):
    return minidet.Predictor(config("configs/torchvision/maskrcnn_resnet50_fpn.yaml", *SIZE, *opts, weights=weights))


@pytest.mark.slow
def test_outputs_and_timings(weights):
    p = _predictor(weights)
    img = structured_image(150, 210, 3)
    out = p(img)
    n = len(out["boxes"])
    assert n > 0
    assert out["boxes"].shape == (n, 4) and out["boxes"].dtype == torch.float32
    assert out["scores"].shape == (n,) and out["labels"].dtype == torch.int64
    assert out["category_ids"].dtype == torch.int64 and out["masks"].shape == (n, 150, 210)
    assert out["masks"].dtype == torch.bool
    assert (out["boxes"][:, 2] <= 210).all() and (out["boxes"][:, 3] <= 150).all()
    assert set(out["timings"]) == set(STAGES) and all(v > 0 for v in out["timings"].values())
    assert torch.all(out["scores"][:-1] >= out["scores"][1:])
    assert p.class_names[1] == "person"
    table = format_table(summarize([out["timings"]] * 3))
    assert "backbone" in table and "total" in table


@pytest.mark.slow
def test_batch_equals_its_members_when_padding_matches(weights):
    """Images of the same size give the same result alone and in a batch."""
    p = _predictor(weights)
    a, b = structured_image(160, 200, 1), structured_image(160, 200, 2)
    batch = p.predict_batch([a, b])
    for img, got in zip((a, b), batch):
        single = p(img)
        torch.testing.assert_close(got["boxes"], single["boxes"], atol=1e-3, rtol=0)
        assert torch.equal(got["labels"], single["labels"])


@pytest.mark.slow
def test_timing_off_records_nothing(weights):
    p = _predictor(weights, "TEST.TIMING", False)
    assert p(structured_image(100, 120, 0))["timings"] == {}
    t = StageTimer(enabled=False)
    assert t.stage("a") is t.stage("b")  # one shared no-op context: no clock, no sync


@pytest.mark.slow
def test_no_mask_head(weights):
    p = _predictor(weights, "MODEL.MASK_ON", False)
    out = p(structured_image(100, 120, 0))
    assert "masks" not in out and "mask_head" not in out["timings"]


@pytest.mark.slow
@pytest.mark.parametrize("bad", [np.zeros((10, 10), np.uint8), np.zeros((10, 10, 3), np.float32), "img.jpg"])
def test_bad_input_is_a_clear_error(weights, bad):
    p = _predictor(weights)
    with pytest.raises(ValueError, match="HxWx3 uint8 BGR"):
        p(bad)


@pytest.mark.slow
def test_groupnorm_model_runs():
    """MODEL.NORM GN builds GroupNorm everywhere the architecture normalizes."""
    cfg = config("configs/torchvision/maskrcnn_resnet50_fpn_v2.yaml", "MODEL.NORM", "GN", *SIZE, weights="none")
    model, _ = minidet.prepare_model(cfg)
    gns = [m for m in model.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert model.fpn.lateral2.norm in gns and model.box_head.conv1.norm in gns
    assert model.mask_head.mask_fcn1.norm in gns and model.backbone.stem.conv1.norm in gns
    assert all(m.num_groups == 32 for m in gns)
    out = model([structured_image(100, 130, 0)])[0]
    assert out["boxes"].shape[1] == 4


@pytest.mark.slow
def test_rgb_and_bgr_networks_see_the_same_pixels(weights):
    """INPUT.FORMAT decides the channel order the network gets; input is always BGR."""
    p = _predictor(weights)
    img = structured_image(120, 160, 5)
    batch, _, _, _ = p.model.preprocess([img])
    ref = torch.from_numpy(img[:, :, ::-1].copy()).permute(2, 0, 1).float() / 255
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    ref = torch.nn.functional.interpolate(
        ((ref - mean) / std)[None],
        scale_factor=224 / 120,
        mode="bilinear",
        recompute_scale_factor=True,
        align_corners=False,
    )[0]
    assert torch.equal(batch[0, :, : ref.shape[1], : ref.shape[2]], ref)


@pytest.mark.slow
def test_amp_bf16_runs_and_is_measured_against_fp32(weights):
    """Autocast is opt-in (TEST.AMP); box arithmetic stays float32, outputs keep their dtypes. bf16 without the
    CPU's bf16 instructions is slow, and neither the size nor the count of detections is what this test is about:
    short side 128 (a third of SIZE's pixels), 100 proposals and 10 detections (the mask head's 4 convs on 100
    crops of 14 x 14 cost more than the backbone at this size)."""
    img = structured_image(150, 210, 3)
    small = ["INPUT.MIN_SIZE_TEST", 128, "INPUT.MAX_SIZE_TEST", 192, "MODEL.RPN.POST_NMS_TOPK_TEST", 100,
             "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", 10]
    p32, p16 = _predictor(weights, *small), _predictor(weights, *small, "TEST.AMP", "bf16")
    ref, out = p32(img), p16(img)
    assert out["boxes"].dtype == torch.float32 and out["scores"].dtype == torch.float32
    assert out["masks"].dtype == torch.bool and len(out["boxes"]) > 0
    # the network layers run in bf16 and stay close to float32 (about 1% here). Which detections
    # survive is not compared: these default-initialized weights rank many boxes almost equally,
    # so bf16 rounding reorders them (how much depends on the CPU's bf16 kernels)
    feats = []
    for p in (p32, p16):
        batch = p.model.preprocess([img])[0]
        with torch.inference_mode(), p.model._amp():
            feats.append(p.model.fpn(p.model.backbone(batch)))
    for level, f32 in feats[0].items():
        bf16 = feats[1][level]
        assert f32.dtype == torch.float32 and bf16.dtype == torch.bfloat16, level
        assert float((bf16.float() - f32).norm() / f32.norm()) < 0.05, level
    assert len(ref["boxes"]) > 0
    with pytest.raises(minidet.ConfigError, match="TEST.AMP"):
        _predictor(weights, "TEST.AMP", "int8")
