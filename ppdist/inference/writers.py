"""Result files of ``tools/infer.py``, by the task's writer (``ppdist.tasks``): rec ``results.txt``,
det ``bbox.json`` + drawn images, seg palette PNGs + overlays, table ``results.jsonl`` + HTML +
pictures with the cell boxes. Each writer takes results batch by batch and ``close()`` finishes.

A run into a folder that holds an earlier run's results replaces them: the files the earlier run
wrote and this one did not (the pictures of images no longer given) are removed when this run
closes, so the folder never holds results its result file does not list. What a run wrote is
listed in ``FILE_LIST`` in the folder; only files named there are ever removed, so files put there
by anything else stay.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, List, Mapping, Sequence, Set

from ppdist.tasks import get_task
from ppdist.utils.atomic import write_text_atomic

FILE_LIST = ".ppdist_infer_files"  # the files of the folder's last run, one name a line
logger = logging.getLogger("ppdist")


class ReplacingWriter:
    """A task's writer whose ``close()`` also removes the previous run's files that this run did
    not write again (see the module docstring); never an input image of this run."""

    def __init__(self, writer: Any, output_dir: str) -> None:
        self.writer = writer
        self.output_dir = output_dir
        self.inputs: Set[str] = set()

    def __getattr__(self, name: str) -> Any:  # the task writer's own attributes (e.g. draw, names)
        if name == "writer":
            raise AttributeError(name)
        return getattr(self.writer, name)

    def add(self, results: Sequence[Mapping[str, Any]]) -> None:
        self.inputs.update(os.path.realpath(r["path"]) for r in results if "path" in r)
        self.writer.add(results)

    def close(self) -> List[str]:
        written = self.writer.close()
        names = {os.path.basename(path) for path in written}
        removed = [
            name for name in previous_files(self.output_dir) if name not in names and self._stale(name)
        ]
        for name in removed:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.output_dir, name))
        if removed:
            logger.info(
                "removed %d file(s) of the previous run in %s that this run did not write (e.g. %s)",
                len(removed),
                self.output_dir,
                ", ".join(removed[:3]),
            )
        write_text_atomic(os.path.join(self.output_dir, FILE_LIST), "".join(f"{n}\n" for n in sorted(names)))
        return written

    def abort(self) -> None:
        """The task writer's abort; the previous run's files and list stay."""
        self.writer.abort()

    def _stale(self, name: str) -> bool:
        """Whether ``name`` of the previous list may be removed: a plain file (not a link) of the
        folder itself, not an input of this run."""
        path = os.path.join(self.output_dir, name)
        return os.path.isfile(path) and not os.path.islink(path) and os.path.realpath(path) not in self.inputs


def previous_files(output_dir: str) -> List[str]:
    """The names ``FILE_LIST`` of ``output_dir`` lists (empty without one): file names only, no
    folder part, the list itself left out."""
    try:
        with open(os.path.join(output_dir, FILE_LIST), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    return [
        n
        for n in lines
        if n and n not in (".", "..", FILE_LIST) and os.path.basename(n) == n and "/" not in n
    ]


def build_writer(task: str, output_dir: str, info: Mapping[str, Any], draw_threshold: float = 0.5) -> Any:
    """The writer of ``task`` into ``output_dir`` (created), replacing a previous run's files there."""
    os.makedirs(output_dir, exist_ok=True)
    return ReplacingWriter(get_task(task).writer(output_dir, info, draw_threshold), output_dir)
