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


@triton.jit
def _tile_rows_ahead(bt_row, start_n, kv_end, page_next, PAGE_SIZE: tl.constexpr,
                     BLOCK_N: tl.constexpr, MASKED: tl.constexpr, INT64_KV: tl.constexpr,
                     PREFETCH_PAGES: tl.constexpr):
    """``_tile_rows`` of the tile at ``start_n`` plus the page ids to carry to the next trip.
    PREFETCH_PAGES: this tile's pages are ``page_next`` (looked up the iteration before, or by
    ``_tile_pages`` ahead of the loop) and the next tile's are loaded now, so no K/V address
    of a pipelined copy waits on a load issued just before it (with the lookup in place, the
    pipeliner also spends a third stage on copying the page ids: K/V keep one shared-memory
    slot). Otherwise ``page_next`` comes back as it came. Returns ``(offs_n, in_range, page,
    slot, page_next)``."""
    if PREFETCH_PAGES:
        page = page_next
        page_next = _tile_pages(bt_row, start_n + BLOCK_N, kv_end, PAGE_SIZE, BLOCK_N, INT64_KV)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        in_range = offs_n < kv_end
        slot = offs_n % PAGE_SIZE
    else:
        offs_n, in_range, page, slot = _tile_rows(bt_row, start_n, kv_end, PAGE_SIZE, BLOCK_N,
                                                  MASKED, INT64_KV)
    return offs_n, in_range, page, slot, page_next
