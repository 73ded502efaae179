"""CTCLabelDecode: greedy collapse rules, scores, label decoding and dictionaries."""

import numpy as np
import pytest
import torch

from ppdist.postprocess import CTCLabelDecode
from ppdist.postprocess.ctc_decode import reverse_rtl
from ppdist.registry import POSTPROCESSES
from ppdist.utils.host_sync import HostSyncCounter


def one_hot_probs(frames, num_classes, peak=0.9):
    """(1, T, C) probabilities whose argmax per frame is ``frames[t]`` with prob ``peak[t]``."""
    peaks = np.broadcast_to(np.asarray(peak, dtype=np.float32), (len(frames),))
    probs = np.zeros((1, len(frames), num_classes), dtype=np.float32)
    for t, (c, p) in enumerate(zip(frames, peaks)):
        probs[0, t, :] = (1 - p) / (num_classes - 1)
        probs[0, t, c] = p
    return probs


def test_default_dictionary():
    decode = CTCLabelDecode()
    assert decode.character[0] == "blank"
    assert "".join(decode.character[1:]) == "0123456789abcdefghijklmnopqrstuvwxyz"
    assert decode.num_classes == 37


def test_collapse_repeats_and_drop_blank():
    decode = CTCLabelDecode()
    h, e, l, o = (decode.character.index(c) for c in "helo")  # noqa: E741  (the letters of "hello")
    # h h _ e l l _ l o _  -> "hello": repeats merge, a blank separates the two l's
    frames = [h, h, 0, e, l, l, 0, l, o, 0]
    peaks = [0.9, 0.5, 0.99, 0.8, 0.6, 0.7, 0.99, 0.4, 0.3, 0.99]
    [(text, score)] = decode(one_hot_probs(frames, 37, peaks))["preds"]
    assert text == "hello"
    # kept frames: first h (0.9), e (0.8), first l of the pair (0.6), l (0.4), o (0.3)
    assert score == pytest.approx(np.mean([0.9, 0.8, 0.6, 0.4, 0.3]), abs=1e-6)


def test_all_blank_gives_empty_text_and_zero_score():
    decode = CTCLabelDecode()
    assert decode(one_hot_probs([0, 0, 0], 37))["preds"] == [("", 0.0)]


def test_tensor_inputs_labels_and_batch():
    decode = POSTPROCESSES.build({"name": "CTCLabelDecode"})
    a, b = decode.character.index("a"), decode.character.index("b")
    probs = np.concatenate([one_hot_probs([a, 0, a, b], 37), one_hot_probs([b, b, b, 0], 37)])
    labels = torch.tensor([[a, a, b, 0, 0], [b, b, 0, 0, 0]])  # repeats in labels are kept
    for preds in (torch.from_numpy(probs), torch.from_numpy(probs).to(torch.bfloat16), [probs]):
        out = decode(preds, {"label": labels, "length": torch.tensor([3, 2])})
        assert [t for t, _ in out["preds"]] == ["aab", "b"]
        assert out["labels"] == ["aab", "bb"]
        assert all(isinstance(s, float) for _, s in out["preds"])
    assert "labels" not in decode(probs)
    assert "labels" not in decode(probs, {"image": None})


def test_rejects_wrong_number_of_classes():
    with pytest.raises(ValueError, match="37"):
        CTCLabelDecode()(np.zeros((1, 5, 10), dtype=np.float32))


def test_dictionary_file_and_space_char(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("你\n好\nA\n", encoding="utf-8")
    decode = CTCLabelDecode(character_dict_path=str(path), use_space_char=True)
    assert decode.character == ["blank", "你", "好", "A", " "]
    assert decode.num_classes == 5
    [(text, _)] = decode(one_hot_probs([1, 4, 0, 2, 3], 5))["preds"]
    assert text == "你 好A"
    assert decode(one_hot_probs([1], 5), {"label": np.array([[3, 4, 3, 0]])})["labels"] == ["A A"]
    assert CTCLabelDecode(character_dict_path=str(path)).num_classes == 4


def test_arabic_dictionary_reverses_text(tmp_path):
    assert reverse_rtl("ab12") == "ab12"
    assert reverse_rtl("\u0645\u0631ab 1\u062d") == "\u062dab 1\u0631\u0645"
    path = tmp_path / "arabic_dict.txt"
    path.write_text("\u0645\n\u0631\na\n", encoding="utf-8")
    decode = CTCLabelDecode(character_dict_path=str(path))
    assert decode.reverse
    assert decode(one_hot_probs([1, 2, 3], 4))["preds"][0][0] == "a\u0631\u0645"


def test_tensor_predictions_cross_to_the_host_once_and_decode_as_numpy_does():
    torch.manual_seed(0)
    decoder = CTCLabelDecode()
    logits = torch.randn(6, 20, decoder.num_classes)
    logits[0, :, 3] = 9.0  # a long run of one class
    probs = logits.softmax(dim=2)
    with HostSyncCounter() as counter:
        from_tensor = decoder(probs)["preds"]
    assert counter.count == 1, counter.report()
    assert from_tensor == decoder.decode_predictions(probs.numpy())
