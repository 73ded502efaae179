"""CTCLabelEncode follows PaddleOCR's rule (characters outside the dictionary are dropped) and says
what it did: a note for a changed label, a specific reason for a rejected one."""

import pytest

from ppdist.data.base import NOTES_KEY, RejectedSample
from ppdist.data.transforms.rec import CTCLabelEncode


def test_dropped_characters_are_noted_and_the_rest_is_kept():
    encode = CTCLabelEncode(max_text_length=10)  # 0-9a-z, lower-cased
    data = encode({"label": "AB€c?"})
    assert int(data["length"]) == 3 and list(data["label"][:3]) == [11, 12, 13]
    assert data[NOTES_KEY] == ["label 'AB€c?': 2 character(s) not in the dictionary dropped ('?€')"]
    assert NOTES_KEY not in encode({"label": "abc"})


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "empty label"),
        ("a" * 11, "longer than Global.max_text_length 10"),
        ("€€", "no character of label"),
    ],
)
def test_each_rejection_says_why(text, reason):
    with pytest.raises(RejectedSample, match=reason):
        CTCLabelEncode(max_text_length=10)({"label": text})
