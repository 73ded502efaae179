"""The operator counter of one training step (``tools/benchmark.py --count_ops``)."""

from __future__ import annotations

import json

import pytest
import torch
from ppdist_testing import QUICKSTART, check_ok, run_tool
from step_testing import device_batch, step_trainer

from ppdist.benchmark.op_count import PHASES, OpCount, _Counting, count_step_ops, launches, measure_step_ops
from ppdist.config import load_config
from ppdist.modeling.batch_norm_statistics import batch_norms

aten = torch.ops.aten


def test_views_and_allocations_launch_nothing_and_arithmetic_does():
    for op in (aten.view.default, aten.t.default, aten.detach.default, aten.empty.memory_format):
        assert not launches(op), op
    for op in (aten.add.Tensor, aten.convolution.default, aten.mul_.Tensor, aten.clone.default):
        assert launches(op), op


def test_counts_what_runs_in_the_mode():
    result = OpCount()
    with _Counting(result):
        x = torch.ones(4, 3)
        y = (x.t() @ x).view(-1).detach()  # mm; t, view and detach are views
        y.add_(1).sum()
    assert result.ops == {"ones": 1, "mm": 1, "add_": 1, "sum": 1}
    assert result.phases["update"] == result.total == 4  # outside a model, a loss and a backward


def crnn_trainer(*overrides: str):
    config = load_config(QUICKSTART, ["Global.synthetic_data=null", "Optimizer.fused=true", *overrides])
    trainer = step_trainer(config, 2, (32, 100), steps=3)
    return trainer, [device_batch(trainer, batch) for batch, _ in zip(trainer.train_loader, range(3))]


def test_the_forward_phase_is_the_models_forward_and_every_phase_is_counted():
    trainer, batches = crnn_trainer()
    trainer.step(batches[0])
    counted = count_step_ops(trainer, batches[1])
    assert set(counted.phases) == set(PHASES) and all(counted.phases[p] > 0 for p in PHASES)
    assert counted.total == sum(counted.ops.values())
    # the same forward alone, counted outside the hooks, is the step's forward phase
    alone = OpCount()
    with _Counting(alone):
        trainer.model(batches[2])
    assert alone.total == counted.phases["forward"]
    # the backward's convolution gradients come once per convolution of the forward
    assert counted.ops["convolution_backward"] == counted.ops["convolution"] > 0


def test_paddles_variance_rule_and_the_batch_counter_cost_no_operator():
    """Paddle's variance rule and ``num_batches_tracked`` launch nothing (they cost a ``mul_``, a
    ``div_`` and an ``add_`` per BatchNorm through Python hooks before issue 41): each BatchNorm of
    a step is its kernel alone. ``tools/benchmark.py --count_ops`` tracks it in docs/benchmarks.md."""
    counts = {}
    for rule in ("paddle", "torch"):
        trainer, batches = crnn_trainer(f"Global.bn_statistics={rule}")
        trainer.step(batches[0])
        counts[rule] = count_step_ops(trainer, batches[1])
        layers = batch_norms(trainer.model)
        assert layers and all(
            (int(bn.num_batches_tracked) == 0) == (rule == "paddle") for bn in layers.values()
        )
    # the one difference from torch's own BatchNorm (``bn_statistics: torch``): its counter
    assert counts["torch"].phases["forward"] - counts["paddle"].phases["forward"] == len(layers)
    assert counts["torch"].ops - counts["paddle"].ops == {"add_": len(layers)}
    assert counts["paddle"].phases["backward"] == counts["torch"].phases["backward"]
    assert counts["paddle"].ops["native_batch_norm"] == len(layers)
    # one BatchNorm of the model by itself, at an input size it has seen: one operator
    trainer, batches = crnn_trainer("Global.bn_statistics=paddle")
    bn = next(iter(batch_norms(trainer.model).values())).train()
    x = torch.randn(2, bn.num_features, 4, 4)
    bn(x)
    alone = OpCount()
    with _Counting(alone):
        bn(x)
    assert alone.ops == {"native_batch_norm": 1}


def test_measure_step_ops_reports_a_fused_update():
    config = load_config(QUICKSTART, ["Global.synthetic_data=null"])
    result = measure_step_ops(config, 2, (32, 100), warmup=1)
    assert result["total"] == sum(result["phases"].values())
    # the fused Adam: a few launches for all parameters, not a loop over them
    parameters = sum(1 for _ in step_trainer(config, 2, (32, 100), steps=1).model.parameters())
    assert result["phases"]["update"] < parameters
    assert config["Optimizer"].get("fused") is not True  # the caller's config is left as it was


@pytest.mark.slow
def test_the_tool_writes_the_count(tmp_path):
    out = tmp_path / "ops.json"
    args = ["benchmark.py", "-c", QUICKSTART, "--count_ops", "--count_size", "32", "100", "--warmup", "1"]
    result = check_ok(run_tool(args + ["--json", str(out), "--output_dir", str(tmp_path)]))
    data = json.loads(out.read_text())
    assert data["total"] == sum(data["phases"].values()) > 100
    assert data["size"] == [32, 100] and data["batch_size"] == 2
    assert (
        f"ATen operators of one training step (quickstart_synth, batch 2 at 32x100, cpu): {data['total']:,}"
        in (result.stdout)
    )
