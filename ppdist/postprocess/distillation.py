"""``DistillationCTCLabelDecode`` (PaddleOCR's): the CTC decoding of each model of a
``DistillationModel``'s output ``{model name: output}``."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Union

from ppdist.postprocess.ctc_decode import CTCLabelDecode
from ppdist.registry import POSTPROCESSES


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
        model_name: Union[str, List[str]] = "student",
        key: Optional[str] = None,
        multi_head: bool = False,
    ) -> None:
        super().__init__(character_dict_path, use_space_char)
        names = [model_name] if isinstance(model_name, str) else list(model_name)
        if not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f"model_name must be a model name or a list of them, got {model_name!r}")
        self.model_name = names
        self.key = key
        self.multi_head = multi_head

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
