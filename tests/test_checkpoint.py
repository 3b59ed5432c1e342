"""torchvision key renaming, the strict matcher and its report, safe loading, norm choice."""

import os
import pickle

import pytest
import torch

import minidet
from helpers import config
from minidet.checkpoint import CheckpointError, load_checkpoint
from minidet.families.torchvision import rename as rename_torchvision
from minidet.norm import Affine, FrozenBN
from minidet.readers import read_torch_file
from minidet.testing.checkpoints import REFERENCE


def _cfg(v2=False, **kw):
    path = f"configs/torchvision/maskrcnn_resnet50_fpn{'_v2' if v2 else ''}.yaml"
    return config(path, *(x for kv in kw.items() for x in kv))


def _keys(name):
    path = os.path.join(REFERENCE, name)
    if not os.path.exists(path):
        pytest.skip(f"needs ../shared/reference/{name}")
    keys = []
    for line in open(path):
        parts = line.split()
        if parts and "." in parts[0] and not parts[0].startswith("#"):
            keys.append(parts[0])
    return keys


@pytest.mark.parametrize("v2", [False, True])
def test_every_torchvision_key_maps_to_a_model_parameter(request, v2):
    tv_state = request.getfixturevalue("tv_v2_state_init" if v2 else "tv_state_init")  # torchvision's own keys
    model = minidet.build_model(_cfg(v2))
    own = set(model.state_dict())
    mapped = {rename_torchvision(k) for k in tv_state} - {None}
    assert mapped <= own, sorted(mapped - own)[:5]
    # and nothing of the model is left unfilled (buffers pixel_mean/std are config, not weights)
    assert own - mapped <= {"pixel_mean", "pixel_std"}


def test_reference_key_lists_cover_both_layouts():
    keys = _keys("torchvision_maskrcnn_resnet50_fpn.keys.txt")
    renamed = {rename_torchvision(k) for k in keys}
    assert "rpn.head.convs.0.weight" in renamed and "mask_head.mask_fcn1.weight" in renamed
    assert "fpn.lateral2.weight" in renamed and "fpn.output5.bias" in renamed
    # legacy names from the published COCO_V1 file
    for legacy, ours in [
        ("backbone.fpn.inner_blocks.0.weight", "fpn.lateral2.weight"),
        ("rpn.head.conv.weight", "rpn.head.convs.0.weight"),
        ("roi_heads.mask_head.mask_fcn1.weight", "mask_head.mask_fcn1.weight"),
    ]:
        assert rename_torchvision(legacy) == ours


@pytest.fixture(scope="module")
def tv_stats_file(tmp_path_factory, tv_state_init):
    """(path, state dict): torchvision's initial weights with non-trivial statistics in the stem's norm."""
    gen = torch.Generator().manual_seed(0)
    sd = dict(tv_state_init)
    sd["backbone.body.bn1.running_var"] = torch.empty(64).uniform_(0.5, 2.0, generator=gen)
    sd["backbone.body.bn1.running_mean"] = torch.randn(64, generator=gen)
    path = tmp_path_factory.mktemp("ckpt") / "tv.pth"
    torch.save(sd, path)
    return str(path), sd


@pytest.mark.parametrize("norm,eps", [("FrozenBN", 0.0), ("Affine", 0.0), ("FrozenBN", 1e-5), ("Affine", 1e-5)])
def test_norm_statistics_loaded_with_the_config_eps(tv_stats_file, norm, eps):
    path, sd = tv_stats_file
    model = minidet.build_model(_cfg(**{"MODEL.NORM": norm, "MODEL.FROZEN_BN_EPS": eps}))
    report = load_checkpoint(model, path, bn_eps=eps, convention="torchvision")
    assert not report.missing and not report.unexpected and not report.mismatched
    assert all(k.endswith("num_batches_tracked") for k in report.ignored) and report.ignored
    n = model.backbone.stem.conv1.norm
    w, b = sd["backbone.body.bn1.weight"], sd["backbone.body.bn1.bias"]
    m, v = sd["backbone.body.bn1.running_mean"], sd["backbone.body.bn1.running_var"]
    if norm == "FrozenBN":
        assert isinstance(n, FrozenBN) and n.eps == eps and torch.equal(n.running_var, v)
    else:
        assert isinstance(n, Affine)
        scale = w * (v + eps).rsqrt()
        torch.testing.assert_close(n.scale.view(-1), scale)
        torch.testing.assert_close(n.shift.view(-1), b - m * scale)


@pytest.mark.slow
def test_missing_and_mismatched_are_errors(tv_stats_file, tmp_path):
    path, sd = tv_stats_file
    sd = dict(sd)
    del sd["roi_heads.box_head.fc7.weight"]
    p = tmp_path / "missing.pth"
    torch.save(sd, p)
    model = minidet.build_model(_cfg())
    with pytest.raises(CheckpointError, match=r"missing.pth: 1 model weights not in checkpoint: box_head.fc2.weight"):
        load_checkpoint(model, str(p), 0.0, convention="torchvision")
    report = load_checkpoint(model, str(p), 0.0, allow_missing=True, convention="torchvision")
    assert report.missing == ["box_head.fc2.weight"] and "box_head.fc2.weight" in str(report)

    sd = dict(tv_stats_file[1])
    sd["roi_heads.box_predictor.cls_score.weight"] = torch.zeros(81, 1024)
    p = tmp_path / "shape.pth"
    torch.save(sd, p)
    with pytest.raises(
        CheckpointError, match=r"box_predictor.cls_score.weight: checkpoint \(81, 1024\) vs model \(91, 1024\)"
    ):
        load_checkpoint(minidet.build_model(_cfg()), str(p), 0.0, convention="torchvision")


def test_gn_config_refuses_batchnorm_checkpoint(tv_stats_file):
    path, _ = tv_stats_file
    model = minidet.build_model(_cfg(**{"MODEL.NORM": "GN"}))
    with pytest.raises(CheckpointError, match="batch-norm statistics but MODEL.NORM is GN"):
        load_checkpoint(model, path, 0.0, convention="torchvision")


def test_v1_file_into_v2_config_is_a_clear_error(tv_stats_file):
    path, _ = tv_stats_file
    with pytest.raises(CheckpointError, match="not in checkpoint"):
        load_checkpoint(minidet.build_model(_cfg(v2=True)), path, 1e-5, convention="torchvision")


def test_missing_file_points_to_official_weights(tmp_path):
    with pytest.raises(CheckpointError, match="`minidet weights list` names the official weights"):
        minidet.Predictor(_cfg(**{"MODEL.WEIGHTS": str(tmp_path / "nope.pth")}))


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_code_in_a_checkpoint_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    _Payload.marker = str(marker)
    p = tmp_path / "evil.pth"
    torch.save({"backbone.body.conv1.weight": torch.zeros(1), "x": _Payload()}, p)
    with pytest.raises(CheckpointError, match="evil.pth"):
        read_torch_file(str(p))
    with open(tmp_path / "evil2.pth", "wb") as f:
        pickle.dump(_Payload(), f)
    with pytest.raises(CheckpointError, match="evil2.pth"):
        read_torch_file(str(tmp_path / "evil2.pth"))
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"\x00garbage" * 10, b"PK\x03\x04trunc"])
def test_corrupt_files_one_line_error(tmp_path, content):
    p = tmp_path / "bad.pth"
    p.write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        read_torch_file(str(p))
    assert "bad.pth" in str(e.value) and "\n" not in str(e.value)


def test_unrecognized_layout(tmp_path):
    p = tmp_path / "other.pth"
    torch.save({"features.0.weight": torch.zeros(3)}, p)
    with pytest.raises(CheckpointError, match="unrecognized checkpoint layout"):
        load_checkpoint(minidet.build_model(_cfg()), str(p), 0.0, convention="torchvision")


def test_unrecognized_layout_names_every_family(tmp_path):
    """The refusal of a file no family claims names each family's files (``Family.files``: its zoo's title, and the
    models minidet reads of it where not all)."""
    p = tmp_path / "other.pth"
    torch.save({"features.0.weight": torch.zeros(3)}, p)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(minidet.build_model(_cfg()), str(p), 0.0, convention="torchvision")
    assert str(e.value).endswith(
        "expected a torchvision maskrcnn_resnet50_fpn[_v2], Detectron, detectron2, maskrcnn-benchmark or mmdetection "
        "checkpoint, or a minidet state dict")


def test_each_key_is_renamed_once(tmp_path, monkeypatch):
    """Fitting the config to a file (its architecture, its head shapes) and loading it rename each of its keys once:
    every step reads the one renamed view (``Checkpoint.view``)."""
    import dataclasses
    from collections import Counter

    from minidet.families import FAMILIES
    from minidet.testing.checkpoints import d2_weights

    path = tmp_path / "model_final.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": d2_weights(50)}, f, 4)
    family, calls = FAMILIES["detectron2"], Counter()

    def renamer(keys):
        rename = family.renamer(keys)
        return lambda k: calls.update([k]) or rename(k)

    monkeypatch.setitem(FAMILIES, "detectron2", dataclasses.replace(family, renamer=renamer))
    _, report = minidet.prepare_model(config("configs/detectron2/mask_rcnn_R_50_FPN_3x.yaml",
                                             "MODEL.WEIGHTS", str(path)))
    assert report.format == "detectron2" and report.loaded and not report.missing
    assert set(calls.values()) == {1} and len(calls) == report.loaded + len(report.ignored)


def test_the_body_check_compares_shapes_without_a_model():
    """``families.check_body`` reads the renamed view's shapes and the config's ``bodies.Body``: a ResNet's depth
    (res4's blocks, by the one table ``RESNET_BLOCKS``), a ResNeXt's groups, a RegNet's stages, the stem's kind."""
    from types import SimpleNamespace

    from minidet.bodies import RESNET_BLOCKS, regnet_body, resnet_body, resnet_depth
    from minidet.families import check_body

    assert {d: resnet_depth(b[2]) for d, b in RESNET_BLOCKS.items()} == {50: 50, 101: 101, 152: 152}
    assert resnet_depth(5) is None

    def view(body):  # a file of ``body``'s shapes, under minidet's names
        k = body.stem_kernel
        out = {"backbone.stem.conv1.weight": SimpleNamespace(shape=(body.stem_channels, 3, k, k))}
        for i, st in enumerate(body.stages):
            for b in range(st.blocks):
                out[f"backbone.res{i + 2}.{b}.conv2.weight"] = SimpleNamespace(
                    shape=(st.width, st.width // st.groups, 3, 3))
                out[f"backbone.res{i + 2}.{b}.conv3.weight"] = SimpleNamespace(shape=(st.out, st.width, 1, 1))
        return out

    r50, r101, x101 = resnet_body(50), resnet_body(101), resnet_body(101, 32, 8)
    regnet = regnet_body(22, 24.48, 24, 2.54, 16)  # RegNetX-400MF
    for body in (r50, r101, x101, regnet):
        check_body(view(body), {}, body, "f.pth", "mmdetection")  # the config's own body: nothing to say
    check_body(view(r101), {}, None, "f.pth", "mmdetection")  # not a minidet body: nothing to check
    refusals = [
        (r101, r50, "f.pth: ResNet-101 (res4 has 23 blocks) but the model has 6; set MODEL.RESNETS.DEPTH 101"),
        (x101, r101, "f.pth: backbone.res2.0.conv2.weight is a 3x3 conv of 32 groups of 8 channels but the model's "
                     "has 1 of 64; set MODEL.RESNETS.NUM_GROUPS 32 and WIDTH_PER_GROUP 8"),
        (regnet, r50, "f.pth: the checkpoint's body is a RegNet (its stem a 3x3 conv of 32 channels) but the config "
                      "builds a ResNet (a 7x7 stem): minidet runs it with a config that sets MODEL.REGNET, such as "
                      "mmdetection/mask-rcnn_regnetx-3.2GF_fpn_1x_coco"),
        (r50, regnet, "f.pth: the checkpoint's body is a ResNet (its stem a 7x7 conv) but the config builds a RegNet: "
                      "minidet runs it with a ResNet config (MODEL.REGNET.DEPTH 0), such as "
                      "mmdetection/mask-rcnn_r50_fpn_1x_coco"),
        (regnet, regnet_body(16, 35.73, 56, 2.28, 16),  # RegNetX-800MF
         f"f.pth: the checkpoint's RegNet has stages of 32, 64, 160, 384 channels with 1, 2, 7, 12 blocks but the "
         f"config's (MODEL.REGNET) has {', '.join(map(str, regnet_body(16, 35.73, 56, 2.28, 16).out_channels))} "),
    ]
    for file_body, config_body, message in refusals:
        with pytest.raises(CheckpointError) as e:
            check_body(view(file_body), {}, config_body, "f.pth", "mmdetection")
        assert str(e.value).startswith(message), str(e.value)
