"""Key-tile addressing shared by the paged decode loops (``paged_decode``, ``paged_decode_pairs``)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_rows(bt_row, start_n, kv_end, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, INT64_KV: tl.constexpr):
    """Key positions ``offs_n = start_n + [0, BLOCK_N)`` of one sequence (block-table row
    ``bt_row``), ``in_range = offs_n < kv_end``, and each key's page (from the block table; 0
    past ``kv_end`` with MASKED; int64 with INT64_KV, else int32: the caller knows every offset
    fits) and slot in it. A tile may span several pages or part of one."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    in_range = offs_n < kv_end
    if MASKED:
        page = tl.load(bt_row + offs_n // PAGE_SIZE, mask=in_range, other=0)
    else:
        page = tl.load(bt_row + offs_n // PAGE_SIZE)
    if INT64_KV:
        page = page.to(tl.int64)
    return offs_n, in_range, page, offs_n % PAGE_SIZE


@triton.jit
def _tile_pages(bt_row, start_n, kv_end, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                INT64_KV: tl.constexpr = False):
    """Each key's page of the tile at ``start_n`` (0 past ``kv_end``; int64 with INT64_KV): the
    block-table load of ``_tile_rows`` on its own, always masked, so that a loop can issue it
    tiles ahead of the loads whose addresses it gives (``PREFETCH_PAGES``)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    page = tl.load(bt_row + offs_n // PAGE_SIZE, mask=offs_n < kv_end, other=0)
    if INT64_KV:
        page = page.to(tl.int64)
    return page
