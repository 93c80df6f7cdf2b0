"""``merge_attention_states``: the LSE-weighted merge of two partial attention results (the
code the split-K combine runs too), and its custom op."""
from __future__ import annotations

import torch

from .. import _validate as V
from .._dispatch import use_op
from ..kernels.paged_combine import launch_merge_states
from ._alloc import allocator
from .checks import check_device_ok

__all__ = ["merge_attention_states"]


def merge_attention_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor,
                           lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LSE-weighted merge of two partial attention results over disjoint key sets.

    Parameters
    ----------
    o_a, o_b : ``[n, nheads, headdim]`` (fp16/bf16/fp32, same dtype), each normalized over its keys.
    lse_a, lse_b : float32 ``[n, nheads]``, natural log (FlashInfer's ``merge_state`` layout).

    Returns
    -------
    o : ``[n, nheads, headdim]``, o_a's dtype; lse : float32 ``[n, nheads]``.
    A side with ``lse = -inf`` weighs exactly zero (the other side is returned as it is); both
    ``-inf`` gives ``(0, -inf)``. The split-K combine runs the same ``_merge_chunk`` code.
    """
    V.check_tensor("o_a", o_a, ndim=3, dtypes=V.ATTN_DTYPES)
    V.check_tensor("o_b", o_b, ndim=3, dtypes=V.ATTN_DTYPES)
    V.check_tensor("lse_a", lse_a, ndim=2, dtypes=(torch.float32,))
    V.check_tensor("lse_b", lse_b, ndim=2, dtypes=(torch.float32,))
    V.check_same_dtype(o_a=o_a, o_b=o_b)
    device = V.check_same_device(o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b)
    if o_b.shape != o_a.shape:
        raise ValueError(f"o_b must have o_a's shape {tuple(o_a.shape)}, got {tuple(o_b.shape)}")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if t.shape != o_a.shape[:2]:
            raise ValueError(f"{name} must have shape {tuple(o_a.shape[:2])} ([n, nheads]), "
                             f"got {tuple(t.shape)}")
    V.check_last_dim_contiguous(o_a=o_a, o_b=o_b)
    check_device_ok(device)
    if use_op(o_a, lse_a, o_b, lse_b):
        return torch.ops.kvonce.merge_attention_states(o_a, lse_a, o_b, lse_b)
    return _merge_attention_states_impl(o_a, lse_a, o_b, lse_b)


# ------------------------------------------------------------------------------------------------
# torch.library custom op (what torch.compile and dispatch modes see; plain eager calls run the
# implementation directly). kvonce/flops.py counts no FLOPs for it (no matmul).
# ------------------------------------------------------------------------------------------------

def _merge_attention_states_impl(o_a, lse_a, o_b, lse_b):
    out = allocator.empty(o_a.shape, dtype=o_a.dtype, device=o_a.device)
    lse = allocator.empty(o_a.shape[:2], dtype=torch.float32, device=o_a.device)
    launch_merge_states(o_a, lse_a, o_b, lse_b, out, lse)
    return out, lse


@torch.library.custom_op("kvonce::merge_attention_states", mutates_args=())
def _merge_attention_states_op(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor,
                               lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``merge_attention_states`` after its checks."""
    return _merge_attention_states_impl(o_a, lse_a, o_b, lse_b)


@_merge_attention_states_op.register_fake
def _(o_a, lse_a, o_b, lse_b):
    return torch.empty_like(o_a), torch.empty_like(lse_a)
