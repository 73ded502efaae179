"""Label encodings of the attention and multi-head recognisers: SARLabelEncode and MultiLabelEncode
(CTC + SAR, PP-OCRv3), with PaddleOCR's indices and rejection rules."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ppdist.data.base import RejectedSample
from ppdist.data.charset import load_characters
from ppdist.data.transforms.rec import CTCLabelEncode, encode_text, note_dropped
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS

Sample = Dict[str, Any]

SAR_UNKNOWN = "<UKN>"
SAR_START_END = "<BOS/EOS>"
SAR_PADDING = "<PAD>"


@TRANSFORMS.register
class SARLabelEncode:
    """Encode ``data["label"]`` for SAR: ``[start] + indices + [end]`` padded with the padding index
    to ``max_text_length`` (int64), and ``length`` (the number of characters kept).

    The classes are the dictionary's characters (0-based, no blank), then ``<UKN>``, the shared
    start/end token ``<BOS/EOS>`` and ``<PAD>``: ``len(character) == n + 3``. The text is checked
    as for CTC (empty, longer than ``max_text_length``, no known character: rejected; unknown
    characters dropped, said in a note); a text of ``max_text_length - 1`` or more characters
    after that leaves no room for the start and end tokens and is rejected too.
    """

    def __init__(
        self, max_text_length: int, character_dict_path: Optional[str] = None, use_space_char: bool = False
    ) -> None:
        if max_text_length < 3:
            raise ConfigError(
                f"Global.max_text_length must be at least 3 for SAR's start and end tokens, got {max_text_length}"
            )
        self.max_text_length = max_text_length
        self.lower = not character_dict_path
        chars = load_characters(character_dict_path, use_space_char)
        self.character = chars + [SAR_UNKNOWN, SAR_START_END, SAR_PADDING]
        self.unknown_idx = len(chars)
        self.start_idx = self.end_idx = len(chars) + 1
        self.padding_idx = len(chars) + 2
        self.index = {ch: i for i, ch in enumerate(chars)}  # a duplicated entry: its last index

    def checked_encode(self, text: str) -> Tuple[np.ndarray, int, List[str]]:
        """(padded int64 target, number of characters kept, characters dropped) of ``text``;
        ``RejectedSample`` with the reason when SAR cannot use it."""
        ids, dropped = encode_text(text, self.index, self.max_text_length, self.lower)
        if len(ids) >= self.max_text_length - 1:
            raise RejectedSample(
                f"label {text[:40]!r} has {len(ids)} character(s): SAR needs at most "
                f"Global.max_text_length - 2 = {self.max_text_length - 2} (start and end tokens)"
            )
        target = np.full(self.max_text_length, self.padding_idx, dtype=np.int64)
        target[0] = self.start_idx
        target[1 : len(ids) + 1] = ids
        target[len(ids) + 1] = self.end_idx
        return target, len(ids), dropped

    def __call__(self, data: Sample) -> Sample:
        target, length, dropped = self.checked_encode(data["label"])
        note_dropped(data, dropped)
        data["label"] = target
        data["length"] = np.array(length, dtype=np.int64)
        return data


@TRANSFORMS.register
class MultiLabelEncode:
    """PP-OCRv3's labels for a CTC head and a SAR head: ``label_ctc`` (CTCLabelEncode's zero-padded
    indices), ``label_sar`` (SARLabelEncode's target) and ``length`` (the CTC length), all int64.

    A text either encoding rejects is a bad sample with that encoding's reason. As in PaddleOCR the
    sample keeps only ``image``, ``img_path`` and the three labels (the text is gone); ppdist's own
    entries (``_notes``, ...) travel on. ``gtc_encode`` (PP-OCRv4's NRTR labels) is not supported.
    """

    def __init__(
        self,
        max_text_length: int,
        character_dict_path: Optional[str] = None,
        use_space_char: bool = False,
        gtc_encode: Optional[str] = None,
    ) -> None:
        if gtc_encode is not None:
            raise ConfigError(
                f"MultiLabelEncode.gtc_encode: only the SAR labels (gtc_encode: null) are supported, got {gtc_encode!r}"
            )
        self.ctc = CTCLabelEncode(max_text_length, character_dict_path, use_space_char)
        self.sar = SARLabelEncode(max_text_length, character_dict_path, use_space_char)

    def __call__(self, data: Sample) -> Sample:
        text = data["label"]
        ctc_ids, dropped = self.ctc.checked_encode(text)
        sar_target, _, _ = self.sar.checked_encode(text)
        note_dropped(data, dropped)
        label_ctc = np.zeros(self.ctc.max_text_length, dtype=np.int64)
        label_ctc[: len(ctc_ids)] = ctc_ids
        out = {key: value for key, value in data.items() if key.startswith("_")}
        out.update(
            img_path=data.get("img_path"),
            image=data["image"],
            label_ctc=label_ctc,
            label_sar=sar_target,
            length=np.array(len(ctc_ids), dtype=np.int64),
        )
        return out
