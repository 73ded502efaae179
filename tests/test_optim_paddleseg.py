"""PaddleSeg's optimizers, step by step: the Optimizer sections converted from the SegFormer
(AdamW) and OCRNet (SGD momentum) configs give the parameters PaddleSeg's own optimizers give
(fixture made by tests/fixtures/paddle_optim/make_seg_optim.py with paddlepaddle 2.6.2).

PaddleSeg's AdamW passes no ``apply_decay_param_fun``, so Paddle decays every parameter, norms
and biases included: ``p <- p * (1 - lr * 0.01)`` then the Adam update."""

import os

import numpy as np
import pytest
import torch
from torch import nn

from ppdist.convert.configs.convert import convert_config
from ppdist.optim import build_optimizer

HERE = os.path.dirname(__file__)
FIXTURE = np.load(os.path.join(HERE, "fixtures", "paddle_optim", "seg_optim.npz"))
CONFIGS = os.path.join(HERE, "fixtures", "paddle_configs", "PaddleSeg", "configs")
SEGFORMER = os.path.join(CONFIGS, "segformer", "segformer_b0_cityscapes_1024x1024_160k.yml")
OCRNET = os.path.join(CONFIGS, "ocrnet", "ocrnet_hrnetw18_cityscapes_1024x512_160k.yml")
STEPS, ITERS = 5, 6
# Paddle hands the LR to its kernels as float32 (relative error ~3e-8 of an update); leaving out
# the weight decay of norms and biases, or the L2 term, changes the parameters by > 1e-4.
TOL = 1e-7


class Small(nn.Module):
    """One layer of each kind SegFormer / OCRNet have (as the fixture's Paddle model)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.norm = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 2)


def section(path, **changes):
    """The converted Optimizer section with the fixture's LR (and weight decay) values."""
    opt = dict(convert_config(path).config["Optimizer"])
    lr = dict(opt["lr"], **changes.pop("lr", {}))
    return dict(opt, lr=lr, **changes)


def replay(opt_cfg):
    """ppdist's optimizer on the fixture's initial parameters and gradients; parameters after
    each step and the LR of each step."""
    model = Small().double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(FIXTURE[f"init/{name}"]))
    optimizer, scheduler = build_optimizer(opt_cfg, model, epochs=1, step_each_epoch=ITERS, total_steps=ITERS)
    steps, lrs = [], []
    for k in range(STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        for name, p in model.named_parameters():
            p.grad = torch.from_numpy(FIXTURE[f"grad{k}/{name}"]).clone()
        optimizer.step()
        scheduler.step()
        steps.append({n: p.detach().numpy().copy() for n, p in model.named_parameters()})
    return model, optimizer, steps, lrs


def max_diff(case, steps):
    return max(
        float(np.abs(params[name] - FIXTURE[f"{case}/step{k}/{name}"]).max())
        for k, params in enumerate(steps)
        for name in params
    )


ADAMW = dict(lr={"learning_rate": 0.1})
MOMENTUM = dict(weight_decay=0.04, lr={"learning_rate": 0.1, "warmup_iters": 2, "warmup_start_lr": 0.01})


def test_segformer_adamw_decays_every_parameter_as_paddleseg():
    cfg = section(SEGFORMER, **ADAMW)
    assert {k: v for k, v in cfg.items() if k != "lr"} == {
        "name": "AdamW",
        "beta1": 0.9,
        "beta2": 0.999,
        "weight_decay": 0.01,
    }
    model, optimizer, steps, lrs = replay(cfg)
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.01 for p in g["params"]}
    assert decayed == {id(p) for p in model.parameters()}  # norms and biases too
    assert lrs == pytest.approx(list(FIXTURE["adamw/lr"]), rel=1e-12)
    assert max_diff("adamw", steps) < TOL


def test_exempting_norms_and_biases_would_differ_from_paddleseg():
    _, _, steps, _ = replay(section(SEGFORMER, one_dim_param_no_weight_decay=True, **ADAMW))
    assert max_diff("adamw", steps) > 1e-4


def test_ocrnet_momentum_with_coupled_l2_and_warmup_poly_as_paddleseg():
    cfg = section(OCRNET, **MOMENTUM)
    assert (cfg["name"], cfg["momentum"], cfg["lr"]["power"], cfg["lr"]["end_lr"]) == (
        "Momentum",
        0.9,
        0.9,
        0.0,
    )
    _, _, steps, lrs = replay(cfg)
    assert lrs == pytest.approx(list(FIXTURE["momentum/lr"]), rel=1e-12)
    assert max_diff("momentum", steps) < TOL


def test_momentum_without_the_l2_term_would_differ_from_paddleseg():
    _, _, steps, _ = replay(section(OCRNET, **dict(MOMENTUM, weight_decay=0.0)))
    assert max_diff("momentum", steps) > 1e-4
