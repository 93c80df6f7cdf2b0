"""The sparse half of dense-and-sparse keys (``kvonce.paged.outliers``): a quantized cache whose
keys keep ``N_OUT <= 16`` outlier channels per KV head at 16 bits (fp16, or q's dtype), in a
side cache ``values [num_pages, PAGE_SIZE, nheads_k, N_OUT]``, those channels stored as 0 in the
quantized keys. A key's score is then ``q . dequant(k_dense) + q[:, channels] . values``: the
second term is one more small dot per key tile (``N_OUT`` padded to 16 columns; in fp16 for
fp16 values, bf16 q's values there taken to fp16 rows times a power of two each), added to the
scores after the dense dot's own per-key (int8) or per-head (fp8) scale, times a per-row
factor (``paged_decode._attend_kv_head``'s ``out_scale``). Shared by the decode loops and the
varlen prefill (through ``paged_decode._attend_kv_head``).
"""
from __future__ import annotations

import triton
import triton.language as tl

OUT_COLS: tl.constexpr = tl.constexpr(16)  # N_OUT padded: the smallest MMA reduction


@triton.jit
def _outlier_queries(q_row_ptrs, OC, kv_head, row_ok, N_OUT: tl.constexpr):
    """``q [BLOCK_M, 16]``: each packed row's values at its KV head's outlier channels
    (``OC``: int32 ``[nheads_k, N_OUT]``), 0 in the padding columns and rows. ``q_row_ptrs
    [BLOCK_M]``: each row's channel 0 in Q."""
    offs_o = tl.arange(0, OUT_COLS)
    o_ok = offs_o < N_OUT
    chans = tl.load(OC + kv_head * N_OUT + offs_o, mask=o_ok, other=0)
    return tl.load(q_row_ptrs[:, None] + chans[None, :], mask=row_ok[:, None] & o_ok[None, :],
                   other=0.0)


@triton.jit
def _without_outlier_channels(q, OC, kv_head, offs_d, N_OUT: tl.constexpr):
    """``q [BLOCK_M, BLOCK_D]`` with its KV head's outlier channels set to 0, for the dense dot
    of a format that stores 0 only approximately (int4: its 16 levels span each key's [min, max],
    so the dense part's zeroed outlier channels come back within half a step of 0): the side
    cache alone carries those channels, as ``KeyOutliers.merge`` defines the keys."""
    offs_o = tl.arange(0, OUT_COLS)
    chans = tl.load(OC + kv_head * N_OUT + offs_o, mask=offs_o < N_OUT, other=-1)
    hit = tl.max((offs_d[:, None] == chans[None, :]).to(tl.int32), 1)
    return tl.where(hit[None, :] != 0, 0.0, q).to(q.dtype)


@triton.jit
def _outlier_scores(q_out, KO, page, slot, in_range, stride_op, stride_ot,
                    MASKED: tl.constexpr, N_OUT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``q_out [BLOCK_M, 16] . values[keys]ᵀ``: the outlier channels' part of the scores of one
    key tile, fp32 ``[BLOCK_M, BLOCK_N]``. ``KO``: this KV head's side cache; ``page, slot,
    in_range [BLOCK_N]``: the tile's keys (``paged_tiles._tile_rows``). Keys out of range read 0
    (their slots may hold anything, NaN included)."""
    offs_o = tl.arange(0, OUT_COLS)
    # N_OUT is 8 or 16 and every stride a multiple of 8 (KeyOutliers checks it): each key's
    # values are 16-byte aligned runs and the mask is constant over 8-channel groups, so the
    # loads are 16 bytes wide (cp.async: the software pipeliner prefetches them with K and V).
    rows = tl.multiple_of(page * stride_op + slot * stride_ot, 8)
    ptrs = KO + rows[None, :] + offs_o[:, None]
    mask = (offs_o // 8 < N_OUT // 8)[:, None]
    if MASKED:
        mask = mask & in_range[None, :]
    values_t = tl.load(ptrs, mask=mask, other=0.0).to(q_out.dtype)  # fp16 -> fp32 q: exact
    return tl.dot(q_out, values_t, input_precision=DOT_PRECISION)
