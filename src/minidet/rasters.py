"""Georeferenced rasters (GeoTIFF and the like) read window by window with rasterio (the geo extra): sliced inference
reads each tile's pixels from the file, never the whole raster.

``open_raster(path)`` gives a :class:`RasterImage` for a raster that has a coordinate system (else None: the file
is read as an ordinary image); infer reads such a raster through it with and without ``--slice`` (the same pixels,
the same refusals: 8- and 16-bit samples, 16-bit scaled as every 16-bit image is; 1 band grey, 2 grey and alpha,
3 or more RGB, a palette's colours; a damaged file one ``damaged GeoTIFF`` line). It reads like the HxWx3 uint8
BGR array it stands for where that is cheap: ``shape``, ``image[y0:y1, x0:x1]`` (that window, read from the file),
``np.asarray(image)`` (all of it: a drawing, or a run without ``--slice``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .imageio import ImageReadError, _print_warning, uint16_to_uint8

if TYPE_CHECKING:
    from affine import Affine

GEO_EXTENSIONS = (".tif", ".tiff", ".jp2", ".vrt")
_KINDS = {"GTiff": "GeoTIFF", "JP2OpenJPEG": "JPEG 2000", "VRT": "VRT"}  # GDAL's driver: what a user calls the file
_SAMPLES = ("uint8", "uint16")  # 16-bit samples are scaled as every 16-bit image is (``imageio.uint16_to_uint8``)


class RasterImage:
    """A raster's pixels as HxWx3 uint8 BGR, read window by window: ``bands`` (1-based, in RGB order) are the
    first three, or band 1 thrice (grey); 16-bit samples scaled to 8 bits; ``palette`` (256 x 3 RGB, or None): band
    1's indices looked up in its colour table; ``kind`` names the file in messages."""

    ndim, dtype = 3, np.dtype(np.uint8)

    def __init__(self, path: str, height: int, width: int, bands: list[int], kind: str = "raster",
                 palette: np.ndarray | None = None) -> None:
        self.path, self.height, self.width, self.bands, self.kind = path, height, width, bands, kind
        self.palette = palette

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.height, self.width, 3

    def __getitem__(self, key) -> np.ndarray:
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        y0, y1, _ = rows.indices(self.height)
        x0, x1, _ = cols.indices(self.width)
        return self.read(x0, y0, x1, y1)

    def read(self, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
        """The window's pixels (x1, y1 exclusive) as an HxWx3 uint8 BGR array; :class:`ImageReadError` where the
        file's pixels cannot be read (a truncated or corrupt file: found only when its blocks are read)."""
        import rasterio
        from rasterio.windows import Window

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
                with rasterio.open(self.path) as src:
                    data = src.read(self.bands, window=Window(x0, y0, x1 - x0, y1 - y0))
        except rasterio.errors.RasterioError as e:
            raise ImageReadError(self.path, f"damaged {self.kind}: its pixels cannot be read (truncated or corrupt): "
                                            f"{_gdal_message(e, self.path)}") from None
        if self.palette is not None:
            data = self.palette[data[0]].transpose(2, 0, 1)  # indices -> RGB bands
        data = data[::-1].transpose(1, 2, 0)  # RGB bands -> BGR, bands last
        return uint16_to_uint8(data) if data.dtype == np.uint16 else np.ascontiguousarray(data)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self.read(0, 0, self.width, self.height)
        return a if dtype is None else a.astype(dtype)


def _gdal_message(e: BaseException, path: str) -> str:
    """GDAL's own words under rasterio's error (the first cause: rasterio's "Read failed. See previous exception"
    says nothing), on one line, without the file's name (the line names it)."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = " ".join(str(e).replace(path, "").replace(os.path.basename(path), "").split()).strip(" ,:")
    return text if len(text) <= 300 else text[:297] + "..."


class _Raster(NamedTuple):
    height: int
    width: int
    dtypes: set[str]
    transform: Affine
    crs: str
    colours: list[str]  # GDAL's colour interpretation of each band: gray, red, ..., alpha, palette, undefined
    driver: str
    palette: np.ndarray | None  # band 1's colour table as 256 x 3 RGB (a paletted 8-bit raster), else None


def _describe(path: str) -> _Raster | None:
    """What reading a raster with a coordinate system needs to know of it; None for another file, or without
    rasterio."""
    if not os.fspath(path).lower().endswith(GEO_EXTENSIONS) or not os.path.isfile(path):
        return None  # a FIFO or a device would block the open
    try:
        import rasterio
    except ImportError:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
            with rasterio.open(path) as src:
                if src.crs is None:
                    return None
                colours = [c.name for c in src.colorinterp]
                palette = None
                if colours[0] == "palette" and src.dtypes[0] == "uint8":
                    table = src.colormap(1)
                    palette = np.array([table.get(k, (0, 0, 0, 255))[:3] for k in range(256)], np.uint8)
                return _Raster(src.height, src.width, set(src.dtypes), src.transform, src.crs.to_string(), colours,
                               src.driver, palette)
    except (OSError, rasterio.errors.RasterioError):
        return None


def _bands(path: str, colours: list[str], on_warning: Callable[[str], None]) -> list[int]:
    """The bands read as RGB: 1 band, or 2 (grey and alpha, as RGBA is RGB): band 1 as grey; 3 or more: the first
    three. Two bands the second of which is not alpha are read as grey too, and ``on_warning`` says so."""
    if len(colours) >= 3:
        return [1, 2, 3]
    if len(colours) == 2 and colours[1] != "alpha":
        on_warning(f"{path}: 2 bands, the second not alpha: read as grey from band 1 (minidet reads 1 band as grey, "
                   "2 as grey and alpha, 3 or more as RGB from the first three)")
    return [1, 1, 1]


def open_raster(path: str, max_pixels: int = 0,
                on_warning: Callable[[str], None] | None = None) -> RasterImage | None:
    """A :class:`RasterImage` of ``path`` where it is a raster with a coordinate system and rasterio is installed,
    else None; :class:`ImageReadError` for one it cannot run (samples neither 8- nor 16-bit, more than
    ``max_pixels`` pixels). A 2-band raster whose second band is not alpha calls ``on_warning("<path>: <what>")``
    (default: a ``warning:`` line on stderr, as an image decoded despite its decoder's complaint)."""
    if (info := _describe(path)) is None:
        return None
    h, w = info.height, info.width
    if not info.dtypes <= set(_SAMPLES) or len(info.dtypes) != 1:
        raise ImageReadError(path, f"a raster of {', '.join(sorted(info.dtypes))} bands: minidet reads 8- and 16-bit "
                                   "bands (scale it to 8 bits, e.g. gdal_translate -ot Byte -scale)")
    if max_pixels and h * w > max_pixels:
        raise ImageReadError(path, f"{w} x {h} = {w * h} pixels exceeds INPUT.MAX_PIXELS ({max_pixels})",
                             too_large=True)
    bands = _bands(os.fspath(path), info.colours, on_warning or _print_warning)
    return RasterImage(os.fspath(path), h, w, bands, _KINDS.get(info.driver, "raster"), info.palette)


def georeference(path: str) -> tuple[Callable[[np.ndarray], np.ndarray], str, tuple[int, int]] | None:
    """The raster's pixel -> CRS map of (K, 2) x, y arrays (its affine transform), its CRS name and its (height,
    width); None for a file that is not a georeferenced raster, or without rasterio."""
    if (info := _describe(path)) is None:
        return None
    t = info.transform

    def apply(xy: np.ndarray) -> np.ndarray:
        return np.stack([t.a * xy[:, 0] + t.b * xy[:, 1] + t.c, t.d * xy[:, 0] + t.e * xy[:, 1] + t.f], axis=1)

    return apply, info.crs, (info.height, info.width)
