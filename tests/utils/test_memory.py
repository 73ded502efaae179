"""keep_freed_memory: a process that allocates and frees a batch of megabyte arrays again and again
stops faulting fresh pages in once glibc keeps its freed memory (what loader workers do, and every
tool's process through run_main: a training step frees and re-allocates its activations)."""

import os
import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys
import numpy as np
from ppdist.cli import run_main
from ppdist.utils.memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def batches():
    for _ in range(20):
        arrays = [np.ones(1 << 20, np.uint8) for _ in range(8)]  # a batch of 1 MiB images, touched
        del arrays
def faults():
    batches()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    batches()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
if sys.argv[1] == "tool":
    run_main(faults)
faults()
"""


def _page_faults(mode: str) -> int:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, env=env, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.slow
def test_freed_memory_is_reused():
    pages = 20 * 8 * (1 << 20) // 4096
    assert _page_faults("default") > pages // 2  # glibc hands each batch back and faults it in again
    assert _page_faults("keep") < pages // 100
    assert _page_faults("tool") < pages // 100  # a tool's process (tools/*.py run in run_main)
