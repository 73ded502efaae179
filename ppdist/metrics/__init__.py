"""Metrics; importing this package registers them in ``METRICS``."""
from ppdist.metrics.base import Metric
from ppdist.metrics.rec import RecMetric

__all__ = ["Metric", "RecMetric"]
