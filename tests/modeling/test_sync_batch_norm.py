"""ppdist's SyncBatchNorm on a 2-process gloo group: the statistics of one BatchNorm over both
processes' batches put together (outputs, gradients, running statistics by either variance rule),
the same numbers as torch's SyncBatchNorm with today's Paddle-rule hook (its CUDA-only kernels
replaced by ppdist's CPU arithmetic), and no host read where torch's reads 3 per layer."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sync_bn_testing import TorchKernelsOnCpu, make_batch_norm, rank_data, run
from torch import nn

from ppdist.modeling import sync_batch_norm as sbn
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule
from ppdist.utils.host_sync import HostSyncCounter

WORLD = 2
# per-rank input shapes (unequal batches: the counts are gathered, not assumed), memory format
CASES = {
    "2d": (((3, 4, 5, 6), (2, 4, 5, 6)), False),
    "2d_channels_last": (((3, 4, 5, 6), (2, 4, 5, 6)), True),
    "1d": (((6, 4), (3, 4)), False),
    "1d_sequence": (((3, 4, 7), (2, 4, 7)), False),
    "one_value_per_rank": (((1, 4, 1, 1), (1, 4, 1, 1)), False),  # PP-LiteSeg's 1x1 SPPM bin, batch 1
}
RULES = ("paddle", "torch")


def reference(shapes, channels_last, rule, rank):
    """One BatchNorm over every rank's batch put together; this rank's share of it."""
    module = make_batch_norm(shapes[0])
    apply_statistics_rule(module, rule)
    parts = [rank_data(shapes, channels_last, r) for r in range(WORLD)]
    out = run(module, torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    start = sum(shape[0] for shape in shapes[:rank])
    rows = slice(start, start + shapes[rank][0])
    return dict(out, y=out["y"][rows], x_grad=out["x_grad"][rows])


def summed_parameter_grads(out):
    """A process's weight/bias gradients summed over the group (DDP would average them)."""
    for key in ("weight_grad", "bias_grad"):
        dist.all_reduce(out[key])
    return out


def counted_run(module, x, grad):
    with HostSyncCounter() as counter:
        out = run(module, x, grad)
    return out, counter.count


def compare(rank, store):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    results = {}
    try:
        for name, (shapes, channels_last) in CASES.items():
            for rule in RULES:
                x, grad = rank_data(shapes, channels_last, rank)
                base = make_batch_norm(shapes[0])
                ours_module = sbn.convert_sync_batchnorm(copy.deepcopy(base))
                apply_statistics_rule(ours_module, rule)
                ours, our_reads = counted_run(ours_module, x, grad)
                theirs_module = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(base))
                apply_statistics_rule(theirs_module, rule)
                with TorchKernelsOnCpu():
                    theirs, their_reads = counted_run(theirs_module, x, grad)
                results[(name, rule)] = {
                    "ours": summed_parameter_grads(ours),
                    "torch": summed_parameter_grads(theirs),
                    "reference": reference(shapes, channels_last, rule, rank),
                    "reads": (our_reads, their_reads),
                    "channels_last": ours["y"].is_contiguous(memory_format=torch.channels_last),
                }
        return results
    finally:
        dist.destroy_process_group()


def worker(rank, store, out_path):
    results = compare(rank, store)
    torch.save(results, f"{out_path}.{rank}")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sync_bn")
    mp.spawn(worker, args=(str(folder / "store"), str(folder / "out")), nprocs=WORLD)
    return [torch.load(f"{folder / 'out'}.{rank}", weights_only=False) for rank in range(WORLD)]


def max_error(a, b):
    return ((a.double() - b.double()).abs() / (1 + b.double().abs())).max().item()


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow
def test_equals_one_batch_norm_over_both_processes_batches(results, case, rule):
    for per_rank in results:
        got, want = per_rank[(case, rule)]["ours"], per_rank[(case, rule)]["reference"]
        for key in want:
            assert max_error(got[key], want[key]) < 2e-6, (case, rule, key)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_numbers_as_torchs_sync_batch_norm_without_its_host_reads(results, case, rule):
    for per_rank in results:
        entry = per_rank[(case, rule)]
        for key, value in entry["torch"].items():
            if key != "num_batches_tracked":
                assert max_error(entry["ours"][key], value) < 1e-7, (case, rule, key)
        # with a momentum torch only counts the batches; Paddle's rule leaves the unused counter alone
        counted = (int(entry["torch"]["num_batches_tracked"]), int(entry["ours"]["num_batches_tracked"]))
        assert counted == ((1, 0) if rule == "paddle" else (1, 1))
        ours, theirs = entry["reads"]
        assert ours == 0
        assert theirs >= 3  # the three boolean-mask indexings of its gathered statistics


def test_channels_last_stays_channels_last(results):
    assert all(per_rank[("2d_channels_last", "paddle")]["channels_last"] for per_rank in results)


def test_conversion_keeps_the_parameter_objects_and_their_tags():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(4)))
    model[1].weight.regularizer_factor = 0.0
    model[1].weight.requires_grad_(False)
    model[2][0].eval()
    weight, running_var = model[1].weight, model[1].running_var
    converted = sbn.convert_sync_batchnorm(model)
    assert isinstance(converted[1], sbn.SyncBatchNorm) and isinstance(converted[2][0], sbn.SyncBatchNorm)
    assert converted[1].weight is weight and converted[1].running_var is running_var
    assert converted[1].weight.regularizer_factor == 0.0 and not converted[1].weight.requires_grad
    assert converted[1].training and not converted[2][0].training


def test_outside_a_process_group_it_is_a_batch_norm_with_the_rule():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 2, 2)
    plain, synced = nn.BatchNorm2d(3), sbn.convert_sync_batchnorm(nn.BatchNorm2d(3))
    for module in (plain, synced):
        apply_statistics_rule(module, "paddle")
    assert torch.equal(plain(x), synced(x))
    assert torch.equal(plain.running_var, synced.running_var)
