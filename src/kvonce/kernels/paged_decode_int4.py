"""The int4 paged-decode pieces (format: ``kvonce.paged.quant``, one fp16 or float32 scale and
offset per key): the generic per-channel tile (head dims other than 128, fp32 q, V at an odd
byte) and, at head dim 128, the nibble-plane loop (``_attend_paged_int4``). A key's channel is
``(n - 8) * scale + offset`` for its nibble n: the scale and offset are per key, so K's go on
the scores' columns and V's on the probabilities, and the bytes reach the MMA operand with only
the lop3 converts between.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .dual_group_fwd import _softmax_step
from .paged_outliers import _outlier_scores
from .paged_tiles import _tile_pages, _tile_rows_ahead
from .quant_convert import _int4_units_to_f16, _nibbles_to


@triton.jit
def _int4_key_scales(CS, rows, in_range, MASKED: tl.constexpr, SCALE_PAIRS: tl.constexpr):
    """Each key's ``(scale, offset)`` ``[BLOCK_N]`` each, at ``CS + rows`` (fp16 or float32
    pairs), as float32. SCALE_PAIRS (scale rows aligned to the pair: 8 bytes float32, 4 fp16):
    one load a key, which the pipeliner prefetches with cp.async with K and V; otherwise two."""
    if SCALE_PAIRS:
        # the pair as one unsigned word of twice the element's bits; scale the low half
        F16: tl.constexpr = CS.dtype.element_ty == tl.float16
        BITS: tl.constexpr = 16 if F16 else 32
        HALF: tl.constexpr = tl.uint16 if F16 else tl.uint32
        WORD: tl.constexpr = tl.uint32 if F16 else tl.uint64
        CW = CS.to(tl.pointer_type(WORD))
        if MASKED:
            pair = tl.load(CW + rows // 2, mask=in_range, other=0)
        else:
            pair = tl.load(CW + rows // 2)
        s = (pair & ((1 << BITS) - 1)).to(HALF).to(CS.dtype.element_ty, bitcast=True)
        offset = (pair >> BITS).to(HALF).to(CS.dtype.element_ty, bitcast=True)
    else:
        if MASKED:
            s = tl.load(CS + rows, mask=in_range, other=0.0)
            offset = tl.load(CS + rows + 1, mask=in_range, other=0.0)
        else:
            s = tl.load(CS + rows)
            offset = tl.load(CS + rows + 1)
    return s.to(tl.float32), offset.to(tl.float32)


@triton.jit
def _pair_widen(x):
    """``x [M, W]`` twice side by side, ``[M, 2W]``: a head pair's operand or accumulator, one
    half per KV head of the pair."""
    M: tl.constexpr = x.shape[0]
    W: tl.constexpr = x.shape[1]
    return tl.reshape(tl.permute(tl.join(x, x), (0, 2, 1)), [M, 2 * W])


@triton.jit
def _pair_operand(x, pair_hi):
    """A head pair's q operand ``[M, 2W]`` from ``x [M, W]``: row r's channels in its own
    head's half (``pair_hi[r]``: the pair's second head), zeros in the other, so that one dot
    against the pair's bytes ``[2W, N]`` (first head's W, then the second's) scores each row
    against its own head only."""
    W: tl.constexpr = x.shape[1]
    second_half = tl.arange(0, 2 * W) >= W
    return tl.where(second_half[None, :] == pair_hi[:, None], _pair_widen(x), 0.0).to(x.dtype)


@triton.jit
def _pair_select(x, pair_hi):
    """Each row's own head's half ``[M, W]`` of a head pair's ``x [M, 2W]``."""
    M: tl.constexpr = x.shape[0]
    W: tl.constexpr = x.shape[1] // 2
    first, second = tl.split(tl.permute(tl.reshape(x, [M, 2, W]), (0, 2, 1)))
    return tl.where(pair_hi[:, None], second, first)


@triton.jit
def _pair_rows(x0, x1, pair_hi, HEAD_PAIRS: tl.constexpr):
    """Per-key values ``[N]`` as each row sees them: ``[1, N]`` for one KV head, ``[M, N]``
    (the first head's ``x0`` or the second's ``x1``, by ``pair_hi``) for a head pair."""
    if HEAD_PAIRS:
        return tl.where(pair_hi[:, None], x1[None, :], x0[None, :])
    else:
        return x0[None, :]


@triton.jit
def _int4_pair_scales(CS, rows, stride_h, in_range, pair_hi, MASKED: tl.constexpr,
                      SCALE_PAIRS: tl.constexpr, HEAD_PAIRS: tl.constexpr):
    """``_int4_key_scales`` as each row sees them (``_pair_rows``): the second head's at
    ``CS + stride_h`` (HEAD_PAIRS)."""
    s, offset = _int4_key_scales(CS, rows, in_range, MASKED, SCALE_PAIRS)
    if HEAD_PAIRS:
        s1, offset1 = _int4_key_scales(CS + stride_h, rows, in_range, MASKED, SCALE_PAIRS)
    else:
        s1, offset1 = s, offset
    return _pair_rows(s, s1, pair_hi, HEAD_PAIRS), _pair_rows(offset, offset1, pair_hi,
                                                                  HEAD_PAIRS)


@triton.jit
def _int4_tile(C, CS, rows, scale_rows, in_range, offs_d, head_dim, dtype: tl.constexpr,
               MASKED: tl.constexpr):
    """One int4 cache's tile ``[BLOCK_N, BLOCK_D]`` in ``dtype`` (channels past ``head_dim`` and,
    MASKED, keys out of range read 0): key n's channel c is the low nibble of byte c (c < d/2) or
    the high nibble of byte c - d/2, ``(nibble - 8) * scale + offset`` in float32, rounded once
    (as ``dequantize_kv`` to that dtype). Each byte is addressed twice (the second read hits
    L1)."""
    half = head_dim // 2
    high = offs_d >= half
    ok = (offs_d < head_dim)[None, :]
    if MASKED:
        ok = ok & in_range[:, None]
    b = tl.load(C + rows[:, None] + tl.where(high, offs_d - half, offs_d)[None, :], mask=ok,
                other=0x88)
    n = ((b.to(tl.int32) >> tl.where(high, 4, 0)[None, :]) & 15) - 8
    s, offset = _int4_key_scales(CS, scale_rows, in_range, MASKED, False)
    x = n.to(tl.float32) * s[:, None] + offset[:, None]
    return tl.where(ok, x, 0.0).to(dtype)


@triton.jit
def _int4_tile_probabilities(m_i, l_i, q_low, q_high, q_sum, offs_n, in_range, page, slot,
                             qk_scale, tok, diag, kv_end, K, KS, stride_kp, stride_kt,
                             stride_ksp, stride_kst, MASKED: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             DOT_PRECISION: tl.constexpr, q_out, KO, stride_kop, stride_kot,
                             out_scale, N_OUT: tl.constexpr, SCALE_PAIRS: tl.constexpr,
                             ROW_SCALE: tl.constexpr = False, HEAD_PAIRS: tl.constexpr = False,
                             pair_hi=0, stride_kh=0, stride_ksh=0):
    """The scores half of one int4 key tile (keys ``offs_n``, each on ``page`` at ``slot``): the
    bytes ``[64, BLOCK_N]`` (transposed) go to the MMA operand as they are stored, their low
    nibbles dotted against q's channels 0-63 (``q_low``) and their high ones, accumulated,
    against 64-127 (``q_high``), both as ``n - 8``; then each key's scale on its column and its
    offset times the row's ``q_sum`` (``sum(q)``); the outlier channels' scores first (N_OUT >
    0), then the online-softmax step. HEAD_PAIRS: the bytes of two KV heads ``[128, BLOCK_N]``
    (the second's at ``+ stride_kh``), ``q_low`` / ``q_high`` ``[BLOCK_M, 128]`` pair operands
    (``_pair_operand``), each row's scales its own head's. Returns ``(p, alpha, m_i, l_i)``."""
    k_rows = page * stride_kp + slot * stride_kt
    NB: tl.constexpr = 128 if HEAD_PAIRS else 64
    offs_b = tl.arange(0, NB)
    if HEAD_PAIRS:
        offs_b = offs_b % 64 + (offs_b // 64) * stride_kh
    if MASKED:  # 0x88: both nibbles 8, the value 0 (the scores are masked anyway)
        kb = tl.load(K + k_rows[None, :] + offs_b[:, None], mask=in_range[None, :], other=0x88)
    else:
        kb = tl.load(K + k_rows[None, :] + offs_b[:, None])
    dtype: tl.constexpr = q_low.dtype
    dots = tl.dot(q_low, _nibbles_to(kb, False, dtype), input_precision=DOT_PRECISION)
    dots = tl.dot(q_high, _nibbles_to(kb, True, dtype), dots, input_precision=DOT_PRECISION)
    s, offset = _int4_pair_scales(KS, page * stride_ksp + slot * stride_kst, stride_ksh,
                                  in_range, pair_hi, MASKED, SCALE_PAIRS, HEAD_PAIRS)
    qk = dots * s + q_sum[:, None] * offset
    if N_OUT > 0:
        qk += _outlier_scores(q_out, KO, page, slot, in_range, stride_kop, stride_kot, MASKED,
                              N_OUT, DOT_PRECISION) * out_scale[:, None]
    p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, qk_scale, tok, offs_n, diag, kv_end, MASKED,
                                       ROW_SCALE=ROW_SCALE)
    return p, alpha, m_i, l_i


@triton.jit
def _attend_paged_int4(acc, m_i, l_i, q, lo, hi, qk_scale, tok, diag, kv_end, K, V, KS, VS,
                       bt_row, stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp,
                       stride_kst, stride_vsp, stride_vst, MASKED: tl.constexpr,
                       PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, INT64_KV: tl.constexpr = True, q_out=0.0,
                       KO=0, stride_kop=0, stride_kot=0, out_scale=1.0,
                       N_OUT: tl.constexpr = 0, SCALE_PAIRS: tl.constexpr = False,
                       PREFETCH_PAGES: tl.constexpr = False, ROW_SCALE: tl.constexpr = False,
                       HEAD_PAIRS: tl.constexpr = False, pair_hi=0, stride_kh=0, stride_vh=0,
                       stride_ksh=0, stride_vsh=0):
    """``_attend_paged`` for an int4 cache at head dim 128, ``acc [BLOCK_M, 128]`` in and out.
    Scores: ``_int4_tile_probabilities``. Values: V read as 16-bit units ``[BLOCK_N, 32]`` (unit
    u: bytes 2u, 2u + 1), four nibble planes of ``n - 8`` (the output's even and odd channels of
    the low and of the high nibbles, ``quant_convert._int4_units_to_f16``: a lop3 and a
    subtract), each dotted with one fp16 probability tile that carries V's per-key scales
    (``p * scale``); V's offsets add ``sum_keys(p * offset)`` to every channel of a row, those
    products summed over keys once after the loop (a ``[BLOCK_M, BLOCK_N]`` float32
    accumulator: no cross-warp sum a tile). ``BLOCK_M`` is 16 (int4 launches take 16-row
    M-blocks, ``paged_decode.decode_row_blocks``). The scores
    dot runs in q's dtype (fp16 or bf16), P·V in fp16 for both: the probabilities (<= 1) keep
    more bits in fp16 than in bf16, and the planes are small integers. PREFETCH_PAGES: each
    tile's page ids come from the iteration before (``paged_tiles._tile_rows_ahead``), which
    at 3 stages is what gives K/V a second shared-memory slot. ROW_SCALE (bf16 q through fp16
    rows, ``paged_decode._f16_rows``): ``qk_scale`` is per row. HEAD_PAIRS (``PagedDecodeConfig
    .head_pairs``): the rows belong to two adjacent KV heads (``pair_hi``: the second, whose
    K, V and scales sit at ``+ stride_kh`` etc.); each tile reads both heads' bytes, the scores
    dot takes pair operands (``_pair_operand``), the V planes are 64 units wide (both heads) and
    each row keeps its own head's half (``_pair_select``): the other half's products are
    discarded, so the pair's second accumulator half carries a copy it never returns."""
    q_low, q_high = tl.split(tl.permute(tl.reshape(q, [BLOCK_M, 2, 64]), (0, 2, 1)))
    q_sum = tl.sum(q.to(tl.float32), 1)
    # acc's channel c: plane c // 64, parity c % 2, column (c % 64) // 2
    a4 = tl.permute(tl.reshape(acc, [BLOCK_M, 2, 32, 2]), (0, 2, 3, 1))  # (m, col, parity, plane)
    a_low, a_high = tl.split(a4)
    even_low, odd_low = tl.split(a_low)
    even_high, odd_high = tl.split(a_high)
    if HEAD_PAIRS:
        q_low = _pair_operand(q_low, pair_hi)
        q_high = _pair_operand(q_high, pair_hi)
        even_low, odd_low = _pair_widen(even_low), _pair_widen(odd_low)
        even_high, odd_high = _pair_widen(even_high), _pair_widen(odd_high)
    tl.static_assert(BLOCK_M <= 16)
    v_offsets = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    V16 = V.to(tl.pointer_type(tl.uint16))
    NU: tl.constexpr = 64 if HEAD_PAIRS else 32
    offs_u = tl.arange(0, NU)
    if HEAD_PAIRS:
        offs_u = offs_u % 32 + (offs_u // 32) * (stride_vh // 2)
    page_next = _tile_pages(bt_row, lo, kv_end, PAGE_SIZE, BLOCK_N, INT64_KV) \
        if PREFETCH_PAGES else 0
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, in_range, page, slot, page_next = _tile_rows_ahead(
            bt_row, start_n, kv_end, page_next, PAGE_SIZE, BLOCK_N, MASKED, INT64_KV,
            PREFETCH_PAGES)
        p, alpha, m_i, l_i = _int4_tile_probabilities(
            m_i, l_i, q_low, q_high, q_sum, offs_n, in_range, page, slot, qk_scale, tok, diag,
            kv_end, K, KS, stride_kp, stride_kt, stride_ksp, stride_kst, MASKED, BLOCK_M,
            BLOCK_N, DOT_PRECISION, q_out, KO, stride_kop, stride_kot, out_scale, N_OUT,
            SCALE_PAIRS, ROW_SCALE, HEAD_PAIRS, pair_hi, stride_kh, stride_ksh)
        v_scale, v_offset = _int4_pair_scales(VS, page * stride_vsp + slot * stride_vst,
                                              stride_vsh, in_range, pair_hi, MASKED, SCALE_PAIRS,
                                              HEAD_PAIRS)
        v_offsets = v_offsets * alpha[:, None] + p * v_offset
        v_units = page * (stride_vp // 2) + slot * (stride_vt // 2)
        if MASKED:  # 0x8888: every nibble 8, the value 0 (and p is 0 there)
            units = tl.load(V16 + v_units[:, None] + offs_u[None, :], mask=in_range[:, None],
                            other=0x8888)
        else:
            units = tl.load(V16 + v_units[:, None] + offs_u[None, :])
        p16 = (p * v_scale).to(tl.float16)
        even_low = tl.dot(p16, _int4_units_to_f16(units, False, False), even_low * alpha[:, None],
                          input_precision=DOT_PRECISION)
        odd_low = tl.dot(p16, _int4_units_to_f16(units, True, False), odd_low * alpha[:, None],
                         input_precision=DOT_PRECISION)
        even_high = tl.dot(p16, _int4_units_to_f16(units, False, True),
                           even_high * alpha[:, None], input_precision=DOT_PRECISION)
        odd_high = tl.dot(p16, _int4_units_to_f16(units, True, True), odd_high * alpha[:, None],
                          input_precision=DOT_PRECISION)
    if HEAD_PAIRS:
        even_low, odd_low = _pair_select(even_low, pair_hi), _pair_select(odd_low, pair_hi)
        even_high, odd_high = _pair_select(even_high, pair_hi), _pair_select(odd_high, pair_hi)
    a4 = tl.join(tl.join(even_low, odd_low), tl.join(even_high, odd_high))
    acc = tl.reshape(tl.permute(a4, (0, 3, 1, 2)), [BLOCK_M, 128])
    return acc + tl.sum(v_offsets, 1)[:, None], m_i, l_i
