"""The contract of a loss whose normaliser spans the data-parallel processes (PP-YOLOE's).

Such a loss divides its sum by a normaliser ``clamp(mean over processes of a per-batch quantity,
min=floor)``. It returns that mean, before the floor and detached, under ``NORMALIZER_KEY``, and
has the attribute ``normalizer_floor``. With gradient accumulation the trainer then normalises
the ``K`` micro-batches of a step together, as ``N * K`` processes would: each micro-batch's
gradient is taken unnormalised, and their sum is divided once by the floor-clamped mean of the
``K`` normalisers. Losses without the key are means over their batch: each micro-batch's loss
is divided by ``K``.
"""

from __future__ import annotations

NORMALIZER_KEY = "normalizer"
