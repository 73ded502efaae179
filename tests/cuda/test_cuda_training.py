"""One training step per task on CUDA at every precision and memory format, with the device
recording every synchronising call (``torch.cuda.set_sync_debug_mode``): none, except those ATen's
CTC kernels make internally (measured alone and subtracted), and resuming across AMP settings."""

import copy
import os

import pytest
import torch
from cuda_testing import PRECISIONS, device_syncs, sync_warnings
from ppdist_testing import REPO
from step_testing import device_batch, step_trainer

from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.utils.host_sync import HostSyncCounter


def config_path(*parts):
    return os.path.join(REPO, "configs", *parts)


QUICKSTARTS = {
    "crnn": (config_path("rec", "quickstart_synth.yml"), 32, (32, 100)),
    "ppyoloe": (config_path("det", "quickstart_synth.yml"), 16, (160, 160)),
    "pp_liteseg": (config_path("seg", "quickstart_synth.yml"), 8, (128, 128)),
    "ppocrv3": (config_path("rec", "PP-OCRv3", "quickstart_synth.yml"), 16, (48, 320)),
    "segformer": (config_path("seg", "quickstart_segformer_synth.yml"), 8, (128, 128)),
    "ocrnet": (config_path("seg", "quickstart_ocrnet_synth.yml"), 8, (96, 96)),
    "slanet": (config_path("table", "quickstart_synth.yml"), 16, (160, 160)),
}
RECIPES = {  # the recipes' real training input sizes, a few samples per batch
    "crnn": (config_path("rec", "rec_mv3_none_bilstm_ctc.yml"), 256, (32, 100)),
    "ppyoloe": (config_path("det", "ppyoloe_crn_s_300e_coco.yml"), 8, (640, 640)),
    "pp_liteseg": (
        config_path("seg", "pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml"),
        4,
        (512, 1024),
    ),
    "ppocrv3": (config_path("rec", "PP-OCRv3", "ch_PP-OCRv3_rec_distillation.yml"), 64, (48, 320)),
    "segformer": (config_path("seg", "segformer_b0_cityscapes_1024x1024_160k.yml"), 2, (1024, 1024)),
    "ocrnet": (config_path("seg", "ocrnet_hrnetw18_cityscapes_1024x512_160k.yml"), 2, (512, 1024)),
    "slanet": (config_path("table", "SLANet.yml"), 16, (488, 488)),
}
# Paddle's AMP op lists of a recipe: ppdist refuses them with use_amp (torch.autocast's own lists apply)
RECIPE_AMP_OVERRIDES = {"slanet": ["Global.amp_custom_white_list=[]"]}
# the PP-OCRv3 quick start's dictionary is written with its data: the bundled English one stands in
QUICKSTART_DICT = "Global.character_dict_path=" + os.path.join(REPO, "ppdist", "data", "dicts", "en_dict.txt")


def detached(value):
    """``value``'s floating tensors as fresh leaves (nested dicts and lists followed)."""
    if isinstance(value, torch.Tensor):
        return value.detach().float().requires_grad_() if value.is_floating_point() else value
    if isinstance(value, dict):
        return {key: detached(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(detached(item) for item in value)
    return value


def loss_internal_syncs(trainer, batch):
    """The syncs of the loss alone, forward and backward, on the model's own outputs: those inside
    ATen's CUDA CTC kernels (they copy their length/offset tables from the host with blocking
    copies, with host lengths as the trainer passes them); the CPU suite's counter checks that the
    loss itself reads nothing."""
    with torch.no_grad():
        preds = detached(trainer.model(batch))
    with device_syncs() as caught:
        trainer.loss_fn(preds, batch)["loss"].backward()
    return len(sync_warnings(caught))


def cuda_trainer(path, batch_size, size, overrides=()):
    overrides = [QUICKSTART_DICT, *overrides] if "PP-OCRv3" in path and "quickstart" in path else overrides
    config = load_config(path, ["Global.synthetic_data=null", *overrides])
    env = DistEnv(device=torch.device("cuda", torch.cuda.current_device()))
    return step_trainer(config, batch_size, size, env=env)


def run_steps(trainer, count=3):
    """``count`` steps; the last one under the device's sync check and the host-sync counter."""
    batches = [device_batch(trainer, batch) for batch, _ in zip(trainer.train_loader, range(count))]
    host = [batch[key] for batch in batches for key in trainer.host_keys]
    with HostSyncCounter(host=host) as counter:
        for batch in batches[:-1]:
            trainer.step(batch)
        counter.events.clear()
        with device_syncs() as caught:
            values, _ = trainer.step(batches[-1])
    assert counter.count == 0, counter.report()
    # none, but the ones ATen's CTC makes inside its own kernels (CRNN, PP-OCRv3)
    allowed = loss_internal_syncs(trainer, batches[-1]) if trainer.host_keys else 0
    assert len(sync_warnings(caught)) == allowed, sync_warnings(caught)
    torch.cuda.synchronize()
    assert torch.isfinite(values["loss"]).item()
    return values


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("task", sorted(QUICKSTARTS))
def test_quickstart_step_on_cuda(task, precision, channels_last):
    overrides = [*PRECISIONS[precision], f"Global.channels_last={str(channels_last).lower()}"]
    trainer = cuda_trainer(*QUICKSTARTS[task], overrides)
    assert trainer.channels_last == channels_last and trainer.optimizer.defaults.get("fused")
    run_steps(trainer)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("task", sorted(RECIPES))
def test_recipe_step_at_its_real_input_size_on_cuda(task, precision):
    amp = RECIPE_AMP_OVERRIDES.get(task, []) if precision != "fp32" else []
    run_steps(cuda_trainer(*RECIPES[task], [*PRECISIONS[precision], *amp]))


def weights_apart(want, got, before, rtol=1e-3, atol=1e-5):
    """The tensors of ``got`` not equal to ``want`` (allclose), worst first, each with its largest
    difference and the largest update the step made to it (from ``before``)."""
    apart = []
    for name, value in want.items():
        other = got[name]
        if value.is_floating_point() and not torch.allclose(
            value.float(), other.float(), rtol=rtol, atol=atol
        ):
            diff = (value.float() - other.float()).abs().max().item()
            update = (value.float() - before[name].float()).abs().max().item()
            apart.append((name, diff, update))
    return sorted(apart, key=lambda row: -row[1])


@pytest.mark.parametrize("saved", sorted(PRECISIONS))
@pytest.mark.parametrize("resumed", sorted(PRECISIONS))
def test_every_amp_setting_resumes_from_every_other_on_cuda(saved, resumed):
    """Judged by the step after the resume: it runs sync-free and finite, its loss equals that of
    a trainer of the resumed precision continuing from the same weights, and with the same
    precision the resumed run continues exactly as the saved one goes on (same batch). Each
    trainer loads its own copy of the state: torch's ``Optimizer.load_state_dict`` keeps tensors
    already of the parameter's device and dtype, so a shared copy would be advanced in place by the
    first trainer that steps (how the same-precision cases once failed on CUDA)."""
    first = cuda_trainer(*QUICKSTARTS["crnn"], PRECISIONS[saved])
    run_steps(first, count=2)
    state = copy.deepcopy(first.state_dict())
    second = cuda_trainer(*QUICKSTARTS["crnn"], PRECISIONS[resumed])
    second.load_state_dict(copy.deepcopy(state))
    if resumed == "fp16":  # its scale: the saved one, or the configured start when there was none
        expected = first.scaler.get_scale() if saved == "fp16" else 1024.0
        assert second.scaler.get_scale() == expected
    batch = device_batch(second, next(iter(second.train_loader)))
    before = {k: v.clone() for k, v in second.model.state_dict().items()}
    values = run_steps(second, count=1)  # the step after the resume: sync-free, finite
    moved = [
        k
        for k, v in second.model.state_dict().items()
        if v.is_floating_point() and not torch.equal(v, before[k])
    ]
    assert moved, "the step after the resume changed no weight"
    if saved == resumed:
        third = cuda_trainer(*QUICKSTARTS["crnn"], PRECISIONS[saved])
        third.load_state_dict(copy.deepcopy(state))
        want, _ = first.step(batch)
        got, _ = third.step(device_batch(third, next(iter(third.train_loader))))
        assert torch.allclose(want["loss"], got["loss"], rtol=1e-4, atol=1e-5)
        apart = weights_apart(first.model.state_dict(), third.model.state_dict(), before)
        assert not apart, "weights apart after the same step (max |diff|, max |update|): " + str(apart[:5])
    assert torch.isfinite(values["loss"]).item()
