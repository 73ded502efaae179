"""The loop and its hooks, driven with plain Python objects (no config file): order, state, names."""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ppdist.data.build import Collate
from ppdist.data.samplers import TrainBatchSampler
from ppdist.engine.hooks import Checkpointer, Hook
from ppdist.engine.trainer import Trainer
from ppdist.errors import ConfigError
from ppdist.optim import ConstLR, IterScheduler


class Line(Dataset):
    """y = 3x + 1 on 64 points."""

    def __init__(self) -> None:
        self.x = np.linspace(-1, 1, 64, dtype=np.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, item):
        index = item[0]
        return {"x": self.x[index : index + 1], "y": 3 * self.x[index : index + 1] + 1}


class Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(1, 1)

    def forward(self, batch: Dict[str, Any]) -> torch.Tensor:
        return self.fc(batch["x"])


def squared_error(preds: torch.Tensor, batch: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    return {"loss": ((preds - batch["y"]) ** 2).mean()}


class Recorder(Hook):
    """Appends (name, stage, global step) to a shared list."""

    def __init__(self, name: str, log: List, priority: int = 50) -> None:
        self.name, self.log, self.priority = name, log, priority

    def _record(self, stage: str) -> None:
        self.log.append((self.name, stage, self.trainer.position.global_step))

    def before_train(self):
        self._record("before_train")

    def before_step(self):
        self._record("before_step")

    def after_step(self):
        self._record("after_step")

    def after_epoch(self):
        self._record("after_epoch")

    def after_train(self):
        self._record("after_train")


class Counter(Hook):
    """Counts steps across resumes (its state) and reports it in the summary."""

    name = "counter"

    def __init__(self) -> None:
        self.steps = 0

    def after_step(self):
        self.steps += 1

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]

    def summary(self):
        return {"counted_steps": self.steps}


def make_trainer(hooks=(), total_steps=24, save_dir=None, seed=0) -> Trainer:
    torch.manual_seed(seed)
    loader = DataLoader(
        Line(), batch_sampler=TrainBatchSampler(64, 8, shuffle=True, seed=seed), collate_fn=Collate()
    )
    model = Affine()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = IterScheduler(optimizer, ConstLR(0.5, step_each_epoch=8))
    return Trainer(
        model,
        squared_error,
        optimizer,
        scheduler,
        loader,
        total_steps=total_steps,
        hooks=hooks,
        save_dir=save_dir,
    )


def test_the_loop_trains_plain_objects_and_calls_the_hooks_in_order():
    log: List = []
    trainer = make_trainer([Recorder("r", log)], total_steps=20)  # 2.5 epochs of 8 steps
    trainer.train()
    assert torch.allclose(trainer.model.fc.weight, torch.tensor([[3.0]]), atol=0.05)
    assert torch.allclose(trainer.model.fc.bias, torch.tensor([1.0]), atol=0.05)
    stages = [stage for _, stage, _ in log]
    assert stages[0] == "before_train" and stages[-1] == "after_train"
    assert stages[1:-1] == (["before_step", "after_step"] * 8 + ["after_epoch"]) * 2 + [
        "before_step",
        "after_step",
    ] * 4 + ["after_epoch"]
    assert [step for _, stage, step in log if stage == "after_step"] == list(range(1, 21))
    position = trainer.position
    assert (position.next_epoch, position.next_batch, position.epoch_consumed, position.global_step) == (
        3,
        4,
        32,
        20,
    )
    assert trainer.last_step.samples == 8 and trainer.last_step.values["loss"].ndim == 0


def test_hooks_run_by_priority_and_after_train_unwinds():
    log: List = []
    hooks = [Recorder("late", log, 60), Recorder("early", log, 5), Recorder("late_too", log, 60)]
    make_trainer(hooks, total_steps=1).train()
    order = {stage: [name for name, s, _ in log if s == stage] for stage in ("before_train", "after_step")}
    assert order == {
        "before_train": ["early", "late", "late_too"],
        "after_step": ["early", "late", "late_too"],
    }
    assert [name for name, stage, _ in log if stage == "after_train"] == ["late_too", "late", "early"]


def test_a_hook_state_is_saved_under_its_name_and_restored(tmp_path):
    first = make_trainer(
        [Counter(), Checkpointer(save_epoch_step=100)], total_steps=8, save_dir=str(tmp_path)
    )
    assert first.train() == {"counted_steps": 8}
    saved = torch.load(tmp_path / "latest.pt", weights_only=True)
    assert saved["hooks"]["counter"] == {"steps": 8} and saved["position"]["global_step"] == 8

    resumed = make_trainer([Checkpointer()], total_steps=16, save_dir=str(tmp_path / "again"))
    resumed.load_state_dict(saved)
    late = Counter()  # added after the state was loaded: it gets its state when added
    resumed.register_hooks([late])
    assert late.steps == 8
    assert resumed.train()["counted_steps"] == 16


def test_hook_names_are_unique():
    with pytest.raises(ConfigError, match="two hooks are named 'counter'"):
        make_trainer([Counter(), Counter()])


def test_the_loader_must_have_the_resumable_sampler():
    loader = DataLoader(Line(), batch_size=8)
    model = Affine()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="TrainBatchSampler"):
        Trainer(
            model, squared_error, optimizer, IterScheduler(optimizer, ConstLR(0.1, 8)), loader, total_steps=2
        )
