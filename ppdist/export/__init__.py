"""Deployment: export a trained model to ONNX / TorchScript and describe it in ``inference.yml``."""
