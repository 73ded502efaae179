"""setup.py's description and the README's opening name every model family ppdist trains (issue 44:
the description named the first three)."""

from __future__ import annotations

import ast
import os

from paddle_step_specs import SPECS

FAMILIES = (
    "CRNN",
    "PP-OCRv3",
    "SLANet",
    "PP-YOLOE",
    "Faster R-CNN",
    "Cascade R-CNN",
    "PP-LiteSeg",
    "OCRNet",
    "SegFormer",
)


def setup_keyword(repo_root: str, name: str) -> str:
    with open(os.path.join(repo_root, "setup.py"), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"]
    return next(ast.literal_eval(k.value) for k in calls[0].keywords if k.arg == name)


def test_description_and_readme_name_every_family(repo_root):
    assert len(FAMILIES) == len(SPECS)  # a new family (its step-equivalence spec) is named here too
    description = setup_keyword(repo_root, "description")
    with open(os.path.join(repo_root, "README.md"), encoding="utf-8") as handle:
        opening = handle.read().split("\n\n")[1]
    assert [f for f in FAMILIES if f not in description] == []
    assert [f for f in FAMILIES if f"**{f}**" not in opening] == []
