"""What crosses the network between a deployed server and its silos, and how.

A message is plain data: nested dicts and lists of tensors, numbers, strings, booleans
and None (an algorithm's planned server state, a client's message to the server). It is
split into its tensors, keyed by their path (``params/fc.weight``), and a JSON skeleton
holding everything else with a placeholder per tensor. Flower carries the tensors as an
``ArrayRecord`` and the skeleton as a string in a ``ConfigRecord``; the in-process
loopback transport carries the same pair. Nothing is pickled, so a party never
unpickles what the other sent, and :func:`describe` lists exactly what crossed: keys,
shapes, dtypes and bytes (docs/deployment.md shows one round).

Numbers survive exactly: tensors keep dtype and bits, floats travel as JSON's shortest
round-tripping repr, tuples come back as tuples.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

import numpy as np
import torch

_TENSOR = "__tensor__"
_TUPLE = "__tuple__"
_FLOAT = "__float__"  # inf and nan, which JSON proper has no word for


class WireError(ValueError):
    """A message that cannot be packed (an unsupported value) or unpacked (a malformed one)."""


def pack(value: Any) -> tuple[dict[str, torch.Tensor], str]:
    """``value`` as (tensors by path, JSON skeleton); tensors are detached CPU copies' views."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(v: Any, path: str) -> Any:
        if isinstance(v, torch.Tensor):
            tensors[path] = v.detach().cpu()
            return {_TENSOR: path}
        if isinstance(v, np.ndarray):
            return walk(torch.from_numpy(np.ascontiguousarray(v)), path)
        if isinstance(v, dict):
            out = {}
            for k, item in v.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise WireError(f"{path or 'message'}: key {k!r} is not a string or an integer")
                out[_key(k)] = walk(item, f"{path}/{k}" if path else str(k))
            return out
        if isinstance(v, (list, tuple)):
            items = [walk(item, f"{path}/{i}") for i, item in enumerate(v)]
            return {_TUPLE: items} if isinstance(v, tuple) else items
        if isinstance(v, (bool, str)) or v is None:
            return v
        if isinstance(v, (int, np.integer)):
            return int(v)
        if isinstance(v, (float, np.floating)):
            f = float(v)
            return f if np.isfinite(f) else {_FLOAT: repr(f)}
        raise WireError(f"{path or 'message'}: a {type(v).__name__} cannot cross the wire (tensors, numbers, text, lists, dicts)")

    skeleton = walk(value, "")
    return tensors, json.dumps(skeleton, allow_nan=False)


def _key(k: str | int) -> str:
    """Dict keys travel as strings; an integer key is marked so that it comes back an int."""
    return f"#int:{k}" if isinstance(k, int) else k


def _unkey(k: str) -> str | int:
    return int(k[5:]) if k.startswith("#int:") else k


def unpack(tensors: dict[str, torch.Tensor], skeleton: str, device: torch.device | str = "cpu") -> Any:
    """The value :func:`pack` split, with its tensors on ``device``."""
    try:
        tree = json.loads(skeleton)
    except json.JSONDecodeError as err:
        raise WireError(f"malformed message skeleton: {err}") from None
    used: set[str] = set()

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            if set(v) == {_TENSOR}:
                path = v[_TENSOR]
                if path not in tensors:
                    raise WireError(f"message names tensor '{path}' but carries no such array")
                used.add(path)
                return tensors[path].to(device)
            if set(v) == {_TUPLE}:
                return tuple(walk(item) for item in v[_TUPLE])
            if set(v) == {_FLOAT}:
                return float(v[_FLOAT])
            return {_unkey(k): walk(item) for k, item in v.items()}
        if isinstance(v, list):
            return [walk(item) for item in v]
        return v

    value = walk(tree)
    extra = sorted(set(tensors) - used)
    if extra:
        raise WireError(f"message carries arrays its skeleton does not name: {', '.join(extra[:5])}")
    return value


def walk(value: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, Any, int]]:
    """Every node of an unpacked message, parents first: (path such as
    ``server/params/fc.weight``, node, depth); dicts and lists are walked into."""
    yield path, value, depth
    if isinstance(value, dict):
        children = value.items()
    elif isinstance(value, (list, tuple)):
        children = enumerate(value)
    else:
        return
    for key, item in children:
        yield from walk(item, f"{path}/{key}" if path else str(key), depth + 1)


def describe(tensors: dict[str, torch.Tensor], skeleton: str) -> list[dict[str, Any]]:
    """One row per thing that crossed: each tensor (key, shape, dtype, bytes) and the skeleton."""
    rows = [
        {"key": k, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "bytes": t.numel() * t.element_size()}
        for k, t in tensors.items()
    ]
    rows.append({"key": "(skeleton)", "shape": [], "dtype": "json", "bytes": len(skeleton.encode())})
    return rows


def tensors_to_numpy(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The tensors as NumPy arrays (what Flower's ``ArrayRecord`` is built from); bfloat16,
    which NumPy lacks, is refused rather than silently widened."""
    out = {}
    for k, t in tensors.items():
        if t.dtype == torch.bfloat16:
            raise WireError(f"{k}: bfloat16 tensors have no NumPy type; cast the model to float32 to deploy it")
        out[k] = t.contiguous().numpy()
    return out


def tensors_from_numpy(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The arrays as tensors (copied, so they own their memory)."""
    return {k: torch.from_numpy(np.array(a, copy=True)) for k, a in arrays.items()}
