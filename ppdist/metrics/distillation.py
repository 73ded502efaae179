"""``DistillationMetric`` (PaddleOCR's): one base metric per model of a distillation post-process's
results ``{model name: results}``; the ``key`` model's numbers are the metric, the others are
reported beside them as ``{model}_{name}``."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ppdist.config.model_names import check_model_names
from ppdist.metrics.base import Metric
from ppdist.metrics.report import ReportItem
from ppdist.registry import METRICS, POSTPROCESSES


@METRICS.register(name="DistillationMetric")
class DistillationMetric(Metric):
    """``base_metric_name`` (e.g. RecMetric) built with ``main_indicator`` and the other keyword
    arguments (e.g. ``ignore_space``) for every model of the results, in their order.

    ``compute`` returns the ``key`` model's metrics under their own names and every other model's
    as ``{model}_{name}`` (``Teacher_acc``). ``state`` holds each model's state, so merged states
    give exactly the unsplit numbers; ``pictures``, ``nothing_evaluated`` are the key model's;
    ``bind_dataset`` reaches every model's metric.
    """

    def __init__(
        self,
        key: str,
        base_metric_name: str = "RecMetric",
        main_indicator: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        self.key = key
        self.base_metric_name = base_metric_name
        self.kwargs = dict(
            kwargs, **({"main_indicator": main_indicator} if main_indicator is not None else {})
        )
        probe = METRICS.build(dict(self.kwargs, name=base_metric_name), where="Metric")  # checks the kwargs
        self.main_indicator = probe.main_indicator
        self.dataset: Any = None
        self.metrics: Dict[str, Metric] = {}

    @classmethod
    def check_forwarded(cls, kwargs: Mapping[str, Any], where: str) -> None:
        """Config validation: the keywords meant for the base metric are its own."""
        own = ("key", "base_metric_name")
        base = kwargs.get("base_metric_name", "RecMetric")
        METRICS.check(base, {k: v for k, v in kwargs.items() if k not in own}, where)

    @staticmethod
    def check_config(options: Mapping[str, Any], where: str, config: Mapping[str, Any]) -> None:
        """Config validation: ``key`` is a model of ``Architecture.Models`` and one of those the
        post-process decodes (its ``model_name``): the results hold no other."""
        if "key" not in options:
            return
        used = [(f"{where}.key", options["key"])]
        check_model_names(used, config)
        post = config.get("PostProcess") or {}
        if post.get("name") in POSTPROCESSES and "model_name" in POSTPROCESSES.accepted_keys(post["name"])[0]:
            decoded = POSTPROCESSES.value_of(post, "model_name")
            decoded = [decoded] if isinstance(decoded, str) else list(decoded or [])
            check_model_names(
                used,
                config,
                decoded,
                known_as="one of the models PostProcess.model_name decodes (the results hold no other)",
            )

    @property
    def nothing_evaluated(self) -> Optional[str]:  # type: ignore[override]
        return getattr(self._key_metric(), "nothing_evaluated", None)

    def _new_metric(self) -> Metric:
        metric = METRICS.build(dict(self.kwargs, name=self.base_metric_name), where="Metric")
        bind = getattr(metric, "bind_dataset", None)
        if bind is not None and self.dataset is not None:
            bind(self.dataset)
        return metric

    def _metric_of(self, name: str) -> Metric:
        if name not in self.metrics:
            self.metrics[name] = self._new_metric()
        return self.metrics[name]

    def _key_metric(self) -> Metric:
        return self.metrics.get(self.key) or self._new_metric()

    def bind_dataset(self, dataset: Any) -> None:
        self.dataset = dataset
        for metric in self.metrics.values():
            bind = getattr(metric, "bind_dataset", None)
            if bind is not None:
                bind(dataset)

    def reset(self) -> None:
        for metric in self.metrics.values():
            metric.reset()

    def update(self, results: Mapping[str, Any], batch: Optional[Mapping[str, Any]] = None) -> None:
        if not isinstance(results, Mapping) or self.key not in results:
            held = sorted(results) if isinstance(results, Mapping) else type(results).__name__
            raise ValueError(
                f"DistillationMetric: key {self.key!r} is not a model of the post-process's results ({held}); "
                f"the post-process must be a distillation one (DistillationCTCLabelDecode)"
            )
        for name, model_results in results.items():
            self._metric_of(name).update(model_results, batch)

    def state(self) -> Dict[str, Any]:
        return {"models": {name: metric.state() for name, metric in self.metrics.items()}}

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        names: Dict[str, None] = {}
        for part in states:
            names.update(dict.fromkeys(part["models"]))
        self.metrics = {}
        for name in names:
            self._metric_of(name).load_states([p["models"][name] for p in states if name in p["models"]])

    def compute(self) -> Dict[str, float]:
        out = dict(self._key_metric().compute())
        for name, metric in self.metrics.items():
            if name != self.key:
                out.update({f"{name}_{k}": v for k, v in metric.compute().items()})
        return out

    def report(self) -> List[ReportItem]:
        return self._key_metric().report()
