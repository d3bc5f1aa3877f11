"""Split a nested state dict into its tensors (for DCP) and the rest (for JSON), and back.

Called by `checkpoint` and `resume`. `get_state_dict` returns model and optimizer state as
nested dicts and lists where tensors sit beside plain values (learning rates, betas, the
parameter names of each param group). DCP gets only the tensors, flat, keyed by their
path; the plain values stay in a JSON skeleton with a reference where each tensor was.
"""

from __future__ import annotations

from typing import Any

import torch

REF = "__gv_tensor__"


def _key(path: tuple[Any, ...]) -> str:
    return "/".join(str(p) for p in path)


def split(obj: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """(flat {path: tensor}, skeleton) of a nested state."""
    flat: dict[str, torch.Tensor] = {}

    def walk(o: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(o, torch.Tensor):
            k = _key(path)
            flat[k] = o
            return {REF: k}
        if isinstance(o, dict):
            return {k: walk(v, (*path, k)) for k, v in o.items()}
        if isinstance(o, list | tuple):
            return type(o)(walk(v, (*path, i)) for i, v in enumerate(o))
        return o

    return flat, walk(obj, ())


def join(skeleton: Any, flat: dict[str, torch.Tensor]) -> Any:
    """The nested state again: the skeleton's values, tensors taken from `flat`."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {REF}:
            key = skeleton[REF]
            if key not in flat:
                raise KeyError(f"tensor {key!r} of the checkpoint has no place in the model")
            return flat[key]
        return {k: join(v, flat) for k, v in skeleton.items()}
    if isinstance(skeleton, list | tuple):
        return type(skeleton)(join(v, flat) for v in skeleton)
    return skeleton


def refs(skeleton: Any) -> set[str]:
    """The tensor keys a skeleton refers to."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {REF}:
            return {str(skeleton[REF])}
        return {k for v in skeleton.values() for k in refs(v)}
    if isinstance(skeleton, list | tuple):
        return {k for v in skeleton for k in refs(v)}
    return set()
