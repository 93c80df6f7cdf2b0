"""Varlen paged attention: any mix of prefill, chunked-prefill and decode rows in one launch.

Sequence ``b`` brings ``q_len_b = cu_seqlens_q[b + 1] - cu_seqlens_q[b]`` query rows (``q_len_b``
may be 0): its NEWEST tokens, already in the paged cache and counted by ``cache_seqlens[b]``.
Causal is bottom-right: row ``i`` of sequence ``b`` sees key ``j <= i + cache_seqlens[b] -
q_len_b``.

GQA packing, as in the decode kernel (kernels/paged_decode.py). One program owns one (M tile, KV
head): ``BLOCK_Q = BLOCK_M // GROUP`` consecutive tokens of one sequence times the ``GROUP`` q
heads that read this KV head, heads fastest::

    row r of the tile  ->  token tok0 + r // GROUP,  q head = kv_head * GROUP + r % GROUP
    (rows >= BLOCK_Q * GROUP and tokens >= q_len_b are padding: q = 0, never stored)

so each K/V tile is loaded once for all ``GROUP`` heads. The key loop is the decode kernel's
(``_attend_kv_head``: one page lookup per key row per tile, plain and quantized caches alike):
only the program's setup differs. The Hopper row adds what the decode kernel does not use: page
ids looked up a tile ahead, int32 offsets while the caches fit, and TMA descriptors for unmasked
tiles when pages hold whole tiles. Unmasked key tiles first (keys every row of the tile sees: below
``min(frontier, diag + tok0 + 1)``), then the masked diagonal band up to the tile's causal
frontier ``min(seqlen, diag + last_tok + 1)`` (non-causal: ``seqlen``).

Work is mapped on the device, with no host sync (vLLM's unified-attention trick): sequence ``b``'s
tiles start at index ``cu_seqlens_q[b] // BLOCK_Q + b``, so the grid's first dimension
``total_q // BLOCK_Q + batch`` (shapes only) bounds every sequence's tiles, and each program finds
its sequence by a binary search over ``cu_seqlens_q``; surplus programs return at once.

No key splits in this version: a program walks all its keys (long histories with few query rows
get few programs; split-K for them is the decode kernel's job today).

Softmax runs in base 2 (``log2(e)`` folded into the scale, ``exp2`` throughout); the stored LSE is
natural log: ``lse = (m + log2(l)) * ln 2``. A row that sees no key stores out 0, lse -inf.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import alignment_key, dot_input_precision, launch, next_pow2
# The shared key loop (plain and quantized tile loads, online softmax) and the scale strides.
from .paged_decode import _attend_kv_head, _scale_strides, _span
from .paged_outliers import _outlier_queries, _without_outlier_channels


@triton.jit
def _find_sequence(cu_seqlens_q, tile, batch, BLOCK_Q: tl.constexpr):
    """The sequence whose tiles hold tile index ``tile``: the last ``b`` with
    ``cu_seqlens_q[b] // BLOCK_Q + b <= tile`` (binary search; the index is monotone in b)."""
    # int32 scalars from the start: loop-carried values must keep one type (a literal 0, or
    # batch specialized to the constant 1, would enter the loop as constexprs).
    lo = tl.full([], 0, tl.int32)
    hi = tl.full([], 0, tl.int32) + batch
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(cu_seqlens_q + mid) // BLOCK_Q + mid
        if start <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_prefill_kernel(
    Q,                 # [total_q, nheads, HEAD_DIM], last dim contiguous
    K, V,              # [num_pages, PAGE_SIZE, nheads_k, HEAD_DIM], last dim contiguous
                       # (quantized: kvonce.paged.quant's layouts; int4 HEAD_DIM // 2 bytes)
    KS, VS,            # quantized caches' scales (any pointer when KV_FORMAT is 0)
    Kd, Vd,            # with USE_DESC: TMA descriptors of the caches as [pages * PAGE_SIZE, nheads_k * d]
    Out,               # [total_q, nheads, HEAD_DIM], q's dtype
    Lse,               # float32 [nheads, total_q] (any pointer without STORE_LSE)
    cu_seqlens_q,      # int32 [batch + 1]
    cache_seqlens,     # int32 [batch]
    block_table,       # int32 [batch, max_pages]
    KO, KOC,           # N_OUT > 0: outlier values and channels (kernels/paged_outliers.py)
    sm_scale, batch, head_dim,
    stride_qt, stride_qh,
    stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    stride_ot, stride_oh, stride_lh,
    stride_btb,
    stride_kop, stride_kot, stride_koh,
    GROUP: tl.constexpr, IS_CAUSAL: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    STORE_LSE: tl.constexpr, KV_CACHE: tl.constexpr, KV_EVICT: tl.constexpr,
    KV_FORMAT: tl.constexpr, BLOCK_Q: tl.constexpr, LAST_FIRST: tl.constexpr,
    INT64_KV: tl.constexpr, PREFETCH_PAGES: tl.constexpr, USE_DESC: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # tl.dot's input_precision: "ieee" or "tf32" (fp32 inputs only)
    PACK_GQA: tl.constexpr = True,
    N_OUT: tl.constexpr = 0,  # outlier channels per KV head kept at q's precision (0: none)
):
    # PACK_GQA: BLOCK_Q = BLOCK_M // GROUP tokens per tile, grid (total_q // BLOCK_Q + batch,
    # nheads_k). Otherwise one q head per program: BLOCK_Q = BLOCK_M, grid (.., nheads).
    if LAST_FIRST:
        tile = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        tile = tl.program_id(0)
    if PACK_GQA:
        kv_head = tl.program_id(1)
    else:
        kv_head = tl.program_id(1) // GROUP
    seq = _find_sequence(cu_seqlens_q, tile, batch, BLOCK_Q)
    q_start = tl.load(cu_seqlens_q + seq)
    q_len = tl.load(cu_seqlens_q + seq + 1) - q_start
    tok0 = (tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    if tok0 >= q_len:  # surplus program (or an empty sequence's slot)
        return
    seqlen = tl.load(cache_seqlens + seq)

    rows = tl.arange(0, BLOCK_M)
    if PACK_GQA:
        tok = tok0 + rows // GROUP
        head = kv_head * GROUP + rows % GROUP
        row_ok = (rows < BLOCK_Q * GROUP) & (tok < q_len)
    else:
        tok = tok0 + rows
        head = tl.program_id(1) + rows * 0
        row_ok = tok < q_len
    offs_d = tl.arange(0, BLOCK_D)
    # int64: (q_start + tok) * stride_qt passes 2^31 for long batches.
    q_rows = (q_start + tok).to(tl.int64)
    q_ptrs = Q + (q_rows * stride_qt + head * stride_qh)[:, None] + offs_d[None, :]
    if EVEN_D:
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)
    if N_OUT > 0:
        q_out = _outlier_queries(Q + q_rows * stride_qt + head * stride_qh, KOC, kv_head, row_ok,
                                 N_OUT)
        if KV_FORMAT == 3:
            q = _without_outlier_channels(q, KOC, kv_head, offs_d, N_OUT)
    else:
        q_out = 0.0

    if IS_CAUSAL:
        diag = seqlen - q_len                       # row t sees key j <= t + diag
        last_tok = tl.minimum(tok0 + BLOCK_Q, q_len) - 1
        hi = tl.maximum(tl.minimum(seqlen, diag + last_tok + 1), 0)  # the tile's frontier
        all_see = tl.minimum(hi, diag + tok0 + 1)  # keys below this are visible to every row
    else:
        diag = seqlen
        hi = seqlen
        all_see = seqlen
    full = tl.maximum(all_see, 0) // BLOCK_N * BLOCK_N

    acc, m_i, l_i = _attend_kv_head(
        q, 0, full, hi, tok, diag, sm_scale, kv_head, seq, K, V, KS, VS, block_table,
        stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_ksp, stride_kst,
        stride_ksh, stride_vsp, stride_vst, stride_vsh, stride_btb, offs_d, head_dim,
        PAGE_SIZE, BLOCK_M, BLOCK_N, BLOCK_D, EVEN_D, KV_CACHE, KV_EVICT, KV_FORMAT,
        DOT_PRECISION, INT64_KV, PREFETCH_PAGES, Kd, Vd, USE_DESC, q_out=q_out, KO=KO,
        stride_kop=stride_kop, stride_kot=stride_kot, stride_koh=stride_koh, N_OUT=N_OUT)

    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = Out + (q_rows * stride_ot + head * stride_oh)[:, None] + offs_d[None, :]
    if EVEN_D:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_d[None, :] < head_dim))
    if STORE_LSE:
        lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        tl.store(Lse + head.to(tl.int64) * stride_lh + q_rows, lse, mask=row_ok)


def _tma_ok(config, k_cache, v_cache, kv_format: int, head_dim: int, block_d: int) -> bool:
    """TMA descriptors for unmasked K/V tiles: asked for by the config, a plain cache on a CUDA
    device, pages holding whole key tiles, a power-of-two head dim, each page's rows and heads back
    to back (a 2-D ``[pages * page_size, nheads_k * d]`` view) and 16-byte aligned bases and rows."""
    if (not config.tma or kv_format != 0 or k_cache.device.type != "cuda" or head_dim != block_d
            or k_cache.shape[1] % config.block_n != 0):
        return False
    return all(t.shape[0] > 0 and t.stride(3) == 1 and t.stride(2) == head_dim
               and t.stride(1) == t.shape[2] * head_dim and t.stride(0) == t.shape[1] * t.stride(1)
               and t.data_ptr() % 16 == 0 and (t.stride(1) * t.element_size()) % 16 == 0
               for t in (k_cache, v_cache))


def prefill_block_m(config_block_m: int, group: int) -> int:
    """Packed rows per tile: the config's, but at least one token's ``GROUP`` heads (next power
    of two; >= 16 for tl.dot)."""
    return max(16, config_block_m, next_pow2(group))


class PagedPrefillLaunch:
    """One varlen paged shape's launch, fixed once: grid, scalar arguments, constants, cache key.

    Built from the (planned) tensors' shapes and strides: ``q [total_q, nheads, d]``, the caches,
    ``block_table [batch, max_pages]``. ``__call__`` launches ``_paged_prefill_kernel`` through
    ``_launch.launch`` for tensors with exactly those shapes and strides; checks are the caller's.
    ``out`` is ``[total_q, nheads, d]`` (q's dtype, strides as q's or contiguous: passed per
    call), ``lse`` float32 contiguous ``[nheads, total_q]`` (None with ``store_lse=False``).
    """

    def __init__(self, q, k_cache, v_cache, block_table, *, softmax_scale: float, causal: bool,
                 config, store_lse: bool, kv_format: int = 0, k_scale=None, v_scale=None,
                 outlier_values=None):
        total_q, nheads, head_dim = q.shape
        page_size, nheads_k = k_cache.shape[1], k_cache.shape[2]
        batch = block_table.shape[0]
        group = nheads // nheads_k
        if config.pack_gqa:
            block_m = prefill_block_m(config.block_m, group)
            block_q = block_m // group
        else:  # one q head per program: the rows are tokens
            block_m = max(16, config.block_m)
            block_q = block_m
        block_d = max(16, next_pow2(head_dim))
        self.empty = total_q == 0 or batch == 0
        self.device_index = q.device.index if q.device.type == "cuda" else -1
        self._ints = (batch, head_dim, *q.stride()[:2], *k_cache.stride()[:3],
                      *v_cache.stride()[:3], *_scale_strides(k_scale, kv_format),
                      *_scale_strides(v_scale, kv_format), nheads * head_dim, head_dim, total_q,
                      block_table.stride(0),
                      *(outlier_values.stride()[:3] if outlier_values is not None else (0, 0, 0)))
        self._scale = float(softmax_scale)
        self._grid = (total_q // block_q + batch, nheads_k if config.pack_gqa else nheads, 1)
        self._constexprs = dict(
            GROUP=group, IS_CAUSAL=causal, PAGE_SIZE=page_size, BLOCK_M=block_m,
            BLOCK_N=config.block_n, BLOCK_D=block_d, EVEN_D=block_d == head_dim,
            STORE_LSE=store_lse, KV_CACHE=config.kv_cache_modifier, KV_EVICT=config.kv_eviction,
            KV_FORMAT=kv_format, BLOCK_Q=block_q, LAST_FIRST=config.last_tiles_first,
            # int32 K/V offsets while both caches' elements stay below 2^31 (shapes only)
            INT64_KV=config.int64_kv_offsets or max(_span(k_cache), _span(v_cache)) >= 2**31,
            PREFETCH_PAGES=config.prefetch_pages,
            USE_DESC=_tma_ok(config, k_cache, v_cache, kv_format, head_dim, block_d),
            DOT_PRECISION=dot_input_precision(q.dtype),  # fp32 as PyTorch would (fixed per plan)
            PACK_GQA=config.pack_gqa,
            N_OUT=outlier_values.shape[3] if outlier_values is not None else 0)
        self._warps = (config.num_warps, config.num_stages)
        self._key = (q.dtype, k_cache.dtype, k_scale.dtype if k_scale is not None else None,
                     outlier_values.dtype if outlier_values is not None else None,
                     self._ints, tuple(self._constexprs.values()), self._warps)
        self._gluon = None
        if config.gluon and config.pack_gqa:
            from . import gluon_prefill

            if gluon_prefill.unsupported_reason(q, k_cache, v_cache, block_table,
                                                kv_format=kv_format, block_n=config.gluon_block_n,
                                                stages=config.gluon_stages) is None:
                self._gluon = gluon_prefill.GluonPrefillLaunch(
                    q, k_cache, v_cache, block_table, softmax_scale=softmax_scale,
                    causal=causal, store_lse=store_lse, block_n=config.gluon_block_n,
                    stages=config.gluon_stages, last_tiles_first=config.last_tiles_first,
                    persistent=config.gluon_persistent)

    def __call__(self, q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, out, lse,
                 k_scale=None, v_scale=None, outlier_values=None, outlier_channels=None) -> None:
        """``out`` must be contiguous ``[total_q, nheads, d]``; ``lse`` float32 contiguous
        ``[nheads, total_q]`` or None; ``outlier_values``/``outlier_channels``: dense-and-sparse
        keys (the launch was built with those values' shape and strides)."""
        if self.empty:
            return
        if self._gluon is not None:
            self._gluon(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, out, lse)
            return
        if lse is None:  # never dereferenced (STORE_LSE is off): any pointer will do
            lse = out
        if k_scale is None:  # plain cache: never dereferenced
            k_scale = v_scale = cache_seqlens
        if outlier_values is None:  # N_OUT = 0: never dereferenced
            outlier_values = outlier_channels = cache_seqlens
        if self._constexprs["USE_DESC"]:
            # Descriptors per call (a few us of host time), launched through Triton's own path.
            from triton.tools.tensor_descriptor import TensorDescriptor

            block = [self._constexprs["BLOCK_N"], self._constexprs["BLOCK_D"]]
            descs = [TensorDescriptor(t, [t.shape[0] * t.shape[1], t.shape[2] * t.shape[3]],
                                      [t.stride(1), 1], block) for t in (k_cache, v_cache)]
            _paged_prefill_kernel[self._grid](
                q, k_cache, v_cache, k_scale, v_scale, *descs, out, lse, cu_seqlens_q,
                cache_seqlens, block_table, outlier_values, outlier_channels, self._scale,
                *self._ints, **self._constexprs,
                num_warps=self._warps[0], num_stages=self._warps[1])
            return
        aligned = alignment_key(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table,
                              k_scale, v_scale, out, lse, outlier_values, outlier_channels)
        launch(_paged_prefill_kernel, (self._key, aligned), self._grid,
               (q, k_cache, v_cache, k_scale, v_scale, None, None, out, lse, cu_seqlens_q,
                cache_seqlens, block_table, outlier_values, outlier_channels, self._scale,
                *self._ints),
               self._constexprs, *self._warps, self.device_index)
