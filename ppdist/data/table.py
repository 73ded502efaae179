"""Table structure recognition dataset: PubTabNet-format jsonl label files (PubTabDataSet)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Union

from ppdist.data.base import BaseDataSet, RejectedSample, inside_root
from ppdist.data.index_cache import cached_index
from ppdist.data.label_index import LabelLines, build_label_index
from ppdist.data.rec import Ratio, _ratios, _section
from ppdist.errors import DataError, DataPathError
from ppdist.registry import DATASETS


def parse_table_line(text: str) -> Dict[str, Any]:
    """``filename``, ``structure`` (HTML tokens) and ``cells`` of one PubTabNet json line;
    ``ValueError`` saying what is missing or malformed."""
    try:
        info = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(info, dict):
        raise ValueError(f"expected a JSON object, got {type(info).__name__}")
    filename = info.get("filename")
    if not isinstance(filename, str) or not filename:
        raise ValueError("'filename' (the image path) is missing or not a non-empty string")
    html = info.get("html")
    if not isinstance(html, dict):
        raise ValueError("'html' is missing or not an object with 'structure' and 'cells'")
    structure = html.get("structure")
    tokens = structure.get("tokens") if isinstance(structure, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError("'html.structure.tokens' is missing or not a list of strings")
    cells = html.get("cells")
    if not isinstance(cells, list):
        raise ValueError("'html.cells' is missing or not a list")
    return {
        "filename": filename,
        "structure": list(tokens),
        "cells": [dict(c) if isinstance(c, dict) else c for c in cells],
    }


@DATASETS.register
class PubTabDataSet(BaseDataSet):
    """Table images on disk listed in PubTabNet-format jsonl files: one JSON object per line with
    ``filename`` (joined with ``data_dir``) and ``html`` = {``structure``: {``tokens``}, ``cells``:
    [{``tokens``, ``bbox``}]} (PaddleOCR's PubTabDataSet).

    A sample is ``{img_path, image (bytes), structure (tokens), cells, file_name}``. The lines are
    held as the same compact, cacheable index as ``SimpleDataSet``'s (``cache``: ``auto``, ``off``
    or a folder); ``ratio_list`` keeps a fixed, seeded fraction of each file. A malformed line is a
    bad sample reported as ``file:line`` when read; a path outside ``data_dir`` is not read unless
    ``allow_paths_outside_root: true``.
    """

    def __init__(
        self,
        data_dir: str,
        label_file_list: List[str],
        transforms: list,
        mode: str = "train",
        ratio_list: Ratio = 1.0,
        seed: int = 1024,
        allow_paths_outside_root: bool = False,
        cache: Union[str, bool] = "auto",
    ) -> None:
        super().__init__(transforms, mode)
        sec = _section(mode)
        if isinstance(label_file_list, str):
            label_file_list = [label_file_list]
        if not label_file_list:
            raise DataError(f"{sec}.label_file_list is empty")
        if not os.path.isdir(data_dir):
            raise DataPathError(f"{sec}.data_dir: directory not found: {data_dir}")
        ratios = _ratios(ratio_list, len(label_file_list), f"{sec}.ratio_list", "label file(s)")
        for path in label_file_list:
            if not os.path.isfile(path):
                raise DataPathError(f"{sec}.label_file_list: label file not found: {path}")
        self.data_dir = data_dir
        self.label_files = list(label_file_list)
        self.seed = seed
        self.allow_paths_outside_root = bool(allow_paths_outside_root)
        index = cached_index(
            cache,
            f"{sec}.cache",
            "label",
            self.label_files,
            {"ratios": ratios, "seed": seed},
            lambda: build_label_index(self.label_files, ratios, seed),
            what=f"{sec} ({len(self.label_files)} label file(s))",
        )
        self.lines = LabelLines(index)

    def __len__(self) -> int:
        return len(self.lines)

    def _where(self, index: int) -> str:
        file_idx, line_no, _ = self.lines.line(index)
        return f"{self.label_files[file_idx]}:{line_no}"

    def parse(self, index: int) -> Dict[str, Any]:
        """Line ``index`` parsed (see ``parse_table_line``); a malformed line is a ``RejectedSample``
        saying what is wrong (the sample's origin, ``file:line``, is reported with it)."""
        _, line_no, raw = self.lines.line(index)
        try:
            text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            return parse_table_line(text)
        except UnicodeDecodeError as exc:
            why = f"not valid UTF-8 ({exc.reason})"
        except ValueError as exc:
            why = str(exc)
        raise RejectedSample(f"malformed line: {why}")

    def origin(self, index: int) -> str:
        where = self._where(index)
        try:
            return f"{where} ({self.parse(index)['filename']})"
        except RejectedSample:
            return where

    def read(self, index: int) -> Dict[str, Any]:
        info = self.parse(index)
        img_path = inside_root(
            self.data_dir,
            os.path.join(self.data_dir, info["filename"]),
            self.allow_paths_outside_root,
            "allow_paths_outside_root",
        )
        with open(img_path, "rb") as handle:
            image = handle.read()
        return {
            "img_path": img_path,
            "image": image,
            "structure": info["structure"],
            "cells": info["cells"],
            "file_name": info["filename"],
        }
