"""Appending new tokens' K/V to a paged cache: one program per (new token, sequence)."""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import all_aligned, launch, next_pow2


@triton.jit
def _append_paged_kv_kernel(
    K, V,              # new tokens [batch, new_len, nheads_k, HEAD_DIM], last dim contiguous
    KCache, VCache,    # [num_pages, PAGE_SIZE, nheads_k, HEAD_DIM], last dim contiguous
    cache_seqlens,     # int32 [batch]: token i of sequence b goes to position cache_seqlens[b] + i
    block_table,       # int32 [batch, max_pages]
    nheads_k, head_dim,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_cp, stride_ct, stride_ch, stride_vcp, stride_vct, stride_vch,
    stride_btb,
    PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (new token, sequence): its K and V rows (all KV heads) into their page
    slot. Positions come from ``cache_seqlens`` on the device (no host sync)."""
    tok = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    pos = tl.load(cache_seqlens + seq) + tok
    page = tl.load(block_table + seq * stride_btb + pos // PAGE_SIZE).to(tl.int64)
    slot = pos % PAGE_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < nheads_k) & (offs_d[None, :] < head_dim)
    src = offs_h[:, None] * stride_kh + offs_d[None, :]
    k = tl.load(K + seq * stride_kb + tok * stride_kt + src, mask=mask)
    v = tl.load(V + seq * stride_vb + tok * stride_vt
                + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(KCache + page * stride_cp + slot * stride_ct + offs_h[:, None] * stride_ch
             + offs_d[None, :], k, mask=mask)
    tl.store(VCache + page * stride_vcp + slot * stride_vct + offs_h[:, None] * stride_vch
             + offs_d[None, :], v, mask=mask)


def launch_append_paged_kv(k, v, k_cache, v_cache, cache_seqlens, block_table) -> None:
    """Write ``k, v [batch, new_len, nheads_k, d]`` into their pages (checks are the caller's):
    one launch instead of the gathers and indexed stores of plain PyTorch."""
    batch, new_len, nheads_k, head_dim = k.shape
    if batch == 0 or new_len == 0:
        return
    ints = (nheads_k, head_dim, *k.stride()[:3], *v.stride()[:3], *k_cache.stride()[:3],
            *v_cache.stride()[:3], block_table.stride(0))
    constexprs = dict(PAGE_SIZE=k_cache.shape[1], BLOCK_H=next_pow2(nheads_k),
                      BLOCK_D=next_pow2(head_dim))
    key = (k.dtype, ints, tuple(constexprs.values()),
           all_aligned(k, v, k_cache, v_cache, cache_seqlens, block_table))
    launch(_append_paged_kv_kernel, key, (new_len, batch, 1),
           (k, v, k_cache, v_cache, cache_seqlens, block_table, *ints), constexprs,
           4 if nheads_k * head_dim >= 1024 else 1, 1,
           k.device.index if k.device.type == "cuda" else -1)
