"""The task registry: what a task (rec, det, seg, table) owns outside the model, and the one place
a config's task is resolved.

A task is read from the config's post-process (``CTCLabelDecode`` -> rec, ``MultiClassNMS`` -> det,
``SegPostProcess`` -> seg, ``TableLabelDecode`` -> table), so no task name has to be added to a
config. A task module (``ppdist/tasks/<name>.py``) registers one ``Task``; export, inference,
browsing and benchmarks look the task up here instead of branching on its name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from ppdist.errors import ConfigError

# (output folder, plain config, the inference.yml post-process entry, updated in place) -> labels
LabelWriter = Callable[[str, Mapping[str, Any], Dict[str, Any]], Any]
# (output folder, the inference info, draw threshold) -> a writer of tools/infer.py's result files
ResultWriter = Callable[[str, Mapping[str, Any], float], Any]


@dataclass
class GraphSpec:
    """Inputs/outputs of an exported graph and the example sizes used to export and check it."""

    input_names: List[str]
    output_names: List[str]
    dynamic_axes: Dict[str, Dict[int, str]]
    example_shapes: List[Tuple[int, ...]]  # image shapes [N, 3, H, W]: first exports, all check


# (eval-mode model, its plain config, exclude_nms) -> (the deployed module, its graph)
DeployBuilder = Callable[[nn.Module, Mapping[str, Any], bool], Tuple[nn.Module, GraphSpec]]


@dataclass(frozen=True)
class BenchmarkData:
    """A synthetic set at the recipe's real image size for ``tools/benchmark.py --input_pipeline
    --synthetic``: its folder name for ``images`` images, its generator (``data_dir``, ``images``)
    and the dataset entry that reads it (``data_dir``, ``split``, the config's entry, whose
    transforms it keeps)."""

    folder: Callable[[int], str]
    generate: Callable[[str, int], None]
    dataset_entry: Callable[[str, str, Mapping[str, Any]], Dict[str, Any]]


@dataclass(frozen=True)
class BrowsePanel:
    """How ``tools/browse_dataset.py`` reads and pages a task's samples. ``targets`` sets a browsed
    sample's target from its one-sample batch (``reader``: the split's reader, ``raw``: the sample
    as the dataset read it, or None; ``draw``: keep what the picture needs); ``summary`` gives the
    task's entries of the split's summary over the counted samples; ``on_read`` (optional) sees
    every sample read as the dataset read it (None when it cannot be read), a rejected one too. The page: panel size in pixels, columns, rows per page,
    a legend of the page's classes under it."""

    targets: Callable[[Any, Mapping[str, Any], Any, bool, Optional[Mapping[str, Any]]], None]
    summary: Callable[[Any, Sequence[Any]], Dict[str, Any]]
    panel_px: Tuple[int, int]
    columns: int
    rows_per_page: int
    needs_characters: bool = False  # the reader decodes labels with the post-process's characters
    class_legend: bool = False
    on_read: Optional[Callable[[Any, Optional[Mapping[str, Any]], Any], None]] = None


@dataclass(frozen=True)
class Task:
    """One task: its name, the post-processes that identify it, its exported graph's input and
    output names (``raw_outputs``: without the in-graph post-process, detection's
    ``exclude_nms``), the builder of its deployed module, its inference ``runner`` (built from an
    inference info) and result ``writer`` (``tools/infer.py``'s files), its synthetic
    ``benchmark_data`` and ``training_sample``, its dataset ``browse`` panel, and its labels: ``labels`` those a config
    names (detection's categories, segmentation's class names), ``label_files`` those an export
    writes beside ``inference.yml`` (the rec dictionary, the table structure tokens)."""

    name: str
    postprocesses: Tuple[str, ...]
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    build_deploy: DeployBuilder
    runner: Callable[[Mapping[str, Any]], Any]
    writer: ResultWriter
    raw_outputs: Tuple[str, ...] = field(default=())
    labels: Optional[Callable[[Mapping[str, Any]], Any]] = None
    label_files: Optional[LabelWriter] = None
    benchmark_data: Optional[BenchmarkData] = None
    browse: Optional[BrowsePanel] = None
    test_time_augmentation: bool = False  # the post-process takes PaddleSeg's --aug_eval / --is_slide
    # one synthetic training sample (model inputs and loss targets) of a config at an image size
    # (height, width), seeded by its index: the op counter's and the step tests' batches
    training_sample: Optional[
        Callable[[Mapping[str, Any], Tuple[int, int], int], Dict[str, torch.Tensor]]
    ] = None
    # whether a config's graph can leave its post-process out (``raw_outputs``); default: when the
    # task has raw outputs (Faster R-CNN's per-class boxes cannot)
    raw_graph: Optional[Callable[[Mapping[str, Any]], bool]] = None

    def has_raw_graph(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config``'s model exports without its in-graph post-process (``exclude_nms``)."""
        return bool(self.raw_outputs) and (self.raw_graph is None or self.raw_graph(config))

    def graph_outputs(self, exclude_nms: bool = False) -> List[str]:
        """The graph's output names, the raw ones when the in-graph post-process is left out."""
        return list(self.raw_outputs if exclude_nms and self.raw_outputs else self.outputs)

    def config_labels(self, config: Mapping[str, Any]) -> Any:
        """The labels ``config`` names (``None`` for a task whose labels are a file it points to)."""
        return self.labels(config) if self.labels else None

    def inference_labels(self, out_dir: str, config: Mapping[str, Any], postprocess: Dict[str, Any]) -> Any:
        """The ``labels`` entry of an exported model's ``inference.yml``, writing its files into ``out_dir``."""
        if self.label_files:
            return self.label_files(out_dir, config, postprocess)
        return self.config_labels(config)


TASKS: Dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add ``task`` to ``TASKS``; a name or post-process claimed twice is a programming error."""
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is registered twice")
    claimed = {p: t.name for t in TASKS.values() for p in t.postprocesses}
    for name in task.postprocesses:
        if name in claimed:
            raise ValueError(f"post-process {name!r} belongs to task {claimed[name]!r} already")
    TASKS[task.name] = task
    return task


def task_by_postprocess() -> Dict[str, str]:
    """Post-process name -> task name, over every registered task."""
    return {p: t.name for t in TASKS.values() for p in t.postprocesses}


def task_of(config: Mapping[str, Any]) -> str:
    """``rec``, ``det``, ``seg`` or ``table`` (the registered tasks) from ``PostProcess.name``."""
    name = (config.get("PostProcess") or {}).get("name")
    known = task_by_postprocess()
    if name not in known:
        raise ConfigError(
            f"PostProcess.name {name!r} names no task ppdist knows; expected one of {sorted(known)}"
        )
    return known[name]


def get_task(config_or_name: Any) -> Task:
    """The ``Task`` of a config (``task_of``) or of a task name."""
    name = config_or_name if isinstance(config_or_name, str) else task_of(config_or_name)
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name]


def write_lines(path: str, lines: Sequence[str]) -> None:
    """``lines`` into ``path``, one per line (UTF-8)."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{line}\n" for line in lines))


def eval_transform_size(config: Mapping[str, Any], default: Sequence[int]) -> List[int]:
    """The Eval resize's size as the config writes it, else ``default``: [H, W] for RecResizeImg and
    PaddleDetection's Resize, [w, h] for PaddleSeg's."""
    for entry in (config.get("Eval") or {}).get("dataset", {}).get("transforms", []) or []:
        if not isinstance(entry, Mapping):
            continue
        ((name, args),) = entry.items() if len(entry) == 1 else ((None, None),)
        args = args or {}
        if name == "RecResizeImg":
            return list(args["image_shape"][1:])
        if name == "Resize" and "target_size" in args:
            size = args["target_size"]
            return [size, size] if isinstance(size, int) else list(size)
    return list(default)
