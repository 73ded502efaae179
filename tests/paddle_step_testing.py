"""The numerics of the step-equivalence harness (tests/paddle_step_harness.py) against the
fixtures of tests/fixtures/paddle_step/, which the original training code wrote: sampled
gradients, BatchNorm statistics and the optimizer replay, all by Paddle parameter name."""

from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

import numpy as np
import torch

from ppdist.convert.weights import convert_state_dict

Positions = Dict[str, Tuple[str, np.ndarray]]


def load_arrays(path: str) -> Dict[str, np.ndarray]:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def relative(ours: np.ndarray, theirs: np.ndarray) -> float:
    """||ours - theirs|| / ||theirs||."""
    return float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))


def to_torch(model: torch.nn.Module, state: Dict[str, np.ndarray]) -> Dict[str, torch.Tensor]:
    """ppdist's state dict for ``model`` from a complete Paddle state dict."""
    converted, report = convert_state_dict(model, state, "fixture")
    assert report.complete and not report.missing, report.lines()
    return converted


def trainable_parameters(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Parameter]]:
    """``(name, parameter)`` of the parameters that train (a frozen backbone stage's do not: the
    original's fixture holds gradients of its trainable parameters only)."""
    return [(key, p) for key, p in model.named_parameters() if p.requires_grad]


def sample_positions(
    model: torch.nn.Module, state: Dict[str, np.ndarray], fixture: Dict[str, np.ndarray]
) -> Positions:
    """torch parameter -> (Paddle name, its flat positions of the fixture's sampled indices), found
    by converting a state whose entries are their own global index (Linear weights transpose; the
    model's dtype holds the indices exactly: < 2**24 values in float32, < 2**53 in float64)."""
    tagged, offsets, offset = dict(state), {}, 0  # untagged: frozen constants keep their values
    for name, value in state.items():
        if f"grad_index/{name}" not in fixture:
            continue
        tagged[name] = np.arange(offset + 1, offset + 1 + value.size, dtype=np.float64).reshape(value.shape)
        offsets[name] = offset
        offset += value.size
    assert offset < (2**53 if next(model.parameters()).dtype == torch.float64 else 2**24), offset
    converted = to_torch(model, tagged)
    starts = sorted((o, n) for n, o in offsets.items())
    keys = [o for o, _ in starts]
    positions = {}
    for key, _ in trainable_parameters(model):
        flat = converted[key].numpy().reshape(-1).astype(np.int64) - 1
        owner = starts[int(np.searchsorted(keys, flat.min(), side="right")) - 1][1]
        where = np.empty(flat.size, dtype=np.int64)
        where[flat - offsets[owner]] = np.arange(flat.size)
        positions[key] = (owner, where[fixture[f"grad_index/{owner}"]])
    return positions


def gradient_errors(
    model: torch.nn.Module,
    positions: Positions,
    fixture: Dict[str, np.ndarray],
    step: int = 1,
    norm_tolerance: float = 1e-3,
) -> Tuple[Dict[str, float], List[str]]:
    """Relative error of every parameter's sampled gradient entries (checking full norms to
    ``norm_tolerance`` relative on the way), and the parameters whose gradient is 0 in exact
    arithmetic (norm ≤ 1e-10 of the total in the fixture; checked to be ≤ 1e-6 of it in ppdist:
    rounding noise)."""
    norms = {key: float(fixture[f"grad_norm_{step}/{owner}"]) for key, (owner, _) in positions.items()}
    total = float(np.sqrt(sum(n * n for n in norms.values())))
    errors, zero = {}, []
    for key, p in trainable_parameters(model):
        owner, where = positions[key]
        ours = p.grad.double().numpy().reshape(-1)
        if norms[key] <= 1e-10 * total:
            zero.append(key)
            assert np.linalg.norm(ours) <= 1e-6 * total, key
            continue
        errors[key] = relative(ours[where], fixture[f"grad_{step}/{owner}"])
        assert abs(np.linalg.norm(ours) - norms[key]) <= norm_tolerance * norms[key], key
    return errors, zero


def batch_norm_errors(
    model: torch.nn.Module,
    expected: Dict[str, torch.Tensor],
    names: Iterable[str] = ("running_mean", "running_var"),
) -> Dict[str, float]:
    """Max abs difference of each BatchNorm statistic over the max magnitude of the expected one."""
    errors = {}
    for key, buffer in model.state_dict().items():
        if key.rpartition(".")[2] in names:
            ours, theirs = buffer.double().numpy(), expected[key].double().numpy()
            errors[key] = float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-12))
    return errors


def gradient_with_full_norm(grad: torch.Tensor, where: np.ndarray, norm: float) -> None:
    """Give a flat gradient holding only its sampled entries (``where``) the full gradient's
    ``norm`` by filling its first unsampled entry, so that a per-tensor norm clip scales it as it
    scaled the original (the entry's own update is never compared)."""
    if len(where) == grad.numel():
        return
    free = int(np.setdiff1d(np.arange(len(where) + 1), where)[0])
    rest = norm**2 - float(grad.double().square().sum())
    assert rest >= -1e-9 * norm**2, (norm, rest)
    grad[free] = max(rest, 0.0) ** 0.5


def replay(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    positions: Positions,
    fixture: Dict[str, np.ndarray],
    steps: int = 2,
    after_step=None,
    clip=None,
) -> float:
    """Feed the fixture's gradients (at the sampled entries, zero elsewhere: the updates are
    element-wise) to ``optimizer`` for ``steps`` steps; the worst difference of a step's update
    (new - old parameter at the sampled entries) from the original's, relative to the largest
    update of that parameter. ``model`` should be float64, as the fixtures are: an update can be
    1e-7 of the parameter. ``after_step(step)`` runs after each step. ``clip(model)`` (a per-tensor
    norm clip) runs before each optimizer step, on gradients given the fixture's full norms
    (``gradient_with_full_norm``)."""
    worst = 0.0
    old = {
        key: p.detach().double().numpy().reshape(-1)[positions[key][1]]
        for key, p in trainable_parameters(model)
    }
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            assert group["lr"] == float(fixture[f"lr_{step}"]) * group.get("lr_mult", 1.0), step
        for key, p in trainable_parameters(model):
            owner, where = positions[key]
            grad = torch.zeros(p.numel(), dtype=p.dtype)
            grad[torch.from_numpy(where)] = torch.from_numpy(fixture[f"grad_{step}/{owner}"]).to(p.dtype)
            if clip is not None:
                gradient_with_full_norm(grad, where, float(fixture[f"grad_norm_{step}/{owner}"]))
            p.grad = grad.reshape(p.shape)
        if clip is not None:
            clip(model)
        optimizer.step()
        scheduler.step()
        if after_step is not None:
            after_step(step)
        for key, p in trainable_parameters(model):
            owner, where = positions[key]
            ours = p.detach().double().numpy().reshape(-1)[where]
            theirs = fixture[f"param_{step}/{owner}"]
            update = theirs - old[key]
            scale = np.abs(update).max()
            error = np.abs((ours - old[key]) - update).max()
            worst = max(worst, float(error / scale) if scale > 0 else float(error > 0))
            old[key] = theirs
    return worst
