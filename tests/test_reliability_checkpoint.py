"""Checkpoint loading, second pass (issue 12, §1.3-§1.5, §1.7, §3.12), as a user meets it: files
written here run through tools/infer.py (and the weights line through tools/eval_coco.py). Every
refusal is one ``error:`` line naming the file and the key; the runs that succeed use tiny settings.
"""

from __future__ import annotations

import collections
import json
import pickle
import struct
import tempfile
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from helpers import load_tool, one_error_line
from minidet.apps.bench.reference import legacy_v1_state_dict
from minidet.apps.synthetic import structured_image
from minidet.readers import read_checkpoint
from minidet.testing.checkpoints import d2_weights, make_blobs, write_detectron_pkl
from test_bad_inputs import D2_CONFIG, EVAL, FAST, INFER, TINY, TV_CONFIG

ROOT = Path(__file__).resolve().parent.parent
DETECTRON_CONFIG = ROOT / "configs" / "detectron" / "e2e_mask_rcnn_R-50-FPN_1x.yaml"

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


# tv_state (conftest.py): torchvision's own Mask R-CNN (ResNet-50 built once per session), confident classes


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("img") / "a.png"
    cv2.imwrite(str(path), structured_image(64, 80, seed=0))
    return path


@pytest.fixture(scope="module")
def d2_50() -> dict:
    """``d2_weights(50)``, made once for the module; tests copy the dict, never change its arrays."""
    return d2_weights(50)


@pytest.fixture(scope="module")
def blobs_r50() -> dict:
    """``make_blobs("R-50-FPN", seed=0)``, made once for the module; tests change a copy (``dict(...)``)."""
    return make_blobs("R-50-FPN", seed=0)


def _infer(capsys, image: Path, config: Path, weights, *opts: str) -> tuple[int, str, str, Path]:
    """tools/infer.py in-process on one image: exit status, stdout, stderr, output folder."""
    out = Path(tempfile.mkdtemp(dir=image.parent))
    argv = ["--config-file", str(config), "--input", str(image), "--output", str(out), "MODEL.WEIGHTS", str(weights)]
    rc = load_tool(INFER).main([*argv, *opts])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err, out


def _error(capsys, image: Path, config: Path, weights, *opts: str) -> str:
    rc, _, err, _ = _infer(capsys, image, config, weights, *opts)
    assert rc == 2, err
    return one_error_line(err)


def _save(state: dict, path: Path) -> Path:
    torch.save(state, path)
    return path


# ------------------------------------------------------------------------------ §1.3 tensors of the wrong kind


@pytest.mark.slow
@pytest.mark.parametrize(
    "key,dtype",
    [
        ("backbone.body.layer1.0.conv1.weight", torch.int64),
        ("backbone.body.layer1.0.conv1.weight", torch.int32),
        ("roi_heads.box_predictor.cls_score.weight", torch.bool),
        ("backbone.body.bn1.running_var", torch.uint8),  # a norm statistic
    ],
)
def test_non_floating_tensors_for_float_weights_are_refused(tmp_path, capsys, image, tv_state, key, dtype):
    state = dict(tv_state)
    state[key] = state[key].to(dtype)
    path = _save(state, tmp_path / "int.pth")
    line = _error(capsys, image, TV_CONFIG, path, *FAST)
    assert line.startswith(f"error: {path}: {key} holds {dtype} values where the model has floating-point weights")


@pytest.mark.slow
def test_integer_detectron_arrays_are_refused(tmp_path, capsys, image, blobs_r50):
    blobs = dict(blobs_r50)
    blobs["res3_0_branch2b_w"] = blobs["res3_0_branch2b_w"].astype(np.int32)
    path = tmp_path / "int.pkl"
    write_detectron_pkl(str(path), blobs)
    line = _error(capsys, image, DETECTRON_CONFIG, path, *FAST)
    assert line.startswith(f"error: {path}: res3_0_branch2b_w holds torch.int32 values where the model has floating")


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize(
    "key,make,what",
    [
        ("backbone.body.conv1.weight", torch.Tensor.to_sparse, "a sparse_coo tensor; weights must be dense"),
        ("roi_heads.box_predictor.cls_score.weight", torch.Tensor.to_sparse_csr, "a sparse_csr tensor; weights must"),
        ("backbone.body.layer2.0.conv1.weight", lambda t: t.to("meta"), "a meta tensor: a shape without values"),
    ],
)
def test_sparse_tensors_are_one_line_without_torch_internals(tmp_path, capsys, image, tv_state, key, make, what):
    state = dict(tv_state)
    state[key] = make(state[key])
    path = _save(state, tmp_path / "sparse.pth")
    line = _error(capsys, image, TV_CONFIG, path, *FAST)
    assert line.startswith(f"error: {path}: entry {key!r} is {what}")


# ------------------------------------------------------------------------------ §1.4 no weights, the weights line


@pytest.mark.slow
def test_empty_weights_is_an_error_and_none_runs_random_weights(tmp_path, capsys, image):
    line = _error(capsys, image, TV_CONFIG, "", *FAST)
    assert line.startswith("error: MODEL.WEIGHTS is empty; name a checkpoint file, or set MODEL.WEIGHTS none")
    for spelling in ("none", "None"):
        rc, out, err, folder = _infer(capsys, image, TV_CONFIG, spelling, *FAST)
        assert rc == 0, err
        assert out.splitlines()[0] == "infer: weights none (random weights: MODEL.WEIGHTS none)"
        assert (folder / "a.json").is_file()


@pytest.mark.slow
@pytest.mark.skipif(not TINY.is_dir(), reason=f"needs ../shared/data/coco_tiny ({TINY} is absent)")
def test_eval_coco_names_the_weights(tmp_path, capsys, tv_state):
    path = _save(tv_state, tmp_path / "tv.pth")
    argv = ["--config-file", str(TV_CONFIG), "--ann", str(TINY / "annotations" / "instances_val2017.json"),
            "--images", str(TINY / "val2017"), "--output", str(tmp_path / "out"), "--max-images", "1",
            "--workers", "0", "MODEL.WEIGHTS", str(path), *FAST]
    rc = load_tool(EVAL).main(argv)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert f"eval_coco: weights {path} (torchvision format, v1 key layout, " in captured.out


# ------------------------------------------------------------------------------ §1.5 the format fixes config keys


def _defaults_config(folder: Path) -> Path:
    """What a pip user starts from: ``get_cfg()`` defaults (FrozenBN eps 1e-5)."""
    path = folder / "defaults.yaml"
    path.write_text("MODEL:\n  DEVICE: cpu\n")
    return path


@pytest.mark.slow
def test_v1_legacy_layout_needs_frozen_bn_eps_zero(tmp_path, capsys, image, tv_state):
    path = _save(legacy_v1_state_dict(tv_state), tmp_path / "v1.pth")
    line = _error(capsys, image, _defaults_config(tmp_path), path, *FAST)
    assert line == (
        f"error: {path}: a torchvision checkpoint (v1 legacy key layout) needs MODEL.FROZEN_BN_EPS 0.0, "
        "the config has 1e-05; see configs/torchvision/"
    )
    line = _error(capsys, image, TV_CONFIG, path, "MODEL.FROZEN_BN_EPS", "1e-5", *FAST)
    assert "needs MODEL.FROZEN_BN_EPS 0.0" in line
    rc, out, err, folder = _infer(capsys, image, TV_CONFIG, path, *FAST)  # the v1 config: eps 0
    assert rc == 0, err
    assert out.splitlines()[0].startswith(f"infer: weights {path} (torchvision format, v1 legacy key layout, ")
    assert json.loads((folder / "a.json").read_text())["instances"]


@pytest.mark.slow
def test_the_format_fixes_the_convention(tmp_path, capsys, image, tv_state, d2_50, blobs_r50):
    blobs = tmp_path / "detectron.pkl"
    write_detectron_pkl(str(blobs), dict(blobs_r50))
    d2 = tmp_path / "d2.pkl"
    d2.write_bytes(pickle.dumps({"model": dict(d2_50), "__author__": "Detectron2 Model Zoo"}))
    tv = _save(tv_state, tmp_path / "tv.pth")
    for path, config, need, have in [
        (blobs, TV_CONFIG, "detectron", "torchvision"),
        (d2, TV_CONFIG, "detectron2", "torchvision"),
        (tv, D2_CONFIG, "torchvision", "detectron2"),
    ]:
        line = _error(capsys, image, config, path, *FAST)
        assert line.endswith(f"needs MODEL.CONVENTION {need}, the config has {have}; see configs/{need}/"), line


def test_the_key_names_decide_the_family_not_the_container(tmp_path, capsys, image, tv_state):
    """A torchvision state dict of numpy arrays in detectron2's wrapper ({"model": ..., "__author__": ...}) is a
    torchvision file: it runs under the torchvision config and is refused under detectron2's."""
    wrapped = tmp_path / "wrapped.pkl"
    arrays = {k: v.numpy() for k, v in tv_state.items()}
    wrapped.write_bytes(pickle.dumps({"model": arrays, "__author__": "a converter"}))
    line = _error(capsys, image, D2_CONFIG, wrapped, *FAST)
    assert line.endswith("needs MODEL.CONVENTION torchvision, the config has detectron2; see configs/torchvision/")
    rc, out, err, _ = _infer(capsys, image, TV_CONFIG, wrapped, *FAST)
    assert rc == 0, err
    assert "(torchvision format, v1 key layout, " in out.splitlines()[0]


# ------------------------------------------------------------------------------ §1.7 OrderedDict state dicts


@pytest.mark.slow
def test_ordered_dict_pickle_loads_like_a_plain_dict(tmp_path, capsys, image, d2_50):
    weights = d2_50
    outputs = []
    for name, state in (("plain.pkl", dict(weights)), ("ordered.pkl", collections.OrderedDict(weights))):
        path = tmp_path / name
        path.write_bytes(pickle.dumps({"model": state, "__author__": "Detectron2 Model Zoo"}, 2))
        rc, out, err, folder = _infer(capsys, image, D2_CONFIG, path, *FAST)
        assert rc == 0, err
        assert out.splitlines()[0].startswith(f"infer: weights {path} (detectron2 format, ")
        doc = json.loads((folder / "a.json").read_text())
        outputs.append((out.splitlines()[0].removeprefix(f"infer: weights {path}"), doc["instances"]))
    assert outputs[0] == outputs[1] and outputs[0][1]


# ------------------------------------------------------------------------------ §3.12 messages that keep the reason


def _safetensors_bytes() -> bytes:
    """A valid safetensors file (the format: u64 little-endian header length, JSON header, data)."""
    header = json.dumps({"backbone.body.conv1.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    return struct.pack("<Q", len(header)) + header.encode() + struct.pack("<2f", 1.0, 2.0)


def test_checkpoint_errors_keep_the_reason(tmp_path, capsys, image):
    text_zip = tmp_path / "notes.pth"
    with zipfile.ZipFile(text_zip, "w") as z:
        z.writestr("notes.txt", "not weights")
    pickled_list = tmp_path / "list.pth"
    pickled_list.write_bytes(pickle.dumps([1.0, 2.0]))
    saved_list = _save([torch.zeros(2)], tmp_path / "saved_list.pth")
    cases = {
        text_zip: "cannot read as a torch checkpoint: a zip archive but not a torch.save file (no data.pkl; "
        "it holds notes.txt)",
        pickled_list: "expected a dict of tensors, got list",
        saved_list: "expected a dict of tensors, got list",
    }
    for name in ("model.safetensors", "model.pth"):  # by content, whatever the name
        (tmp_path / name).write_bytes(_safetensors_bytes())
        cases[tmp_path / name] = "the .safetensors format is not supported; convert it where the safetensors"
    for path, message in cases.items():
        line = _error(capsys, image, TV_CONFIG, path, *FAST)
        assert line.startswith(f"error: {path}: {message}"), line


def test_a_torch_file_named_safetensors_is_read_by_its_content(tmp_path, tv_state):
    path = _save(tv_state, tmp_path / "tv.safetensors")
    assert set(read_checkpoint(str(path))) == set(tv_state)
