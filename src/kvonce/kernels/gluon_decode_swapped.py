"""The Gluon paged decode's swapped-operand consumers (kernels/gluon_decode.py, ``SWAP_AB``):
S^T = K q^T and O^T = V^T P^T, each warp's 32 keys of a tile as the dots' M and the packed q rows
(``GROUP * q_len <= 8``) as N = 8, where the row-major form (gluon_decode_rows) pads them to
m16: each thread holds half the scores, half the softmax and half the accumulators. The cost:
P^T's operand layout is the transpose of S^T's accumulator (one conversion a tile, by shuffles).
fp8, and int8 / int4 with their scales by ring (``_consume_swapped``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .gluon_decode_common import (FP8, HEAD_DIM, INT4, INT8, INT8_BIAS, LOG2E, MMA, PAIR_SMEM,
                                  probe_drains, WARPS, _drain, _f16_row_factors,
                                  _fp8_pairs_to_f16, _int4_k_to_f16, _int4_v_to_f16,
                                  _int8_pairs_to_f16, _int8_to_biased_f16, _release,
                                  _scale_slot_layout, _split_range, _tile_counts, _units_layout,
                                  _unpack_f16_pairs, _warp_weights, packed_pairs,
                                  INT4_V_BIAS, _ring_key_scales)
from .gluon_prefill import _add, _max


# ----------------------------------------------------------------------------------------------
# Swapped operands (SWAP_AB): keys as the dots' M, q rows as N
# ----------------------------------------------------------------------------------------------
# S^T = K q^T and O^T = V^T P^T: a group of at most 8 packed q rows fills an n8 tile where the
# row-major form pads it to m16, so each thread holds half the scores (8 a tile), half the
# softmax and half the accumulators ([WARPS, 64, 8] a plane: 16 registers against 32). The cost:
# P^T's operand layout is the transpose of S^T's accumulator (one layout conversion a tile).
NR = gl.constexpr(8)                  # packed q rows, the dots' N (GROUP * q_len <= 8)
KA_OP = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4))   # K
QB_OP = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=4))   # q^T
VA_OP = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))   # V^T units
PB_OP = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))   # P^T
KEY_COL = gl.constexpr(gl.SliceLayout(2, MMA))    # per-key values [WARPS, WKEYS] (keys as M)
ROW_T = gl.constexpr(gl.SliceLayout(1, MMA))      # m, l [WARPS, NR]


@gluon.jit
def _load_q_t(Q, seq, kv_head, q_len, stride_qb, stride_qt, stride_qh, GROUP: gl.constexpr,
              D: gl.constexpr, FIRST: gl.constexpr):
    """q^T's channels ``FIRST .. FIRST + D`` of the packed rows (row ``r``: token ``r //
    GROUP``, q head ``kv_head * GROUP + r % GROUP``; rows past ``GROUP * q_len`` zero) as the
    B operand ``[WARPS, D, NR]``, the same in every warp."""
    r = gl.arange(0, NR, gl.SliceLayout(0, gl.SliceLayout(1, QB_OP)))
    d = gl.arange(0, D, gl.SliceLayout(0, gl.SliceLayout(2, QB_OP)))
    wq = gl.arange(0, WARPS, gl.SliceLayout(1, gl.SliceLayout(2, QB_OP)))
    q_row = (r // GROUP) * stride_qt + (kv_head * GROUP + r % GROUP) * stride_qh
    q_ptrs = (Q + seq.to(gl.int64) * stride_qb + FIRST
              + gl.expand_dims(gl.expand_dims(wq * 0, 1) + gl.expand_dims(d, 0), 2)
              + gl.expand_dims(gl.expand_dims(q_row, 0), 1))
    q_ok = gl.expand_dims(gl.expand_dims(wq >= 0, 1) & gl.expand_dims(d >= 0, 0), 2) \
        & gl.expand_dims(gl.expand_dims(r < GROUP * q_len, 0), 1)
    return gl.load(q_ptrs, mask=q_ok, other=0.0)


OUT2_T = gl.constexpr(gl.SliceLayout(0, MMA))   # merged outputs [channels, NR]


@gluon.jit
def _out_ptrs_t(Out, seq, split, kv_head, q_len, stride_ob, stride_ot, stride_oh, stride_os,
                GROUP: gl.constexpr, CH: gl.constexpr):
    """Where a ``[CH, NR]`` output plane goes (channel ``c`` of the plane at ``Out``'s channel
    ``2 c``: the caller adds its plane's first channel) and which rows exist: ``(ptrs, ok)``."""
    ch = gl.arange(0, CH, gl.SliceLayout(1, OUT2_T))
    ro = gl.arange(0, NR, gl.SliceLayout(0, OUT2_T))
    o_row = (seq.to(gl.int64) * stride_ob + split * stride_os + (ro // GROUP) * stride_ot
             + (kv_head * GROUP + ro % GROUP) * stride_oh)
    return (Out + gl.expand_dims(o_row, 0) + gl.expand_dims(ch * 2, 1),
            gl.expand_dims(ro < GROUP * q_len, 0))


@gluon.jit
def _tile_keys_t(start, LAYOUT: gl.constexpr, WKEYS: gl.constexpr, HEADS: gl.constexpr,
                 PAGE_SIZE: gl.constexpr):
    """The keys of a tile's rows ``[WARPS, WKEYS]`` in ``LAYOUT`` (warp w's rows ``WKEYS w ..``)
    for the tile at key ``start``: row r is key ``start + r``, or, a CTA taking ``HEADS`` KV
    heads (rows page by page, head by head: whole pages of each), ``start + (r // (HEADS *
    PAGE_SIZE)) PAGE_SIZE + r % PAGE_SIZE``."""
    w = gl.arange(0, WARPS, gl.SliceLayout(1, LAYOUT))
    n = gl.arange(0, WKEYS, gl.SliceLayout(0, LAYOUT))
    r = gl.expand_dims(w * WKEYS, 1) + gl.expand_dims(n, 0)
    if HEADS == 1:
        return start + r
    else:
        return start + r // (HEADS * PAGE_SIZE) * PAGE_SIZE + r % PAGE_SIZE


@gluon.jit
def _own_head_t(GROUP: gl.constexpr, HEADS: gl.constexpr, PAGE_SIZE: gl.constexpr,
                WKEYS: gl.constexpr):
    """Which scores ``[WARPS, WKEYS, NR]`` pair a key with a q row of its own KV head, a CTA
    taking ``HEADS`` KV heads (``GROUP`` q heads in all: row r's KV head ``(r % GROUP) //
    (GROUP / HEADS)``, a tile row's ``(row // PAGE_SIZE) % HEADS``); the rest are masked to
    -inf. Padding rows (past ``GROUP * q_len``) fall in some head: finite scores, never stored."""
    w = gl.arange(0, WARPS, gl.SliceLayout(1, KEY_COL))
    n = gl.arange(0, WKEYS, gl.SliceLayout(0, KEY_COL))
    row_head = (gl.expand_dims(w * WKEYS, 1) + gl.expand_dims(n, 0)) // PAGE_SIZE % HEADS
    c = gl.arange(0, NR, gl.SliceLayout(0, ROW_T))
    col_head = (c % GROUP) // (GROUP // HEADS)
    return gl.expand_dims(row_head, 2) == gl.expand_dims(gl.expand_dims(col_head, 0), 1)


@gluon.jit
def _key_part_sum(x):
    """``x [WARPS, WKEYS, NR]`` (the swapped dots' accumulator layout) summed over each
    thread's own keys: ``[WARPS, 8, NR]``. A warp's key ``k`` is ``8 q + r`` with ``r`` its
    lane's group (lane // 4: lanes) and ``q`` its registers' (the m16 tile and its half), so the
    sum over ``q`` stays in registers; the 8 groups' parts are added once, after the tiles."""
    WKEYS: gl.constexpr = x.shape[1]
    return gl.sum(gl.reshape(x, [WARPS, WKEYS // 8, 8, x.shape[2]]), 1)


@gluon.jit
def _part_rescale(part, alpha):
    """``part [WARPS, 8, NR]`` (``_key_part_sum``'s) times ``alpha [WARPS, NR]`` a row."""
    L: gl.constexpr = part.type.layout
    return part * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, L)), 1)


@gluon.jit
def _softmax_step_t(sc, m_i, l_i, start, hi, last_key, qk_scale, MASKED: gl.constexpr,
                    ROW_SCALE: gl.constexpr, own=0, HEADS: gl.constexpr = 1,
                    PAGE_SIZE: gl.constexpr = 16, DEFER_SUMS: gl.constexpr = False):
    """``_softmax_step`` on swapped scores ``sc [WARPS, WKEYS, NR]`` (keys along axis 1).
    HEADS > 1: ``own`` (``_own_head_t``) masks the scores of other heads' keys. DEFER_SUMS:
    ``l_i`` is each thread's part ``[WARPS, 8, NR]`` (``_key_part_sum``)."""
    WKEYS: gl.constexpr = sc.shape[1]
    if ROW_SCALE:
        scale = gl.expand_dims(qk_scale, 1)
    else:
        scale = qk_scale
    if MASKED:
        keys = gl.expand_dims(_tile_keys_t(start, KEY_COL, WKEYS, HEADS, PAGE_SIZE), 2)
        visible = (keys < hi) & (keys <= gl.expand_dims(gl.expand_dims(last_key, 0), 1))
        if HEADS > 1:
            visible = visible & own
        sc = gl.where(visible, sc * scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.reduce(sc, 1, _max))
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(sc - gl.expand_dims(m_sub, 1))
    else:
        m_new = gl.maximum(m_i, gl.reduce(sc, 1, _max) * qk_scale)   # qk_scale > 0
        m_sub = m_new
        if HEADS > 1:
            # a warp's 32 rows may hold only some of the group's heads (four heads of 16-key
            # pages, two of 64): its other rows' m stays -inf, read as 0 (no -inf - -inf)
            sc = gl.where(own, sc, float("-inf"))
            m_new = gl.maximum(m_i, gl.reduce(sc, 1, _max) * qk_scale)
            m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(sc * scale - gl.expand_dims(m_sub, 1))
    alpha = gl.exp2(m_i - m_sub)
    if DEFER_SUMS:
        l_i = _part_rescale(l_i, alpha) + _key_part_sum(p)
    else:
        l_i = l_i * alpha + gl.reduce(p, 1, _add)
    return p, m_new, l_i, alpha


@gluon.jit
def _tile_t(qt, s_init, acc_e, acc_o, m_i, l_i, acc_scale, k_smem, v_smem, ks_smem, vs_smem,
            k_ready, v_ready, k_empty, v_empty, j, start, hi, last_key, qk_scale,
            MASKED: gl.constexpr, THREAD_ARRIVE: gl.constexpr, KV_FORMAT: gl.constexpr,
            ROW_SCALE: gl.constexpr, V_BIASED: gl.constexpr, own=0, HEADS: gl.constexpr = 1,
            PAGE_SIZE: gl.constexpr = 16):
    """``_tile`` with swapped operands (fp8, int8 with its scales by ring): ``qt [WARPS, 128,
    NR]`` (q^T), scores ``[WARPS, WKEYS, NR]``, accumulators ``acc_e, acc_o [WARPS, 64, NR]``
    (the even and the odd channels), the row state ``[WARPS, NR]``, int8's unit ``acc_scale``
    ``[WARPS]``. The same arithmetic as ``_tile``'s, transposed. HEADS, ``own``: a CTA's KV head
    group (``_own_head_t``)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    TILE: gl.constexpr = k_smem.shape[1]
    WKEYS: gl.constexpr = TILE // WARPS
    s = j % STAGES
    phase = (j // STAGES) & 1
    U16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    mbarrier.wait(k_ready.index(s), phase)
    kb = k_smem.index(s).reshape([WARPS, WKEYS, HEAD_DIM]).load(KA_OP)
    if KV_FORMAT == INT8:
        ks = _ring_key_scales(ks_smem.index(s), WKEYS, TILE, KEY_COL)
        vs = _ring_key_scales(vs_smem.index(s), WKEYS, TILE, KEY_COL)
    _release(k_empty.index(s), THREAD_ARRIVE)
    if KV_FORMAT == INT8:
        if MASKED:   # scales past the end: whatever the slots hold (NaN)
            vs = gl.where(_tile_keys_t(start, KEY_COL, WKEYS, HEADS, PAGE_SIZE) < hi, vs, 0.0)
        sc = mma_v2(_int8_to_biased_f16(kb), qt, s_init) * gl.expand_dims(ks, 2)
    else:
        kf = kb.to(gl.float8e4nv, bitcast=True).to(gl.float16)
        sc = mma_v2(kf, qt, gl.zeros([WARPS, WKEYS, NR], gl.float32, MMA))
    p, m_new, l_i, alpha = _softmax_step_t(sc, m_i, l_i, start, hi, last_key, qk_scale, MASKED,
                                           ROW_SCALE, own, HEADS, PAGE_SIZE)
    a3 = gl.expand_dims(alpha, 1)                                # [WARPS, 1, NR]
    if KV_FORMAT == INT8:
        v_max = gl.max(vs, 1)                                   # [WARPS]: 0 past the end
        v_max = gl.where(v_max > 0.0, v_max, 1.0)
        p = p * gl.expand_dims(vs / gl.expand_dims(v_max, 1), 2)
        a3 = a3 * gl.expand_dims(gl.expand_dims(acc_scale / v_max, 1), 2)
        acc_scale = v_max
    p16 = p.to(gl.float16)
    p_op = gl.convert_layout(p16, PB_OP)

    mbarrier.wait(v_ready.index(s), phase)
    units = v_smem.index(s)._reinterpret(gl.uint16, [TILE, HEAD_DIM // 2], U16).reshape(
        [WARPS, WKEYS, HEAD_DIM // 2]).permute((0, 2, 1)).load(VA_OP)
    _release(v_empty.index(s), THREAD_ARRIVE)
    BIASED: gl.constexpr = V_BIASED and KV_FORMAT == INT8
    if MASKED and not BIASED:   # V rows past the end may hold NaN bytes (0 * NaN)
        vkeys = gl.expand_dims(
            _tile_keys_t(start, gl.SliceLayout(1, VA_OP), WKEYS, HEADS, PAGE_SIZE), 1)
        units = gl.where(vkeys < hi, units, 0)
    if KV_FORMAT == INT8:
        if BIASED:   # each row's 1152 sum p (p as the dots take it) off the dots' start
            bias = gl.expand_dims(gl.sum(p16.to(gl.float32), 1) * -INT8_BIAS, 1)
            acc_e = mma_v2(_int8_pairs_to_f16(units, False, True), p_op, acc_e * a3 + bias)
            acc_o = mma_v2(_int8_pairs_to_f16(units, True, True), p_op, acc_o * a3 + bias)
        else:
            acc_e = mma_v2(_int8_pairs_to_f16(units, False), p_op, acc_e * a3)
            acc_o = mma_v2(_int8_pairs_to_f16(units, True), p_op, acc_o * a3)
    else:
        acc_e = mma_v2(_fp8_pairs_to_f16(units, False), p_op, acc_e * a3)
        acc_o = mma_v2(_fp8_pairs_to_f16(units, True), p_op, acc_o * a3)
    return acc_e, acc_o, m_new, l_i, acc_scale


@gluon.jit
def _consume_t(Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
               ks_smem, vs_smem, seq, split, kv_head, seqlen, lo, hi, sm_scale, q_len,
               stride_qb, stride_qt, stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot,
               stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
               GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr, THREAD_ARRIVE: gl.constexpr,
               KV_FORMAT: gl.constexpr, STORE_LSE: gl.constexpr, V_BIASED: gl.constexpr,
               PROBE: gl.constexpr = 0, HEADS: gl.constexpr = 1, PAGE_SIZE: gl.constexpr = 16):
    """``_consume`` with swapped operands (``_tile_t``): q^T loaded once into the operand
    layout, the tiles, the four warps' states merged through Triton's reduce scratch, the
    output's even and odd channels stored from ``[64, NR]``. HEADS > 1: ``kv_head`` is the
    CTA's group of KV heads and ``GROUP`` its q heads (fp8's per-head scales a q row's)."""
    TILE: gl.constexpr = k_smem.shape[1]
    TKEYS: gl.constexpr = TILE // HEADS
    WKEYS: gl.constexpr = TILE // WARPS
    gl.static_assert(GROUP <= NR, "swapped operands: at most 8 q heads a KV head")
    qt = _load_q_t(Q, seq, kv_head, q_len, stride_qb, stride_qt, stride_qh, GROUP, HEAD_DIM, 0)
    ROW_SCALE: gl.constexpr = Q.dtype.element_ty == gl.bfloat16
    if ROW_SCALE:   # bf16 rows times a power of two into fp16 (``_consume``'s)
        qf = qt.to(gl.float32)
        up, down = _f16_row_factors(gl.max(gl.abs(qf), 1))       # [WARPS, NR]
        qt = (qf * gl.expand_dims(up, 1)).to(gl.float16)

    diag, n_full, n_tiles = _tile_counts(seqlen, lo, hi, q_len, IS_CAUSAL, TKEYS)
    rs = gl.arange(0, NR, gl.SliceLayout(0, ROW_T))
    last_key = rs // GROUP + diag
    row_kv_head = kv_head * HEADS + (rs % GROUP) // (GROUP // HEADS)   # [NR]
    COL_SCALE: gl.constexpr = ROW_SCALE or (HEADS > 1 and KV_FORMAT != INT8)
    if KV_FORMAT == INT8:
        qk_scale = sm_scale * LOG2E
    elif HEADS > 1:   # fp8's K scale, the row's head's
        k_scales = gl.load(KS + row_kv_head * stride_ksh)
        qk_scale = gl.zeros([WARPS, NR], gl.float32, ROW_T) \
            + gl.expand_dims(k_scales * (sm_scale * LOG2E), 0)
    else:
        qk_scale = sm_scale * LOG2E * gl.load(KS + kv_head * stride_ksh)
    if ROW_SCALE:
        qk_scale = qk_scale * gl.convert_layout(down, ROW_T)
    if HEADS > 1:
        own = _own_head_t(GROUP, HEADS, PAGE_SIZE, WKEYS)
    else:
        own = 0

    m_i = gl.full([WARPS, NR], float("-inf"), gl.float32, ROW_T)
    l_i = gl.zeros([WARPS, NR], gl.float32, ROW_T)
    acc_e = gl.zeros([WARPS, HEAD_DIM // 2, NR], gl.float32, MMA)
    acc_o = gl.zeros([WARPS, HEAD_DIM // 2, NR], gl.float32, MMA)
    acc_scale = gl.full([WARPS], 1.0, gl.float32, gl.SliceLayout(1, KEY_COL))
    s_init = gl.zeros([WARPS, WKEYS, NR], gl.float32, MMA)
    if KV_FORMAT == INT8:   # K converts to 1152 + x: the dot starts from -1152 sum(q) a row
        q_sum = gl.convert_layout(gl.sum(qt.to(gl.float32), 1), ROW_T)
        s_init = s_init + gl.expand_dims(q_sum * (-INT8_BIAS), 1)
    if probe_drains(PROBE):
        _drain(k_ready, v_ready, k_empty, v_empty, n_tiles, THREAD_ARRIVE)
        n_full = 0
        n_tiles = 0
    for j in range(0, n_full):
        acc_e, acc_o, m_i, l_i, acc_scale = _tile_t(
            qt, s_init, acc_e, acc_o, m_i, l_i, acc_scale, k_smem, v_smem, ks_smem, vs_smem,
            k_ready, v_ready, k_empty, v_empty, j, lo + j * TKEYS, hi, last_key, qk_scale,
            False, THREAD_ARRIVE, KV_FORMAT, COL_SCALE, V_BIASED, own, HEADS, PAGE_SIZE)
    for j in range(n_full, n_tiles):
        acc_e, acc_o, m_i, l_i, acc_scale = _tile_t(
            qt, s_init, acc_e, acc_o, m_i, l_i, acc_scale, k_smem, v_smem, ks_smem, vs_smem,
            k_ready, v_ready, k_empty, v_empty, j, lo + j * TKEYS, hi, last_key, qk_scale,
            True, THREAD_ARRIVE, KV_FORMAT, COL_SCALE, V_BIASED, own, HEADS, PAGE_SIZE)

    m, w, l, seen, lse = _warp_weights(m_i, l_i)                   # w [WARPS, NR]
    w3 = gl.expand_dims(w, 1)                                      # [WARPS, 1, NR]
    if KV_FORMAT == INT8:   # the accumulators back from their unit
        w3 = w3 * gl.expand_dims(gl.expand_dims(acc_scale, 1), 2)
    o_e = gl.reduce(acc_e * w3, 0, _add)                           # [64, NR]
    o_o = gl.reduce(acc_o * w3, 0, _add)
    if KV_FORMAT == INT8:
        inv = gl.where(seen, 1.0 / gl.where(seen, l, 1.0), 0.0)
    elif HEADS > 1:   # fp8's V scale, the row's head's
        inv = gl.where(seen, gl.load(VS + row_kv_head * stride_vsh) / gl.where(seen, l, 1.0),
                       0.0)
    else:
        inv = gl.where(seen, gl.load(VS + kv_head * stride_vsh) / gl.where(seen, l, 1.0), 0.0)
    o_ptrs, o_ok = _out_ptrs_t(Out, seq, split, kv_head, q_len, stride_ob, stride_ot,
                               stride_oh, stride_os, GROUP, HEAD_DIM // 2)
    inv_o = gl.expand_dims(gl.convert_layout(inv, gl.SliceLayout(0, OUT2_T)), 0)
    OT: gl.constexpr = Out.dtype.element_ty
    gl.store(o_ptrs, (o_e * inv_o).to(OT), mask=o_ok)
    gl.store(o_ptrs + 1, (o_o * inv_o).to(OT), mask=o_ok)
    if STORE_LSE:
        rl = gl.arange(0, NR, gl.SliceLayout(0, ROW_T))
        gl.store(Lse + seq.to(gl.int64) * stride_lb + split * stride_ls
                 + (rl // GROUP) * stride_lt + (kv_head * GROUP + rl % GROUP) * stride_lh, lse,
                 mask=rl < GROUP * q_len)


@gluon.constexpr_function
def _pair_load_t(wkeys):
    """int4's (scale, offset) pairs from a ring slot straight into the swapped scores' key
    layout (``KEY_COL``: warp w's ``wkeys`` keys, lane l's l // 4 + {0, 8, 16, ..}, the lane's
    low two bits broadcast), the pair's two floats the fastest registers (one 8-byte load a
    key)."""
    reg_bases = [[0, 0, 1]] + [[0, k, 0] for k in (8, 16, 32, 64) if k < wkeys]
    return gl.DistributedLinearLayout(
        reg_bases=reg_bases, lane_bases=[[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 2, 0], [0, 4, 0]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[4, wkeys, 2])


@gluon.jit
def _ring_scale_pairs_t(slot, WKEYS: gl.constexpr):
    """``_ring_scale_pairs`` into ``KEY_COL`` (keys as the swapped dots' M)."""
    gl.static_assert(WKEYS % 8 == 0, "a warp's keys: whole m8 groups")
    pairs = slot._reinterpret(gl.float32, [WARPS, WKEYS, 2], PAIR_SMEM).load(_pair_load_t(WKEYS))
    scale, offset = pairs.split()
    return gl.convert_layout(scale, KEY_COL), gl.convert_layout(offset, KEY_COL)


@gluon.jit
def _tile_int4_t(q_lo, q_hi, s_init, q_sum, acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i,
                 acc_scale, k_smem, v_smem, ks_smem, vs_smem, k_ready, v_ready, k_empty,
                 v_empty, j, start, hi, last_key, qk_scale, MASKED: gl.constexpr,
                 THREAD_ARRIVE: gl.constexpr, ROW_SCALE: gl.constexpr,
                 V_BIASED: gl.constexpr = False, own=0, HEADS: gl.constexpr = 1,
                 PAGE_SIZE: gl.constexpr = 16, DEFER_SUMS: gl.constexpr = False):
    """``_tile_int4`` with swapped operands: ``q_lo, q_hi [WARPS, 64, NR]`` (q^T's two
    halves), scores ``[WARPS, WKEYS, NR]``, the four nibble planes' accumulators ``[WARPS, 32,
    NR]``, ``b_i`` and the row state ``[WARPS, NR]``, the unit ``acc_scale [WARPS]``.
    V_BIASED: V's nibbles as ``INT4_V_BIAS``'s biased fp16 (one lop3 a register), each plane's
    dot starting from minus its bias times the rows' probability sums; the high planes' sums
    come out 16 times their value. HEADS, ``own``: a CTA's KV head group (``_own_head_t``)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    TILE: gl.constexpr = k_smem.shape[1]
    ROW: gl.constexpr = k_smem.shape[2]
    WKEYS: gl.constexpr = TILE // WARPS
    U16: gl.constexpr = _units_layout(v_smem.layout)
    s = j % STAGES
    phase = (j // STAGES) & 1
    mbarrier.wait(k_ready.index(s), phase)
    if packed_pairs(ks_smem.shape[1], ks_smem.shape[2], TILE):   # fp16 pairs: a unit a key
        layout: gl.constexpr = _scale_slot_layout(WARPS, WKEYS, ks_smem.shape[2])
        ks, ko = _unpack_f16_pairs(
            ks_smem.index(s)._reinterpret(gl.float32, [WARPS, WKEYS], layout).load(KEY_COL))
        vs, vo = _unpack_f16_pairs(
            vs_smem.index(s)._reinterpret(gl.float32, [WARPS, WKEYS], layout).load(KEY_COL))
    else:
        ks, ko = _ring_scale_pairs_t(ks_smem.index(s), WKEYS)
        vs, vo = _ring_scale_pairs_t(vs_smem.index(s), WKEYS)
    kb = k_smem.index(s).reshape([WARPS, WKEYS, ROW]).load(KA_OP)
    _release(k_empty.index(s), THREAD_ARRIVE)
    if MASKED:   # pairs past the end: whatever the slots hold (NaN): out of v_max and b
        inside = _tile_keys_t(start, KEY_COL, WKEYS, HEADS, PAGE_SIZE) < hi
        vs = gl.where(inside, vs, 0.0)
        vo = gl.where(inside, vo, 0.0)
    sc = mma_v2(_int4_k_to_f16(kb, True), q_hi, gl.zeros([WARPS, WKEYS, NR], gl.float32, MMA))
    sc = mma_v2(_int4_k_to_f16(kb, False), q_lo, sc * 0.0625 + gl.expand_dims(s_init, 1))
    sc = sc * gl.expand_dims(ks, 2) + gl.expand_dims(ko, 2) * gl.expand_dims(q_sum, 1)
    p, m_new, l_i, alpha = _softmax_step_t(sc, m_i, l_i, start, hi, last_key, qk_scale, MASKED,
                                           ROW_SCALE, own, HEADS, PAGE_SIZE, DEFER_SUMS)
    v_max = gl.max(vs, 1)                                       # [WARPS]: 0 past the end
    v_max = gl.where(v_max > 0.0, v_max, 1.0)
    v_inv = gl.expand_dims(1.0 / v_max, 1)
    alpha = alpha * gl.expand_dims(gl.convert_layout(acc_scale / v_max,
                                                     gl.SliceLayout(1, ROW_T)), 1)
    if DEFER_SUMS:
        b_i = _part_rescale(b_i, alpha) + _key_part_sum(p * gl.expand_dims(vo * v_inv, 2))
    else:
        b_i = b_i * alpha + gl.reduce(p * gl.expand_dims(vo * v_inv, 2), 1, _add)
    p = p * gl.expand_dims(vs * v_inv, 2)
    a3 = gl.expand_dims(alpha, 1)
    acc_scale = v_max
    p16 = p.to(gl.float16)
    p_op = gl.convert_layout(p16, PB_OP)

    mbarrier.wait(v_ready.index(s), phase)
    units = v_smem.index(s)._reinterpret(gl.uint16, [TILE, ROW // 2], U16).reshape(
        [WARPS, WKEYS, ROW // 2]).permute((0, 2, 1)).load(VA_OP)
    _release(v_empty.index(s), THREAD_ARRIVE)
    # Bytes past the end need no mask: any byte is two finite q, and their p is 0.
    if V_BIASED:   # each row's bias times sum p (p as the dots take it) off the dots' start
        p_sum = gl.expand_dims(gl.sum(p16.to(gl.float32), 1), 1)          # [WARPS, 1, NR]
        low = p_sum * -INT4_V_BIAS[0]
        high = p_sum * -INT4_V_BIAS[1]
        acc_el = mma_v2(_int4_v_to_f16(units, False, False, True), p_op, acc_el * a3 + low)
        acc_ol = mma_v2(_int4_v_to_f16(units, True, False, True), p_op, acc_ol * a3 + low)
        acc_eh = mma_v2(_int4_v_to_f16(units, False, True, True), p_op, acc_eh * a3 + high)
        acc_oh = mma_v2(_int4_v_to_f16(units, True, True, True), p_op, acc_oh * a3 + high)
    else:
        acc_el = mma_v2(_int4_v_to_f16(units, False, False), p_op, acc_el * a3)
        acc_ol = mma_v2(_int4_v_to_f16(units, True, False), p_op, acc_ol * a3)
        acc_eh = mma_v2(_int4_v_to_f16(units, False, True), p_op, acc_eh * a3)
        acc_oh = mma_v2(_int4_v_to_f16(units, True, True), p_op, acc_oh * a3)
    return acc_el, acc_ol, acc_eh, acc_oh, b_i, m_new, l_i, acc_scale


@gluon.jit
def _consume_int4_t(Q, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, ks_smem,
                    vs_smem, seq, split, kv_head, seqlen, lo, hi, sm_scale, q_len, stride_qb,
                    stride_qt, stride_qh, stride_ob, stride_ot, stride_oh, stride_os,
                    stride_lb, stride_lt, stride_lh, stride_ls, GROUP: gl.constexpr,
                    IS_CAUSAL: gl.constexpr, THREAD_ARRIVE: gl.constexpr,
                    STORE_LSE: gl.constexpr, PROBE: gl.constexpr = 0,
                    V_BIASED: gl.constexpr = False, HEADS: gl.constexpr = 1,
                    PAGE_SIZE: gl.constexpr = 16, DEFER_SUMS: gl.constexpr = False):
    """``_consume_int4_tiles`` with swapped operands (``_tile_int4_t``, V_BIASED its), q^T
    loaded here. HEADS > 1: ``kv_head`` the CTA's group of KV heads (``_consume_t``'s)."""
    TILE: gl.constexpr = k_smem.shape[1]
    TKEYS: gl.constexpr = TILE // HEADS
    PLANE: gl.constexpr = HEAD_DIM // 4
    HALF: gl.constexpr = HEAD_DIM // 2
    gl.static_assert(GROUP <= NR, "swapped operands: at most 8 q heads a KV head")
    q_lo = _load_q_t(Q, seq, kv_head, q_len, stride_qb, stride_qt, stride_qh, GROUP, HALF, 0)
    q_hi = _load_q_t(Q, seq, kv_head, q_len, stride_qb, stride_qt, stride_qh, GROUP, HALF, HALF)
    ROW_SCALE: gl.constexpr = Q.dtype.element_ty == gl.bfloat16
    if ROW_SCALE:   # bf16 rows times a power of two into fp16 (``_consume``'s)
        lo_f = q_lo.to(gl.float32)
        hi_f = q_hi.to(gl.float32)
        up, down = _f16_row_factors(gl.maximum(gl.max(gl.abs(lo_f), 1),
                                               gl.max(gl.abs(hi_f), 1)))   # [WARPS, NR]
        q_lo = (lo_f * gl.expand_dims(up, 1)).to(gl.float16)
        q_hi = (hi_f * gl.expand_dims(up, 1)).to(gl.float16)

    diag, n_full, n_tiles = _tile_counts(seqlen, lo, hi, q_len, IS_CAUSAL, TKEYS)
    rs = gl.arange(0, NR, gl.SliceLayout(0, ROW_T))
    last_key = rs // GROUP + diag
    if HEADS > 1:
        own = _own_head_t(GROUP, HEADS, PAGE_SIZE, TILE // WARPS)
    else:
        own = 0
    qk_scale = sm_scale * LOG2E
    if ROW_SCALE:
        qk_scale = qk_scale * gl.convert_layout(down, ROW_T)
    # ``_consume_int4_tiles``' start: -72 sum(q_hi) - 1032 sum(q_lo) a row
    sum_lo = gl.convert_layout(gl.sum(q_lo.to(gl.float32), 1), ROW_T)
    sum_hi = gl.convert_layout(gl.sum(q_hi.to(gl.float32), 1), ROW_T)
    s_init = sum_hi * -72.0 + sum_lo * -1032.0
    q_sum = sum_lo + sum_hi
    m_i = gl.full([WARPS, NR], float("-inf"), gl.float32, ROW_T)
    if DEFER_SUMS:   # each thread's part of the rows' sums [WARPS, 8, NR] (_key_part_sum)
        l_i = _key_part_sum(gl.zeros([WARPS, TILE // WARPS, NR], gl.float32, MMA))
        b_i = _key_part_sum(gl.zeros([WARPS, TILE // WARPS, NR], gl.float32, MMA))
    else:
        l_i = gl.zeros([WARPS, NR], gl.float32, ROW_T)
        b_i = gl.zeros([WARPS, NR], gl.float32, ROW_T)
    acc_scale = gl.full([WARPS], 1.0, gl.float32, gl.SliceLayout(1, KEY_COL))
    acc_el = gl.zeros([WARPS, PLANE, NR], gl.float32, MMA)
    acc_ol = gl.zeros([WARPS, PLANE, NR], gl.float32, MMA)
    acc_eh = gl.zeros([WARPS, PLANE, NR], gl.float32, MMA)
    acc_oh = gl.zeros([WARPS, PLANE, NR], gl.float32, MMA)
    if probe_drains(PROBE):
        _drain(k_ready, v_ready, k_empty, v_empty, n_tiles, THREAD_ARRIVE)
        n_full = 0
        n_tiles = 0
    for j in range(0, n_full):
        acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i, acc_scale = _tile_int4_t(
            q_lo, q_hi, s_init, q_sum, acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i,
            acc_scale, k_smem, v_smem, ks_smem, vs_smem, k_ready, v_ready, k_empty, v_empty, j,
            lo + j * TKEYS, hi, last_key, qk_scale, False, THREAD_ARRIVE, ROW_SCALE, V_BIASED,
            own, HEADS, PAGE_SIZE, DEFER_SUMS)
    for j in range(n_full, n_tiles):
        acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i, acc_scale = _tile_int4_t(
            q_lo, q_hi, s_init, q_sum, acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i,
            acc_scale, k_smem, v_smem, ks_smem, vs_smem, k_ready, v_ready, k_empty, v_empty, j,
            lo + j * TKEYS, hi, last_key, qk_scale, True, THREAD_ARRIVE, ROW_SCALE, V_BIASED,
            own, HEADS, PAGE_SIZE, DEFER_SUMS)

    if DEFER_SUMS:   # the lanes' parts added once
        l_i = gl.convert_layout(gl.sum(l_i, 1), ROW_T)
        b_i = gl.convert_layout(gl.sum(b_i, 1), ROW_T)
    m, w, l, seen, lse = _warp_weights(m_i, l_i)                   # w [WARPS, NR]
    w_unit = w * gl.expand_dims(gl.convert_layout(acc_scale, gl.SliceLayout(1, ROW_T)), 1)
    w3 = gl.expand_dims(w_unit, 1)
    o_el = gl.reduce(acc_el * w3, 0, _add)                         # [32, NR]
    o_ol = gl.reduce(acc_ol * w3, 0, _add)
    if V_BIASED:   # the high planes' sums are 16 times their value
        w3_high = w3 * 0.0625
    else:
        w3_high = w3
    o_eh = gl.reduce(acc_eh * w3_high, 0, _add)
    o_oh = gl.reduce(acc_oh * w3_high, 0, _add)
    b = gl.reduce(b_i * w_unit, 0, _add)                          # [NR]: sum p o
    inv = gl.where(seen, 1.0 / gl.where(seen, l, 1.0), 0.0)
    o_ptrs, o_ok = _out_ptrs_t(Out, seq, split, kv_head, q_len, stride_ob, stride_ot,
                               stride_oh, stride_os, GROUP, PLANE)
    inv_o = gl.expand_dims(gl.convert_layout(inv, gl.SliceLayout(0, OUT2_T)), 0)
    b_o = gl.expand_dims(gl.convert_layout(b, gl.SliceLayout(0, OUT2_T)), 0)
    OT: gl.constexpr = Out.dtype.element_ty
    gl.store(o_ptrs, ((o_el + b_o) * inv_o).to(OT), mask=o_ok)
    gl.store(o_ptrs + 1, ((o_ol + b_o) * inv_o).to(OT), mask=o_ok)
    gl.store(o_ptrs + HALF, ((o_eh + b_o) * inv_o).to(OT), mask=o_ok)
    gl.store(o_ptrs + HALF + 1, ((o_oh + b_o) * inv_o).to(OT), mask=o_ok)
    if STORE_LSE:
        rl = gl.arange(0, NR, gl.SliceLayout(0, ROW_T))
        gl.store(Lse + seq.to(gl.int64) * stride_lb + split * stride_ls
                 + (rl // GROUP) * stride_lt + (kv_head * GROUP + rl % GROUP) * stride_lh, lse,
                 mask=rl < GROUP * q_len)


@gluon.jit
def _consume_swapped(Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                     cache_seqlens, block_table, sm_scale, q_len, num_splits, stride_qb,
                     stride_qt, stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot,
                     stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
                     stride_btb, stride_ksp, stride_kst, stride_vsp, stride_vst, ks_smem,
                     vs_smem, GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr,
                     THREAD_ARRIVE: gl.constexpr, RING_MERGE: gl.constexpr,
                     KV_FORMAT: gl.constexpr, PAGE_SIZE: gl.constexpr, STORE_LSE: gl.constexpr,
                     SCALE_RING: gl.constexpr, V_BIASED: gl.constexpr,
                     PROBE: gl.constexpr = 0, HEADS: gl.constexpr = 1,
                     DEFER_SUMS: gl.constexpr = False):
    """The consumer partition with swapped operands: ``_consume``'s arguments, ``_consume_t``'s
    work (fp8, and int8 with its scales by ring; the merge through Triton's reduce scratch).
    HEADS > 1: the CTA takes KV heads ``HEADS * program_id(1) ..`` (``GROUP``: their q heads),
    a tile ``TILE / HEADS`` keys of each."""
    gl.static_assert(KV_FORMAT == FP8 or SCALE_RING,
                     "swapped operands: fp8, or int8 / int4 with their scales by ring")
    gl.static_assert(GROUP % HEADS == 0, "GROUP: the KV head group's q heads")
    TILE: gl.constexpr = k_smem.shape[1]
    split = gl.program_id(0)
    kv_head = gl.program_id(1)
    seq = gl.program_id(2)
    seqlen, lo, hi = _split_range(cache_seqlens, seq, split, num_splits, TILE // HEADS)
    if KV_FORMAT == INT4:
        _consume_int4_t(Q, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                        ks_smem, vs_smem, seq, split, kv_head, seqlen, lo, hi, sm_scale, q_len,
                        stride_qb, stride_qt, stride_qh, stride_ob, stride_ot, stride_oh,
                        stride_os, stride_lb, stride_lt, stride_lh, stride_ls, GROUP, IS_CAUSAL,
                        THREAD_ARRIVE, STORE_LSE, PROBE, V_BIASED, HEADS, PAGE_SIZE, DEFER_SUMS)
    else:
        _consume_t(Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                   ks_smem, vs_smem, seq, split, kv_head, seqlen, lo, hi, sm_scale, q_len,
                   stride_qb, stride_qt, stride_qh, stride_ksh, stride_vsh, stride_ob,
                   stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
                   GROUP, IS_CAUSAL, THREAD_ARRIVE, KV_FORMAT, STORE_LSE, V_BIASED, PROBE,
                   HEADS, PAGE_SIZE)
