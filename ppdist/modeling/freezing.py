"""Frozen stages for fine-tuning: the first units of a backbone (its stem, then its stages) keep
their weights and their BatchNorm statistics.

Two spellings of one setting, as the backbones accept them: mmdetection's ``frozen_stages``
(-1 nothing, 0 the stem, k the stem and the first k stages) and PaddleDetection's ``freeze_at``
(the index of the last frozen stage, stem included; -1 nothing), so ``freeze_at = k`` is
``frozen_stages = k + 1``. ``freeze_norm`` (PaddleDetection's) also freezes every normalisation
layer of the backbone: affine parameters not trained, running statistics used, not updated.

A frozen unit's parameters get ``requires_grad = False`` (so the optimizer, which takes trainable
parameters only, and DDP leave them alone) and the unit stays in eval mode whatever
``model.train()`` says: ``FreezableBackbone.train`` re-applies it after every call, and finds the
units through their containers, so BatchNorms replaced later (SyncBatchNorm conversion) are
covered too. ``frozen_state_names`` lists every tensor training never changes, which the EMA
copies instead of averaging (the bias-corrected average of a constant is not exactly it).
"""

from __future__ import annotations

import logging
from typing import Iterator, List, Optional, Sequence, Set

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

logger = logging.getLogger("ppdist")
Unit = Sequence[nn.Module]  # the modules of a stem or a stage


def frozen_unit_count(freeze_at: Optional[int], frozen_stages: Optional[int], num_stages: int) -> int:
    """How many leading units (the stem, then the stages) ``freeze_at`` / ``frozen_stages`` freeze."""
    if freeze_at is not None and frozen_stages is not None:
        raise ValueError(
            f"give freeze_at (PaddleDetection's: last frozen stage) or frozen_stages (mmdetection's: "
            f"stem + that many stages), not both (got {freeze_at} and {frozen_stages})"
        )
    if freeze_at is not None:
        if not isinstance(freeze_at, int) or isinstance(freeze_at, bool) or not -1 <= freeze_at < num_stages:
            raise ValueError(f"freeze_at must be an int in [-1, {num_stages - 1}], got {freeze_at!r}")
        frozen_stages = freeze_at + 1 if freeze_at >= 0 else -1
    if frozen_stages is None:
        return 0
    if (
        not isinstance(frozen_stages, int)
        or isinstance(frozen_stages, bool)
        or not -1 <= frozen_stages <= num_stages
    ):
        raise ValueError(f"frozen_stages must be an int in [-1, {num_stages}], got {frozen_stages!r}")
    return frozen_stages + 1


class FreezableBackbone(nn.Module):
    """Base of the backbones that can freeze their first units; call ``freeze`` at the end of
    ``__init__``, after the weights are initialised."""

    def freeze(
        self,
        units: Sequence[Unit],
        freeze_at: Optional[int] = None,
        frozen_stages: Optional[int] = None,
        freeze_norm: bool = False,
    ) -> None:
        """Freeze the first units of ``units`` (``[stem, stage 1, ...]``) as the settings say."""
        count = frozen_unit_count(freeze_at, frozen_stages, len(units) - 1)
        self._frozen_units: List[Unit] = [list(unit) for unit in units[:count]]
        self._freeze_norm = bool(freeze_norm)
        for unit in self._frozen_units:
            for module in unit:
                module.requires_grad_(False)
        if self._freeze_norm:
            for module in self.modules():
                if isinstance(module, _BatchNorm):
                    module.requires_grad_(False)
        if count or self._freeze_norm:
            self._log_frozen(count)
        self.train(self.training)

    def _log_frozen(self, count: int) -> None:
        """One line at build time: what is frozen, by module name, and how many parameters."""
        names = {id(module): name for name, module in self.named_modules()}
        units = [
            ("the stem" if i == 0 else f"stage {i}") + f" ({', '.join(names[id(m)] for m in unit)})"
            for i, unit in enumerate(self._frozen_units)
        ]
        if self._freeze_norm:
            units.append("every BatchNorm (freeze_norm)")
        frozen = sum(p.numel() for p in self.parameters() if not p.requires_grad)
        total = sum(p.numel() for p in self.parameters())
        logger.info(
            "%s: frozen %s: %s of its %s parameters",
            type(self).__name__,
            "; ".join(units),
            f"{frozen:,}",
            f"{total:,}",
        )

    def frozen_modules(self) -> Iterator[nn.Module]:
        """The modules held in eval mode: the frozen units (not their submodules) and, with
        ``freeze_norm``, every BatchNorm (SyncBatchNorm conversions included: found anew)."""
        for unit in getattr(self, "_frozen_units", []):
            yield from unit
        if getattr(self, "_freeze_norm", False):
            yield from (module for module in self.modules() if isinstance(module, _BatchNorm))

    def train(self, mode: bool = True) -> "FreezableBackbone":
        super().train(mode)
        for module in self.frozen_modules():
            module.eval()
        return self


def frozen_state_names(model: nn.Module) -> Set[str]:
    """The state-dict names of ``model`` that training never changes: parameters not trained
    (``requires_grad`` False) and every tensor of the frozen modules of its backbones (BatchNorm
    running statistics included). The EMA copies them instead of averaging them."""
    names = {name for name, param in model.named_parameters() if not param.requires_grad}
    frozen = {
        id(sub)
        for module in model.modules()
        if isinstance(module, FreezableBackbone)
        for top in module.frozen_modules()
        for sub in top.modules()
    }
    for prefix, module in model.named_modules():
        if id(module) in frozen:
            tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
            names.update(f"{prefix}.{name}" if prefix else name for name, _ in tensors)
    return names
