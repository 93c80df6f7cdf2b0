"""Warp-specialized Hopper (sm90) varlen paged prefill in Gluon: ``_paged_prefill_kernel``'s
contract (kernels/paged_prefill.py) for plain fp16/bf16 caches, with K/V brought by TMA, page by
page, by a loader warp.

Rows are packed as in the Triton kernel: a work item (M tile, KV head) holds ``BLOCK_Q = BLOCK_M
// GROUP`` consecutive tokens of one sequence times the ``GROUP`` q heads of the KV head (row
``r`` -> token ``tok0 + r // GROUP``, head ``kv_head * GROUP + r % GROUP``), so each K/V tile is
read once for the whole group; the item order and the sequence search are the Triton kernel's.
A CTA runs one item, or (persistent) walks items ``p, p + G, ..`` with its ring running on
across them. Two partitions:

- ``_load`` (1 warp): key tile ``j`` (``BLOCK_N`` keys) of an item into ring slot ``j % STAGES``
  as ``BLOCK_N // BOX`` TMA boxes of ``BOX = min(PAGE_SIZE, BLOCK_N)`` rows each, from the caches
  viewed as ``[num_pages * PAGE_SIZE, nheads_k * D]``: Hopper's TMA cannot gather rows, but a box
  never crosses a page, so one block-table lookup per box places it (a warp-uniform scalar
  load, ``SCALAR_PAGES``; or a tile-ahead vector of the tile's page ids). K on ``k_ready[s]``,
  V on ``v_ready[s]``; a K (V) slot is refilled once ``k_empty[s]`` (``v_empty[s]``) says both
  consumer warpgroups are done with it.
- ``_consume`` (two partitions of one warpgroup, 64 rows each): an item's Q (packed rows
  gathered by pointers into registers under the previous item's last P V, then stored to shared
  memory), then per tile S = Q Kᵀ (SS wgmma), the online
  softmax in base 2 (the causal / sequence-end mask only on tiles past ``full``, the keys every
  row sees), O += P V (RS wgmma: P stays in registers), with FA3's intra-warpgroup overlap (tile
  j's Q Kᵀ issued before tile j - 1's P V). Each warpgroup frees a slot by its own arrive: as
  separate partitions they run out of step, so one's softmax meets the other's wgmmas (one
  8-warp partition, whose arrive is a bar.sync of both warpgroups first, measured 15-25% slower;
  docs/notes.md).

Keys past the sequence's end in its last page (and boxes past it, which re-read the sequence's
last box: the block table past a sequence's pages is never read) hold whatever the page holds
there: their scores are masked, and the consumers zero those V rows in shared memory before P V,
since 0 * NaN would be NaN. Rows past a sequence's tokens are computed and never stored.
Softmax in base 2 (log2(e) folded into the scale), natural-log LSE outside; a row that sees no
key stores out 0 and lse -inf.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ._launch import alignment_key, launch
from .configs import device_info

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)
BLOCK_M = gl.constexpr(128)          # packed rows per CTA: two consumer warpgroups of 64
ROWS = gl.constexpr(64)              # a consumer warpgroup's rows
# Partitions: the default one is consumer warpgroup 0 (4 warps, the launch's num_warps; Triton
# gives it 256 registers), then consumer warpgroup 1 and the loader warp; 64K registers in all.
CONSUMER_WARPS = gl.constexpr(4)
CONSUMER_REGS = gl.constexpr(232)
LOADER_WARPS = gl.constexpr(1)
LOADER_REGS = gl.constexpr(24)


@gluon.constexpr_function
def mma_layout(n):
    """wgmma accumulator ``[ROWS, n]`` of a consumer warpgroup."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                     instr_shape=[16, n, 16])


@gluon.constexpr_function
def rows_layout(head_dim):
    """Coalesced ``[ROWS, head_dim]`` layout of a warpgroup for the Q load, the O store and the
    V zeroing: 16-byte vectors."""
    cols = head_dim // 8
    return gl.BlockedLayout([1, 8], [32 // cols, cols], [4, 1], [1, 0])


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _max(a, b):
    return gl.maximum(a, b)


@gluon.jit
def _find_sequence(cu_seqlens_q, tile, batch, BLOCK_Q: gl.constexpr):
    """The last ``b`` with ``cu_seqlens_q[b] // BLOCK_Q + b <= tile`` (binary search)."""
    lo = tile * 0            # int32 scalars (batch == 1 would be specialized to a constant)
    hi = lo + batch
    while lo < hi:
        mid = (lo + hi) // 2
        if gl.load(cu_seqlens_q + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@gluon.jit
def _tile(item, cu_seqlens_q, cache_seqlens, batch, num_tiles, BLOCK_Q: gl.constexpr,
          BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, LAST_FIRST: gl.constexpr):
    """Work item ``item`` (``kv_head * num_tiles + t``: the Triton kernel's grid order, M tiles
    of one KV head back to back) as its KV head, sequence, first token and key ranges (as
    ``_paged_prefill_kernel``): keys ``[0, full)`` are seen by every row of the tile, ``[full,
    hi)`` need the mask. ``num_tiles``: M tiles per KV head (an argument: the Gluon kernels here
    call only builtins and their own functions, so that they also compile in a process running
    Triton's interpreter)."""
    kv_head = item // num_tiles
    if LAST_FIRST:
        tile = num_tiles - 1 - item % num_tiles
    else:
        tile = item % num_tiles
    seq = _find_sequence(cu_seqlens_q, tile, batch, BLOCK_Q)
    q_start = gl.load(cu_seqlens_q + seq)
    q_len = gl.load(cu_seqlens_q + seq + 1) - q_start
    tok0 = (tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    seqlen = gl.load(cache_seqlens + seq)
    if IS_CAUSAL:
        diag = seqlen - q_len                      # row t sees key j <= t + diag
        last_tok = gl.minimum(tok0 + BLOCK_Q, q_len) - 1
        hi = gl.maximum(gl.minimum(seqlen, diag + last_tok + 1), 0)
        all_see = gl.minimum(hi, diag + tok0 + 1)
    else:
        diag = seqlen
        hi = seqlen
        all_see = seqlen
    full = gl.maximum(all_see, 0) // BLOCK_N * BLOCK_N
    return kv_head, seq, q_start, q_len, tok0, seqlen, diag, hi, full


@gluon.jit
def _load(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
          cu_seqlens_q, cache_seqlens, block_table, stride_btb, page_shift, batch, num_tiles,
          num_items, num_programs, PAGE_SIZE: gl.constexpr, BLOCK_Q: gl.constexpr,
          BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr,
          LAST_FIRST: gl.constexpr, SCALAR_PAGES: gl.constexpr, TILE_LOOKUP: gl.constexpr,
          KV_PAIRED: gl.constexpr = False, LOADER_PAD: gl.constexpr = 0,
          PAD_CHAINS: gl.constexpr = 1):
    """The loader warp: every key tile of the CTA's work items, box by box, into the K and V
    rings (``it`` counts the CTA's tiles across items, as the consumers do)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    # The page of each box of a tile, looked up one tile ahead (one vector load a tile: the
    # TMA issues of a tile never wait on a block-table load of their own).
    BOXES: gl.constexpr = BLOCK_N // BOX
    box = gl.arange(0, BOXES, gl.BlockedLayout([1], [32], [1], [0]))
    it = 0
    pad = gl.program_id(0) + 1
    pad_b = pad + 1
    pad_c = pad + 2
    pad_d = pad + 3
    lanes = gl.arange(0, 32, gl.BlockedLayout([1], [32], [1], [0])) + pad
    for item in range(gl.program_id(0), num_items, num_programs):
        kv_head, seq, q_start, q_len, tok0, seqlen, diag, hi, full = _tile(
            item, cu_seqlens_q, cache_seqlens, batch, num_tiles, BLOCK_Q, BLOCK_N, IS_CAUSAL,
            LAST_FIRST)
        n_tiles = gl.where(tok0 < q_len, (hi + BLOCK_N - 1) // BLOCK_N, 0)
        col = kv_head * HEAD_DIM
        if len(v_desc.block_type.shape) == 3:   # V by pages: the descriptor's 64-column chunks
            vcol = kv_head * (HEAD_DIM // 64)
        else:
            vcol = col
        bt_row = block_table + seq.to(gl.int64) * stride_btb
        last_box = gl.maximum(seqlen - 1, 0) // BOX * BOX   # boxes past the end re-read this one
        # k_empty[s] / v_empty[s] (count 2): both consumer warpgroups' Q Kᵀ (P V) on the slot
        # has retired; parity ((it // STAGES) & 1) ^ 1: a fresh barrier passes the first round.
        # K and V slots free apart: K of tile j + STAGES can come while V of tile j is still
        # being read. k_ready[s], v_ready[s] (count 1): expect + the bytes.
        if KV_PAIRED:
            for j in range(n_tiles):
                s = (it + j) % STAGES
                phase = (((it + j) // STAGES) & 1) ^ 1
                _load_kv_tile_by_ids(k_desc, v_desc, k_smem.index(s), v_smem.index(s),
                                     k_ready.index(s), v_ready.index(s), k_empty.index(s),
                                     v_empty.index(s), phase, bt_row, j, col, vcol, last_box,
                                     BLOCK_N, PAGE_SIZE)
                if LOADER_PAD > 0:   # the probe PROBE_LOADER_PAD
                    if PAD_CHAINS == 32:   # a lane a chain: vector instructions, not uniform
                        lanes = _loader_pad(lanes ^ (j + 1), LOADER_PAD)
                    elif PAD_CHAINS == 4:   # the same count as four independent chains
                        pad = _loader_pad(pad ^ (j + 1), LOADER_PAD // 4)
                        pad_b = _loader_pad(pad_b ^ (j + 1), LOADER_PAD // 4)
                        pad_c = _loader_pad(pad_c ^ (j + 1), LOADER_PAD // 4)
                        pad_d = _loader_pad(pad_d ^ (j + 1), LOADER_PAD // 4)
                    else:
                        pad = _loader_pad(pad ^ (j + 1), LOADER_PAD)
        elif SCALAR_PAGES:
            for j in range(n_tiles):
                s = (it + j) % STAGES
                phase = (((it + j) // STAGES) & 1) ^ 1
                _load_tile_by_ids(k_desc, k_smem.index(s), k_ready.index(s), k_empty.index(s),
                                  phase, bt_row, j, col, last_box, page_shift, BLOCK_N,
                                  PAGE_SIZE, TILE_LOOKUP)
                _load_tile_by_ids(v_desc, v_smem.index(s), v_ready.index(s), v_empty.index(s),
                                  phase, bt_row, j, vcol, last_box, page_shift, BLOCK_N,
                                  PAGE_SIZE, TILE_LOOKUP)
        else:
            pages = _box_pages(bt_row, 0, box, last_box, BLOCK_N, BOX, PAGE_SIZE)
            for j in range(n_tiles):
                s = (it + j) % STAGES
                cur = pages
                pages = _box_pages(bt_row, j + 1, box, last_box, BLOCK_N, BOX, PAGE_SIZE)
                phase = (((it + j) // STAGES) & 1) ^ 1
                _load_tile(k_desc, k_smem.index(s), k_ready.index(s), k_empty.index(s), phase, cur,
                           box, j, col, last_box, BLOCK_N, PAGE_SIZE)
                _load_tile(v_desc, v_smem.index(s), v_ready.index(s), v_empty.index(s), phase, cur,
                           box, j, vcol, last_box, BLOCK_N, PAGE_SIZE)
        it += n_tiles
    if LOADER_PAD > 0:   # xorshift keeps a nonzero value nonzero: never stores
        if (pad == 0) | (pad_b == 0) | (pad_c == 0) | (pad_d == 0):
            gl.store(cache_seqlens, pad)
        gl.store(cache_seqlens + lanes * 0, lanes, mask=lanes == 0)


@gluon.jit
def _loader_pad(x, ROUNDS: gl.constexpr):
    """``ROUNDS`` xorshift32 rounds of ``x`` (~6 dependent integer instructions each, none
    foldable): the probe ``PROBE_LOADER_PAD``'s extra loader instructions."""
    for _ in gl.static_range(ROUNDS):
        x ^= x << 13
        x ^= (x.to(gl.uint32) >> 17).to(gl.int32)
        x ^= x << 5
    return x


@gluon.jit
def _load_tile(desc, smem, ready, empty, phase, pages, box, j, col, last_box,
               BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Tile ``j`` of K (or V) into the ring slot ``smem`` once ``empty`` passes ``phase``, box by
    box, on ``ready`` (expect + the boxes' bytes)."""
    BOX: gl.constexpr = _box_rows(desc.block_type.shape)
    mbarrier.wait(empty, phase)
    mbarrier.expect(ready, (BLOCK_N // BOX) * desc.block_type.nbytes)
    for i in gl.static_range(BLOCK_N // BOX):
        row = _box_row(pages, box, i, j, last_box, BLOCK_N, BOX, PAGE_SIZE)
        _copy_box(desc, row, col, ready, smem, i)


@gluon.jit
def _load_tile_by_ids(desc, smem, ready, empty, phase, bt_row, j, col, last_box, page_shift,
                      BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr,
                      TILE_LOOKUP: gl.constexpr = False):
    """``_load_tile`` with each box's page id a warp-uniform scalar load (an L1 hit but for
    a page table line's first touch) instead of a lane's entry of a tile-ahead vector taken
    out by shuffles. ``TILE_LOOKUP`` (a probe, ``PROBE_TILE_LOOKUP``): 1, one lookup a tile,
    the tile's pages taken as consecutive; 2, one lookup a sequence (its first page's), all its
    pages taken as consecutive (right only for such block tables)."""
    BOX: gl.constexpr = _box_rows(desc.block_type.shape)
    mbarrier.wait(empty, phase)
    mbarrier.expect(ready, (BLOCK_N // BOX) * desc.block_type.nbytes)
    if TILE_LOOKUP == 2:
        first_row = gl.load(bt_row) * PAGE_SIZE
    elif TILE_LOOKUP == 1:
        first_key = gl.minimum(j * BLOCK_N, last_box)
        first_row = gl.load(bt_row + first_key // PAGE_SIZE) * PAGE_SIZE - first_key
    for i in gl.static_range(BLOCK_N // BOX):
        key = gl.minimum(j * BLOCK_N + i * BOX, last_box)
        if TILE_LOOKUP:
            row = first_row + key
        elif PAGE_SIZE == 0:   # the probe PROBE_RUNTIME_PAGE: the page size 1 << page_shift
            row = ((gl.load(bt_row + (key >> page_shift)) << page_shift)
                   + (key & ((1 << page_shift) - 1)))
        else:
            row = gl.load(bt_row + key // PAGE_SIZE) * PAGE_SIZE + key % PAGE_SIZE
        _copy_box(desc, row, col, ready, smem, i)


@gluon.jit
def _load_kv_tile_by_ids(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                         phase, bt_row, j, col, vcol, last_box, BLOCK_N: gl.constexpr,
                         PAGE_SIZE: gl.constexpr):
    """Tile ``j`` of K and of V (``KV_PAIRED``) once both slots are free: each box's page id
    looked up once for its K and its V copies, against ``_load_tile_by_ids``'s once each."""
    BOX: gl.constexpr = _box_rows(k_desc.block_type.shape)
    mbarrier.wait(k_empty, phase)
    mbarrier.wait(v_empty, phase)
    mbarrier.expect(k_ready, (BLOCK_N // BOX) * k_desc.block_type.nbytes)
    mbarrier.expect(v_ready, (BLOCK_N // BOX) * v_desc.block_type.nbytes)
    for i in gl.static_range(BLOCK_N // BOX):
        key = gl.minimum(j * BLOCK_N + i * BOX, last_box)
        row = gl.load(bt_row + key // PAGE_SIZE) * PAGE_SIZE + key % PAGE_SIZE
        _copy_box(k_desc, row, col, k_ready, k_smem, i)
        _copy_box(v_desc, row, vcol, v_ready, v_smem, i)


@gluon.constexpr_function
def _box_rows(block_shape):
    """Cache rows of a descriptor's box: ``[BOX, HEAD_DIM]``, or V by pages' ``[CH, BOX, 64]``."""
    return block_shape[len(block_shape) - 2]


@gluon.jit
def _copy_box(desc, row, col, ready, smem, i: gl.constexpr):
    """Box ``i`` of a tile (cache rows ``row ..``) into the ring slot ``smem`` on ``ready``. A
    2-D descriptor (box ``[BOX, HEAD_DIM]`` at column ``col``) fills the slot's rows ``i * BOX
    ..``, which Triton issues as one copy a 128-byte column chunk (two at d128). V by pages
    (``V_PAGES``): a 3-D descriptor over the cache as ``[64-column chunks, rows, 64]``, box ``[CH,
    BOX, 64]`` at chunk ``col``, fills the slot's page ``i`` (``[CH, BOX, 64]``) in one copy."""
    if len(desc.block_type.shape) == 3:
        CH: gl.constexpr = desc.block_type.shape[0]
        tma.async_copy_global_to_shared(desc, [col, row, 0], ready, smem.slice(i * CH, CH))
    else:
        BOX: gl.constexpr = desc.block_type.shape[0]
        tma.async_copy_global_to_shared(desc, [row, col], ready, smem.slice(i * BOX, BOX))


@gluon.constexpr_function
def v_pages_layout(block_n, head_dim, box):
    """The ``[block_n, head_dim]`` V operand whose pages (``box`` rows each) lie one after
    another, each page ``[head_dim / 64, box, 64]`` (64-column chunks, 128-byte rows swizzled by
    the row's index mod 8, as TMA writes a box): offset bits to (row, column). A wgmma's k16 step
    stays inside a page, so Triton's descriptors for it (start a step, the chunks' stride, the
    8-row groups' stride) are uniform; compiled for sm_90a: one group of 8 HGMMA as for V as K."""
    bases = [[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [0, 32], [1, 8], [2, 16], [4, 32]]
    bases += [[r, 0] for r in (8, 16, 32, 64, 128) if r < box]
    bases += [[0, c] for c in (64, 128) if c < head_dim]
    bases += [[p, 0] for p in (8, 16, 32, 64, 128) if box <= p < block_n]
    return gl.SharedLinearLayout(offset_bases=bases, alignment=1024)


@gluon.jit
def _v_pages_operand(v_smem, s, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Slot ``s`` of V held by pages (a ring ``[STAGES, BOXES * CH, BOX, 64]``) as the
    ``[BLOCK_N, HEAD_DIM]`` P V operand: the slot's bytes under ``v_pages_layout``."""
    return v_smem.index(s)._reinterpret(v_smem.dtype, [BLOCK_N, HEAD_DIM],
                                        v_pages_layout(BLOCK_N, HEAD_DIM, v_smem.shape[2]))


@gluon.jit
def _box_row(pages, box, i: gl.constexpr, j, last_box, BLOCK_N: gl.constexpr,
             BOX: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Cache row of tile ``j``'s box ``i`` (its page taken from ``pages``, ``_box_pages``)."""
    key = gl.minimum(j * BLOCK_N + i * BOX, last_box)
    if BOX == BLOCK_N:
        page = gl.reduce(pages, 0, _add)
    else:
        page = gl.reduce(gl.where(box == i, pages, 0), 0, _add)
    return page * PAGE_SIZE + key % PAGE_SIZE


@gluon.jit
def _box_pages(bt_row, j, box, last_box, BLOCK_N: gl.constexpr, BOX: gl.constexpr,
               PAGE_SIZE: gl.constexpr):
    """Page ids of tile ``j``'s boxes (boxes past the sequence's end: its last box's page, so
    the block table past the sequence's pages is never read)."""
    key = gl.minimum(j * BLOCK_N + box * BOX, last_box)
    return gl.load(bt_row + key // PAGE_SIZE)


@gluon.jit
def _zero_rows_from(smem, first, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Rows ``>= first`` of a shared ``[BLOCK_N, HEAD_DIM]`` tile set to 0 by a consumer
    warpgroup, visible to its wgmmas on return. Both warpgroups zero the same tile unsynchronized:
    each store writes a row's final value (0, or the value it holds), so a wgmma of the other
    warpgroup reads the right bytes whichever store it sees."""
    layout: gl.constexpr = rows_layout(HEAD_DIM)
    tile = smem.load(layout)
    keep = gl.arange(0, BLOCK_N, gl.SliceLayout(1, layout)) < first
    # Idempotent: a thread that reads a row after another zeroed it stores the same zeros.
    smem.store(gl.where(gl.expand_dims(keep, 1), tile, 0.0).to(smem.dtype))
    fence_async_shared()
    gl.thread_barrier()


@gluon.constexpr_function
def _tree_shape(rows, n):
    """``[rows, 2, .., 2, 8]``: the column index of a wgmma accumulator ``[rows, n]`` split into
    its block bits (a block: 8 columns, of which a thread holds 2) and the column in a block."""
    return [rows] + [2] * ((n // 8).bit_length() - 1) + [8]


@gluon.jit
def _reduce_axis1(t, MAX: gl.constexpr):
    """``t`` reduced along axis 1: its maxima (``MAX``) or its sums."""
    if MAX:
        return gl.reduce(t, 1, _max)
    else:
        return gl.reduce(t, 1, _add)


@gluon.jit
def _rows_reduce(x, MAX: gl.constexpr, TREE: gl.constexpr = False):
    """``x [rows, n]`` (a wgmma accumulator)'s row maxima (``MAX``) or sums. ``TREE``
    (``ROW_TREE``): a thread's n / 4 values of a row as a tree (halving across the 8-column
    blocks, depth log2(n / 8) + 1) instead of one chain of n / 4 - 1, then the quad's shuffles;
    in the rows' layout (no data moved)."""
    if TREE:
        SHAPE: gl.constexpr = _tree_shape(x.shape[0], x.shape[1])
        t = gl.reshape(x, SHAPE)
        for _ in gl.static_range(len(SHAPE) - 1):
            t = _reduce_axis1(t, MAX)
        return gl.convert_layout(t, gl.SliceLayout(1, x.type.layout))
    else:
        return _reduce_axis1(x, MAX)


@gluon.jit
def _softmax_tile(sc, m_i, l_i, start, full, seqlen, last_key, qk_scale, BLOCK_N: gl.constexpr,
                  S_LAYOUT: gl.constexpr, TREE: gl.constexpr = False):
    """Raw scores ``sc [rows, BLOCK_N]`` of keys ``start ..`` into the online softmax (base
    2): ``(p, alpha, m_new, l_new)``. Tiles past ``full`` (the diagonal band, the sequence's end)
    are masked: row r sees key k iff ``k <= last_key[r]`` and ``k < seqlen``."""
    if start + BLOCK_N > full:
        keys = start + gl.arange(0, BLOCK_N, gl.SliceLayout(0, S_LAYOUT))
        visible = ((gl.expand_dims(keys, 0) <= gl.expand_dims(last_key, 1))
                   & gl.expand_dims(keys < seqlen, 0))
        sc = gl.where(visible, sc * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, _rows_reduce(sc, True, TREE))
        # A row with no visible key so far keeps m = -inf: subtract 0 (no -inf - -inf).
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(sc - gl.expand_dims(m_sub, 1))
    else:
        m_new = gl.maximum(m_i, _rows_reduce(sc, True, TREE) * qk_scale)
        m_sub = m_new
        p = gl.exp2(sc * qk_scale - gl.expand_dims(m_sub, 1))
    alpha = gl.exp2(m_i - m_sub)
    return p, alpha, m_new, l_i * alpha + _rows_reduce(p, False, TREE)


RESCALE_THRESHOLD = gl.constexpr(8.0)   # ``LAZY_RESCALE``: log2 of how far p may exceed 1


# A warp's vote over its rows (a thread holds two: rows r and r + 8 of the wgmma layout): 1 in
# every lane where any lane's either row is nonzero.
_WARP_ANY_ASM = gl.constexpr("""{
    .reg .pred a, b;
    setp.ne.u32 a, $2, 0;
    setp.ne.u32 b, $3, 0;
    or.pred a, a, b;
    vote.sync.any.pred a, a, 0xffffffff;
    selp.u32 $0, 1, 0, a;
    selp.u32 $1, 1, 0, a;
}""")


def _rescale_if_asm(n: int) -> str:
    """Inline PTX: ``n`` values of O (``$n ..``) times their rows' alpha (``$2n ..``), skipped
    by a branch where the warp's flag (``$3n``, warp-uniform) is 0: the skipped path issues a
    compare and a branch instead of ``n`` FMULs (ptxas keeps O in place: no MOV is left)."""
    movs = "".join(f"    mov.b32 ${i}, ${n + i};\n" for i in range(n))
    muls = "".join(f"    mul.f32 ${i}, ${n + i}, ${2 * n + i};\n" for i in range(n))
    return ("{\n    .reg .pred skip;\n" f"    setp.eq.u32 skip, ${3 * n}, 0;\n" + movs
            + "    @skip bra.uni DONE;\n" + muls + "DONE:\n}")


RESCALE_PACK = gl.constexpr(16)   # O's values a branch (64 a thread at d128, 32 at d64)
_RESCALE_IF_ASM = gl.constexpr(_rescale_if_asm(RESCALE_PACK.value))
_RESCALE_IF_CONSTRAINTS = gl.constexpr(",".join(
    ["=f"] * RESCALE_PACK.value + ["f"] * (2 * RESCALE_PACK.value) + ["r"] * RESCALE_PACK.value))


@gluon.jit
def _warp_any(flags):
    """``flags`` (int32, a row vector of the wgmma layout, two a thread) voted over each warp.
    Not pure: a vote reads the other lanes, so the compiler must not move it."""
    return gl.inline_asm_elementwise(_WARP_ANY_ASM, "=r,=r,r,r", [flags], dtype=gl.int32,
                                     is_pure=False, pack=2)


@gluon.jit
def _rescale_if(acc, alpha, flag, ROWS_O: gl.constexpr):
    """``acc * alpha`` (a factor a row) where the warp's ``flag`` (warp-uniform) is set, else
    ``acc`` as it is, by a branch: the FMULs are not issued."""
    a = gl.expand_dims(gl.convert_layout(alpha, ROWS_O), 1)
    f = gl.expand_dims(gl.convert_layout(flag, ROWS_O), 1)
    return gl.inline_asm_elementwise(_RESCALE_IF_ASM, _RESCALE_IF_CONSTRAINTS, [acc, a, f],
                                     dtype=gl.float32, is_pure=True, pack=RESCALE_PACK)


@gluon.jit
def _softmax_tile_lazy(sc, m_i, l_i, qk_scale):
    """``_softmax_tile`` for a tile every row sees whole (``LAZY_RESCALE``), FA4's conditional
    rescale: a warp's rows keep their running max, and so their scale, unless one of them grew
    by more than ``RESCALE_THRESHOLD`` (p then stays <= 2^8: exact in fp32, and P's 16-bit
    form keeps its relative precision). Returns ``(p, alpha, m_new, l_new, flag)``: ``flag`` 0
    (in every lane of a warp) means the warp's ``m_new = m_i``, ``alpha = 1``, and O needs no
    rescale (``_rescale_if``)."""
    m_tile = gl.reduce(sc, 1, _max) * qk_scale
    flag = _warp_any((m_tile - m_i > RESCALE_THRESHOLD).to(gl.int32))
    m_new = gl.where(flag != 0, gl.maximum(m_i, m_tile), m_i)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(sc * qk_scale - gl.expand_dims(m_new, 1))
    return p, alpha, m_new, l_i * alpha + gl.reduce(p, 1, _add), flag


TRACE_ROUNDS = gl.constexpr(128)   # items a CTA's trace holds (``PROBE_TRACE``)
TRACE_TILES = gl.constexpr(8)      # the loop's tiles whose softmax start and end are stamped
TRACE_EVENTS = gl.constexpr(17 + 2 * TRACE_TILES.value)


@gluon.jit
def _clock():
    """The SM's clock, ``%clock64``."""
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def _stamp(tp, event: gl.constexpr, TRACE: gl.constexpr):
    """With ``TRACE``: the SM's clock into ``tp[event]``."""
    if TRACE:
        gl.store(tp + event, _clock())


@gluon.jit
def _lap(t, total, TRACE: gl.constexpr):
    """With ``TRACE``: ``(now, total + now - t)``, a loop step's cycles added to its sum."""
    if TRACE:
        now = _clock()
        total += now - t
        t = now
    return t, total


@gluon.jit
def _timed_wait(bar, phase, waited, TRACE: gl.constexpr):
    """``mbarrier.wait(bar, phase)``; with ``TRACE`` the cycles it took added to ``waited``."""
    if TRACE:
        t0 = _clock()
        mbarrier.wait(bar, phase)
        waited += _clock() - t0
    else:
        mbarrier.wait(bar, phase)
    return waited


@gluon.jit
def _consume_items(Q, Out, Lse, q_smem, k_smem, v_smem, ones_smem, k_ready, v_ready, k_empty,
                   v_empty, cu_seqlens_q, cache_seqlens, sm_scale, batch, num_tiles, num_items,
                   num_programs, stride_qt, stride_qh, stride_ot, stride_oh, stride_lh, trace,
                   GROUP: gl.constexpr, BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr,
                   HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, LAST_FIRST: gl.constexpr,
                   STORE_LSE: gl.constexpr, TRACE: gl.constexpr, PART: gl.constexpr,
                   SOFTMAX_FORM: gl.constexpr = 0):
    """Consumer warpgroup ``PART``: packed rows ``[64 PART, 64 PART + 64)`` of each of the
    CTA's work items against its keys ``[0, hi)`` (``it`` counts the CTA's key tiles across
    items, as the loader does). The next item's tile and Q rows are looked up while this one's
    last P V runs (``_next_item``), so a persistent CTA starts an item on data already loaded.
    ``ones_smem`` ``[8, BLOCK_N]``: ones, the B operand of the row sums' wgmma
    (``ROW_SUM_MMA``), filled here (both warpgroups store the same values)."""
    q_smem = q_smem.index(PART)
    if SOFTMAX_FORM // 64 % 2 == 1:
        ones_smem.store(gl.full([8, BLOCK_N], 1.0, ones_smem.dtype, rows_layout(BLOCK_N)))
        fence_async_shared()
        gl.thread_barrier()
    it = 0
    item = gl.program_id(0)
    kv_head, q_start, q_len, tok0, seqlen, diag, hi, full, q = _next_item(
        Q, cu_seqlens_q, cache_seqlens, batch, num_tiles, item, True, stride_qt, stride_qh,
        GROUP, BLOCK_Q, BLOCK_N, HEAD_DIM, IS_CAUSAL, LAST_FIRST, PART)
    rnd = 0   # the CTA's items so far (the trace's row)
    while item < num_items:
        nxt = item + num_programs
        if tok0 < q_len:   # else a surplus item (or an empty sequence's slot): no key tiles
            it_next = it + (hi + BLOCK_N - 1) // BLOCK_N
            tp = trace + ((gl.program_id(0) * TRACE_ROUNDS + gl.minimum(rnd, TRACE_ROUNDS - 1))
                          * 2 + PART) * TRACE_EVENTS
            kv_head, q_start, q_len, tok0, seqlen, diag, hi, full, q = _consume_item(
                Q, Out, Lse, q, q_smem, k_smem, v_smem, ones_smem, k_ready, v_ready, k_empty,
                v_empty, it,
                kv_head, q_start, q_len, tok0, seqlen, diag, hi, full, sm_scale, stride_qt,
                stride_qh, stride_ot, stride_oh, stride_lh, cu_seqlens_q, cache_seqlens, batch,
                num_tiles, nxt, nxt < num_items, tp, GROUP, BLOCK_Q, BLOCK_N, HEAD_DIM,
                IS_CAUSAL, LAST_FIRST, STORE_LSE, TRACE, PART, SOFTMAX_FORM)
            it = it_next
        else:
            kv_head, q_start, q_len, tok0, seqlen, diag, hi, full, q = _next_item(
                Q, cu_seqlens_q, cache_seqlens, batch, num_tiles, nxt, nxt < num_items,
                stride_qt, stride_qh, GROUP, BLOCK_Q, BLOCK_N, HEAD_DIM, IS_CAUSAL, LAST_FIRST,
                PART)
        item = nxt
        rnd += 1


@gluon.jit
def _q_rows(kv_head, q_start, q_len, tok0, GROUP: gl.constexpr, BLOCK_Q: gl.constexpr,
            HEAD_DIM: gl.constexpr, PART: gl.constexpr):
    """A consumer warpgroup's packed rows of an item in the coalesced layout: ``(q_rows`` (the
    rows' token in Q/Out, int64), ``head``, ``row_ok`` (a real token, not padding))."""
    IO: gl.constexpr = rows_layout(HEAD_DIM)
    rows = PART * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, IO))
    tok = tok0 + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    # Rows past BLOCK_Q * GROUP (a group that does not divide 128) are padding, as past q_len.
    row_ok = (tok < q_len) & (rows < BLOCK_Q * GROUP)
    return (q_start + tok).to(gl.int64), head, row_ok


@gluon.jit
def _next_item(Q, cu_seqlens_q, cache_seqlens, batch, num_tiles, item, valid, stride_qt,
               stride_qh, GROUP: gl.constexpr, BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr,
               HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, LAST_FIRST: gl.constexpr,
               PART: gl.constexpr):
    """Work item ``item``'s tile (``_tile``, less the sequence index) and the warpgroup's Q
    rows in registers (rows past q_len, or every row where not ``valid``: 0, no load)."""
    kv_head, seq, q_start, q_len, tok0, seqlen, diag, hi, full = _tile(
        item, cu_seqlens_q, cache_seqlens, batch, num_tiles, BLOCK_Q, BLOCK_N, IS_CAUSAL,
        LAST_FIRST)
    q_rows, head, row_ok = _q_rows(kv_head, q_start, q_len, tok0, GROUP, BLOCK_Q, HEAD_DIM,
                                   PART)
    offs_d = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, rows_layout(HEAD_DIM)))
    q = gl.load(Q + gl.expand_dims(q_rows * stride_qt + head * stride_qh, 1)
                + gl.expand_dims(offs_d, 0), mask=gl.expand_dims(row_ok & valid, 1), other=0.0)
    return kv_head, q_start, q_len, tok0, seqlen, diag, hi, full, q


@gluon.jit
def _item_state(sm_scale, tok0, diag, GROUP: gl.constexpr, BLOCK_N: gl.constexpr,
                HEAD_DIM: gl.constexpr, PART: gl.constexpr):
    """A consumer warpgroup's start of an item: ``(qk_scale`` (log2 e folded in), ``last_key``
    (each row's last visible key), ``m_i``, ``l_i``, ``acc)``."""
    ROWS_S: gl.constexpr = gl.SliceLayout(1, mma_layout(BLOCK_N))
    rows_s = PART * ROWS + gl.arange(0, ROWS, ROWS_S)
    last_key = tok0 + rows_s // GROUP + diag   # row r sees keys <= this
    return (sm_scale * LOG2E, last_key, gl.full([ROWS], float("-inf"), gl.float32, ROWS_S),
            gl.zeros([ROWS], gl.float32, ROWS_S),
            gl.zeros([ROWS, HEAD_DIM], gl.float32, mma_layout(HEAD_DIM)))


@gluon.jit
def _issue_last_pv(v_smem, v_ready, g, p_op, acc, start, seqlen, tp=None,
                   TRACE: gl.constexpr = False):
    """An item's last P V (the ring's ``g``-th V tile, keys ``start ..``; rows past ``seqlen``
    zeroed first), issued, not waited: the async accumulator. With ``TRACE``: the clock once V
    has landed (slot 10) and once the wgmma is issued (slot 11)."""
    STAGES: gl.constexpr = v_smem.shape[0]
    BLOCK_N: gl.constexpr = p_op.shape[1]
    HEAD_DIM: gl.constexpr = acc.shape[1]
    s = g % STAGES
    mbarrier.wait(v_ready.index(s), (g // STAGES) & 1)
    _stamp(tp, 10, TRACE)
    if len(v_smem.shape) == 4:   # V by pages (``V_PAGES``)
        if start + BLOCK_N > seqlen:   # only the last tile reaches past the end
            _zero_rows_from(_v_pages_operand(v_smem, s, BLOCK_N, HEAD_DIM), seqlen - start,
                            BLOCK_N, HEAD_DIM)
        acc = warpgroup_mma(p_op, _v_pages_operand(v_smem, s, BLOCK_N, HEAD_DIM), acc,
                            is_async=True)
    else:
        if start + BLOCK_N > seqlen:   # only the last tile reaches past the end
            _zero_rows_from(v_smem.index(s), seqlen - start, BLOCK_N, HEAD_DIM)
        acc = warpgroup_mma(p_op, v_smem.index(s), acc, is_async=True)
    _stamp(tp, 11, TRACE)
    return acc


@gluon.jit
def _steady_tiles(q_smem, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, it, n_tiles, acc,
                  p_op, m_i, l_i, full, seqlen, last_key, qk_scale, tp, BLOCK_N: gl.constexpr,
                  TRACE: gl.constexpr, SOFTMAX_FORM: gl.constexpr = 0, ones_smem=None):
    """Key tiles ``1 .. n_tiles - 1`` of an item (the ring's ``it + j``-th), tile 0's P in
    ``p_op``: FA3's intra-warpgroup overlap, tile j's Q Kᵀ issued before tile j - 1's P V, whose
    wgmma runs under tile j's softmax (P of tile j - 1 stays in registers as its A operand until
    it retires). Returns ``(acc, p_op, m_i, l_i)`` with the last tile's P in ``p_op``, its P V
    not issued. With ``TRACE``: step 3's clock and the cycles waited on K and on V. With
    ``ROW_SUM_MMA`` (SOFTMAX_FORM + 64) ``l_i`` is a ``[rows, 8]`` wgmma accumulator of P's row
    sums (``P @ ones``, issued with each P V), not a row vector."""
    SUM_MMA: gl.constexpr = SOFTMAX_FORM // 64 % 2 == 1
    S_LAYOUT: gl.constexpr = mma_layout(BLOCK_N)
    O_LAYOUT: gl.constexpr = acc.type.layout
    P_OPERAND: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    ROWS_O: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    STAGES: gl.constexpr = k_smem.shape[0]
    dtype: gl.constexpr = q_smem.dtype
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT)
    no_sums = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, S_LAYOUT))   # (SUM_MMA: unused)
    k_waited = gl.to_tensor(0).to(gl.int64)   # the loop's cycles in k_ready / v_ready waits
    v_waited = k_waited                        # (TRACE only)
    # and in its steps (TRACE only): the wgmmas' issue (the waits included), the Q Kᵀ's wait,
    # the softmax, the P V's wait, the rescale and P's conversion
    issue_c = k_waited
    qk_c = k_waited
    softmax_c = k_waited
    pv_c = k_waited
    tail_c = k_waited
    t = k_waited
    if TRACE:
        t = _clock()
    for j in range(1, n_tiles):
        g = it + j
        s = g % STAGES
        prev = (g - 1) % STAGES
        k_waited = _timed_wait(k_ready.index(s), (g // STAGES) & 1, k_waited, TRACE)
        sc = warpgroup_mma(q_smem, k_smem.index(s).permute((1, 0)), zero_s,
                           use_acc=False, is_async=True)
        v_waited = _timed_wait(v_ready.index(prev), ((g - 1) // STAGES) & 1, v_waited, TRACE)
        if len(v_smem.shape) == 4:   # V by pages (``V_PAGES``)
            acc = warpgroup_mma(p_op, _v_pages_operand(v_smem, prev, BLOCK_N, acc.shape[1]),
                                acc, is_async=True)
        else:
            acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        if SUM_MMA:
            l_i = warpgroup_mma(p_op, ones_smem.permute((1, 0)), l_i, is_async=True)
        t, issue_c = _lap(t, issue_c, TRACE)
        if SUM_MMA:
            sc = warpgroup_mma_wait(num_outstanding=2, deps=(sc, ))
        else:
            sc = warpgroup_mma_wait(num_outstanding=1, deps=(sc, ))
        t, qk_c = _lap(t, qk_c, TRACE)
        mbarrier.arrive(k_empty.index(s))
        if TRACE:   # tiles 1 .. TRACE_TILES: the softmax's start (slots 17 + 2 (j - 1))
            if j <= TRACE_TILES:
                gl.store(tp + 15 + 2 * j, _clock())
        if SOFTMAX_FORM % 4 == 1:   # timing only: no exponential (no MUFU), no mask
            m_new = gl.maximum(m_i, gl.reduce(sc, 1, _max) * qk_scale)
            p = sc * qk_scale - gl.expand_dims(m_new, 1)
            alpha = m_i - m_new
            l_i = l_i * alpha + gl.reduce(p, 1, _add)
            m_i = m_new
        elif SOFTMAX_FORM // 4 % 2 == 1:   # LAZY_RESCALE: tiles every row sees whole
            if j * BLOCK_N + BLOCK_N <= full:
                p, alpha, m_i, l_i, flag = _softmax_tile_lazy(sc, m_i, l_i, qk_scale)
            else:
                p, alpha, m_i, l_i = _softmax_tile(sc, m_i, l_i, j * BLOCK_N, full, seqlen,
                                                   last_key, qk_scale, BLOCK_N, S_LAYOUT,
                                                   SOFTMAX_FORM // 8 % 2 == 1)
                flag = gl.full_like(m_i, 1, dtype=gl.int32)
        elif SUM_MMA:   # the row sums dead here: no FADDs
            p, alpha, m_i, _ = _softmax_tile(sc, m_i, no_sums, j * BLOCK_N, full, seqlen,
                                             last_key, qk_scale, BLOCK_N, S_LAYOUT,
                                             SOFTMAX_FORM // 8 % 2 == 1)
        else:
            p, alpha, m_i, l_i = _softmax_tile(sc, m_i, l_i, j * BLOCK_N, full, seqlen,
                                               last_key, qk_scale, BLOCK_N, S_LAYOUT,
                                               SOFTMAX_FORM // 8 % 2 == 1)
        t, softmax_c = _lap(t, softmax_c, TRACE)
        if TRACE:   # and its end (slots 18 + 2 (j - 1)), as the warp reaches it
            if j <= TRACE_TILES:
                gl.store(tp + 16 + 2 * j, t)
        if SUM_MMA:
            acc, l_i, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, l_i, p_op))
        else:
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        t, pv_c = _lap(t, pv_c, TRACE)
        mbarrier.arrive(v_empty.index(prev))
        if SOFTMAX_FORM // 4 % 2 == 1:
            acc = _rescale_if(acc, alpha, flag, ROWS_O)
        elif SOFTMAX_FORM % 4 != 2:   # 2 (timing only): O never rescaled
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, ROWS_O), 1)
            if SUM_MMA:
                l_i = l_i * gl.expand_dims(
                    gl.convert_layout(alpha, gl.SliceLayout(1, l_i.type.layout)), 1)
        p_op = gl.convert_layout(p.to(dtype), P_OPERAND)
        t, tail_c = _lap(t, tail_c, TRACE)
    _stamp(tp, 3, TRACE)
    if TRACE:
        gl.store(tp + 7, k_waited)
        gl.store(tp + 8, v_waited)
        gl.store(tp + 12, issue_c)
        gl.store(tp + 13, qk_c)
        gl.store(tp + 14, softmax_c)
        gl.store(tp + 15, pv_c)
        gl.store(tp + 16, tail_c)
    return acc, p_op, m_i, l_i


@gluon.jit
def _consume_item(Q, Out, Lse, q, q_smem, k_smem, v_smem, ones_smem, k_ready, v_ready, k_empty,
                  v_empty, it, kv_head, q_start, q_len, tok0, seqlen, diag, hi, full, sm_scale,
                  stride_qt, stride_qh, stride_ot, stride_oh, stride_lh, cu_seqlens_q,
                  cache_seqlens, batch, num_tiles, nxt, nxt_valid, tp, GROUP: gl.constexpr,
                  BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, LAST_FIRST: gl.constexpr, STORE_LSE: gl.constexpr,
                  TRACE: gl.constexpr, PART: gl.constexpr, SOFTMAX_FORM: gl.constexpr = 0):
    """One work item of consumer warpgroup ``PART`` (its ``q_smem`` slice; ``q`` its Q rows in
    registers), its key tiles the ring's ``it``-th onwards; returns ``_next_item(nxt)``, looked
    up under the item's last P V. FA3's intra-warpgroup overlap: tile j's Q Kᵀ is issued before
    tile j - 1's P V, whose wgmma runs under tile j's softmax (P of tile j - 1 stays in
    registers as its A operand until it retires). Each warpgroup frees a slot by its own arrive
    (the empty barriers count 2): the two drift apart, so one's softmax meets the other's
    wgmmas."""
    S_LAYOUT: gl.constexpr = mma_layout(BLOCK_N)
    O_LAYOUT: gl.constexpr = mma_layout(HEAD_DIM)
    P_OPERAND: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    ROWS_S: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    ROWS_O: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    IO: gl.constexpr = rows_layout(HEAD_DIM)
    STAGES: gl.constexpr = k_smem.shape[0]
    dtype: gl.constexpr = q_smem.dtype

    # Q into shared memory once every warp of the warpgroup has read the last item's O out of it.
    _stamp(tp, 0, TRACE)
    gl.thread_barrier()
    q_smem.store(q)
    fence_async_shared()
    gl.thread_barrier()   # the wgmma reads rows every warp of the warpgroup stored
    _stamp(tp, 1, TRACE)

    qk_scale, last_key, m_i, l_i, acc = _item_state(sm_scale, tok0, diag, GROUP, BLOCK_N,
                                                    HEAD_DIM, PART)
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT)
    n_tiles = (hi + BLOCK_N - 1) // BLOCK_N
    if n_tiles > 0:
        s = it % STAGES
        mbarrier.wait(k_ready.index(s), (it // STAGES) & 1)
        sc = warpgroup_mma(q_smem, k_smem.index(s).permute((1, 0)), zero_s, use_acc=False,
                           is_async=True)
        sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc, ))
        mbarrier.arrive(k_empty.index(s))
        p, alpha, m_i, l_i = _softmax_tile(sc, m_i, l_i, 0, full, seqlen, last_key,
                                           qk_scale, BLOCK_N, S_LAYOUT,
                                           SOFTMAX_FORM // 8 % 2 == 1)
        p_op = gl.convert_layout(p.to(dtype), P_OPERAND)
        _stamp(tp, 2, TRACE)
        SUM_MMA: gl.constexpr = SOFTMAX_FORM // 64 % 2 == 1
        sums = l_i
        if SUM_MMA:   # ROW_SUM_MMA: l from the tensor core, 8 equal columns of P @ ones
            sums = gl.zeros([ROWS, 8], gl.float32, mma_layout(8))
        acc, p_op, m_i, sums = _steady_tiles(
            q_smem, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, it, n_tiles, acc, p_op,
            m_i, sums, full, seqlen, last_key, qk_scale, tp, BLOCK_N, TRACE, SOFTMAX_FORM,
            ones_smem)
        last = n_tiles - 1
        s = (it + last) % STAGES
        acc = _issue_last_pv(v_smem, v_ready, it + last, p_op, acc, last * BLOCK_N, seqlen, tp,
                             TRACE)
        if SUM_MMA:
            sums = warpgroup_mma(p_op, ones_smem.permute((1, 0)), sums, is_async=True)
        nxt_item = _next_item(Q, cu_seqlens_q, cache_seqlens, batch, num_tiles, nxt, nxt_valid,
                              stride_qt, stride_qh, GROUP, BLOCK_Q, BLOCK_N, HEAD_DIM, IS_CAUSAL,
                              LAST_FIRST, PART)
        _stamp(tp, 9, TRACE)
        if SUM_MMA:
            acc, sums = warpgroup_mma_wait(num_outstanding=0, deps=(acc, sums))
            l_i = gl.convert_layout(gl.max(sums, 1), ROWS_S)
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            l_i = sums
        mbarrier.arrive(v_empty.index(s))
        _stamp(tp, 4, TRACE)
    else:
        nxt_item = _next_item(Q, cu_seqlens_q, cache_seqlens, batch, num_tiles, nxt, nxt_valid,
                              stride_qt, stride_qh, GROUP, BLOCK_Q, BLOCK_N, HEAD_DIM, IS_CAUSAL,
                              LAST_FIRST, PART)

    seen = l_i > 0.0
    out = acc / gl.expand_dims(gl.convert_layout(gl.where(seen, l_i, 1.0), ROWS_O), 1)
    # O leaves through q's shared tile (every wgmma that read it has retired), re-read in the
    # coalesced layout: no separate conversion scratch, which leaves room for a third stage.
    q_smem.store(out.to(dtype))
    gl.thread_barrier()
    q_rows, head, row_ok = _q_rows(kv_head, q_start, q_len, tok0, GROUP, BLOCK_Q, HEAD_DIM, PART)
    offs_d = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, IO))
    gl.store(Out + gl.expand_dims(q_rows * stride_ot + head * stride_oh, 1)
             + gl.expand_dims(offs_d, 0), q_smem.load(IO), mask=gl.expand_dims(row_ok, 1))
    if STORE_LSE:
        _store_lse(Lse, m_i, l_i, kv_head, q_start, q_len, tok0, stride_lh, GROUP, BLOCK_Q,
                   PART)
    _stamp(tp, 5, TRACE)
    if TRACE:
        gl.store(tp + 6, n_tiles.to(gl.int64))
    return nxt_item


@gluon.jit
def _store_lse(Lse, m_i, l_i, kv_head, q_start, q_len, tok0, stride_lh, GROUP: gl.constexpr,
               BLOCK_Q: gl.constexpr, PART: gl.constexpr):
    """An item's natural-log LSE from its base-2 row statistics (-inf where a row saw no key),
    rows past the sequence or the group masked."""
    rows_s = PART * ROWS + gl.arange(0, ROWS, m_i.type.layout)
    tok_s = tok0 + rows_s // GROUP
    seen = l_i > 0.0
    lse = gl.where(seen, (m_i + gl.log2(gl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
    gl.store(Lse + (kv_head * GROUP + rows_s % GROUP).to(gl.int64) * stride_lh + q_start
             + tok_s, lse, mask=(tok_s < q_len) & (rows_s < BLOCK_Q * GROUP))


@gluon.jit
def _gluon_prefill_kernel(
    Q, k_desc, v_desc, Out, Lse, cu_seqlens_q, cache_seqlens, block_table, sm_scale, batch,
    num_tiles, num_items, num_programs, stride_qt, stride_qh, stride_ot, stride_oh, stride_lh,
    stride_btb, page_shift, trace, GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr,
    PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    STORE_LSE: gl.constexpr, LAST_FIRST: gl.constexpr, STAGES: gl.constexpr,
    SCALAR_PAGES: gl.constexpr = False, TILE_LOOKUP: gl.constexpr = False,
    TRACE: gl.constexpr = False, SOFTMAX_FORM: gl.constexpr = 0, KV_PAIRED: gl.constexpr = False,
    LOADER_PAD: gl.constexpr = 0, PAD_CHAINS: gl.constexpr = 1,
):
    """Grid ``(num_programs,)``: CTA ``p`` runs work items ``p, p + num_programs, ..`` of
    ``num_items = num_tiles * nheads_k`` (``_tile``; ``num_tiles = total_q // BLOCK_Q + batch``
    M tiles per KV head); ``num_programs = num_items`` is one CTA per item, fewer is persistent
    (the loader fills the next item's first slots while the consumers finish the last one). Q,
    Out ``[total_q, nheads, HEAD_DIM]`` (last dim contiguous); k/v descriptors over the caches
    as ``[num_pages * PAGE_SIZE, nheads_k * HEAD_DIM]``, block ``[min(PAGE_SIZE, BLOCK_N),
    HEAD_DIM]`` (v by pages, ``V_PAGES``: ``[nheads_k * HEAD_DIM / 64, num_pages * PAGE_SIZE,
    64]``, block ``[HEAD_DIM / 64, BOX, 64]``); Lse float32 ``[nheads, total_q]``-strided (any
    pointer without STORE_LSE); cu_seqlens_q int32 ``[batch + 1]``, cache_seqlens int32
    ``[batch]``, block_table int32 ``[batch, max_pages]``; ``page_shift``: log2 of the page
    size, read only where PAGE_SIZE is 0 (the probe ``PROBE_RUNTIME_PAGE``); ``trace``: int64,
    the probe ``PROBE_TRACE``'s buffer (read only with TRACE)."""
    BLOCK_Q: gl.constexpr = BLOCK_M // GROUP
    dtype: gl.constexpr = k_desc.dtype
    Q_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_DIM], Q_SMEM)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    if len(v_desc.block_type.shape) == 3:   # V by pages: a slot [BOXES * CH, BOX, 64]
        BOX_V: gl.constexpr = v_desc.block_type.shape[1]
        v_smem = gl.allocate_shared_memory(
            dtype, [STAGES, BLOCK_N // BOX_V * (HEAD_DIM // 64), BOX_V, 64], v_desc.layout)
    else:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    if SOFTMAX_FORM // 64 % 2 == 1:   # ROW_SUM_MMA: the row sums' B operand (ones)
        ones_smem = gl.allocate_shared_memory(
            dtype, [8, BLOCK_N], gl.NVMMASharedLayout.get_default_for([8, BLOCK_N], dtype))
    else:
        ones_smem = q_smem   # never read
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)   # one arrive per consumer warpgroup
        mbarrier.init(v_empty.index(i), count=2)

    # (The argument lists are spelled out: a tuple built in the kernel would carry the
    # constexprs as runtime values.)
    gl.warp_specialize([
        (_consume_items, (Q, Out, Lse, q_smem, k_smem, v_smem, ones_smem, k_ready, v_ready,
                          k_empty, v_empty, cu_seqlens_q, cache_seqlens, sm_scale, batch, num_tiles,
                          num_items, num_programs, stride_qt, stride_qh, stride_ot, stride_oh,
                          stride_lh, trace, GROUP, BLOCK_Q, BLOCK_N, HEAD_DIM, IS_CAUSAL,
                          LAST_FIRST, STORE_LSE, TRACE, 0, SOFTMAX_FORM)),
        (_consume_items, (Q, Out, Lse, q_smem, k_smem, v_smem, ones_smem, k_ready, v_ready,
                          k_empty, v_empty, cu_seqlens_q, cache_seqlens, sm_scale, batch, num_tiles,
                          num_items, num_programs, stride_qt, stride_qh, stride_ot, stride_oh,
                          stride_lh, trace, GROUP, BLOCK_Q, BLOCK_N, HEAD_DIM, IS_CAUSAL,
                          LAST_FIRST, STORE_LSE, TRACE, 1, SOFTMAX_FORM)),
        (_load, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                 cu_seqlens_q, cache_seqlens, block_table, stride_btb, page_shift, batch,
                 num_tiles, num_items, num_programs, PAGE_SIZE, BLOCK_Q, BLOCK_N, HEAD_DIM,
                 IS_CAUSAL, LAST_FIRST, SCALAR_PAGES, TILE_LOOKUP, KV_PAIRED, LOADER_PAD,
                 PAD_CHAINS)),
    ], [CONSUMER_WARPS, LOADER_WARPS], [CONSUMER_REGS, LOADER_REGS])


# Launch through ``_launch.launch``'s cached path (the compiled kernel's C launcher, TMA
# descriptors as plain arguments) instead of the JIT's per-call binding: `PagedPrefillPlan.run`
# 89 -> 61 us of host time on the lent H100, 2026-11-26 (`bench host`'s prefill rows, each way).
# False keeps the JIT launch (tests compare the two byte for byte).
CACHED_LAUNCH = True

# The loader's page ids as warp-uniform scalar loads a box (``_load_tile_by_ids``) instead of a
# tile-ahead vector a lane an id, taken out by 3 shuffles a box for K and again for V. The
# loader's warp shares an SM sub-partition with two consumer warps, and its instructions cost
# them: at page 16 (8 boxes a tile) the loader's loop is 282 SASS instructions a tile against
# 340, and prefill 8 x 2048 ran 445.3 against 435.4 TFLOP/s eager, 435.7 / 424.4 in graphs (H200,
# 2026-11-30, four rounds alternated, bytes equal); chunked 64 x 512 over 8k 556.7 against 509.1.
# ncu (base clocks) on the vector form: the loader's sub-partition issues 429k instructions
# against the others' 296k at page 16 (353k at page 256). Two or four loader warps lost (420 /
# 400 against 434). Taken only where a tile has several boxes: at one box a tile (pages of
# BLOCK_N keys or more) the vector form shuffles nothing and loads its id a tile ahead, and the
# scalar form measured even there (prefill +0.7%, +1.4%, chunked -2.1%, mixed +0.5% in graphs).
# False keeps the vector form everywhere.
SCALAR_PAGES = True

# V by pages where a tile has several boxes (d128, d256): one TMA copy a page through a 3-D
# descriptor (box ``[HEAD_DIM / 64, BOX, 64]``) instead of Triton's one a 128-byte column chunk,
# the slot read by P V through ``v_pages_layout`` (one wgmma group, as V as K). At page 16 the
# loader's copies go 32 -> 24 a tile. Page 256 with 16-row boxes was as slow as page 16 (H200,
# 2026-11-30: 449.8 / 436.4 against 451.0 / 442.0 TFLOP/s eager / graphs, page 256 462.8 /
# 454.0). The first form (P V as one k16 group a page) added 33 consumer instructions a tile
# and measured even to 2% slower; this one compiles to the consumers' loops of V as K but for
# the descriptors' constants. Measured (H200, 2026-12-01, prefill 8 x 2048 page 16, two
# interleaved pairs, TFLOP/s eager / graphs): 455.0 / 439.4 and 458.0 / 441.3 against V as K's
# 448.2 / 440.9 and 452.4 / 433.2; chunked even (571.6 / 562.3, 560.7 / 565.1 against 567.1 /
# 562.2, 568.5 / 560.4); a later A/B even (off 454.2 / 438.6, on 452.6 / 440.2). A small gain
# at most, within a loan's noise; on for the fewer copies. False: V as K (two copies a page).
V_PAGES = True

# With scalar page ids (tiles of several boxes): a tile's K and V copies issued together once
# both slots are free, each box's page id looked up once for both (the loader's lookups halved;
# K no longer runs ahead of V's slot): at page 16 the loader's loop 242 -> 216 SASS
# instructions a tile. Measured (H200, 2026-12-01, prefill 8 x 2048 page 16, TFLOP/s eager /
# graphs, interleaved pairs): 449.1 / 437.6 and 445.5 / 441.1 against 445.4 / 434.1 and 446.9 /
# 435.0; chunked 64 x 512 over 8k 561.1 / 552.6 and 550.6 / 554.7 against 538.1 / 550.8 and
# 549.7 / 552.1; the session before +0.4% in graphs. Bytes equal. False: K's copies, then V's,
# each with its own lookups.
KV_PAIRED = True

# A probe (timing only; scripts/prefill_knob_ab.py): with KV_PAIRED, this many xorshift rounds
# (~6 dependent integer instructions each) added to the loader's work a tile: whether the
# loader's instruction count (on one SM sub-partition, beside one warp of each consumer
# warpgroup) costs the consumers. 0: none.
PROBE_LOADER_PAD = 0
# 4: the same rounds as four independent chains (latency / 4); 32: a chain a lane (vector
# instructions instead of the uniform datapath's)
PROBE_PAD_CHAINS = 1

# FA4's conditional rescale in the steady loop's unmasked tiles (``_softmax_tile_lazy``): O and
# l are rescaled only when some row's max grew by more than RESCALE_THRESHOLD (2^8), a choice
# each warp makes a tile (a vote; the skipped FMULs are branched over in inline PTX: a
# warpgroup-wide choice needs a cross-warp max, whose Triton form spilled inside the loop). The
# probe "no_rescale" (O never rescaled) was +3% at page 16 and +1.5% at page 256 (H200,
# 2026-11-30). Compiled for sm_90a: a skipping tile's path 460 -> 409 instructions a warp, a
# rescaling one 473. Measured (H200, 2026-12-01, two interleaved pairs, TFLOP/s eager / graphs;
# correct against the reference, with and without 12x key spikes): prefill 8 x 2048 page 16
# 428.0 / 421.8 and 437.8 / 419.1 against 444.2 / 432.8 and 444.2 / 437.9 (-1 to -4%), page 256
# 457.5 / 444.8 against 458.1 / 447.1; chunked 64 x 512 over 8k +1.5 to +2.3% (page 16 567.0 /
# 559.2, 561.5 / 558.5 against 554.4 / 550.0, 553.8 / 550.4). Off: the prefill row is the one
# short of its target. The kernel's SOFTMAX_FORM: 4 (its low two bits: PROBE_SOFTMAX).
LAZY_RESCALE = False

# The softmax's row max and row sum as a tree (``_rows_reduce``): a thread's 32 scores of a
# row reduced as 2 independent chains of 15 (then 1 and the quad's shuffles) instead of one of
# 31, the two rows' chains independent too. The row max is on each tile's critical path (S ->
# max -> exp2 -> P -> P V); the chain form's masked tiles ran it as 31 dependent FMNMX a row,
# the second row's after the first's shuffles. sm_90a's planned stalls: masked path 1281 ->
# 1165, the tail 210 -> 192, the unmasked path even (689 -> 685, its two rows' chains were
# already interleaved). Measured (H200, 2026-12-01, TFLOP/s eager / graphs, two interleaved
# pairs; correct against the reference in fp16 / bf16, with 12x key spikes too): prefill 8 x
# 2048 page 16 449.9 / 446.9 and 450.9 / 440.2 against 448.0 / 445.7 and 449.6 / 436.5, page
# 256 465.2 / 452.0 against 460.0 / 448.0; chunked 64 x 512 over 8k page 16 568.6 / 565.5 and
# 563.2 / 562.9 against 572.6 / 566.5 and 568.1 / 568.4, page 256 552.9 / 555.6 against 552.0
# / 553.9. On: +0.3 to +1.1% on the prefill row (the one short of its target, 1 tile in ~8.5
# masked), chunked (1 in ~64 masked) within -1 to +0.3%. The kernel's SOFTMAX_FORM: 8.
ROW_TREE = True

# P's row sums by the tensor core (``P @ ones``, a m64n8 wgmma issued with each P V into an
# accumulator of 8 equal columns, rescaled with O) instead of 64 FADDs a warp a tile and their
# shuffles: the loop is bound by its instructions' issue (EXP_POLY below: +113 instructions a
# warp a tile cost 11%), and this takes ~64 FADDs out for ~8 HGMMAs and their descriptors. l
# becomes the sum of P as rounded to 16 bits, the P that P V multiplies. Compiled for sm_90a:
# the unmasked path 478 -> 445 instructions a warp a tile, shared memory +2 KB (the ones).
# Measured (H200, 2026-12-01, forty-third session, TFLOP/s eager / graphs, prefill 8 x 2048 in
# five interleaved pairs at page 16, 3-5 rounds each; correct against the reference in fp16 /
# bf16, with 12x key spikes too): page 16 +0.2 to +2.3% in graphs in all five (445.7 / 439.9,
# 442.8 / 440.3, 445.5 / 443.6, 447.5 / 437.3, 444.7 / 443.7) and +0.6 to +1.3% eager; page 32
# and 64 even (+0.3, -0.6); page 128 and 256 -0.5 to -1.5% (256: 448.5 / 451.4, 447.7 / 453.5,
# 449.4 / 451.7); chunked 64 x 512 over 8k page 16 -0.3 to +0.4%. So it applies where the
# loader copies a key tile as boxes of at most ``ROW_SUM_MMA`` rows (8 boxes a tile at page 16):
# there the loader warp's instructions share the consumers' issue, and fewer consumer
# instructions pay; with few boxes the n8 wgmmas' latency on P V's path costs more than the
# FADDs. True / False: every page / none (the A/B's forms). The kernel's SOFTMAX_FORM: 64.
ROW_SUM_MMA: bool | int = 16


def row_sum_mma(box: int) -> bool:
    """Whether a launch whose loader copies ``box``-row TMA boxes takes ``ROW_SUM_MMA``."""
    if isinstance(ROW_SUM_MMA, bool):
        return ROW_SUM_MMA
    return box <= ROW_SUM_MMA

# Measured and removed (H200, 2026-12-01, forty-second session; the code is in commit 65cab04):
# an item's last tile on its first BLOCK_N / 2 keys where the keys its rows see end there
# (``NARROW_LAST``: Q Kᵀ at n = 64, the masked softmax on 64 columns, P V at k = 64; prefill 8 x
# 2048 skips 0.25 of its 8.5 tiles an item). Outputs bytes equal (the skipped half adds exact
# zeros), TFLOP/s eager / graphs: prefill page 16 444.0 / 436.0 and 441.0 / 433.5 against
# 449.3 / 434.7 and 448.0 / 438.3, page 256 455.8 / 449.5 against 461.5 / 445.7; chunked -1.4 to
# +1.8%. The narrow branch waits its P V before the next item's lookup (with a second lookup
# under an async wgmma, ptxas serialized every wgmma of the kernel, C7512): the wgmmas skipped
# were not this loop's critical path. The thirty-sixth session's TRIM_LAST_TILE, the same cut,
# measured the same (docs/notes.md).
#
# Also measured and removed (commit 02f4f27): 1 or 2 of every 4 unmasked exponentials by a degree-3
# polynomial on the FMA pipe (``EXP_POLY``, FA4's split; the unmasked softmax 204 -> 317 SASS
# instructions a warp a tile with 1, SFU 512 -> 384 cycles). Correct, and slower: prefill page 16
# 395.7 / 393.4 (1) and 363.7 / 377.0 (2) against 445.9 / 441.9 TFLOP/s, chunked -9% and -14%.
# The loop is bound by its instructions' issue, not by the SFU.

# A probe (timing only, wrong outputs; scripts/prefill_knob_ab.py): the steady loop's softmax
# without its exponentials ("no_exp": x for exp2(x), no MUFU, and no mask code: the loop 1039 ->
# 421 SASS instructions a tile a warp) or with O never rescaled ("no_rescale"): what the
# exponentials and the rescale cost at most. H200, 2026-11-30 (TFLOP/s eager / graphs, prefill
# 8 x 2048): page 16 444.4 / 431.5 -> no_exp 487.7 / 474.8, no_rescale 456.5 / 444.5; page 256
# 461.5 / 446.3 -> 478.7 / 461.9 and 469.8 / 452.8. None: the kernel.
PROBE_SOFTMAX = None

# A probe (scripts/prefill_item_trace.py): an int64 tensor ``[programs, TRACE_ROUNDS, 2,
# TRACE_EVENTS]`` into which each consumer warpgroup writes its SM's clock at the steps of each
# work item (``_consume_item``'s ``_stamp``s; slot 6: the item's key tiles; 7, 8: the cycles
# its loop spent waiting on ``k_ready`` and on ``v_ready``; 9: after the next item's lookup,
# 10: once the last tile's V has landed, 11: its P V issued; 9-11 only for items with key
# tiles; 12-16: the loop's cycles by step, summed over its tiles: the wgmmas' issue with the
# K and V waits, the Q Kᵀ's wait, the softmax, the P V's wait, the rescale and P's conversion,
# as each warp reaches them in program order; 17 + 2 (j - 1), 18 + 2 (j - 1): the clock at the
# start and end of loop tile j's softmax, j = 1 .. TRACE_TILES). None: no trace
# (the kernel's ``trace`` argument is then ``out``, never read).
PROBE_TRACE = None

# A probe (scripts/prefill_page_order.py's ``one``, ``first``): with scalar page ids, one
# block-table lookup a tile instead of one a box (True), or one a sequence ("sequence"), the pages
# taken as consecutive: right only for block tables with consecutive pages (the script's
# "sequential" order); timing only.
PROBE_TILE_LOOKUP = False

# A probe (scripts/prefill_page_order.py's ``rt``): the page size a kernel argument (PAGE_SIZE 0,
# ``page_shift``) instead of a constant, where page ids are scalar loads a box: one binary for
# every page size of a box size (page 16 and page 256 with 16-row boxes run the same kernel).
PROBE_RUNTIME_PAGE = False

# A probe (scripts/prefill_page_order.py, prefill_sweep.py's ``bN``): TMA boxes of at most this
# many rows; None (a page's rows or a tile's) is the kernel. Page 256 with 16-row boxes issues
# page 16's copies and lookups over page 256's layout.
BOX_ROWS = None


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def unsupported_reason(q, k_cache, v_cache, block_table, *, kv_format: int, block_n: int,
                       stages: int) -> str | None:
    """Why ``GluonPrefillLaunch`` cannot run these tensors, or None when it can: a Hopper GPU,
    a plain fp16/bf16 cache in q's dtype, head dim 64 or 128, a GQA group of at most 128 heads
    (groups that do not divide the 128 rows get padding rows), pages and key tiles that nest
    (power-of-two sizes, >= 8 rows a box), each page's rows and heads back to back (the caches
    viewed 2-D as ``[pages * page_size, nheads_k * d]``), 16-byte aligned, and TMA row
    coordinates below 2^31."""
    total_q, nheads, head_dim = q.shape
    num_pages, page_size, nheads_k = k_cache.shape[:3]
    if kv_format != 0:
        return "quantized caches take the Triton kernel"
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "needs a Hopper (sm90) GPU"
    if q.dtype not in (torch.float16, torch.bfloat16) or k_cache.dtype != q.dtype:
        return "needs fp16/bf16 q and caches of q's dtype"
    if head_dim not in (64, 128):
        return f"head_dim must be 64 or 128, got {head_dim}"
    group = nheads // nheads_k
    if group > BLOCK_M.value:
        return f"the GQA group ({group}) must be <= {BLOCK_M.value}"
    if block_n not in (64, 128) or stages < 1:
        return f"block_n must be 64 or 128 and stages >= 1, got {block_n}, {stages}"
    if not _pow2(page_size) or min(page_size, block_n) < 8:
        return f"page_size must be a power of two >= 8, got {page_size}"
    if q.stride(2) != 1:
        return "q's head dim must be contiguous"
    if num_pages * page_size >= 2**31:
        return "the caches' rows pass 2^31"
    for t in (k_cache, v_cache):
        if not (t.stride(3) == 1 and t.stride(2) == head_dim
                and t.stride(1) == nheads_k * head_dim and t.stride(0) == page_size * t.stride(1)
                and t.data_ptr() % 16 == 0 and (t.stride(1) * t.element_size()) % 16 == 0):
            return "each page's rows and heads must be back to back and 16-byte aligned"
    return None


class GluonPrefillLaunch:
    """``PagedPrefillLaunch``'s call for ``_gluon_prefill_kernel``: grid (one CTA an item, or
    with ``persistent`` one an SM), scalars and constants fixed once from the planned shapes; TMA
    descriptors per call (host-side, a few us); through the JIT, or the cached launcher with
    ``CACHED_LAUNCH``."""

    def __init__(self, q, k_cache, v_cache, block_table, *, softmax_scale: float, causal: bool,
                 store_lse: bool, block_n: int, stages: int, last_tiles_first: bool,
                 persistent: bool):
        total_q, nheads, head_dim = q.shape
        page_size, nheads_k = k_cache.shape[1], k_cache.shape[2]
        batch = block_table.shape[0]
        group = nheads // nheads_k
        self.box = min(page_size, block_n, BOX_ROWS or block_n)
        self.head_dim = head_dim
        self.empty = total_q == 0 or batch == 0
        self._num_tiles = total_q // (BLOCK_M.value // group) + batch   # M tiles per KV head
        self._num_items = self._num_tiles * nheads_k
        # Persistent: one CTA an SM (229 KB of shared memory and 64K registers hold one).
        self._num_programs = (min(self._num_items, device_info(q.device)[1]) if persistent
                              else self._num_items)
        self._scale = float(softmax_scale)
        self._batch = batch
        self._constexprs = dict(GROUP=group, IS_CAUSAL=causal, PAGE_SIZE=page_size,
                                BLOCK_N=block_n, HEAD_DIM=head_dim, STORE_LSE=store_lse,
                                LAST_FIRST=last_tiles_first, STAGES=stages,
                                SCALAR_PAGES=SCALAR_PAGES and block_n > self.box,
                                TILE_LOOKUP=({False: 0, True: 1, "sequence": 2}[
                                    PROBE_TILE_LOOKUP] if block_n > self.box else 0),
                                TRACE=PROBE_TRACE is not None,
                                SOFTMAX_FORM=({None: 0, "no_exp": 1, "no_rescale": 2}[
                                    PROBE_SOFTMAX] + 4 * LAZY_RESCALE
                                    + 8 * ROW_TREE
                                    # (not with the lazy rescale or the probes; with the
                                    # trace probe it spills in the loop)
                                    + 64 * (row_sum_mma(self.box) and not LAZY_RESCALE
                                            and PROBE_SOFTMAX is None
                                            and PROBE_TRACE is None)),
                                KV_PAIRED=bool(KV_PAIRED and SCALAR_PAGES and block_n > self.box
                                               and not PROBE_TILE_LOOKUP
                                               and not PROBE_RUNTIME_PAGE),
                                LOADER_PAD=PROBE_LOADER_PAD if KV_PAIRED else 0,
                                PAD_CHAINS=PROBE_PAD_CHAINS)
        self._page_shift = page_size.bit_length() - 1
        if (PROBE_RUNTIME_PAGE and self._constexprs["SCALAR_PAGES"]
                and not self._constexprs["TILE_LOOKUP"]):
            self._constexprs["PAGE_SIZE"] = 0
        self._gl_dtype = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}[q.dtype]
        self.v_pages = bool(V_PAGES and self._constexprs["SCALAR_PAGES"] and head_dim > 64
                            and head_dim % 64 == 0 and self.box >= 8)

    def _desc(self, cache, by_pages: bool = False):
        """TMA descriptor over a cache ``[num_pages, page_size, nheads_k, head_dim]`` as
        ``[num_pages * page_size, nheads_k * head_dim]``, box ``[box, head_dim]``; ``by_pages``
        (V with ``V_PAGES``): as ``[nheads_k * head_dim / 64, num_pages * page_size, 64]``, box
        ``[head_dim / 64, box, 64]``, a page's rows in one copy."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        rows = cache.shape[0] * cache.shape[1]
        if by_pages:
            chunks = self.head_dim // 64
            block = [chunks, self.box, 64]
            layout = gl.NVMMASharedLayout.get_default_for(block, self._gl_dtype)
            return TensorDescriptor(cache, [cache.shape[2] * chunks, rows, 64],
                                    [64, cache.stride(1), 1], block, layout)
        layout = gl.NVMMASharedLayout.get_default_for([self.box, self.head_dim], self._gl_dtype)
        return TensorDescriptor(cache, [rows, cache.shape[2] * cache.shape[3]],
                                [cache.stride(1), 1], [self.box, self.head_dim], layout)

    def __call__(self, q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, out,
                 lse) -> None:
        if self.empty:
            return
        if PROBE_TRACE is not None and (PROBE_TRACE.dtype != torch.int64 or tuple(
                PROBE_TRACE.shape[1:]) != (TRACE_ROUNDS.value, 2, TRACE_EVENTS.value)
                or PROBE_TRACE.shape[0] < self._num_programs or not PROBE_TRACE.is_contiguous()):
            raise ValueError(f"PROBE_TRACE must be a contiguous int64 [>= {self._num_programs}, "
                             f"{TRACE_ROUNDS.value}, 2, {TRACE_EVENTS.value}] tensor")
        lse_arg, stride_lh = (out, 0) if lse is None else (lse, lse.stride(0))
        args = (q, self._desc(k_cache), self._desc(v_cache, self.v_pages), out, lse_arg,
                cu_seqlens_q, cache_seqlens, block_table, self._scale, self._batch, self._num_tiles,
                self._num_items, self._num_programs, q.stride(0), q.stride(1), out.stride(0),
                out.stride(1), stride_lh, block_table.stride(0), self._page_shift,
                out if PROBE_TRACE is None else PROBE_TRACE)
        grid = (self._num_programs, )
        if not CACHED_LAUNCH:
            _gluon_prefill_kernel[grid](*args, **self._constexprs,
                                        num_warps=CONSUMER_WARPS.value)
            return
        ints = tuple(a for a in args[9:-1])
        aligned = alignment_key(q, k_cache, v_cache, out, lse_arg, cu_seqlens_q, cache_seqlens,
                              block_table)
        # The box is in the key: the descriptors' block shape is a specialization, and with
        # BOX_ROWS it no longer follows from PAGE_SIZE and BLOCK_N.
        launch(_gluon_prefill_kernel, ("gluon-prefill", q.dtype, self.box, self.v_pages, ints,
                                       tuple(self._constexprs.values()), aligned),
               (*grid, 1, 1), args, self._constexprs, CONSUMER_WARPS.value, 1,
               q.device.index)
