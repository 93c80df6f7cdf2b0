"""Warp-specialized Hopper (sm90) dual-group attention backward in Gluon: FA3's structure.

The same contract as ``dual_group_bwd.launch_dual_group_bwd`` (contiguous K/V, and the
context-parallel path: the zigzag all-gather buffer read and written in place, both query groups
in one tensor in a rank's local order; ``gluon_bwd_maps`` draws the row and key maps), in one
main kernel between a small pre- and postprocess:

1. Δ = rowsum(dO∘O) for every row of both groups (``_delta_kernel``, plain Triton); the fp32
   dQ accumulator ``[rows0 + rows1, nheads * D]`` is zeroed; the main kernel's accumulator
   inits -LSE / scale and -Δ are staged per (group, sequence) at 16-byte aligned columns of
   one fp32 ``[2 * nheads, cols]`` buffer (``_init_kernel``, ``init_column``).
2. ``_gluon_bwd_kernel``: one CTA per (KV head, sequence, 128 keys), in the order of
   ``launch_gluon_bwd``'s ``schedule`` (``gluon_bwd_sched``: by default KV heads fastest, key
   block 0 first). Two partitions:

   - ``_load`` (1 warp, 24 registers): K and V of the CTA's keys once, by TMA; then a 2-deep
     mbarrier ring of Q and dO tiles (64 rows each, 2-D descriptors over ``[rows, nheads * D]``),
     and of the step's 64 -LSE / scale and -Δ values (TMA too, on their own barrier), which the
     consumers take as the initial Sᵀ and dPᵀ accumulators. The loader stores nothing itself: a
     generic-proxy store handed over by one lane's mbarrier arrive is what racecheck flagged.
   - ``_consume`` (8 warps = two warpgroups at 240 registers, the research note's layout A):
     warpgroup ``w`` owns keys ``[64w, 64w + 64)`` for Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (async SS
     wgmma), Pᵀ = exp2(Sᵀ·scale·log2e − LSE₂), dSᵀ = Pᵀ∘(dPᵀ − Δ), and dV += Pᵀ·dO,
     dK += dSᵀ·Q (RS wgmma: Pᵀ and dSᵀ stay in registers as the A operand); dSᵀ goes to shared
     memory and dQ = scale·dS·K is split by head-dim columns (warpgroup ``w`` computes columns
     ``[wD/2, (w+1)D/2)`` over all 128 keys), staged in shared memory and reduce-added in fp32
     into the dQ accumulator by one TMA reduce per step, asynchronously.

   Layout A, not B (two 4-warp partitions, each reducing a [64, D] dQ partial over its own 64
   keys): B holds a 64-register dQ per thread beside dK, dV, Sᵀ and dPᵀ, and ptxas serialized
   the wgmmas (C7512) and spilled; A's dQ is 32 registers and reduces half the bytes (FA3's
   split). The price is a partition-wide ``bar.sync`` where both warpgroups meet at dS.

   The q loop walks, for every q head of the KV head (GQA), the rows of BOTH query groups that
   see the CTA's keys (each group bottom-right causal within its own ``kv_end``), so dK and dV are
   summed over all of them in fp32 registers and stored once (dK scaled), cast to dK/dV's dtype.
3. dQ = the accumulator cast to q's dtype (the scale is applied before the reduce); K/V rows of
   no sequence (past ``cu_seqlens_k[-1]``) are zeroed. Every element of dq*, dk, dv is written.

Masks: the causal diagonal, keys past ``kv_end`` and rows past a group's length, only on the
tiles that need them, as -inf in the initial Sᵀ accumulator (so P = exp2(Sᵀ · scale · log2e) is
exactly 0); rows that see no key (``lse = -inf``) are staged as -inf. Such rows add nothing to
dK/dV (a tile's rows past its group's length also get -Δ = 0: a row of no sequence may hold a
non-finite Δ) and exact zeros to the dQ rows they cover (rows of other sequences, or group 1's
first rows in the shared accumulator when a group-0 tile runs past its tensor; TMA clips rows
past the accumulator's end). This assumes the rows of q, dout, k, v outside any sequence hold
finite values (a NaN there would leak through ``0 * NaN``); the Triton backward masks its loads
instead.

Base-2 softmax inside (log2(e) folded into the scale), natural-log LSE outside. The dQ reduce
order varies run to run: ``deterministic=True`` keeps the Triton two-kernel backward.
"""
from __future__ import annotations

import torch
import triton
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from .gluon_bwd_maps import (BLOCK_M, BLOCK_N, _first_key, _group, _key_rows, _m_range,
                             _n_segments, _segment, _tile, local_order_rows)
from .gluon_bwd_sched import (DEFAULT_SCHEDULE, ORDERS, GluonBwdSchedule, _delta_kernel,
                              _init_kernel, _zero_key_tail_kernel, lpt_work)


LOG2E = gl.constexpr(1.4426950408889634)

# Tiles: BLOCK_M query rows per ring slot, BLOCK_N keys per CTA (gluon_bwd_maps; the ring depths
# are the shared buffers' leading dims: gluon_bwd_sched.GluonBwdSchedule).
# Partitions and registers per thread (setmaxnreg). The consumer is one 8-warp partition, two
# warpgroups at 240: dK + dV 128 (each warpgroup owns 64 of the keys), Sᵀ + dPᵀ 64 or dQ 32 (the
# warpgroups split dQ's head-dim columns), the bf16 A fragments 16 + 16. The loader warp gets 24
# (padded to a warpgroup). The kernel's `.maxnreg` stays unset: 12 warps run at 168 outside the
# warp-specialized region (research note, section 2.1).
CONSUMER_WARPS = gl.constexpr(8)
LOADER_WARPS = gl.constexpr(1)
LOADER_REGS = gl.constexpr(24)
# Sᵀ and dPᵀ: keys x queries [BLOCK_N, BLOCK_M]; warpgroup w holds keys [64w, 64w + 64).
ST_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                   instr_shape=[16, 64, 16]))
QUERY_LAYOUT = gl.constexpr(gl.SliceLayout(0, ST_LAYOUT))   # per-query LSE₂, Δ, row index
KEY_LAYOUT = gl.constexpr(gl.SliceLayout(1, ST_LAYOUT))     # per-key index
# Row indices of a step in the consumer (one register a thread; converted to QUERY_LAYOUT only
# for the causal mask: a QUERY_LAYOUT arange is hoisted out of the loop, 16 live registers).
ROW_LAYOUT = gl.constexpr(gl.BlockedLayout([1], [32], [8], [0]))
# A step's 64 -LSE / scale or -Δ values in shared memory: a flat ring the consumers read in
# QUERY_LAYOUT, written by TMA through a [1, BLOCK_M] unswizzled view of the same bytes.
VEC_SMEM = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))
INIT_TMA = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))


@gluon.constexpr_function
def dkv_layout(head_dim):
    """dK and dV accumulators [BLOCK_N keys, D], split by keys like Sᵀ (so Pᵀ and dSᵀ convert to
    the RS A operand without data movement): wgmma m64nDk16 per warpgroup."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                     instr_shape=[16, head_dim, 16])


@gluon.constexpr_function
def dq_layout(head_dim):
    """dQ [BLOCK_M queries, D]: warpgroup w computes columns [wD/2, (w+1)D/2) over all 128 keys."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                     instr_shape=[16, head_dim // 2, 16])


@builtin
def tma_reduce_add(desc, coord, src, _semantic=None):
    """``cp.reduce.async.bulk.tensor.add`` of shared ``src`` into ``desc`` at ``coord`` (triton
    3.6 binds the op but has no Python wrapper). Tracked like a TMA store: ``tma.store_wait``."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle, coord,
                                              src.handle)


@gluon.jit
def _load(q0_desc, q1_desc, do0_desc, do1_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem,
          lse_smem, delta_smem, kv_ready, q_ready, do_ready, init_ready, qdo_empty, init_desc,
          dqa_row1, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, kv_group, Work,
          n_blocks, batch, n_chunks, rank_rows, chunk_blocks, n_segments,
          HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, KV_END_SCALAR: gl.constexpr,
          ORDER: gl.constexpr, ROTATE: gl.constexpr, KV_ZIGZAG: gl.constexpr,
          LOCAL_ORDER: gl.constexpr):
    """The loader warp: K/V once, then into the ring, by TMA, every step's Q, dO and its rows'
    -LSE / scale and -Δ (the Sᵀ and dPᵀ accumulators' initial rows, staged by the preprocess in
    ``init_desc``), in ``_consume``'s step order. No generic-proxy store: every byte the
    consumers read arrives through a barrier's transaction count."""
    STAGES: gl.constexpr = q_smem.shape[0]
    kv_head, seq, blk = _tile(Work, n_blocks, batch, ORDER)
    n0, empty = _first_key(cu_seqlens_k, seq, blk, chunk_blocks, KV_ZIGZAG)
    kv_row, lim = _key_rows(cu_seqlens_k, seq, n0, n_chunks, rank_rows, KV_ZIGZAG)
    # kv_ready (count 1): this warp's expect + the TMA bytes complete phase 0; consumers wait 0.
    # One box of BLOCK_N rows each: the block's keys are one run of rows in either layout.
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_row, kv_head * HEAD_DIM], kv_ready, k_smem)
    tma.async_copy_global_to_shared(v_desc, [kv_row, kv_head * HEAD_DIM], kv_ready, v_smem)
    it = 0
    n_seg = _n_segments(kv_group, n_segments, KV_ZIGZAG)
    for tr in range(n_seg):  # both query groups of every q head of the KV head
        t = _segment(tr, n0, n_seg, ROTATE)
        g = t % 2
        head = kv_head * kv_group + t // 2
        row, len_q, end, vis_end = _group(g, seq, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
                                          kv_end0, kv_end1, n_chunks, n0, batch,
                                          KV_END_SCALAR, KV_ZIGZAG, LOCAL_ORDER)
        # The segment's first init column (gluon_bwd_sched.init_column): 16-byte aligned.
        if LOCAL_ORDER:
            segment = 2 * seq + g
        else:
            segment = g * batch + seq
        init_col = (gl.where(g == 0, 0, dqa_row1) + row + 3 * segment + 3) // 4 * 4
        diag, lo, hi = _m_range(len_q, end, n0, IS_CAUSAL)
        for m0 in range(lo, hi, BLOCK_M):
            s = it % STAGES
            ph = (it // STAGES) & 1
            # qdo_empty[s] (count 1: the consumer partition arrives once its last wgmma on the
            # slot has retired). Wait parity ph ^ 1: a fresh barrier passes the first round.
            mbarrier.wait(qdo_empty.index(s), ph ^ 1)
            # q_ready[s], do_ready[s] (count 1): expect + TMA bytes; consumers wait parity ph.
            mbarrier.expect(q_ready.index(s), q0_desc.block_type.nbytes)
            if g == 0:
                tma.async_copy_global_to_shared(q0_desc, [row + m0, head * HEAD_DIM],
                                                q_ready.index(s), q_smem.index(s))
            else:
                tma.async_copy_global_to_shared(q1_desc, [row + m0, head * HEAD_DIM],
                                                q_ready.index(s), q_smem.index(s))
            mbarrier.expect(do_ready.index(s), do0_desc.block_type.nbytes)
            if g == 0:
                tma.async_copy_global_to_shared(do0_desc, [row + m0, head * HEAD_DIM],
                                                do_ready.index(s), do_smem.index(s))
            else:
                tma.async_copy_global_to_shared(do1_desc, [row + m0, head * HEAD_DIM],
                                                do_ready.index(s), do_smem.index(s))
            # init_ready[s] (count 1): expect + the TMA bytes of the step's 64 -LSE / scale and
            # 64 -Δ (the Sᵀ and dPᵀ accumulators' initial rows); consumers wait parity ph.
            mbarrier.expect(init_ready.index(s), 2 * init_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                init_desc, [2 * head, init_col + m0], init_ready.index(s),
                lse_smem.index(s)._reinterpret(gl.float32, [1, BLOCK_M], INIT_TMA))
            tma.async_copy_global_to_shared(
                init_desc, [2 * head + 1, init_col + m0], init_ready.index(s),
                delta_smem.index(s)._reinterpret(gl.float32, [1, BLOCK_M], INIT_TMA))
            it += 1


@gluon.jit
def _consume(dqa_desc, dqa_row1, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_stage, lse_smem,
             delta_smem, kv_ready, q_ready, do_ready, init_ready, qdo_empty, DK, DV, stride_dkn,
             stride_dkh, stride_dvn, stride_dvh, cu_seqlens_q0, cu_seqlens_q1,
             cu_seqlens_k, kv_end0, kv_end1, kv_group, sm_scale, Work, n_blocks, batch,
             n_chunks, rank_rows, chunk_blocks, n_segments, HEAD_DIM: gl.constexpr,
             IS_CAUSAL: gl.constexpr, KV_END_SCALAR: gl.constexpr, ORDER: gl.constexpr,
             ROTATE: gl.constexpr, KV_ZIGZAG: gl.constexpr, LOCAL_ORDER: gl.constexpr):
    """The two consumer warpgroups: keys ``[n0, n0 + BLOCK_N)`` against every step's rows;
    dK/dV stored at the end."""
    DKV: gl.constexpr = dkv_layout(HEAD_DIM)
    DQ: gl.constexpr = dq_layout(HEAD_DIM)
    A_OPERAND: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=DKV, k_width=2)
    dtype: gl.constexpr = q_smem.dtype
    STAGES: gl.constexpr = q_smem.shape[0]
    DQ_STAGES: gl.constexpr = dq_stage.shape[0]
    kv_head, seq, blk = _tile(Work, n_blocks, batch, ORDER)
    n0, empty = _first_key(cu_seqlens_k, seq, blk, chunk_blocks, KV_ZIGZAG)
    qk_scale = sm_scale * LOG2E
    zero_st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ST_LAYOUT)
    zero_dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, DQ)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, DKV)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, DKV)
    mbarrier.wait(kv_ready, 0)
    it = 0
    n_seg = _n_segments(kv_group, n_segments, KV_ZIGZAG)
    for tr in range(n_seg):  # both query groups of every q head of the KV head
        t = _segment(tr, n0, n_seg, ROTATE)
        g = t % 2
        head = kv_head * kv_group + t // 2
        row, len_q, end, vis_end = _group(g, seq, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
                                          kv_end0, kv_end1, n_chunks, n0, batch,
                                          KV_END_SCALAR, KV_ZIGZAG, LOCAL_ORDER)
        diag, lo, hi = _m_range(len_q, end, n0, IS_CAUSAL)
        for m0 in range(lo, hi, BLOCK_M):
            s = it % STAGES
            ph = (it // STAGES) & 1
            # The accumulators start at -LSE / scale and -Δ (broadcast over keys; the loader
            # staged them), so that Pᵀ = exp2(Sᵀ · scale · log2e) and dSᵀ = Pᵀ ∘ dPᵀ need no
            # per-query vector in registers while the wgmmas run.
            mbarrier.wait(init_ready.index(s), ph)
            neg_lse = lse_smem.index(s).load(QUERY_LAYOUT)
            tail = m0 + BLOCK_M > hi   # in the loop, hi == len_q
            if tail:
                # Rows past len_q (another sequence's, or none's) see no key: -inf (P = 0).
                offs_t = gl.convert_layout(m0 + gl.arange(0, BLOCK_M, ROW_LAYOUT), QUERY_LAYOUT)
                neg_lse = gl.where(offs_t < hi, neg_lse, float("-inf"))
            s_init = zero_st + gl.expand_dims(neg_lse, 0)
            # Keys past `vis_end` (the group's `end`, the sequence's or, zigzag, the block's
            # chunk's end) and above the causal diagonal start at -inf (P = 0): masking the
            # initial accumulator costs no registers while the wgmmas are in flight.
            if IS_CAUSAL:
                masked = (n0 + BLOCK_N > vis_end) | (m0 + diag < n0 + BLOCK_N - 1)
            else:
                masked = n0 + BLOCK_N > vis_end
            if masked:
                offs_key = n0 + gl.arange(0, BLOCK_N, KEY_LAYOUT)
                visible = gl.expand_dims(offs_key < vis_end, 1)
                if IS_CAUSAL:
                    # Row i's last visible key, i + diag, converted from the compact layout (a
                    # QUERY_LAYOUT arange would be hoisted out of the loop: 16 live registers).
                    offs_r = m0 + gl.arange(0, BLOCK_M, ROW_LAYOUT)
                    last_key = gl.convert_layout(offs_r + diag, QUERY_LAYOUT)
                    visible = visible & (gl.expand_dims(offs_key, 1) <=
                                         gl.expand_dims(last_key, 0))
                s_init = gl.where(visible, s_init, float("-inf"))
            q_s = q_smem.index(s)
            do_s = do_smem.index(s)
            mbarrier.wait(q_ready.index(s), ph)
            sT = warpgroup_mma(k_smem, q_s.permute((1, 0)), s_init, is_async=True)  # Sᵀ = K Qᵀ
            neg_delta = delta_smem.index(s).load(QUERY_LAYOUT)
            if tail:
                # Their P is 0, but 0 * (a non-finite Δ of a row of no sequence) would not be.
                offs_t = gl.convert_layout(m0 + gl.arange(0, BLOCK_M, ROW_LAYOUT), QUERY_LAYOUT)
                neg_delta = gl.where(offs_t < hi, neg_delta, 0.0)
            dp_init = zero_st + gl.expand_dims(neg_delta, 0)
            mbarrier.wait(do_ready.index(s), ph)
            dpT = warpgroup_mma(v_smem, do_s.permute((1, 0)), dp_init,
                                is_async=True)                                # dPᵀ = V dOᵀ
            sT = warpgroup_mma_wait(num_outstanding=1, deps=(sT, ))
            pT = gl.exp2(sT * qk_scale)
            dpT = warpgroup_mma_wait(num_outstanding=0, deps=(dpT, ))
            dsT = (pT * dpT).to(dtype)
            pT_a = gl.convert_layout(pT.to(dtype), A_OPERAND, assert_trivial=True)
            dv = warpgroup_mma(pT_a, do_s, dv, is_async=True)               # dV += Pᵀ dO
            ds_smem.store(dsT)
            fence_async_shared()
            dv = warpgroup_mma_wait(num_outstanding=0, deps=(dv, ))
            dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, zero_dq, use_acc=False,
                               is_async=True)                                 # dQ = dS K
            dsT_a = gl.convert_layout(dsT, A_OPERAND, assert_trivial=True)
            dk = warpgroup_mma(dsT_a, q_s, dk, is_async=True)               # dK += dSᵀ Q
            dq = warpgroup_mma_wait(num_outstanding=1, deps=(dq, ))
            # The reduce that last read this staging buffer (DQ_STAGES steps ago) is done.
            tma.store_wait(DQ_STAGES - 1)
            if DQ_STAGES == STAGES:
                dq_buf = dq_stage.index(s)   # one index register for both rings (no spill)
            else:
                dq_buf = dq_stage.index(it % DQ_STAGES)
            dq_buf.store(dq * sm_scale)
            fence_async_shared()
            tma_reduce_add(dqa_desc, [gl.where(g == 0, 0, dqa_row1) + row + m0, head * HEAD_DIM],
                           dq_buf)
            dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ))
            mbarrier.arrive(qdo_empty.index(s))
            it += 1
    tma.store_wait(0)
    # The block's keys (positions [n0, lim) at rows kv_row + position - n0), cast once (dK
    # scaled). Written as positions so that the contiguous kernel's SASS is unchanged.
    kv_row, lim = _key_rows(cu_seqlens_k, seq, n0, n_chunks, rank_rows, KV_ZIGZAG)
    offs_n = n0 + gl.arange(0, BLOCK_N, gl.SliceLayout(1, DKV))
    offs_d = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, DKV))
    mask = gl.expand_dims(offs_n < lim, 1)
    rows = gl.expand_dims(kv_row - n0 + offs_n, 1)
    gl.store(DK + rows * stride_dkn + kv_head * stride_dkh + gl.expand_dims(offs_d, 0),
             (dk * sm_scale).to(DK.dtype.element_ty), mask=mask)
    gl.store(DV + rows * stride_dvn + kv_head * stride_dvh + gl.expand_dims(offs_d, 0),
             dv.to(DV.dtype.element_ty), mask=mask)


@gluon.jit
def _gluon_bwd_kernel(
    q0_desc, q1_desc, do0_desc, do1_desc, k_desc, v_desc, dqa_desc, dqa_row1, init_desc,
    DK, DV, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
    sm_scale, stride_dkn, stride_dkh, stride_dvn, stride_dvh, kv_group, Work, n_blocks, batch,
    n_chunks, rank_rows, chunk_blocks, n_segments,
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, KV_END_SCALAR: gl.constexpr,
    ORDER: gl.constexpr = 0, ROTATE: gl.constexpr = False, QDO_STAGES: gl.constexpr = 2,
    DQ_STAGES: gl.constexpr = 1, KV_ZIGZAG: gl.constexpr = False,
    LOCAL_ORDER: gl.constexpr = False,
):
    """Grid ``(nheads_k, batch, key blocks)``. q/dO descriptors: ``[rows, nheads * D]``, block
    ``[BLOCK_M, D]``; k/v: ``[total_k, nheads_k * D]``, block ``[BLOCK_N, D]``; dqa: fp32
    ``[rows0 + rows1, nheads * D]``, block ``[BLOCK_M, D]``, group 1's rows from ``dqa_row1``
    (one descriptor: no branch at the reduce, and ptxas keeps one descriptor address instead of
    spilling two). init: fp32 ``[2 * nheads, cols]`` (row ``2h``: head ``h``'s -LSE / scale,
    -inf where LSE is; row ``2h + 1``: -Δ; a (group, sequence)'s rows from column
    ``gluon_bwd_sched.init_column``), block ``[1, BLOCK_M]``.
    DK/DV: ``[total_k, nheads_k, D]``, last dim contiguous. kv_end*: ints or int32 ``[batch]``.
    Work, n_blocks, batch, ORDER, ROTATE: the CTA order (``_tile``, ``_segment``); QDO_STAGES and
    DQ_STAGES: the Q/dO ring's and the dQ staging's depth (``gluon_bwd_sched``).
    ``KV_ZIGZAG``: k/v and DK/DV are the zigzag all-gather buffer ``[world * rank_rows, ..]``
    (``n_chunks = 2 * world``), ``cu_seqlens_k`` LOCAL, key block ``blk`` = chunk
    ``blk // chunk_blocks``'s ``blk % chunk_blocks``-th 128 keys (``gluon_bwd_maps``).
    ``LOCAL_ORDER``: both groups' rows in one tensor (q0/q1 descriptors, Lse, Delta over the same
    rows; ``dqa_row1`` 0), cu_seqlens_q0 the ``local_order_rows`` table. ``n_segments``:
    ``2 * kv_group`` (zigzag). Unused runtime arguments are ignored where their flag is off."""
    kv_head, seq, blk = _tile(Work, n_blocks, batch, ORDER)
    n0, empty = _first_key(cu_seqlens_k, seq, blk, chunk_blocks, KV_ZIGZAG)
    if empty:
        return

    dtype: gl.constexpr = q0_desc.dtype
    TILE: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    KV: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    DS: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    DQ: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.float32)
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], KV)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], KV)
    q_smem = gl.allocate_shared_memory(dtype, [QDO_STAGES, BLOCK_M, HEAD_DIM], TILE)
    do_smem = gl.allocate_shared_memory(dtype, [QDO_STAGES, BLOCK_M, HEAD_DIM], TILE)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], DS)
    dq_stage = gl.allocate_shared_memory(gl.float32, [DQ_STAGES, BLOCK_M, HEAD_DIM], DQ)
    lse_smem = gl.allocate_shared_memory(gl.float32, [QDO_STAGES, BLOCK_M], VEC_SMEM)
    delta_smem = gl.allocate_shared_memory(gl.float32, [QDO_STAGES, BLOCK_M], VEC_SMEM)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [QDO_STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [QDO_STAGES, 1], mbarrier.MBarrierLayout())
    init_ready = gl.allocate_shared_memory(gl.int64, [QDO_STAGES, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [QDO_STAGES, 1], mbarrier.MBarrierLayout())
    # kv_ready: the loader's expect (the one arrival) + K/V TMA bytes; consumers wait phase 0.
    # With S = QDO_STAGES:
    # q_ready[s], do_ready[s]: the loader's expect + the TMA bytes of step it's Q (dO),
    #   s = it % S; consumers wait phase (it // S) & 1.
    # init_ready[s]: the loader's expect + the TMA bytes of step it's 64 -LSE / scale and 64 -Δ;
    #   consumers wait phase (it // S) & 1.
    # qdo_empty[s]: the consumer partition arrives (thread 0, after a partition bar.sync and
    #   its wgmma wait) once step it's wgmmas have read the slot; the loader waits phase
    #   ((it // S) & 1) ^ 1 before refilling (a fresh barrier passes the first round).
    # dq_stage[it % DQ_STAGES]: written by the consumers after tma.store_wait(DQ_STAGES - 1)
    #   (the reduce that read it DQ_STAGES steps ago has finished reading).
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(QDO_STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(init_ready.index(i), count=1)
        mbarrier.init(qdo_empty.index(i), count=1)

    gl.warp_specialize([
        (_consume, (dqa_desc, dqa_row1, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_stage,
                    lse_smem, delta_smem, kv_ready, q_ready, do_ready, init_ready, qdo_empty, DK,
                    DV, stride_dkn, stride_dkh, stride_dvn, stride_dvh, cu_seqlens_q0,
                    cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, kv_group, sm_scale, Work,
                    n_blocks, batch, n_chunks, rank_rows, chunk_blocks, n_segments, HEAD_DIM,
                    IS_CAUSAL, KV_END_SCALAR, ORDER, ROTATE, KV_ZIGZAG, LOCAL_ORDER)),
        (_load, (q0_desc, q1_desc, do0_desc, do1_desc, k_desc, v_desc, q_smem, do_smem, k_smem,
                 v_smem, lse_smem, delta_smem, kv_ready, q_ready, do_ready, init_ready, qdo_empty,
                 init_desc, dqa_row1, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0,
                 kv_end1, kv_group, Work, n_blocks, batch, n_chunks, rank_rows, chunk_blocks,
                 n_segments, HEAD_DIM, IS_CAUSAL, KV_END_SCALAR, ORDER, ROTATE, KV_ZIGZAG,
                 LOCAL_ORDER)),
    ], [LOADER_WARPS], [LOADER_REGS])



def _max_offset(t) -> int:
    """Largest element offset into a 3-dim ``t`` (plus one): int32 indexing must stay below."""
    return sum(max(n - 1, 0) * st for n, st in zip(t.shape, t.stride())) + 1


def unsupported_reason(q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, dq0, dq1, dk, dv,
                       *, zigzag_world_size: int = 0, local_order: bool = False,
                       int64_kv_offsets: bool = False) -> str | None:
    """Why ``launch_gluon_bwd`` cannot run these arguments, or None when it can. Any zigzag
    chunk size is covered (a key block never crosses a chunk border: ``gluon_bwd_maps``)."""
    if zigzag_world_size < 0:
        return f"zigzag_world_size must be >= 0, got {zigzag_world_size}"
    if zigzag_world_size > 0 and k.shape[0] % zigzag_world_size:
        return (f"the zigzag buffer's {k.shape[0]} rows are not a multiple of "
                f"zigzag_world_size={zigzag_world_size}")
    if local_order:
        # One tensor per role holds both groups' rows (one Δ pass, one dQ accumulator).
        for name, a, b in (("q", q0, q1), ("out", out0, out1), ("dout", dout0, dout1),
                           ("lse", lse0, lse1), ("dq", dq0, dq1)):
            if not _same(a, b):
                return f"local_order needs {name}0 and {name}1 to be one tensor"
    elif _same(dq0, dq1):
        return "dq0 and dq1 are one tensor: only with local_order"
    if not q0.is_cuda or torch.cuda.get_device_capability(q0.device)[0] != 9:
        return "needs a Hopper (sm90) GPU"
    if q0.dtype not in (torch.float16, torch.bfloat16):
        return f"q/k/v must be float16 or bfloat16, got {q0.dtype}"
    if any(t.dtype != q0.dtype for t in (q1, k, v, dout0, dout1)):
        return "q0, q1, k, v, dout0, dout1 must share one dtype"
    head_dim = q0.shape[2]
    if head_dim not in (64, 128):
        return f"head_dim must be 64 or 128, got {head_dim}"
    for name, t in (("q0", q0), ("q1", q1), ("k", k), ("v", v), ("dout0", dout0),
                    ("dout1", dout1)):
        # TMA views [rows, nheads * D]: heads adjacent, 16-byte aligned rows and base.
        if t.stride(2) != 1 or (t.shape[1] > 1 and t.stride(1) != head_dim):
            return f"{name} must have its heads and head dim contiguous, strides {t.stride()}"
        if (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return f"{name} rows must be 16-byte aligned"
    for name, t in (("lse0", lse0), ("lse1", lse1)):
        if t.stride(-1) != 1:
            return f"{name} must be contiguous along rows"
    for name, t in (("dk", dk), ("dv", dv)):
        if t.stride(2) != 1:
            return f"{name} must have a contiguous last dim"
    if int64_kv_offsets or any(_max_offset(t) >= 2**31 for t in (q0, q1, k, v, dk, dv, dout0,
                                                                  dout1)):
        return "int64 offsets are not supported"
    return None


def _same(a, b) -> bool:
    """``a`` and ``b`` view the same elements (the same tensor, or equal views of it)."""
    return a is b or (a.numel() > 0 and a.data_ptr() == b.data_ptr() and a.shape == b.shape
                      and a.stride() == b.stride() and a.dtype == b.dtype)


def supports(q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, dq0, dq1, dk, dv, **kw) -> bool:
    """Whether ``launch_gluon_bwd`` covers these arguments (``unsupported_reason`` is None)."""
    return unsupported_reason(q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, dq0, dq1,
                              dk, dv, **kw) is None


def _desc(t, rows_block: int, head_dim: int):
    """TMA descriptor over ``t [rows, heads, D]`` viewed as ``[rows, heads * D]``, block
    ``[rows_block, D]`` (a tensor of no rows gets a dummy one: no CTA reads it)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if t.shape[0] == 0:
        t = t.new_zeros((rows_block, t.shape[1], head_dim))
    dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16,
             torch.float32: gl.float32}[t.dtype]
    layout = gl.NVMMASharedLayout.get_default_for([rows_block, head_dim], dtype)
    return TensorDescriptor(t, [t.shape[0], t.shape[1] * head_dim], [t.stride(0), 1],
                            [rows_block, head_dim], layout)


def _init_desc(init):
    """TMA descriptor over the accumulator inits ``init [2 * nheads, cols]`` (fp32), block
    ``[1, BLOCK_M]``: one step's 64 values of one head."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(init, list(init.shape), [init.stride(0), 1], [1, BLOCK_M.value],
                            INIT_TMA.value)


def launch_gluon_bwd(
    q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, delta0, delta1, dq0, dq1, dk, dv,
    cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
    *, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, config=None,
    zigzag_world_size: int = 0, local_order: bool = False,
    schedule: GluonBwdSchedule | None = None,
) -> None:
    """``launch_dual_group_bwd``'s signature and contract (every element of dq*, dk, dv written;
    rows of no sequence zeroed) on the warp-specialized Gluon kernel. ``delta*``: float32 scratch
    shaped like ``lse*``, filled here. ``config`` is accepted for the signature; only its
    ``int64_kv_offsets`` is read. ``schedule``: CTA order, ring depths and preprocess fusion
    (``gluon_bwd_sched.GluonBwdSchedule``; None: the default, as measured 2026-11-25). Raises
    NotImplementedError for what the kernel does not cover (``unsupported_reason``).

    ``zigzag_world_size > 0``: ``k, v`` (and ``dk, dv``) are the zigzag all-gather buffer
    ``[world * rank_rows, nheads_k, D]``, ``cu_seqlens_k`` LOCAL (``2 c`` rows per sequence and
    rank), ``max_seqlen_k`` bounds the GLOBAL key counts ``2 c world``; buffer rows of no
    sequence (each rank's past ``cu_seqlens_k[-1]``) get dK = dV = 0. ``local_order``: q, out,
    dout, lse, delta, dq of both groups are one tensor each in a zigzag rank's local order
    (sequence ``b`` from ``cu_q0[b] + cu_q1[b]``, group 0's chunk first) and, with the zigzag
    buffer, ``kv_end*`` count chunks (``chunk_idx + 1``), as ``launch_dual_group_bwd``."""
    reason = unsupported_reason(
        q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, dq0, dq1, dk, dv,
        zigzag_world_size=zigzag_world_size, local_order=local_order,
        int64_kv_offsets=bool(getattr(config, "int64_kv_offsets", False)))
    if reason is not None:
        raise NotImplementedError(f"launch_gluon_bwd: {reason}")
    if delta0.stride(-1) != 1 or delta1.stride(-1) != 1:
        raise ValueError("delta0/delta1 must be contiguous along rows, shaped like lse0/lse1")
    if local_order and not _same(delta0, delta1):
        raise ValueError("local_order needs delta0 and delta1 to be one tensor")
    batch = cu_seqlens_q0.shape[0] - 1
    nheads, head_dim = q0.shape[1], q0.shape[2]
    nheads_k = k.shape[1]
    scalar_end = isinstance(kv_end0, int)
    if scalar_end != isinstance(kv_end1, int):
        raise TypeError("kv_end0 and kv_end1 must both be ints or both be tensors")
    sched = DEFAULT_SCHEDULE if schedule is None else schedule
    # 1. Δ = rowsum(dO∘O) of every row of each group; with fuse_prep the same kernel zeroes the
    #    fp32 dQ accumulator (group 0's rows, then group 1's; local order: the one tensor's
    #    rows, group 1's at offset 0 of it), which the main kernel reduce-adds scale * dS K into.
    rows0 = dq0.shape[0]
    if local_order:
        dqa_rows, dqa_row1 = rows0, 0
        parts = ((out0, dout0, delta0, 0), )
    else:
        dqa_rows, dqa_row1 = rows0 + dq1.shape[0], rows0
        parts = ((out0, dout0, delta0, 0), (out1, dout1, delta1, rows0))
    fuse = sched.fuse_prep and out0.shape[0] == rows0 and (local_order
                                                          or out1.shape[0] == dq1.shape[0])
    dqa = (torch.empty if fuse else torch.zeros)(
        (dqa_rows, nheads, head_dim), dtype=torch.float32, device=dq0.device)
    for out, dout, delta, row0 in parts:
        if out.shape[0]:
            _delta_kernel[(nheads, triton.cdiv(out.shape[0], 64))](
                out, dout, delta, dqa, out.shape[0], row0, *out.stride()[:2],
                *dout.stride()[:2], delta.stride(0), *dqa.stride()[:2], BLOCK=64,
                HEAD_DIM=head_dim, ZERO_DQA=fuse, num_warps=4)
    # The main kernel's accumulator inits (-LSE / scale, -Δ) per (group, sequence) segment at
    # 16-byte aligned columns (gluon_bwd_sched.init_column): at most 3 padding columns per
    # segment, never written (the kernel masks rows past a group's length).
    init = torch.empty((2 * nheads, triton.cdiv(dqa_rows + 6 * batch + 4, 4) * 4),
                       dtype=torch.float32, device=dq0.device)
    # LOCAL_ORDER kernels read each (group, sequence)'s first row and row count from a table
    # (gluon_bwd_maps.local_order_rows) in place of cu_seqlens_q0/q1.
    cu_q0, cu_q1 = cu_seqlens_q0, cu_seqlens_q1
    if local_order:
        cu_q0 = cu_q1 = local_order_rows(cu_seqlens_q0, cu_seqlens_q1)
    for group, (lse, delta, cu_q, group_row0) in enumerate(((lse0, delta0, cu_q0, 0),
                                                           (lse1, delta1, cu_q1, dqa_row1))):
        if batch > 0 and max_seqlen_q > 0:
            _init_kernel[(nheads, batch, triton.cdiv(max_seqlen_q, 64))](
                lse, delta, init, cu_q, batch, group, group_row0, softmax_scale,
                lse.stride(0), delta.stride(0), init.stride(0), BLOCK=64,
                LOCAL_ORDER=local_order, num_warps=2)
    # 2. The main kernel: one CTA per (KV head, sequence, 128 keys) in the schedule's order;
    #    zigzag: 2 * world chunks of chunk_blocks blocks each (the longest chunk's).
    world = max(zigzag_world_size, 1)
    if zigzag_world_size > 0:
        chunk_blocks = triton.cdiv(triton.cdiv(max_seqlen_k, 2 * world), 128)
        n_blocks = 2 * world * chunk_blocks
    else:
        chunk_blocks, n_blocks = 1, triton.cdiv(max_seqlen_k, 128)
    order = ORDERS[sched.order]
    if order == 0:
        grid, work = (nheads_k, batch, n_blocks), cu_seqlens_k   # work: unused
    else:
        grid = (nheads_k * batch * n_blocks, )
        work = cu_seqlens_k if order == 1 else lpt_work(
            cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, n_blocks=n_blocks,
            causal=causal, zigzag_world_size=zigzag_world_size, chunk_blocks=chunk_blocks,
            kv_end_in_chunks=local_order)
    if batch > 0 and n_blocks > 0:
        _gluon_bwd_kernel[grid](
            _desc(q0, 64, head_dim), _desc(q1, 64, head_dim), _desc(dout0, 64, head_dim),
            _desc(dout1, 64, head_dim), _desc(k, 128, head_dim), _desc(v, 128, head_dim),
            _desc(dqa, 64, head_dim), dqa_row1, _init_desc(init), dk, dv, cu_q0, cu_q1,
            cu_seqlens_k, kv_end0, kv_end1, softmax_scale, *dk.stride()[:2], *dv.stride()[:2],
            nheads // nheads_k, work, n_blocks, batch,
            2 * world, k.shape[0] // world, chunk_blocks, 2 * (nheads // nheads_k),
            HEAD_DIM=head_dim, IS_CAUSAL=causal, KV_END_SCALAR=scalar_end, ORDER=order,
            ROTATE=sched.rotate_heads, QDO_STAGES=sched.qdo_stages, DQ_STAGES=sched.dq_stages,
            KV_ZIGZAG=zigzag_world_size > 0, LOCAL_ORDER=local_order,
            num_warps=CONSUMER_WARPS.value)
    # 3. dQ in q's dtype (rows of no sequence stay 0); dK/dV rows of no sequence (per rank in
    #    the zigzag buffer) zeroed.
    dq0.copy_(dqa[:rows0])
    if not local_order:
        dq1.copy_(dqa[rows0:])
    _zero_key_tail_kernel[(16, nheads_k, world)](
        dk, dv, cu_seqlens_k, batch, k.shape[0] // world, *dk.stride()[:2], *dv.stride()[:2],
        BLOCK=64, HEAD_DIM=head_dim)
