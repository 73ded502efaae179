"""PaddleDetection's Fleet-era name for ``tools/train.py``: the same command, the same ``main``.

``python -m ppdist.launch --selected_gpus 0,1,2,3 tools/train_multi_machine.py -c CFG`` runs exactly
what ``tools/train.py`` runs (its ``main`` is loaded from that file; nothing is copied here).
"""

from __future__ import annotations

import importlib.util
import os

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


def load_train():
    """tools/train.py as a module (not run): its ``main`` and docstring are this command's."""
    spec = importlib.util.spec_from_file_location("ppdist_tools_train", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train = load_train()
main = train.main

if __name__ == "__main__":
    train.run_main(main)  # tools/train.py's own runner
