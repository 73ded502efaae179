"""SLANet exported with its greedy decode inside the graph (one loop, not max_text_length + 1 copies
of a step): ONNX Runtime and TorchScript equal the PyTorch eval forward, the graph names no device,
``inference.yml`` carries the structure tokens, and tools/infer.py gives the same HTML and boxes from
the checkpoint and from the exported directory, with its result files.

A tiny random-init SLANet (tests/ppdist_testing.tiny_table_config, 64x64 images, 41 steps), its
``<td></td>`` score raised so that the decode emits cells (and so boxes) rather than one arbitrary
token; no training."""

from __future__ import annotations

import importlib.util
import json
import os
import warnings

import cv2
import numpy as np
import onnx
import pytest
import torch
from lxml import html as lxml_html
from PIL import Image
from ppdist_testing import REPO, tiny_table_config

from ppdist.components import build_model, build_postprocess
from ppdist.config import load_config
from ppdist.data.synthetic_table import generate_table_dataset
from ppdist.export.inference_config import read_inference_config
from ppdist.export.model_export import export_model
from ppdist.inference.runners import build_runner
from ppdist.inference.writers import FILE_LIST

pytest.importorskip("onnxruntime")
SIZE, STEPS = 64, 41  # PaddingTableImage 64x64; max_text_length 40 + 1
CELL = 28  # <td></td>: appended after the 27 tokens of the dictionary without <td>, after sos


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(config, its overrides, eval model, exported dir, export report, input folder of 3 tables)."""
    root = tmp_path_factory.mktemp("table_export")
    data = str(root / "data")
    generate_table_dataset(data, num_train=3, num_val=1, seed=3, max_rows=3, max_cols=3)
    cfg = tiny_table_config(str(root / "c.yml"), data, str(root / "out"), size=SIZE)
    overrides = ["Global.synthetic_data=null", f"Global.checkpoints={root / 'ckpt'}"]
    config = load_config(cfg, overrides)
    torch.manual_seed(0)
    model = build_model(config).eval()
    assert build_postprocess(config).character.index("<td></td>") == CELL
    with torch.no_grad():
        model.head.structure_generator[1].bias[CELL] += 4.0
    torch.save({"model": model.state_dict()}, str(root / "ckpt.pt"))
    report = export_model(config, str(root / "inf"), ("onnx", "torchscript"), check=True, tolerance=1e-4)
    images = root / "images"
    images.mkdir()
    train = os.path.join(data, "images", "train")
    for name in sorted(os.listdir(train))[:3]:
        os.symlink(os.path.join(train, name), images / name)
    return cfg, overrides, model, root / "inf", report, images


def _load(path: str):
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tool():
    return _load(os.path.join(REPO, "tools", "infer.py"))


def _inputs(batch: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


def test_onnx_and_torchscript_equal_the_eval_forward_with_one_loop(exported):
    import onnxruntime as ort

    _, _, model, model_dir, report, _ = exported
    assert report["task"] == "table" and report["max_abs_diff"] <= 1e-4  # export's own --check
    graph = onnx.load(str(model_dir / "model.onnx")).graph
    assert [n.op_type for n in graph.node].count("Loop") == 1 and len(graph.node) < 1000
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    scripted = torch.jit.load(str(model_dir / "model.pt"))
    assert any(node.kind() == "prim::Loop" for node in scripted.graph.nodes())
    for batch in (1, 3):  # the batch is dynamic
        image = _inputs(batch, seed=batch)
        with torch.no_grad():
            want = model(image)
            from_ts = scripted(image)
        from_ort = session.run(None, {"image": image.numpy()})
        for i, key in enumerate(("structure_probs", "loc_preds")):
            assert tuple(want[key].shape)[:2] == (batch, STEPS)
            assert np.abs(from_ort[i] - want[key].numpy()).max() <= 1e-4, key
            assert (from_ts[i] - want[key]).abs().max() <= 1e-4, key
        tokens = want["structure_probs"].argmax(-1)
        assert torch.equal(torch.from_numpy(from_ort[0]).argmax(-1), tokens)


def test_torchscript_graph_names_no_device(exported):
    """test_graph_export's check (a traced ``arange(device="cpu")`` would not move to a GPU), on
    the frozen graph with its scripted loop."""
    device_constants = _load(os.path.join(os.path.dirname(__file__), "test_graph_export.py")).device_constants
    _, _, _, model_dir, _, _ = exported
    assert device_constants(torch.jit.load(str(model_dir / "model.pt")).graph) == []


def test_inference_yml_holds_the_padded_size_and_the_structure_tokens(exported):
    cfg, overrides, _, model_dir, _, _ = exported
    info = read_inference_config(str(model_dir))
    assert info["task"] == "table" and info["outputs"] == ["structure_probs", "loc_preds"]
    assert info["inputs"] == [{"name": "image", "shape": [-1, 3, SIZE, SIZE], "dtype": "float32"}]
    ops = [next(iter(step)) for step in info["preprocess"]]
    assert ops == ["DecodeImage", "ResizeTableImage", "NormalizeImage", "PaddingTableImage", "ToCHWImage"]
    classes = build_postprocess(load_config(cfg, overrides)).character
    tokens = (model_dir / "structure_tokens.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert tokens == classes[1:-1] and info["labels"]["num_classes"] == len(classes) == 30
    assert info["postprocess"]["character_dict_path"] == str(model_dir / "structure_tokens.txt")
    assert info["postprocess"]["merge_no_span_structure"] is True


def test_infer_from_checkpoint_and_export_gives_the_same_tables_and_files(exported, tmp_path):
    cfg, overrides, _, model_dir, _, images = exported
    tool = _tool()
    common = ["--input", str(images), "--batch_size", "2", "--no_progress"]
    from_ckpt = tool.run(["-c", cfg, "-o", *overrides, "--output_dir", str(tmp_path / "pt"), *common])
    from_onnx = tool.run(["--model", str(model_dir), "--output_dir", str(tmp_path / "ort"), *common])
    assert from_ckpt["images"] == from_onnx["images"] == 3
    for a, b in zip(from_ckpt["results"], from_onnx["results"]):
        assert a["html"] == b["html"] and a["structure"] == b["structure"]
        assert a["boxes"].shape == b["boxes"].shape and np.abs(a["boxes"] - b["boxes"]).max() < 1e-3
    lines = (tmp_path / "ort" / "results.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3
    for line, result in zip(lines, from_onnx["results"]):
        record = json.loads(line)
        assert record["path"] == result["path"] and record["html"] == result["html"]
        assert record["html"].startswith("<html><body><table>") and record["html"].endswith(
            "</table></body></html>"
        )
        stem, name = os.path.splitext(os.path.basename(result["path"]))[0], os.path.basename(result["path"])
        assert (tmp_path / "ort" / f"{stem}.html").read_text(encoding="utf-8") == record["html"]
        cells = lxml_html.fromstring(record["html"]).xpath("//td")
        boxes = np.asarray(record["boxes"], dtype=np.float32)
        assert len(cells) == len(boxes) > 0 and boxes.shape[1] == 4  # a box per cell, xyxy
        with Image.open(result["path"]) as original, Image.open(tmp_path / "ort" / name) as drawn:
            width, height = original.size
            assert drawn.size == original.size
            changed = np.asarray(drawn.convert("RGB")) != np.asarray(original.convert("RGB"))
        assert changed.any()  # the boxes are drawn
        assert (boxes >= 0).all() and (boxes[:, 0::2] <= width).all() and (boxes[:, 1::2] <= height).all()
    # the boxes are the cell steps' normalised boxes times the original image's width and height
    runner = build_runner(read_inference_config(str(model_dir)))
    sample = runner.load(from_onnx["results"][0]["path"])
    with torch.no_grad():
        want = exported[2](torch.from_numpy(sample["image"][None]))
    cell_steps = [i for i, t in enumerate(want["structure_probs"][0].argmax(-1).tolist()) if t == CELL]
    height, width = sample["shape"][:2]
    expected = want["loc_preds"][0, cell_steps].numpy() * np.array([width, height, width, height])
    assert (
        np.abs(from_onnx["results"][0]["boxes"] - expected[: len(from_onnx["results"][0]["boxes"])]).max()
        < 1e-3
    )


def test_a_second_infer_replaces_the_first_ones_files_and_a_narrow_table_is_skipped_saying_why(
    exported, tmp_path, capsys
):
    """Issue 44: a second run into the same folder removes the first run's per-image files that it
    did not write again (never a file put there by hand); a 300x1 image is skipped as too narrow, not
    counted as unreadable; PyTorch table inference prints no torch.jit.script deprecation warning."""
    cfg, overrides, _, _, _, images = exported
    first = sorted(os.listdir(images))
    few = tmp_path / "few"
    few.mkdir()
    for name in first[1:]:
        os.symlink(os.path.realpath(images / name), few / name)
    cv2.imwrite(str(few / "narrow.png"), np.full((300, 1, 3), 255, np.uint8))
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    tool = _tool()
    common = ["-c", cfg, "-o", *overrides, "--output_dir", str(out), "--no_progress"]
    tool.run([*common, "--input", str(images)])
    stems = [os.path.splitext(name)[0] for name in first]
    assert sorted(os.listdir(out)) == sorted(
        [FILE_LIST, "notes.txt", "results.jsonl", *first, *(f"{s}.html" for s in stems)]
    )
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = tool.run([*common, "--input", str(few)])
    printed = capsys.readouterr()
    assert not [w for w in caught if "torch.jit.script" in str(w.message)]
    assert [json.loads(line)["path"] for line in (out / "results.jsonl").read_text().splitlines()] == [
        str(few / name) for name in first[1:]
    ]
    assert sorted(os.listdir(out)) == sorted(
        [FILE_LIST, "notes.txt", "results.jsonl", *first[1:], *(f"{s}.html" for s in stems[1:])]
    )  # the first image's picture and HTML are gone, the hand-made notes stay
    assert (out / "notes.txt").read_text() == "mine"
    assert summary["images"] == 2 and [os.path.basename(p) for p, _ in summary["skipped"]] == ["narrow.png"]
    skips = [line for line in (printed.out + printed.err).splitlines() if "narrow.png" in line]
    assert len(skips) == 1 and skips[0].endswith(  # one line (tools/infer.py's log)
        f"WARNING: skipped {few / 'narrow.png'}: image 300x1 is too narrow to resize to max_len {SIZE}"
    )
    assert "2 image(s) predicted, 1 skipped (each named above), " in printed.out
    assert "unreadable" not in printed.out + printed.err
