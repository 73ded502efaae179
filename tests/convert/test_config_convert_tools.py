"""tools/convert_paddle_config.py, and tools/train.py started directly on Paddle configs."""

import os

import pytest
import yaml
from ppdist_testing import HANG_TIMEOUT_S, REPO, check_ok, run_tool

from ppdist import load_config

FIXTURES = os.path.join(REPO, "tests", "fixtures", "paddle_configs")
DET_S = os.path.join(FIXTURES, "PaddleDetection", "configs", "ppyoloe", "ppyoloe_crn_s_300e_coco.yml")
PPYOLOE_CRN = os.path.join(FIXTURES, "PaddleDetection", "configs", "ppyoloe", "_base_", "ppyoloe_crn.yml")


@pytest.mark.slow
def test_tool_prints_the_config_and_lists_unmapped_keys(tmp_path):
    result = check_ok(run_tool(["convert_paddle_config.py", "-c", DET_S]))
    assert result.stdout.startswith("# Converted from the PaddleDetection config")
    config = yaml.safe_load(result.stdout)
    assert config["Global"]["epoch_num"] == 300 and config["Architecture"]["Backbone"]["name"] == "CSPResNet"
    assert "not converted: pretrain_weights" in result.stderr and "warning" not in result.stderr
    out = tmp_path / "sub" / "ppyoloe_s.yml"
    check_ok(
        run_tool(["convert_paddle_config.py", "-c", DET_S, "--out", str(out), "-o", "Global.epoch_num=12"])
    )
    assert load_config(str(out))["Global"]["width_mult"] == 0.5
    assert load_config(str(out))["Global"]["epoch_num"] == 12  # -o: ppdist key paths, on the converted config


def test_tool_bad_input_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("architecture: MaskRCNN\nepoch: 12\n")
    result = run_tool(["convert_paddle_config.py", "-c", str(bad)])
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "MaskRCNN" in result.stderr


def _check_run(result, save_dir, unmapped):
    check_ok(result)
    assert os.path.isfile(os.path.join(save_dir, "config.yml"))
    converted = os.path.join(save_dir, "converted_config.yml")
    text = open(converted, encoding="utf-8").read()
    assert text.startswith("# Converted from the") and unmapped in text
    assert f"not converted: {unmapped}" in result.stdout + result.stderr  # logged as a warning
    load_config(converted)  # the saved file is a ppdist config


@pytest.mark.slow
def test_train_on_a_paddleseg_config(tmp_path):
    from ppdist.data.synthetic_seg import generate_seg_dataset

    data = str(tmp_path / "seg")
    generate_seg_dataset(data, num_train=8, num_val=2, seed=1, image_size=64, num_classes=3)
    (tmp_path / "base.yml").write_text(f"""
batch_size: 2
iters: 100
train_dataset:
  type: Dataset
  dataset_root: {data}
  train_path: {data}/train.txt
  num_classes: 3
  transforms:
    - type: RandomPaddingCrop
      crop_size: [64, 64]
    - type: RandomHorizontalFlip
    - type: Normalize
  mode: train
val_dataset:
  type: Dataset
  dataset_root: {data}
  val_path: {data}/val.txt
  num_classes: 3
  transforms:
    - type: Normalize
  mode: val
optimizer: {{type: SGD, momentum: 0.9, weight_decay: 4.0e-5}}
lr_scheduler: {{type: PolynomialDecay, learning_rate: 0.01, end_lr: 0, power: 0.9}}
loss:
  types: [{{type: CrossEntropyLoss}}]
  coef: [1]
""")
    (tmp_path / "pp_liteseg_tiny.yml").write_text("""
_base_: base.yml
batch_size: 4
iters: 2
model:
  type: PPLiteSeg
  backbone: {type: STDC1, base: 16, pretrained: https://example.invalid/PP_STDCNet1.tar.gz}
  arm_out_chs: [16, 16, 32]
  seg_head_inter_chs: [16, 16, 16]
  cm_out_ch: 32
loss:
  types: [{type: OhemCrossEntropyLoss, min_kept: 1000}]
  coef: [1, 0.4, 0.4]
""")
    save = str(tmp_path / "out")
    result = run_tool(
        [
            "train.py",
            "-c",
            str(tmp_path / "pp_liteseg_tiny.yml"),
            "-o",
            f"Global.save_model_dir={save}",
            "Global.use_gpu=false",
            "Global.use_sync_bn=false",
            "Train.loader.num_workers=0",
            "Eval.loader.num_workers=0",
            "Global.print_batch_step=1",
        ],
        timeout=HANG_TIMEOUT_S,
    )
    _check_run(result, save, "model.backbone.pretrained")
    assert load_config(os.path.join(save, "config.yml"))["Global"]["max_iters"] == 2


@pytest.mark.slow
def test_train_on_a_paddledetection_config(tmp_path):
    from ppdist.data.synthetic_det import generate_det_dataset

    data = str(tmp_path / "det")
    generate_det_dataset(data, num_train=8, num_val=2, seed=1, image_size=64, num_classes=2, max_objects=2)
    norm = "{mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], is_scale: True}"
    (tmp_path / "ppyoloe_tiny.yml").write_text(f"""
_BASE_: ['{PPYOLOE_CRN}']
epoch: 1
num_classes: 2
width_mult: 0.25
depth_mult: 0.33
worker_num: 0
log_iter: 1
snapshot_epoch: 1
use_gpu: false
metric: COCO
LearningRate:
  base_lr: 0.01
  schedulers: [{{name: CosineDecay, max_epochs: 2}}, {{name: LinearWarmup, start_factor: 0., steps: 1}}]
OptimizerBuilder:
  optimizer: {{momentum: 0.9, type: Momentum}}
  regularizer: {{factor: 0.0005, type: L2}}
TrainDataset: {{name: COCODataSet, dataset_dir: {data}, image_dir: images/train,
                anno_path: annotations/instances_train.json, data_fields: [image, gt_bbox, gt_class, is_crowd]}}
EvalDataset: {{name: COCODataSet, dataset_dir: {data}, image_dir: images/val,
               anno_path: annotations/instances_val.json, allow_empty: true}}
TrainReader:
  sample_transforms: [{{Decode: {{}}}}, {{RandomFlip: {{}}}}, {{Mosaic: {{prob: 1.0}}}}]
  batch_transforms:
    - BatchRandomResize: {{target_size: [64], random_size: True, keep_ratio: False}}
    - NormalizeImage: {norm}
    - Permute: {{}}
    - PadGT: {{}}
  batch_size: 4
EvalReader:
  sample_transforms:
    - Decode: {{}}
    - Resize: {{target_size: [64, 64], keep_ratio: False, interp: 2}}
    - NormalizeImage: {norm}
    - Permute: {{}}
  batch_size: 2
""")
    save = str(tmp_path / "out")
    result = run_tool(
        [
            "train.py",
            "-c",
            str(tmp_path / "ppyoloe_tiny.yml"),
            "-o",
            f"Global.save_model_dir={save}",
            "Global.use_sync_bn=false",
        ],
        timeout=HANG_TIMEOUT_S,
    )
    _check_run(result, save, "TrainReader.sample_transforms[2].Mosaic")
