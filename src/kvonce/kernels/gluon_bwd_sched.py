"""The CTA schedule and the plain-Triton pre/post kernels of the Gluon backward (``gluon_bwd.py``).

``GluonBwdSchedule`` is ``launch_gluon_bwd``'s ``schedule=`` option: the order in which the
grid's CTAs (one per KV head, sequence and 128 keys) are dispatched, the depth of the Q/dO ring
and of the dQ staging buffer, and whether the dQ accumulator is zeroed by the Δ preprocess. The
default reproduces the kernel as it ran on the H100 on 2026-11-25.

Why the order matters (the estimate in ``scripts/gluon_bwd_model.py``): a step (64 query rows
against the CTA's 128 keys) reads 32 KB of Q/dO and reduce-adds 32 KB of fp32 dQ. The default
grid ``(nheads_k, batch, key blocks)`` dispatches the KV heads fastest, so the 132 resident CTAs
span every KV head (and, on a varlen batch, every sequence), whose Q/dO + dQ accumulator rows
(128 + 64 MB on the Llama shapes) do not fit the 50 MB L2: when the CTAs of one (KV head,
sequence) drift apart, each step goes to DRAM (96 KB a step at 2.5 TB/s is the 5.1 us per
SM-step the mixed batch measured, against 2.7-2.9 at 1x8192). ``order="l2"`` dispatches the key
blocks fastest within one KV head (FA3's ``SingleTileLPTBwdScheduler`` swizzles heads so that
their Q/dO + dQaccum fit 50 MB of L2): one KV head's 4 q heads are 32 MB on these shapes.
``order="lpt"`` adds longest-processing-time first within each KV head: the (sequence, key
block) items sorted by their q-step count on the device (no host sync). ``rotate_heads`` starts
each CTA's q loop at a different (q head, group), so that the CTAs of one KV head do not all
reduce-add into the same dQ rows at the same moment.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

ORDERS = {"grid": 0, "l2": 1, "lpt": 2}


@dataclasses.dataclass(frozen=True)
class GluonBwdSchedule:
    """``order``: "grid" (KV heads fastest, the 3-D grid), "l2" (KV head outermost, then sequence,
    key blocks fastest; 1-D grid) or "lpt" (KV head outermost, items by q-step count, longest
    first). ``rotate_heads``: each CTA's q loop starts at (q head, group) number ``block % (2 *
    kv_group)``. ``qdo_stages``: Q/dO ring depth (2 or 3). ``dq_stages``: dQ staging buffers (1
    or 2; 2 lets a step's reduce-add run while the next step's dQ is staged). ``fuse_prep``: the
    Δ kernel zeroes the dQ accumulator (one pass fewer over it, one launch fewer)."""
    order: str = "grid"
    rotate_heads: bool = False
    qdo_stages: int = 2
    dq_stages: int = 1
    fuse_prep: bool = False

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {sorted(ORDERS)}, got {self.order!r}")
        if self.qdo_stages not in (2, 3) or self.dq_stages not in (1, 2):
            raise ValueError(f"qdo_stages must be 2 or 3 and dq_stages 1 or 2, got "
                             f"{self.qdo_stages}, {self.dq_stages}")


DEFAULT_SCHEDULE = GluonBwdSchedule()
# What the library runs (varlen.py, DualGroupBwdConfig.gluon): the best all-round variant of
# scripts/gluon_bwd_sweep.py on the lent H100, 2026-11-25 (docs/benchmarks.md): 547 / 531 / 522
# TFLOP/s at 1x8192 ranks 0/3/7 and 489 on the mixed batch, where the grid order measured
# 548 / 543 / 539 and 273 (its CTAs of one KV head run apart and their Q/dO and dQ accumulator
# fall out of L2 on the mixed batch; "l2" keeps one KV head's in L2).
TUNED_SCHEDULE = GluonBwdSchedule(order="l2", rotate_heads=True)
# The variants scripts/gluon_bwd_sweep.py times (shared memory, d128: 181660 B by default,
# 215004 with a third Q/dO stage; a third stage and a second dQ buffer together exceed 227 KB).
VARIANTS = {
    "default": DEFAULT_SCHEDULE,
    "l2": GluonBwdSchedule(order="l2"),
    "l2-rot": GluonBwdSchedule(order="l2", rotate_heads=True),
    "lpt": GluonBwdSchedule(order="lpt"),
    "lpt-rot": GluonBwdSchedule(order="lpt", rotate_heads=True),
    "l2-qdo3": GluonBwdSchedule(order="l2", qdo_stages=3),
    "l2-rot-fuse": GluonBwdSchedule(order="l2", rotate_heads=True, fuse_prep=True),
    "lpt-rot-qdo3-fuse": GluonBwdSchedule(order="lpt", rotate_heads=True, qdo_stages=3,
                                          fuse_prep=True),
}
# dq_stages=2 is not among them: at d128 causal ptxas spills 12-32 bytes (a thread index kept
# across the q loop for the dK/dV epilogue; kernel-check 2026-11-25); non-causal it compiles clean.


@triton.jit
def _delta_kernel(O, DO, Delta, DQA, rows, dqa_row0, stride_om, stride_oh, stride_dom,
                  stride_doh, stride_delta_h, stride_dqam, stride_dqah, BLOCK: tl.constexpr,
                  HEAD_DIM: tl.constexpr, ZERO_DQA: tl.constexpr):
    """Grid ``(nheads, cdiv(rows, BLOCK))``: ``Delta[h, r] = sum_d dO[r, h, d] * O[r, h, d]`` in
    fp32 for every row of one group's tensors (rows of no sequence too: the main kernel never
    reads theirs). ``ZERO_DQA``: also zero the fp32 accumulator rows ``dqa_row0 + r`` of head
    ``h`` (DQA ``[rows0 + rows1, nheads, HEAD_DIM]``)."""
    head = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = (offs < rows)[:, None]
    rows64 = offs.to(tl.int64)[:, None]
    o = tl.load(O + rows64 * stride_om + head * stride_oh + offs_d[None, :], mask=ok, other=0.0)
    do = tl.load(DO + rows64 * stride_dom + head * stride_doh + offs_d[None, :], mask=ok,
                 other=0.0)
    tl.store(Delta + head * stride_delta_h + offs, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1),
             mask=offs < rows)
    if ZERO_DQA:
        tl.store(DQA + (dqa_row0 + rows64) * stride_dqam + head * stride_dqah + offs_d[None, :],
                 tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32), mask=ok)


def init_column(row, segment):
    """The first column of a (group, sequence) segment in the accumulator-init buffer: its
    first row (group 1's offset by group 0's rows, as in the dQ accumulator) plus 3 per earlier
    segment, rounded up to 4 floats: TMA loads a box whose inner coordinate is 16-byte aligned
    (a misaligned one hung the kernel on the H100, 2026-11-25), and segment ``k + 1`` starts at
    least ``len_k`` past segment ``k``. ``segment``: the index in tensor order (``g * batch + b``;
    local order ``2 b + g``). Plain integer arithmetic: the Triton kernel below and
    ``gluon_bwd._load`` compute it the same way."""
    return (row + 3 * segment + 3) // 4 * 4


@triton.jit
def _init_kernel(Lse, Delta, Init, RowInfo, batch, group, group_row0, sm_scale, stride_lse_h,
                 stride_delta_h, stride_init_h, BLOCK: tl.constexpr, LOCAL_ORDER: tl.constexpr):
    """Grid ``(nheads, batch, cdiv(max_seqlen_q, BLOCK))``: the Gluon kernel's accumulator inits
    of group ``group``'s rows of every sequence, at columns ``init_column`` of ``Init [2 * nheads,
    cols]``: row ``2h`` -LSE / sm_scale (-inf where LSE is -inf: a row that saw no key gets
    P = 0), row ``2h + 1`` -Δ. ``RowInfo``: the group's ``cu_seqlens_q`` (or, ``LOCAL_ORDER``,
    ``gluon_bwd_maps.local_order_rows``' table); ``group_row0``: the group's first column
    before padding (group 1: group 0's row count; 0 in local order). Lse/Delta ``[nheads, rows]``
    of the group's tensor. Padding columns are not written: the kernel masks them."""
    head = tl.program_id(0)
    seq = tl.program_id(1)
    if LOCAL_ORDER:
        entry = RowInfo + (group * batch + seq) * 2
        row = tl.load(entry)
        n = tl.load(entry + 1)
        segment = 2 * seq + group
    else:
        row = tl.load(RowInfo + seq)
        n = tl.load(RowInfo + seq + 1) - row
        segment = group * batch + seq
    col = (group_row0 + row + 3 * segment + 3) // 4 * 4   # init_column
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    lse = tl.load(Lse + head * stride_lse_h + row + offs, mask=ok, other=0.0)
    delta = tl.load(Delta + head * stride_delta_h + row + offs, mask=ok, other=0.0)
    init = Init + (2 * head) * stride_init_h + col + offs
    tl.store(init, -tl.where(lse == float("-inf"), float("inf"), lse) / sm_scale, mask=ok)
    tl.store(init + stride_init_h, -delta, mask=ok)


@triton.jit
def _zero_key_tail_kernel(DK, DV, cu_seqlens_k, batch, rank_rows, stride_dkn, stride_dkh,
                          stride_dvn, stride_dvh, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Grid ``(programs, nheads_k, ranks)``: zero dK/dV rows ``r * rank_rows + [cu_seqlens_k[batch],
    rank_rows)`` of each rank ``r`` (keys of no sequence: contiguous K/V is one rank of
    ``total_k`` rows; the zigzag buffer ``ranks`` of ``rank_rows``, ``cu_seqlens_k`` LOCAL),
    which no CTA of the main kernel writes; a grid-stride loop over row blocks."""
    head = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    zero = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    base = tl.program_id(2) * rank_rows
    lo = base + tl.load(cu_seqlens_k + batch)
    hi = base + rank_rows
    for start in range(lo + tl.program_id(0) * BLOCK, hi, tl.num_programs(0) * BLOCK):
        rows = start + tl.arange(0, BLOCK)
        ok = (rows < hi)[:, None]
        rows64 = rows.to(tl.int64)[:, None]
        tl.store(DK + rows64 * stride_dkn + head * stride_dkh + offs_d[None, :],
                 zero.to(DK.dtype.element_ty), mask=ok)
        tl.store(DV + rows64 * stride_dvn + head * stride_dvh + offs_d[None, :],
                 zero.to(DV.dtype.element_ty), mask=ok)


@triton.jit
def _group_steps(cu_q, kv_end, seq, n0, len_k, chunk, BLOCK_M: tl.constexpr,
                 IS_CAUSAL: tl.constexpr, KV_END_SCALAR: tl.constexpr,
                 KV_END_IN_CHUNKS: tl.constexpr):
    """The q steps of one group that key block ``n0`` of ``seq`` (vector) walks: the Gluon
    kernel's ``_m_range`` (rows ``[lo, hi)``, ``lo`` a multiple of BLOCK_M)."""
    row = tl.load(cu_q + seq)
    len_q = tl.load(cu_q + seq + 1) - row
    if KV_END_SCALAR:
        end = kv_end + seq * 0
    else:
        end = tl.load(kv_end + seq)
    if KV_END_IN_CHUNKS:
        end = end * chunk
    end = tl.minimum(tl.maximum(end, 0), len_k)
    if IS_CAUSAL:
        lo = (tl.maximum(n0 - (end - len_q), 0) // BLOCK_M) * BLOCK_M
    else:
        lo = n0 * 0
    hi = tl.where(n0 < end, len_q, 0)
    return tl.maximum(hi - lo + BLOCK_M - 1, 0) // BLOCK_M


@triton.jit
def _block_steps_kernel(Steps, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
                        n_items, n_blocks, world_size, chunk_blocks, BLOCK: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                        KV_END_SCALAR: tl.constexpr, KV_ZIGZAG: tl.constexpr,
                        KV_END_IN_CHUNKS: tl.constexpr):
    """``Steps[seq * n_blocks + blk]`` (int32): the q steps (both groups, one q head) of the
    Gluon kernel's CTA for key block ``blk`` of ``seq``; -1 where the block holds no key (past
    the sequence, or zigzag, past its chunk: the CTA exits at once). Key blocks as
    ``gluon_bwd_maps._keys``: ``KV_ZIGZAG`` with ``cu_seqlens_k`` LOCAL, block ``blk`` the
    ``blk % chunk_blocks``-th 128 keys of global chunk ``blk // chunk_blocks``."""
    item = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = item < n_items
    seq = tl.where(ok, item // n_blocks, 0)
    blk = item % n_blocks
    k0 = tl.load(cu_seqlens_k + seq)
    len_k = tl.load(cu_seqlens_k + seq + 1) - k0
    if KV_ZIGZAG:
        chunk = len_k // 2
        len_k = chunk * 2 * world_size
        j = blk // chunk_blocks
        n0 = j * chunk + (blk % chunk_blocks) * BLOCK_N
        lim = j * chunk + chunk
    else:
        chunk = len_k * 0 + 1
        n0 = blk * BLOCK_N
        lim = len_k
    steps = (_group_steps(cu_seqlens_q0, kv_end0, seq, n0, len_k, chunk, BLOCK_M, IS_CAUSAL,
                          KV_END_SCALAR, KV_END_IN_CHUNKS)
             + _group_steps(cu_seqlens_q1, kv_end1, seq, n0, len_k, chunk, BLOCK_M, IS_CAUSAL,
                            KV_END_SCALAR, KV_END_IN_CHUNKS))
    tl.store(Steps + item, tl.where(n0 < lim, steps, -1), mask=ok)


def block_steps(cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, *, n_blocks: int,
                causal: bool, block_m: int = 64, block_n: int = 128, zigzag_world_size: int = 0,
                chunk_blocks: int = 1, kv_end_in_chunks: bool = False) -> torch.Tensor:
    """int32 ``[batch * n_blocks]``: each (sequence, key block) CTA's q steps per q head, -1 for
    blocks that hold no key (``_block_steps_kernel``; device-side, no host sync).
    ``zigzag_world_size > 0``: the zigzag buffer's blocks (``cu_seqlens_k`` LOCAL,
    ``chunk_blocks`` blocks per chunk); ``kv_end_in_chunks``: ``kv_end*`` count chunks."""
    batch = cu_seqlens_k.shape[0] - 1
    n_items = batch * n_blocks
    steps = torch.empty(n_items, dtype=torch.int32, device=cu_seqlens_k.device)
    if n_items:
        _block_steps_kernel[(triton.cdiv(n_items, 256),)](
            steps, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, n_items,
            n_blocks, max(zigzag_world_size, 1), chunk_blocks, BLOCK=256, BLOCK_M=block_m,
            BLOCK_N=block_n, IS_CAUSAL=causal, KV_END_SCALAR=isinstance(kv_end0, int),
            KV_ZIGZAG=zigzag_world_size > 0,
            KV_END_IN_CHUNKS=kv_end_in_chunks and zigzag_world_size > 0)
    return steps


def lpt_work(cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, *, n_blocks: int,
             causal: bool, zigzag_world_size: int = 0, chunk_blocks: int = 1,
             kv_end_in_chunks: bool = False) -> torch.Tensor:
    """int32 ``[batch * n_blocks]``: the items ``seq * n_blocks + blk`` longest first (a stable
    device sort of ``block_steps``: equal counts keep sequence and block order, which keeps
    neighbouring CTAs on the same rows). Blocks that hold no key come last. The zigzag
    keywords as ``block_steps``'s."""
    steps = block_steps(cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
                        n_blocks=n_blocks, causal=causal, zigzag_world_size=zigzag_world_size,
                        chunk_blocks=chunk_blocks, kv_end_in_chunks=kv_end_in_chunks)
    return torch.sort(steps, descending=True, stable=True).indices.to(torch.int32)
