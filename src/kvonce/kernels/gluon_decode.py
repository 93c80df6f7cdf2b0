"""Warp-specialized Hopper (sm_90a) paged decode in Gluon for fp8 e4m3, int8 and int4 KV caches: the
contract of ``_paged_decode_kernel`` (kernels/paged_decode.py) with SPLIT (float32 partials,
merged by ``paged_combine``; one split stores out itself), for fp16 and bf16 queries, head dim
128, pages a multiple of 16 keys.

WIRED on sm_90 (``PagedDecodeConfig.gluon``, the fp8, int8 and int4 rows; ``paged_fits`` says which
launches, ``PagedGluonDecodeLaunch`` is the plan's launch): two CTAs an SM at two ring stages
(``GLUON_PLAN_VARIANT``). On the lent H200 (2026-11-29, CUDA graphs, decode + combine) the fp8 form
ran 1.07-1.12x the Triton kernel at the ``bench quant`` shapes with its own split counts
(``paged.splits.gluon_num_splits``: one CTA an SM for short launches where that fills the SMs, else
whole waves of two; one pass from a full wave of two), where the Triton loop, at 604 instructions a
tile a warp, no longer follows the H200's memory; int8 (``KV_FORMAT`` 2: per-key scales; the same
split rule since 2026-11-30) 1.08-1.21x (scripts/quant_decode_sweep.py, seventeenth session); bf16
queries (rows scaled into fp16 once a CTA, the same loop) alike. On the H100 (2026-11-27, one CTA an
SM, four stages, the Triton row's splits) the fp8 form was 2-11% slower.

int8's per-key scales come by TMA with each K tile where stored head-major (``SCALE_RING``: the
loader copies a box's scales, one row of their head-major storage, into a ring beside K's;
``INT8_SCALES_BY_TMA``: 623 instructions a tile a warp against 780, 2-3% faster at 64 x 8192 on
the H200). An int4 form (``KV_FORMAT`` 3, 64-byte rows, the nibble planes, scales by ring)
runs with swapped operands (``GLUON_SWAP_FORMATS``: keys as the dots' M, the packed q rows as
N = 8; 516 instructions a tile a warp against the Triton int4 loop's 734): 1-10% faster than
the Triton int4 row where a launch has about 0.7 of a wave of two CTAs an SM or more (H200,
2026-11-29, nineteenth session), slower below (split launches); the plan routes it there only
(``paged.splits.gluon_int4_pays``). The row-major int4 form (``_tile_int4``) was 9-13% slower
than Triton: kept for rows over 8 where a caller forces it, not routed.
(docs/notes.md, "A Gluon decode for the quantized caches"; ``make kernel-check``.)

16-bit caches (fp16 / bf16 pages and q, no scales: a 16-bit descriptor, 64-key tiles so that a
slot is 16 KB as fp8's; ``scripts/gluon_decode16_check.py``): compiled for sm_90a, 209
instructions and one CTA barrier a tile a warp against the Triton plain loop's 411 and 9; on the
H100 correct at every case, and NOT faster than the Triton plan at the decode rows where the
plan trails dense SDPA (0.84-1.02x: GQA 12/2 128 x 512 to 1 x 65536, MHA 12/12 and GQA 32/8
64 x 1024; docs/notes.md, "Issue 26, 2026-11-27, eleventh session"). Not wired.

Why. Triton's 2-stage software pipeline keeps about one K/V tile in flight per program and each
tile's softmax does cross-warp reductions (CTA barriers): the 1 x 131072 fp8 rows read DRAM at
71-73% of peak. Here a loader warp keeps ``STAGES`` tiles (32 KB each) in flight by TMA, and the
consumer warps' steady loop has no cross-warp reduction.

Grid ``(num_splits, nheads_k, batch)``: a CTA takes one (split, KV head, sequence); the split
rule is the Triton kernel's (``split_len = cdiv(cdiv(seqlen, S), 128) * 128``, keys ``[s *
split_len, min((s + 1) * split_len, seqlen))``). Rows are GQA-packed as there: row ``r`` of the
16-row tile is token ``r // GROUP``, q head ``kv_head * GROUP + r % GROUP`` (``GROUP * q_len <=
16``, the rest zero padding, never stored). Two partitions:

- ``_load`` (1 warp, 24 registers; ``LOADERS`` 4: four, each its share of the boxes):
  ``gluon_prefill._load``'s scheme. Key tile ``j`` (128 keys)
  into ring slot ``j % STAGES`` (K 16 KB + V 16 KB) as ``128 / BOX`` TMA boxes of ``[BOX, 128]``
  bytes (``BOX`` = the largest of 128/64/32/16 dividing the page: 8 boxes at page 16) from the
  caches viewed as ``[num_pages * page_size, nheads_k * 128]`` uint8: TMA cannot gather rows,
  but a box never crosses a page, so one block-table lookup per box places it (a tile's page ids
  are looked up a tile ahead). K on ``k_ready[s]``, V on ``v_ready[s]``; a slot is refilled
  once ``k_empty[s]`` (``v_empty[s]``) says the consumers are done reading it.
- ``_consume`` (the default partition, 4 warps): warp ``w`` owns keys ``32 w .. 32 w + 31`` of
  every tile and its own softmax state ``(m, l [16], acc [16, 128])`` (FlashDecoding's split
  inside the CTA). Every register tensor is rank 3 with the warp as the leading (batch) dim of a
  batched ``mma_v2`` (``NVMMADistributedLayout`` version 2, ``warps_per_cta [4, 1, 1]``), so
  the row max and sum over a warp's 32 keys are shuffles within the warp. Per tile and warp:
  S [16, 32] = q [16, 128] K_w^T (32 m16n8k16; the slot reshaped ``[4, 32, 128]`` and permuted
  to ``[4, 128, 32]``, read by ``ldmatrix`` with ``k_width`` 4, each byte pair converted by
  ``cvt.rn.f16x2.e4m3x2``); the online softmax in base 2 (fp8's K scale folded into the score
  scale); P stays in registers as the A operand; V read as 16-bit units (the slot reinterpreted
  ``[128, 64]`` uint16, ``[4, 32, 64]``, ``ldmatrix.trans``) and converted by the channel-pair
  trick (``quant_convert._pair_units_to_f16``: a ``prmt`` and one cvt give the fp16 pair of the
  even or odd channel of two keys), two dots (even and odd output channels, 32 m16n8k16). Once
  per CTA the four warps' states are merged (max, rescale, sum: Triton's cross-warp reductions
  through shared memory), V's scale applied, and the partial stored, even and odd channels
  interleaved by the store addresses.

Ring slots are freed by every consumer thread's own arrive (``THREAD_ARRIVE``, count 128,
``cp.async.mbarrier.arrive.noinc``: no cp.async is pending, so it arrives at once), not by
Gluon's ``mbarrier.arrive``, whose single elected arrive Triton's membar pass fences with a
``bar.sync`` of the 4 consumer warps (two per tile). One ``bar.sync`` of the consumer warps per
tile remains, which membar puts before the K wait (it cannot tell the ring slots and the
barriers of a partition's captured allocations apart); the loader warp never joins it.

Keys past the sequence's end in its last tile (boxes past the end re-read the sequence's last
box: the block table past a sequence's pages is never read) hold whatever the page holds there,
NaN bytes included: their scores are masked to -inf and, on the masked tile only, their V units
zeroed in registers before the convert (0 * NaN would be NaN). Causal is bottom-right (row ``t``
sees key ``j <= t + seqlen - q_len``); tiles wholly visible to every row take the unmasked loop.
Natural-log LSE out; an empty split, or a row that sees no key of its split (causal, the first
rows when q_len > seqlen), stores out 0, lse -inf: a warp whose keys a row never saw keeps
``m = -inf, l = 0, acc = 0``, and every ``exp2`` of an ``m`` subtracts ``m_sub`` (``m`` with -inf
read as 0), so no ``-inf - -inf`` (NaN) is ever formed: ``alpha`` and the merge weight are
``exp2(-inf) = 0`` there, and the output's ``1 / l`` is taken only where ``l > 0``.

Two CTAs an SM (``ctas_per_sm=2``; the plan's, measured on the H200). The launch is 8 warps, 256
threads, not 5: Triton's allocate-warp-groups pass pads the loader warp to a warpgroup
(``setmaxnreg`` works per warpgroup; ``metadata.num_warps`` 8, PTX ``.reqntid 256``). Unset, the
kernel's ``.maxnreg`` is 65536 / 256 = 256 (ptxas: 255 registers at launch, one CTA an SM) and the
consumers' ``setmaxnreg.inc`` 256; they use R0-R216. The ``maxnreg`` compile option (module
attribute ``ttg.maxnreg``) replaces that base: at ``TWO_CTA_MAXNREG`` = 128 the PTX has ``.maxnreg
128`` (128 x 256 x 2 = 65536: two CTAs), the loader warpgroup ``setmaxnreg.dec`` 24 and the
consumers ``setmaxnreg.inc`` (128 x 256 - 24 x 128) / 128 = 232; no spill, the same steady loop.
Shared memory: the ring is 32 KB a stage; the four warps' merge goes through Triton's reduce
scratch (16 KB more: 4 stages 147588 B, 3 stages 114812 B) or, ``ring_merge=True`` (constexpr
``RING_MERGE``), through the idle K ring (3 stages 98684 B, 2 stages 65860 B), which fits two CTAs
(228 KB an SM, 1 KB reserved a CTA) with room to spare.

Head-major pages (``HEAD_MAJOR``; memory ``[num_pages, nheads_k, page_size, row]``, the
Triton kernels' "hnd" storage): the descriptors' rows are every (page, KV head)'s keys in turn,
so a box is a page's keys of one head, contiguous (token-major: ``page_size`` rows of ``row``
bytes, ``nheads_k * row`` apart). H200, 2026-11-29 (twentieth session, graphs): int4 7-16%
faster than on token-major pages (GQA 32/8 64 x 8192 180.1 us against 192.6, 1 x 131072 62.0
against 72.0), fp8 / int8 0.5-3%.

Where the time goes (``PROBE``, ``scripts/quant_decode_probe.py``; H200, 2026-11-29): with the
consumers reading nothing (memory only) every shipped route runs within 2-10% of its kernel
time (GQA 32/8 64 x 8192: fp8 256.9 us against 262.4, int8 266.7 against 274.7, int4 172.9
against 194.9), with the loader copying nothing (math only) 35-45% faster (142.7, 174.8, 142.6):
the loader and the memory set the pace. A second loader warp (``LOADERS`` 2, each half a tile's
boxes) took int4's memory-only time 5% down and its kernel time 0-3%; five or six int4 stages
nothing. With int4's consumers cheaper (fp16 pairs, V biased: twenty-second session) two loaders
took its kernel time 4-6% down, four another 1-2% (twenty-third session): int4 and int8 run four
(``GLUON_LOADERS``), fp8 one; the two-loader form went then (four supersede it).

Measured and off (twenty-fifth session, H200; docs/notes.md): a CTA taking a group of KV heads
(``HEADS``, ``GLUON_KV_HEAD_GROUPS``: a TMA box a whole page of the group, the swapped
consumers masking each score to its own head) and cp.async loader warps for fp8 (``CP_ASYNC``,
``GLUON_CP_ASYNC_FORMATS``): fp8's and int8's memory rate stayed where TMA's 2 KB boxes put it
(int4's rose 1-2% at one shape, and its launches with fewer CTAs lost more).

Modules: gluon_decode_common (layouts, converters, the loader warp, the consumers' shared
steps), gluon_decode_rows (the row-major consumers described above), gluon_decode_swapped (keys
as the dots' M: ``SWAP_AB``, compiled, not yet on), this one (the kernel and the host side).

Host side: ``GluonDecodeLaunch`` validates and builds the TMA descriptors once (a call is then
the decode launch, plus the combine's: CUDA-graph capturable); ``launch_gluon_decode_fp8`` does
both per call. ``PagedGluonDecodeLaunch`` is the plan's (``PagedDecodeLaunch``'s call): shapes
fixed once, the descriptors of each call's caches built on their first call and kept
(``tma_descriptors.DescriptorCache``; a plan serves every layer).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .configs import device_info
from .gluon_decode_common import (BLOCK_N, FP8, HEAD_DIM, INT4, INT8, LOADER_REGS, LOADER_WARPS,
                                  ROWS, TWO_CTA_MAXNREG, WARPS, _load, _release_count, _scale_rows)
from .gluon_decode_rows import _consume
from .gluon_decode_swapped import NR, _consume_swapped
from .tma_descriptors import DescriptorCache


@gluon.jit
def _launch_dependents():
    """``griddepcontrol.launch_dependents``: a programmatic dependent launch after this one may
    start (its CTAs then wait, ``gdc_wait``, for this grid's memory)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _wait_prior_grid():
    """``griddepcontrol.wait``: until the grid this one was launched after (as a programmatic
    dependent) has ended and its memory is visible; at once without such a launch."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gluon_decode_kernel(
    Q, k_desc, v_desc, KS, VS, k_raw, v_raw, Out, Lse, cache_seqlens, block_table, sm_scale,
    q_len,
    num_splits, stride_qb, stride_qt, stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot,
    stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls, stride_btb,
    stride_ksp, stride_kst, stride_vsp, stride_vst,
    GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr, PAGE_SIZE: gl.constexpr,
    STAGES: gl.constexpr, THREAD_ARRIVE: gl.constexpr = True, RING_MERGE: gl.constexpr = False,
    TILE_KEYS: gl.constexpr = 0, KV_FORMAT: gl.constexpr = 1, STORE_LSE: gl.constexpr = True,
    SCALE_RING: gl.constexpr = False, V_BIASED: gl.constexpr = False,
    SWAP_AB: gl.constexpr = False, PROBE: gl.constexpr = 0, LOADERS: gl.constexpr = 1,
    HEAD_MAJOR: gl.constexpr = False, HEADS: gl.constexpr = 1, CP_ASYNC: gl.constexpr = False,
    DEFER_SUMS: gl.constexpr = False, PDL_TRIGGER: gl.constexpr = False,
    PDL_EXIT_WAIT: gl.constexpr = False,
):
    # PDL_TRIGGER: each CTA lets the split combine after this launch start at once (a
    # programmatic dependent launch, paged_combine.COMBINE_PDL: it waits for these partials).
    # PDL_EXIT_WAIT: launched as a programmatic dependent of a launch it does not read (a batch
    # cut's tail after its head, kvonce.paged.batch_cut), so its CTAs fill the SMs the head's
    # last wave leaves idle; each CTA waits for that launch to end before it exits, so that this
    # launch's end (which its combine, or the next launch, waits for) implies the head's.
    # HEAD_MAJOR: pages stored [num_pages, nheads_k, page_size, row] (the descriptors' rows a
    # (page, KV head)'s keys), else token-major [num_pages, page_size, nheads_k, row].
    # HEADS: KV heads a CTA (program_id(1) their group, GROUP the group's q heads: HEADS x the
    # GQA group), head-major pages and swapped operands only: a TMA box a whole page of the
    # group's heads, so a tile is TILE / HEADS keys of each, its rows (page, head, slot).
    # LOADERS: loader warps (1 or 4), each copying its share of every tile's TMA boxes.
    # CP_ASYNC: the loaders copy by cp.async (16 bytes a thread) from k_raw / v_raw (the caches'
    # bytes) instead of TMA (fp8, one head a CTA; the ready barriers count every loader
    # thread's arrival).
    # DEFER_SUMS: int4's swapped consumers keep each thread's part of the rows' sums (l, the
    # offsets' b) and add the lanes' parts once, after the tiles (no shuffle a tile for them).
    # PROBE: the roofline probe (gluon_decode_common's PROBE_MEMORY / PROBE_MATH; 0 the kernel).
    # SWAP_AB: the consumers with swapped operands (gluon_decode_swapped: fp8, int8 / int4 with
    # their scales by ring, GROUP * q_len <= 8), else the row-major ones (gluon_decode_rows).
    # Out / Lse: the float32 split partials (merged by paged_combine), or, with one split, the
    # final out (q's dtype, any strides: stride_os unused) and LSE, which STORE_LSE False skips.
    # fp8 caches come as uint8 descriptors (128-key tiles, 16 KB a slot); fp16 / bf16 caches as
    # their own dtype (``TILE_KEYS`` 0: 64-key tiles, 16 KB a slot as well).
    KV16: gl.constexpr = k_desc.dtype.primitive_bitwidth == 16
    TILE: gl.constexpr = TILE_KEYS if TILE_KEYS else (64 if KV16 else BLOCK_N)
    ROW: gl.constexpr = k_desc.block_type.shape[1]     # a key's row: 128 (int4: 64 bytes)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, TILE, ROW], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, TILE, ROW], v_desc.layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    gl.static_assert(SCALE_RING or KV_FORMAT != INT4, "int4's scales come by ring")
    if SCALE_RING:
        # KS / VS: TMA descriptors of the per-key scales' head-major storage (int4: (scale,
        # offset]) a box's a row ([1, BOX * PAIR] float32): a ring of them beside K's, each box's
        # row at a multiple of 128 bytes (TMA's shared-memory alignment: int8's 16-key boxes,
        # 64 bytes, take two rows, ``SCALE_ROWS``)
        BOXES: gl.constexpr = TILE // k_desc.block_type.shape[0]
        SBOX: gl.constexpr = KS.block_type.shape[1]
        RS: gl.constexpr = _scale_rows(SBOX)
        ks_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BOXES * RS, SBOX], KS.layout)
        vs_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BOXES * RS, SBOX], VS.layout)
    else:   # unused
        ks_smem = k_smem
        vs_smem = v_smem
    for i in gl.static_range(STAGES):
        # each loader warp's expect (TMA), or each loader thread's arrival (cp.async)
        mbarrier.init(k_ready.index(i), count=LOADERS * (32 if CP_ASYNC else 1))
        mbarrier.init(v_ready.index(i), count=LOADERS * (32 if CP_ASYNC else 1))
        mbarrier.init(k_empty.index(i), count=_release_count(THREAD_ARRIVE))
        mbarrier.init(v_empty.index(i), count=_release_count(THREAD_ARRIVE))
    # (the partitions' argument lists written out: a tuple variable would drop constexprs, and
    # one holding the function does not compile; tried again 2026-11-29. Which format runs
    # how many loaders: GLUON_LOADERS; the two-loader form went when four shipped)
    if PDL_TRIGGER:
        _launch_dependents()
    if LOADERS == 4:   # the loader warpgroup's four warps (the launch is 8 warps either way)
        gl.warp_specialize([
            (_consume_any,
             (Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, sm_scale, q_len, num_splits, stride_qb, stride_qt,
                 stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot, stride_oh, stride_os,
                 stride_lb, stride_lt, stride_lh, stride_ls, stride_btb, stride_ksp, stride_kst,
                 stride_vsp, stride_vst, ks_smem, vs_smem, GROUP, IS_CAUSAL, THREAD_ARRIVE,
                 RING_MERGE, KV_FORMAT, PAGE_SIZE, STORE_LSE, SCALE_RING,
                 V_BIASED and KV_FORMAT != FP8, PROBE, SWAP_AB, HEADS, DEFER_SUMS)),
            (_load, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, num_splits, stride_btb, KS, VS, ks_smem, vs_smem,
                 PAGE_SIZE, SCALE_RING, PROBE, 0, 4, HEAD_MAJOR, HEADS, CP_ASYNC, k_raw, v_raw)),
            (_load, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, num_splits, stride_btb, KS, VS, ks_smem, vs_smem,
                 PAGE_SIZE, SCALE_RING, PROBE, 1, 4, HEAD_MAJOR, HEADS, CP_ASYNC, k_raw, v_raw)),
            (_load, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, num_splits, stride_btb, KS, VS, ks_smem, vs_smem,
                 PAGE_SIZE, SCALE_RING, PROBE, 2, 4, HEAD_MAJOR, HEADS, CP_ASYNC, k_raw, v_raw)),
            (_load, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, num_splits, stride_btb, KS, VS, ks_smem, vs_smem,
                 PAGE_SIZE, SCALE_RING, PROBE, 3, 4, HEAD_MAJOR, HEADS, CP_ASYNC, k_raw, v_raw)),
        ], [LOADER_WARPS] * 4, [LOADER_REGS] * 4)
    else:
        gl.static_assert(LOADERS == 1, "one or four loader warps")
        gl.warp_specialize([
            (_consume_any,
             (Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, sm_scale, q_len, num_splits, stride_qb, stride_qt,
                 stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot, stride_oh, stride_os,
                 stride_lb, stride_lt, stride_lh, stride_ls, stride_btb, stride_ksp, stride_kst,
                 stride_vsp, stride_vst, ks_smem, vs_smem, GROUP, IS_CAUSAL, THREAD_ARRIVE,
                 RING_MERGE, KV_FORMAT, PAGE_SIZE, STORE_LSE, SCALE_RING,
                 V_BIASED and KV_FORMAT != FP8, PROBE, SWAP_AB, HEADS, DEFER_SUMS)),
            (_load, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, num_splits, stride_btb, KS, VS, ks_smem, vs_smem,
                 PAGE_SIZE, SCALE_RING, PROBE, 0, 1, HEAD_MAJOR, HEADS, CP_ASYNC, k_raw, v_raw)),
        ], [LOADER_WARPS], [LOADER_REGS])
    if PDL_EXIT_WAIT:   # the consumer warps, after their stores
        _wait_prior_grid()


@gluon.jit
def _consume_any(Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, sm_scale, q_len, num_splits, stride_qb, stride_qt,
                 stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot, stride_oh, stride_os,
                 stride_lb, stride_lt, stride_lh, stride_ls, stride_btb, stride_ksp, stride_kst,
                 stride_vsp, stride_vst, ks_smem, vs_smem, GROUP: gl.constexpr,
                 IS_CAUSAL: gl.constexpr, THREAD_ARRIVE: gl.constexpr,
                 RING_MERGE: gl.constexpr, KV_FORMAT: gl.constexpr, PAGE_SIZE: gl.constexpr,
                 STORE_LSE: gl.constexpr, SCALE_RING: gl.constexpr, V_BIASED: gl.constexpr,
                 PROBE: gl.constexpr, SWAP_AB: gl.constexpr, HEADS: gl.constexpr = 1,
                 DEFER_SUMS: gl.constexpr = False):
    """The consumer partition: the swapped-operand consumers (SWAP_AB) or the row-major ones,
    both on the same arguments (KV head groups, HEADS > 1: the swapped ones)."""
    if HEADS > 1:
        gl.static_assert(SWAP_AB, "KV head groups: swapped operands")
    if SWAP_AB:
        _consume_swapped(Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty,
                         v_empty, cache_seqlens, block_table, sm_scale, q_len, num_splits,
                         stride_qb, stride_qt, stride_qh, stride_ksh, stride_vsh, stride_ob,
                         stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh,
                         stride_ls, stride_btb, stride_ksp, stride_kst, stride_vsp, stride_vst,
                         ks_smem, vs_smem, GROUP, IS_CAUSAL, THREAD_ARRIVE, RING_MERGE,
                         KV_FORMAT, PAGE_SIZE, STORE_LSE, SCALE_RING, V_BIASED, PROBE, HEADS,
                         DEFER_SUMS)
    else:
        _consume(Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, sm_scale, q_len, num_splits, stride_qb, stride_qt,
                 stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot, stride_oh, stride_os,
                 stride_lb, stride_lt, stride_lh, stride_ls, stride_btb, stride_ksp, stride_kst,
                 stride_vsp, stride_vst, ks_smem, vs_smem, GROUP, IS_CAUSAL, THREAD_ARRIVE,
                 RING_MERGE, KV_FORMAT, PAGE_SIZE, STORE_LSE, SCALE_RING, V_BIASED, PROBE)


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------

def scale_pair_layout():
    """The shared layout of int4's (scale, offset) ring (a box of ``[1, BOX * 2]`` float32 a
    row, unswizzled: the consumers read a key pair's 16 bytes at once)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def box_rows(page_size: int) -> int:
    """Rows of a TMA box: the largest of 128, 64, 32, 16 that divides the page (a box never
    crosses a page, and a 128-key tile is a whole number of boxes)."""
    for rows in (128, 64, 32, 16):
        if page_size % rows == 0:
            return rows
    raise ValueError(f"page_size must be a multiple of 16, got {page_size}")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_scale(name: str, scale, nheads_k: int, device) -> int:
    """fp8 per-KV-head scale: float32 ``[nheads_k]`` or 0-dim; returns its head stride."""
    _check(isinstance(scale, torch.Tensor) and scale.dtype == torch.float32,
           f"{name} must be a float32 tensor")
    _check(scale.shape in ((), (nheads_k,)),
           f"{name} must be [nheads_k] = [{nheads_k}] or 0-dim, got {tuple(scale.shape)}")
    _check(scale.device == device, f"{name} must be on {device}, got {scale.device}")
    return scale.stride(0) if scale.dim() == 1 else 0


def _validate(q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, block_table, out_partial,
              lse_partial, num_splits):
    _check(isinstance(q, torch.Tensor) and q.dim() == 4, "q must be [batch, q_len, nheads, 128]")
    batch, q_len, nheads, head_dim = q.shape
    kv16 = isinstance(k_cache, torch.Tensor) and k_cache.dtype in (torch.float16, torch.bfloat16)
    if kv16:
        _check(q.dtype == k_cache.dtype, f"q must be {k_cache.dtype} (the caches'), got {q.dtype}")
    else:
        _check(q.dtype == torch.float16, f"q must be float16, got {q.dtype}")
    _check(head_dim == HEAD_DIM.value, f"head dim must be {HEAD_DIM.value}, got {head_dim}")
    _check(q.stride(3) == 1, "q's last dim must be contiguous")
    _check(q.is_cuda, "q must be a CUDA tensor")
    _check(torch.cuda.get_device_capability(q.device)[0] == 9, "needs a Hopper (sm90) GPU")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check(isinstance(t, torch.Tensor) and t.dim() == 4,
               f"{name} must be [num_pages, page_size, nheads_k, 128]")
        _check(t.dtype == (k_cache.dtype if kv16 else torch.float8_e4m3fn),
               f"{name} must be float8_e4m3fn, or float16 / bfloat16 like k_cache, got {t.dtype}")
        _check(t.shape == k_cache.shape, f"k_cache and v_cache shapes differ: "
               f"{tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
        _check(t.device == q.device, f"{name} must be on {q.device}")
    num_pages, page_size, nheads_k, d = k_cache.shape
    _check(d == head_dim, f"caches' head dim must be {head_dim}, got {d}")
    _check(page_size % 16 == 0, f"page_size must be a multiple of 16, got {page_size}")
    _check(nheads % nheads_k == 0, f"nheads ({nheads}) must be a multiple of nheads_k "
           f"({nheads_k})")
    group = nheads // nheads_k
    _check(group * q_len <= ROWS.value,
           f"GQA group x q_len must be <= {ROWS.value}, got {group} x {q_len}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check(t.stride(3) == 1 and t.stride(2) == d and t.stride(1) == nheads_k * d
               and t.stride(0) == page_size * t.stride(1),
               f"{name}: each page's rows and heads must be back to back (contiguous pages)")
        _check(t.data_ptr() % 16 == 0, f"{name} must be 16-byte aligned")
    _check(num_pages * page_size < 2**31, "the caches' rows pass 2^31 (TMA coordinates)")
    _check(isinstance(num_splits, int) and num_splits >= 1,
           f"num_splits must be a positive int, got {num_splits!r}")
    _check(cache_seqlens.dtype == torch.int32 and cache_seqlens.shape == (batch,),
           f"cache_seqlens must be int32 [{batch}]")
    _check(block_table.dtype == torch.int32 and block_table.dim() == 2
           and block_table.shape[0] == batch and block_table.stride(1) == 1,
           f"block_table must be int32 [{batch}, max_pages], last dim contiguous")
    _check(cache_seqlens.is_contiguous(), "cache_seqlens must be contiguous")
    _check(out_partial.dtype == torch.float32
           and tuple(out_partial.shape) == (batch, q_len, nheads, num_splits, head_dim)
           and out_partial.stride(4) == 1,
           f"out_partial must be float32 [{batch}, {q_len}, {nheads}, {num_splits}, {head_dim}]"
           " with the last dim contiguous")
    _check(lse_partial.dtype == torch.float32
           and tuple(lse_partial.shape) == (batch, q_len, nheads, num_splits),
           f"lse_partial must be float32 [{batch}, {q_len}, {nheads}, {num_splits}]")
    for name, t in (("cache_seqlens", cache_seqlens), ("block_table", block_table),
                    ("out_partial", out_partial), ("lse_partial", lse_partial)):
        _check(t.device == q.device, f"{name} must be on {q.device}")
    if kv16:
        _check(k_scale is None and v_scale is None, "16-bit caches take no k_scale / v_scale")
        return 0, 0
    return (_check_scale("k_scale", k_scale, nheads_k, q.device),
            _check_scale("v_scale", v_scale, nheads_k, q.device))


def _desc(cache, box: int):
    """TMA descriptor over the cache as ``[num_pages * page_size, nheads_k * 128]``, box ``[box,
    128]`` (128-byte swizzle): an fp8 cache's bytes as uint8, a 16-bit cache as it is."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if cache.dtype in (torch.float16, torch.bfloat16):
        gl_dtype = gl.float16 if cache.dtype == torch.float16 else gl.bfloat16
        layout = gl.NVMMASharedLayout.get_default_for([box, HEAD_DIM.value], gl_dtype)
        return TensorDescriptor(cache, [cache.shape[0] * cache.shape[1],
                                        cache.shape[2] * cache.shape[3]],
                                [cache.stride(1), 1], [box, HEAD_DIM.value], layout)
    raw = cache.view(torch.uint8)
    layout = gl.NVMMASharedLayout.get_default_for([box, HEAD_DIM.value], gl.uint8)
    return TensorDescriptor(raw, [raw.shape[0] * raw.shape[1], raw.shape[2] * raw.shape[3]],
                            [raw.stride(1), 1], [box, HEAD_DIM.value], layout)


class GluonDecodeLaunch:
    """``_gluon_decode_kernel`` (and, given ``out``, the combine) bound to fixed tensors:
    validated and the two TMA descriptors built once, so ``decode()`` is one kernel launch and
    ``__call__()`` two (decode + ``combine_partials`` into ``out`` / ``lse``): no allocation, no
    host sync, CUDA-graph capturable (the descriptors travel by value in the kernel parameters,
    so they must describe the caches a captured graph replays on). Arguments as in
    ``launch_gluon_decode_fp8``; ``out`` fp16 ``[batch, q_len, nheads, 128]`` and ``lse`` float32
    ``[batch, nheads, q_len]``, contiguous, optional."""

    def __init__(self, q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, block_table,
                 out_partial, lse_partial, out=None, lse=None, *, softmax_scale: float,
                 num_splits: int, causal: bool, stages: int = 4, thread_arrive: bool = True,
                 ctas_per_sm: int = 1, ring_merge: bool = False, tile_keys: int = 0):
        ksh, vsh = _validate(q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, block_table,
                             out_partial, lse_partial, num_splits)
        kv16 = k_cache.dtype in (torch.float16, torch.bfloat16)
        _check(not (kv16 and ring_merge), "16-bit caches merge through the reduce scratch")
        _check(tile_keys in (0, 64, 128), f"tile_keys must be 0, 64 or 128, got {tile_keys}")
        if kv16:   # the kernel never reads them: any float32 pointer
            k_scale = v_scale = out_partial
        _check(stages >= 2, f"stages must be >= 2, got {stages}")
        _check(ctas_per_sm in (1, 2), f"ctas_per_sm must be 1 or 2, got {ctas_per_sm}")
        batch, q_len, nheads, _ = q.shape
        page_size, nheads_k = k_cache.shape[1], k_cache.shape[2]
        if out is not None:
            _check(out.shape == q.shape and out.is_contiguous() and out.device == q.device,
                   f"out must be contiguous {tuple(q.shape)} on {q.device}")
        if lse is not None:
            _check(out is not None and lse.dtype == torch.float32 and lse.is_contiguous()
                   and tuple(lse.shape) == (batch, nheads, q_len),
                   f"lse must be contiguous float32 [{batch}, {nheads}, {q_len}] (with out)")
        self.out_partial, self.lse_partial, self.out, self.lse = out_partial, lse_partial, out, lse
        self.grid = (num_splits, nheads_k, batch)
        tile = tile_keys or (64 if kv16 else BLOCK_N.value)
        box = min(box_rows(page_size), tile)
        self.args = (
            q, _desc(k_cache, box), _desc(v_cache, box), k_scale, v_scale, k_cache, v_cache,
            out_partial,
            lse_partial, cache_seqlens, block_table, float(softmax_scale), q_len, num_splits,
            q.stride(0), q.stride(1), q.stride(2), ksh, vsh, *out_partial.stride()[:4],
            *lse_partial.stride(), block_table.stride(0), 0, 0, 0, 0)
        self.constexprs = dict(GROUP=nheads // nheads_k, IS_CAUSAL=bool(causal),
                               PAGE_SIZE=page_size, STAGES=int(stages),
                               THREAD_ARRIVE=bool(thread_arrive), RING_MERGE=bool(ring_merge),
                               TILE_KEYS=int(tile_keys), num_warps=WARPS.value)
        if ctas_per_sm == 2:
            self.constexprs["maxnreg"] = TWO_CTA_MAXNREG

    def decode(self):
        """The decode kernel alone (the partials); returns the compiled kernel."""
        if self.grid[2] == 0:
            return None
        return _gluon_decode_kernel[self.grid](*self.args, **self.constexprs)

    def __call__(self):
        """Decode + combine (needs ``out``); returns ``(out, lse)``."""
        self.decode()
        if self.grid[2]:
            combine_partials(self.out_partial, self.lse_partial, self.out, self.lse)
        return self.out, self.lse


def launch_gluon_decode_fp8(q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, block_table,
                            out_partial, lse_partial, *, softmax_scale: float, num_splits: int,
                            causal: bool, stages: int = 4, thread_arrive: bool = True,
                            ctas_per_sm: int = 1, ring_merge: bool = False):
    """``_gluon_decode_kernel`` on an fp8 e4m3 paged cache: the float32 split partials
    ``out_partial [batch, q_len, nheads, num_splits, 128]`` (normalized) and ``lse_partial
    [batch, q_len, nheads, num_splits]`` (natural log; ``-inf`` and 0 for an empty split or a
    row that sees no key), what ``_paged_decode_kernel`` stores with SPLIT, so
    ``combine_partials`` (``paged_combine``) merges them. q fp16 ``[batch, q_len, nheads, 128]``;
    caches float8_e4m3fn ``[num_pages, page_size, nheads_k, 128]`` (contiguous pages, page_size a
    multiple of 16); k_scale / v_scale float32 ``[nheads_k]`` or 0-dim (``kvonce.paged.quant``);
    ``GROUP * q_len <= 16``. ``stages``: ring slots (2-4); ``ctas_per_sm`` 2: the launch at
    ``TWO_CTA_MAXNREG`` registers (consumers 232 after ``setmaxnreg``), for two CTAs an SM with
    ``stages`` <= 3 and ``ring_merge`` (the end-of-CTA merge through the idle K ring instead of
    16 KB of reduce scratch). Validates and builds the TMA descriptors on every call (a
    ``GluonDecodeLaunch`` does that once). Returns the compiled kernel."""
    return GluonDecodeLaunch(q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, block_table,
                             out_partial, lse_partial, softmax_scale=softmax_scale,
                             num_splits=num_splits, causal=causal, stages=stages,
                             thread_arrive=thread_arrive, ctas_per_sm=ctas_per_sm,
                             ring_merge=ring_merge).decode()


def combine_partials(out_partial, lse_partial, out, lse=None) -> None:
    """``paged_combine._combine_splits_kernel`` over the partials: ``out [batch, q_len, nheads,
    128]`` (its dtype) and, if given, ``lse`` float32 ``[batch, nheads, q_len]``, both
    contiguous (as ``PagedDecodeLaunch`` calls it)."""
    from .paged_combine import _combine_splits_kernel, combine_launch_shape, combine_pdl

    batch, q_len, nheads, num_splits, head_dim = out_partial.shape
    grid, constexprs, (warps, stages) = combine_launch_shape(
        nheads, q_len, batch, num_splits, head_dim, combine_pdl(out.device, "gluon"))
    constexprs["STORE_LSE"] = lse is not None
    _combine_splits_kernel[grid](
        out_partial, lse_partial, out, out if lse is None else lse, num_splits, head_dim,
        *out_partial.stride()[:4], *lse_partial.stride(), q_len * nheads * head_dim,
        nheads * head_dim, head_dim, nheads * q_len, 1, q_len, **constexprs, num_warps=warps,
        num_stages=stages, **({"launch_pdl": True} if constexprs["PDL_WAIT"] else {}))


# ----------------------------------------------------------------------------------------------
# The plan's launch (kvonce.paged.decode)
# ----------------------------------------------------------------------------------------------

# The variant the plan launches: two CTAs an SM, two ring stages (32 KB each), the merge through
# the idle K ring. H200, 2026-11-29, graphs, at the plan's split counts: 1.07-1.12x the Triton
# kernel, 2-3% ahead of three stages at 64 x 8192 and even to 1% behind at 1 x 131072.
GLUON_PLAN_VARIANT = dict(stages=2, ctas_per_sm=2, ring_merge=True)
# A launch of at most one CTA an SM (the split rule's short launches, ``paged.splits.
# gluon_num_splits``) could keep more bytes in flight a CTA: an SM's whole ring is its one CTA's,
# and at two stages only one 32 KB tile is in flight while the consumers read the other. fp8 /
# int8 at such launches take ``GLUON_ONE_CTA_VARIANT`` when set, e.g. ``dict(stages=4,
# ctas_per_sm=1, ring_merge=False)``: four stages, the merge through its own scratch (fp8
# 147588 B, int8 155780 B), no register cap; None: the plan variant. Measured on the H200
# (twenty-ninth session, decode_fixed_cost, graphs): correct, and slower at every point, more
# so the deeper the ring: GQA 32/8 fp8 65536 / 131072 keys 37.9 / 69.4 us at the plan's
# variant, 41.6 / 74.5 at 3 stages, 41.9 / 75.5 at 4; int8 40.1 / 70.1, 45.5 / 77.7, 46.4 /
# 80.2; MHA 12/12 alike (fp8 52.3 / 98.7, 58.2 / 104.9, 60.1 / 107.2). At the plan's two
# stages each of its other two changes costs alone: the merge through scratch ~2 us a call
# (fp8 GQA 38.0 / 69.6 -> 40.1 / 71.7), the register cap's removal 1.5-3.4 us (-> 39.6 / 73.0).
# Off.
GLUON_ONE_CTA_VARIANT: dict | None = None
# int4: the same bytes in flight in 16 KB stages. Row-major consumers: correct on the H200
# (tests/test_gluon_decode.py, 2026-11-29 eighteenth session) but 9-13% slower than the Triton
# int4 row (GQA 32/8 64 x 8192 218.6 us against 199.2, 1 x 131072 70.6 against 61.9; MHA 12/12
# 324.1 / 96.5 against 294.8 / 85.7); swapped (GLUON_SWAP_FORMATS) the routed form.
INT4_VARIANT = dict(stages=4, ctas_per_sm=2, ring_merge=False)
# int8 scales stored head-major (quantize_kv's) by TMA with each K tile (``SCALE_RING``: 623
# instructions a tile a warp against 780 with a load a key). H200, 2026-11-29 eighteenth
# session, graphs: GQA 32/8 64 x 8192 267.5 us against 273.2, MHA 12/12 390.8 against 400.1,
# 1 x 131072 even (85.7 / 117.1 against 84.9 / 117.7). Scales stored otherwise (token-major, or
# not 16-byte aligned) are read a key at a time.
INT8_SCALES_BY_TMA = True
# int8's fp16 scales (``check_scale`` takes them) by the same ring, two keys a 32-bit unit (a
# 16-key box's 32 bytes heading a 128-byte ring row; the row-major consumers read the units
# where their key columns hold adjacent pairs: ``gluon_decode_common.UNIT_COLS``). Compiled for
# sm_90a 2026-11-29 (twenty-first session): 636 instructions a tile a warp against 623 with
# float32 scales, one CTA barrier a tile as there; the bytes 1.5% fewer (260 a token and KV
# head against 264). H200, 2026-11-29 twenty-second session, graphs, head-major pages,
# 64 x 8192: GQA 32/8 267.2 us against 270.4 with float32 scales, MHA 12/12 389.9 against
# 395.4 (quantize_kv's int8 default became fp16 scales with it).
INT8_FP16_SCALE_RING = True
# int8 V as ``1152 + x``, the bias off each tile's dot start (``_tile``'s V_BIASED; compiled
# for sm_90a 2026-11-29: 573 instructions a tile a warp against 623, the masked tile 662 against
# 854): correct on the H200 but not faster (nineteenth session, graphs, GQA 32/8 then MHA 12/12
# at 64 x 8192 / 1 x 131072: 274.1 / 87.5, 404.1 / 119.6 us against 274.4 / 87.7, 403.8 /
# 119.9; swapped, 270.8 / 87.5, 396.9 / 116.8 against 270.2 / 87.7, 397.8 / 116.8): off.
INT8_V_BIASED = False
# int4 V as ``1024 + n`` / ``1024 + 16 n`` (the swapped consumers' V_BIASED: one lop3 a
# register, no subtract / fma; each plane's bias times the rows' probability sums off its dot's
# start, ``gluon_decode_common.INT4_V_BIAS``). Compiled for sm_90a 2026-11-29 (twenty-first
# session): 499 instructions a tile a warp against 531 (fp16 pairs, head-major, GQA 4: 56
# half-precision adds / fmas gone, the rows' probability sums 22 more); the head-major int4
# route is held by its consumers there (kernel 181.6 us, memory only 159.8). H200, 2026-11-29
# twenty-second session, graphs, head-major pages, 64 x 8192: GQA 32/8 177.9 us against 181.5,
# MHA 12/12 255.9 against 260.5.
INT4_V_BIASED = True
# int4's swapped consumers keep each thread's part of the rows' sums (l, and b: the offsets' sum
# p o) across the tiles and add the lanes' parts once (``DEFER_SUMS``; the row max stays a
# tile's shuffles: the exponentials need it). Compiled for sm_90a 2026-11-30 (twenty-fifth
# session): 475 instructions a tile a warp against 499 (head-major, GQA 4, fp16 pairs, V
# biased; 19 shuffles against 31), the masked tile 514 against 537, no spill. H200, 2026-11-30
# (twenty-sixth session, graphs, head-major pages, four loaders): 1.0-1.8% faster at equal
# memory-only times (GQA 32/8 64 x 8192 165.7 us against 168.0, 24 x 8192 83.7 against 84.7;
# MHA 12/12 232.1 against 236.4, 111.3 against 112.9). Shipped.
INT4_DEFER_SUMS = True
# The cache formats whose consumers take swapped operands (``_consume_t``, ``_consume_int4_t``:
# keys as M, q rows as N = 8) where the packed rows fit 8 (int8 / int4 with their scales by
# ring). Compiled for sm_90a 2026-11-29: fp8 373 instructions a tile a warp against 453, int8 504
# against 623, int4 516 against 649 (the Triton int4 loop: 734); 157-175 registers against
# ~210-230. On the H200 (nineteenth session, graphs; every route correct) fewer instructions
# paid only for int4: fp8 / int8 ran 1-2% slower (GQA 32/8 64 x 8192 261.5 / 270.2 us against
# 257.6 / 267.2, 1 x 131072 81.4 / 87.7 against 80.2 / 85.9; MHA 12/12 381.7 / 397.8 against
# 378.8 / 394.8), int4 1-10% faster than the Triton int4 row from 192 CTAs (GQA 64 x 8192 191.3
# against 198.0, MHA 278.1 against 294.7; ``paged.splits.gluon_int4_pays``).
GLUON_SWAP_FORMATS = (3,)
# int4's swapped consumers in 256-key tiles (two 32 KB stages, the same shared memory as four
# of 16 KB): each consumer warp's chain (ring wait, converts, dots, softmax, release) then
# carries 64 keys, where the loops measured latency-bound (the nineteenth session). Compiled
# for sm_90a 2026-11-29: 909 instructions a 256-key tile a warp (455 a 128 keys against 515),
# 224 registers (consumers' 232), 16 B spilled outside the tile loops. Three such stages
# (``INT4_SWAPPED_STAGES`` 3): 114812 B of shared memory (two CTAs an SM still fit), 933
# instructions a tile. On the H200 (nineteenth session): correct (its 33 route cases), and at
# two stages even with 128-key tiles (GQA 32/8 64 x 8192 194.5 us against 194.8, one call): off.
INT4_SWAPPED_TILE_KEYS = 128
INT4_SWAPPED_STAGES = 0
# Split launches merged by their last split (an arrival count a (sequence, KV head), the
# partials read back through L2, no combine launch; commit 4f3a76e) measured 0-3% slower than the
# combine kernel (H200, graphs, 2026-11-29: fp8 GQA 32/8 1 x 131072 84.2 us against 82.5, int8
# 91.0 against 88.5, MHA 12/12 even): the merging CTA's L2 round trips outlast a launch.
# Three ring stages where the launch has at most one CTA an SM (98.7 KB a CTA) measured +1.3% in
# scripts/gluon_decode_check.py and -1.3 to -2.0% through the plan (GQA 32/8 1 x 131072 83.7 us
# against 82.0, MHA 12/12 114.5 against 113.0; H200, graphs, 2026-11-29): not taken. One split
# stores out and LSE itself (no combine, no scratch): GQA 32/8 64 x 8192 262.2 us against 269.1
# through the partials, MHA 12/12 386.4 against 389.8.
# Loader warps by cache format (QUANT_FORMATS code; ``LOADERS``): each issues its share of a
# tile's TMA boxes (int4 at page 16: 32 a 128-key tile, K, V and their scale pairs, 17 KB).
# int4 takes two: once its consumers were cheap enough (fp16 pairs, V biased), two loaders took
# the routed rows 4-6% down (H200, 2026-11-29 twenty-second session, graphs, head-major pages,
# 64 x 8192: GQA 32/8 171.5 us against 178.3, MHA 12/12 241.4 against 256.2); the short
# launches the plan keeps on Triton ran 2-4% slower with them (1 x 131072: 62.6 against 60.4).
# Four (the loader warpgroup's room: the launch is padded to 8 warps anyway; twenty-third
# session, same run, graphs, head-major pages): int4 64 x 8192 GQA 169.6 -> 168.4 us, MHA 240.3 ->
# 235.2; int8 64 x 8192 GQA 264.7 -> 261.8, MHA 382.3 -> 382.5, 1 x 131072 GQA 83.3 -> 83.7, MHA
# 114.9 -> 113.3; fp8 within 0.8% either way at both shapes (kept at one). int4 and int8 take four.
GLUON_LOADERS = {1: 1, 2: 4, 3: 4}
# KV heads a CTA by cache format (QUANT_FORMATS code; the most, ``kv_head_group``): on
# head-major pages a CTA takes a group of KV heads whose pages' rows are adjacent, so each TMA
# box is a whole page of the group (fp8 page 16: 4 KB against 2 KB; int4 2 KB against 1 KB) and
# the launch has 1 / HEADS the CTAs a split; the swapped consumers mask each score to its own
# head (the dots' N holds the group's q rows: HEADS x GROUP x q_len <= 8). Correct on the H200
# (tests/test_gluon_decode.py, every format, heads 2 and 4, pages 16 to 64, fp16 and bf16
# queries; bf16 rerun 2026-11-30, twenty-sixth session: 56 passed) but it does not pay
# (2026-11-30, twenty-fifth session, graphs, head-major, kernel / memory only us): fp8 GQA 32/8
# 64 x 8192 259.3 / 255.1 against 259.6 / 255.6 (4 KB boxes stream as 2 KB ones), 1 x 131072
# 81.6 against 80.8 (33 splits of 4 groups: 132 CTAs); int8 even; int4 GQA 64 x 8192 164.6 /
# 147.9 against 168.0 / 149.9 (2% faster) but 7% slower at 48 and 24 x 8192, MHA 12/12 2-30%
# slower (two heads: 64 x 8192 2%, 24 x 8192 30%; four: 64 x 8192 19%, 192 CTAs); off (empty).
GLUON_KV_HEAD_GROUPS: dict = {}
# The cache formats (QUANT_FORMATS codes) whose loader warps copy by cp.async (16 bytes a thread,
# ``LDGSTS.E.BYPASS.128``) instead of TMA boxes: fp8 only (no scale ring), one head a CTA.
GLUON_CP_ASYNC_FORMATS: tuple = ()
# The roofline probe (a measurement: gluon_decode_common's PROBE_MEMORY 1 / PROBE_MATH 2, the
# shipped fp8 / int8 row-major and int4 swapped consumers; scripts/quant_decode_probe.py sets
# it before building its plans): 0, the kernel.
ROOFLINE_PROBE = 0
# The cache formats (QUANT_FORMATS codes) the plan may route here: fp8 e4m3 (1), int8 (2), int4
# (3; the plan's default rows only where ``paged.splits.gluon_int4_pays``).
GLUON_FORMATS = (1, 2, 3)
# The query dtypes: bf16 rows are scaled into fp16 once a CTA (the loop unchanged).
GLUON_QUERY_DTYPES = (torch.float16, torch.bfloat16)


def paged_fits(q, k_cache, v_cache, kv_format: int, outlier_values=None, k_scale=None,
               v_scale=None) -> bool:
    """Whether the Gluon decode runs this launch: q ``[batch, q_len, nheads, 128]`` of a dtype in
    ``GLUON_QUERY_DTYPES`` (fp16, bf16) with GQA group x q_len <= 16, a cache of a format in
    ``GLUON_FORMATS`` (fp8 e4m3: 1, int8: 2, int4: 3) of contiguous pages
    (``[num_pages, page_size, nheads_k, 128]``, int4 64 bytes a row, stored token-major or
    head-major, K and V alike; page_size a multiple of 16, under 2^31 (key, head) rows), int4's
    (scale, offset) pairs stored head-major (``head_major_scales``; ``k_scale`` / ``v_scale``
    where given), no dense-and-sparse keys (the caller also checks the device: sm_90). Shapes,
    dtypes and strides only (meta tensors answer too; the caches' 16-byte alignment is checked
    by each call)."""
    if (kv_format not in GLUON_FORMATS or outlier_values is not None
            or q.dtype not in GLUON_QUERY_DTYPES
            or q.dim() != 4 or k_cache.dim() != 4 or q.shape[3] != HEAD_DIM.value
            or q.stride(3) != 1 or k_cache.element_size() != 1):
        return False
    num_pages, page_size, nheads_k, d = k_cache.shape
    row = HEAD_DIM.value // 2 if kv_format == INT4.value else HEAD_DIM.value
    if (d != row or page_size % 16 or nheads_k == 0 or q.shape[2] % nheads_k
            or (q.shape[2] // nheads_k) * q.shape[1] > ROWS.value
            or num_pages * page_size * nheads_k >= 2**31):   # TMA rows: int32
        return False
    head_major = pages_head_major(k_cache)
    for t in (k_cache, v_cache):
        if (t.shape != k_cache.shape or t.stride(3) != 1
                or t.stride() != _page_strides(t.shape, head_major)):
            return False
    if kv_format == INT4.value:
        return all(sc is None or head_major_scales(sc) for sc in (k_scale, v_scale))
    return True


def _page_strides(shape, head_major: bool) -> tuple:
    """A paged cache's contiguous strides, token-major ``[num_pages, page_size, nheads_k, row]``
    or head-major (memory ``[num_pages, nheads_k, page_size, row]``)."""
    _, page_size, nheads_k, row = shape
    if head_major:
        return (nheads_k * page_size * row, row, page_size * row, 1)
    return (page_size * nheads_k * row, nheads_k * row, row, 1)


def pages_head_major(cache) -> bool:
    """Whether a paged cache ``[num_pages, page_size, nheads_k, row]`` is stored head-major
    (memory ``[num_pages, nheads_k, page_size, row]``, contiguous; one KV head's: token-major)."""
    return cache.shape[2] > 1 and cache.stride() == _page_strides(cache.shape, True)


def head_major_scales(scale) -> bool:
    """Whether per-key scales (int8 ``[pages, page_size, nheads_k]``, int4's (scale, offset)
    pairs ``[..., 2]``) are stored head-major and contiguous (memory ``[pages, nheads_k,
    page_size(, 2)]``, ``quantize_kv``'s storage of a paged cache): a page's scales of one KV head
    are then one row for TMA (``SCALE_RING``)."""
    if scale.dim() not in (3, 4):
        return False
    pages, page_size, nheads_k = scale.shape[:3]
    pair = scale.shape[3] if scale.dim() == 4 else 1
    strides = (nheads_k * page_size * pair, pair, page_size * pair) + ((1,) if pair > 1 else ())
    # a dim of one element may carry any stride (one KV head: reductions give it stride 1)
    return pair in (1, 2) and all(n == 1 or got == want for n, got, want
                                  in zip(scale.shape, scale.stride(), strides))


def kv_head_group(q, k_cache, kv_format: int, k_scale=None, v_scale=None) -> int:
    """KV heads a CTA of the Gluon decode takes (1, or a group ``GLUON_KV_HEAD_GROUPS`` allows):
    head-major pages, the group's q rows within the swapped dots' N (``HEADS x GROUP x q_len
    <= 8``), whole pages of the group a 128-key tile's boxes (``HEADS x page_size`` dividing
    128), ``nheads_k`` a multiple; int8 where its scales come by ring (``head_major_scales``,
    16-byte aligned: the call checks the alignment). q ``[batch, q_len, nheads, 128]``, k_cache
    ``[num_pages, page_size, nheads_k, row]``, shapes and strides only."""
    most = GLUON_KV_HEAD_GROUPS.get(kv_format, 1)
    page_size, nheads_k = k_cache.shape[1], k_cache.shape[2]
    rows = q.shape[1] * (q.shape[2] // max(1, nheads_k))
    if most <= 1 or not pages_head_major(k_cache):
        return 1
    if kv_format == INT8.value and not (
            INT8_SCALES_BY_TMA and k_scale is not None and v_scale is not None
            and all(head_major_scales(sc) and (sc.dtype == torch.float32 or INT8_FP16_SCALE_RING)
                    for sc in (k_scale, v_scale))):
        return 1
    for heads in (8, 4, 2):
        if (heads <= most and nheads_k % heads == 0 and heads * rows <= NR.value
                and BLOCK_N.value % (heads * page_size) == 0):
            return heads
    return 1


def writes_partials(num_splits: int) -> bool:
    """Whether a launch of ``num_splits`` splits needs the float32 split scratch."""
    return num_splits > 1


class PagedGluonDecodeLaunch:
    """``_gluon_decode_kernel`` + the split combine with ``PagedDecodeLaunch``'s call: built from
    the planned shapes (``paged_fits`` true), then ``__call__(q, k_cache, v_cache, cache_seqlens,
    block_table, out, lse, o_part, lse_part, arrivals, k_scale, v_scale, outlier_values,
    outlier_channels)`` launches for tensors of those shapes and strides. Split launches go
    through ``o_part [batch, q_len, nheads, S, 128]`` / ``lse_part [batch, q_len, nheads, S]``
    (float32, contiguous) and the combine; one split stores ``out`` (contiguous, q's dtype)
    and ``lse`` (contiguous float32 ``[batch, nheads, q_len]``, or None without ``store_lse``)
    itself (``writes_partials``). ``arrivals`` and the outlier arguments are unused. The TMA
    descriptors of each call's caches and scales are built once and kept (``DescriptorCache``:
    the plan runs every layer's), both kernels launched through ``_launch.launch`` (Triton's C
    launcher, no per-call argument binding): no allocation, no host sync, CUDA-graph
    capturable. A batch cut's pair (``kvonce.paged.batch_cut``): ``trigger_next`` lets the
    launch after this one start as soon as every CTA of this one has; ``follows`` launches this
    one as that programmatic dependent (it reads nothing the one before writes), its CTAs
    waiting for the one before to end before they exit."""

    def __init__(self, q, k_cache, v_cache, block_table, *, softmax_scale: float, causal: bool,
                 num_splits: int, store_lse: bool, kv_format: int = 1, k_scale=None,
                 v_scale=None, trigger_next: bool = False, follows: bool = False):
        from .paged_combine import combine_launch_shape, combine_pdl

        batch, q_len, nheads, head_dim = q.shape
        page_size, nheads_k = k_cache.shape[1], k_cache.shape[2]
        self.store_lse = store_lse
        self.per_key_scales = kv_format in (INT8.value, INT4.value)
        self.int4 = kv_format == INT4.value
        self.device_index = q.device.index
        # KV heads a CTA (kv_head_group; k_scale / v_scale: examples of the calls' scales)
        self.heads = kv_head_group(q, k_cache, kv_format, k_scale, v_scale)
        self.grid = (num_splits, nheads_k // self.heads, batch)
        self.box = min(box_rows(page_size), BLOCK_N.value)
        if self.heads > 1:   # a box: a whole page of the group's heads
            self.box = self.heads * page_size
        self.row = k_cache.shape[3]                     # bytes a key (int4: 64)
        self.head_major = pages_head_major(k_cache)
        self.layout = gl.NVMMASharedLayout.get_default_for([self.box, self.row], gl.uint8)
        self.scale = float(softmax_scale)
        self._descs = DescriptorCache()   # the caches' and scales' TMA descriptors, call to call
        # One split stores the final out [batch, q_len, nheads, d] and lse [batch, nheads, q_len]
        # (a combine launch and the partials' round trip saved: 6.0 us of GQA 32/8 64 x 8192's
        # 260.6, H200), more go through the float32 partials (contiguous scratch).
        self.direct = num_splits == 1
        s = num_splits
        if self.direct:
            out_strides = (q_len * nheads * head_dim, nheads * head_dim, head_dim, 0)
            lse_strides = (nheads * q_len, 1, q_len, 0)    # (batch, token, head, split)
        else:
            out_strides = (q_len * nheads * s * head_dim, nheads * s * head_dim, s * head_dim,
                           head_dim)
            lse_strides = (q_len * nheads * s, nheads * s, s, 1)
        self.ints = (q_len, num_splits, q.stride(0), q.stride(1), q.stride(2))
        self.tail_ints = (*out_strides, *lse_strides, block_table.stride(0))
        # swapped operands (GLUON_SWAP_FORMATS): packed rows <= 8; fp8, or int8 / int4 with
        # their scales by ring (so int8's choice waits for the call's scales: ``ring_constexprs``)
        rows = nheads // nheads_k * q_len
        self.swap = ((kv_format in GLUON_SWAP_FORMATS or self.heads > 1)
                     and self.heads * rows <= NR.value)
        # int4: 16 KB a stage (64-byte rows), four of them; its four nibble planes merge
        # through Triton's reduce scratch. Swapped, INT4_SWAPPED_TILE_KEYS-key tiles in
        # INT4_SWAPPED_STAGES stages (0: as many as keep those bytes).
        variant = INT4_VARIANT if self.int4 else GLUON_PLAN_VARIANT
        if (not self.int4 and GLUON_ONE_CTA_VARIANT
                and num_splits * self.grid[1] * batch <= device_info(q.device)[1]):
            variant = GLUON_ONE_CTA_VARIANT
        tile, stages = 0, variant["stages"]
        if self.int4 and self.swap and INT4_SWAPPED_TILE_KEYS != BLOCK_N.value:
            tile = INT4_SWAPPED_TILE_KEYS
            stages = INT4_SWAPPED_STAGES or max(2, stages * BLOCK_N.value // tile)
        self.constexprs = dict(GROUP=nheads // nheads_k * self.heads, IS_CAUSAL=bool(causal),
                               PAGE_SIZE=page_size, STAGES=stages,
                               THREAD_ARRIVE=True, RING_MERGE=variant["ring_merge"],
                               TILE_KEYS=tile, KV_FORMAT=kv_format,
                               STORE_LSE=store_lse or not self.direct,
                               V_BIASED=(kv_format == INT8.value and INT8_V_BIASED)
                               or (kv_format == INT4.value and INT4_V_BIASED and self.swap),
                               PROBE=ROOFLINE_PROBE,
                               LOADERS=GLUON_LOADERS.get(kv_format, 1),
                               HEAD_MAJOR=self.head_major, HEADS=self.heads,
                               DEFER_SUMS=self.int4 and self.swap and INT4_DEFER_SUMS,
                               CP_ASYNC=kv_format in GLUON_CP_ASYNC_FORMATS
                               and kv_format == FP8.value and self.heads == 1,
                               PDL_TRIGGER=trigger_next
                               or (not self.direct and combine_pdl(q.device, "gluon")),
                               PDL_EXIT_WAIT=follows)
        self.ring_constexprs = dict(self.constexprs, SCALE_RING=True, SWAP_AB=self.swap)
        self.constexprs["SWAP_AB"] = self.swap and kv_format == FP8.value
        # the two-CTA variants' register cap (TWO_CTA_MAXNREG); a one-CTA variant none
        self.maxnreg = TWO_CTA_MAXNREG if variant["ctas_per_sm"] == 2 else 0
        self.key = ("gluon-decode", q.dtype, self.ints, self.tail_ints,
                    tuple(self.constexprs.values()), self.maxnreg)
        self.combine = None
        if not self.direct:
            self.combine_ints = (num_splits, head_dim, *out_strides, *lse_strides,
                                 q_len * nheads * head_dim, nheads * head_dim, head_dim,
                                 nheads * q_len, 1, q_len)
            grid, constexprs, warps = combine_launch_shape(
                nheads, q_len, batch, num_splits, head_dim, pdl=combine_pdl(q.device, "gluon"))
            constexprs["STORE_LSE"] = store_lse
            self.combine = (("combine", q.dtype, self.combine_ints,
                             tuple(constexprs.values())), grid, constexprs, warps)

    def _desc(self, cache):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        raw = cache.view(torch.uint8)
        if self.head_major:   # rows: every (page, KV head)'s keys in turn
            return TensorDescriptor(raw, [raw.numel() // self.row, self.row], [self.row, 1],
                                    [self.box, self.row], self.layout)
        return TensorDescriptor(raw, [raw.shape[0] * raw.shape[1], raw.shape[2] * raw.shape[3]],
                                [raw.stride(1), 1], [self.box, self.row], self.layout)

    def _scales_desc(self, scale):
        """Per-key scales (``head_major_scales``: int8's, int4's pairs) as ``[pages * nheads_k,
        page_size * pair]`` 32-bit rows, a box's a TMA box; int4's fp16 pairs as one 32-bit unit
        a key, int8's fp16 scales two keys a unit (the kernel reads them so,
        ``gluon_decode_common.ring_units``). A CTA of ``heads`` KV heads: ``[pages * nheads_k /
        heads, heads * page_size * pair]``, a row a page of the group (adjacent in storage)."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        pages, page_size, nheads_k = scale.shape[:3]
        # the head-major storage, flat (a view: ``head_major_scales`` holds), as 32-bit units
        flat = scale.transpose(1, 2).reshape(-1)
        if flat.dtype == torch.float16:
            flat = flat.view(torch.float32)
        units = flat.numel() // (pages * nheads_k) * self.heads   # a (page, KV head group)'s
        return TensorDescriptor(flat, [pages * nheads_k // self.heads, units], [units, 1],
                                [1, self.box * units // (page_size * self.heads)],
                                scale_pair_layout())

    def __call__(self, q, k_cache, v_cache, cache_seqlens, block_table, out, lse, o_part,
                 lse_part, arrivals, k_scale, v_scale, outlier_values=None,
                 outlier_channels=None):
        from ._launch import alignment_key, launch
        from .paged_combine import _combine_splits_kernel

        if self.grid[2] == 0:
            return
        if any(pages_head_major(c) != self.head_major for c in (k_cache, v_cache)):
            raise ValueError("the Gluon decode's plan was built for "
                             f"{'head' if self.head_major else 'token'}-major pages; got caches "
                             f"with strides {tuple(k_cache.stride())}, {tuple(v_cache.stride())}")
        if k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16:
            raise ValueError("the Gluon decode (TMA) needs 16-byte aligned caches: "
                             f"k_cache at {k_cache.data_ptr():#x}, v_cache at "
                             f"{v_cache.data_ptr():#x}")
        # int4's scales come by TMA (SCALE_RING); int8's too where stored head-major from a
        # 16-byte aligned address and INT8_SCALES_BY_TMA, else a load a key
        ring = self.int4 or (self.per_key_scales and INT8_SCALES_BY_TMA and all(
            head_major_scales(sc) and sc.data_ptr() % 16 == 0
            and (sc.dtype == torch.float32 or INT8_FP16_SCALE_RING)
            for sc in (k_scale, v_scale)))
        if self.heads > 1 and self.per_key_scales and not ring:
            raise ValueError(
                "the Gluon decode's plan takes KV heads in groups of "
                f"{self.heads}, which reads the per-key scales by TMA: scales stored head-major "
                "(memory [pages, nheads_k, page_size]) from a 16-byte aligned address; got "
                f"strides {tuple(k_scale.stride())}, {tuple(v_scale.stride())}")
        if self.int4:
            for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
                if not head_major_scales(sc) or sc.data_ptr() % 16:
                    raise ValueError(
                        f"the Gluon int4 decode reads {name} by TMA: pairs stored head-major "
                        "(memory [pages, nheads_k, page_size, 2], quantize_kv's) from a 16-byte "
                        f"aligned address; got strides {tuple(sc.stride())} at "
                        f"{sc.data_ptr():#x}")
        if self.per_key_scales:   # int8 / int4: [pages, page_size, nheads_k(, 2)], any strides
            head_strides = (k_scale.stride(2), v_scale.stride(2))
            key_strides = (*k_scale.stride()[:2], *v_scale.stride()[:2])
        else:                     # fp8: [nheads_k] or 0-dim
            head_strides = (k_scale.stride(0) if k_scale.dim() == 1 else 0,
                            v_scale.stride(0) if v_scale.dim() == 1 else 0)
            key_strides = (0, 0, 0, 0)
        aligned = alignment_key(q, cache_seqlens, block_table, k_scale, v_scale)
        if self.direct:
            dst_o, dst_l = out, (out if lse is None or not self.store_lse else lse)
        else:
            dst_o, dst_l = o_part, lse_part
        ks_arg, vs_arg = k_scale, v_scale
        if ring:
            ks_arg = self._descs.get(self._scales_desc, k_scale)
            vs_arg = self._descs.get(self._scales_desc, v_scale)
        launch(_gluon_decode_kernel,
               (self.key, head_strides, key_strides, k_scale.dtype, aligned, ring), self.grid,
               (q, self._descs.get(self._desc, k_cache),
                self._descs.get(self._desc, v_cache), ks_arg, vs_arg, k_cache, v_cache, dst_o,
                dst_l,
                cache_seqlens, block_table, self.scale, *self.ints, *head_strides,
                *self.tail_ints, *key_strides),
               self.ring_constexprs if ring else self.constexprs, WARPS.value, 1,
               self.device_index, self.maxnreg, launch_pdl=self.constexprs["PDL_EXIT_WAIT"])
        if self.direct:
            return
        key, grid, constexprs, warps = self.combine
        launch(_combine_splits_kernel, key, grid,
               (o_part, lse_part, out, out if lse is None or not self.store_lse else lse,
                *self.combine_ints), constexprs, *warps, self.device_index,
               launch_pdl=constexprs["PDL_WAIT"])
