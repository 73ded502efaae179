"""Load a YAML config (PaddleOCR schema), merge ``_BASE_`` files, apply ``-o`` overrides, validate.

The resolved config is a plain ``dict`` with the sections Global, Architecture, Loss,
Optimizer, PostProcess, Metric, Train and Eval. Validation runs before any process group
or data is touched and raises ``ConfigError`` with the file, the key path and the closest
valid names.
"""

from __future__ import annotations

import copy
import inspect
import os
import re
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import yaml

from ppdist.errors import ConfigError
from ppdist.registry import SYNTHETIC_DATA, _type_matches, did_you_mean
from ppdist.utils.atomic import write_text_atomic

STAGE_PRETRAINED_KEY = "pretrained"  # Architecture.Backbone.pretrained: backbone-only weights
SECTIONS = ("Global", "Architecture", "Loss", "Optimizer", "PostProcess", "Metric", "Train", "Eval")
BASE_KEY = "_BASE_"

# Global keys that are injected into any component (transform, post-process, ...) whose
# constructor has a parameter of the same name; Global wins, as in PaddleOCR.
# Unset (null) Global values are not injected.
SHARED_GLOBAL_KEYS = (
    "character_dict_path",
    "max_text_length",
    "use_space_char",
    "infer_mode",
    "num_classes",
    "ignore_index",
    "width_mult",
    "depth_mult",
)


class YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-5`` (no dot) as a float, unlike YAML 1.1."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_value(text: str) -> Any:
    """Parse an override value as YAML (``[0, 500]`` -> list, ``1e-5`` -> float, ``a`` -> str)."""
    try:
        return yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError:
        return text


# --------------------------------------------------------------------------- Global schema
class GlobalKey:
    """One documented ``Global`` key: accepted types, default and a one-line description."""

    def __init__(self, types: Tuple[type, ...], default: Any, doc: str, choices: Sequence[Any] = ()) -> None:
        self.types = types
        self.default = default
        self.doc = doc
        self.choices = tuple(choices)


_NONE = type(None)
_NUM = (int, float)
GLOBAL_SCHEMA: Dict[str, GlobalKey] = {
    "use_gpu": GlobalKey((bool,), True, "Train on CUDA when available; falls back to CPU with a warning."),
    "epoch_num": GlobalKey((int, _NONE), None, "Number of epochs (or set max_iters)."),
    "max_iters": GlobalKey((int, _NONE), None, "Iteration budget; replaces epoch_num when set."),
    "log_smooth_window": GlobalKey((int,), 20, "Median window of the logged loss/metric values."),
    "print_batch_step": GlobalKey((int,), 10, "Log every N global steps."),
    "save_model_dir": GlobalKey((str,), "./output/run", "Where checkpoints, train.log and config.yml go."),
    "save_epoch_step": GlobalKey((int,), 1, "Keep an iter_epoch_N checkpoint every N epochs."),
    "save_iter_step": GlobalKey(
        (int, _NONE),
        None,
        "Also write 'latest' every N global steps (mid-epoch), so a restart loses little work.",
    ),
    "eval_batch_step": GlobalKey(
        (list, int), [0, 2000], "[start, interval] in global steps; an int means [0, int]."
    ),
    "eval_batch_epoch": GlobalKey((int, _NONE), None, "Evaluate every N epochs instead of eval_batch_step."),
    "cal_metric_during_train": GlobalKey(
        (bool,), False, "Compute the metric on each training batch for the log."
    ),
    "pretrained_model": GlobalKey(
        (str, _NONE),
        None,
        "Weights to start from: a ppdist .pt or a Paddle .pdparams "
        "(or its prefix), converted on load; shape mismatches are skipped and listed.",
    ),
    "checkpoints": GlobalKey(
        (str, _NONE), None, "Checkpoint to resume from, or 'auto' for save_model_dir/latest."
    ),
    "save_inference_dir": GlobalKey((str, _NONE), None, "Export directory (tools/export_model.py)."),
    "use_visualdl": GlobalKey((bool,), False, "Paddle's VisualDL switch; mapped to TensorBoard."),
    "use_tensorboard": GlobalKey((bool,), False, "Write TensorBoard scalars to save_model_dir/tensorboard."),
    "infer_img": GlobalKey((str, _NONE), None, "Image or folder for tools/infer.py."),
    "character_dict_path": GlobalKey(
        (str, _NONE), None, "Dictionary file, one character per line; none = 0-9a-z."
    ),
    "character_type": GlobalKey((str, _NONE), None, "Legacy PaddleOCR key; has no effect."),
    "max_text_length": GlobalKey((int,), 25, "Longest label kept by CTCLabelEncode."),
    "infer_mode": GlobalKey((bool,), False, "Inference resize mode for RecResizeImg."),
    "use_space_char": GlobalKey((bool,), False, "Append a space to the dictionary."),
    "save_res_path": GlobalKey((str, _NONE), None, "Where tools/infer.py writes its results."),
    "seed": GlobalKey((int,), 1024, "Seed of model init, shuffling and augmentation."),
    "use_amp": GlobalKey(
        (bool,), False, "Automatic mixed precision on CUDA (ignored with a warning on CPU)."
    ),
    "amp_dtype": GlobalKey((str,), "float16", "AMP dtype.", choices=("float16", "bfloat16")),
    "amp_level": GlobalKey(
        (str,), "O1", "Paddle AMP level; both levels map to torch.autocast.", choices=("O1", "O2")
    ),
    "scale_loss": GlobalKey(_NUM, 65536.0, "Initial loss scale of the fp16 GradScaler."),
    "use_dynamic_loss_scaling": GlobalKey((bool,), True, "Let the GradScaler adapt the scale."),
    "channels_last": GlobalKey(
        (bool,),
        True,
        "Run the model and 4-D inputs in channels_last memory format "
        "(measured faster for all three models, docs/benchmarks.md).",
    ),
    "use_sync_bn": GlobalKey((bool,), False, "Convert BatchNorm to SyncBatchNorm under multi-GPU DDP."),
    "find_unused_parameters": GlobalKey((bool,), False, "DDP find_unused_parameters."),
    "gradient_as_bucket_view": GlobalKey(
        (bool, _NONE),
        None,
        "DDP gradients as views of its communication buckets (saves a copy); "
        "null: on with CUDA, off on CPU (measured faster, docs/benchmarks.md).",
    ),
    "bucket_cap_mb": GlobalKey(
        _NUM + (_NONE,), None, "DDP all-reduce bucket size in MB (null: PyTorch's 25)."
    ),
    "static_graph": GlobalKey(
        (bool,), False, "DDP static_graph: the set of used parameters never changes between steps."
    ),
    "compile": GlobalKey(
        (bool, dict),
        False,
        "torch.compile the training forward: true, or {mode, dynamic, fullgraph, backend}.",
    ),
    "use_ema": GlobalKey(
        (bool,), False, "Keep an exponential moving average of the weights for eval/saving."
    ),
    "ema_decay": GlobalKey(_NUM, 0.9998, "EMA decay."),
    "ema_decay_type": GlobalKey(
        (str,),
        "constant",
        "'threshold' ramps the decay as min(decay, (1 + t) / (10 + t)) (PaddleDetection).",
        choices=("constant", "threshold"),
    ),
    "grad_clip": GlobalKey(_NUM + (_NONE,), None, "Clip the global gradient norm to this value."),
    "dist_timeout": GlobalKey((int,), 1800, "Seconds before a collective that waits on a dead peer fails."),
    "auto_scale_lr": GlobalKey(
        (dict, _NONE),
        None,
        "{base_batch_size: N[, enable: true]}: scale every learning rate by global batch / N; "
        "also allows resuming with another number of processes.",
    ),
    "max_bad_sample_ratio": GlobalKey(
        _NUM, 0.1, "Fail the run when more than this fraction of samples is bad."
    ),
    "log_ranks": GlobalKey((str, int), "0", "Accepted for compatibility; only rank 0 logs."),
    "print_mem_info": GlobalKey((bool,), True, "Append max CUDA memory to log lines."),
    "distributed": GlobalKey((bool, _NONE), None, "Ignored: set from the launch environment."),
    "num_classes": GlobalKey(
        (int, _NONE),
        None,
        "Class count given to every component that takes num_classes (head, loss, metric, dataset).",
    ),
    "ignore_index": GlobalKey(
        (int, _NONE),
        None,
        "Label value excluded from loss and metric, given to every component that takes it "
        "(components default to 255).",
    ),
    "width_mult": GlobalKey(
        _NUM + (_NONE,),
        None,
        "Detection: channel multiplier given to every component that takes width_mult (PP-YOLOE s/m/l/x).",
    ),
    "depth_mult": GlobalKey(
        _NUM + (_NONE,),
        None,
        "Detection: block-count multiplier given to every component that takes depth_mult.",
    ),
    "synthetic_data": GlobalKey(
        (dict, _NONE), None, "{kind, data_dir, num_train, num_val, seed}: generate data there if absent."
    ),
}
# Paddle keys we know but do not implement: accepted only when off/empty.
UNSUPPORTED_GLOBAL = {
    "to_static": "Paddle dynamic-to-static compilation (use Global.compile: torch.compile)",
    "use_wandb": "Weights & Biases logging (use use_tensorboard)",
    "use_xpu": "XPU devices",
    "use_npu": "NPU devices",
    "use_mlu": "MLU devices",
    "uniform_output_enabled": "PaddleX output layout",
    "amp_custom_black_list": "custom AMP op lists",
    "amp_custom_white_list": "custom AMP op lists",
    "d2s_train_image_shape": "dynamic-to-static shapes",
    "pdx_model_name": "PaddleX model names",
}
LOADER_SCHEMA: Dict[str, Tuple[Tuple[type, ...], Any]] = {
    "batch_size_per_card": ((int,), None),
    "shuffle": ((bool,), False),
    "drop_last": ((bool,), False),
    "num_workers": ((int,), 0),
    "use_shared_memory": ((bool,), True),
    "pin_memory": ((bool, _NONE), None),
    "persistent_workers": ((bool, _NONE), None),
    "prefetch_factor": ((int, _NONE), None),
    "cv2_num_threads": ((int,), 0),
}


# --------------------------------------------------------------------------- loading
def read_yaml_mapping(path: str, loader: type = YamlLoader) -> Dict[str, Any]:
    """The top-level mapping of one YAML file (no inheritance); ``ConfigError`` naming the file otherwise."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = yaml.load(handle, Loader=loader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def merge_dicts(base: Mapping[str, Any], child: Mapping[str, Any]) -> Dict[str, Any]:
    """Recursive merge: dicts merge, lists and scalars are replaced, the child wins."""
    out = copy.deepcopy(dict(base))
    for key, value in child.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_dicts(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_yaml_with_bases(path: str, _seen: Optional[Tuple[str, ...]] = None) -> Dict[str, Any]:
    """Read ``path`` and merge its ``_BASE_`` files (relative to it) underneath it."""
    real = os.path.realpath(path)
    seen = _seen or ()
    if real in seen:
        raise ConfigError(f"{path}: circular _BASE_ inheritance: " + " -> ".join(seen + (real,)))
    data = read_yaml_mapping(path)
    bases = data.pop(BASE_KEY, None) or []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list):
        raise ConfigError(f"{path}: {BASE_KEY} must be a list of file paths")
    merged: Dict[str, Any] = {}
    for base in bases:
        base_path = base if os.path.isabs(base) else os.path.join(os.path.dirname(path), base)
        if not os.path.isfile(base_path):
            raise ConfigError(f"{path}: {BASE_KEY} file not found: {base} (resolved to {base_path})")
        merged = merge_dicts(merged, load_yaml_with_bases(base_path, seen + (real,)))
    return merge_dicts(merged, data)


def apply_overrides(config: Dict[str, Any], overrides: Iterable[str], source: str = "-o") -> Dict[str, Any]:
    """Apply ``Section.key.sub=value`` overrides in place (values parsed as YAML).

    Integer path parts index into lists (``Train.dataset.transforms.2.RecResizeImg...``).
    """
    for item in overrides or ():
        if "=" not in item:
            raise ConfigError(f"{source} {item!r}: expected Key.sub=value")
        key, text = item.split("=", 1)
        value = parse_value(text)
        parts = key.strip().split(".")
        if parts[0] not in SECTIONS:
            raise ConfigError(
                f"{source} {item!r}: unknown section {parts[0]!r}.{did_you_mean(parts[0], SECTIONS)}"
            )
        if len(parts) == 1:
            if not isinstance(value, dict):
                raise ConfigError(f"{source} {item!r}: a whole section needs a mapping value")
            config[parts[0]] = merge_dicts(config.get(parts[0]) or {}, value)
            continue
        node: Any = config.setdefault(parts[0], {})
        for depth, part in enumerate(parts[1:-1], start=1):
            node = _step_into(node, part, ".".join(parts[: depth + 1]), item, source)
        last = parts[-1]
        if isinstance(node, list):
            node[_list_index(node, last, key, item, source)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError(f"{source} {item!r}: {'.'.join(parts[:-1])} is not a mapping")
    return config


def _list_index(node: list, part: str, path: str, item: str, source: str) -> int:
    if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
        raise ConfigError(f"{source} {item!r}: {path} needs a list index in [0, {len(node)})")
    return int(part)


def _step_into(node: Any, part: str, path: str, item: str, source: str) -> Any:
    if isinstance(node, list):
        return node[_list_index(node, part, path, item, source)]
    if not isinstance(node, dict):
        raise ConfigError(f"{source} {item!r}: {path} is not a mapping")
    if node.get(part) is None:
        node[part] = {}
    return node[part]


# --------------------------------------------------------------------------- validation
def _check_type(value: Any, types: Tuple[type, ...], path: str) -> None:
    if not any(_type_matches(value, t) for t in types):
        names = " or ".join("null" if t is _NONE else t.__name__ for t in types)
        raise ConfigError(f"wrong type for {path}: expected {names}, got {type(value).__name__} ({value!r})")


COMPILE_KEYS = ("mode", "dynamic", "fullgraph", "backend", "options")


def compile_options(glob: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """``torch.compile`` keyword arguments from ``Global.compile`` (None when off)."""
    setting = glob.get("compile")
    if not setting:
        return None
    if setting is True:
        return {}
    unknown = sorted(set(setting) - set(COMPILE_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key(s) in Global.compile: {unknown}; expected some of {list(COMPILE_KEYS)} "
            f"(torch.compile's arguments), or true"
        )
    return dict(setting)


def _validate_global(config: Dict[str, Any]) -> None:
    glob = config.setdefault("Global", {}) or {}
    config["Global"] = glob
    for key, value in list(glob.items()):
        if key in UNSUPPORTED_GLOBAL:
            if value:
                raise ConfigError(
                    f"Global.{key} is not supported yet ({UNSUPPORTED_GLOBAL[key]}); "
                    f"remove it or set it to false/empty"
                )
            continue
        if key not in GLOBAL_SCHEMA:
            raise ConfigError(f"unknown key Global.{key}.{did_you_mean(key, GLOBAL_SCHEMA)}")
        spec = GLOBAL_SCHEMA[key]
        if value is None and spec.default is not None and _NONE not in spec.types:
            glob[key] = value = spec.default  # an empty YAML value means "default"
        _check_type(value, spec.types, f"Global.{key}")
        if spec.choices and value not in spec.choices:
            raise ConfigError(f"Global.{key} must be one of {list(spec.choices)}, got {value!r}")
    for key, spec in GLOBAL_SCHEMA.items():
        glob.setdefault(key, copy.deepcopy(spec.default))
    if glob["epoch_num"] is None and glob["max_iters"] is None:
        raise ConfigError("missing required key Global.epoch_num (or Global.max_iters)")
    compile_options(glob)
    step = glob["eval_batch_step"]
    if isinstance(step, int):
        glob["eval_batch_step"] = [0, step]
    elif len(step) != 2 or not all(isinstance(s, int) for s in step):
        raise ConfigError(f"Global.eval_batch_step must be [start, interval] integers, got {step!r}")
    if glob["eval_batch_step"][1] <= 0:
        raise ConfigError("Global.eval_batch_step interval must be > 0")
    if glob["synthetic_data"]:
        validate_synthetic_spec(glob["synthetic_data"])
    if glob["print_batch_step"] <= 0 or glob["log_smooth_window"] <= 0 or glob["save_epoch_step"] <= 0:
        raise ConfigError("Global.print_batch_step, log_smooth_window and save_epoch_step must be > 0")
    if glob["save_iter_step"] is not None and glob["save_iter_step"] <= 0:
        raise ConfigError(
            f"Global.save_iter_step must be a positive number of steps (or null), got {glob['save_iter_step']}"
        )
    if glob["auto_scale_lr"] is not None:
        _validate_auto_scale_lr(glob["auto_scale_lr"])


def synthetic_generator(spec: Mapping[str, Any]) -> Callable[..., Dict[str, Any]]:
    """The data set generator of ``Global.synthetic_data.kind``."""
    kind = spec.get("kind")
    if kind not in SYNTHETIC_DATA:
        raise ConfigError(f"Global.synthetic_data.kind must be one of {SYNTHETIC_DATA.names()}, got {kind!r}")
    return SYNTHETIC_DATA.get(kind)


def validate_synthetic_spec(spec: Mapping[str, Any]) -> None:
    """Check ``{kind, data_dir, ...generator keywords}`` against the generator's signature."""
    generator = synthetic_generator(spec)
    if not spec.get("data_dir"):
        raise ConfigError("missing required key Global.synthetic_data.data_dir")
    params = inspect.signature(generator).parameters
    for key in spec:
        if key in ("kind", "data_dir"):
            continue
        if key not in params or key == "out_dir":
            raise ConfigError(
                f"unknown key Global.synthetic_data.{key}."
                f"{did_you_mean(key, [p for p in params if p != 'out_dir'])}"
            )


def _validate_auto_scale_lr(spec: Mapping[str, Any]) -> None:
    for key in spec:
        if key not in ("base_batch_size", "enable"):
            raise ConfigError(
                f"unknown key Global.auto_scale_lr.{key}.{did_you_mean(key, ['base_batch_size', 'enable'])}"
            )
    base = spec.get("base_batch_size")
    if not isinstance(base, int) or isinstance(base, bool) or base <= 0:
        raise ConfigError(
            f"Global.auto_scale_lr.base_batch_size must be a positive integer (the global batch the "
            f"learning rate was tuned for), got {base!r}"
        )
    if not isinstance(spec.get("enable", True), bool):
        raise ConfigError(f"Global.auto_scale_lr.enable must be true or false, got {spec['enable']!r}")


def auto_scale_lr_base(glob: Mapping[str, Any]) -> Optional[int]:
    """``Global.auto_scale_lr.base_batch_size`` when LR scaling is on, else None."""
    spec = glob.get("auto_scale_lr")
    if not spec or not spec.get("enable", True):
        return None
    return int(spec["base_batch_size"])


def shared_global_values(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The Global values injected into components (see ``SHARED_GLOBAL_KEYS``)."""
    glob = config.get("Global") or {}
    return {k: glob[k] for k in SHARED_GLOBAL_KEYS if glob.get(k) is not None}


def inject_globals(
    registry: Any, name: str, kwargs: Dict[str, Any], shared: Mapping[str, Any]
) -> Dict[str, Any]:
    """``kwargs`` plus the shared Global values the constructor ``name`` accepts (Global wins)."""
    accepted, _ = registry.accepted_keys(name)
    out = dict(kwargs)
    out.update({k: v for k, v in shared.items() if k in accepted})
    return out


def component_kwargs(registry: Any, entry: Mapping[str, Any], config: Mapping[str, Any]) -> Dict[str, Any]:
    """The keyword arguments of the component ``entry`` (``{name, **kwargs}``): its own, without the
    name, plus the shared Global values of ``config`` that its constructor accepts (Global wins)."""
    kwargs = {k: v for k, v in entry.items() if k != "name"}
    return inject_globals(registry, entry["name"], kwargs, shared_global_values(config))


def _check_component(
    registry: Any, entry: Any, where: str, config: Mapping[str, Any], injected: Sequence[str] = ()
) -> None:
    if not isinstance(entry, dict) or "name" not in entry:
        raise ConfigError(f"{where} needs a mapping with a 'name' key, got {entry!r}")
    registry.get(entry["name"], f"{where}.name")
    registry.check(entry["name"], component_kwargs(registry, entry, config), where, injected=injected)


def _check_transforms(ops: Any, where: str, config: Mapping[str, Any]) -> None:
    from ppdist.registry import TRANSFORMS

    if not isinstance(ops, list):
        raise ConfigError(f"{where} must be a list of {{OpName: params}} entries")
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or len(op) != 1:
            raise ConfigError(f"{where}[{i}] must be a one-key mapping {{OpName: params}}, got {op!r}")
        ((name, params),) = op.items()
        params = params or {}
        if not isinstance(params, dict):
            raise ConfigError(f"{where}[{i}].{name} parameters must be a mapping, got {params!r}")
        _check_component(TRANSFORMS, dict(params, name=name), f"{where}[{i}].{name}", config)


def _validate_data_section(config: Dict[str, Any], section: str) -> None:
    from ppdist.registry import DATASETS

    part = config.get(section)
    if part is None:
        return
    if not isinstance(part, dict):
        raise ConfigError(f"{section} must be a mapping with 'dataset' and 'loader'")
    for key in part:
        if key not in ("dataset", "loader"):
            raise ConfigError(f"unknown key {section}.{key}.{did_you_mean(key, ['dataset', 'loader'])}")
    dataset = part.get("dataset")
    if not isinstance(dataset, dict) or "name" not in dataset:
        raise ConfigError(f"missing required key {section}.dataset.name")
    DATASETS.get(dataset["name"], f"{section}.dataset.name")
    own = {k: v for k, v in dataset.items() if k not in ("transforms", "batch_transforms")}
    kwargs = component_kwargs(DATASETS, own, config)
    DATASETS.check(dataset["name"], kwargs, f"{section}.dataset", injected=("transforms", "mode", "seed"))
    _check_transforms(dataset.get("transforms") or [], f"{section}.dataset.transforms", config)
    _check_transforms(dataset.get("batch_transforms") or [], f"{section}.dataset.batch_transforms", config)
    loader = part.get("loader") or {}
    if not isinstance(loader, dict):
        raise ConfigError(f"{section}.loader must be a mapping")
    for key, value in loader.items():
        if key not in LOADER_SCHEMA:
            hint = (
                " Custom samplers/collate functions are not supported yet."
                if key in ("sampler", "collate_fn")
                else ""
            )
            raise ConfigError(f"unknown key {section}.loader.{key}.{did_you_mean(key, LOADER_SCHEMA)}{hint}")
        if value is not None:
            _check_type(value, LOADER_SCHEMA[key][0], f"{section}.loader.{key}")
    if loader.get("batch_size_per_card") is None:
        raise ConfigError(f"missing required key {section}.loader.batch_size_per_card")
    if loader["batch_size_per_card"] <= 0:
        raise ConfigError(f"{section}.loader.batch_size_per_card must be > 0")
    for key, (_, default) in LOADER_SCHEMA.items():
        if loader.get(key) is None:
            loader[key] = default
    part["loader"] = loader


def _validate_optimizer(config: Dict[str, Any]) -> None:
    from ppdist.engine.optim import OPTIMIZER_COMMON_KEYS
    from ppdist.registry import LR_SCHEDULERS, OPTIMIZERS, REGULARIZERS

    opt = config.get("Optimizer")
    if not isinstance(opt, dict) or "name" not in opt:
        raise ConfigError("missing required key Optimizer.name")
    kwargs = {k: v for k, v in opt.items() if k not in ("name",) + OPTIMIZER_COMMON_KEYS}
    OPTIMIZERS.check(opt["name"], kwargs, "Optimizer", injected=("params",))
    lr = opt.get("lr")
    if lr is None:
        raise ConfigError("missing required key Optimizer.lr (a number or {name, learning_rate, ...})")
    if isinstance(lr, dict):
        entry = dict(lr)
        entry.setdefault("name", "Const")
        LR_SCHEDULERS.check(
            entry["name"],
            {k: v for k, v in entry.items() if k != "name"},
            "Optimizer.lr",
            injected=("epochs", "step_each_epoch", "total_steps"),
        )
    else:
        _check_type(lr, _NUM, "Optimizer.lr")
    reg = opt.get("regularizer")
    if reg:
        if not isinstance(reg, dict) or "name" not in reg:
            raise ConfigError("Optimizer.regularizer needs {name: L2, factor: ...}")
        REGULARIZERS.check(
            reg["name"], {k: v for k, v in reg.items() if k != "name"}, "Optimizer.regularizer"
        )
    for key in ("clip_norm", "clip_norm_global"):
        if opt.get(key) is not None:
            _check_type(opt[key], _NUM, f"Optimizer.{key}")


def _without_stage_pretrained(entry: Dict[str, Any]) -> Dict[str, Any]:
    """``Architecture.Backbone`` minus its ``pretrained`` weights path (checked to be a path)."""
    value = entry[STAGE_PRETRAINED_KEY]
    if value is not None and not isinstance(value, str):
        raise ConfigError(
            f"Architecture.Backbone.{STAGE_PRETRAINED_KEY} must be a weights path (.pt or Paddle "
            f".pdparams) or null, got {value!r}"
        )
    if isinstance(value, str) and value.startswith(("http://", "https://")):
        raise ConfigError(
            f"Architecture.Backbone.{STAGE_PRETRAINED_KEY} is a URL ({value}); ppdist does not "
            f"download weights: download the file and give its local path"
        )
    return {k: v for k, v in entry.items() if k != STAGE_PRETRAINED_KEY}


def _validate_architecture(config: Dict[str, Any]) -> None:
    from ppdist.registry import BACKBONES, HEADS, NECKS

    arch = config.get("Architecture")
    if not isinstance(arch, dict):
        raise ConfigError("missing required section Architecture")
    allowed = ("model_type", "algorithm", "Transform", "Backbone", "Neck", "Head", "in_channels")
    for key in arch:
        if key not in allowed:
            raise ConfigError(f"unknown key Architecture.{key}.{did_you_mean(key, allowed)}")
    if arch.get("Transform"):
        raise ConfigError("Architecture.Transform (e.g. TPS) is not supported yet; set it to null")
    for key, registry, required in (
        ("Backbone", BACKBONES, True),
        ("Neck", NECKS, False),
        ("Head", HEADS, True),
    ):
        entry = arch.get(key)
        if entry is None and not required:
            continue
        if entry is None:
            raise ConfigError(f"missing required key Architecture.{key}")
        if key == "Backbone" and isinstance(entry, dict) and STAGE_PRETRAINED_KEY in entry:
            entry = _without_stage_pretrained(entry)
        _check_component(
            registry, entry, f"Architecture.{key}", config, injected=("in_channels", "out_channels")
        )


def validate(config: Dict[str, Any]) -> Dict[str, Any]:
    """Check every section, fill defaults; raise ``ConfigError`` on the first problem."""
    from ppdist.registry import LOSSES, METRICS, POSTPROCESSES

    for key in config:
        if key not in SECTIONS:
            raise ConfigError(f"unknown section {key!r}.{did_you_mean(key, SECTIONS)}")
    _validate_global(config)
    _validate_architecture(config)
    for section, registry in (("Loss", LOSSES), ("PostProcess", POSTPROCESSES), ("Metric", METRICS)):
        if config.get(section) is None:
            raise ConfigError(f"missing required section {section}")
        _check_component(registry, config[section], section, config)
    for i, entry in enumerate(config["Loss"].get("types") or []):  # MultiOutputLoss entries
        _check_component(LOSSES, entry, f"Loss.types[{i}]", config)
    _validate_optimizer(config)
    if config.get("Train") is None and config.get("Eval") is None:
        raise ConfigError("the config needs a Train and/or an Eval section")
    for section in ("Train", "Eval"):
        _validate_data_section(config, section)
    return config


def load_config(path: str, overrides: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Load ``path`` with its ``_BASE_`` files, apply ``overrides`` and validate.

    Every ``ConfigError`` message starts with the config file it concerns. A PaddleDetection or
    PaddleSeg config is converted to ppdist's schema first (``ppdist.convert.config_convert``).
    """
    from ppdist.convert.config_convert import load_paddle_config

    try:
        config = load_paddle_config(path)
        if config is None:
            config = load_yaml_with_bases(path)
        apply_overrides(config, overrides or ())
        return validate(config)
    except ConfigError as exc:
        message = str(exc)
        if not message.startswith(path):
            message = f"{path}: {message}"
        raise ConfigError(message) from None


def dump_config(config: Mapping[str, Any], path: str) -> None:
    """Write the resolved config as YAML (atomically)."""
    write_text_atomic(path, yaml.safe_dump(dict(config), sort_keys=False, allow_unicode=True))
