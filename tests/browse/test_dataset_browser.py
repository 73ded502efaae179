"""tools/browse_dataset.py: what the model sees, drawn, and the split's summary (all three tasks)."""

import json
import os

import numpy as np
import pytest
from picture_testing import assert_picture
from PIL import Image
from ppdist_testing import check_ok, run_tool, tiny_config, tiny_det_config, tiny_seg_config

from ppdist.browse.browse import BrowseOptions, browse_dataset
from ppdist.browse.dataset_browser import choose_indices, read_samples, split_dataset, summarize
from ppdist.browse.sample_grid import IGNORE_RGB, OVERLAY_ALPHA, box_colour, overlay, render_samples
from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.errors import ConfigError
from ppdist.inference.writers import build_writer
from ppdist.metrics.seg import SegMetric
from ppdist.tasks.result_files import LEGEND_ROW_PX
from ppdist.tasks.seg import segmentation_labels
from ppdist.visualize import eval_pictures
from ppdist.visualize.eval_pictures import write_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAKERS = {"rec": tiny_config, "det": tiny_det_config, "seg": tiny_seg_config}


def loaded(task, tmp_path, overrides=()):
    path = MAKERS[task](str(tmp_path / f"{task}.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    config = load_config(path, list(overrides))
    ensure_synthetic_data(config, DistEnv())
    return path, config


def read_lines(path):
    with open(path, encoding="utf-8") as handle:
        return handle.readlines()


def test_recognition_labels_are_decoded_back_to_the_label_file_text(tmp_path):
    _, config = loaded("rec", tmp_path)
    dataset = split_dataset(config, "Eval")
    browse = read_samples(config, "Eval", dataset, range(6))
    labels = [line.rstrip("\n").split("\t")[1] for line in read_lines(tmp_path / "data" / "val.txt")][:6]
    assert [s.text for s in browse.samples] == labels
    summary = summarize(browse)
    assert summary["characters"] == sum(summary["characters_per_class"].values()) == sum(map(len, labels))
    assert summary["label_lengths"] == {n: sum(len(t) == n for t in labels) for n in set(map(len, labels))}
    assert summary["image_sizes_after_transforms"]["100x32"] == 6
    first = Image.open(str(tmp_path / "data" / browse.samples[0].origin.split("(")[1].rstrip(")")))
    assert summary["raw_image_sizes"]["width_range"][0] <= first.size[0]
    figure = render_samples(browse, browse.samples)
    assert tuple(figure.canvas.get_width_height()) == (1200, 280)


def flipped(boxes, width):
    return np.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], axis=1)


def test_detection_boxes_are_the_annotations_after_the_transforms_and_drawn_where_they_are(tmp_path):
    _, config = loaded("det", tmp_path)
    resize = config["Train"]["dataset"]["batch_transforms"][0]["BatchRandomResize"]
    resize["target_size"] = [128]  # 96 -> 128: the boxes scale by 4/3 (and RandomFlip may flip)
    dataset = split_dataset(config, "Train")
    browse = read_samples(config, "Train", dataset, range(6))
    coco = json.load(open(tmp_path / "data" / "annotations" / "instances_train.json", encoding="utf-8"))
    names = {c["id"]: c["name"] for c in coco["categories"]}
    total = 0
    for sample in browse.samples:
        assert sample.size == (128, 128) and sample.image.shape == (128, 128, 3)
        expected = [a for a in coco["annotations"] if a["image_id"] == dataset.image_id(sample.index)]
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in expected)]) * 128 / 96
        got = sample.boxes[np.lexsort(sample.boxes.T[::-1])]
        candidates = [boxes, flipped(boxes, 128)]
        assert any(np.allclose(got, c[np.lexsort(c.T[::-1])], atol=0.05) for c in candidates), sample.index
        assert sorted(browse.class_names[c] for c in sample.classes) == sorted(
            names[a["category_id"]] for a in expected
        )
        total += len(expected)
    summary = summarize(browse)
    assert summary["boxes"] == sum(summary["boxes_per_class"].values()) == total
    assert sum(k * v for k, v in summary["boxes_per_image"].items()) == total
    assert sum(summary["boxes_per_image"].values()) == summary["samples_counted"] == 6

    sample = max(browse.samples, key=lambda s: float(np.prod(s.boxes[:, 2:] - s.boxes[:, :2], axis=1).max()))
    figure = render_samples(browse, [sample])
    path = str(tmp_path / "one.png")
    figure.savefig(path, dpi=figure.dpi)
    drawn = np.asarray(Image.open(path).convert("RGB")).astype(int)
    axes, height = figure.axes[0], figure.canvas.get_width_height()[1]
    biggest = int(np.argmax(np.prod(sample.boxes[:, 2:] - sample.boxes[:, :2], axis=1)))
    x1, y1, x2, y2 = sample.boxes[biggest]
    colour = np.array(box_colour(int(sample.classes[biggest]))) * 255
    for x, y in ((x1, (y1 + y2) / 2), (x2, (y1 + y2) / 2), ((x1 + x2) / 2, y2)):  # left, right, bottom
        px, py = axes.transData.transform((x, y))
        patch = drawn[int(height - py) - 1 : int(height - py) + 2, int(px) - 1 : int(px) + 2]
        assert np.abs(patch - colour).sum(axis=-1).min() < 40, (x, y, patch)


def test_segmentation_pixels_per_class_are_the_label_files_and_ignore_is_white(tmp_path):
    _, config = loaded("seg", tmp_path)
    dataset = split_dataset(config, "Eval")
    browse = read_samples(config, "Eval", dataset, range(5))
    expected = np.zeros(256, np.int64)
    for line in read_lines(tmp_path / "data" / "val.txt")[:5]:
        label = np.asarray(Image.open(str(tmp_path / "data" / line.split()[1])))
        expected += np.bincount(label.ravel(), minlength=256)
    summary = summarize(browse)
    assert summary["pixels_per_class"] == {c: int(n) for c, n in enumerate(expected[:255]) if n}
    assert summary["ignored_pixels"] == expected[255] > 0
    assert summary["labelled_pixels"] + summary["ignored_pixels"] == 5 * 64 * 64
    sample = browse.samples[0]
    shown = overlay(np.zeros_like(sample.image), sample.label_map, 255)
    ignored = sample.label_map == 255
    assert (shown[ignored] == round(OVERLAY_ALPHA * IGNORE_RGB[0])).all()
    assert (shown[~ignored] < round(OVERLAY_ALPHA * 255)).any(axis=-1).all()  # classes: not white
    figure = render_samples(browse, browse.samples)
    assert tuple(figure.canvas.get_width_height()) == (3 * 520, 2 * 280 + 40)


def test_detection_eval_samples_show_their_annotations_scaled_as_the_image(tmp_path):
    _, config = loaded("det", tmp_path)
    config["Eval"]["dataset"]["transforms"][1]["Resize"]["target_size"] = [160, 160]  # 96 -> 160
    dataset = split_dataset(config, "Eval")  # the eval pipeline keeps no boxes
    browse = read_samples(config, "Eval", dataset, range(3))
    coco = json.load(open(tmp_path / "data" / "annotations" / "instances_val.json", encoding="utf-8"))
    for sample in browse.samples:
        assert sample.size == (160, 160)
        expected = [a["bbox"] for a in coco["annotations"] if a["image_id"] == dataset.image_id(sample.index)]
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in expected]).reshape(-1, 4) * 160 / 96
        np.testing.assert_allclose(sample.boxes, boxes, atol=1e-3)


def test_a_missing_image_is_a_bad_sample_of_the_summary_and_the_rest_is_counted(tmp_path):
    _, config = loaded("det", tmp_path)
    dataset = split_dataset(config, "Eval")
    missing = dataset.image_path(2)
    os.remove(missing)
    out = str(tmp_path / "browse")
    summary = browse_dataset(config, BrowseOptions("Eval", num=4, out_dir=out, whole_split=True))
    assert len(summary["bad_samples"]) == 1 and missing in summary["bad_samples"][0]
    coco = json.load(open(tmp_path / "data" / "annotations" / "instances_val.json", encoding="utf-8"))
    kept = [a for a in coco["annotations"] if a["image_id"] != dataset.image_id(2) and not a.get("iscrowd")]
    assert summary["boxes"] == sum(summary["boxes_per_class"].values()) == len(kept)  # from the annotations
    assert summary["samples_counted"] == len(dataset) - 1 and summary["of"].startswith("the whole split")
    assert missing in open(os.path.join(out, "summary.md"), encoding="utf-8").read()
    assert_picture(os.path.join(out, "samples.png"), (3 * 320, 320))  # 3 of the first 4 are good
    with pytest.raises(ConfigError, match="--num must be a positive"):
        browse_dataset(config, BrowseOptions("Eval", num=0, out_dir=out))


def test_choosing_samples_is_the_first_n_or_a_seeded_random_choice():
    assert choose_indices(10, 4, False, 0) == [0, 1, 2, 3]
    assert choose_indices(3, 5, False, 0) == [0, 1, 2]
    chosen = choose_indices(100, 8, True, 7)
    assert chosen == choose_indices(100, 8, True, 7) != choose_indices(100, 8, True, 8)
    assert len(set(chosen)) == 8 and chosen == sorted(chosen)


@pytest.mark.slow
def test_the_tool_draws_the_split_and_lists_a_missing_image_with_its_line(tmp_path):
    path, _ = loaded("rec", tmp_path)
    train_list = tmp_path / "data" / "train.txt"
    lines = read_lines(train_list)
    lines[1] = "images/missing.png\tabc\n"
    train_list.write_text("".join(lines), encoding="utf-8")
    out = str(tmp_path / "browse")
    args = ["browse_dataset.py", "-c", path, "--num", "30", "--out", out, "--all"]
    result = check_ok(run_tool(args + ["-o", "Global.synthetic_data=null"]))
    summary = json.load(open(os.path.join(out, "summary.json"), encoding="utf-8"))
    assert summary["bad_samples"] == [
        f"{train_list}:2 (images/missing.png): " + summary["bad_samples"][0].split(": ", 1)[1]
    ]
    assert summary["samples_counted"] == len(lines) - 1  # the replacement is counted at its own index
    labels = [line.rstrip("\n").split("\t")[1] for i, line in enumerate(lines) if i != 1]
    assert summary["characters"] == sum(map(len, labels))
    assert "missing.png" in result.stdout and "## bad samples (1)" in result.stdout
    assert summary["pictures"] == [os.path.join(out, "samples_1.png"), os.path.join(out, "samples_2.png")]
    assert_picture(summary["pictures"][0], (3 * 400, 8 * 140))
    assert_picture(summary["pictures"][1], (3 * 400, 2 * 140))


def test_segmentation_classes_have_infers_colours_and_the_datasets_names(tmp_path, monkeypatch):
    """browse_dataset's overlay and legend, infer's PNG palette and the evaluation pictures: one
    colour per class, and the names of the set's labels.txt (``class i`` without one)."""
    _, config = loaded("seg", tmp_path)
    dataset = split_dataset(config, "Eval")
    names = ["background", "ellipse", "rectangle", "triangle"]
    assert dataset.label_list == names
    browse = read_samples(config, "Eval", dataset, range(3))
    legend = render_samples(browse, browse.samples).legends[0]
    drawn = {
        text.get_text(): tuple(round(255 * c) for c in handle.get_facecolor()[:3])
        for text, handle in zip(legend.get_texts(), legend.legend_handles)
    }
    sample = browse.samples[0]
    image = str(tmp_path / "image.png")
    Image.fromarray(sample.image).save(image)
    label_map = np.where(sample.label_map == 255, 0, sample.label_map)
    info = {"task": "seg", "labels": segmentation_labels(config)}  # what infer gets (inference.yml)
    assert info["labels"] == {"num_classes": 4, "names": names}
    writer = build_writer("seg", str(tmp_path / "infer"), info)
    (png, jpg) = writer.write({"path": image, "label_map": label_map})
    infer_palette = Image.open(png).getpalette()
    rows = len(np.unique(label_map))  # the overlay above one legend row per class it shows
    assert writer.names == names and Image.open(jpg).size[1] == 64 + LEGEND_ROW_PX * rows + 4
    shown = overlay(np.zeros_like(sample.image), sample.label_map, 255)
    for cls in range(4):
        colour = tuple(infer_palette[3 * cls : 3 * cls + 3])
        assert drawn[names[cls]] == colour, names[cls]
        where = sample.label_map == cls
        if where.any():
            assert (shown[where] == np.round(OVERLAY_ALPHA * np.array(colour))).all(), cls
    assert drawn["ignore (255)"] == (255, 255, 255)
    figures = []
    monkeypatch.setattr(eval_pictures, "save_png", lambda figure, path: figures.append(figure))
    metric = SegMetric(num_classes=4)
    metric.bind_dataset(dataset)
    write_report(metric.report(), str(tmp_path / "pictures"))
    assert [t.get_text() for t in figures[0].axes[0].get_xticklabels()] == names
    os.remove(tmp_path / "data" / "labels.txt")  # a set without names: classes by number
    dataset = split_dataset(config, "Eval")
    browse = read_samples(config, "Eval", dataset, range(3))
    texts = [t.get_text() for t in render_samples(browse, browse.samples).legends[0].get_texts()]
    assert texts[:2] == ["class 0", "class 1"] and dataset.label_list == []


def test_a_detection_class_has_one_colour_in_browse_and_infer(tmp_path):
    """Class k (the k-th category of the set) is drawn in one colour: browse_dataset's box and
    infer's box of that category."""
    labels = [{"id": 3, "name": "ellipse"}, {"id": 7, "name": "rectangle"}, {"id": 9, "name": "ring"}]
    image = str(tmp_path / "white.png")
    Image.fromarray(np.full((60, 60, 3), 255, np.uint8)).save(image)
    writer = build_writer("det", str(tmp_path / "infer"), {"labels": labels}, draw_threshold=0.5)
    for index, label in enumerate(labels):
        result = {
            "path": image,
            "boxes": np.array([[10.0, 20.0, 50.0, 50.0]]),
            "scores": np.array([0.9]),
            "category_ids": np.array([label["id"]]),
        }
        drawn = np.asarray(Image.open(writer.draw(result)).convert("RGB"))
        edge = tuple(int(v) for v in drawn[35, 10])  # the box's left side
        assert edge == tuple(round(255 * c) for c in box_colour(index)), label["name"]
    assert len({box_colour(k) for k in range(3)}) == 3


def test_when_every_sample_is_bad_the_tool_lists_each_and_exits_2(tmp_path):
    """Was: a traceback (ValueError "no usable sample to draw (4 bad)", exit 1) naming no sample."""
    path, _ = loaded("rec", tmp_path)
    train_list = tmp_path / "data" / "train.txt"
    count = len(read_lines(train_list))
    train_list.write_text("".join(f"images/missing_{i}.png\tabc\n" for i in range(count)), encoding="utf-8")
    out = str(tmp_path / "browse")
    args = ["browse_dataset.py", "-c", path, "--num", "3", "--out", out, "-o", "Global.synthetic_data=null"]
    result = run_tool(args)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    for line in (1, 2, 3):
        listed = [row for row in result.stdout.splitlines() if f"{train_list}:{line} " in row]
        assert (
            len(listed) == 1 and f"missing_{line - 1}.png" in listed[0] and "FileNotFoundError" in listed[0]
        )
    errors = [row for row in result.stderr.splitlines() if row.startswith("ppdist: error:")]
    assert len(errors) == 1 and "none of the 3 sample(s)" in errors[0] and "3 bad" in errors[0], result.stderr
    summary = json.load(open(os.path.join(out, "summary.json"), encoding="utf-8"))
    assert len(summary["bad_samples"]) == 3 and summary["pictures"] == []


def test_ppocrv3_multi_head_labels_are_decoded_back_to_the_label_file_text(tmp_path):
    """MultiLabelEncode writes label_ctc / label_sar, not label: the CTC label is the one shown."""
    data = str(tmp_path / "d")
    config = load_config(
        os.path.join(ROOT, "configs", "rec", "PP-OCRv3", "quickstart_synth.yml"),
        [
            "Global.synthetic_data.num_train=8",
            "Global.synthetic_data.num_val=4",
            f"Global.synthetic_data.data_dir={data}",
            f"Global.character_dict_path={data}/dict.txt",
            f"Global.save_model_dir={tmp_path / 'out'}",
            f"Eval.dataset.data_dir={data}",
            f"Eval.dataset.label_file_list=[{data}/val.txt]",
        ],
    )
    ensure_synthetic_data(config, DistEnv())
    dataset = split_dataset(config, "Eval")
    browse = read_samples(config, "Eval", dataset, range(4))
    labels = [line.rstrip("\n").split("\t")[1] for line in read_lines(os.path.join(data, "val.txt"))]
    assert [s.text for s in browse.samples] == labels
    assert summarize(browse)["characters"] == sum(map(len, labels))
