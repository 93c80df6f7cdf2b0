"""The Gluon paged decode's row-major consumers (kernels/gluon_decode.py): the packed q rows
(``GROUP * q_len <= 16``) as the dots' M, each warp's 32 keys of a tile as N. ``_consume``
(fp8, int8 and 16-bit caches, ``_tile``) and, for int4, ``_consume_int4_tiles`` (``_tile_int4``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .gluon_decode_common import (HEAD_DIM, INT4, INT8, INT8_BIAS, K_OP, K_OP16, LOG2E, MERGE_LOAD,
                                  MERGE_OUT, MERGE_SMEM, MMA, PAIR_SMEM, probe_drains, P_OP, Q_OP,
                                  Q_OP16, ROWS, ROW_STATE, V_OP, WARPS, _drain, _f16_row_factors,
                                  _fp8_pairs_to_f16, _int4_k_to_f16, _int4_v_to_f16,
                                  _int8_pairs_to_f16, _int8_to_biased_f16, _key_scales, _release,
                                  _scale_rows, _scale_slot_layout, _split_range,
                                  _unpack_f16_pairs, packed_pairs, _store_lse, _ring_key_scales,
                                  _tile_counts, _units_layout, _warp_weights)
from .gluon_prefill import _add, _max


@gluon.jit
def _softmax_step(sc, m_i, l_i, start, hi, last_key, qk_scale, MASKED: gl.constexpr,
                  ROW_SCALE: gl.constexpr):
    """The online softmax of a tile's scores ``sc [WARPS, ROWS, WKEYS]`` (keys ``start + WKEYS
    w ..`` in warp w), in base 2: ``(p, m_new, l_i, alpha)``. MASKED: keys from ``hi`` on, and
    those past a row's ``last_key``, get -inf. ROW_SCALE: ``qk_scale`` is a row's own."""
    WKEYS: gl.constexpr = sc.shape[2]
    if MASKED:
        w = gl.arange(0, WARPS, gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
        n = gl.arange(0, WKEYS, gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
        keys = start + gl.expand_dims(gl.expand_dims(w * WKEYS, 1), 2) \
            + gl.expand_dims(gl.expand_dims(n, 0), 1)
        visible = (keys < hi) & (keys <= gl.expand_dims(gl.expand_dims(last_key, 0), 2))
        if ROW_SCALE:
            sc = gl.where(visible, sc * gl.expand_dims(qk_scale, 2), float("-inf"))
        else:
            sc = gl.where(visible, sc * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.reduce(sc, 2, _max))
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(sc - gl.expand_dims(m_sub, 2))
    else:
        m_new = gl.maximum(m_i, gl.reduce(sc, 2, _max) * qk_scale)   # qk_scale > 0
        m_sub = m_new
        if ROW_SCALE:
            p = gl.exp2(sc * gl.expand_dims(qk_scale, 2) - gl.expand_dims(m_sub, 2))
        else:
            p = gl.exp2(sc * qk_scale - gl.expand_dims(m_sub, 2))
    alpha = gl.exp2(m_i - m_sub)
    l_i = l_i * alpha + gl.reduce(p, 2, _add)
    return p, m_new, l_i, alpha


@gluon.jit
def _tile(q, s_init, acc_e, acc_o, m_i, l_i, acc_scale, k_smem, v_smem, k_ready, v_ready,
          k_empty, v_empty, j, start, hi, last_key, qk_scale, KS, VS, bt_row, stride_ksp,
          stride_kst,
          stride_vsp, stride_vst, MASKED: gl.constexpr, THREAD_ARRIVE: gl.constexpr,
          KV_FORMAT: gl.constexpr, PAGE_SIZE: gl.constexpr, ROW_SCALE: gl.constexpr,
          SCALE_RING: gl.constexpr = False, V_BIASED: gl.constexpr = False):
    """Key tile ``j`` of the ring (keys ``start ..``) into each warp's state: warp w takes keys
    ``start + TILE / 4 * w ..``. fp8 and int8 slots (uint8) are converted to fp16 here; 16-bit
    slots (``KV16``) are the operands as they are, V's channels 0-63 into ``acc_e`` and 64-127
    into ``acc_o`` (fp8, int8: the even and the odd channels).

    int8 (``KV_FORMAT`` 2): K converts to ``1152 + x`` and the scores' dot starts from ``s_init``
    (``-1152 * sum(q)`` a row: fp16 products are exact in fp32, and the sums' rounding at that
    magnitude, ~2^-23 x 1152 x sum |q|, is far under int8's own step); each key's K scale goes on
    its scores' column, its V scale on its
    probabilities' column over the warp's largest V scale of the tile (so the fp16 probabilities
    stay <= 1: a bf16-range scale would overflow fp16, ``paged_decode_pairs``' reason), and the
    accumulators are kept in units of the last tile's largest scale, ``acc_scale [WARPS]``: the
    rescale by ``alpha`` also carries the change of unit, so the dot still accumulates in place.
    ROW_SCALE: ``qk_scale`` is a row's own (``[WARPS, ROWS]``: bf16 q rows scaled into fp16).
    SCALE_RING (int8): KS / VS are the scale rings (``_load_tile``'s SCALES), read with K.
    V_BIASED (int8): V converts to ``1152 + x`` (no subtract: 64 instructions a tile a thread
    fewer) and one more dot, the fp16 probabilities against ones (every column a row's sum of
    the probabilities exactly as the V dots take them), gives each row's ``1152 sum p``, which
    the V dots' start subtracts (the rescale's multiply becomes a fused multiply-add): the bias
    cancels within the tile, so the accumulators never carry it: ~1e-5 to 5e-5 of an int8 step
    lost in a numpy model of the fp32 sums (8192-131072 keys; the exact V path's ~1e-5, int8's
    own rounding ~5e-3 averaged over 8192 keys). Taken off once at the end instead, the sums
    carry 1152 l: ~1e-3 of a step lost (the model), the precision traded away."""
    STAGES: gl.constexpr = k_smem.shape[0]
    TILE: gl.constexpr = k_smem.shape[1]
    WKEYS: gl.constexpr = TILE // WARPS
    KV16: gl.constexpr = k_smem.dtype.primitive_bitwidth == 16
    s = j % STAGES
    phase = (j // STAGES) & 1
    U16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    if KV_FORMAT == INT8 and not SCALE_RING:   # issued before the waits: under K's latency
        ks, vs = _key_scales(KS, VS, bt_row, start, hi, stride_ksp, stride_kst, stride_vsp,
                             stride_vst, PAGE_SIZE, WKEYS)

    mbarrier.wait(k_ready.index(s), phase)
    if KV16:
        kf = k_smem.index(s).reshape([WARPS, WKEYS, HEAD_DIM]).permute((0, 2, 1)).load(K_OP16)
        _release(k_empty.index(s), THREAD_ARRIVE)
    else:
        kb = k_smem.index(s).reshape([WARPS, WKEYS, HEAD_DIM]).permute((0, 2, 1)).load(K_OP)
        if SCALE_RING:
            ks = _ring_key_scales(KS.index(s), WKEYS, TILE, gl.SliceLayout(1, MMA), True)
            vs = _ring_key_scales(VS.index(s), WKEYS, TILE, gl.SliceLayout(1, MMA), True)
        _release(k_empty.index(s), THREAD_ARRIVE)
        if SCALE_RING and MASKED:   # scales past the end: whatever the slots hold (NaN)
            w = gl.arange(0, WARPS, gl.SliceLayout(1, gl.SliceLayout(1, MMA)))
            n = gl.arange(0, WKEYS, gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
            vs = gl.where(start + gl.expand_dims(w * WKEYS, 1) + gl.expand_dims(n, 0) < hi,
                          vs, 0.0)
        if KV_FORMAT == INT8:
            kf = _int8_to_biased_f16(kb)
        else:
            kf = kb.to(gl.float8e4nv, bitcast=True).to(gl.float16)
    if KV_FORMAT == INT8:
        sc = mma_v2(q, kf, s_init)
    else:
        sc = mma_v2(q, kf, gl.zeros([WARPS, ROWS, WKEYS], gl.float32, MMA))
    if KV_FORMAT == INT8:
        sc = sc * gl.expand_dims(ks, 1)
    p, m_new, l_i, alpha = _softmax_step(sc, m_i, l_i, start, hi, last_key, qk_scale, MASKED,
                                         ROW_SCALE)
    a3 = gl.expand_dims(alpha, 2)
    if KV_FORMAT == INT8:
        v_max = gl.max(vs, 1)                                   # [WARPS]: 0 past the end
        v_max = gl.where(v_max > 0.0, v_max, 1.0)
        p = p * gl.expand_dims(vs / gl.expand_dims(v_max, 1), 1)
        a3 = a3 * gl.expand_dims(gl.expand_dims(acc_scale / v_max, 1), 1)
        acc_scale = v_max
    p_op = gl.convert_layout(p.to(q.dtype), P_OP)

    mbarrier.wait(v_ready.index(s), phase)
    if KV16:
        vt = v_smem.index(s).reshape([WARPS, WKEYS, HEAD_DIM])
        v_lo = vt.slice(0, HEAD_DIM // 2, dim=2).load(V_OP)
        v_hi = vt.slice(HEAD_DIM // 2, HEAD_DIM // 2, dim=2).load(V_OP)
    else:
        units = v_smem.index(s)._reinterpret(gl.uint16, [TILE, HEAD_DIM // 2], U16).reshape(
            [WARPS, WKEYS, HEAD_DIM // 2]).load(V_OP)
    _release(v_empty.index(s), THREAD_ARRIVE)
    if MASKED and not (V_BIASED and KV_FORMAT == INT8):
        # V rows past the end may hold anything (NaN bytes): 0 * NaN would be NaN (biased int8
        # converts any byte to a finite 1024 .. 1279, and p is 0 there)
        wv = gl.arange(0, WARPS, gl.SliceLayout(1, gl.SliceLayout(2, V_OP)))
        kv = gl.arange(0, WKEYS, gl.SliceLayout(0, gl.SliceLayout(2, V_OP)))
        vkeys = start + gl.expand_dims(gl.expand_dims(wv * WKEYS, 1), 2) \
            + gl.expand_dims(gl.expand_dims(kv, 0), 2)
        if KV16:
            v_lo = gl.where(vkeys < hi, v_lo, 0.0)
            v_hi = gl.where(vkeys < hi, v_hi, 0.0)
        else:
            units = gl.where(vkeys < hi, units, 0)
    if KV16:
        acc_e = mma_v2(p_op, v_lo, acc_e * a3)
        acc_o = mma_v2(p_op, v_hi, acc_o * a3)
    elif KV_FORMAT == INT8:
        if V_BIASED:
            ones = gl.full([WARPS, WKEYS, 8], 1.0, gl.float16, V_OP)
            p_sum = mma_v2(p_op, ones, gl.zeros([WARPS, ROWS, 8], gl.float32, MMA))
            bias = gl.expand_dims(gl.max(p_sum, 2) * -INT8_BIAS, 2)
            acc_e = mma_v2(p_op, _int8_pairs_to_f16(units, False, True), acc_e * a3 + bias)
            acc_o = mma_v2(p_op, _int8_pairs_to_f16(units, True, True), acc_o * a3 + bias)
        else:
            acc_e = mma_v2(p_op, _int8_pairs_to_f16(units, False), acc_e * a3)
            acc_o = mma_v2(p_op, _int8_pairs_to_f16(units, True), acc_o * a3)
    else:
        acc_e = mma_v2(p_op, _fp8_pairs_to_f16(units, False), acc_e * a3)
        acc_o = mma_v2(p_op, _fp8_pairs_to_f16(units, True), acc_o * a3)
    return acc_e, acc_o, m_new, l_i, acc_scale


# int4's (scale, offset) pairs from a ring slot ([TILE, 2] float32) straight into the scores'
# column layout (``SliceLayout(1, MMA)``: warp w's keys, lane l's 2 (l % 4) + {0, 1} + 8 j, the
# other lane bits broadcast), the pair's two floats the fastest registers: a thread's two
# adjacent keys are one 16-byte load, and the split halves are that layout as they are.
PAIR_LOAD = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 1, 0], [0, 8, 0], [0, 16, 0]],
    lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]],
    warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[4, 32, 2]))


@gluon.jit
def _ring_scales(slot, WKEYS: gl.constexpr):
    """A ring slot's per-key scales (int8) -> float32 ``[WARPS, WKEYS]`` in the scores' column
    layout (a thread's two adjacent keys: one 8-byte load)."""
    layout: gl.constexpr = _scale_slot_layout(WARPS, WKEYS, slot.shape[1])
    return slot._reinterpret(gl.float32, [WARPS, WKEYS], layout).load(gl.SliceLayout(1, MMA))


@gluon.jit
def _ring_scale_pairs(slot, WKEYS: gl.constexpr):
    """A ring slot's per-key (scale, offset) pairs -> two float32 ``[WARPS, WKEYS]`` in the
    scores' column layout (warp w: keys ``WKEYS w ..`` of the tile)."""
    gl.static_assert(WARPS * WKEYS == 128, "PAIR_LOAD is the 128-key tile's")
    gl.static_assert(_scale_rows(slot.shape[1]) == 1, "pairs of a 16-key box: 128 bytes")
    pairs = slot._reinterpret(gl.float32, [WARPS, WKEYS, 2], PAIR_SMEM).load(PAIR_LOAD)
    scale, offset = pairs.split()
    COLS: gl.constexpr = gl.SliceLayout(1, MMA)
    return gl.convert_layout(scale, COLS), gl.convert_layout(offset, COLS)


@gluon.jit
def _tile_int4(q_lo, q_hi, s_init, q_sum, acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i,
               l_i, acc_scale, k_smem, v_smem, ks_smem, vs_smem, k_ready, v_ready, k_empty,
               v_empty, j, start, hi, last_key, qk_scale, MASKED: gl.constexpr,
               THREAD_ARRIVE: gl.constexpr, ROW_SCALE: gl.constexpr):
    """``_tile`` for int4 slots (``[TILE, 64]`` bytes a key). Scores: the high nibbles' dot
    (``1024 + 16 n``), times 1/16 plus ``s_init [WARPS, ROWS]`` as the low nibbles' start
    (``1024 + n``), which leaves ``sum q (n - 8)`` a key (``_consume_int4_tiles``); then each key's
    scale on its column and its offset times the row's ``sum(q)``. Output: the four nibble
    planes' dots (channels ``2u``, ``2u + 1``, ``64 + 2u``, ``65 + 2u``: ``acc_el, acc_ol,
    acc_eh, acc_oh [WARPS, ROWS, 32]``) of the exact ``q`` with the probabilities times the V
    scales over the warp's largest, in units of ``acc_scale`` as int8's; the V offsets' share
    ``sum p o`` a row in ``b_i [WARPS, ROWS]`` in the same unit (added to every channel at the
    end)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    TILE: gl.constexpr = k_smem.shape[1]
    ROW: gl.constexpr = k_smem.shape[2]
    WKEYS: gl.constexpr = TILE // WARPS
    U16: gl.constexpr = _units_layout(v_smem.layout)
    s = j % STAGES
    phase = (j // STAGES) & 1
    mbarrier.wait(k_ready.index(s), phase)
    if packed_pairs(ks_smem.shape[1], ks_smem.shape[2], TILE):   # fp16 pairs
        ks, ko = _unpack_f16_pairs(_ring_scales(ks_smem.index(s), WKEYS))
        vs, vo = _unpack_f16_pairs(_ring_scales(vs_smem.index(s), WKEYS))
    else:
        ks, ko = _ring_scale_pairs(ks_smem.index(s), WKEYS)
        vs, vo = _ring_scale_pairs(vs_smem.index(s), WKEYS)
    kb = k_smem.index(s).reshape([WARPS, WKEYS, ROW]).permute((0, 2, 1)).load(K_OP)
    _release(k_empty.index(s), THREAD_ARRIVE)
    if MASKED:   # pairs past the end: whatever the slots hold (NaN): out of v_max and b
        w = gl.arange(0, WARPS, gl.SliceLayout(1, gl.SliceLayout(1, MMA)))
        n = gl.arange(0, WKEYS, gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
        inside = start + gl.expand_dims(w * WKEYS, 1) + gl.expand_dims(n, 0) < hi
        vs = gl.where(inside, vs, 0.0)
        vo = gl.where(inside, vo, 0.0)
    sc = mma_v2(q_hi, _int4_k_to_f16(kb, True), gl.zeros([WARPS, ROWS, WKEYS], gl.float32, MMA))
    sc = mma_v2(q_lo, _int4_k_to_f16(kb, False), sc * 0.0625 + gl.expand_dims(s_init, 2))
    sc = sc * gl.expand_dims(ks, 1) + gl.expand_dims(ko, 1) * gl.expand_dims(q_sum, 2)
    p, m_new, l_i, alpha = _softmax_step(sc, m_i, l_i, start, hi, last_key, qk_scale, MASKED,
                                         ROW_SCALE)
    v_max = gl.max(vs, 1)                                       # [WARPS]: 0 past the end
    v_max = gl.where(v_max > 0.0, v_max, 1.0)
    v_inv = gl.expand_dims(1.0 / v_max, 1)
    # the change of unit as well ([WARPS] vectors: the same layout either way)
    alpha = alpha * gl.expand_dims(gl.convert_layout(acc_scale / v_max,
                                                     gl.SliceLayout(1, ROW_STATE)), 1)
    b_i = b_i * alpha + gl.reduce(p * gl.expand_dims(vo * v_inv, 1), 2, _add)
    p = p * gl.expand_dims(vs * v_inv, 1)
    a3 = gl.expand_dims(alpha, 2)
    acc_scale = v_max
    p_op = gl.convert_layout(p.to(gl.float16), P_OP)

    mbarrier.wait(v_ready.index(s), phase)
    units = v_smem.index(s)._reinterpret(gl.uint16, [TILE, ROW // 2], U16).reshape(
        [WARPS, WKEYS, ROW // 2]).load(V_OP)
    _release(v_empty.index(s), THREAD_ARRIVE)
    # Bytes past the end need no mask: any byte is two finite q, and their p is 0.
    acc_el = mma_v2(p_op, _int4_v_to_f16(units, False, False), acc_el * a3)
    acc_ol = mma_v2(p_op, _int4_v_to_f16(units, True, False), acc_ol * a3)
    acc_eh = mma_v2(p_op, _int4_v_to_f16(units, False, True), acc_eh * a3)
    acc_oh = mma_v2(p_op, _int4_v_to_f16(units, True, True), acc_oh * a3)
    return acc_el, acc_ol, acc_eh, acc_oh, b_i, m_new, l_i, acc_scale


@gluon.jit
def _consume_int4_tiles(q_lo, q_hi, acc_scale, m_i, l_i, k_smem, v_smem, k_ready, v_ready,
                        k_empty, v_empty, lo, hi, n_full, n_tiles, last_key, qk_scale, ks_smem,
                        vs_smem, Out, Lse, seq,
                        split, kv_head, q_len, stride_ob, stride_ot, stride_oh, stride_os,
                        stride_lb, stride_lt, stride_lh, stride_ls, GROUP: gl.constexpr,
                        THREAD_ARRIVE: gl.constexpr, ROW_SCALE: gl.constexpr,
                        STORE_LSE: gl.constexpr):
    """``_consume``'s tiles, merge and stores for int4 caches (``_tile_int4``): the four nibble
    planes merged through Triton's reduce scratch, the V offsets' share added to every channel,
    the planes stored at channels ``2u``, ``2u + 1``, ``64 + 2u``, ``65 + 2u``."""
    TILE: gl.constexpr = k_smem.shape[1]
    WKEYS: gl.constexpr = TILE // WARPS
    PLANE: gl.constexpr = HEAD_DIM // 4
    # The low nibbles' dot (1024 + n) starts from a sixteenth of the high ones' (1024 + 16 n,
    # from 0) plus -72 sum(q_hi) - 1032 sum(q_lo) a row: sum q (n - 8) a key. Products of fp16
    # are exact in fp32; the sums' rounding at those magnitudes is far under int4's step, as
    # int8's 1152. The start is a row's: one FFMA an element, no register tile.
    sum_lo = gl.convert_layout(gl.sum(q_lo.to(gl.float32), 2), ROW_STATE)
    sum_hi = gl.convert_layout(gl.sum(q_hi.to(gl.float32), 2), ROW_STATE)
    s_init = sum_hi * -72.0 + sum_lo * -1032.0
    q_sum = sum_lo + sum_hi
    acc_el = gl.zeros([WARPS, ROWS, PLANE], gl.float32, MMA)
    acc_ol = gl.zeros([WARPS, ROWS, PLANE], gl.float32, MMA)
    acc_eh = gl.zeros([WARPS, ROWS, PLANE], gl.float32, MMA)
    acc_oh = gl.zeros([WARPS, ROWS, PLANE], gl.float32, MMA)
    b_i = gl.zeros([WARPS, ROWS], gl.float32, ROW_STATE)
    for j in range(0, n_full):
        acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i, acc_scale = _tile_int4(
            q_lo, q_hi, s_init, q_sum, acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i,
            acc_scale, k_smem, v_smem, ks_smem, vs_smem, k_ready, v_ready, k_empty, v_empty, j,
            lo + j * TILE, hi, last_key, qk_scale, False, THREAD_ARRIVE, ROW_SCALE)
    for j in range(n_full, n_tiles):
        acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i, acc_scale = _tile_int4(
            q_lo, q_hi, s_init, q_sum, acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i,
            acc_scale, k_smem, v_smem, ks_smem, vs_smem, k_ready, v_ready, k_empty, v_empty, j,
            lo + j * TILE, hi, last_key, qk_scale, True, THREAD_ARRIVE, ROW_SCALE)

    # The four warps' states merged once (each warp's weight times its accumulators' unit).
    m, w, l, seen, lse = _warp_weights(m_i, l_i)                 # w [WARPS, ROWS]
    w_unit = w * gl.expand_dims(gl.convert_layout(acc_scale, gl.SliceLayout(1, ROW_STATE)), 1)
    w3 = gl.expand_dims(w_unit, 2)
    o_el = gl.reduce(acc_el * w3, 0, _add)
    o_ol = gl.reduce(acc_ol * w3, 0, _add)
    o_eh = gl.reduce(acc_eh * w3, 0, _add)
    o_oh = gl.reduce(acc_oh * w3, 0, _add)
    b = gl.reduce(b_i * w_unit, 0, _add)                        # [ROWS]: sum p o
    inv = gl.where(seen, 1.0 / gl.where(seen, l, 1.0), 0.0)

    OUT2: gl.constexpr = gl.SliceLayout(0, MMA)
    ro = gl.arange(0, ROWS, gl.SliceLayout(1, OUT2))
    po = gl.arange(0, PLANE, gl.SliceLayout(0, OUT2))
    o_row = (seq.to(gl.int64) * stride_ob + split * stride_os + (ro // GROUP) * stride_ot
             + (kv_head * GROUP + ro % GROUP) * stride_oh)
    o_ptrs = Out + gl.expand_dims(o_row, 1) + gl.expand_dims(po * 2, 0)
    o_ok = gl.expand_dims(ro < GROUP * q_len, 1)
    inv_o = gl.expand_dims(gl.convert_layout(inv, gl.SliceLayout(1, OUT2)), 1)
    b_o = gl.expand_dims(gl.convert_layout(b, gl.SliceLayout(1, OUT2)), 1)
    OT: gl.constexpr = Out.dtype.element_ty
    gl.store(o_ptrs, ((o_el + b_o) * inv_o).to(OT), mask=o_ok)
    gl.store(o_ptrs + 1, ((o_ol + b_o) * inv_o).to(OT), mask=o_ok)
    gl.store(o_ptrs + HEAD_DIM // 2, ((o_eh + b_o) * inv_o).to(OT), mask=o_ok)
    gl.store(o_ptrs + HEAD_DIM // 2 + 1, ((o_oh + b_o) * inv_o).to(OT), mask=o_ok)
    if STORE_LSE:
        _store_lse(Lse, lse, seq, split, kv_head, q_len, stride_lb, stride_lt, stride_lh,
                   stride_ls, GROUP)


@gluon.jit
def _consume(Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
             cache_seqlens, block_table, sm_scale, q_len, num_splits, stride_qb, stride_qt,
             stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot, stride_oh, stride_os,
             stride_lb, stride_lt, stride_lh, stride_ls, stride_btb, stride_ksp, stride_kst,
             stride_vsp, stride_vst, ks_smem, vs_smem, GROUP: gl.constexpr,
             IS_CAUSAL: gl.constexpr,
             THREAD_ARRIVE: gl.constexpr, RING_MERGE: gl.constexpr, KV_FORMAT: gl.constexpr,
             PAGE_SIZE: gl.constexpr, STORE_LSE: gl.constexpr, SCALE_RING: gl.constexpr,
             V_BIASED: gl.constexpr, PROBE: gl.constexpr = 0):
    TILE: gl.constexpr = k_smem.shape[1]
    KV16: gl.constexpr = k_smem.dtype.primitive_bitwidth == 16
    gl.static_assert(not (KV16 and RING_MERGE), "16-bit caches merge through the scratch")
    QL: gl.constexpr = Q_OP16 if KV16 else Q_OP
    split = gl.program_id(0)
    kv_head = gl.program_id(1)
    seq = gl.program_id(2)
    seqlen, lo, hi = _split_range(cache_seqlens, seq, split, num_splits, TILE)

    # Q rows [WARPS, ROWS, D], the same in every warp, loaded straight into the operand layout.
    # int4: the channels of the low nibbles (0-63) and of the high ones (64-127) apart
    D_Q: gl.constexpr = HEAD_DIM // 2 if KV_FORMAT == INT4 else HEAD_DIM
    r = gl.arange(0, ROWS, gl.SliceLayout(0, gl.SliceLayout(2, QL)))
    d = gl.arange(0, D_Q, gl.SliceLayout(0, gl.SliceLayout(1, QL)))
    wq = gl.arange(0, WARPS, gl.SliceLayout(1, gl.SliceLayout(2, QL)))
    q_row = (r // GROUP) * stride_qt + (kv_head * GROUP + r % GROUP) * stride_qh
    q_ptrs = (Q + seq.to(gl.int64) * stride_qb
              + gl.expand_dims(gl.expand_dims(wq * 0, 1) + gl.expand_dims(q_row, 0), 2)
              + gl.expand_dims(gl.expand_dims(d, 0), 1))
    q_ok = gl.expand_dims(gl.expand_dims(wq >= 0, 1) & gl.expand_dims(r < GROUP * q_len, 0), 2)
    q = gl.load(q_ptrs, mask=q_ok, other=0.0)
    if KV_FORMAT == INT4:
        q_hi = gl.load(q_ptrs + D_Q, mask=q_ok, other=0.0)
    # bf16 q (fp8 / int8 caches): each row times a power of two into fp16 (its largest magnitude
    # in [2^13, 2^14): nothing lost, paged_decode._f16_rows), so the dots and the converters stay
    # fp16's; the inverse factor goes on the row's score scale.
    ROW_SCALE: gl.constexpr = (not KV16) and Q.dtype.element_ty == gl.bfloat16
    if ROW_SCALE:
        qf = q.to(gl.float32)
        amax = gl.max(gl.abs(qf), 2)                             # [WARPS, ROWS]
        if KV_FORMAT == INT4:
            amax = gl.maximum(amax, gl.max(gl.abs(q_hi.to(gl.float32)), 2))
        up, down = _f16_row_factors(amax)
        q = (qf * gl.expand_dims(up, 2)).to(gl.float16)
        if KV_FORMAT == INT4:
            q_hi = (q_hi.to(gl.float32) * gl.expand_dims(up, 2)).to(gl.float16)

    diag, n_full, n_tiles = _tile_counts(seqlen, lo, hi, q_len, IS_CAUSAL, TILE)
    rs = gl.arange(0, ROWS, gl.SliceLayout(0, ROW_STATE))
    last_key = rs // GROUP + diag
    if KV16 or KV_FORMAT == INT8 or KV_FORMAT == INT4:   # int8, int4: per-key scales
        qk_scale = sm_scale * LOG2E
    else:
        qk_scale = sm_scale * LOG2E * gl.load(KS + kv_head * stride_ksh)
    if ROW_SCALE:
        qk_scale = qk_scale * gl.convert_layout(down, ROW_STATE)
    if not SCALE_RING:   # else KS / VS are TMA descriptors: the scales come by ring
        KSh = KS + kv_head * stride_ksh
        VSh = VS + kv_head * stride_vsh
    bt_row = block_table + seq.to(gl.int64) * stride_btb

    m_i = gl.full([WARPS, ROWS], float("-inf"), gl.float32, ROW_STATE)
    l_i = gl.zeros([WARPS, ROWS], gl.float32, ROW_STATE)
    acc_e = gl.zeros([WARPS, ROWS, HEAD_DIM // 2], gl.float32, MMA)
    acc_o = gl.zeros([WARPS, ROWS, HEAD_DIM // 2], gl.float32, MMA)
    # int8: the accumulators' unit (each warp's last largest V scale; _tile), and the scores'
    # dot's start, -1152 * sum(q) a row (its K converts to 1152 + x)
    acc_scale = gl.full([WARPS], 1.0, gl.float32, gl.SliceLayout(1, gl.SliceLayout(1, MMA)))
    WKEYS: gl.constexpr = TILE // WARPS
    s_init = gl.zeros([WARPS, ROWS, WKEYS], gl.float32, MMA)
    if KV_FORMAT == INT8:
        q_sum = gl.convert_layout(gl.sum(q.to(gl.float32), 2), ROW_STATE)
        s_init = s_init + gl.expand_dims(q_sum * (-INT8_BIAS), 2)
    if KV_FORMAT == INT4:
        gl.static_assert(PROBE == 0, "the roofline probe: fp8 / int8 row-major consumers")
        gl.static_assert(not V_BIASED, "int4's biased V: the swapped consumers only")
        _consume_int4_tiles(q, q_hi, acc_scale, m_i, l_i, k_smem, v_smem, k_ready, v_ready,
                            k_empty, v_empty, lo, hi, n_full, n_tiles, last_key, qk_scale,
                            ks_smem, vs_smem, Out,
                            Lse, seq, split, kv_head, q_len, stride_ob, stride_ot, stride_oh,
                            stride_os, stride_lb, stride_lt, stride_lh, stride_ls, GROUP,
                            THREAD_ARRIVE, ROW_SCALE, STORE_LSE)
    else:
        if SCALE_RING:
            KSt = ks_smem
            VSt = vs_smem
        else:
            KSt = KSh
            VSt = VSh
        if probe_drains(PROBE):
            _drain(k_ready, v_ready, k_empty, v_empty, n_tiles, THREAD_ARRIVE)
            n_full = 0
            n_tiles = 0
        for j in range(0, n_full):
            acc_e, acc_o, m_i, l_i, acc_scale = _tile(
                q, s_init, acc_e, acc_o, m_i, l_i, acc_scale, k_smem, v_smem, k_ready, v_ready,
                k_empty, v_empty, j, lo + j * TILE, hi, last_key, qk_scale, KSt, VSt, bt_row,
                stride_ksp, stride_kst, stride_vsp, stride_vst, False, THREAD_ARRIVE, KV_FORMAT,
                PAGE_SIZE, ROW_SCALE, SCALE_RING, V_BIASED)
        for j in range(n_full, n_tiles):
            acc_e, acc_o, m_i, l_i, acc_scale = _tile(
                q, s_init, acc_e, acc_o, m_i, l_i, acc_scale, k_smem, v_smem, k_ready, v_ready,
                k_empty, v_empty, j, lo + j * TILE, hi, last_key, qk_scale, KSt, VSt, bt_row,
                stride_ksp, stride_kst, stride_vsp, stride_vst, True, THREAD_ARRIVE, KV_FORMAT,
                PAGE_SIZE, ROW_SCALE, SCALE_RING, V_BIASED)

        # The four warps' states merged once.
        m, w, l, seen, lse = _warp_weights(m_i, l_i)               # w [WARPS, ROWS]
        w3 = gl.expand_dims(w, 2)
        if KV_FORMAT == INT8:   # the accumulators back from their unit
            w3 = w3 * gl.expand_dims(gl.expand_dims(acc_scale, 1), 1)
        if not RING_MERGE:   # Triton's cross-warp reduction (shared-memory scratch)
            o_e = gl.reduce(acc_e * w3, 0, _add)
            o_o = gl.reduce(acc_o * w3, 0, _add)
        if KV16 or KV_FORMAT == INT8:
            inv = gl.where(seen, 1.0 / gl.where(seen, l, 1.0), 0.0)
        else:
            inv = gl.where(seen, gl.load(VS + kv_head * stride_vsh) / gl.where(seen, l, 1.0), 0.0)

        if RING_MERGE:
            # Every tile's K and V waits are behind every consumer warp and the loader issues no
            # tile past the last, so the ring is idle: K slot 0 takes the even channels' weighted
            # accumulators, slot 1 the odd ones' (fp32 [WARPS, ROWS, 64], 16 KB each). Membar puts a
            # bar.sync of the consumer warps between the last tile's ldmatrix and these stores (the
            # views alias the K ring) and another between the stores and the loads.
            ev = k_smem.index(0)._reinterpret(gl.float32, [WARPS * ROWS, HEAD_DIM // 2],
                                              MERGE_SMEM).reshape([WARPS, ROWS, HEAD_DIM // 2])
            od = k_smem.index(1)._reinterpret(gl.float32, [WARPS * ROWS, HEAD_DIM // 2],
                                              MERGE_SMEM).reshape([WARPS, ROWS, HEAD_DIM // 2])
            ev.store(acc_e * w3)
            od.store(acc_o * w3)
            o_e = gl.sum(ev.load(MERGE_LOAD), 0)                   # [ROWS, 64], 2 pairs a thread
            o_o = gl.sum(od.load(MERGE_LOAD), 0)
            o = gl.convert_layout(gl.join(o_e, o_o).reshape([ROWS, HEAD_DIM]), MERGE_OUT,
                                  assert_trivial=True)             # channels 4i .. 4i + 3
            ro = gl.arange(0, ROWS, gl.SliceLayout(1, MERGE_OUT))
            po = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, MERGE_OUT))
            o_row = (seq.to(gl.int64) * stride_ob + split * stride_os + (ro // GROUP) * stride_ot
                     + (kv_head * GROUP + ro % GROUP) * stride_oh)
            o_ptrs = Out + gl.expand_dims(o_row, 1) + gl.expand_dims(po, 0)
            o_ok = gl.expand_dims(ro < GROUP * q_len, 1)
            inv_o = gl.expand_dims(gl.convert_layout(inv, gl.SliceLayout(1, MERGE_OUT)), 1)
            gl.store(o_ptrs, (o * inv_o).to(Out.dtype.element_ty), mask=o_ok)
        else:
            OUT2: gl.constexpr = gl.SliceLayout(0, MMA)
            ro = gl.arange(0, ROWS, gl.SliceLayout(1, OUT2))
            po = gl.arange(0, HEAD_DIM // 2, gl.SliceLayout(0, OUT2))
            o_row = (seq.to(gl.int64) * stride_ob + split * stride_os + (ro // GROUP) * stride_ot
                     + (kv_head * GROUP + ro % GROUP) * stride_oh)
            # fp8: even and odd channels (stride 2); 16-bit: the two 64-channel halves
            C_STEP: gl.constexpr = 1 if KV16 else 2
            C_OFF: gl.constexpr = HEAD_DIM // 2 if KV16 else 1
            o_ptrs = Out + gl.expand_dims(o_row, 1) + gl.expand_dims(po * C_STEP, 0)
            o_ok = gl.expand_dims(ro < GROUP * q_len, 1)
            inv_o = gl.expand_dims(gl.convert_layout(inv, gl.SliceLayout(1, OUT2)), 1)
            gl.store(o_ptrs, (o_e * inv_o).to(Out.dtype.element_ty), mask=o_ok)
            gl.store(o_ptrs + C_OFF, (o_o * inv_o).to(Out.dtype.element_ty), mask=o_ok)
        if STORE_LSE:
            _store_lse(Lse, lse, seq, split, kv_head, q_len, stride_lb, stride_lt, stride_lh,
                       stride_ls, GROUP)
