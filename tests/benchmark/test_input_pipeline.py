"""The input-pipeline measurement: each step's CPU time lands in its own row (per image, batch
transforms divided by the batch size), the rows add up to the total, and the tool reports both
splits of a config, on its own data or on a synthetic set at the recipe's size."""

import json

import cv2
import numpy as np
import pytest
from ppdist_testing import check_ok, run_tool, tiny_det_config

import ppdist.tasks.det
import ppdist.tasks.seg
import ppdist.tasks.table
from ppdist.benchmark import input_pipeline, pipeline_data
from ppdist.benchmark.input_pipeline import markdown_table, profile_split
from ppdist.config import load_config
from ppdist.data.base import BaseDataSet
from ppdist.data.build import Collate


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Costly:
    """A transform that costs ``seconds`` of (fake) CPU time per call."""

    def __init__(self, clock: FakeClock, seconds: float, batch_op: bool = False) -> None:
        self.clock, self.seconds, self.batch_op = clock, seconds, batch_op

    def __call__(self, data):
        self.clock.now += self.seconds
        return data


class Images(BaseDataSet):
    def __init__(self, clock: FakeClock, ops, count: int) -> None:
        super().__init__(ops, mode="train")
        self.clock, self.count = clock, count
        self.blob = cv2.imencode(".png", np.zeros((4, 4, 3), np.uint8))[1].tobytes()

    def __len__(self) -> int:
        return self.count

    def read(self, index: int):
        self.clock.now += 0.001
        return {"image": self.blob, "value": np.float32(index)}


def test_each_step_gets_its_own_time(monkeypatch):
    clock = FakeClock()
    dataset = Images(clock, [Costly(clock, 0.002), Costly(clock, 0.003)], count=12)
    collate = Collate([Costly(clock, 0.016, batch_op=True)])
    monkeypatch.setattr(input_pipeline, "cpu_time", clock)
    monkeypatch.setattr(input_pipeline, "build_input_pipeline", lambda *args: (dataset, collate))
    monkeypatch.setattr(input_pipeline, "plain_decode_ms", lambda blobs, passes: 0.5)
    config = {"Global": {"seed": 0}, "Train": {"loader": {"batch_size_per_card": 4}}}
    split = profile_split(config, "Train", images=10, passes=2)  # whole batches of 10: 4 + 4 + 2
    assert split["images"] == 10 and split["batch_size"] == 4 and split["passes"] == 2
    assert split["ms_per_image"] == pytest.approx(
        {
            "read": 1.0,
            "Costly (transforms[0])": 2.0,
            "Costly (transforms[1])": 3.0,
            "finish (output layout)": 0.0,
            "Costly (batch_transforms[0])": 3 * 16.0 / 10,  # three batches of 16 ms over 10 images
            "other (seeding, bookkeeping)": 0.0,
            "collate (stacking)": 0.0,
        }
    )
    assert split["total_ms"] == pytest.approx(sum(split["ms_per_image"].values()))
    assert split["total_ms"] == pytest.approx(1 + 2 + 3 + 4.8)
    assert split["decode_ms"] == 0.5 and split["ratio"] == pytest.approx(split["total_ms"] / 0.5)
    table = markdown_table(split)
    assert "| Costly (batch_transforms[0]) | 4.80 |" in table and "| **total** | **10.80** |" in table
    assert "best of 2 passes" in table


@pytest.mark.slow
def test_the_tool_reports_both_splits(tmp_path):
    data = str(tmp_path / "det")
    cfg = tiny_det_config(str(tmp_path / "t.yml"), data, str(tmp_path / "o"), num_train=12, num_val=8)
    out = tmp_path / "pipeline.json"
    result = check_ok(
        run_tool(["benchmark.py", "-c", cfg, "--input_pipeline", "--images", "8", "--json", str(out)])
    )
    report = json.loads(out.read_text())["input_pipeline"]
    config = load_config(cfg)
    for section, batch in (("Train", 8), ("Eval", 4)):
        split = report[section]
        assert split["images"] == 8 and split["batch_size"] == batch
        assert split["total_ms"] == pytest.approx(sum(split["ms_per_image"].values()))
        assert split["ratio"] == pytest.approx(split["total_ms"] / split["decode_ms"])
        named = list(split["ms_per_image"]) + split["on_device"]
        dataset = config[section]["dataset"]
        for entry in dataset["transforms"] + dataset.get("batch_transforms", []):
            assert any(name.startswith(next(iter(entry))) for name in named)
        assert f"{section}: 8 images, batch {batch}" in result.stdout


def test_synthetic_data_at_the_recipe_size(tmp_path, monkeypatch):
    monkeypatch.setattr(ppdist.tasks.det, "BENCHMARK_IMAGE_SIZE", (96, 64))
    config = load_config("configs/det/ppyoloe_crn_s_300e_coco.yml")
    synthetic = pipeline_data.with_synthetic_data(config, str(tmp_path), images=4)
    split = profile_split(synthetic, "Eval", images=4)
    assert split["images"] == 4
    dataset = synthetic["Train"]["dataset"]
    assert dataset["name"] == "COCODataSet" and dataset["anno_path"] == "annotations/instances_train.json"
    assert dataset["transforms"] == config["Train"]["dataset"]["transforms"]
    image = cv2.imread(f"{dataset['dataset_dir']}/images/train/00000000.jpg")
    assert image.shape == (64, 96, 3)
