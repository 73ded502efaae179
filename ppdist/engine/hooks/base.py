"""The hook interface of ``ppdist.engine.trainer.Trainer``.

A hook is an object with up to five methods the loop calls on every process, in the order below,
and a state of its own that checkpoints keep under the hook's ``name``::

    hook.before_train()
    while the schedule is not done:
        for each batch of the epoch:
            hook.before_step()
            trainer.run_step(batch)
            hook.after_step()
        hook.after_epoch()
    hook.after_train()

Hooks run by ascending ``priority`` (ties: in the order they were added); ``after_train`` runs in
the reverse order, as a stack unwinds, so that what the later hooks do at the end (a final
evaluation, the last checkpoint) is done before the log hook writes its closing line. Saving a
checkpoint and evaluating are collective: every process runs every hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping

if TYPE_CHECKING:  # the trainer imports this module; hooks only see it at run time
    from ppdist.engine.trainer import Trainer

# the built-in hooks' priorities: lower runs first
PRIORITY_RUN_DIR = -10  # claims nothing in before_train; its after_train (run in reverse) comes last
PRIORITY_CLOCK = 0
PRIORITY_BAD_SAMPLES = 10
PRIORITY_LOG = 20
PRIORITY_CURVES = 21
PRIORITY_NONFINITE = 25
PRIORITY_EVALUATION = 30
PRIORITY_EARLY_STOP = 35
PRIORITY_CHECKPOINT = 40
PRIORITY_DEFAULT = 50  # hooks added by the user: after the built-ins


class Hook:
    """Base class: every method is optional. ``self.trainer`` is set when the hook is added.

    ``state_dict()`` / ``load_state_dict()`` carry what the hook must remember across a resume
    (e.g. the best metric); ``summary()`` adds to what ``Trainer.train()`` returns.
    """

    name: str = ""  # key of the hook's state in checkpoints; the class name when empty
    priority: int = PRIORITY_DEFAULT
    trainer: "Trainer"

    def before_train(self) -> None:
        """Once, before the first step (also when a resumed run has nothing left to do)."""

    def before_step(self) -> None:
        """Before each step, once its batch is loaded."""

    def after_step(self) -> None:
        """After each step: ``trainer.last_step`` and ``trainer.position`` describe it."""

    def after_epoch(self) -> None:
        """After the last step of an epoch, or of the schedule when it ends mid-epoch."""

    def after_train(self) -> None:
        """Once, after the last step."""

    def after_failure(self) -> None:
        """Once, when training stops on an exception (instead of ``after_train``; the exception
        propagates after it): give back what the run holds."""

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned (called before ``before_train`` on a resume)."""

    def summary(self) -> Dict[str, Any]:
        """What the hook adds to ``Trainer.train()``'s result (e.g. the best metrics)."""
        return {}

    @property
    def hook_name(self) -> str:
        return self.name or type(self).__name__


def ends_window(trainer: "Trainer", period: int) -> bool:
    """True on every ``period``-th global step, after the last step of an epoch and after the last
    step of the schedule: where the log line and the checks that go with it happen."""
    return trainer.position.global_step % period == 0 or trainer.epoch_done or trainer.finished
