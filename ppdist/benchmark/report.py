"""The benchmark's text report."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping


def _env_line(env: Mapping[str, Any]) -> str:
    return (
        f"torch {env['torch']}, {env['device']}, {env['cpu_count']} CPU cores, {env['threads']} thread(s), "
        f"{env['train_workers']} train worker(s), batch {env['train_batch_size_per_card']}/process, "
        f"AMP {env['amp']}, channels_last {'on' if env['channels_last'] else 'off'}, compile {env['compile']}"
    )


def format_report(result: Mapping[str, Any]) -> str:
    """Aligned lines, one per measurement that ran."""
    lines: List[str] = [
        f"ppdist benchmark: {result['config']} (warm-up {result['warmup']} steps, "
        f"{result['iters']} timed steps)",
        f"  environment       {_env_line(result['environment'])}",
    ]
    trainer, bare = result.get("trainer"), result.get("bare_loop")
    if trainer:
        lines.append(
            f"  trainer           {trainer['samples_per_s']:10.2f} samples/s   (avg_reader_cost "
            f"{trainer['avg_reader_cost']:.5f} s = {trainer['reader_fraction']:.1%} of avg_batch_cost "
            f"{trainer['avg_batch_cost']:.5f} s)"
        )
    if bare:
        lines.append(
            f"  bare loop         {bare['samples_per_s']:10.2f} samples/s   (same model, loss, optimizer "
            f"and batches, pre-loaded)"
        )
    if trainer and bare:
        lines.append(f"  trainer overhead  ratio {result['trainer_overhead']:.3f} (trainer / bare loop)")
    loader = result.get("loader")
    if loader:
        model_rate = bare["samples_per_s"] if bare else None
        tail = (
            f" vs the model's {model_rate:.2f}: {loader['samples_per_s'] / model_rate:.1f}x headroom"
            if model_rate
            else ""
        )
        lines.append(
            f"  input pipeline    {loader['samples_per_s']:10.2f} samples/s   (data loader alone, "
            f"{loader['num_workers']} worker(s)){tail}"
        )
    scaling = result.get("scaling")
    if scaling:
        lines.append(
            f"  scaling           1 x {scaling['threads_per_process']} thread(s): "
            f"{scaling['single']['samples_per_s']:.2f}; {scaling['processes']} processes x "
            f"{scaling['threads_per_process']} thread(s): {scaling['multi']['samples_per_s']:.2f} samples/s"
            f" -> speed-up {scaling['speedup']:.2f}x, efficiency {scaling['efficiency']:.2f}"
        )
    evaluation = result.get("eval")
    if evaluation:
        metric = ", ".join(
            f"{k} {v:.4f}" for k, v in evaluation["metric"].items() if isinstance(v, (int, float))
        )
        lines.append(
            f"  eval              {evaluation['samples_per_s']:10.2f} samples/s   ({evaluation['samples']} "
            f"samples, batch {evaluation['batch_size']}, {metric})"
        )
    infer = result.get("infer")
    if infer:
        lines.append(
            f"  infer (PyTorch)   {infer['images_per_s']:10.2f} images/s    ({infer['images']} images, "
            f"batch {infer['batch_size']}, file to result)"
        )
    for note in result.get("notes", []):
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def best_run(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The fastest of repeated runs (the least disturbed by other load on the machine)."""
    return max(runs, key=lambda run: run["samples_per_s"])
