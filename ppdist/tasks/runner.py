"""What every task's inference runner shares: an image file read and put through the exported
model's preprocess transforms, samples batched into the graph's named inputs, a graph call per input
size. A task's runner (``ppdist.tasks.<task>``) turns the graph's named outputs into its results."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ppdist.data.base import RejectedSample
from ppdist.data.build import build_transforms
from ppdist.errors import PPDistError
from ppdist.registry import POSTPROCESSES
from ppdist.utils.input_size import describe_too_small, too_small

Sample = Dict[str, Any]
Result = Dict[str, Any]
Outputs = Dict[str, np.ndarray]

DECODE_OPS = ("DecodeImage", "Decode")


class ImageReadError(PPDistError):
    """An input file that cannot be used: unreadable, not an image, or smaller than the model's
    smallest input after preprocessing (callers skip and report it)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path


def build_postprocess_of(info: Mapping[str, Any]) -> Any:
    """The post-process object ``info["postprocess"]`` describes (registry build, as in training)."""
    return POSTPROCESSES.build(
        dict(info["postprocess"]), where=f"{info.get('path', 'inference info')}: postprocess"
    )


def read_bytes(path: str) -> bytes:
    """The bytes of ``path``; ``ImageReadError`` if it cannot be read or is empty."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise ImageReadError(path, f"cannot read ({exc.strerror or exc})") from exc
    if not raw:
        raise ImageReadError(path, "empty file")
    return raw


def group_by(keys: Sequence[Any]) -> List[List[int]]:
    """Indices grouped by equal key, groups in order of first appearance."""
    groups: Dict[Any, List[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


class Runner:
    """Shared file loading (preprocess transforms) and batched prediction."""

    task = ""

    def __init__(self, info: Mapping[str, Any]) -> None:
        self.info = info
        self.input_names: List[str] = [row["name"] for row in info["inputs"]]
        self.output_names: List[str] = list(info["outputs"])
        steps = list(info["preprocess"])
        self.op_names = [next(iter(step)) for step in steps]
        self.ops = build_transforms(steps, {"Global": {}}, "preprocess")

    def decode(self, raw: bytes, path: str) -> Sample:
        """The sample the first transform expects (encoded bytes, as the datasets give)."""
        return {"img_path": path, "image": raw}

    def load(self, path: str) -> Sample:
        """Read ``path`` and apply the preprocess transforms; ``ImageReadError`` if it is no image."""
        return self.load_encoded(read_bytes(path), path)

    def load_encoded(self, raw: bytes, path: str) -> Sample:
        """``load`` for an encoded image already in memory (``path`` names it in results and errors)."""
        data: Optional[Sample] = self.decode(raw, path)
        for name, op in zip(self.op_names, self.ops):
            try:
                data = op(data)
            except RejectedSample as exc:  # e.g. over Global.max_image_pixels: skipped, named
                raise ImageReadError(path, str(exc)) from exc
            except (ValueError, TypeError) as exc:
                if name not in DECODE_OPS:
                    raise
                raise ImageReadError(path, f"cannot decode the image ({exc})") from exc
            if data is None:
                raise ImageReadError(path, f"cannot decode the image ({name} rejected it)")
        sample = self.finish(data)
        self.check_size(sample, path)
        return sample

    def check_size(self, sample: Sample, path: str) -> None:
        """``ImageReadError`` if the preprocessed image (the graph's [C, H, W] input) is smaller
        than the model's smallest input (``min_input_size`` of the inference info)."""
        minimum = self.info.get("min_input_size")
        size = np.shape(sample["image"])[-2:]
        if len(size) == 2 and too_small(size, minimum):
            raise ImageReadError(path, describe_too_small(size, minimum, "after preprocessing"))

    def finish(self, data: Sample) -> Sample:
        return data

    def group_key(self, sample: Sample) -> Any:
        """Samples with equal keys can go into one graph call."""
        return tuple(np.shape(sample["image"]))

    def batch(self, samples: Sequence[Sample]) -> Dict[str, np.ndarray]:
        """The graph's named float32 inputs for ``samples`` (equal ``group_key``)."""
        return {"image": np.stack([np.asarray(s["image"], dtype=np.float32) for s in samples])}

    def postprocess(self, outputs: Outputs, samples: Sequence[Sample]) -> List[Result]:  # pragma: no cover
        raise NotImplementedError

    def predict(
        self, run: Callable[[Dict[str, np.ndarray]], Outputs], samples: Sequence[Sample]
    ) -> List[Result]:
        """Results of ``samples`` in order; samples of different input sizes run in separate calls."""
        results: List[Optional[Result]] = [None] * len(samples)
        for group in group_by([self.group_key(s) for s in samples]):
            chunk = [samples[i] for i in group]
            for i, result in zip(group, self.postprocess(run(self.batch(chunk)), chunk)):
                results[i] = result
        return results  # type: ignore[return-value]
