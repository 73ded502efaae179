"""tools/browse_dataset.py: what the model sees, drawn, and the split's summary (all three tasks)."""

import json
import os

import numpy as np
import pytest
from picture_testing import assert_picture
from ppdist_testing import check_ok, run_tool, tiny_config, tiny_det_config, tiny_seg_config

from ppdist.config import load_config
from ppdist.data.prepare import ensure_synthetic_data
from ppdist.engine.dist import DistEnv
from ppdist.visualize.dataset_browser import draw_samples, read_samples, split_dataset, summarize

MAKERS = {"rec": tiny_config, "det": tiny_det_config, "seg": tiny_seg_config}


def loaded(task, tmp_path, overrides=()):
    path = MAKERS[task](str(tmp_path / f"{task}.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    config = load_config(path, list(overrides))
    ensure_synthetic_data(config, DistEnv())
    return path, config


def test_recognition_labels_are_decoded_back_to_the_label_file_text(tmp_path):
    _, config = loaded("rec", tmp_path)
    dataset = split_dataset(config, "Eval")
    browse = read_samples(config, "Eval", dataset, range(6))
    with open(os.path.join(str(tmp_path / "data"), "val.txt"), encoding="utf-8") as handle:
        labels = [line.rstrip("\n").split("\t")[1] for line in handle][:6]
    assert [s.text for s in browse.samples] == labels
    summary = summarize(browse)
    assert sum(summary["characters"].values()) == sum(len(t) for t in labels)
    assert summary["label_lengths"] == {
        n: sum(len(t) == n for t in labels) for n in sorted(set(map(len, labels)))
    }
    draw_samples(browse, str(tmp_path / "rec.png"))
    assert_picture(str(tmp_path / "rec.png"), (1200, 280))


def test_detection_boxes_are_the_annotations(tmp_path):
    _, config = loaded("det", tmp_path, ["Train.dataset.transforms=[{Decode: {}}]"])  # no flip
    dataset = split_dataset(config, "Train")
    browse = read_samples(config, "Train", dataset, range(5))
    annotations = os.path.join(str(tmp_path / "data"), "annotations", "instances_train.json")
    with open(annotations, encoding="utf-8") as handle:
        coco = json.load(handle)
    names = {c["id"]: c["name"] for c in coco["categories"]}
    total = 0
    for sample in browse.samples:
        image_id = dataset.image_id(sample.index)
        expected = [a for a in coco["annotations"] if a["image_id"] == image_id and not a.get("iscrowd")]
        boxes = sorted([x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in expected))
        np.testing.assert_allclose(
            sorted(sample.boxes.tolist()), boxes, atol=1e-3
        )  # BatchRandomBatchRandomResize to 96: identity
        assert sorted(browse.class_names[c] for c in sample.classes) == sorted(
            names[a["category_id"]] for a in expected
        )
        total += len(expected)
    summary = summarize(browse)
    assert sum(summary["boxes_per_class"].values()) == total
    assert sum(k * v for k, v in summary["boxes_per_image"].items()) == total
    draw_samples(browse, str(tmp_path / "det.png"))
    assert_picture(str(tmp_path / "det.png"), (1280, 640))


def test_segmentation_pixels_are_counted_and_drawn(tmp_path):
    _, config = loaded("seg", tmp_path)
    dataset = split_dataset(config, "Train")
    browse = read_samples(config, "Train", dataset, range(4))
    summary = summarize(browse)
    assert sum(summary["pixels_per_class"].values()) == 4 * 64 * 64
    assert set(summary["pixels_per_class"]) <= {0, 1, 2, 3, 255}
    draw_samples(browse, str(tmp_path / "seg.png"), dataset.ignore_index)
    assert_picture(str(tmp_path / "seg.png"), (1280, 320))


def test_the_tool_writes_the_picture_and_names_bad_samples(tmp_path):
    path, config = loaded("rec", tmp_path)
    train_list = os.path.join(str(tmp_path / "data"), "train.txt")
    with open(train_list, encoding="utf-8") as handle:
        lines = handle.readlines()
    lines[1] = "images/missing.png\tabc\n"
    with open(train_list, "w", encoding="utf-8") as handle:
        handle.writelines(lines)
    out = str(tmp_path / "browse")
    result = check_ok(
        run_tool(
            ["browse_dataset.py", "-c", path, "--num", "4", "--out", out, "-o", "Global.synthetic_data=null"]
        )
    )
    assert "wrote" in result.stdout
    summary = json.load(open(os.path.join(out, "summary.json"), encoding="utf-8"))
    assert summary["samples"] == 4 and summary["of"] == "the 4 drawn samples"
    assert any("missing.png" in line for line in summary["bad_samples"]), summary["bad_samples"]
    assert_picture(os.path.join(out, "samples.png"), (1200, 280))
    bad = run_tool(["browse_dataset.py", "-c", path, "--num", "0", "--out", out])
    assert bad.returncode == 2 and "--num must be a positive number" in bad.stderr


@pytest.mark.parametrize("split", ["Nope"])
def test_unknown_split_is_refused_by_argparse(tmp_path, split):
    result = run_tool(["browse_dataset.py", "-c", "configs/rec/quickstart_synth.yml", "--split", split])
    assert result.returncode == 2 and "invalid choice" in result.stderr
