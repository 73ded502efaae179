"""Inference on image files with a checkpoint (PyTorch) or an exported model (ONNX Runtime)."""

from ppdist.inference.backends import OnnxBackend, TorchBackend
from ppdist.inference.runners import build_runner, inference_info_from_config

__all__ = ["OnnxBackend", "TorchBackend", "build_runner", "inference_info_from_config"]
