"""PP-OCRv3's post-processes equal PaddleOCR's (tests/fixtures/paddle_ppocrv3/make_loss_fixture.py):
DistillationCTCLabelDecode on eval-mode outputs, SARLabelDecode; CTCLabelDecode on multi-head batches."""

import math
import os

import numpy as np
import pytest
import torch

from ppdist.postprocess import CTCLabelDecode, DistillationCTCLabelDecode, SARLabelDecode

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle_ppocrv3")
DICT = os.path.join(FIXTURES, "loss_dict.txt")
MODELS = ("Student", "Teacher")


@pytest.fixture(scope="module")
def fixture():
    with np.load(os.path.join(FIXTURES, "loss_fixture.npz")) as data:
        return dict(data)


@pytest.mark.parametrize("b", [0, 1])
def test_distillation_ctc_decode_equals_paddle(fixture, b):
    decode = DistillationCTCLabelDecode(DICT, True, model_name=list(MODELS), key="head_out", multi_head=True)
    assert decode.num_classes == 12
    preds = {m: {"head_out": torch.from_numpy(fixture[f"eval/{m}_{b}"])} for m in MODELS}
    results = decode(preds, {"label_ctc": torch.from_numpy(fixture[f"eval_label_ctc_{b}"])})
    assert list(results) == list(MODELS)
    for m in MODELS:
        assert [t for t, _ in results[m]["preds"]] == list(fixture[f"decode/{m}_{b}_text"])
        np.testing.assert_allclose(
            [s for _, s in results[m]["preds"]], fixture[f"decode/{m}_{b}_score"], atol=1e-6
        )
        assert results[m]["labels"] == list(fixture[f"decode_label_{b}"])


def test_training_outputs_are_decoded_from_their_ctc_branch(fixture):
    logits = torch.from_numpy(fixture["train/Student/head_out/ctc"])
    heads = {"ctc": logits, "ctc_neck": torch.zeros(3, 10, 6), "sar": torch.zeros(3, 7, 14)}
    batch = {"label_ctc": torch.from_numpy(fixture["batch/label_ctc"])}
    plain = CTCLabelDecode(DICT, True)(logits, batch)
    assert CTCLabelDecode(DICT, True)(heads, batch) == plain
    assert plain["labels"] == list(fixture["batch/texts"])
    distill = DistillationCTCLabelDecode(DICT, True, model_name="Student", key="head_out", multi_head=True)
    assert distill({"Student": {"head_out": heads}}, batch) == {"Student": plain}
    with pytest.raises(ValueError, match="no 'ctc' branch"):
        CTCLabelDecode(DICT, True)({"sar": logits}, batch)


def test_sar_decode_equals_paddle(fixture):
    decode = SARLabelDecode(DICT, True)
    assert decode.num_classes == 14 and (decode.end_idx, decode.padding_idx) == (12, 13)
    results = decode(torch.from_numpy(fixture["sar_decode/probs"]), {"label_sar": fixture["batch/label_sar"]})
    assert [t for t, _ in results["preds"]] == list(fixture["sar_decode/text"])
    assert results["preds"][2] == ("", results["preds"][2][1]) and math.isnan(results["preds"][2][1])
    np.testing.assert_allclose([s for _, s in results["preds"]], fixture["sar_decode/score"], atol=1e-6)
    assert results["labels"] == list(fixture["sar_decode/label"]) == list(fixture["batch/texts"])


def test_sar_decode_rm_symbol():
    decode = SARLabelDecode(DICT, True, rm_symbol=True)
    probs = np.zeros((1, 5, 14), np.float32)
    probs[0, [0, 1, 2, 3, 4], [0, 10, 11, 1, 12]] = 1.0  # "a", " ", <UKN>, "b", end
    # the space goes; "<UKN>" is lower-cased and loses its brackets only, as in Paddle
    assert decode(probs)["preds"] == [("auknb", 1.0)]
    assert SARLabelDecode(DICT, True)(probs)["preds"] == [("a <UKN>b", 1.0)]
