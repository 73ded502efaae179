"""Data transforms of PaddleDetection (``{Op: {...}}``) and PaddleSeg (``{type: Op, ...}``) -> ppdist.

An op ppdist does not have is dropped and listed; an option ppdist's op does not have is listed
unless it holds the value that ppdist's op behaves as.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional

from ppdist.convert.configs.common import Keys, Report, component, same_value
from ppdist.registry import TRANSFORMS


class Op(NamedTuple):
    """How one Paddle op maps: ppdist name, Paddle's defaults, options ppdist fixes to one value."""

    name: str
    defaults: Dict[str, Any]
    fixed: Dict[str, Any] = {}
    required: tuple = ()


IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]

DET_OPS: Dict[str, Op] = {
    "Decode": Op("Decode", {}),
    "RandomExpand": Op("RandomExpand", {"ratio": 4.0, "prob": 0.5, "fill_value": [127.5, 127.5, 127.5]}),
    "RandomCrop": Op(
        "RandomCrop",
        {
            "aspect_ratio": [0.5, 2.0],
            "thresholds": [0.0, 0.1, 0.3, 0.5, 0.7, 0.9],
            "scaling": [0.3, 1.0],
            "num_attempts": 50,
            "allow_no_crop": True,
            "cover_all_box": False,
            "prob": 1.0,
        },
        fixed={"is_mask_crop": False, "ioumode": "iou"},
    ),
    "RandomFlip": Op("RandomFlip", {"prob": 0.5}, fixed={"is_mask_flip": False}),
    "Resize": Op("Resize", {"interp": 1}, required=("target_size", "keep_ratio")),
    "NormalizeImage": Op(
        "NormalizeImage",
        {"mean": IMAGENET_MEAN, "std": IMAGENET_STD, "is_scale": True, "norm_type": "mean_std"},
    ),
    "Permute": Op("Permute", {}),
    "RandomResize": Op(
        "RandomResize",
        {"keep_ratio": True, "interp": 1, "random_range": False, "random_size": True, "random_interp": False},
        required=("target_size",),
    ),
    "PadBatch": Op("PadBatch", {"pad_to_stride": 0}),
    "BatchRandomResize": Op(
        "BatchRandomResize",
        {"interp": 0, "random_size": True, "random_interp": False},
        required=("target_size", "keep_ratio"),
    ),
}
SEG_OPS: Dict[str, Op] = {
    "ResizeStepScaling": Op(
        "ResizeStepScaling", {"min_scale_factor": 0.75, "max_scale_factor": 1.25, "scale_step_size": 0.25}
    ),
    "RandomPaddingCrop": Op(
        "RandomPaddingCrop",
        {"crop_size": [512, 512], "im_padding_value": 127.5, "label_padding_value": 255},
        fixed={"category_max_ratio": 1.0},
    ),
    "RandomHorizontalFlip": Op("RandomHorizontalFlip", {"prob": 0.5}),
    "RandomVerticalFlip": Op("RandomVerticalFlip", {"prob": 0.1}),
    "RandomDistort": Op(
        "RandomDistort",
        {
            "brightness_range": 0.5,
            "brightness_prob": 0.5,
            "contrast_range": 0.5,
            "contrast_prob": 0.5,
            "saturation_range": 0.5,
            "saturation_prob": 0.5,
            "hue_range": 18,
            "hue_prob": 0.5,
            "sharpness_range": 0.5,
            "sharpness_prob": 0,
        },
    ),
    "Normalize": Op("Normalize", {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}),
    "Resize": Op(
        "Resize",
        {"target_size": [512, 512], "keep_ratio": False, "interp": "LINEAR"},
        fixed={"size_divisor": None},
    ),
}


def _convert_op(op: Op, params: Keys) -> Dict[str, Any]:
    values = dict(op.defaults)
    explicit: List[str] = []
    for key in list(params.data):
        if key in op.fixed:
            params.expect(key, op.fixed[key], f"ppdist's {op.name} has no such option")
        elif key in op.defaults or key in op.required:
            values[key] = params.get(key)
            explicit.append(key)
    params.finish(f"ppdist's {op.name} has no such option")
    return component(TRANSFORMS, op.name, values, explicit)


def _one_channel_triplets(entry: Dict[str, Any]) -> Dict[str, Any]:
    """PaddleSeg's ``Normalize(mean=(0.5,))`` broadcasts one value over the channels."""
    for key in ("mean", "std"):
        value = entry.get(key)
        if isinstance(value, list) and len(value) == 1:
            entry[key] = value * 3
    return entry


def _det_distort(params: Keys, report: Report) -> Dict[str, Any]:
    """PaddleDetection's ``[lower, upper, prob]`` lists -> ppdist's symmetric ``*_range``/``*_prob``."""
    values: Dict[str, Any] = {"sharpness_prob": 0}
    defaults = {
        "hue": [-18, 18, 0.5],
        "saturation": [0.5, 1.5, 0.5],
        "contrast": [0.5, 1.5, 0.5],
        "brightness": [0.5, 1.5, 0.5],
    }
    explicit = []
    for key, default in defaults.items():
        low, high, prob = params.get(key, default)
        centre = 0.0 if key == "hue" else 1.0
        if abs((low + high) / 2 - centre) > 1e-9:
            report.unmapped_key(
                params.key_path(key),
                f"ppdist's RandomDistort draws a range symmetric around "
                f"{centre:g}; used +-{(high - low) / 2:g}",
                [low, high, prob],
            )
        values[f"{key}_range"] = (high - low) / 2
        values[f"{key}_prob"] = prob
        if key in params:
            explicit += [f"{key}_range", f"{key}_prob"]
    params.expect(
        "random_apply", True, "ppdist applies the ops in a random order (PaddleDetection's random_apply)"
    )
    params.expect("count", 4, "ppdist applies all four ops")
    params.expect("random_channel", False, "no channel swap in ppdist")
    params.expect("prob", 1.0, "ppdist's RandomDistort always runs")
    params.finish("ppdist's RandomDistort has no such option")
    return component(TRANSFORMS, "RandomDistort", values, explicit)


def _det_pad_gt(params: Keys, report: Report) -> Dict[str, Any]:
    params.expect("return_gt_mask", True, "ppdist always adds pad_gt_mask")
    params.expect("pad_img", False, "images are resized to one size per batch")
    minimum = params.get("minimum_gtnum", 0)
    params.finish("ppdist's PadGT has no such option")
    return {"name": "PadGT", "num_max_boxes": int(minimum)} if minimum else {"name": "PadGT"}


_SPECIAL: Dict[str, Callable[[Keys, Report], Dict[str, Any]]] = {
    "RandomDistort": _det_distort,
    "PadGT": _det_pad_gt,
}


def _as_entry(raw: Any) -> Optional[tuple]:
    """``(name, params)`` of ``{Op: {...}}`` or a tagged ``{name: Op, ...}``; None when malformed."""
    if isinstance(raw, Mapping) and "name" in raw and len(raw) != 1:
        return raw["name"], {k: v for k, v in raw.items() if k != "name"}
    if isinstance(raw, Mapping) and len(raw) == 1:
        ((name, params),) = raw.items()
        if isinstance(params, Mapping) or params is None:
            return name, dict(params or {})
    return None


def _to_ppdist(entry: Dict[str, Any]) -> Dict[str, Any]:
    name = entry.pop("name")
    return {name: entry}


def convert_det_transforms(ops: Any, path: str, report: Report) -> List[Dict[str, Any]]:
    """PaddleDetection ``sample_transforms``/``batch_transforms`` -> ppdist ``[{Op: {...}}, ...]``."""
    out = []
    for i, raw in enumerate(ops or []):
        where = f"{path}[{i}]"
        parsed = _as_entry(raw)
        if parsed is None:
            report.unmapped_key(where, "not a {Op: params} entry; dropped", raw)
            continue
        name, params = parsed
        keys = Keys(params, f"{where}.{name}", report)
        if name in _SPECIAL:
            out.append(_to_ppdist(_SPECIAL[name](keys, report)))
        elif name in DET_OPS:
            out.append(_to_ppdist(_convert_op(DET_OPS[name], keys)))
        else:
            report.unmapped_key(f"{where}.{name}", "ppdist has no such transform; dropped", params or None)
    return out


def convert_seg_transforms(ops: Any, path: str, report: Report) -> List[Dict[str, Any]]:
    """PaddleSeg ``transforms: [{type: Op, ...}, ...]`` -> ppdist ``[{Op: {...}}, ...]``."""
    out = []
    for i, raw in enumerate(ops or []):
        where = f"{path}[{i}]"
        if not isinstance(raw, Mapping) or "type" not in raw:
            report.unmapped_key(where, "not a {type: Op, ...} entry; dropped", raw)
            continue
        name = raw["type"]
        params = {k: v for k, v in raw.items() if k != "type"}
        if name not in SEG_OPS:
            report.unmapped_key(f"{where}.{name}", "ppdist has no such transform; dropped", params or None)
            continue
        if name == "Normalize":
            params = _one_channel_triplets(params)
        keys = Keys(params, f"{where}.{name}", report)
        if name == "RandomPaddingCrop" and same_value(params.get("category_max_ratio", 1.0), 1.0):
            keys.get("ignore_index")  # only used with category_max_ratio < 1
            keys.get("loop_times")
        out.append(_to_ppdist(_convert_op(SEG_OPS[name], keys)))
    return out
