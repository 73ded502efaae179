"""Per-task inference: read + preprocess an image file, batch samples into the graph's named
inputs, and turn the graph's named outputs into per-image results.

A runner is built from an *inference info* dict: the one ``read_inference_config`` returns for an
exported model directory, or ``inference_info_from_config(config)`` for a training config (same
keys, nothing written). The runners are backend-agnostic (see ``ppdist.inference.backends``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from ppdist.data.base import RejectedSample
from ppdist.data.build import build_transforms
from ppdist.data.image_size import DEFAULT_MAX_IMAGE_PIXELS, check_image_pixels
from ppdist.errors import ConfigError, PPDistError
from ppdist.export.inference_config import inference_postprocess, inference_preprocess
from ppdist.export.submodels import deployed_config
from ppdist.metrics.teds import structure_html
from ppdist.registry import POSTPROCESSES
from ppdist.tasks import get_task

logger = logging.getLogger("ppdist")

Sample = Dict[str, Any]
Result = Dict[str, Any]
Outputs = Dict[str, np.ndarray]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")
DECODE_OPS = ("DecodeImage", "Decode")


class ImageReadError(PPDistError):
    """An input file that cannot be read or decoded as an image (callers skip and report it)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path


def inference_info_from_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The inference info of ``config`` as ``read_inference_config`` would return it after an
    export (task, inputs, outputs, preprocess, postprocess, labels), without writing files; the rec
    dictionary stays the config's ``character_dict_path``. A composite (distillation) model's info
    is that of its deployed sub-model (``ppdist.export.submodels``)."""
    config = deployed_config(config)
    task = get_task(config)
    info: Dict[str, Any] = {
        "task": task.name,
        "files": {},
        "inputs": [{"name": n} for n in task.inputs],
        "outputs": list(task.outputs),
        "preprocess": inference_preprocess(config),
        "postprocess": inference_postprocess(config),
    }
    labels = task.config_labels(config)
    if labels is not None:
        info["labels"] = labels
    return info


def build_postprocess_of(info: Mapping[str, Any]) -> Any:
    """The post-process object ``info["postprocess"]`` describes (registry build, as in training)."""
    return POSTPROCESSES.build(
        dict(info["postprocess"]), where=f"{info.get('path', 'inference info')}: postprocess"
    )


def list_images(path: str) -> List[str]:
    """``path`` itself when it is a file, else the image files directly in the folder (sorted)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise ConfigError(f"--input: no such file or directory: {path}")
    names = sorted(n for n in os.listdir(path) if n.lower().endswith(IMAGE_EXTENSIONS))
    broken = [
        n
        for n in names
        if os.path.islink(os.path.join(path, n)) and not os.path.exists(os.path.join(path, n))
    ]
    for name in broken:
        logger.warning("--input: skipped %s: a link to a file that does not exist", os.path.join(path, name))
    return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise ImageReadError(path, f"cannot read ({exc.strerror or exc})") from exc
    if not raw:
        raise ImageReadError(path, "empty file")
    return raw


def _group_by(keys: Sequence[Any]) -> List[List[int]]:
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
        return self.load_encoded(_read_bytes(path), path)

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
        return self.finish(data)

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
        for group in _group_by([self.group_key(s) for s in samples]):
            chunk = [samples[i] for i in group]
            for i, result in zip(group, self.postprocess(run(self.batch(chunk)), chunk)):
                results[i] = result
        return results  # type: ignore[return-value]


class RecRunner(Runner):
    """Text lines -> ``{path, text, score}`` (greedy CTC decoding)."""

    task = "rec"

    def __init__(self, info: Mapping[str, Any]) -> None:
        super().__init__(info)
        self.decoder = build_postprocess_of(info)  # CTCLabelDecode

    def group_key(self, sample: Sample) -> Any:
        return tuple(np.shape(sample["image"])[:-1])  # widths are padded per batch

    def batch(self, samples: Sequence[Sample]) -> Dict[str, np.ndarray]:
        """Zero-padded on the right to the batch's widest line (PaddleOCR's predict_rec)."""
        images = [np.asarray(s["image"], dtype=np.float32) for s in samples]
        width = max(im.shape[-1] for im in images)
        out = np.zeros((len(images),) + images[0].shape[:-1] + (width,), dtype=np.float32)
        for i, im in enumerate(images):
            out[i, ..., : im.shape[-1]] = im
        return {"image": out}

    def postprocess(self, outputs: Outputs, samples: Sequence[Sample]) -> List[Result]:
        """``{path, text, score}``; with the outputs of several models (``<name>/probs``, a
        distillation model's sub-models), also ``models: {name: {label, score}}`` (PaddleOCR's
        infer_rec record)."""
        decoded = self.decoder.decode_predictions(np.asarray(outputs["probs"]))
        results = [
            {"path": s["img_path"], "text": text, "score": score}
            for s, (text, score) in zip(samples, decoded)
        ]
        models = [key[: -len("/probs")] for key in outputs if key.endswith("/probs")]
        for name in models:
            for result, (text, score) in zip(
                results, self.decoder.decode_predictions(np.asarray(outputs[f"{name}/probs"]))
            ):
                result.setdefault("models", {})[name] = {"label": text, "score": score}
        return results


class DetRunner(Runner):
    """Images -> ``{path, boxes [K, 4] xyxy on the original image, scores, labels, category_ids}``."""

    task = "det"

    def __init__(self, info: Mapping[str, Any]) -> None:
        super().__init__(info)
        self.labels: List[Dict[str, Any]] = list(info.get("labels") or [])
        self.nms = build_postprocess_of(info)  # MultiClassNMS

    def finish(self, data: Sample) -> Sample:
        return {
            "img_path": data["img_path"],
            "image": data["image"],
            "scale_factor": np.asarray(data["scale_factor"], dtype=np.float32).reshape(2),
            "ori_shape": tuple(int(v) for v in np.asarray(data["ori_shape"]).reshape(2)),
        }

    def batch(self, samples: Sequence[Sample]) -> Dict[str, np.ndarray]:
        inputs = super().batch(samples)
        inputs["scale_factor"] = np.stack([s["scale_factor"] for s in samples]).astype(np.float32)
        return inputs

    def _bbox(self, outputs: Outputs) -> Tuple[np.ndarray, np.ndarray]:
        """(bbox [M, 6], bbox_num [N]); a graph exported with exclude_nms gets NMS here."""
        if "bbox" in outputs:
            return np.asarray(outputs["bbox"]), np.asarray(outputs["bbox_num"])
        bbox, num = self.nms.batched(torch.from_numpy(outputs["scores"]), torch.from_numpy(outputs["boxes"]))
        return bbox.numpy(), num.numpy()

    def category_id(self, label: int) -> int:
        return int(self.labels[label]["id"]) if 0 <= label < len(self.labels) else label

    def label_name(self, label: int) -> str:
        return str(self.labels[label]["name"]) if 0 <= label < len(self.labels) else str(label)

    def postprocess(self, outputs: Outputs, samples: Sequence[Sample]) -> List[Result]:
        bbox, nums = self._bbox(outputs)
        results, start = [], 0
        for sample, num in zip(samples, nums.reshape(-1).tolist()):
            rows = bbox[start : start + int(num)]
            start += int(num)
            labels = rows[:, 0].astype(np.int64)
            results.append(
                {
                    "path": sample["img_path"],
                    "boxes": rows[:, 2:6].astype(np.float32),
                    "scores": rows[:, 1].astype(np.float32),
                    "labels": labels,
                    "category_ids": np.array([self.category_id(int(v)) for v in labels], dtype=np.int64),
                }
            )
        return results


class SegRunner(Runner):
    """Images -> ``{path, label_map [H, W]}`` at the original size (logits resized bilinearly)."""

    task = "seg"

    def __init__(self, info: Mapping[str, Any]) -> None:
        super().__init__(info)
        self.test_time = build_postprocess_of(info)  # SegPostProcess: scales, flips, sliding window

    def decode(self, raw: bytes, path: str) -> Sample:
        """RGB uint8 (H, W, 3), as ``SegDataSet.read`` gives it (its transforms start after decoding)."""
        try:
            check_image_pixels(raw, DEFAULT_MAX_IMAGE_PIXELS)
        except RejectedSample as exc:
            raise ImageReadError(path, str(exc)) from exc
        image = cv2.imdecode(np.frombuffer(raw, dtype=np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise ImageReadError(path, "cannot decode the image (not an image file?)")
        image = np.ascontiguousarray(image[:, :, ::-1])
        return {"img_path": path, "image": image, "ori_shape": image.shape[:2], "gt_fields": []}

    def finish(self, data: Sample) -> Sample:
        """CHW float32 (``SegDataSet.finish``)."""
        image = np.asarray(data["image"])
        image = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)
        return {
            "img_path": data["img_path"],
            "image": np.ascontiguousarray(image, dtype=np.float32),
            "ori_shape": tuple(int(v) for v in data["ori_shape"]),
        }

    def predict(
        self, run: Callable[[Dict[str, np.ndarray]], Outputs], samples: Sequence[Sample]
    ) -> List[Result]:
        """Plain pass, or the configured test-time augmentation / sliding window with ``run`` as
        the network (the same code as evaluation, ``SegPostProcess.infer``)."""
        if not (self.test_time.aug_eval or self.test_time.is_slide):
            return super().predict(run, samples)

        def network(image: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(np.asarray(run({"image": image.numpy()})["logits"], dtype=np.float32))

        results: List[Optional[Result]] = [None] * len(samples)
        for group in _group_by([self.group_key(s) for s in samples]):
            chunk = [samples[i] for i in group]
            logits = self.test_time.infer(network, {"image": torch.from_numpy(self.batch(chunk)["image"])})
            for i, result in zip(group, self.postprocess({"logits": logits.numpy()}, chunk)):
                results[i] = result
        return results  # type: ignore[return-value]

    def postprocess(self, outputs: Outputs, samples: Sequence[Sample]) -> List[Result]:
        logits = torch.from_numpy(np.asarray(outputs["logits"], dtype=np.float32))
        results = []
        for i, sample in enumerate(samples):
            row = logits[i : i + 1]
            if tuple(row.shape[-2:]) != sample["ori_shape"]:
                row = F.interpolate(row, size=list(sample["ori_shape"]), mode="bilinear", align_corners=False)
            label_map = row[0].argmax(dim=0).numpy()
            dtype = np.uint8 if row.shape[1] <= 256 else np.int32
            results.append({"path": sample["img_path"], "label_map": label_map.astype(dtype)})
        return results


class TableRunner(Runner):
    """Table images -> ``{path, structure (HTML tokens), html, score, boxes [n_cells, loc_reg_num]
    on the original image}`` (``TableLabelDecode`` with the ``shape`` of ``ResizeTableImage`` /
    ``PaddingTableImage``); ``html`` is the structure wrapped as PaddleOCR's predict_table does."""

    task = "table"

    def __init__(self, info: Mapping[str, Any]) -> None:
        super().__init__(info)
        self.decoder = build_postprocess_of(info)  # TableLabelDecode

    def finish(self, data: Sample) -> Sample:
        return {
            "img_path": data["img_path"],
            "image": data["image"],
            "shape": np.asarray(data["shape"], dtype=np.float32).reshape(-1),
        }

    def postprocess(self, outputs: Outputs, samples: Sequence[Sample]) -> List[Result]:
        locs = np.asarray(outputs["loc_preds"], dtype=np.float32)
        decoded = self.decoder(
            {"structure_probs": np.asarray(outputs["structure_probs"]), "loc_preds": locs},
            {"shape": np.stack([s["shape"] for s in samples])},
        )
        results = []
        for sample, (tokens, score), boxes in zip(
            samples, decoded["structure_batch_list"], decoded["bbox_batch_list"]
        ):
            results.append(
                {
                    "path": sample["img_path"],
                    "structure": list(tokens),
                    "html": structure_html(tokens),
                    "score": score,
                    "boxes": boxes.reshape(-1, locs.shape[-1]),
                }
            )
        return results


RUNNERS = {"rec": RecRunner, "det": DetRunner, "seg": SegRunner, "table": TableRunner}


def build_runner(info: Mapping[str, Any]) -> Runner:
    """The runner of ``info["task"]``."""
    return RUNNERS[info["task"]](info)
