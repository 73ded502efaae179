"""The ``loss_config_list`` of the composite losses (``CombinedLoss``, ``MultiLoss``): a list of
one-key mappings ``{LossName: params}``, and the SAR padding index PaddleOCR's tools/train.py gives
the SAR loss of such a list."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from ppdist.data.charset import load_characters
from ppdist.errors import ConfigError
from ppdist.losses.sar import sar_padding_index
from ppdist.registry import LOSSES

logger = logging.getLogger("ppdist")


def parse_entries(entries: Any, where: str = "Loss.loss_config_list") -> List[Tuple[str, Dict[str, Any]]]:
    """``[(name, params)]`` of ``entries``; ``ConfigError`` naming the entry when one is malformed."""
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ConfigError(
            f"{where} must be a non-empty list of {{LossName: params}} entries, got {entries!r}"
        )
    parsed = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ConfigError(f"{where}[{i}] must be a one-key mapping {{LossName: params}}, got {entry!r}")
        ((name, params),) = entry.items()
        if params is not None and not isinstance(params, dict):
            raise ConfigError(f"{where}[{i}].{name} parameters must be a mapping, got {params!r}")
        parsed.append((name, dict(params or {})))
    return parsed


def build_entry(name: str, params: Dict[str, Any], where: str) -> Any:
    """The loss ``name`` built from ``params`` (which may hold the loss's own ``name`` keyword, as the
    distillation losses' term prefix), keywords checked against its signature first."""
    LOSSES.check(name, params, where)
    try:
        return LOSSES.get(name, where)(**params)
    except (ValueError, TypeError) as exc:  # a constructor rejecting a config value
        raise ConfigError(f"{where}: {exc}") from exc


def num_ctc_classes(character_dict_path: Optional[str], use_space_char: bool) -> int:
    """n: the CTC post-process's class count (the dictionary [+ space] + blank)."""
    return len(load_characters(character_dict_path, use_space_char)) + 1


def set_sar_ignore_index(
    parsed: List[Tuple[str, Dict[str, Any]]],
    sar_name: str,
    position: int,
    character_dict_path: Optional[str],
    use_space_char: bool,
    where: str,
) -> None:
    """PaddleOCR's tools/train.py: the SAR loss at ``position`` of the list gets ``ignore_index``
    n + 1 (the padding index), replacing any set; a SAR loss elsewhere keeps its own (Paddle's
    default 92 when unset: a warning says so)."""
    for i, (name, params) in enumerate(parsed):
        if name != sar_name:
            continue
        if i == position % len(parsed):
            params["ignore_index"] = sar_padding_index(num_ctc_classes(character_dict_path, use_space_char))
        elif "ignore_index" not in params:
            logger.warning(
                "%s[%d].%s: ignore_index is not set, PaddleOCR's default 92 is used (tools/train.py sets "
                "the padding index n + 1 only for the %s entry)",
                where,
                i,
                name,
                "last" if position == -1 else f"[{position}]",
            )
