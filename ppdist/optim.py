"""Optimizers, L2 regularizer and per-iteration LR schedules with PaddleOCR's names.

``Optimizer: {name: Adam, beta1, beta2, epsilon, lr: {name: Cosine, learning_rate,
warmup_epoch}, regularizer: {name: L2, factor}, clip_norm | clip_norm_global}``.

Schedules are closed-form functions of the global step (stepped once per iteration), so
their state is one integer and a resume restores them exactly. ``step_each_epoch`` is the
number of per-card iterations of one epoch, as in PaddleOCR.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from ppdist.config.schema import OPTIMIZER_COMMON_KEYS
from ppdist.errors import ConfigError
from ppdist.registry import LR_SCHEDULERS, OPTIMIZERS, REGULARIZERS


# --------------------------------------------------------------------------- regularizers
@REGULARIZERS.register(name="L2")
class L2Decay:
    """Coupled L2: ``factor * param`` is added to the gradient (Paddle's L2Decay)."""

    def __init__(self, factor: float = 0.0) -> None:
        self.factor = float(factor)


# --------------------------------------------------------------------------- optimizers
def _impl(fused: bool) -> Dict[str, bool]:
    """torch's fused kernel (one launch per step; with fp16 AMP the scaler's overflow check stays
    on the device), or torch's default implementation (multi-tensor on CUDA)."""
    return {"fused": True} if fused else {}


def use_fused(setting: Optional[bool], device: torch.device) -> bool:
    """``Optimizer.fused``; unset: on with CUDA, off on CPU (docs/benchmarks.md)."""
    return device.type == "cuda" if setting is None else bool(setting)


@OPTIMIZERS.register(name="Adam")
def adam(
    params: List[Dict[str, Any]],
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    amsgrad: bool = False,
    fused: bool = False,
) -> torch.optim.Optimizer:
    """Adam with coupled L2 (the regularizer's factor becomes each group's ``weight_decay``)."""
    return torch.optim.Adam(
        params, lr=0.0, betas=(beta1, beta2), eps=epsilon, amsgrad=amsgrad, **_impl(fused)
    )


@OPTIMIZERS.register(name="AdamW")
def adamw(
    params: List[Dict[str, Any]],
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    weight_decay: float = 0.01,
    no_weight_decay_name: Optional[str] = None,
    one_dim_param_no_weight_decay: bool = False,
    fused: bool = False,
) -> torch.optim.Optimizer:
    """AdamW with decoupled weight decay; names listed in ``no_weight_decay_name`` (space
    separated substrings) and, optionally, 1-D parameters get none (PaddleOCR's options)."""
    skip = (no_weight_decay_name or "").split()
    for group in params:
        group["weight_decay"] = weight_decay
    out: List[Dict[str, Any]] = []
    for group in params:
        decayed, plain = [], []
        for name, p in zip(group["names"], group["params"]):
            exempt = any(s in name for s in skip) or (one_dim_param_no_weight_decay and p.ndim <= 1)
            (plain if exempt else decayed).append((name, p))
        for members, wd in ((decayed, weight_decay), (plain, 0.0)):
            if members:
                out.append(
                    {"params": [p for _, p in members], "names": [n for n, _ in members], "weight_decay": wd}
                )
    return torch.optim.AdamW(out, lr=0.0, betas=(beta1, beta2), eps=epsilon, **_impl(fused))


def _sgd(
    params: List[Dict[str, Any]],
    momentum: float,
    use_nesterov: bool,
    weight_decay: Optional[float],
    fused: bool,
) -> torch.optim.Optimizer:
    if weight_decay is not None:  # PaddleSeg's key: coupled L2 on every parameter
        if any(g.get("custom_decay") for g in params) or any(g["weight_decay"] for g in params):
            raise ConfigError(
                "Optimizer: set weight_decay or regularizer (or per-parameter factors), not both"
            )
        for group in params:
            group["weight_decay"] = float(weight_decay)
    optimizer = torch.optim.SGD(
        params, lr=0.0, momentum=momentum, nesterov=use_nesterov and momentum > 0, **_impl(fused)
    )
    if momentum:  # torch's fused SGD leaves new buffers unwritten when its first step is skipped
        for group in optimizer.param_groups:  # (found_inf: fp16 overflow, nan_policy skip); zeros
            for param in group["params"]:  # give the same first step: m * 0 + g = g
                optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)
    return optimizer


@OPTIMIZERS.register(name="Momentum")
def momentum_sgd(
    params: List[Dict[str, Any]],
    momentum: float = 0.9,
    use_nesterov: bool = False,
    weight_decay: Optional[float] = None,
    fused: bool = False,
) -> torch.optim.Optimizer:
    """Paddle's Momentum: v = m*v + g; p -= lr*v (torch SGD without dampening).

    ``weight_decay`` (PaddleSeg) is coupled L2 on all parameters, BN and biases included."""
    return _sgd(params, momentum, use_nesterov, weight_decay, fused)


@OPTIMIZERS.register(name="SGD")
def sgd(
    params: List[Dict[str, Any]],
    momentum: float = 0.0,
    use_nesterov: bool = False,
    weight_decay: Optional[float] = None,
    fused: bool = False,
) -> torch.optim.Optimizer:
    """SGD (optionally with momentum; PaddleSeg's ``type: SGD, momentum: 0.9`` is Momentum)."""
    return _sgd(params, momentum, use_nesterov, weight_decay, fused)


# --------------------------------------------------------------------------- LR schedules
class LRSchedule:
    """A learning rate as a function of the iteration.

    Linear warmup over ``warmup_epoch`` epochs (PaddleOCR) or ``warmup_iters`` iterations
    (PaddleSeg), from ``warmup_start_lr`` (default 0) to the schedule's starting value.
    """

    def __init__(
        self,
        learning_rate: float,
        step_each_epoch: int,
        warmup_epoch: float = 0,
        warmup_iters: int = 0,
        warmup_start_lr: float = 0.0,
    ) -> None:
        if warmup_epoch and warmup_iters:
            raise ConfigError("Optimizer.lr: set warmup_epoch or warmup_iters, not both")
        self.base_lr = float(learning_rate)
        self.step_each_epoch = int(step_each_epoch)
        self.warmup_steps = int(warmup_iters) if warmup_iters else int(round(warmup_epoch * step_each_epoch))
        self.warmup_start_lr = float(warmup_start_lr)

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.warmup_start_lr + (self.base_lr - self.warmup_start_lr) * step / self.warmup_steps
        return self.after_warmup(step - self.warmup_steps)

    def after_warmup(self, step: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


def paddledet_warmup(base_lr: float, start_lr: float, step: int, steps: int) -> float:
    """PaddleDetection's LinearWarmup at ``step`` of ``steps``, its arithmetic to the last bit:
    ``base_lr * (start_factor * (1 - a) + a)`` with ``a = step / steps``."""
    alpha = step / steps
    start_factor = start_lr / base_lr if base_lr else 0.0
    return base_lr * (start_factor * (1 - alpha) + alpha)


@LR_SCHEDULERS.register(name="Const")
class ConstLR(LRSchedule):
    """A constant learning rate (also used when ``lr`` is a plain number)."""

    def __init__(
        self, learning_rate: float, step_each_epoch: int, warmup_epoch: float = 0, epochs: int = 0
    ) -> None:
        super().__init__(learning_rate, step_each_epoch, warmup_epoch)

    def after_warmup(self, step: int) -> float:
        return self.base_lr


@LR_SCHEDULERS.register(name="Cosine")
class CosineLR(LRSchedule):
    """Cosine annealing to 0 over ``epochs * step_each_epoch`` iterations (after warmup)."""

    def __init__(
        self,
        learning_rate: float,
        epochs: int,
        step_each_epoch: int,
        warmup_epoch: float = 0,
        eta_min: float = 0.0,
    ) -> None:
        super().__init__(learning_rate, step_each_epoch, warmup_epoch)
        self.total = max(1, epochs * step_each_epoch)
        self.eta_min = float(eta_min)

    def after_warmup(self, step: int) -> float:
        return self.eta_min + (self.base_lr - self.eta_min) * 0.5 * (
            1 + math.cos(math.pi * min(step, self.total) / self.total)
        )


@LR_SCHEDULERS.register(name="Linear")
class LinearLR(LRSchedule):
    """Polynomial decay (power 1 = linear) to ``end_lr`` over ``epochs * step_each_epoch``."""

    def __init__(
        self,
        learning_rate: float,
        epochs: int,
        step_each_epoch: int,
        end_lr: float = 0.0,
        power: float = 1.0,
        warmup_epoch: float = 0,
    ) -> None:
        super().__init__(learning_rate, step_each_epoch, warmup_epoch)
        self.total = max(1, epochs * step_each_epoch)
        self.end_lr = float(end_lr)
        self.power = float(power)

    def after_warmup(self, step: int) -> float:
        frac = 1.0 - min(step, self.total) / self.total
        return (self.base_lr - self.end_lr) * frac**self.power + self.end_lr


@LR_SCHEDULERS.register(name="CosineDecay")
class CosineDecayLR(LRSchedule):
    """PaddleDetection's cosine: ``lr * 0.5 * (1 + cos(pi * t / (M - W)))`` with ``t`` counted
    after the warmup ``W`` and ``M = max_epochs * step_each_epoch``; ``max_epochs`` may exceed
    the run's epochs (PP-YOLOE: 360 for 300), so the LR never reaches 0."""

    def __init__(
        self,
        learning_rate: float,
        epochs: int,
        step_each_epoch: int,
        max_epochs: Optional[int] = None,
        warmup_epoch: float = 0,
        warmup_iters: int = 0,
        warmup_start_lr: float = 0.0,
    ) -> None:
        super().__init__(learning_rate, step_each_epoch, warmup_epoch, warmup_iters, warmup_start_lr)
        self.max_steps = int((max_epochs or epochs) * step_each_epoch)
        self.span = max(1, self.max_steps - self.warmup_steps)

    def lr_at(self, step: int) -> float:
        """PaddleDetection's arithmetic to the last bit: its LinearWarmup computes
        ``lr * (start_factor * (1 - a) + a)`` with ``a = step / W``."""
        if step < self.warmup_steps:
            return paddledet_warmup(self.base_lr, self.warmup_start_lr, step, self.warmup_steps)
        return self.after_warmup(step - self.warmup_steps)

    def after_warmup(self, step: int) -> float:
        return self.base_lr * 0.5 * (math.cos(min(step, self.span) * math.pi / self.span) + 1)


@LR_SCHEDULERS.register(name="PolynomialDecay")
class PolynomialDecayLR(LRSchedule):
    """PaddleSeg's schedule: ``(lr - end_lr) * (1 - t / decay_steps) ** power + end_lr`` with
    ``t`` counted after the warmup and ``decay_steps`` defaulting to the run's iterations minus
    ``warmup_iters`` (iteration-based runs: ``Global.max_iters``)."""

    def __init__(
        self,
        learning_rate: float,
        total_steps: int,
        step_each_epoch: int,
        end_lr: float = 0.0,
        power: float = 0.9,
        decay_steps: Optional[int] = None,
        warmup_iters: int = 0,
        warmup_start_lr: float = 0.0,
        warmup_epoch: float = 0,
    ) -> None:
        super().__init__(learning_rate, step_each_epoch, warmup_epoch, warmup_iters, warmup_start_lr)
        self.decay_steps = max(1, int(decay_steps) if decay_steps else int(total_steps) - self.warmup_steps)
        self.end_lr = float(end_lr)
        self.power = float(power)

    def after_warmup(self, step: int) -> float:
        frac = 1.0 - min(step, self.decay_steps) / self.decay_steps
        return (self.base_lr - self.end_lr) * frac**self.power + self.end_lr


@LR_SCHEDULERS.register(name="Piecewise")
class PiecewiseLR(LRSchedule):
    """``values[i]`` until epoch ``decay_epochs[i]`` (boundaries in epochs, applied per iteration) or
    iteration ``decay_iters[i]`` (PaddleDetection's static-era ``max_iters`` configs), after a linear
    warm-up to ``values[0]`` over ``warmup_epoch`` epochs or ``warmup_iters`` iterations from
    ``warmup_start_lr`` (default 0).

    ``boundaries_after_warmup`` true (PaddleOCR: its LinearWarmup wraps the PiecewiseDecay, which
    counts its steps from the warm-up's end): the decay boundaries count after the warm-up; false
    (PaddleDetection, whose warm-up and decay boundaries share one step count): from step 0, and
    the warm-up is PaddleDetection's arithmetic (``paddledet_warmup``).

    ``learning_rate`` (SLANet.yml writes one) is not read by PaddleOCR's Piecewise: accepted when it
    equals ``values[0]``, refused otherwise (it would not be the first rate).
    """

    def __init__(
        self,
        step_each_epoch: int,
        values: List[float],
        decay_epochs: Optional[List[float]] = None,
        decay_iters: Optional[List[int]] = None,
        warmup_epoch: float = 0,
        warmup_iters: int = 0,
        warmup_start_lr: float = 0.0,
        epochs: int = 0,
        boundaries_after_warmup: bool = True,
        learning_rate: Optional[float] = None,
    ) -> None:
        if (decay_epochs is None) == (decay_iters is None):
            raise ConfigError("Optimizer.lr: Piecewise needs decay_epochs or decay_iters (one of them)")
        boundaries = list(decay_epochs if decay_epochs is not None else decay_iters)  # type: ignore[arg-type]
        if len(values) != len(boundaries) + 1:
            raise ConfigError(
                f"Optimizer.lr: Piecewise needs len(values) == len(decay_epochs or decay_iters) + 1, "
                f"got {len(values)} values and {len(boundaries)} boundaries"
            )
        if learning_rate is not None and float(learning_rate) != float(values[0]):
            raise ConfigError(
                f"Optimizer.lr.learning_rate ({learning_rate}) is not read by Piecewise, whose rates are "
                f"Optimizer.lr.values (the first: {values[0]}): remove it or make it equal to values[0]"
            )
        super().__init__(values[0], step_each_epoch, warmup_epoch, warmup_iters, warmup_start_lr)
        if decay_epochs is not None:
            self.boundaries = [int(e * step_each_epoch) for e in boundaries]
        else:
            self.boundaries = [int(i) for i in boundaries]
        self.values = [float(v) for v in values]
        self.boundaries_after_warmup = bool(boundaries_after_warmup)

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps and not self.boundaries_after_warmup:
            return paddledet_warmup(self.base_lr, self.warmup_start_lr, step, self.warmup_steps)
        return super().lr_at(step)

    def after_warmup(self, step: int) -> float:
        counted = step if self.boundaries_after_warmup else step + self.warmup_steps
        return self.values[bisect.bisect_right(self.boundaries, counted)]


class IterScheduler:
    """Sets every param group's lr from an ``LRSchedule`` at each ``step()`` (per iteration)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LRSchedule) -> None:
        self.optimizer = optimizer
        self.schedule = schedule
        self.last_step = 0
        self.lr_tensors: Optional[List[torch.Tensor]] = None  # set by use_tensor_lr
        self._apply()

    def use_tensor_lr(self, device: torch.device) -> None:
        """Each group's rate in a device tensor filled in place (a captured step reads it anew; torch's
        fused optimizers take it): float64 (the update of a Python float), float32 on CUDA."""
        dtype = torch.float32 if device.type == "cuda" else torch.float64
        self.lr_tensors = [torch.zeros((), dtype=dtype, device=device) for _ in self.optimizer.param_groups]
        self._apply()

    def _apply(self) -> None:
        lr = self.schedule.lr_at(self.last_step)
        for index, group in enumerate(self.optimizer.param_groups):
            value = lr * group.get("lr_mult", 1.0)
            if self.lr_tensors is None:
                group["lr"] = value
            else:  # the same tensor every step (a loaded optimizer state may have replaced it)
                group["lr"] = self.lr_tensors[index].fill_(value)

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def get_lr(self) -> float:
        return self.schedule.lr_at(self.last_step)

    def state_dict(self) -> Dict[str, int]:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.last_step = int(state["last_step"])
        self._apply()


# --------------------------------------------------------------------------- building
def _param_groups(model: nn.Module, default_decay: float) -> List[Dict[str, Any]]:
    """Group trainable parameters by their L2 factor (``param.regularizer_factor`` overrides) and
    their learning-rate multiplier (``param.lr_mult``, e.g. ResNet's ``lr_mult_list``: the group's
    ``lr_mult``, which the scheduler applies)."""
    groups: Dict[Tuple[float, bool, float], Dict[str, Any]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        custom = hasattr(param, "regularizer_factor")
        factor = float(getattr(param, "regularizer_factor", default_decay))
        lr_mult = float(getattr(param, "lr_mult", 1.0))
        group = groups.setdefault(
            (factor, custom, lr_mult),
            {"params": [], "names": [], "weight_decay": factor, "custom_decay": custom},
        )
        if lr_mult != 1.0:
            group["lr_mult"] = lr_mult
        group["params"].append(param)
        group["names"].append(name)
    return list(groups.values())


def build_lr_schedule(
    lr_cfg: Any, epochs: int, step_each_epoch: int, total_steps: Optional[int] = None
) -> LRSchedule:
    """An ``LRSchedule`` from ``Optimizer.lr`` (a number or ``{name, learning_rate, ...}``)."""
    if not isinstance(lr_cfg, Mapping):
        return ConstLR(float(lr_cfg), step_each_epoch)
    entry = dict(lr_cfg)
    entry.setdefault("name", "Const")
    name = entry["name"]
    accepted, _ = LR_SCHEDULERS.accepted_keys(name)
    total = int(total_steps) if total_steps is not None else epochs * step_each_epoch
    extra = {
        k: v
        for k, v in (("epochs", epochs), ("step_each_epoch", step_each_epoch), ("total_steps", total))
        if k in accepted
    }
    return LR_SCHEDULERS.build(entry, where="Optimizer.lr", **extra)


LR_VALUE_KEYS = ("learning_rate", "end_lr", "eta_min", "warmup_start_lr")


def scale_learning_rates(lr_cfg: Any, factor: float) -> Any:
    """``Optimizer.lr`` with every absolute learning rate multiplied by ``factor`` (linear scaling
    rule): the peak, the end / minimum, the warm-up start and Piecewise ``values``, so the schedule
    keeps its shape."""
    if not isinstance(lr_cfg, Mapping):
        return float(lr_cfg) * factor
    scaled = dict(lr_cfg)
    for key in LR_VALUE_KEYS:
        if isinstance(scaled.get(key), (int, float)) and not isinstance(scaled[key], bool):
            scaled[key] = float(scaled[key]) * factor
    if isinstance(scaled.get("values"), (list, tuple)):
        scaled["values"] = [float(v) * factor for v in scaled["values"]]
    return scaled


def build_optimizer(
    opt_cfg: Mapping[str, Any],
    model: nn.Module,
    epochs: int,
    step_each_epoch: int,
    total_steps: Optional[int] = None,
) -> Tuple[torch.optim.Optimizer, IterScheduler]:
    """Optimizer and per-iteration scheduler from the ``Optimizer`` section."""
    reg_cfg = opt_cfg.get("regularizer") or None
    default_decay = 0.0
    if reg_cfg:
        default_decay = REGULARIZERS.build(dict(reg_cfg), where="Optimizer.regularizer").factor
    groups = _param_groups(model, default_decay)
    if not groups:
        raise ConfigError("the model has no trainable parameters")
    kwargs = {k: v for k, v in opt_cfg.items() if k not in OPTIMIZER_COMMON_KEYS}
    fused = use_fused(opt_cfg.get("fused"), groups[0]["params"][0].device)
    optimizer = OPTIMIZERS.build(kwargs, where="Optimizer", params=groups, fused=fused)
    schedule = build_lr_schedule(opt_cfg["lr"], epochs, step_each_epoch, total_steps)
    return optimizer, IterScheduler(optimizer, schedule)
