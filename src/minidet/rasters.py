"""Georeferenced rasters (GeoTIFF and the like) read window by window with rasterio (the geo extra): sliced inference
reads each tile's pixels from the file, never the whole raster.

``open_raster(path)`` gives a :class:`RasterImage` for a raster that has a coordinate system (else None: the file
is read as an ordinary image). It reads like the HxWx3 uint8 BGR array it stands for where that is cheap:
``shape``, ``image[y0:y1, x0:x1]`` (that window, read from the file), ``np.asarray(image)`` (all of it: a drawing).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import numpy as np

from .imageio import ImageReadError

GEO_EXTENSIONS = (".tif", ".tiff", ".jp2", ".vrt")


class RasterImage:
    """The first three bands of a raster (one band: as grey) as HxWx3 uint8 BGR, read window by window."""

    ndim, dtype = 3, np.dtype(np.uint8)

    def __init__(self, path: str, height: int, width: int, bands: int) -> None:
        self.path, self.height, self.width, self.bands = path, height, width, bands

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.height, self.width, 3

    def __getitem__(self, key) -> np.ndarray:
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        y0, y1, _ = rows.indices(self.height)
        x0, x1, _ = cols.indices(self.width)
        return self.read(x0, y0, x1, y1)

    def read(self, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
        """The window's pixels (x1, y1 exclusive) as an HxWx3 uint8 BGR array."""
        import rasterio
        from rasterio.windows import Window

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
            with rasterio.open(self.path) as src:
                bands = [1, 2, 3] if self.bands >= 3 else [1, 1, 1]
                data = src.read(bands, window=Window(x0, y0, x1 - x0, y1 - y0))
        return np.ascontiguousarray(data[::-1].transpose(1, 2, 0))  # RGB bands -> BGR

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self.read(0, 0, self.width, self.height)
        return a if dtype is None else a.astype(dtype)


def _describe(path: str):
    """``(height, width, bands, dtypes, transform, CRS name)`` of a raster with a coordinate system; None for another
    file, or without rasterio."""
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
                return src.height, src.width, src.count, set(src.dtypes), src.transform, src.crs.to_string()
    except (OSError, rasterio.errors.RasterioError):
        return None


def open_raster(path: str, max_pixels: int = 0) -> RasterImage | None:
    """A :class:`RasterImage` of ``path`` where it is a raster with a coordinate system and rasterio is installed,
    else None; :class:`ImageReadError` for one it cannot run (not 8-bit, more than ``max_pixels`` pixels)."""
    if (info := _describe(path)) is None:
        return None
    h, w, n, dtypes, _, _ = info
    if dtypes != {"uint8"}:
        raise ImageReadError(path, f"a raster of {', '.join(sorted(dtypes))} bands: minidet reads 8-bit bands "
                                   "(scale it to 8 bits, e.g. gdal_translate -ot Byte -scale)")
    if max_pixels and h * w > max_pixels:
        raise ImageReadError(path, f"{w} x {h} = {w * h} pixels exceeds INPUT.MAX_PIXELS ({max_pixels})",
                             too_large=True)
    return RasterImage(os.fspath(path), h, w, n)


def georeference(path: str) -> tuple[Callable[[np.ndarray], np.ndarray], str, tuple[int, int]] | None:
    """The raster's pixel -> CRS map of (K, 2) x, y arrays (its affine transform), its CRS name and its (height,
    width); None for a file that is not a georeferenced raster, or without rasterio."""
    if (info := _describe(path)) is None:
        return None
    t, crs = info[4], info[5]

    def apply(xy: np.ndarray) -> np.ndarray:
        return np.stack([t.a * xy[:, 0] + t.b * xy[:, 1] + t.c, t.d * xy[:, 0] + t.e * xy[:, 1] + t.f], axis=1)

    return apply, crs, (info[0], info[1])
