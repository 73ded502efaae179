"""PP-OCRv3's distillation training step is PaddleOCR's: every CombinedLoss term, the heads' outputs,
the gradients of the Teacher and the Student, BatchNorm statistics, the recipe's Adam + L2 (with the
per-parameter factors) and its Piecewise warm-up LR, against tests/fixtures/paddle_step/rec_ppocrv3.npz
(written by PaddleOCR 2.7's own build_model / build_loss / build_optimizer, MultiLabelEncode and
RecResizeImg on paddlepaddle 2.6.2; make_rec_ppocrv3.py).

The config is the fixture's recipe (configs/rec/PP-OCRv3/ch_PP-OCRv3_rec_distillation.yml's
Architecture, Loss and Optimizer, checked equal here, with the fixture's 40-character dictionary and
the dropouts off); the weights are the fixture's seeded Paddle state dict (27,182,028 trainable
parameters, Paddle's count). The fixture was made in float64 and ppdist runs in float64 here too (a
forward and backward take ~4 s): float32 rounding moves a few backbone BatchNorm gradient norms by
up to 1.5e-3 on the second batch, which would hide errors of that size. Measured (torch 2.14 CPU):
head outputs 2.7e-8 relative (the fixture stores them in float32); every loss term from ppdist's
forward and on Paddle's head outputs ≤ 1.0e-7 relative (ppdist computes losses in float32); sampled
gradients ≤ 1.8e-5 relative, median 4.4e-8 (4 biases exactly 0 in both); BatchNorm statistics
1.2e-7 (stored in float32); Adam + L2 replay 1.1e-12 of the update (without the backbone
BatchNorms' L2Decay(0): 0.86; with the CTC heads' fc_decay 1e-5 replaced by 3e-5: 4.4e-5); the LR
at all 1600 steps of 800 epochs x 2 equal. In float32: outputs 9.5e-6, loss terms 4.0e-7, first
batch's gradients ≤ 3.4e-5. No Paddle is needed.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from typing import Any, Dict

import numpy as np
import paddle_step_harness as harness
import torch
import yaml
from paddle_step_testing import load_arrays

from ppdist.config import load_config

RECIPE = os.path.join(harness.ROOT, "configs", "rec", "PP-OCRv3", "ch_PP-OCRv3_rec_distillation.yml")
DROPOUTS = {"Neck": ("drop_rate", "attn_drop_rate"), "SARHead": ("enc_drop_rnn", "pred_dropout")}
MODELS = ("Teacher", "Student")
# gradients exactly zero in both: the constant they add is removed by the next softmax or BatchNorm
# (the SAR attention score's bias and the svtr neck's last LayerNorm bias)
ZERO_GRADIENTS = ("head.sar_head.decoder.conv1x1_2.bias", "head.ctc_encoder.encoder.norm.bias")
SCRIPT = harness.fixture_script("make_rec_ppocrv3.py")


@functools.lru_cache(maxsize=None)
def manifest() -> Dict[str, Any]:
    with open(SCRIPT.MANIFEST) as f:
        return json.load(f)


def paddle_state() -> harness.Arrays:
    return SCRIPT.synthetic_state(manifest()["tensors"], manifest()["seed"])


def fixture_recipe() -> Dict[str, Any]:
    """The config PaddleOCR ran, less what its tools/train.py injects (out_channels_list, SAR's
    ignore_index: ppdist derives them from the dictionary too)."""
    config = copy.deepcopy(manifest()["recipe"])
    for model in config["Architecture"]["Models"].values():
        del model["Head"]["out_channels_list"]
    del config["Loss"]["loss_config_list"][-1]["DistillationSARLoss"]["ignore_index"]
    return config


def config(family: harness.Family) -> harness.Config:
    """ppdist's config of the fixture's recipe (the shipped recipe's sections and the fixture's
    dictionary, dropouts off) with the recipe's Global.epoch_num, Metric and data sections."""
    raw = fixture_recipe()
    raw["Global"].update(character_dict_path=SCRIPT.DICTIONARY, epoch_num=SCRIPT.EPOCHS)
    raw["Metric"] = {
        "name": "DistillationMetric",
        "base_metric_name": "RecMetric",
        "main_indicator": "acc",
        "key": "Student",
    }
    transforms = [
        {"DecodeImage": {"img_mode": "BGR", "channel_first": False}},
        {"MultiLabelEncode": None},
        {"RecResizeImg": {"image_shape": [3, 48, 320]}},
        {"KeepKeys": {"keep_keys": ["image", "label_ctc", "label_sar", "length", "valid_ratio"]}},
    ]
    for split in ("Train", "Eval"):
        raw[split] = {
            "dataset": {
                "name": "SimpleDataSet",
                "data_dir": ".",
                "label_file_list": ["labels.txt"],
                "transforms": transforms,
            },
            "loader": {"batch_size_per_card": SCRIPT.BATCH, "shuffle": split == "Train", "num_workers": 0},
        }
    path = family.scratch / "recipe.yml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return load_config(str(path))


def batch_of(arrays: harness.Arrays, step: int) -> Dict[str, torch.Tensor]:
    """The fixture's batch ``step`` as ppdist's loader gives it (float32 valid ratio), its image in
    float64 (the model's dtype here)."""
    images = [SCRIPT.normalize(p, w) for p, w in zip(arrays[f"image_{step}"], arrays[f"width_{step}"])]
    batch = {"image": torch.from_numpy(np.stack(images)).double()}
    for key in ("label_ctc", "label_sar", "length"):
        batch[key] = torch.from_numpy(arrays[f"{key}_{step}"])
    batch["valid_ratio"] = torch.from_numpy(arrays[f"valid_ratio_{step}"]).float()
    return batch


def batch(family: harness.Family, variant: harness.Variant) -> harness.Batch:
    inputs = batch_of(family.arrays, 1)
    return inputs, inputs


def paddle_terms(arrays: harness.Arrays, step: int) -> Dict[str, float]:
    prefix = f"loss_{step}/"
    return {key[len(prefix) :]: float(value) for key, value in arrays.items() if key.startswith(prefix)}


def forward(family: harness.Family, run: harness.StepRun) -> harness.Comparison:
    """Both models' CTC and SAR head outputs, and every CombinedLoss term under Paddle's names."""
    compared = harness.Comparison()
    for name in MODELS:
        head = run.outputs[name]["head_out"]
        for key in ("ctc", "sar"):
            compared.arrays[f"{key}/{name}"] = (head[key], family.arrays[f"{key}_1/{name}"])
    theirs = paddle_terms(family.arrays, 1)
    ours = {key: float(value.detach()) for key, value in run.losses.items()}
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))  # Paddle's term names
    compared.values = {key: (ours[key], value) for key, value in theirs.items()}
    return compared


def teacher(family: harness.Family, run: harness.StepRun) -> Dict[str, harness.Pair]:
    """The loss alone: ppdist's CombinedLoss on PaddleOCR's head outputs (the backbone features of
    the L2 term are ppdist's own, checked by ``forward``)."""
    preds = {}
    for name in MODELS:
        ours = run.outputs[name]
        head = dict(ours["head_out"])
        head["ctc"] = torch.from_numpy(family.arrays[f"ctc_1/{name}"]).double()
        head["sar"] = torch.from_numpy(family.arrays[f"sar_1/{name}"]).double()
        preds[name] = dict(ours, head_out=head, backbone_out=ours["backbone_out"].detach())
    ours = {k: float(v) for k, v in run.loss_fn(preds, batch_of(family.arrays, 1)).items()}
    return {key: (ours[key], value) for key, value in paddle_terms(family.arrays, 1).items()}


def the_shipped_recipe_is_the_one_paddleocr_ran(family: harness.Family) -> None:
    """Architecture (but the dropouts), Loss and Optimizer of configs/rec/PP-OCRv3's recipe are the
    fixture's, less what PaddleOCR's tools/train.py injects (out_channels_list, SAR's ignore_index)."""
    with open(RECIPE, encoding="utf-8") as f:
        ours = yaml.safe_load(f)
    theirs = fixture_recipe()
    for name in MODELS:
        model = theirs["Architecture"]["Models"][name]
        for entry in model["Head"]["head_list"]:
            ((head, settings),) = entry.items()
            for key in DROPOUTS["Neck" if head == "CTCHead" else head]:
                del (settings["Neck"] if head == "CTCHead" else settings)[key]
        assert {k: v for k, v in ours["Architecture"]["Models"][name].items() if k != "pretrained"} == model
    assert ours["Loss"] == theirs["Loss"]
    assert ours["Optimizer"] == theirs["Optimizer"]


SPEC = harness.StepSpec(
    name="ppocrv3",
    fixture=lambda: SCRIPT.unpack(load_arrays(SCRIPT.FIXTURE)),
    paddle_state=paddle_state,
    config=config,
    base_dtype=torch.float64,  # 27M parameters: float32 cannot hold the sampled indices
    variants=(
        harness.Variant(
            "float64",
            torch.float64,
            harness.Tolerance(outputs=1e-6, loss=1e-6, gradients=1e-4, statistics=1e-6),
        ),
    ),
    batch=batch,
    forward=forward,
    teacher=teacher,
    teacher_tolerance=1e-6,
    zero_gradients=harness.ZeroGradients(
        paddle_names=tuple(f"{name}.{key}" for name in MODELS for key in ZERO_GRADIENTS)
    ),
    # two steps: LR 0 (the warm-up's first), then 5e-5; L2 3e-5, CTC heads' fc_decay 1e-5, the
    # backbone BatchNorms' L2Decay(0)
    replay=harness.Replay(tolerance=1e-9, steps_per_epoch=SCRIPT.STEPS_PER_EPOCH),
    schedules=(
        harness.Schedule("schedule_lr", steps_per_epoch=SCRIPT.STEPS_PER_EPOCH),
    ),  # Piecewise + warm-up
    checks=(the_shipped_recipe_is_the_one_paddleocr_ran,),
    slow=frozenset({"forward"}),
)
