"""tools/infer.py: checkpoint (PyTorch) and exported model (ONNX Runtime) give the same results,
result files are written, unreadable inputs are skipped and reported.

Models are randomly initialised (fixed seed) and saved as ``{"model": state_dict}`` checkpoints,
so no training is needed."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image
from ppdist_testing import (
    HANG_TIMEOUT_S,
    REPO,
    tiny_config,
    tiny_det_config,
    tiny_seg_config,
)

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.errors import ConfigError
from ppdist.export.inference_config import read_inference_config
from ppdist.export.model_export import export_model
from ppdist.inference.runners import build_runner, inference_info_from_config
from ppdist.inference.writers import FILE_LIST
from ppdist.registry import SYNTHETIC_DATA
from ppdist.tasks.result_files import pseudo_colour_palette
from ppdist.tasks.runner import ImageReadError

pytest.importorskip("onnxruntime")
MAKERS = {"rec": tiny_config, "seg": tiny_seg_config, "det": tiny_det_config}
DATA_ARGS = {
    "rec": {"charset": "0123456789", "min_len": 3, "max_len": 5},
    "seg": {"image_size": 64, "num_classes": 4},
    "det": {"image_size": 96, "num_classes": 2},
}


def _tool():
    spec = importlib.util.spec_from_file_location(
        "ppdist_infer_tool", os.path.join(REPO, "tools", "infer.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _setup(tmp_path, task):
    """(config path, checkpoint prefix, exported dir, input folder with 4 images + one broken file)."""
    data = str(tmp_path / "data")
    cfg = MAKERS[task](str(tmp_path / "c.yml"), data, str(tmp_path / "out"))
    SYNTHETIC_DATA.get(task)(data, num_train=4, num_val=1, seed=7, **DATA_ARGS[task])
    ckpt = str(tmp_path / "ckpt")
    overrides = ["Global.synthetic_data=null", f"Global.checkpoints={ckpt}"]
    if task == "det":  # an untrained detector scores everything ~0.01: keep them all for NMS
        overrides.append("PostProcess.score_threshold=0.0")
    config = load_config(cfg, overrides)
    torch.manual_seed(0)
    model = build_model(config)
    if task == "det":  # spread the untrained scores, else NMS ties make the outputs ambiguous
        for layer in model.head.pred_cls:
            torch.nn.init.normal_(layer.weight, std=0.05)
            torch.nn.init.normal_(layer.bias, std=1.0)
    torch.save({"model": model.state_dict()}, ckpt + ".pt")
    export_model(config, str(tmp_path / "inf"), ("onnx",))
    images = str(tmp_path / "images")
    os.makedirs(images)
    train_dir = os.path.join(data, "images", "train")
    for name in sorted(os.listdir(train_dir))[:4]:
        os.symlink(os.path.join(train_dir, name), os.path.join(images, name))
    with open(os.path.join(images, "x.png"), "wb") as handle:
        handle.write(b"not an image")
    return cfg, overrides, str(tmp_path / "inf"), images


def _run_both(tmp_path, task, capsys):
    cfg, overrides, model_dir, images = _setup(tmp_path, task)
    tool = _tool()
    common = ["--input", images, "--batch_size", "3", "--no_progress"]
    torch_out = tool.run(["-c", cfg, "-o", *overrides, "--output_dir", str(tmp_path / "pt"), *common])
    onnx_out = tool.run(["--model", model_dir, "--output_dir", str(tmp_path / "ort"), *common])
    printed = capsys.readouterr()
    for summary in (torch_out, onnx_out):
        assert summary["images"] == 4
        assert [os.path.basename(p) for p, _ in summary["skipped"]] == ["x.png"]
    skips = [line for line in (printed.out + printed.err).splitlines() if "x.png" in line]
    assert len(skips) == 2 and all("WARNING: skipped " in line for line in skips)  # one line per run
    assert "4 image(s) predicted, 1 skipped" in printed.out
    return torch_out, onnx_out


def test_rec_checkpoint_and_onnx_agree(tmp_path, capsys):
    """A random-init CRNN decodes every line to the same short text (spreading its head does not
    change that), so the scores (mean max-probabilities) carry most of this comparison."""
    torch_out, onnx_out = _run_both(tmp_path, "rec", capsys)
    assert [r["text"] for r in torch_out["results"]] == [r["text"] for r in onnx_out["results"]]
    assert np.allclose(
        [r["score"] for r in torch_out["results"]], [r["score"] for r in onnx_out["results"]], atol=1e-4
    )
    lines = (tmp_path / "ort" / "results.txt").read_text().splitlines()
    assert len(lines) == 4 and all(len(line.split("\t")) == 3 for line in lines)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "y.png").write_bytes(b"not an image")
    tool = _tool()
    with pytest.raises(ConfigError, match="no image could be predicted"):  # a failed run keeps the results
        tool.run(
            ["--model", str(tmp_path / "inf"), "--output_dir", str(tmp_path / "ort"), "--input", str(broken)]
        )
    assert (tmp_path / "ort" / "results.txt").read_text().splitlines() == lines
    assert sorted(os.listdir(tmp_path / "ort")) == [FILE_LIST, "results.txt"]  # no temporary file left


def test_default_output_folder_is_per_model():
    """rec and seg results used to mix in output/infer."""
    parse = _tool().build_parser().parse_args
    default = _tool().default_output_dir
    assert default(parse(["-c", "configs/rec/quickstart_synth.yml", "--input", "x"])) == os.path.join(
        "output", "infer", "quickstart_synth"
    )
    assert default(parse(["--model", "output/inference/seg/", "--input", "x"])) == os.path.join(
        "output", "infer", "seg"
    )


def test_seg_checkpoint_and_onnx_agree_and_png_holds_class_ids(tmp_path, capsys):
    torch_out, onnx_out = _run_both(tmp_path, "seg", capsys)
    for a, b in zip(torch_out["results"], onnx_out["results"]):
        assert a["label_map"].shape == b["label_map"].shape
        assert (a["label_map"] == b["label_map"]).mean() >= 0.999
    first = onnx_out["results"][0]
    stem = os.path.splitext(os.path.basename(first["path"]))[0]
    with Image.open(tmp_path / "ort" / f"{stem}.png") as png:
        assert png.mode == "P"
        assert png.getpalette()[:12] == pseudo_colour_palette(256)[:12]
        assert np.array_equal(np.asarray(png), first["label_map"])
    original = np.asarray(Image.open(first["path"]))
    assert first["label_map"].shape == original.shape[:2]
    assert (tmp_path / "ort" / f"{stem}_overlay.jpg").is_file()


def test_det_checkpoint_and_onnx_agree(tmp_path, capsys):
    torch_out, onnx_out = _run_both(tmp_path, "det", capsys)
    for a, b in zip(torch_out["results"], onnx_out["results"]):
        assert len(a["scores"]) == len(b["scores"]) > 0
        assert np.abs(a["scores"] - b["scores"]).max() < 1e-4
        assert np.array_equal(a["category_ids"], b["category_ids"])
    records = json.loads((tmp_path / "ort" / "bbox.json").read_text())
    assert len(records) == sum(len(r["scores"]) for r in onnx_out["results"])
    category_ids = {row["id"] for row in read_inference_config(str(tmp_path / "inf"))["labels"]}
    assert len(category_ids) == 2  # the synthetic COCO categories (ids need not be 1..C)
    assert {r["category_id"] for r in records} <= category_ids and all(len(r["bbox"]) == 4 for r in records)
    assert len([n for n in os.listdir(tmp_path / "ort") if n.endswith(".jpg")]) == 4


def test_unreadable_file_raises_a_clear_error(tmp_path):
    cfg = tiny_seg_config(str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    runner = build_runner(inference_info_from_config(load_config(cfg, ["Global.synthetic_data=null"])))
    bad = tmp_path / "x.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(ImageReadError, match="x.png"):
        runner.load(str(bad))
    with pytest.raises(ImageReadError, match="missing.png"):
        runner.load(str(tmp_path / "missing.png"))


def test_seg_test_time_augmentation_same_from_checkpoint_and_onnx(tmp_path, capsys):
    cfg, overrides, model_dir, images = _setup(tmp_path, "seg")
    tool = _tool()
    common = [
        "--input",
        images,
        "--no_progress",
        "--aug_eval",
        "--scales",
        "0.75",
        "1.0",
        "--flip_horizontal",
    ]
    torch_out = tool.run(["-c", cfg, "-o", *overrides, "--output_dir", str(tmp_path / "pt"), *common])
    onnx_out = tool.run(["--model", model_dir, "--output_dir", str(tmp_path / "ort"), *common])
    plain = tool.run(
        ["--model", model_dir, "--output_dir", str(tmp_path / "plain"), "--input", images, "--no_progress"]
    )
    for a, b in zip(torch_out["results"], onnx_out["results"]):
        assert (a["label_map"] == b["label_map"]).mean() >= 0.999
    logits_differ = any(
        (a["label_map"] != c["label_map"]).any() for a, c in zip(onnx_out["results"], plain["results"])
    )
    assert logits_differ  # the augmentation did run (random-init logits change with scale and flip)


def test_predictor_on_exported_model_and_checkpoint(tmp_path):
    from ppdist.predict import Predictor

    cfg, overrides, model_dir, images = _setup(tmp_path, "seg")
    paths = sorted(os.path.join(images, n) for n in os.listdir(images) if n != "x.png")
    exported = Predictor(model_dir)
    checkpoint = Predictor(cfg, overrides=overrides)
    array = np.asarray(Image.open(paths[0]).convert("RGB"))[:, :, ::-1].copy()  # BGR, as cv2 reads it
    from_onnx = exported(paths[:2] + [array])
    from_torch = checkpoint(paths[:2])
    assert exported.task == checkpoint.task == "seg" and len(from_onnx) == 3
    for a, b in zip(from_onnx, from_torch):
        assert (a["label_map"] == b["label_map"]).mean() >= 0.999
    assert np.array_equal(from_onnx[2]["label_map"], from_onnx[0]["label_map"])  # array == its file


def test_mismatching_inference_yml_is_refused(tmp_path):
    import yaml

    from ppdist.errors import ConfigError
    from ppdist.inference.infer import from_exported

    _, _, model_dir, _ = _setup(tmp_path, "seg")
    path = os.path.join(model_dir, "inference.yml")
    with open(path) as handle:
        info = yaml.safe_load(handle)
    info["outputs"] = ["probs"]  # e.g. the inference.yml of a recognizer next to a segmentation graph
    with open(path, "w") as handle:
        yaml.safe_dump(info, handle)
    with pytest.raises(
        ConfigError,
        match=r"inference.yml does not describe .*model.onnx: the graph has outputs "
        r"\['logits'\] \(inference.yml: \['probs'\]\)",
    ):
        from_exported(model_dir)


@pytest.mark.slow
def test_exported_model_runs_in_a_fresh_process_without_the_config(tmp_path):
    """--model alone: nothing but inference.yml tells the process which components to build."""
    import subprocess
    import sys

    from ppdist_testing import child_env

    _, _, model_dir, images = _setup(tmp_path, "rec")
    os.remove(os.path.join(images, "x.png"))
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "tools", "infer.py"),
            "--model",
            model_dir,
            "--input",
            images,
            "--output_dir",
            str(tmp_path / "fresh"),
            "--no_progress",
        ],
        cwd=str(tmp_path),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=HANG_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "4 image(s) predicted, 0 skipped" in result.stdout
    assert len((tmp_path / "fresh" / "results.txt").read_text().splitlines()) == 4


def test_broken_exported_files_and_empty_results_are_named(tmp_path, caplog):
    from ppdist.errors import ConfigError
    from ppdist.inference.infer import from_exported
    from ppdist.inference.runners import list_images

    cfg, overrides, model_dir, images = _setup(tmp_path, "rec")
    onnx_path = os.path.join(model_dir, "model.onnx")
    with open(onnx_path, "wb") as handle:
        handle.write(b"corrupt")
    with pytest.raises(ConfigError, match="model.onnx is not a loadable ONNX model"):
        from_exported(model_dir)
    os.remove(onnx_path)
    with pytest.raises(ConfigError, match="model.onnx not found"):
        from_exported(model_dir)
    with open(os.path.join(model_dir, "inference.yml"), "w") as handle:
        handle.write("task: [rec\n")
    with pytest.raises(ConfigError, match="inference.yml is not readable YAML"):
        from_exported(model_dir)
    os.symlink(str(tmp_path / "gone.png"), os.path.join(images, "dangling.png"))
    with caplog.at_level("WARNING", logger="ppdist"):
        found = list_images(images)
    assert "dangling.png" not in " ".join(found) and "a link to a file that does not exist" in caplog.text
    # every input unreadable: test_rec_checkpoint_and_onnx_agree (refused, the previous results kept)
    with pytest.raises(ConfigError, match="inference from a config needs trained weights"):
        _tool().run(["-c", cfg, "--input", images])


def test_test_time_augmentation_is_refused_for_a_task_without_it(tmp_path):
    cfg, overrides, model_dir, images = _setup(tmp_path, "rec")
    with pytest.raises(ConfigError, match="--aug_eval / --is_slide apply to segmentation models only"):
        _tool().run(
            ["--model", model_dir, "--input", images, "--aug_eval", "--output_dir", str(tmp_path / "o")]
        )


def test_a_huge_image_is_skipped_in_infer_not_decoded(tmp_path):
    import zlib

    from PIL import Image as PILImage

    cfg, overrides, model_dir, images = _setup(tmp_path, "seg")
    buffer = tmp_path / "small.png"
    PILImage.fromarray(np.zeros((2, 2, 3), np.uint8)).save(buffer)
    data = bytearray(buffer.read_bytes())
    data[16:24] = (20000).to_bytes(4, "big") * 2
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    runner = build_runner(read_inference_config(model_dir))
    with pytest.raises(ImageReadError, match="20000 x 20000 pixels is over"):
        runner.load_encoded(bytes(data), "huge.png")
