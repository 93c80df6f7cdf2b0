"""Warp-specialized Hopper (sm_90a) paged decode in Gluon for fp8 e4m3 and int8 KV caches: the
contract of ``_paged_decode_kernel`` (kernels/paged_decode.py) with SPLIT (float32 partials,
merged by ``paged_combine``; one split stores out itself), for fp16 and bf16 queries, head dim
128, pages a multiple of 16 keys.

WIRED on sm_90 (``PagedDecodeConfig.gluon``, the fp8 and int8 rows; ``paged_fits`` says which
launches, ``PagedGluonDecodeLaunch`` is the plan's launch): two CTAs an SM at two ring stages
(``GLUON_PLAN_VARIANT``). On the lent H200 (2026-11-29, CUDA graphs, decode + combine) the fp8
form ran 1.07-1.12x the Triton kernel at the ``bench quant`` shapes with its own split counts
(``paged.splits.gluon_num_splits``: about one CTA an SM for short launches, one pass from a full
wave of two), where the Triton loop, at 604 instructions a tile a warp, no longer follows the
H200's memory; int8 (``KV_FORMAT`` 2: per-key scales, a wave of two CTAs an SM for short
launches) 1.08-1.21x (scripts/quant_decode_sweep.py, seventeenth session); bf16 queries (rows
scaled into fp16 once a CTA, the same loop) alike. On the H100 (2026-11-27, one CTA an SM, four
stages, the Triton row's splits) the fp8 form was 2-11% slower.

int8's per-key scales come by TMA with each K tile where stored head-major (``SCALE_RING``: the
loader copies a box's scales, one row of their head-major storage, into a ring beside K's;
``INT8_SCALES_BY_TMA``: 623 instructions a tile a warp against 780, 2-3% faster at 64 x 8192 on
the H200). An int4 form (``KV_FORMAT`` 3, ``_tile_int4``: 64-byte rows, the nibble planes,
scales by ring; 649 instructions against the Triton int4 loop's 734) is correct on the H200 but
9-13% slower than the Triton int4 row, so not in ``GLUON_FORMATS``.
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

- ``_load`` (1 warp, 24 registers): ``gluon_prefill._load``'s scheme. Key tile ``j`` (128 keys)
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

Host side: ``GluonDecodeLaunch`` validates and builds the TMA descriptors once (a call is then
the decode launch, plus the combine's: CUDA-graph capturable); ``launch_gluon_decode_fp8`` does
both per call. ``PagedGluonDecodeLaunch`` is the plan's (``PagedDecodeLaunch``'s call): shapes
fixed once, the descriptors built from each call's caches (a plan serves every layer).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .gluon_prefill import _add, _max  # the reduce combiners
from .quant_convert import (_I4_UNIT_ASM, _INT8_BIAS, _INT8_PAIR_EVEN, _INT8_PAIR_ODD,
                            _pair_asm)

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)
HEAD_DIM = gl.constexpr(128)
BLOCK_N = gl.constexpr(128)          # keys a ring slot (a tile), 32 per consumer warp
ROWS = gl.constexpr(16)              # packed q rows (GROUP * q_len <= 16, zero padded)
WARPS = gl.constexpr(4)              # consumer warps: the default partition (num_warps)
WARP_KEYS = gl.constexpr(32)         # a consumer warp's keys of a tile
LOADER_WARPS = gl.constexpr(1)
LOADER_REGS = gl.constexpr(24)

# Batched mma.sync (m16n8k16): the leading dim is the consumer warp, so every tensor below is
# warp-private: a reduction over its last two dims never leaves the warp.
MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1],
                                             instr_shape=[1, 16, 8]))
# S = Q Kᵀ: k_width 4 (each thread holds 4 consecutive channels of a key: the K slot is read by
# ldmatrix, 16 B a row segment, and q in the same order, so the dot's sum is unchanged).
Q_OP = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4))
K_OP = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=4))
# O += P V: P straight from the S accumulator (k_width 2), V units by ldmatrix.trans.
P_OP = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
V_OP = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))
ROW_STATE = gl.constexpr(gl.SliceLayout(2, MMA))     # m, l: [WARPS, ROWS]
# 16-bit caches (``KV16``: fp16 / bf16 pages, no scales): q and K in the plain m16n8k16 operand
# order (k_width 2), V's two 64-channel halves straight from their slot.
Q_OP16 = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
K_OP16 = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))
# RING_MERGE: the four warps' weighted accumulators go through the (idle) K ring, fp32 [WARPS,
# ROWS, 64] for the even channels in slot 0 and the odd in slot 1, XOR-swizzled by row (16-byte
# units: the MMA layout's 8-byte stores and the loads are at the minimum wavefronts), read back
# with the warp dim inside each thread (4 warps x 2 channel pairs a thread); each thread sums
# its 4 warps' values and stores 4 consecutive channels (even and odd joined) as 16 B.
MERGE_SMEM = gl.constexpr(gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8,
                                                  order=[1, 0]))
MERGE_LOAD = gl.constexpr(gl.BlockedLayout([4, 1, 2], [1, 1, 32], [1, 4, 1], [2, 1, 0]))
MERGE_OUT = gl.constexpr(gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0]))   # [ROWS, 128]
# Launch registers for two CTAs an SM: the launch is 8 warps (4 consumer + the loader warp
# padded to a warpgroup by Triton's allocate-warp-groups pass), 65536 / 2 / 256 = 128. Passed
# as the ``maxnreg`` compile option (``ttg.maxnreg`` -> the PTX ``.maxnreg``), from which the
# same pass sizes the consumers' ``setmaxnreg.inc``: (128 * 256 - 24 * 128) / 128 = 232.
TWO_CTA_MAXNREG = 128
# Cache formats (``KV_FORMAT``, kvonce.paged.checks.QUANT_FORMATS' codes): fp8 e4m3 with a scale a
# KV head, int8 with a scale a (token, KV head). 16-bit caches are told by their descriptor.
FP8 = gl.constexpr(1)
INT8 = gl.constexpr(2)
# int8 K bytes -> fp16 1152 + x, four a register (quant_convert._ints_to's packed form without
# its subtract: bias by xor, each biased byte under a 0x64 high byte by prmt; the scores' dot
# starts from -1152 * sum(q) instead, so 1152 comes off every score with no instruction a tile).
INT8_QUAD_BIASED = gl.constexpr("""{
    .reg .b32 t;
    xor.b32 t, $2, 0x80808080;
    prmt.b32 $0, t, 0x64646464, 0x4140;
    prmt.b32 $1, t, 0x64646464, 0x4342;
    }""")
INT8_BIAS = gl.constexpr(1152.0)
INT8_PAIR_EVEN = gl.constexpr(_INT8_PAIR_EVEN.value)
INT8_PAIR_ODD = gl.constexpr(_INT8_PAIR_ODD.value)
# V_BIASED: int8 V bytes -> fp16 ``1152 + x`` two keys a register (xor, prmt: the pair
# converters without their subtract); the bias comes off each tile's dot start (``_tile``).
INT8_PAIR_EVEN_BIASED = gl.constexpr(_pair_asm(_INT8_BIAS, "0x64646464", "0x4240",
                                               "mov.b32 $0, u;"))
INT8_PAIR_ODD_BIASED = gl.constexpr(_pair_asm(_INT8_BIAS, "0x64646464", "0x4341",
                                              "mov.b32 $0, u;"))
# int4 (``KV_FORMAT`` 3): a key's 64 bytes hold channel i in byte i's low nibble and i + 64 in its
# high one (each nibble q + 8), with a float32 (scale, offset) a (token, KV head). K bytes ->
# fp16 under a 0x64 high byte (prmt), then one AND keeps the low nibble (1024 + n) or the high
# one (1024 + 16 n): 6 instructions for 8 values; the scores' dots start from the rows' biases
# (``_int4_score_inits``). V units (two bytes of a key) -> the exact q of one nibble plane
# (quant_convert's int4 unit converters: channels 2u, 2u + 1, 64 + 2u, 65 + 2u).
INT4 = gl.constexpr(3)
_INT4_K_BYTES = """{
    .reg .b32 t, u;
    prmt.b32 t, $2, 0x64646464, 0x4140;
    prmt.b32 u, $2, 0x64646464, 0x4342;
    and.b32 $0, t, MASK;
    and.b32 $1, u, MASK;
    }"""
INT4_K_LOW = gl.constexpr(_INT4_K_BYTES.replace("MASK", "0xFF0FFF0F"))
INT4_K_HIGH = gl.constexpr(_INT4_K_BYTES.replace("MASK", "0xFFF0FFF0"))


@gluon.jit
def _split_range(cache_seqlens, seq, split, num_splits, TILE: gl.constexpr):
    """``(seqlen, lo, hi)``: split ``split``'s keys ``[lo, hi)`` (the Triton kernel's rule, in
    whole ``TILE``-key tiles)."""
    seqlen = gl.load(cache_seqlens + seq)
    split_len = (((seqlen + num_splits - 1) // num_splits + TILE - 1) // TILE) * TILE
    lo = split * split_len
    hi = gl.minimum(lo + split_len, seqlen)
    return seqlen, lo, hi


# ----------------------------------------------------------------------------------------------
# Loader warp
# ----------------------------------------------------------------------------------------------

@gluon.jit
def _box_pages(bt_row, start, box, last_box, BOX: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Page ids of the boxes of the tile at key ``start`` (boxes past the end: the sequence's
    last box's page, so the block table past the sequence's pages is never read)."""
    key = gl.minimum(start + box * BOX, last_box)
    return gl.load(bt_row + key // PAGE_SIZE)


@gluon.jit
def _load_tile(desc, smem, ready, empty, phase, pages, box, start, col, last_box,
               PAGE_SIZE: gl.constexpr, SCALES: gl.constexpr = False, ks_desc=None,
               ks_smem=None, vs_desc=None, vs_smem=None, kv_head=0):
    """The tile at key ``start`` of K (or V) into the ring slot ``smem`` once ``empty`` passes
    ``phase``, box by box, on ``ready`` (expect + the boxes' bytes). SCALES (a K tile of a
    ``SCALE_RING`` launch): the tile's K and V scales too, on the same barrier (int4's (scale,
    offset) pairs, ``PAIR`` 2; int8's scales, 1): each box's are one row of the scales'
    head-major storage (``[pages * nheads_k, page_size * PAIR]`` float32: a page's of one KV head
    are adjacent), into ``ks_smem`` / ``vs_smem`` ``[TILE / BOX, BOX * PAIR]``."""
    BOX: gl.constexpr = desc.block_type.shape[0]
    TILE: gl.constexpr = smem.shape[0]
    mbarrier.wait(empty, phase)
    if SCALES:
        PAIR: gl.constexpr = ks_desc.block_type.shape[1] // BOX
        RS: gl.constexpr = _scale_rows(ks_desc.block_type.shape[1])
        nheads_k = gl.num_programs(1)
        mbarrier.expect(ready, (TILE // BOX) * (desc.block_type.nbytes
                                                + ks_desc.block_type.nbytes
                                                + vs_desc.block_type.nbytes))
    else:
        mbarrier.expect(ready, (TILE // BOX) * desc.block_type.nbytes)
    for i in gl.static_range(TILE // BOX):
        key = gl.minimum(start + i * BOX, last_box)
        if BOX == TILE:
            page = gl.reduce(pages, 0, _add)
        else:
            page = gl.reduce(gl.where(box == i, pages, 0), 0, _add)
        row = page * PAGE_SIZE + key % PAGE_SIZE
        tma.async_copy_global_to_shared(desc, [row, col], ready, smem.slice(i * BOX, BOX))
        if SCALES:
            scale_at = [page * nheads_k + kv_head, (key % PAGE_SIZE) * PAIR]
            tma.async_copy_global_to_shared(ks_desc, scale_at, ready, ks_smem.slice(i * RS, 1))
            tma.async_copy_global_to_shared(vs_desc, scale_at, ready, vs_smem.slice(i * RS, 1))


@gluon.jit
def _load(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, cache_seqlens,
          block_table, num_splits, stride_btb, ks_desc, vs_desc, ks_smem, vs_smem,
          PAGE_SIZE: gl.constexpr, SCALE_RING: gl.constexpr):
    """The loader warp: the split's key tiles into the K and V rings (SCALE_RING: each tile's
    per-key scales with its K tile, ``_load_tile``'s SCALES)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    TILE: gl.constexpr = k_smem.shape[1]
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    BOXES: gl.constexpr = TILE // BOX
    split = gl.program_id(0)
    kv_head = gl.program_id(1)
    seq = gl.program_id(2)
    seqlen, lo, hi = _split_range(cache_seqlens, seq, split, num_splits, TILE)
    n_tiles = gl.maximum(hi - lo + TILE - 1, 0) // TILE
    col = kv_head * k_desc.block_type.shape[1]     # a key's row of this head (int4: 64 bytes)
    bt_row = block_table + seq.to(gl.int64) * stride_btb
    box = gl.arange(0, BOXES, gl.BlockedLayout([1], [32], [1], [0]))
    last_box = gl.maximum(seqlen - 1, 0) // BOX * BOX
    pages = _box_pages(bt_row, lo, box, last_box, BOX, PAGE_SIZE)
    for j in range(n_tiles):
        s = j % STAGES
        phase = ((j // STAGES) & 1) ^ 1      # a fresh empty barrier passes the first round
        start = lo + j * TILE
        cur = pages
        pages = _box_pages(bt_row, start + TILE, box, last_box, BOX, PAGE_SIZE)
        if SCALE_RING:
            _load_tile(k_desc, k_smem.index(s), k_ready.index(s), k_empty.index(s), phase, cur,
                       box, start, col, last_box, PAGE_SIZE, True, ks_desc, ks_smem.index(s),
                       vs_desc, vs_smem.index(s), kv_head)
        else:
            _load_tile(k_desc, k_smem.index(s), k_ready.index(s), k_empty.index(s), phase, cur,
                       box, start, col, last_box, PAGE_SIZE)
        _load_tile(v_desc, v_smem.index(s), v_ready.index(s), v_empty.index(s), phase, cur, box,
                   start, col, last_box, PAGE_SIZE)


# ----------------------------------------------------------------------------------------------
# Consumer warps
# ----------------------------------------------------------------------------------------------

@gluon.jit
def _fp8_pairs_to_f16(units, ODD: gl.constexpr):
    """uint16 units (low byte channel 2p, high byte 2p + 1 of one key) -> fp16 channel 2p (or,
    ODD, 2p + 1), two keys an instruction pair (``quant_convert._pair_units_to_f16``)."""
    # prmt selector: bytes 1 and 3 (odd channels) or 0 and 2 (even) of the two keys' units.
    SELECT: gl.constexpr = "0x3331" if ODD else "0x3320"
    return gl.inline_asm_elementwise(
        """{
        .reg .b32 t;
        .reg .b16 lo, hi;
        prmt.b32 t, $1, 0, """ + SELECT + """;
        mov.b32 {lo, hi}, t;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        }""", "=r,r", [units], dtype=gl.float16, is_pure=True, pack=2)


@gluon.jit
def _int8_pairs_to_f16(units, ODD: gl.constexpr, BIASED: gl.constexpr = False):
    """uint16 units of an int8 V tile -> fp16 channel 2p (or, ODD, 2p + 1) of two keys a
    register (``quant_convert._pair_units_to_f16``'s int8 form: xor, prmt, sub); BIASED:
    ``1152 + x`` (xor, prmt)."""
    if BIASED:
        if ODD:
            asm: gl.constexpr = INT8_PAIR_ODD_BIASED
        else:
            asm: gl.constexpr = INT8_PAIR_EVEN_BIASED
    elif ODD:
        asm: gl.constexpr = INT8_PAIR_ODD
    else:
        asm: gl.constexpr = INT8_PAIR_EVEN
    return gl.inline_asm_elementwise(asm, "=r,r", [units], dtype=gl.float16, is_pure=True,
                                     pack=2)


@gluon.jit
def _int8_to_biased_f16(bytes):
    """int8 K bytes (as uint8) -> fp16 ``1152 + x``, exactly, four a register (3 instructions)."""
    return gl.inline_asm_elementwise(INT8_QUAD_BIASED, "=r,=r,r", [bytes], dtype=gl.float16,
                                     is_pure=True, pack=4)


@gluon.constexpr_function
def _int4_asm(kind, high, odd=False):
    """The PTX of an int4 converter: K bytes (``kind`` "k") or V units (``"v"``)."""
    if kind == "k":
        return INT4_K_HIGH.value if high else INT4_K_LOW.value
    return _I4_UNIT_ASM[(bool(odd), bool(high))].value


@gluon.jit
def _int4_k_to_f16(bytes, HIGH: gl.constexpr):
    """int4 K bytes -> fp16 ``1024 + n`` of each byte's low nibble (or, HIGH, ``1024 + 16 n`` of
    its high one), exactly, four a register (the two calls' prmt are the same: ptxas keeps one)."""
    asm: gl.constexpr = _int4_asm("k", HIGH)
    return gl.inline_asm_elementwise(asm, "=r,=r,r", [bytes], dtype=gl.float16, is_pure=True,
                                     pack=4)


@gluon.jit
def _int4_v_to_f16(units, ODD: gl.constexpr, HIGH: gl.constexpr):
    """uint16 units of an int4 V tile (bytes 2u, 2u + 1 of a key) -> fp16 ``q`` of channel
    ``2u + ODD + 64 HIGH``, exactly, two keys a register (quant_convert's unit converters)."""
    asm: gl.constexpr = _int4_asm("v", HIGH, ODD)
    return gl.inline_asm_elementwise(asm, "=r,r", [units], dtype=gl.float16, is_pure=True,
                                     pack=2)


@gluon.jit
def _tile_key_slots(bt_row, start, hi, PAGE_SIZE: gl.constexpr, WKEYS: gl.constexpr):
    """Where the keys of the tile at key ``start`` sit, in the scores' column layout (warp w:
    keys ``start + WKEYS w ..``): ``(page [WARPS, WKEYS] int64, slot, ok)``, ``ok`` false from
    ``hi`` on (the block table past a sequence's pages and the slots past its end may hold
    anything: never read)."""
    SL: gl.constexpr = gl.SliceLayout(1, MMA)
    w = gl.arange(0, WARPS, gl.SliceLayout(1, SL))
    n = gl.arange(0, WKEYS, gl.SliceLayout(0, SL))
    w_start = start + w * WKEYS          # a multiple of WKEYS (splits and tiles are 128-aligned)
    keys = gl.expand_dims(w_start, 1) + gl.expand_dims(n, 0)
    ok = keys < hi
    # A warp's keys lie in one page (pages of 32 keys and more) or two (16): one block-table
    # load a page, not one a key.
    page = gl.expand_dims(gl.load(bt_row + w_start // PAGE_SIZE, mask=w_start < hi, other=0), 1)
    if PAGE_SIZE < WKEYS:
        gl.static_assert(2 * PAGE_SIZE == WKEYS, "pages of 16 keys: a warp's 32 span two")
        page2 = gl.load(bt_row + w_start // PAGE_SIZE + 1, mask=w_start + PAGE_SIZE < hi,
                        other=0)
        page = gl.where(gl.expand_dims(n, 0) < PAGE_SIZE, page, gl.expand_dims(page2, 1))
    return page.to(gl.int64), keys % PAGE_SIZE, ok


@gluon.jit
def _key_scales(KS, VS, bt_row, start, hi, stride_ksp, stride_kst, stride_vsp, stride_vst,
                PAGE_SIZE: gl.constexpr, WKEYS: gl.constexpr):
    """int8's per-key K and V scales of the tile at key ``start`` (KS, VS: this KV head's),
    float32 ``[WARPS, WKEYS]`` in the scores' column layout; 0 for keys from ``hi`` on."""
    page, slot, ok = _tile_key_slots(bt_row, start, hi, PAGE_SIZE, WKEYS)
    ks = gl.load(KS + page * stride_ksp + slot * stride_kst, mask=ok, other=0.0)
    vs = gl.load(VS + page * stride_vsp + slot * stride_vst, mask=ok, other=0.0)
    return ks.to(gl.float32), vs.to(gl.float32)


@gluon.constexpr_function
def _release_count(thread_arrive):
    """Arrivals that free a ring slot: every consumer thread's, or the partition's one."""
    return 32 * WARPS.value if thread_arrive else 1


@gluon.jit
def _release(bar, THREAD_ARRIVE: gl.constexpr):
    """The consumers are done reading a ring slot (their shared loads are issued). THREAD_ARRIVE:
    each thread arrives by itself (``cp.async.mbarrier.arrive.noinc``: with no cp.async of its
    own pending it arrives at once); else Gluon's ``mbarrier.arrive``: one elected thread,
    after a ``bar.sync`` of the 4 consumer warps (Triton's membar puts it there)."""
    if THREAD_ARRIVE:
        async_copy.mbarrier_arrive(bar, increment_count=False)
    else:
        mbarrier.arrive(bar)


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
            ks = _ring_scales(KS.index(s), WKEYS)
            vs = _ring_scales(VS.index(s), WKEYS)
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


@gluon.constexpr_function
def _units_layout(byte_layout):
    """The ring slot's NVMMA layout (bytes) read as 16-bit units: the same swizzle."""
    return gl.NVMMASharedLayout(swizzle_byte_width=byte_layout.swizzle_byte_width,
                                element_bitwidth=16, rank=2)


# int4's (scale, offset) pairs from a ring slot ([TILE, 2] float32) straight into the scores'
# column layout (``SliceLayout(1, MMA)``: warp w's keys, lane l's 2 (l % 4) + {0, 1} + 8 j, the
# other lane bits broadcast), the pair's two floats the fastest registers: a thread's two
# adjacent keys are one 16-byte load, and the split halves are that layout as they are.
PAIR_LOAD = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 1, 0], [0, 8, 0], [0, 16, 0]],
    lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]],
    warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[4, 32, 2]))
PAIR_SMEM = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                                 order=[2, 1, 0]))


PLAIN2 = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))


@gluon.constexpr_function
def _scale_rows(sbox):
    """Ring rows a box's scales take (``sbox`` float32): TMA writes shared memory at multiples
    of 128 bytes, so a box of fewer than 32 floats (int8's 16-key boxes) is followed by
    padding rows."""
    return max(1, 32 // sbox)


@gluon.constexpr_function
def _scale_slot_layout(warps, wkeys, sbox):
    """A scale ring slot (``[BOXES * _scale_rows(sbox), sbox]``) read as ``[warps, wkeys]``
    keys: plain rows, or, with padding rows, ``sbox`` keys then ``32 - sbox`` floats of
    padding."""
    rows = _scale_rows(sbox)
    if rows == 1:
        return PLAIN2
    bases = [[0, 1 << b] for b in range(wkeys.bit_length() - 1)]
    bases += [[1 << b, 0] for b in range(warps.bit_length() - 1)]
    return gl.PaddedSharedLayout([[sbox, sbox * (rows - 1)]], bases, [], [warps, wkeys])


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
def _f16_row_factors(amax):
    """bf16 q rows into fp16's range: for a row's largest magnitude ``amax``, ``(up, down)`` =
    ``(2^(13 - e), 2^(e - 13))`` with ``e = floor(log2(amax))`` (-127 for 0, clamped to
    [-100, 127]): times ``up`` the row's largest lands in [2^13, 2^14) and nothing is lost
    (``paged_decode._f16_rows``); ``down`` goes on the row's score scale."""
    e = ((amax.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = gl.minimum(gl.maximum(e, -100), 127)
    up = ((140 - e) << 23).to(gl.float32, bitcast=True)
    down = ((114 + e) << 23).to(gl.float32, bitcast=True)
    return up, down


@gluon.jit
def _warp_weights(m_i, l_i):
    """The consumer warps' row states ``m_i, l_i [WARPS, rows]`` (base 2) merged: ``(m, w, l,
    seen, lse)``: the rows' max ``m`` and sum ``l``, each warp's weight ``w [WARPS, rows]`` (0
    for a warp that saw no key), whether a row saw any key, its LSE (natural log, -inf where
    none)."""
    m = gl.reduce(m_i, 0, _max)
    m_sub = gl.where(m == float("-inf"), 0.0, m)
    w = gl.exp2(m_i - gl.expand_dims(m_sub, 0))
    l = gl.reduce(l_i * w, 0, _add)
    seen = l > 0.0
    lse = gl.where(seen, (m + gl.log2(gl.where(seen, l, 1.0))) * LN2, float("-inf"))
    return m, w, l, seen, lse


@gluon.jit
def _store_lse(Lse, lse, seq, split, kv_head, q_len, stride_lb, stride_lt, stride_lh, stride_ls,
               GROUP: gl.constexpr):
    rl = gl.arange(0, ROWS, gl.SliceLayout(0, ROW_STATE))
    gl.store(Lse + seq.to(gl.int64) * stride_lb + split * stride_ls
             + (rl // GROUP) * stride_lt + (kv_head * GROUP + rl % GROUP) * stride_lh, lse,
             mask=rl < GROUP * q_len)


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
def _softmax_step_t(sc, m_i, l_i, start, hi, last_key, qk_scale, MASKED: gl.constexpr,
                    ROW_SCALE: gl.constexpr):
    """``_softmax_step`` on swapped scores ``sc [WARPS, WKEYS, NR]`` (keys along axis 1)."""
    WKEYS: gl.constexpr = sc.shape[1]
    if ROW_SCALE:
        scale = gl.expand_dims(qk_scale, 1)
    else:
        scale = qk_scale
    if MASKED:
        w = gl.arange(0, WARPS, gl.SliceLayout(1, KEY_COL))
        n = gl.arange(0, WKEYS, gl.SliceLayout(0, KEY_COL))
        keys = gl.expand_dims(start + gl.expand_dims(w * WKEYS, 1) + gl.expand_dims(n, 0), 2)
        visible = (keys < hi) & (keys <= gl.expand_dims(gl.expand_dims(last_key, 0), 1))
        sc = gl.where(visible, sc * scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.reduce(sc, 1, _max))
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(sc - gl.expand_dims(m_sub, 1))
    else:
        m_new = gl.maximum(m_i, gl.reduce(sc, 1, _max) * qk_scale)   # qk_scale > 0
        m_sub = m_new
        p = gl.exp2(sc * scale - gl.expand_dims(m_sub, 1))
    alpha = gl.exp2(m_i - m_sub)
    l_i = l_i * alpha + gl.reduce(p, 1, _add)
    return p, m_new, l_i, alpha


@gluon.jit
def _tile_t(qt, s_init, acc_e, acc_o, m_i, l_i, acc_scale, k_smem, v_smem, ks_smem, vs_smem,
            k_ready, v_ready, k_empty, v_empty, j, start, hi, last_key, qk_scale,
            MASKED: gl.constexpr, THREAD_ARRIVE: gl.constexpr, KV_FORMAT: gl.constexpr,
            ROW_SCALE: gl.constexpr, V_BIASED: gl.constexpr):
    """``_tile`` with swapped operands (fp8, int8 with its scales by ring): ``qt [WARPS, 128,
    NR]`` (q^T), scores ``[WARPS, WKEYS, NR]``, accumulators ``acc_e, acc_o [WARPS, 64, NR]``
    (the even and the odd channels), the row state ``[WARPS, NR]``, int8's unit ``acc_scale``
    ``[WARPS]``. The same arithmetic as ``_tile``'s, transposed."""
    STAGES: gl.constexpr = k_smem.shape[0]
    TILE: gl.constexpr = k_smem.shape[1]
    WKEYS: gl.constexpr = TILE // WARPS
    s = j % STAGES
    phase = (j // STAGES) & 1
    U16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    mbarrier.wait(k_ready.index(s), phase)
    kb = k_smem.index(s).reshape([WARPS, WKEYS, HEAD_DIM]).load(KA_OP)
    if KV_FORMAT == INT8:
        layout: gl.constexpr = _scale_slot_layout(WARPS, WKEYS, ks_smem.shape[2])
        ks = ks_smem.index(s)._reinterpret(gl.float32, [WARPS, WKEYS], layout).load(KEY_COL)
        vs = vs_smem.index(s)._reinterpret(gl.float32, [WARPS, WKEYS], layout).load(KEY_COL)
    _release(k_empty.index(s), THREAD_ARRIVE)
    if KV_FORMAT == INT8:
        if MASKED:   # scales past the end: whatever the slots hold (NaN)
            w = gl.arange(0, WARPS, gl.SliceLayout(1, KEY_COL))
            n = gl.arange(0, WKEYS, gl.SliceLayout(0, KEY_COL))
            vs = gl.where(start + gl.expand_dims(w * WKEYS, 1) + gl.expand_dims(n, 0) < hi,
                          vs, 0.0)
        sc = mma_v2(_int8_to_biased_f16(kb), qt, s_init) * gl.expand_dims(ks, 2)
    else:
        kf = kb.to(gl.float8e4nv, bitcast=True).to(gl.float16)
        sc = mma_v2(kf, qt, gl.zeros([WARPS, WKEYS, NR], gl.float32, MMA))
    p, m_new, l_i, alpha = _softmax_step_t(sc, m_i, l_i, start, hi, last_key, qk_scale, MASKED,
                                           ROW_SCALE)
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
        wv = gl.arange(0, WARPS, gl.SliceLayout(1, gl.SliceLayout(1, VA_OP)))
        kv = gl.arange(0, WKEYS, gl.SliceLayout(0, gl.SliceLayout(1, VA_OP)))
        vkeys = start + gl.expand_dims(gl.expand_dims(wv * WKEYS, 1), 1) \
            + gl.expand_dims(gl.expand_dims(kv, 0), 1)
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
               KV_FORMAT: gl.constexpr, STORE_LSE: gl.constexpr, V_BIASED: gl.constexpr):
    """``_consume`` with swapped operands (``_tile_t``): q^T loaded once into the operand
    layout, the tiles, the four warps' states merged through Triton's reduce scratch, the
    output's even and odd channels stored from ``[64, NR]``."""
    TILE: gl.constexpr = k_smem.shape[1]
    WKEYS: gl.constexpr = TILE // WARPS
    gl.static_assert(GROUP <= NR, "swapped operands: at most 8 q heads a KV head")
    r = gl.arange(0, NR, gl.SliceLayout(0, gl.SliceLayout(1, QB_OP)))
    d = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, gl.SliceLayout(2, QB_OP)))
    wq = gl.arange(0, WARPS, gl.SliceLayout(1, gl.SliceLayout(2, QB_OP)))
    q_row = (r // GROUP) * stride_qt + (kv_head * GROUP + r % GROUP) * stride_qh
    q_ptrs = (Q + seq.to(gl.int64) * stride_qb
              + gl.expand_dims(gl.expand_dims(wq * 0, 1) + gl.expand_dims(d, 0), 2)
              + gl.expand_dims(gl.expand_dims(q_row, 0), 1))
    q_ok = gl.expand_dims(gl.expand_dims(wq >= 0, 1) & gl.expand_dims(d >= 0, 0), 2) \
        & gl.expand_dims(gl.expand_dims(r < GROUP * q_len, 0), 1)
    qt = gl.load(q_ptrs, mask=q_ok, other=0.0)
    ROW_SCALE: gl.constexpr = Q.dtype.element_ty == gl.bfloat16
    if ROW_SCALE:   # bf16 rows times a power of two into fp16 (``_consume``'s)
        qf = qt.to(gl.float32)
        up, down = _f16_row_factors(gl.max(gl.abs(qf), 1))       # [WARPS, NR]
        qt = (qf * gl.expand_dims(up, 1)).to(gl.float16)

    if IS_CAUSAL:
        diag = seqlen - q_len
        all_see = gl.minimum(hi, diag + 1)
    else:
        diag = seqlen
        all_see = hi
    full = lo + gl.maximum(all_see - lo, 0) // TILE * TILE
    n_full = (full - lo) // TILE
    n_tiles = gl.maximum(hi - lo + TILE - 1, 0) // TILE
    rs = gl.arange(0, NR, gl.SliceLayout(0, ROW_T))
    last_key = rs // GROUP + diag
    if KV_FORMAT == INT8:
        qk_scale = sm_scale * LOG2E
    else:
        qk_scale = sm_scale * LOG2E * gl.load(KS + kv_head * stride_ksh)
    if ROW_SCALE:
        qk_scale = qk_scale * gl.convert_layout(down, ROW_T)

    m_i = gl.full([WARPS, NR], float("-inf"), gl.float32, ROW_T)
    l_i = gl.zeros([WARPS, NR], gl.float32, ROW_T)
    acc_e = gl.zeros([WARPS, HEAD_DIM // 2, NR], gl.float32, MMA)
    acc_o = gl.zeros([WARPS, HEAD_DIM // 2, NR], gl.float32, MMA)
    acc_scale = gl.full([WARPS], 1.0, gl.float32, gl.SliceLayout(1, KEY_COL))
    s_init = gl.zeros([WARPS, WKEYS, NR], gl.float32, MMA)
    if KV_FORMAT == INT8:   # K converts to 1152 + x: the dot starts from -1152 sum(q) a row
        q_sum = gl.convert_layout(gl.sum(qt.to(gl.float32), 1), ROW_T)
        s_init = s_init + gl.expand_dims(q_sum * (-INT8_BIAS), 1)
    for j in range(0, n_full):
        acc_e, acc_o, m_i, l_i, acc_scale = _tile_t(
            qt, s_init, acc_e, acc_o, m_i, l_i, acc_scale, k_smem, v_smem, ks_smem, vs_smem,
            k_ready, v_ready, k_empty, v_empty, j, lo + j * TILE, hi, last_key, qk_scale, False,
            THREAD_ARRIVE, KV_FORMAT, ROW_SCALE, V_BIASED)
    for j in range(n_full, n_tiles):
        acc_e, acc_o, m_i, l_i, acc_scale = _tile_t(
            qt, s_init, acc_e, acc_o, m_i, l_i, acc_scale, k_smem, v_smem, ks_smem, vs_smem,
            k_ready, v_ready, k_empty, v_empty, j, lo + j * TILE, hi, last_key, qk_scale, True,
            THREAD_ARRIVE, KV_FORMAT, ROW_SCALE, V_BIASED)

    m, w, l, seen, lse = _warp_weights(m_i, l_i)                   # w [WARPS, NR]
    w3 = gl.expand_dims(w, 1)                                      # [WARPS, 1, NR]
    if KV_FORMAT == INT8:   # the accumulators back from their unit
        w3 = w3 * gl.expand_dims(gl.expand_dims(acc_scale, 1), 2)
    o_e = gl.reduce(acc_e * w3, 0, _add)                           # [64, NR]
    o_o = gl.reduce(acc_o * w3, 0, _add)
    if KV_FORMAT == INT8:
        inv = gl.where(seen, 1.0 / gl.where(seen, l, 1.0), 0.0)
    else:
        inv = gl.where(seen, gl.load(VS + kv_head * stride_vsh) / gl.where(seen, l, 1.0), 0.0)
    OUT2: gl.constexpr = gl.SliceLayout(0, MMA)
    ch = gl.arange(0, HEAD_DIM // 2, gl.SliceLayout(1, OUT2))
    ro = gl.arange(0, NR, gl.SliceLayout(0, OUT2))
    o_row = (seq.to(gl.int64) * stride_ob + split * stride_os + (ro // GROUP) * stride_ot
             + (kv_head * GROUP + ro % GROUP) * stride_oh)
    o_ptrs = Out + gl.expand_dims(o_row, 0) + gl.expand_dims(ch * 2, 1)
    o_ok = gl.expand_dims(ro < GROUP * q_len, 0)
    inv_o = gl.expand_dims(gl.convert_layout(inv, gl.SliceLayout(0, OUT2)), 0)
    OT: gl.constexpr = Out.dtype.element_ty
    gl.store(o_ptrs, (o_e * inv_o).to(OT), mask=o_ok)
    gl.store(o_ptrs + 1, (o_o * inv_o).to(OT), mask=o_ok)
    if STORE_LSE:
        rl = gl.arange(0, NR, gl.SliceLayout(0, ROW_T))
        gl.store(Lse + seq.to(gl.int64) * stride_lb + split * stride_ls
                 + (rl // GROUP) * stride_lt + (kv_head * GROUP + rl % GROUP) * stride_lh, lse,
                 mask=rl < GROUP * q_len)


# int4's (scale, offset) pairs from a ring slot straight into the swapped scores' key layout
# (``KEY_COL``: warp w's keys, lane l's l // 4 + {0, 8, 16, 24}, the lane's low two bits
# broadcast), the pair's two floats the fastest registers (one 8-byte load a key).
PAIR_LOAD_T = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 8, 0], [0, 16, 0]],
    lane_bases=[[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 2, 0], [0, 4, 0]],
    warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[4, 32, 2]))


@gluon.jit
def _ring_scale_pairs_t(slot, WKEYS: gl.constexpr):
    """``_ring_scale_pairs`` into ``KEY_COL`` (keys as the swapped dots' M)."""
    gl.static_assert(WARPS * WKEYS == 128, "PAIR_LOAD_T is the 128-key tile's")
    pairs = slot._reinterpret(gl.float32, [WARPS, WKEYS, 2], PAIR_SMEM).load(PAIR_LOAD_T)
    scale, offset = pairs.split()
    return gl.convert_layout(scale, KEY_COL), gl.convert_layout(offset, KEY_COL)


@gluon.jit
def _tile_int4_t(q_lo, q_hi, s_init, q_sum, acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i,
                 acc_scale, k_smem, v_smem, ks_smem, vs_smem, k_ready, v_ready, k_empty,
                 v_empty, j, start, hi, last_key, qk_scale, MASKED: gl.constexpr,
                 THREAD_ARRIVE: gl.constexpr, ROW_SCALE: gl.constexpr):
    """``_tile_int4`` with swapped operands: ``q_lo, q_hi [WARPS, 64, NR]`` (q^T's two
    halves), scores ``[WARPS, WKEYS, NR]``, the four nibble planes' accumulators ``[WARPS, 32,
    NR]``, ``b_i`` and the row state ``[WARPS, NR]``, the unit ``acc_scale [WARPS]``."""
    STAGES: gl.constexpr = k_smem.shape[0]
    TILE: gl.constexpr = k_smem.shape[1]
    ROW: gl.constexpr = k_smem.shape[2]
    WKEYS: gl.constexpr = TILE // WARPS
    U16: gl.constexpr = _units_layout(v_smem.layout)
    s = j % STAGES
    phase = (j // STAGES) & 1
    mbarrier.wait(k_ready.index(s), phase)
    ks, ko = _ring_scale_pairs_t(ks_smem.index(s), WKEYS)
    vs, vo = _ring_scale_pairs_t(vs_smem.index(s), WKEYS)
    kb = k_smem.index(s).reshape([WARPS, WKEYS, ROW]).load(KA_OP)
    _release(k_empty.index(s), THREAD_ARRIVE)
    if MASKED:   # pairs past the end: whatever the slots hold (NaN): out of v_max and b
        w = gl.arange(0, WARPS, gl.SliceLayout(1, KEY_COL))
        n = gl.arange(0, WKEYS, gl.SliceLayout(0, KEY_COL))
        inside = start + gl.expand_dims(w * WKEYS, 1) + gl.expand_dims(n, 0) < hi
        vs = gl.where(inside, vs, 0.0)
        vo = gl.where(inside, vo, 0.0)
    sc = mma_v2(_int4_k_to_f16(kb, True), q_hi, gl.zeros([WARPS, WKEYS, NR], gl.float32, MMA))
    sc = mma_v2(_int4_k_to_f16(kb, False), q_lo, sc * 0.0625 + gl.expand_dims(s_init, 1))
    sc = sc * gl.expand_dims(ks, 2) + gl.expand_dims(ko, 2) * gl.expand_dims(q_sum, 1)
    p, m_new, l_i, alpha = _softmax_step_t(sc, m_i, l_i, start, hi, last_key, qk_scale, MASKED,
                                           ROW_SCALE)
    v_max = gl.max(vs, 1)                                       # [WARPS]: 0 past the end
    v_max = gl.where(v_max > 0.0, v_max, 1.0)
    v_inv = gl.expand_dims(1.0 / v_max, 1)
    alpha = alpha * gl.expand_dims(gl.convert_layout(acc_scale / v_max,
                                                     gl.SliceLayout(1, ROW_T)), 1)
    b_i = b_i * alpha + gl.reduce(p * gl.expand_dims(vo * v_inv, 2), 1, _add)
    p = p * gl.expand_dims(vs * v_inv, 2)
    a3 = gl.expand_dims(alpha, 1)
    acc_scale = v_max
    p_op = gl.convert_layout(p.to(gl.float16), PB_OP)

    mbarrier.wait(v_ready.index(s), phase)
    units = v_smem.index(s)._reinterpret(gl.uint16, [TILE, ROW // 2], U16).reshape(
        [WARPS, WKEYS, ROW // 2]).permute((0, 2, 1)).load(VA_OP)
    _release(v_empty.index(s), THREAD_ARRIVE)
    # Bytes past the end need no mask: any byte is two finite q, and their p is 0.
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
                    STORE_LSE: gl.constexpr):
    """``_consume_int4_tiles`` with swapped operands (``_tile_int4_t``), q^T loaded here."""
    TILE: gl.constexpr = k_smem.shape[1]
    PLANE: gl.constexpr = HEAD_DIM // 4
    HALF: gl.constexpr = HEAD_DIM // 2
    gl.static_assert(GROUP <= NR, "swapped operands: at most 8 q heads a KV head")
    r = gl.arange(0, NR, gl.SliceLayout(0, gl.SliceLayout(1, QB_OP)))
    d = gl.arange(0, HALF, gl.SliceLayout(0, gl.SliceLayout(2, QB_OP)))
    wq = gl.arange(0, WARPS, gl.SliceLayout(1, gl.SliceLayout(2, QB_OP)))
    q_row = (r // GROUP) * stride_qt + (kv_head * GROUP + r % GROUP) * stride_qh
    q_ptrs = (Q + seq.to(gl.int64) * stride_qb
              + gl.expand_dims(gl.expand_dims(wq * 0, 1) + gl.expand_dims(d, 0), 2)
              + gl.expand_dims(gl.expand_dims(q_row, 0), 1))
    q_ok = gl.expand_dims(gl.expand_dims(wq >= 0, 1) & gl.expand_dims(d >= 0, 0), 2) \
        & gl.expand_dims(gl.expand_dims(r < GROUP * q_len, 0), 1)
    q_lo = gl.load(q_ptrs, mask=q_ok, other=0.0)
    q_hi = gl.load(q_ptrs + HALF, mask=q_ok, other=0.0)
    ROW_SCALE: gl.constexpr = Q.dtype.element_ty == gl.bfloat16
    if ROW_SCALE:   # bf16 rows times a power of two into fp16 (``_consume``'s)
        lo_f = q_lo.to(gl.float32)
        hi_f = q_hi.to(gl.float32)
        up, down = _f16_row_factors(gl.maximum(gl.max(gl.abs(lo_f), 1),
                                               gl.max(gl.abs(hi_f), 1)))   # [WARPS, NR]
        q_lo = (lo_f * gl.expand_dims(up, 1)).to(gl.float16)
        q_hi = (hi_f * gl.expand_dims(up, 1)).to(gl.float16)

    if IS_CAUSAL:
        diag = seqlen - q_len
        all_see = gl.minimum(hi, diag + 1)
    else:
        diag = seqlen
        all_see = hi
    full = lo + gl.maximum(all_see - lo, 0) // TILE * TILE
    n_full = (full - lo) // TILE
    n_tiles = gl.maximum(hi - lo + TILE - 1, 0) // TILE
    rs = gl.arange(0, NR, gl.SliceLayout(0, ROW_T))
    last_key = rs // GROUP + diag
    qk_scale = sm_scale * LOG2E
    if ROW_SCALE:
        qk_scale = qk_scale * gl.convert_layout(down, ROW_T)
    # ``_consume_int4_tiles``' start: -72 sum(q_hi) - 1032 sum(q_lo) a row
    sum_lo = gl.convert_layout(gl.sum(q_lo.to(gl.float32), 1), ROW_T)
    sum_hi = gl.convert_layout(gl.sum(q_hi.to(gl.float32), 1), ROW_T)
    s_init = sum_hi * -72.0 + sum_lo * -1032.0
    q_sum = sum_lo + sum_hi
    m_i = gl.full([WARPS, NR], float("-inf"), gl.float32, ROW_T)
    l_i = gl.zeros([WARPS, NR], gl.float32, ROW_T)
    b_i = gl.zeros([WARPS, NR], gl.float32, ROW_T)
    acc_scale = gl.full([WARPS], 1.0, gl.float32, gl.SliceLayout(1, KEY_COL))
    acc_el = gl.zeros([WARPS, PLANE, NR], gl.float32, MMA)
    acc_ol = gl.zeros([WARPS, PLANE, NR], gl.float32, MMA)
    acc_eh = gl.zeros([WARPS, PLANE, NR], gl.float32, MMA)
    acc_oh = gl.zeros([WARPS, PLANE, NR], gl.float32, MMA)
    for j in range(0, n_full):
        acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i, acc_scale = _tile_int4_t(
            q_lo, q_hi, s_init, q_sum, acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i,
            acc_scale, k_smem, v_smem, ks_smem, vs_smem, k_ready, v_ready, k_empty, v_empty, j,
            lo + j * TILE, hi, last_key, qk_scale, False, THREAD_ARRIVE, ROW_SCALE)
    for j in range(n_full, n_tiles):
        acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i, acc_scale = _tile_int4_t(
            q_lo, q_hi, s_init, q_sum, acc_el, acc_ol, acc_eh, acc_oh, b_i, m_i, l_i,
            acc_scale, k_smem, v_smem, ks_smem, vs_smem, k_ready, v_ready, k_empty, v_empty, j,
            lo + j * TILE, hi, last_key, qk_scale, True, THREAD_ARRIVE, ROW_SCALE)

    m, w, l, seen, lse = _warp_weights(m_i, l_i)                   # w [WARPS, NR]
    w_unit = w * gl.expand_dims(gl.convert_layout(acc_scale, gl.SliceLayout(1, ROW_T)), 1)
    w3 = gl.expand_dims(w_unit, 1)
    o_el = gl.reduce(acc_el * w3, 0, _add)                         # [32, NR]
    o_ol = gl.reduce(acc_ol * w3, 0, _add)
    o_eh = gl.reduce(acc_eh * w3, 0, _add)
    o_oh = gl.reduce(acc_oh * w3, 0, _add)
    b = gl.reduce(b_i * w_unit, 0, _add)                          # [NR]: sum p o
    inv = gl.where(seen, 1.0 / gl.where(seen, l, 1.0), 0.0)
    OUT2: gl.constexpr = gl.SliceLayout(0, MMA)
    pu = gl.arange(0, PLANE, gl.SliceLayout(1, OUT2))
    ro = gl.arange(0, NR, gl.SliceLayout(0, OUT2))
    o_row = (seq.to(gl.int64) * stride_ob + split * stride_os + (ro // GROUP) * stride_ot
             + (kv_head * GROUP + ro % GROUP) * stride_oh)
    o_ptrs = Out + gl.expand_dims(o_row, 0) + gl.expand_dims(pu * 2, 1)
    o_ok = gl.expand_dims(ro < GROUP * q_len, 0)
    inv_o = gl.expand_dims(gl.convert_layout(inv, gl.SliceLayout(0, OUT2)), 0)
    b_o = gl.expand_dims(gl.convert_layout(b, gl.SliceLayout(0, OUT2)), 0)
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
                     SCALE_RING: gl.constexpr, V_BIASED: gl.constexpr):
    """The consumer partition with swapped operands: ``_consume``'s arguments, ``_consume_t``'s
    work (fp8, and int8 with its scales by ring; the merge through Triton's reduce scratch)."""
    gl.static_assert(KV_FORMAT == FP8 or SCALE_RING,
                     "swapped operands: fp8, or int8 / int4 with their scales by ring")
    TILE: gl.constexpr = k_smem.shape[1]
    split = gl.program_id(0)
    kv_head = gl.program_id(1)
    seq = gl.program_id(2)
    seqlen, lo, hi = _split_range(cache_seqlens, seq, split, num_splits, TILE)
    if KV_FORMAT == INT4:
        _consume_int4_t(Q, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                        ks_smem, vs_smem, seq, split, kv_head, seqlen, lo, hi, sm_scale, q_len,
                        stride_qb, stride_qt, stride_qh, stride_ob, stride_ot, stride_oh,
                        stride_os, stride_lb, stride_lt, stride_lh, stride_ls, GROUP, IS_CAUSAL,
                        THREAD_ARRIVE, STORE_LSE)
    else:
        _consume_t(Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                   ks_smem, vs_smem, seq, split, kv_head, seqlen, lo, hi, sm_scale, q_len,
                   stride_qb, stride_qt, stride_qh, stride_ksh, stride_vsh, stride_ob,
                   stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
                   GROUP, IS_CAUSAL, THREAD_ARRIVE, KV_FORMAT, STORE_LSE, V_BIASED)


@gluon.jit
def _consume(Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
             cache_seqlens, block_table, sm_scale, q_len, num_splits, stride_qb, stride_qt,
             stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot, stride_oh, stride_os,
             stride_lb, stride_lt, stride_lh, stride_ls, stride_btb, stride_ksp, stride_kst,
             stride_vsp, stride_vst, ks_smem, vs_smem, GROUP: gl.constexpr,
             IS_CAUSAL: gl.constexpr,
             THREAD_ARRIVE: gl.constexpr, RING_MERGE: gl.constexpr, KV_FORMAT: gl.constexpr,
             PAGE_SIZE: gl.constexpr, STORE_LSE: gl.constexpr, SCALE_RING: gl.constexpr,
             V_BIASED: gl.constexpr):
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

    if IS_CAUSAL:
        diag = seqlen - q_len                       # row t sees key j <= t + diag
        all_see = gl.minimum(hi, diag + 1)
    else:
        diag = seqlen
        all_see = hi
    full = lo + gl.maximum(all_see - lo, 0) // TILE * TILE
    n_full = (full - lo) // TILE
    n_tiles = gl.maximum(hi - lo + TILE - 1, 0) // TILE
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


@gluon.jit
def _gluon_decode_kernel(
    Q, k_desc, v_desc, KS, VS, Out, Lse, cache_seqlens, block_table, sm_scale, q_len,
    num_splits, stride_qb, stride_qt, stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot,
    stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls, stride_btb,
    stride_ksp, stride_kst, stride_vsp, stride_vst,
    GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr, PAGE_SIZE: gl.constexpr,
    STAGES: gl.constexpr, THREAD_ARRIVE: gl.constexpr = True, RING_MERGE: gl.constexpr = False,
    TILE_KEYS: gl.constexpr = 0, KV_FORMAT: gl.constexpr = 1, STORE_LSE: gl.constexpr = True,
    SCALE_RING: gl.constexpr = False, V_BIASED: gl.constexpr = False,
    SWAP_AB: gl.constexpr = False,
):
    # SWAP_AB: the consumers' dots with swapped operands (``_consume_t``: fp8, int8 by ring,
    # GROUP * q_len <= 8). Out / Lse: the float32 split partials (merged by paged_combine), or, with one split, the
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
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=_release_count(THREAD_ARRIVE))
        mbarrier.init(v_empty.index(i), count=_release_count(THREAD_ARRIVE))
    # (the partitions' argument lists written twice: a tuple variable would drop constexprs)
    if SWAP_AB:
        gl.warp_specialize([
            (_consume_swapped,
             (Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, sm_scale, q_len, num_splits, stride_qb, stride_qt,
                 stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot, stride_oh, stride_os,
                 stride_lb, stride_lt, stride_lh, stride_ls, stride_btb, stride_ksp, stride_kst,
                 stride_vsp, stride_vst, ks_smem, vs_smem, GROUP, IS_CAUSAL, THREAD_ARRIVE,
                 RING_MERGE, KV_FORMAT, PAGE_SIZE, STORE_LSE, SCALE_RING,
                 V_BIASED and KV_FORMAT == INT8)),
            (_load, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, num_splits, stride_btb, KS, VS, ks_smem, vs_smem,
                 PAGE_SIZE, SCALE_RING)),
        ], [LOADER_WARPS], [LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consume, (Q, KS, VS, Out, Lse, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, sm_scale, q_len, num_splits, stride_qb, stride_qt,
                 stride_qh, stride_ksh, stride_vsh, stride_ob, stride_ot, stride_oh, stride_os,
                 stride_lb, stride_lt, stride_lh, stride_ls, stride_btb, stride_ksp, stride_kst,
                 stride_vsp, stride_vst, ks_smem, vs_smem, GROUP, IS_CAUSAL, THREAD_ARRIVE,
                 RING_MERGE, KV_FORMAT, PAGE_SIZE, STORE_LSE, SCALE_RING,
                 V_BIASED and KV_FORMAT == INT8)),
            (_load, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cache_seqlens, block_table, num_splits, stride_btb, KS, VS, ks_smem, vs_smem,
                 PAGE_SIZE, SCALE_RING)),
        ], [LOADER_WARPS], [LOADER_REGS])


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
            q, _desc(k_cache, box), _desc(v_cache, box), k_scale, v_scale, out_partial,
            lse_partial, cache_seqlens, block_table, float(softmax_scale), q_len, num_splits,
            q.stride(0), q.stride(1), q.stride(2), ksh, vsh, *out_partial.stride()[:4],
            *lse_partial.stride(), block_table.stride(0), 0, 0, 0, 0)
        self.constexprs = dict(GROUP=nheads // nheads_k, IS_CAUSAL=bool(causal),
                               PAGE_SIZE=page_size, STAGES=GLUON_PLAN_VARIANT["stages"],
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
    from .paged_combine import _combine_splits_kernel, combine_launch_shape

    batch, q_len, nheads, num_splits, head_dim = out_partial.shape
    grid, constexprs, (warps, stages) = combine_launch_shape(nheads, q_len, batch, num_splits,
                                                             head_dim)
    constexprs["STORE_LSE"] = lse is not None
    _combine_splits_kernel[grid](
        out_partial, lse_partial, out, out if lse is None else lse, num_splits, head_dim,
        *out_partial.stride()[:4], *lse_partial.stride(), q_len * nheads * head_dim,
        nheads * head_dim, head_dim, nheads * q_len, 1, q_len, **constexprs, num_warps=warps,
        num_stages=stages)


# ----------------------------------------------------------------------------------------------
# The plan's launch (kvonce.paged.decode)
# ----------------------------------------------------------------------------------------------

# The variant the plan launches: two CTAs an SM, two ring stages (32 KB each), the merge through
# the idle K ring. H200, 2026-11-29, graphs, at the plan's split counts: 1.07-1.12x the Triton
# kernel, 2-3% ahead of three stages at 64 x 8192 and even to 1% behind at 1 x 131072.
GLUON_PLAN_VARIANT = dict(stages=2, ctas_per_sm=2, ring_merge=True)
# int4: the same bytes in flight in 16 KB stages. Correct on the H200 (tests/test_gluon_decode.py,
# 2026-11-29 eighteenth session) but 9-13% slower than the Triton int4 row's default (GQA 32/8
# 64 x 8192 218.6 us against 199.2, 1 x 131072 70.6 against 61.9; MHA 12/12 324.1 / 96.5
# against 294.8 / 85.7): not routed (``GLUON_FORMATS``).
INT4_VARIANT = dict(stages=4, ctas_per_sm=2, ring_merge=False)
# int8 scales stored head-major (quantize_kv's) by TMA with each K tile (``SCALE_RING``: 623
# instructions a tile a warp against 780 with a load a key). H200, 2026-11-29 eighteenth
# session, graphs: GQA 32/8 64 x 8192 267.5 us against 273.2, MHA 12/12 390.8 against 400.1,
# 1 x 131072 even (85.7 / 117.1 against 84.9 / 117.7). Scales stored otherwise (token-major, or
# not 16-byte aligned) are read a key at a time.
INT8_SCALES_BY_TMA = True
# int8 V as ``1152 + x``, the bias off each tile's dot start (``_tile``'s V_BIASED; compiled
# for sm_90a 2026-11-29: 573 instructions a tile a warp against 623, the masked tile 662 against
# 854; not yet run on a GPU): off until tests/test_gluon_decode.py has run it.
INT8_V_BIASED = False
# The consumers' dots with swapped operands (``_consume_t``, ``_consume_int4_t``: keys as M, q
# rows as N = 8) where the packed rows fit 8, for fp8 and for int8 / int4 with their scales by
# ring (compiled for sm_90a 2026-11-29: fp8 373 instructions a tile a warp against 453, int8 504
# against 623 and, with INT8_V_BIASED, 472 against 573, int4 516 against 649 (the Triton int4
# loop: 734); 157-175 registers against ~210-230; not yet run on a GPU): off until
# tests/test_gluon_decode.py has run it. int4 is still routed only where GLUON_FORMATS has 3.
GLUON_SWAP_AB = False
# Split launches merged by their last split (an arrival count a (sequence, KV head), the
# partials read back through L2, no combine launch; commit 4f3a76e) measured 0-3% slower than the
# combine kernel (H200, graphs, 2026-11-29: fp8 GQA 32/8 1 x 131072 84.2 us against 82.5, int8
# 91.0 against 88.5, MHA 12/12 even): the merging CTA's L2 round trips outlast a launch.
# Three ring stages where the launch has at most one CTA an SM (98.7 KB a CTA) measured +1.3% in
# scripts/gluon_decode_check.py and -1.3 to -2.0% through the plan (GQA 32/8 1 x 131072 83.7 us
# against 82.0, MHA 12/12 114.5 against 113.0; H200, graphs, 2026-11-29): not taken. One split
# stores out and LSE itself (no combine, no scratch): GQA 32/8 64 x 8192 262.2 us against 269.1
# through the partials, MHA 12/12 386.4 against 389.8.
# The cache formats (QUANT_FORMATS codes) the plan may route here: fp8 e4m3 (1), int8 (2).
GLUON_FORMATS = (1, 2)
# The query dtypes: bf16 rows are scaled into fp16 once a CTA (the loop unchanged).
GLUON_QUERY_DTYPES = (torch.float16, torch.bfloat16)


def paged_fits(q, k_cache, v_cache, kv_format: int, outlier_values=None, k_scale=None,
               v_scale=None) -> bool:
    """Whether the Gluon decode runs this launch: q ``[batch, q_len, nheads, 128]`` of a dtype in
    ``GLUON_QUERY_DTYPES`` (fp16, bf16) with GQA group x q_len <= 16, a cache of a format in
    ``GLUON_FORMATS`` (fp8 e4m3: 1, int8: 2; int4: 3 compiled, not routed) of token-major
    contiguous pages (``[num_pages, page_size, nheads_k, 128]``, int4 64 bytes a row; page_size a
    multiple of 16, rows under 2^31), int4's (scale, offset) pairs stored head-major
    (``head_major_scales``; ``k_scale`` / ``v_scale`` where given), no dense-and-sparse keys
    (the caller also checks the device: sm_90). Shapes, dtypes and strides only (meta tensors
    answer too; the caches' 16-byte alignment is checked by each call)."""
    if (kv_format not in GLUON_FORMATS or outlier_values is not None
            or q.dtype not in GLUON_QUERY_DTYPES
            or q.dim() != 4 or k_cache.dim() != 4 or q.shape[3] != HEAD_DIM.value
            or q.stride(3) != 1 or k_cache.element_size() != 1):
        return False
    num_pages, page_size, nheads_k, d = k_cache.shape
    row = HEAD_DIM.value // 2 if kv_format == INT4.value else HEAD_DIM.value
    if (d != row or page_size % 16 or nheads_k == 0 or q.shape[2] % nheads_k
            or (q.shape[2] // nheads_k) * q.shape[1] > ROWS.value
            or num_pages * page_size >= 2**31):
        return False
    for t in (k_cache, v_cache):
        if (t.shape != k_cache.shape or t.stride(3) != 1 or t.stride(2) != d
                or t.stride(1) != nheads_k * d or t.stride(0) != page_size * t.stride(1)):
            return False
    if kv_format == INT4.value:
        return all(sc is None or head_major_scales(sc) for sc in (k_scale, v_scale))
    return True


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
    itself (``writes_partials``). ``arrivals`` and the outlier arguments are unused. The two
    TMA descriptors are built from each call's caches (the plan runs every layer's; a few us of
    host time), both kernels launched through ``_launch.launch`` (Triton's C launcher, no
    per-call argument binding): no allocation, no host
    sync, CUDA-graph capturable."""

    def __init__(self, q, k_cache, v_cache, block_table, *, softmax_scale: float, causal: bool,
                 num_splits: int, store_lse: bool, kv_format: int = 1):
        from .paged_combine import combine_launch_shape

        batch, q_len, nheads, head_dim = q.shape
        page_size, nheads_k = k_cache.shape[1], k_cache.shape[2]
        self.store_lse = store_lse
        self.per_key_scales = kv_format in (INT8.value, INT4.value)
        self.int4 = kv_format == INT4.value
        self.device_index = q.device.index
        self.grid = (num_splits, nheads_k, batch)
        self.box = min(box_rows(page_size), BLOCK_N.value)
        self.row = k_cache.shape[3]                     # bytes a key (int4: 64)
        self.layout = gl.NVMMASharedLayout.get_default_for([self.box, self.row], gl.uint8)
        self.scale = float(softmax_scale)
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
        # int4: 16 KB a stage (64-byte rows), four of them; its four nibble planes merge
        # through Triton's reduce scratch
        variant = INT4_VARIANT if self.int4 else GLUON_PLAN_VARIANT
        self.constexprs = dict(GROUP=nheads // nheads_k, IS_CAUSAL=bool(causal),
                               PAGE_SIZE=page_size, STAGES=variant["stages"],
                               THREAD_ARRIVE=True, RING_MERGE=variant["ring_merge"],
                               TILE_KEYS=0, KV_FORMAT=kv_format,
                               STORE_LSE=store_lse or not self.direct,
                               V_BIASED=kv_format == INT8.value and INT8_V_BIASED)
        # swapped operands (GLUON_SWAP_AB): packed rows <= 8; fp8, or int8 / int4 with their
        # scales by ring (so int8's choice waits for the call's scales: ``ring_constexprs``)
        rows = nheads // nheads_k * q_len
        self.swap = GLUON_SWAP_AB and rows <= NR.value and kv_format in (1, 2, 3)
        self.ring_constexprs = dict(self.constexprs, SCALE_RING=True, SWAP_AB=self.swap)
        self.constexprs["SWAP_AB"] = self.swap and kv_format == FP8.value
        self.key = ("gluon-decode", q.dtype, self.ints, self.tail_ints,
                    tuple(self.constexprs.values()))
        self.combine = None
        if not self.direct:
            self.combine_ints = (num_splits, head_dim, *out_strides, *lse_strides,
                                 q_len * nheads * head_dim, nheads * head_dim, head_dim,
                                 nheads * q_len, 1, q_len)
            grid, constexprs, warps = combine_launch_shape(nheads, q_len, batch, num_splits,
                                                           head_dim)
            constexprs["STORE_LSE"] = store_lse
            self.combine = (("combine", q.dtype, self.combine_ints,
                             tuple(constexprs.values())), grid, constexprs, warps)

    def _desc(self, cache):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        raw = cache.view(torch.uint8)
        return TensorDescriptor(raw, [raw.shape[0] * raw.shape[1], raw.shape[2] * raw.shape[3]],
                                [raw.stride(1), 1], [self.box, self.row], self.layout)

    def _scales_desc(self, scale):
        """Per-key scales (``head_major_scales``: int8's, int4's pairs) as ``[pages * nheads_k,
        page_size * pair]`` float32 rows, a box's a TMA box."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        pages, page_size, nheads_k = scale.shape[:3]
        pair = scale.shape[3] if scale.dim() == 4 else 1
        return TensorDescriptor(scale, [pages * nheads_k, page_size * pair],
                                [page_size * pair, 1], [1, self.box * pair],
                                scale_pair_layout())

    def __call__(self, q, k_cache, v_cache, cache_seqlens, block_table, out, lse, o_part,
                 lse_part, arrivals, k_scale, v_scale, outlier_values=None,
                 outlier_channels=None):
        from ._launch import alignment_key, launch
        from .paged_combine import _combine_splits_kernel

        if self.grid[2] == 0:
            return
        if k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16:
            raise ValueError("the Gluon decode (TMA) needs 16-byte aligned caches: "
                             f"k_cache at {k_cache.data_ptr():#x}, v_cache at "
                             f"{v_cache.data_ptr():#x}")
        # int4's scales come by TMA (SCALE_RING); int8's too where stored head-major from a
        # 16-byte aligned address and INT8_SCALES_BY_TMA, else a load a key
        ring = self.int4 or (self.per_key_scales and INT8_SCALES_BY_TMA and all(
            head_major_scales(sc) and sc.data_ptr() % 16 == 0 for sc in (k_scale, v_scale)))
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
            ks_arg, vs_arg = self._scales_desc(k_scale), self._scales_desc(v_scale)
        launch(_gluon_decode_kernel,
               (self.key, head_strides, key_strides, k_scale.dtype, aligned, ring), self.grid,
               (q, self._desc(k_cache), self._desc(v_cache), ks_arg, vs_arg, dst_o, dst_l,
                cache_seqlens, block_table, self.scale, *self.ints, *head_strides,
                *self.tail_ints, *key_strides),
               self.ring_constexprs if ring else self.constexprs, WARPS.value, 1,
               self.device_index, TWO_CTA_MAXNREG)
        if self.direct:
            return
        key, grid, constexprs, warps = self.combine
        launch(_combine_splits_kernel, key, grid,
               (o_part, lse_part, out, out if lse is None or not self.store_lse else lse,
                *self.combine_ints), constexprs, *warps, self.device_index)
