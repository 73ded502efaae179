"""Table evaluation pictures: the worst wrong tables (lowest TEDS first) drawn with predicted and
labelled cells, and structure accuracy by structure length; merged process states keep exactly the
single process's worst tables; an untrained SLANet's evaluation draws them through the evaluator."""

import pickle

import numpy as np
import pytest
from picture_testing import assert_picture, keep_saved_figures
from PIL import Image
from ppdist_testing import tiny_table_config

from ppdist.components import build_metric, build_model, build_postprocess
from ppdist.config import load_config
from ppdist.data.base import SAMPLE_INDEX_KEY
from ppdist.data.build import build_dataloader, build_dataset
from ppdist.data.synthetic_table import generate_table_dataset
from ppdist.engine.dist import DistEnv
from ppdist.engine.evaluator import Evaluator
from ppdist.metrics.table import GALLERY_SIZE, TableMetric, accuracy_by_length
from ppdist.visualize import table_pictures
from ppdist.visualize.eval_pictures import write_report
from ppdist.visualize.table_pictures import LABEL_RGB, PRED_RGB

ROW = ["<tr>", "<td></td>", "<td></td>", "</tr>"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    generate_table_dataset(str(root / "data"), num_train=1, num_val=6, seed=5, max_rows=3, max_cols=3)
    path = tiny_table_config(str(root / "t.yml"), str(root / "data"), str(root / "out"))
    return root, load_config(path, [])


def results(preds, labels, box=(10.0, 5.0, 60.0, 25.0)):
    """TableLabelDecode's results for token lists: one cell box per prediction / label."""
    boxes = [np.array([box], np.float32) for _ in preds]
    return {
        "structure_batch_list": [[p, 0.9] for p in preds],
        "bbox_batch_list": boxes,
        "labels": {
            "structure_batch_list": labels,
            "bbox_batch_list": [[np.array([0.0, 0.0, 40.0, 30.0])]] * 6,
        },
    }


def batch(indices):
    return {SAMPLE_INDEX_KEY: np.array(indices)}


def test_worst_tables_and_accuracy_by_length_merge_exactly(tmp_path, tables, monkeypatch):
    _, config = tables
    labels = [ROW * n for n in (1, 2, 3, 4, 5, 6)]  # 4 .. 24 tokens
    preds = [ROW * 1, ROW * 1, ROW * 3, ROW * 1, ROW * 5, ["<tr>"]]  # 1, 3, 5 wrong
    whole = TableMetric(teds=True)
    whole.update(results(preds, labels), batch(range(6)))
    parts = []
    for start in (0, 3):  # two processes, their states pickled and merged
        part = TableMetric(teds=True)
        part.update(
            results(preds[start : start + 3], labels[start : start + 3]), batch(range(start, start + 3))
        )
        parts.append(pickle.loads(pickle.dumps(part.state())))
    merged = TableMetric(teds=True)
    merged.load_states(parts)
    assert merged.mistakes == whole.mistakes and merged.records == whole.records
    assert [m.index for m in whole.mistakes] == [5, 3, 1]  # the lowest TEDS first
    teds = [m.similarity for m in whole.mistakes]
    assert teds == sorted(teds) and teds[0] < 0.2 and all(t < 1 for t in teds)
    rows = accuracy_by_length(whole.records)
    assert [(r["lengths"], r["tables"], r["correct"]) for r in rows] == [
        ("0-9", 2, 1),
        ("10-19", 2, 1),
        ("20-29", 2, 1),
    ]
    assert rows[0]["teds"] == pytest.approx((1.0 + teds[2]) / 2)

    dataset = build_dataset(config, "Eval", "eval")
    merged.bind_dataset(dataset)
    figures = keep_saved_figures(monkeypatch, table_pictures)
    written = write_report(merged.report(), str(tmp_path))
    names = ["worst_tables.png", "worst_tables.md", "accuracy_by_length.png", "accuracy_by_length.md"]
    assert [p.split("/")[-1] for p in written] == names
    listing = open(written[1], encoding="utf-8").read()
    assert "The 3 worst of 3 wrong structure(s) in 6 table(s)" in listing
    assert (
        "| 1 | " + f"{teds[0]:.4f}" + " | `" + "".join(ROW * 6) + "` | `<tr>` | " + dataset.origin(5)
        in listing
    )
    by_length = open(written[3], encoding="utf-8").read()
    assert "| 0-9 | 2 | 1 | 0.5000 |" in by_length
    gallery = figures[0]
    assert gallery.axes[0].get_title().startswith(f"1. TEDS {teds[0]:.3f}, label 24 / predicted 1 tokens")
    # the first table's predicted box (red) and labelled box (green) drawn where they are
    drawn = np.asarray(Image.open(written[0]).convert("RGB")).astype(int)
    axes, height = gallery.axes[0], gallery.canvas.get_width_height()[1]
    for (x, y), colour in (((10.0, 15.0), PRED_RGB), ((35.0, 25.0), PRED_RGB), ((40.0, 15.0), LABEL_RGB)):
        px, py = axes.transData.transform((x, y))
        patch = drawn[int(height - py) - 1 : int(height - py) + 2, int(px) - 1 : int(px) + 2]
        assert np.abs(patch - np.array(colour) * 255).sum(axis=-1).min() < 60, (x, y, patch)
    bars = [p.get_height() for p in figures[1].axes[0].patches]
    assert bars == [0.5, 0.5, 0.5]


def test_an_untrained_slanet_evaluation_draws_its_worst_tables(tmp_path, tables):
    root, _ = tables
    config = load_config(str(root / "t.yml"), ["Eval.loader.batch_size_per_card=6"])  # one decode
    torch_model = build_model(config).eval()
    loader = build_dataloader(config, "Eval", "eval", 0, 1, "cpu")
    metric = build_metric(config)
    evaluator = Evaluator(loader, build_postprocess(config), metric, DistEnv())
    metrics = evaluator.run(torch_model)
    written = evaluator.draw_pictures(str(tmp_path / "out"))
    wrong = metric.all_num - metric.correct_num
    assert metric.all_num == 6 and wrong == round(6 * (1 - metrics["acc"]))
    assert len(metric.mistakes) == min(wrong, GALLERY_SIZE) and len(metric.records) == 6
    assert sorted(r[0] for r in metric.records) == list(range(6))
    assert wrong > 0  # untrained: wrong tables to draw
    assert_picture(written[0], min_size=(400, 400))
    lengths = sum(int(line.split("|")[2]) for line in open(written[-1]).read().splitlines()[4:])
    assert lengths == 6  # every table in one length bin


def test_the_kept_worst_tables_of_merged_processes_are_the_single_process_ones():
    """More wrong tables than GALLERY_SIZE, split over 3 processes: the merged 9 worst (token
    similarity without teds, then index) are exactly one process's."""
    labels = [ROW * (1 + n % 5) for n in range(18)]
    preds = [ROW * (1 + n % 3) for n in range(18)]  # wrong where the row counts differ
    whole = TableMetric()
    for start in range(0, 18, 6):
        whole.update(
            results(preds[start : start + 6], labels[start : start + 6]), batch(range(start, start + 6))
        )
    parts = []
    for start in (0, 6, 12):
        part = TableMetric()
        part.update(
            results(preds[start : start + 6], labels[start : start + 6]), batch(range(start, start + 6))
        )
        parts.append(part.state())
    merged = TableMetric()
    merged.load_states(parts)
    wrong = [n for n in range(18) if 1 + n % 5 != 1 + n % 3]
    assert len(wrong) > GALLERY_SIZE and len(merged.mistakes) == GALLERY_SIZE
    assert merged.mistakes == whole.mistakes
    keys = sorted(
        (1 - abs(len(labels[n]) - len(preds[n])) / max(len(labels[n]), len(preds[n])), n) for n in wrong
    )
    assert [m.index for m in whole.mistakes] == [n for _, n in keys[:GALLERY_SIZE]]
