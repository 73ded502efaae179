"""The shared trainer, evaluator, checkpointing and distributed helpers."""
