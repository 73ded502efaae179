"""The PP-OCRv3 data fixture made by PaddleOCR (tests/fixtures/paddle_ppocrv3/make_data_fixture.py):
its stored outputs and its input recipes (the script imports PaddleOCR only when it runs)."""

import importlib.util
import json
import os
from typing import Any, Dict

import numpy as np
from ppdist_testing import paddle_fixture_dir

FIXTURES = paddle_fixture_dir("ppocrv3")


def script() -> Any:
    """make_data_fixture.py as a module (inputs: ``text_image``, the cases)."""
    spec = importlib.util.spec_from_file_location(
        "paddle_ppocrv3_data_fixture", os.path.join(FIXTURES, "make_data_fixture.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arrays() -> Dict[str, np.ndarray]:
    with np.load(os.path.join(FIXTURES, "data_images.npz")) as data:
        return {key: data[key] for key in data.files}


def labels() -> Dict[str, Any]:
    with open(os.path.join(FIXTURES, "data_labels.json"), encoding="utf-8") as handle:
        return json.load(handle)
