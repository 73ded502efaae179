"""Dataset indexes as a few flat numpy arrays: compact, shared by forked workers, mappable from a file.

A Python list of per-sample records costs ~250 bytes a sample and, worse, every forked DataLoader
worker slowly copies its pages as reference counts are touched (pytorch#13246). A ``PackedIndex``
keeps the same information in a handful of numpy arrays (strings as one byte buffer plus offsets,
as detectron2 and mmengine serialize their dataset lists), which forked workers share untouched.
Saved to a file, the arrays are memory-mapped read-only: every process on a node maps the same
pages of the page cache instead of holding its own copy.

File layout: ``MAGIC``, an 8-byte little-endian checksum (CRC-32 of everything after it), an
8-byte little-endian header length, a JSON header (``meta``, ``key``, and each array's dtype, shape
and offset), then the arrays, each aligned to 64 bytes. ``load`` verifies the checksum (one pass
over the file: ~20 ms for the 24 MB index of a 500k-line label file) and the header's
layout, so a damaged file is an ``IndexFileError``, never a wrong sample.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import zlib
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from ppdist.utils import strict_json
from ppdist.utils.atomic import atomic_file

MAGIC = b"PPDIST-INDEX-2\n"
ALIGN = 64
CHECKSUM_AT = len(MAGIC)  # the checksum covers the file from CHECKSUM_AT + 8 to its end
HEAD = len(MAGIC) + 16  # magic, checksum, header length


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
        header = strict_json.dumps({"meta": self.meta, "key": key, "arrays": specs}).encode("utf-8")
        start = _data_start(len(header))
        with atomic_file(path, binary=True) as handle:
            checksum = _Checksum(handle)
            handle.write(MAGIC + struct.pack("<Q", 0))
            checksum.write(struct.pack("<Q", len(header)) + header)
            checksum.write(b"\0" * (start - handle.tell()))
            for name, array in arrays.items():
                checksum.write(b"\0" * (start + specs[name]["offset"] - handle.tell()))
                checksum.write(memoryview(array.reshape(-1).view(np.uint8)))
            handle.seek(CHECKSUM_AT)
            handle.write(struct.pack("<Q", checksum.value))
            handle.seek(0, os.SEEK_END)

    @classmethod
    def load(cls, path: str, verify: bool = True) -> "PackedIndex":
        """The index in ``path`` with its arrays mapped read-only (shared with every process that maps it).

        ``verify``: check the file's checksum (off only where the same file was verified already).
        """
        with open(path, "rb") as handle:
            head = handle.read(HEAD)
            if len(head) < HEAD or not head.startswith(MAGIC):
                raise IndexFileError(f"{path} is not a ppdist index file (or from another version)")
            (stored,) = struct.unpack("<Q", head[CHECKSUM_AT : CHECKSUM_AT + 8])
            (length,) = struct.unpack("<Q", head[CHECKSUM_AT + 8 :])
            size = os.fstat(handle.fileno()).st_size
            if length > size - HEAD:
                raise IndexFileError(f"{path} is truncated (its header ends past the file)")
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            header = json.loads(mapped[HEAD : HEAD + length].decode("utf-8"))
            arrays = _map_arrays(mapped, header["arrays"], _data_start(length), size)
            meta, key = dict(header["meta"]), header["key"]
        except IndexFileError as exc:
            raise IndexFileError(f"{path} {exc}") from None
        except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise IndexFileError(f"{path}: unreadable header ({type(exc).__name__}: {exc})") from None
        if verify and zlib.crc32(memoryview(mapped)[CHECKSUM_AT + 8 :]) != stored:
            raise IndexFileError(f"{path}: checksum mismatch (the file was changed or damaged)")
        index = cls(arrays, meta)
        index.path, index.key = os.path.abspath(path), key
        return index

    def __reduce__(self):
        if self.path is not None:
            return (PackedIndex.load, (self.path, False))  # verified by the process that sends it
        return (_rebuild, (self.arrays, self.meta))


class _Checksum:
    """Writes to ``handle`` and keeps the CRC-32 of what it wrote."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.value = handle, 0

    def write(self, data: Any) -> None:
        self.value = zlib.crc32(data, self.value)
        self.handle.write(data)


def _data_start(header_length: int) -> int:
    """Where the arrays begin: after the header, aligned to ``ALIGN``."""
    return -(-(HEAD + header_length) // ALIGN) * ALIGN


def _map_arrays(mapped: mmap.mmap, specs: Mapping[str, Any], start: int, size: int) -> Dict[str, np.ndarray]:
    """The arrays ``specs`` describes, as read-only views of ``mapped``; IndexFileError if one lies past the file."""
    arrays: Dict[str, np.ndarray] = {}
    for name, spec in specs.items():
        dtype, shape = np.dtype(spec["dtype"]), tuple(int(n) for n in spec["shape"])
        if any(n < 0 for n in shape) or int(spec["offset"]) < 0:
            raise ValueError(f"array {name!r} has a negative shape or offset")
        count = int(np.prod(shape, dtype=np.int64))
        begin = start + int(spec["offset"])
        if begin + count * dtype.itemsize > size:
            raise IndexFileError(f"is truncated (array {name!r} ends past the file)")
        if count == 0:
            arrays[name] = np.zeros(shape, dtype=dtype)
            continue
        arrays[name] = np.frombuffer(mapped, dtype=dtype, count=count, offset=begin).reshape(shape)
    return arrays


def _rebuild(arrays: Dict[str, np.ndarray], meta: Dict[str, Any]) -> PackedIndex:
    return PackedIndex(arrays, meta)
