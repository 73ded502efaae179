"""Run a runner + backend over image files: batching, skipping unreadable files, throughput."""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from tqdm import tqdm

from ppdist.errors import ConfigError
from ppdist.export.deploy_modules import build_deploy
from ppdist.export.inference_config import read_inference_config
from ppdist.export.model_export import load_deploy_model
from ppdist.export.submodels import deployed_export_dir, exported_sub_models, inference_parts
from ppdist.inference.backends import NamedBackends, OnnxBackend, TorchBackend
from ppdist.inference.runners import build_runner, inference_info_from_config
from ppdist.modeling.input_size import min_input_size
from ppdist.tasks.runner import ImageReadError, Runner

logger = logging.getLogger("ppdist")


def from_exported(model_dir: str) -> Tuple[Dict[str, Any], Runner, OnnxBackend]:
    """Info, runner and ONNX Runtime backend of an exported model directory; of a distillation
    export's root (``<dir>/Student/``, ``<dir>/Teacher/``), the deployed model's, with one info line."""
    deployed = deployed_export_dir(model_dir)
    if deployed is not None:
        logger.info(
            "%s holds the exported models of a distillation run (%s): running the deployed one, %s",
            model_dir,
            ", ".join(exported_sub_models(model_dir)),
            deployed,
        )
        model_dir = deployed
    info = read_inference_config(model_dir)
    if "onnx" not in info["files"]:
        raise ConfigError(f"{model_dir} has no ONNX model (export with --format onnx or both)")
    backend = OnnxBackend(info["files"]["onnx"])
    check_graph_matches(info, backend)
    return info, build_runner(info), backend


def check_graph_matches(info: Mapping[str, Any], backend: OnnxBackend) -> None:
    """The ONNX graph's input and output names and ranks must be those ``inference.yml`` declares."""
    declared_inputs = [row["name"] for row in info["inputs"]]
    problems = []
    if backend.input_names != declared_inputs:
        problems.append(f"inputs {backend.input_names} (inference.yml: {declared_inputs})")
    if backend.output_names != list(info["outputs"]):
        problems.append(f"outputs {backend.output_names} (inference.yml: {list(info['outputs'])})")
    for graph_input, row in zip(backend.session.get_inputs(), info["inputs"]):
        if "shape" in row and len(graph_input.shape) != len(row["shape"]):
            problems.append(
                f"input {row['name']} has rank {len(graph_input.shape)} (inference.yml: {row['shape']})"
            )
    if problems:
        raise ConfigError(
            f"{info['path']} does not describe {backend.path}: the graph has "
            + "; ".join(problems)
            + ". Export the model again, or use the inference.yml written with it"
        )


def from_config(
    config: Mapping[str, Any], device: str = "cpu"
) -> Tuple[Dict[str, Any], Runner, Union[TorchBackend, NamedBackends]]:
    """Info, runner and PyTorch backend of a training config with ``Global.checkpoints``. For a
    distillation model, the deployed sub-model's (the Student's) outputs, and those of the models
    its post-process decodes under ``<name>/<output>`` (``NamedBackends``: rec results then hold
    each one's reading)."""
    info = inference_info_from_config(config)
    model, _ = load_deploy_model(config, purpose="inference from a config")
    main, parts = inference_parts(model, config)
    smallest = max((min_input_size(part) or (1, 1) for _, part, _ in parts), default=(1, 1))
    if smallest != (1, 1):  # as an export records it in inference.yml
        info["min_input_size"] = list(smallest)
    backends = []
    for name, part, part_config in parts:
        module, spec = build_deploy(part, part_config)
        backends.append((name, TorchBackend(module, spec.output_names, spec.input_names, device)))
    backend = backends[0][1] if main is None else NamedBackends(backends, main)
    return info, build_runner(info), backend


def _batches(paths: Sequence[str], size: int) -> List[Sequence[str]]:
    return [paths[i : i + size] for i in range(0, len(paths), size)]


def infer(
    paths: Sequence[str],
    runner: Runner,
    backend: Any,
    writer: Optional[Any] = None,
    batch_size: int = 1,
    progress: bool = True,
) -> Dict[str, Any]:
    """Predict every file of ``paths``; unreadable files are skipped and listed in ``skipped``.
    Returns ``{results, skipped: [(path, why)], images, seconds, images_per_s}``."""
    results: List[Dict[str, Any]] = []
    skipped: List[Tuple[str, str]] = []
    start = time.perf_counter()
    bar = tqdm(total=len(paths), unit="img", disable=not progress)
    for chunk in _batches(list(paths), max(1, int(batch_size))):
        samples = []
        for path in chunk:
            try:
                samples.append(runner.load(path))
            except ImageReadError as exc:
                skipped.append((path, str(exc)))
                logger.warning("skipped %s", exc)
        if samples:
            batch_results = runner.predict(backend.run, samples)
            if writer is not None:
                writer.add(batch_results)
            results.extend(batch_results)
        bar.update(len(chunk))
    bar.close()
    seconds = time.perf_counter() - start
    return {
        "results": results,
        "skipped": skipped,
        "images": len(results),
        "seconds": seconds,
        "images_per_s": len(results) / seconds if seconds > 0 else 0.0,
    }
