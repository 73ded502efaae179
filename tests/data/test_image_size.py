"""Images are measured from their header and refused before decoding when too large."""

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from ppdist.data.base import RejectedSample
from ppdist.data.image_size import check_image_pixels, header_size
from ppdist.data.transforms import DecodeImage


def png_bytes(width, height):
    """A real PNG header of ``width`` x ``height`` (a tiny image whose header is rewritten)."""
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((2, 2, 3), np.uint8)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")  # IHDR width, height
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")  # the IHDR chunk's CRC
    return bytes(data)


def test_header_size_reads_only_the_header():
    assert header_size(png_bytes(20000, 20000)) == (20000, 20000)
    assert header_size(b"not an image") is None


def test_a_huge_image_is_rejected_before_decoding():
    huge = png_bytes(20000, 20000)  # 400 M pixels: ~1.2 GB decoded
    with pytest.raises(RejectedSample, match="20000 x 20000 pixels is over Global.max_image_pixels"):
        DecodeImage()({"image": huge})
    check_image_pixels(huge, None)  # no limit
    with pytest.raises(RejectedSample):
        check_image_pixels(png_bytes(100, 100), 5000)


def _encoded(fmt, size, mode="RGB", **options):
    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).convert(mode).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def test_png_and_jpeg_headers_are_read_as_pillow_reads_them():
    """The direct PNG / JPEG header reading gives Pillow's size (baseline, progressive, grey,
    EXIF and ICC segments before the frame); anything else goes to Pillow."""
    from ppdist.data.image_size import _fast_size

    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: the stored size is reported, as Pillow does
    icc = b"\0" * 3000
    samples = [
        _encoded("JPEG", (37, 21)),
        _encoded("JPEG", (640, 480), progressive=True),
        _encoded("JPEG", (33, 65), mode="L"),
        _encoded("JPEG", (50, 40), exif=exif.tobytes(), icc_profile=icc),
        _encoded("PNG", (300, 7)),
        _encoded("PNG", (9, 12), mode="L"),
    ]
    for data in samples:
        with Image.open(io.BytesIO(data)) as image:
            expected = image.size
        assert _fast_size(data) == expected and header_size(data) == expected
        assert header_size(memoryview(np.frombuffer(data, np.uint8))) == expected
    assert _fast_size(_encoded("BMP", (5, 6))) is None and header_size(_encoded("BMP", (5, 6))) == (5, 6)
    assert _fast_size(samples[0][:40]) is None  # cut before its frame header: Pillow decides
    assert _fast_size(b"\xff\xd8\x00garbage") is None
