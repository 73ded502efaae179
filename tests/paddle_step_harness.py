"""The step-equivalence harness: what a model family's training step is checked against (the
fixture that the original training code wrote in tests/fixtures/paddle_step/) is declared in one
``StepSpec`` per family (tests/paddle_step_specs/); the checks here run on every spec
(tests/engine/test_paddle_step.py):

- ``check_teacher_losses``: ppdist's loss function on the original's own outputs;
- ``check_forward``: ppdist's training forward (outputs, every loss term) from the original's weights;
- ``check_gradients``: sampled entries and full norms of every gradient, and which ones are 0;
- ``check_statistics``: BatchNorm running statistics after the training forward;
- ``check_replay``: the original's gradients through ppdist's optimizer (clip, EMA) give its update;
- ``check_schedule``: the learning rate at the steps the fixture lists.

A spec's ``variants`` are its training forwards (a dtype, or a phase of the loss), each with its
``Tolerance``; a family's own checks that fit none of these are its spec's ``checks``."""

from __future__ import annotations

import copy
import importlib.util
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from paddle_step_testing import (
    Positions,
    batch_norm_errors,
    gradient_errors,
    relative,
    replay,
    sample_positions,
    to_torch,
    trainable_parameters,
)

from ppdist.components import build_loss, build_model
from ppdist.engine.ema import ModelEMA
from ppdist.engine.setup import build_optimizer, gradient_clipper
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

Arrays = Dict[str, np.ndarray]
Config = Dict[str, Any]
Pair = Tuple[Any, Any]  # (ppdist's, the original's): numbers, or a tensor / array and an array
Batch = Tuple[Any, Any]  # a training forward's (inputs, targets)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_DIR = os.path.join(ROOT, "tests", "fixtures", "paddle_step")
CHECKS = ("teacher", "forward", "gradients", "statistics", "replay", "schedule")


def fixture_script(filename: str) -> ModuleType:
    """A script of tests/fixtures/paddle_step/ as a module: its settings, weight recipes and .npz
    layout (it imports Paddle only when run)."""
    name = f"paddle_step_{os.path.splitext(filename)[0]}"
    spec = importlib.util.spec_from_file_location(name, os.path.join(STEP_DIR, filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Tolerance:
    """Relative tolerances of one training forward's checks (the family's notes give the measured
    errors): ``outputs`` and ``loss`` of ppdist's forward, the worst sampled ``gradients`` (None:
    ``paddle_float32`` instead), BatchNorm ``statistics``, full gradient ``norms``."""

    outputs: float
    loss: float
    gradients: Optional[float]
    statistics: float
    norms: float = 1e-3
    # (a, b): ppdist's worst gradient error within a x, its median within b x those of the
    # original's own float32 run against its float64 one (the fixture's fp32_grad_error/)
    paddle_float32: Optional[Tuple[float, float]] = None


@dataclass(frozen=True)
class Variant:
    """One training forward and backward of a family: its name (a dtype, or a phase of the loss) and
    the dtype its model runs in."""

    name: str
    dtype: torch.dtype
    tolerance: Tolerance


# The tolerances most families meet: how ppdist trains (float32) and, where the fixture was made in
# float64, ppdist in float64 (only its float32 loss rounds).
FLOAT32 = Variant(
    "float32", torch.float32, Tolerance(outputs=1e-4, loss=1e-4, gradients=1e-3, statistics=1e-4)
)
FLOAT64 = Variant(
    "float64", torch.float64, Tolerance(outputs=1e-6, loss=1e-6, gradients=1e-5, statistics=1e-6)
)


@dataclass(frozen=True)
class ZeroGradients:
    """The gradients that are 0 in exact arithmetic in both frameworks (a constant the next
    training-mode BatchNorm or softmax removes; checked to be rounding noise): exactly the ppdist
    parameters ``names``, or exactly the Paddle parameters ``paddle_names``, or else fewer than a
    tenth of the nonzero ones (each name ending in ``ending`` if given)."""

    names: Optional[Tuple[str, ...]] = None
    paddle_names: Optional[Tuple[str, ...]] = None
    ending: Optional[str] = None

    def check(self, zero: Sequence[str], errors: Dict[str, float], positions: Positions) -> None:
        if self.names is not None:
            assert sorted(zero) == sorted(self.names), zero
        elif self.paddle_names is not None:
            assert sorted(positions[key][0] for key in zero) == sorted(self.paddle_names), zero
        else:
            assert len(zero) < len(errors) // 10, zero
            assert self.ending is None or all(key.endswith(self.ending) for key in zero), zero


@dataclass(frozen=True)
class Replay:
    """The optimizer replay: ``steps`` of the fixture's gradients through ppdist's optimizer of the
    family's config (float64), each step's update within ``tolerance`` of the original's.

    ``clip``: through ppdist's gradient clipper first (``unclipped_error``: without it the replay
    must miss by more than this). ``start_step``: the scheduler's step before the first.
    ``ema_tolerance``: a ModelEMA (the config's decay) updated after each step, checked against
    the fixture's ``ema_<step>/``. ``groups``: (setting, value) every parameter group has;
    ``every_parameter``: the groups hold every parameter. ``arrays``: the fixture as the replay
    reads it (``grad_<step>/``, ``param_<step>/``, ``lr_<step>``)."""

    tolerance: float
    steps_per_epoch: int
    steps: int = 2
    clip: bool = False
    unclipped_error: Optional[float] = None
    start_step: int = 0
    ema_tolerance: Optional[float] = None
    groups: Tuple[Tuple[str, Any], ...] = ()
    every_parameter: bool = False
    arrays: Optional[Callable[[Arrays], Arrays]] = None


@dataclass(frozen=True)
class Schedule:
    """The LR schedule of ``config`` (None: the family's), equal to the fixture's ``name`` values:
    at every step from 0, at the steps of the fixture's ``index``, or (``lr_at``) queried at these
    steps instead of stepped to them. ``beyond``: the index goes past this step; ``length``: how
    many values; ``ends``: the first and last value."""

    name: str
    steps_per_epoch: int
    config: Optional[Callable[[], Config]] = None
    index: Optional[str] = None
    lr_at: Optional[Callable[[], Iterable[int]]] = None
    beyond: Optional[int] = None
    length: Optional[int] = None
    ends: Optional[Tuple[float, float]] = None


@dataclass
class StepRun:
    """ppdist's model after one training forward and backward of a variant, with its outputs,
    losses, the outputs of the spec's ``capture`` modules and the loss function."""

    variant: Variant
    model: torch.nn.Module
    outputs: Any
    losses: Dict[str, torch.Tensor]
    captured: Dict[str, torch.Tensor]
    loss_fn: torch.nn.Module


@dataclass
class Comparison:
    """What a check compares, by label: ``arrays`` (relative norm error) and ``values`` (relative
    error), each as (ppdist's, the original's)."""

    arrays: Dict[str, Pair] = field(default_factory=dict)
    values: Dict[str, Pair] = field(default_factory=dict)


@dataclass(frozen=True)
class StepSpec:
    """A family's step-equivalence fixture and how ppdist replays it.

    ``fixture()``, ``paddle_state()`` and ``config(family)`` load the fixture's arrays, the Paddle
    state dict it started from and ppdist's config of the recipe; ``batch(family, variant)`` is the
    training forward's (inputs, targets). ``forward(family, run)`` compares the forward with the
    fixture, ``teacher(family, run)`` ppdist's loss on the original's outputs (within
    ``teacher_tolerance``). The model is built once in ``base_dtype`` with Paddle's weights (it must
    hold the sampled indices exactly: float64 over 2**24 parameters); each variant runs a copy in
    Paddle's BatchNorm rule (``statistics_layers``: how many BatchNorms) after ``prepare(model)``.
    ``parameter_tensors``, ``parameters``, ``statistics``: the counts of parameter tensors,
    parameters and BatchNorm statistics asserted. ``checks``: the family's own checks, run with
    the family; ``slow``: the shared checks (``CHECKS``) and own checks marked slow; ``one_thread``:
    one intra-op thread while the family runs."""

    name: str
    fixture: Callable[[], Arrays]
    paddle_state: Callable[[], Arrays]
    config: Callable[["Family"], Config]
    variants: Tuple[Variant, ...]
    batch: Callable[["Family", Variant], Batch]
    forward: Callable[["Family", StepRun], Comparison]
    teacher: Callable[["Family", StepRun], Dict[str, Pair]]
    teacher_tolerance: float
    zero_gradients: ZeroGradients
    replay: Replay
    schedules: Tuple[Schedule, ...]
    base_dtype: torch.dtype = torch.float32
    prepare: Optional[Callable[[torch.nn.Module], None]] = None
    capture: Tuple[str, ...] = ()
    parameter_tensors: Optional[int] = None
    parameters: Optional[int] = None
    statistics_layers: Optional[int] = None
    statistics: Optional[int] = None
    # the variants a check runs on (default: teacher on the first, the others on all)
    teacher_variants: Optional[Tuple[str, ...]] = None
    statistics_variants: Optional[Tuple[str, ...]] = None
    # the variant's arrays of the gradient check (e.g. a phase's gradients as grad_1/)
    step_arrays: Optional[Callable[[Arrays, str], Arrays]] = None
    checks: Tuple[Callable[["Family"], None], ...] = ()
    slow: FrozenSet[str] = frozenset()
    one_thread: bool = False

    def variant(self, name: str) -> Variant:
        return next(variant for variant in self.variants if variant.name == name)

    def variants_of(self, check: str) -> Tuple[str, ...]:
        """The names of the variants ``check`` runs on."""
        if check == "teacher" and self.teacher_variants is not None:
            return self.teacher_variants
        if check == "teacher":
            return (self.variants[0].name,)
        if check == "statistics" and self.statistics_variants is not None:
            return self.statistics_variants
        return tuple(variant.name for variant in self.variants)


class Family:
    """A family's fixture, Paddle state, config, model with Paddle's weights and sampled-position
    map, each made once when first needed; ``scratch`` is a folder of its own."""

    def __init__(self, spec: StepSpec, scratch: Path) -> None:
        self.spec = spec
        self.scratch = scratch

    @cached_property
    def arrays(self) -> Arrays:
        return self.spec.fixture()

    @cached_property
    def state(self) -> Arrays:
        return self.spec.paddle_state()

    @cached_property
    def config(self) -> Config:
        return self.spec.config(self)

    @cached_property
    def base(self) -> torch.nn.Module:
        """ppdist's model in the spec's ``base_dtype`` with Paddle's weights; the checks use copies."""
        model = build_model(self.config).to(self.spec.base_dtype)
        model.load_state_dict(to_torch(model, self.state))
        return model

    @cached_property
    def positions(self) -> Positions:
        """ppdist parameter -> (Paddle name, positions of the fixture's sampled entries)."""
        found = sample_positions(self.base, self.state, self.arrays)
        sampled = len([key for key in self.arrays if key.startswith("grad_index/")])
        assert len(found) == len(trainable_parameters(self.base)) == sampled
        if self.spec.parameter_tensors is not None:
            assert len(found) == self.spec.parameter_tensors, len(found)
        if self.spec.parameters is not None:
            assert sum(p.numel() for _, p in trainable_parameters(self.base)) == self.spec.parameters
        return found

    def run(self, name: str) -> StepRun:
        """One training forward and backward of variant ``name`` on a copy of the model."""
        variant = self.spec.variant(name)
        model = copy.deepcopy(self.base).to(variant.dtype)
        layers = apply_statistics_rule(model, "paddle")
        assert self.spec.statistics_layers is None or layers == self.spec.statistics_layers, layers
        model.train()
        if self.spec.prepare is not None:
            self.spec.prepare(model)
        inputs, targets = self.spec.batch(self, variant)
        captured: Dict[str, torch.Tensor] = {}
        modules = dict(model.named_modules())
        hooks = [
            modules[path].register_forward_hook(
                lambda module, args, out, path=path: captured.__setitem__(path, out.detach())
            )
            for path in self.spec.capture
        ]
        try:
            outputs = model(inputs)
        finally:
            for hook in hooks:
                hook.remove()
        loss_fn = build_loss(self.config)
        losses = loss_fn(outputs, targets)
        losses["loss"].backward()
        return StepRun(variant, model, outputs, losses, captured, loss_fn)


@contextmanager
def family_context(spec: StepSpec, scratch: Path) -> Iterator[Family]:
    """The family of ``spec``, with one intra-op thread while it is open if the spec asks."""
    threads = torch.get_num_threads()
    if spec.one_thread:
        torch.set_num_threads(1)
    try:
        yield Family(spec, scratch)
    finally:
        torch.set_num_threads(threads)


def as_array(value: Any) -> np.ndarray:
    if torch.is_tensor(value):
        return value.detach().double().numpy()
    return np.asarray(value, dtype=np.float64)


def as_number(value: Any) -> float:
    return float(value.detach()) if torch.is_tensor(value) else float(value)


def value_errors(values: Dict[str, Pair], tolerance: float, what: str) -> None:
    """Assert each (ours, theirs) within ``tolerance`` relative of theirs; print the worst."""
    errors = {}
    for label, (ours, theirs) in values.items():
        ours, theirs = as_number(ours), as_number(theirs)
        errors[label] = abs(ours - theirs) / abs(theirs) if theirs else float(ours != theirs)
        assert abs(ours - theirs) <= tolerance * abs(theirs), (label, ours, theirs)
    if errors:
        worst = max(errors, key=errors.get)
        print(f"{what}: worst {errors[worst]:.1e} ({worst}) relative")


def check_teacher_losses(family: Family, run: StepRun) -> None:
    """ppdist's loss function on the original's own outputs gives the original's loss terms."""
    value_errors(family.spec.teacher(family, run), family.spec.teacher_tolerance, "loss on Paddle's outputs")


def check_forward(family: Family, run: StepRun) -> None:
    """ppdist's training forward from Paddle's weights: outputs and loss terms equal the original's."""
    tolerance = run.variant.tolerance
    compared = family.spec.forward(family, run)
    for label, (ours, theirs) in compared.arrays.items():
        error = relative(as_array(ours), theirs)
        print(f"{label} ({run.variant.name}): {error:.1e} relative")
        assert error <= tolerance.outputs, (label, error)
    value_errors(compared.values, tolerance.loss, f"loss terms ({run.variant.name})")


def check_gradients(family: Family, run: StepRun) -> None:
    """Sampled entries and full norms of every parameter's gradient, and which gradients are 0."""
    spec, tolerance = family.spec, run.variant.tolerance
    arrays = family.arrays if spec.step_arrays is None else spec.step_arrays(family.arrays, run.variant.name)
    positions = family.positions
    errors, zero = gradient_errors(run.model, positions, arrays, norm_tolerance=tolerance.norms)
    worst = max(errors, key=errors.get)
    median = float(np.median(list(errors.values())))
    note, own = "", None
    if any(key.startswith("fp32_grad_error/") for key in arrays):  # the original's float32 run
        own = np.asarray([float(arrays[f"fp32_grad_error/{positions[key][0]}"]) for key in errors])
        note = f"; Paddle's own float32 run: worst {own.max():.1e}, median {np.median(own):.1e}"
    print(f"gradients ({run.variant.name}): worst {errors[worst]:.1e} ({worst}), median {median:.1e}{note}")
    if tolerance.gradients is not None:
        assert errors[worst] <= tolerance.gradients, (worst, errors[worst])
    if tolerance.paddle_float32 is not None:
        assert own is not None, "the fixture holds no fp32_grad_error/"
        worst_factor, median_factor = tolerance.paddle_float32
        assert errors[worst] <= worst_factor * own.max() and median <= median_factor * np.median(own), worst
    spec.zero_gradients.check(zero, errors, positions)


def check_statistics(family: Family, run: StepRun) -> None:
    """BatchNorm running statistics after the training forward equal the original's (``bn_1/``)."""
    expected = dict(family.state)
    expected.update({k[len("bn_1/") :]: v for k, v in family.arrays.items() if k.startswith("bn_1/")})
    errors = batch_norm_errors(run.model, to_torch(run.model, expected))
    count = len([key for key in family.arrays if key.startswith("bn_1/")])
    assert len(errors) == count, (len(errors), count)
    assert family.spec.statistics is None or count == family.spec.statistics, count
    worst = max(errors, key=errors.get)
    print(f"BatchNorm statistics ({run.variant.name}): worst {errors[worst]:.1e} ({worst})")
    assert errors[worst] <= run.variant.tolerance.statistics, worst


def replay_error(family: Family, clip: bool) -> float:
    """The worst update error of the spec's replay on a float64 copy of the model (``clip``:
    through ppdist's gradient clipper), checking the optimizer's groups and EMA on the way."""
    spec = family.spec.replay
    model = copy.deepcopy(family.base).double()  # an update can be ~1e-7 of the parameter: float64
    model.load_state_dict(to_torch(model, family.state))
    optimizer, scheduler = build_optimizer(family.config, model, spec.steps_per_epoch)
    for setting, value in spec.groups:
        assert all(group[setting] == value for group in optimizer.param_groups), setting
    if spec.every_parameter:
        assert sum(len(group["params"]) for group in optimizer.param_groups) == len(family.positions)
    if spec.start_step:
        scheduler.load_state_dict({"last_step": spec.start_step})
    arrays = family.arrays if spec.arrays is None else spec.arrays(family.arrays)
    after_step, ema_errors = None, []
    if spec.ema_tolerance is not None:
        settings = family.config["Global"]
        ema = ModelEMA(model, decay=settings["ema_decay"], decay_type=settings["ema_decay_type"])

        def after_step(step: int) -> None:
            ema.update(model)
            averaged = dict(ema.module.named_parameters())  # the EMA copy trains nothing itself
            for key, (owner, where) in family.positions.items():
                p = averaged[key]
                ours = p.detach().double().numpy().reshape(-1)[where]
                theirs = arrays[f"ema_{step}/{owner}"]
                ema_errors.append(float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-12)))

    clipper = gradient_clipper(family.config) if clip else None
    worst = replay(
        model,
        optimizer,
        scheduler,
        family.positions,
        arrays,
        steps=spec.steps,
        after_step=after_step,
        clip=clipper,
    )
    if spec.ema_tolerance is not None:
        print(f"ModelEMA: worst {max(ema_errors):.1e}")
        assert max(ema_errors) <= spec.ema_tolerance
    return worst


def check_replay(family: Family) -> None:
    """The original's gradients through ppdist's optimizer give the original's update."""
    spec = family.spec.replay
    worst = replay_error(family, spec.clip)
    print(f"optimizer replay: {worst:.1e} of the update")
    assert worst <= spec.tolerance
    if spec.unclipped_error is not None:
        unclipped = replay_error(family, clip=False)
        print(f"without the clip: {unclipped:.1e}")
        assert unclipped > spec.unclipped_error


def learning_rates(family: Family, schedule: Schedule) -> np.ndarray:
    """ppdist's LR of ``schedule`` at the steps the fixture lists."""
    config = family.config if schedule.config is None else schedule.config()
    optimizer, scheduler = build_optimizer(config, torch.nn.Linear(1, 1), schedule.steps_per_epoch)
    if schedule.lr_at is not None:
        return np.array([scheduler.schedule.lr_at(int(step)) for step in schedule.lr_at()])
    if schedule.index is None:
        steps: Sequence[int] = range(len(family.arrays[schedule.name]))
    else:
        steps = family.arrays[schedule.index]
    ours: List[float] = []
    step = 0
    for wanted in steps:
        while step < wanted:
            scheduler.step()
            step += 1
        ours.append(optimizer.param_groups[0]["lr"])
    return np.asarray(ours)


def check_schedule(family: Family, schedule: Schedule) -> None:
    """The recipe's LR schedule equals the original's to the last bit."""
    expected = family.arrays[schedule.name]
    if schedule.index is not None:
        index = family.arrays[schedule.index]
        assert len(index) == len(expected)
        assert schedule.beyond is None or index[-1] > schedule.beyond, index[-1]
    if schedule.ends is not None:
        assert (expected[0], expected[-1]) == schedule.ends, (expected[0], expected[-1])
    ours = learning_rates(family, schedule)
    assert schedule.length is None or len(ours) == schedule.length, len(ours)
    np.testing.assert_array_equal(ours, expected)
