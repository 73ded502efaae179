"""The repository's formatter and linter settings (pyproject.toml) hold for every file."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_code_is_formatted():
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, f"run `ruff format .`:\n{result.stdout}{result.stderr}"


def test_linter_is_clean():
    result = ruff("check", ".")
    assert result.returncode == 0, f"run `ruff check .`:\n{result.stdout}{result.stderr}"
