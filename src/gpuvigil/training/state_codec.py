"""JSON for the non-tensor state of a checkpoint: nothing in a checkpoint is ever unpickled.

Called by `checkpoint` for each rank's file (RNG states, step, data position, `run.extra`)
and the job-wide file (LR scheduler, optimizer hyperparameters, `run.extra_global`). Tensors
go through DCP; everything else is JSON with a few tagged types that JSON lacks (tuples,
bytes, small tensors, numpy arrays), so loading a checkpoint can only ever build data. A
value of any other type is refused when it is saved, with the path to it, never pickled.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np
import torch

_TAG = "__gv__"


class StateError(ValueError):
    """A value that cannot be saved as data (its path and type say which)."""


def _bytes(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def encode(obj: Any, path: str = "") -> Any:
    """A JSON-ready copy of `obj`; raises StateError naming the first value it cannot keep."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {_TAG: "float", "v": repr(obj)}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: encode(v, f"{path}.{k}") for k, v in obj.items()}
        return {
            _TAG: "dict",
            "items": [
                [encode(k, f"{path}<key>"), encode(v, f"{path}[{k!r}]")] for k, v in obj.items()
            ],
        }
    if isinstance(obj, list):
        return [encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {_TAG: "tuple", "items": [encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, bytes | bytearray):
        return {_TAG: "bytes", "b64": _bytes(bytes(obj))}
    if type(obj) is torch.Tensor:
        t = obj.detach().to("cpu").contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {_TAG: "tensor", "dtype": str(t.dtype), "shape": list(t.shape), "b64": _bytes(raw)}
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise StateError(f"{path or '<root>'}: numpy array of Python objects")
        return {
            _TAG: "ndarray",
            "dtype": obj.dtype.str,
            "shape": list(obj.shape),
            "b64": _bytes(np.ascontiguousarray(obj).tobytes()),
        }
    if isinstance(obj, np.generic):
        return encode(obj.item(), path)
    raise StateError(
        f"{path or '<root>'}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be "
        "saved as checkpoint state (only JSON data, tuples, bytes, tensors and numpy arrays; "
        "checkpoints never pickle)"
    )


def decode(obj: Any) -> Any:
    """Inverse of `encode`; raises StateError on anything `encode` does not write."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    tag = obj.get(_TAG)
    if tag is None:
        return {k: decode(v) for k, v in obj.items()}
    try:
        if tag == "tuple":
            return tuple(decode(v) for v in obj["items"])
        if tag == "dict":
            return {_hashable(decode(k)): decode(v) for k, v in obj["items"]}
        if tag == "float":
            return float(obj["v"])
        if tag == "bytes":
            return base64.b64decode(obj["b64"], validate=True)
        if tag == "tensor":
            dtype = getattr(torch, str(obj["dtype"]).removeprefix("torch."), None)
            if not isinstance(dtype, torch.dtype):
                raise StateError(f"not a dtype: {obj['dtype']}")
            raw = bytearray(base64.b64decode(obj["b64"], validate=True))
            shape = [int(n) for n in obj["shape"]]
            if not raw:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).clone()
        if tag == "ndarray":
            dtype = np.dtype(str(obj["dtype"]))
            if dtype.hasobject:
                raise StateError("numpy object arrays are not data")
            raw = base64.b64decode(obj["b64"], validate=True)
            return np.frombuffer(raw, dtype=dtype).reshape([int(n) for n in obj["shape"]]).copy()
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise StateError(f"malformed {tag!r} value: {e}") from e
    raise StateError(f"unknown tag {tag!r}")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list | tuple) else key


def dumps(obj: Any) -> bytes:
    return json.dumps(encode(obj), separators=(",", ":"), allow_nan=False).encode()


def loads(raw: bytes) -> Any:
    """Raises StateError on anything that is not a state file of ours."""
    try:
        return decode(json.loads(raw))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        if isinstance(e, StateError):
            raise
        raise StateError(f"not JSON state: {e}") from e
