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
