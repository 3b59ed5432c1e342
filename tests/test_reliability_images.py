"""Issue 12, §2.9 and §3.13: image reading and preprocessing within bounded memory, files refused
from their first bytes, and the native decoders' stray messages turned into one warning per file.
"""

from __future__ import annotations

import functools
import io
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch.nn import functional as F

import minidet
from helpers import config, run_tool
from minidet import imageio
from minidet.apps.synthetic import structured_image
from minidet.imageio import ImageReadError, read_image, read_image_bytes

try:
    from PIL import Image, ImageCms
except ImportError:  # PIL is a minidet dependency, but keep the module importable without it
    Image = ImageCms = None

ROOT = Path(__file__).resolve().parent.parent
INFER = ROOT / "tools" / "infer.py"
CONFIGS = {
    "torchvision": ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml",
    "detectron": ROOT / "configs" / "detectron" / "e2e_mask_rcnn_R-50-FPN_1x.yaml",
    "detectron2": ROOT / "configs" / "detectron2" / "mask_rcnn_R_50_FPN_3x.yaml",
}
# each family as configured, and with the other channel order / range / std, so that every branch
# of the three resize conventions (channel flip, range division, std division) is exercised
VARIANTS = [
    ("torchvision", ()),
    ("torchvision", ("INPUT.FORMAT", "BGR", "INPUT.PIXEL_RANGE", "255.0")),
    ("detectron", ()),
    ("detectron", ("INPUT.FORMAT", "RGB", "MODEL.PIXEL_STD", "[57.375, 57.12, 58.395]")),
    ("detectron2", ()),
    ("detectron2", ("INPUT.FORMAT", "RGB", "MODEL.PIXEL_STD", "[57.375, 57.12, 58.395]")),
]
# down- and upscaling, odd sizes, both orientations, a long strip, a tiny image (800 / 5 = 160x up)
SIZES = [(1001, 777), (2000, 3001), (333, 517), (801, 1203), (57, 91), (5, 7), (4000, 30)]
GIB = 2**30


@functools.lru_cache(maxsize=2)
def _model(family: str, *opts: str, device: str = "cpu"):
    """The network only (no weights are read) on ``device``. Only its pre-processing is used, which changes
    nothing in it: the last two are kept for the next test (the same variant at the other thread count)."""
    return minidet.build_model(config(CONFIGS[family], *opts)).to(device)


def _plain(model, img: np.ndarray) -> torch.Tensor:
    """The whole-image computation of each convention, as written before §2.9 (float image at full
    size with out-of-place temporaries; PIL resizing the RGB image)."""
    model = model.transform  # the pre-processing settings
    mean, std, dev = model.pixel_mean, model.pixel_std, model.device
    if model.resize.__name__ == "resize_cv2":  # Detectron: float image minus mean, cv2 resize
        a = img[:, :, ::-1] if model.flip_channels else img
        x = a.astype(np.float32)
        if model.pixel_range != 255.0:
            x = x / np.float32(255.0 / model.pixel_range)
        x = x - mean.view(1, 1, -1).cpu().numpy()
        if np.any(std.cpu().numpy() != 1):
            x = x / std.view(1, 1, -1).cpu().numpy()
        h, w = a.shape[:2]
        scale = float(model.min_size) / float(min(h, w))
        if np.round(scale * max(h, w)) > model.max_size:
            scale = float(model.max_size) / float(max(h, w))
        x = cv2.resize(x, None, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)
        return torch.from_numpy(x).permute(2, 0, 1).to(dev)
    if model.resize.__name__ == "resize_pil":  # detectron2: PIL resize of the uint8 RGB/BGR image, then normalize
        a = img[:, :, ::-1] if model.flip_channels else img
        h, w = a.shape[:2]
        scale = model.min_size / min(h, w)
        newh, neww = (model.min_size, scale * w) if h < w else (scale * h, model.min_size)
        if max(newh, neww) > model.max_size:
            scale = model.max_size / max(newh, neww)
            newh, neww = newh * scale, neww * scale
        small = Image.fromarray(np.ascontiguousarray(a)).resize((int(neww + 0.5), int(newh + 0.5)), Image.BILINEAR)
        x = torch.as_tensor(np.asarray(small).astype("float32").transpose(2, 0, 1)).to(dev)
        if model.pixel_range != 255.0:
            x = x / (255.0 / model.pixel_range)
        return (x - mean) / std
    t = torch.as_tensor(img).to(dev).permute(2, 0, 1)  # torchvision: normalize NCHW, then interpolate
    if model.flip_channels:
        t = t.flip(0)
    x = t.float()
    if model.pixel_range != 255.0:
        x = x / (255.0 / model.pixel_range)
    x = (x - mean) / std
    scale = min(model.min_size / min(x.shape[-2:]), model.max_size / max(x.shape[-2:]))
    x = F.interpolate(x[None], scale_factor=scale, mode="bilinear", recompute_scale_factor=True, align_corners=False)
    return x[0]


@pytest.mark.skipif(Image is None, reason="PIL is needed for the detectron2 convention")
@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
)
@pytest.mark.parametrize("threads", [1, 2])  # PyTorch's CPU bilinear kernel depends on the thread count
@pytest.mark.parametrize(("family", "opts"), VARIANTS)
def test_low_memory_preprocess_is_bit_identical(family, opts, threads, device):
    model = _model(family, *opts, device=device)
    rng = np.random.default_rng(7)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for h, w in SIZES:
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            with torch.inference_mode():
                batch, sizes, _, _ = model.preprocess([img])
                expect = _plain(model, img)
            got = batch[0, :, : sizes[0][0], : sizes[0][1]]
            assert got.shape == expect.shape, (h, w)
            assert torch.equal(got, expect), (family, opts, h, w)
        small = _model(family, *opts, "INPUT.MIN_SIZE_TEST", "40", "INPUT.MAX_SIZE_TEST", "60", device=device)
        img = rng.integers(0, 256, (301, 203, 3), dtype=np.uint8)  # output h + w <= 128: another CPU kernel
        with torch.inference_mode():
            batch, sizes, _, _ = small.preprocess([torch.as_tensor(img)])  # a tensor input, too
            assert torch.equal(batch[0, :, : sizes[0][0], : sizes[0][1]], _plain(small, img))
    finally:
        torch.set_num_threads(before)


def test_16bit_conversion_in_bands_is_exact(tmp_path):
    """16-bit images are rounded to 8 bits in bands of rows: every value as ``(v + 128) // 257``."""
    rng = np.random.default_rng(3)
    arr = rng.integers(0, 65536, (1500, 3001, 3), dtype=np.uint16)  # several bands of rows
    path = tmp_path / "deep.png"
    assert cv2.imwrite(str(path), arr, [cv2.IMWRITE_PNG_COMPRESSION, 1])
    expect = ((arr.astype(np.uint32) + 128) // 257).astype(np.uint8)
    np.testing.assert_array_equal(read_image(str(path)), expect)


# ------------------------------------------------------------------------------ peak memory

_PEAK_SCRIPT = r"""
import json, sys
import cv2, numpy as np, torch
import minidet
from minidet.imageio import read_image
from minidet.apps.synthetic import structured_image

def kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))

path, h, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tile = structured_image(500, 600, seed=1)
big = np.tile(tile, (h // 500, w // 600, 1))
assert cv2.imwrite(path, big, [cv2.IMWRITE_JPEG_QUALITY, 90])
del big
torch.set_num_threads(1)
out = {}
for family, config in json.loads(sys.argv[4]).items():
    cfg = minidet.get_cfg()
    cfg.merge_from_file(config)
    cfg.merge_from_list(["MODEL.WEIGHTS", ""])
    model = minidet.build_model(cfg)
    with torch.inference_mode():
        model.preprocess([structured_image(64, 80)])  # lazy imports and allocator set-up
    base = kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    with torch.inference_mode():
        model.preprocess([read_image(path)])
    out[family] = (kib("VmHWM") - base) * 1024
    del model
print(json.dumps(out))
"""


@pytest.mark.slow
def test_read_and_preprocess_peak_memory(tmp_path):
    """Reading and preprocessing a 10000 x 6000 JPEG stays within 20 bytes per pixel above the
    idle process: the decoded image (3 bytes per pixel), one float copy of it (12), the file's
    bytes (about 1 for this JPEG) and the small resized image, with 4 to spare. Before §2.9 the
    torchvision convention alone took about 37 bytes per pixel."""
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    h, w = 10000, 6000
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", _PEAK_SCRIPT, str(tmp_path / "big.jpg"), str(h), str(w)]
    res = subprocess.run(
        [*cmd, __import__("json").dumps({k: str(v) for k, v in CONFIGS.items()})],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900, check=False,
    )
    assert res.returncode == 0, res.stderr
    peaks = __import__("json").loads(res.stdout.strip().splitlines()[-1])
    for family, peak in peaks.items():
        assert peak < 20 * h * w, f"{family}: {peak / (h * w):.1f} bytes per pixel"


# ------------------------------------------------------------------------------ big files

_READ_SCRIPT = r"""
import sys, time
from minidet.imageio import ImageReadError, read_image

def kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))

base = kib("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current RSS
t = time.perf_counter()
try:
    read_image(sys.argv[1])
    print("read")
except ImageReadError as e:
    print(e)
print((kib("VmHWM") - base) * 1024, time.perf_counter() - t)
"""


def _sparse(path: Path, start: bytes, size: int = 2 * GIB) -> Path:
    with open(path, "wb") as f:
        f.write(start)
        f.truncate(size)  # a hole: no disk, no memory, until someone reads it
    return path


def _small_jpeg() -> bytes:
    return cv2.imencode(".jpg", structured_image(48, 64, seed=2))[1].tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jpeg header", "zeros"])
def test_2gb_file_is_refused_unread(tmp_path, kind):
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    """A 2 GB file named .jpg is refused in one line from its first bytes, in a process that stays
    small: a JPEG header announcing 64 x 48 pixels, or no image format at all."""
    path = _sparse(tmp_path / "huge.jpg", _small_jpeg() if kind == "jpeg header" else b"")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", _READ_SCRIPT, str(path)], capture_output=True, text=True, env=env,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    message, numbers = res.stdout.strip().splitlines()
    hwm, seconds = (float(v) for v in numbers.split())
    if kind == "zeros":
        assert message == f"{path}: not a recognized image format"
    else:
        big = f"{path}: file is {2 * GIB} bytes, implausibly large for a 64 x 48 image (3072 pixels"
        assert message.startswith(big), message
    assert hwm < 16 * 2**20, hwm  # the peak growth while reading: reading the file would be 2 GB
    assert seconds < 5


def test_large_file_without_a_header_size_is_bounded_by_the_pixel_limit(tmp_path):
    # a JPEG start with no frame header in reach: the file may hold at most MAX_PIXELS pixels
    start = b"\xff\xd8" + b"\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    path = _sparse(tmp_path / "noframe.jpg", start)
    t = time.perf_counter()
    with pytest.raises(ImageReadError) as info:
        read_image(str(path), max_pixels=1_000_000)
    assert time.perf_counter() - t < 5
    assert info.value.reason.startswith(f"file is {2 * GIB} bytes, implausibly large for INPUT.MAX_PIXELS (1000000")


def test_plausible_file_sizes_are_read(tmp_path):
    """The bound leaves room for real files: a noisy 16-bit RGBA PNG (the densest layout decoded,
    8 bytes per pixel) and a JPEG with 20 MB of metadata after its header."""
    rng = np.random.default_rng(0)
    noisy = rng.integers(0, 65536, (200, 300, 4), dtype=np.uint16)
    path = tmp_path / "noise16.png"
    assert cv2.imwrite(str(path), noisy, [cv2.IMWRITE_PNG_COMPRESSION, 0])
    assert os.path.getsize(path) > 8 * 200 * 300
    assert read_image(str(path)).shape == (200, 300, 3)
    jpg = _small_jpeg()
    padded = jpg[:-2] + b"\x00" * (20 * 2**20) + jpg[-2:]  # junk before EOI: libjpeg skips it, warns
    path = tmp_path / "padded.jpg"
    path.write_bytes(padded)
    warnings: list[str] = []
    assert read_image(str(path), on_warning=warnings.append).shape == (48, 64, 3)
    assert len(warnings) == 1 and "extraneous bytes" in warnings[0]


def test_tiff_directory_after_the_image_data_is_parsed(tmp_path):
    """libtiff writes the directory after the strips: the header is found with a seek, and a size
    bomb in it is refused before decoding, even when it lies beyond the first 64 KiB."""
    data = bytearray(cv2.imencode(".tif", structured_image(300, 400, seed=4))[1].tobytes())
    ifd = int.from_bytes(data[4:8], "little")
    assert ifd > imageio.HEAD_BYTES  # the premise: the directory is not in the first bytes
    for k in range(int.from_bytes(data[ifd : ifd + 2], "little")):
        entry = ifd + 2 + 12 * k
        tag, typ = struct.unpack_from("<HH", data, entry)
        if tag in (256, 257):  # ImageWidth, ImageLength
            struct.pack_into("<H" if typ == 3 else "<I", data, entry + 8, 20000)
    path = tmp_path / "bomb.tif"
    path.write_bytes(bytes(data))
    with pytest.raises(ImageReadError, match=r"20000 x 20000 = 400000000 pixels exceeds INPUT.MAX_PIXELS"):
        read_image(str(path))


def test_jpeg_frame_header_after_large_metadata(tmp_path):
    jpg = bytearray(_small_jpeg())
    app = b"\xff\xe2" + struct.pack(">H", 60000) + b"\x00" * 59998  # three 60 KB APP2 segments
    data = jpg[:2] + app * 3 + jpg[2:]
    sof = data.index(b"\xff\xc0")
    assert sof > imageio.HEAD_BYTES
    data[sof + 5 : sof + 9] = struct.pack(">HH", 20000, 20000)
    path = tmp_path / "meta.jpg"
    path.write_bytes(bytes(data))
    with pytest.raises(ImageReadError, match=r"20000 x 20000 = 400000000 pixels exceeds"):
        read_image(str(path))


# ------------------------------------------------------------------------------ native messages


def _jpeg_extraneous() -> bytes:
    jpg = _small_jpeg()
    # libjpeg reads a few bytes ahead as scan data; the rest: "Corrupt JPEG data: N extraneous bytes ..."
    return jpg[:-2] + b"\x00" * 16 + jpg[-2:]


def _png_bad_icc() -> bytes:
    """A PNG whose iCCP profile's PCS illuminant is not D50: libpng warns, the image decodes."""
    prof = bytearray(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())
    prof[68:80] = b"\x00\x00\x80\x00" * 3
    bio = io.BytesIO()
    Image.fromarray(structured_image(40, 56, seed=5)).save(bio, "PNG", icc_profile=bytes(prof))
    return bio.getvalue()


def _png_bad_text_crc() -> bytes:
    png = cv2.imencode(".png", structured_image(40, 56, seed=6))[1].tobytes()
    body = b"tEXtComment\x00made by a test"
    chunk = struct.pack(">I", len(body) - 4) + body + b"\x00\x00\x00\x00"  # wrong CRC: libpng warns
    return png[:33] + chunk + png[33:]


needs_pil = pytest.mark.skipif(Image is None, reason="PIL writes the ICC profile")


@needs_pil
def test_native_messages_become_one_warning(capfd):
    cases = {"a.jpg": _jpeg_extraneous(), "b.png": _png_bad_icc(), "c.png": _png_bad_text_crc()}
    said: dict[str, str] = {}
    for name, data in cases.items():
        got: list[str] = []
        assert read_image_bytes(data, name, on_warning=got.append).ndim == 3
        assert len(got) == 1 and got[0].startswith(f"{name}: ") and "decoded anyway" in got[0], got
        assert "\n" not in got[0]
        said[name] = got[0]
    assert "Corrupt JPEG data" in said["a.jpg"] and "libpng warning" in said["b.png"] + said["c.png"]
    assert capfd.readouterr().err == ""  # nothing reached fd 2
    read_image_bytes(cases["a.jpg"], "a.jpg")  # the default: one line on stderr
    assert capfd.readouterr().err.splitlines() == [f"warning: {said['a.jpg']}"]


def test_native_messages_shown_when_asked(capfd, monkeypatch):
    monkeypatch.setattr(imageio, "SHOW_NATIVE_MESSAGES", True)  # what a tool's --debug sets
    got: list[str] = []
    read_image_bytes(_jpeg_extraneous(), "a.jpg", on_warning=got.append)
    assert got == []
    assert "Corrupt JPEG data" in capfd.readouterr().err


def test_fd2_restored_with_threads(capfd):
    """Decoding from several threads at once: every warning is for its own file, fd 2 is back."""
    data = _jpeg_extraneous()
    found: dict[int, list[str]] = {}

    def work(k: int) -> None:
        found[k] = []
        for _ in range(10):
            read_image_bytes(data, f"t{k}.jpg", on_warning=found[k].append)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(v) == 10 and all(m.startswith(f"t{k}.jpg: ") for m in v) for k, v in found.items())
    os.write(2, b"still here\n")
    assert capfd.readouterr().err == "still here\n"


# ------------------------------------------------------------------------------ through infer.py

FAST = [
    "INPUT.MIN_SIZE_TEST", "160", "INPUT.MAX_SIZE_TEST", "1333",
    "MODEL.RPN.PRE_NMS_TOPK_TEST", "300", "MODEL.RPN.POST_NMS_TOPK_TEST", "100",
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "0.0", "MODEL.ROI_HEADS.DETECTIONS_PER_IMAGE", "5",
]


@pytest.mark.slow
@needs_pil
@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
def test_infer_warns_once_per_damaged_image(tmp_path, tv_file_init):
    """Through tools/infer.py: a corrupt-but-decodable JPEG and PNGs libpng warns about give one
    ``warning: <file>: ...`` line each and their outputs; no raw library line reaches stderr; the
    2 GB files are one error line each, found without reading them."""
    images = tmp_path / "images"
    images.mkdir()
    warned = {"extra.jpg": _jpeg_extraneous(), "icc.png": _png_bad_icc(), "crc.png": _png_bad_text_crc()}
    for name, data in warned.items():
        (images / name).write_bytes(data)
    cv2.imwrite(str(images / "good.jpg"), structured_image(60, 80, seed=8))
    _sparse(images / "huge.jpg", _small_jpeg())
    _sparse(images / "zeros.jpg", b"")
    out = tmp_path / "out"
    res = run_tool(INFER, "--config-file", str(CONFIGS["torchvision"]), "--input", str(images), "--output", str(out),
                   "MODEL.WEIGHTS", str(tv_file_init), *FAST, cwd=tmp_path, threads=1, timeout=900)
    assert res.returncode == 1, res.stderr  # the two huge files failed
    lines = res.stderr.splitlines()
    for name in warned:
        mine = [line for line in lines if line.startswith(f"warning: {images / name}: ")]
        assert len(mine) == 1, (name, res.stderr)
        assert (out / f"{Path(name).stem}.json").is_file() and (out / f"{Path(name).stem}.jpg").is_file()
    others = [line for line in lines if not line.startswith(("warning: ", "error: "))]
    for raw in ("libpng", "Corrupt JPEG", "Premature end", "extraneous"):
        assert not any(raw in line for line in others), res.stderr
    errors = [line for line in lines if line.startswith("error: ")]
    assert sorted(errors) == sorted([
        next(e for e in errors if e.startswith(f"error: {images / 'huge.jpg'}: file is {2 * GIB} bytes")),
        f"error: {images / 'zeros.jpg'}: not a recognized image format",
    ]), res.stderr
    assert (out / "good.json").is_file()
