"""The op-by-op replay has a CUDA graph's semantics: the captured work runs again on the same
tensors; Python values read during the capture stay, tensors filled in place are read anew; a host
read is refused during the capture."""

import pytest
import torch

from ppdist.engine.graph_capture import CaptureError, OpReplayCapture, capture_for


def test_a_replay_reads_tensors_filled_in_place_and_keeps_python_numbers():
    scale = torch.tensor(2.0)
    python_offset = 1.0
    x = torch.tensor([1.0, 2.0])
    capture = OpReplayCapture()
    out = capture.capture(lambda: x * scale + python_offset)
    assert out.tolist() == [3.0, 5.0]  # the capture runs the function
    scale.fill_(10.0)
    x.copy_(torch.tensor([3.0, 4.0]))
    python_offset = 100.0  # noqa: F841 (a CUDA graph would not see it either)
    capture.replay()
    assert out.tolist() == [31.0, 41.0]  # the same output tensor, new inputs, the old offset


def test_a_replayed_training_step_equals_the_steps_run_eagerly():
    def model_and_optimizer():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        )
        lr = torch.tensor(0.1, dtype=torch.float64)
        return model, torch.optim.Adam(model.parameters(), lr=lr, fused=True), lr

    inputs = [torch.randn(16, 4, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    eager, eager_opt, eager_lr = model_and_optimizer()
    replayed, opt, lr = model_and_optimizer()
    static_input = inputs[0].clone()

    def step(model, optimizer, x):
        optimizer.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        return loss.detach()

    eager_losses = []
    for i, x in enumerate(inputs):
        eager_lr.fill_(0.1 / (i + 1))
        eager_losses.append(step(eager, eager_opt, x).item())
    lr.fill_(0.1)  # an eager warm-up step: the optimizer's state exists before the capture
    replayed_losses = [step(replayed, opt, static_input).item()]
    capture = OpReplayCapture()
    lr.fill_(0.1 / 2)
    static_input.copy_(inputs[1])
    loss = capture.capture(lambda: step(replayed, opt, static_input))
    replayed_losses.append(loss.item())
    for i, x in enumerate(inputs[2:], start=2):
        lr.fill_(0.1 / (i + 1))
        static_input.copy_(x)
        capture.replay()
        replayed_losses.append(loss.item())
    assert replayed_losses == eager_losses
    for (name, a), b in zip(eager.state_dict().items(), replayed.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_host_read_is_refused_during_the_capture():
    x = torch.ones(3)
    with pytest.raises(CaptureError, match="reads a tensor's value on the host"):
        OpReplayCapture().capture(lambda: x * float(x.sum()))


def test_a_result_of_another_shape_at_replay_is_refused():
    x = torch.tensor([1.0, 0.0, 2.0])
    capture = OpReplayCapture()
    capture.capture(lambda: torch.nonzero(x))
    x.copy_(torch.tensor([1.0, 1.0, 2.0]))
    with pytest.raises(CaptureError, match=r"gave a \(3, 1\) result, captured \(2, 1\)"):
        capture.replay()


def test_the_cpu_gets_the_op_replay():
    assert isinstance(capture_for(torch.device("cpu")), OpReplayCapture)
