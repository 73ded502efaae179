"""Predict image files: ``python tools/infer.py -c CFG -o Global.checkpoints=PATH --input PATH|DIR``
(PyTorch on the checkpoint) or ``python tools/infer.py --model EXPORTED_DIR --input PATH|DIR``
(ONNX Runtime on the exported model; -c is then not needed).

Writes into ``--output_dir``: rec ``results.txt`` (``path<TAB>text<TAB>score``); det ``bbox.json``
(COCO results) and the images with boxes above ``--draw_threshold``; seg ``<name>.png`` (palette
PNG of class ids) and ``<name>_overlay.jpg``. Unreadable files are reported and skipped.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.cli import base_parser, flat_overrides, run_main  # noqa: E402


def build_parser():
    parser = base_parser(__doc__, config_required=False)
    parser.add_argument("--input", required=True, help="an image file or a folder of jpg/jpeg/png/bmp files")
    parser.add_argument("--model", default=None, help="exported model directory (inference.yml + model.onnx)")
    parser.add_argument("--output_dir", default="output/infer", help="where the results are written")
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--draw_threshold", type=float, default=0.5, help="det: draw boxes scoring at least this")
    parser.add_argument("--device", default="cpu", help="PyTorch device for checkpoint inference")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    return parser


def run(argv=None) -> dict:
    """Parse ``argv`` and run inference; returns the summary of ``ppdist.inference.infer.infer``."""
    args = build_parser().parse_args(argv)
    from ppdist.engine.logger import setup_logger
    from ppdist.errors import ConfigError
    from ppdist.inference.infer import from_config, from_exported, infer
    from ppdist.inference.runners import list_images
    from ppdist.inference.writers import build_writer

    setup_logger(None)
    if args.model:
        info, runner, backend = from_exported(args.model)
    elif args.config:
        from ppdist.config import load_config

        info, runner, backend = from_config(load_config(args.config, flat_overrides(args.opt)), args.device)
    else:
        raise ConfigError("give -c CONFIG -o Global.checkpoints=PATH, or --model EXPORTED_DIR")
    paths = list_images(args.input)
    if not paths:
        raise ConfigError(f"--input {args.input}: no jpg/jpeg/png/bmp files")
    writer = build_writer(info["task"], args.output_dir, info, args.draw_threshold)
    summary = infer(paths, runner, backend, writer, args.batch_size, progress=not args.no_progress)
    summary["written"] = writer.close()
    for path, why in summary["skipped"]:
        print(f"skipped: {why}", file=sys.stderr)
    backend_name = "onnxruntime" if args.model else "pytorch"
    print(f"{summary['images']} image(s) predicted, {len(summary['skipped'])} skipped (unreadable), "
          f"{summary['images_per_s']:.1f} images/s ({backend_name}, batch {args.batch_size}); "
          f"results in {args.output_dir}")
    return summary


def main() -> int:
    run()
    return 0


if __name__ == "__main__":
    run_main(main)
