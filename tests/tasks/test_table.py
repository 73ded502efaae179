"""The table task's result writer: results.jsonl is strict JSON (an empty structure's score, NaN,
is written as null)."""

import json

import cv2
import numpy as np

from ppdist.tasks.table import TableWriter


def test_an_empty_structure_writes_a_null_score(tmp_path):
    image = str(tmp_path / "empty.png")
    cv2.imwrite(image, np.full((20, 30, 3), 255, np.uint8))
    out = tmp_path / "out"
    out.mkdir()
    writer = TableWriter(str(out))
    writer.add(
        [
            {
                "path": image,
                "html": "<html><body><table></table></body></html>",
                "score": float("nan"),
                "boxes": np.zeros((0, 4)),
            }
        ]
    )
    writer.close()
    (line,) = (out / "results.jsonl").read_text().splitlines()
    record = json.loads(line, parse_constant=lambda name: f"not JSON: {name}")
    assert record["score"] is None and record["boxes"] == []
