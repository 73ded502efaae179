"""ppdist's SyncBatchNorm on the GPU, where it runs torch's fused kernels (the CPU suite checks
their CPU stand-ins): the statistics of one BatchNorm over every process's batch, and no host
synchronisation in a forward + backward.

Two processes share one GPU over gloo (NCCL refuses two ranks on one device), so this runs on a
one-GPU machine; the sync-free check uses a one-process NCCL group and calls the autograd function
directly (a group of one process does not synchronise through the module).
"""

import copy

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sync_bn_testing import make_batch_norm, rank_data, run

from ppdist.modeling import sync_batch_norm as sbn
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

WORLD = 2
CASES = {  # per-rank input shapes (unequal batches), channels_last
    "2d": (((3, 8, 5, 6), (2, 8, 5, 6)), False),
    "2d_channels_last": (((3, 8, 5, 6), (2, 8, 5, 6)), True),
    "1d_sequence": (((3, 8, 7), (2, 8, 7)), False),
}
RULES = ("paddle", "torch")


def gloo_worker(rank, store, out_path):
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    results = {}
    try:
        for name, (shapes, channels_last) in CASES.items():
            for rule in RULES:
                base = make_batch_norm(shapes[0]).cuda()
                ours = sbn.convert_sync_batchnorm(copy.deepcopy(base))
                apply_statistics_rule(ours, rule)
                out = run(ours, *rank_data(shapes, channels_last, rank, "cuda"))
                for key in ("weight_grad", "bias_grad"):  # summed over the group (DDP averages)
                    dist.all_reduce(out[key])
                whole = copy.deepcopy(base)
                apply_statistics_rule(whole, rule)
                parts = [rank_data(shapes, channels_last, r, "cuda") for r in range(WORLD)]
                want = run(whole, torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
                start = sum(shape[0] for shape in shapes[:rank])
                rows = slice(start, start + shapes[rank][0])
                want = dict(want, y=want["y"][rows], x_grad=want["x_grad"][rows])
                results[(name, rule)] = {
                    "ours": {k: v.cpu() for k, v in out.items()},
                    "reference": {k: v.cpu() for k, v in want.items()},
                }
        torch.save(results, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


def max_error(a, b):
    return ((a.double() - b.double()).abs() / (1 + b.double().abs())).max().item()


def test_fused_kernels_equal_one_batch_norm_over_both_processes_batches(tmp_path):
    mp.spawn(gloo_worker, args=(str(tmp_path / "store"), str(tmp_path / "out")), nprocs=WORLD)
    for rank in range(WORLD):
        results = torch.load(f"{tmp_path / 'out'}.{rank}", weights_only=False)
        assert len(results) == len(CASES) * len(RULES)
        for (case, rule), entry in results.items():
            for key, want in entry["reference"].items():
                # cuDNN's BatchNorm and the fused SyncBN kernels reduce in different orders
                assert max_error(entry["ours"][key], want) < 1e-5, (rank, case, rule, key)


def nccl_worker(rank, store, out_path):
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        module = make_batch_norm((4, 16, 20, 20)).cuda()
        apply_statistics_rule(module, "paddle")
        x = torch.randn(4, 16, 20, 20, device="cuda").requires_grad_(True)

        def step():
            y = sbn._SyncBatchNormFunction.apply(
                x, module.weight, module.bias, module.running_mean, module.running_var,
                module.eps, module.momentum, dist.group.WORLD, 1, True,
            )  # fmt: skip
            y.square().sum().backward()
            return y

        step()  # warm-up: NCCL's communicator and the kernels' first launches
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                y = step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        plain = make_batch_norm((4, 16, 20, 20)).cuda()
        apply_statistics_rule(plain, "paddle")
        for _ in range(4):
            want = plain(x.detach())
        torch.save(
            {
                "y": (y.detach().cpu(), want.detach().cpu()),
                "running_var": (module.running_var.cpu(), plain.running_var.cpu()),
                "running_mean": (module.running_mean.cpu(), plain.running_mean.cpu()),
            },
            out_path,
        )
    finally:
        dist.destroy_process_group()


def test_fused_path_makes_no_host_synchronisation(tmp_path):
    mp.spawn(nccl_worker, args=(str(tmp_path / "store"), str(tmp_path / "out")), nprocs=1)
    results = torch.load(tmp_path / "out", weights_only=False)
    for key, (got, want) in results.items():
        assert max_error(got, want) < 1e-5, key
