"""Character dictionaries shared by the CTC label encoder and decoder (PaddleOCR rules).

``ppocr_keys_v1.txt``, ``en_dict.txt`` and the table structure dictionaries are bundled (``ppdist/data/dicts``): a PaddleOCR path to
them such as ``ppocr/utils/ppocr_keys_v1.txt`` that does not exist from the working directory
resolves to the bundled copy (a path that exists always wins).
"""

from __future__ import annotations

import logging
import os
from typing import List, Optional, Set

from ppdist.errors import ConfigError

DEFAULT_CHARACTERS = "0123456789abcdefghijklmnopqrstuvwxyz"
BUNDLED_DICT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dicts")
BUNDLED_DICTS = (
    "ppocr_keys_v1.txt",
    "en_dict.txt",
    "table_structure_dict.txt",
    "table_structure_dict_ch.txt",
)
# the folders a config names a bundled dictionary in: PaddleOCR's checkout and ppdist's own
BUNDLED_DICT_PREFIXES = ("ppocr/utils", "ppocr/utils/dict", "ppdist/data/dicts")

logger = logging.getLogger("ppdist")
_reported: Set[str] = set()  # paths whose fallback was already announced (one line per process)


def bundled_dict(path: str) -> Optional[str]:
    """The bundled copy ``path`` stands for (``.../ppocr/utils/ppocr_keys_v1.txt`` ...), else None."""
    folder, name = os.path.split(os.path.normpath(path).replace(os.sep, "/"))
    if name in BUNDLED_DICTS and any(("/" + folder).endswith("/" + p) for p in BUNDLED_DICT_PREFIXES):
        return os.path.join(BUNDLED_DICT_DIR, name)
    return None


def resolve_dict_path(character_dict_path: str) -> str:
    """``character_dict_path`` when it exists, else the bundled dictionary it names (said once, at
    info level); ``ConfigError`` when neither exists."""
    if os.path.isfile(character_dict_path):
        return character_dict_path
    bundled = bundled_dict(character_dict_path)
    if bundled is None or not os.path.isfile(bundled):
        raise ConfigError(f"Global.character_dict_path: file not found: {character_dict_path}")
    if character_dict_path not in _reported:
        _reported.add(character_dict_path)
        logger.info(
            "Global.character_dict_path: %s does not exist here; using ppdist's bundled copy %s",
            character_dict_path,
            bundled,
        )
    return bundled


def load_characters(character_dict_path: Optional[str] = None, use_space_char: bool = False) -> List[str]:
    """The dictionary's characters, without the CTC blank.

    No path means PaddleOCR's default "0-9a-z" (labels are then lower-cased by the encoder).
    A dictionary file holds one character per line; ``use_space_char`` appends " ".
    """
    if not character_dict_path:
        return list(DEFAULT_CHARACTERS)
    chars = []
    with open(resolve_dict_path(character_dict_path), "rb") as handle:
        for raw in handle:
            line = raw.decode("utf-8").strip("\n").strip("\r\n")
            chars.append(line)
    if use_space_char:
        chars.append(" ")
    return chars
