"""Result files of ``tools/infer.py``: rec ``results.txt``, det ``bbox.json`` + drawn images,
seg palette PNGs + overlays. Each writer takes results batch by batch and ``close()`` finishes."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Dict, List, Mapping, Sequence

import cv2
import numpy as np
from PIL import Image

from ppdist.utils.atomic import temporary_path, write_text_atomic

Result = Dict[str, Any]


def pseudo_colour_palette(size: int = 256) -> List[int]:
    """Flat ``[r, g, b, ...]`` palette of pseudo-colour PNGs, class ``i`` at ``3 * i``: the Pascal VOC
    colours (bits of the id spread over the channels, most significant first) of ids 1..size, so
    class 0 is not black - the colours PaddleSeg's predictions use."""
    palette: List[int] = []
    for voc_id in range(1, size + 1):
        rgb = [0, 0, 0]
        for bit in range(8):
            for channel in range(3):
                rgb[channel] |= ((voc_id >> (3 * bit + channel)) & 1) << (7 - bit)
        palette.extend(rgb)
    return palette


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


class RecWriter:
    """``path\\ttext\\tscore`` lines, printed and written to ``output_dir/results.txt``: into a
    temporary file beside it that replaces it on ``close()``, so a failed run (``abort()``) leaves
    the previous ``results.txt`` as it was."""

    def __init__(self, output_dir: str, echo: bool = True) -> None:
        self.path = os.path.join(output_dir, "results.txt")
        self.echo = echo
        self.tmp = temporary_path(self.path)
        self.handle = open(self.tmp, "x", encoding="utf-8")

    def add(self, results: Sequence[Result]) -> None:
        for r in results:
            line = f"{r['path']}\t{r['text']}\t{r['score']:.6f}"
            self.handle.write(line + "\n")
            if self.echo:
                print(line)

    def close(self) -> List[str]:
        self.handle.close()
        os.replace(self.tmp, self.path)
        return [self.path]

    def abort(self) -> None:
        """Drop what was written; ``results.txt`` stays as it was."""
        self.handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)


class DetWriter:
    """COCO results in ``output_dir/bbox.json`` (image_id = running index, plus ``file_name``) and
    each image with its boxes above ``draw_threshold`` drawn, as ``output_dir/<name>``."""

    def __init__(
        self, output_dir: str, labels: Sequence[Mapping[str, Any]], draw_threshold: float = 0.5
    ) -> None:
        self.output_dir = output_dir
        self.names = {int(row["id"]): str(row["name"]) for row in labels}
        self.draw_threshold = draw_threshold
        self.records: List[Dict[str, Any]] = []
        self.images = 0
        self.drawn: List[str] = []

    def add(self, results: Sequence[Result]) -> None:
        for r in results:
            image_id = self.images
            self.images += 1
            for box, score, cat in zip(r["boxes"].tolist(), r["scores"].tolist(), r["category_ids"].tolist()):
                x1, y1, x2, y2 = box
                self.records.append(
                    {
                        "image_id": image_id,
                        "file_name": os.path.basename(r["path"]),
                        "category_id": int(cat),
                        "bbox": [x1, y1, x2 - x1, y2 - y1],
                        "score": float(score),
                    }
                )
            self.drawn.append(self.draw(r))

    def draw(self, result: Result) -> str:
        image = cv2.imread(result["path"], cv2.IMREAD_COLOR)
        palette = pseudo_colour_palette(max(self.names or {0: ""}) + 1)
        for box, score, cat in zip(
            result["boxes"].tolist(), result["scores"].tolist(), result["category_ids"].tolist()
        ):
            if score < self.draw_threshold:
                continue
            r, g, b = (
                palette[3 * int(cat) : 3 * int(cat) + 3] if 3 * int(cat) + 2 < len(palette) else (0, 255, 0)
            )
            x1, y1, x2, y2 = (int(round(v)) for v in box)
            cv2.rectangle(image, (x1, y1), (x2, y2), (b, g, r), 2)
            text = f"{self.names.get(int(cat), cat)} {score:.2f}"
            cv2.putText(
                image, text, (x1, max(y1 - 4, 10)), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (b, g, r), 1, cv2.LINE_AA
            )
        path = os.path.join(self.output_dir, os.path.basename(result["path"]))
        cv2.imwrite(path, image)
        return path

    def close(self) -> List[str]:
        path = os.path.join(self.output_dir, "bbox.json")
        write_text_atomic(path, json.dumps(self.records))
        return [path] + self.drawn

    def abort(self) -> None:
        """Nothing to drop: ``bbox.json`` is written only by ``close()``."""


class SegWriter:
    """``output_dir/<stem>.png`` (palette mode, pixel value = class id) and ``<stem>_overlay.jpg``
    (the image blended with the class colours, PaddleSeg's weight 0.6)."""

    def __init__(self, output_dir: str, weight: float = 0.6) -> None:
        self.output_dir = output_dir
        self.weight = weight
        self.palette = pseudo_colour_palette(256)
        self.written: List[str] = []

    def add(self, results: Sequence[Result]) -> None:
        for r in results:
            self.written.extend(self.write(r))

    def write(self, result: Result) -> List[str]:
        label_map = result["label_map"]
        stem = os.path.join(self.output_dir, _stem(result["path"]))
        if label_map.max(initial=0) < 256:
            png = Image.fromarray(label_map.astype(np.uint8))  # mode L; putpalette makes it P
            png.putpalette(self.palette)
        else:  # more classes than a palette holds: plain 16-bit class ids
            png = Image.fromarray(label_map.astype(np.uint16))
        png.save(stem + ".png")
        image = cv2.imread(result["path"], cv2.IMREAD_COLOR)
        colours = np.asarray(self.palette, dtype=np.uint8).reshape(-1, 3)[:, ::-1]  # BGR
        pseudo = colours[np.clip(label_map, 0, 255)]
        overlay = cv2.addWeighted(image, self.weight, pseudo, 1 - self.weight, 0)
        cv2.imwrite(stem + "_overlay.jpg", overlay)
        return [stem + ".png", stem + "_overlay.jpg"]

    def close(self) -> List[str]:
        return self.written

    def abort(self) -> None:
        """Nothing to drop: each image's files are complete once written."""


def build_writer(task: str, output_dir: str, info: Mapping[str, Any], draw_threshold: float = 0.5) -> Any:
    """The writer of ``task`` into ``output_dir`` (created)."""
    os.makedirs(output_dir, exist_ok=True)
    if task == "rec":
        return RecWriter(output_dir)
    if task == "det":
        return DetWriter(output_dir, info.get("labels") or [], draw_threshold)
    return SegWriter(output_dir)
