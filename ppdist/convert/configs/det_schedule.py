"""PaddleDetection's schedule (``OptimizerBuilder`` and ``LearningRate``: Momentum / SGD / Adam /
AdamW, L2, clipping, PiecewiseDecay / CosineDecay / ... with LinearWarmup) -> ppdist's Optimizer
section; the same for every PaddleDetection family."""

from __future__ import annotations

from typing import Any, Dict

from ppdist.convert.configs.common import Keys, Report
from ppdist.errors import ConfigError


def convert_det_optimizer(top: Keys, report: Report, path: str) -> Dict[str, Any]:
    """PaddleDetection's ``OptimizerBuilder`` (optimizer, regularizer, clip_grad_by_norm) and
    ``LearningRate`` (schedulers and warm-up) -> ppdist's Optimizer section."""
    builder = top.sub("OptimizerBuilder")
    opt_cfg = Keys(
        builder.get("optimizer", {"type": "Momentum", "momentum": 0.9}),
        "OptimizerBuilder.optimizer",
        report,
    )
    kind = opt_cfg.get("type")
    out: Dict[str, Any]
    if kind in ("Momentum", "SGD"):
        out = {"name": kind}
        if kind == "Momentum":
            out["momentum"] = float(opt_cfg.get("momentum", 0.9))
        if opt_cfg.get("use_nesterov"):
            out["use_nesterov"] = True
    elif kind in ("Adam", "AdamW"):
        out = {"name": kind}
        for key in ("beta1", "beta2", "epsilon"):
            if key in opt_cfg:
                out[key] = float(opt_cfg.get(key))
        if kind == "AdamW":
            out["weight_decay"] = float(opt_cfg.get("weight_decay", 0.01))
    else:
        raise ConfigError(
            f"{path}: OptimizerBuilder.optimizer.type {kind!r} is not supported (Momentum, SGD, Adam, AdamW)"
        )
    opt_cfg.skip("param_groups", "per-group optimizer settings are not supported")
    opt_cfg.expect("multi_precision", False, "master weights are handled by AMP's GradScaler")
    opt_cfg.finish()
    reg = builder.get("regularizer", {"type": "L2", "factor": 0.0001})
    if reg and reg != "None":
        reg_keys = Keys(reg, "OptimizerBuilder.regularizer", report)
        if kind == "AdamW":
            report.unmapped_key(
                "OptimizerBuilder.regularizer",
                "ignored for AdamW by PaddleDetection too (AdamW uses its weight_decay)",
                reg,
                show_value=True,
            )
            reg_keys.used.update(reg_keys.data)
        elif reg_keys.get("type") != "L2":
            report.unmapped_key(
                "OptimizerBuilder.regularizer.type", "ppdist has L2 only", reg_keys.get("type")
            )
        else:
            out["regularizer"] = {"name": "L2", "factor": float(reg_keys.get("factor", 0.0001))}
        reg_keys.finish()
    if builder.get("clip_grad_by_norm") is not None:
        out["clip_norm_global"] = float(builder.get("clip_grad_by_norm"))
    builder.skip("clip_grad_by_value", "ppdist clips by norm only")
    builder.finish()
    out["lr"] = _learning_rate(top, report, path)
    return out


def _learning_rate(top: Keys, report: Report, path: str) -> Dict[str, Any]:
    sec = top.sub("LearningRate")
    base_lr = float(sec.get("base_lr", 0.01))
    schedulers = sec.get("schedulers")
    if schedulers is None:
        schedulers = [{"name": "PiecewiseDecay"}, {"name": "LinearWarmup"}]
    sec.finish()
    if not isinstance(schedulers, list) or not schedulers:
        raise ConfigError(f"{path}: LearningRate.schedulers must be a non-empty list")
    decay = Keys(schedulers[0], "LearningRate.schedulers[0]", report)
    name = decay.get("name")
    use_warmup = decay.get("use_warmup", True)
    if name == "CosineDecay":
        out: Dict[str, Any] = {
            "name": "CosineDecay",
            "learning_rate": base_lr,
            "max_epochs": int(decay.get("max_epochs", 1000)),
        }
        decay.expect("min_lr_ratio", 0.0, "ppdist's CosineDecay anneals to 0")
        decay.expect("last_plateau_epochs", 0, "no final plateau in ppdist's CosineDecay")
    elif name == "PiecewiseDecay":
        milestones = list(decay.get("milestones", [8, 11]))
        values = decay.get("values")
        if values is None:
            gamma = decay.get("gamma", [0.1, 0.01])
            gammas = gamma if isinstance(gamma, list) else [gamma / 10**i for i in range(len(milestones))]
            values = [base_lr] + [base_lr * g for g in gammas]
        unit = "decay_iters" if "max_iters" in top else "decay_epochs"  # static-era milestones: iterations
        out = {"name": "Piecewise", unit: milestones, "values": [float(v) for v in values]}
    else:
        raise ConfigError(
            f"{path}: LearningRate scheduler {name!r} is not supported (CosineDecay, "
            f"PiecewiseDecay, with LinearWarmup)"
        )
    decay.finish()
    if use_warmup and len(schedulers) > 1:
        _warmup(report, path, Keys(schedulers[1], "LearningRate.schedulers[1]", report), out, base_lr)
    for i, extra in enumerate(schedulers[2:], start=2):
        report.unmapped_key(
            f"LearningRate.schedulers[{i}]",
            "PaddleDetection uses only the first two schedulers (decay, warmup)",
            extra,
        )
    return out


def _warmup(report: Report, path: str, sec: Keys, out: Dict[str, Any], base_lr: float) -> None:
    name = sec.get("name")
    if name != "LinearWarmup":
        report.unmapped_key(
            "LearningRate.schedulers[1]",
            "ppdist warms up linearly only (LinearWarmup); no warmup converted",
            sec.data,
        )
        sec.used.update(sec.data)
        return
    epochs = sec.get("epochs")
    steps = int(sec.get("steps", 500))
    start = float(sec.get("start_factor", 1.0 / 3))
    sec.expect("epochs_first", True, "warmup epochs always take priority over steps in ppdist")
    sec.finish()
    if out["name"] == "Piecewise":
        out["boundaries_after_warmup"] = False  # PaddleDetection's milestones count from step 0
    if epochs is not None:
        out["warmup_epoch"] = epochs
    elif steps:
        out["warmup_iters"] = steps
    out["warmup_start_lr"] = base_lr * start


# ------------------------------------------------------------------ data
