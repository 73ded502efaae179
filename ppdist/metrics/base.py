"""The metric contract the evaluator relies on."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ppdist.metrics.report import ReportItem


class Metric:
    """Accumulates per-batch results; its state is picklable and mergeable across ranks.

    ``update(results, batch)`` adds one batch; ``state()`` returns a picklable snapshot;
    ``load_states(states)`` replaces the accumulated state by the merge of several
    snapshots (one per rank, in rank order); ``compute()`` returns a dict of floats that
    includes ``main_indicator``. Merging must be exact: N-process eval must give exactly
    the single-process numbers (use integer counts or ``math.fsum`` over per-sample values).

    When the evaluated samples hold nothing to score (every label pixel ignored, no ground-truth
    box), ``compute`` returns nan for the scores and sets ``nothing_evaluated`` to the reason (the
    evaluator warns with it; nan is never a best); otherwise ``nothing_evaluated`` is None.
    """

    main_indicator: str = ""
    nothing_evaluated: Optional[str] = None

    def reset(self) -> None:
        raise NotImplementedError

    def update(self, results: Any, batch: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def state(self) -> Dict[str, Any]:
        raise NotImplementedError

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        raise NotImplementedError

    def compute(self) -> Dict[str, float]:
        raise NotImplementedError

    def report(self) -> List[ReportItem]:
        """What the last ``compute`` saw, as text files and picture data
        (``ppdist.metrics.report``; ``ppdist.visualize.eval_pictures.write_report`` writes them),
        on the process holding the merged state. Nothing by default."""
        return []
