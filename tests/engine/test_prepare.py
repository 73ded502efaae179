"""The synthetic-data log line: what the set holds and whether it was drawn, not a Python dict."""

import json
import logging
import os

from ppdist.data.synthetic import generate_rec_dataset
from ppdist.data.synthetic_det import generate_det_dataset
from ppdist.data.synthetic_io import SETTINGS_FILE
from ppdist.engine.dist import DistEnv
from ppdist.engine.prepare import describe_synthetic_data, ensure_synthetic_data


def test_the_det_summary_reads_as_a_sentence(tmp_path):
    out = str(tmp_path / "det")
    drawn = describe_synthetic_data(generate_det_dataset(out, 3, 2, image_size=64, num_classes=2))
    assert drawn.startswith(f"det set in {out}, 3 train / 2 val samples of 64 px, 2 classes (")
    assert "drawn in " in drawn and "(seed 0)" in drawn and "{" not in drawn
    again = describe_synthetic_data(generate_det_dataset(out, 3, 2, image_size=64, num_classes=2))
    assert again.endswith(", already there, used as is") and "drawn" not in again


def test_the_rec_summary_names_its_counts(tmp_path):
    out = str(tmp_path / "rec")
    line = describe_synthetic_data(generate_rec_dataset(out, 4, 2))
    assert line.startswith(f"rec set in {out}, 4 train / 2 val samples, drawn in ")


def _table_config(out, **options):
    spec = {"kind": "table", "data_dir": out, "num_train": 4, "num_val": 2, "seed": 0, **options}
    return {"Global": {"synthetic_data": spec}}


def test_a_reused_set_drawn_with_other_settings_is_named_in_a_warning(tmp_path, caplog):
    """The quick start's folder from an earlier config is used as is, but every setting it was
    drawn with that the config now changes is named; a folder with no settings record (made by an
    older ppdist, or by hand) is checked by its counts."""
    out = str(tmp_path / "tables")
    ensure_synthetic_data(_table_config(out), DistEnv())
    record = json.load(open(os.path.join(out, SETTINGS_FILE), encoding="utf-8"))
    assert record["cell_height"] == [20, 30] and record["num_train"] == 4 and record["seed"] == 0
    with caplog.at_level(logging.WARNING, logger="ppdist"):
        ensure_synthetic_data(_table_config(out), DistEnv())
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]
        ensure_synthetic_data(_table_config(out, cell_height=[40, 60], num_train=5), DistEnv())
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{out} already holds a data set drawn with " in warning and "used as is" in warning
    assert (
        "cell_height=[20, 30] (config asks [40, 60])" in warning and "num_train=4 (config asks 5)" in warning
    )
    assert "seed" not in warning and "span_ratio" not in warning
    os.remove(os.path.join(out, SETTINGS_FILE))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ppdist"):
        ensure_synthetic_data(_table_config(out, cell_height=[40, 60], num_train=5), DistEnv())
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "num_train=4 (config asks 5)" in warning and "cell_height" not in warning
