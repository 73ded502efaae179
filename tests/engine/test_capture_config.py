"""Which configs ``Global.cuda_graph`` takes: each refusal is one line naming the key and why,
before anything is built."""

import os

import pytest
from ppdist_testing import REPO

from ppdist.components import build_loss
from ppdist.config import load_config
from ppdist.engine.capture_config import capture_refusal, fused_by_default
from ppdist.engine.dist import DistEnv
from ppdist.engine.setup import build_trainer
from ppdist.errors import ConfigError


def config_path(*parts):
    return os.path.join(REPO, "configs", *parts)


SEG = config_path("seg", "pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml")
ON = "Global.cuda_graph=true"


def refusal(path, *overrides):
    return capture_refusal(load_config(path, [ON, *overrides]))


BF16 = ["Global.use_amp=true", "Global.amp_dtype=bfloat16"]


@pytest.mark.parametrize(
    "path, overrides",
    [
        (SEG, []),
        (SEG, BF16),
        (config_path("seg", "ocrnet_hrnetw18_cityscapes_1024x512_160k.yml"), BF16),
        (config_path("seg", "segformer_b0_cityscapes_1024x1024_160k.yml"), BF16),
        (config_path("table", "SLANet.yml"), []),
        (config_path("rec", "rec_mv3_none_bilstm_ctc.yml"), BF16),
        (config_path("rec", "PP-OCRv3", "ch_PP-OCRv3_rec_distillation.yml"), []),
    ],
)
def test_the_static_recipes_are_taken(path, overrides):
    assert refusal(path, *overrides) is None


@pytest.mark.parametrize(
    "path, overrides, expected",
    [
        (
            config_path("det", "ppyoloe_crn_s_300e_coco.yml"),
            [],
            "Global.cuda_graph: Train.dataset.batch_transforms draw 15 input sizes (multi-scale training), a "
            "captured step has one shape; set Global.cuda_graph: false, or one target size",
        ),
        (
            config_path("det", "ppyoloe_crn_s_300e_coco.yml"),
            ["Train.dataset.batch_transforms=[]"],
            "Global.cuda_graph: the loss PPYOLOELoss reads 'epoch_id' of each batch on the host, which a "
            "captured step would read once; set Global.cuda_graph: false",
        ),
        (SEG, ["Global.use_amp=true"], "Global.cuda_graph with fp16 AMP is refused: its loss scaler decides"),
        (SEG, ["Optimizer.fused=false"], "Global.cuda_graph needs torch's fused optimizer"),
        (SEG, ["Global.accumulate_steps=2"], "Global.accumulate_steps 2 is refused"),
        (SEG, ["Global.compile=true"], "Global.cuda_graph with Global.compile is not supported"),
    ],
)
def test_what_cannot_be_captured_is_refused_in_one_line(path, overrides, expected):
    found = refusal(path, *overrides)
    assert found is not None and expected in found and "\n" not in found


def test_off_refuses_nothing():
    assert capture_refusal(load_config(config_path("det", "ppyoloe_crn_s_300e_coco.yml"))) is None


def test_the_refusal_comes_before_any_data_is_read():
    """The recipe's COCO folders do not exist here: the refusal is what stops the run."""
    config = load_config(config_path("det", "ppyoloe_crn_s_300e_coco.yml"), [ON])
    with pytest.raises(ConfigError, match="multi-scale training"):
        build_trainer(config, DistEnv())


def test_ctc_reads_its_lengths_on_the_device_with_capture():
    """The CTC losses take Global.cuda_graph: lengths on the device (ppdist.losses.ctc_device)."""
    for path in (
        config_path("rec", "rec_mv3_none_bilstm_ctc.yml"),
        config_path("rec", "PP-OCRv3", "ch_PP-OCRv3_rec_distillation.yml"),
    ):
        assert build_loss(load_config(path, [ON])).host_keys == ()
        assert build_loss(load_config(path)).host_keys == ("length",)


def test_the_optimizer_is_fused_by_default_with_capture():
    assert fused_by_default(load_config(SEG, [ON]))["fused"] is True
    assert fused_by_default(load_config(SEG)).get("fused") is None
