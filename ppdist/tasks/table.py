"""Table structure recognition (SLANet): the deployed module and its graph."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Tuple

import torch
from torch import nn

from ppdist.components import build_postprocess
from ppdist.tasks.registry import GraphSpec, Task, register_task, write_lines

INPUTS, OUTPUTS = ("image",), ("structure_probs", "loc_preds")
STRUCTURE_FILE = "structure_tokens.txt"


class TableDeploy(nn.Module):
    """image [N, 3, H, W] (PaddingTableImage's size) -> ``structure_probs`` [N, L, C] (softmax) and
    ``loc_preds`` [N, L, R] (normalised boxes), L = max_text_length + 1: SLANet's eval forward. The
    backbone and neck are traced; the head's greedy decode (``SLAHead.decoder``) is scripted, so the
    exported graphs keep its steps as one loop (``graph_export`` traces before the ONNX export)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.backbone = model.backbone
        self.neck = model.neck
        self.flat_features = model.head.flat_features  # no parameters: (B, C, H, W) -> (B, H*W, C)
        self.decode = torch.jit.script(model.head.decoder())

    def forward(self, image: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        feats = self.backbone(image)
        feats = feats if self.neck is None else self.neck(feats)
        return self.decode(self.flat_features(feats))


def table_input_size(config: Mapping[str, Any]) -> List[int]:
    """[H, W] of the Eval ``PaddingTableImage.size`` (every image is padded to it), else 488x488."""
    for entry in (config.get("Eval") or {}).get("dataset", {}).get("transforms", []) or []:
        if isinstance(entry, Mapping) and "PaddingTableImage" in entry:
            return [int(v) for v in (entry["PaddingTableImage"] or {}).get("size", (488, 488))]
    return [488, 488]


def build_table_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    """A fixed image size (the padded one), a dynamic batch."""
    height, width = table_input_size(config)
    axes = {name: {0: "batch"} for name in INPUTS + OUTPUTS}
    spec = GraphSpec(list(INPUTS), list(OUTPUTS), axes, [(1, 3, height, width), (2, 3, height, width)])
    return TableDeploy(model).eval(), spec


def write_structure_tokens(
    out_dir: str, config: Mapping[str, Any], postprocess: Dict[str, Any]
) -> Dict[str, Any]:
    """The structure tokens as ``TableLabelDecode`` holds them (``merge_no_span_structure`` applied,
    without ``sos`` / ``eos``) written as ``structure_tokens.txt``: read back with the same setting,
    they give the same classes."""
    classes = build_postprocess(config).character
    write_lines(os.path.join(out_dir, STRUCTURE_FILE), classes[1:-1])
    postprocess.update(character_dict_path=STRUCTURE_FILE)
    return {"num_classes": len(classes), "file": STRUCTURE_FILE}


TASK = register_task(
    Task(
        name="table",
        postprocesses=("TableLabelDecode",),
        inputs=INPUTS,
        outputs=OUTPUTS,
        build_deploy=build_table_deploy,
        label_files=write_structure_tokens,
    )
)
