"""Image reading: formats, bit depths, EXIF orientation, bad files, pixel limit, input listing."""

from __future__ import annotations

import io
import os
import pickle
import struct
import zlib

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minidet.apps.bulk.inputs import find_inputs
from minidet.apps.synthetic import structured_image
from minidet.imageio import (
    DEFAULT_MAX_PIXELS,
    ImageReadError,
    header_size,
    read_image,
    read_image_bytes,
    sniff_format,
)

try:
    from PIL import Image, ImageOps
except ImportError:  # PIL is only a test helper here, never a minidet dependency
    Image = ImageOps = None

def list_images(inputs: list[str]) -> list[str]:
    return [p for p, _ in find_inputs(inputs)[0]]


needs_pil = pytest.mark.skipif(Image is None, reason="PIL is not installed; it is needed to write this format")


def _encode(img: np.ndarray, ext: str, params: list[int] | None = None) -> bytes:
    ok, buf = cv2.imencode(ext, img, params or [])
    assert ok
    return buf.tobytes()


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def _pil_bytes(img, fmt: str, **kw) -> bytes:
    bio = io.BytesIO()
    img.save(bio, fmt, **kw)
    return bio.getvalue()


def _exif_segment(orientation: int, order: str = "MM") -> bytes:
    """A JPEG APP1 segment holding an EXIF IFD0 with just the Orientation tag."""
    e = ">" if order == "MM" else "<"
    magic = b"MM\x00*" if order == "MM" else b"II*\x00"
    ifd = struct.pack(e + "H", 1) + struct.pack(e + "HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(e + "I", 0)
    payload = b"Exif\x00\x00" + magic + struct.pack(e + "I", 8) + ifd
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def _with_exif(jpeg: bytes, orientation: int, order: str = "MM") -> bytes:
    assert jpeg[:2] == b"\xff\xd8"
    return jpeg[:2] + _exif_segment(orientation, order) + jpeg[2:]


# Displayed image from the stored one, per EXIF orientation value (TIFF/EXIF spec).
ORIENT = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1, :],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, k=-1),
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
    8: lambda a: np.rot90(a, k=1),
}


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _forged_png(width: int, height: int) -> bytes:
    """A valid-looking PNG header announcing a huge image, with almost no pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def img():
    return structured_image(48, 64, seed=3)


# ---------------------------------------------------------------- good images


def test_color_png_exact(tmp_path, img):
    out = read_image(_write(tmp_path / "a.png", _encode(img, ".png")))
    assert out.dtype == np.uint8 and out.shape == (48, 64, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, img)


def test_jpeg_matches_cv2_imread(tmp_path, img):
    path = _write(tmp_path / "a.jpg", _encode(img, ".jpg"))
    np.testing.assert_array_equal(read_image(path), cv2.imread(path))


def test_grayscale_png(tmp_path, img):
    gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    out = read_image(_write(tmp_path / "g.png", _encode(gray, ".png")))
    assert out.shape == (48, 64, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[:, :, c], gray)


def test_rgba_png_drops_alpha(tmp_path, img):
    bgra = np.dstack([img, np.linspace(0, 255, 48 * 64).reshape(48, 64).astype(np.uint8)])
    out = read_image(_write(tmp_path / "a.png", _encode(bgra, ".png")))
    np.testing.assert_array_equal(out, img)  # colour kept as stored, not blended with a background


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_16bit_png_rounds_to_8bit(tmp_path, channels):
    # v/257 rounds to nearest: 257*100+128 -> 100 (100.498), 257*100+129 -> 101 (100.502); >>8 would give 100.
    values = np.array([0, 1, 128, 129, 257 * 100 + 128, 257 * 100 + 129, 65534, 65535], np.uint16)
    expect = np.array([0, 0, 0, 1, 100, 101, 255, 255], np.uint8)
    plane = np.tile(values, (3, 1))
    arr = plane if channels == 1 else np.dstack([plane] * channels)
    if channels == 4:
        arr[:, :, 3] = 1000  # alpha: dropped
    out = read_image(_write(tmp_path / "d.png", _encode(arr, ".png")))
    assert out.dtype == np.uint8 and out.shape == (3, 8, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[1, :, c], expect)


@needs_pil
def test_palette_png(tmp_path):
    rgb_palette = [255, 0, 0, 0, 255, 0, 0, 0, 255, 250, 200, 10]
    idx = (np.arange(24).reshape(4, 6) % 4).astype(np.uint8)
    pim = Image.fromarray(idx, mode="P")
    pim.putpalette(rgb_palette)
    out = read_image(_write(tmp_path / "p.png", _pil_bytes(pim, "PNG")))
    lut_bgr = np.array(rgb_palette, np.uint8).reshape(4, 3)[:, ::-1]
    np.testing.assert_array_equal(out, lut_bgr[idx])


@needs_pil
def test_gray_alpha_png(tmp_path):
    la = np.dstack([np.full((5, 7), 77, np.uint8), np.full((5, 7), 9, np.uint8)])
    out = read_image(_write(tmp_path / "la.png", _pil_bytes(Image.fromarray(la, mode="LA"), "PNG")))
    assert out.shape == (5, 7, 3) and np.all(out == 77)


@needs_pil
def test_cmyk_jpeg(tmp_path, img):
    rgb = np.ascontiguousarray(img[:, :, ::-1])
    data = _pil_bytes(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    out = read_image(_write(tmp_path / "cmyk.jpg", data))
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[:, :, ::-1]
    assert out.shape == img.shape
    assert np.abs(out.astype(int) - ref.astype(int)).max() <= 3


@pytest.mark.parametrize("order", ["MM", "II"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation(tmp_path, img, orientation, order):
    plain = _encode(img, ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 95])
    stored = cv2.imdecode(np.frombuffer(plain, np.uint8), cv2.IMREAD_COLOR)
    data = _with_exif(plain, orientation, order)
    out = read_image(_write(tmp_path / f"o{orientation}.jpg", data))
    np.testing.assert_array_equal(out, ORIENT[orientation](stored))
    if Image is not None:  # independent reference for the orientation convention
        ref = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))))[:, :, ::-1]
        assert ref.shape == out.shape
        assert np.abs(ref.astype(int) - out.astype(int)).mean() < 2


def test_png_named_jpg(tmp_path, img):
    out = read_image(_write(tmp_path / "really_png.jpg", _encode(img, ".png")))
    np.testing.assert_array_equal(out, img)


@pytest.mark.parametrize("ext", [".png", ".jpg", ".bmp"])
def test_one_pixel(tmp_path, ext):
    px = np.array([[[10, 200, 30]]], np.uint8)
    out = read_image(_write(tmp_path / f"one{ext}", _encode(px, ext)))
    assert out.shape == (1, 1, 3)
    if ext != ".jpg":
        np.testing.assert_array_equal(out, px)


@pytest.mark.parametrize("shape", [(10000, 16), (16, 10000)])
def test_extreme_aspect_ratio(tmp_path, shape):
    arr = np.zeros((*shape, 3), np.uint8)
    arr[::7, ::3] = (5, 150, 250)
    out = read_image(_write(tmp_path / "long.png", _encode(arr, ".png")))
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize("ext", [".bmp", ".webp", ".tif", ".tiff"])
def test_other_formats(tmp_path, img, ext):
    params = [cv2.IMWRITE_WEBP_QUALITY, 101] if ext == ".webp" else []  # 101 = lossless
    out = read_image(_write(tmp_path / f"a{ext}", _encode(img, ext, params)))
    np.testing.assert_array_equal(out, img)


def test_unicode_path(tmp_path, img):
    out = read_image(_write(tmp_path / "bild_äöü_画像.png", _encode(img, ".png")))
    np.testing.assert_array_equal(out, img)


def test_read_image_bytes(img):
    out = read_image_bytes(_encode(img, ".png"), "mem.png")
    np.testing.assert_array_equal(out, img)
    with pytest.raises(ImageReadError, match=r"^upload-7: "):
        read_image_bytes(b"nope", "upload-7")


# ---------------------------------------------------------------- bad files


def _read_error(path, **kw) -> ImageReadError:
    with pytest.raises(ImageReadError) as info:
        read_image(str(path), **kw)
    err = info.value
    assert "\n" not in str(err)
    assert str(err).startswith(f"{path}: ")
    return err


def test_missing_file(tmp_path):
    assert "not found" in _read_error(tmp_path / "nope.jpg").reason


def test_directory(tmp_path):
    assert "directory" in _read_error(tmp_path).reason


def test_zero_bytes(tmp_path):
    assert "empty" in _read_error(_write(tmp_path / "z.jpg", b"")).reason


@pytest.mark.parametrize("ext", [".jpg", ".png"])
@pytest.mark.parametrize("frac", [0.05, 0.5, 0.95])
def test_truncated(tmp_path, img, ext, frac):
    data = _encode(structured_image(120, 160, seed=5), ext)
    err = _read_error(_write(tmp_path / f"t{ext}", data[: int(len(data) * frac)]))
    assert "truncated or corrupt" in err.reason
    assert ("JPEG" if ext == ".jpg" else "PNG") in err.reason


def test_text_named_jpg(tmp_path):
    err = _read_error(_write(tmp_path / "notes.jpg", b"this is not an image\n"))
    assert "not a recognized image format" in err.reason


@pytest.mark.parametrize("text", [b"BM but really a text file, long enough to look like a header", b"P6 no"])
def test_text_with_image_like_start(text):
    with pytest.raises(ImageReadError, match=r"^t: (not a recognized image format|cannot decode PNM)"):
        read_image_bytes(text, "t")


def test_pixel_limit(tmp_path, img):
    path = _write(tmp_path / "a.png", _encode(img, ".png"))
    err = _read_error(path, max_pixels=48 * 64 - 1)
    assert err.reason == f"64 x 48 = {48 * 64} pixels exceeds INPUT.MAX_PIXELS ({48 * 64 - 1})"
    assert read_image(path, max_pixels=48 * 64).shape == (48, 64, 3)  # the limit itself is allowed
    assert read_image(path, max_pixels=0).shape == (48, 64, 3)  # 0 = no limit


def test_pixel_limit_checked_before_decoding(tmp_path):
    # 60000 x 60000 x 3 bytes would be ~10 GB; the header alone must be enough to refuse it.
    err = _read_error(_write(tmp_path / "bomb.png", _forged_png(60000, 60000)))
    assert f"60000 x 60000 = 3600000000 pixels exceeds INPUT.MAX_PIXELS ({DEFAULT_MAX_PIXELS})" in err.reason


def test_pixel_limit_jpeg_header(tmp_path, img):
    data = bytearray(_encode(img, ".jpg"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", 50000, 40000)  # height, width
    err = _read_error(_write(tmp_path / "big.jpg", bytes(data)), max_pixels=10**9)
    assert "40000 x 50000 = 2000000000 pixels" in err.reason


def test_error_is_picklable_and_single_line():
    err = ImageReadError("a/b.jpg", "something\nwent   wrong")
    assert str(err) == "a/b.jpg: something went wrong"
    again = pickle.loads(pickle.dumps(err))
    assert (again.path, again.reason, str(again)) == (err.path, err.reason, str(err))


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".webp", ".tif"])
def test_header_size_matches_decoder(ext):
    im = structured_image(37, 53, seed=1)
    data = _encode(im, ext)
    assert header_size(data) == (37, 53)
    assert sniff_format(data) is not None


@needs_pil
@pytest.mark.parametrize(("fmt", "kw"), [("WEBP", {"lossless": True}), ("WEBP", {"quality": 70}), ("GIF", {})])
def test_header_size_pil_variants(fmt, kw):
    im = Image.fromarray(structured_image(21, 34, seed=2))
    if fmt == "WEBP" and "quality" in kw:
        im = im.convert("RGBA")  # lossy + alpha -> VP8X container
    assert header_size(_pil_bytes(im, fmt, **kw)) == (21, 34)


def test_header_size_unknown():
    assert header_size(b"hello") is None
    assert header_size(b"\xff\xd8\xff") is None  # JPEG signature, no frame header
    assert header_size(b"\x89PNG\r\n\x1a\n") is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_files_raise_only_image_read_error(data):
    """Cut or corrupted files either decode to a valid image or raise ImageReadError."""
    ext = data.draw(st.sampled_from([".jpg", ".png"]))
    raw = bytearray(_encode(structured_image(24, 32, seed=0), ext))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    else:
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        out = read_image_bytes(bytes(raw), "fuzz" + ext)
    except ImageReadError as e:
        assert str(e).startswith("fuzz") and "\n" not in str(e)
    else:
        assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3


# ---------------------------------------------------------------- listing inputs


def _touch(path) -> str:
    _write(path, b"x")
    return str(path)


def test_list_folder(tmp_path):
    for name in ["b.JPG", "a.png", "c.jpeg", "d.TIFF", "e.webp", "f.bmp", "g.tif", "notes.txt", "h.gif"]:
        _touch(tmp_path / name)
    os.mkdir(tmp_path / "sub.jpg")
    _touch(tmp_path / "sub.jpg" / "inner.jpg")
    got = [os.path.basename(p) for p in list_images([str(tmp_path)])]
    assert got == ["a.png", "b.JPG", "c.jpeg", "d.TIFF", "e.webp", "f.bmp", "g.tif"]


def test_list_explicit_files_kept(tmp_path):
    odd = _touch(tmp_path / "scan.weird")
    bad = _touch(tmp_path / "broken.jpg")
    assert list_images([odd, bad]) == [odd, bad]


def test_list_glob_and_dedupe(tmp_path):
    a, b = _touch(tmp_path / "x1.jpg"), _touch(tmp_path / "x2.png")
    _touch(tmp_path / "x3.txt")
    got = list_images([str(tmp_path / "x*"), a])
    assert got == [a, b]


def test_list_missing(tmp_path):
    missing = str(tmp_path / "nothing_here.jpg")
    with pytest.raises(FileNotFoundError, match="nothing_here.jpg") as info:
        list_images([missing])
    assert "\n" not in str(info.value)
    with pytest.raises(FileNotFoundError, match=r"\*\.png"):
        list_images([str(tmp_path / "*.png")])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        list_images([str(empty)])


def test_native_call_runs_the_call_once_when_it_raises_an_oserror():
    """A call that fails with an OSError of its own (a ConnectionError is one) is not run a second time."""
    from minidet.imageio import native_call

    calls = []

    def connect():
        calls.append(1)
        raise ConnectionError("nothing listens")

    with pytest.raises(ConnectionError):
        native_call(connect)
    assert calls == [1]
