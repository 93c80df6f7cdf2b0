"""The int4 paged-decode pieces: the generic per-channel tile (head dims other than 128) and, at
head dim 128, the split-dot loop (``_attend_paged_int4``): each nibble plane of a 32-byte chunk
is one dot against q's (or the output's) channels of one group, that group's per-key scale on
the scores' (or the probabilities') columns; with ``v_pairs`` (``_attend_paged_int4_vpairs``) V
is read as 16-bit units and scaled on V instead, so one probability tile feeds full-width dots.
Both share the scores half (``_int4_tile_probabilities``). Format: ``kvonce.paged.quant``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .dual_group_fwd import _softmax_step
from .paged_outliers import _outlier_scores
from .paged_tiles import _tile_pages, _tile_rows, _tile_rows_ahead
from .quant_convert import _int4_units_to_f16, _nibbles_to


@triton.jit
def _int4_tile(C, CS, rows, scale_rows, in_range, offs_d, head_dim, dtype: tl.constexpr,
               MASKED: tl.constexpr):
    """One int4 cache's tile ``[BLOCK_N, BLOCK_D]`` in ``dtype`` (channels past ``head_dim`` and,
    MASKED, keys out of range read 0): key n's channel c is the low nibble of byte c (c < d/2) or
    the high nibble of byte c - d/2, times the fp16 scale of group c // 32, rounded once (as
    ``dequantize_kv`` to that dtype). Each byte is addressed twice (the second read hits L1)."""
    half = head_dim // 2
    high = offs_d >= half
    ok = (offs_d < head_dim)[None, :]
    if MASKED:
        ok = ok & in_range[:, None]
    b = tl.load(C + rows[:, None] + tl.where(high, offs_d - half, offs_d)[None, :], mask=ok,
                other=0x88).to(tl.int16)
    s = tl.load(CS + scale_rows[:, None] + (offs_d // 32)[None, :], mask=ok, other=0.0)
    q = (b >> tl.where(high, 4, 0)[None, :].to(tl.int16)) & 15
    if dtype == tl.float16:  # (1024 + nibble) - 1032: exact; the fp16 product rounds once
        x = ((q + 0x6400).to(tl.float16, bitcast=True) - 1032.0) * s
    else:
        x = ((q - 8).to(tl.float32) * s.to(tl.float32)).to(dtype)
    return x


@triton.jit
def _split_int4_groups(x, BLOCK_M: tl.constexpr):
    """``x [BLOCK_M, 128]`` -> its four 32-channel groups ``[BLOCK_M, 32]`` (group g: channels
    ``32g .. 32g + 31``, one int4 scale each)."""
    x4 = tl.permute(tl.reshape(x, [BLOCK_M, 2, 2, 32]), (0, 3, 2, 1))  # (c, g % 2, g // 2)
    g01, g23 = tl.split(x4)
    g0, g1 = tl.split(g01)
    g2, g3 = tl.split(g23)
    return g0, g1, g2, g3


@triton.jit
def _join_int4_groups(g0, g1, g2, g3, BLOCK_M: tl.constexpr):
    """The inverse of ``_split_int4_groups``: four ``[BLOCK_M, 32]`` groups -> ``[BLOCK_M, 128]``."""
    x4 = tl.join(tl.join(g0, g1), tl.join(g2, g3))  # (c, g % 2, g // 2)
    return tl.reshape(tl.permute(x4, (0, 3, 2, 1)), [BLOCK_M, 128])


@triton.jit
def _int4_scales(CS, rows, in_range, MASKED: tl.constexpr, SCALE_PAIRS: tl.constexpr):
    """The four group scales of each key of a tile (``CS + rows``: its first, fp16), as float32
    ``[BLOCK_N]`` each. SCALE_PAIRS (scale rows 4-byte aligned): two 32-bit loads a key, which
    the pipeliner prefetches with cp.async into shared memory and reads back in the layout the
    scores' columns use; fp16 loads (2 bytes) it cannot, so they wait in the loop and each
    crosses to that layout through shared memory behind a CTA barrier."""
    if SCALE_PAIRS:
        C32 = CS.to(tl.pointer_type(tl.uint32))
        if MASKED:
            s01 = tl.load(C32 + rows // 2, mask=in_range, other=0)
            s23 = tl.load(C32 + rows // 2 + 1, mask=in_range, other=0)
        else:
            s01 = tl.load(C32 + rows // 2)
            s23 = tl.load(C32 + rows // 2 + 1)
        s0 = (s01 & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
        s1 = (s01 >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
        s2 = (s23 & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
        s3 = (s23 >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    else:
        if MASKED:
            s0 = tl.load(CS + rows, mask=in_range, other=0.0)
            s1 = tl.load(CS + rows + 1, mask=in_range, other=0.0)
            s2 = tl.load(CS + rows + 2, mask=in_range, other=0.0)
            s3 = tl.load(CS + rows + 3, mask=in_range, other=0.0)
        else:
            s0 = tl.load(CS + rows)
            s1 = tl.load(CS + rows + 1)
            s2 = tl.load(CS + rows + 2)
            s3 = tl.load(CS + rows + 3)
    return s0.to(tl.float32), s1.to(tl.float32), s2.to(tl.float32), s3.to(tl.float32)


@triton.jit
def _int4_chunk_scores(qk, q_low, q_high, K, k_rows, s_low, s_high, in_range, k: tl.constexpr,
                       MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``qk [BLOCK_M, BLOCK_N]`` plus the scores of int4 bytes ``32k .. 32k + 31`` of each key
    (head dim 128): their low nibbles are group k (against ``q_low``, q's channels of group k),
    their high nibbles group k + 2 (against ``q_high``); each dot's scores times its group's
    per-key scale (``s_low``, ``s_high``: float32 ``[BLOCK_N]``). The bytes, transposed ``[32,
    BLOCK_N]``, go from memory to the MMA operand with only integer ops between (32 contiguous
    bytes: Triton stages them in shared memory as they are; 16 were too few for it)."""
    offs_b = 32 * k + tl.arange(0, 32)
    if MASKED:  # 0x88: both nibbles 8, the value 0 (the scores are masked anyway)
        kb = tl.load(K + k_rows[None, :] + offs_b[:, None], mask=in_range[None, :], other=0x88)
    else:
        kb = tl.load(K + k_rows[None, :] + offs_b[:, None])
    dtype: tl.constexpr = q_low.dtype
    low = tl.dot(q_low, _nibbles_to(kb, False, dtype), input_precision=DOT_PRECISION)
    high = tl.dot(q_high, _nibbles_to(kb, True, dtype), input_precision=DOT_PRECISION)
    return qk + low * s_low[None, :] + high * s_high[None, :]


@triton.jit
def _int4_chunk_values(acc_low, acc_high, p, alpha, V, v_rows, s_low, s_high, in_range,
                       k: tl.constexpr, dtype: tl.constexpr, MASKED: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    """Groups k and k + 2 of the output (``acc_low``, ``acc_high [BLOCK_M, 32]``, rescaled by
    ``alpha``) plus ``p`` times the values of int4 bytes ``32k .. 32k + 31`` ``[BLOCK_N, 32]``:
    each nibble plane's dot takes ``p`` with its group's per-key scale (``s_low``, ``s_high``)
    on the columns."""
    offs_b = 32 * k + tl.arange(0, 32)
    if MASKED:
        vb = tl.load(V + v_rows[:, None] + offs_b[None, :], mask=in_range[:, None], other=0x88)
    else:
        vb = tl.load(V + v_rows[:, None] + offs_b[None, :])
    p_low = (p * s_low[None, :]).to(dtype)
    p_high = (p * s_high[None, :]).to(dtype)
    acc_low = tl.dot(p_low, _nibbles_to(vb, False, dtype), acc_low * alpha[:, None],
                     input_precision=DOT_PRECISION)
    acc_high = tl.dot(p_high, _nibbles_to(vb, True, dtype), acc_high * alpha[:, None],
                      input_precision=DOT_PRECISION)
    return acc_low, acc_high


@triton.jit
def _int4_tile_probabilities(m_i, l_i, q0, q1, q2, q3, offs_n, in_range, page, slot, qk_scale,
                             tok, diag, kv_end, K, KS, stride_kp, stride_kt, stride_ksp,
                             stride_kst, MASKED: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, q_out, KO,
                             stride_kop, stride_kot, out_scale, N_OUT: tl.constexpr,
                             SCALE_PAIRS: tl.constexpr):
    """The scores half of one int4 key tile (keys ``offs_n``, each on ``page`` at ``slot``:
    ``paged_tiles._tile_rows``), shared by both V forms: each nibble plane of K dotted against
    q's group (``q0 .. q3``), its group scale on the columns, the outlier channels' scores first
    (N_OUT > 0), then the online-softmax step. Returns ``(p, alpha, m_i, l_i)``."""
    k_rows = page * stride_kp + slot * stride_kt
    if N_OUT > 0:
        qk = _outlier_scores(q_out, KO, page, slot, in_range, stride_kop, stride_kot, MASKED,
                             N_OUT, DOT_PRECISION) * out_scale[:, None]
    else:
        qk = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k0, k1, k2, k3 = _int4_scales(KS, page * stride_ksp + slot * stride_kst, in_range, MASKED,
                                  SCALE_PAIRS)
    qk = _int4_chunk_scores(qk, q0, q2, K, k_rows, k0, k2, in_range, 0, MASKED, DOT_PRECISION)
    qk = _int4_chunk_scores(qk, q1, q3, K, k_rows, k1, k3, in_range, 1, MASKED, DOT_PRECISION)
    p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, qk_scale, tok, offs_n, diag, kv_end, MASKED)
    return p, alpha, m_i, l_i


@triton.jit
def _int4_values_scaled(V16, v_units, s0, s1, s2, s3, in_range, MASKED: tl.constexpr):
    """A tile's int4 values as four fp16 planes ``[BLOCK_N, 32]`` times their group scales: the
    even and odd channels of the low nibbles (channels ``2u``, ``2u + 1``: groups 0 and 1) and of
    the high nibbles (``64 + 2u``, ``65 + 2u``: groups 2 and 3). The row is read as 16-bit units
    ``[BLOCK_N, 32]`` (unit u: bytes ``2u, 2u + 1``; 16-byte cp.async runs) and each plane comes
    out of a unit with a lop3 and a subtract (``quant_convert._int4_units_to_f16``). Triton
    converts and scales in a blocked layout (the scale operand keeps it from hoisting the chain
    into the MMA operand layout) and stages the four fp16 planes in shared memory for the dots
    (compiled for sm_90a, fp16 q: 871 instructions a tile a warp against 1212 for the
    byte-gathered loop, 12 CTA barriers against 14). ``s0 .. s3``: fp32 ``[BLOCK_N]``; the planes hold each
    value over 8, rounded once to fp16."""
    offs_u = tl.arange(0, 32)
    if MASKED:
        units = tl.load(V16 + v_units[:, None] + offs_u[None, :], mask=in_range[:, None],
                        other=0x8888)
    else:
        units = tl.load(V16 + v_units[:, None] + offs_u[None, :])
    # The scales over 8 (exact): |q| <= 7 then keeps every value under 7/8 of fp16's max, where
    # the scale itself (rounded up from amax / 7) could put 7 s past it; the caller takes the 8
    # back in fp32. What it costs is fp16's subnormal spacing (6e-8) on values under 6e-5 x 8,
    # far below int4's own step (the scale).
    first = (offs_u < 16)[None, :]
    s_low = tl.where(first, (s0 * 0.125).to(tl.float16)[:, None],
                     (s1 * 0.125).to(tl.float16)[:, None])
    s_high = tl.where(first, (s2 * 0.125).to(tl.float16)[:, None],
                      (s3 * 0.125).to(tl.float16)[:, None])
    even_low = _int4_units_to_f16(units, False, False) * s_low
    odd_low = _int4_units_to_f16(units, True, False) * s_low
    even_high = _int4_units_to_f16(units, False, True) * s_high
    odd_high = _int4_units_to_f16(units, True, True) * s_high
    return even_low, odd_low, even_high, odd_high


@triton.jit
def _attend_paged_int4_vpairs(acc, m_i, l_i, q, lo, hi, qk_scale, tok, diag, kv_end, K, V, KS,
                              VS, bt_row, stride_kp, stride_kt, stride_vp, stride_vt,
                              stride_ksp, stride_kst, stride_vsp, stride_vst,
                              MASKED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              DOT_PRECISION: tl.constexpr, INT64_KV: tl.constexpr = True,
                              q_out=0.0, KO=0, stride_kop=0, stride_kot=0, out_scale=1.0,
                              N_OUT: tl.constexpr = 0, SCALE_PAIRS: tl.constexpr = False,
                              PREFETCH_PAGES: tl.constexpr = False):
    """``_attend_paged_int4`` with V's group scales on V (``_int4_values_scaled``) instead of
    on the probabilities: one fp16 probability tile a tile feeds four full-width dots (the
    output's even and odd channels of each nibble plane), where the per-group form scaled and
    moved four. The scores dot runs in q's dtype (fp16 or bf16), P·V in fp16 for both: the
    probabilities (<= 1) keep more bits in fp16 than in bf16, and the planes are V as the
    format rounds it to fp16. ``acc [BLOCK_M, 128]`` in and out. PREFETCH_PAGES: each
    tile's page ids come from the iteration before (``paged_tiles._tile_rows_ahead``), which
    at 3 stages is what gives K/V a second shared-memory slot; at 2 stages it only moves the
    page-id wait (47 -> 131 instructions after the load, sm_90a SASS, fp16 q). Carried two
    tiles ahead, the pipeliner dropped cp.async for K/V (shared memory 55 -> 37 KB, 24 CTA
    barriers a tile): not done."""
    q0, q1, q2, q3 = _split_int4_groups(q, BLOCK_M)
    # acc's channel c: plane c // 64, parity c % 2, column (c % 64) // 2
    a4 = tl.reshape(acc * 0.125, [BLOCK_M, 2, 32, 2])  # the planes hold V / 8
    a4 = tl.permute(a4, (0, 2, 3, 1))  # (m, col, parity, plane)
    a_low, a_high = tl.split(a4)
    even_low, odd_low = tl.split(a_low)
    even_high, odd_high = tl.split(a_high)
    V16 = V.to(tl.pointer_type(tl.uint16))
    page_next = _tile_pages(bt_row, lo, kv_end, PAGE_SIZE, BLOCK_N, INT64_KV) \
        if PREFETCH_PAGES else 0
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, in_range, page, slot, page_next = _tile_rows_ahead(
            bt_row, start_n, kv_end, page_next, PAGE_SIZE, BLOCK_N, MASKED, INT64_KV,
            PREFETCH_PAGES)
        p, alpha, m_i, l_i = _int4_tile_probabilities(
            m_i, l_i, q0, q1, q2, q3, offs_n, in_range, page, slot, qk_scale, tok, diag, kv_end,
            K, KS, stride_kp, stride_kt, stride_ksp, stride_kst, MASKED, BLOCK_M, BLOCK_N,
            DOT_PRECISION, q_out, KO, stride_kop, stride_kot, out_scale, N_OUT, SCALE_PAIRS)
        v0, v1, v2, v3 = _int4_scales(VS, page * stride_vsp + slot * stride_vst, in_range,
                                      MASKED, SCALE_PAIRS)
        v_el, v_ol, v_eh, v_oh = _int4_values_scaled(
            V16, page * (stride_vp // 2) + slot * (stride_vt // 2), v0, v1, v2, v3, in_range,
            MASKED)
        p16 = p.to(tl.float16)
        even_low = tl.dot(p16, v_el, even_low * alpha[:, None], input_precision=DOT_PRECISION)
        odd_low = tl.dot(p16, v_ol, odd_low * alpha[:, None], input_precision=DOT_PRECISION)
        even_high = tl.dot(p16, v_eh, even_high * alpha[:, None],
                           input_precision=DOT_PRECISION)
        odd_high = tl.dot(p16, v_oh, odd_high * alpha[:, None], input_precision=DOT_PRECISION)
    a4 = tl.join(tl.join(even_low, odd_low), tl.join(even_high, odd_high))
    acc = tl.reshape(tl.permute(a4, (0, 3, 1, 2)), [BLOCK_M, 128]) * 8.0
    return acc, m_i, l_i


@triton.jit
def _attend_paged_int4(acc, m_i, l_i, q, lo, hi, qk_scale, tok, diag, kv_end, K, V, KS, VS,
                       bt_row, stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp,
                       stride_kst, stride_vsp, stride_vst, MASKED: tl.constexpr,
                       PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, INT64_KV: tl.constexpr = True, q_out=0.0,
                       KO=0, stride_kop=0, stride_kot=0, out_scale=1.0,
                       N_OUT: tl.constexpr = 0, SCALE_PAIRS: tl.constexpr = False):
    """``_attend_paged`` for an int4 cache at head dim 128, as split dots: no tile is widened,
    interleaved or scaled per element. Bytes 32k .. 32k + 31 of a key hold group k in their low
    nibbles and group k + 2 in their high ones (``kvonce.paged.quant``), so each nibble plane is
    one dot against q's (or the output's) channels of one group, with that group's per-key scale
    on the scores' (or the probabilities') columns. q and the output are split into their four
    groups once per call (``_split_int4_groups``). Same state in and out as ``_attend_paged``;
    N_OUT > 0: the outlier channels' scores start each tile's (``paged_outliers``).
    SCALE_PAIRS: each key's four scales as two 32-bit loads (``_int4_scales``)."""
    dtype: tl.constexpr = q.dtype
    q0, q1, q2, q3 = _split_int4_groups(q, BLOCK_M)
    a0, a1, a2, a3 = _split_int4_groups(acc, BLOCK_M)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, in_range, page, slot = _tile_rows(bt_row, start_n, kv_end, PAGE_SIZE, BLOCK_N,
                                                  MASKED, INT64_KV)
        p, alpha, m_i, l_i = _int4_tile_probabilities(
            m_i, l_i, q0, q1, q2, q3, offs_n, in_range, page, slot, qk_scale, tok, diag, kv_end,
            K, KS, stride_kp, stride_kt, stride_ksp, stride_kst, MASKED, BLOCK_M, BLOCK_N,
            DOT_PRECISION, q_out, KO, stride_kop, stride_kot, out_scale, N_OUT, SCALE_PAIRS)
        v_rows = page * stride_vp + slot * stride_vt
        v0, v1, v2, v3 = _int4_scales(VS, page * stride_vsp + slot * stride_vst, in_range,
                                      MASKED, SCALE_PAIRS)
        a0, a2 = _int4_chunk_values(a0, a2, p, alpha, V, v_rows, v0, v2, in_range, 0, dtype,
                                    MASKED, DOT_PRECISION)
        a1, a3 = _int4_chunk_values(a1, a3, p, alpha, V, v_rows, v1, v3, in_range, 1, dtype,
                                    MASKED, DOT_PRECISION)
    acc = _join_int4_groups(a0, a1, a2, a3, BLOCK_M)
    return acc, m_i, l_i
