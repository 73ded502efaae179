"""Test helpers: one training step of any config on a synthetic batch, without its data set
(``ppdist.benchmark.synthetic_step``: ``step_trainer``, ``device_batch``, ``synthetic_sample``)."""

from ppdist.benchmark.synthetic_step import device_batch, step_trainer, synthetic_sample

__all__ = ["device_batch", "step_trainer", "synthetic_sample"]
