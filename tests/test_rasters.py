"""Georeferenced rasters (``minidet.rasters``, the geo extra) as infer reads them, with and without ``--slice``: the
same pixels, the same verdicts (issue 56 items 9c-9e). Each test writes its own GeoTIFFs with rasterio."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import ROOT, call_tool, needs_extra
from minidet.apps.bulk.sliced import image_reader
from minidet.apps.synthetic import structured_image
from minidet.imageio import ImageReadError
from minidet.slicing import Slicing

pytestmark = [needs_extra("rasterio", "geo"),
              pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")]

TOOL = ROOT / "tools" / "infer.py"
CONFIG = ROOT / "configs" / "torchvision" / "maskrcnn_resnet50_fpn.yaml"
SMALL = ("INPUT.MIN_SIZE_TEST", "320", "INPUT.MAX_SIZE_TEST", "512")
READERS = {"whole": image_reader(None), "sliced": image_reader(Slicing(64))}


def _geotiff(path, bands: np.ndarray, colorinterp=None) -> str:
    """``bands`` (C, H, W) written as a GeoTIFF in UTM zone 33N, 10 m pixels."""
    import rasterio
    from rasterio.transform import from_origin

    c, h, w = bands.shape
    with rasterio.open(path, "w", driver="GTiff", height=h, width=w, count=c, dtype=bands.dtype.name,
                       crs="EPSG:32633", transform=from_origin(500000.0, 4500000.0, 10.0, 10.0)) as dst:
        if colorinterp is not None:  # before the pixels: GDAL fixes a TIFF's extra samples with its first strip
            dst.colorinterp = colorinterp
        dst.write(bands)
    return str(path)


def _read(how: str, path: str) -> np.ndarray:
    return np.asarray(READERS[how](path, 0))


def _rgb16(h: int = 120, w: int = 160) -> np.ndarray:
    """Three 16-bit bands over the whole 0..65535 range (RGB order)."""
    rng = np.random.default_rng(3)
    return rng.integers(0, 65536, (3, h, w), dtype=np.uint16)


@pytest.mark.parametrize("how", list(READERS))
def test_a_16_bit_geotiff_is_scaled_to_8_bits_with_and_without_slice(tmp_path, how):
    """Issue 56 item 9e: a 16-bit GeoTIFF ran without ``--slice`` (scaled to 8 bits as every 16-bit image is) but
    was refused with it; both now read the same pixels: each sample v as round(v / 257)."""
    bands = _rgb16()
    got = _read(how, _geotiff(tmp_path / "u16.tif", bands))
    expected = ((bands.astype(np.uint32) + 128) // 257).astype(np.uint8)[::-1].transpose(1, 2, 0)  # RGB -> BGR
    assert got.dtype == np.uint8 and np.array_equal(got, expected)


@pytest.mark.parametrize("how", list(READERS))
def test_a_raster_of_other_samples_is_refused_in_one_line_with_and_without_slice(tmp_path, how):
    path = _geotiff(tmp_path / "f32.tif", np.zeros((3, 40, 50), np.float32))
    with pytest.raises(ImageReadError) as e:
        _read(how, path)
    assert str(e.value) == (f"{path}: a raster of float32 bands: minidet reads 8- and 16-bit bands (scale it to 8 "
                            "bits, e.g. gdal_translate -ot Byte -scale)")


@pytest.mark.parametrize("how", list(READERS))
def test_a_2_band_geotiff_is_read_as_grey_and_said_unless_the_second_is_alpha(tmp_path, capfd, how):
    """Issue 56 item 9c: a 2-band GeoTIFF was read as its first band without a word. Grey and alpha (as GDAL marks
    them) is grey, as RGBA is RGB; two other bands: band 1 as grey and one warning line saying so."""
    from rasterio.enums import ColorInterp

    rng = np.random.default_rng(4)
    bands = rng.integers(0, 256, (2, 60, 80), dtype=np.uint8)
    grey = np.repeat(bands[0][:, :, None], 3, axis=2)
    capfd.readouterr()
    alpha = _geotiff(tmp_path / "la.tif", bands, [ColorInterp.gray, ColorInterp.alpha])
    assert np.array_equal(_read(how, alpha), grey) and capfd.readouterr().err == ""
    two = _geotiff(tmp_path / "vv_vh.tif", bands)
    assert np.array_equal(_read(how, two), grey)
    assert capfd.readouterr().err.splitlines() == [
        f"warning: {two}: 2 bands, the second not alpha: read as grey from band 1 (minidet reads 1 band as grey, 2 "
        "as grey and alpha, 3 or more as RGB from the first three)"]


@pytest.mark.parametrize("how", list(READERS))
def test_a_truncated_geotiff_is_one_damaged_line_with_and_without_slice(tmp_path, how):
    """Issue 56 item 9d: a truncated GeoTIFF gave rasterio's raw ``Read failed`` (with ``--slice``) or OpenCV's
    TIFF warnings (without); both now say it is damaged in one line naming the file."""
    path = _geotiff(tmp_path / "cut.tif", _rgb16(400, 300).astype(np.uint8))
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(ImageReadError) as e:
        _read(how, path)
    line = str(e.value)
    assert line.startswith(f"{path}: damaged GeoTIFF: its pixels cannot be read (truncated or corrupt): ")
    assert "\n" not in line and "Read failed" not in line and "See previous exception" not in line


@pytest.mark.slow
def test_infer_runs_a_16_bit_geotiff_sliced_as_whole_and_reports_a_truncated_one(tmp_path, tv_file, capfd):
    """Through ``minidet infer``: a 16-bit GeoTIFF gives the same records whole and sliced in one tile (the plain
    run); a truncated one beside it is one ``error: <file>: damaged GeoTIFF: ...`` line, the run goes on (exit 1)."""
    image = structured_image(300, 400, seed=8)
    bands = (image[:, :, ::-1].transpose(2, 0, 1).astype(np.uint16) * 257)  # 8-bit pixels in 16 bits
    folder = tmp_path / "in"
    folder.mkdir()
    _geotiff(folder / "ortho16.tif", bands)
    cut = _geotiff(folder / "cut.tif", bands)
    data = open(cut, "rb").read()
    open(cut, "wb").write(data[: len(data) // 2])
    records = {}
    for name, extra in (("whole", []), ("sliced", ["--slice", "512"])):
        r = call_tool(TOOL, "--config-file", str(CONFIG), "--input", str(folder), "--output", str(tmp_path / name),
                      "--no-vis", "--workers", "0", *extra, "MODEL.WEIGHTS", str(tv_file), *SMALL, capture=capfd,
                      threads=1)
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert r.returncode == 1 and len(errors) == 1, r.stderr
        assert errors[0].startswith(f"error: {cut}: damaged GeoTIFF: its pixels cannot be read (truncated or "
                                    "corrupt): "), errors
        assert "Traceback" not in r.stderr and "Read failed" not in r.stderr
        records[name] = json.loads((tmp_path / name / "ortho16.json").read_text())
    assert records["whole"]["instances"] and records["whole"] == records["sliced"]


@pytest.mark.parametrize("how", list(READERS))
def test_a_paletted_geotiff_is_read_in_its_colours_with_and_without_slice(tmp_path, how):
    """A GeoTIFF of palette indices (a classified map) is its colours, as OpenCV read it without ``--slice`` before
    infer read GeoTIFFs with rasterio (and not its indices as grey, as the sliced reader did)."""
    import rasterio
    from rasterio.transform import from_origin

    rng = np.random.default_rng(5)
    index = rng.integers(0, 4, (1, 50, 60), dtype=np.uint8)
    colours = {0: (255, 0, 0, 255), 1: (0, 255, 0, 255), 2: (0, 0, 255, 255), 3: (10, 20, 30, 255)}
    path = tmp_path / "classes.tif"
    with rasterio.open(path, "w", driver="GTiff", height=50, width=60, count=1, dtype="uint8", crs="EPSG:32633",
                       transform=from_origin(500000.0, 4500000.0, 10.0, 10.0), photometric="palette") as dst:
        dst.write(index)
        dst.write_colormap(1, colours)
    table = np.zeros((256, 3), np.uint8)
    for k, rgba in colours.items():
        table[k] = rgba[:3]
    assert np.array_equal(_read(how, str(path)), table[index[0]][:, :, ::-1])  # BGR
