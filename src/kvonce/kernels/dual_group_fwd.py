"""Fused dual-group varlen attention forward (zigzag llama3 context parallelism).

One program owns one M-block of group-0 query rows and the matching M-block of group-1 rows of one
(sequence, q head). It walks the key tiles of that sequence once, up to the larger of the two
groups' visible ranges, and feeds every tile it loads to each group that needs it:

    keys:   0 ........................ hi0 ....................... hi1
    q0:     [ both, no mask ][ both, masked ]
    q1:     [ both, no mask ][ both, masked ][ q1 alone, no mask ][ q1 alone, masked ]

The region bounds are run-time values (they depend on the sequence and the M-block), so the kernel
calls one loop helper per region: shared tiles go to two online-softmax states, the tail of the
longer group to one.

Softmax runs in base 2 (``log2(e)`` folded into the scale once, ``exp2`` throughout); running
maxima stay in base-2 units and only the stored LSE is converted: ``lse = (m + log2(l)) * ln 2``.

K/V can be read in two layouts (``KV_ZIGZAG``):
- contiguous: sequence ``b``'s key ``j`` is row ``cu_seqlens_k[b] + j``;
- zigzag all-gather buffer: ``world_size`` ranks' local buffers back to back (``rank_rows`` rows
  each); rank ``r`` holds chunks ``r`` and ``2 * world_size - 1 - r`` of every sequence, so key
  ``j`` of sequence ``b`` (chunk size ``c``) is found at
  ``rank * rank_rows + cu_seqlens_k_local[b] + (j % c) + (c if late chunk else 0)``.
  The kernel reads the gathered buffer where it lies; nothing is copied into contiguous order.
"""
from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from ._launch import alignment_key, dot_input_precision, launch, next_pow2


@triton.jit
def _softmax_step(qk, m_i, l_i, qk_scale, offs_m, offs_n, diag, kv_end, MASKED: tl.constexpr,
                  KEYS_AXIS: tl.constexpr = 1, ROW_SCALE: tl.constexpr = False):
    """Raw scores ``qk [BLOCK_M, BLOCK_N]`` (fp32, before the softmax scale) of one key tile into
    the online-softmax state (base 2): returns ``(p, alpha, m_new, l_new)``, ``p`` the tile's
    unnormalized probabilities and ``alpha`` the factor that rescales the running output.
    Row ``i`` sees key ``j`` iff ``j <= i + diag`` and ``j < kv_end`` (checked with MASKED).
    KEYS_AXIS 0: the scores come transposed, ``[BLOCK_N, BLOCK_M]`` (the decode's swapped dots),
    and so does ``p``. ROW_SCALE: ``qk_scale`` is a ``[BLOCK_M]`` vector, one scale per row (the
    decode's power-of-two row factors, ``paged_decode._f16_rows``), else a scalar."""
    if ROW_SCALE:
        scale = tl.expand_dims(qk_scale, KEYS_AXIS)
    else:
        scale = qk_scale
    if KEYS_AXIS == 1:
        rows = offs_m[:, None]
        keys = offs_n[None, :]
    else:
        rows = offs_m[None, :]
        keys = offs_n[:, None]
    if MASKED:
        visible = (keys <= rows + diag) & (keys < kv_end)
        qk = tl.where(visible, qk * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, KEYS_AXIS))
        # A row with no visible key so far keeps m = -inf; subtract 0 instead so that
        # exp2(-inf - -inf) never makes a NaN.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - tl.expand_dims(m_sub, KEYS_AXIS))
    else:
        m_new = tl.maximum(m_i, tl.max(qk, KEYS_AXIS) * qk_scale)
        m_sub = m_new
        p = tl.math.exp2(qk * scale - tl.expand_dims(m_sub, KEYS_AXIS))
    alpha = tl.math.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, KEYS_AXIS)
    return p, alpha, m_new, l_i


@triton.jit
def _online_update(acc, m_i, l_i, q, k_t, v, qk_scale, offs_m, offs_n, diag, kv_end,
                   MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, k_scale=1.0, v_scale=1.0,
                   KEY_SCALES: tl.constexpr = False, ROW_SCALE: tl.constexpr = False,
                   qk_bias=0.0, HAS_BIAS: tl.constexpr = False):
    """One key tile into one online-softmax state (base 2).

    acc [BLOCK_M, BLOCK_D] fp32, m_i/l_i [BLOCK_M] fp32, q [BLOCK_M, BLOCK_D],
    k_t [BLOCK_D, BLOCK_N] (K transposed), v [BLOCK_N, BLOCK_D].
    Row ``i`` sees key ``j`` iff ``j <= i + diag`` and ``j < kv_end``.
    With KEY_SCALES, ``k_scale``/``v_scale [BLOCK_N]`` (fp32) are per-key dequantization scales
    of a quantized K/V tile, applied to the scores' and the probabilities' columns (BLOCK_M x
    BLOCK_N multiplies instead of BLOCK_D x BLOCK_N on the tiles; fp16 tiles take the V scales
    over the tile's largest, which multiplies the fp32 products). (A flag, not ``is None``: a
    None default reaches a nested jit function as a constexpr, which ``is not None``.)
    ROW_SCALE: ``qk_scale [BLOCK_M]``, one per row (``_softmax_step``). HAS_BIAS: ``qk_bias
    [BLOCK_M, BLOCK_N]`` fp32 added to the scores after the key scales (outlier channels:
    ``paged_outliers``).
    """
    qk = tl.dot(q, k_t, input_precision=DOT_PRECISION)
    if KEY_SCALES:
        qk = qk * k_scale[None, :]
    if HAS_BIAS:
        qk = qk + qk_bias
    p, alpha, m_new, l_i = _softmax_step(qk, m_i, l_i, qk_scale, offs_m, offs_n, diag, kv_end,
                                         MASKED, ROW_SCALE=ROW_SCALE)
    if KEY_SCALES and v.dtype == tl.float16:
        # fp16 probabilities times the V scales: over the tile's largest scale (<= 1), which
        # comes back on the fp32 products, so small values (|v| < ~1e-2: p x scale among fp16's
        # subnormals) keep their precision
        top = tl.max(v_scale, 0)
        top = tl.where(top > 0.0, top, 1.0)  # every key past kv_end: all zero
        pv = tl.dot((p * (v_scale * (1.0 / top))[None, :]).to(v.dtype), v,
                    input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv * top
    elif KEY_SCALES:
        acc = acc * alpha[:, None] + tl.dot((p * v_scale[None, :]).to(v.dtype), v,
                                            input_precision=DOT_PRECISION)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _zigzag_chunk_base(j, k_row0, chunk, rank_rows, world_size):
    """Row of key 0 of global chunk ``j``'s rank-local copy, minus ``j * chunk`` (so that key
    position ``n`` of chunk ``j`` is at ``base + n``)."""
    early = j < world_size
    rank = tl.where(early, j, 2 * world_size - 1 - j)
    return rank.to(k_row0.dtype) * rank_rows + k_row0 + tl.where(early, 0, chunk) - j * chunk


@triton.jit
def _kv_rows(start_n, k_row0, chunk, rank_rows, world_size, BLOCK_N: tl.constexpr,
             KV_ZIGZAG: tl.constexpr):
    """Buffer rows of key positions ``start_n + [0, BLOCK_N)`` of one sequence, in k_row0's dtype
    (int64 only when the K/V element offsets can pass 2^31: int32 math is cheaper per key).

    Zigzag: the chunk of key ``n`` is ``floor((n + 0.5) / c)`` in fp32, exact while n < 2^22 (the
    +0.5 keeps the quotient 0.5/c away from an integer, far above fp32 rounding there). Measured
    on the H100 (docs/notes.md): cheaper than an integer division per key (10.86 vs 11.95 ms at the
    Llama shape) and than a per-tile two-chunk select (10.98 ms), which also needs chunk >= BLOCK_N.
    """
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if KV_ZIGZAG:
        inv = 1.0 / tl.maximum(chunk, 1).to(tl.float32)
        j = ((offs_n.to(tl.float32) + 0.5) * inv).to(tl.int32)
        return _zigzag_chunk_base(j, k_row0, chunk, rank_rows, world_size) + offs_n
    else:
        return k_row0 + offs_n


@triton.jit
def _load_kv_tile(K, V, Kd, Vd, kv_col, start_n, kv_end, k_row0, chunk, rank_rows, world_size,
                  stride_kn, stride_vn, offs_d, head_dim,
                  BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, KV_ZIGZAG: tl.constexpr,
                  KV_CACHE: tl.constexpr, USE_DESC: tl.constexpr, MASKED: tl.constexpr):
    """K tile transposed ``[BLOCK_D, BLOCK_N]`` and V tile ``[BLOCK_N, BLOCK_D]``; keys at or past
    ``kv_end`` read as 0 (and are masked out of the scores by the caller).

    ``USE_DESC``: unmasked tiles, whose keys all lie inside the sequence, come through the TMA
    descriptors ``Kd, Vd`` (2-D ``[rows, nheads_k * d]``, this head's columns from ``kv_col``);
    masked tiles keep predicated pointer loads, so that no row of another sequence (or padding)
    ever enters the math. On the zigzag buffer the caller takes this path only for a sequence
    whose chunk length is a multiple of BLOCK_N: each tile then lies inside one chunk, whose rows
    are contiguous, and its first row is one scalar per tile."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if USE_DESC and not MASKED:
        if KV_ZIGZAG:
            row = (_zigzag_chunk_base(start_n // chunk, k_row0, chunk, rank_rows, world_size)
                   + start_n).to(tl.int32)
        else:
            row = (k_row0 + start_n).to(tl.int32)
        k = Kd.load([row, kv_col])
        v = Vd.load([row, kv_col])
        return offs_n, tl.trans(k), v
    rows = _kv_rows(start_n, k_row0, chunk, rank_rows, world_size, BLOCK_N, KV_ZIGZAG)
    in_range = offs_n < kv_end
    if EVEN_D:
        k_mask = in_range[None, :]
        v_mask = in_range[:, None]
    else:
        k_mask = in_range[None, :] & (offs_d[:, None] < head_dim)
        v_mask = in_range[:, None] & (offs_d[None, :] < head_dim)
    k_t = tl.load(K + rows[None, :] * stride_kn + offs_d[:, None], mask=k_mask, other=0.0,
                  cache_modifier=KV_CACHE)
    v = tl.load(V + rows[:, None] * stride_vn + offs_d[None, :], mask=v_mask, other=0.0,
                cache_modifier=KV_CACHE)
    return offs_n, k_t, v


@triton.jit
def _attend_one(acc, m_i, l_i, q, lo, hi, qk_scale, offs_m, diag, kv_end,
                K, V, Kd, Vd, kv_col, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn, offs_d, head_dim,
                MASKED: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr,
                KV_ZIGZAG: tl.constexpr, KV_CACHE: tl.constexpr, USE_DESC: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """Key tiles ``[lo, hi)`` (``lo`` a multiple of BLOCK_N) into one group's state."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, k_t, v = _load_kv_tile(K, V, Kd, Vd, kv_col, start_n, kv_end, k_row0, chunk, rank_rows, world_size,
                                       stride_kn, stride_vn, offs_d, head_dim,
                                       BLOCK_N, EVEN_D, KV_ZIGZAG, KV_CACHE, USE_DESC, MASKED)
        acc, m_i, l_i = _online_update(acc, m_i, l_i, q, k_t, v, qk_scale, offs_m, offs_n,
                                       diag, kv_end, MASKED, DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def _attend_alone(acc, m_i, l_i, q, lo, full, hi, qk_scale, offs_m, diag, kv_end,
                  K, V, Kd, Vd, kv_col, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn, offs_d, head_dim,
                  BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, KV_ZIGZAG: tl.constexpr,
                  KV_CACHE: tl.constexpr, USE_DESC: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
    """One group's tiles past the shared range: ``[lo, full)`` unmasked, then ``[.., hi)`` masked."""
    split = tl.maximum(lo, full)
    acc, m_i, l_i = _attend_one(acc, m_i, l_i, q, lo, split, qk_scale, offs_m, diag, kv_end,
                                K, V, Kd, Vd, kv_col, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn,
                                offs_d, head_dim, False, BLOCK_N, EVEN_D, KV_ZIGZAG, KV_CACHE, USE_DESC,
                                DOT_PRECISION)
    acc, m_i, l_i = _attend_one(acc, m_i, l_i, q, split, hi, qk_scale, offs_m, diag, kv_end,
                                K, V, Kd, Vd, kv_col, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn,
                                offs_d, head_dim, True, BLOCK_N, EVEN_D, KV_ZIGZAG, KV_CACHE, USE_DESC,
                                DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def _attend_two(acc0, m0, l0, q0, diag0, end0, acc1, m1, l1, q1, diag1, end1,
                lo, hi, qk_scale, offs_m,
                K, V, Kd, Vd, kv_col, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn, offs_d, head_dim,
                MASKED: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr,
                KV_ZIGZAG: tl.constexpr, KV_CACHE: tl.constexpr, USE_DESC: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """Key tiles ``[lo, hi)``: each tile loaded once, fed to both groups' states."""
    kv_end = tl.maximum(end0, end1)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, k_t, v = _load_kv_tile(K, V, Kd, Vd, kv_col, start_n, kv_end, k_row0, chunk, rank_rows, world_size,
                                       stride_kn, stride_vn, offs_d, head_dim,
                                       BLOCK_N, EVEN_D, KV_ZIGZAG, KV_CACHE, USE_DESC, MASKED)
        acc0, m0, l0 = _online_update(acc0, m0, l0, q0, k_t, v, qk_scale, offs_m, offs_n,
                                      diag0, end0, MASKED, DOT_PRECISION)
        acc1, m1, l1 = _online_update(acc1, m1, l1, q1, k_t, v, qk_scale, offs_m, offs_n,
                                      diag1, end1, MASKED, DOT_PRECISION)
    return acc0, m0, l0, acc1, m1, l1


@triton.jit
def _key_bounds(len_q, kv_end, m0, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """For the M-block of rows ``[m0, m0 + BLOCK_M)``: ``diag`` (row ``i`` sees key
    ``j <= i + diag``), ``full`` (tiles below it need no mask, a multiple of BLOCK_N) and ``hi``
    (no tile at or past it is needed). Shared by the forward and the backward's dQ kernel."""
    rows_end = tl.minimum(m0 + BLOCK_M, len_q)
    if IS_CAUSAL:
        diag = kv_end - len_q
        hi = tl.minimum(kv_end, rows_end + diag)
        full = tl.minimum(kv_end, m0 + diag + 1)
    else:
        diag = kv_end
        hi = kv_end
        full = kv_end
    hi = tl.where(rows_end > m0, tl.maximum(hi, 0), 0)
    full = (tl.minimum(tl.maximum(full, 0), hi) // BLOCK_N) * BLOCK_N
    return diag, full, hi


@triton.jit
def _group_block_setup(Q, cu_seqlens_q, q_shift, kv_end_ptr, seq, len_k, start_m, head, stride_qm,
                       stride_qh, offs_m, offs_d, head_dim,
                       IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       EVEN_D: tl.constexpr, KV_END_SCALAR: tl.constexpr):
    """Load one group's M-block of q and compute its key-range bounds.

    Returns ``q [BLOCK_M, BLOCK_D]``, ``len_q``, ``diag`` (row ``i`` sees key ``j <= i + diag``),
    ``kv_end`` (keys visible at all), ``full`` (tiles below it need no mask, a multiple of BLOCK_N)
    and ``hi`` (no tile at or past it is needed). The M-block's q rows start at
    ``cu_seqlens_q[seq] + q_shift``."""
    q_start = tl.load(cu_seqlens_q + seq)
    len_q = tl.load(cu_seqlens_q + seq + 1) - q_start
    q_start += q_shift
    if KV_END_SCALAR:  # one int for every sequence (no per-sequence tensor to fill)
        kv_end = tl.minimum(tl.maximum(kv_end_ptr, 0), len_k)
    else:
        kv_end = tl.minimum(tl.maximum(tl.load(kv_end_ptr + seq), 0), len_k)
    diag, full, hi = _key_bounds(len_q, kv_end, start_m * BLOCK_M, IS_CAUSAL, BLOCK_M, BLOCK_N)
    row_ok = offs_m < len_q
    q_ptrs = Q + (q_start + offs_m).to(tl.int64)[:, None] * stride_qm + head * stride_qh + offs_d[None, :]
    if EVEN_D:
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)
    return q, len_q, diag, kv_end, full, hi


@triton.jit
def _store_group(Out, Lse, out_row0, head, acc, m_i, l_i, len_q, offs_m, offs_d, head_dim,
                 stride_om, stride_oh, stride_lse_h, EVEN_D: tl.constexpr):
    """out = acc / l (0 where no key was seen), lse = (m + log2 l) * ln 2 (-inf there)."""
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    row = out_row0 + offs_m
    row_ok = offs_m < len_q
    o_ptrs = Out + row.to(tl.int64)[:, None] * stride_om + head * stride_oh + offs_d[None, :]
    if EVEN_D:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_d[None, :] < head_dim))
    tl.store(Lse + head * stride_lse_h + row.to(tl.int64), lse, mask=row_ok)


@triton.jit
def _fused_dual_group_fwd_kernel_varlen(
    Q0, Q1,            # [total_q0, nheads, HEAD_DIM], [total_q1, nheads, HEAD_DIM]; last dim contiguous
    K, V,              # [rows, nheads_k, HEAD_DIM] (contiguous varlen, or the zigzag gathered buffer)
    Kd, Vd,            # with USE_DESC: TMA descriptors of K, V as [rows, nheads_k * HEAD_DIM]
    Out0, Out1,        # [rows_o0, nheads, HEAD_DIM], [rows_o1, nheads, HEAD_DIM] (may be one tensor)
    Lse0, Lse1,        # float32 [nheads, rows_o0], [nheads, rows_o1]
    cu_seqlens_q0, cu_seqlens_q1,  # int32 [batch + 1]
    cu_seqlens_k,      # int32 [batch + 1]: contiguous starts, or LOCAL starts in zigzag mode
    kv_end0, kv_end1,  # int32 [batch] (ints with KV_END_SCALAR; chunk counts with
                       # KV_END_IN_CHUNKS): keys each group may see, clipped to the sequence here
    out_start0, out_start1,  # int32 [batch]: first output row of each sequence (unused with
                             # OUT_LOCAL_ORDER)
    sm_scale,          # float: softmax scale (log2(e) is folded in here)
    rank_rows, world_size,  # zigzag mode: rows per rank in the gathered buffer, ranks
    stride_q0m, stride_q0h, stride_q1m, stride_q1h,
    stride_kn, stride_kh, stride_vn, stride_vh,
    stride_o0m, stride_o0h, stride_o1m, stride_o1h,
    stride_lse0_h, stride_lse1_h,
    head_dim, kv_group,  # real head dim; q heads per kv head
    IS_CAUSAL: tl.constexpr, KV_ZIGZAG: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    KV_CACHE: tl.constexpr, INT64_KV: tl.constexpr, KV_END_SCALAR: tl.constexpr,
    KV_END_IN_CHUNKS: tl.constexpr, OUT_LOCAL_ORDER: tl.constexpr, USE_DESC: tl.constexpr,
    Q_LOCAL_ORDER: tl.constexpr, ONE_GROUP: tl.constexpr,
    CHUNK_PART: tl.constexpr,  # zigzag buffer: 0 every sequence, 1 those whose chunk length is a
                               # multiple of CHUNK_TILE (TMA tiles), 2 the others (pointer loads)
    CHUNK_TILE: tl.constexpr,  # the TMA launch's BLOCK_N (the same in both launches)
    DOT_PRECISION: tl.constexpr,  # tl.dot's input_precision: "ieee" or "tf32" (fp32 inputs only)
):
    # Grid (nheads, m-blocks, batch): heads vary fastest, so the q heads of one kv head run
    # together (FA2's m-blocks-fastest order measured the same, docs/notes.md). m-blocks are
    # visited last-first: under a causal mask the last rows have the most keys and start first.
    head = tl.program_id(0)
    start_m = tl.num_programs(1) - 1 - tl.program_id(1)
    if ONE_GROUP:
        # Programs (seq, group) interleaved, group 1 first: in zigzag it is the group with more
        # keys, and the longest blocks starting first shorten the tail (measured, docs/notes.md).
        seq = tl.program_id(2) // 2
        second = tl.program_id(2) % 2 == 0
    else:
        seq = tl.program_id(2)
    kv_head = head // kv_group
    kv_col = kv_head * BLOCK_D

    k_row0 = tl.load(cu_seqlens_k + seq)
    if INT64_KV:
        k_row0 = k_row0.to(tl.int64)
    len_k_stored = tl.load(cu_seqlens_k + seq + 1) - tl.load(cu_seqlens_k + seq)
    if KV_ZIGZAG:
        chunk = len_k_stored // 2          # local length = 2 chunks
        len_k = chunk * 2 * world_size     # global length
    else:
        chunk = 1
        len_k = len_k_stored

    if CHUNK_PART == 1 and chunk % CHUNK_TILE != 0:
        return  # the on-grid launch (TMA): a chunk off the tile grid is the other launch's
    if CHUNK_PART == 2 and chunk % CHUNK_TILE == 0:
        return  # the off-grid launch (pointer loads): a chunk on the grid is the TMA launch's
    if KV_END_IN_CHUNKS:  # zigzag: the ends count this sequence's chunks (no metadata tensors)
        kv_end0 = kv_end0 * chunk
        kv_end1 = kv_end1 * chunk
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    if Q_LOCAL_ORDER:
        # q of both groups in the rank's local order (as the outputs): group 0 of sequence b at
        # cu_q0[b] + cu_q1[b], group 1 at cu_q0[b + 1] + cu_q1[b].
        q_shift0 = tl.load(cu_seqlens_q1 + seq)
        q_shift1 = tl.load(cu_seqlens_q0 + seq + 1)
    else:
        q_shift0 = 0
        q_shift1 = 0
    if ONE_GROUP:
        # One group's M-block per program: one online-softmax state, so a 128-row block fits the
        # register file without spilling (two states do not, docs/notes.md); shared K/V tiles are
        # read once per group, the second read mostly from L2.
        len_q0 = tl.load(cu_seqlens_q0 + seq + 1) - tl.load(cu_seqlens_q0 + seq)
        q, len_q, diag, end, full, hi = _group_block_setup(
            tl.where(second, Q1, Q0), tl.where(second, cu_seqlens_q1, cu_seqlens_q0),
            tl.where(second, q_shift1, q_shift0), tl.where(second, kv_end1, kv_end0), seq, len_k,
            start_m, head, tl.where(second, stride_q1m, stride_q0m),
            tl.where(second, stride_q1h, stride_q0h), offs_m, offs_d, head_dim, IS_CAUSAL, BLOCK_M,
            BLOCK_N, EVEN_D, KV_END_SCALAR)
        if OUT_LOCAL_ORDER:
            out_row = (tl.load(cu_seqlens_q0 + seq) + tl.load(cu_seqlens_q1 + seq)
                       + tl.where(second, len_q0, 0))
        else:
            out_row = tl.load(tl.where(second, out_start1, out_start0) + seq)
        K += kv_head * stride_kh
        V += kv_head * stride_vh
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        # A block past its group's rows has hi == 0: no tile, no row stored.
        qk_scale = sm_scale * 1.4426950408889634
        acc, m_i, l_i = _attend_alone(
            acc, m_i, l_i, q, 0, full, hi, qk_scale, offs_m, diag, end,
            K, V, Kd, Vd, kv_col, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn,
            offs_d, head_dim, BLOCK_N, EVEN_D, KV_ZIGZAG, KV_CACHE, USE_DESC, DOT_PRECISION)
        _store_group(tl.where(second, Out1, Out0), tl.where(second, Lse1, Lse0), out_row, head,
                     acc, m_i, l_i, len_q, offs_m, offs_d, head_dim,
                     tl.where(second, stride_o1m, stride_o0m), tl.where(second, stride_o1h, stride_o0h),
                     tl.where(second, stride_lse1_h, stride_lse0_h), EVEN_D)
    else:
        q0, len_q0, diag0, end0, full0, hi0 = _group_block_setup(
            Q0, cu_seqlens_q0, q_shift0, kv_end0, seq, len_k, start_m, head, stride_q0m, stride_q0h,
            offs_m, offs_d, head_dim, IS_CAUSAL, BLOCK_M, BLOCK_N, EVEN_D, KV_END_SCALAR)
        q1, len_q1, diag1, end1, full1, hi1 = _group_block_setup(
            Q1, cu_seqlens_q1, q_shift1, kv_end1, seq, len_k, start_m, head, stride_q1m, stride_q1h,
            offs_m, offs_d, head_dim, IS_CAUSAL, BLOCK_M, BLOCK_N, EVEN_D, KV_END_SCALAR)
        if start_m * BLOCK_M >= tl.maximum(len_q0, len_q1):
            return
        if OUT_LOCAL_ORDER:
            # The rank's local order: sequence b's rows start at cu_q0[b] + cu_q1[b], group 0's
            # chunk first, then group 1's.
            out_row0 = tl.load(cu_seqlens_q0 + seq) + tl.load(cu_seqlens_q1 + seq)
            out_row1 = out_row0 + len_q0
        else:
            out_row0 = tl.load(out_start0 + seq)
            out_row1 = tl.load(out_start1 + seq)

        K += kv_head * stride_kh
        V += kv_head * stride_vh
        qk_scale = sm_scale * 1.4426950408889634

        acc0 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        m_0 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        m_1 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_0 = tl.zeros([BLOCK_M], dtype=tl.float32)
        l_1 = tl.zeros([BLOCK_M], dtype=tl.float32)

        # Shared tiles: both groups unmasked, then both masked (one of them may be a plain tile
        # there; the mask is then all-true and costs only the select).
        both_full = tl.minimum(full0, full1)
        both_hi = tl.minimum(hi0, hi1)
        shared_end = tl.cdiv(both_hi, BLOCK_N) * BLOCK_N
        acc0, m_0, l_0, acc1, m_1, l_1 = _attend_two(
            acc0, m_0, l_0, q0, diag0, end0, acc1, m_1, l_1, q1, diag1, end1,
            0, both_full, qk_scale, offs_m,
            K, V, Kd, Vd, kv_col, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn, offs_d, head_dim,
            False, BLOCK_N, EVEN_D, KV_ZIGZAG, KV_CACHE, USE_DESC, DOT_PRECISION)
        acc0, m_0, l_0, acc1, m_1, l_1 = _attend_two(
            acc0, m_0, l_0, q0, diag0, end0, acc1, m_1, l_1, q1, diag1, end1,
            both_full, shared_end, qk_scale, offs_m,
            K, V, Kd, Vd, kv_col, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn, offs_d, head_dim,
            True, BLOCK_N, EVEN_D, KV_ZIGZAG, KV_CACHE, USE_DESC, DOT_PRECISION)

        # Then each group alone past the shared range (for the shorter one these loops are empty).
        # Group 0 is finished and stored first: in zigzag it is the shorter group, and storing it frees
        # its accumulator and q registers for group 1's long tail.
        acc0, m_0, l_0 = _attend_alone(
            acc0, m_0, l_0, q0, shared_end, full0, hi0, qk_scale, offs_m, diag0, end0,
            K, V, Kd, Vd, kv_col, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn, offs_d, head_dim,
            BLOCK_N, EVEN_D, KV_ZIGZAG, KV_CACHE, USE_DESC, DOT_PRECISION)
        _store_group(Out0, Lse0, out_row0, head, acc0, m_0, l_0, len_q0, offs_m, offs_d,
                     head_dim, stride_o0m, stride_o0h, stride_lse0_h, EVEN_D)

        acc1, m_1, l_1 = _attend_alone(
            acc1, m_1, l_1, q1, shared_end, full1, hi1, qk_scale, offs_m, diag1, end1,
            K, V, Kd, Vd, kv_col, k_row0, chunk, rank_rows, world_size, stride_kn, stride_vn, offs_d, head_dim,
            BLOCK_N, EVEN_D, KV_ZIGZAG, KV_CACHE, USE_DESC, DOT_PRECISION)
        _store_group(Out1, Lse1, out_row1, head, acc1, m_1, l_1, len_q1, offs_m, offs_d,
                     head_dim, stride_o1m, stride_o1h, stride_lse1_h, EVEN_D)


def _max_offset(t) -> int:
    """Largest element offset a kernel adds to a 3-dim ``t``'s data pointer (plus one)."""
    (n0, n1, n2), (s0, s1, s2) = t.shape, t.stride()
    return max(n0 - 1, 0) * s0 + max(n1 - 1, 0) * s1 + max(n2 - 1, 0) * s2 + 1


def launch_dual_group_fwd(
    q0, q1, k, v, out0, out1, lse0, lse1,
    cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, out_start0, out_start1,
    *, max_seqlen_q: int, softmax_scale: float, causal: bool, config,
    zigzag_world_size: int = 0, zigzag_rank_rows: int = 0, zigzag_local_order: bool = False,
    q_local_order: bool = False,
):
    """Launch ``_fused_dual_group_fwd_kernel_varlen``. All checks are the caller's (varlen.py).
    Returns Triton's compiled-kernel handle (registers, spills: for the config sweep), or None
    when there is nothing to launch (or under the interpreter).

    ``kv_end0, kv_end1`` are int32 ``[batch]`` tensors or both ints (the same for every sequence);
    ``out_start*`` int32 tensors whose first ``batch`` entries are used (``cu_seqlens_q*`` itself
    for outputs in the groups' own order). ``zigzag_world_size > 0`` reads ``k, v`` as the zigzag
    all-gather buffer of that many ranks, ``zigzag_rank_rows`` rows each, with ``cu_seqlens_k``
    the LOCAL cumulative lengths. ``zigzag_local_order``: the rank's zigzag step in one launch
    with no metadata tensors: ``kv_end*`` are ints counting each sequence's chunks
    (``chunk_idx + 1``), ``out_start*`` are ignored and both groups are written in the rank's
    local order (rows of sequence ``b`` from ``cu_q0[b] + cu_q1[b]``, group 0 first);
    ``q_local_order`` (with it): q0 and q1 are that same local-order tensor too. Launched
    through ``_launch.launch`` (no per-call binding).

    On the zigzag buffer a TMA config (one group per program) is two launches: the config's
    program with TMA tiles for the sequences whose chunk length is a multiple of its key tile,
    then ``off_grid_config(config)`` (the dual-group program with pointer loads) for the others.
    """
    batch = cu_seqlens_q0.shape[0] - 1
    nheads, head_dim = q0.shape[1], q0.shape[2]
    if batch == 0 or max_seqlen_q == 0:
        return None
    block_d = max(16, next_pow2(head_dim))
    grid = (nheads, max(1, -(-max_seqlen_q // config.block_m)), batch * (2 if config.one_group else 1))
    kv_end_scalar = isinstance(kv_end0, int)
    ints = (zigzag_rank_rows, max(zigzag_world_size, 1), *q0.stride()[:2], *q1.stride()[:2],
            *k.stride()[:2], *v.stride()[:2], *out0.stride()[:2], *out1.stride()[:2],
            lse0.stride(0), lse1.stride(0), head_dim, nheads // k.shape[1])
    use_desc = _tma_ok(config, k, v, head_dim, block_d, zigzag_world_size)
    constexprs = dict(
        IS_CAUSAL=causal, KV_ZIGZAG=zigzag_world_size > 0,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_D=block_d,
        EVEN_D=block_d == head_dim, KV_CACHE=config.kv_cache_modifier,
        INT64_KV=config.int64_kv_offsets or _max_offset(k) >= 2**31 or _max_offset(v) >= 2**31,
        KV_END_SCALAR=kv_end_scalar, KV_END_IN_CHUNKS=zigzag_local_order,
        OUT_LOCAL_ORDER=zigzag_local_order, USE_DESC=use_desc, Q_LOCAL_ORDER=q_local_order,
        ONE_GROUP=config.one_group, CHUNK_PART=0, CHUNK_TILE=config.block_n,
        DOT_PRECISION=dot_input_precision(q0.dtype))  # fp32 dots as PyTorch would
    ends = (kv_end0, kv_end1)
    if use_desc:
        # Descriptors are built per call (a few us of host time, nothing at these sizes) and
        # launched through Triton's own path.
        from triton.tools.tensor_descriptor import TensorDescriptor

        descs = [TensorDescriptor(t, [t.shape[0], t.shape[1] * head_dim], [t.stride(0), 1],
                                  [config.block_n, block_d]) for t in (k, v)]
        if zigzag_world_size > 0:
            # The zigzag buffer: a key tile is contiguous in the buffer when the sequence's
            # chunk length is a multiple of BLOCK_N, which only the device knows. Two launches,
            # each of whose programs returns at once for the other's sequences: TMA tiles for
            # the chunks on the grid, then pointer loads for the others. (One kernel holding both
            # loops needs both loops' pipelined buffers: 426 KB of shared memory at 128 x 128.)
            constexprs["CHUNK_PART"] = 1
        handle = _fused_dual_group_fwd_kernel_varlen[grid](
            q0, q1, k, v, *descs, out0, out1, lse0, lse1, cu_seqlens_q0, cu_seqlens_q1,
            cu_seqlens_k, *ends, out_start0, out_start1, softmax_scale, *ints, **constexprs,
            num_warps=config.num_warps, num_stages=config.num_stages)
        if zigzag_world_size == 0:
            return handle
        # The off-grid sequences: the dual-group program with pointer loads (measured faster
        # there than one group per program: docs/notes.md).
        config = off_grid_config(config)
        grid = (nheads, max(1, -(-max_seqlen_q // config.block_m)), batch)
        constexprs.update(USE_DESC=False, CHUNK_PART=2, BLOCK_M=config.block_m,
                          BLOCK_N=config.block_n, ONE_GROUP=False,
                          INT64_KV=constexprs["INT64_KV"] or config.int64_kv_offsets)
    pointers = (q0, q1, k, v, out0, out1, lse0, lse1, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k)
    # Integer ends are specialized on by Triton like any int argument: part of the key.
    key = (q0.dtype, out0.dtype, ints, tuple(constexprs.values()), config.num_warps,
           config.num_stages, ends if kv_end_scalar else None,
           alignment_key(*pointers, out_start0, out_start1, *(() if kv_end_scalar else ends)))
    args = (*pointers[:4], None, None, *pointers[4:], *ends, out_start0, out_start1,
            softmax_scale, *ints)
    return launch(_fused_dual_group_fwd_kernel_varlen, key, grid, args, constexprs,
                  config.num_warps, config.num_stages,
                  q0.device.index if q0.device.type == "cuda" else -1)


def off_grid_config(config):
    """The launch config for the zigzag-buffer sequences whose chunk length is off a TMA
    config's key tile: two groups per program, 64-key tiles, pointer loads (the zigzag row
    before 2026-11-25: 1.54-1.85 ms on the mixed batch against 1.92-2.03 for one group)."""
    return dataclasses.replace(config, block_n=min(config.block_n, 64), tma=False,
                               one_group=False)


def _tma_ok(config, k, v, head_dim: int, block_d: int, zigzag_world_size: int) -> bool:
    """TMA descriptors for K/V: asked for by the config (on the zigzag buffer only with one
    group per program, where the kernel picks TMA per sequence), a CUDA device, a power-of-two
    head dim, each row's heads back to back (``[rows, nheads_k * d]`` 2-D view) and 16-byte
    aligned bases and row strides."""
    if not config.tma or k.device.type != "cuda" or head_dim != block_d:
        return False
    if zigzag_world_size > 0 and not config.one_group:
        return False
    return all(t.shape[0] > 0 and t.stride(2) == 1 and t.stride(1) == head_dim
               and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
               for t in (k, v))
