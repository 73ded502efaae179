"""A small Python API over the inference runners.

from ppdist.predict import Predictor
predictor = Predictor("output/inference/quickstart_synth")           # exported: ONNX Runtime
predictor = Predictor("configs/rec/quickstart_synth.yml",             # or a checkpoint: PyTorch
                      checkpoint="output/rec/quickstart_synth/best_accuracy")
results = predictor(["a.png", "b.png"])   # or numpy BGR images; one dict per image
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence, Union

import cv2
import numpy as np

from ppdist.convert.configs import load_config
from ppdist.errors import ConfigError
from ppdist.inference.infer import from_config, from_exported

Image = Union[str, np.ndarray]


class Predictor:
    """Predict with an exported model directory (``inference.yml`` + ONNX, run by ONNX Runtime) or
    a training config and checkpoint (PyTorch). Results are the runners' dicts: rec ``{path, text,
    score}``, det ``{path, boxes, scores, labels, category_ids}``, seg ``{path, label_map}``, table
    ``{path, structure, html, score, boxes}``."""

    def __init__(
        self,
        source: str,
        checkpoint: str = None,
        overrides: Sequence[str] = (),
        device: str = "cpu",
        batch_size: int = 8,
    ) -> None:
        if os.path.isdir(source):
            self.info, self.runner, self.backend = from_exported(source)
        elif os.path.isfile(source):
            extra = [f"Global.checkpoints={checkpoint}"] if checkpoint else []
            self.info, self.runner, self.backend = from_config(
                load_config(source, extra + list(overrides)), device
            )
        else:
            raise ConfigError(f"Predictor: {source} is neither an exported model directory nor a config file")
        self.task = self.info["task"]
        self.batch_size = max(1, int(batch_size))

    def _load(self, image: Image, index: int) -> Dict[str, Any]:
        if isinstance(image, str):
            return self.runner.load(image)
        if isinstance(image, np.ndarray) and image.ndim in (2, 3):
            ok, encoded = cv2.imencode(".png", image)  # the same decode path as files (BGR arrays, as cv2)
            if ok:
                return self.runner.load_encoded(encoded.tobytes(), f"<array {index}>")
        raise ConfigError(f"Predictor: image {index} must be a file path or an HxW(x3) uint8 array")

    def __call__(self, images: Union[Image, Sequence[Image]]) -> List[Dict[str, Any]]:
        """One result per image, in order (an unreadable file raises ``ImageReadError``)."""
        items = [images] if isinstance(images, (str, np.ndarray)) else list(images)
        results: List[Dict[str, Any]] = []
        for start in range(0, len(items), self.batch_size):
            samples = [
                self._load(image, start + i) for i, image in enumerate(items[start : start + self.batch_size])
            ]
            results.extend(self.runner.predict(self.backend.run, samples))
        return results
