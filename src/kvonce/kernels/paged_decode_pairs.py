"""The paged-decode loop of fp8 and int8 caches with V read as channel pairs
(``PagedDecodeConfig.v_pairs``).

Why. P·V's reduction runs over keys, but a cache row holds one key's channels: the MMA operand
wants two consecutive keys of one channel in a register, which for a 1-byte V tile Triton gathers
byte by byte (compiled for sm_90a, the unmasked loop of the (128, 4, 2) fp8 kernel spent 128
``LDS.U8``, ~100 byte-packing ``IMAD`` and most of its 143 ``IMAD.MOV`` of 992 instructions a tile
a warp on V; int8's 1153 had the same 128 ``LDS.U8``; docs/notes.md). Read as 16-bit units
instead, the tile ``[BLOCK_N, BLOCK_D / 2]`` (unit ``p`` of key ``n`` = channels ``2p`` and
``2p + 1``) is an ordinary 16-bit B operand, which the MMA operand load transposes (ldmatrix):
each register then holds two keys' units of one channel pair, and a ``prmt`` and one convert
(``quant_convert._pair_units_to_f16``) give the fp16 pair of the even (or odd) channel. So the
loop does two dots a tile, ``O_even += P V[:, 0::2]`` and ``O_odd += P V[:, 1::2]``, and the
caller interleaves the output once at the end.

fp16 compute only: fp16 queries, or bf16 queries with ``f16_math``
(``paged_decode._f16_rows``). Head dims with an even ``BLOCK_D == head_dim``, V strides even
(16-bit units). int8's per-key scales go on the scores' and probabilities' columns, as in
``_online_update``; the probabilities times V scales are kept at most 1 per tile (the tile's
largest scale comes back on the fp32 products).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .dual_group_fwd import _softmax_step
from .paged_outliers import _outlier_scores
from .paged_tiles import _tile_pages, _tile_rows_ahead
from .quant_convert import _fp8_bytes_to, _ints_to, _pair_units_to_f16


@triton.jit
def _attend_paged_pairs(acc_even, acc_odd, m_i, l_i, q, lo, hi, qk_scale, tok, diag, kv_end,
                        K, V, KS, VS, bt_row, stride_kp, stride_kt, stride_vp, stride_vt,
                        stride_ksp, stride_kst, stride_vsp, stride_vst, offs_d,
                        MASKED: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, KV_FORMAT: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, INT64_KV: tl.constexpr,
                        ROW_SCALE: tl.constexpr, q_out=0.0, KO=0, stride_kop=0, stride_kot=0,
                        out_scale=1.0, N_OUT: tl.constexpr = 0,
                        PREFETCH_PAGES: tl.constexpr = False):
    """Key tiles ``[lo, hi)`` of an fp8 (KV_FORMAT 1) or int8 (2) cache (K, V, KS, VS: this KV
    head's base pointers) into the state ``(acc_even, acc_odd [BLOCK_M, BLOCK_D / 2], m_i,
    l_i)``: the output's even and odd channels. q: fp16 ``[BLOCK_M, BLOCK_D]``; the rest (the
    outlier channels' ``q_out .. N_OUT`` included) as ``paged_decode._attend_paged``.
    PREFETCH_PAGES: the next tile's page ids are loaded an iteration ahead and carried
    (``PagedDecodeConfig.prefetch_pages``)."""
    offs_p = tl.arange(0, BLOCK_D // 2)
    V16 = V.to(tl.pointer_type(tl.uint16))
    if KV_FORMAT == 1:  # an fp8 load takes no `other`: through a uint8 view
        K = K.to(tl.pointer_type(tl.uint8))
    page_next = _tile_pages(bt_row, lo, kv_end, PAGE_SIZE, BLOCK_N, INT64_KV) \
        if PREFETCH_PAGES else 0
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, in_range, page, slot, page_next = _tile_rows_ahead(
            bt_row, start_n, kv_end, page_next, PAGE_SIZE, BLOCK_N, MASKED, INT64_KV,
            PREFETCH_PAGES)
        k_ptrs = K + (page * stride_kp + slot * stride_kt)[None, :] + offs_d[:, None]
        v_ptrs = (V16 + (page * (stride_vp // 2) + slot * (stride_vt // 2))[:, None]
                  + offs_p[None, :])
        if MASKED:
            k_raw = tl.load(k_ptrs, mask=in_range[None, :], other=0)
            units = tl.load(v_ptrs, mask=in_range[:, None], other=0)
        else:
            k_raw = tl.load(k_ptrs)
            units = tl.load(v_ptrs)
        if KV_FORMAT == 1:
            k_t = _fp8_bytes_to(k_raw, tl.float16)
        else:
            k_t = _ints_to(k_raw, tl.float16)
        qk = tl.dot(q, k_t, input_precision=DOT_PRECISION)
        if KV_FORMAT == 2:  # per-key scales (0 past kv_end)
            ks = tl.load(KS + page * stride_ksp + slot * stride_kst, mask=in_range, other=0.0)
            qk = qk * ks.to(tl.float32)[None, :]
        if N_OUT > 0:
            qk += _outlier_scores(q_out, KO, page, slot, in_range, stride_kop, stride_kot,
                                  MASKED, N_OUT, DOT_PRECISION) * out_scale[:, None]
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, qk_scale, tok, offs_n, diag, kv_end,
                                           MASKED, ROW_SCALE=ROW_SCALE)
        if KV_FORMAT == 2:
            vs = tl.load(VS + page * stride_vsp + slot * stride_vst, mask=in_range,
                         other=0.0).to(tl.float32)
            # The probabilities go to fp16 times int8's per-key V scales: a scale past fp16's
            # max (bf16 |v| > 65504 * 127) would overflow, small values (|v| < ~1e-2) would
            # land among fp16's subnormals. So they take the scales over the tile's largest
            # (products <= 1), which comes back on the fp32 dot results.
            vs_max = tl.max(vs, 0)
            vs_max = tl.where(vs_max > 0.0, vs_max, 1.0)  # a tile past kv_end: all zero
            p = p * (vs * (1.0 / vs_max))[None, :]
        p = p.to(tl.float16)
        pv_even = tl.dot(p, _pair_units_to_f16(units, False, KV_FORMAT),
                         input_precision=DOT_PRECISION)
        pv_odd = tl.dot(p, _pair_units_to_f16(units, True, KV_FORMAT),
                        input_precision=DOT_PRECISION)
        if KV_FORMAT == 2:
            pv_even = pv_even * vs_max
            pv_odd = pv_odd * vs_max
        acc_even = acc_even * alpha[:, None] + pv_even
        acc_odd = acc_odd * alpha[:, None] + pv_odd
    return acc_even, acc_odd, m_i, l_i
