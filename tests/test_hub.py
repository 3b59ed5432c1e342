"""The weights registry and the verified, resumable downloads of ``minidet.hub``, against a real HTTP server
on 127.0.0.1 (started here, serving generated files with ``Range`` support), and ``minidet weights``."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gzip
import hashlib
import io
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from httpserver import FileServer, checkpoint_bytes
from minidet import hub
from minidet.apps import weights as weights_app
from minidet.checkpoint import CheckpointError
from minidet.families import FAMILIES
from minidet.families.base import digest_prefix
from minidet.hub import downloads

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "src" / "minidet" / "configs"
README = ROOT / "weights" / "README.md"


@pytest.fixture(autouse=True)
def minidet_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MINIDET_HOME", str(home))
    monkeypatch.setattr(downloads, "RETRY_DELAY", 0.0)
    return home


@pytest.fixture
def server():
    s = FileServer()
    yield s
    s.close()


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _test_entry(url: str, sha256: str | None, size: int | None, name: str = "test/model") -> hub.WeightsEntry:
    return hub.WeightsEntry(name, url, "model.pth", name, sha256, size, 1.0, 2.0, "made by the test")


# ----------------------------------------------------------------------------------------------------------------
# downloads


def test_download_verified_and_not_repeated(server, minidet_home, capsys):
    url, data, digest = server.add("/m/a.pth", 2_000_000)
    dest = minidet_home / "weights" / "a.pth"
    assert hub.download(url, dest, sha256=digest, size=len(data)) == dest
    assert dest.read_bytes() == data
    assert not (minidet_home / "weights" / "a.pth.partial").exists()
    assert not hub.recorded_digest(dest)  # a published digest is not recorded
    assert len(server.requests) == 1
    # a URL: cached under its basename, not downloaded again
    assert hub.resolve_weights(url) == str(dest)
    assert hub.resolve_weights(url) == str(dest)
    assert len(server.requests) == 1
    assert "downloading" in capsys.readouterr().err


def test_download_records_digest_when_none_published(server, minidet_home, capsys):
    url, data, digest = server.add("/b.pkl", 1_200_000)
    path = hub.resolve_weights(url)
    assert path == str(minidet_home / "weights" / "b.pkl")
    assert hub.recorded_digest(path) == digest
    warning = [line for line in capsys.readouterr().err.splitlines() if "publishes no SHA-256" in line]
    assert len(warning) == 1 and digest in warning[0] and "b.pkl.sha256" in warning[0]
    # a later download of the same file is checked against the recorded digest
    os.remove(path)
    server.files["/b.pkl"] = checkpoint_bytes(1_200_000)
    with pytest.raises(hub.DownloadError) as e:
        hub.resolve_weights(url)
    text = _one_line(e)
    assert digest in text and "recorded" in text and path in text
    assert not os.path.exists(path) and not os.path.exists(path + ".partial")


def test_wrong_digest_deletes_partial(server, minidet_home):
    url, data, digest = server.add("/c.pth", 1_500_000)
    dest = minidet_home / "weights" / "c.pth"
    with pytest.raises(hub.DownloadError) as e:
        hub.download(url, dest, sha256="0" * 64)
    text = _one_line(e)
    assert str(dest) in text and url in text and "0" * 64 in text and digest in text
    assert not dest.exists() and not (dest.parent / "c.pth.partial").exists()


def test_wrong_size_deletes_partial(server, minidet_home):
    url, data, digest = server.add("/s.pth", 1_000_000)
    dest = minidet_home / "weights" / "s.pth"
    with pytest.raises(hub.DownloadError, match="1000000 bytes, expected 999"):
        hub.download(url, dest, sha256=digest, size=999)
    assert not dest.exists() and not (dest.parent / "s.pth.partial").exists()


def test_connection_cut_is_resumed(server, minidet_home, capsys):
    url, data, digest = server.add("/cut.pth", 3_000_000)
    server.cut.add("/cut.pth")
    dest = minidet_home / "weights" / "cut.pth"
    hub.download(url, dest, sha256=digest, size=len(data))
    assert dest.read_bytes() == data
    assert [r for _, r in server.requests] == [None, f"bytes={len(data) // 2}-"]
    assert "dropped" in capsys.readouterr().err


def test_partial_from_earlier_run_is_resumed(server, minidet_home):
    url, data, digest = server.add("/p.pth", 2_500_000)
    dest = minidet_home / "weights" / "p.pth"
    dest.parent.mkdir(parents=True)
    (dest.parent / "p.pth.partial").write_bytes(data[:1_000_000])
    hub.download(url, dest, sha256=digest)
    assert dest.read_bytes() == data
    assert server.requests == [("/p.pth", "bytes=1000000-")]
    # a complete partial: the server answers 416, the file is verified and kept
    other = minidet_home / "weights" / "q.pth"
    (other.parent / "q.pth.partial").write_bytes(data)
    hub.download(url, other, sha256=digest)
    assert other.read_bytes() == data and server.requests[-1] == ("/p.pth", "bytes=2500000-")


def test_http_404_is_one_line(server, minidet_home):
    dest = minidet_home / "weights" / "none.pth"
    with pytest.raises(hub.DownloadError) as e:
        hub.download(server.url + "/none.pth", dest)
    text = _one_line(e)
    assert "404" in text and server.url + "/none.pth" in text
    assert not dest.exists()


def test_no_server_names_url_and_destination(minidet_home):
    url = f"http://127.0.0.1:{_free_port()}/x/model.pth"
    with pytest.raises(hub.DownloadError) as e:
        hub.resolve_weights(url)
    text = _one_line(e)
    assert url in text and str(minidet_home / "weights" / "model.pth") in text and "by other means" in text


def test_concurrent_downloads_write_once(server, minidet_home):
    url, data, digest = server.add("/lock.pth", 2_000_000)
    server.slow.add("/lock.pth")
    dest = minidet_home / "weights" / "lock.pth"
    results, errors = [], []

    def get() -> None:
        try:
            results.append(hub.download(url, dest, sha256=digest))
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    first = threading.Thread(target=get)
    first.start()
    for _ in range(200):  # the first one is downloading (holds the lock)
        if server.requests:
            break
        time.sleep(0.01)
    waiting = [threading.Thread(target=get) for _ in range(2)]  # both wait on the lock file the first removes
    for t in waiting:
        t.start()
    for t in (first, *waiting):
        t.join(10)
    assert not errors and results == [dest, dest, dest]
    assert len(server.requests) == 1 and dest.read_bytes() == data
    assert not list(dest.parent.glob("*.lock"))  # the cache keeps no lock file


_GET = """import os, sys, time
from minidet import hub
from minidet.families.base import digest_prefix
from minidet.hub import downloads
print("ready", flush=True)
while not os.path.exists(sys.argv[4]):
    time.sleep(0.01)
print(hub.download(sys.argv[1], sys.argv[2], sha256=sys.argv[3]))
"""


@pytest.mark.slow  # two processes importing torch: minutes on a busy machine
def test_processes_downloading_the_same_file_take_turns(server, minidet_home, tmp_path):
    """Two processes start the same download at once: one downloads, the other waits and uses its file; no lock
    file stays."""
    url, data, digest = server.add("/proc.pth", 2_000_000)
    server.slow.add("/proc.pth")
    server.pause = 0.5  # 4 s: the other process surely starts meanwhile, even on a busy machine
    dest, go = minidet_home / "weights" / "proc.pth", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [subprocess.Popen([sys.executable, "-c", _GET, url, str(dest), digest, str(go)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 2  # minidet imported by both
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [out.strip() for out, _ in outs] == [str(dest)] * 2
    assert sum("waiting for another process downloading" in err for _, err in outs) == 1, outs
    assert len(server.requests) == 1 and dest.read_bytes() == data
    assert not list(dest.parent.glob("*.lock"))


def test_lock_files_do_not_stay_behind(server, minidet_home):
    """Every name ever fetched, downloaded or failed, leaves no ``.lock`` in the cache."""
    url, data, digest = server.add("/l/a.pth", 100_000)
    hub.resolve_weights(url)
    with pytest.raises(hub.DownloadError):
        hub.resolve_weights(server.url + "/l/missing.pth")
    folder = minidet_home / "weights"
    assert sorted(p.name for p in folder.iterdir()) == ["a.pth", "a.pth.sha256", "a.pth.url", "a.pth.verified"]


def test_cached_file_from_another_url_is_refused(server, minidet_home):
    url, data, digest = server.add("/one/model_final.pkl", 1_000_000)
    server.files["/two/model_final.pkl"] = checkpoint_bytes(1_000_000)
    hub.resolve_weights(url)
    with pytest.raises(CheckpointError, match="was downloaded from"):
        hub.resolve_weights(server.url + "/two/model_final.pkl")


# ----------------------------------------------------------------------------------------------------------------
# what a download must be

PAGE = (b"<!DOCTYPE html>\n<html><head><title>Sign in to continue</title></head><body>" + b"<p>please log in</p>" * 300
        + b"</body></html>\n")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _refusal(value: str) -> str:
    """The one line ``resolve_weights(value)`` is refused with."""
    with pytest.raises(hub.DownloadError) as e:
        hub.resolve_weights(value)
    return _one_line(e)


def test_html_page_with_status_200_is_refused(server, minidet_home):
    """A source with no published digest: the first download is not trusted whatever it is."""
    server.files["/models/model.pth"] = PAGE
    url = server.url + "/models/model.pth"
    text = _refusal(url)
    assert text.startswith(f"{url}: the server sent an HTML page (\"Sign in to continue\", {len(PAGE)} bytes), "
                           "not a checkpoint"), text
    assert "deleted it, nothing recorded" in text and str(minidet_home / "weights" / "model.pth") in text
    assert os.listdir(minidet_home / "weights") == []  # no file, no partial, no digest, no source, no lock
    # a registry entry with a published size: the same line, not a size mismatch
    with pytest.raises(hub.DownloadError, match="the server sent an HTML page"):
        hub.download(url, minidet_home / "weights" / "model.pth", sha256="0" * 64, size=123_456)


def _torch_files(folder: Path) -> list[Path]:
    import torch

    state = {"w": torch.arange(40_000, dtype=torch.float32)}
    torch.save(state, folder / "zip.pth")
    torch.save(state, folder / "legacy.pth", _use_new_zipfile_serialization=False)
    (folder / "detectron.pkl").write_bytes(pickle.dumps({"blobs": {"w": np.zeros(40_000, np.float32)}}, protocol=2))
    return [folder / "zip.pth", folder / "legacy.pth", folder / "detectron.pkl"]


def _zip_of(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name in names:
            z.writestr(name, os.urandom(30_000))
    return buf.getvalue()


@pytest.mark.parametrize("content, what", [
    (b"", "an empty file"),
    (b"Not Found\n", "10 bytes of text ('Not Found')"),
    (b'{"error": "AccessDenied"}', "a JSON document ('{\"error\": \"AccessDenied\"}', 25 bytes)"),
    (b"<?xml version='1.0'?><Error><Code>NoSuchKey</Code></Error>", "an XML document ("),
    (PAGE, f'an HTML page ("Sign in to continue", {len(PAGE)} bytes)'),
    (gzip.compress(os.urandom(100_000)), "a gzip file ("),
    (_zip_of(["weights.bin", "config.json"]), "a zip archive that is no torch.save file (no data.pkl; it holds "
                                              "weights.bin, config.json)"),
    (b"\x80\x02" + os.urandom(1000), "a file of only 1002 bytes"),
    (bytes(range(256)) * 400, "102400 bytes of binary data in no format minidet reads"),
], ids=["empty", "text", "json", "xml", "html", "gzip", "zip", "small", "binary"])
def test_not_a_checkpoint_says_what_arrived(content, what, tmp_path):
    path = tmp_path / "download"
    path.write_bytes(content)
    assert hub.not_a_checkpoint(path).startswith(what)


def test_checkpoint_formats_are_accepted(tmp_path):
    for path in _torch_files(tmp_path):  # torch.save (zip and legacy) and a protocol-2 pickle, as written
        assert hub.not_a_checkpoint(path) is None, path


# ----------------------------------------------------------------------------------------------------------------
# a cached file before its use


def test_cached_registry_file_is_checked_before_use(server, minidet_home, monkeypatch, tmp_path, capsys):
    url, data, digest = server.add("/reg/model.pth", 1_000_000)
    monkeypatch.setitem(hub.REGISTRY, "test/model", _test_entry(url, digest, len(data)))
    path = Path(hub.resolve_weights("test/model"))
    state = json.loads((path.parent / "model.pth.verified").read_text())  # remembered by the download itself
    assert state == {"size": len(data), "mtime_ns": path.stat().st_mtime_ns, "sha256": digest}

    # another file under the registry's name: refused by name, by path and by `minidet weights get`
    monkeypatch.chdir(tmp_path)
    bad = checkpoint_bytes(900_000)
    path.write_bytes(bad)
    fresh = f"for a fresh copy: rm {path} && minidet weights get test/model"
    for value in ("test/model", "weights/model.pth"):
        assert _refusal(value) == (f"{path}: the cached file has 900000 bytes and SHA-256 {_sha(bad)}, expected "
                                   f"{len(data)} bytes and SHA-256 {digest} (published); {fresh}")
    capsys.readouterr()
    assert weights_app.main(["get", "test/model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and fresh in err
    # the same size: its digest
    same = checkpoint_bytes(len(data))
    path.write_bytes(same)
    assert _refusal("test/model") == (f"{path}: the cached file has SHA-256 {_sha(same)}, expected {digest} "
                                      f"(published); {fresh}")

    # hashed once per file state (size, mtime): a change that keeps both is not seen until the mtime moves
    path.write_bytes(data)
    assert hub.resolve_weights("test/model") == str(path)
    st = path.stat()
    path.write_bytes(same)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert hub.resolve_weights("test/model") == str(path)  # not hashed again
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(hub.DownloadError, match="the cached file has SHA-256"):
        hub.resolve_weights("test/model")
    assert len(server.requests) == 1


def test_cached_file_is_checked_against_its_recorded_digest(server, minidet_home):
    url, data, digest = server.add("/rec/model_final.pkl", 1_000_000)
    path = Path(hub.resolve_weights(url))
    changed = checkpoint_bytes(len(data))
    path.write_bytes(changed)
    assert _refusal(url) == (f"{path}: the cached file has SHA-256 {_sha(changed)}, expected {digest} (recorded at "
                             f"its first download in {path}.sha256); for a fresh copy: rm {path} && minidet weights "
                             f"get {url}")
    # an HTML page whose digest an older minidet recorded: deleting the record too is part of the fix
    path.write_bytes(PAGE)
    Path(f"{path}.sha256").write_text(f"{_sha(PAGE)}  {path.name}\n")
    assert _refusal(url) == (f"{path}: the cached file is an HTML page (\"Sign in to continue\", {len(PAGE)} bytes), "
                             f"not a checkpoint, and its digest was recorded from it; for a fresh copy: rm {path} "
                             f"{path}.sha256 && minidet weights get {url}")
    os.remove(path)
    os.remove(f"{path}.sha256")
    assert hub.resolve_weights(url) == str(path) and path.read_bytes() == data


# ----------------------------------------------------------------------------------------------------------------
# names and paths


def test_registry_name_downloads_on_first_use(server, minidet_home, monkeypatch, tmp_path):
    url, data, digest = server.add("/reg/model.pth", 1_000_000)
    monkeypatch.setitem(hub.REGISTRY, "test/model", _test_entry(url, digest, len(data)))
    path = hub.resolve_weights("test/model")
    assert path == str(minidet_home / "weights" / "model.pth") and Path(path).read_bytes() == data
    assert hub.resolve_weights("test/model") == path
    # the registry URL gets the entry's file name and digest
    assert hub.resolve_weights(url) == path
    # a config's relative MODEL.WEIGHTS finds the download from any folder
    monkeypatch.chdir(tmp_path)
    assert hub.resolve_weights("weights/model.pth") == path
    assert len(server.requests) == 1


def test_relative_paths_cwd_then_home_then_checkout(minidet_home, monkeypatch, tmp_path):
    cwd = tmp_path / "cwd"
    (cwd / "weights").mkdir(parents=True)
    (minidet_home / "weights").mkdir(parents=True)
    (cwd / "weights" / "x.pth").write_bytes(b"cwd")
    (minidet_home / "weights" / "x.pth").write_bytes(b"home")
    monkeypatch.chdir(cwd)
    assert hub.resolve_weights("weights/x.pth") == str(cwd / "weights" / "x.pth")
    os.remove(cwd / "weights" / "x.pth")
    assert hub.resolve_weights("weights/x.pth") == str(minidet_home / "weights" / "x.pth")
    assert hub.resolve_weights(str(cwd / ".." / "home" / "weights" / "x.pth")) == str(
        cwd / ".." / "home" / "weights" / "x.pth")
    # the checkout's files from any folder
    assert hub.resolve_weights("weights/README.md") == str(README)


def test_not_found_lists_absolute_paths(minidet_home, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    value = "nowhere/maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth"
    with pytest.raises(CheckpointError) as e:
        hub.resolve_weights(value)
    text = _one_line(e)
    for base in (tmp_path, minidet_home, ROOT):
        assert str(base / value) in text
    assert "`minidet weights get torchvision/maskrcnn_resnet50_fpn` downloads it" in text
    assert not (minidet_home / "weights").exists()  # nothing downloaded for a path
    with pytest.raises(CheckpointError) as e:
        hub.resolve_weights(str(tmp_path / "abs.pth"))
    assert f"(tried {tmp_path / 'abs.pth'})" in _one_line(e)
    with pytest.raises(CheckpointError) as e:
        hub.resolve_weights("torchvision/maskrcnn_resnet50_fpm")
    text = _one_line(e)
    assert "not a registry name" in text and "torchvision/maskrcnn_resnet50_fpn" in text


# ----------------------------------------------------------------------------------------------------------------
# the registry


def _config_weights(path: Path) -> str:
    data = yaml.safe_load(path.read_text())
    weights = (data.get("MODEL") or {}).get("WEIGHTS")
    if weights is None and "_BASE_" in data:
        return _config_weights((path.parent / data["_BASE_"]).resolve())
    return weights


PANOPTIC_PQ_ONLY = {f"mmdetection/panoptic-fpn_{m}_coco" for m in ("r50_fpn_1x", "r50_fpn_ms-3x", "r101_fpn_1x",
                                                                     "r101_fpn_ms-3x")}
NO_MASK_AP = {"mmdetection/mask-rcnn_x101-32x8d_fpn_ms-poly-3x_coco", *PANOPTIC_PQ_ONLY}  # what their zoos publish
NO_BOX_AP = {"detectron2/cityscapes_mask_rcnn_R_50_FPN", *PANOPTIC_PQ_ONLY}


def test_registry_entries_match_their_configs():
    assert len(hub.REGISTRY) == 183
    for name, e in hub.REGISTRY.items():
        assert e.name == name == e.config
        config = CONFIGS / f"{e.config}.yaml"
        assert config.is_file(), config
        assert os.path.basename(_config_weights(config)) == e.filename, name
        assert e.url.startswith("https://") and e.source
        assert (e.box_ap or name in NO_BOX_AP) and (e.mask_ap or name in NO_MASK_AP), name  # one AP published
        assert e.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", e.sha256)
    assert len({e.filename for e in hub.REGISTRY.values()}) == len(hub.REGISTRY)
    assert len({e.url for e in hub.REGISTRY.values()}) == len(hub.REGISTRY)


def test_torchvision_digests_start_with_the_name_prefix(minidet_home):
    tv = [e for e in hub.REGISTRY.values() if e.name.startswith("torchvision/")]
    assert len(tv) == 2
    for e in tv:
        assert e.sha256 and e.size and e.name_prefix and e.sha256.startswith(e.name_prefix)
        assert e.filename.endswith(f"-{e.name_prefix}.pth")
    assert all(e.sha256 is None for e in hub.REGISTRY.values() if e not in tv)
    # an expected digest that contradicts the file name is refused before anything is fetched
    with pytest.raises(hub.DownloadError, match="does not start with 12345678"):
        hub.download("https://download.pytorch.org/models/x_coco-12345678.pth", minidet_home / "x.pth",
                     sha256="ab" * 32)
    assert digest_prefix("https://example.org/model-20240101.pth") is None


def test_readme_agrees_with_registry():
    text = README.read_text()
    urls = {u.rstrip(".,") for u in re.findall(r"https?://[^\s)\]`'\"<>]+", text)}
    urls = {u for u in urls if not u.endswith("/")}  # the URL pattern's fixed part
    registry = {e.url for e in hub.REGISTRY.values()}
    assert urls == registry
    for e in hub.REGISTRY.values():
        assert e.config in text and e.filename in text, e.name
        if e.sha256:
            assert e.sha256 in text and f"{e.size:,}" in text
    assert "minidet weights get" in text and "MINIDET_HOME" in text and "~/.cache/minidet/weights" in text


def test_every_registry_entry_has_its_zoos_licence():
    """Each zoo of the registry has its row in the licence table (and each row is a zoo of the registry); every
    registry entry's licence is its zoo's row."""
    zoos = {f.name: f for f in FAMILIES.values() if f.weights}
    assert set(hub.ZOO_LICENCES) == set(zoos)
    for name, e in hub.REGISTRY.items():
        z = hub.licence_of(e)
        assert z is not None and z is next(hub.ZOO_LICENCES[k] for k, f in zoos.items() if e in f.weights), name
        assert z.licence and z.zoo and " of " in z.source, name
    assert {z.licence for z in hub.ZOO_LICENCES.values()} <= {"CC BY-SA 3.0", hub.NOT_STATED}
    assert hub.licence_of(_test_entry("https://example.org/m.pth", None, None)) is None  # no zoo


def test_readme_gives_each_zoos_licence_and_its_source():
    text = README.read_text()
    registry = {m[1]: m[2] for m in re.finditer(r"^\| `([^`]+)` \| `[^`]+` \|.*\| ([^|]+?) \|$", text, re.M)}
    assert registry == {n: hub.licence_of(e).licence for n, e in hub.REGISTRY.items()}
    zoos = {m[1]: m for m in re.finditer(r"^\| ([^|`]+?) \| ([^|]+?) \| ([^|]+) \| ([^|]+) \|$", text, re.M)}
    for z in hub.ZOO_LICENCES.values():
        row = zoos[z.zoo]
        assert row[2] == z.licence, z.zoo
        file, _, repo = z.source.partition(" of ")
        assert f"`{file}`" in row[4] and repo in row[4], z.zoo


# ----------------------------------------------------------------------------------------------------------------
# minidet weights


def test_weights_list_shows_each_zoos_licence(minidet_home):
    """``minidet weights list``, run as a user runs it: each registry row with its zoo's licence."""
    code = "import sys; from minidet.apps.cli import main; sys.exit(main())"
    r = subprocess.run([sys.executable, "-c", code, "weights", "list"], capture_output=True, text=True,
                       env={**os.environ, "MINIDET_HOME": str(minidet_home)}, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = lines[0]
    assert header.endswith("  licence")
    at = header.index("licence")
    for name, e in hub.REGISTRY.items():
        row = next(line for line in lines if line.startswith(f"{name} "))
        assert row[at:] == hub.licence_of(e).licence, row
    assert "weights/README.md" in lines[-1]


def test_weights_get_says_the_licence_when_it_downloads(server, minidet_home, monkeypatch, capsys):
    url, data, _ = server.add("/lic/model.pkl", 1_000_000)
    name = "detectron2/mask_rcnn_R_50_FPN_3x"  # a registry name of a zoo whose licence is stated
    monkeypatch.setitem(hub.REGISTRY, name, _test_entry(url, None, None, name=name))
    assert weights_app.main(["get", name]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(minidet_home / "weights" / "model.pth")]
    said = [line for line in captured.err.splitlines() if "licence" in line]
    assert said == ["minidet: licence of these weights: CC BY-SA 3.0, as detectron2 states it (MODEL_ZOO.md of "
                    "facebookresearch/detectron2)"]
    assert captured.err.splitlines().index(said[0]) == 1 + next(
        i for i, line in enumerate(captured.err.splitlines()) if line.startswith("minidet: downloading"))
    assert weights_app.main(["get", name]) == 0  # cached: nothing downloaded, nothing said
    assert "licence" not in capsys.readouterr().err

    name = "mmdetection/mask-rcnn_r50_fpn_1x_coco"  # a zoo that states none
    url = server.add("/lic/b.pth", 1_000_000)[0]
    monkeypatch.setitem(hub.REGISTRY, name, hub.WeightsEntry(name, url, "b.pth", name, None, None, 1.0, 2.0, "test"))
    assert weights_app.main(["get", name]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "licence" in line]
    assert said == ["minidet: licence of these weights: not stated by mmdetection (configs/mask_rcnn/README.md of "
                    "open-mmlab/mmdetection); see weights/README.md"]


def test_weights_app_list_get_verify(server, minidet_home, monkeypatch, capsys):
    url, data, digest = server.add("/app/model.pth", 1_000_000)
    monkeypatch.setitem(hub.REGISTRY, "test/model", _test_entry(url, None, None))
    url2, data2, digest2 = server.add("/app/pub.pth", 1_000_000)
    pub = hub.WeightsEntry("test/pub", url2, "pub.pth", "test/pub", digest2, len(data2), None, None, "test")
    monkeypatch.setitem(hub.REGISTRY, "test/pub", pub)

    assert weights_app.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in hub.REGISTRY:
        assert name in out
    row = _long_rows()["test/model"]
    assert (row["cached"], row["sha256"], row["url"]) == ("no", "none", url)

    assert weights_app.main(["get", "test/model", "test/pub"]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(minidet_home / "weights" / "model.pth"), str(minidet_home / "weights" / "pub.pth")]
    row = _long_rows()["test/model"]
    assert (row["cached"], row["sha256"], row["size"]) == ("yes", "recorded", "1.0 MiB")  # the cached file's size

    assert weights_app.main(["verify", "test/model", "test/pub"]) == 0
    out = capsys.readouterr().out
    assert "ok (recorded digest)" in out and re.search(r"test/pub\s+ok\s", out)
    assert weights_app.main(["verify"]) == 0
    assert "missing" in capsys.readouterr().out

    cached = minidet_home / "weights" / "model.pth"
    cached.write_bytes(b"x" + data[1:])
    assert weights_app.main(["verify"]) == 1
    captured = capsys.readouterr()
    assert f"MISMATCH expected {digest} (recorded) got {hashlib.sha256(cached.read_bytes()).hexdigest()}" in \
        captured.out
    assert "do not match" in captured.err

    assert weights_app.main(["get", "no/such_model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert weights_app.main(["verify", "tset/model"]) == 2
    assert "test/model" in capsys.readouterr().err
    assert weights_app.main(["get", f"http://127.0.0.1:{_free_port()}/gone.pth"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "gone.pth" in errors[0]


def _long_rows(*options: str) -> dict[str, dict[str, str]]:
    """``minidet weights list --long``'s rows by name, each a {column: value} (columns are 2 or more spaces
    apart)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert weights_app.main(["list", "--long", *options]) == 0
    lines = out.getvalue().splitlines()
    header = re.split(r"\s{2,}", lines[0])
    rows = [dict(zip(header, re.split(r"\s{2,}", line))) for line in lines[1 : lines.index("")]]
    assert all(len(r) == len(header) for r in rows)
    return {r["name"]: r for r in rows}


@pytest.mark.parametrize("argv", [["--help"], ["list", "--help"], ["get", "--help"], ["verify", "--help"]])
def test_weights_app_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        weights_app.main(argv, prog="minidet weights")
    assert e.value.code == 0
    assert "minidet weights" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------
# weights by name (issue 56, item 6): typos, another family's file, a digest prefix in the name


@pytest.mark.parametrize("typo,close", [
    ("torchvision/maskrcnn_resnet50_fpm", "torchvision/maskrcnn_resnet50_fpn"),
    ("detectron2/mask_rcnn_R_50_FPN_3", "detectron2/mask_rcnn_R_50_FPN_3x"),
    ("mask_rcnn_R_50_FPN_3x_gn", "detectron2/mask_rcnn_R_50_FPN_3x_gn"),  # the family left out
])
def test_weights_get_typo_names_the_close_names(typo, close, capsys):
    """``minidet weights get`` with a typo: one error line with the close registry names, as ``--config-file``
    gives the close config names."""
    assert weights_app.main(["get", typo]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {typo} is neither a registry name nor an http(s) URL; "
                                                   "close names: ")
    assert close in err.partition("close names: ")[2].split(" (")[0].split(", ")
    assert err.rstrip().endswith("(`minidet weights list` lists them)")


def _served_as(server, name: str, monkeypatch) -> str:
    """The registry entry ``name`` with its file served by ``server`` (a checkpoint-like file); its URL."""
    url = server.add(f"/zoo/{hub.REGISTRY[name].filename}", 1_000_000)[0]
    monkeypatch.setitem(hub.REGISTRY, name, dataclasses.replace(hub.REGISTRY[name], url=url, sha256=None, size=None))
    return url


def test_registry_name_of_another_family_is_refused_before_its_download(server, minidet_home, monkeypatch, tmp_path,
                                                                         capsys):
    """``--config-file detectron2/... MODEL.WEIGHTS torchvision/...``: one line naming both families and the config
    that runs the file, before any request reaches the server (by name or by the registry URL)."""
    from minidet.config import ConfigError, load_cfg

    tv, d2 = "torchvision/maskrcnn_resnet50_fpn", "detectron2/mask_rcnn_R_50_FPN_3x"
    url = _served_as(server, tv, monkeypatch)
    for value in (tv, url):
        with pytest.raises(ConfigError) as e:
            load_cfg(d2, ["MODEL.WEIGHTS", value])
        assert _one_line(e) == (f"MODEL.WEIGHTS {value} is a torchvision checkpoint but the config is of the "
                                f"detectron2 family (MODEL.CONVENTION detectron2); the config that runs it: "
                                f"--config-file {tv} (nothing was downloaded)")
    # as a user meets it: `minidet infer`, one error line, exit status 2, nothing asked of the server
    from minidet.apps import cli

    image = tmp_path / "a.png"
    image.write_bytes(_png())
    assert cli.main(["infer", "--config-file", d2, "--input", str(image), "--output", str(tmp_path / "out"),
                     "MODEL.WEIGHTS", tv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: MODEL.WEIGHTS {tv} is a torchvision checkpoint"), err
    assert server.requests == [] and not (minidet_home / "weights").exists()
    # the config of its own family downloads it; a fine-tuned file's own classes do not matter to the check
    assert load_cfg(tv, ["MODEL.WEIGHTS", tv, "MODEL.ROI_HEADS.NUM_CLASSES", 3]).MODEL.WEIGHTS == tv
    assert load_cfg(d2, ["MODEL.WEIGHTS", "detectron2/mask_rcnn_R_101_FPN_3x"]).MODEL.CONVENTION == "detectron2"
    assert server.requests == []


def _png() -> bytes:
    """A small PNG image (a real input for `minidet infer`)."""
    import cv2

    return cv2.imencode(".png", np.zeros((32, 32, 3), np.uint8))[1].tobytes()


def _by_hand(name: str, data: bytes) -> Path:
    """``data`` put into the cache by hand under the registry file name of ``name`` (no record beside it)."""
    path = hub.weights_dir() / hub.REGISTRY[name].filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


MMDET = "mmdetection/mask-rcnn_r50_fpn_1x_coco"  # a file named ...-d4b0c5d6.pth, no full digest published


def test_file_by_hand_whose_digest_contradicts_its_name_is_refused(minidet_home, monkeypatch, tmp_path, capsys):
    """A file put into the cache by hand whose SHA-256 does not begin with the prefix in its name: refused at each
    use (by name, by its cache path) in one line, and `minidet weights verify` reports it failed."""
    entry = hub.REGISTRY[MMDET]
    data = checkpoint_bytes(900_000)
    while _sha(data).startswith(entry.name_prefix):  # (one chance in 4 billion)
        data = checkpoint_bytes(900_000)
    path = _by_hand(MMDET, data)
    expected = (f"{path}: the cached file has SHA-256 {_sha(data)}, expected {entry.name_prefix}... (the prefix in "
                f"the file name); for a fresh copy: rm {path} && minidet weights get {MMDET}")
    monkeypatch.chdir(tmp_path)
    for value in (MMDET, f"weights/{entry.filename}", entry.url):
        assert _refusal(value) == expected, value
    assert weights_app.main(["verify", MMDET]) == 1
    captured = capsys.readouterr()
    assert f"MISMATCH expected {entry.name_prefix}... (the prefix in the file name) got {_sha(data)}" in captured.out
    assert "1 cached file(s) do not match" in captured.err
    # a record made by hand of the same file does not outweigh its name
    Path(f"{path}.sha256").write_text(f"{_sha(data)}  {path.name}\n")
    assert _refusal(MMDET) == expected
    assert weights_app.main(["verify", MMDET]) == 1


def test_file_by_hand_that_agrees_with_its_name_is_used(minidet_home, monkeypatch, capsys):
    """The prefix check passes a file whose digest begins with the prefix in its name (hashed once per file
    state), and `verify` says what was checked."""
    data = checkpoint_bytes(900_000)
    entry = hub.REGISTRY[MMDET]
    stem = entry.filename.rpartition("-")[0]
    filename = f"{stem}-{_sha(data)[:8]}.pth"
    url = f"{entry.url.rpartition('/')[0]}/{filename}"
    monkeypatch.setitem(hub.REGISTRY, MMDET, dataclasses.replace(entry, url=url, filename=filename))
    path = _by_hand(MMDET, data)
    assert hub.resolve_weights(MMDET) == str(path)
    assert json.loads(Path(f"{path}.verified").read_text())["sha256"] == _sha(data)
    assert weights_app.main(["verify", MMDET]) == 0
    assert re.search(rf"{re.escape(MMDET)}\s+ok \(digest prefix in its name\)\s", capsys.readouterr().out)



# ----------------------------------------------------------------------------------------------------------------
# minidet weights list: a readable default, filters, sorting, every field for programs (issue 56, item 8)


def _list(capsys, *options: str) -> tuple[int, str, str]:
    code = weights_app.main(["list", *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_weights_list_default_fits_a_terminal(capsys):
    """Name, box/mask AP, size and licence of every registry file, in registry order, each line at most 120
    characters (the longest registry name is 86); the rest is in --long."""
    code, out, _ = _list(capsys)
    lines = out.splitlines()
    assert code == 0 and max(map(len, lines)) <= 120
    assert re.split(r"\s{2,}", lines[0]) == ["name", "box/mask AP", "MiB", "licence"]
    rows = [re.split(r"\s{2,}", line) for line in lines[1 : lines.index("")]]
    assert [r[0] for r in rows] == list(hub.REGISTRY)
    for (name, ap, mib, licence), e in zip(rows, hub.REGISTRY.values()):
        shown = [None if v == "-" else float(v) for v in ap.split("/")]
        assert shown == [e.box_ap, e.mask_ap] and licence == hub.licence_of(e).licence, name
        assert mib == (f"{e.size / 2**20:.0f}" if e.size else "-"), name
    assert lines[-1].startswith(f"{len(hub.REGISTRY)} of {len(hub.REGISTRY)} files; --long: ")


# what each architecture's files are called (the zoos' own words in the config names), for the reference
NAMED = {"cascade": "cascade", "dcn": "dconv", "gcb": "gcb", "regnet": "regnet", "ms-rcnn": "ms-rcnn"}


def _names(out: str) -> list[str]:
    lines = out.splitlines()
    return [line.split()[0] for line in lines[1 : lines.index("")]]


@pytest.mark.slow  # reads every config (seconds on 2 cores)
def test_weights_list_filters_by_family_architecture_and_dataset(capsys):
    """--family, --arch (from the configs: the zoos' names say the same) and --dataset each list exactly the files
    of that kind, in registry order; filters combine."""
    for family in ("torchvision", "detectron", "detectron2", "maskrcnn_benchmark", "mmdetection"):
        assert _names(_list(capsys, "--family", family)[1]) == [e.name for e in FAMILIES[family].weights]
    for arch, word in NAMED.items():
        assert _names(_list(capsys, "--arch", arch)[1]) == [n for n in hub.REGISTRY if word in n], arch
    plain = [n for n in hub.REGISTRY if not any(w in n for w in NAMED.values())]
    assert _names(_list(capsys, "--arch", "plain")[1]) == plain
    words = {"lvis": ("lvis",), "lvis-v0.5": ("lvis_v0.5", "lvis-v0.5"), "lvis-v1": ("lvis_v1", "lvis-v1"),
             "cityscapes": ("cityscapes",)}
    for dataset, said in words.items():
        assert _names(_list(capsys, "--dataset", dataset)[1]) == [n for n in hub.REGISTRY if any(w in n for w in said)]
    coco = [n for n in hub.REGISTRY if "lvis" not in n and "cityscapes" not in n]
    assert _names(_list(capsys, "--dataset", "coco")[1]) == coco
    both = _names(_list(capsys, "--family", "detectron2", "--arch", "cascade", "--dataset", "coco")[1])
    assert both == [e.name for e in FAMILIES["detectron2"].weights if "cascade" in e.name]


def test_weights_list_sorted_by_ap(capsys):
    """--sort ap: by mask AP, then box AP, highest first; files without a published AP last."""
    names = _names(_list(capsys, "--sort", "ap")[1])
    assert sorted(names) == sorted(hub.REGISTRY)
    low = float("-inf")  # no AP published
    keys = [(hub.REGISTRY[n].mask_ap or low, hub.REGISTRY[n].box_ap or low) for n in names]
    assert all(a >= b for a, b in zip(keys, keys[1:]))  # tuples: mask AP first, then box AP
    assert _names(_list(capsys, "--sort", "name")[1]) == sorted(hub.REGISTRY)


def test_weights_list_matching_nothing_is_one_line(capsys):
    """Filters that no file passes together: one line naming what each filter allows with the others; a value
    that is none of its choices: one error line with the choices, exit status 2."""
    code, out, err = _list(capsys, "--family", "torchvision", "--dataset", "lvis")
    assert (code, out) == (0, "")
    assert err == ("minidet: no registry file matches --family torchvision --dataset lvis; with --dataset lvis: "
                   "--family detectron2, mmdetection; with --family torchvision: --dataset coco\n")
    assert _list(capsys, "--family", "torchvision", "--dataset", "lvis", "--format", "json")[1] == "[]\n"
    code, out, err = _list(capsys, "--arch", "cascde")
    assert (code, out) == (2, "")
    assert err == "error: --arch cascde: no such architecture; choices: plain, cascade, dcn, gcb, ms-rcnn, regnet\n"
    code, _, err = _list(capsys, "--family", "mmdet")
    assert code == 2 and err.startswith("error: --family mmdet: no such family; choices: torchvision, detectron, ")


def test_weights_list_every_field_for_programs(minidet_home, capsys):
    """--format json and tsv: every field of every file (what --long shows: config, URL, digest, cached)."""
    _by_hand(MMDET, checkpoint_bytes(100_000))
    records = json.loads(_list(capsys, "--format", "json", "--family", "mmdetection")[1])
    assert [r["name"] for r in records] == [e.name for e in FAMILIES["mmdetection"].weights]
    by_name = {r["name"]: r for r in records}
    e = hub.REGISTRY[MMDET]
    assert by_name[MMDET] == {
        "name": MMDET, "family": "mmdetection", "config": e.config, "box_ap": e.box_ap, "mask_ap": e.mask_ap,
        "size": 100_000, "licence": hub.NOT_STATED, "cached": True, "digest": "prefix",
        "sha256": f"{e.name_prefix}...", "url": e.url, "path": str(minidet_home / "weights" / e.filename),
        "architecture": "plain", "dataset": "coco"}
    table = list(csv.DictReader(io.StringIO(_list(capsys, "--format", "tsv", "--family", "mmdetection")[1]),
                                delimiter="\t"))
    assert [r["name"] for r in table] == list(by_name)
    assert table[0] == {k: "" if v is None else {True: "yes", False: "no"}.get(v, v) if isinstance(v, bool) else
                        str(v) for k, v in records[0].items()}
    assert _long_rows("--family", "mmdetection")[MMDET]["url"] == e.url
