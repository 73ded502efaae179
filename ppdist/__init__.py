"""ppdist: PaddleOCR / PaddleDetection / PaddleSeg training on PyTorch with one distributed trainer.

The Python API. Importing any ``ppdist`` module runs this file first, which registers every
component (``ppdist.components``); no module of the package imports this one.

    config = ppdist.load_config("configs/rec/quickstart_synth.yml", ["Global.epoch_num=2"])
    ppdist.build_trainer(config).train()           # what tools/train.py runs (one process)

or the parts, run by the loop without a config file of their own (docs/architecture.md):

    model = ppdist.build_model(config)
    loader = ppdist.build_dataloader(config, "Train", "train")
    steps = loader.batch_sampler.steps_per_epoch   # optimizer steps (len(loader) / Global.accumulate_steps)
    optimizer, scheduler = ppdist.build_optimizer(config, model, steps_per_epoch=steps)
    ppdist.Trainer(model, ppdist.build_loss(config), optimizer, scheduler, loader, epochs=2).train()

A ``ppdist.WeightUpdate(model, optimizer, scheduler, scaler=..., ema=..., clip_gradients=...,
nan_policy=...)`` passed as ``Trainer(..., update=...)`` sets how gradients become weights;
``ppdist.build_runtime(config["Global"], device)`` applies the config's backend settings and gives
the autocast, memory format and loss scaling that training, evaluation and the benchmarks use:

    runtime = ppdist.build_runtime(config["Global"], torch.device("cpu"))
    model = runtime.place(ppdist.build_model(config))
    with runtime.autocast():
        preds = model(batch)
"""

from ppdist.components import build_loss, build_metric, build_model, build_postprocess
from ppdist.convert.configs import load_config
from ppdist.data.build import build_dataloader
from ppdist.engine.hooks import Hook
from ppdist.engine.runtime import Runtime, build_runtime
from ppdist.engine.setup import build_optimizer, build_trainer
from ppdist.engine.trainer import Trainer
from ppdist.engine.update import WeightUpdate

__version__ = "0.1.0"

__all__ = [
    "Hook",
    "Runtime",
    "Trainer",
    "WeightUpdate",
    "__version__",
    "build_dataloader",
    "build_loss",
    "build_metric",
    "build_model",
    "build_optimizer",
    "build_postprocess",
    "build_runtime",
    "build_trainer",
    "load_config",
]
