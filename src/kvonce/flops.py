"""FLOP formulas of kvonce's custom ops, for ``torch.utils.flop_counter.FlopCounterMode``.

Convention (flash-attn's benchmarks, PyTorch's SDPA formula): a forward does two matmuls per
visible (query row, key) pair and q head, ``Q K^T`` and ``P V``, ``headdim`` multiply-adds each at
2 FLOPs a multiply-add: ``4 * headdim * nheads * pairs``. A backward does five (``Q K^T`` again,
``dV``, ``dP``, ``dQ``, ``dK``): 2.5x the forward. GQA changes nothing (every q head counts).

``pairs`` is counted EXACTLY from the length tensors (``cu_seqlens``, ``kv_end``,
``cache_seqlens``) when their values can be read: that reads them on the host (a sync, which is
acceptable inside FlopCounterMode). With fake or meta tensors (FakeTensorMode, tracing) there are
no values, and each formula returns an upper bound from shapes, said where it is computed.

Not counted (no matmul work): ``kvonce::merge_attention_states`` (an elementwise LSE-weighted
merge) and ``kvonce::append_paged_kv`` (a copy, quantizing for a quantized cache).

``FlopCounterMode`` calls a formula as ``formula(*args, **kwargs, out_val=out)`` with the op's raw
arguments (``get_raw=True``; trailing arguments left at their defaults may be absent), so each
formula takes the op's schema arguments in order. Imported by ``kvonce/__init__.py`` after the
ops exist: importing it registers the formulas.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula

from .paged import decode as _decode  # noqa: F401  (registers paged_decode, paged_decode_split)
from .paged import prefill as _prefill  # noqa: F401  (registers paged_prefill)
from .paged import prefix as _prefix  # noqa: F401  (registers prefix_decode)
from . import varlen as _varlen  # noqa: F401  (registers dual_group_fwd, dual_group_bwd)
from ._dispatch import values_readable
from .zigzag import cp as _cp
from .zigzag import fused as _fused  # noqa: F401  (registers dual_group_*_zigzag)

__all__ = ["visible_pairs", "attention_flops", "zigzag_pairs"]

_ops = torch.ops.kvonce


def visible_pairs(q_lens, k_lens, causal: bool) -> torch.Tensor:
    """Visible (query row, key) pairs of each sequence: int64, ``q_lens`` and ``k_lens``
    broadcast (ints or integer tensors; negative lengths count as 0).

    Causal is bottom-right (row ``i`` of ``Lq`` sees key ``j < Lk`` iff ``j <= i + Lk - Lq``):
    with ``n = min(Lq, Lk)`` the last ``n`` rows see ``Lk - n + 1 .. Lk`` keys and the others
    none, ``n * Lk - n * (n - 1) / 2`` pairs. Non-causal: ``Lq * Lk``.
    """
    lq = torch.as_tensor(q_lens, dtype=torch.int64).clamp_min(0)
    lk = torch.as_tensor(k_lens, dtype=torch.int64).clamp_min(0)
    if not causal:
        return lq * lk
    n = torch.minimum(lq, lk)
    return n * lk - n * (n - 1) // 2


def attention_flops(nheads: int, head_dim: int, pairs: int, *, backward: bool = False) -> int:
    """``4 * head_dim * nheads * pairs`` for a forward, 2.5x that (``10 * ...``) for a backward."""
    return (10 if backward else 4) * head_dim * nheads * int(pairs)


def _lens(cu: torch.Tensor) -> torch.Tensor:
    """Sequence lengths of cumulative ``cu [batch + 1]``."""
    return cu[1:].long() - cu[:-1].long()


# ------------------------------------------------------------------------------------------------
# Dual-group varlen (kvonce.varlen)
# ------------------------------------------------------------------------------------------------

def _dual_group_pairs(q0, q1, k, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
                      causal) -> int:
    """Group ``g`` of sequence ``b``: ``len_qg[b]`` rows over ``min(kv_end_g[b], len_k[b])`` keys.
    Shapes only: every row of a group sees at most all ``total_k`` keys (a bound, loose for
    batches of several sequences)."""
    if not values_readable(cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1):
        return (q0.shape[0] + q1.shape[0]) * k.shape[0]
    len_k = _lens(cu_seqlens_k)
    pairs = 0
    for cu_q, kv_end in ((cu_seqlens_q0, kv_end0), (cu_seqlens_q1, kv_end1)):
        pairs = pairs + visible_pairs(_lens(cu_q), torch.minimum(kv_end.long(), len_k),
                                      causal).sum()
    return int(pairs)


@register_flop_formula(_ops.dual_group_fwd, get_raw=True)
def dual_group_fwd_flops(q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0,
                         kv_end1, max_seqlen_q, max_seqlen_k, softmax_scale, causal, *config,
                         out_val=None) -> int:
    """``kvonce::dual_group_fwd``: both groups' forward."""
    pairs = _dual_group_pairs(q0, q1, k, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0,
                              kv_end1, causal)
    return attention_flops(q0.shape[1], q0.shape[2], pairs)


@register_flop_formula(_ops.dual_group_bwd, get_raw=True)
def dual_group_bwd_flops(dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1, cu_seqlens_q0,
                         cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal, dkv_dtype, *config, out_val=None) -> int:
    """``kvonce::dual_group_bwd``: 2.5x the forward's pairs."""
    pairs = _dual_group_pairs(q0, q1, k, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0,
                              kv_end1, causal)
    return attention_flops(q0.shape[1], q0.shape[2], pairs, backward=True)


# ------------------------------------------------------------------------------------------------
# Zigzag: the fused replacement's two ops and the context-parallel pair
# ------------------------------------------------------------------------------------------------

def zigzag_pairs(len_q0, len_q1, chunk, chunk_idx_0: int, chunk_idx_1: int, world: int,
                 causal: bool) -> int:
    """Group ``g`` of sequence ``b`` (zigzag chunk ``chunk_idx_g``): ``len_qg[b]`` rows over global
    keys ``[0, (chunk_idx_g + 1) * chunk[b])``, causal in global positions (= bottom-right)."""
    global_len = 2 * world * chunk
    pairs = 0
    for len_q, idx in ((len_q0, chunk_idx_0), (len_q1, chunk_idx_1)):
        pairs = pairs + visible_pairs(len_q, torch.minimum((idx + 1) * chunk, global_len),
                                      causal).sum()
    return int(pairs)


def _local_zigzag_pairs(q, cu_seqlens, chunk_idx_0, chunk_idx_1, world, causal) -> int:
    """One rank's two groups from its LOCAL ``cu_seqlens`` (each length two chunks, the kernels'
    ``cu // 2`` rows per group). Shapes only: a group has at most ``T // 2`` rows (``T`` local
    tokens), each seeing at most ``(chunk_idx + 1) * (T // 2)`` keys."""
    half = q.shape[0] // 2
    if not values_readable(cu_seqlens):
        return sum(half * (idx + 1) * half for idx in (chunk_idx_0, chunk_idx_1))
    rows = _lens(torch.div(cu_seqlens, 2, rounding_mode="floor"))
    chunk = _lens(cu_seqlens) // 2
    return zigzag_pairs(rows, rows, chunk, chunk_idx_0, chunk_idx_1, world, causal)


@register_flop_formula(_ops.dual_group_fwd_zigzag, get_raw=True)
def dual_group_fwd_zigzag_flops(q0, q1, kv_buffer, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
                                chunk_idx_0, chunk_idx_1, world_size, max_seqlen_q, softmax_scale,
                                causal, *config, out_val=None) -> int:
    """``kvonce::dual_group_fwd_zigzag``: chunk ``c_b = len_k_local[b] // 2``. Shapes only: group
    ``g`` has ``q_g.shape[0]`` rows, each seeing at most ``(chunk_idx_g + 1) * R // 2`` keys
    (``R`` the per-rank rows of the buffer, which bound ``2 * c_b``)."""
    if values_readable(cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k):
        pairs = zigzag_pairs(_lens(cu_seqlens_q0), _lens(cu_seqlens_q1), _lens(cu_seqlens_k) // 2,
                             chunk_idx_0, chunk_idx_1, world_size, causal)
    else:
        half = kv_buffer.shape[1] // world_size // 2
        pairs = q0.shape[0] * (chunk_idx_0 + 1) * half + q1.shape[0] * (chunk_idx_1 + 1) * half
    return attention_flops(q0.shape[1], q0.shape[2], pairs)


@register_flop_formula(_ops.dual_group_bwd_zigzag, get_raw=True)
def dual_group_bwd_zigzag_flops(dout, q, out, lse, kv_buffer, cu_seqlens_q, chunk_idx_0,
                                chunk_idx_1, world_size, max_seqlen_q, softmax_scale, causal,
                                dkv_dtype, *config, out_val=None) -> int:
    """``kvonce::dual_group_bwd_zigzag``: 2.5x the forward twin's pairs."""
    pairs = _local_zigzag_pairs(q, cu_seqlens_q, chunk_idx_0, chunk_idx_1, world_size, causal)
    return attention_flops(q.shape[1], q.shape[2], pairs, backward=True)


def _cp_world_rank(group_name: str) -> tuple[int, int]:
    """(world size, rank) of the CP op's process group ("" = no torch.distributed: (1, 0))."""
    _, world, rank = _cp._resolve(group_name)
    return world, rank


def _cp_pairs(q, cu_seqlens, causal, group_name) -> int:
    """Rank ``r`` of ``w`` holds chunks ``r`` and ``2w - 1 - r`` of every sequence."""
    world, rank = _cp_world_rank(group_name)
    return _local_zigzag_pairs(q, cu_seqlens, rank, 2 * world - 1 - rank, world, causal)


@register_flop_formula(_ops.zigzag_cp_fwd, get_raw=True)
def zigzag_cp_fwd_flops(q, k, v, cu_seqlens, heads_k_stride, max_chunk, softmax_scale, causal,
                        group_name, keep_kv, deterministic=False, out_val=None) -> int:
    """``kvonce::zigzag_cp_fwd``: this rank's two groups (all its KV-head strides)."""
    return attention_flops(q.shape[1], q.shape[2], _cp_pairs(q, cu_seqlens, causal, group_name))


@register_flop_formula(_ops.zigzag_cp_bwd, get_raw=True)
def zigzag_cp_bwd_flops(dout, q, k, v, out, lse, kept, cu_seqlens, heads_k_stride, max_chunk,
                        softmax_scale, causal, group_name, deterministic=False,
                        out_val=None) -> int:
    """``kvonce::zigzag_cp_bwd``: 2.5x the forward's pairs."""
    return attention_flops(q.shape[1], q.shape[2], _cp_pairs(q, cu_seqlens, causal, group_name),
                           backward=True)


# ------------------------------------------------------------------------------------------------
# Paged decode (kvonce.paged.decode, kvonce.paged.prefix)
# ------------------------------------------------------------------------------------------------

def _decode_flops(q, k_cache, cache_seqlens, block_table, causal) -> int:
    """``q [batch, q_len, nheads, d]``: sequence ``b``'s ``q_len`` rows over ``cache_seqlens[b]``
    keys. Shapes only: every sequence holds at most ``max_pages * page_size`` keys (the count
    grows with the key length, so that length bounds it)."""
    batch, q_len, nheads, head_dim = q.shape
    if values_readable(cache_seqlens):
        pairs = visible_pairs(q_len, cache_seqlens, causal).sum()
    else:
        pairs = batch * visible_pairs(q_len, block_table.shape[1] * k_cache.shape[1], causal)
    return attention_flops(nheads, head_dim, pairs)


@register_flop_formula(_ops.paged_decode, get_raw=True)
def paged_decode_flops(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal,
                       *config_and_scales, out_val=None) -> int:
    """``kvonce::paged_decode`` (plain and quantized caches)."""
    return _decode_flops(q, k_cache, cache_seqlens, block_table, causal)


@register_flop_formula(_ops.paged_decode_split, get_raw=True)
def paged_decode_split_flops(q, k_cache, v_cache, cache_seqlens, block_table, o_part, lse_part,
                             arrivals, softmax_scale, causal, *config_and_scales,
                             out_val=None) -> int:
    """``kvonce::paged_decode_split``: the same attention as single-pass (the merge is not a
    matmul)."""
    return _decode_flops(q, k_cache, cache_seqlens, block_table, causal)


@register_flop_formula(_ops.prefix_decode, get_raw=True)
def prefix_decode_flops(q, k_cache, v_cache, cache_seqlens, block_table, work, members,
                        prefix_pages, o_part, lse_part, suffix_table, suffix_seqlens,
                        softmax_scale, causal, *config, out_val=None) -> int:
    """``kvonce::prefix_decode``: the cascade computes the plain decode's attention (shared pages
    once for all their sequences, but every sequence's row-key pairs still count once each: the
    useful work, not the padded tiles)."""
    return _decode_flops(q, k_cache, cache_seqlens, block_table, causal)


@register_flop_formula(_ops.paged_prefill, get_raw=True)
def paged_prefill_flops(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table,
                        softmax_scale, causal, *config_and_scales, out_val=None) -> int:
    """``kvonce::paged_prefill``: sequence ``b``'s ``cu_seqlens_q[b + 1] - cu_seqlens_q[b]`` rows
    over its ``cache_seqlens[b]`` keys, bottom-right causal: exactly the visible pairs. Without
    readable values (fake tensors), the bound ``total_q`` rows x ``max_pages * page_size`` keys."""
    total_q, nheads, head_dim = q.shape
    if values_readable(cu_seqlens_q, cache_seqlens):
        pairs = visible_pairs(_lens(cu_seqlens_q), cache_seqlens, causal).sum()
    else:
        pairs = total_q * block_table.shape[1] * k_cache.shape[1]
    return attention_flops(nheads, head_dim, pairs)
