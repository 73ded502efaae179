"""The shell commands of README.md and docs/*.md, in reading order, and a fresh copy to run them in."""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import List

SHELL_FENCES = ("bash", "sh", "shell")


@dataclass(frozen=True)
class DocCommand:
    """One command of a fenced shell block: the page, its first line there, the text without comments."""

    page: str
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def doc_pages(repo: str) -> List[str]:
    """README.md, then the pages of docs/ by name (paths relative to ``repo``)."""
    pages = ["README.md"] + sorted(
        os.path.relpath(p, repo) for p in glob.glob(os.path.join(repo, "docs", "*.md"))
    )
    return pages


def strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` inside quotes or inside a word is kept)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def block_commands(page: str, first_line: int, lines: List[str]) -> List[DocCommand]:
    """The commands of one fenced block: continuation lines joined, comments and blank lines dropped."""
    commands: List[DocCommand] = []
    pending: List[str] = []
    start = first_line
    for offset, raw in enumerate(lines):
        text = strip_comment(raw)
        if not pending:
            start = first_line + offset
        if text.endswith("\\"):
            pending.append(text[:-1].strip())
            continue
        pending.append(text)
        joined = " ".join(p for p in pending if p)
        pending = []
        if joined:
            commands.append(DocCommand(page, start, joined))
    return commands


def extract_commands(repo: str) -> List[DocCommand]:
    """Every command of the ``bash``/``sh``/``shell`` fences of README.md and docs/*.md, in reading order."""
    commands: List[DocCommand] = []
    for page in doc_pages(repo):
        with open(os.path.join(repo, page), encoding="utf-8") as handle:
            lines = handle.read().split("\n")
        fence_start = None
        language = ""
        for number, line in enumerate(lines, start=1):
            if not line.startswith("```"):
                continue
            if fence_start is None:
                fence_start, language = number, line[3:].strip()
                continue
            if language in SHELL_FENCES:
                commands += block_commands(page, fence_start + 1, lines[fence_start : number - 1])
            fence_start = None
    return commands


def with_overrides(text: str, overrides: List[str]) -> str:
    """``text`` with ``-o overrides...`` appended (tools take -o more than once; the last value wins)."""
    if not overrides:
        return text
    return text + " -o " + " ".join(shlex.quote(o) for o in overrides)


def fresh_copy(repo: str, dest: str) -> str:
    """The files git knows in ``repo`` (tracked, and new ones it does not ignore) copied to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = os.path.join(repo, name)
        if not os.path.isfile(source):  # deleted in the working tree
            continue
        target = os.path.join(dest, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(source, target)
    return dest
