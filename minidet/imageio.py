"""Robust image reading (always HxWx3 uint8 BGR) and input listing.

Every failure to read one image raises :class:`ImageReadError` with a one-line message
``"<file>: <what is wrong>"``, so a batch tool can report it and go on.

Decoding uses OpenCV with ``IMREAD_COLOR | IMREAD_ANYDEPTH``: that applies the EXIF
orientation (so a rotated phone JPEG comes out the way viewers show it), drops an alpha
channel, expands grayscale and palette images to three channels and converts CMYK JPEGs,
while keeping 16-bit samples, which are then rounded to 8 bits here (``v / 257``).

The pixel limit is checked from the file header where the format is simple to parse
(PNG, JPEG, BMP, GIF, WebP, TIFF), so a small file announcing a gigantic image is refused
before any memory is allocated; other formats are checked after decoding.
"""

from __future__ import annotations

import glob
import os

import cv2
import numpy as np

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
DEFAULT_MAX_PIXELS = 100_000_000


class ImageReadError(Exception):
    """One image could not be read; ``str(err)`` is ``"<path>: <reason>"`` on one line."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = str(path)
        self.reason = " ".join(str(reason).split())
        super().__init__(f"{self.path}: {self.reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


def read_image(path: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Read an image file as an HxWx3 uint8 BGR array in its displayed orientation.

    ``max_pixels`` > 0 refuses images with more than that many pixels (``INPUT.MAX_PIXELS``);
    0 disables the check. Raises :class:`ImageReadError` for any problem with the file.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ImageReadError(path, "file not found") from None
    except IsADirectoryError:
        raise ImageReadError(path, "is a directory, not an image file") from None
    except PermissionError:
        raise ImageReadError(path, "permission denied") from None
    except OSError as e:
        raise ImageReadError(path, f"cannot read file ({e.strerror or e})") from None
    return read_image_bytes(data, path, max_pixels)


def read_image_bytes(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode encoded image bytes like :func:`read_image`; ``name`` is used in error messages."""
    data = bytes(data)
    if not data:
        raise ImageReadError(name, "empty file (0 bytes)")
    fmt = sniff_format(data)
    size = header_size(data)
    if size is not None:
        _check_pixels(name, size[0], size[1], max_pixels)
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_ANYDEPTH)
    except cv2.error as e:
        raise ImageReadError(name, f"cannot decode image ({getattr(e, 'err', '') or e})") from None
    if img is None:
        if fmt is None:
            raise ImageReadError(name, "not a recognized image format")
        if fmt == "HEIF/AVIF":
            raise ImageReadError(name, "HEIF/AVIF images are not supported; convert to JPEG or PNG")
        raise ImageReadError(name, f"cannot decode {fmt} data (truncated or corrupt)")
    _check_pixels(name, img.shape[0], img.shape[1], max_pixels)
    return _to_bgr8(img, name)


def _check_pixels(name: str, height: int, width: int, max_pixels: int) -> None:
    n = int(height) * int(width)
    if max_pixels > 0 and n > max_pixels:
        raise ImageReadError(name, f"{width} x {height} = {n} pixels exceeds INPUT.MAX_PIXELS ({max_pixels})")


def _to_bgr8(img: np.ndarray, name: str) -> np.ndarray:
    """Normalize a decoded array to contiguous HxWx3 uint8 BGR."""
    if img.dtype == np.uint16:
        img = ((img.astype(np.uint32) + 128) // 257).astype(np.uint8)
    elif img.dtype != np.uint8:
        raise ImageReadError(name, f"unsupported sample type {img.dtype} (only 8- and 16-bit images)")
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    if img.ndim == 2:
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    elif img.ndim == 3 and img.shape[2] == 4:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2BGR)
    elif not (img.ndim == 3 and img.shape[2] == 3):
        raise ImageReadError(name, f"unsupported image layout {tuple(img.shape)}")
    return np.ascontiguousarray(img)


_BMP_HEADER_SIZES = (12, 16, 40, 52, 56, 64, 108, 124)  # the DIB header variants


def sniff_format(data: bytes) -> str | None:
    """Name of the image format announced by the first bytes of ``data``, or None."""
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data.startswith(b"BM") and int.from_bytes(data[14:18], "little") in _BMP_HEADER_SIZES:
        return "BMP"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    if data[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "TIFF"
    if data.startswith((b"\x00\x00\x00\x0cjP  ", b"\xff\x4f\xff\x51")):
        return "JPEG 2000"
    if len(data) > 2 and data[0:1] == b"P" and data[1:2] in b"123456" and data[2:3].isspace():
        return "PNM"
    if data[4:8] == b"ftyp" and data[8:12] in (b"heic", b"heix", b"mif1", b"msf1", b"avif", b"avis"):
        return "HEIF/AVIF"
    return None


_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def header_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` stored in the header of a PNG, JPEG, BMP, GIF, WebP or TIFF.

    Returns None for other formats, malformed headers, or a zero dimension. The size is
    the stored one, before any EXIF rotation (which does not change the pixel count).
    """
    try:
        size = _parse_header(data)
    except (IndexError, ValueError):
        return None
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return size


def _u(data: bytes, start: int, n: int, order: str) -> int:
    chunk = data[start : start + n]
    if len(chunk) != n:
        raise ValueError("short header")
    return int.from_bytes(chunk, order)


def _parse_header(data: bytes) -> tuple[int, int] | None:
    fmt = sniff_format(data)
    if fmt == "PNG" and data[12:16] == b"IHDR":
        return _u(data, 20, 4, "big"), _u(data, 16, 4, "big")
    if fmt == "JPEG":
        return _jpeg_size(data)
    if fmt == "GIF":
        return _u(data, 8, 2, "little"), _u(data, 6, 2, "little")
    if fmt == "BMP":
        if _u(data, 14, 4, "little") == 12:  # OS/2 BITMAPCOREHEADER
            return _u(data, 20, 2, "little"), _u(data, 18, 2, "little")
        height = int.from_bytes(data[22:26], "little", signed=True)
        return abs(height), _u(data, 18, 4, "little")
    if fmt == "WebP":
        return _webp_size(data)
    if fmt == "TIFF":
        return _tiff_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            return None
        if marker in _JPEG_SOF:
            return _u(data, i + 5, 2, "big"), _u(data, i + 7, 2, "big")
        i += 2 + _u(data, i + 2, 2, "big")
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X":
        return 1 + _u(data, 27, 3, "little"), 1 + _u(data, 24, 3, "little")
    if chunk == b"VP8L" and data[20] == 0x2F:
        bits = _u(data, 21, 4, "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        return _u(data, 28, 2, "little") & 0x3FFF, _u(data, 26, 2, "little") & 0x3FFF
    return None


def _tiff_size(data: bytes) -> tuple[int, int] | None:
    order = "little" if data[:2] == b"II" else "big"
    if _u(data, 2, 2, order) != 42:  # BigTIFF: leave it to the post-decode check
        return None
    ifd = _u(data, 4, 4, order)
    found: dict[int, int] = {}
    for k in range(_u(data, ifd, 2, order)):
        entry = ifd + 2 + 12 * k
        tag, typ = _u(data, entry, 2, order), _u(data, entry + 2, 2, order)
        if tag in (256, 257):  # ImageWidth, ImageLength: SHORT or LONG
            found[tag] = _u(data, entry + 8, 2 if typ == 3 else 4, order)
    if 256 in found and 257 in found:
        return found[257], found[256]
    return None


def _has_glob_magic(s: str) -> bool:
    return any(c in s for c in "*?[")


def _is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def list_images(inputs: list[str]) -> list[str]:
    """Expand files, folders and glob patterns into a list of image paths.

    A folder contributes its image files (extensions in :data:`IMAGE_EXTENSIONS`, any case;
    not recursive; sorted by name). A glob pattern contributes the matching image files,
    sorted. A file named explicitly is kept whatever its extension, so a bad file is
    reported by :func:`read_image` rather than silently skipped. Repeats are dropped.
    Raises FileNotFoundError naming the first input that yields no image.
    """
    found: list[str] = []
    for item in inputs:
        item = os.fspath(item)
        if os.path.isdir(item):
            names = sorted(n for n in os.listdir(item) if _is_image_name(n))
            paths = [os.path.join(item, n) for n in names]
            paths = [p for p in paths if os.path.isfile(p)]
            if not paths:
                raise FileNotFoundError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in folder: {item}")
        elif os.path.lexists(item):
            paths = [item]
        elif _has_glob_magic(item):
            paths = sorted(p for p in glob.glob(item) if os.path.isfile(p) and _is_image_name(p))
            if not paths:
                raise FileNotFoundError(f"no image files match: {item}")
        else:
            raise FileNotFoundError(f"no such file or folder: {item}")
        found.extend(paths)
    unique: list[str] = []
    seen: set[str] = set()
    for p in found:
        key = os.path.abspath(p)
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique
