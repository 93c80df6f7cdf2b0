"""Argument checks shared by the API modules.

Every check raises ``TypeError`` or ``ValueError`` naming the argument, what was expected and what
was seen (shapes, dtypes, devices; never tensor contents, which would need a host sync).
"""
from __future__ import annotations

from typing import Iterable

import torch

ATTN_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SUPPORTED_HEAD_DIMS = (32, 64, 96, 128, 256)


def check_tensor(name: str, t, *, ndim: int | None = None,
                 dtypes: Iterable[torch.dtype] | None = None) -> None:
    """``t`` is a tensor of ``ndim`` dims and one of ``dtypes``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name} must be one of ({names}), got {str(t.dtype).replace('torch.', '')}")


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device; returns it."""
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}; "
                             "all tensors must be on one device")
    return first.device


def check_same_dtype(**tensors: torch.Tensor) -> None:
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}; "
                            "they must match")


def check_last_dim_contiguous(**tensors: torch.Tensor) -> None:
    """Kernels read whole rows with vector loads: the last dim must have stride 1."""
    for name, t in tensors.items():
        if t.numel() > 0 and t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides "
                             f"{tuple(t.stride())}")


def check_cu_seqlens(name: str, t, batch: int | None = None) -> int:
    """int32 ``[batch + 1]``; returns ``batch``. Values (monotone, start at 0) are the caller's
    contract: checking them would need a host sync."""
    check_tensor(name, t, ndim=1, dtypes=(torch.int32,))
    if t.shape[0] < 1:
        raise ValueError(f"{name} must have batch + 1 >= 1 entries, got shape {tuple(t.shape)}")
    if batch is not None and t.shape[0] != batch + 1:
        raise ValueError(f"{name} must have shape [{batch + 1}] (batch + 1), got {tuple(t.shape)}")
    return t.shape[0] - 1


def check_head_dim(name: str, head_dim: int) -> None:
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{name}: head dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")


def check_gqa(nheads: int, nheads_k: int) -> None:
    if nheads_k < 1 or nheads % nheads_k != 0:
        raise ValueError(f"nheads ({nheads}) must be a multiple of nheads_k ({nheads_k})")


def check_int_or_per_sequence(name: str, x, batch: int, device: torch.device) -> None:
    """An int >= 0, or an int32 tensor ``[batch]`` on ``device``."""
    if isinstance(x, bool):
        raise TypeError(f"{name} must be an int or an int32 tensor [batch], got bool")
    if isinstance(x, int):
        if x < 0:
            raise ValueError(f"{name} must be >= 0, got {x}")
        return
    check_tensor(name, x, ndim=1, dtypes=(torch.int32,))
    if x.shape[0] != batch:
        raise ValueError(f"{name} must have shape [{batch}] (one per sequence), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the inputs are on {device}")


def check_nonnegative_int(name: str, x) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise TypeError(f"{name} must be a non-negative int, got {x!r}")


def call_signature(*args) -> tuple | None:
    """Everything the checks of this module read from ``args``: each tensor's type, shape,
    strides, dtype and device (never its values), each other argument's type and value. Two calls
    with one signature pass or fail the checks alike, so an API may remember the signatures that
    passed and skip its checks on a repeat (host time: docs/notes.md). None when an argument is
    unhashable (then check as usual)."""
    try:
        sig = tuple((type(a), a.shape, a.stride(), a.dtype, a.device)
                    if isinstance(a, torch.Tensor) else (type(a), a) for a in args)
        hash(sig)
        return sig
    except TypeError:
        return None


class PassedChecks:
    """A bounded memory of call signatures whose checks passed."""

    def __init__(self, capacity: int = 256):
        self.capacity, self._seen = capacity, {}

    def get(self, signature, default=None):
        return self._seen.get(signature, default) if signature is not None else default

    def add(self, signature, value=True) -> None:
        if signature is None:
            return
        if len(self._seen) >= self.capacity:
            self._seen.clear()
        self._seen[signature] = value
