"""Per-device defaults of the GPU switches, and the recompile limit for multi-scale training."""

import subprocess
import sys

import torch

from ppdist.engine.device_settings import apply_backend_settings, broadcast_buffers, channels_last
from ppdist.engine.setup import compile_for_training

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_channels_last_default_follows_the_device_and_precision():
    assert channels_last({"channels_last": None, "use_amp": False}, CPU)
    assert channels_last({"channels_last": None, "use_amp": True}, CUDA)
    assert not channels_last({"channels_last": None, "use_amp": False}, CUDA)
    assert not channels_last({"channels_last": False, "use_amp": True}, CPU)


def test_broadcast_buffers_is_off_with_sync_bn_unless_set():
    assert not broadcast_buffers({"broadcast_buffers": None}, sync_bn=True)
    assert broadcast_buffers({"broadcast_buffers": None}, sync_bn=False)
    assert broadcast_buffers({"broadcast_buffers": True}, sync_bn=True)


def test_matmul_precision_and_tf32_follow_the_config():
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        apply_backend_settings({"float32_matmul_precision": "highest", "cudnn_benchmark": True}, CPU)
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        apply_backend_settings({"float32_matmul_precision": "high", "cudnn_benchmark": True}, CPU)
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def test_deterministic_switches_the_reproducible_kernels_on_and_off_again():
    glob = {"float32_matmul_precision": torch.get_float32_matmul_precision(), "cudnn_benchmark": True}
    try:
        apply_backend_settings({**glob, "deterministic": True}, CPU)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic
        apply_backend_settings({**glob, "deterministic": False}, CPU)
        assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False


def test_the_default_settings_leave_the_compiler_unloaded():
    """torch.use_deterministic_algorithms imports torch._inductor (~2 s of every tool's start-up): it
    is called only to switch determinism on, or off again."""
    code = (
        "import sys, torch; from ppdist.engine.device_settings import apply_backend_settings; "
        "apply_backend_settings({'float32_matmul_precision': 'highest', 'cudnn_benchmark': False}, "
        "torch.device('cpu')); print('torch._inductor' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


def test_compile_fits_every_training_size_and_never_falls_back_silently(caplog):
    dynamo = torch._dynamo.config
    saved = dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit
    try:
        with caplog.at_level("INFO", logger="ppdist"):
            compile_for_training(torch.nn.Linear(2, 2), {}, input_sizes=15)  # PP-YOLOE's 15 sizes
        assert dynamo.recompile_limit >= 15 and dynamo.fail_on_recompile_limit_hit
        assert "15 training input size(s)" in caplog.text and "recompile limit" in caplog.text
    finally:
        dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit = saved
