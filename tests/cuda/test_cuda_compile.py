"""Global.compile on CUDA over the detection recipe's 15 training sizes (inductor): a training
step at 60 random sizes compiles the forward at most twice (one static graph, one dynamic) and
never hits the recompile limit (which would fail the run)."""

import os
import random

import torch
from ppdist_testing import REPO
from step_testing import step_trainer, synthetic_sample

from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.setup import compile_for_training

RECIPE = os.path.join(REPO, "configs", "det", "ppyoloe_crn_s_300e_coco.yml")


def test_det_recipe_compiled_over_its_training_sizes_compiles_at_most_twice():
    config = load_config(
        RECIPE, ["Global.synthetic_data=null", "Global.use_amp=true", "Global.amp_dtype=bfloat16"]
    )
    (resize,) = [
        t["BatchRandomResize"]
        for t in config["Train"]["dataset"]["batch_transforms"]
        if "BatchRandomResize" in t
    ]
    sizes = list(resize["target_size"])
    trainer = step_trainer(config, 2, (sizes[0], sizes[0]), env=DistEnv(device=torch.device("cuda", 0)))
    trainer.config = config
    frames = []

    def counting_inductor(graph_module, example_inputs):
        frames.append(len(example_inputs))
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(graph_module, example_inputs)

    dynamo = torch._dynamo.config
    saved = dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit
    torch._dynamo.reset()
    try:
        trainer.train_model = compile_for_training(trainer.model, {"backend": counting_inductor}, len(sizes))
        rng = random.Random(0)
        seen = set()
        for step in range(60):
            size = rng.choice(sizes)
            seen.add(size)
            samples = [synthetic_sample(config, (size, size), 2 * step + i) for i in range(2)]
            batch = {key: torch.stack([s[key] for s in samples]) for key in samples[0]}
            batch = trainer.to_device(batch)
            batch["epoch_id"] = 0
            values, _ = trainer.step(batch)
        torch.cuda.synchronize()
        assert torch.isfinite(values["loss"]).item()
    finally:
        torch._dynamo.reset()
        dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit = saved
    assert len(seen) == 15
    assert len(frames) <= 2, f"{len(frames)} compiles for {len(seen)} sizes"
