"""Export a trained model: ``python tools/export_model.py -c CFG -o Global.checkpoints=PATH
[--format onnx|torchscript|both] [--output_dir DIR] [--check] [--exclude_nms]``.

Writes ``model.onnx`` / ``model.pt`` and ``inference.yml`` (preprocessing, post-process, labels,
input spec) so that ``tools/infer.py --model DIR`` runs without the training config. A
distillation model (``Architecture.Models``) is written as one plain model per sub-model into
``DIR/<name>/`` (PaddleOCR's layout); ``DIR/Student`` is the one to deploy.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.cli import base_parser, flat_overrides, run_main
from ppdist.convert.configs import load_config
from ppdist.engine.logger import setup_logger
from ppdist.export.model_export import FORMATS, export_model
from ppdist.utils.writable import check_output_dir


def main() -> int:
    parser = base_parser(__doc__)
    parser.add_argument(
        "--format",
        choices=("onnx", "torchscript", "both"),
        default="both",
        help="model.onnx, model.pt (TorchScript) or both (default)",
    )
    parser.add_argument(
        "--output_dir",
        default=None,
        help="default: Global.save_inference_dir, else ./output/inference/<config name>",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="run ONNX Runtime and PyTorch on the same inputs at two sizes and report the max abs diff",
    )
    parser.add_argument("--tolerance", type=float, default=1e-3, help="--check fails above this difference")
    parser.add_argument(
        "--exclude_nms",
        action="store_true",
        help="detection: output boxes [N, A, 4] and scores [N, C, A] without NMS in the graph",
    )
    args = parser.parse_args()
    config = load_config(args.config, flat_overrides(args.opt))
    setup_logger(None)
    stem = os.path.splitext(os.path.basename(args.config))[0]
    out_dir = (
        args.output_dir
        or config["Global"].get("save_inference_dir")
        or os.path.join("output", "inference", stem)
    )
    check_output_dir(out_dir, "--output_dir")
    report = export_model(config, out_dir, FORMATS[args.format], args.exclude_nms, args.check, args.tolerance)
    for name, part in report.get("models", {}).items():
        if "max_abs_diff" in part:
            print(f"{name}: ONNX Runtime vs PyTorch max abs diff: {part['max_abs_diff']:.3g}")
    if "max_abs_diff" in report:
        print(f"ONNX Runtime vs PyTorch max abs diff: {report['max_abs_diff']:.3g}")
    if "deployed_dir" in report:
        print(f"the model to deploy: {report['deployed_dir']} ({report['deployed']})")
    return 0


if __name__ == "__main__":
    run_main(main)
