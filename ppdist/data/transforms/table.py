"""Table structure recognition transforms (PaddleOCR's SLANet pipeline).

``TableLabelEncode`` turns a PubTabNet sample's HTML structure tokens and cells into the fixed-length
``structure`` / ``bboxes`` / ``bbox_masks`` arrays, ``TableBoxEncode`` converts and normalises the
boxes by the image size, ``ResizeTableImage`` scales the longer side to ``max_len`` and writes
``shape``, ``PaddingTableImage`` pads to a fixed size, ``ToCHWImage`` changes the layout. Semantics
follow PaddleOCR 2.7 (``ppocr/data/imaug/label_ops.py`` and ``table_ops.py``); what PaddleOCR skips
silently is a ``RejectedSample`` here, with the reason.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import cv2
import numpy as np

from ppdist.data.base import RejectedSample
from ppdist.data.charset import load_characters
from ppdist.errors import ConfigError
from ppdist.registry import HEADS, TRANSFORMS

Sample = Dict[str, Any]

BOX_FORMATS = ("xyxy", "xywh", "xyxyxyxy")
SOS, EOS = "sos", "eos"
# tokens that open a cell: each one takes the next entry of ``html.cells`` (PaddleOCR's list; the
# <ebN></ebN> tokens of replace_empty_cell_token other than <eb></eb> are not in it, as there)
CELL_TOKENS = ("<td>", "<td", "<eb></eb>", "<td></td>")
# the content of a cell without bbox -> its empty-cell token (replace_empty_cell_token)
EMPTY_CELL_TOKENS: Dict[Tuple[str, ...], str] = {
    (): "<eb></eb>",
    (" ",): "<eb1></eb1>",
    ("<b>", " ", "</b>"): "<eb2></eb2>",
    ("\u2028", "\u2028"): "<eb3></eb3>",
    ("<sup>", " ", "</sup>"): "<eb4></eb4>",
    ("<b>", "</b>"): "<eb5></eb5>",
    ("<i>", " ", "</i>"): "<eb6></eb6>",
    ("<b>", "<i>", "</i>", "</b>"): "<eb7></eb7>",
    ("<b>", "<i>", " ", "</i>", "</b>"): "<eb8></eb8>",
    ("<i>", "</i>"): "<eb9></eb9>",
    ("<b>", " ", "\u2028", " ", "\u2028", " ", "</b>"): "<eb10></eb10>",
}


def table_tokens(character_dict_path: str, merge_no_span_structure: bool) -> List[str]:
    """The structure vocabulary: ``sos``, the dictionary's tokens, ``eos``. With
    ``merge_no_span_structure`` the dictionary gains ``<td></td>`` (if absent) and loses ``<td>``."""
    tokens = load_characters(character_dict_path)
    if merge_no_span_structure:
        if "<td></td>" not in tokens:
            tokens.append("<td></td>")
        if "<td>" in tokens:
            tokens.remove("<td>")
    return [SOS] + tokens + [EOS]


def merge_no_span(structure: Sequence[str]) -> List[str]:
    """``<td>`` and the token after it (its ``</td>``) become one ``<td></td>``."""
    merged: List[str] = []
    i = 0
    while i < len(structure):
        if structure[i] == "<td>":
            merged.append("<td></td>")
            i += 2
        else:
            merged.append(structure[i])
            i += 1
    return merged


def _cell(cells: Sequence[Any], k: int) -> Dict[str, Any]:
    if k >= len(cells):
        raise RejectedSample(f"the structure has more cells than html.cells ({len(cells)})")
    cell = cells[k]
    if not isinstance(cell, dict) or not isinstance(cell.get("tokens"), list):
        raise RejectedSample(f"html.cells[{k}] must be an object with a 'tokens' list, got {str(cell)[:80]}")
    return cell


def replace_empty_cells(structure: Sequence[str], cells: Sequence[Any]) -> List[str]:
    """Each cell token whose cell has no ``bbox`` becomes the empty-cell token of its content."""
    out: List[str] = []
    k = 0
    for token in structure:
        if token in ("<td></td>", "<td", "<td>"):
            cell = _cell(cells, k)
            if "bbox" not in cell:
                content = tuple(cell["tokens"])
                if content not in EMPTY_CELL_TOKENS:
                    raise RejectedSample(
                        f"html.cells[{k}] has no bbox and content {list(content)}, which has no empty-cell token"
                    )
                token = EMPTY_CELL_TOKENS[content]
            k += 1
        out.append(token)
    return out


@TRANSFORMS.register
class TableLabelEncode:
    """``structure`` (max_text_length + 2 indices: sos, tokens, eos, then sos as padding),
    ``bboxes`` ((max_text_length + 2, loc_reg_num) float32: each cell token's box, as in the label),
    ``bbox_masks`` ((max_text_length + 2,) float32: 1 where a box is learned) and ``length`` (int64:
    the number of tokens) from ``structure`` (HTML tokens) and ``cells``.

    Empty tokens are dropped, a ``span`` attribute gets its leading space, tokens missing from the
    dictionary are dropped (PaddleOCR's rules); a structure with no token or more than
    ``max_text_length`` is rejected. A cell's box is learned when it has a ``bbox`` and text, or
    always with ``learn_empty_box``.
    """

    def __init__(
        self,
        max_text_length: int,
        character_dict_path: str,
        replace_empty_cell_token: bool = False,
        merge_no_span_structure: bool = False,
        learn_empty_box: bool = False,
        loc_reg_num: int = 4,
    ) -> None:
        if not isinstance(max_text_length, int) or isinstance(max_text_length, bool) or max_text_length < 1:
            raise ConfigError(
                f"TableLabelEncode.max_text_length must be a positive integer, got {max_text_length!r}"
            )
        if not isinstance(loc_reg_num, int) or isinstance(loc_reg_num, bool) or loc_reg_num < 1:
            raise ConfigError(f"TableLabelEncode.loc_reg_num must be a positive integer, got {loc_reg_num!r}")
        if not character_dict_path:
            raise ConfigError(
                "TableLabelEncode.character_dict_path: a table structure dictionary is required"
            )
        self.max_text_length = max_text_length
        self.loc_reg_num = loc_reg_num
        self.replace_empty_cell_token = bool(replace_empty_cell_token)
        self.merge_no_span_structure = bool(merge_no_span_structure)
        self.learn_empty_box = bool(learn_empty_box)
        self.character = table_tokens(character_dict_path, self.merge_no_span_structure)
        self.dict = {token: i for i, token in enumerate(self.character)}
        self.start_idx = self.pad_idx = self.dict[SOS]
        self.end_idx = self.dict[EOS]
        self.is_cell = np.zeros(len(self.character), dtype=bool)
        for token, i in self.dict.items():
            self.is_cell[i] = token in CELL_TOKENS

    @staticmethod
    def check_config(options: Mapping[str, Any], where: str, config: Mapping[str, Any]) -> None:
        """Config validation against the model: a head that predicts ``loc_reg_num`` coordinates per
        cell (SLAHead) must predict as many as the labels hold (``ConfigError`` naming both keys)."""
        head = (config.get("Architecture") or {}).get("Head")
        if not isinstance(head, Mapping) or head.get("name") not in HEADS:
            return
        if "loc_reg_num" not in HEADS.accepted_keys(head["name"])[0]:
            return
        predicted = HEADS.value_of(head, "loc_reg_num")
        labelled = TRANSFORMS.value_of(dict(options, name="TableLabelEncode"), "loc_reg_num")
        if predicted != labelled:
            raise ConfigError(
                f"{where}.loc_reg_num is {labelled!r} but Architecture.Head.loc_reg_num is {predicted!r}: the head "
                f"predicts as many box coordinates per cell as the labels hold; give both the same value "
                f"(4: xyxy boxes, 8: polygons)"
            )

    @property
    def padded_length(self) -> int:
        """Entries of ``structure`` / ``bboxes``: max_text_length plus sos and eos."""
        return self.max_text_length + 2

    def tokens(self, data: Sample) -> List[str]:
        """The structure tokens as encoded (merged, empty cells replaced, spans spaced)."""
        structure = list(data["structure"])
        if self.merge_no_span_structure:
            structure = merge_no_span(structure)
        if self.replace_empty_cell_token:
            structure = replace_empty_cells(structure, data["cells"])
        out = []
        for token in structure:
            if token != "":
                if "span" in token and token[0] != " ":
                    token = " " + token
                out.append(token)
        return out

    def __call__(self, data: Sample) -> Sample:
        tokens = self.tokens(data)
        if not tokens or len(tokens) > self.max_text_length:
            raise RejectedSample(
                f"the structure has {len(tokens)} tokens; TableLabelEncode takes 1 to max_text_length "
                f"{self.max_text_length}"
            )
        ids = [self.dict[t] for t in tokens if t in self.dict]
        if not ids:
            raise RejectedSample("no token of the structure is in the table structure dictionary")
        structure = np.full(self.padded_length, self.pad_idx, dtype=np.int64)
        structure[0] = self.start_idx
        structure[1 : len(ids) + 1] = ids
        structure[len(ids) + 1] = self.end_idx
        bboxes = np.zeros((self.padded_length, self.loc_reg_num), dtype=np.float32)
        bbox_masks = np.zeros(self.padded_length, dtype=np.float32)
        cells = data["cells"]
        for k, i in enumerate(np.flatnonzero(self.is_cell[structure]).tolist()):
            cell = _cell(cells, k)
            if "bbox" in cell and len(cell["tokens"]) > 0:
                box = _box(cell["bbox"], k)
                if box.size != self.loc_reg_num:
                    raise RejectedSample(
                        f"html.cells[{k}].bbox has {box.size} values; loc_reg_num is {self.loc_reg_num}"
                    )
                bboxes[i] = box
                bbox_masks[i] = 1.0
            if self.learn_empty_box:
                bbox_masks[i] = 1.0
        data["structure"] = structure
        data["bboxes"] = bboxes
        data["bbox_masks"] = bbox_masks
        data["length"] = np.int64(len(ids))
        return data


def _box(value: Any, k: int) -> np.ndarray:
    """``html.cells[k].bbox`` as a flat float32 array; a ``RejectedSample`` naming the field when
    it is not made of finite numbers (text, nested objects, NaN)."""
    try:
        box = np.asarray(value, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError):
        box = None
    if box is None or not np.isfinite(box).all():
        raise RejectedSample(f"html.cells[{k}].bbox must be finite numbers, got {repr(value)[:80]}")
    return box


@TRANSFORMS.register
class TableBoxEncode:
    """``bboxes`` converted from ``in_box_format`` to ``out_box_format`` and divided by the image
    width (x) and height (y). The conversions are PaddleOCR's: the same format, or xyxy -> xywh
    (centre x, centre y, width, height)."""

    def __init__(self, in_box_format: str = "xyxy", out_box_format: str = "xyxy") -> None:
        for key, value in (("in_box_format", in_box_format), ("out_box_format", out_box_format)):
            if value not in BOX_FORMATS:
                raise ConfigError(
                    f"TableBoxEncode.{key} must be one of {', '.join(BOX_FORMATS)}, got {value!r}"
                )
        if in_box_format != out_box_format and (in_box_format, out_box_format) != ("xyxy", "xywh"):
            raise ConfigError(
                f"TableBoxEncode: in_box_format {in_box_format!r} -> out_box_format {out_box_format!r} is not "
                "a conversion PaddleOCR makes; use the same format, or xyxy -> xywh"
            )
        self.in_box_format = in_box_format
        self.out_box_format = out_box_format

    def __call__(self, data: Sample) -> Sample:
        height, width = data["image"].shape[:2]
        bboxes = np.asarray(data["bboxes"], dtype=np.float32)
        if self.in_box_format != self.out_box_format:
            bboxes = xyxy_to_xywh(bboxes)
        else:
            bboxes = bboxes.copy()
        bboxes[:, 0::2] /= width
        bboxes[:, 1::2] /= height
        data["bboxes"] = bboxes
        return data


def xyxy_to_xywh(bboxes: np.ndarray) -> np.ndarray:
    """(x1, y1, x2, y2) -> (centre x, centre y, width, height), same dtype."""
    out = np.empty_like(bboxes)
    out[:, 0] = (bboxes[:, 0] + bboxes[:, 2]) / 2
    out[:, 1] = (bboxes[:, 1] + bboxes[:, 3]) / 2
    out[:, 2] = bboxes[:, 2] - bboxes[:, 0]
    out[:, 3] = bboxes[:, 3] - bboxes[:, 1]
    return out


@TRANSFORMS.register
class ResizeTableImage:
    """Scale the image (bilinear) so its longer side is ``max_len``; ``shape`` = [height, width,
    ratio, ratio] of the original (float32); ``bboxes`` scaled too with ``resize_bboxes`` (not in
    ``infer_mode``). The original image stays as ``src_img``."""

    def __init__(self, max_len: int, resize_bboxes: bool = False, infer_mode: bool = False) -> None:
        if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
            raise ConfigError(f"ResizeTableImage.max_len must be a positive integer, got {max_len!r}")
        self.max_len = max_len
        self.resize_bboxes = bool(resize_bboxes)
        self.infer_mode = bool(infer_mode)

    def __call__(self, data: Sample) -> Sample:
        img = data["image"]
        height, width = img.shape[:2]
        ratio = self.max_len / (max(height, width) * 1.0)
        resize_h, resize_w = int(height * ratio), int(width * ratio)
        if resize_h < 1 or resize_w < 1:
            raise RejectedSample(f"image {height}x{width} is too narrow to resize to max_len {self.max_len}")
        if self.resize_bboxes and not self.infer_mode:
            data["bboxes"] = data["bboxes"] * ratio
        data["image"] = cv2.resize(img, (resize_w, resize_h))
        data["src_img"] = img
        data["shape"] = np.array([height, width, ratio, ratio], dtype=np.float32)
        data["max_len"] = self.max_len
        return data


@TRANSFORMS.register
class PaddingTableImage:
    """Place the image at the top left of a zero float32 image of ``size`` [height, width];
    ``shape`` gains the padded height and width."""

    def __init__(self, size: Sequence[int]) -> None:
        if (
            not isinstance(size, (list, tuple))
            or len(size) != 2
            or not all(isinstance(v, int) and v > 0 for v in size)
        ):
            raise ConfigError(
                f"PaddingTableImage.size must be [height, width] (positive integers), got {size!r}"
            )
        self.size = (int(size[0]), int(size[1]))

    def __call__(self, data: Sample) -> Sample:
        img = data["image"]
        pad_h, pad_w = self.size
        height, width = img.shape[:2]
        if height > pad_h or width > pad_w:
            raise RejectedSample(
                f"image {height}x{width} is larger than PaddingTableImage.size {pad_h}x{pad_w} "
                "(ResizeTableImage.max_len must not exceed it)"
            )
        padded = np.zeros((pad_h, pad_w, 3), dtype=np.float32)
        padded[:height, :width, :] = img
        data["image"] = padded
        data["shape"] = np.concatenate([np.asarray(data["shape"], dtype=np.float32), [pad_h, pad_w]]).astype(
            np.float32
        )
        return data


@TRANSFORMS.register
class ToCHWImage:
    """HWC -> CHW (contiguous, dtype kept): PaddleOCR's ToCHWImage."""

    def __init__(self) -> None:
        pass

    def __call__(self, data: Sample) -> Sample:
        img: Optional[np.ndarray] = data.get("image")
        if not isinstance(img, np.ndarray) or img.ndim != 3:
            raise ValueError(
                f"ToCHWImage expects an HWC image, got {getattr(img, 'shape', type(img).__name__)}"
            )
        data["image"] = np.ascontiguousarray(img.transpose(2, 0, 1))
        return data
