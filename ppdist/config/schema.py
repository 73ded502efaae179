"""The config schema: the sections, the documented ``Global`` keys and the other known keys.

Constants only; ``validate`` checks a config against them. Every task uses the same schema,
PaddleOCR's sections, which a Paddle user already reads fluently.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

STAGE_PRETRAINED_KEY = "pretrained"  # Architecture.Backbone.pretrained: backbone-only weights
# wandb: PaddleOCR's Weights & Biases settings (optional; ppdist.config.trackers checks it)
SECTIONS = ("Global", "Architecture", "Loss", "Optimizer", "PostProcess", "Metric", "Train", "Eval", "wandb")
BASE_KEY = "_BASE_"
ARCHITECTURE_KEYS = (
    "name",
    "model_type",
    "algorithm",
    "Transform",
    "Backbone",
    "Neck",
    "Head",
    "in_channels",
    "return_all_feats",
)
DISTILLATION_KEYS = ("name", "model_type", "algorithm", "Models")  # Architecture.name: DistillationModel
DISTILLATION_MODEL_KEYS = ("freeze_params", "pretrained")  # keys of a Models entry besides ARCHITECTURE_KEYS
# Optimizer keys ppdist handles itself; every other key is an argument of the optimizer named by ``name``
OPTIMIZER_COMMON_KEYS = ("lr", "regularizer", "clip_norm", "clip_norm_global", "fused")

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
    "max_image_pixels",
    "cuda_graph",
)


class GlobalKey:
    """One documented ``Global`` key: accepted types, default and a one-line description."""

    def __init__(self, types: Tuple[type, ...], default: Any, doc: str, choices: Sequence[Any] = ()) -> None:
        self.types = types
        self.default = default
        self.doc = doc
        self.choices = tuple(choices)


NONE_TYPE = type(None)
NUMBER_TYPES = (int, float)
MAX_ACCUMULATE_STEPS = 65536  # micro-batches per optimizer step: far past any real use, refused above

GLOBAL_SCHEMA: Dict[str, GlobalKey] = {
    "use_gpu": GlobalKey((bool,), True, "Train on CUDA when available; falls back to CPU with a warning."),
    "epoch_num": GlobalKey((int, NONE_TYPE), None, "Number of epochs (or set max_iters)."),
    "max_iters": GlobalKey((int, NONE_TYPE), None, "Iteration budget; replaces epoch_num when set."),
    "log_smooth_window": GlobalKey((int,), 20, "Median window of the logged loss/metric values."),
    "print_batch_step": GlobalKey((int,), 10, "Log every N global steps."),
    "save_model_dir": GlobalKey((str,), "./output/run", "Where checkpoints, train.log and config.yml go."),
    "save_epoch_step": GlobalKey((int,), 1, "Keep an iter_epoch_N checkpoint every N epochs."),
    "save_iter_step": GlobalKey(
        (int, NONE_TYPE),
        None,
        "Also write 'latest' every N global steps (mid-epoch), so a restart loses little work.",
    ),
    "eval_batch_step": GlobalKey(
        (list, int), [0, 2000], "[start, interval] in global steps; an int means [0, int]."
    ),
    "eval_batch_epoch": GlobalKey(
        (int, NONE_TYPE), None, "Evaluate every N epochs instead of eval_batch_step."
    ),
    "eval_during_train": GlobalKey(
        (bool,),
        True,
        "Evaluate on the Eval set during training; false: train only (tools/train.py sets it from "
        "PaddleDetection's --eval / PaddleSeg's --do_eval on those suites' configs).",
    ),
    "cal_metric_during_train": GlobalKey(
        (bool,), False, "Compute the metric on each training batch for the log."
    ),
    "pretrained_model": GlobalKey(
        (str, NONE_TYPE),
        None,
        "Weights to start from: a ppdist .pt or a Paddle .pdparams "
        "(or its prefix), converted on load; shape mismatches are skipped and listed.",
    ),
    "checkpoints": GlobalKey(
        (str, NONE_TYPE), None, "Checkpoint to resume from, or 'auto' for save_model_dir/latest."
    ),
    "save_inference_dir": GlobalKey((str, NONE_TYPE), None, "Export directory (tools/export_model.py)."),
    "use_visualdl": GlobalKey((bool,), False, "Paddle's VisualDL switch; mapped to TensorBoard."),
    "use_tensorboard": GlobalKey((bool,), False, "Write TensorBoard scalars to save_model_dir/tensorboard."),
    "use_wandb": GlobalKey(
        (bool, NONE_TYPE),
        None,
        "Weights & Biases logging from rank 0, with the wandb.init keywords of the top-level wandb "
        "section; null: on when the config has a wandb section (PaddleOCR's rule).",
    ),
    "mlflow": GlobalKey(
        (bool, dict, NONE_TYPE),
        None,
        "MLflow logging from rank 0: true or {tracking_uri, experiment_name, run_name, tags}; no "
        "tracking_uri: MLFLOW_TRACKING_URI, else the file store save_model_dir/mlruns.",
    ),
    "tracker_checkpoints": GlobalKey(
        (str,),
        "reference",
        "What MLflow / W&B record of each checkpoint written: 'reference' (its path, step and "
        "metrics; no copy), 'artifact' (a copy uploaded, as PaddleOCR's W&B logger does) or 'none'.",
        choices=("reference", "artifact", "none"),
    ),
    "profiler_options": GlobalKey(
        (str, NONE_TYPE),
        None,
        "PaddleOCR's -p string, e.g. 'batch_range=[10,20];state=GPU;profile_path=prof': "
        "torch.profiler on that window of steps, a trace for TensorBoard / Perfetto.",
    ),
    "infer_img": GlobalKey((str, NONE_TYPE), None, "Image or folder for tools/infer.py."),
    "character_dict_path": GlobalKey(
        (str, NONE_TYPE), None, "Dictionary file, one character per line; none = 0-9a-z."
    ),
    "character_type": GlobalKey((str, NONE_TYPE), None, "Legacy PaddleOCR key; has no effect."),
    "max_text_length": GlobalKey((int,), 25, "Longest label kept by CTCLabelEncode."),
    "infer_mode": GlobalKey((bool,), False, "Inference resize mode for RecResizeImg."),
    "use_space_char": GlobalKey((bool,), False, "Append a space to the dictionary."),
    "save_res_path": GlobalKey(
        (str, NONE_TYPE),
        None,
        "PaddleOCR's infer_rec.py result file: accepted, not read (tools/infer.py writes into --output_dir).",
    ),
    "box_format": GlobalKey(
        (str, NONE_TYPE),
        None,
        "PaddleOCR's table box format, read by no PaddleOCR 2.7 code (its configs pass it on with a YAML "
        "anchor to TableBoxEncode and TableMetric): accepted, no effect.",
        choices=("xyxy", "xywh", "xyxyxyxy", None),
    ),
    "seed": GlobalKey((int,), 1024, "Seed of model init, shuffling and augmentation."),
    "use_amp": GlobalKey((bool,), False, "Automatic mixed precision (torch.autocast on CUDA, and on CPU)."),
    "amp_dtype": GlobalKey((str,), "float16", "AMP dtype.", choices=("float16", "bfloat16")),
    "amp_level": GlobalKey(
        (str,), "O1", "Paddle AMP level; both levels map to torch.autocast.", choices=("O1", "O2")
    ),
    "scale_loss": GlobalKey(NUMBER_TYPES, 65536.0, "Initial loss scale of the fp16 GradScaler."),
    "use_dynamic_loss_scaling": GlobalKey((bool,), True, "Let the GradScaler adapt the scale."),
    "channels_last": GlobalKey(
        (bool, NONE_TYPE),
        None,
        "Run the model and 4-D inputs in channels_last memory format; null: on with CPU (measured "
        "faster for all three models) and with CUDA AMP, off with CUDA fp32 (docs/benchmarks.md).",
    ),
    "cudnn_benchmark": GlobalKey(
        (bool, NONE_TYPE),
        None,
        "Let cuDNN time its algorithms once per input shape and keep the fastest (CUDA); null: on, "
        "except with several training input sizes (multi-scale batch transforms) and no "
        "cudnn_warmup, where cuDNN's heuristics pick (Paddle's default, FLAGS_cudnn_exhaustive_search=0).",
    ),
    "cudnn_warmup": GlobalKey(
        (str, NONE_TYPE),
        None,
        "'all_sizes': before the first step, one forward and backward at every training input size "
        "of the multi-scale batch transforms (cuDNN autotunes each once, before training, with "
        "cudnn_benchmark null or true); the weights, statistics, optimizer, RNG streams and position "
        "are left as they were. null: sizes are met (and tuned, if on) as training draws them.",
        choices=(None, "all_sizes"),
    ),
    "deterministic": GlobalKey(
        (bool,),
        False,
        "Reproducible kernels: cuDNN deterministic without autotuning, cuBLAS with a fixed workspace, "
        "torch.use_deterministic_algorithms (warn-only); a resumed GPU run then repeats the "
        "uninterrupted one exactly, at some speed.",
    ),
    "float32_matmul_precision": GlobalKey(
        (str,),
        "high",
        "torch.set_float32_matmul_precision: 'high' uses TF32 for fp32 matmuls/convolutions on "
        "Ampere+ GPUs (Paddle's default); 'highest' keeps full fp32.",
        choices=("highest", "high", "medium"),
    ),
    "broadcast_buffers": GlobalKey(
        (bool, NONE_TYPE),
        None,
        "DDP broadcast_buffers (rank 0's BatchNorm statistics before every forward); null: off with "
        "SyncBatchNorm, on otherwise.",
    ),
    "use_sync_bn": GlobalKey((bool,), False, "Convert BatchNorm to SyncBatchNorm under multi-GPU DDP."),
    "bn_statistics": GlobalKey(
        (str,),
        "paddle",
        "How BatchNorm updates running_var in training: 'paddle' with the biased batch variance, "
        "as the originals do; 'torch' with PyTorch's unbiased one (N/(N-1) larger).",
        choices=("paddle", "torch"),
    ),
    "find_unused_parameters": GlobalKey((bool,), False, "DDP find_unused_parameters."),
    "gradient_as_bucket_view": GlobalKey(
        (bool, NONE_TYPE),
        None,
        "DDP gradients as views of its communication buckets (saves a copy); "
        "null: on with CUDA, off on CPU (measured faster, docs/benchmarks.md).",
    ),
    "bucket_cap_mb": GlobalKey(
        NUMBER_TYPES + (NONE_TYPE,), None, "DDP all-reduce bucket size in MB (null: PyTorch's 25)."
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
    "ema_decay": GlobalKey(NUMBER_TYPES, 0.9998, "EMA decay."),
    "ema_decay_type": GlobalKey(
        (str,),
        "constant",
        "'threshold' ramps the decay as min(decay, (1 + t) / (10 + t)), 'exponential' as "
        "decay * (1 - exp(-(t + 1) / 2000)) (PaddleDetection's types; 'constant' is its 'normal').",
        choices=("constant", "threshold", "exponential"),
    ),
    "max_image_pixels": GlobalKey(
        (int, NONE_TYPE),
        None,
        "Images whose header gives more pixels are bad samples, not decoded; null: 89,478,485 (Pillow's).",
    ),
    "overwrite": GlobalKey(
        (bool,),
        False,
        "Start a new run in a save_model_dir that holds another run's checkpoints, replacing them.",
    ),
    "grad_clip": GlobalKey(NUMBER_TYPES + (NONE_TYPE,), None, "Clip the global gradient norm to this value."),
    "accumulate_steps": GlobalKey(
        (int,),
        1,
        "Gradient accumulation: K micro-batches per optimizer step per process; N processes x K train "
        "on exactly the batches of N*K processes (LR schedule, EMA, logs and checkpoints count optimizer steps). "
        f"At most {MAX_ACCUMULATE_STEPS}, and at most the batches of an epoch (checked against the data set).",
    ),
    "nan_policy": GlobalKey(
        (str,),
        "stop",
        "A NaN/Inf loss or gradient: 'stop' the run (checked on log steps and before every checkpoint, "
        "naming the step and the last good checkpoint), or 'skip' the step and continue (one flag read per step).",
        choices=("stop", "skip"),
    ),
    "max_skipped_step_ratio": GlobalKey(
        NUMBER_TYPES,
        0.5,
        "With nan_policy 'skip': stop the run (exit 1) when more than this fraction of the steps is left "
        "out, judged over each window of at least 10 steps between log lines / epoch ends, and over the "
        "whole run when it ends inside a shorter window. 1: never stop.",
    ),
    "early_stop": GlobalKey(
        (dict, NONE_TYPE),
        None,
        "{patience: N, min_delta: d}: stop when the main indicator has not improved by more than d "
        "in N evaluations.",
    ),
    "plot_curves": GlobalKey(
        (bool,), True, "Draw save_model_dir/curves.png (loss terms, LR, eval metrics) after every evaluation."
    ),
    "eval_pictures": GlobalKey(
        (bool,),
        True,
        "Draw the final evaluation's pictures (PR curves, confusion matrices, worst mistakes) into "
        "save_model_dir/eval_pictures when training ends.",
    ),
    "keep_checkpoint_max": GlobalKey(
        (int, NONE_TYPE),
        None,
        "Keep only the newest N periodic checkpoints (iter_epoch_N, iter_step_N); latest and "
        "best_accuracy are always kept. null: keep all.",
    ),
    "cuda_graph": GlobalKey(
        (bool,),
        False,
        "Capture the whole training step (forward, loss, backward, clipping, non-finite watch, optimizer, "
        "EMA) after a few eager steps and replay it: one launch per step on CUDA (a CUDA graph; on the "
        "CPU an op-by-op replay of the same semantics, not faster). For recipes of one input shape; "
        "refused in one line for multi-scale training, fp16, accumulation, a loss that reads the host.",
    ),
    "checkpoint_in_background": GlobalKey(
        (bool,),
        True,
        "Write checkpoints from a host copy in a background thread (the step pays the copy only); "
        "false: the save returns once the files are whole.",
    ),
    "dist_timeout": GlobalKey((int,), 1800, "Seconds before a collective that waits on a dead peer fails."),
    "auto_scale_lr": GlobalKey(
        (dict, NONE_TYPE),
        None,
        "{base_batch_size: N[, enable: true]}: scale every learning rate by global batch / N; "
        "also allows resuming with another number of processes.",
    ),
    "max_bad_sample_ratio": GlobalKey(
        NUMBER_TYPES, 0.1, "Fail the run when more than this fraction of samples is bad."
    ),
    "log_ranks": GlobalKey((str, int), "0", "Accepted for compatibility; only rank 0 logs."),
    "print_mem_info": GlobalKey((bool,), True, "Append max CUDA memory to log lines."),
    "distributed": GlobalKey((bool, NONE_TYPE), None, "Ignored: set from the launch environment."),
    "debug": GlobalKey(
        (bool, NONE_TYPE),
        None,
        "PaddleOCR's debug switch, read by no PaddleOCR 2.7 code: accepted, no effect.",
    ),
    "d2s_train_image_shape": GlobalKey(
        (list, NONE_TYPE),
        None,
        "Input shape of Paddle's dynamic-to-static training, used only with Global.to_static (refused: "
        "use Global.compile): accepted, no effect.",
    ),
    "num_classes": GlobalKey(
        (int, NONE_TYPE),
        None,
        "Class count given to every component that takes num_classes (head, loss, metric, dataset).",
    ),
    "ignore_index": GlobalKey(
        (int, NONE_TYPE),
        None,
        "Label value excluded from loss and metric, given to every component that takes it "
        "(components default to 255).",
    ),
    "width_mult": GlobalKey(
        NUMBER_TYPES + (NONE_TYPE,),
        None,
        "Detection: channel multiplier given to every component that takes width_mult (PP-YOLOE s/m/l/x).",
    ),
    "depth_mult": GlobalKey(
        NUMBER_TYPES + (NONE_TYPE,),
        None,
        "Detection: block-count multiplier given to every component that takes depth_mult.",
    ),
    "synthetic_data": GlobalKey(
        (dict, NONE_TYPE), None, "{kind, data_dir, num_train, num_val, seed}: generate data there if absent."
    ),
    "hooks": GlobalKey(
        (list, NONE_TYPE),
        None,
        "More trainer hooks: [{name: <a hook registered in ppdist.registry.HOOKS>, key: value, ...}].",
    ),
    "custom_imports": GlobalKey(
        (list, NONE_TYPE),
        None,
        "Python modules imported before the config is validated (the hooks and components they register).",
    ),
}
# Paddle keys we know but do not implement: accepted only when off/empty.
UNSUPPORTED_GLOBAL = {
    "to_static": "Paddle dynamic-to-static compilation (use Global.compile: torch.compile)",
    "use_xpu": "XPU devices",
    "use_npu": "NPU devices",
    "use_mlu": "MLU devices",
    "uniform_output_enabled": "PaddleX output layout",
    "amp_custom_black_list": "custom AMP op lists",
    "amp_custom_white_list": "custom AMP op lists",
    "pdx_model_name": "PaddleX model names",
}
# Unsupported keys that only act with Global.use_amp, as in PaddleOCR: accepted without it
AMP_ONLY_GLOBAL = ("amp_custom_black_list", "amp_custom_white_list")
LOADER_SCHEMA: Dict[str, Tuple[Tuple[type, ...], Any]] = {
    "batch_size_per_card": ((int,), None),
    "shuffle": ((bool,), False),
    "drop_last": ((bool,), False),
    "num_workers": ((int,), 0),
    "use_shared_memory": ((bool,), True),
    "pin_memory": ((bool, NONE_TYPE), None),
    "persistent_workers": ((bool, NONE_TYPE), None),
    "prefetch_factor": ((int, NONE_TYPE), None),
    "cv2_num_threads": ((int,), 0),
    "normalize_on_device": ((bool,), True),
}
# torch.compile arguments accepted in Global.compile
COMPILE_KEYS = ("mode", "dynamic", "fullgraph", "backend", "options")
