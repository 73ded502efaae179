"""Which configs ``Global.cuda_graph`` (the captured training step, ``ppdist.engine.step_graph``)
takes, decided from the config before anything is built: each refusal is one line that names the
key and why."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ppdist.components import build_loss
from ppdist.data.build import train_input_sizes
from ppdist.errors import ConfigError

KEY = "Global.cuda_graph"


def capture_refusal(config: Mapping[str, Any]) -> Optional[str]:
    """Why ``config``'s training step cannot be captured (None: it can, or the key is off)."""
    glob = config["Global"]
    if not glob.get("cuda_graph"):
        return None
    if glob.get("compile"):
        return (
            f"{KEY} with Global.compile is not supported: the captured step's CPU form records ATen "
            f"calls, which compiled kernels bypass, so the pair cannot be checked; keep one of the two"
        )
    if glob.get("use_amp") and glob.get("amp_dtype") == "float16":
        return (
            f"{KEY} with fp16 AMP is refused: its loss scaler decides on the host whether a step is "
            f"taken; use Global.amp_dtype: bfloat16 (no loss scaling) or fp32"
        )
    if (config.get("Optimizer") or {}).get("fused") is False:
        return (
            f"{KEY} needs torch's fused optimizer (learning rate in a device tensor, step counts on the "
            f"device): remove Optimizer.fused: false"
        )
    if (glob.get("accumulate_steps") or 1) > 1:
        return f"{KEY} captures a step of one batch: Global.accumulate_steps {glob['accumulate_steps']} is refused"
    sizes = train_input_sizes(config)
    if len(sizes) > 1:
        return (
            f"{KEY}: Train.dataset.batch_transforms draw {len(sizes)} input sizes (multi-scale training), "
            f"a captured step has one shape; set {KEY}: false, or one target size"
        )
    loss = build_loss(dict(config))  # its parts say what they read on the host
    host_keys = tuple(getattr(loss, "host_keys", ()))
    if getattr(loss, "epoch_dependent", False):
        host_keys += ("epoch_id",)
    if host_keys:
        return (
            f"{KEY}: the loss {type(loss).__name__} reads {', '.join(repr(k) for k in host_keys)} of each "
            f"batch on the host, which a captured step would read once; set {KEY}: false"
        )
    return None


def check_capture_config(config: Mapping[str, Any]) -> None:
    """Raise ``ConfigError`` with ``capture_refusal``'s line."""
    refusal = capture_refusal(config)
    if refusal is not None:
        raise ConfigError(refusal)


def fused_by_default(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``Optimizer`` section, with ``fused: true`` where ``Global.cuda_graph`` is on and it is unset."""
    section = config["Optimizer"]
    if config["Global"].get("cuda_graph") and section.get("fused") is None:
        return dict(section, fused=True)
    return section
