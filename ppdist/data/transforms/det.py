"""Object-detection transforms (PaddleDetection semantics and names).

A sample holds ``image`` (H, W, 3 RGB; uint8 after ``Decode``, float32 after ``NormalizeImage``;
between ``RandomExpand`` / ``RandomCrop`` / ``RandomFlip`` and the next op that needs pixels, a
``PendingImage``: the geometry recorded, drawn once by that op, see ``ppdist.data.pending_image``),
``gt_bbox`` (N, 4) float32 pixel xyxy, ``gt_class`` (N, 1) and ``is_crowd`` (N, 1), plus
``im_shape`` = [h, w] of the current image and ``scale_factor`` = [sy, sx] (resized / original).
Per-box arrays always follow the boxes (crops drop rows from all of them).

Ops with the class attribute ``batch_op = True`` (``BatchRandomResize``, ``PadGT``) receive
the list of samples of one per-process batch (see ``ppdist.data.build.apply_batch_transforms``).
Randomness comes from ``random`` / ``np.random`` (seeded per sample, or per batch, by ppdist).

``RandomDistort`` and ``Resize`` are shared with the segmentation ops (``transforms/seg.py``):
the former only touches ``image`` and its defaults are PaddleDetection's; the latter switches
to the detection behaviour below (``resize_detection``) for samples made by ``Decode``.
"""

from __future__ import annotations

import bisect
import random
from numbers import Integral
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import cv2
import numpy as np

from ppdist.data.image_size import DEFAULT_MAX_IMAGE_PIXELS, check_image_pixels
from ppdist.data.pending_image import PendingImage, pending
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS

Sample = Dict[str, Any]

# arrays with one row per box: kept in step with ``gt_bbox`` by crops and padding
BOX_FIELDS = ("gt_class", "is_crowd", "gt_score", "difficult")
CV_INTERPS = (cv2.INTER_NEAREST, cv2.INTER_LINEAR, cv2.INTER_CUBIC, cv2.INTER_AREA, cv2.INTER_LANCZOS4)
_INTERP_NAMES = {
    "NEAREST": cv2.INTER_NEAREST,
    "LINEAR": cv2.INTER_LINEAR,
    "CUBIC": cv2.INTER_CUBIC,
    "AREA": cv2.INTER_AREA,
    "LANCZOS4": cv2.INTER_LANCZOS4,
}
# BatchRandomResize's random interpolations (PaddleDetection's order)
BATCH_INTERPS = (cv2.INTER_NEAREST, cv2.INTER_LINEAR, cv2.INTER_AREA, cv2.INTER_CUBIC, cv2.INTER_LANCZOS4)


# ----------------------------------------------------------------------------- helpers
def cv_interp(value: Union[int, str], where: str) -> int:
    """A cv2 interpolation code from a code (0-4) or a name (NEAREST, LINEAR, ...)."""
    if isinstance(value, str) and value in _INTERP_NAMES:
        return _INTERP_NAMES[value]
    if isinstance(value, Integral) and not isinstance(value, bool) and int(value) in CV_INTERPS:
        return int(value)
    raise ConfigError(
        f"{where} must be a cv2 interpolation code (0 nearest, 1 linear, 2 cubic, 3 area, "
        f"4 lanczos4) or one of {', '.join(_INTERP_NAMES)}, got {value!r}"
    )


def hw_size(value: Any, where: str) -> Tuple[int, int]:
    """PaddleDetection's target size: an int (square) or [h, w], as two positive ints."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        value = [int(value), int(value)]
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, Integral) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ConfigError(f"{where} must be a positive int or [height, width], got {value!r}")
    return int(value[0]), int(value[1])


def _check_prob(value: float, where: str) -> float:
    if not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{where} must lie in [0, 1], got {value!r}")
    return float(value)


def _range(value: Any, where: str, low: float = 0.0) -> Tuple[float, float]:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not low <= float(value[0]) <= float(value[1])
    ):
        raise ConfigError(f"{where} must be [min, max] with {low} <= min <= max, got {value!r}")
    return float(value[0]), float(value[1])


def _geometry(data: Sample, op: str) -> PendingImage:
    """The sample's image as a ``PendingImage`` to record a crop / flip / expansion on."""
    img = data.get("image")
    if not isinstance(img, (np.ndarray, PendingImage)) or img.ndim != 3:
        raise TypeError(f"{op} expects a decoded (H, W, C) image in data['image'] (put Decode first)")
    return pending(data)


def _boxes(data: Sample) -> Optional[np.ndarray]:
    """``gt_bbox`` as float32 (N, 4), or None when the sample has no boxes field."""
    if "gt_bbox" not in data:
        return None
    return np.asarray(data["gt_bbox"], dtype=np.float32).reshape(-1, 4)


def _set_shape(data: Sample, img: Union[np.ndarray, PendingImage]) -> None:
    data["im_shape"] = np.array(img.shape[:2], dtype=np.float32)


def _take_boxes(data: Sample, keep: np.ndarray) -> None:
    for key in BOX_FIELDS:
        if key in data:
            data[key] = np.asarray(data[key])[keep]


class BoxIoU:
    """IoU of fixed ``boxes`` (N, 4) with one box after another (all xyxy, float32 arithmetic):
    the boxes' corners and areas are prepared once (``RandomCrop`` tries up to hundreds of crops)."""

    def __init__(self, boxes: np.ndarray) -> None:
        self.lt, self.rb = boxes[:, :2], boxes[:, 2:]
        wh = self.rb - self.lt
        self.area = wh[:, 0] * wh[:, 1]
        self.sorted_areas = sorted(float(a) for a in self.area)

    def bound(self, area: float) -> float:
        """An upper bound of the IoU any of the boxes can have with a box of ``area`` > 0:
        IoU <= min(a, b) / max(a, b) (the float32 IoU exceeds it by a few ulps at most)."""
        i = bisect.bisect_left(self.sorted_areas, area)
        best = area / self.sorted_areas[i] if i < len(self.sorted_areas) else 0.0
        return max(best, self.sorted_areas[i - 1] / area) if i > 0 else best

    def __call__(self, box: np.ndarray) -> np.ndarray:
        wh = np.minimum(self.rb, box[2:]) - np.maximum(self.lt, box[:2])
        np.maximum(wh, 0, out=wh)
        inter = wh[:, 0] * wh[:, 1]
        side = box[2:] - box[:2]
        union = self.area + side[0] * side[1] - inter
        return inter / np.maximum(union, 1e-10)


def box_iou(boxes: np.ndarray, box: np.ndarray) -> np.ndarray:
    """IoU of each of ``boxes`` (N, 4) with one ``box`` (4,), all xyxy."""
    return BoxIoU(boxes)(box)


def resize_detection(data: Sample, target: Tuple[int, int], keep_ratio: bool, interp: int) -> Sample:
    """Resize a detection sample to ``target`` = (h, w) (PaddleDetection's ``Resize``).

    ``keep_ratio`` scales by ``min(min(target) / min(h, w), max(target) / max(h, w))``. The
    image keeps its dtype (uint8 stays uint8: ``NormalizeImage`` / ``Permute`` make it float32,
    on the host or on the device); boxes are scaled and clipped; ``im_shape`` is the new [h, w] and
    ``scale_factor`` is multiplied by (new / old) per axis.
    """
    img = _geometry(data, "Resize")  # a pending canvas is drawn by the resize itself
    h, w = img.shape[:2]
    if keep_ratio:
        scale = min(min(target) / min(h, w), max(target) / max(h, w))
        new_h, new_w = max(1, int(scale * h + 0.5)), max(1, int(scale * w + 0.5))
    else:
        new_h, new_w = target
    sy, sx = new_h / h, new_w / w
    data["image"] = img.resized(new_w, new_h, interp)
    data["im_shape"] = np.array([new_h, new_w], dtype=np.float32)
    old = np.asarray(data.get("scale_factor", (1.0, 1.0)), dtype=np.float32).reshape(2)
    data["scale_factor"] = np.array([old[0] * sy, old[1] * sx], dtype=np.float32)
    boxes = _boxes(data)
    if boxes is not None and len(boxes):
        boxes = boxes * np.array([sx, sy, sx, sy], dtype=np.float32)
        boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, new_w)
        boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, new_h)
        data["gt_bbox"] = boxes
    return data


# ----------------------------------------------------------------------------- decode
@TRANSFORMS.register
class Decode:
    """Decode ``data["image"]`` to an RGB uint8 (H, W, 3) array with cv2.

    Accepts encoded bytes (what ``COCODataSet.read`` gives), a 1-D uint8 buffer, or an already
    decoded (H, W, 3) RGB array (passed through). Sets ``h``, ``w``, ``ori_shape`` and
    ``im_shape`` = [h, w] and ``scale_factor`` = [1, 1] (float32). Undecodable data raises.
    """

    def __init__(self, max_image_pixels: Optional[int] = DEFAULT_MAX_IMAGE_PIXELS) -> None:
        self.max_image_pixels = max_image_pixels  # checked from the file header, before decoding

    def __call__(self, data: Sample) -> Sample:
        raw = data.get("image")
        if isinstance(raw, np.ndarray) and raw.ndim == 3:
            img = raw
        else:
            if isinstance(raw, (bytes, bytearray, memoryview)):
                buf = np.frombuffer(raw, dtype=np.uint8)
            elif isinstance(raw, np.ndarray) and raw.ndim == 1:
                buf = raw.view(np.uint8)
            else:
                raise TypeError(
                    f"Decode expects encoded image bytes or an (H, W, 3) array in data['image'], "
                    f"got {type(raw).__name__}"
                )
            if buf.size:
                check_image_pixels(memoryview(buf), self.max_image_pixels)
            img = cv2.imdecode(buf, cv2.IMREAD_COLOR) if buf.size else None
            if img is None:
                raise ValueError(f"Decode: cannot decode the image ({buf.size} bytes; not an image file?)")
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        data["image"] = img
        data["h"], data["w"] = int(img.shape[0]), int(img.shape[1])
        data["ori_shape"] = np.array(img.shape[:2], dtype=np.float32)
        _set_shape(data, img)
        data["scale_factor"] = np.ones(2, dtype=np.float32)
        return data


@TRANSFORMS.register
class RandomExpand:
    """With probability ``prob`` place the image at a random offset on a canvas ``r`` times
    larger per side, ``r ~ U[1, ratio]``, filled with ``fill_value`` (RGB); boxes are shifted.

    The canvas keeps the image dtype (a uint8 image gets the fill rounded). It is recorded, not
    drawn: the first op that needs pixels draws only what is left of it (``pending_image``).
    """

    def __init__(
        self,
        ratio: float = 4.0,
        prob: float = 0.5,
        fill_value: Union[float, Sequence[float]] = (123.675, 116.28, 103.53),
    ) -> None:
        if float(ratio) <= 1.01:
            raise ConfigError(f"RandomExpand.ratio must be > 1.01, got {ratio!r}")
        self.ratio = float(ratio)
        self.prob = _check_prob(prob, "RandomExpand.prob")
        fill = (
            [float(fill_value)] * 3
            if isinstance(fill_value, (int, float))
            else [float(v) for v in fill_value]
        )
        if len(fill) != 3:
            raise ConfigError(
                f"RandomExpand.fill_value must be a number or 3 numbers (RGB), got {fill_value!r}"
            )
        self.fill = np.array(fill, dtype=np.float32)

    def __call__(self, data: Sample) -> Sample:
        img = _geometry(data, "RandomExpand")
        if np.random.uniform(0.0, 1.0) >= self.prob:
            return data
        h, w = img.shape[:2]
        r = np.random.uniform(1.0, self.ratio)
        new_h, new_w = int(h * r), int(w * r)
        if new_h <= h or new_w <= w:
            return data
        y = np.random.randint(0, new_h - h + 1)
        x = np.random.randint(0, new_w - w + 1)
        fill = np.round(self.fill) if np.issubdtype(img.dtype, np.integer) else self.fill
        values = tuple(float(v) for v in fill.astype(img.dtype)[: img.shape[2]])
        data["image"] = img.expand(new_h, new_w, y, x, values)
        _set_shape(data, data["image"])
        boxes = _boxes(data)
        if boxes is not None:
            data["gt_bbox"] = boxes + np.array([x, y, x, y], dtype=np.float32)
        return data


@TRANSFORMS.register
class RandomCrop:
    """SSD-style random crop.

    The IoU thresholds (plus ``"no_crop"`` when ``allow_no_crop``) are tried in a shuffled
    order. For a threshold, up to ``num_attempts`` crops are drawn: scale ``s ~ U[scaling]``,
    aspect ``a ~ U[max(ar_min, s^2), min(ar_max, s^-2)]``, size ``(h * s / sqrt(a), w * s * sqrt(a))``
    at a random position; a crop is accepted when some box has IoU >= threshold with it (all
    boxes with ``cover_all_box``) and at least one box centre lies inside. Boxes whose centre
    is inside are kept (clipped to the crop), the others dropped with their per-box fields.
    When ``"no_crop"`` comes up first or no crop is accepted the sample is left as it is, so a
    crop never empties a sample. Samples without boxes are not cropped.
    """

    def __init__(
        self,
        aspect_ratio: Optional[Sequence[float]] = (0.5, 2.0),
        thresholds: Sequence[float] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9),
        scaling: Sequence[float] = (0.3, 1.0),
        num_attempts: int = 50,
        allow_no_crop: bool = True,
        cover_all_box: bool = False,
        prob: float = 1.0,
    ) -> None:
        self.aspect_ratio = (
            None if aspect_ratio is None else _range(aspect_ratio, "RandomCrop.aspect_ratio", 1e-6)
        )
        self.scaling = _range(scaling, "RandomCrop.scaling", 1e-6)
        if self.scaling[1] > 1.0:
            raise ConfigError(f"RandomCrop.scaling must lie in (0, 1], got {scaling!r}")
        if not thresholds:
            raise ConfigError("RandomCrop.thresholds must not be empty")
        self.thresholds = [float(t) for t in thresholds]
        if num_attempts < 1:
            raise ConfigError(f"RandomCrop.num_attempts must be >= 1, got {num_attempts!r}")
        self.num_attempts = int(num_attempts)
        self.allow_no_crop = bool(allow_no_crop)
        self.cover_all_box = bool(cover_all_box)
        self.prob = _check_prob(prob, "RandomCrop.prob")

    def _draw(self, h: int, w: int) -> Optional[np.ndarray]:
        scale = np.random.uniform(*self.scaling)
        if self.aspect_ratio is not None:
            lo, hi = max(self.aspect_ratio[0], scale**2), min(self.aspect_ratio[1], scale**-2)
            root = np.sqrt(np.random.uniform(lo, hi))
            h_scale, w_scale = scale / root, scale * root
        else:
            h_scale, w_scale = np.random.uniform(*self.scaling), np.random.uniform(*self.scaling)
            if not 0.5 <= h_scale * h / max(w_scale * w, 1e-6) <= 2.0:
                return None
        crop_h, crop_w = min(h, int(h * h_scale)), min(w, int(w * w_scale))
        if crop_h < 1 or crop_w < 1:
            return None
        y = np.random.randint(0, h - crop_h + 1)
        x = np.random.randint(0, w - crop_w + 1)
        return np.array([x, y, x + crop_w, y + crop_h], dtype=np.float32)

    @staticmethod
    def _kept(boxes: np.ndarray, crop: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Boxes clipped to ``crop`` in crop coordinates, and the indices of those kept."""
        centres = (boxes[:, :2] + boxes[:, 2:]) / 2
        inside = np.all((centres >= crop[:2]) & (centres < crop[2:]), axis=1)
        clipped = np.concatenate(
            [np.maximum(boxes[:, :2], crop[:2]), np.minimum(boxes[:, 2:], crop[2:])], axis=1
        )
        clipped -= np.concatenate([crop[:2], crop[:2]])
        inside &= np.all(clipped[:, :2] < clipped[:, 2:], axis=1)
        return clipped, np.flatnonzero(inside)

    def __call__(self, data: Sample) -> Sample:
        img = _geometry(data, "RandomCrop")
        boxes = _boxes(data)
        if boxes is None or len(boxes) == 0 or random.random() > self.prob:
            return data
        h, w = img.shape[:2]
        choices: List[Any] = list(self.thresholds) + (["no_crop"] if self.allow_no_crop else [])
        order = np.random.permutation(len(choices))
        iou_with = BoxIoU(boxes)
        for idx in order:
            thresh = choices[idx]
            if thresh == "no_crop":
                return data
            for _ in range(self.num_attempts):
                crop = self._draw(h, w)
                if crop is None:
                    continue
                area = float((crop[2] - crop[0]) * (crop[3] - crop[1]))
                if not self.cover_all_box and iou_with.bound(area) < thresh - 1e-4:
                    continue  # no box can reach the threshold: the IoU need not be computed
                iou = iou_with(crop)
                if iou.max() < thresh or (self.cover_all_box and iou.min() < thresh):
                    continue
                clipped, keep = self._kept(boxes, crop)
                if keep.size == 0:
                    continue
                x1, y1, x2, y2 = (int(v) for v in crop)
                data["image"] = img.crop(x1, y1, x2, y2)
                _set_shape(data, data["image"])
                data["gt_bbox"] = clipped[keep]
                _take_boxes(data, keep)
                return data
        return data


@TRANSFORMS.register
class RandomFlip:
    """Mirror left-right with probability ``prob``; box x-coordinates become ``W - x``."""

    def __init__(self, prob: float = 0.5) -> None:
        self.prob = _check_prob(prob, "RandomFlip.prob")

    def __call__(self, data: Sample) -> Sample:
        img = _geometry(data, "RandomFlip")
        if np.random.uniform(0.0, 1.0) >= self.prob:
            return data
        w = img.shape[1]
        data["image"] = img.flip()
        boxes = _boxes(data)
        if boxes is not None and len(boxes):
            flipped = boxes.copy()
            flipped[:, 0] = w - boxes[:, 2]
            flipped[:, 2] = w - boxes[:, 0]
            data["gt_bbox"] = flipped
        return data


# ----------------------------------------------------------------------------- normalise / layout
# ----------------------------------------------------------------------------- batch ops
@TRANSFORMS.register
class BatchRandomResize:
    """Resize every sample of a batch to ONE size drawn from ``target_size`` (ints: squares, or
    [h, w] pairs) with ONE interpolation drawn from nearest/linear/area/cubic/lanczos4
    (``random_interp``; else ``interp``). Boxes are scaled and clipped, ``im_shape`` and
    ``scale_factor`` updated (see ``resize_detection``)."""

    batch_op = True

    def __init__(
        self,
        target_size: Union[int, Sequence[Any]] = tuple(range(320, 769, 32)),
        keep_ratio: bool = False,
        interp: Union[int, str] = cv2.INTER_NEAREST,
        random_size: bool = True,
        random_interp: bool = True,
    ) -> None:
        if random_size:
            if not isinstance(target_size, (list, tuple)) or not target_size:
                raise ConfigError(
                    "BatchRandomResize.target_size must be a non-empty list of sizes when "
                    f"random_size is true, got {target_size!r}"
                )
            self.sizes = [hw_size(s, "BatchRandomResize.target_size[]") for s in target_size]
        else:
            self.sizes = [hw_size(target_size, "BatchRandomResize.target_size")]
        self.keep_ratio = bool(keep_ratio)
        self.interp = cv_interp(interp, "BatchRandomResize.interp")
        self.random_interp = bool(random_interp)

    def training_sizes(self) -> List[Tuple[int, int]]:
        """Every (h, w) size a training batch can take, in ``target_size``'s order."""
        return list(self.sizes)

    def draw(self) -> Tuple[Tuple[int, int], int]:
        """The (h, w) size and cv2 interpolation for one batch."""
        size = self.sizes[int(np.random.randint(len(self.sizes)))]
        interp = (
            BATCH_INTERPS[int(np.random.randint(len(BATCH_INTERPS)))] if self.random_interp else self.interp
        )
        return size, interp

    def __call__(self, samples: List[Sample]) -> List[Sample]:
        size, interp = self.draw()
        return [resize_detection(s, size, self.keep_ratio, interp) for s in samples]


@TRANSFORMS.register
class PadGT:
    """Zero-pad the per-box arrays of every sample to N rows and add ``pad_gt_mask`` (N, 1)
    float32 (1 for real boxes). N is the batch's largest box count, at least 1 (so shapes are
    never empty), and at least ``num_max_boxes`` when that is set. ``gt_class`` becomes int64."""

    batch_op = True
    touches_image = False  # the image may be normalised on the device after it

    def __init__(self, num_max_boxes: Optional[int] = None) -> None:
        if num_max_boxes is not None and num_max_boxes < 1:
            raise ConfigError(f"PadGT.num_max_boxes must be a positive int or null, got {num_max_boxes!r}")
        self.num_max_boxes = num_max_boxes

    def __call__(self, samples: List[Sample]) -> List[Sample]:
        counts = [len(_boxes(s)) if "gt_bbox" in s else 0 for s in samples]
        n = max([1, self.num_max_boxes or 1] + counts)
        for sample, count in zip(samples, counts):
            boxes = np.zeros((n, 4), dtype=np.float32)
            if count:
                boxes[:count] = _boxes(sample)
            sample["gt_bbox"] = boxes
            classes = np.zeros((n, 1), dtype=np.int64)
            if count:
                classes[:count] = np.asarray(sample["gt_class"]).reshape(count, 1)
            sample["gt_class"] = classes
            for key in BOX_FIELDS[1:]:
                if key in sample:
                    arr = np.asarray(sample[key])
                    arr = arr.reshape(count, arr.size // count if count else 1)
                    padded = np.zeros((n, arr.shape[1]), dtype=arr.dtype)
                    padded[:count] = arr
                    sample[key] = padded
            mask = np.zeros((n, 1), dtype=np.float32)
            mask[:count] = 1.0
            sample["pad_gt_mask"] = mask
        return samples
