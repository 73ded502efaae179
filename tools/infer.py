"""Predict image files: ``python tools/infer.py -c CFG -o Global.checkpoints=PATH --input PATH|DIR``
(PyTorch on the checkpoint) or ``python tools/infer.py --model EXPORTED_DIR --input PATH|DIR``
(ONNX Runtime on the exported model; -c is then not needed).

Writes into ``--output_dir`` (default ``output/infer/<config or exported folder name>``): rec
``results.txt`` (``path<TAB>text<TAB>score``; of a distillation checkpoint, the Student's, and the
readings of PostProcess.model_name's models in ``results_per_model.txt``:
``path<TAB>{"Student": {"label", "score"}, ...}``);
det ``bbox.json`` (COCO results) and the images with boxes above ``--draw_threshold``; seg
``<name>.png`` (palette PNG of class ids) and ``<name>_overlay.jpg`` (above a legend naming its
classes: the data set's ``labels.txt`` names, recorded in ``inference.yml``); table ``results.jsonl``
(``{"path", "html", "score", "boxes"}`` a line: the structure as ``<html><body><table>...``, the
cell boxes on the original image), ``<name>.html`` and the image with the cell boxes drawn.
Unreadable files and unusable ones (e.g. too small for the model) are reported with the reason and
skipped; a failed run keeps the previous ``results.txt`` / ``bbox.json`` / ``results.jsonl``; a run
that succeeds removes the files of the previous run into the folder that it did not write again
(listed in ``.ppdist_infer_files``; nothing else is removed).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.cli import base_parser, flat_overrides, positive_int, run_main
from ppdist.cli_seg_eval import add_seg_eval_arguments, seg_eval_overrides
from ppdist.convert.configs import load_config
from ppdist.engine.logger import setup_logger
from ppdist.errors import ConfigError
from ppdist.inference.infer import from_config, from_exported, infer
from ppdist.inference.runners import build_runner, list_images
from ppdist.inference.writers import build_writer
from ppdist.tasks import get_task
from ppdist.utils.writable import check_output_dir


def build_parser():
    parser = base_parser(__doc__, config_required=False)
    parser.add_argument("--input", required=True, help="an image file or a folder of jpg/jpeg/png/bmp files")
    parser.add_argument("--model", default=None, help="exported model directory (inference.yml + model.onnx)")
    parser.add_argument(
        "--output_dir",
        default=None,
        help="where the results are written (default: output/infer/<config name>, or "
        "output/infer/<exported folder name> with --model)",
    )
    parser.add_argument(
        "--batch_size", type=positive_int, default=1, help="images per forward pass (default 1)"
    )
    parser.add_argument(
        "--draw_threshold", type=float, default=0.5, help="det: draw boxes scoring at least this"
    )
    parser.add_argument("--device", default="cpu", help="PyTorch device for checkpoint inference")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    add_seg_eval_arguments(parser)
    return parser


def default_output_dir(args) -> str:
    """``output/infer/<config name>`` (``-c``) or ``output/infer/<exported folder name>`` (``--model``):
    one folder per model, so the results of two models do not mix."""
    source = os.path.normpath(args.model) if args.model else args.config
    return os.path.join("output", "infer", os.path.splitext(os.path.basename(source))[0])


def run(argv=None) -> dict:
    """Parse ``argv`` and run inference; returns the summary of ``ppdist.inference.infer.infer``."""
    args = build_parser().parse_args(argv)
    setup_logger(None)
    if not args.model and not args.config:
        raise ConfigError("give -c CONFIG -o Global.checkpoints=PATH, or --model EXPORTED_DIR")
    args.output_dir = args.output_dir or default_output_dir(args)
    check_output_dir(args.output_dir, "--output_dir")
    if args.model:
        info, runner, backend = from_exported(args.model)
    elif args.config:
        info, runner, backend = from_config(load_config(args.config, flat_overrides(args.opt)), args.device)
    else:
        raise ConfigError("give -c CONFIG -o Global.checkpoints=PATH, or --model EXPORTED_DIR")
    overrides = seg_eval_overrides(args)
    if overrides:
        if not get_task(info["task"]).test_time_augmentation:
            raise ConfigError("--aug_eval / --is_slide apply to segmentation models only")
        info["postprocess"] = {**info["postprocess"], **overrides}
        runner = build_runner(info)
    paths = list_images(args.input)
    if not paths:
        raise ConfigError(f"--input {args.input}: no jpg/jpeg/png/bmp files")
    writer = build_writer(info["task"], args.output_dir, info, args.draw_threshold)
    try:
        summary = infer(paths, runner, backend, writer, args.batch_size, progress=not args.no_progress)
    except BaseException:
        writer.abort()  # the previous results stay as they were
        raise
    if summary["images"] == 0:  # every input was unreadable: nothing was predicted
        writer.abort()
        raise ConfigError(f"no image could be predicted ({len(summary['skipped'])} skipped, see above)")
    summary["written"] = writer.close()
    backend_name = "onnxruntime" if args.model else "pytorch"
    skipped = len(summary["skipped"])  # unreadable, or unusable (e.g. too small for the model)
    print(
        f"{summary['images']} image(s) predicted, {skipped} skipped{' (each named above)' if skipped else ''}, "
        f"{summary['images_per_s']:.1f} images/s ({backend_name}, batch {args.batch_size}); "
        f"results in {args.output_dir}"
    )
    return summary


def main() -> int:
    run()
    return 0


if __name__ == "__main__":
    run_main(main)
