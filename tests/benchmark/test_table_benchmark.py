"""tools/benchmark.py's measurements on a table model: the synthetic set of ``--synthetic`` in
PubTabNet's layout, batches with the SLANet keys, and the bare loop, trainer and eval throughput."""

import json

import numpy as np
from ppdist_testing import tiny_table_config

import ppdist.tasks.det
import ppdist.tasks.seg
import ppdist.tasks.table
from ppdist.benchmark import measurements as m
from ppdist.benchmark import pipeline_data
from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger


def test_the_measurements_run_a_tiny_slanet_on_synthetic_tables(tmp_path, monkeypatch):
    monkeypatch.setattr(ppdist.tasks.table, "BENCHMARK_GRID", (3, 3))  # within the tiny model's 40 tokens
    path = tiny_table_config(str(tmp_path / "t.yml"), "unused", str(tmp_path / "out"))
    config = pipeline_data.with_synthetic_data(load_config(path, []), str(tmp_path / "synthetic"), images=8)
    data_dir = tmp_path / "synthetic" / "table_8"
    for section, split in (("Train", "train"), ("Eval", "val")):
        dataset = config[section]["dataset"]
        assert dataset["name"] == "PubTabDataSet" and dataset["data_dir"] == str(data_dir)
        assert dataset["label_file_list"] == [str(data_dir / f"{split}.txt")]
        lines = (data_dir / f"{split}.txt").read_text().splitlines()
        assert len(lines) == 8 and "cells" in json.loads(lines[0])["html"]

    setup_logger(None)
    train_cfg = m.training_config(config, 1, 2, str(tmp_path / "trainer"))
    train_cfg["Train"]["loader"]["batch_size_per_card"] = 4
    batches, loader = m.load_batches(train_cfg, 3, 1, DistEnv().device)
    batch = batches[0]
    length = 40 + 2  # max_text_length + sos + eos
    assert batch["image"].shape == (4, 3, 64, 64)
    assert batch["structure"].shape == (4, length) and batch["bbox_masks"].shape == (4, length)
    assert batch["bboxes"].shape == (4, length, 4) and batch["shape"].shape == (4, 6)
    assert (batch["structure"][:, 0] == 0).all()  # sos first
    assert np.array_equal(batch["bbox_masks"].sum(1) > 0, np.ones(4, bool))  # every table has cells to learn
    assert loader["samples"] == 2 * 4 and loader["steps_per_epoch"] == 2
    bare = m.measure_bare_loop(train_cfg, DistEnv().device, batches, 1, loader["steps_per_epoch"])
    assert bare["steps"] == 2 and bare["samples"] == 8 and bare["samples_per_s"] > 0
    trainer = m.measure_trainer(train_cfg, DistEnv(), 1, 2)
    assert trainer["samples"] == 8 and trainer["samples_per_s"] > 0
    evaluated = m.measure_eval(config, DistEnv(), None)
    assert evaluated["samples"] == 8 and evaluated["samples_per_s"] > 0
    assert set(evaluated["metric"]) == {"acc"} and 0 <= evaluated["metric"]["acc"] <= 1
