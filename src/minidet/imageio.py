"""Robust image reading (always HxWx3 uint8 BGR; any failure one :class:`ImageReadError`) and input listing.

OpenCV decodes (EXIF orientation applied, alpha dropped, 16-bit samples rounded to 8 bits). A file in no known
format, or whose header or size shows more than the pixel limit, is refused before it is read whole."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator

import cv2
import numpy as np

from .errors import InputError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
# A whole run of an image peaks at about 1.1 GB plus 21 bytes per pixel with its drawing (18 without), 100 detections
# (masks kept as their boxes' crops; docs/large_images.md): 125 MP stays within 4 GB, and a Sentinel-2 tile
# (10980 x 10980, 120.6 MP) is read.
DEFAULT_MAX_PIXELS = 125_000_000
# A file may have at most 16 bytes (twice 16-bit RGBA) per pixel its header announces (else per INPUT.MAX_PIXELS)
MAX_BYTES_PER_PIXEL = 16
METADATA_BYTES = 64 * 2**20  # plus ample room for metadata (EXIF, ICC, previews)
HEAD_BYTES = 64 * 1024  # read first, to sniff the format and parse the header
SHOW_NATIVE_MESSAGES = False  # True: the native decoders' messages reach fd 2 as they are (a tool's --debug)
FD2_LOCK = threading.Lock()  # file descriptor 2 is shared by all threads
_BMP_HEADER_SIZES = (12, 16, 40, 52, 56, 64, 108, 124)  # the DIB header variants
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_OPEN_ERRORS = ((FileNotFoundError, "file not found"), (IsADirectoryError, "is a directory, not an image file"),
                (PermissionError, "permission denied"))
_MAGIC = {  # format: the first bytes announcing it (BMP, WebP, PNM and HEIF/AVIF: see sniff_format)
    "JPEG": (b"\xff\xd8\xff",), "PNG": (b"\x89PNG\r\n\x1a\n",), "GIF": (b"GIF87a", b"GIF89a"),
    "TIFF": (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"), "Sun raster": (b"\x59\xa6\x6a\x95",),
    "JPEG 2000": (b"\x00\x00\x00\x0cjP  ", b"\xff\x4f\xff\x51"), "Radiance HDR": (b"#?RADIANCE", b"#?RGBE"),
}


class ImageReadError(InputError):
    """One image could not be read; ``str(err)`` is ``"<path>: <reason>"`` on one line. ``too_large``: refused for
    its pixel count (a server answers it with 413, not 400)."""

    def __init__(self, path: str, reason: str, too_large: bool = False) -> None:
        self.path = str(path)
        self.reason = " ".join(str(reason).split())
        self.too_large = too_large
        super().__init__(f"{self.path}: {self.reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.too_large))


def read_image(path: str, max_pixels: int = DEFAULT_MAX_PIXELS,
               on_warning: Callable[[str], None] | None = None) -> np.ndarray:
    """Read an image file as an HxWx3 uint8 BGR array in its displayed orientation; :class:`ImageReadError` for
    any problem, more than ``max_pixels`` pixels included (0: no limit). A file decoded although its decoder
    complained calls ``on_warning("<path>: <what>")`` (default: ``warning: ...`` on stderr)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = _read_checked(f, path, max_pixels)
    except OSError as e:
        reason = next((r for t, r in _OPEN_ERRORS if isinstance(e, t)), f"cannot read file ({e.strerror or e})")
        raise ImageReadError(path, reason) from None
    return read_image_bytes(data, path, max_pixels, on_warning)


def _read_checked(f, name: str, max_pixels: int) -> bytes:
    """The whole file, once its first bytes show an image of acceptable size and file size."""
    head = f.read(HEAD_BYTES)
    st = os.fstat(f.fileno())
    regular = stat.S_ISREG(st.st_mode)
    _, size = _check_header(name, head, max_pixels, _FileView(f, st.st_size, head) if regular else None)
    pixels = size[0] * size[1] if size is not None else max_pixels
    limit = MAX_BYTES_PER_PIXEL * pixels + METADATA_BYTES if pixels > 0 else None
    if regular:
        if limit is not None and st.st_size > limit:
            raise ImageReadError(name, _too_large(st.st_size, size, pixels))
        f.seek(0)
        return f.read()
    chunks, total = [head], len(head)  # a pipe or a device: read on, up to the limit
    while chunk := f.read(1 << 20):
        total += len(chunk)
        if limit is not None and total > limit:
            raise ImageReadError(name, _too_large(total, size, pixels))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(nbytes: int, size: tuple[int, int] | None, pixels: int) -> str:
    what = f"a {size[1]} x {size[0]} image ({pixels} pixels)" if size else f"INPUT.MAX_PIXELS ({pixels} pixels)"
    return (f"file is {nbytes} bytes, implausibly large for {what}: images take at most "
            f"{MAX_BYTES_PER_PIXEL} bytes per pixel + {METADATA_BYTES >> 20} MiB of metadata; not read")


def _check_header(name: str, data: bytes, max_pixels: int, view: _FileView | None = None) -> tuple[str, tuple | None]:
    """``(format, (height, width) or None)`` of ``data`` (its first bytes at least; the header read from ``view`` if
    given); :class:`ImageReadError` if it is empty, of no known format or shows more than ``max_pixels`` pixels."""
    fmt = sniff_format(data)
    if fmt is None:
        raise ImageReadError(name, "not a recognized image format" if data else "empty file (0 bytes)")
    size = header_size(data if view is None else view)
    _check_pixels(name, size, max_pixels)
    return fmt, size


def check_image_bytes(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[str, tuple | None]:
    """What :func:`read_image_bytes` checks before decoding, alone: ``(format, (height, width) or None)``;
    :class:`ImageReadError` for empty bytes, no known format or more pixels than ``max_pixels`` in the header."""
    return _check_header(name, data if isinstance(data, bytes) else bytes(data), max_pixels)


def read_image_bytes(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS,
                     on_warning: Callable[[str], None] | None = None) -> np.ndarray:
    """Decode encoded image bytes like :func:`read_image`; ``name`` is used in messages."""
    data = bytes(data)
    fmt, _ = _check_header(name, data, max_pixels)
    try:
        img, native = _imdecode(np.frombuffer(data, np.uint8))
    except cv2.error as e:
        raise ImageReadError(name, f"cannot decode image ({getattr(e, 'err', '') or e})") from None
    if img is None:
        if fmt == "HEIF/AVIF":
            raise ImageReadError(name, "HEIF/AVIF images are not supported; convert to JPEG or PNG")
        said = f": {native}" if native else ""
        raise ImageReadError(name, f"cannot decode {fmt} data (truncated or corrupt){said}")
    if native:
        (on_warning or _print_warning)(f"{name}: {fmt} decoder warning, decoded anyway: {native}")
    _check_pixels(name, img.shape[:2], max_pixels)
    return _to_bgr8(img, name)


@contextlib.contextmanager
def native_messages(show: bool) -> Iterator[None]:
    """Within the block, the native decoders' messages reach fd 2 unchanged if ``show``, else are captured."""
    global SHOW_NATIVE_MESSAGES
    old, SHOW_NATIVE_MESSAGES = SHOW_NATIVE_MESSAGES, show
    try:
        yield
    finally:
        SHOW_NATIVE_MESSAGES = old


def _print_warning(message: str) -> None:
    from tqdm import tqdm  # keeps a progress bar intact; plain text in a DataLoader worker

    tqdm.write(f"warning: {message}", file=sys.stderr)


def _imdecode(buf: np.ndarray) -> tuple[np.ndarray | None, str]:
    """``cv2.imdecode`` and, on one line, what the native decoders printed on fd 2 meanwhile."""
    return native_call(cv2.imdecode, buf, cv2.IMREAD_COLOR | cv2.IMREAD_ANYDEPTH)


def native_call(fn: Callable, *args) -> tuple:
    """``fn(*args)`` and, on one line, what native code (libjpeg, FFmpeg, OpenCV's log) printed on fd 2 meanwhile;
    with :data:`SHOW_NATIVE_MESSAGES` that reaches fd 2 as it is and the text is ''."""
    if SHOW_NATIVE_MESSAGES:
        return fn(*args), ""
    with FD2_LOCK:
        saved, called = None, False
        try:
            saved = os.dup(2)
            with tempfile.TemporaryFile() as tmp:
                if sys.stderr is not None:
                    sys.stderr.flush()
                os.dup2(tmp.fileno(), 2)
                try:
                    called = True
                    result = fn(*args)
                finally:
                    os.dup2(saved, 2)
                tmp.seek(0)
                text = tmp.read(4096).decode("utf-8", "replace")
        except OSError:
            if called:  # fn's own error (a ConnectionError is one): raised, fn is not run again
                raise
            return fn(*args), ""  # no fd 2 or no temporary file: run without capturing
        finally:
            if saved is not None:
                os.close(saved)
    native = "; ".join(" ".join(line.split()) for line in text.splitlines() if line.strip())
    return result, native if len(native) <= 300 else native[:297] + "..."


def _check_pixels(name: str, size: tuple[int, int] | None, max_pixels: int) -> None:
    height, width = size or (0, 0)
    n = height * width
    if max_pixels > 0 and n > max_pixels:
        raise ImageReadError(name, f"{width} x {height} = {n} pixels exceeds INPUT.MAX_PIXELS ({max_pixels})", True)


def uint16_to_uint8(img: np.ndarray) -> np.ndarray:
    """16-bit samples as 8-bit ones, each v as round(v / 257) (0..65535 onto 0..255), any shape; in bands along the
    first axis, so that the uint32 temporaries stay small."""
    out = np.empty(img.shape, np.uint8)
    rows = max(1, (1 << 22) // max(1, img[0].size))
    for i in range(0, img.shape[0], rows):
        out[i : i + rows] = (img[i : i + rows].astype(np.uint32) + 128) // 257
    return out


def _to_bgr8(img: np.ndarray, name: str) -> np.ndarray:
    """Normalize a decoded array to contiguous HxWx3 uint8 BGR."""
    if img.dtype == np.uint16:
        img = uint16_to_uint8(img)
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


def sniff_format(data: bytes) -> str | None:
    """Name of the image format announced by the first bytes of ``data``, or None."""
    for fmt, magic in _MAGIC.items():
        if data.startswith(magic):
            return fmt
    if data.startswith(b"BM") and int.from_bytes(data[14:18], "little") in _BMP_HEADER_SIZES:
        return "BMP"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    if len(data) > 2 and data[0:1] == b"P" and data[1:2] in b"1234567Ff" and data[2:3].isspace():
        return "PNM"  # P1-P6, PAM (P7) and PFM (PF, Pf)
    if data[4:8] == b"ftyp" and data[8:12] in (b"heic", b"heix", b"mif1", b"msf1", b"avif", b"avis"):
        return "HEIF/AVIF"
    return None


def header_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` stored (before EXIF rotation) in the header of a PNG, JPEG, BMP, GIF, WebP or TIFF;
    None for other formats, malformed headers or a zero dimension. ``data``: bytes, or indexable like them."""
    try:
        size = _parse_header(data, sniff_format(data[:32]))
    except (IndexError, ValueError):
        return None
    return size if size is not None and min(size) > 0 else None


class _FileView:
    """A regular file's bytes for the header parsers, read in windows of :data:`HEAD_BYTES` (the first: ``head``);
    after 64 more (4 MiB) a read raises ValueError, so a header that is not found costs little."""

    def __init__(self, f, size: int, head: bytes) -> None:
        self.f, self.size = f, size
        self.start, self.window, self.reads = 0, head, 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: int | slice):
        if isinstance(key, slice):
            start, stop, _ = key.indices(self.size)
            return self._read(start, max(0, stop - start))
        if not 0 <= key < self.size:  # the parsers index from the start only
            raise IndexError(key)
        return self._read(key, 1)[0]

    def _read(self, start: int, n: int) -> bytes:
        if not (self.start <= start and start + n <= self.start + len(self.window)):
            self.reads += 1
            if self.reads > 64:
                raise ValueError("header not found in the first windows read")
            self.f.seek(start)
            self.start, self.window = start, self.f.read(max(n, HEAD_BYTES))
        return self.window[start - self.start : start - self.start + n]


def _u(data: bytes, start: int, n: int, order: str) -> int:
    chunk = data[start : start + n]
    if len(chunk) != n:
        raise ValueError("short header")
    return int.from_bytes(chunk, order)


def _parse_header(data: bytes, fmt: str | None) -> tuple[int, int] | None:
    if fmt == "PNG" and data[12:16] == b"IHDR":
        return _u(data, 20, 4, "big"), _u(data, 16, 4, "big")
    if fmt == "JPEG":
        return _jpeg_size(data)
    if fmt == "GIF":
        return _u(data, 8, 2, "little"), _u(data, 6, 2, "little")
    if fmt == "BMP":
        if _u(data, 14, 4, "little") == 12:  # OS/2 BITMAPCOREHEADER
            return _u(data, 20, 2, "little"), _u(data, 18, 2, "little")
        return abs(int.from_bytes(data[22:26], "little", signed=True)), _u(data, 18, 4, "little")
    if fmt == "WebP":  # the first chunk: extended, lossless or lossy
        chunk = data[12:16]
        if chunk == b"VP8X":
            return 1 + _u(data, 27, 3, "little"), 1 + _u(data, 24, 3, "little")
        if chunk == b"VP8L" and data[20] == 0x2F:
            bits = _u(data, 21, 4, "little")
            return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
        if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
            return _u(data, 28, 2, "little") & 0x3FFF, _u(data, 26, 2, "little") & 0x3FFF
    if fmt == "TIFF":
        return _tiff_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    for _ in range(65536):  # far more markers than a real file has before its frame header
        if i + 4 > len(data) or data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            return None
        if marker in _JPEG_SOF:
            return _u(data, i + 5, 2, "big"), _u(data, i + 7, 2, "big")
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
        else:
            i += 2 + _u(data, i + 2, 2, "big")
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
    return found.get(257, 0), found.get(256, 0)  # a dimension not found: 0, and header_size says None


