"""BatchNorm running statistics by Paddle's rule (biased batch variance), against Paddle's own
BatchNorm (fixture made with paddlepaddle 2.6.2) and on every BatchNorm of the three models."""

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import ppdist.components  # noqa: F401
from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule, batch_norms, use_paddle_statistics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "paddle_batch_norm", "batch_norm.npz")
CASES = ("sppm_bin1", "sppm_bin2", "crnn_like", "bn1d", "bn1d_seq")


def replay(name: str, rule: str, module_type=None) -> list:
    data = np.load(FIXTURE)
    x1 = data[f"{name}/input_1"]
    channels = x1.shape[1]
    module_type = module_type or (nn.BatchNorm2d if x1.ndim == 4 else nn.BatchNorm1d)
    bn = module_type(channels, momentum=0.1, eps=1e-5).train()
    bn.running_mean.copy_(torch.from_numpy(data[f"{name}/running_mean_0"]))
    bn.running_var.copy_(torch.from_numpy(data[f"{name}/running_var_0"]))
    apply_statistics_rule(bn, rule)
    errors = []
    for step in range(1, 4):
        bn(torch.from_numpy(data[f"{name}/input_{step}"]))
        for key, ours in (("running_mean", bn.running_mean), ("running_var", bn.running_var)):
            theirs = torch.from_numpy(data[f"{name}/{key}_{step}"])
            errors.append(((ours - theirs).abs() / theirs.abs().clamp_min(1e-3)).max().item())
    return errors


@pytest.mark.parametrize("name", CASES)
def test_running_statistics_equal_paddles_batch_norm(name):
    assert max(replay(name, "paddle")) < 1e-5


def test_sync_batch_norm_outside_a_process_group_follows_the_rule_too():
    assert max(replay("sppm_bin1", "paddle", nn.SyncBatchNorm)) < 1e-5


def test_torch_rule_keeps_torchs_unbiased_update_which_differs_where_n_is_small():
    # the fixture's 1x1 bin (N = 4): torch's variance term is 4/3 of Paddle's
    assert max(replay("sppm_bin1", "torch")) > 1e-2
    assert max(replay("crnn_like", "torch")) > 1e-4


def test_a_failing_forward_leaves_the_running_variance_as_it_was():
    bn = nn.BatchNorm2d(3).train()
    use_paddle_statistics(bn)
    before = bn.running_var.clone()
    with pytest.raises(RuntimeError):
        bn(torch.randn(4, 5, 2, 2))  # wrong channel count: torch raises inside the forward
    assert torch.equal(bn.running_var, before)


def test_applying_twice_and_evaluation_change_nothing_more():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 2, 2)
    once, twice = nn.BatchNorm2d(3).train(), nn.BatchNorm2d(3).train()
    use_paddle_statistics(once)
    use_paddle_statistics(twice)
    use_paddle_statistics(twice)
    once(x), twice(x)
    assert torch.equal(once.running_var, twice.running_var)
    twice.eval()
    twice(x)
    assert torch.equal(once.running_var, twice.running_var)


def test_autocast_keeps_float32_statistics_with_the_rule():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 3, 3)
    reference, amp = nn.BatchNorm2d(8).train(), nn.BatchNorm2d(8).train()
    use_paddle_statistics(reference)
    use_paddle_statistics(amp)
    reference(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp(x.to(torch.bfloat16))
    assert amp.running_var.dtype == torch.float32
    expected = 0.9 + 0.1 * x.to(torch.bfloat16).float().var(dim=(0, 2, 3), unbiased=False)
    torch.testing.assert_close(amp.running_var, expected, rtol=1e-2, atol=1e-3)


MODELS = {
    "rec": ("configs/rec/rec_mv3_none_bilstm_ctc.yml", (2, 3, 32, 100)),
    "seg": ("configs/seg/pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml", (2, 3, 64, 96)),
    "det": ("configs/det/ppyoloe_crn_s_300e_coco.yml", (2, 3, 96, 96)),
}


@pytest.mark.parametrize("family", sorted(MODELS))
def test_every_batch_norm_of_each_model_updates_with_the_biased_variance(family):
    path, shape = MODELS[family]
    torch.manual_seed(0)
    model = build_model(load_config(os.path.join(ROOT, path))).train()
    seen = {}

    def capture(name):
        def hook(module, args):
            seen[name] = (args[0].detach().double(), module.running_var.detach().double().clone())

        return hook

    modules = batch_norms(model)
    for name, module in modules.items():
        module.register_forward_pre_hook(capture(name))
    assert use_paddle_statistics(model) == len(modules) > 10
    out = model({"image": torch.randn(shape)} if family != "rec" else torch.randn(shape))
    sum(t.float().mean() for t in torch.utils._pytree.tree_leaves(out) if torch.is_tensor(t)).backward()
    assert set(seen) == set(modules), "every BatchNorm ran"
    for name, module in modules.items():
        x, before = seen[name]
        dims = [d for d in range(x.dim()) if d != 1]
        expected = 0.9 * before + 0.1 * x.var(dim=dims, unbiased=False)
        torch.testing.assert_close(module.running_var.double(), expected, rtol=2e-5, atol=1e-6, msg=name)


def sync_count_worker(rank: int, store: str, out: str) -> None:
    """Rank r holds a batch of r + 2 images: SyncBatchNorm's N is the total over both ranks."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        bn = nn.SyncBatchNorm(3).train()
        use_paddle_statistics(bn)
        x = torch.randn(rank + 2, 3, 2, 5)
        hooks = bn._forward_pre_hooks.values()
        for hook in hooks:  # the pre-hook alone: SyncBatchNorm's own kernel needs CUDA
            hook(bn, (x,))
        scaled = bn.running_var.clone()
        for hook in bn._forward_hooks.values():
            hook(bn, (x,), None)
        gathered = [None] * 2
        dist.all_gather_object(gathered, (scaled, bn.running_var.clone()))
        if rank == 0:
            torch.save(gathered, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_sync_batch_norm_scales_by_the_count_over_all_processes(tmp_path):
    out = tmp_path / "out.pt"
    mp.spawn(sync_count_worker, args=(str(tmp_path / "store"), str(out)), nprocs=2)
    total = (2 + 3) * 2 * 5
    for scaled, restored in torch.load(out, weights_only=False):
        torch.testing.assert_close(scaled, torch.full((3,), total / (total - 1)))
        torch.testing.assert_close(restored, torch.ones(3))
