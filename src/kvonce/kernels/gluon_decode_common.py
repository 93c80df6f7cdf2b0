"""The Gluon paged decode's shared pieces (kernels/gluon_decode.py has the kernel, its contract
and the host side): the layouts and constants, the cache bytes' converters, the loader warp, the
scale rings' shared-memory layouts and the consumers' common steps (ring release, the warps'
merge weights, bf16 rows' factors, the LSE store). The consumers: gluon_decode_rows (q rows as
the dots' M) and gluon_decode_swapped (keys as M).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .gluon_prefill import _add, _max
from .quant_convert import _I4_UNIT_ASM, _INT8_BIAS, _INT8_PAIR_EVEN, _INT8_PAIR_ODD, _pair_asm

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
# high one (each nibble q + 8), with an fp16 (or float32) (scale, offset) a (token, KV head). K
# bytes -> fp16 under a 0x64 high byte (prmt), then one AND keeps the low nibble (1024 + n) or
# the high one (1024 + 16 n): 6 instructions for 8 values; the scores' dots start from the rows'
# biases (``_int4_score_inits``). V units (two bytes of a key) -> the exact q of one nibble plane
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
def _box_page(pages, box, i: gl.constexpr, ONE_BOX: gl.constexpr):
    """Box ``i``'s page id of a tile's (``pages`` over the boxes ``box``; ONE_BOX: a tile is one
    box)."""
    if ONE_BOX:
        return gl.reduce(pages, 0, _add)
    else:
        return gl.reduce(gl.where(box == i, pages, 0), 0, _add)


@gluon.constexpr_function
def _part_boxes(boxes, part, parts):
    """How many of a tile's ``boxes`` loader warp ``part`` of ``parts`` copies."""
    return len(range(part, boxes, parts))


@gluon.jit
def _load_tile(desc, smem, ready, empty, phase, pages, box, start, col, last_box,
               PAGE_SIZE: gl.constexpr, SCALES: gl.constexpr = False, ks_desc=None,
               ks_smem=None, vs_desc=None, vs_smem=None, kv_head=0, PART: gl.constexpr = 0,
               PARTS: gl.constexpr = 1, HEAD_MAJOR: gl.constexpr = False,
               HEADS: gl.constexpr = 1):
    """The tile at key ``start`` of K (or V) into the ring slot ``smem`` once ``empty`` passes
    ``phase``, box by box, on ``ready`` (expect + the boxes' bytes). SCALES (a K tile of a
    ``SCALE_RING`` launch): the tile's K and V scales too, on the same barrier (int4's (scale,
    offset) pairs, ``PAIR`` 2; int8's scales, 1): each box's are one row of the scales'
    head-major storage (``[pages * nheads_k, page_size * PAIR]`` float32: a page's of one KV head
    are adjacent), into ``ks_smem`` / ``vs_smem`` ``[TILE / BOX, BOX * PAIR]``. ``PART`` of
    ``PARTS`` loader warps: the boxes ``i % PARTS == PART`` (``ready`` counts ``PARTS``
    arrivals, each warp's expect of its own bytes). HEAD_MAJOR: pages stored ``[num_pages,
    nheads_k, page_size, row]`` (the descriptor's rows: ``(page * nheads_k + kv_head) *
    page_size + slot``, ``col`` 0), else token-major (``page * page_size + slot``). HEADS: the
    CTA's KV heads (``kv_head`` its group ``kv_head * HEADS ..``), head-major pages only: a box
    is a whole page of the group's heads (their rows adjacent there), a scale box the group's
    row of the scales viewed ``[pages * nheads_k / HEADS, HEADS * page_size * PAIR]``."""
    BOX: gl.constexpr = desc.block_type.shape[0]          # tile rows: HEADS x a head's keys
    BOX_KEYS: gl.constexpr = BOX // HEADS
    TILE: gl.constexpr = smem.shape[0]
    MINE: gl.constexpr = _part_boxes(TILE // BOX, PART, PARTS)
    gl.static_assert(HEADS == 1 or (HEAD_MAJOR and BOX_KEYS == PAGE_SIZE),
                     "KV head groups: head-major pages, a box a whole page of the group")
    groups = gl.num_programs(1)                           # nheads_k / HEADS
    mbarrier.wait(empty, phase)
    if SCALES:
        SBOX: gl.constexpr = ks_desc.block_type.shape[1]    # 32-bit units a box's keys take
        RS: gl.constexpr = _scale_rows(SBOX)
        mbarrier.expect(ready, MINE * (desc.block_type.nbytes + ks_desc.block_type.nbytes
                                       + vs_desc.block_type.nbytes))
    else:
        mbarrier.expect(ready, MINE * desc.block_type.nbytes)
    for i in gl.static_range(PART, TILE // BOX, PARTS):
        key = gl.minimum(start + i * BOX_KEYS, last_box)
        page = _box_page(pages, box, i, BOX == TILE)
        if HEAD_MAJOR:
            row = ((page * groups + kv_head) * HEADS) * PAGE_SIZE + key % PAGE_SIZE
        else:
            row = page * PAGE_SIZE + key % PAGE_SIZE
        tma.async_copy_global_to_shared(desc, [row, col], ready, smem.slice(i * BOX, BOX))
        if SCALES:
            scale_at = [page * groups + kv_head, (key % PAGE_SIZE) * SBOX // BOX]
            tma.async_copy_global_to_shared(ks_desc, scale_at, ready, ks_smem.slice(i * RS, 1))
            tma.async_copy_global_to_shared(vs_desc, scale_at, ready, vs_smem.slice(i * RS, 1))


@gluon.jit
def _load_tile_cp(raw, smem, ready, empty, phase, pages, box, start, kv_head, last_box,
                  PAGE_SIZE: gl.constexpr, BOX: gl.constexpr, PART: gl.constexpr,
                  PARTS: gl.constexpr, HEAD_MAJOR: gl.constexpr):
    """``_load_tile`` by cp.async: this loader warp's boxes of the tile at key ``start`` from
    the cache's bytes ``raw`` (16 bytes a thread an instruction), then each thread's arrival on
    ``ready`` once its copies land (``cp.async.mbarrier.arrive.noinc``: ``ready`` counts 32
    arrivals a loader warp)."""
    TILE: gl.constexpr = smem.shape[0]
    ROW: gl.constexpr = smem.shape[1]
    CP: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // ROW, ROW // 16], [1, 1], [1, 0])
    nheads_k = gl.num_programs(1)
    r = gl.arange(0, BOX, gl.SliceLayout(1, CP))
    c = gl.arange(0, ROW, gl.SliceLayout(0, CP))
    if HEAD_MAJOR:   # a box's rows back to back
        offs = gl.expand_dims(r * ROW, 1) + gl.expand_dims(c, 0)
    else:            # a key's rows of every head apart
        offs = gl.expand_dims(r * (nheads_k * ROW), 1) + gl.expand_dims(c, 0)
    mbarrier.wait(empty, phase)
    for i in gl.static_range(PART, TILE // BOX, PARTS):
        key = gl.minimum(start + i * BOX, last_box)
        page = _box_page(pages, box, i, BOX == TILE)
        if HEAD_MAJOR:
            first = ((page.to(gl.int64) * nheads_k + kv_head) * PAGE_SIZE + key % PAGE_SIZE) * ROW
        else:
            first = ((page.to(gl.int64) * PAGE_SIZE + key % PAGE_SIZE) * nheads_k + kv_head) * ROW
        # 16-byte runs from 16-byte aligned addresses (the host checks the caches' alignment)
        ptrs = gl.max_contiguous(gl.multiple_of(raw + first + offs, [1, 16]), [1, 16])
        async_copy.async_copy_global_to_shared(smem.slice(i * BOX, BOX), ptrs)
    async_copy.mbarrier_arrive(ready, increment_count=False)


# The roofline probe (``PROBE``, a measurement, never the plan's: ``gluon_decode.ROOFLINE_PROBE``,
# scripts/quant_decode_probe.py): 1, memory only: the consumers wait for each tile's slots and
# free them, reading nothing (the launch runs at the loader's and the memory's pace); 2, math
# only: the loader copies the ring's first round of tiles and then passes each slot on without a
# copy (the consumers run at their own pace on the ring's stale tiles); 3, no scales: the kernel
# with the loader copying no per-key scales (int8 / int4 by ring: the consumers read the scale
# ring's stale bytes), what the scales' traffic costs; 4, memory only without the scales.
# Outputs are garbage.
PROBE_MEMORY = gl.constexpr(1)
PROBE_MATH = gl.constexpr(2)
PROBE_NO_SCALES = gl.constexpr(3)
PROBE_MEMORY_NO_SCALES = gl.constexpr(4)


@gluon.constexpr_function
def probe_drains(probe):
    """Whether the roofline probe ``probe``'s consumers only free the slots (memory only)."""
    return probe == 1 or probe == 4


@gluon.jit
def _pass_slot(ready, empty, phase):
    """The math-only probe's loader: a freed slot handed back as filled, no bytes copied."""
    mbarrier.wait(empty, phase)
    mbarrier.arrive(ready)


@gluon.jit
def _drain(k_ready, v_ready, k_empty, v_empty, n_tiles, THREAD_ARRIVE: gl.constexpr):
    """The memory-only probe's consumers: each tile's K and V slots waited for and freed."""
    STAGES: gl.constexpr = k_ready.shape[0]
    for j in range(n_tiles):
        s = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(k_ready.index(s), phase)
        _release(k_empty.index(s), THREAD_ARRIVE)
        mbarrier.wait(v_ready.index(s), phase)
        _release(v_empty.index(s), THREAD_ARRIVE)


@gluon.jit
def _load(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, cache_seqlens,
          block_table, num_splits, stride_btb, ks_desc, vs_desc, ks_smem, vs_smem,
          PAGE_SIZE: gl.constexpr, SCALE_RING: gl.constexpr, PROBE: gl.constexpr = 0,
          PART: gl.constexpr = 0, PARTS: gl.constexpr = 1, HEAD_MAJOR: gl.constexpr = False,
          HEADS: gl.constexpr = 1, CP_ASYNC: gl.constexpr = False, k_raw=None, v_raw=None):
    """A loader warp: the split's key tiles into the K and V rings (SCALE_RING: each tile's
    per-key scales with its K tile, ``_load_tile``'s SCALES); with ``PARTS`` loader warps, this
    one's share of every tile's boxes (``PART``). HEADS: the CTA's group of KV heads, a tile
    ``TILE / HEADS`` keys of each (``_load_tile``)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    TILE: gl.constexpr = k_smem.shape[1]
    TKEYS: gl.constexpr = TILE // HEADS                   # a tile's keys (of each head)
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    BOX_KEYS: gl.constexpr = BOX // HEADS
    BOXES: gl.constexpr = TILE // BOX
    split = gl.program_id(0)
    kv_head = gl.program_id(1)                            # with HEADS > 1: the group
    seq = gl.program_id(2)
    seqlen, lo, hi = _split_range(cache_seqlens, seq, split, num_splits, TKEYS)
    n_tiles = gl.maximum(hi - lo + TKEYS - 1, 0) // TKEYS
    if HEAD_MAJOR:   # a page's keys of one head are the descriptor's rows
        col = 0
    else:            # a key's row of this head (int4: 64 bytes) within the token's
        col = kv_head * k_desc.block_type.shape[1]
    bt_row = block_table + seq.to(gl.int64) * stride_btb
    box = gl.arange(0, BOXES, gl.BlockedLayout([1], [32], [1], [0]))
    last_box = gl.maximum(seqlen - 1, 0) // BOX_KEYS * BOX_KEYS
    pages = _box_pages(bt_row, lo, box, last_box, BOX_KEYS, PAGE_SIZE)
    for j in range(n_tiles):
        s = j % STAGES
        phase = ((j // STAGES) & 1) ^ 1      # a fresh empty barrier passes the first round
        start = lo + j * TKEYS
        cur = pages
        pages = _box_pages(bt_row, start + TKEYS, box, last_box, BOX_KEYS, PAGE_SIZE)
        copy = True
        if PROBE == PROBE_MATH:
            copy = j < STAGES
        if copy and CP_ASYNC:
            gl.static_assert(not SCALE_RING and HEADS == 1, "cp.async loads: fp8, one head")
            _load_tile_cp(k_raw, k_smem.index(s), k_ready.index(s), k_empty.index(s), phase, cur,
                          box, start, kv_head, last_box, PAGE_SIZE, BOX, PART, PARTS, HEAD_MAJOR)
            _load_tile_cp(v_raw, v_smem.index(s), v_ready.index(s), v_empty.index(s), phase, cur,
                          box, start, kv_head, last_box, PAGE_SIZE, BOX, PART, PARTS, HEAD_MAJOR)
        elif copy:
            if SCALE_RING and PROBE != PROBE_NO_SCALES and PROBE != PROBE_MEMORY_NO_SCALES:
                _load_tile(k_desc, k_smem.index(s), k_ready.index(s), k_empty.index(s), phase,
                           cur, box, start, col, last_box, PAGE_SIZE, True, ks_desc,
                           ks_smem.index(s), vs_desc, vs_smem.index(s), kv_head, PART, PARTS,
                           HEAD_MAJOR, HEADS)
            else:
                _load_tile(k_desc, k_smem.index(s), k_ready.index(s), k_empty.index(s), phase,
                           cur, box, start, col, last_box, PAGE_SIZE, kv_head=kv_head,
                           PART=PART, PARTS=PARTS, HEAD_MAJOR=HEAD_MAJOR, HEADS=HEADS)
            _load_tile(v_desc, v_smem.index(s), v_ready.index(s), v_empty.index(s), phase, cur,
                       box, start, col, last_box, PAGE_SIZE, kv_head=kv_head, PART=PART,
                       PARTS=PARTS, HEAD_MAJOR=HEAD_MAJOR, HEADS=HEADS)
        else:
            _pass_slot(k_ready.index(s), k_empty.index(s), phase)
            _pass_slot(v_ready.index(s), v_empty.index(s), phase)


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
def _int4_v_to_f16(units, ODD: gl.constexpr, HIGH: gl.constexpr, BIASED: gl.constexpr = False):
    """uint16 units of an int4 V tile (bytes 2u, 2u + 1 of a key) -> fp16 ``q`` of channel
    ``2u + ODD + 64 HIGH``, exactly, two keys a register (quant_convert's unit converters).
    BIASED: ``1024 + n`` (``1024 + 16 n`` HIGH) of the stored nibble ``n = q + 8``, the
    converters' lop3 without their subtract / fma (``INT4_V_BIAS``)."""
    if BIASED:
        asm: gl.constexpr = _int4_v_biased_asm(ODD, HIGH)
    else:
        asm: gl.constexpr = _int4_asm("v", HIGH, ODD)
    return gl.inline_asm_elementwise(asm, "=r,r", [units], dtype=gl.float16, is_pure=True,
                                     pack=2)


# int4 V biased (``V_BIASED`` on int4): a plane's dot takes ``1024 + n`` (low nibbles: ``q +
# 1032``) or ``1024 + 16 n`` (high: ``16 q + 1152``) and starts from minus that bias times each
# row's sum of the fp16 probabilities (as the dot takes them); the high planes' sums are 16
# times the value, scaled once at the end.
INT4_V_BIAS = gl.constexpr((1032.0, 1152.0))


@gluon.constexpr_function
def _int4_v_biased_asm(odd, high):
    """PTX of a biased int4 V converter: the nibble under fp16 1024's exponent, one lop3 (the
    odd byte shifted down 8 first)."""
    src = "s" if odd else "$1"
    shift = "shr.b32 s, $1, 8;" if odd else ""
    mask = "0x00F000F0" if high else "0x000F000F"
    return f"""{{
    .reg .b32 s;
    {shift}
    lop3.b32 $0, {src}, {mask}, 0x64006400, 0xEA;
    }}"""


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


@gluon.constexpr_function
def _units_layout(byte_layout):
    """The ring slot's NVMMA layout (bytes) read as 16-bit units: the same swizzle."""
    return gl.NVMMASharedLayout(swizzle_byte_width=byte_layout.swizzle_byte_width,
                                element_bitwidth=16, rank=2)
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
def ring_units(slot_rows, sbox):
    """32-bit units a scale ring slot (``[slot_rows, sbox]``, ``_scale_rows`` padded) holds:
    a tile's keys times 1 (int8's float32 scales, int4's fp16 pairs), 2 (int4's float32 pairs)
    or 1/2 (int8's fp16 scales, two keys a unit)."""
    return slot_rows // max(1, 32 // sbox) * sbox


@gluon.constexpr_function
def packed_pairs(slot_rows, sbox, tile):
    """Whether an int4 scale ring slot holds one unit a key, an fp16 (scale, offset) pair,
    rather than two (a float32 pair)."""
    return ring_units(slot_rows, sbox) == tile


# int8's fp16 scales two keys a unit, for the row-major consumers' key columns
# (``SliceLayout(1, MMA)`` of ``[WARPS, 32]``: lane l's keys 2 (l % 4) + {0, 1} + 8 j): unit u =
# keys 2u, 2u + 1, so thread l takes units l % 4 + 4 j and the unpacked pairs land on its own
# keys. ``UNIT_COLS``: those units ``[WARPS, 16]``; ``UNIT_BOXES``: the same registers read as
# a page-16 slot's boxes ``[8, 8]`` (box b: warp b // 2's units 8 (b % 2) ..).
UNIT_COLS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 4], [0, 8]], lane_bases=[[0, 1], [0, 2], [0, 0], [0, 0], [0, 0]],
    warp_bases=[[1, 0], [2, 0]], block_bases=[], shape=[4, 16]))
UNIT_BOXES = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 4], [1, 0]], lane_bases=[[0, 1], [0, 2], [0, 0], [0, 0], [0, 0]],
    warp_bases=[[2, 0], [4, 0]], block_bases=[], shape=[8, 8]))


@gluon.jit
def _ring_key_scales(slot, WKEYS: gl.constexpr, TILE: gl.constexpr, LAYOUT: gl.constexpr,
                     KEY_PAIRS: gl.constexpr = False):
    """int8's per-key scales of a ring slot -> float32 ``[WARPS, WKEYS]`` in ``LAYOUT`` (warp
    w: keys ``WKEYS w ..`` of the tile): float32 scales a unit a key, or fp16 scales two keys a
    unit (``ring_units`` half the tile), unpacked. KEY_PAIRS: ``LAYOUT`` holds adjacent key
    pairs as the row-major consumers' columns do (the units read as ``UNIT_COLS``, no layout
    conversion); else the pairs are moved into ``LAYOUT``."""
    SBOX: gl.constexpr = slot.shape[1]
    if ring_units(slot.shape[0], SBOX) * 2 == TILE:
        HK: gl.constexpr = WKEYS // 2
        if KEY_PAIRS:
            gl.static_assert(WARPS * HK == 64, "UNIT_COLS: 128-key tiles")
            LOAD: gl.constexpr = UNIT_COLS
        else:
            LOAD: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [WARPS, 1], [1, 0])
        if _scale_rows(SBOX) == 4:
            # page 16: each box's 8 units head a 128-byte row (a padding of 24 after every 8
            # is no PaddedSharedLayout: powers of two only): the rows' heads, box by box
            gl.static_assert(SBOX == 8 and TILE == 128, "UNIT_BOXES: 8 boxes of 8 units")
            BOXES: gl.constexpr = slot.shape[0] // 4
            heads = slot._reinterpret(gl.float32, [BOXES, 32], PLAIN2).slice(0, SBOX, 1)
            units = gl.convert_layout(heads.load(UNIT_BOXES).reshape([WARPS, HK]), LOAD)
        else:
            layout: gl.constexpr = _scale_slot_layout(WARPS, HK, SBOX)
            units = slot._reinterpret(gl.float32, [WARPS, HK], layout).load(LOAD)
        even, odd = _unpack_f16_pairs(units)
        return gl.convert_layout(gl.join(even, odd).reshape([WARPS, WKEYS]), LAYOUT)
    else:
        layout: gl.constexpr = _scale_slot_layout(WARPS, WKEYS, SBOX)
        return slot._reinterpret(gl.float32, [WARPS, WKEYS], layout).load(LAYOUT)


@gluon.jit
def _unpack_f16_pairs(units):
    """32-bit units holding fp16 (scale, offset) pairs (scale the low half) -> two float32
    tensors of ``units``' shape and layout."""
    bits = units.to(gl.uint32, bitcast=True)
    scale = (bits & 0xFFFF).to(gl.uint16).to(gl.float16, bitcast=True).to(gl.float32)
    offset = (bits >> 16).to(gl.uint16).to(gl.float16, bitcast=True).to(gl.float32)
    return scale, offset


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
def _tile_counts(seqlen, lo, hi, q_len, IS_CAUSAL: gl.constexpr, TILE: gl.constexpr):
    """A split's keys ``[lo, hi)`` as tiles: ``(diag, n_full, n_tiles)``, row ``t`` seeing key
    ``j <= t + diag`` (causal: bottom-right; else every key), the first ``n_full`` tiles wholly
    visible to every row (the unmasked loop), ``n_tiles`` in all."""
    if IS_CAUSAL:
        diag = seqlen - q_len                       # row t sees key j <= t + diag
        all_see = gl.minimum(hi, diag + 1)
    else:
        diag = seqlen
        all_see = hi
    full = lo + gl.maximum(all_see - lo, 0) // TILE * TILE
    n_full = (full - lo) // TILE
    n_tiles = gl.maximum(hi - lo + TILE - 1, 0) // TILE
    return diag, n_full, n_tiles


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
