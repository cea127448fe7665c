"""What a deployed server accepts from a silo: every train reply is checked before it is used.

A silo is another organisation's process; its reply may be malformed, poisoned or forged.
:func:`check_packed` runs on the raw (tensors, skeleton) pair before anything is unpacked
(byte and size limits); :func:`check_train_reply` on the unpacked value: its keys, the
message's tensors (floating dtype of the model, the model parameter's shape where the key
names one, every value finite), numbers finite, weights and counts within
``max_rows``, epsilon a finite number >= 0. A reply that fails raises :class:`InvalidReply`
with one line saying why; the server drops the silo from the round and quarantines it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import torch

from . import wire

REPLY_KEYS = {"message", "loss", "extra_metrics", "epsilon"}
SECURE_REPLY_KEYS = {"masked", "layout", "loss", "extra_metrics", "epsilon"}  # secure aggregation: no message
OPTIONAL_KEYS = {"person_epsilon"}
COUNT_KEYS = ("num_examples", "weight", "num_train", "steps")  # message numbers bounded by max_rows
MAX_ROWS = 10_000_000  # the largest row count (or weight) a silo may claim by default
MAX_DEPTH = 8
MAX_SKELETON_BYTES = 1 << 20
MAX_EXTRA_METRICS = 64


class InvalidReply(ValueError):
    """A silo's reply the server will not use; the message says what was wrong."""


@dataclass(frozen=True)
class ReplyLimits:
    """The model's parameter shapes and dtype, and the bounds a reply must keep."""

    shapes: dict[str, torch.Size]
    dtype: torch.dtype
    max_bytes: int  # all tensors of one reply together
    max_rows: int = MAX_ROWS
    submodels: bool = False  # a parameter's tensor may be a slice of it (no dimension larger)

    @classmethod
    def for_model(
        cls, params: dict[str, torch.Tensor], submodels: bool = False, max_rows: int = MAX_ROWS, copies: int = 4
    ) -> "ReplyLimits":
        """Limits for a model's parameters: a reply may carry ``copies`` times their bytes."""
        floating = [p for p in params.values() if p.is_floating_point()]
        dtype = floating[0].dtype if floating else torch.float32
        size = sum(p.numel() * p.element_size() for p in params.values())
        return cls({k: v.shape for k, v in params.items()}, dtype, copies * size + (1 << 16), max_rows, submodels)

    def fits(self, name: str, shape: torch.Size) -> bool:
        """Whether a tensor of ``shape`` may stand for model parameter ``name``."""
        full = self.shapes[name]
        if not self.submodels:
            return shape == full
        return len(shape) == len(full) and all(s <= f for s, f in zip(shape, full))


def check_packed(tensors: dict[str, torch.Tensor], skeleton: str, limits: ReplyLimits) -> None:
    """Byte limits on the raw reply, before it is unpacked."""
    if not isinstance(skeleton, str) or len(skeleton) > MAX_SKELETON_BYTES:
        raise InvalidReply(f"reply skeleton over {MAX_SKELETON_BYTES} bytes or not text")
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if total > limits.max_bytes:
        raise InvalidReply(f"reply carries {total} bytes of arrays, over the limit of {limits.max_bytes}")
    try:
        depth = _depth(json.loads(skeleton))
    except (json.JSONDecodeError, RecursionError):
        raise InvalidReply("reply skeleton is not valid JSON") from None
    if depth > MAX_DEPTH + 4:  # the wire's own wrappers add a few levels
        raise InvalidReply(f"reply nests {depth} levels deep")


def check_train_reply(value: Any, limits: ReplyLimits, secure: bool = False, weighted: bool = True) -> None:
    """The unpacked train reply: keys, message tensors and numbers (under secure aggregation
    the masked vector and its layout instead, with the weight's entry unless ``weighted`` is
    false: distributed DP's uniform mean), metrics, epsilon."""
    if not isinstance(value, dict):
        raise InvalidReply(f"reply is a {type(value).__name__}, not a mapping")
    keys, expected = set(value), SECURE_REPLY_KEYS if secure else REPLY_KEYS
    if not expected <= keys or keys - expected - OPTIONAL_KEYS:
        raise InvalidReply(f"reply keys {sorted(keys)} are not {sorted(expected)} (+ {sorted(OPTIONAL_KEYS)})")
    _check_number("epsilon", value["epsilon"], low=0.0)
    if value["loss"] is not None:
        _check_logged("loss", value["loss"])
    metrics = value["extra_metrics"]
    if not isinstance(metrics, dict) or len(metrics) > MAX_EXTRA_METRICS:
        raise InvalidReply("extra_metrics must be a mapping of at most 64 numbers")
    for name, number in metrics.items():
        _check_logged(f"extra_metrics/{name}", number)
    if secure:
        _check_masked(value["masked"], value["layout"], limits, weighted)
        return
    if not isinstance(value["message"], dict):
        raise InvalidReply("the message must be a mapping")
    _check_tree(value["message"], limits)


def _check_masked(masked: Any, layout: Any, limits: ReplyLimits, weighted: bool) -> None:
    """A masked update: one int64 vector of 32-bit words, one number per entry of a layout
    of model parameters (each at its shape), plus the weight when ``weighted``."""
    if not isinstance(layout, list) or not layout:
        raise InvalidReply("layout must be a non-empty list of [parameter, shape]")
    size = 0
    for entry in layout:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], list)
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in entry[1])):
            raise InvalidReply(f"layout entry {entry!r} is not [parameter, shape]")
        name, shape = entry[0], torch.Size(entry[1])
        if name not in limits.shapes or limits.shapes[name] != shape:
            raise InvalidReply(f"layout: {name} {list(shape)} is not a parameter of the model at its shape")
        size += shape.numel()
    size += int(weighted)
    if not isinstance(masked, torch.Tensor) or masked.dtype != torch.int64 or masked.shape != (size,):
        what = "the layout and the weight" if weighted else "the layout"
        raise InvalidReply(f"masked must be an int64 vector of {size} numbers ({what})")
    if bool(((masked < 0) | (masked >= 1 << 32)).any()):
        raise InvalidReply("masked holds numbers outside 32 bits")


def _check_tree(message: Any, limits: ReplyLimits) -> None:
    """Every node of a reply's message (:func:`~fedveil.deploy.wire.walk`): its depth, each
    tensor's shape, dtype and values, each number finite (a count within the rows a silo can
    hold), nothing but tensors, numbers, strings, booleans and None."""
    for path, node, depth in wire.walk(message, "message"):
        if depth > MAX_DEPTH:
            raise InvalidReply(f"{path}: nested more than {MAX_DEPTH} levels")
        if path.rsplit("/", 1)[-1] in COUNT_KEYS:
            _check_number(path, node, low=0.0, high=float(limits.max_rows))
        elif isinstance(node, torch.Tensor):
            _check_tensor(node, path, limits)
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            _check_number(path, node)
        elif not (node is None or isinstance(node, (str, bool, dict, list, tuple))):
            raise InvalidReply(f"{path}: unexpected {type(node).__name__}")


def _check_tensor(t: torch.Tensor, path: str, limits: ReplyLimits) -> None:
    name = path.rsplit("/", 1)[-1]
    if name in limits.shapes and not limits.fits(name, t.shape):
        raise InvalidReply(f"{path}: shape {list(t.shape)} but the model's {name} is {list(limits.shapes[name])}")
    if t.is_floating_point():
        if t.dtype != limits.dtype:
            raise InvalidReply(f"{path}: dtype {t.dtype} but the model's is {limits.dtype}")
        if not bool(torch.isfinite(t).all()):
            raise InvalidReply(f"{path}: holds NaN or infinite values")
    elif t.is_complex():
        raise InvalidReply(f"{path}: complex values")


def _check_number(path: str, x: Any, low: float = -math.inf, high: float = math.inf) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise InvalidReply(f"{path}: {x!r} is not a number")
    if not math.isfinite(x) or not low <= x <= high:
        raise InvalidReply(f"{path}: {x!r} is outside [{low:g}, {high:g}] or not finite")


def _check_logged(path: str, x: Any) -> None:
    """A logged statistic: a number, NaN allowed (an empty Poisson batch has no loss), not infinite."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isinf(x):
        raise InvalidReply(f"{path}: {x!r} is not a finite number or NaN")


def _depth(node: Any) -> int:
    if isinstance(node, dict):
        return 1 + max((_depth(v) for v in node.values()), default=0)
    if isinstance(node, list):
        return 1 + max((_depth(v) for v in node), default=0)
    return 0
