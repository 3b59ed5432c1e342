"""minidet as an installed package: the ``minidet`` command, configs by name, weights by name or URL (downloaded
from a real HTTP server on 127.0.0.1), ``Predictor.from_pretrained``, and the paths a user meets outside the
checkout (the clone's own folder in the current directory, relative ``MODEL.WEIGHTS`` of the shipped configs)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
import torch

import minidet
from helpers import IMAGE_SHAPES, ROOT, images_bgr, one_error_line
from httpserver import FileServer
from minidet import hub
from minidet.apps import cli
from minidet.config import CONFIG_DIR, ConfigError, config_names

TV = "torchvision/maskrcnn_resnet50_fpn"
SMALL = {"INPUT.MIN_SIZE_TEST": 160, "INPUT.MAX_SIZE_TEST": 240}
MINIDET = Path(sys.executable).with_name("minidet")  # the console script of this venv


def minidet_cmd(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([str(MINIDET), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDET_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def server():
    s = FileServer()
    yield s
    s.close()


@pytest.fixture
def tv_served(server, tv_file, monkeypatch):
    """The registry's torchvision v1 entry pointing at the local server, which serves the session's synthetic v1
    checkpoint with its own digest (test data; the published URL and digest are those of the real file)."""
    data = Path(tv_file).read_bytes()
    server.files["/tv.pth"] = data
    entry = dataclasses.replace(hub.REGISTRY[TV], url=server.url + "/tv.pth", sha256=hashlib.sha256(data).hexdigest(),
                                size=len(data))
    monkeypatch.setitem(hub.REGISTRY, TV, entry)
    return entry


def test_command_overview_and_unknown_command(tmp_path, capsys):
    r = minidet_cmd("--help", cwd=tmp_path)  # the console script itself; the rest is its code in this process
    assert r.returncode == 0, r.stderr
    for name in ("infer", "eval", "bench", "weights", "configs"):
        assert f"\n  {name} " in r.stdout
    assert cli.main([]) == 2
    capsys.readouterr()
    assert cli.main(["detect"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: unknown command 'detect'")
    with pytest.raises(SystemExit) as e:  # argparse's --help
        cli.main(["infer", "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: minidet infer ")


def test_configs_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # names resolve inside the package, wherever the current directory is
    capsys.readouterr()
    assert cli.main(["configs"]) == 0  # `minidet configs`
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == config_names() and TV in listed and len(listed) == 187
    for name in listed:
        by_name = minidet.get_cfg(name)
        by_path = minidet.get_cfg()
        by_path.merge_from_file(str(CONFIG_DIR / f"{name}.yaml"))
        assert by_name == by_path, name
    # _BASE_ chains resolve inside the package: the Detectron GN config inherits two levels
    gn = minidet.get_cfg("detectron/e2e_mask_rcnn_R-50-FPN_2x_gn")
    assert gn.MODEL.NORM == "GN" and gn.MODEL.CONVENTION == "detectron"
    # the checkout's documented paths work from any folder; a .yaml suffix is allowed
    assert minidet.get_cfg(f"configs/{TV}.yaml") == minidet.get_cfg(TV) == minidet.get_cfg(f"{TV}.yaml")
    with pytest.raises(ConfigError) as e:
        minidet.get_cfg("torchvision/maskrcnn_resnet50")
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "torchvision/maskrcnn_resnet50") in msg
    assert "close names: torchvision/maskrcnn_resnet50_fpn," in msg and "`minidet configs`" in msg


@pytest.mark.slow
def test_a_clone_in_the_current_folder_does_not_shadow_the_package(tmp_path):
    """From the folder that holds a clone named minidet/ (its top folder has no __init__.py), ``import minidet``
    is the real package, not the clone's top folder as a namespace package."""
    clone = tmp_path / "minidet"
    (clone / "src").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("[project]\nname = 'minidet'\n")
    code = "import minidet; print(minidet.__file__); minidet.get_cfg()"
    env = {**os.environ, "PYTHONPATH": ""}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == Path(minidet.__file__)


@pytest.mark.slow
def test_from_pretrained_downloads_once_and_matches_the_file(home, tv_served, tv_file, server, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    pred = minidet.Predictor.from_pretrained(TV, device="cpu", **SMALL)
    cached = home / "weights" / "maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth"
    assert cached.read_bytes() == Path(tv_file).read_bytes()
    assert pred.load_report.path == str(cached)
    # the same file by path, through the cfg route: the same detections, bit for bit
    cfg = minidet.get_cfg(TV)
    cfg.merge_from_list(["MODEL.WEIGHTS", str(tv_file), "MODEL.DEVICE", "cpu", *sum(map(list, SMALL.items()), [])])
    ref = minidet.Predictor(cfg)
    for image in images_bgr(IMAGE_SHAPES[:1]):
        a, b = pred(image), ref(image)
        assert all(torch.equal(a[k], b[k]) for k in ("boxes", "scores", "labels"))
        assert torch.equal(a["masks"].dense(), b["masks"].dense())
    # a config name whose weights are a registry file (the fast config) takes the cached file: no new request
    n = len(server.requests)
    fast = minidet.Predictor.from_pretrained(f"{TV}_fast", MODEL__ROI_HEADS__DETECTIONS_PER_IMAGE=10, **SMALL)
    assert len(server.requests) == n and fast.cfg.MODEL.FOLD_NORM
    assert fast.cfg.MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE == 10


@pytest.mark.slow
def test_infer_with_a_url_from_another_folder(home, server, tv_file, tmp_path):
    """``minidet infer`` with a config name and ``MODEL.WEIGHTS URL``, run from a folder outside the checkout: the
    file is downloaded into $MINIDET_HOME once, and the run's first line names the cached file."""
    data = Path(tv_file).read_bytes()
    server.files["/models/tv_synthetic.pth"] = data
    cv2.imwrite(str(tmp_path / "photo.jpg"), images_bgr(IMAGE_SHAPES[:1])[0])
    args = ["infer", "--config-file", TV, "--input", "photo.jpg", "--output", "out", "--no-vis",
            "MODEL.WEIGHTS", server.url + "/models/tv_synthetic.pth", *map(str, sum(map(list, SMALL.items()), []))]
    r = minidet_cmd(*args, cwd=tmp_path, env={"MINIDET_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    cached = home / "weights" / "tv_synthetic.pth"
    assert cached.read_bytes() == data and f"weights {cached} (torchvision format" in r.stdout
    assert json.loads((tmp_path / "out" / "photo.json").read_text())["instances"]
    assert [p for p, _ in server.requests] == ["/models/tv_synthetic.pth"]


def test_relative_weights_of_a_shipped_config_outside_the_checkout(home, tv_file, tmp_path, monkeypatch):
    """The shipped configs name ``weights/<file>``: from another folder it is found in $MINIDET_HOME/weights;
    missing, the one-line error shows every absolute path tried and the command that downloads it."""
    monkeypatch.chdir(tmp_path)
    cfg = minidet.get_cfg(TV)
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", *sum(map(list, SMALL.items()), [])])
    with pytest.raises(minidet.CheckpointError) as e:
        minidet.Predictor(cfg)
    msg = str(e.value)
    assert "\n" not in msg
    for tried in (tmp_path / cfg.MODEL.WEIGHTS, home / cfg.MODEL.WEIGHTS, ROOT / cfg.MODEL.WEIGHTS):
        assert str(tried) in msg
    assert f"minidet weights get {TV}" in msg
    (home / "weights").mkdir(parents=True)
    data = Path(tv_file).read_bytes()
    (home / cfg.MODEL.WEIGHTS).write_bytes(data)
    # under a registry file's name, a file that is not the published one is refused before it is used
    entry = hub.REGISTRY[TV]
    with pytest.raises(minidet.CheckpointError, match=f"expected {entry.size} bytes and SHA-256 {entry.sha256} "):
        minidet.Predictor(cfg)
    # the registry entry publishing this synthetic file's digest and size (test data): found and used
    digest = hashlib.sha256(data).hexdigest()
    monkeypatch.setitem(hub.REGISTRY, TV, dataclasses.replace(entry, sha256=digest, size=len(data)))
    assert minidet.Predictor(cfg).load_report.path == str(home / cfg.MODEL.WEIGHTS)


def test_help_configs_and_weights_list_import_no_torch(tmp_path):
    """`minidet --help`, `configs` and `weights list` answer without importing torch (seconds on a busy machine)."""
    code = ("import sys\nfrom minidet.apps import cli\n"
            "for argv in (['--help'], ['configs'], ['weights', 'list']):\n    assert cli.main(argv) == 0, argv\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision'))\n"
            "assert not loaded, loaded[:5]\n")
    env = {**os.environ, "MINIDET_HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert "commands:" in run.stdout and "torchvision/maskrcnn_resnet50_fpn" in run.stdout
