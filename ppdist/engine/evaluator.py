"""Evaluation on all ranks with exact, unpadded shards; rank 0 gathers the metric states,
computes the metric once and broadcasts the result."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

import torch
from torch import nn
from tqdm import tqdm

from ppdist.data.base import BAD_SAMPLES_KEY, NOTES_KEY, SAMPLE_INDEX_KEY
from ppdist.engine.batch import batch_size_of, move_to_device
from ppdist.engine.dist import DistEnv, gather_object_to_main, run_on_main
from ppdist.engine.finite_state import any_nonfinite
from ppdist.engine.logger import format_eta
from ppdist.errors import EmptyEvaluationError
from ppdist.metrics.base import Metric
from ppdist.visualize.eval_pictures import write_report

logger = logging.getLogger("ppdist")


class EvalProgress:
    """A tqdm bar on a terminal; otherwise (logs, CI) an ETA line every ~25% of the batches."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.total, self.desc, self.done = total, desc, 0
        self.enabled = enabled
        self.start = time.perf_counter()
        self.bar = (
            tqdm(total=total, desc=desc, dynamic_ncols=True, leave=False, mininterval=1.0)
            if enabled and sys.stderr.isatty()
            else None
        )
        self.next_report = max(1, total // 4)

    def update(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled and self.done >= self.next_report and self.done < self.total:
            elapsed = time.perf_counter() - self.start
            eta = elapsed / self.done * (self.total - self.done)
            logger.info("%s: %d/%d batches, eta: %s", self.desc, self.done, self.total, format_eta(eta))
            self.next_report += max(1, self.total // 4)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Evaluator:
    """Runs ``model`` over this rank's eval shard and merges the metric over all ranks.

    Every rank evaluates its contiguous shard with no collective inside the loop (ranks may
    hold different numbers of batches), then the metric states are all-gathered in rank
    order and merged, so every rank returns exactly the single-process numbers. Batch entries
    named in the post-process's ``host_keys`` (e.g. detection's image ids and scale factors)
    stay on the host, as the trainer does with the loss's.
    """

    def __init__(
        self,
        loader: Iterable[Mapping[str, Any]],
        postprocess: Callable[..., Any],
        metric: Metric,
        env: DistEnv,
        autocast: Callable[[], Any] = contextlib.nullcontext,
        channels_last: bool = False,
    ) -> None:
        self.loader = loader
        self.postprocess = postprocess
        self.metric = metric
        self.env = env
        self.autocast = autocast
        self.channels_last = channels_last
        self.host_keys = (SAMPLE_INDEX_KEY,) + tuple(getattr(postprocess, "host_keys", ()))
        self.last_fps = 0.0
        self.last_bad: List[str] = []
        self.last_nonfinite_batches = 0  # batches of the last run whose predictions held NaN/Inf
        bind = getattr(metric, "bind_dataset", None)  # e.g. COCO ground truth and category ids
        if bind is not None:
            bind(getattr(loader, "dataset", None))

    def draw_pictures(self, out_dir: str) -> List[str]:
        """The metric's pictures of the last ``run`` (PR curves, confusion matrices, the worst
        recognition mistakes) into ``out_dir``: on rank 0, which holds the merged state; nothing
        on the others (not collective)."""
        if not self.env.is_main:
            return []
        written = write_report(self.metric.report(), out_dir)
        for path in written:
            logger.info("wrote %s", path)
        return written

    @torch.no_grad()
    def run(self, model: nn.Module, desc: str = "eval") -> Dict[str, float]:
        was_training = model.training
        model.eval()
        self.metric.reset()
        bad: List[str] = []
        samples = 0
        start = time.perf_counter()
        progress = EvalProgress(len(self.loader), desc, enabled=self.env.is_main)
        nonfinite: Optional[torch.Tensor] = None  # batches whose predictions were not finite, on the device
        for batch in self.loader:
            bad.extend(batch.pop(BAD_SAMPLES_KEY, []))
            batch.pop(NOTES_KEY, None)  # changes to kept samples are reported by training
            progress.update()
            size = batch_size_of(batch)
            if size == 0:
                continue
            batch = move_to_device(batch, self.env.device, self.channels_last, self.host_keys)
            with self.autocast():
                # a post-process with test-time augmentation runs the model itself
                infer = getattr(self.postprocess, "infer", None)
                preds = infer(model, batch) if infer is not None else model(batch)
            flag = any_nonfinite(preds)
            if flag is not None:
                nonfinite = flag.long() if nonfinite is None else nonfinite + flag.long()
            results = self.postprocess(preds, batch)
            self.metric.update(results, batch)
            samples += size
        progress.close()
        elapsed = time.perf_counter() - start
        # one rank computes the metric (COCOeval over all detections is the costly case) and
        # every rank gets its result: rank 0 gathers the states, the others wait while it works
        gathered = gather_object_to_main(
            {
                "state": self.metric.state(),
                "bad": bad,
                "samples": samples,
                "elapsed": elapsed,
                # read once per evaluation (a meta tensor, which stands for a device in tests, has no value)
                "nonfinite": 0 if nonfinite is None or nonfinite.is_meta else int(nonfinite.item()),
            },
            self.env,
        )

        def merge_and_compute() -> Dict[str, Any]:
            assert gathered is not None
            self.metric.load_states([g["state"] for g in gathered])
            metrics = self.metric.compute()
            return {
                "metrics": metrics,
                "nothing_evaluated": getattr(self.metric, "nothing_evaluated", None),
                "bad": [b for g in gathered for b in g["bad"]],
                "samples": sum(g["samples"] for g in gathered),
                "elapsed": max(g["elapsed"] for g in gathered),
                "nonfinite": sum(g["nonfinite"] for g in gathered),
            }

        summary = run_on_main(merge_and_compute, self.env, f"{desc}: computing the metric")
        metrics, total = summary["metrics"], summary["samples"]
        self.last_bad = summary["bad"]
        self.last_fps = total / max(summary["elapsed"], 1e-9)
        self.last_nonfinite_batches = summary["nonfinite"]
        if total == 0:  # every rank knows (broadcast): all raise together, none waits
            model.train(was_training)
            raise EmptyEvaluationError(
                f"the evaluation saw no sample: the Eval set is empty or every one of its samples was bad "
                f"({len(self.last_bad)} bad{': ' + '; '.join(self.last_bad[:3]) if self.last_bad else ''}); "
                f"check Eval.dataset (data_dir / label_file_list / dataset_root / anno_path)"
            )
        if summary["nothing_evaluated"] and self.env.is_main:
            logger.warning(
                "eval: nothing was evaluated: %s; %s is nan, not a score",
                summary["nothing_evaluated"],
                getattr(self.metric, "main_indicator", "the metric") or "the metric",
            )
        for line in self.last_bad:
            logger.warning("eval: skipped bad sample %s", line)
        if self.last_bad:
            logger.warning("eval: %d bad sample(s) skipped, %d evaluated", len(self.last_bad), total)
        if self.last_nonfinite_batches:
            logger.warning(
                "eval: the model's predictions hold NaN/Inf values in %d batch(es): these metrics are not "
                "those of a working model",
                self.last_nonfinite_batches,
            )
        model.train(was_training)
        return metrics
