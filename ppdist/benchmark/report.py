"""The benchmark's text report."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping


def _env_line(env: Mapping[str, Any]) -> str:
    return (
        f"torch {env['torch']}, {env['device']}, {env['cpu_count']} CPU cores, {env['threads']} thread(s), "
        f"{env['train_workers']} train worker(s), batch {env['train_batch_size_per_card']}/process, "
        f"AMP {env['amp']}, channels_last {'on' if env['channels_last'] else 'off'}, compile {env['compile']}"
    )


def _rates(run: Mapping[str, Any]) -> str:
    """samples/s of the median step beside the window's mean."""
    left_out = f", {run['epoch_ends']} after an epoch end left out" if run.get("epoch_ends") else ""
    return (
        f"{run['median_samples_per_s']:10.2f} samples/s   (median step {1000 * run['median_step_s']:.1f} ms "
        f"of {run['steps']}{left_out}; window mean {run['samples_per_s']:.2f})"
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
        lines.append(f"  trainer           {_rates(trainer)}")
        lines.append(
            f"                    avg_reader_cost {trainer['avg_reader_cost']:.5f} s = "
            f"{trainer['reader_fraction']:.1%} of avg_batch_cost {trainer['avg_batch_cost']:.5f} s"
        )
    if bare:
        lines.append(
            f"  bare loop         {_rates(bare)}; same model, loss, optimizer and batches, pre-loaded"
        )
    for name, run in (("trainer", trainer), ("bare loop", bare)):
        if run and run.get("warmed_sizes"):
            sizes = ", ".join("x".join(str(v) for v in size) for size in run["warmed_sizes"])
            lines.append(
                f"  warm-up           {name} visited every training size once before timing: {sizes}"
            )
    if trainer and bare:
        lines.append(
            f"  trainer/bare      {result['trainer_overhead']:.3f}: the trainer trains at "
            f"{trainer['median_samples_per_s']:.2f} samples/s, a bare PyTorch loop at "
            f"{bare['median_samples_per_s']:.2f} on the same model, data and settings (median steps; "
            f"window means {result['trainer_overhead_window']:.3f})"
        )
    loader = result.get("loader")
    if loader:
        model_rate = bare["median_samples_per_s"] if bare else None
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
            f"{scaling['single']['median_samples_per_s']:.2f}; {scaling['processes']} processes x "
            f"{scaling['threads_per_process']} thread(s): {scaling['multi']['median_samples_per_s']:.2f} "
            f"samples/s (median steps)"
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
    """The fastest of repeated runs by median step (the least disturbed by other load on the machine)."""
    return max(runs, key=lambda run: run.get("median_samples_per_s", run["samples_per_s"]))
