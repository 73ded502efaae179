"""Character dictionaries shared by the CTC label encoder and decoder (PaddleOCR rules)."""

from __future__ import annotations

import os
from typing import List, Optional

from ppdist.errors import ConfigError

DEFAULT_CHARACTERS = "0123456789abcdefghijklmnopqrstuvwxyz"


def load_characters(character_dict_path: Optional[str] = None, use_space_char: bool = False) -> List[str]:
    """The dictionary's characters, without the CTC blank.

    No path means PaddleOCR's default "0-9a-z" (labels are then lower-cased by the encoder).
    A dictionary file holds one character per line; ``use_space_char`` appends " ".
    """
    if not character_dict_path:
        chars = list(DEFAULT_CHARACTERS)
    else:
        if not os.path.isfile(character_dict_path):
            raise ConfigError(f"Global.character_dict_path: file not found: {character_dict_path}")
        chars = []
        with open(character_dict_path, "rb") as handle:
            for raw in handle:
                line = raw.decode("utf-8").strip("\n").strip("\r\n")
                chars.append(line)
        if use_space_char:
            chars.append(" ")
    return chars
