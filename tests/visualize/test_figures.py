"""matplotlib is loaded by the first figure, not by importing ppdist or a tool."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ppdist_testing import REPO

from ppdist.visualize.figures import new_figure, save_png

LOADS_NOTHING_TO_DRAW = """
import runpy, sys
sys.argv = [sys.argv[0]]
import ppdist
for tool in ("train", "eval", "infer", "export_model", "benchmark"):
    runpy.run_path("tools/%s.py" % tool, run_name="not_main")  # the tool's imports, not its main()
import ppdist.browse.sample_grid
print(sorted(name for name in sys.modules if name.split(".")[0] == "matplotlib"))
"""


@pytest.mark.slow
def test_importing_ppdist_and_the_tools_leaves_matplotlib_unloaded():
    result = subprocess.run(
        [sys.executable, "-c", LOADS_NOTHING_TO_DRAW],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "[]", result.stdout[-2000:]


def test_a_figure_loads_matplotlib_and_is_written_as_png(tmp_path):
    figure = new_figure((120, 80))
    figure.add_subplot(1, 1, 1).plot([0, 1], [1, 0])
    path = str(tmp_path / "f.png")
    save_png(figure, path)
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "matplotlib.figure" in sys.modules
