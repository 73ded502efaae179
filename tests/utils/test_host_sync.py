"""The host-sync counter flags every kind of host read of a device value, and nothing else."""

import torch
import torch.nn.functional as F

from ppdist.utils.host_sync import HostSyncCounter, count_host_syncs


def kinds(counter: HostSyncCounter) -> list:
    return [event.kind for event in counter.events]


def test_scalar_reads_of_device_tensors_are_counted():
    x = torch.randn(4, requires_grad=True)
    with HostSyncCounter() as counter:
        float(x.detach().sum())
        bool((x > 0).any())
        int(x.argmax())
        x.sum().item()
    assert kinds(counter) == ["aten::_local_scalar_dense"] * 4
    assert all("test_host_sync.py" in event.where for event in counter.events)


def test_data_dependent_shapes_are_counted():
    x = torch.randn(6)
    mask = x > 0
    repeats = torch.tensor([1, 2, 0, 1, 1, 1])
    with HostSyncCounter() as counter:
        x[mask]
        x.nonzero()
        x.masked_select(mask)
        torch.unique(x)
        y = x.clone()
        y[mask] = 0.0
        x.repeat_interleave(repeats)
    assert len(counter.events) == 6, counter.report()


def test_transfers_are_counted_but_host_work_is_not():
    x = torch.randn(4)
    lengths = torch.tensor([3, 2])
    with HostSyncCounter(host=[lengths]) as counter:
        x.tolist()
        x.cpu()
        x.numpy()
        torch.tensor(0.5, device=x.device)  # a blocking copy of a Python scalar
        lengths.to(x.device)  # blocking host-to-device copy
        # host-side work: declared host tensors, factories without a device, what derives from them
        (lengths * 2).tolist()
        torch.zeros(3).sum().item()
        torch.tensor([1, 2]).max().item()
        torch.where(lengths > 2, lengths, 0).sum().item()
        lengths.to(x.device, non_blocking=True)
    assert kinds(counter) == [
        "Tensor.tolist()",
        "Tensor.cpu()",
        "Tensor.numpy()",
        "torch.tensor(python data, device=...)",
        "blocking host-to-device copy",
    ], counter.report()


def test_fixed_shape_reductions_and_backward_are_free():
    w = torch.randn(8, 3, requires_grad=True)
    x, labels = torch.randn(5, 8), torch.tensor([0, 2, 1, 1, 0], device="cpu")

    def step():
        logits = x @ w
        positive = (labels != 0).float()
        loss = (F.cross_entropy(logits, labels, reduction="none") * positive).sum() / positive.sum().clamp(
            min=1
        )
        loss.backward()
        torch._foreach_lerp_([w.detach()], [w.grad], 0.1)

    counter = count_host_syncs(step)
    assert counter.count == 0, counter.report()


def test_ctc_with_device_lengths_is_counted_with_host_lengths_not():
    log_probs = torch.randn(10, 2, 5).log_softmax(-1)
    targets = torch.tensor([[1, 2], [3, 0]], device=log_probs.device)
    device_lengths = torch.tensor([2, 1], device=log_probs.device)
    host_lengths = torch.tensor([2, 1])
    with HostSyncCounter(host=[host_lengths]) as counter:
        F.ctc_loss(log_probs, targets, torch.full((2,), 10, device=log_probs.device), device_lengths)
        F.ctc_loss(log_probs, targets, torch.full((2,), 10), host_lengths)
    assert kinds(counter) == ["ctc_loss with lengths on the device"], counter.report()


def test_patches_are_removed_on_exit():
    tolist, tensor = torch.Tensor.tolist, torch.tensor
    with HostSyncCounter():
        pass
    assert torch.Tensor.tolist is tolist and torch.tensor is tensor


def test_torch_compile_traces_the_factories_after_a_count():
    with HostSyncCounter():  # wraps torch.arange & co. while it counts
        torch.arange(3)

    def shifted(x: torch.Tensor) -> torch.Tensor:
        return torch.arange(4, dtype=x.dtype, device=x.device) + x

    assert torch.compile(shifted, backend="eager", fullgraph=True)(torch.zeros(4)).tolist() == [0, 1, 2, 3]
