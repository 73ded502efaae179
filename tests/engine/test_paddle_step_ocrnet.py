"""An OCRNet-HRNet_W18 training step is PaddleSeg's training step: the main and auxiliary (soft
object regions) cross-entropy losses with coef [1, 0.4], gradients, BatchNorm statistics, the
recipe's Momentum + L2 update and its LR schedule, against tests/fixtures/paddle_step/ocrnet.npz
(written by PaddleSeg's own config reader, builder, OCRNet + HRNet_W18, CrossEntropyLoss and
optimizer on paddlepaddle 2.6.2; make_ocrnet.py).

The model is the real-size OCRNet-HRNet_W18 of configs/seg/ocrnet_hrnetw18_cityscapes_1024x512_
160k.yml (19 classes; the seeded weights of tests/fixtures/paddle_ocrnet) on 2 images 3x64x128 in
train mode, the head's Dropout2d at p 0 on both sides (a random mask cannot be reproduced across
frameworks). The fixture was made in float64; ppdist runs in float32 (how it trains) and in
float64 (only its float32 loss rounds). Measured (torch 2.14 CPU, 1 thread), relative errors:

=====================================================  ===========  ===========  =========
check                                                  float32      float64      tolerance
=====================================================  ===========  ===========  =========
loss on Paddle's logits, per output + total, 2 steps   3.2e-8                    1e-6
loss from ppdist's forward, per output + total         6.5e-7       3.2e-8       1e-4 / 1e-6
head's two outputs before the resize (norm) (a)        4.0e-5       2.5e-8       1e-4 / 1e-6
sampled raw gradients, worst parameter (norm) (b)      5.6e-2       7.8e-8       (b) / 1e-5
  the same, median over the 946 non-zero parameters    6.8e-3       5.5e-8       (b)
BatchNorm running statistics, all 314 (c)              4.1e-6       6.7e-8       1e-4 / 1e-6
Momentum 0.9 + L2 4e-5 replay, 2 steps (d)                          8.6e-8       1e-5
poly 0.9 LR schedule, 2052 step counts (e)             equal                     equal
=====================================================  ===========  ===========  =========

(a) The fixture stores them in float32 (2.5e-8 is that rounding). (b) Train-mode BatchNorm on
few values (HRNet's 1/32 branch is 2x4 here: 16 values a channel) amplifies float32 rounding:
Paddle's own float32 gradients are 6.1e-2 (worst) and 3.9e-3 (median) from its float64 ones. In
float32, ppdist's worst must be within 2x Paddle's worst and its median within 3x Paddle's
median, full norms within 5e-2 (worst 1.1e-2); the float64 run is the exact check. The nine head
conv biases followed by a training-mode BatchNorm have an exactly zero gradient in both (checked
as such). (c) Paddle's rule, biased batch variance (torch's unbiased rule: 1.0e-2 off, at the
1/32 branch). (d) of each step's update, in float64; leaving out the L2 term changes the nine
zero-gradient biases' update entirely (1.5 relative). (e) 0-300, every 97th from 301, then every
step from 159900 to 160004 (0 from 160000 on). Training with the head's Dropout2d on (p 0.1)
would move the loss by 2.9e-3. No Paddle is needed.
"""

import copy
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

from ppdist.components import build_loss, build_model
from ppdist.config import load_config
from ppdist.engine.setup import build_optimizer
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "seg", "ocrnet_hrnetw18_cityscapes_1024x512_160k.yml")
STEP_DIR = os.path.join(ROOT, "tests", "fixtures", "paddle_step")
TOLERANCE = 1e-4


def _make_ocrnet():
    """tests/fixtures/paddle_step/make_ocrnet.py as a module (numpy only until it is run)."""
    spec = importlib.util.spec_from_file_location(
        "paddle_step_make_ocrnet", os.path.join(STEP_DIR, "make_ocrnet.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = _make_ocrnet()


def label(fixture, step: int) -> torch.Tensor:
    return torch.from_numpy(fixture[f"label_{step}"].astype(np.int64))


def resized(head_logits: np.ndarray) -> torch.Tensor:
    """A head output at the input size, as the model resizes it (bilinear, half-pixel), in float64."""
    return F.interpolate(
        torch.from_numpy(head_logits.astype(np.float64)),
        (MAKE.HEIGHT, MAKE.WIDTH),
        mode="bilinear",
        align_corners=False,
    )


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread (the measured numbers above are with 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fixture() -> Dict[str, np.ndarray]:
    return MAKE.unpack(load_arrays(os.path.join(STEP_DIR, "ocrnet.npz")))


@pytest.fixture(scope="module")
def state() -> Dict[str, np.ndarray]:
    return MAKE.paddle_state()


@pytest.fixture(scope="module")
def config():
    return load_config(CONFIG)


@pytest.fixture(scope="module")
def base(state, config) -> torch.nn.Module:
    """ppdist's model with Paddle's weights (float32); the tests that change it use copies."""
    model = build_model(config)
    model.load_state_dict(to_torch(model, state))
    return model


@pytest.fixture(scope="module")
def positions(fixture, state, base):
    """ppdist parameter -> (Paddle name, positions of the fixture's sampled entries)."""
    found = sample_positions(base, state, fixture)
    assert (
        len(found)
        == len(list(base.parameters()))
        == len([key for key in fixture if key.startswith("grad_index/")])
        == 955
    )
    return found


# float32: how ppdist trains; float64: as the fixture was made, so only ppdist's float32 loss rounds
TOLERANCES = {
    torch.float32: {"loss": TOLERANCE, "logits": TOLERANCE, "norms": 5e-2, "statistics": TOLERANCE},
    torch.float64: {"loss": 1e-6, "logits": 1e-6, "gradients": 1e-5, "norms": 1e-5, "statistics": 1e-6},
}


@pytest.fixture(scope="module", params=[torch.float32, torch.float64], ids=["float32", "float64"])
def run(request, fixture, base, config):
    """ppdist's model (Paddle's weights, in the parameter's dtype, Dropout2d at 0) after one training
    forward and backward on the fixture's first batch, with its losses and the head's two outputs
    before the resize."""
    dtype = request.param
    model = copy.deepcopy(base).to(dtype)
    assert apply_statistics_rule(model, "paddle") == 314
    model.train()
    dropout = model.head.spatial_ocr.conv1x1[1]
    assert isinstance(dropout, torch.nn.Dropout2d) and dropout.p == 0.1
    dropout.p = 0.0
    captured = {}
    hooks = [
        head.register_forward_hook(lambda module, args, out, h=h: captured.__setitem__(h, out.detach()))
        for h, head in enumerate((model.head.cls_head, model.head.aux_head))
    ]
    outputs = model(torch.from_numpy(MAKE.normalize(fixture["image_1"])).to(dtype))
    for hook in hooks:
        hook.remove()
    loss_fn = build_loss(config)
    losses = loss_fn(outputs, {"label": label(fixture, 1)})
    losses["loss"].backward()
    return {
        "dtype": dtype,
        "tolerance": TOLERANCES[dtype],
        "model": model,
        "outputs": outputs,
        "head_logits": captured,
        "losses": losses,
    }


def test_recipe_losses_and_optimizer_are_paddlesegs(config):
    """What make_ocrnet.py found in PaddleSeg's config and builder (2 x CrossEntropyLoss, coef
    [1, 0.4]; Momentum 0.9 with weight_decay 4e-5; PolynomialDecay 0.01, power 0.9, to 0)."""
    assert config["Loss"] == {
        "name": "MultiOutputLoss",
        "types": [{"name": "CrossEntropyLoss"}, {"name": "CrossEntropyLoss"}],
        "coef": MAKE.COEF,
    }
    section = config["Optimizer"]
    assert (section["name"], section["momentum"], section["weight_decay"]) == ("Momentum", 0.9, 4e-5)
    assert section["lr"] == {"name": "PolynomialDecay", "learning_rate": 0.01, "end_lr": 0.0, "power": 0.9}
    assert config["Global"]["max_iters"] == MAKE.ITERS


def test_loss_on_paddles_logits_equals_paddles(fixture, config):
    """Teacher forcing: ppdist's MultiOutputLoss on the head outputs Paddle's loss was given (the
    float32-stored outputs, resized as the model does), both steps: each output's coef x cross
    entropy and the total."""
    loss_fn, worst = build_loss(config), 0.0
    for step in (1, 2):
        logits = [resized(fixture[f"head_logits_{step}_{h}"]) for h in range(2)]
        ours = loss_fn(logits, {"label": label(fixture, step)})
        for key, theirs in [(f"loss_{h}", fixture[f"teacher_loss_{step}_{h}"]) for h in range(2)] + [
            ("loss", fixture[f"teacher_loss_{step}"])
        ]:
            worst = max(worst, abs(ours[key].item() - float(theirs)) / float(theirs))
    print(f"loss on Paddle's logits: {worst:.1e} relative")
    assert worst <= 1e-6


def test_forward_loss_and_logits_equal_paddles(fixture, run):
    tolerance, worst_loss, worst_logits = run["tolerance"], 0.0, 0.0
    assert [tuple(out.shape) for out in run["outputs"]] == [(2, 19, MAKE.HEIGHT, MAKE.WIDTH)] * 2
    for h in range(2):
        theirs = float(fixture[f"loss_1_{h}"])
        worst_loss = max(worst_loss, abs(run["losses"][f"loss_{h}"].item() - theirs) / theirs)
        ours = run["head_logits"][h].double().numpy()
        worst_logits = max(worst_logits, relative(ours, fixture[f"head_logits_1_{h}"]))
    theirs = float(fixture["loss_1"])
    worst_loss = max(worst_loss, abs(run["losses"]["loss"].item() - theirs) / theirs)
    print(f"ppdist forward ({run['dtype']}): loss {worst_loss:.1e}, head outputs {worst_logits:.1e} relative")
    assert worst_loss <= tolerance["loss"] and worst_logits <= tolerance["logits"]


ZERO_GRADIENT = [  # conv biases followed by a training-mode BatchNorm
    "head.aux_head.0.conv.bias",
    "head.conv3x3_ocr.conv.bias",
    "head.spatial_ocr.attention_block.f_down.conv.bias",
    "head.spatial_ocr.attention_block.f_object.0.conv.bias",
    "head.spatial_ocr.attention_block.f_object.1.conv.bias",
    "head.spatial_ocr.attention_block.f_pixel.0.conv.bias",
    "head.spatial_ocr.attention_block.f_pixel.1.conv.bias",
    "head.spatial_ocr.attention_block.f_up.conv.bias",
    "head.spatial_ocr.conv1x1.0.conv.bias",
]


def test_raw_gradients_equal_paddles(fixture, run, positions):
    """Sampled entries and full norms of every parameter's gradient. float64: each within 1e-5.
    float32: ppdist's rounding errors are distributed as Paddle's own float32 run's (worst within
    2x Paddle's, median within 3x), full norms within 5e-2."""
    errors, zero = gradient_errors(run["model"], positions, fixture, norm_tolerance=run["tolerance"]["norms"])
    own = np.asarray([float(fixture[f"fp32_grad_error/{positions[key][0]}"]) for key in errors])
    worst = max(errors, key=errors.get)
    median = float(np.median(list(errors.values())))
    print(
        f"gradients ({run['dtype']}): worst {errors[worst]:.1e} ({worst}), median {median:.1e}; Paddle's "
        f"own float32 run: worst {own.max():.1e}, median {np.median(own):.1e}"
    )
    if run["dtype"] == torch.float64:
        assert errors[worst] <= run["tolerance"]["gradients"], worst
    else:
        assert errors[worst] <= 2.0 * own.max() and median <= 3.0 * np.median(own), worst
    assert sorted(zero) == ZERO_GRADIENT


@pytest.fixture(scope="module")
def statistics(fixture, state, base) -> Dict[str, torch.Tensor]:
    """Paddle's BatchNorm statistics after training forward 1, under ppdist's names."""
    expected = dict(state)
    expected.update({key[len("bn_1/") :]: value for key, value in fixture.items() if key.startswith("bn_1/")})
    return to_torch(base, expected)


def test_batch_norm_statistics_after_the_training_forward_equal_paddles(fixture, run, statistics):
    errors = batch_norm_errors(run["model"], statistics)
    assert len(errors) == len([key for key in fixture if key.startswith("bn_1/")]) == 2 * 314
    worst = max(errors, key=errors.get)
    print(f"BatchNorm statistics ({run['dtype']}): worst {errors[worst]:.1e} ({worst})")
    assert errors[worst] <= run["tolerance"]["statistics"], worst


def test_momentum_replay_of_paddles_gradients_equals_paddles_update(fixture, base, config, positions):
    model = copy.deepcopy(base).double()  # an update can be ~1e-7 of the parameter: float64
    optimizer, scheduler = build_optimizer(config, model, 1000)
    assert all(group["weight_decay"] == 4e-5 and group["momentum"] == 0.9 for group in optimizer.param_groups)
    worst = replay(model, optimizer, scheduler, positions, fixture)
    print(f"Momentum + L2 replay: {worst:.1e}")
    assert worst <= 1e-5


def test_polynomial_schedule_equals_paddlesegs(fixture, config):
    optimizer, scheduler = build_optimizer(config, torch.nn.Linear(1, 1), 1000)
    index = fixture["lr_index"]
    assert index[-1] > MAKE.ITERS and len(index) == len(fixture["lr_values"])
    assert fixture["lr_values"][0] == 0.01 and fixture["lr_values"][-1] == 0.0
    ours, step = [], 0
    for wanted in index:
        while step < wanted:
            scheduler.step()
            step += 1
        ours.append(optimizer.param_groups[0]["lr"])
    np.testing.assert_array_equal(np.asarray(ours), fixture["lr_values"])
