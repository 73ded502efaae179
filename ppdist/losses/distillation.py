"""The distillation losses of PaddleOCR (distillation_loss.py) on a ``DistillationModel``'s outputs
``{model name: output}``: each picks its models' outputs (``key``, then the multi-head branch) and
names its terms as PaddleOCR does; ``CombinedLoss`` weights and sums them."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import nn

from ppdist.config.model_names import check_model_names
from ppdist.errors import ConfigError
from ppdist.losses.basic import DistanceLoss, DMLLoss
from ppdist.losses.ctc import CTCLoss
from ppdist.losses.precision import full_precision
from ppdist.losses.sar import PADDLE_DEFAULT_IGNORE_INDEX, SARLoss
from ppdist.registry import LOSSES

MULTI_HEAD_BRANCHES = ("ctc", "sar")


def pick(preds: Mapping[str, Any], model_name: str, key: Optional[str], branch: Optional[str] = None) -> Any:
    """``preds[model_name]``, then its ``key`` entry, then its ``branch`` (a multi-head output)."""
    out = _item(preds, model_name, "model")
    if key is not None:
        out = _item(out, key, f"{model_name}'s output")
    if branch is not None:
        out = _item(out, branch, f"{model_name}'s {key or 'output'}")
    return out


def _item(mapping: Any, name: str, what: str) -> Any:
    if not isinstance(mapping, Mapping) or name not in mapping:
        held = sorted(mapping) if isinstance(mapping, Mapping) else type(mapping).__name__
        raise KeyError(f"no {name!r} in the {what} (it holds {held})")
    return mapping[name]


def name_pairs(pairs: Any) -> List[List[str]]:
    """``model_name_pairs`` as a list of [name, name] pairs (one pair alone is accepted, as Paddle's DML)."""
    if isinstance(pairs, (list, tuple)) and len(pairs) == 2 and all(isinstance(p, str) for p in pairs):
        pairs = [pairs]
    if (
        not isinstance(pairs, (list, tuple))
        or not pairs
        or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(n, str) for n in p) for p in pairs
        )
    ):
        raise ValueError(f"model_name_pairs must be a list of [model, model] pairs, got {pairs!r}")
    return [list(p) for p in pairs]


def model_names(names: Any) -> List[str]:
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"model_name_list must be a non-empty list of model names, got {names!r}")
    return list(names)


def check_pair_names(options: Mapping[str, Any], where: str, config: Mapping[str, Any]) -> None:
    """Config validation: every name of ``model_name_pairs`` is a model of ``Architecture.Models``."""
    if "model_name_pairs" not in options:
        return
    try:
        pairs = name_pairs(options["model_name_pairs"])
    except ValueError as exc:
        raise ConfigError(f"{where}.{exc}") from None
    used = [
        (f"{where}.model_name_pairs[{i}][{j}]", name)
        for i, pair in enumerate(pairs)
        for j, name in enumerate(pair)
    ]
    check_model_names(used, config)


def check_list_names(options: Mapping[str, Any], where: str, config: Mapping[str, Any]) -> None:
    """Config validation: every name of ``model_name_list`` is a model of ``Architecture.Models``."""
    if "model_name_list" not in options:
        return
    try:
        names = model_names(options["model_name_list"])
    except ValueError as exc:
        raise ConfigError(f"{where}.{exc}") from None
    check_model_names([(f"{where}.model_name_list[{i}]", name) for i, name in enumerate(names)], config)


def _check_branch(dis_head: str) -> str:
    if dis_head not in MULTI_HEAD_BRANCHES:
        raise ValueError(f"dis_head must be one of {MULTI_HEAD_BRANCHES}, got {dis_head!r}")
    return dis_head


def check_same_shape(loss: str, key: Optional[str], names: Sequence[str], outputs: Sequence[Any]) -> None:
    """Both outputs a pair loss compares element by element have one shape, else one
    ``ConfigError`` naming the loss, the key and both shapes (a Teacher of another backbone
    scale); a shape is host metadata, nothing is read from the device."""
    shapes = [tuple(out.shape) if isinstance(out, torch.Tensor) else None for out in outputs]
    if None in shapes or shapes[0] == shapes[1]:
        return
    raise ConfigError(
        f"{loss}: {key or 'the output'!r} of {names[0]} has shape {shapes[0]} and of {names[1]} {shapes[1]}; "
        f"the loss compares them element by element: give both models outputs of one shape there "
        f"(e.g. the same Backbone scale), or remove this loss"
    )


def sum_tensors(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """``values[0] + values[1] + ...`` in order (as Paddle's running sums; the shapes may broadcast)."""
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def with_total(terms: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``terms`` plus ``loss``, their sum (PaddleOCR's ``_sum_loss``)."""
    return dict(terms, loss=sum_tensors(list(terms.values())))


@LOSSES.register(name="DistillationDMLLoss")
class DistillationDMLLoss(DMLLoss):
    """``DMLLoss`` between the outputs of each pair of ``model_name_pairs``; terms ``{name}_{i}``
    (e.g. ``dml_ctc_0``) and their sum ``loss``. With ``multi_head`` the ``dis_head`` branch
    (ctc or sar) of the ``key`` output is compared."""

    check_config = staticmethod(check_pair_names)

    def __init__(
        self,
        model_name_pairs: Sequence[Any] = (),
        act: Optional[str] = None,
        use_log: bool = False,
        key: Optional[str] = None,
        multi_head: bool = False,
        dis_head: str = "ctc",
        name: str = "dml",
    ) -> None:
        super().__init__(act=act, use_log=use_log)
        self.model_name_pairs = name_pairs(model_name_pairs)
        self.key = key
        self.dis_head = _check_branch(dis_head) if multi_head else None
        self.name = name

    @full_precision
    def forward(self, preds: Mapping[str, Any], batch: Any = None) -> Dict[str, torch.Tensor]:  # type: ignore[override]
        terms = {}
        for idx, (first, second) in enumerate(self.model_name_pairs):
            out1 = pick(preds, first, self.key, self.dis_head)
            out2 = pick(preds, second, self.key, self.dis_head)
            key = f"{self.key}.{self.dis_head}" if self.key and self.dis_head else self.key or self.dis_head
            check_same_shape(f"DistillationDMLLoss {self.name!r}", key, (first, second), (out1, out2))
            terms[f"{self.name}_{idx}"] = super().forward(out1, out2)
        return with_total(terms)


@LOSSES.register(name="DistillationDistanceLoss")
class DistillationDistanceLoss(DistanceLoss):
    """``DistanceLoss`` between the ``key`` outputs of each pair; terms
    ``{name}_l2_{first}_{second}_{i}`` (PaddleOCR appends ``_l2`` whatever the mode), no total."""

    check_config = staticmethod(check_pair_names)

    def __init__(
        self,
        mode: str = "l2",
        model_name_pairs: Sequence[Any] = (),
        key: Optional[str] = None,
        name: str = "loss_distance",
        reduction: str = "mean",
        delta: Optional[float] = None,
    ) -> None:
        super().__init__(mode=mode, reduction=reduction, delta=delta)
        self.model_name_pairs = name_pairs(model_name_pairs)
        self.key = key
        self.name = name + "_l2"

    @full_precision
    def forward(self, preds: Mapping[str, Any], batch: Any = None) -> Dict[str, torch.Tensor]:  # type: ignore[override]
        terms = {}
        for idx, (first, second) in enumerate(self.model_name_pairs):
            out1, out2 = pick(preds, first, self.key), pick(preds, second, self.key)
            check_same_shape(
                f"DistillationDistanceLoss {self.name!r}", self.key, (first, second), (out1, out2)
            )
            terms[f"{self.name}_{first}_{second}_{idx}"] = super().forward(out1, out2)
        return terms


@LOSSES.register(name="DistillationCTCLoss")
class DistillationCTCLoss(nn.Module):
    """``CTCLoss`` of each model of ``model_name_list``; terms ``{name}_{model}_{i}``, no total.
    With ``multi_head`` the ``ctc`` branch is scored against ``batch["label_ctc"]``, otherwise the
    output against ``batch["label"]``; the lengths (``batch["length"]``) stay on the host
    (``cuda_graph``: on the device, as ``CTCLoss``)."""

    host_keys = CTCLoss.host_keys

    check_config = staticmethod(check_list_names)

    def __init__(
        self,
        model_name_list: Sequence[str] = (),
        key: Optional[str] = None,
        multi_head: bool = False,
        name: str = "loss_ctc",
        cuda_graph: bool = False,
    ) -> None:
        super().__init__()
        self.model_name_list = model_names(model_name_list)
        self.key = key
        self.multi_head = multi_head
        self.name = name
        self.ctc = CTCLoss(cuda_graph=cuda_graph)
        self.host_keys = self.ctc.host_keys

    def forward(self, preds: Mapping[str, Any], batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        labels = batch["label_ctc"] if self.multi_head else batch["label"]
        terms = {}
        for idx, model_name in enumerate(self.model_name_list):
            out = pick(preds, model_name, self.key, "ctc" if self.multi_head else None)
            if isinstance(out, (list, tuple)):
                out = out[-1]
            terms[f"{self.name}_{model_name}_{idx}"] = self.ctc.score(out, labels, batch["length"])
        return terms


@LOSSES.register(name="DistillationSARLoss")
class DistillationSARLoss(nn.Module):
    """``SARLoss`` of each model of ``model_name_list``; terms ``{name}_{model}_{i}``, no total.
    With ``multi_head`` the ``sar`` branch is scored against ``batch["label_sar"]``, otherwise the
    output against ``batch["label"]``. ``ignore_index``: the padding index (CombinedLoss sets
    n + 1 from the dictionary as PaddleOCR's tools/train.py does)."""

    check_config = staticmethod(check_list_names)

    def __init__(
        self,
        model_name_list: Sequence[str] = (),
        key: Optional[str] = None,
        multi_head: bool = False,
        name: str = "loss_sar",
        ignore_index: int = PADDLE_DEFAULT_IGNORE_INDEX,
    ) -> None:
        super().__init__()
        self.model_name_list = model_names(model_name_list)
        self.key = key
        self.multi_head = multi_head
        self.name = name
        self.sar = SARLoss(ignore_index=ignore_index)

    def forward(self, preds: Mapping[str, Any], batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        labels = batch["label_sar"] if self.multi_head else batch["label"]
        return {
            f"{self.name}_{model_name}_{idx}": self.sar.score(
                pick(preds, model_name, self.key, "sar" if self.multi_head else None), labels
            )
            for idx, model_name in enumerate(self.model_name_list)
        }
