"""Fused dual-group varlen attention backward (zigzag llama3 context parallelism).

The forward's two query groups share one K/V; so does the backward. Two kernels, run in order:

1. ``_dual_group_bwd_dq_kernel``: one program per (q head, M-block, sequence), shaped like the
   forward. It first computes ``delta = rowsum(dO * O)`` for its rows of both groups (the
   preprocess, fused: the rows are loaded here anyway) and stores it for kernel 2; then it walks
   the key tiles once, feeding every tile it loads to both groups, and writes ``dQ``.
2. ``_dual_group_bwd_dkdv_kernel``: one program per (key block, KV head, sequence). It loads its
   K/V tile once and walks, for every q head of the GQA group, the query rows of BOTH groups that
   see those keys, accumulating ``dK`` and ``dV`` in fp32 registers; they are scaled and cast once,
   at the store, to the dK/dV tensor's dtype (fp32 by default: no fp16/bf16 partial sums).

With ``P = exp(S * scale - lse)`` (base 2 inside: ``log2(e)`` folded into the scale, the stored
natural-log LSE converted on load), ``dP = dO V^T`` and ``dS = P * (dP - delta)``:
``dV = P^T dO``, ``dK = scale * dS^T Q``, ``dQ = scale * dS K``.

Rows that see no key carry ``lse = -inf``: it is read as ``+inf``, so their ``P`` is exactly 0
(no ``exp(-inf - -inf)``), their dQ is 0 and they add nothing to dK/dV. Keys no row sees keep the
zero accumulator, and rows of dQ/dK/dV that belong to no sequence (past ``cu_seqlens[-1]``, or
past each rank's rows in the zigzag buffer) are zeroed by one extra grid slice
(``seq == batch``): every element of every gradient is written.

Key rows come from the forward's ``_kv_rows`` (contiguous or the zigzag all-gather buffer), and
dK/dV are written to the same rows: in zigzag mode the gradient lands in the buffer's rank-major
layout, ready for a reduce-scatter. ``LOCAL_ORDER``: q/out/dout/lse/dq of both groups live in one
tensor in a zigzag rank's local order (sequence ``b``'s rows from ``cu_q0[b] + cu_q1[b]``, group
0's chunk first).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dual_group_fwd import _key_bounds, _kv_rows, _max_offset
from ._launch import dot_input_precision, next_pow2

LOG2E = 1.4426950408889634


@triton.jit
def _seq_keys(cu_seqlens_k, seq, world_size, KV_ZIGZAG: tl.constexpr, INT64_KV: tl.constexpr):
    """First stored K/V row of sequence ``seq``, its zigzag chunk size and its key count."""
    k_row0 = tl.load(cu_seqlens_k + seq)
    len_k_stored = tl.load(cu_seqlens_k + seq + 1) - k_row0
    if INT64_KV:
        k_row0 = k_row0.to(tl.int64)
    if KV_ZIGZAG:
        chunk = len_k_stored // 2          # local length = 2 chunks
        len_k = chunk * 2 * world_size     # global length
    else:
        chunk = len_k_stored * 0 + 1
        len_k = len_k_stored
    return k_row0, chunk, len_k


@triton.jit
def _group_rows(cu_seqlens_q0, cu_seqlens_q1, seq, LOCAL_ORDER: tl.constexpr):
    """``(row0, len0, row1, len1)``: first row and row count of each group's part of ``seq``."""
    start0 = tl.load(cu_seqlens_q0 + seq)
    len0 = tl.load(cu_seqlens_q0 + seq + 1) - start0
    start1 = tl.load(cu_seqlens_q1 + seq)
    len1 = tl.load(cu_seqlens_q1 + seq + 1) - start1
    if LOCAL_ORDER:
        row0 = start0 + start1
        row1 = row0 + len0
    else:
        row0 = start0
        row1 = start1
    return row0, len0, row1, len1


@triton.jit
def _group_kv_end(kv_end_ptr, seq, chunk, len_k, KV_END_SCALAR: tl.constexpr,
                  KV_END_IN_CHUNKS: tl.constexpr):
    """Keys one group sees in ``seq``, clamped to ``[0, len_k]`` exactly as the forward does."""
    if KV_END_SCALAR:
        end = kv_end_ptr
    else:
        end = tl.load(kv_end_ptr + seq)
    if KV_END_IN_CHUNKS:
        end = end * chunk
    return tl.minimum(tl.maximum(end, 0), len_k)


@triton.jit
def _load_rows(T, row0, offs_m, len_q, head, stride_m, stride_h, offs_d, head_dim,
               EVEN_D: tl.constexpr, TRANSPOSED: tl.constexpr):
    """Rows ``row0 + offs_m`` of one head: ``[BLOCK_M, BLOCK_D]`` (``[BLOCK_D, BLOCK_M]``
    transposed); rows at or past ``len_q`` read as 0."""
    rows = (row0 + offs_m).to(tl.int64)
    ok = offs_m < len_q
    if TRANSPOSED:
        ptrs = T + rows[None, :] * stride_m + head * stride_h + offs_d[:, None]
        mask = ok[None, :] if EVEN_D else ok[None, :] & (offs_d[:, None] < head_dim)
    else:
        ptrs = T + rows[:, None] * stride_m + head * stride_h + offs_d[None, :]
        mask = ok[:, None] if EVEN_D else ok[:, None] & (offs_d[None, :] < head_dim)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _load_lse2(Lse, row0, offs_m, len_q, head, stride_lse_h):
    """LSE of rows ``row0 + offs_m`` in base 2; ``+inf`` for rows that saw no key (-inf) and rows
    past ``len_q``, so that their ``P = exp2(s - lse)`` is exactly 0."""
    lse = tl.load(Lse + head * stride_lse_h + (row0 + offs_m).to(tl.int64), mask=offs_m < len_q,
                  other=float("inf"))
    return tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)


@triton.jit
def _load_kv_block(K, V, rows, in_range, stride_kn, stride_vn, offs_d, head_dim,
                   EVEN_D: tl.constexpr, TRANSPOSED: tl.constexpr):
    """K and V at buffer ``rows``: ``[BLOCK_N, BLOCK_D]`` each (``[BLOCK_D, BLOCK_N]``
    transposed); keys outside ``in_range`` read as 0."""
    if TRANSPOSED:
        mask = in_range[None, :] if EVEN_D else in_range[None, :] & (offs_d[:, None] < head_dim)
        k = tl.load(K + rows[None, :] * stride_kn + offs_d[:, None], mask=mask, other=0.0)
        v = tl.load(V + rows[None, :] * stride_vn + offs_d[:, None], mask=mask, other=0.0)
    else:
        mask = in_range[:, None] if EVEN_D else in_range[:, None] & (offs_d[None, :] < head_dim)
        k = tl.load(K + rows[:, None] * stride_kn + offs_d[None, :], mask=mask, other=0.0)
        v = tl.load(V + rows[:, None] * stride_vn + offs_d[None, :], mask=mask, other=0.0)
    return k, v


@triton.jit
def _zero_rows(T, lo, hi, head, stride_m, stride_h, offs_d, head_dim, first, step,
               BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """Write 0 to rows ``[lo, hi)`` of one head, blocks ``first, first + step, ...`` of them
    (a grid-stride loop over the programs of one grid slice)."""
    offs = tl.arange(0, BLOCK)
    zero = tl.zeros([BLOCK, BLOCK_D], dtype=T.dtype.element_ty)
    for start in range(lo + first * BLOCK, hi, step * BLOCK):
        rows = start + offs
        mask = (rows < hi)[:, None] & (offs_d[None, :] < head_dim)
        tl.store(T + rows.to(tl.int64)[:, None] * stride_m + head * stride_h + offs_d[None, :],
                 zero, mask=mask)


@triton.jit
def _dq_update(dq, q, do, lse2, delta, k_t, v_t, qk_scale, offs_m, offs_n, diag, kv_end,
               MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One key tile into one group's dQ accumulator (unscaled: ``sum dS K``).

    dq [BLOCK_M, BLOCK_D] fp32, q/do [BLOCK_M, BLOCK_D], lse2/delta [BLOCK_M] fp32,
    k_t/v_t [BLOCK_D, BLOCK_N]. Row ``i`` sees key ``j`` iff ``j <= i + diag`` and ``j < kv_end``.
    """
    p = tl.math.exp2(tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale - lse2[:, None])
    if MASKED:
        visible = (offs_n[None, :] <= offs_m[:, None] + diag) & (offs_n[None, :] < kv_end)
        p = tl.where(visible, p, 0.0)
    ds = p * (tl.dot(do, v_t, input_precision=DOT_PRECISION) - delta[:, None])
    return dq + tl.dot(ds.to(k_t.dtype), tl.trans(k_t), input_precision=DOT_PRECISION)


@triton.jit
def _dq_tiles(dq0, q0, do0, lse0, delta0, diag0, end0, dq1, q1, do1, lse1, delta1, diag1, end1,
              lo, hi, qk_scale, offs_m,
              K, V, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn, offs_d, head_dim,
              TWO: tl.constexpr, MASKED: tl.constexpr, BLOCK_N: tl.constexpr,
              EVEN_D: tl.constexpr, KV_ZIGZAG: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Key tiles ``[lo, hi)`` into group 0's dQ and, with ``TWO``, group 1's: each tile loaded
    once. (For one group alone the caller passes it as group 0.)"""
    kv_end = tl.maximum(end0, end1) if TWO else end0
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        rows = _kv_rows(start_n, k_row0, chunk, rank_rows, world_size, BLOCK_N, KV_ZIGZAG)
        k_t, v_t = _load_kv_block(K, V, rows, offs_n < kv_end, stride_kn, stride_vn, offs_d,
                                  head_dim, EVEN_D, True)
        dq0 = _dq_update(dq0, q0, do0, lse0, delta0, k_t, v_t, qk_scale, offs_m, offs_n,
                         diag0, end0, MASKED, DOT_PRECISION)
        if TWO:
            dq1 = _dq_update(dq1, q1, do1, lse1, delta1, k_t, v_t, qk_scale, offs_m, offs_n,
                             diag1, end1, MASKED, DOT_PRECISION)
    return dq0, dq1


@triton.jit
def _dq_alone(dq, q, do, lse, delta, diag, end, lo, full, hi, qk_scale, offs_m,
              K, V, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn, offs_d, head_dim,
              BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, KV_ZIGZAG: tl.constexpr,
              DOT_PRECISION: tl.constexpr):
    """One group's tiles past the shared range: ``[lo, full)`` unmasked, then ``[.., hi)`` masked
    (the forward's ``_attend_alone``)."""
    split = tl.maximum(lo, full)
    dq, _ = _dq_tiles(dq, q, do, lse, delta, diag, end, dq, q, do, lse, delta, diag, end,
                      lo, split, qk_scale, offs_m, K, V, k_row0, chunk, rank_rows, world_size,
                      stride_kn, stride_vn, offs_d, head_dim, False, False, BLOCK_N, EVEN_D,
                      KV_ZIGZAG, DOT_PRECISION)
    dq, _ = _dq_tiles(dq, q, do, lse, delta, diag, end, dq, q, do, lse, delta, diag, end,
                      split, hi, qk_scale, offs_m, K, V, k_row0, chunk, rank_rows, world_size,
                      stride_kn, stride_vn, offs_d, head_dim, False, True, BLOCK_N, EVEN_D,
                      KV_ZIGZAG, DOT_PRECISION)
    return dq


@triton.jit
def _group_delta(O, DO, Delta, row0, offs_m, len_q, head, stride_om, stride_oh, stride_dom,
                 stride_doh, stride_delta_h, offs_d, head_dim, EVEN_D: tl.constexpr):
    """``delta = rowsum(dO * O)`` in fp32 for one group's M-block, stored for the dK/dV kernel."""
    o = _load_rows(O, row0, offs_m, len_q, head, stride_om, stride_oh, offs_d, head_dim,
                   EVEN_D, False)
    do = _load_rows(DO, row0, offs_m, len_q, head, stride_dom, stride_doh, offs_d, head_dim,
                    EVEN_D, False)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    tl.store(Delta + head * stride_delta_h + (row0 + offs_m).to(tl.int64), delta,
             mask=offs_m < len_q)
    return do, delta


@triton.jit
def _store_dq(DQ, dq, row0, offs_m, len_q, head, stride_m, stride_h, offs_d, head_dim,
              sm_scale):
    rows = (row0 + offs_m).to(tl.int64)
    mask = (offs_m < len_q)[:, None] & (offs_d[None, :] < head_dim)
    tl.store(DQ + rows[:, None] * stride_m + head * stride_h + offs_d[None, :],
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=mask)


@triton.jit
def _dual_group_bwd_dq_kernel(
    Q0, Q1, K, V, O0, O1, DO0, DO1, Lse0, Lse1, Delta0, Delta1, DQ0, DQ1,
    cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
    sm_scale, rank_rows, world_size, rows_dq0, rows_dq1,
    stride_q0m, stride_q0h, stride_q1m, stride_q1h, stride_kn, stride_kh, stride_vn, stride_vh,
    stride_o0m, stride_o0h, stride_o1m, stride_o1h, stride_do0m, stride_do0h,
    stride_do1m, stride_do1h, stride_dq0m, stride_dq0h, stride_dq1m, stride_dq1h,
    stride_lse0_h, stride_lse1_h, stride_delta0_h, stride_delta1_h,
    head_dim, kv_group,
    IS_CAUSAL: tl.constexpr, KV_ZIGZAG: tl.constexpr, LOCAL_ORDER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    INT64_KV: tl.constexpr, KV_END_SCALAR: tl.constexpr, KV_END_IN_CHUNKS: tl.constexpr,
    DELTA_ONLY: tl.constexpr, ONE_GROUP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # tl.dot's input_precision: "ieee" or "tf32" (fp32 inputs only)
):
    """Grid ``(nheads, m-blocks, batch + 1)`` (``2 * batch + 1`` with ``ONE_GROUP``); the last
    slice zeroes dQ rows of no sequence. ``DELTA_ONLY``: only the preprocess (dQ then comes from
    the dK/dV kernel's atomics). ``ONE_GROUP``: a program per (sequence, group) M-block, group 1
    (the longer in zigzag) first: one dQ accumulator instead of two (the forward's one_group)."""
    head = tl.program_id(0)
    if ONE_GROUP:
        seq = tl.program_id(2) // 2
        second = tl.program_id(2) % 2 == 0
        batch = (tl.num_programs(2) - 1) // 2
    else:
        seq = tl.program_id(2)
        batch = tl.num_programs(2) - 1
    offs_d = tl.arange(0, BLOCK_D)
    if seq == batch and DELTA_ONLY:
        return
    if seq == batch:
        row0 = tl.load(cu_seqlens_q0 + batch)  # where rows of no sequence begin
        row1 = tl.load(cu_seqlens_q1 + batch)
        if LOCAL_ORDER:
            row0 += row1
        _zero_rows(DQ0, row0, rows_dq0, head, stride_dq0m, stride_dq0h, offs_d, head_dim,
                   tl.program_id(1), tl.num_programs(1), BLOCK_M, BLOCK_D)
        if not LOCAL_ORDER:
            _zero_rows(DQ1, row1, rows_dq1, head, stride_dq1m, stride_dq1h, offs_d, head_dim,
                       tl.program_id(1), tl.num_programs(1), BLOCK_M, BLOCK_D)
        return
    # Last M-blocks first: under a causal mask they have the most keys.
    start_m = tl.num_programs(1) - 1 - tl.program_id(1)
    kv_head = head // kv_group
    k_row0, chunk, len_k = _seq_keys(cu_seqlens_k, seq, world_size, KV_ZIGZAG, INT64_KV)
    end0 = _group_kv_end(kv_end0, seq, chunk, len_k, KV_END_SCALAR, KV_END_IN_CHUNKS)
    end1 = _group_kv_end(kv_end1, seq, chunk, len_k, KV_END_SCALAR, KV_END_IN_CHUNKS)
    row0, len0, row1, len1 = _group_rows(cu_seqlens_q0, cu_seqlens_q1, seq, LOCAL_ORDER)
    m0 = start_m * BLOCK_M
    if ONE_GROUP:
        row = tl.where(second, row1, row0)
        len_q = tl.where(second, len1, len0)
        end = tl.where(second, end1, end0)
        if m0 >= len_q:
            return
        offs_m = m0 + tl.arange(0, BLOCK_M)
        diag, full, hi = _key_bounds(len_q, end, m0, IS_CAUSAL, BLOCK_M, BLOCK_N)
        do, delta = _group_delta(tl.where(second, O1, O0), tl.where(second, DO1, DO0),
                                 tl.where(second, Delta1, Delta0), row, offs_m, len_q, head,
                                 tl.where(second, stride_o1m, stride_o0m),
                                 tl.where(second, stride_o1h, stride_o0h),
                                 tl.where(second, stride_do1m, stride_do0m),
                                 tl.where(second, stride_do1h, stride_do0h),
                                 tl.where(second, stride_delta1_h, stride_delta0_h), offs_d,
                                 head_dim, EVEN_D)
        if DELTA_ONLY:
            return
        q = _load_rows(tl.where(second, Q1, Q0), row, offs_m, len_q, head,
                       tl.where(second, stride_q1m, stride_q0m),
                       tl.where(second, stride_q1h, stride_q0h), offs_d, head_dim, EVEN_D, False)
        lse = _load_lse2(tl.where(second, Lse1, Lse0), row, offs_m, len_q, head,
                         tl.where(second, stride_lse1_h, stride_lse0_h))
        K += kv_head * stride_kh
        V += kv_head * stride_vh
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        dq = _dq_alone(dq, q, do, lse, delta, diag, end, 0, full, hi, sm_scale * 1.4426950408889634,
                       offs_m, K, V, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn,
                       offs_d, head_dim, BLOCK_N, EVEN_D, KV_ZIGZAG, DOT_PRECISION)
        _store_dq(tl.where(second, DQ1, DQ0), dq, row, offs_m, len_q, head,
                  tl.where(second, stride_dq1m, stride_dq0m),
                  tl.where(second, stride_dq1h, stride_dq0h), offs_d, head_dim, sm_scale)
        return
    if m0 >= tl.maximum(len0, len1):
        return
    offs_m = m0 + tl.arange(0, BLOCK_M)
    diag0, full0, hi0 = _key_bounds(len0, end0, m0, IS_CAUSAL, BLOCK_M, BLOCK_N)
    diag1, full1, hi1 = _key_bounds(len1, end1, m0, IS_CAUSAL, BLOCK_M, BLOCK_N)

    do0, delta0 = _group_delta(O0, DO0, Delta0, row0, offs_m, len0, head, stride_o0m, stride_o0h,
                               stride_do0m, stride_do0h, stride_delta0_h, offs_d, head_dim, EVEN_D)
    do1, delta1 = _group_delta(O1, DO1, Delta1, row1, offs_m, len1, head, stride_o1m, stride_o1h,
                               stride_do1m, stride_do1h, stride_delta1_h, offs_d, head_dim, EVEN_D)
    if DELTA_ONLY:
        return
    q0 = _load_rows(Q0, row0, offs_m, len0, head, stride_q0m, stride_q0h, offs_d, head_dim,
                    EVEN_D, False)
    q1 = _load_rows(Q1, row1, offs_m, len1, head, stride_q1m, stride_q1h, offs_d, head_dim,
                    EVEN_D, False)
    lse0 = _load_lse2(Lse0, row0, offs_m, len0, head, stride_lse0_h)
    lse1 = _load_lse2(Lse1, row1, offs_m, len1, head, stride_lse1_h)

    K += kv_head * stride_kh
    V += kv_head * stride_vh
    qk_scale = sm_scale * 1.4426950408889634
    dq0 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq1 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # The forward's regions: shared tiles unmasked, shared tiles masked, then each group alone.
    both_full = tl.minimum(full0, full1)
    shared_end = tl.cdiv(tl.minimum(hi0, hi1), BLOCK_N) * BLOCK_N
    dq0, dq1 = _dq_tiles(dq0, q0, do0, lse0, delta0, diag0, end0,
                         dq1, q1, do1, lse1, delta1, diag1, end1, 0, both_full, qk_scale, offs_m,
                         K, V, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn,
                         offs_d, head_dim, True, False, BLOCK_N, EVEN_D, KV_ZIGZAG, DOT_PRECISION)
    dq0, dq1 = _dq_tiles(dq0, q0, do0, lse0, delta0, diag0, end0,
                         dq1, q1, do1, lse1, delta1, diag1, end1, both_full, shared_end, qk_scale,
                         offs_m, K, V, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn,
                         offs_d, head_dim, True, True, BLOCK_N, EVEN_D, KV_ZIGZAG, DOT_PRECISION)
    # Group 0 alone (unmasked then masked), stored; then group 1 alone.
    dq0 = _dq_alone(dq0, q0, do0, lse0, delta0, diag0, end0, shared_end, full0, hi0, qk_scale,
                    offs_m, K, V, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn,
                    offs_d, head_dim, BLOCK_N, EVEN_D, KV_ZIGZAG, DOT_PRECISION)
    _store_dq(DQ0, dq0, row0, offs_m, len0, head, stride_dq0m, stride_dq0h, offs_d, head_dim,
              sm_scale)
    dq1 = _dq_alone(dq1, q1, do1, lse1, delta1, diag1, end1, shared_end, full1, hi1, qk_scale,
                    offs_m, K, V, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn,
                    offs_d, head_dim, BLOCK_N, EVEN_D, KV_ZIGZAG, DOT_PRECISION)
    _store_dq(DQ1, dq1, row1, offs_m, len1, head, stride_dq1m, stride_dq1h, offs_d, head_dim,
              sm_scale)


@triton.jit
def _dkdv_rows(dk, dv, k, v, Q, DO, Lse, Delta, DQA, row0, len_q, head, lo, hi, offs_n, diag,
               kv_end, qk_scale, sm_scale, stride_qm, stride_qh, stride_dom, stride_doh,
               stride_lse_h, stride_delta_h, stride_dqam, stride_dqah, offs_d, head_dim,
               MASKED: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_D: tl.constexpr,
               ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Query rows ``[lo, hi)`` of one group and q head into the tile's dK/dV accumulators.

    dk/dv [BLOCK_N, BLOCK_D] fp32 (dk unscaled), k/v [BLOCK_N, BLOCK_D]. Row ``i`` sees key
    ``j`` iff ``j <= i + diag`` and ``j < kv_end``; computed transposed (keys x rows).
    ``ATOMIC_DQ``: also add this tile's ``scale * dS K`` to the fp32 dQ accumulator ``DQA``."""
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_t = _load_rows(Q, row0, offs_m, len_q, head, stride_qm, stride_qh, offs_d, head_dim,
                         EVEN_D, True)
        do = _load_rows(DO, row0, offs_m, len_q, head, stride_dom, stride_doh, offs_d, head_dim,
                        EVEN_D, False)
        lse = _load_lse2(Lse, row0, offs_m, len_q, head, stride_lse_h)
        delta = tl.load(Delta + head * stride_delta_h + (row0 + offs_m).to(tl.int64),
                        mask=offs_m < len_q, other=0.0)
        p_t = tl.math.exp2(tl.dot(k, q_t, input_precision=DOT_PRECISION) * qk_scale
                           - lse[None, :])
        if MASKED:
            visible = (offs_n[:, None] <= offs_m[None, :] + diag) & (offs_n[:, None] < kv_end)
            p_t = tl.where(visible, p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)
        ds_t = p_t * (tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION) - delta[None, :])
        dk += tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), input_precision=DOT_PRECISION)
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(ds_t * sm_scale).to(k.dtype), k, input_precision=DOT_PRECISION)
            rows = (row0 + offs_m).to(tl.int64)
            tl.atomic_add(DQA + rows[:, None] * stride_dqam + head * stride_dqah + offs_d[None, :],
                          dq, mask=(offs_m < len_q)[:, None] & (offs_d[None, :] < head_dim),
                          sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_group(dk, dv, k, v, Q, DO, Lse, Delta, DQA, row0, len_q, kv_end, head, n0, offs_n,
                qk_scale, sm_scale, stride_qm, stride_qh, stride_dom, stride_doh, stride_lse_h,
                stride_delta_h, stride_dqam, stride_dqah, offs_d, head_dim,
                IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                EVEN_D: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One group's rows that see keys ``[n0, n0 + BLOCK_N)``: masked M-blocks (the diagonal, or
    every block when the tile crosses ``kv_end``), then the unmasked ones."""
    if IS_CAUSAL:
        diag = kv_end - len_q
        lo = tl.maximum(n0 - diag, 0)               # first row that sees key n0
        full = n0 + BLOCK_N - 1 - diag              # rows from here see the whole tile
    else:
        diag = kv_end
        lo = n0 * 0
        full = lo
    lo = (lo // BLOCK_M) * BLOCK_M
    hi = tl.where(n0 < kv_end, len_q, 0)
    full = tl.where(n0 + BLOCK_N <= kv_end, tl.cdiv(tl.maximum(full, 0), BLOCK_M) * BLOCK_M, hi)
    full = tl.maximum(lo, tl.minimum(full, hi))
    dk, dv = _dkdv_rows(dk, dv, k, v, Q, DO, Lse, Delta, DQA, row0, len_q, head, lo, full,
                        offs_n, diag, kv_end, qk_scale, sm_scale, stride_qm, stride_qh,
                        stride_dom, stride_doh, stride_lse_h, stride_delta_h, stride_dqam,
                        stride_dqah, offs_d, head_dim, True, BLOCK_M, EVEN_D, ATOMIC_DQ,
                        DOT_PRECISION)
    dk, dv = _dkdv_rows(dk, dv, k, v, Q, DO, Lse, Delta, DQA, row0, len_q, head, full, hi,
                        offs_n, diag, kv_end, qk_scale, sm_scale, stride_qm, stride_qh,
                        stride_dom, stride_doh, stride_lse_h, stride_delta_h, stride_dqam,
                        stride_dqah, offs_d, head_dim, False, BLOCK_M, EVEN_D, ATOMIC_DQ,
                        DOT_PRECISION)
    return dk, dv


@triton.jit
def _dual_group_bwd_dkdv_kernel(
    Q0, Q1, K, V, DO0, DO1, Lse0, Lse1, Delta0, Delta1, DK, DV, DQA0, DQA1,
    cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
    sm_scale, rank_rows, world_size,
    stride_q0m, stride_q0h, stride_q1m, stride_q1h, stride_kn, stride_kh, stride_vn, stride_vh,
    stride_do0m, stride_do0h, stride_do1m, stride_do1h, stride_dkn, stride_dkh,
    stride_dvn, stride_dvh, stride_lse0_h, stride_lse1_h, stride_delta0_h, stride_delta1_h,
    stride_dqa0m, stride_dqa0h, stride_dqa1m, stride_dqa1h,
    head_dim, kv_group,
    IS_CAUSAL: tl.constexpr, KV_ZIGZAG: tl.constexpr, LOCAL_ORDER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    INT64_KV: tl.constexpr, KV_END_SCALAR: tl.constexpr, KV_END_IN_CHUNKS: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # tl.dot's input_precision: "ieee" or "tf32" (fp32 inputs only)
):
    """Grid ``(key blocks, nheads_k, batch + 1)``: key blocks fastest, so the programs that
    stream the same q heads' rows run together (L2 reuse). The last slice zeroes the K/V rows
    of no sequence (per rank in zigzag mode; ``rank_rows`` = all rows otherwise)."""
    kv_head = tl.program_id(1)
    seq = tl.program_id(2)
    batch = tl.num_programs(2) - 1
    offs_d = tl.arange(0, BLOCK_D)
    if seq == batch:
        tail0 = tl.load(cu_seqlens_k + batch)
        for rank in range(0, world_size):
            lo = rank * rank_rows + tail0
            _zero_rows(DK, lo, (rank + 1) * rank_rows, kv_head, stride_dkn, stride_dkh, offs_d,
                       head_dim, tl.program_id(0), tl.num_programs(0), BLOCK_N, BLOCK_D)
            _zero_rows(DV, lo, (rank + 1) * rank_rows, kv_head, stride_dvn, stride_dvh, offs_d,
                       head_dim, tl.program_id(0), tl.num_programs(0), BLOCK_N, BLOCK_D)
        return
    k_row0, chunk, len_k = _seq_keys(cu_seqlens_k, seq, world_size, KV_ZIGZAG, INT64_KV)
    end0 = _group_kv_end(kv_end0, seq, chunk, len_k, KV_END_SCALAR, KV_END_IN_CHUNKS)
    end1 = _group_kv_end(kv_end1, seq, chunk, len_k, KV_END_SCALAR, KV_END_IN_CHUNKS)
    row0, len0, row1, len1 = _group_rows(cu_seqlens_q0, cu_seqlens_q1, seq, LOCAL_ORDER)
    K += kv_head * stride_kh
    V += kv_head * stride_vh
    DK += kv_head * stride_dkh
    DV += kv_head * stride_dvh
    qk_scale = sm_scale * 1.4426950408889634
    # Grid-stride over key blocks: one pass when the grid covers max_seqlen_k, and every key is
    # still written if a caller's max_seqlen_k is too small.
    for n0 in range(tl.program_id(0) * BLOCK_N, len_k, tl.num_programs(0) * BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        in_range = offs_n < len_k
        rows = _kv_rows(n0, k_row0, chunk, rank_rows, world_size, BLOCK_N, KV_ZIGZAG)
        k, v = _load_kv_block(K, V, rows, in_range, stride_kn, stride_vn, offs_d, head_dim,
                              EVEN_D, False)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        for h in range(0, kv_group):
            head = kv_head * kv_group + h
            dk, dv = _dkdv_group(dk, dv, k, v, Q0, DO0, Lse0, Delta0, DQA0, row0, len0, end0,
                                 head, n0, offs_n, qk_scale, sm_scale, stride_q0m, stride_q0h,
                                 stride_do0m, stride_do0h, stride_lse0_h, stride_delta0_h,
                                 stride_dqa0m, stride_dqa0h, offs_d, head_dim,
                                 IS_CAUSAL, BLOCK_M, BLOCK_N, EVEN_D, ATOMIC_DQ,
                                 DOT_PRECISION)
            dk, dv = _dkdv_group(dk, dv, k, v, Q1, DO1, Lse1, Delta1, DQA1, row1, len1, end1,
                                 head, n0, offs_n, qk_scale, sm_scale, stride_q1m, stride_q1h,
                                 stride_do1m, stride_do1h, stride_lse1_h, stride_delta1_h,
                                 stride_dqa1m, stride_dqa1h, offs_d, head_dim,
                                 IS_CAUSAL, BLOCK_M, BLOCK_N, EVEN_D, ATOMIC_DQ,
                                 DOT_PRECISION)
        mask = in_range[:, None] & (offs_d[None, :] < head_dim)
        tl.store(DK + rows[:, None] * stride_dkn + offs_d[None, :],
                 (dk * sm_scale).to(DK.dtype.element_ty), mask=mask)
        tl.store(DV + rows[:, None] * stride_dvn + offs_d[None, :],
                 dv.to(DV.dtype.element_ty), mask=mask)


def launch_dual_group_bwd(
    q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, delta0, delta1, dq0, dq1, dk, dv,
    cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
    *, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, config,
    zigzag_world_size: int = 0, local_order: bool = False,
) -> None:
    """Launch the dQ kernel (which also fills ``delta0/1``) and then the dK/dV kernel.

    All checks are the caller's. ``kv_end*``: both ints (the same for every sequence) or int32
    ``[batch]`` tensors; with ``local_order`` (the zigzag twin) ints counting each sequence's
    chunks. ``delta*``: float32 scratch shaped like ``lse*``. ``zigzag_world_size > 0`` reads
    ``k, v`` (and writes ``dk, dv``) as the zigzag all-gather buffer, ``cu_seqlens_k`` LOCAL.
    ``max_seqlen_q`` bounds both groups' row counts, ``max_seqlen_k`` the key counts (global in
    zigzag mode): they size the grids. Every element of dq*, dk, dv is written.
    """
    batch = cu_seqlens_q0.shape[0] - 1
    nheads, head_dim = q0.shape[1], q0.shape[2]
    nheads_k = k.shape[1]
    block_d = max(16, next_pow2(head_dim))
    zigzag = zigzag_world_size > 0
    world = max(zigzag_world_size, 1)
    rank_rows = k.shape[0] // world
    common = dict(
        IS_CAUSAL=causal, KV_ZIGZAG=zigzag, LOCAL_ORDER=local_order, BLOCK_D=block_d,
        EVEN_D=block_d == head_dim,
        INT64_KV=config.int64_kv_offsets or any(_max_offset(t) >= 2**31 for t in (k, v, dk, dv)),
        KV_END_SCALAR=isinstance(kv_end0, int), KV_END_IN_CHUNKS=local_order,
        DOT_PRECISION=dot_input_precision(q0.dtype))  # fp32 dots as PyTorch would
    atomic = config.atomic_dq
    if atomic:  # fp32 accumulators the dK/dV kernel adds into (one for the local order)
        dqa0 = torch.zeros(dq0.shape, dtype=torch.float32, device=dq0.device)
        dqa1 = dqa0 if dq1 is dq0 else torch.zeros(dq1.shape, dtype=torch.float32,
                                                   device=dq1.device)
    else:
        dqa0, dqa1 = delta0, delta1  # unused
    dq_grid = (nheads, max(1, triton.cdiv(max_seqlen_q, config.dq_block_m)),
               batch * (2 if config.dq_one_group else 1) + 1)
    _dual_group_bwd_dq_kernel[dq_grid](
        q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, delta0, delta1, dq0, dq1,
        cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
        softmax_scale, rank_rows, world, dq0.shape[0], dq1.shape[0],
        *q0.stride()[:2], *q1.stride()[:2], *k.stride()[:2], *v.stride()[:2],
        *out0.stride()[:2], *out1.stride()[:2], *dout0.stride()[:2], *dout1.stride()[:2],
        *dq0.stride()[:2], *dq1.stride()[:2], lse0.stride(0), lse1.stride(0),
        delta0.stride(0), delta1.stride(0), head_dim, nheads // nheads_k,
        BLOCK_M=config.dq_block_m, BLOCK_N=config.dq_block_n, DELTA_ONLY=atomic,
        ONE_GROUP=config.dq_one_group, **common,
        num_warps=config.dq_num_warps, num_stages=config.dq_num_stages)
    dkdv_grid = (max(1, triton.cdiv(max_seqlen_k, config.dkdv_block_n)), nheads_k, batch + 1)
    _dual_group_bwd_dkdv_kernel[dkdv_grid](
        q0, q1, k, v, dout0, dout1, lse0, lse1, delta0, delta1, dk, dv, dqa0, dqa1,
        cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
        softmax_scale, rank_rows, world,
        *q0.stride()[:2], *q1.stride()[:2], *k.stride()[:2], *v.stride()[:2],
        *dout0.stride()[:2], *dout1.stride()[:2], *dk.stride()[:2], *dv.stride()[:2],
        lse0.stride(0), lse1.stride(0), delta0.stride(0), delta1.stride(0),
        *_row_strides(dqa0), *_row_strides(dqa1), head_dim, nheads // nheads_k,
        BLOCK_M=config.dkdv_block_m, BLOCK_N=config.dkdv_block_n, ATOMIC_DQ=atomic, **common,
        num_warps=config.dkdv_num_warps, num_stages=config.dkdv_num_stages)
    if atomic:
        dq0.copy_(dqa0)
        if dq1 is not dq0:
            dq1.copy_(dqa1)


def _row_strides(t) -> tuple[int, int]:
    return (t.stride(0), t.stride(1)) if t.dim() == 3 else (0, 0)
