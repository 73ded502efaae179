"""ppdist.build_runtime: the compute settings of a config, derived once (autocast, memory format,
loss scaling, backend settings applied), as training, evaluation and the benchmarks use them."""

from __future__ import annotations

import torch
from ppdist_testing import tiny_config

import ppdist
from ppdist.config import load_config

CPU = torch.device("cpu")


def _glob(tmp_path, *overrides):
    path = tiny_config(str(tmp_path / "t.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    return load_config(path, ["Global.synthetic_data=null", *overrides])["Global"]


def test_fp16_needs_a_loss_scaler_bf16_and_fp32_do_not(tmp_path):
    fp32 = ppdist.build_runtime(_glob(tmp_path), CPU)
    bf16 = ppdist.build_runtime(_glob(tmp_path, "Global.use_amp=true", "Global.amp_dtype=bfloat16"), CPU)
    fp16 = ppdist.build_runtime(_glob(tmp_path, "Global.use_amp=true", "Global.amp_dtype=float16"), CPU)
    assert (fp32.loss_scaling, bf16.loss_scaling, fp16.loss_scaling) == (False, False, True)
    assert not fp32.grad_scaler({"scale_loss": 1024.0, "use_dynamic_loss_scaling": True}).is_enabled()
    with bf16.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with fp32.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_place_puts_the_model_in_the_configs_memory_format(tmp_path):
    conv = torch.nn.Conv2d(3, 8, 3)
    nhwc = ppdist.build_runtime(_glob(tmp_path, "Global.channels_last=true"), CPU)
    nchw = ppdist.build_runtime(_glob(tmp_path, "Global.channels_last=false"), CPU)
    assert nhwc.channels_last and not nchw.channels_last
    assert nhwc.place(conv).weight.is_contiguous(memory_format=torch.channels_last)
    assert nchw.place(torch.nn.Conv2d(3, 8, 3)).weight.is_contiguous()
