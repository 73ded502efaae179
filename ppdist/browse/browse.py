"""``tools/browse_dataset.py``'s work: draw N samples of a split as the model sees them and write
the summary (``summary.json`` and ``summary.md``) of those N or of the whole split."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Sequence

from ppdist.browse.dataset_browser import (
    choose_indices,
    read_samples,
    split_dataset,
    summarize,
    summary_markdown,
)
from ppdist.browse.sample_grid import draw_samples
from ppdist.errors import ConfigError, DataError
from ppdist.utils import strict_json
from ppdist.utils.atomic import write_text_atomic


class NothingToDraw(DataError):
    """Every sample read was bad: nothing could be drawn. ``bad`` lists them (file:line, reason);
    the summary files are written. An input mistake: exit 2."""

    exit_code = 2

    def __init__(self, message: str, bad: Sequence[str]) -> None:
        super().__init__(message)
        self.bad = list(bad)


@dataclass
class BrowseOptions:
    """What to draw and count: ``num`` samples of ``split`` (the first, or a random choice with
    ``seed``), the summary of those or of the whole split (``whole_split``)."""

    split: str = "Train"
    num: int = 16
    out_dir: str = "browse"
    shuffle: bool = False
    seed: int = 0
    whole_split: bool = False


def check_options(config: Mapping[str, Any], options: BrowseOptions) -> None:
    """``ConfigError`` for a split the config lacks or a number of samples below 1."""
    if options.split not in ("Train", "Eval"):
        raise ConfigError(f"--split must be Train or Eval, got {options.split!r}")
    if not isinstance(config.get(options.split), Mapping) or "dataset" not in config[options.split]:
        raise ConfigError(f"the config has no {options.split}.dataset section to browse")
    if options.num < 1:
        raise ConfigError(f"--num must be a positive number of samples, got {options.num}")


def browse_dataset(config: Mapping[str, Any], options: BrowseOptions) -> Dict[str, Any]:
    """Draw, count and write; returns the summary (also in ``out_dir``'s summary.json / .md).
    ``NothingToDraw`` (after writing the summary) when every sample read was bad."""
    check_options(config, options)
    dataset = split_dataset(config, options.split)
    if len(dataset) == 0:
        raise ConfigError(f"{options.split}.dataset has no sample to browse")
    indices = choose_indices(len(dataset), options.num, options.shuffle, options.seed)
    drawn = read_samples(config, options.split, dataset, indices)
    os.makedirs(options.out_dir, exist_ok=True)
    if not drawn.samples:  # every sample read was bad: say which, and why, instead of drawing nothing
        summary = dict(
            summarize(drawn), of=f"the {len(indices)} samples read", drawn_indices=indices, pictures=[]
        )
        _write_summary(summary, options.out_dir)
        raise NothingToDraw(
            f"{options.split}: none of the {len(indices)} sample(s) read could be drawn: {len(drawn.bad)} bad "
            f"(listed above and in {os.path.join(options.out_dir, 'summary.md')}); check "
            f"{options.split}.dataset (data_dir / label_file_list / dataset_root / anno_path)",
            drawn.bad,
        )
    pictures = draw_samples(drawn, options.out_dir)
    if options.whole_split:
        counted = read_samples(config, options.split, dataset, range(len(dataset)), draw=False)
        of = f"the whole split ({len(dataset)} samples)"
    else:
        counted = drawn
        which = f"{len(indices)} randomly chosen" if options.shuffle else f"first {len(indices)}"
        of = f"the {which} samples drawn (--all: the whole split)"
    summary = dict(summarize(counted), of=of, drawn_indices=indices, pictures=pictures)
    _write_summary(summary, options.out_dir)
    return summary


def _write_summary(summary: Mapping[str, Any], out_dir: str) -> None:
    """``summary.json`` and ``summary.md`` in ``out_dir``."""
    write_text_atomic(os.path.join(out_dir, "summary.json"), strict_json.dumps(summary, indent=1) + "\n")
    write_text_atomic(os.path.join(out_dir, "summary.md"), summary_markdown(summary))
