"""Training curves: loss terms, learning rate and the main evaluation metrics against global
step, several runs overlaid (``tools/plot_logs.py``, and ``curves.png`` after every evaluation).

What a person compares is drawn by default: every training value (the loss terms, the learning
rate) and the evaluation metrics except COCO's breakdowns by object size and its recalls
(``DETAIL_CURVES``; drawn when named in ``keys``). An evaluation value of -1 is COCO's "no
data" (no object of that size), nan an evaluation with nothing to score: neither is drawn. Axes read plainly: no offset, no
scientific multiplier (0.0000003 is written so, not as 3 under a 1e-7)."""

from __future__ import annotations

import math
from typing import List, Mapping, Optional, Sequence, Tuple

from ppdist.visualize.figures import new_figure, save_png
from ppdist.visualize.train_log import Series, is_curve

PANEL_PX = (500, 320)  # the largest panel
MIN_PANEL_PX = (300, 180)
FIGURE_PX = (1600, 1200)  # the panels shrink to fit, down to MIN_PANEL_PX
DETAIL_CURVES = frozenset(
    ("ap_small", "ap_medium", "ap_large", "ar1", "ar10", "ar100", "ar_small", "ar_medium", "ar_large")
)
NO_DATA = -1.0  # COCOeval's value for "nothing to measure" (no ground truth of that area range)


def curve_names(series: Series) -> List[str]:
    """The names to plot in a series, without the ``train/`` / ``eval/`` prefix: the loss
    first, then the learning rate, the other training values, then the evaluation metrics (in
    the order they were logged: the loss terms and the metric's numbers in their own order).
    Costs and counts are left out."""
    names: List[str] = []
    for full in sorted(series, key=lambda n: not n.startswith("train/")):  # stable: logged order kept
        name = full.split("/", 1)[-1]
        if name not in names and is_curve(name):
            names.append(name)
    first = [n for n in ("loss", "lr") if n in names]
    return first + [n for n in names if n not in first]


def select_names(runs: Mapping[str, Series], keys: Optional[Sequence[str]]) -> List[str]:
    """``keys`` (bare names, e.g. ``loss,lr,acc``, or ``train/acc`` / ``eval/acc``) checked against
    what the runs logged; the main ones (not ``DETAIL_CURVES``) when None. Names with no value
    but -1 ("no data") are left out."""
    found: List[str] = []
    for series in runs.values():
        found += [n for n in curve_names(series) if n not in found]
    if not keys:
        keys = [n for n in found if n not in DETAIL_CURVES]
    else:
        present = set(found) | {full for series in runs.values() for full in series if is_curve(full)}
        unknown = [k for k in keys if k not in present]
        if unknown:
            raise ValueError(
                f"no curve named {', '.join(unknown)} in these runs; they logged: {', '.join(found)}"
            )
    return [k for k in keys if any(_points(s, full) for s in runs.values() for full, _ in _curves_of(s, k))]


def draw_curves(runs: Mapping[str, Series], out_path: str, keys: Optional[Sequence[str]] = None) -> List[str]:
    """One panel per name against global step, each run a colour (training lines solid,
    evaluations dashed with markers); writes ``out_path`` (PNG) and returns the names drawn."""
    names = select_names(runs, keys)
    if not names:
        raise ValueError("nothing to plot: the runs logged no values yet")
    columns, rows, panel = layout(len(names))
    figure = new_figure((panel[0] * columns, panel[1] * rows))
    colours = [f"C{i % 10}" for i in range(len(runs))]
    for index, name in enumerate(names):
        axes = figure.add_subplot(rows, columns, index + 1)
        for colour, (label, series) in zip(colours, runs.items()):
            for full, style in _curves_of(series, name):
                points = _points(series, full)
                axes.plot(
                    [step for step, _ in points],
                    [value for _, value in points],
                    color=colour,
                    label=f"{label} ({full.split('/')[0]})" if "/" in full else label,
                    **style,
                )
        axes.set_title(name)
        axes.set_xlabel("global step")
        axes.grid(alpha=0.3)
        axes.ticklabel_format(style="plain", useOffset=False)  # before a log scale replaces it
        if name.split("/")[-1].startswith("loss"):
            _log_scale_if_wide(axes)
        axes.legend(fontsize="x-small")
    figure.tight_layout()
    save_png(figure, out_path)
    return names


def layout(count: int) -> Tuple[int, int, Tuple[int, int]]:
    """``(columns, rows, (panel width, height))`` for ``count`` panels: 3 columns up to 9 panels,
    4 beyond; panels shrink so that the figure fits ``FIGURE_PX`` (down to ``MIN_PANEL_PX``)."""
    columns = min(3 if count <= 9 else 4, count)
    rows = math.ceil(count / columns)
    width = max(MIN_PANEL_PX[0], min(PANEL_PX[0], FIGURE_PX[0] // columns))
    height = max(MIN_PANEL_PX[1], min(PANEL_PX[1], FIGURE_PX[1] // rows))
    return columns, rows, (width, height)


def _curves_of(series: Series, name: str) -> List[tuple]:
    if "/" in name:
        return [(name, _style(name))] if name in series else []
    return [(f"{p}/{name}", _style(p)) for p in ("train", "eval") if f"{p}/{name}" in series]


def _points(series: Series, full: str) -> List[Tuple[int, float]]:
    """The ``(step, value)`` points of ``series[full]`` in step order; an evaluation's "no data"
    (COCO's -1, the nan of an evaluation that had nothing to score) left out."""
    evaluation = full.startswith("eval/")
    return [
        (s, v)
        for s, v in sorted(series[full].items())
        if not (evaluation and (v == NO_DATA or math.isnan(v)))
    ]


def _style(prefix_or_name: str) -> dict:
    if prefix_or_name.startswith("eval"):
        return {"linestyle": "--", "marker": "o", "markersize": 3}
    return {"linewidth": 1.2}


def _log_scale_if_wide(axes) -> None:
    """Log scale when a positive curve spans more than two decades (a loss from 50 to 0.05)."""
    values = [v for line in axes.get_lines() for v in line.get_ydata() if v > 0 and math.isfinite(v)]
    if (
        values
        and max(values) / min(values) > 100
        and all(v > 0 for line in axes.get_lines() for v in line.get_ydata())
    ):
        axes.set_yscale("log")
