"""The synthetic-data log line: what the set holds and whether it was drawn, not a Python dict."""

from ppdist.data.prepare import describe_synthetic_data
from ppdist.data.synthetic import generate_rec_dataset
from ppdist.data.synthetic_det import generate_det_dataset


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
