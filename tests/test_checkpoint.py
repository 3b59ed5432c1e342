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
