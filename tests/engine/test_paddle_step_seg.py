"""A PP-LiteSeg-T training step is PaddleSeg's training step: the three heads' OHEM losses and
kept pixels, gradients, BatchNorm statistics, the recipe's Momentum + L2 update and its LR
schedule, against tests/fixtures/paddle_step/seg.npz (written by PaddleSeg v2.9.1's own config
reader, builder, model, OhemCrossEntropyLoss and optimizer on paddlepaddle 2.6.2; make_seg.py).

The model is the real-size PP-LiteSeg-T of configs/seg/pp_liteseg_stdc1_cityscapes_1024x512_
scale0.5_160k.yml (seeded weights of tests/fixtures/paddle_seg, the seg heads' last conv x4 so
that OHEM drops pixels) on 2 images 3x96x192 in train mode (three heads), OHEM's ``min_kept`` set
to the fixture's 26573 (the recipe's 130000 exceeds the 36864 pixels: all would be kept). On
head 0 ``min_kept`` sets the threshold (0.81), on heads 1 and 2 0.7 does. The fixture was made in
float64; ppdist runs in float32 (how it trains) and in float64 (only its float32 loss rounds).
Measured (torch 2.14 CPU, 1 thread), relative errors:

=====================================================  ===========  ===========  =========
check                                                  float32      float64      tolerance
=====================================================  ===========  ===========  =========
loss on Paddle's logits, per head, steps 1 and 2 (a)   7.8e-8                    1e-4
OHEM alone, three seeded regimes (b)                   1.0e-7                    1e-4
loss from ppdist's forward, per head                   4.8e-7       7.8e-8       1e-4 / 1e-6
heads' logits before the resize (norm)                 7.3e-6       8.1e-8       1e-4 / 1e-6
sampled raw gradients, worst parameter (norm) (c)      1.8e-4       5.6e-7       1e-3 / 1e-5
BatchNorm running statistics after the forward (d)     7.4e-7       2.8e-8       1e-4 / 1e-6
Momentum 0.9 + L2 5e-4 replay, 2 steps (e)                          6.1e-8       1e-5
LR schedule, 3833 of the 160000 steps and 5 beyond     equal                     equal
=====================================================  ===========  ===========  =========

(a) teacher forcing: Paddle's heads' logits before the resize, resized by torch's bilinear
(half-pixel, as the model does); in every case OHEM keeps exactly Paddle's pixels. (b) ``min_kept``
sets the threshold / 0.7 does / fewer valid pixels than ``min_kept``. (c) Paddle's own float32
run is 2.5e-4 from its float64 one; the four SPPM conv biases, each followed by a training-mode
BatchNorm, have an exactly zero gradient in both (checked as such). (d) Paddle's rule, biased
batch variance (torch's unbiased rule: 6.4e-2, at the SPPM's 1x1 bin where N is the batch, 2).
(e) of each step's update, in float64 (a warmup update is ~1e-7 of its parameter); the rest is
float64 rounding of new - old at the SPPM conv biases, whose update is weight decay alone, 5e-9 of
the parameter (Paddle's own update matches lr x (g + 5e-4 p) in float64 to 5e-12 elsewhere). Deleting OHEM's 1e-5 in the denominator is caught by the float64 checks
only (a 1.3e-5 change). No Paddle is needed.
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

from ppdist.components import build_loss, build_model
from ppdist.config import load_config
from ppdist.engine.setup import build_optimizer
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "seg", "pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml")
STEP_DIR = os.path.join(ROOT, "tests", "fixtures", "paddle_step")
TOLERANCE = 1e-4


def _make_seg():
    """tests/fixtures/paddle_step/make_seg.py as a module (numpy only until it is run)."""
    spec = importlib.util.spec_from_file_location(
        "paddle_step_make_seg", os.path.join(STEP_DIR, "make_seg.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = _make_seg()


def recipe(min_kept=None):
    """The recipe's config; with ``min_kept`` its three OHEM losses keep at least that many pixels."""
    overrides = []
    if min_kept is not None:
        entry = f"{{name: OhemCrossEntropyLoss, thresh: 0.7, min_kept: {int(min_kept)}}}"
        overrides.append(f"Loss.types=[{entry}, {entry}, {entry}]")
    return load_config(CONFIG, overrides)


def label(fixture, step: int) -> torch.Tensor:
    return torch.from_numpy(fixture[f"label_{step}"].astype(np.int64))


def resized(head_logits: np.ndarray) -> torch.Tensor:
    """A head's logits at the input size, as the model resizes them (bilinear, half-pixel)."""
    return F.interpolate(
        torch.from_numpy(head_logits), (MAKE.HEIGHT, MAKE.WIDTH), mode="bilinear", align_corners=False
    )


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
    return load_arrays(os.path.join(STEP_DIR, "seg.npz"))


@pytest.fixture(scope="module")
def state() -> Dict[str, np.ndarray]:
    return MAKE.paddle_state()


@pytest.fixture(scope="module")
def config(fixture):
    return recipe(fixture["min_kept"])


@pytest.fixture(scope="module")
def positions(fixture, state, config):
    """ppdist parameter -> (Paddle name, positions of the fixture's sampled entries)."""
    model = build_model(config)
    found = sample_positions(model, state, fixture)
    assert (
        len(found)
        == len(list(model.parameters()))
        == len([key for key in fixture if key.startswith("grad_index/")])
        == 151
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
    backward on the fixture's first batch, with its losses and the heads' logits before the resize."""
    dtype = request.param
    model = build_model(config)
    model.load_state_dict(to_torch(model, state))
    model.to(dtype)
    apply_statistics_rule(model, "paddle")
    model.train()
    heads = dict(model.named_modules())["head.seg_heads"]
    captured = {}
    hooks = [
        head.register_forward_hook(lambda module, args, out, h=h: captured.__setitem__(h, out.detach()))
        for h, head in enumerate(heads)
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
        "loss_fn": loss_fn,
    }


def test_recipe_losses_and_optimizer_are_paddlesegs():
    """What make_seg.py found in PaddleSeg's config and builder (3 x OHEM thresh 0.7, min_kept
    130000, coef [1, 1, 1]; Momentum 0.9 with weight_decay 5e-4; LinearWarmup + PolynomialDecay)."""
    config = recipe()
    ohem = {"name": "OhemCrossEntropyLoss", "thresh": 0.7, "min_kept": 130000}
    assert config["Loss"]["types"] == [ohem] * 3 and config["Loss"]["coef"] == [1, 1, 1]
    section = config["Optimizer"]
    assert (section["name"], section["momentum"], section["weight_decay"]) == ("Momentum", 0.9, 5e-4)
    assert section["lr"] == {
        "name": "PolynomialDecay",
        "learning_rate": 0.005,
        "end_lr": 0.0,
        "power": 0.9,
        "warmup_iters": 1000,
        "warmup_start_lr": 1e-5,
    }
    assert config["Global"]["max_iters"] == MAKE.ITERS


def same_pixels_kept(loss_fn, h: int, logit: torch.Tensor, target: torch.Tensor, packed: np.ndarray) -> bool:
    """Whether ppdist's OHEM of head ``h`` keeps exactly the pixels of the fixture's packed mask."""
    ours = loss_fn.losses[h].kept_mask(logit.float(), target).numpy()
    theirs = np.unpackbits(packed, count=ours.size).reshape(ours.shape).astype(bool)
    return bool(np.array_equal(ours, theirs))


def test_loss_on_paddles_logits_equals_paddles(fixture, config):
    """Teacher forcing: ppdist's MultiOutputLoss on Paddle's three heads' logits, both steps, and
    its OHEM on three seeded logit sets (``min_kept`` / 0.7 sets the threshold / all kept)."""
    loss_fn, worst = build_loss(config), 0.0
    for step in (1, 2):
        logits = [resized(fixture[f"head_logits_{step}_{h}"]) for h in range(3)]
        target = label(fixture, step)
        ours = loss_fn(logits, {"label": target})
        for h in range(3):
            theirs = float(fixture[f"loss_{step}_{h}"])
            worst = max(worst, abs(ours[f"loss_{h}"].item() - theirs) / theirs)
            assert same_pixels_kept(loss_fn, h, logits[h], target, fixture[f"kept_{step}_{h}"]), (step, h)
        theirs = float(fixture[f"loss_{step}"])
        assert abs(ours["loss"].item() - theirs) <= TOLERANCE * theirs, step
    teacher = 0.0
    for i in range(3):
        logits, target = MAKE.teacher_case(i, fixture["label_1"].astype(np.int64))
        logits, target = torch.from_numpy(logits), torch.from_numpy(target)
        ours = loss_fn.losses[0](logits, target).item()
        theirs = float(fixture[f"teacher_loss_{i}"])
        teacher = max(teacher, abs(ours - theirs) / theirs)
        assert same_pixels_kept(loss_fn, 0, logits, target, fixture[f"teacher_kept_{i}"]), i
    print(f"loss on Paddle's logits: heads {worst:.1e}, teacher cases {teacher:.1e} relative")
    assert worst <= TOLERANCE and teacher <= TOLERANCE


def test_forward_loss_and_logits_equal_paddles(fixture, run):
    loss_fn, target, tolerance = run["loss_fn"], label(fixture, 1), run["tolerance"]
    worst_loss, worst_logits = 0.0, 0.0
    for h in range(3):
        theirs = float(fixture[f"loss_1_{h}"])
        worst_loss = max(worst_loss, abs(run["losses"][f"loss_{h}"].item() - theirs) / theirs)
        ours = run["head_logits"][h].double().numpy()
        worst_logits = max(worst_logits, relative(ours, fixture[f"head_logits_1_{h}"]))
        assert same_pixels_kept(loss_fn, h, run["outputs"][h].detach(), target, fixture[f"kept_1_{h}"]), h
    print(f"ppdist forward ({run['dtype']}): loss {worst_loss:.1e}, head logits {worst_logits:.1e} relative")
    assert worst_loss <= tolerance["loss"] and worst_logits <= tolerance["logits"]
    theirs = float(fixture["loss_1"])
    assert abs(run["losses"]["loss"].item() - theirs) <= tolerance["loss"] * theirs


def test_raw_gradients_equal_paddles(fixture, run, positions):
    """Sampled entries and full norms of every parameter's gradient. A conv bias followed by a
    training-mode BatchNorm has no effect (the BatchNorm removes the constant): the four SPPM
    conv biases have a zero gradient up to rounding in both, checked as such."""
    errors, zero = gradient_errors(run["model"], positions, fixture)
    worst = max(errors, key=errors.get)
    owners = {positions[key][0] for key in errors}
    paddle_fp32 = max(float(fixture[f"fp32_grad_error/{owner}"]) for owner in owners)
    print(
        f"gradients ({run['dtype']}): worst {errors[worst]:.1e} ({worst}); Paddle's own float32 run: "
        f"{paddle_fp32:.1e}"
    )
    assert errors[worst] <= run["tolerance"]["gradients"], (worst, errors[worst])
    assert sorted(zero) == [
        "head.cm.conv_out.conv.bias",
        "head.cm.stages.0.1.conv.bias",
        "head.cm.stages.1.1.conv.bias",
        "head.cm.stages.2.1.conv.bias",
    ]


def test_batch_norm_statistics_after_the_training_forward_equal_paddles(fixture, run, state):
    expected = dict(state)
    expected.update({key[len("bn_1/") :]: value for key, value in fixture.items() if key.startswith("bn_1/")})
    errors = batch_norm_errors(run["model"], to_torch(run["model"], expected))
    assert len(errors) == len([key for key in fixture if key.startswith("bn_1/")]) == 2 * 48
    worst = max(errors, key=errors.get)
    print(f"BatchNorm statistics ({run['dtype']}): worst {errors[worst]:.1e} ({worst})")
    assert errors[worst] <= run["tolerance"]["statistics"], worst


def test_momentum_replay_of_paddles_gradients_equals_paddles_update(fixture, state, config, positions):
    model = build_model(config).double()  # an update is ~1e-7 of the parameter: float64
    model.load_state_dict(to_torch(model, state))
    optimizer, scheduler = build_optimizer(config, model, 1000)
    assert all(group["weight_decay"] == 5e-4 and group["momentum"] == 0.9 for group in optimizer.param_groups)
    worst = replay(model, optimizer, scheduler, positions, fixture)
    print(f"Momentum + L2 replay: {worst:.1e}")
    assert worst <= 1e-5


def test_warmup_polynomial_schedule_equals_paddlesegs(fixture):
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
