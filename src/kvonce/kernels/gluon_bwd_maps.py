"""Where the Gluon backward's CTAs find their keys and query rows (``gluon_bwd.py``'s index maps).

A CTA owns (KV head, sequence, key block). Everything a partition needs to know about its tile
comes from these ``@gluon.jit`` helpers, reloaded where needed (L1 hits) rather than held in
registers across the q loop. They only load from ``cu_seqlens*`` / ``kv_end*`` and do scalar
arithmetic, so ``tests/test_gluon_bwd_zigzag.py`` runs their very source in Python (with a
stand-in for ``gl``) to check the maps against the Triton backward's on the CPU.

K/V rows (``_first_key``, ``_key_rows``):

- contiguous: block ``blk`` is key positions ``[128 blk, 128 blk + 128)`` of the sequence, at
  rows ``cu_seqlens_k[seq] + n0 ..``; keys past the sequence's end are masked.
- zigzag all-gather buffer (``KV_ZIGZAG``; ``cu_seqlens_k`` LOCAL, each sequence ``2c`` rows
  per rank, ``c`` its chunk size): a block never crosses a chunk border. Block
  ``blk = j * chunk_blocks + i`` is keys ``[j c + 128 i, min(j c + 128 i + 128, (j + 1) c))``
  of global chunk ``j``, which the zigzag layout stores as ONE run of buffer rows::

      rank r's rows:  [ r * rank_rows + cu_seqlens_k[b] ...                        )
                      [ chunk r of seq b (c rows) | chunk 2W-1-r of seq b (c rows) ] ...
      chunk j < W:    rank j,        offset 0
      chunk j >= W:   rank 2W-1-j,   offset c

  so the loader TMAs it with one row coordinate, whatever ``c`` is (no chunk-size
  restriction). The keys of the last block of a chunk past ``(j + 1) c`` (when ``c`` is not
  a multiple of 128) are rows of other keys: they are masked like keys past a sequence's end
  (``lim``). ``chunk_blocks = cdiv(max chunk, 128)``; blocks with ``128 i >= c`` exit at once.

The kernel takes ``n_chunks = 2 * world`` rather than the world size: a kernel argument used as
it comes is read from the constant bank, where ``2 * world`` would be one more value computed in
the prologue and held (spilled) across the consumers' loop at d128 (kernel-check 2026-11-26).

Query rows (``_group``): group ``g``'s rows of sequence ``seq`` start at ``cu_seqlens_q{g}[seq]``
in its own tensor, or (``LOCAL_ORDER``, both groups in one tensor in a zigzag rank's order) at
``cu_q0[seq] + cu_q1[seq]``, group 1 after group 0's ``len_q0`` rows: the kernel then reads
``(first row, row count)`` of each (group, sequence) from a table the host builds
(``local_order_rows``), passed as ``cu_seqlens_q0``. ``LOCAL_ORDER`` with
``KV_ZIGZAG`` also reads ``kv_end*`` as chunk counts (times ``c``), as the Triton backward's
``KV_END_IN_CHUNKS``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# BLOCK_N keys per CTA, BLOCK_M query rows per step (FA3's hd128 causal tile; Gluon tiles are
# powers of two).
BLOCK_M = gl.constexpr(64)
BLOCK_N = gl.constexpr(128)


@gluon.jit
def _tile(Work, n_blocks, batch, ORDER: gl.constexpr):
    """``(kv_head, seq, blk)`` of this CTA (``gluon_bwd_sched.ORDERS``): 0, the 3-D grid
    ``(nheads_k, batch, key blocks)``; 1, a 1-D grid, KV head outermost, then sequence, key
    blocks fastest; 2, the same with each KV head's items ``seq * n_blocks + blk`` read from
    ``Work`` (longest first)."""
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
    return kv_head, seq, blk


@gluon.jit
def _first_key(cu_seqlens_k, seq, blk, chunk_blocks, KV_ZIGZAG: gl.constexpr):
    """``(n0, empty)``: the position of key block ``blk``'s first key in ``seq`` (``128 blk``, or
    zigzag the ``blk % chunk_blocks``-th 128 keys of global chunk ``blk // chunk_blocks``), and
    whether the block holds no key (past the sequence, or past its chunk when the chunk is
    shorter than the longest: then ``n0`` is in the next chunk, and the CTA must exit)."""
    k_row0 = gl.load(cu_seqlens_k + seq)
    len_stored = gl.load(cu_seqlens_k + seq + 1) - k_row0
    if KV_ZIGZAG:
        chunk = len_stored // 2
        offset = (blk % chunk_blocks) * BLOCK_N
        n0 = (blk // chunk_blocks) * chunk + offset
        empty = offset >= chunk
    else:
        n0 = blk * BLOCK_N
        empty = n0 >= len_stored
    return n0, empty


@gluon.jit
def _key_rows(cu_seqlens_k, seq, n0, n_chunks, rank_rows, KV_ZIGZAG: gl.constexpr):
    """``(kv_row, lim)`` of the block whose first key is ``n0``: the CTA holds key positions
    ``[n0, min(n0 + BLOCK_N, lim))`` at K/V (and dK/dV) rows ``kv_row + [0, ..)``. Contiguous:
    ``lim`` is the sequence's key count. Zigzag: the end of ``n0``'s chunk (module docstring).
    Only for blocks that hold keys (``_first_key``'s ``empty`` is False).
    Derived from ``n0`` alone, so that the consumers hold one scalar across their loop (holding
    the block index's chunk and rank too spilled 24-72 B at d128, kernel-check 2026-11-26)."""
    k_row0 = gl.load(cu_seqlens_k + seq)
    len_stored = gl.load(cu_seqlens_k + seq + 1) - k_row0
    if KV_ZIGZAG:
        chunk = len_stored // 2
        j = n0 // gl.maximum(chunk, 1)
        early = 2 * j < n_chunks
        rank = gl.where(early, j, n_chunks - 1 - j)
        kv_row = rank * rank_rows + k_row0 + gl.where(early, 0, chunk) + n0 - j * chunk
        lim = j * chunk + chunk
    else:
        kv_row = k_row0 + n0
        lim = len_stored
    return kv_row, lim


@gluon.jit
def _group(g, seq, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, n_chunks,
           n0, batch, KV_END_SCALAR: gl.constexpr, KV_ZIGZAG: gl.constexpr,
           LOCAL_ORDER: gl.constexpr):
    """``(row, len_q, end, vis_end)`` of group ``g`` in sequence ``seq``: its first row, row
    count and visible key count (clamped to ``[0, len_k]`` as the forward does: the causal
    diagonal's anchor), and the end of the keys the CTA of first key ``n0`` may show it
    (``min(end, lim)``, ``_key_rows``)."""
    if LOCAL_ORDER:
        # cu_seqlens_q0 is the host's table (``local_order_rows``): the address depends on g,
        # so the loads stay in the consumers' loop (group-invariant loads of both cu_seqlens_q*
        # are hoisted out of it and held: 8 B spilled at d128, kernel-check 2026-11-26).
        entry = cu_seqlens_q0 + (g * batch + seq) * 2
        row = gl.load(entry)
        len_q = gl.load(entry + 1)
    else:
        cu_q = gl.where(g == 0, cu_seqlens_q0, cu_seqlens_q1)
        row = gl.load(cu_q + seq)
        len_q = gl.load(cu_q + seq + 1) - row
    len_k = gl.load(cu_seqlens_k + seq + 1) - gl.load(cu_seqlens_k + seq)
    if KV_END_SCALAR:
        end = gl.where(g == 0, kv_end0, kv_end1)
    else:
        end = gl.load(gl.where(g == 0, kv_end0, kv_end1) + seq)
    if KV_ZIGZAG:
        chunk = len_k // 2
        len_k = chunk * n_chunks             # global key count
        if LOCAL_ORDER:
            end = end * chunk                # kv_end* count chunks
    end = gl.minimum(gl.maximum(end, 0), len_k)
    if KV_ZIGZAG:
        j = n0 // gl.maximum(chunk, 1)
        vis_end = gl.minimum(end, j * chunk + chunk)      # the chunk's end: _key_rows's lim
    else:
        vis_end = end                        # lim == len_k
    return row, len_q, end, vis_end


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
def _n_segments(kv_group, n_segments, KV_ZIGZAG: gl.constexpr):
    """The q loop's trip count, ``2 * kv_group`` (both groups of every q head of the KV head),
    read as the argument ``n_segments`` (the constant bank) by every kernel: computed from
    ``kv_group`` it is one more register held across the consumers' loop, which ptxas spilled
    (8-12 B at d128, kernel-check 2026-11-26). ``kv_group`` and ``KV_ZIGZAG`` stay in the
    signature for the callers."""
    return n_segments


@gluon.jit
def _segment(tr, n0, n_seg, ROTATE: gl.constexpr):
    """The loop's ``tr``-th (q head, group) segment ``t`` of ``n_seg``: ``tr`` itself, or
    (``ROTATE``) shifted by the key block's index so that the CTAs of one KV head spread their dQ
    reduce-adds over the q heads and groups."""
    if ROTATE:
        t = (tr + n0 // BLOCK_N) % n_seg
    else:
        t = tr
    return t


def local_order_rows(cu_seqlens_q0, cu_seqlens_q1):
    """int32 ``[2, batch, 2]``: ``(first row, row count)`` of group ``g`` of sequence ``b`` in
    a zigzag rank's local order (``cu_q0[b] + cu_q1[b]``, group 1 after group 0's rows), the
    ``LOCAL_ORDER`` kernels' ``cu_seqlens_q0``. Device-side torch ops: no host sync."""
    import torch

    cu0, cu1 = cu_seqlens_q0.to(torch.int32), cu_seqlens_q1.to(torch.int32)
    len0, len1 = cu0[1:] - cu0[:-1], cu1[1:] - cu1[:-1]
    start0 = cu0[:-1] + cu1[:-1]
    return torch.stack([torch.stack([start0, len0], 1),
                        torch.stack([start0 + len0, len1], 1)]).contiguous()
