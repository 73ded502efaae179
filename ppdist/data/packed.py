"""Dataset indexes as a few flat numpy arrays: compact, shared by forked workers, mappable from a file.

A Python list of per-sample records costs ~250 bytes a sample and, worse, every forked DataLoader
worker slowly copies its pages as reference counts are touched (pytorch#13246). A ``PackedIndex``
keeps the same information in a handful of numpy arrays (strings as one byte buffer plus offsets,
as detectron2 and mmengine serialize their dataset lists), which forked workers share untouched.
Saved to a file, the arrays are memory-mapped read-only: every process on a node maps the same
pages of the page cache instead of holding its own copy.

File layout: ``MAGIC``, an 8-byte little-endian header length, a JSON header (``meta``, ``key``,
and each array's dtype, shape and offset), then the arrays, each aligned to 64 bytes.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from ppdist.utils.atomic import atomic_file

MAGIC = b"PPDIST-INDEX-1\n"
ALIGN = 64


class IndexFileError(ValueError):
    """The file is not a readable ``PackedIndex`` (truncated, foreign or from another version)."""


def pack_strings(items: Sequence[bytes]) -> Dict[str, np.ndarray]:
    """``{"bytes": uint8 buffer, "offsets": int64 [n + 1]}`` holding ``items`` back to back."""
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(item) for item in items], out=offsets[1:])
    buffer = np.frombuffer(b"".join(items), dtype=np.uint8) if items else np.zeros(0, dtype=np.uint8)
    return {"bytes": buffer, "offsets": offsets}


def string_at(buffer: np.ndarray, offsets: np.ndarray, index: int) -> str:
    """The UTF-8 string ``index`` of a ``pack_strings`` column."""
    return buffer[int(offsets[index]) : int(offsets[index + 1])].tobytes().decode("utf-8")


class PackedIndex:
    """Named numpy arrays plus JSON-able ``meta``; ``path`` is set when the arrays map a file.

    Pickling a file-backed index sends only its path (a spawned worker maps the same file);
    an in-memory one pickles its arrays.
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], meta: Optional[Dict[str, Any]] = None) -> None:
        self.arrays: Dict[str, np.ndarray] = dict(arrays)
        self.meta: Dict[str, Any] = dict(meta or {})
        self.path: Optional[str] = None
        self.key: Any = None

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())

    def save(self, path: str, key: Any = None) -> None:
        """Write the index to ``path`` atomically (a reader sees the old file or the new one)."""
        arrays = {name: np.ascontiguousarray(a) for name, a in self.arrays.items()}
        specs: Dict[str, Dict[str, Any]] = {}
        offset = 0
        for name, array in arrays.items():
            specs[name] = {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
            offset += -(-array.nbytes // ALIGN) * ALIGN
        header = json.dumps({"meta": self.meta, "key": key, "arrays": specs}).encode("utf-8")
        start = -(-(len(MAGIC) + 8 + len(header)) // ALIGN) * ALIGN
        with atomic_file(path, binary=True) as handle:
            handle.write(MAGIC + struct.pack("<Q", len(header)) + header)
            handle.write(b"\0" * (start - handle.tell()))
            for name, array in arrays.items():
                handle.write(b"\0" * (start + specs[name]["offset"] - handle.tell()))
                handle.write(memoryview(array.reshape(-1).view(np.uint8)))

    @classmethod
    def load(cls, path: str) -> "PackedIndex":
        """The index in ``path`` with its arrays mapped read-only (shared with every process that maps it)."""
        with open(path, "rb") as handle:
            head = handle.read(len(MAGIC) + 8)
            if len(head) < len(MAGIC) + 8 or not head.startswith(MAGIC):
                raise IndexFileError(f"{path} is not a ppdist index file (or from another version)")
            (length,) = struct.unpack("<Q", head[len(MAGIC) :])
            try:
                header = json.loads(handle.read(length).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise IndexFileError(f"{path}: unreadable header ({exc})") from None
            size = os.fstat(handle.fileno()).st_size
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        start = -(-(len(MAGIC) + 8 + length) // ALIGN) * ALIGN
        arrays: Dict[str, np.ndarray] = {}
        for name, spec in header["arrays"].items():
            dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            begin = start + int(spec["offset"])
            if begin + count * dtype.itemsize > size:
                raise IndexFileError(f"{path} is truncated (array {name!r} ends past the file)")
            if count == 0:
                arrays[name] = np.zeros(shape, dtype=dtype)
                continue
            arrays[name] = np.frombuffer(mapped, dtype=dtype, count=count, offset=begin).reshape(shape)
        index = cls(arrays, header["meta"])
        index.path, index.key = os.path.abspath(path), header["key"]
        return index

    def __reduce__(self):
        if self.path is not None:
            return (PackedIndex.load, (self.path,))
        return (_rebuild, (self.arrays, self.meta))


def _rebuild(arrays: Dict[str, np.ndarray], meta: Dict[str, Any]) -> PackedIndex:
    return PackedIndex(arrays, meta)
