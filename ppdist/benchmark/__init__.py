"""Throughput measurements behind ``tools/benchmark.py``: the trainer against a bare loop, the
input pipeline, multi-process scaling, evaluation and inference, in one run on one machine."""
