"""The hook that gives a run's output folder back when its training ends (``ppdist.engine.run_dir``)."""

from __future__ import annotations

from ppdist.engine.hooks.base import PRIORITY_RUN_DIR, Hook
from ppdist.engine.run_dir import RunDirClaim


class RunDirRelease(Hook):
    """Releases the claim ``build_trainer`` took on ``save_model_dir`` after every other hook's
    ``after_train`` and once the last checkpoint is whole (the background write waited for), or
    when training fails, so that the folder is free for the next run (of this process, checked like
    any other, or of another process)."""

    name = "run_dir"
    priority = PRIORITY_RUN_DIR

    def __init__(self, claim: RunDirClaim) -> None:
        self.claim = claim

    def after_train(self) -> None:
        self.trainer.wait_for_checkpoints()
        self.claim.release()

    def after_failure(self) -> None:
        try:
            self.trainer.wait_for_checkpoints(raise_error=False)
        finally:
            self.claim.release()
