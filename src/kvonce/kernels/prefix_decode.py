"""Shared-prefix paged decode (cascade): the chunk-first kernel and the launches of the cascade.

A cascade step is three launches, in this order on one stream:

1. ``_prefix_chunk_kernel`` (chunk-first): one program per (work item, KV head); a work item is
   one tree node's M-block of packed rows and one key chunk of its shared page run. The node's
   rows are all its member sequences' rows, packed as

       row r  ->  member i = r // (GROUP * q_len),  then as in the decode kernel:
                  token t = (r % (GROUP * q_len)) // GROUP,  q head = kv_head * GROUP + r % GROUP

   so every K/V tile of the shared run is loaded once per M-block (BLOCK_M up to 128 rows of
   several sequences) and fed to tensor-core ``tl.dot``s. Each program writes a float32 partial
   ``(o, lse)`` per row into its slot of ``o_part / lse_part``. The same launch also writes the
   suffix view for phase 2 (grid-stride over the sequences): ``suffix_seqlens[b] =
   max(cache_seqlens[b] - prefix_pages[b] * PAGE_SIZE, 0)`` and ``suffix_table[b, c] =
   block_table[b, prefix_pages[b] + c]`` for the columns the suffix uses (no extra launch, no
   host sync).
2. The plain decode kernel (``paged_decode._paged_decode_kernel``) over the suffix view, storing
   float32 partials (split-K layout, never merged in the launch) into slots ``[0, S_suffix)``.
   Causal masking is invariant to the shift: row t sees suffix key ``j' <= t + (L - P) - q_len``
   iff it sees key ``j' + P <= t + L - q_len``.
3. ``paged_combine._combine_splits_kernel`` merges the ``S`` slots of each row (a slot a row does
   not use holds ``lse = -inf``, set once at plan time: it weighs exactly zero).

Slot layout of ``o_part [batch, q_len, nheads, S, d]``: suffix splits first, then for each node
on the sequence's root-to-leaf chain its key chunks, a child's after its parent's, so the slots
of a sequence are always ``[0, S_suffix + chain_chunks_b)``.

Per-row causal diagonals. Row r of member b sees key j iff ``j <= last_key_r`` with
``last_key_r = t + L_b - q_len`` (causal) or ``L_b - 1``: ``_online_update`` gets ``offs_m =
last_key`` and ``diag = 0``. A sequence with no page beyond the shared run and q_len > 1 is
therefore masked inside the shared pages, and a node run longer than a member's keys is cut at
its length. Tiles below every row's diagonal take the unmasked loop.

Softmax runs in base 2 (``log2(e)`` folded into the scale); stored LSEs are natural log.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import paged_decode
from ._launch import alignment_key, dot_input_precision, launch, next_pow2
from .dual_group_fwd import _online_update
from .paged_combine import _combine_splits_kernel, combine_launch_shape, combine_pdl
from .paged_decode import _load_paged_kv_tile, _paged_decode_kernel, _span, decode_row_blocks

# Columns of one work item in the plan's int32 ``work [num_work, WORK_FIELDS]`` table.
WORK_FIELDS = 6  # member_start, member_count, row0, key_lo, key_hi, slot


@triton.jit
def _write_suffix_view(block_table, cache_seqlens, PrefixPages, SuffixTable, SuffixSeqlens, pid,
                       num_progs, batch, suffix_width, stride_btb,
                       PAGE_SIZE: tl.constexpr, BLOCK_P: tl.constexpr):
    """Sequences ``pid, pid + num_progs, ..``: their suffix length and the block-table columns
    of their suffix, shifted to column 0 (only the columns the suffix reads)."""
    offs = tl.arange(0, BLOCK_P)
    for b in range(pid, batch, num_progs):
        skip = tl.load(PrefixPages + b)
        n_keys = tl.maximum(tl.load(cache_seqlens + b) - skip * PAGE_SIZE, 0)
        tl.store(SuffixSeqlens + b, n_keys)
        n_cols = tl.minimum(tl.cdiv(n_keys, PAGE_SIZE), suffix_width)
        src = block_table + b * stride_btb + skip  # int32: tables hold < 2^31 entries
        dst = SuffixTable + b * suffix_width
        for c0 in range(0, n_cols, BLOCK_P):
            cols = c0 + offs
            ok = cols < n_cols
            tl.store(dst + cols, tl.load(src + cols, mask=ok), mask=ok)


@triton.jit
def _attend_shared(acc, m_i, l_i, q, lo, hi, qk_scale, last_key, kv_end, K, V, bt_row,
                   stride_kp, stride_kt, stride_vp, stride_vt, offs_d, head_dim,
                   MASKED: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                   EVEN_D: tl.constexpr, KV_CACHE: tl.constexpr, KV_EVICT: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, INT64_KV: tl.constexpr):
    """Key tiles ``[lo, hi)`` of the shared run into the packed rows' state; row ``i`` sees key
    ``j`` iff ``j <= last_key[i]`` (its own sequence's diagonal) and ``j < kv_end``."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, k_t, v = _load_paged_kv_tile(K, V, bt_row, start_n, kv_end, stride_kp, stride_kt,
                                             stride_vp, stride_vt, offs_d, head_dim, PAGE_SIZE,
                                             BLOCK_N, EVEN_D, MASKED, KV_CACHE, KV_EVICT,
                                             INT64_KV)
        acc, m_i, l_i = _online_update(acc, m_i, l_i, q, k_t, v, qk_scale, last_key, offs_n, 0,
                                       kv_end, MASKED, DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def _prefix_chunk_kernel(
    Q,              # [batch, q_len, nheads, HEAD_DIM], last dim contiguous
    K, V,           # [num_pages, PAGE_SIZE, nheads_k, HEAD_DIM], last dim contiguous
    cache_seqlens,  # int32 [batch]
    block_table,    # int32 [batch, max_pages], last dim contiguous
    Work,           # int32 [num_work, 6]: member_start, member_count, row0, key_lo, key_hi, slot
    Members,        # int32 [num_member_entries]: each node's member sequences, node after node
    PrefixPages,    # int32 [batch]: pages of the deepest node of each sequence (0: none)
    Opart,          # float32 [batch, q_len, nheads, S, HEAD_DIM]
    Lpart,          # float32 [batch, q_len, nheads, S]
    SuffixTable,    # int32 [batch, suffix_width], contiguous (written)
    SuffixSeqlens,  # int32 [batch] (written)
    sm_scale, batch, q_len, head_dim, suffix_width,
    stride_qb, stride_qt, stride_qh,
    stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ob, stride_ot, stride_oh, stride_os,
    stride_lb, stride_lt, stride_lh, stride_ls,
    stride_btb,
    GROUP: tl.constexpr, IS_CAUSAL: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    BLOCK_P: tl.constexpr, KV_CACHE: tl.constexpr, KV_EVICT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # tl.dot's input_precision: "ieee" or "tf32" (fp32 inputs only)
    INT64_KV: tl.constexpr,  # int64 K/V offsets (PrefixDecodeConfig.int64_kv_offsets or > 2^31)
):
    # Grid: (num_work, nheads_k). The plan orders the work items chunk by chunk with a chunk's
    # M-blocks side by side, so the M-blocks of one tile range run together and share it in L2.
    item = tl.program_id(0)
    kv_head = tl.program_id(1)
    _write_suffix_view(block_table, cache_seqlens, PrefixPages, SuffixTable, SuffixSeqlens,
                       item * tl.num_programs(1) + kv_head,
                       tl.num_programs(0) * tl.num_programs(1), batch, suffix_width, stride_btb,
                       PAGE_SIZE, BLOCK_P)

    w = Work + item * 6
    member_start = tl.load(w)
    member_count = tl.load(w + 1)
    row0 = tl.load(w + 2)
    lo = tl.load(w + 3)
    key_hi = tl.load(w + 4)
    slot = tl.load(w + 5)

    rows = row0 + tl.arange(0, BLOCK_M)
    rows_per_member = GROUP * q_len
    row_ok = rows < member_count * rows_per_member
    local = rows % rows_per_member
    tok = local // GROUP
    head = kv_head * GROUP + local % GROUP
    seq = tl.load(Members + member_start + rows // rows_per_member, mask=row_ok, other=0)
    seqlen = tl.load(cache_seqlens + seq, mask=row_ok, other=0)
    if IS_CAUSAL:
        last_key = tok + seqlen - q_len  # row sees key j <= last_key (bottom-right diagonal)
    else:
        last_key = seqlen - 1
    # Only keys some row sees are loaded (a member may end inside the run); padding rows count
    # for neither bound.
    hi = tl.minimum(key_hi, tl.max(tl.where(row_ok, last_key, -1), 0) + 1)
    all_see = tl.minimum(hi, tl.min(tl.where(row_ok, last_key, key_hi), 0) + 1)
    full = lo + tl.maximum(all_see - lo, 0) // BLOCK_N * BLOCK_N

    offs_d = tl.arange(0, BLOCK_D)
    seq64 = seq.to(tl.int64)
    q_ptrs = (Q + (seq64 * stride_qb + tok * stride_qt + head * stride_qh)[:, None]
              + offs_d[None, :])
    if EVEN_D:
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)

    # The members' block-table rows agree on the run's columns: read the first member's.
    bt_row = block_table + tl.load(Members + member_start).to(tl.int64) * stride_btb
    K += kv_head * stride_kh
    V += kv_head * stride_vh
    qk_scale = sm_scale * 1.4426950408889634
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = _attend_shared(acc, m_i, l_i, q, lo, full, qk_scale, last_key, hi, K, V,
                                   bt_row, stride_kp, stride_kt, stride_vp, stride_vt, offs_d,
                                   head_dim, False, PAGE_SIZE, BLOCK_N, EVEN_D, KV_CACHE,
                                   KV_EVICT, DOT_PRECISION, INT64_KV)
    # Under the branch, not just an empty loop: the masked loop's pipeline prologue would
    # otherwise run (and its first tile's block-table load wait) in every chunk that ends on a
    # tile every row sees whole (paged_decode._attend_kv_head, the same).
    if full < hi:
        acc, m_i, l_i = _attend_shared(acc, m_i, l_i, q, full, hi, qk_scale, last_key, hi, K, V,
                                       bt_row, stride_kp, stride_kt, stride_vp, stride_vt,
                                       offs_d, head_dim, True, PAGE_SIZE, BLOCK_N, EVEN_D,
                                       KV_CACHE, KV_EVICT, DOT_PRECISION, INT64_KV)

    # o = acc / l (0 where the row saw no key of this chunk), lse natural log (-inf there).
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    o_ptrs = (Opart + (seq64 * stride_ob + tok * stride_ot + head * stride_oh
                       + slot * stride_os)[:, None] + offs_d[None, :])
    if EVEN_D:
        tl.store(o_ptrs, out, mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, out, mask=row_ok[:, None] & (offs_d[None, :] < head_dim))
    tl.store(Lpart + seq64 * stride_lb + tok * stride_lt + head * stride_lh + slot * stride_ls,
             lse, mask=row_ok)


def _device_index(t) -> int:
    return t.device.index if t.device.type == "cuda" else -1


def _partial_strides(q_len: int, nheads: int, slots: int, head_dim: int):
    """(batch, token, head, slot) strides of contiguous ``o_part [batch, q_len, nheads, slots,
    d]`` and ``lse_part [batch, q_len, nheads, slots]``."""
    return ((q_len * nheads * slots * head_dim, nheads * slots * head_dim, slots * head_dim,
             head_dim),
            (q_len * nheads * slots, nheads * slots, slots, 1))


class CascadeLaunch:
    """The three launches of one cascade shape, fixed once (grids, scalars, constants, keys).

    Built from the planned tensors' shapes and strides; ``__call__`` launches, through
    ``_launch.launch``, for tensors with exactly those shapes and strides (checks are the
    caller's): ``work`` int32 ``[num_work, 6]``, ``members`` int32, ``prefix_pages`` int32
    ``[batch]``, scratch ``o_part`` float32 ``[batch, q_len, nheads, S, d]`` and ``lse_part``
    ``[batch, q_len, nheads, S]`` (contiguous; the slots a row never uses hold ``lse = -inf``),
    ``suffix_table`` int32 contiguous ``[batch, suffix_width]``, ``suffix_seqlens`` int32
    ``[batch]``; ``out`` contiguous ``[batch, q_len, nheads, d]`` in q's dtype and ``lse``
    float32 contiguous ``[batch, nheads, q_len]`` (None with ``store_lse=False``).

    ``suffix_splits`` slots ``[0, suffix_splits)`` hold the suffix decode's split-K partials;
    the decode kernel is launched directly (SPLIT, never MERGE_HERE) because ``PagedDecodeLaunch``
    always merges its splits into a final output.
    """

    def __init__(self, q, k_cache, v_cache, block_table, *, num_work: int, slots: int,
                 suffix_splits: int, suffix_width: int, block_m: int, softmax_scale: float,
                 causal: bool, config, decode_config, store_lse: bool):
        batch, q_len, nheads, head_dim = q.shape
        page_size, nheads_k = k_cache.shape[1], k_cache.shape[2]
        group = nheads // nheads_k
        block_d = max(16, next_pow2(head_dim))
        self.batch, self.device_index = batch, _device_index(q)
        dst_o, dst_l = _partial_strides(q_len, nheads, slots, head_dim)
        scale = float(softmax_scale)
        kv_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
        precision = dot_input_precision(q.dtype)  # fp32 dots as PyTorch would (fixed per plan)
        past_int32 = max(_span(k_cache), _span(v_cache)) >= 2**31

        # 1. chunk-first: (work item, KV head); a grid of at least one program writes the view.
        ints = (batch, q_len, head_dim, suffix_width, *q.stride()[:3], *kv_strides, *dst_o,
                *dst_l, block_table.stride(0))
        constexprs = dict(GROUP=group, IS_CAUSAL=causal, PAGE_SIZE=page_size, BLOCK_M=block_m,
                          BLOCK_N=config.block_n, BLOCK_D=block_d, EVEN_D=block_d == head_dim,
                          BLOCK_P=128, KV_CACHE=config.kv_cache_modifier,
                          KV_EVICT=config.kv_eviction, DOT_PRECISION=precision,
                          INT64_KV=config.int64_kv_offsets or past_int32)
        warps = (config.num_warps if block_m >= 128 else 4, config.num_stages)
        self._chunk = (("chunk", q.dtype, k_cache.dtype, ints, tuple(constexprs.values()), warps),
                       (max(1, num_work), nheads_k, 1), scale, ints, constexprs, warps)

        # 2. sequence-first: the decode kernel over the suffix view, partials into slots
        # [0, suffix_splits). Arguments in _paged_decode_kernel's order (plain cache: the scale
        # pointers and strides are never read).
        block_m_dec, num_m_blocks = decode_row_blocks(nheads, nheads_k, q_len)
        ints = (q_len, suffix_splits, num_m_blocks, head_dim, *q.stride()[:3], *kv_strides,
                0, 0, 0, 0, 0, 0, *dst_o, *dst_l, suffix_width, 0, 0, 0)
        c = decode_config
        constexprs = dict(GROUP=group, IS_CAUSAL=causal, PAGE_SIZE=page_size,
                          BLOCK_M=block_m_dec, BLOCK_N=c.block_n, BLOCK_D=block_d,
                          EVEN_D=block_d == head_dim, STORE_LSE=True, SPLIT=True,
                          MERGE_HERE=False, KV_CACHE=c.kv_cache_modifier,
                          KV_EVICT=c.kv_eviction, KV_FORMAT=0, DOT_PRECISION=precision,
                          SWAP_AB=c.swap_ab, F16_MATH=False,
                          INT64_KV=c.int64_kv_offsets or past_int32, V_PAIRS=False,
                          N_OUT=0, SCALE_PAIRS=False, PREFETCH_PAGES=c.prefetch_pages,
                          MERGE_SPLITS_AT_ONCE=1, HEAD_PAIRS=False,
                          PDL_TRIGGER=combine_pdl(q.device, "prefix"), PDL_EXIT_WAIT=False,
                          MASKED_STAGES=paged_decode.MASKED_LOOP_STAGES)
        warps = (c.num_warps, c.num_stages)
        self._suffix = (("suffix", q.dtype, k_cache.dtype, ints, tuple(constexprs.values()),
                         warps), (suffix_splits * num_m_blocks, nheads_k, batch), scale, ints,
                        constexprs, warps)

        # 3. combine: one program per (head, channel chunk, token, sequence) over the S slots.
        ints = (slots, head_dim, *dst_o, *dst_l, q_len * nheads * head_dim, nheads * head_dim,
                head_dim, nheads * q_len, 1, q_len)
        grid, constexprs, warps = combine_launch_shape(nheads, q_len, batch, slots, block_d,
                                                       pdl=combine_pdl(q.device, "prefix"))
        constexprs["STORE_LSE"] = store_lse
        self._combine = (("combine", q.dtype, ints, tuple(constexprs.values())),
                         grid, ints, constexprs, warps)

    def __call__(self, q, k_cache, v_cache, cache_seqlens, block_table, work, members,
                 prefix_pages, o_part, lse_part, suffix_table, suffix_seqlens, out, lse) -> None:
        if self.batch == 0:
            return
        if lse is None:  # STORE_LSE is off: never dereferenced
            lse = out
        aligned = alignment_key(q, k_cache, v_cache, cache_seqlens, block_table, work, members,
                              prefix_pages, o_part, lse_part, suffix_table, suffix_seqlens, out,
                              lse)
        key, grid, scale, ints, constexprs, warps = self._chunk
        launch(_prefix_chunk_kernel, (key, aligned), grid,
               (q, k_cache, v_cache, cache_seqlens, block_table, work, members, prefix_pages,
                o_part, lse_part, suffix_table, suffix_seqlens, scale, *ints),
               constexprs, *warps, self.device_index)
        key, grid, scale, ints, constexprs, warps = self._suffix
        # FinalOut, FinalLse, Arrivals, KS, VS, KO, KOC: never dereferenced (no MERGE_HERE, a
        # plain cache, no outlier channels).
        launch(_paged_decode_kernel, (key, aligned), grid,
               (q, k_cache, v_cache, suffix_seqlens, suffix_seqlens, o_part, lse_part,
                suffix_seqlens, suffix_table, out, lse, suffix_seqlens, suffix_seqlens,
                suffix_seqlens, scale, *ints),
               constexprs, *warps, self.device_index)
        key, grid, ints, constexprs, warps = self._combine
        launch(_combine_splits_kernel, (key, aligned), grid, (o_part, lse_part, out, lse, *ints),
               constexprs, *warps, self.device_index, launch_pdl=constexprs["PDL_WAIT"])
