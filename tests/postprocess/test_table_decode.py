"""SLANet's TableLabelDecode equals PaddleOCR's (tests/fixtures/paddle_table/make_eval_fixture.py):
the classes of merge_no_span_structure, the predicted tokens (eos at step 0 skipped, sos skipped,
the end at eos), their mean scores and cell boxes in image pixels, and the labels' decode."""

import json
import os

import numpy as np
import pytest
import torch

from ppdist.components import build_postprocess
from ppdist.postprocess import TableLabelDecode
from ppdist.postprocess.table_decode import load_table_tokens

HERE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle_table")
DICT = os.path.join(HERE, "table_structure_dict.txt")


@pytest.fixture(scope="module")
def fixture():
    with open(os.path.join(HERE, "eval_fixture.json"), encoding="utf-8") as f:
        record = json.load(f)
    with np.load(os.path.join(HERE, "eval_fixture.npz")) as data:
        arrays = {k[len("decode/") :]: data[k] for k in data.files if k.startswith("decode/")}
    return record, arrays


def _decode(arrays, as_tensors):
    convert = torch.tensor if as_tensors else np.array
    decoder = build_postprocess(
        {
            "Global": {"character_dict_path": DICT},
            "PostProcess": {"name": "TableLabelDecode", "merge_no_span_structure": True},
        }
    )
    preds = {"structure_probs": convert(arrays["structure_probs"]), "loc_preds": convert(arrays["loc_preds"])}
    batch = {k: convert(arrays[k]) for k in ("structure", "bboxes", "shape")}
    return decoder, decoder(preds, batch)


def test_classes_equal_paddle(fixture):
    record, _ = fixture
    assert load_table_tokens(DICT, merge_no_span_structure=True) == record["character"]
    plain = load_table_tokens(DICT)
    assert plain[0] == "sos" and plain[-1] == "eos" and "<td>" in plain and "<td></td>" not in plain


@pytest.mark.parametrize("as_tensors", [False, True])
def test_predictions_and_labels_equal_paddle(fixture, as_tensors):
    record, arrays = fixture
    decoder, out = _decode(arrays, as_tensors)
    expected = record["decode"]["preds"]
    assert [s[0] for s in out["structure_batch_list"]] == [s[0] for s in expected["structure_batch_list"]]
    np.testing.assert_allclose(
        [s[1] for s in out["structure_batch_list"]],
        [s[1] for s in expected["structure_batch_list"]],
        atol=1e-6,
    )
    for got, want in zip(out["bbox_batch_list"], expected["bbox_batch_list"]):
        assert got.shape == np.array(want).shape  # (0,) without cells, as Paddle
        np.testing.assert_allclose(got.reshape(-1, 4), np.array(want).reshape(-1, 4), atol=1e-4)
    labels = record["decode"]["labels"]
    assert out["labels"]["structure_batch_list"] == labels["structure_batch_list"]
    for got, want in zip(out["labels"]["bbox_batch_list"], labels["bbox_batch_list"]):
        np.testing.assert_allclose(np.array(got).reshape(-1, 4), np.array(want).reshape(-1, 4), atol=1e-4)
    assert decoder.host_keys == ("structure", "bboxes", "shape")


def test_predictions_only_and_mistakes(fixture):
    _, arrays = fixture
    decoder = TableLabelDecode(DICT, merge_no_span_structure=True)
    preds = {"structure_probs": arrays["structure_probs"], "loc_preds": arrays["loc_preds"]}
    out = decoder(preds, {"shape": arrays["shape"]})
    assert "labels" not in out and len(out["structure_batch_list"]) == 3
    with pytest.raises(ValueError, match=r"needs batch\['shape'\]"):
        decoder(preds, {})
    with pytest.raises(ValueError, match=r"structure_probs \(B, L, 30\), got shape \(3, 8, 29\)"):
        decoder(
            {"structure_probs": arrays["structure_probs"][..., :29], "loc_preds": arrays["loc_preds"]},
            {"shape": arrays["shape"]},
        )
    all_eos = np.zeros((1, 3, 30), np.float32)
    all_eos[..., 29] = 1.0
    empty = decoder(
        {"structure_probs": all_eos, "loc_preds": np.zeros((1, 3, 4), np.float32)},
        {"shape": arrays["shape"][:1]},
    )
    assert empty["structure_batch_list"][0][0] == [] and np.isnan(empty["structure_batch_list"][0][1])
