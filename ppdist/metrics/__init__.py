"""Metrics; importing this package registers them in ``METRICS``."""

from ppdist.metrics.base import Metric
from ppdist.metrics.coco import COCOMetric
from ppdist.metrics.distillation import DistillationMetric
from ppdist.metrics.rec import RecMetric
from ppdist.metrics.seg import SegMetric
from ppdist.metrics.table import TableMetric

__all__ = ["COCOMetric", "DistillationMetric", "Metric", "RecMetric", "SegMetric", "TableMetric"]
