"""Acceptance: minidet on a torchvision checkpoint == torchvision itself.

The reference model is built by torchvision (v1 as for its COCO_V1 weights: FrozenBN with
eps 0; v2: BatchNorm), with randomized norm statistics; its ``state_dict`` is saved (v1 in
the published legacy key layout) and run by both implementations on three images of
different sizes in one batch. The detections are the same when they agree within the
tolerances of ``minidet.apps.compare``, or differ no more than torchvision's own do when
its model runs in channels-last (another float summation order), as the benchmark judges them.
The cases whose subject is a float-order option (the norm's form, folding, channels-last, the
gather RoIAlign, oneDNN linears) run both sides at 300 proposals and 30 detections an image
(tests/helpers.py: FEWER); the plain case, bit for bit, and the whole batch with torchvision's
ties at its caps, 1000 and 100.
"""

import pytest
import torch

import minidet
from helpers import DETECTIONS, FEWER, IMAGE_SHAPES, PROPOSALS, config, images_bgr
from minidet.apps.bench.reference import build_tv, legacy_v1_state_dict, run_tv, to_tv_input
from minidet.apps.compare import assert_same_detections

MIN_SIZE, MAX_SIZE = 320, 512
CONFIGS = {1: "configs/torchvision/maskrcnn_resnet50_fpn.yaml", 2: "configs/torchvision/maskrcnn_resnet50_fpn_v2.yaml"}


# each version's tests in one process of the parallel part (pytest-xdist's loadgroup): its reference is run once
@pytest.fixture(scope="module", ids=["v1", "v2"],
                params=[pytest.param(v, marks=pytest.mark.xdist_group(f"parity_tv{v}")) for v in (1, 2)])
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
    reordered = run_tv(model.to(memory_format=torch.channels_last), imgs)  # torchvision's own float-order change
    model.rpn._post_nms_top_n["testing"], model.roi_heads.detections_per_img = PROPOSALS, DETECTIONS  # FEWER's caps
    fewer = (run_tv(model.to(memory_format=torch.contiguous_format), imgs),
             run_tv(model.to(memory_format=torch.channels_last), imgs))
    return version, str(path), imgs, ref, reordered, fewer


def _predictor(version, path, **overrides):
    opts = [x for kv in overrides.items() for x in kv]
    size = ["INPUT.MIN_SIZE_TEST", MIN_SIZE, "INPUT.MAX_SIZE_TEST", MAX_SIZE]
    return minidet.Predictor(config(CONFIGS[version], *size, *opts, weights=path))


# the cases at torchvision's caps (1000 proposals, 100 detections): the plain one (bit for bit on v1) and the whole
# batch in one run with torchvision's tie order; the others' subject is a float-order option: at FEWER's caps
AT_CAPS = {("FrozenBN", False, False, "torchvision", 0, False, False),
           ("FrozenBN", False, False, "torchvision", 3, True, False)}
FEWER_OPTS = dict(zip(FEWER[::2], FEWER[1::2]))  # FEWER as _predictor's overrides


@pytest.mark.slow
@pytest.mark.parametrize(
    "norm,fold,channels_last,roi_align,chunk,tv_ties,fuse_linear",
    [
        ("FrozenBN", False, False, "torchvision", 0, False, False),  # chunk 0: automatic, one image at a time on CPU
        ("FrozenBN", False, False, "torchvision", 3, True, False),  # the whole batch in one run; torchvision's ties
        ("FrozenBN", False, False, "gather", 0, False, False),
        ("Affine", False, False, "gather", 0, False, False),
        ("FrozenBN", True, False, "gather", 0, False, False),
        ("Affine", True, True, "gather", 2, False, False),  # the _fast configs
        ("FrozenBN", False, False, "gather", 0, False, True),  # oneDNN linears, the selected class's mask
    ],
)
def test_same_detections_as_torchvision(reference, norm, fold, channels_last, roi_align, chunk, tv_ties, fuse_linear):
    version, path, imgs, ref, reordered, fewer = reference
    at_caps = (norm, fold, channels_last, roi_align, chunk, tv_ties, fuse_linear) in AT_CAPS
    if not at_caps:
        ref, reordered = fewer
    opts = {
        "MODEL.NORM": norm,
        "MODEL.FOLD_NORM": fold,
        "MODEL.CHANNELS_LAST": channels_last,
        "MODEL.ROI_ALIGN_IMPL": roi_align,
        "TEST.CHUNK_IMAGES": chunk,
        "MODEL.RPN.TORCHVISION_TIE_ORDER": tv_ties,
        "MODEL.FUSE_LINEAR": fuse_linear,
        **({} if at_caps else FEWER_OPTS),
    }
    predictor = _predictor(version, path, **opts)
    assert not predictor.load_report.missing and not predictor.load_report.unexpected
    outs = predictor.predict_batch(imgs)
    assert len(outs) == len(IMAGE_SHAPES)
    for out, r, r_cl, (h, w) in zip(outs, ref, reordered, IMAGE_SHAPES):
        assert len(r["boxes"]) > (20 if at_caps else DETECTIONS - 1), "the reference should detect plenty"
        assert out["masks"].shape[1:] == (h, w) and out["masks"].dtype == torch.bool
        assert out["boxes"].dtype == torch.float32 and out["labels"].dtype == torch.int64
        assert torch.equal(out["category_ids"], out["labels"])  # coco91: index == COCO id
        assert_same_detections(out, r, r_cl)
        if norm == "FrozenBN" and not fold and not channels_last and roi_align == "torchvision" and version == 1:
            # same op sequence as torchvision (FrozenBatchNorm2d, its RoIAlign; the fused convs of
            # FPN, RPN and mask head run the same oneDNN kernel): bit-identical
            assert torch.equal(out["boxes"], r["boxes"]) and torch.equal(out["scores"], r["scores"])


@pytest.mark.slow
@pytest.mark.xdist_group("parity_tv1")
@pytest.mark.parametrize("reference", [1], indirect=True, ids=["v1"])
def test_v1_current_key_layout_loads_the_same(reference, tmp_path):
    """The published v1 file uses the legacy layout; the current layout must give the same."""
    version, path, imgs, _, _, (ref, _) = reference  # the key layout is the subject, not the caps: FEWER's
    sd = torch.load(path, weights_only=True)
    current = tmp_path / "current.pth"
    tv = build_tv(1, MIN_SIZE, MAX_SIZE)
    tv.load_state_dict(sd)  # torchvision's own version hooks accept the legacy layout
    torch.save(tv.state_dict(), current)
    assert "rpn.head.conv.0.0.weight" in torch.load(current, weights_only=True)
    outs = _predictor(1, str(current), **{"MODEL.ROI_ALIGN_IMPL": "torchvision", **FEWER_OPTS}).predict_batch(imgs)
    for out, r in zip(outs, ref):
        assert torch.equal(out["boxes"], r["boxes"]) and torch.equal(out["scores"], r["scores"])


def test_torchvision_configs_pin_eps():
    for version, eps in ((1, 0.0), (2, 1e-5)):
        assert config(CONFIGS[version]).MODEL.FROZEN_BN_EPS == eps


@pytest.mark.slow
def test_torchvision_detections_do_not_depend_on_proposal_order():
    """Why ``MODEL.RPN.TORCHVISION_TIE_ORDER`` can be off: torchvision's own box and mask heads
    give the same detections (boxes, scores, labels, masks: bit for bit) for its proposals in any
    order, so the order of proposals of equal objectness changes nothing."""
    model = build_tv(1, MIN_SIZE, MAX_SIZE)
    images = [to_tv_input(im) for im in images_bgr()]
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        batch, _ = model.transform(images)
        features = model.backbone(batch.tensors)
        proposals, _ = model.rpn(batch, features)
        shuffled = [p[torch.randperm(len(p), generator=gen)] for p in proposals]
        outs = []
        for props in (proposals, shuffled):
            dets, _ = model.roi_heads(features, props, batch.image_sizes)
            outs.append(model.transform.postprocess(dets, batch.image_sizes, [im.shape[-2:] for im in images]))
    for a, b in zip(*outs):
        assert len(a["boxes"]) > 20
        assert not bool((a["scores"][1:] == a["scores"][:-1]).any())  # no equal scores: one order
        for key in ("boxes", "scores", "labels", "masks"):
            assert torch.equal(a[key], b[key]), key
