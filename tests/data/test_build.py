"""ppdist.data.build's collate: a batch that does not stack names the entry and what joins it."""

import numpy as np
import pytest

from ppdist.data.build import collate, size_mismatch_message
from ppdist.errors import DataError


def det(h, w, boxes):
    return {"image": np.zeros((3, h, w), np.float32), "gt_bbox": np.zeros((boxes, 4), np.float32)}


def test_different_box_counts_point_to_pad_gt():
    with pytest.raises(DataError) as info:
        collate([det(32, 32, 1), det(32, 32, 3)], [], None)
    message = str(info.value)
    assert message.startswith("samples of one batch have different sizes of 'gt_bbox' ([(1, 4), (3, 4)]): ")
    assert "add PadGT to batch_transforms" in message and "\n" not in message


def test_different_image_sizes_point_to_batch_size_one_or_pad_batch():
    message = size_mismatch_message([det(32, 32, 1), det(64, 32, 1)])
    assert message.startswith(
        "samples of one batch have different sizes of 'image' ([(3, 32, 32), (3, 64, 32)]): "
    )
    assert "batch_size_per_card: 1" in message and "PadBatch" in message
