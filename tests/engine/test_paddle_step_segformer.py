"""A SegFormer-B0 training step is PaddleSeg's training step: the cross-entropy loss, logits,
gradients, the head's BatchNorm statistics, the recipe's AdamW update and its LR schedule, against
tests/fixtures/paddle_step/segformer.npz (written by PaddleSeg d7975e7c's own config reader,
builder, SegFormer, CrossEntropyLoss, AdamW and PolynomialDecay on paddlepaddle 2.6.2;
make_segformer.py).

The model is the real-size SegFormer-B0 of configs/seg/segformer_b0_cityscapes_1024x1024_160k.yml
(19 classes, embedding_dim 256; seeded weights of tests/fixtures/paddle_segformer) on 2 images
3x64x128 in train mode with stochastic depth and dropout off on both sides
(``Architecture.Backbone.drop_path_rate=0``, the head's dropout in eval mode; PaddleSeg:
``reset_drop_path(0.0)``). The fixture was made in float64; ppdist runs in float32 (how it
trains) and in float64 (only its float32 loss rounds). Measured (torch 2.14 CPU, 1 thread),
relative errors:

=====================================================  ===========  ===========  =========
check                                                  float32      float64      tolerance
=====================================================  ===========  ===========  =========
loss on Paddle's logits (a)                            5.3e-8                    1e-4
loss from ppdist's forward                             5.3e-8       5.3e-8       1e-4 / 1e-6
logits before the resize (norm)                        1.1e-6       2.4e-13      1e-4 / 1e-6
sampled raw gradients, worst parameter (norm) (b)      2.8e-5       1.1e-8       1e-3 / 1e-5
BatchNorm running statistics after the forward (c)     1.0e-7       1.7e-8       1e-4 / 1e-6
AdamW replay, 2 steps (d)                                           4.5e-8       1e-5
LR schedule, 2052 steps: 0-300, every 97th, the end    equal                     equal
=====================================================  ===========  ===========  =========

(a) teacher forcing: Paddle's ``linear_pred`` logits, resized by torch's bilinear (half-pixel, as
the model does); 9.4% of the pixels are ignored (averaging over all pixels instead: 9.4e-2).
ppdist's loss computes in float32: that sets its float64 loss and gradient figures. (b) Paddle's own float32 run
is 5.9e-6 from its float64 one; five parameters whose output only adds a per-channel constant
before the training-mode ``linear_fuse`` BatchNorm (the four ``linear_c*`` embedding biases and
``norm4``'s bias, which reaches the head only through ``linear_c4``) have an exactly zero gradient
in both (checked as such). (c) Paddle's rule, biased batch variance (torch's unbiased rule: 7.4e-5,
caught in float64); the 1.7e-8 is Paddle's momentum 0.9 taken as float32 (with 0.9f: 1e-14).
(d) of each step's update, in float64: decoupled weight decay 0.01 on every parameter, norms and
biases included (PaddleSeg passes no ``apply_decay_param_fun``; leaving 1-D parameters undecayed:
2.0), then Adam with beta1 0.9, beta2 0.999, eps 1e-8; the rest is Paddle's float32 LR. The LR
is PolynomialDecay 6e-5, power 1, to 0 at step 160000 and after. No Paddle is needed.
"""

import importlib.util
import os
from typing import Dict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from paddle_step_testing import (
    batch_norm_errors,
    gradient_errors,
    load_arrays,
    relative,
    replay,
    sample_positions,
    to_torch,
)
from torch import nn

from ppdist.components import build_loss, build_model
from ppdist.config import load_config
from ppdist.engine.setup import build_optimizer
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule
from ppdist.modeling.layers import DropPath

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "seg", "segformer_b0_cityscapes_1024x1024_160k.yml")
STEP_DIR = os.path.join(ROOT, "tests", "fixtures", "paddle_step")
TOLERANCE = 1e-4
ZERO_GRADIENTS = [
    "backbone.norm4.bias",
    "head.linear_c1.proj.bias",
    "head.linear_c2.proj.bias",
    "head.linear_c3.proj.bias",
    "head.linear_c4.proj.bias",
]


def _make_segformer():
    """tests/fixtures/paddle_step/make_segformer.py as a module (numpy only until it is run)."""
    spec = importlib.util.spec_from_file_location(
        "paddle_step_make_segformer", os.path.join(STEP_DIR, "make_segformer.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = _make_segformer()
IMAGES = MAKE.images()


def recipe(**backbone):
    """The recipe's config; ``backbone`` keywords override ``Architecture.Backbone``."""
    return load_config(CONFIG, [f"Architecture.Backbone.{key}={value}" for key, value in backbone.items()])


def label(fixture, step: int) -> torch.Tensor:
    return torch.from_numpy(fixture[f"label_{step}"].astype(np.int64))


def resized(head_logits: np.ndarray) -> torch.Tensor:
    """``linear_pred``'s logits at the input size, as the model resizes them (bilinear, half-pixel)."""
    return F.interpolate(
        torch.from_numpy(head_logits), (MAKE.HEIGHT, MAKE.WIDTH), mode="bilinear", align_corners=False
    )


def train_without_noise(model: torch.nn.Module) -> None:
    """Training mode (BatchNorm on batch statistics) with the head's channel dropout off (the
    config's drop_path_rate 0 leaves no stochastic depth; drop_rate / attn_drop_rate are 0)."""
    model.train()
    model.head.dropout.eval()
    assert not [m for m in model.modules() if isinstance(m, DropPath)]
    noisy = [
        m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0
    ]
    noisy += [
        m for m in model.modules() if isinstance(getattr(m, "attn_drop", None), float) and m.attn_drop > 0
    ]
    assert not noisy, noisy


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: the step is small, and 2 threads on a shared 2-core CI machine are
    slower (the measured numbers above are with 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fixture() -> Dict[str, np.ndarray]:
    return load_arrays(os.path.join(STEP_DIR, "segformer.npz"))


@pytest.fixture(scope="module")
def state() -> Dict[str, np.ndarray]:
    return MAKE.paddle_state()


@pytest.fixture(scope="module")
def config():
    return recipe(drop_path_rate=0.0)


@pytest.fixture(scope="module")
def positions(fixture, state, config):
    """ppdist parameter -> (Paddle name, positions of the fixture's sampled entries)."""
    model = build_model(config)
    found = sample_positions(model, state, fixture)
    assert (
        len(found)
        == len(list(model.parameters()))
        == len([key for key in fixture if key.startswith("grad_index/")])
        == 189
    )
    return found


# float32: how ppdist trains; float64: as the fixture was made, so only ppdist's float32 loss rounds
TOLERANCES = {
    torch.float32: {"loss": TOLERANCE, "logits": TOLERANCE, "gradients": 1e-3, "statistics": TOLERANCE},
    torch.float64: {"loss": 1e-6, "logits": 1e-6, "gradients": 1e-5, "statistics": 1e-6},
}


@pytest.fixture(scope="module", params=[torch.float32, torch.float64], ids=["float32", "float64"])
def run(request, fixture, state, config):
    """ppdist's model (Paddle's weights, in the parameter's dtype) after one training forward and
    backward on the fixture's first batch, with its loss and the logits before the resize."""
    dtype = request.param
    model = build_model(config)
    model.load_state_dict(to_torch(model, state))
    model.to(dtype)
    assert apply_statistics_rule(model, "paddle") == 1
    train_without_noise(model)
    captured = []
    hook = model.head.linear_pred.register_forward_hook(
        lambda module, args, out: captured.append(out.detach())
    )
    outputs = model(torch.from_numpy(MAKE.normalize(IMAGES[0])).to(dtype))
    hook.remove()
    loss_fn = build_loss(config)
    losses = loss_fn(outputs, {"label": label(fixture, 1)})
    losses["loss"].backward()
    return {
        "dtype": dtype,
        "tolerance": TOLERANCES[dtype],
        "model": model,
        "outputs": outputs,
        "head_logits": captured[0],
        "losses": losses,
    }


def test_recipe_loss_and_optimizer_are_paddlesegs():
    """What make_segformer.py found in PaddleSeg's config and builder (one CrossEntropyLoss, coef
    [1]; AdamW beta1 0.9, beta2 0.999, weight_decay 0.01; PolynomialDecay 6e-5, power 1, end_lr 0
    over the 160000 iterations, no warmup) and the model the step used."""
    config = recipe()
    assert config["Loss"]["types"] == [{"name": "CrossEntropyLoss"}] and config["Loss"]["coef"] == [1]
    section = config["Optimizer"]
    assert (section["name"], section["beta1"], section["beta2"], section["weight_decay"]) == (
        "AdamW",
        0.9,
        0.999,
        0.01,
    )
    assert section["lr"] == {"name": "PolynomialDecay", "learning_rate": 6e-5, "end_lr": 0.0, "power": 1.0}
    assert config["Global"]["max_iters"] == MAKE.ITERS
    architecture = config["Architecture"]
    assert architecture["Backbone"] == {"name": "MixVisionTransformer_B0"}
    assert (architecture["Head"]["name"], architecture["Head"]["embedding_dim"]) == ("SegFormerHead", 256)


def test_loss_on_paddles_logits_equals_paddles(fixture, config):
    """Teacher forcing: ppdist's loss on Paddle's logits (10% of the pixels ignored)."""
    ours = build_loss(config)([resized(fixture["head_logits_1"])], {"label": label(fixture, 1)})[
        "loss"
    ].item()
    theirs = float(fixture["loss_1"])
    print(f"loss on Paddle's logits: {abs(ours - theirs) / theirs:.1e} relative")
    assert abs(ours - theirs) <= TOLERANCE * theirs


def test_forward_loss_and_logits_equal_paddles(fixture, run):
    tolerance = run["tolerance"]
    theirs = float(fixture["loss_1"])
    loss = abs(run["losses"]["loss"].item() - theirs) / theirs
    logits = relative(run["head_logits"].double().numpy(), fixture["head_logits_1"])
    print(f"ppdist forward ({run['dtype']}): loss {loss:.1e}, logits {logits:.1e} relative")
    assert loss <= tolerance["loss"] and logits <= tolerance["logits"]
    assert run["outputs"][0].shape == (MAKE.BATCH, MAKE.NUM_CLASSES, MAKE.HEIGHT, MAKE.WIDTH)


def test_raw_gradients_equal_paddles(fixture, run, positions):
    """Sampled entries and full norms of every parameter's gradient. What only adds a per-channel
    constant before the training-mode ``linear_fuse`` BatchNorm has no effect: the four embedding
    biases and the last backbone LayerNorm's bias have a zero gradient up to rounding in both."""
    errors, zero = gradient_errors(run["model"], positions, fixture)
    worst = max(errors, key=errors.get)
    paddle_fp32 = max(float(fixture[f"fp32_grad_error/{positions[key][0]}"]) for key in errors)
    print(
        f"gradients ({run['dtype']}): worst {errors[worst]:.1e} ({worst}); Paddle's own float32 run: "
        f"{paddle_fp32:.1e}"
    )
    assert errors[worst] <= run["tolerance"]["gradients"], (worst, errors[worst])
    assert sorted(zero) == ZERO_GRADIENTS


def test_batch_norm_statistics_after_the_training_forward_equal_paddles(fixture, run, state):
    expected = dict(state)
    expected.update({key[len("bn_1/") :]: value for key, value in fixture.items() if key.startswith("bn_1/")})
    errors = batch_norm_errors(run["model"], to_torch(run["model"], expected))
    assert len(errors) == len([key for key in fixture if key.startswith("bn_1/")]) == 2
    worst = max(errors, key=errors.get)
    print(f"BatchNorm statistics ({run['dtype']}): worst {errors[worst]:.1e} ({worst})")
    assert errors[worst] <= run["tolerance"]["statistics"], worst


def test_adamw_replay_of_paddles_gradients_equals_paddles_update(fixture, state, config, positions):
    model = build_model(config).double()  # an update is ~1e-4 of the parameter: float64
    model.load_state_dict(to_torch(model, state))
    optimizer, scheduler = build_optimizer(config, model, 1000)
    assert all(
        group["weight_decay"] == 0.01 and group["betas"] == (0.9, 0.999) and group["eps"] == 1e-8
        for group in optimizer.param_groups
    )
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(positions)
    worst = replay(model, optimizer, scheduler, positions, fixture, steps=MAKE.STEPS)
    print(f"AdamW replay: {worst:.1e}")
    assert worst <= 1e-5


def test_polynomial_schedule_equals_paddlesegs(fixture):
    optimizer, scheduler = build_optimizer(recipe(), torch.nn.Linear(1, 1), 1000)
    index = fixture["lr_index"]
    assert index[-1] > MAKE.ITERS and len(index) == len(fixture["lr_values"])
    ours, step = [], 0
    for wanted in index:
        while step < wanted:
            scheduler.step()
            step += 1
        ours.append(optimizer.param_groups[0]["lr"])
    np.testing.assert_array_equal(np.asarray(ours), fixture["lr_values"])
