"""``DistillationCTCLabelDecode`` (PaddleOCR's): the CTC decoding of each model of a
``DistillationModel``'s output ``{model name: output}``."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Union

from ppdist.config.model_names import check_model_names
from ppdist.errors import ConfigError
from ppdist.postprocess.ctc_decode import CTCLabelDecode
from ppdist.registry import POSTPROCESSES

DEFAULT_MODEL = "student"  # PaddleOCR's default model_name


def decoded_models(model_name: Any) -> List[str]:
    """``model_name`` (a name or a list of them) as a list; ``ValueError`` for anything else."""
    names = [model_name] if isinstance(model_name, str) else model_name
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"model_name must be a model name or a list of them, got {model_name!r}")
    return list(names)


@POSTPROCESSES.register(name="DistillationCTCLabelDecode")
class DistillationCTCLabelDecode(CTCLabelDecode):
    """``{name: CTCLabelDecode results}`` for each ``model_name`` (a name or a list): the model's
    output, its ``key`` entry when set, and its ``ctc`` branch when ``multi_head`` and it is a
    mapping (training outputs; the eval output is already the CTC probabilities). ``num_classes``
    is the CTC class count, as CTCLabelDecode's."""

    def __init__(
        self,
        character_dict_path: Optional[str] = None,
        use_space_char: bool = False,
        model_name: Union[str, List[str]] = DEFAULT_MODEL,
        key: Optional[str] = None,
        multi_head: bool = False,
    ) -> None:
        super().__init__(character_dict_path, use_space_char)
        self.model_name = decoded_models(model_name)
        self.key = key
        self.multi_head = multi_head

    @staticmethod
    def check_config(options: Mapping[str, Any], where: str, config: Mapping[str, Any]) -> None:
        """Config validation: the decoded models (``model_name``, PaddleOCR's default ``student``
        when unset) are models of ``Architecture.Models``."""
        try:
            names = decoded_models(options.get("model_name", DEFAULT_MODEL))
        except ValueError as exc:
            raise ConfigError(f"{where}.{exc}") from None
        key = "model_name" if "model_name" in options else "model_name (default)"
        check_model_names(
            [(f"{where}.{key}" + (f"[{i}]" if len(names) > 1 else ""), n) for i, n in enumerate(names)],
            config,
        )

    def __call__(  # type: ignore[override]
        self, preds: Mapping[str, Any], batch: Optional[Mapping[str, Any]] = None
    ) -> Dict[str, Dict[str, Any]]:
        results = {}
        for name in self.model_name:
            if name not in preds:
                raise KeyError(
                    f"DistillationCTCLabelDecode: no model {name!r} in the predictions ({sorted(preds)})"
                )
            pred = preds[name]
            if self.key is not None:
                pred = pred[self.key]
            if self.multi_head and isinstance(pred, Mapping):
                pred = pred["ctc"]
            results[name] = super().__call__(pred, batch)
        return results
