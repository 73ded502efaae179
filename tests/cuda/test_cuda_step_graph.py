"""On a GPU: ``Global.cuda_graph`` replays a CUDA graph of the whole step. It equals the eager step
(the same kernels; a backward with atomic adds may differ in the last bits), reads nothing on the
host between log steps, and a captured run resumes exactly. The CPU twin of these tests:
tests/engine/test_step_graph.py."""

import os

import pytest
import torch
from cuda_testing import PRECISIONS, device_syncs, sync_warnings
from ppdist_testing import REPO, StopAfterStep, tiny_seg_config
from step_testing import device_batch, step_trainer

from ppdist.benchmark.step_time import measure_step_time
from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.graph_capture import CudaGraphCapture
from ppdist.engine.logger import setup_logger
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.engine.setup import build_trainer

CUDA = torch.device("cuda")
CONFIGS = {
    "pp_liteseg": (os.path.join(REPO, "configs", "seg", "quickstart_synth.yml"), 4, (128, 128)),
    "ocrnet": (os.path.join(REPO, "configs", "seg", "quickstart_ocrnet_synth.yml"), 2, (128, 128)),
    "slanet": (os.path.join(REPO, "configs", "table", "quickstart_synth.yml"), 2, (128, 128)),
    "crnn": (os.path.join(REPO, "configs", "rec", "quickstart_synth.yml"), 16, (32, 100)),
}
EXTRA = {"crnn": ["Global.cuda_graph=true"]}  # CTC's lengths on the device, eager and captured alike
STEPS = 8


def trained(name, precision, capture):
    path, batch_size, size = CONFIGS[name]
    overrides = ["Global.synthetic_data=null", "Global.use_ema=true", "Global.grad_clip=1.0"]
    config = load_config(
        path, overrides + PRECISIONS[precision] + ["Optimizer.fused=true"] + EXTRA.get(name, [])
    )
    trainer = step_trainer(
        config,
        batch_size,
        size,
        env=DistEnv(device=CUDA),
        steps=STEPS,
        nan_policy="stop",
        capture_step=capture,
    )
    batches = [device_batch(trainer, batch) for batch in trainer.train_loader]
    losses = []
    for batch in batches:
        values, _ = trainer.step(batch)
        trainer.position.global_step += 1
        losses.append(torch.stack(list(values.values())))
    return trainer, torch.stack(losses)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_cuda_graph_replay_equals_the_eager_step(name, precision):
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    eager, eager_losses = trained(name, precision, capture=False)
    captured, captured_losses = trained(name, precision, capture=True)
    assert isinstance(captured.step_graph.capture, CudaGraphCapture) and captured.step_graph.captured
    torch.testing.assert_close(captured_losses, eager_losses, rtol=1e-4, atol=1e-5)
    for (key, a), b in zip(eager.model.state_dict().items(), captured.model.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=key)
    assert captured.ema.step == eager.ema.step == STEPS
    assert captured.nonfinite.found(DistEnv(device=CUDA)) is None


def test_a_replayed_step_makes_no_synchronising_call():
    path, batch_size, size = CONFIGS["pp_liteseg"]
    config = load_config(path, ["Global.synthetic_data=null", "Global.use_ema=true"] + PRECISIONS["bf16"])
    trainer = step_trainer(config, batch_size, size, env=DistEnv(device=CUDA), steps=STEPS, capture_step=True)
    batches = [device_batch(trainer, batch) for batch in trainer.train_loader]
    for batch in batches[:5]:  # eager, then the capture
        trainer.step(batch)
    with device_syncs() as caught:
        for batch in batches[5:]:
            trainer.step(batch)
    assert sync_warnings(caught) == []


def test_step_time_measures_the_captured_step():
    """``tools/benchmark.py --step_time`` with ``*_graph`` precisions: the eager steps and the
    capture are warm-up, the timed steps are replays (recorded for docs/benchmarks.md)."""
    path, batch_size, size = CONFIGS["ocrnet"]
    config = load_config(path, ["Global.synthetic_data=null", "Global.cuda_graph=true"])
    record = measure_step_time(config, batch_size, size, CUDA, warmup=1, iters=5, profile_steps=1)
    assert record["cuda_graph"] is True
    assert record["samples_per_s"] > 0 and record["issue_ms"] > 0 and record["kernels_per_step"] > 0


def test_a_captured_run_on_the_gpu_resumes_exactly(tmp_path):
    setup_logger(None)

    def run(name, hooks=()):
        path = tiny_seg_config(
            str(tmp_path / f"{name}.yml"), str(tmp_path / "data"), str(tmp_path / name), 24
        )
        overrides = ["Train.loader.num_workers=0", "Global.cuda_graph=true", "Global.deterministic=true"]
        config = load_config(path, overrides + ["Global.save_iter_step=8", "Global.checkpoints=auto"])
        ensure_synthetic_data(config, DistEnv(device=CUDA))
        return build_trainer(config, DistEnv(device=CUDA), hooks=hooks)

    straight = run("straight")
    straight.train()
    killed = run("killed", hooks=[StopAfterStep(13)])
    with pytest.raises(RuntimeError, match="killed"):
        killed.train()
    resumed = run("killed")
    assert resumed.position.global_step == 8
    resumed.train()
    assert resumed.step_graph.captured and resumed.position.global_step == 24
    for (key, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), key
