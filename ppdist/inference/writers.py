"""Result files of ``tools/infer.py``: rec ``results.txt``, det ``bbox.json`` + drawn images,
seg palette PNGs + overlays, table ``results.jsonl`` + HTML + pictures with the cell boxes. Each
writer takes results batch by batch and ``close()`` finishes."""

from __future__ import annotations

import contextlib
import json
import os
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import cv2
import numpy as np
from PIL import Image

from ppdist.utils.atomic import temporary_path, write_text_atomic
from ppdist.utils.display import class_name
from ppdist.visualize.palette import class_colour, flat_palette

Result = Dict[str, Any]


def pseudo_colour_palette(size: int = 256) -> List[int]:
    """Flat ``[r, g, b, ...]`` palette of pseudo-colour PNGs, class ``i`` at ``3 * i``: the colours
    PaddleSeg's predictions use, those of ``tools/browse_dataset.py`` (``ppdist.visualize.palette``)."""
    return flat_palette(size)


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


class RecWriter:
    """``path\ttext\tscore`` lines, printed and written to ``output_dir/results.txt``: into a
    temporary file beside it that replaces it on ``close()``, so a failed run (``abort()``) leaves
    the previous ``results.txt`` as it was. Results that hold several models' readings (a
    distillation model's sub-models) also go to ``results_per_model.txt`` the same way, one
    ``path\t{"Student": {"label", "score"}, ...}`` line each (PaddleOCR's infer_rec record, UTF-8)."""

    PER_MODEL_FILE = "results_per_model.txt"

    def __init__(self, output_dir: str, echo: bool = True) -> None:
        self.path = os.path.join(output_dir, "results.txt")
        self.per_model_path = os.path.join(output_dir, self.PER_MODEL_FILE)
        self.echo = echo
        self.tmp = temporary_path(self.path)
        self.handle = open(self.tmp, "x", encoding="utf-8")
        self.per_model: Optional[Tuple[str, IO[str]]] = None  # (temporary path, handle) once needed

    def add(self, results: Sequence[Result]) -> None:
        for r in results:
            line = f"{r['path']}\t{r['text']}\t{r['score']:.6f}"
            self.handle.write(line + "\n")
            if self.echo:
                print(line)
            if "models" in r:
                self._per_model_handle().write(
                    f"{r['path']}\t{json.dumps(r['models'], ensure_ascii=False)}\n"
                )

    def _per_model_handle(self) -> IO[str]:
        if self.per_model is None:
            tmp = temporary_path(self.per_model_path)
            self.per_model = (tmp, open(tmp, "x", encoding="utf-8"))
        return self.per_model[1]

    def close(self) -> List[str]:
        self.handle.close()
        os.replace(self.tmp, self.path)
        if self.per_model is None:  # a per-model file of an earlier run would contradict results.txt
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.per_model_path)
            return [self.path]
        self.per_model[1].close()
        os.replace(self.per_model[0], self.per_model_path)
        return [self.path, self.per_model_path]

    def abort(self) -> None:
        """Drop what was written; ``results.txt`` (and ``results_per_model.txt``) stay as they were."""
        for tmp, handle in [(self.tmp, self.handle)] + ([self.per_model] if self.per_model else []):
            handle.close()
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


class DetWriter:
    """COCO results in ``output_dir/bbox.json`` (image_id = running index, plus ``file_name``) and
    each image with its boxes above ``draw_threshold`` drawn, as ``output_dir/<name>``, in the
    colours browse_dataset gives the classes (``ppdist.visualize.palette``)."""

    def __init__(
        self, output_dir: str, labels: Sequence[Mapping[str, Any]], draw_threshold: float = 0.5
    ) -> None:
        self.output_dir = output_dir
        self.names = {int(row["id"]): str(row["name"]) for row in labels}
        self.classes = {cat: index for index, cat in enumerate(sorted(self.names))}  # browse's class index
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
        for box, score, cat in zip(
            result["boxes"].tolist(), result["scores"].tolist(), result["category_ids"].tolist()
        ):
            if score < self.draw_threshold:
                continue
            index = self.classes.get(int(cat))
            r, g, b = class_colour(index) if index is not None else (0, 255, 0)
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
    (the image blended with the class colours, PaddleSeg's weight 0.6, above a legend of the
    classes it shows: the data set's ``names`` when known, else ``class i``)."""

    def __init__(self, output_dir: str, weight: float = 0.6, names: Sequence[str] = ()) -> None:
        self.output_dir = output_dir
        self.weight = weight
        self.names = list(names)
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
        shown = [int(v) for v in np.unique(label_map) if 0 <= v < 256]
        legend = legend_strip(overlay.shape[1], shown, colours, self.names)
        cv2.imwrite(stem + "_overlay.jpg", stack_legend(overlay, legend) if shown else overlay)
        return [stem + ".png", stem + "_overlay.jpg"]

    def close(self) -> List[str]:
        return self.written

    def abort(self) -> None:
        """Nothing to drop: each image's files are complete once written."""


class TableWriter:
    """``output_dir/results.jsonl``, one ``{"path", "html", "score", "boxes"}`` line per image
    (PaddleOCR's infer_table record: the structure wrapped in ``<html><body><table>``, the cell boxes
    on the original image), written to a temporary file that replaces it on ``close()``; per image
    ``<stem>.html`` (that HTML) and ``<name>`` (the image with the cell boxes drawn: rectangles for
    4 coordinates, closed polygons for 8, in class 0's colour of ``ppdist.visualize.palette``)."""

    RESULTS_FILE = "results.jsonl"

    def __init__(self, output_dir: str, thickness: int = 2) -> None:
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, self.RESULTS_FILE)
        self.tmp = temporary_path(self.path)
        self.handle = open(self.tmp, "x", encoding="utf-8")
        self.thickness = thickness
        self.written: List[str] = []

    def add(self, results: Sequence[Result]) -> None:
        for r in results:
            boxes = np.asarray(r["boxes"], dtype=np.float32)
            record = {"path": r["path"], "html": r["html"], "score": r["score"], "boxes": boxes.tolist()}
            self.handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            html_path = os.path.join(self.output_dir, _stem(r["path"]) + ".html")
            write_text_atomic(html_path, r["html"])
            self.written += [html_path, self.draw(r["path"], boxes)]

    def draw(self, image_path: str, boxes: np.ndarray) -> str:
        image = cv2.imread(image_path, cv2.IMREAD_COLOR)
        red, green, blue = class_colour(0)
        for box in boxes:
            if len(box) == 4:
                x1, y1, x2, y2 = (int(round(float(v))) for v in box)
                cv2.rectangle(image, (x1, y1), (x2, y2), (blue, green, red), self.thickness)
            else:
                points = np.round(box.reshape(-1, 1, 2)).astype(np.int32)
                cv2.polylines(image, [points], True, (blue, green, red), self.thickness)
        path = os.path.join(self.output_dir, os.path.basename(image_path))
        cv2.imwrite(path, image)
        return path

    def close(self) -> List[str]:
        self.handle.close()
        os.replace(self.tmp, self.path)
        return [self.path] + self.written

    def abort(self) -> None:
        """Drop what was written; ``results.jsonl`` stays as it was."""
        self.handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)


LEGEND_ROW_PX = 16


def legend_strip(
    width: int, classes: Sequence[int], colours_bgr: np.ndarray, names: Sequence[str]
) -> np.ndarray:
    """A white BGR strip at least ``width`` wide (wider when a name needs it): one row per class
    of ``classes``, its colour and name."""
    texts = [class_name(cls, names) for cls in classes]
    widest = max((cv2.getTextSize(t, cv2.FONT_HERSHEY_SIMPLEX, 0.4, 1)[0][0] for t in texts), default=0)
    strip = np.full((LEGEND_ROW_PX * len(classes) + 4, max(width, widest + 26), 3), 255, np.uint8)
    for row, (cls, text) in enumerate(zip(classes, texts)):
        top = 2 + row * LEGEND_ROW_PX
        colour = tuple(int(c) for c in colours_bgr[cls])
        cv2.rectangle(strip, (4, top + 2), (16, top + LEGEND_ROW_PX - 3), colour, -1)
        cv2.putText(strip, text, (22, top + 12), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
    return strip


def stack_legend(image: np.ndarray, legend: np.ndarray) -> np.ndarray:
    """``image`` above ``legend``, the narrower one padded with white on the right."""
    width = max(image.shape[1], legend.shape[1])
    pad = [np.pad(a, ((0, 0), (0, width - a.shape[1]), (0, 0)), constant_values=255) for a in (image, legend)]
    return np.concatenate(pad)


def build_writer(task: str, output_dir: str, info: Mapping[str, Any], draw_threshold: float = 0.5) -> Any:
    """The writer of ``task`` into ``output_dir`` (created)."""
    os.makedirs(output_dir, exist_ok=True)
    if task == "rec":
        return RecWriter(output_dir)
    if task == "det":
        return DetWriter(output_dir, info.get("labels") or [], draw_threshold)
    if task == "table":
        return TableWriter(output_dir)
    return SegWriter(output_dir, names=(info.get("labels") or {}).get("names") or ())
