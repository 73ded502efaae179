"""Synthetic text lines for the PP-OCRv3 quick start (``Global.synthetic_data.kind: rec_ppocrv3``).

The dictionary is the part of PaddleOCR's Chinese dictionary ``ppocr_keys_v1.txt`` that the DejaVu
fonts draw (Latin, digits, punctuation, Greek, Cyrillic, symbols: about 180 characters), less the
characters that look like another one (``CONFUSABLE``). ``generate_ppocrv3_rec_dataset`` writes it as
``out_dir/dict.txt`` (the quick start's ``Global.character_dict_path``) beside the images and the
PaddleOCR label files, in the layout of ``ppdist.data.synthetic``::

    out_dir/dict.txt   out_dir/train.txt   out_dir/val.txt   out_dir/images/{train,val}/00000000.jpg

Lines are longer than the CRNN quick start's (4-12 characters by default, some with one space
between two words, for ``use_space_char``); validation strings never occur in the training set.
"""

from __future__ import annotations

import os
import unicodedata
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Set

import numpy as np
from PIL import ImageFont

from ppdist.data.synthetic import _random_strings, _write_split, find_fonts
from ppdist.data.synthetic_io import build_atomically, check_lengths, check_setting, count_lines, is_int
from ppdist.registry import SYNTHETIC_DATA

BUNDLED_DICT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dicts", "ppocr_keys_v1.txt")
DICT_NAME = "dict.txt"
# Drawn by DejaVu like another character of the dictionary (or like a sequence of them): Greek
# Omicron = O, Cyrillic Ze ~ 3, script g = g, the vertical bars and "I" ~ l, "O" ~ 0, wedge ~
# Lambda, element-of ~ epsilon, box lines ~ dashes, primes and accents ~ quotes, ellipsis = "...",
# double bar = "ll", the small dots and squares.
CONFUSABLE = frozenset("ΟЗɡI|∣│▏▕▎O∧∈─┅·▪′″´ˉ…‖")
PROBE_SIZE = 28  # pixels: the glyph check's font size
MISSING = "\U0010fffd"  # a private-use code point no font draws: its bitmap is the font's .notdef box


@lru_cache(maxsize=None)
def _probe_font(path: str) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, PROBE_SIZE)


def _glyph(font: ImageFont.FreeTypeFont, char: str) -> np.ndarray:
    mask = font.getmask(char)
    width, height = mask.size
    return np.asarray(mask, dtype=np.uint8).reshape(height, width) if width and height else np.zeros((0, 0))


def drawn_by_every_font(char: str, fonts: Sequence[str]) -> bool:
    """True when each font draws ``char`` with ink and not as its missing-glyph box."""
    for path in fonts:
        font = _probe_font(path)
        glyph, missing = _glyph(font, char), _glyph(font, MISSING)
        if glyph.size == 0 or not glyph.any() or (glyph.shape == missing.shape and (glyph == missing).all()):
            return False
    return True


def read_dictionary(path: str) -> List[str]:
    """The characters of a PaddleOCR dictionary file, one per line, in file order."""
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\r\n") for line in handle]


def drawable_characters(
    source: Sequence[str], fonts: Sequence[str], max_chars: Optional[int] = None
) -> List[str]:
    """The single, visible characters of ``source`` every font draws, in ``source`` order, without
    ``CONFUSABLE`` ones and CJK/kana (``Lo``) or full-width forms; the first ``max_chars`` if set."""
    out: List[str] = []
    for char in source:
        if len(char) != 1 or char in CONFUSABLE or char in out:
            continue
        category = unicodedata.category(char)
        if category[0] in "CZ" or category == "Lo" or unicodedata.east_asian_width(char) in ("F", "W"):
            continue
        if drawn_by_every_font(char, fonts):
            out.append(char)
    return out[:max_chars] if max_chars else out


def _draw_lines(
    rng: np.random.Generator,
    count: int,
    charset: str,
    lengths: Sequence[int],
    space_ratio: float,
    exclude: Set[str],
) -> List[str]:
    """``count`` random strings not in ``exclude``; in a ``space_ratio`` share of them one inner
    character is a space (two words)."""
    out: List[str] = []
    while len(out) < count:
        for text in _random_strings(rng, count - len(out), charset, lengths[0], lengths[1], exclude):
            if len(text) >= 3 and rng.random() < space_ratio:
                cut = int(rng.integers(1, len(text) - 1))
                text = text[:cut] + " " + text[cut + 1 :]
            if text.lower() not in exclude:
                out.append(text)
    return out


def existing_summary(out_dir: str, seed: int) -> Dict[str, object]:
    """The summary of a data set already in ``out_dir``, read from its dictionary."""
    dict_path = os.path.join(out_dir, DICT_NAME)
    return {
        "task": "rec",
        "out_dir": out_dir,
        "seed": seed,
        "num_chars": count_lines(dict_path) if os.path.isfile(dict_path) else 0,
        "character_dict_path": dict_path,
    }


@SYNTHETIC_DATA.register(name="rec_ppocrv3")
def generate_ppocrv3_rec_dataset(
    out_dir: str,
    num_train: int,
    num_val: int,
    seed: int = 0,
    min_len: int = 4,
    max_len: int = 12,
    max_chars: Optional[int] = None,
    space_ratio: float = 0.2,
    source_dict: Optional[str] = None,
) -> Dict[str, object]:
    """Render PP-OCRv3 quick-start lines into ``out_dir`` (skipped if ``out_dir/train.txt`` exists).

    ``source_dict`` (default: ppdist's copy of PaddleOCR's ``ppocr_keys_v1.txt``) gives the
    candidate characters; ``max_chars`` keeps the first N drawable ones. Deterministic for a seed
    and the installed DejaVu fonts. Returns a summary dict (``num_chars``, ``character_dict_path``).
    """
    check_lengths(min_len, max_len)
    check_setting(
        isinstance(space_ratio, (int, float)) and 0.0 <= space_ratio <= 1.0,
        "space_ratio",
        "in [0, 1]",
        space_ratio,
    )
    check_setting(
        max_chars is None or (is_int(max_chars) and max_chars >= 1),
        "max_chars",
        "a whole number >= 1 (or unset: all drawable characters)",
        max_chars,
    )
    source_dict = source_dict or BUNDLED_DICT
    if not os.path.isfile(source_dict):
        raise FileNotFoundError(f"rec_ppocrv3 synthetic data: dictionary not found: {source_dict}")
    out_dir = os.path.abspath(out_dir)
    settings = dict(
        seed=seed,
        min_len=min_len,
        max_len=max_len,
        max_chars=max_chars,
        space_ratio=space_ratio,
        source_dict=None if source_dict == BUNDLED_DICT else source_dict,
    )
    if os.path.exists(
        os.path.join(out_dir, "train.txt")
    ):  # made before (or on another node): no fonts needed
        return build_atomically(
            out_dir, existing_summary(out_dir, seed), num_train, num_val, lambda tmp: None, settings
        )
    fonts = find_fonts()
    if not fonts:
        raise FileNotFoundError(
            "rec_ppocrv3 synthetic data needs the DejaVu fonts (e.g. apt-get install fonts-dejavu-core)"
        )
    chars = drawable_characters(read_dictionary(source_dict), fonts, max_chars)
    summary: Dict[str, object] = {
        "task": "rec",
        "out_dir": out_dir,
        "seed": seed,
        "fonts": [os.path.basename(f) for f in fonts],
        "num_chars": len(chars),
        "character_dict_path": os.path.join(out_dir, DICT_NAME),
    }

    def write(tmp: str) -> None:
        with open(os.path.join(tmp, DICT_NAME), "w", encoding="utf-8", newline="\n") as handle:
            handle.writelines(f"{c}\n" for c in chars)
        rng = np.random.default_rng([seed & 0xFFFFFFFF, 3])
        charset = "".join(chars)
        train = _draw_lines(rng, num_train, charset, (min_len, max_len), space_ratio, exclude=set())
        seen = {text.lower() for text in train}
        val = _draw_lines(rng, num_val, charset, (min_len, max_len), space_ratio, exclude=seen)
        _write_split(tmp, "train", train, seed, 0, fonts, 0.0)
        _write_split(tmp, "val", val, seed, 1, fonts, 0.0)

    return build_atomically(out_dir, summary, num_train, num_val, write, settings)
