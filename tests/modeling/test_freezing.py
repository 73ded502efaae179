"""Frozen stages (Architecture.Backbone.freeze_at / frozen_stages / freeze_norm) for every backbone."""

import os

import pytest
import torch
from ppdist_testing import REPO, tiny_run_config
from step_testing import device_batch, step_trainer
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ppdist.config import load_config
from ppdist.convert.configs import PADDLEDET, convert_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.ema import ModelEMA
from ppdist.engine.hooks.train_log import count_trainable
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer
from ppdist.errors import ConfigError
from ppdist.modeling.backbones.cspresnet import CSPResNet
from ppdist.modeling.backbones.hrnet import HRNet_W18_Small_V1
from ppdist.modeling.backbones.mobilenet_v3 import MobileNetV3
from ppdist.modeling.backbones.stdcnet import STDC1
from ppdist.modeling.freezing import frozen_state_names

FIXTURES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "paddle_configs"
)
DET_S = os.path.join(FIXTURES, "PaddleDetection", "configs", "ppyoloe", "ppyoloe_crn_s_300e_coco.yml")

# each backbone's units (stem, then stages) as parameter-name prefixes
BACKBONES = {
    "MobileNetV3": (
        lambda **kw: MobileNetV3(scale=0.35, model_name="small", small_stride=[1, 2, 2, 2], **kw),
        [
            ("conv1.",),
            ("blocks.0.",),
            ("blocks.1.", "blocks.2."),
            tuple(f"blocks.{i}." for i in range(3, 8)),
            ("blocks.8.", "blocks.9.", "blocks.10.", "conv2."),
        ],
    ),
    "CSPResNet": (
        lambda **kw: CSPResNet(width_mult=0.25, depth_mult=0.33, **kw),
        [("stem.",), ("stages.0.",), ("stages.1.",), ("stages.2.",), ("stages.3.",)],
    ),
    "HRNet_W18_Small_V1": (
        lambda **kw: HRNet_W18_Small_V1(**kw),
        [
            ("conv_layer1_1.", "conv_layer1_2."),
            ("la1.",),
            ("tr1.", "st2."),
            ("tr2.", "st3."),
            ("tr3.", "st4."),
        ],
    ),
    "STDC1": (
        lambda **kw: STDC1(base=16, **kw),
        [
            ("features.0.", "features.1."),
            ("features.2.", "features.3."),
            ("features.4.", "features.5."),
            ("features.6.", "features.7."),
        ],
    ),
}


# a quick-start config per backbone (each decays weights): path, batch size, input size, overrides
QUICKSTARTS = {
    "MobileNetV3": (os.path.join(REPO, "configs", "rec", "quickstart_synth.yml"), 4, (32, 100), []),
    "CSPResNet": (os.path.join(REPO, "configs", "det", "quickstart_synth.yml"), 4, (128, 128), []),
    "STDC1": (os.path.join(REPO, "configs", "seg", "quickstart_synth.yml"), 4, (128, 128), []),
}


def frozen_names(model: nn.Module) -> set:
    return {name for name, p in model.named_parameters() if not p.requires_grad}


def expected_frozen(model: nn.Module, units, count: int) -> set:
    prefixes = tuple(prefix for unit in units[:count] for prefix in unit)
    return {name for name, _ in model.named_parameters() if name.startswith(prefixes)} if prefixes else set()


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_each_setting_freezes_the_stem_and_the_first_stages(name):
    build, units = BACKBONES[name]
    every = {n for n, _ in build().named_parameters()}
    assert expected_frozen(build(), units, len(units)) == every  # the units cover the backbone
    for stages in range(-1, len(units)):
        model = build(frozen_stages=stages)
        assert frozen_names(model) == expected_frozen(model, units, stages + 1), stages
        if stages >= 1:  # PaddleDetection's freeze_at k is mmdetection's frozen_stages k + 1
            assert frozen_names(build(freeze_at=stages - 1)) == frozen_names(model)
        model.train()
        frozen_modules = {n for n, m in model.named_modules() if not m.training}
        for module_name, module in model.named_modules():
            if isinstance(module, _BatchNorm):
                frozen = f"{module_name}.weight" in frozen_names(model)
                assert (module_name in frozen_modules) == frozen, (stages, module_name)
    assert not frozen_names(build(freeze_at=-1)) and not frozen_names(build(frozen_stages=-1))


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_freeze_norm_freezes_every_batch_norm(name):
    model = BACKBONES[name][0](freeze_norm=True).train()
    norms = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert norms and all(not m.training and not m.weight.requires_grad for m in norms)
    assert all(
        p.requires_grad for n, m in model.named_modules() if isinstance(m, nn.Conv2d) for p in m.parameters()
    )


def test_bad_settings_are_refused():
    build = BACKBONES["CSPResNet"][0]
    with pytest.raises(ValueError, match="freeze_at .* or frozen_stages .*not both"):
        build(freeze_at=0, frozen_stages=1)
    with pytest.raises(ValueError, match=r"frozen_stages must be an int in \[-1, 4\], got 5"):
        build(frozen_stages=5)
    with pytest.raises(ValueError, match=r"freeze_at must be an int in \[-1, 3\], got 4"):
        build(freeze_at=4)


def test_sync_batch_norm_conversion_keeps_frozen_norms_frozen():
    model = nn.SyncBatchNorm.convert_sync_batchnorm(BACKBONES["CSPResNet"][0](frozen_stages=1)).train()
    for name, module in model.named_modules():
        if isinstance(module, nn.SyncBatchNorm):
            frozen = name.startswith(("stem.", "stages.0."))
            assert module.training != frozen and module.weight.requires_grad != frozen, name


def test_frozen_weights_and_statistics_are_bit_identical_after_training(tmp_path, digits_dir):
    setup_logger(None)
    config = tiny_run_config(
        tmp_path, digits_dir, "run", ["Global.max_iters=6", "Architecture.Backbone.frozen_stages=2"]
    )
    trainer = build_trainer(config, DistEnv())
    backbone = trainer.model.backbone
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    frozen = {n for n, p in backbone.named_parameters() if not p.requires_grad}
    assert frozen and frozen == expected_frozen(backbone, BACKBONES["MobileNetV3"][1], 3)
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert not any(id(p) in in_optimizer for n, p in backbone.named_parameters() if n in frozen)
    trainer.train()
    frozen_modules = tuple(n.rsplit(".", 1)[0] + "." for n in frozen)
    for key, value in backbone.state_dict().items():
        if key.startswith(frozen_modules):  # weights and BatchNorm running statistics
            assert torch.equal(value, before[key]), key
        elif key.endswith(".weight") and value.is_floating_point():
            assert not torch.equal(value, before[key]), key
    assert all(
        not m.training for n, m in backbone.named_modules() if (n + ".").startswith(frozen_modules) and n
    )


def test_both_spellings_in_a_config_fail_by_key_before_anything_is_built(tmp_path, digits_dir):
    overrides = ["Architecture.Backbone.frozen_stages=1", "Architecture.Backbone.freeze_at=0"]
    with pytest.raises(ConfigError, match="Architecture.Backbone: give freeze_at .* not both"):
        tiny_run_config(tmp_path, digits_dir, "run", overrides)  # the config's validation


def test_a_paddledetection_config_passes_its_freeze_settings(tmp_path):
    path = tmp_path / "ppyoloe_frozen.yml"
    path.write_text(
        f"_BASE_: ['{DET_S}']\nema_filter_no_grad: true\nCSPResNet:\n  freeze_at: 0\n  freeze_norm: true\n",
        encoding="utf-8",
    )
    conversion = convert_config(str(path), PADDLEDET)
    backbone = conversion.config["Architecture"]["Backbone"]
    assert backbone["name"] == "CSPResNet" and backbone["freeze_at"] == 0 and backbone["freeze_norm"] is True
    assert not [item for item in conversion.unmapped if "ema_filter_no_grad" in item or "freeze" in item]
    assert conversion.config["Global"]["use_ema"] and any("ema_filter_no_grad" in n for n in conversion.notes)


@pytest.mark.parametrize("name", sorted(QUICKSTARTS))
def test_a_short_training_leaves_every_frozen_tensor_bit_identical(name):
    """Weight decay, momentum, EMA, Paddle's BatchNorm statistics rule: none touches a frozen tensor."""
    path, batch_size, size, overrides = QUICKSTARTS[name]
    config = load_config(
        path,
        [
            "Global.synthetic_data=null",
            "Global.use_ema=true",
            "Architecture.Backbone.frozen_stages=2",
            *overrides,
        ],
    )
    assert config["Global"]["bn_statistics"] == "paddle"
    trainer = step_trainer(config, batch_size, size, steps=3)
    model, backbone = trainer.model, trainer.model.backbone
    assert type(backbone).__name__ == name
    frozen = frozen_names(backbone)
    assert frozen == expected_frozen(backbone, BACKBONES[name][1], 3)
    decays = {group["weight_decay"] for group in trainer.optimizer.param_groups}
    assert any(decays), "the run must decay weights"
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.parameters() if p.requires_grad}
    frozen_prefixes = tuple(prefix for unit in BACKBONES[name][1][:3] for prefix in unit)
    constant = {f"backbone.{k}" for k in backbone.state_dict() if k.startswith(frozen_prefixes)}
    assert constant == frozen_state_names(model)
    assert any(k.endswith("running_var") for k in constant)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for batch, _ in zip(trainer.train_loader, range(3)):
        model.train()  # as the trainer does every epoch
        trainer.step(device_batch(trainer, batch))
    assert trainer.ema.step == 3
    ema_state = trainer.ema.module.state_dict()
    for key, value in model.state_dict().items():
        if key in constant:  # weights and BatchNorm statistics, in the model and in its EMA
            assert torch.equal(value, before[key]) and torch.equal(ema_state[key], before[key]), key
        elif key.startswith("backbone.") and key.endswith((".weight", ".running_var")):
            assert not torch.equal(value, before[key]), key
    for module_name, module in backbone.named_modules():
        if isinstance(module, _BatchNorm):
            assert module.training != module_name.startswith(frozen_prefixes), module_name


def test_the_ema_copies_frozen_tensors_and_resumes_across_freezing():
    build = BACKBONES["CSPResNet"][0]
    torch.manual_seed(0)
    model = build(frozen_stages=1)
    ema = ModelEMA(model, decay=0.9, decay_type="constant")
    for _ in range(3):
        ema.update(model)
    frozen = frozen_state_names(model)
    assert frozen and not frozen & set(ema.average)
    state = model.state_dict()
    assert all(torch.equal(ema.module.state_dict()[k], state[k]) for k in frozen)
    # resumed with nothing frozen: a frozen tensor's average continues from its value
    torch.manual_seed(0)
    unfrozen_model = build()
    unfrozen = ModelEMA(unfrozen_model, decay=0.9, decay_type="constant")
    unfrozen.load_state_dict(ema.state_dict())
    unfrozen.update(unfrozen_model)  # the same weights: every average stays at them
    resumed = unfrozen.module.state_dict()
    floats = [k for k in frozen if state[k].is_floating_point()]
    assert floats and all(torch.allclose(resumed[k], state[k], rtol=1e-5, atol=1e-7) for k in floats)
    ema.load_state_dict(unfrozen.state_dict())  # and back to frozen
    assert set(ema.average) == set(unfrozen.average) - frozen


def test_the_build_logs_what_is_frozen_once_and_the_trainable_count_drops(caplog):
    build = BACKBONES["CSPResNet"][0]
    with caplog.at_level("INFO", logger="ppdist"):
        model = build(freeze_at=0)
    lines = [r.getMessage() for r in caplog.records if "frozen" in r.getMessage()]
    frozen = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("stem.", "stages.0.")))
    assert lines == [
        f"CSPResNet: frozen the stem (stem); stage 1 (stages.0): {frozen:,} of its "
        f"{sum(p.numel() for p in build().parameters()):,} parameters"
    ]
    assert count_trainable(model) == count_trainable(build()) - frozen > 0
