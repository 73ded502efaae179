"""Text-recognition datasets: PaddleOCR label files (SimpleDataSet) and LMDB (LMDBDataSet)."""

from __future__ import annotations

import bisect
import json
import os
import random
from typing import Any, Dict, List, NamedTuple, Optional, Union

import lmdb
import numpy as np

from ppdist.data.base import BaseDataSet, RejectedSample, inside_root
from ppdist.data.ext_data import ExtDataMixin, check_ext_op_transform_idx
from ppdist.data.index_cache import cached_index
from ppdist.data.label_index import LabelLines, build_label_index, subsample
from ppdist.errors import ConfigError, DataError, DataPathError
from ppdist.registry import DATASETS

Ratio = Union[float, List[float]]


def _section(mode: str) -> str:
    return "Train.dataset" if mode == "train" else "Eval.dataset"


def _ratios(ratio_list: Ratio, count: int, key: str, what: str) -> List[float]:
    """One ratio in [0, 1] per source (a single number applies to every source)."""
    if isinstance(ratio_list, (int, float)) and not isinstance(ratio_list, bool):
        ratios = [float(ratio_list)] * count
    else:
        ratios = [float(r) for r in ratio_list]
        if len(ratios) != count:
            raise ConfigError(f"{key}: {len(ratios)} ratio(s) given for {count} {what}")
    for r in ratios:
        if not 0.0 <= r <= 1.0:
            raise ConfigError(f"{key}: every ratio must lie in [0, 1], got {r}")
    return ratios


class _Line(NamedTuple):
    file: int  # index into label_file_list
    line_no: int  # 1-based line number in that file
    path: str  # image path as written ("" when the line is malformed)
    label: str  # label text, or what is wrong with a malformed line
    ok: bool


@DATASETS.register
class SimpleDataSet(ExtDataMixin, BaseDataSet):
    """Images on disk listed in PaddleOCR label files: ``relative/path<delimiter>label``.

    Paths are joined with ``data_dir``; one that resolves outside it (``../``, an absolute path
    elsewhere) is a bad sample, not read, unless ``allow_paths_outside_root: true``. A path
    starting with ``[`` is a JSON list of paths
    from which one is picked at random. ``ratio_list`` keeps a fixed, seeded fraction of each
    file's lines (in file order). Malformed lines are kept and reported when read.

    The lines are held as a compact index (``ppdist.data.label_index``) that forked workers
    share; ``cache`` (``auto``, ``off`` or a folder) builds it once per node and maps it in every
    other process and run (``ppdist.data.index_cache``).

    With a transform that joins other samples (RecConAug), each sample brings that many random
    samples of the set, read and put through the first ``ext_op_transform_idx`` transforms
    (``ppdist.data.ext_data``).
    """

    def __init__(
        self,
        data_dir: str,
        label_file_list: List[str],
        transforms: list,
        mode: str = "train",
        ratio_list: Ratio = 1.0,
        delimiter: str = "\t",
        seed: int = 1024,
        allow_paths_outside_root: bool = False,
        cache: Union[str, bool] = "auto",
        ext_op_transform_idx: int = 2,
    ) -> None:
        super().__init__(transforms, mode)
        sec = _section(mode)
        self.ext_op_transform_idx = check_ext_op_transform_idx(self.ops, ext_op_transform_idx, sec)
        self.allow_paths_outside_root = bool(allow_paths_outside_root)
        if not delimiter:
            raise ConfigError(f"{sec}.delimiter must not be empty")
        if isinstance(label_file_list, str):
            label_file_list = [label_file_list]
        if not label_file_list:
            raise DataError(f"{sec}.label_file_list is empty")
        if not os.path.isdir(data_dir):
            raise DataPathError(f"{sec}.data_dir: directory not found: {data_dir}")
        ratios = _ratios(ratio_list, len(label_file_list), f"{sec}.ratio_list", "label file(s)")
        self.data_dir = data_dir
        self.label_files = list(label_file_list)
        self.delimiter = delimiter
        self.seed = seed
        for path in self.label_files:
            if not os.path.isfile(path):
                raise DataPathError(f"{sec}.label_file_list: label file not found: {path}")
        index = cached_index(
            cache,
            f"{sec}.cache",
            "label",
            self.label_files,
            {"ratios": ratios, "seed": seed},
            lambda: build_label_index(self.label_files, ratios, seed),
            what=f"{sec} ({len(self.label_files)} label file(s))",
        )
        self.lines = LabelLines(index)

    def __len__(self) -> int:
        return len(self.lines)

    def _line(self, index: int) -> _Line:
        """Line ``index`` split into image path and label (or what is wrong with it)."""
        file_idx, line_no, raw = self.lines.line(index)
        try:
            text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            return _Line(file_idx, line_no, "", f"not valid UTF-8 ({exc.reason})", False)
        text = text.rstrip("\r\n")
        parts = text.split(self.delimiter, 1)
        if len(parts) != 2 or not parts[0]:
            why = f"expected 'image_path{{delimiter}}label' with delimiter {self.delimiter!r}, got {text[:80]!r}"
            return _Line(file_idx, line_no, "", why, False)
        return _Line(file_idx, line_no, parts[0], parts[1], True)

    def origin(self, index: int) -> str:
        line = self._line(index)
        where = f"{self.label_files[line.file]}:{line.line_no}"
        return f"{where} ({line.path})" if line.ok else where

    def read(self, index: int) -> Dict[str, Any]:
        line = self._line(index)
        if not line.ok:
            raise RejectedSample(f"malformed line: {line.label}")  # reported after its origin (file:line)
        rel = line.path
        if rel.startswith("["):
            rel = random.choice(json.loads(rel))
        img_path = inside_root(
            self.data_dir,
            os.path.join(self.data_dir, rel),
            self.allow_paths_outside_root,
            "allow_paths_outside_root",
        )
        with open(img_path, "rb") as handle:
            image = handle.read()
        return {"img_path": img_path, "image": image, "label": line.label}


def find_lmdb_dirs(root: str) -> List[str]:
    """Every directory under ``root`` (itself included) that holds a ``data.mdb``, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if "data.mdb" in filenames:
            found.append(dirpath)
    return sorted(found)


def _open_lmdb(path: str):
    return lmdb.open(path, max_readers=32, readonly=True, lock=False, readahead=False, meminit=False)


# One read-only environment per LMDB directory and process. py-lmdb refuses to open the same
# environment twice in a process, and a forked DataLoader worker inherits the parent's handles
# (which LMDB forbids using after fork): a worker closes its inherited copies, then reopens.
_ENVS: Dict[tuple, Any] = {}
_ENVS_PID: Optional[int] = None


def _env_key(path: str) -> tuple:
    """Identity of an LMDB's data file (a re-created database is a different one)."""
    st = os.stat(os.path.join(path, "data.mdb"))
    return st.st_dev, st.st_ino


def _process_envs() -> Dict[tuple, Any]:
    """The environments opened by this process (inherited ones are closed first)."""
    global _ENVS_PID
    if _ENVS_PID != os.getpid():
        for env in _ENVS.values():  # inherited from the parent process: release, never use
            try:
                env.close()
            except Exception:
                pass
        _ENVS.clear()
        _ENVS_PID = os.getpid()
    return _ENVS


def shared_env(path: str):
    """This process's read-only environment for the LMDB directory ``path`` (opened on first use)."""
    envs = _process_envs()
    key = _env_key(path)
    env = envs.get(key)
    if env is None:
        env = envs[key] = _open_lmdb(path)
    return env


def _num_samples(path: str) -> int:
    """``num-samples`` of an LMDB, without leaving a new environment open in this process."""
    try:
        cached = _process_envs().get(_env_key(path))
        env = cached if cached is not None else _open_lmdb(path)
    except Exception as exc:
        raise DataError(f"cannot open LMDB {path}: {exc}") from exc
    try:
        with env.begin(write=False) as txn:
            raw = txn.get(b"num-samples")
    finally:
        if cached is None:
            env.close()
    if raw is None:
        raise DataError(f"LMDB {path} has no 'num-samples' key")
    try:
        return int(raw.decode())
    except ValueError as exc:
        raise DataError(f"LMDB {path}: bad 'num-samples' value {raw[:40]!r}") from exc


@DATASETS.register
class LMDBDataSet(ExtDataMixin, BaseDataSet):
    """Every LMDB under ``data_dir`` with keys ``num-samples``, ``image-%09d``, ``label-%09d`` (1-based).

    The dataset holds no environment (it pickles freely): each process opens one shared,
    read-only environment per database on its first read (``shared_env``), so forked
    DataLoader workers open their own. ``ratio_list`` keeps a fixed, seeded fraction of
    each database (databases in sorted path order). Extra samples for RecConAug as in
    ``SimpleDataSet`` (``ext_op_transform_idx`` 1 by default, as PaddleOCR's).
    """

    def __init__(
        self,
        data_dir: str,
        transforms: list,
        mode: str = "train",
        seed: int = 1024,
        ratio_list: Ratio = 1.0,
        ext_op_transform_idx: int = 1,
    ) -> None:
        super().__init__(transforms, mode)
        sec = _section(mode)
        self.ext_op_transform_idx = check_ext_op_transform_idx(self.ops, ext_op_transform_idx, sec)
        if not os.path.isdir(data_dir):
            raise DataPathError(f"{sec}.data_dir: directory not found: {data_dir}")
        self.data_dir = data_dir
        self.seed = seed
        self.dirs = find_lmdb_dirs(data_dir)
        if not self.dirs:
            raise DataError(f"{sec}.data_dir: no LMDB (directory with data.mdb) under {data_dir}")
        ratios = _ratios(ratio_list, len(self.dirs), f"{sec}.ratio_list", "LMDB directories")
        self.indices: List[np.ndarray] = []  # per database: kept 1-based sample indices
        for db_idx, (path, ratio) in enumerate(zip(self.dirs, ratios)):
            count = _num_samples(path)
            self.indices.append((subsample(count, ratio, seed, db_idx) + 1).astype(np.int64))
        self.offsets = np.cumsum([0] + [len(ix) for ix in self.indices]).tolist()

    def __len__(self) -> int:
        return self.offsets[-1]

    def _locate(self, index: int) -> tuple:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        db = bisect.bisect_right(self.offsets, index) - 1
        return db, int(self.indices[db][index - self.offsets[db]])

    def origin(self, index: int) -> str:
        db, key = self._locate(index)
        return f"{self.dirs[db]}:image-{key:09d}"

    def read(self, index: int) -> Dict[str, Any]:
        db, key = self._locate(index)
        with shared_env(self.dirs[db]).begin(write=False) as txn:
            label = txn.get(b"label-%09d" % key)
            image = txn.get(b"image-%09d" % key)
        if label is None or image is None:
            raise KeyError(f"sample {key} missing ('label-{key:09d}' or 'image-{key:09d}')")
        return {
            "img_path": f"{self.dirs[db]}/image-{key:09d}",
            "image": bytes(image),
            "label": label.decode("utf-8"),
        }
