"""Synthetic index files at the seeds' scale: PaddleOCR label files and COCO json (no images).

Only the index part of a dataset is made: the image paths they name do not exist, which is all
building a dataset's index needs. Generation is deterministic in ``seed`` and streams to disk, so
an 18M-line file or an Objects365-size json does not have to fit in memory as Python objects.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from ppdist.utils import strict_json

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
CHUNK = 200_000


def write_label_file(path: str, lines: int, seed: int = 0) -> int:
    """``lines`` lines ``train/word_<i>.jpg<TAB><label>`` (labels of 3..12 characters); the size in bytes."""
    rng = np.random.default_rng(seed)
    letters = np.array(list(ALPHABET))
    with open(path, "w", encoding="utf-8") as handle:
        for start in range(0, lines, CHUNK):
            count = min(CHUNK, lines - start)
            text = "".join(letters[rng.integers(0, len(ALPHABET), size=count * 12)])
            lengths = rng.integers(3, 13, size=count)
            handle.write(
                "".join(
                    f"train/word_{start + i:09d}.jpg\t{text[12 * i : 12 * i + n]}\n"
                    for i, n in enumerate(lengths.tolist())
                )
            )
    return os.path.getsize(path)


def _image_sizes(rng: np.random.Generator, count: int) -> np.ndarray:
    return np.stack([rng.integers(320, 1025, size=count), rng.integers(240, 769, size=count)], axis=1)


def _annotation_chunks(
    rng: np.random.Generator, sizes: np.ndarray, boxes: int, classes: int
) -> Iterator[str]:
    """The annotations as json text, ``boxes`` spread at random over the images."""
    images = len(sizes)
    image_of = np.sort(rng.integers(0, images, size=boxes))
    for start in range(0, boxes, CHUNK):
        idx = image_of[start : start + CHUNK]
        w, h = sizes[idx, 0].astype(np.float64), sizes[idx, 1].astype(np.float64)
        bw = np.round(rng.uniform(0.02, 0.5, size=len(idx)) * w, 2)
        bh = np.round(rng.uniform(0.02, 0.5, size=len(idx)) * h, 2)
        x = np.round(rng.uniform(0, 1, size=len(idx)) * (w - bw), 2)
        y = np.round(rng.uniform(0, 1, size=len(idx)) * (h - bh), 2)
        cats = rng.integers(1, classes + 1, size=len(idx))
        yield ",".join(
            f'{{"id":{start + i + 1},"image_id":{im + 1},"category_id":{c},'
            f'"bbox":[{x0},{y0},{w0},{h0}],"area":{round(w0 * h0, 2)},"iscrowd":0}}'
            for i, (im, c, x0, y0, w0, h0) in enumerate(
                zip(idx.tolist(), cats.tolist(), x.tolist(), y.tolist(), bw.tolist(), bh.tolist())
            )
        )


def write_coco_json(path: str, images: int, boxes: int, classes: int = 80, seed: int = 0) -> int:
    """A COCO instances json with ``images`` images, ``boxes`` boxes and ``classes`` categories; its size."""
    rng = np.random.default_rng(seed)
    sizes = _image_sizes(rng, images)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"images":[')
        for start in range(0, images, CHUNK):
            part = sizes[start : start + CHUNK].tolist()
            handle.write(
                ("," if start else "")
                + ",".join(
                    f'{{"id":{start + i + 1},"file_name":"{start + i + 1:012d}.jpg","width":{w},"height":{h}}}'
                    for i, (w, h) in enumerate(part)
                )
            )
        handle.write('],"annotations":[')
        for n, chunk in enumerate(_annotation_chunks(rng, sizes, boxes, classes)):
            handle.write(("," if n else "") + chunk)
        categories = [{"id": c, "name": f"class_{c}"} for c in range(1, classes + 1)]
        handle.write('],"categories":' + strict_json.dumps(categories) + "}")
    return os.path.getsize(path)
