"""Building a run from its config: DDP options, the user's hooks of Global.hooks, torch.compile over
multi-scale training."""

from __future__ import annotations

import random
import textwrap

import pytest
import torch
from ppdist_testing import tiny_run_config

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer, compile_for_training, gradient_as_bucket_view
from ppdist.errors import ConfigError

HOOK_MODULE = "ppdist_test_user_hooks"
HOOK_SOURCE = '''
from ppdist.engine.hooks import Hook
from ppdist.registry import HOOKS


@HOOKS.register
class StepsSeen(Hook):
    """Remembers every ``every``-th global step; its list survives a resume."""

    name = "steps_seen"

    def __init__(self, every: int = 2) -> None:
        self.every = every
        self.seen = []

    def after_step(self) -> None:
        step = self.trainer.position.global_step
        if step % self.every == 0:
            self.seen.append(step)

    def state_dict(self):
        return {"seen": list(self.seen)}

    def load_state_dict(self, state):
        self.seen = list(state["seen"])
'''


@pytest.fixture
def user_hooks_on_path(tmp_path, monkeypatch):
    (tmp_path / f"{HOOK_MODULE}.py").write_text(textwrap.dedent(HOOK_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return HOOK_MODULE


def test_gradient_as_bucket_view_defaults_per_device():
    assert gradient_as_bucket_view({"gradient_as_bucket_view": None}, torch.device("cpu")) is False
    assert gradient_as_bucket_view({"gradient_as_bucket_view": None}, torch.device("cuda", 0)) is True
    assert gradient_as_bucket_view({"gradient_as_bucket_view": True}, torch.device("cpu")) is True


def test_a_hook_named_in_the_config_is_built_run_saved_and_resumed(tmp_path, digits_dir, user_hooks_on_path):
    setup_logger(None)
    hooks = [f"Global.custom_imports=[{user_hooks_on_path}]", "Global.hooks=[{name: StepsSeen, every: 4}]"]
    common = ["Global.eval_batch_epoch=null", "Global.save_iter_step=6", "Global.plot_curves=true", *hooks]
    trainer = build_trainer(
        tiny_run_config(tmp_path, digits_dir, "run", common + ["Global.max_iters=8"]), DistEnv()
    )
    names = [hook.hook_name for hook in trainer.hooks]
    assert names == [
        "run_dir",
        "bad_samples",
        "log",
        "curves",
        "nonfinite",
        "evaluation",
        "checkpoint",
        "steps_seen",
    ]  # by priority
    assert trainer.hook("steps_seen").every == 4
    trainer.train()
    assert trainer.hook("steps_seen").seen == [4, 8]
    saved = torch.load(tmp_path / "run" / "latest.pt", weights_only=True)
    assert saved["hooks"]["steps_seen"] == {"seen": [4, 8]}

    mid_run = str(tmp_path / "run" / "mid.pt")
    torch.save(dict(saved, hooks=dict(saved["hooks"], steps_seen={"seen": [4]})), mid_run)
    resumed = build_trainer(
        tiny_run_config(
            tmp_path, digits_dir, "again", common + ["Global.max_iters=12", f"Global.checkpoints={mid_run}"]
        ),
        DistEnv(),
    )
    assert resumed.hook("steps_seen").seen == [4]  # the hook's state came back from the checkpoint
    resumed.train()
    assert resumed.hook("steps_seen").seen == [4, 12]


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "Global.hooks=[{name: StepSeen}]",
            r"unknown hook name 'StepSeen' at Global.hooks\[0\].name. Did you mean: 'StepsSeen'",
        ),
        (
            "Global.hooks=[{name: StepsSeen, evry: 3}]",
            r"unknown key Global.hooks\[0\].evry for hook 'StepsSeen'. Did you mean: 'every'",
        ),
        (
            "Global.hooks=[{name: StepsSeen, every: three}]",
            r"wrong type for Global.hooks\[0\].every: expected int",
        ),
        ("Global.hooks=[StepsSeen]", r"Global.hooks\[0\] needs a mapping with a 'name' key"),
    ],
)
def test_config_hooks_are_checked_before_anything_runs(
    tmp_path, digits_dir, user_hooks_on_path, override, message
):
    with pytest.raises(ConfigError, match=message):
        tiny_run_config(
            tmp_path, digits_dir, "bad", [f"Global.custom_imports=[{user_hooks_on_path}]", override]
        )


def test_a_custom_import_that_fails_names_the_module(tmp_path, digits_dir):
    with pytest.raises(
        ConfigError,
        match=r"Global.custom_imports\[0\]: cannot import 'no_such_module_here' \(ModuleNotFoundError",
    ):
        tiny_run_config(tmp_path, digits_dir, "bad", ["Global.custom_imports=[no_such_module_here]"])


def test_the_loss_module_is_placed_on_the_training_device(tmp_path, digits_dir, monkeypatch):
    """Its buffers (e.g. class weights) must not be copied to the device every step."""
    placed = []
    original = torch.nn.Module.to

    def spy(module, *args, **kwargs):
        placed.append((type(module).__name__, args, kwargs))
        return original(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", spy)
    trainer = build_trainer(tiny_run_config(tmp_path, digits_dir))
    loss_name = type(trainer.loss_fn).__name__
    assert (loss_name, (trainer.env.device,), {}) in placed, placed


@pytest.mark.parametrize("evaluate", [True, False])
def test_eval_during_train_false_builds_no_evaluation(tmp_path, digits_dir, evaluate):
    """Global.eval_during_train (tools/train.py's --eval / --do_eval on Paddle configs): no Eval
    loader and no evaluation hook when false, though the config has an Eval section."""
    config = tiny_run_config(
        tmp_path, digits_dir, overrides=[f"Global.eval_during_train={str(evaluate).lower()}"]
    )
    trainer = build_trainer(config)
    names = [hook.hook_name for hook in trainer.hooks]
    assert ("evaluation" in names) == evaluate, names


@pytest.mark.slow
def test_compiled_detector_over_the_multi_scale_sizes_compiles_once_or_twice(repo_root):
    """PP-YOLOE's recipe model (narrowed) through ``compile_for_training`` over 60 random draws of
    15 sizes: one graph for the first size and one with dynamic sizes for the others, where the
    head's anchor cache (guarded by dynamo) used to invalidate every graph at each new size (29
    compiles at d9515f6, about to hit the limit of 32, which fails the run).

    The recipe's 320..768 less 256: the same 15 sizes 32 apart (multiples of the largest stride;
    the smallest stride-32 map is 2x2, dynamo specialises sizes 0 and 1), ~7x cheaper. A batch of 2:
    with 1 image CPU convolutions choose their backend by size (numel > 20480) and dynamo guards on
    it, which a GPU does not do.
    """
    config = load_config(
        f"{repo_root}/configs/det/ppyoloe_crn_s_300e_coco.yml",
        ["Global.width_mult=0.0625", "Global.depth_mult=0.1", "Global.num_classes=4"],
    )
    (resize,) = [
        t["BatchRandomResize"]
        for t in config["Train"]["dataset"]["batch_transforms"]
        if "BatchRandomResize" in t
    ]
    sizes = [size - 256 for size in resize["target_size"]]
    assert len(sizes) == 15 and sizes[0] == 64 and all(b - a == 32 for a, b in zip(sizes, sizes[1:]))
    torch.manual_seed(0)
    model = build_model(config).train()
    compiles = []

    def counting_eager(graph_module, example_inputs):
        compiles.append(len(example_inputs))
        return graph_module.forward

    dynamo = torch._dynamo.config
    saved = dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit
    torch._dynamo.reset()
    try:
        compiled = compile_for_training(model, {"backend": counting_eager}, input_sizes=len(sizes))
        assert dynamo.fail_on_recompile_limit_hit  # past the limit the loop below would raise
        rng = random.Random(0)
        seen = set()
        for _ in range(60):
            size = rng.choice(sizes)
            seen.add(size)
            out = compiled({"image": torch.randn(2, 3, size, size)})
            assert out["anchor_points"].shape == (sum((size // s) ** 2 for s in (32, 16, 8)), 2)
    finally:
        torch._dynamo.reset()
        dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit = saved
    assert len(seen) == 15
    assert len(compiles) <= 2, f"{len(compiles)} compiles for {len(seen)} sizes"
