"""``append_paged_kv``: new tokens' K/V into their pages, one launch (kernels/paged_append.py)."""
from __future__ import annotations

import torch

from .. import _validate as V
from ..decode import _check_block_table_values, _validate_cache
from ..kernels.paged_append import launch_append_paged_kv

__all__ = ["append_paged_kv"]


def append_paged_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    check_block_table: bool = False,
) -> None:
    """Write new tokens' K/V into their pages, in place.

    ``k, v [batch, new_len, nheads_k, headdim]``; token ``i`` of sequence ``b`` goes to position
    ``cache_seqlens[b] + i``. Like flash-attn, ``cache_seqlens`` is left as it is (the caller
    advances it). Positions are computed on the device (no host sync; capturable); that the table
    has pages for them is the caller's contract, checked only with ``check_block_table`` (syncs).
    """
    _validate_cache(k_cache, v_cache, cache_seqlens, block_table)
    V.check_tensor("k", k, ndim=4, dtypes=V.ATTN_DTYPES)
    V.check_tensor("v", v, ndim=4, dtypes=V.ATTN_DTYPES)
    V.check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        block_table=block_table)
    V.check_same_dtype(k=k, v=v, k_cache=k_cache)
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    batch, new_len = k.shape[0], k.shape[1]
    if batch != block_table.shape[0] or k.shape[2:] != k_cache.shape[2:]:
        raise ValueError(f"k must have shape [{block_table.shape[0]}, new_len, "
                         f"{k_cache.shape[2]}, {k_cache.shape[3]}], got {tuple(k.shape)}")
    page_size = k_cache.shape[1]
    if check_block_table:
        _check_block_table_values(cache_seqlens, block_table, k_cache.shape[0], page_size, new_len)
    if new_len == 0 or batch == 0:
        return
    if torch.compiler.is_compiling():
        torch.ops.kvonce.append_paged_kv(k, v, k_cache, v_cache, cache_seqlens, block_table)
    else:
        _append_paged_kv_impl(k, v, k_cache, v_cache, cache_seqlens, block_table)


def _append_paged_kv_impl(k, v, k_cache, v_cache, cache_seqlens, block_table) -> None:
    # One launch; plain PyTorch needed two gathers and an indexed store per cache (99 us of host
    # time per call on the lent H100, docs/benchmarks.md 2026-11-23).
    launch_append_paged_kv(k, v, k_cache, v_cache, cache_seqlens, block_table)


@torch.library.custom_op("kvonce::append_paged_kv", mutates_args=("k_cache", "v_cache"))
def _append_paged_kv_op(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                        block_table: torch.Tensor) -> None:
    """``append_paged_kv`` after its checks: writes into ``k_cache`` and ``v_cache``."""
    _append_paged_kv_impl(k, v, k_cache, v_cache, cache_seqlens, block_table)


@_append_paged_kv_op.register_fake
def _(k, v, k_cache, v_cache, cache_seqlens, block_table):
    return None
