"""Warp-specialized Hopper (sm90) dual-group attention backward in Gluon: FA3's structure.

The same contract as ``dual_group_bwd.launch_dual_group_bwd`` (contiguous K/V only, for now), in
one main kernel between a small pre- and postprocess:

1. Δ = rowsum(dO∘O) for every row of both groups (``_delta_kernel``, plain Triton); the fp32
   dQ accumulator ``[rows0 + rows1, nheads * D]`` is zeroed.
2. ``_gluon_bwd_kernel``: one CTA per (KV head, sequence, 128 keys), in the order of
   ``launch_gluon_bwd``'s ``schedule`` (``gluon_bwd_sched``: by default KV heads fastest, key
   block 0 first). Two partitions:

   - ``_load`` (1 warp, 24 registers): K and V of the CTA's keys once, by TMA; then a 2-deep
     mbarrier ring of Q and dO tiles (64 rows each, 2-D descriptors over ``[rows, nheads * D]``)
     and of the step's -LSE / scale and -Δ rows (plain loads and shared stores), which the
     consumers take as the initial Sᵀ and dPᵀ accumulators.
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

Masks: the causal diagonal and keys past ``kv_end`` only on the warpgroup tiles that need them.
Query rows past a group's length, and rows that see no key (``lse = -inf``), read LSE as
``+inf``: their ``P`` is exactly 0, so they add nothing to dK/dV and exact zeros to the dQ rows
they cover (rows of other sequences, or group 1's first rows in the shared accumulator when a
group-0 tile runs past its tensor; TMA clips rows past the accumulator's end). Masked positions
get -inf in the initial Sᵀ accumulator (-LSE / scale), so P = exp2(Sᵀ · scale · log2e) is 0. This
assumes the rows of q, dout, k, v outside any sequence hold finite values (a NaN there would leak
through ``0 * NaN``); the Triton backward masks its loads instead.

Base-2 softmax inside (log2(e) folded into the scale), natural-log LSE outside. The dQ reduce
order varies run to run: ``deterministic=True`` keeps the Triton two-kernel backward.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from .gluon_bwd_sched import (DEFAULT_SCHEDULE, ORDERS, VARIANTS, GluonBwdSchedule,
                              _delta_kernel, _zero_key_tail_kernel, lpt_work)


LOG2E = gl.constexpr(1.4426950408889634)

# Tiles (the ring depths are the shared buffers' leading dims: gluon_bwd_sched.GluonBwdSchedule).
# BLOCK_N keys per CTA, BLOCK_M query rows per ring slot (FA3's hd128
# causal tile; Gluon tiles are powers of two).
BLOCK_M = gl.constexpr(64)
BLOCK_N = gl.constexpr(128)
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
# The loader warp's view of a step's 64 LSE / Δ values, and their shared-memory ring.
LOADER_ROW_LAYOUT = gl.constexpr(gl.BlockedLayout([2], [32], [1], [0]))
VEC_SMEM = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))


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
def _group(g, seq, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
           KV_END_SCALAR: gl.constexpr):
    """``(row, len_q, end)`` of group ``g`` in sequence ``seq``: its first row, row count and
    visible key count (clamped to ``[0, len_k]`` as the forward does). Reloaded by each
    partition where needed (L1 hits) rather than held in registers across the loop."""
    cu_q = gl.where(g == 0, cu_seqlens_q0, cu_seqlens_q1)
    row = gl.load(cu_q + seq)
    len_q = gl.load(cu_q + seq + 1) - row
    len_k = gl.load(cu_seqlens_k + seq + 1) - gl.load(cu_seqlens_k + seq)
    if KV_END_SCALAR:
        end = gl.where(g == 0, kv_end0, kv_end1)
    else:
        end = gl.load(gl.where(g == 0, kv_end0, kv_end1) + seq)
    return row, len_q, gl.minimum(gl.maximum(end, 0), len_k)


@gluon.jit
def _m_range(len_q, end, n0, IS_CAUSAL: gl.constexpr):
    """Rows ``[lo, hi)`` of a group (``lo`` a multiple of BLOCK_M) that can see a key of
    ``[n0, n0 + BLOCK_N)``, and ``diag``: row ``i`` sees key ``j`` iff ``j <= i + diag`` (causal)
    and ``j < end``."""
    if IS_CAUSAL:
        diag = end - len_q
        lo = (gl.maximum(n0 - diag, 0) // BLOCK_M) * BLOCK_M
    else:
        diag = end
        lo = n0 * 0
    hi = gl.where(n0 < end, len_q, 0)
    return diag, lo, hi


@gluon.jit
def _tile(Work, n_blocks, batch, ORDER: gl.constexpr):
    """``(kv_head, seq, n0)`` of this CTA (``gluon_bwd_sched.ORDERS``): 0, the 3-D grid ``(nheads_k,
    batch, key blocks)``; 1, a 1-D grid, KV head outermost, then sequence, key blocks fastest; 2,
    the same with each KV head's items ``seq * n_blocks + blk`` read from ``Work`` (longest
    first)."""
    if ORDER == 0:
        kv_head = gl.program_id(0)
        seq = gl.program_id(1)
        blk = gl.program_id(2)
    else:
        per_head = batch * n_blocks
        kv_head = gl.program_id(0) // per_head
        item = gl.program_id(0) % per_head
        if ORDER == 2:
            item = gl.load(Work + item)
        seq = item // n_blocks
        blk = item % n_blocks
    return kv_head, seq, blk * BLOCK_N


@gluon.jit
def _segment(tr, n0, kv_group, ROTATE: gl.constexpr):
    """The loop's ``tr``-th (q head, group) segment ``t``: ``tr`` itself, or (``ROTATE``) shifted by
    the key block's index so that the CTAs of one KV head spread their dQ reduce-adds over the
    q heads and groups."""
    if ROTATE:
        t = (tr + n0 // BLOCK_N) % (2 * kv_group)
    else:
        t = tr
    return t


@gluon.jit
def _load(q0_desc, q1_desc, do0_desc, do1_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem,
          lse_smem, delta_smem, kv_ready, q_ready, do_ready, lse_ready, qdo_empty,
          Lse0, Lse1, Delta0, Delta1, stride_lse0_h, stride_lse1_h, stride_delta0_h,
          stride_delta1_h, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
          kv_group, sm_scale, Work, n_blocks, batch, HEAD_DIM: gl.constexpr,
          IS_CAUSAL: gl.constexpr, KV_END_SCALAR: gl.constexpr, ORDER: gl.constexpr,
          ROTATE: gl.constexpr):
    """The loader warp: K/V once, then Q and dO of every step into the ring by TMA, and the
    step's accumulator inits -LSE / scale and -Δ (same step order as ``_consume``)."""
    STAGES: gl.constexpr = q_smem.shape[0]
    kv_head, seq, n0 = _tile(Work, n_blocks, batch, ORDER)
    k_row0 = gl.load(cu_seqlens_k + seq)
    # kv_ready (count 1): this warp's expect + the TMA bytes complete phase 0; consumers wait 0.
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [k_row0 + n0, kv_head * HEAD_DIM], kv_ready, k_smem)
    tma.async_copy_global_to_shared(v_desc, [k_row0 + n0, kv_head * HEAD_DIM], kv_ready, v_smem)
    it = 0
    for tr in range(2 * kv_group):  # both query groups of every q head of the KV head
        t = _segment(tr, n0, kv_group, ROTATE)
        g = t % 2
        head = kv_head * kv_group + t // 2
        row, len_q, end = _group(g, seq, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0,
                                 kv_end1, KV_END_SCALAR)
        lse_ptr = gl.where(g == 0, Lse0 + head * stride_lse0_h, Lse1 + head * stride_lse1_h) + row
        delta_ptr = gl.where(g == 0, Delta0 + head * stride_delta0_h,
                             Delta1 + head * stride_delta1_h) + row
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
            # The Sᵀ and dPᵀ accumulators' initial rows: -LSE / scale (-inf for rows past len_q
            # and rows that saw no key: their P is exactly 0) and -Δ. Loaded here, after the
            # TMAs are issued, so that their latency stalls neither the TMAs nor the consumers.
            offs = m0 + gl.arange(0, BLOCK_M, LOADER_ROW_LAYOUT)
            lse = gl.load(lse_ptr + offs, mask=offs < len_q, other=float("inf"))
            delta = gl.load(delta_ptr + offs, mask=offs < len_q, other=0.0)
            lse_smem.index(s).store(-gl.where(lse == float("-inf"), float("inf"), lse) / sm_scale)
            delta_smem.index(s).store(-delta)
            # lse_ready[s] (count 1): this warp's stores, then (after a warp barrier, so that
            # thread 0's release covers every lane's store) its arrive; consumers wait parity ph.
            gl.thread_barrier()
            mbarrier.arrive(lse_ready.index(s))
            it += 1


@gluon.jit
def _consume(dqa_desc, dqa_row1, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_stage, lse_smem,
             delta_smem, kv_ready, q_ready, do_ready, lse_ready, qdo_empty, DK, DV, stride_dkn,
             stride_dkh, stride_dvn, stride_dvh, cu_seqlens_q0, cu_seqlens_q1,
             cu_seqlens_k, kv_end0, kv_end1, kv_group, sm_scale, Work, n_blocks, batch,
             HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, KV_END_SCALAR: gl.constexpr,
             ORDER: gl.constexpr, ROTATE: gl.constexpr):
    """The two consumer warpgroups: keys ``[n0, n0 + BLOCK_N)`` against every step's rows;
    dK/dV stored at the end."""
    DKV: gl.constexpr = dkv_layout(HEAD_DIM)
    DQ: gl.constexpr = dq_layout(HEAD_DIM)
    A_OPERAND: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=DKV, k_width=2)
    dtype: gl.constexpr = q_smem.dtype
    STAGES: gl.constexpr = q_smem.shape[0]
    DQ_STAGES: gl.constexpr = dq_stage.shape[0]
    kv_head, seq, n0 = _tile(Work, n_blocks, batch, ORDER)
    qk_scale = sm_scale * LOG2E
    zero_st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ST_LAYOUT)
    zero_dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, DQ)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, DKV)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, DKV)
    mbarrier.wait(kv_ready, 0)
    it = 0
    for tr in range(2 * kv_group):  # both query groups of every q head of the KV head
        t = _segment(tr, n0, kv_group, ROTATE)
        g = t % 2
        head = kv_head * kv_group + t // 2
        row, len_q, end = _group(g, seq, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0,
                                 kv_end1, KV_END_SCALAR)
        diag, lo, hi = _m_range(len_q, end, n0, IS_CAUSAL)
        for m0 in range(lo, hi, BLOCK_M):
            s = it % STAGES
            ph = (it // STAGES) & 1
            # The accumulators start at -LSE / scale and -Δ (broadcast over keys; the loader
            # staged them), so that Pᵀ = exp2(Sᵀ · scale · log2e) and dSᵀ = Pᵀ ∘ dPᵀ need no
            # per-query vector in registers while the wgmmas run.
            mbarrier.wait(lse_ready.index(s), ph)
            s_init = zero_st + gl.expand_dims(lse_smem.index(s).load(QUERY_LAYOUT), 0)
            # Keys past `end` (the sequence's end included) and above the causal diagonal start
            # at -inf (P = 0): masking the initial accumulator costs no registers while the
            # wgmmas are in flight.
            if IS_CAUSAL:
                masked = (n0 + BLOCK_N > end) | (m0 + diag < n0 + BLOCK_N - 1)
            else:
                masked = n0 + BLOCK_N > end
            if masked:
                offs_key = n0 + gl.arange(0, BLOCK_N, KEY_LAYOUT)
                visible = gl.expand_dims(offs_key < end, 1)
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
            dp_init = zero_st + gl.expand_dims(delta_smem.index(s).load(QUERY_LAYOUT), 0)
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
    # The block's keys of the sequence, cast once (dK scaled).
    k_row0 = gl.load(cu_seqlens_k + seq)
    len_k = gl.load(cu_seqlens_k + seq + 1) - k_row0
    offs_n = n0 + gl.arange(0, BLOCK_N, gl.SliceLayout(1, DKV))
    offs_d = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, DKV))
    mask = gl.expand_dims(offs_n < len_k, 1)
    rows = gl.expand_dims(k_row0 + offs_n, 1)
    gl.store(DK + rows * stride_dkn + kv_head * stride_dkh + gl.expand_dims(offs_d, 0),
             (dk * sm_scale).to(DK.dtype.element_ty), mask=mask)
    gl.store(DV + rows * stride_dvn + kv_head * stride_dvh + gl.expand_dims(offs_d, 0),
             dv.to(DV.dtype.element_ty), mask=mask)


@gluon.jit
def _gluon_bwd_kernel(
    q0_desc, q1_desc, do0_desc, do1_desc, k_desc, v_desc, dqa_desc, dqa_row1,
    Lse0, Lse1, Delta0, Delta1, DK, DV,
    cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
    sm_scale, stride_lse0_h, stride_lse1_h, stride_delta0_h, stride_delta1_h,
    stride_dkn, stride_dkh, stride_dvn, stride_dvh, kv_group, Work, n_blocks, batch,
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, KV_END_SCALAR: gl.constexpr,
    ORDER: gl.constexpr = 0, ROTATE: gl.constexpr = False, QDO_STAGES: gl.constexpr = 2,
    DQ_STAGES: gl.constexpr = 1,
):
    """Grid ``(nheads_k, batch, key blocks)``. q/dO descriptors: ``[rows, nheads * D]``, block
    ``[BLOCK_M, D]``; k/v: ``[total_k, nheads_k * D]``, block ``[BLOCK_N, D]``; dqa: fp32
    ``[rows0 + rows1, nheads * D]``, block ``[BLOCK_M, D]``, group 1's rows from ``dqa_row1``
    (one descriptor: no branch at the reduce, and ptxas keeps one descriptor address instead of
    spilling two). Lse/Delta: fp32 ``[nheads, rows]``.
    DK/DV: ``[total_k, nheads_k, D]``, last dim contiguous. kv_end*: ints or int32 ``[batch]``.
    Work, n_blocks, batch, ORDER, ROTATE: the CTA order (``_tile``, ``_segment``); QDO_STAGES and
    DQ_STAGES: the Q/dO ring's and the dQ staging's depth (``gluon_bwd_sched``)."""
    kv_head, seq, n0 = _tile(Work, n_blocks, batch, ORDER)
    k_row0 = gl.load(cu_seqlens_k + seq)
    len_k = gl.load(cu_seqlens_k + seq + 1) - k_row0
    if n0 >= len_k:
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
    lse_ready = gl.allocate_shared_memory(gl.int64, [QDO_STAGES, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [QDO_STAGES, 1], mbarrier.MBarrierLayout())
    # kv_ready: the loader's expect (the one arrival) + K/V TMA bytes; consumers wait phase 0.
    # With S = QDO_STAGES:
    # q_ready[s], do_ready[s]: the loader's expect + Q (dO) TMA bytes for step it (s = it % S);
    #   consumers wait phase (it // S) & 1.
    # lse_ready[s]: the loader's plain arrive after storing step it's -LSE/scale and -Δ (and a
    #   warp barrier); consumers wait phase (it // S) & 1.
    # qdo_empty[s]: the consumer partition arrives (thread 0, after a partition bar.sync and
    #   its wgmma wait) once step it's wgmmas have read the slot; the loader waits phase
    #   ((it // S) & 1) ^ 1 before refilling (a fresh barrier passes the first round).
    # dq_stage[it % DQ_STAGES]: written by the consumers after tma.store_wait(DQ_STAGES - 1)
    #   (the reduce that read it DQ_STAGES steps ago has finished reading).
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(QDO_STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(lse_ready.index(i), count=1)
        mbarrier.init(qdo_empty.index(i), count=1)

    gl.warp_specialize([
        (_consume, (dqa_desc, dqa_row1, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_stage,
                    lse_smem, delta_smem, kv_ready, q_ready, do_ready, lse_ready, qdo_empty, DK,
                    DV, stride_dkn, stride_dkh, stride_dvn, stride_dvh, cu_seqlens_q0,
                    cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, kv_group, sm_scale, Work,
                    n_blocks, batch, HEAD_DIM, IS_CAUSAL, KV_END_SCALAR, ORDER, ROTATE)),
        (_load, (q0_desc, q1_desc, do0_desc, do1_desc, k_desc, v_desc, q_smem, do_smem, k_smem,
                 v_smem, lse_smem, delta_smem, kv_ready, q_ready, do_ready, lse_ready, qdo_empty,
                 Lse0, Lse1, Delta0, Delta1, stride_lse0_h, stride_lse1_h, stride_delta0_h,
                 stride_delta1_h, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
                 kv_group, sm_scale, Work, n_blocks, batch, HEAD_DIM, IS_CAUSAL, KV_END_SCALAR,
                 ORDER, ROTATE)),
    ], [LOADER_WARPS], [LOADER_REGS])



def _max_offset(t) -> int:
    """Largest element offset into a 3-dim ``t`` (plus one): int32 indexing must stay below."""
    return sum(max(n - 1, 0) * st for n, st in zip(t.shape, t.stride())) + 1


def unsupported_reason(q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, dq0, dq1, dk, dv,
                       *, zigzag_world_size: int = 0, local_order: bool = False,
                       int64_kv_offsets: bool = False) -> str | None:
    """Why ``launch_gluon_bwd`` cannot run these arguments, or None when it can."""
    if zigzag_world_size > 0:
        return "the zigzag all-gather buffer (zigzag_world_size > 0) is not supported yet"
    if local_order or dq0 is dq1:
        return "local_order (both groups in one tensor) is not supported yet"
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
    NotImplementedError for what the kernel does not cover (``unsupported_reason``)."""
    reason = unsupported_reason(
        q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, dq0, dq1, dk, dv,
        zigzag_world_size=zigzag_world_size, local_order=local_order,
        int64_kv_offsets=bool(getattr(config, "int64_kv_offsets", False)))
    if reason is not None:
        raise NotImplementedError(f"launch_gluon_bwd: {reason}")
    if delta0.stride(-1) != 1 or delta1.stride(-1) != 1:
        raise ValueError("delta0/delta1 must be contiguous along rows, shaped like lse0/lse1")
    batch = cu_seqlens_q0.shape[0] - 1
    nheads, head_dim = q0.shape[1], q0.shape[2]
    nheads_k = k.shape[1]
    scalar_end = isinstance(kv_end0, int)
    if scalar_end != isinstance(kv_end1, int):
        raise TypeError("kv_end0 and kv_end1 must both be ints or both be tensors")
    sched = DEFAULT_SCHEDULE if schedule is None else schedule
    # 1. Δ = rowsum(dO∘O) of every row of each group; with fuse_prep the same kernel zeroes the
    #    fp32 dQ accumulator (group 0's rows, then group 1's), which the main kernel
    #    reduce-adds scale * dS K into.
    rows0 = dq0.shape[0]
    fuse = sched.fuse_prep and out0.shape[0] == rows0 and out1.shape[0] == dq1.shape[0]
    dqa = (torch.empty if fuse else torch.zeros)(
        (rows0 + dq1.shape[0], nheads, head_dim), dtype=torch.float32, device=dq0.device)
    for out, dout, delta, row0 in ((out0, dout0, delta0, 0), (out1, dout1, delta1, rows0)):
        if out.shape[0]:
            _delta_kernel[(nheads, triton.cdiv(out.shape[0], 64))](
                out, dout, delta, dqa, out.shape[0], row0, *out.stride()[:2],
                *dout.stride()[:2], delta.stride(0), *dqa.stride()[:2], BLOCK=64,
                HEAD_DIM=head_dim, ZERO_DQA=fuse, num_warps=4)
    # 2. The main kernel: one CTA per (KV head, sequence, 128 keys) in the schedule's order.
    n_blocks = triton.cdiv(max_seqlen_k, 128)
    order = ORDERS[sched.order]
    if order == 0:
        grid, work = (nheads_k, batch, n_blocks), cu_seqlens_k   # work: unused
    else:
        grid = (nheads_k * batch * n_blocks, )
        work = cu_seqlens_k if order == 1 else lpt_work(
            cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, n_blocks=n_blocks,
            causal=causal)
    if batch > 0 and n_blocks > 0:
        _gluon_bwd_kernel[grid](
            _desc(q0, 64, head_dim), _desc(q1, 64, head_dim), _desc(dout0, 64, head_dim),
            _desc(dout1, 64, head_dim), _desc(k, 128, head_dim), _desc(v, 128, head_dim),
            _desc(dqa, 64, head_dim), rows0,
            lse0, lse1, delta0, delta1, dk, dv,
            cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
            softmax_scale, lse0.stride(0), lse1.stride(0), delta0.stride(0), delta1.stride(0),
            *dk.stride()[:2], *dv.stride()[:2], nheads // nheads_k, work, n_blocks, batch,
            HEAD_DIM=head_dim, IS_CAUSAL=causal, KV_END_SCALAR=scalar_end, ORDER=order,
            ROTATE=sched.rotate_heads, QDO_STAGES=sched.qdo_stages, DQ_STAGES=sched.dq_stages,
            num_warps=CONSUMER_WARPS.value)
    # 3. dQ in q's dtype (rows of no sequence stay 0); dK/dV rows of no sequence zeroed.
    dq0.copy_(dqa[:rows0])
    dq1.copy_(dqa[rows0:])
    _zero_key_tail_kernel[(16, nheads_k)](
        dk, dv, cu_seqlens_k, batch, k.shape[0], *dk.stride()[:2], *dv.stride()[:2],
        BLOCK=64, HEAD_DIM=head_dim)


# ---------------------------------------------------------------------------------------------
# `make kernel-check` (scripts/kernel_check.py): the variants compiled for sm_90a on the CPU.

def _check_signature(dtype: str, head_dim: int, dkv: str, kv_end_scalar: bool) -> dict:
    gl_dtype = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    tile = gl.NVMMASharedLayout.get_default_for([64, head_dim], gl_dtype)
    dq = gl.NVMMASharedLayout.get_default_for([64, head_dim], gl.float32)
    desc = f"tensordesc<{dtype}[64, {head_dim}],{tile!r}>"
    kv = gl.NVMMASharedLayout.get_default_for([128, head_dim], gl_dtype)
    kv_desc = f"tensordesc<{dtype}[128, {head_dim}],{kv!r}>"
    dq_desc = f"tensordesc<fp32[64, {head_dim}],{dq!r}>"
    end = "i32" if kv_end_scalar else "*i32"
    sig = {name: desc for name in ("q0_desc", "q1_desc", "do0_desc", "do1_desc")}
    sig.update(k_desc=kv_desc, v_desc=kv_desc)
    sig.update(dqa_desc=dq_desc, dqa_row1="i32", Lse0="*fp32", Lse1="*fp32",
               Delta0="*fp32", Delta1="*fp32", DK=f"*{dkv}", DV=f"*{dkv}",
               cu_seqlens_q0="*i32", cu_seqlens_q1="*i32", cu_seqlens_k="*i32", kv_end0=end,
               kv_end1=end, sm_scale="fp32")
    sig.update({name: "i32" for name in ("stride_lse0_h", "stride_lse1_h", "stride_delta0_h",
                                         "stride_delta1_h", "stride_dkn", "stride_dkh",
                                         "stride_dvn", "stride_dvh", "kv_group",
                                         "n_blocks", "batch")})
    sig.update(Work="*i32")
    for name in ("HEAD_DIM", "IS_CAUSAL", "KV_END_SCALAR", "ORDER", "ROTATE", "QDO_STAGES",
                 "DQ_STAGES"):
        sig[name] = "constexpr"
    return sig


def _check_spec(variant, dtype, head_dim, causal, dkv="fp32", kv_end_scalar=False,
                sched=DEFAULT_SCHEDULE):
    # Per step and warpgroup: Sᵀ and dPᵀ D/16 m64n64k16 each, dV and dK 4 m64nDk16 each (K = 64
    # rows), dQ 8 m64n(D/2)k16 (K = 128 keys); one reduce-add instruction; setmaxnreg in the
    # 12-warp prologue and each partition (triton 3.6's AllocateWarpGroups).
    hgmma = 2 * (head_dim // 16) + 2 * 4 + 8
    return (variant, _gluon_bwd_kernel, _check_signature(dtype, head_dim, dkv, kv_end_scalar),
            dict(HEAD_DIM=head_dim, IS_CAUSAL=causal, KV_END_SCALAR=kv_end_scalar,
                 ORDER=ORDERS[sched.order], ROTATE=sched.rotate_heads,
                 QDO_STAGES=sched.qdo_stages, DQ_STAGES=sched.dq_stages),
            dict(num_warps=8), dict(HGMMA=hgmma, UTMAREDG=1, USETMAXREG=10))


GLUON_CHECK_SPECS = [
    _check_spec("d128-bf16-causal", "bf16", 128, True),
    _check_spec("d128-fp16-noncausal-scalar-end", "fp16", 128, False, dkv="fp16",
                kv_end_scalar=True),
    _check_spec("d64-bf16-causal", "bf16", 64, True, dkv="bf16"),
] + [  # the schedules scripts/gluon_bwd_sweep.py times, one per compiled kernel (fuse_prep
    #       and the default change no Gluon code)
    _check_spec(f"d128-bf16-causal-{name}", "bf16", 128, True, sched=sched)
    for sched, name in {dataclasses.replace(sched, fuse_prep=False): name.removesuffix("-fuse")
                        for name, sched in reversed(VARIANTS.items())}.items()
    if sched != DEFAULT_SCHEDULE
] + [
    _check_spec("d128-fp16-noncausal-scalar-end-lpt-rot-dq2", "fp16", 128, False, dkv="fp16",
                kv_end_scalar=True,
                sched=GluonBwdSchedule(order="lpt", rotate_heads=True, dq_stages=2)),
    _check_spec("d64-bf16-causal-l2-qdo3", "bf16", 64, True, dkv="bf16",
                sched=GluonBwdSchedule(order="l2", qdo_stages=3)),
]
