"""Text recognition (CRNN, PP-OCRv3's SVTR_LCNet): the deployed module and its graph."""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Tuple

import torch
from torch import nn

from ppdist.components import build_postprocess
from ppdist.tasks.registry import GraphSpec, Task, eval_transform_size, register_task, write_lines

INPUTS, OUTPUTS = ("image",), ("probs",)
CHARACTERS_FILE = "characters.txt"


class RecDeploy(nn.Module):
    """image [N, 3, 32, W] -> softmax probabilities [N, T, C] (CTC frames)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out = self.model(image)  # CTCHead applies the softmax in eval mode
        return out[-1] if isinstance(out, (list, tuple)) else out


def build_rec_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    """A dynamic batch and width at the Eval resize's height (a batch of 1 and of 3 wider lines)."""
    height, width = eval_transform_size(config, (32, 100))
    spec = GraphSpec(
        list(INPUTS),
        list(OUTPUTS),
        {"image": {0: "batch", 3: "width"}, "probs": {0: "batch", 1: "frames"}},
        [(1, 3, height, width), (3, 3, height, width * 3 + 8)],
    )
    return RecDeploy(model).eval(), spec


def write_characters(out_dir: str, config: Mapping[str, Any], postprocess: Dict[str, Any]) -> Dict[str, Any]:
    """The dictionary written as ``characters.txt`` (without the CTC blank); the post-process reads it."""
    characters = build_postprocess(config).character[1:]
    write_lines(os.path.join(out_dir, CHARACTERS_FILE), characters)
    postprocess.update(character_dict_path=CHARACTERS_FILE, use_space_char=False)
    return {"num_characters": len(characters), "file": CHARACTERS_FILE}


TASK = register_task(
    Task(
        name="rec",
        postprocesses=("CTCLabelDecode", "DistillationCTCLabelDecode"),
        inputs=INPUTS,
        outputs=OUTPUTS,
        build_deploy=build_rec_deploy,
        label_files=write_characters,
    )
)
