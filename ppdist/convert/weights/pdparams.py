"""Read Paddle ``.pdparams`` / ``.pdema`` / ``.pdopt`` files without Paddle, and without running code.

``paddle.save`` writes a pickle. A state dict's tensors become numpy arrays (Paddle >= 2.1 adds a
``StructuredToParameterName@@`` table of names); tensors nested deeper are written as
``tuple((name, array))`` (dygraph tensors) or ``eval('data', {'data': array})`` (LoDTensors).
A pickle can name and call any importable function, so this reader resolves only the handful of
globals such files hold, and replaces ``eval`` with a function that accepts exactly Paddle's
``('data', {'data': array})`` form. Anything else is refused before it is called.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
from typing import Any, Callable, Dict, Mapping, Tuple

import numpy as np

try:  # numpy >= 2; files written with numpy 1 name numpy.core.multiarray
    from numpy._core import multiarray
except ImportError:  # pragma: no cover - numpy 1
    from numpy.core import multiarray

from ppdist.errors import CheckpointError

STRUCTURED_NAMES_KEY = "StructuredToParameterName@@"
SPLIT_PARAMS_KEY = "UnpackBigParamInfor@@"  # protocol 2/3 files: huge arrays stored in flat slices
PADDLE_SUFFIXES = (".pdparams", ".pdema", ".pdopt")
WRAPPER_KEYS = ("model", "state_dict", "net")


class UnsafePickleError(CheckpointError):
    """A weights file asked for something a Paddle weights file never holds."""


def _lodtensor_from_eval(expression: Any, namespace: Any = None, *rest: Any) -> np.ndarray:
    """Paddle's LoDTensor form ``eval('data', {'data': array})``, without ``eval``."""
    if (
        expression == "data"
        and not rest
        and isinstance(namespace, dict)
        and set(namespace) == {"data"}
        and isinstance(namespace["data"], np.ndarray)
    ):
        return namespace["data"]
    raise UnsafePickleError(
        f"eval called with {expression!r}: only Paddle's eval('data', {{'data': array}}) form is accepted"
    )


def _latin1_encode(text: Any, encoding: str = "latin1", errors: str = "strict") -> bytes:
    """``_codecs.encode``, as protocol-2 pickles store bytes; only for text."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"_codecs.encode called with a {type(text).__name__} and {encoding!r}")
    return text.encode(encoding, errors)


def _numpy_globals() -> Dict[Tuple[str, str], Any]:
    allowed: Dict[Tuple[str, str], Any] = {}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = multiarray._reconstruct
        allowed[(module, "scalar")] = multiarray.scalar
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    return allowed


def _allowed_globals() -> Dict[Tuple[str, str], Any]:
    allowed = _numpy_globals()
    for builtins in ("builtins", "__builtin__"):
        allowed[(builtins, "tuple")] = tuple
        allowed[(builtins, "list")] = list
        allowed[(builtins, "dict")] = dict
        allowed[(builtins, "eval")] = _lodtensor_from_eval
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    allowed[("_codecs", "encode")] = _latin1_encode
    return allowed


class PaddleUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals of Paddle weights files."""

    def __init__(self, handle: Any, source: str) -> None:
        super().__init__(handle, encoding="latin1")
        self.source = source
        self.allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> Callable[..., Any]:
        found = self.allowed.get((module, name))
        if found is None:
            raise UnsafePickleError(
                f"{self.source}: refused: the file asks for {module}.{name}, which a Paddle "
                f"weights file never holds (it could run code); nothing was loaded"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(
            f"{self.source}: refused: persistent ids are not part of a Paddle weights file"
        )


def read_paddle_pickle(path: str) -> Any:
    """The object ``paddle.save`` wrote to ``path``, read with ``PaddleUnpickler``."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise CheckpointError(f"cannot read Paddle weights {path}: {exc.strerror or exc}") from None
    try:
        return PaddleUnpickler(io.BytesIO(raw), path).load()
    except UnsafePickleError as exc:
        if str(exc).startswith(path):
            raise
        raise UnsafePickleError(f"{path}: refused: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise CheckpointError(
            f"{path} is not a Paddle weights file (paddle.save pickle): {type(exc).__name__}: {exc}"
        ) from None


def _as_array(value: Any) -> Any:
    """An array from Paddle's tensor forms: ndarray, or (name, ndarray) of a dygraph tensor."""
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], np.ndarray)
    ):
        return value[1]
    return value


def join_split_arrays(data: Dict[str, Any], source: str) -> Dict[str, Any]:
    """Rebuild arrays that a protocol-2/3 ``paddle.save`` stored as flat slices (``name@@.i``)."""
    table = data.pop(SPLIT_PARAMS_KEY, None)
    if not table:
        return data
    for name, info in table.items():
        try:
            parts = [np.asarray(_as_array(data.pop(part))).reshape(-1) for part in info["slices"]]
            data[name] = np.concatenate(parts).reshape(info["OriginShape"])
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(
                f"{source}: parameter {name} is split into slices that do not fit together "
                f"({type(exc).__name__}: {exc}); the file is damaged"
            ) from None
    return data


def load_pdparams(path: str) -> Dict[str, np.ndarray]:
    """A Paddle state dict: structured parameter name -> numpy array.

    Accepts ``.pdparams`` (PaddleDetection keeps EMA weights there), ``.pdema``, the tensors of a
    ``.pdopt``, and a dict that wraps the state dict under ``model``/``state_dict``/``net``;
    non-array entries (the name table, LR scheduler state) are left out.
    """
    data = read_paddle_pickle(path)
    if not isinstance(data, Mapping):
        raise CheckpointError(
            f"{path} holds a {type(data).__name__}, not a Paddle state dict (name -> tensor)"
        )
    data = join_split_arrays(dict(data), path)
    wrapped = [key for key in WRAPPER_KEYS if isinstance(data.get(key), Mapping)]
    if wrapped and not any(isinstance(_as_array(v), np.ndarray) for v in data.values()):
        data = join_split_arrays(dict(data[wrapped[0]]), path)  # e.g. paddle.save({"model": sd, "epoch": n})
    state: Dict[str, np.ndarray] = {}
    for key, value in data.items():
        if key == STRUCTURED_NAMES_KEY:
            continue
        value = _as_array(value)
        if isinstance(value, np.ndarray):
            state[str(key)] = value
    if not state:
        raise CheckpointError(f"{path} holds no tensors (keys: {list(data)[:8]})")
    return state


def is_paddle_weights(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in PADDLE_SUFFIXES
