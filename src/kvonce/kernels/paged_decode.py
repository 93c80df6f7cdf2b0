"""Paged KV-cache decode: GQA-packed flash-decoding, single pass or split-K, and the LSE merge.

GQA packing. One program owns one (sequence, KV head, split) and computes every query row that
reads that KV head: the ``GROUP = nheads // nheads_k`` q heads times the ``q_len`` new tokens,
packed as the rows of one tile and padded to ``BLOCK_M >= 16`` so that ``tl.dot`` runs on the
tensor cores. Each K/V tile is therefore read from memory once per KV head, not once per q head.

    row r of the tile  ->  token t = r // GROUP,  q head = kv_head * GROUP + r % GROUP
    (rows past GROUP * q_len are padding: q = 0, never stored)

Split-K. With ``num_splits = S`` the keys of sequence ``b`` are cut into ``S`` ranges of
``ceil(ceil(seqlen_b / S) / BLOCK_N) * BLOCK_N`` keys; a split whose range is empty (short
sequences) stores ``lse = -inf`` and ``o = 0``, which the combine weighs as zero. ``S`` comes from
shapes only, the ranges from ``cache_seqlens`` on the device: no host sync, CUDA-graph capturable.
With ``S = 1`` the kernel writes the final output (q's dtype) and LSE directly; otherwise each
program stores float32 partials. Up to ``config.max_merged_splits`` splits, each program then
bumps an arrival count of its (sequence, KV head, M-block) and the last of the ``S`` to arrive
merges them (``paged_combine._combine_splits``) and resets the count: one launch. Past that,
the merging program's serial walk over the splits costs more than a second launch (H100,
docs/notes.md), and ``paged_combine._combine_splits_kernel`` merges them, tile by tile.

Causal is bottom-right: row t sees key ``j <= t + seqlen - q_len``. Key tiles wholly visible to
every row take the unmasked loop; the last tiles of the range (the diagonal, the sequence end) the
masked one.

Softmax runs in base 2 (``log2(e)`` folded into the scale, ``exp2`` throughout); the stored LSE is
natural log: ``lse = (m + log2(l)) * ln 2``.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# The state-in/state-out online-softmax step is shared with the varlen kernels.
from ._launch import alignment_key, dot_input_precision, launch, next_pow2
from .dual_group_fwd import _online_update, _softmax_step
from .paged_combine import (_combine_splits, _combine_splits_kernel, combine_launch_shape,
                            combine_pdl)
from .paged_decode_int4 import _attend_paged_int4, _int4_tile
from .paged_decode_pairs import _attend_paged_pairs
from .paged_outliers import _outlier_queries, _outlier_scores, _without_outlier_channels
from .quant_convert import _fp8_bytes_to, _ints_to
from .paged_tiles import _tile_pages, _tile_rows

# The masked band's loop (the plain and byte-gathered tiles' ``_attend_paged``: keys past the
# last whole tile, one or two tiles in decode) at this many stages; 0: the launch's num_stages.
# A pipeline buys nothing at one trip, and on sm_90a the pipelined masked loop is where the
# kernel's register peak sits, which sets every program's residency: GQA 12/2 launches merged
# in the launch hold 180 registers (2 programs an SM at the 128-key tile), 168 with this at 1
# (3 an SM); GQA 32/8 stays at 168, with ~20 more instructions a tile in the unmasked loop
# (ptxas rematerializes thread-index math there). Measured (H200, 2026-11-30): 12/2 merged
# launches 10-19% faster, but 32/8 48 x 8192 (128-key one pass) 9% slower: off; the row
# takes 4 partials at once at those groups instead (PagedDecodeConfig.wide_merge_at_once).
MASKED_LOOP_STAGES = 0


@triton.jit
def _load_paged_kv_tile(K, V, bt_row, start_n, kv_end, stride_kp, stride_kt, stride_vp, stride_vt,
                        offs_d, head_dim, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                        EVEN_D: tl.constexpr, MASKED: tl.constexpr, KV_CACHE: tl.constexpr,
                        KV_EVICT: tl.constexpr, INT64_KV: tl.constexpr = True, pages=0,
                        HAVE_PAGES: tl.constexpr = False):
    """K tile transposed ``[BLOCK_D, BLOCK_N]`` and V tile ``[BLOCK_N, BLOCK_D]`` of key positions
    ``start_n ..``; each key's page comes from the block table (a tile may span several pages),
    or from ``pages [BLOCK_N]`` with HAVE_PAGES (looked up ahead by the caller).
    With MASKED, keys at or past ``kv_end`` read as 0 (the caller masks their scores).
    INT64_KV=False: element offsets in int32 (the caller knows the caches stay below 2^31)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if MASKED:
        in_range = offs_n < kv_end
    if HAVE_PAGES:
        page = pages
    elif MASKED:
        page = tl.load(bt_row + offs_n // PAGE_SIZE, mask=in_range, other=0)
    else:
        page = tl.load(bt_row + offs_n // PAGE_SIZE)
    slot = offs_n % PAGE_SIZE
    # int64: page * stride_kp passes 2^31 for caches over ~2 G elements.
    if INT64_KV:
        page = page.to(tl.int64)
    k_rows = page * stride_kp + slot * stride_kt
    v_rows = page * stride_vp + slot * stride_vt
    k_ptrs = K + k_rows[None, :] + offs_d[:, None]
    v_ptrs = V + v_rows[:, None] + offs_d[None, :]
    if MASKED:
        if EVEN_D:
            k_t = tl.load(k_ptrs, mask=in_range[None, :], other=0.0, cache_modifier=KV_CACHE,
                          eviction_policy=KV_EVICT)
            v = tl.load(v_ptrs, mask=in_range[:, None], other=0.0, cache_modifier=KV_CACHE,
                        eviction_policy=KV_EVICT)
        else:
            k_t = tl.load(k_ptrs, mask=in_range[None, :] & (offs_d[:, None] < head_dim), other=0.0,
                          cache_modifier=KV_CACHE, eviction_policy=KV_EVICT)
            v = tl.load(v_ptrs, mask=in_range[:, None] & (offs_d[None, :] < head_dim), other=0.0,
                        cache_modifier=KV_CACHE, eviction_policy=KV_EVICT)
    else:
        if EVEN_D:  # whole tiles: no predicate on the hot loads
            k_t = tl.load(k_ptrs, cache_modifier=KV_CACHE, eviction_policy=KV_EVICT)
            v = tl.load(v_ptrs, cache_modifier=KV_CACHE, eviction_policy=KV_EVICT)
        else:
            k_t = tl.load(k_ptrs, mask=offs_d[:, None] < head_dim, other=0.0,
                          cache_modifier=KV_CACHE, eviction_policy=KV_EVICT)
            v = tl.load(v_ptrs, mask=offs_d[None, :] < head_dim, other=0.0,
                        cache_modifier=KV_CACHE, eviction_policy=KV_EVICT)
    return offs_n, k_t, v


@triton.jit
def _f16_rows(q):
    """bf16 query rows ``q [BLOCK_M, BLOCK_D]`` as fp16 rows, each times a power of two, and the
    inverse factors (fp32 ``[BLOCK_M]``, for the scores). An fp8 tile then converts with fp16's
    one packed cvt per two values (bf16 has none: 5 instructions per two, ``_fp8_bytes_to``) and
    both dots run in fp16. Nothing is lost: the factor puts each row's largest magnitude in
    [2^13, 2^14), so every element down to 2^-27 of it is an fp16 normal with 10 significand
    bits (bf16 has 7: exact), and smaller ones are off by at most 2^-38 of the row's largest, far
    under its bf16 rounding; the products and sums are fp32 as before (|q| < 2^14, |k| <= 448).
    The probabilities go to fp16 instead of bf16 (finer in [0, 1]). The exponent comes from the
    bits of the row's fp32 max, clamped to [-100, 127] so both factors stay fp32 normals (a row
    under 2^-100 is scaled as if it were 2^-100: still fp16 normal at the top)."""
    qf = q.to(tl.float32)
    amax = tl.max(tl.abs(qf), 1)
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2); -127 for 0
    e = tl.minimum(tl.maximum(e, -100), 127)
    up = ((140 - e) << 23).to(tl.float32, bitcast=True)  # 2^(13 - e)
    down = ((114 + e) << 23).to(tl.float32, bitcast=True)  # 2^(e - 13)
    return (qf * up[:, None]).to(tl.float16), down


@triton.jit
def _load_quant_kv_tile(K, V, KS, VS, bt_row, start_n, kv_end, stride_kp, stride_kt, stride_vp,
                        stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst, offs_d,
                        head_dim, dtype: tl.constexpr, PAGE_SIZE: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
                        KV_FORMAT: tl.constexpr, EVEN_D: tl.constexpr = False,
                        INT64_KV: tl.constexpr = True):
    """``_load_paged_kv_tile`` for a quantized cache (``kvonce.paged.quant``): K transposed
    ``[BLOCK_D, BLOCK_N]`` and V ``[BLOCK_N, BLOCK_D]`` in ``dtype`` (q's).

    KV_FORMAT 1 = fp8 e4m3: the tile is converted as stored; its per-head scales are the
    kernel's (folded into the softmax scale and the output). 2 = int8: converted as stored (exact
    in fp16/bf16); its per-key scales (``_load_key_scales``) are applied to the
    ``[BLOCK_M, BLOCK_N]`` scores and probabilities instead of the ``[BLOCK_D, BLOCK_N]`` tiles.
    3 = int4 where ``_attend_paged_int4`` does not run (prefill, head dims other than 128, fp32 q,
    V at an odd byte): each channel's nibble (channel i low in byte i, i + d/2 high) minus 8, times
    its key's scale, plus its offset, per element (``_int4_tile``). Prefill tiles (128 rows, 8
    warps) compile better this way than through the nibble-plane loop (sm_90a, GQA 32/8: 1094
    instructions a tile a warp, 3 CTA barriers, 177 registers, against 1141, 12 and 255 with 44 B
    of spill; the group-scale split dots before took 1170, 17, 255 and 88 B). INT64_KV=False:
    offsets in int32 (the caller knows caches and scales stay below 2^31 elements)."""
    offs_n, in_range, page, slot = _tile_rows(bt_row, start_n, kv_end, PAGE_SIZE, BLOCK_N,
                                              MASKED, INT64_KV)
    k_rows = page * stride_kp + slot * stride_kt
    v_rows = page * stride_vp + slot * stride_vt
    # One return at the end: code after a return under a constexpr `if` is still compiled.
    if KV_FORMAT == 3:
        # Generic int4 path: each channel c addresses its own byte (c, or c - d/2 in the high
        # nibble) and its key's scale and offset, in V's orientation for both.
        ks_rows = page * stride_ksp + slot * stride_kst
        vs_rows = page * stride_vsp + slot * stride_vst
        k_t = tl.trans(_int4_tile(K, KS, k_rows, ks_rows, in_range, offs_d, head_dim, dtype,
                                  MASKED))
        v = _int4_tile(V, VS, v_rows, vs_rows, in_range, offs_d, head_dim, dtype, MASKED)
    else:
        k_ptrs = K + k_rows[None, :] + offs_d[:, None]
        v_ptrs = V + v_rows[:, None] + offs_d[None, :]
        if KV_FORMAT == 1:
            # Through a uint8 view (an fp8 load takes no `other`), bitcast back: only casts
            # between the load and the dot, so Triton keeps the 1-byte tile in shared memory and
            # converts it in the MMA operand layout (a `tl.where` here made it stage a 16-bit
            # tile through shared memory: twice the bytes, one more round trip).
            k_ptrs = k_ptrs.to(tl.pointer_type(tl.uint8))
            v_ptrs = v_ptrs.to(tl.pointer_type(tl.uint8))
        if MASKED or not EVEN_D:
            d_ok = offs_d < head_dim
            if MASKED:
                k_mask = in_range[None, :] & d_ok[:, None]
                v_mask = in_range[:, None] & d_ok[None, :]
            else:
                k_mask = d_ok[:, None]
                v_mask = d_ok[None, :]
            k_raw = tl.load(k_ptrs, mask=k_mask, other=0)
            v_raw = tl.load(v_ptrs, mask=v_mask, other=0)
        else:  # whole tiles: no predicate
            k_raw = tl.load(k_ptrs)
            v_raw = tl.load(v_ptrs)
        if KV_FORMAT == 1:
            k_t = _fp8_bytes_to(k_raw, dtype)
            v = _fp8_bytes_to(v_raw, dtype)
        else:
            k_t = _ints_to(k_raw, dtype)
            v = _ints_to(v_raw, dtype)
    return offs_n, k_t, v


@triton.jit
def _load_key_scales(KS, VS, bt_row, offs_n, kv_end, stride_ksp, stride_kst, stride_vsp,
                     stride_vst, PAGE_SIZE: tl.constexpr, INT64_KV: tl.constexpr = True):
    """int8's per-key K and V scales of key positions ``offs_n``, float32 ``[BLOCK_N]`` (0 past
    ``kv_end``). The block-table entries are the tile load's, so they come from L1."""
    in_range = offs_n < kv_end
    page = tl.load(bt_row + offs_n // PAGE_SIZE, mask=in_range, other=0)
    if INT64_KV:
        page = page.to(tl.int64)
    slot = offs_n % PAGE_SIZE
    ks = tl.load(KS + page * stride_ksp + slot * stride_kst, mask=in_range, other=0.0)
    vs = tl.load(VS + page * stride_vsp + slot * stride_vst, mask=in_range, other=0.0)
    return ks.to(tl.float32), vs.to(tl.float32)


@triton.jit
def _online_update_swapped(acc_t, m_i, l_i, q, k_t, v, qk_scale, tok, offs_n, diag, kv_end,
                           MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, k_scale=1.0,
                           v_scale=1.0, KEY_SCALES: tl.constexpr = False,
                           ROW_SCALE: tl.constexpr = False):
    """``_online_update`` with the keys on the MMA's M side (TensorRT-LLM XQA's swap): scores
    ``Sᵀ = K·qᵀ [BLOCK_N, BLOCK_M]`` and ``acc_t [BLOCK_D, BLOCK_M] += Vᵀ·Pᵀ``. Hopper's wgmma
    needs M >= 64, which a decode tile's 16 packed rows never reach and its keys do (compiled for
    sm_90a: m64n16k16 wgmma for both dots, where the unswapped loop runs mma.sync)."""
    s_t = tl.dot(tl.trans(k_t), tl.trans(q), input_precision=DOT_PRECISION)
    if KEY_SCALES:
        s_t = s_t * k_scale[:, None]
    p_t, alpha, m_new, l_i = _softmax_step(s_t, m_i, l_i, qk_scale, tok, offs_n, diag, kv_end,
                                           MASKED, KEYS_AXIS=0, ROW_SCALE=ROW_SCALE)
    if KEY_SCALES:
        p_t = p_t * v_scale[:, None]
    acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(v), p_t.to(v.dtype),
                                            input_precision=DOT_PRECISION)
    return acc_t, m_new, l_i


@triton.jit
def _attend_paged(acc, m_i, l_i, q, lo, hi, qk_scale, tok, diag, kv_end,
                  K, V, KS, VS, bt_row, stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp,
                  stride_kst, stride_vsp, stride_vst, offs_d, head_dim,
                  MASKED: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, KV_CACHE: tl.constexpr,
                  KV_EVICT: tl.constexpr, KV_FORMAT: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  INT64_KV: tl.constexpr = True, PREFETCH_PAGES: tl.constexpr = False, Kd=0,
                  Vd=0, kv_col=0,
                  USE_DESC: tl.constexpr = False, SWAP_AB: tl.constexpr = False,
                  ROW_SCALE: tl.constexpr = False, q_out=0.0, KO=0, stride_kop=0, stride_kot=0,
                  out_scale=1.0, N_OUT: tl.constexpr = 0, LOOP_STAGES: tl.constexpr = 0):
    """Key tiles ``[lo, hi)`` (``lo`` a multiple of BLOCK_N) into one packed state: the one loop
    of both the single-pass and the split-K path, and of every cache format (only the tile load
    differs: quantized tiles come in q's dtype, with int8's per-key scales applied to the scores
    and probabilities by ``_online_update``). PREFETCH_PAGES (plain caches): the next tile's page
    ids are loaded one iteration ahead, so no K/V address waits on a load of its own iteration.
    USE_DESC (plain caches, unmasked tiles, ``PAGE_SIZE % BLOCK_N == 0``): every tile lies in one
    page, whose rows come through the TMA descriptors ``Kd, Vd`` (the caches viewed 2-D as
    ``[num_pages * PAGE_SIZE, nheads_k * d]``, this KV head's columns from ``kv_col``); the page
    id is looked up one tile ahead. SWAP_AB: ``acc`` is transposed, ``[BLOCK_D, BLOCK_M]``
    (``_online_update_swapped``). ROW_SCALE: ``qk_scale`` is per row (``_f16_rows``).
    N_OUT > 0 (quantized caches): the outlier channels' scores (``paged_outliers``: ``q_out``
    against side cache ``KO``, times ``out_scale``) join each tile's scores. LOOP_STAGES > 0:
    the loop's own pipeline depth (``MASKED_LOOP_STAGES``), else the launch's."""
    if USE_DESC:
        tl.static_assert(PAGE_SIZE % BLOCK_N == 0)
        next_page = tl.load(bt_row + lo // PAGE_SIZE, mask=lo < kv_end, other=0)
    else:
        next_page = 0
    if PREFETCH_PAGES and KV_FORMAT == 0:  # (the quantized tiles here look theirs up in place)
        next_pages = _tile_pages(bt_row, lo, kv_end, PAGE_SIZE, BLOCK_N)
    else:
        next_pages = tl.zeros([BLOCK_N], dtype=tl.int32)  # unused
    for start_n in tl.range(lo, hi, BLOCK_N,
                            num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
        if KV_FORMAT == 0 and USE_DESC and not MASKED:
            page = next_page
            nxt = start_n + BLOCK_N
            next_page = tl.load(bt_row + nxt // PAGE_SIZE, mask=nxt < kv_end, other=0)
            row = page * PAGE_SIZE + start_n % PAGE_SIZE
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k_t = tl.trans(Kd.load([row, kv_col]))
            v = Vd.load([row, kv_col])
        elif KV_FORMAT == 0 and PREFETCH_PAGES:
            pages = next_pages
            next_pages = _tile_pages(bt_row, start_n + BLOCK_N, kv_end, PAGE_SIZE, BLOCK_N)
            offs_n, k_t, v = _load_paged_kv_tile(K, V, bt_row, start_n, kv_end, stride_kp,
                                                 stride_kt, stride_vp, stride_vt, offs_d,
                                                 head_dim, PAGE_SIZE, BLOCK_N, EVEN_D, MASKED,
                                                 KV_CACHE, KV_EVICT, INT64_KV, pages, True)
        elif KV_FORMAT == 0:
            offs_n, k_t, v = _load_paged_kv_tile(K, V, bt_row, start_n, kv_end, stride_kp,
                                                 stride_kt, stride_vp, stride_vt, offs_d,
                                                 head_dim, PAGE_SIZE, BLOCK_N, EVEN_D, MASKED,
                                                 KV_CACHE, KV_EVICT, INT64_KV)
        else:
            offs_n, k_t, v = _load_quant_kv_tile(
                K, V, KS, VS, bt_row, start_n, kv_end, stride_kp, stride_kt, stride_vp,
                stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst, offs_d, head_dim,
                q.dtype, PAGE_SIZE, BLOCK_N, BLOCK_D, MASKED, KV_FORMAT, EVEN_D, INT64_KV)
        if KV_FORMAT == 2:
            k_scale, v_scale = _load_key_scales(KS, VS, bt_row, offs_n, kv_end, stride_ksp,
                                                stride_kst, stride_vsp, stride_vst, PAGE_SIZE,
                                                INT64_KV)
        else:
            k_scale, v_scale = 1.0, 1.0
        if N_OUT > 0:
            tl.static_assert(KV_FORMAT != 0 and not SWAP_AB)
            _, o_in, o_page, o_slot = _tile_rows(bt_row, start_n, kv_end, PAGE_SIZE, BLOCK_N,
                                                 MASKED, INT64_KV)
            bias = _outlier_scores(q_out, KO, o_page, o_slot, o_in, stride_kop, stride_kot,
                                   MASKED, N_OUT, DOT_PRECISION) * out_scale[:, None]
        else:
            bias = 0.0
        if SWAP_AB:
            acc, m_i, l_i = _online_update_swapped(acc, m_i, l_i, q, k_t, v, qk_scale, tok,
                                                   offs_n, diag, kv_end, MASKED, DOT_PRECISION,
                                                   k_scale, v_scale, KV_FORMAT == 2, ROW_SCALE)
        else:
            acc, m_i, l_i = _online_update(acc, m_i, l_i, q, k_t, v, qk_scale, tok, offs_n,
                                           diag, kv_end, MASKED, DOT_PRECISION, k_scale, v_scale,
                                           KV_FORMAT == 2, ROW_SCALE, bias, N_OUT > 0)
    return acc, m_i, l_i


@triton.jit
def _attend_kv_head(q, lo, full, hi, tok, diag, sm_scale, kv_head, seq, K, V, KS, VS, block_table,
                    stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_ksp,
                    stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh, stride_btb,
                    offs_d, head_dim, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
                    KV_CACHE: tl.constexpr, KV_EVICT: tl.constexpr, KV_FORMAT: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, INT64_KV: tl.constexpr = True,
                    PREFETCH_PAGES: tl.constexpr = False, Kd=0, Vd=0,
                    USE_DESC: tl.constexpr = False, SWAP_AB: tl.constexpr = False,
                    F16_MATH: tl.constexpr = False, V_PAIRS: tl.constexpr = False, q_out=0.0,
                    KO=0, stride_kop=0, stride_kot=0, stride_koh=0, N_OUT: tl.constexpr = 0,
                    SCALE_PAIRS: tl.constexpr = False, HEAD_PAIRS: tl.constexpr = False,
                    pair_hi=0, MASKED_STAGES: tl.constexpr = 0):
    """One packed tile ``q [BLOCK_M, BLOCK_D]`` against sequence ``seq``'s keys ``[lo, hi)`` of
    one KV head: unmasked tiles ``[lo, full)``, then the masked band ``[full, hi)``; returns the
    unnormalized ``(acc, m, l)`` (base 2), fp8's per-head scales applied. Shared by the decode
    and the varlen prefill kernels, which differ only in how rows map to tokens and outputs.
    SWAP_AB: the dots with the keys on the MMA's M side (``_online_update_swapped``; not int4's
    nibble-plane loop, which ignores it). F16_MATH (bf16 q; fp8, or int8 / int4 with V_PAIRS): q as
    fp16 rows times a power of two each (``_f16_rows``), so the tiles convert to fp16 and both dots
    run in fp16; the factors come off with the softmax scale, per row. V_PAIRS (fp8 or int8, fp16
    compute): V read as channel pairs (``paged_decode_pairs``); int4 at head dim 128 (fp16 or bf16
    q): the nibble-plane loop, V read as 16-bit units (``_attend_paged_int4``). N_OUT > 0
    (quantized caches): dense-and-sparse keys, ``q_out [BLOCK_M, 16]`` the rows' values at this KV
    head's outlier channels (``paged_outliers._outlier_queries``), ``KO`` the side cache.
    SCALE_PAIRS (int4's nibble-plane loop, scale rows 8-byte aligned): each key's (scale,
    offset) as one 64-bit load (``paged_decode_int4._int4_key_scales``). HEAD_PAIRS (int4's
    nibble-plane loop, ``PagedDecodeConfig.head_pairs``): ``kv_head`` numbers a pair of KV heads
    (2 kv_head and the next), ``pair_hi [BLOCK_M]`` marks the rows of the second."""
    if HEAD_PAIRS:
        tl.static_assert(KV_FORMAT == 3 and BLOCK_D == 128 and EVEN_D and V_PAIRS
                         and N_OUT == 0)
        kv_head = 2 * kv_head
    K += kv_head * stride_kh
    V += kv_head * stride_vh
    KS += kv_head * stride_ksh
    VS += kv_head * stride_vsh
    bt_row = block_table + seq.to(tl.int64) * stride_btb
    qk_scale = sm_scale * 1.4426950408889634
    if KV_FORMAT == 1:  # fp8's per-head K scale multiplies every score of this KV head
        qk_scale = qk_scale * tl.load(KS)
    out_scale = 1.0
    if N_OUT > 0:
        # Each row's outlier scores times out_scale [BLOCK_M] join the dense scores in their
        # units: fp8's K scale (folded into qk_scale above) undone, and the row factors below.
        tl.static_assert(KV_FORMAT != 0 and not SWAP_AB)
        KO += tl.multiple_of(kv_head * stride_koh, 8)  # KeyOutliers: strides multiples of 8
        out_scale = tl.full([BLOCK_M], 1.0, tl.float32)
        if KV_FORMAT == 1:
            out_scale = out_scale / tl.load(KS)
        if q_out.dtype == tl.bfloat16 and KO.dtype.element_ty == tl.float16:
            # fp16 outlier values (11 significant bits; bf16's 8 cost int8 its accuracy):
            # bf16 q's values at those channels as fp16 rows times a power of two (exact),
            # the factor back on the scores.
            q_out, out_factor = _f16_rows(q_out)
            out_scale = out_scale * out_factor
    if F16_MATH:
        tl.static_assert(KV_FORMAT == 1 or ((KV_FORMAT == 2 or KV_FORMAT == 3) and V_PAIRS))
        q, row_factor = _f16_rows(q)
        qk_scale = qk_scale * row_factor
        if N_OUT > 0:  # the dense scores are q's times 1 / row_factor
            out_scale = out_scale / row_factor
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if KV_FORMAT == 3 and BLOCK_D == 128 and EVEN_D and V_PAIRS:  # int4 nibble planes
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        acc, m_i, l_i = _attend_paged_int4(
            acc, m_i, l_i, q, lo, full, qk_scale, tok, diag, hi, K, V, KS, VS, bt_row, stride_kp,
            stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
            False, PAGE_SIZE, BLOCK_M, BLOCK_N, DOT_PRECISION, INT64_KV, q_out, KO, stride_kop,
            stride_kot, out_scale, N_OUT, SCALE_PAIRS, PREFETCH_PAGES, F16_MATH, HEAD_PAIRS,
            pair_hi, stride_kh, stride_vh, stride_ksh, stride_vsh)
        if full < hi:  # the masked band (see the plain loop's below)
            acc, m_i, l_i = _attend_paged_int4(
                acc, m_i, l_i, q, full, hi, qk_scale, tok, diag, hi, K, V, KS, VS, bt_row,
                stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp,
                stride_vst, True, PAGE_SIZE, BLOCK_M, BLOCK_N, DOT_PRECISION, INT64_KV, q_out, KO,
                stride_kop, stride_kot, out_scale, N_OUT, SCALE_PAIRS, PREFETCH_PAGES, F16_MATH,
                HEAD_PAIRS, pair_hi, stride_kh, stride_vh, stride_ksh, stride_vsh)
    elif V_PAIRS:
        tl.static_assert((KV_FORMAT == 1 or KV_FORMAT == 2) and EVEN_D and not SWAP_AB)
        acc_even = tl.zeros([BLOCK_M, BLOCK_D // 2], dtype=tl.float32)
        acc_odd = tl.zeros([BLOCK_M, BLOCK_D // 2], dtype=tl.float32)
        acc_even, acc_odd, m_i, l_i = _attend_paged_pairs(
            acc_even, acc_odd, m_i, l_i, q, lo, full, qk_scale, tok, diag, hi, K, V, KS, VS,
            bt_row, stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst,
            stride_vsp, stride_vst, offs_d, False, PAGE_SIZE, BLOCK_N, BLOCK_D, KV_FORMAT,
            DOT_PRECISION, INT64_KV, F16_MATH, q_out, KO, stride_kop, stride_kot, out_scale,
            N_OUT, PREFETCH_PAGES)
        if full < hi:  # the masked band (see the plain loop's below)
            acc_even, acc_odd, m_i, l_i = _attend_paged_pairs(
                acc_even, acc_odd, m_i, l_i, q, full, hi, qk_scale, tok, diag, hi, K, V, KS, VS,
                bt_row, stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst,
                stride_vsp, stride_vst, offs_d, True, PAGE_SIZE, BLOCK_N, BLOCK_D, KV_FORMAT,
                DOT_PRECISION, INT64_KV, F16_MATH, q_out, KO, stride_kop, stride_kot, out_scale,
                N_OUT, PREFETCH_PAGES)
        acc = tl.reshape(tl.join(acc_even, acc_odd), [BLOCK_M, BLOCK_D])  # channel 2p + odd
    else:
        if SWAP_AB:
            acc = tl.zeros([BLOCK_D, BLOCK_M], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        acc, m_i, l_i = _attend_paged(acc, m_i, l_i, q, lo, full, qk_scale, tok, diag, hi,
                                      K, V, KS, VS, bt_row, stride_kp, stride_kt, stride_vp,
                                      stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
                                      offs_d, head_dim, False, PAGE_SIZE, BLOCK_N, BLOCK_D, EVEN_D,
                                      KV_CACHE, KV_EVICT, KV_FORMAT, DOT_PRECISION, INT64_KV,
                                      PREFETCH_PAGES, Kd, Vd, kv_head * BLOCK_D, USE_DESC, SWAP_AB,
                                      F16_MATH, q_out, KO, stride_kop, stride_kot, out_scale,
                                      N_OUT)
        # The masked band is empty in every split but a sequence's last (in decode). The branch
        # skips the masked loop's pipeline prologue and epilogue too, which run even for zero
        # trips: ~600 of the ~4000 SASS instructions a warp runs in a four-tile plain program
        # (sm_90a; 5% of the short GQA 12/2 launches on an H200, docs/notes.md).
        if full < hi:
            acc, m_i, l_i = _attend_paged(
                acc, m_i, l_i, q, full, hi, qk_scale, tok, diag, hi, K, V, KS, VS, bt_row,
                stride_kp, stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp,
                stride_vst, offs_d, head_dim, True, PAGE_SIZE, BLOCK_N, BLOCK_D, EVEN_D,
                KV_CACHE, KV_EVICT, KV_FORMAT, DOT_PRECISION, INT64_KV, PREFETCH_PAGES,
                SWAP_AB=SWAP_AB, ROW_SCALE=F16_MATH, q_out=q_out, KO=KO, stride_kop=stride_kop,
                stride_kot=stride_kot, out_scale=out_scale, N_OUT=N_OUT,
                LOOP_STAGES=MASKED_STAGES)
        if SWAP_AB:
            acc = tl.trans(acc)
    if KV_FORMAT == 1:  # and its V scale every output row
        acc = acc * tl.load(VS)
    return acc, m_i, l_i


@triton.jit
def _paged_decode_kernel(
    Q,                 # [batch, q_len, nheads, HEAD_DIM], last dim contiguous
    K, V,              # [num_pages, PAGE_SIZE, nheads_k, HEAD_DIM], last dim contiguous
                       # (quantized: kvonce.paged.quant's layouts; int4 HEAD_DIM // 2 bytes)
    KS, VS,            # quantized caches' scales (any pointer when KV_FORMAT is 0)
    Out,               # [batch, q_len, nheads, (S,) HEAD_DIM]: final (S = 1) or fp32 partials
    Lse,               # float32, indexed by (batch, token, head, split) strides
    cache_seqlens,     # int32 [batch]
    block_table,       # int32 [batch, max_pages]
    FinalOut,          # split-K: [batch, q_len, nheads, HEAD_DIM] contiguous, q's dtype
    FinalLse,          # split-K: float32 [batch, nheads, q_len] contiguous
    Arrivals,          # split-K: int32 [batch, nheads_k, num_m_blocks], zero between launches
    KO, KOC,           # N_OUT > 0: outlier values [num_pages, PAGE_SIZE, nheads_k, N_OUT] (q's
                       # dtype) and channels int32 [nheads_k, N_OUT] (kernels/paged_outliers.py)
    sm_scale, q_len, num_splits, num_m_blocks, head_dim,
    stride_qb, stride_qt, stride_qh,
    stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    stride_ob, stride_ot, stride_oh, stride_os,
    stride_lb, stride_lt, stride_lh, stride_ls,
    stride_btb,
    stride_kop, stride_kot, stride_koh,
    GROUP: tl.constexpr, IS_CAUSAL: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    STORE_LSE: tl.constexpr, SPLIT: tl.constexpr, MERGE_HERE: tl.constexpr,
    KV_CACHE: tl.constexpr, KV_EVICT: tl.constexpr, KV_FORMAT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # tl.dot's input_precision: "ieee" or "tf32" (fp32 inputs only)
    SWAP_AB: tl.constexpr = False,  # keys on the MMA's M side (_online_update_swapped)
    F16_MATH: tl.constexpr = False,  # bf16 q x fp8 / int8 cache, dots in fp16 (_f16_rows)
    INT64_KV: tl.constexpr = True,  # False: K/V (and scale) offsets fit int32
    V_PAIRS: tl.constexpr = False,  # fp8/int8 V as channel pairs, int4 V as 16-bit units
    N_OUT: tl.constexpr = 0,  # outlier channels per KV head kept at q's precision (0: none)
    SCALE_PAIRS: tl.constexpr = False,  # int4 d128: (scale, offset) as one 64-bit load
    PREFETCH_PAGES: tl.constexpr = False,  # page ids looked up a tile ahead (not SWAP_AB)
    MERGE_SPLITS_AT_ONCE: tl.constexpr = 1,  # MERGE_HERE: splits loaded before folding
    HEAD_PAIRS: tl.constexpr = False,  # int4: a program a pair of KV heads (GROUP = 2 x theirs)
    PDL_TRIGGER: tl.constexpr = False,  # the launch after this one may start (COMBINE_PDL)
    # a batch cut's tail, a programmatic dependent of its head (paged.batch_cut): each program
    # waits for the head's end before it exits, so that this launch's end implies the head's
    PDL_EXIT_WAIT: tl.constexpr = False,
    MASKED_STAGES: tl.constexpr = 0,  # the masked band's loop depth (MASKED_LOOP_STAGES)
):
    # Grid: (num_splits * num_m_blocks, nheads_k, batch) (HEAD_PAIRS: nheads_k / 2 pairs). Splits
    # vary fastest so that the programs of one sequence's KV head run side by side.
    if PDL_TRIGGER:   # the split combine waits for these partials itself (gdc_wait)
        gdc_launch_dependents()
    split = tl.program_id(0) // num_m_blocks
    m_block = tl.program_id(0) % num_m_blocks
    kv_head = tl.program_id(1)
    seq = tl.program_id(2)

    seqlen = tl.load(cache_seqlens + seq)
    split_len = tl.cdiv(tl.cdiv(seqlen, num_splits), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seqlen)

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = rows < GROUP * q_len
    pair_hi = (rows % GROUP) >= GROUP // 2  # HEAD_PAIRS: the rows of the pair's second KV head
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = (Q + seq.to(tl.int64) * stride_qb + (tok * stride_qt + head * stride_qh)[:, None]
              + offs_d[None, :])
    if EVEN_D:
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)
    if N_OUT > 0:
        q_out = _outlier_queries(Q + seq.to(tl.int64) * stride_qb + tok * stride_qt
                                 + head * stride_qh, KOC, kv_head, row_ok, N_OUT)
        if KV_FORMAT == 3:
            q = _without_outlier_channels(q, KOC, kv_head, offs_d, N_OUT)
    else:
        q_out = 0.0

    if IS_CAUSAL:
        diag = seqlen - q_len              # row t sees key j <= t + diag
        all_see = tl.minimum(hi, diag + 1)  # keys below this are visible to every row
    else:
        diag = seqlen
        all_see = hi
    full = lo + tl.maximum(all_see - lo, 0) // BLOCK_N * BLOCK_N

    acc, m_i, l_i = _attend_kv_head(
        q, lo, full, hi, tok, diag, sm_scale, kv_head, seq, K, V, KS, VS, block_table,
        stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_ksp, stride_kst,
        stride_ksh, stride_vsp, stride_vst, stride_vsh, stride_btb, offs_d, head_dim,
        PAGE_SIZE, BLOCK_M, BLOCK_N, BLOCK_D, EVEN_D, KV_CACHE, KV_EVICT, KV_FORMAT, DOT_PRECISION,
        INT64_KV=INT64_KV, SWAP_AB=SWAP_AB, F16_MATH=F16_MATH, V_PAIRS=V_PAIRS, q_out=q_out,
        KO=KO, stride_kop=stride_kop, stride_kot=stride_kot, stride_koh=stride_koh, N_OUT=N_OUT,
        SCALE_PAIRS=SCALE_PAIRS, PREFETCH_PAGES=PREFETCH_PAGES, HEAD_PAIRS=HEAD_PAIRS,
        pair_hi=pair_hi, MASKED_STAGES=MASKED_STAGES)
    # out = acc / l (0 where no key was seen, e.g. an empty split), lse natural log (-inf there).
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    o_ptrs = (Out + seq.to(tl.int64) * stride_ob + split * stride_os
              + (tok * stride_ot + head * stride_oh)[:, None] + offs_d[None, :])
    if EVEN_D:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_d[None, :] < head_dim))
    if STORE_LSE or SPLIT:
        l_ptrs = (Lse + seq.to(tl.int64) * stride_lb + split * stride_ls + tok * stride_lt
                  + head * stride_lh)
        tl.store(l_ptrs, lse, mask=row_ok)

    if MERGE_HERE:
        # The last split of this (sequence, KV head, M-block) to finish merges all of them: one
        # launch instead of decode + combine. The barrier orders every thread's partial stores
        # before the (single-thread) release of the arrival count; the acquire side reads the
        # other splits' partials through L2 (.cg).
        tl.debug_barrier()
        slot = (seq * tl.num_programs(1) + kv_head) * num_m_blocks + m_block
        arrived = tl.atomic_add(Arrivals + slot, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            tl.debug_barrier()
            _combine_splits(Out, Lse, FinalOut, FinalLse, seq, tok, head, row_ok, offs_d,
                            num_splits, q_len, GROUP * tl.num_programs(1), head_dim,
                            stride_ob, stride_ot, stride_oh, stride_os,
                            stride_lb, stride_lt, stride_lh, stride_ls, STORE_LSE,
                            BLOCK_M, BLOCK_D, MERGE_SPLITS_AT_ONCE)
            tl.atomic_xchg(Arrivals + slot, 0)  # ready for the next launch (CUDA-graph replays)
    if PDL_EXIT_WAIT:
        gdc_wait()


def _scale_strides(scale, kv_format: int) -> tuple[int, int, int]:
    """(page, slot, KV head) strides of a quantized cache's scales: fp8 ``[nheads_k]`` or 0-dim
    (one per head or per tensor), int8 ``[pages, page_size, nheads_k]``, int4 ``[pages,
    page_size, nheads_k, 2]``; zeros for a plain cache."""
    if kv_format == 0 or scale is None:
        return (0, 0, 0)
    if kv_format == 1:
        return (0, 0, scale.stride(0) if scale.dim() == 1 else 0)
    return tuple(scale.stride()[:3])


def _span(t) -> int:
    """One past the largest element offset of ``t`` from its data pointer."""
    return sum(max(n - 1, 0) * st for n, st in zip(t.shape, t.stride())) + 1


def decode_row_blocks(nheads: int, nheads_k: int, q_len: int,
                      kv_format: int = 0) -> tuple[int, int]:
    """``(BLOCK_M, M-blocks)`` of one (sequence, KV head): its ``nheads // nheads_k * q_len``
    packed rows, padded to >= 16 for tl.dot; past 64 rows the state no longer fits comfortably in
    registers, so large GQA groups x long q_len take several M-blocks (each re-reads K/V, from L2
    mostly: an (sequence, KV head)'s M-blocks are adjacent in the grid). int4 (``kv_format`` 3)
    takes M-blocks of 16 rows: its nibble-plane loop is built and tested at 16 rows (at 64 it
    faulted on the H100, 2026-11-27), and the per-element tile at 64 rows compiles to 3421
    instructions a 128-key tile a warp and 115 KB of shared memory (one program an SM) against 730
    and 44 KB for each 16-row block (sm_90a, fp16 q, 64 rows: 64 q heads a KV head)."""
    rows = nheads // nheads_k * q_len
    block_m = max(16, min(16 if kv_format == 3 else 64, next_pow2(rows)))
    return block_m, -(-rows // block_m)


def head_pairs_eligible(config, kv_format: int, q_dtype, head_dim: int, nheads_k: int) -> bool:
    """Whether a launch may serve two KV heads a program (``config.head_pairs``: int4's
    nibble-plane loop, head dim 128, 16-bit q, an even KV head count); the launch also needs
    V's strides even and no dense-and-sparse keys. The plan counts the split count's programs
    by it."""
    return (config.head_pairs and kv_format == 3 and head_dim == 128 and nheads_k % 2 == 0
            and q_dtype in (torch.float16, torch.bfloat16))


class PagedDecodeLaunch:
    """One decode shape's launch, fixed once: grid, scalar arguments, constants, cache key.

    Built from the (planned) tensors' shapes and strides; ``__call__`` then launches the decode
    kernel (one launch, split-K up to ``config.max_merged_splits`` included: the last split
    merges; past that a combine launch follows) for tensors with exactly those
    shapes and strides, through ``_launch.launch`` (Triton's C launcher, no per-call argument
    binding). Checks are the caller's. ``out`` and ``lse`` must be contiguous ``[batch, q_len,
    nheads, d]`` (q's dtype) and float32 ``[batch, nheads, q_len]``; with ``num_splits > 1`` the
    scratch is float32 contiguous ``o_part [batch, q_len, nheads, S, d]`` and ``lse_part [batch,
    q_len, nheads, S]``, plus int32 zeros ``arrivals [batch, nheads_k, M-blocks]``
    (``decode_row_blocks``), which the kernel leaves zero again. With ``store_lse=False`` no LSE
    is written (``lse`` may be None).
    ``outlier_values`` (quantized caches): the side cache of dense-and-sparse keys
    (``kvonce.paged.outliers``; ``[num_pages, page_size, nheads_k, n]``, q's dtype), whose
    channels come with each call.
    """

    def __init__(self, q, k_cache, v_cache, block_table, *, softmax_scale: float, causal: bool,
                 num_splits: int, config, store_lse: bool, kv_format: int = 0,
                 k_scale=None, v_scale=None, outlier_values=None, trigger_next: bool = False,
                 follows: bool = False):
        batch, q_len, nheads, head_dim = q.shape
        page_size, nheads_k = k_cache.shape[1], k_cache.shape[2]
        block_d = max(16, next_pow2(head_dim))
        # fp16 compute for bf16 q: fp8 anywhere, int8 only through the pairs loop (which keeps
        # its probabilities times per-key V scales under fp16's max; _attend_paged_pairs).
        f16 = config.f16_math and kv_format in (1, 2, 3) and q.dtype == torch.bfloat16
        # V pairs: fp8/int8 with fp16 compute where the row asks; int4 at head dim 128 with 16-bit
        # q (its nibble-plane loop, 16-row M-blocks: decode_row_blocks; V planes and
        # probabilities are fp16 whatever q is, only the scores dot runs in q's dtype; elsewhere
        # the per-element tile).
        even_v = (block_d == head_dim and head_dim % 2 == 0
                  and all(st % 2 == 0 for st in v_cache.stride()[:3]))
        v_pairs = even_v and (
            (kv_format in (1, 2) and config.v_pairs and not config.swap_ab
             and (q.dtype == torch.float16 or f16))
            or (kv_format == 3 and head_dim == 128
                and q.dtype in (torch.float16, torch.bfloat16)))
        # int4's nibble-plane loop over two KV heads a program (config.head_pairs); a call whose
        # V sits at an odd byte (no 16-bit V units, so no nibble-plane loop: __call__) takes the
        # one-head launch.
        self._head_pairs = (head_pairs_eligible(config, kv_format, q.dtype, head_dim, nheads_k)
                            and v_pairs and outlier_values is None)
        self._one_head = None  # made at the first such call
        self._one_head_kwargs = dict(
            softmax_scale=softmax_scale, causal=causal, num_splits=num_splits,
            config=dataclasses.replace(config, head_pairs=False), store_lse=store_lse,
            kv_format=kv_format, trigger_next=trigger_next,
            follows=follows) if self._head_pairs else None
        launch_heads = nheads_k // 2 if self._head_pairs else nheads_k
        group = nheads // launch_heads
        block_m, num_m_blocks = decode_row_blocks(nheads, launch_heads, q_len, kv_format)
        self.batch, self.num_splits = batch, num_splits
        merge_here = 1 < num_splits <= config.max_merged_splits
        self.device_index = q.device.index if q.device.type == "cuda" else -1
        if num_splits == 1:  # straight into out [batch, q_len, nheads, d], lse [batch, nheads, q_len]
            dst_o = (q_len * nheads * head_dim, nheads * head_dim, head_dim, 0)
            dst_l = (nheads * q_len, 1, q_len, 0)  # (batch, token, head, split)
        else:
            s = num_splits
            dst_o = (q_len * nheads * s * head_dim, nheads * s * head_dim, s * head_dim, head_dim)
            dst_l = (q_len * nheads * s, nheads * s, s, 1)
        self._ints = (
            q_len, num_splits, num_m_blocks, head_dim, *q.stride()[:3], *k_cache.stride()[:3],
            *v_cache.stride()[:3], *_scale_strides(k_scale, kv_format),
            *_scale_strides(v_scale, kv_format), *dst_o, *dst_l, block_table.stride(0),
            *(outlier_values.stride()[:3] if outlier_values is not None else (0, 0, 0)))
        self._scale = float(softmax_scale)
        self._grid = (num_splits * num_m_blocks, launch_heads, batch)
        f16_math = f16 and (kv_format == 1 or v_pairs)
        # int4's nibble-plane loop: each key's (scale, offset) as one 64-bit (fp16: 32-bit) load.
        # Even strides here; pair-aligned pointers per call (__call__: otherwise two loads).
        scale_pairs = (v_pairs and kv_format == 3
                       and all(st % 2 == 0 for t in (k_scale, v_scale)
                               for st in t.stride()[:3]))
        self._constexprs = dict(
            GROUP=group, IS_CAUSAL=causal, PAGE_SIZE=page_size, BLOCK_M=block_m,
            BLOCK_N=config.block_n, BLOCK_D=block_d, EVEN_D=block_d == head_dim,
            STORE_LSE=store_lse, SPLIT=num_splits > 1, MERGE_HERE=merge_here,
            KV_CACHE=config.kv_cache_modifier, KV_EVICT=config.kv_eviction, KV_FORMAT=kv_format,
            DOT_PRECISION=dot_input_precision(q.dtype),  # fp32 as PyTorch would (fixed per plan)
            SWAP_AB=config.swap_ab, F16_MATH=f16_math, V_PAIRS=v_pairs,
            N_OUT=outlier_values.shape[3] if outlier_values is not None else 0,
            SCALE_PAIRS=scale_pairs,
            # Not with dense-and-sparse keys: int4+8 ran 5-35% slower with it (H100).
            PREFETCH_PAGES=config.prefetch_pages and outlier_values is None,
            MERGE_SPLITS_AT_ONCE=config.merge_splits_at_once, HEAD_PAIRS=self._head_pairs,
            PDL_TRIGGER=trigger_next or (num_splits > 1 and not merge_here
                                         and combine_pdl(q.device, "triton")),
            PDL_EXIT_WAIT=follows, MASKED_STAGES=MASKED_LOOP_STAGES,
            # int32 offsets where everything fits (fewer IMADs per key row) unless the config
            # says int64 (PagedDecodeConfig.int64_kv_offsets: which rows and launches do, why).
            INT64_KV=config.int64_kv_offsets or max(
                _span(t) for t in (k_cache, v_cache, k_scale, v_scale, outlier_values)
                if t is not None) >= 2**31)
        self._warps = (config.num_warps, config.num_stages)
        self._maxnreg = config.max_registers
        if outlier_values is not None and config.outlier_max_registers:
            self._maxnreg = config.outlier_max_registers
        self._key = (q.dtype, k_cache.dtype, k_scale.dtype if k_scale is not None else None,
                     outlier_values.dtype if outlier_values is not None else None,
                     self._ints, tuple(self._constexprs.values()),
                     self._warps, self._maxnreg)
        # A call whose V is at an odd byte takes no 16-bit V units, one whose scales are off 4
        # bytes (int4: 8) no scale pairs (views at odd offsets; __call__): their loads would be
        # misaligned there. int8's fp16 dots need the V units (f16_math above).
        self._scale_align = 2 * k_scale.element_size() if kv_format == 3 else 4
        self._misaligned_constexprs = {
            (v_ok, scales_ok): dict(self._constexprs, V_PAIRS=v_pairs and v_ok,
                                    SCALE_PAIRS=scale_pairs and v_ok and scales_ok,
                                    F16_MATH=f16 and (kv_format == 1 or (v_pairs and v_ok)))
            for v_ok in (False, True) for scales_ok in (False, True)}
        self._combine = None
        if num_splits > 1 and not merge_here:
            # Final out [batch, q_len, nheads, d] and lse [batch, nheads, q_len], contiguous.
            ints = (num_splits, head_dim, *dst_o, *dst_l, q_len * nheads * head_dim,
                    nheads * head_dim, head_dim, nheads * q_len, 1, q_len)
            grid, constexprs, warps = combine_launch_shape(
                nheads, q_len, batch, num_splits, block_d, pdl=combine_pdl(q.device, "triton"))
            constexprs["STORE_LSE"] = store_lse
            self._combine = ((q.dtype, ints, tuple(constexprs.values())), grid, ints,
                             constexprs, warps)

    def __call__(self, q, k_cache, v_cache, cache_seqlens, block_table, out, lse,
                 o_part=None, lse_part=None, arrivals=None, k_scale=None, v_scale=None,
                 outlier_values=None, outlier_channels=None) -> None:
        if self.batch == 0:
            return
        if lse is None:  # never dereferenced (STORE_LSE is off): any pointer will do
            lse = out
        if self.num_splits > 1:
            dst_o, dst_l, final_o, final_l = o_part, lse_part, out, lse
        else:  # the split-K arguments are never dereferenced
            dst_o, dst_l, final_o, final_l, arrivals = out, lse, out, lse, cache_seqlens
        if k_scale is None:  # plain cache: never dereferenced
            k_scale = v_scale = cache_seqlens
        if outlier_values is None:  # N_OUT = 0: never dereferenced
            outlier_values = outlier_channels = cache_seqlens
        constexprs, fits = self._constexprs, (True, True)
        # The caller's tensors; the outputs, partials and arrival counts are the plan's own
        # (torch's allocator: always 16-byte aligned), so they need no look per call.
        aligned = alignment_key(q, k_cache, v_cache, cache_seqlens, block_table, k_scale,
                                v_scale, outlier_values, outlier_channels)
        if aligned is not True:
            # Some pointer is off 16 bytes (rare: a view at an offset). The pairs' loads need
            # only V 2-byte and the scales 4-byte aligned; past that, the forms without them.
            fits = (not v_cache.data_ptr() & 1,
                    not (k_scale.data_ptr() | v_scale.data_ptr()) & (self._scale_align - 1))
            if self._head_pairs and not fits[0]:  # no 16-bit V units: no nibble-plane loop
                if self._one_head is None:
                    # this launch's own sequences (a batch cut's head gets the whole batch)
                    self._one_head = PagedDecodeLaunch(q[:self.batch], k_cache, v_cache,
                                                       block_table[:self.batch],
                                                       k_scale=k_scale, v_scale=v_scale,
                                                       **self._one_head_kwargs)
                self._one_head(q, k_cache, v_cache, cache_seqlens, block_table, out, lse,
                               o_part, lse_part, arrivals, k_scale, v_scale)
                return
            constexprs = self._misaligned_constexprs[fits]
        key = (self._key, aligned, fits)
        launch(_paged_decode_kernel, key, self._grid,
               (q, k_cache, v_cache, k_scale, v_scale, dst_o, dst_l, cache_seqlens, block_table,
                final_o, final_l, arrivals, outlier_values, outlier_channels, self._scale,
                *self._ints),
               constexprs, *self._warps, self.device_index, self._maxnreg,
               launch_pdl=constexprs["PDL_EXIT_WAIT"])
        if self._combine is not None:
            key, grid, ints, constexprs, warps = self._combine
            launch(_combine_splits_kernel, key, grid, (o_part, lse_part, out, lse, *ints),
                   constexprs, *warps, self.device_index, launch_pdl=constexprs["PDL_WAIT"])
