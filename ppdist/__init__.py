"""ppdist: PaddleOCR / PaddleDetection / PaddleSeg training on PyTorch with one distributed trainer."""

from typing import Any, Dict, Optional, Sequence

__version__ = "0.1.0"


def load_config(path: str, overrides: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The resolved, validated config of ``path`` with ``-o`` style ``overrides`` applied."""
    from ppdist.config import load_config as _load

    return _load(path, overrides)


def build_model(config: Dict[str, Any]) -> Any:
    """The ``torch.nn.Module`` described by a (resolved) config."""
    from ppdist.builder import build_model as _build

    return _build(config)


__all__ = ["load_config", "build_model", "__version__"]
