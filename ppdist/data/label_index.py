"""The lines of PaddleOCR label files as a ``PackedIndex``: found with numpy, parsed when read.

A label file is read as bytes and split at ``\\n`` with numpy; lines that hold only whitespace are
dropped (the rest keep their 1-based line numbers for messages), ``ratio_list`` keeps a seeded
subset, and the kept lines' bytes stay in one buffer. Splitting a line into path and label, and
decoding it, happens when the sample is read, so a malformed line is reported where it is used.
"""

from __future__ import annotations

import bisect
from typing import List, Sequence, Tuple

import numpy as np

from ppdist.data.packed import PackedIndex

# ASCII bytes that str.isspace() does not call whitespace: a line with one of them is not blank
_ASCII_TEXT = np.zeros(256, dtype=bool)
_ASCII_TEXT[:128] = True
_ASCII_TEXT[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = False


def subsample(count: int, ratio: float, seed: int, source: int) -> np.ndarray:
    """Sorted indices of a fixed, seeded ``round(count * ratio)`` subset of ``range(count)``."""
    if ratio >= 1.0:
        return np.arange(count)
    keep = int(round(count * ratio))
    rng = np.random.default_rng([seed & 0xFFFFFFFF, source])
    return np.sort(rng.choice(count, size=keep, replace=False))


def split_lines(raw: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, before the ``\\n``) of every line of ``raw``, as a binary file
    iterates them: a last line without ``\\n`` counts, the empty text after a final ``\\n`` does not."""
    newlines = np.flatnonzero(raw == 10)
    starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
    ends = np.concatenate([newlines, [len(raw)]]).astype(np.int64)
    if starts[-1] == len(raw):
        starts, ends = starts[:-1], ends[:-1]
    return starts, ends


def _is_blank(text: bytes, first_line: bool) -> bool:
    try:
        return not text.decode("utf-8-sig" if first_line else "utf-8").strip()
    except UnicodeDecodeError:
        return False  # kept: reported as not valid UTF-8 when read


def blank_lines(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which lines hold only whitespace (Unicode whitespace included, a first-line BOM ignored)."""
    if len(starts) == 0:
        return np.zeros(0, dtype=bool)
    # each segment [start_i, start_i+1) is the line plus its '\n' (whitespace): never empty
    has_text = np.logical_or.reduceat(_ASCII_TEXT[raw], starts)
    has_high = np.logical_or.reduceat(raw >= 128, starts)
    blank = ~(has_text | has_high)
    for i in np.flatnonzero(has_high & ~has_text):  # non-ASCII and whitespace only: decode to decide
        blank[i] = _is_blank(raw[starts[i] : ends[i]].tobytes(), first_line=i == 0)
    return blank


def _compact(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The bytes of the given lines in runs of consecutive lines, and each line's start in them."""
    if len(starts) == 0:
        return np.zeros(0, dtype=np.uint8), starts
    breaks = np.concatenate([[True], starts[1:] != ends[:-1] + 1])
    first = np.flatnonzero(breaks)
    last = np.concatenate([first[1:] - 1, [len(starts) - 1]])
    run_src, run_end = starts[first], ends[last]
    run_dst = np.concatenate([[0], np.cumsum(run_end - run_src)[:-1]]).astype(np.int64)
    run_of_line = np.cumsum(breaks) - 1
    new_starts = starts - run_src[run_of_line] + run_dst[run_of_line]
    if len(first) == 1:
        return raw[run_src[0] : run_end[0]], new_starts
    return np.concatenate([raw[s:e] for s, e in zip(run_src.tolist(), run_end.tolist())]), new_starts


def build_label_index(paths: Sequence[str], ratios: Sequence[float], seed: int) -> PackedIndex:
    """The non-blank lines of ``paths`` (a seeded ``ratios[i]`` share of file ``i``), in file order.

    Arrays: ``text`` (the kept lines' bytes), ``start`` int64 / ``length`` int32 (each line in
    ``text``), ``line_no`` int32 (1-based, in its file), ``file_start`` int64 (first line of each
    file, plus the total).
    """
    texts: List[np.ndarray] = []
    starts_out: List[np.ndarray] = []
    lengths: List[np.ndarray] = []
    numbers: List[np.ndarray] = []
    file_start = [0]
    offset = 0
    for file_idx, (path, ratio) in enumerate(zip(paths, ratios)):
        raw = np.fromfile(path, dtype=np.uint8)
        starts, ends = split_lines(raw)
        kept = np.flatnonzero(~blank_lines(raw, starts, ends))
        kept = kept[subsample(len(kept), ratio, seed, file_idx)]
        text, new_starts = _compact(raw, starts[kept], ends[kept])
        texts.append(text)
        starts_out.append(new_starts + offset)
        lengths.append((ends[kept] - starts[kept]).astype(np.int32))
        numbers.append((kept + 1).astype(np.int32))
        offset += len(text)
        file_start.append(file_start[-1] + len(kept))
        del raw
    return PackedIndex(
        {
            "text": texts[0] if len(texts) == 1 else np.concatenate(texts),
            "start": np.concatenate(starts_out),
            "length": np.concatenate(lengths),
            "line_no": np.concatenate(numbers),
            "file_start": np.asarray(file_start, dtype=np.int64),
        }
    )


class LabelLines:
    """Random access to the lines of a label index: ``len``, ``line(i) -> (file, line_no, bytes)``."""

    def __init__(self, index: PackedIndex) -> None:
        self.index = index
        self._text, self._start, self._length = index["text"], index["start"], index["length"]
        self._line_no = index["line_no"]
        self._file_start = index["file_start"].tolist()

    def __len__(self) -> int:
        return len(self._start)

    def __reduce__(self):
        return (LabelLines, (self.index,))  # a mapped index pickles as its path, not its arrays

    def line(self, i: int) -> Tuple[int, int, bytes]:
        """(file index, 1-based line number, the line's bytes without ``\\n``) of kept line ``i``."""
        if not 0 <= i < len(self._start):
            raise IndexError(f"index {i} out of range for {len(self._start)} lines")
        start = int(self._start[i])
        raw = self._text[start : start + int(self._length[i])].tobytes()
        return bisect.bisect_right(self._file_start, i) - 1, int(self._line_no[i]), raw
