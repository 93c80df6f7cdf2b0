"""Checks of a paged KV cache shared by decode, merge and append: page sizes, the cache and
block-table tensors, the block table's values (validation mode), the quantized formats' cache
dtypes and kernel codes, their scales, and the device.

Each raises a clear ``ValueError``/``TypeError`` naming the argument, before any launch.
"""
from __future__ import annotations

import torch

from .. import _validate as V
from .._dispatch import require_values
from ..kernels.configs import interpreter_active

__all__ = ["PAGE_SIZES", "QUANT_FORMATS", "check_device_ok", "validate_cache",
           "check_block_table_values", "resolve_kv_format", "validate_quantized_cache",
           "check_scale", "check_scales"]

PAGE_SIZES = tuple(1 << i for i in range(4, 9))  # 16 .. 256


def check_device_ok(device: torch.device) -> None:
    # meta tensors always take the custom op (_dispatch.use_op), whose fake implementation serves
    # them: nothing launches.
    if device.type not in ("cuda", "meta") and not interpreter_active():
        raise ValueError(f"inputs are on {device}: the Triton kernel needs a CUDA device "
                         "(or TRITON_INTERPRET=1 for the CPU interpreter)")


def _check_layout(k_cache, v_cache, cache_seqlens, block_table) -> None:
    """What plain and quantized caches share: the index tensors' dtypes and ranks, one cache
    shape, a page size in ``PAGE_SIZES``, one batch, unit last-dim strides."""
    V.check_tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=(torch.int32,))
    V.check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,))
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, "
                         f"got {tuple(v_cache.shape)}")
    if k_cache.shape[1] not in PAGE_SIZES:
        raise ValueError(f"k_cache: page size (dim 1) must be a power of two in 16..256, "
                         f"got {k_cache.shape[1]}")
    if cache_seqlens.shape[0] != block_table.shape[0]:
        raise ValueError(f"cache_seqlens must have shape [{block_table.shape[0]}] (block_table's "
                         f"batch), got {tuple(cache_seqlens.shape)}")
    if block_table.numel() > 0 and block_table.stride(1) != 1:
        raise ValueError(f"block_table must have a contiguous last dim, got strides "
                         f"{tuple(block_table.stride())}")
    V.check_last_dim_contiguous(k_cache=k_cache, v_cache=v_cache)


def validate_cache(k_cache, v_cache, cache_seqlens, block_table) -> tuple[int, int]:
    """Checks shared by attend and append; returns (page_size, batch)."""
    V.check_tensor("k_cache", k_cache, ndim=4, dtypes=V.ATTN_DTYPES)
    V.check_tensor("v_cache", v_cache, ndim=4, dtypes=V.ATTN_DTYPES)
    V.check_same_dtype(k_cache=k_cache, v_cache=v_cache)
    _check_layout(k_cache, v_cache, cache_seqlens, block_table)
    V.check_head_dim("k_cache", k_cache.shape[3])
    return k_cache.shape[1], block_table.shape[0]


def check_block_table_values(cache_seqlens, block_table, num_pages: int, page_size: int,
                             extra: int = 0) -> None:
    """Validation mode (host sync): every sequence's ``cache_seqlens + extra`` positions have pages
    in the table, and those entries name existing pages."""
    require_values("check_block_table=True", cache_seqlens=cache_seqlens, block_table=block_table)
    need = (cache_seqlens.long() + extra + page_size - 1) // page_size
    if bool((cache_seqlens < 0).any()):
        raise ValueError("cache_seqlens has negative entries")
    if bool((need > block_table.shape[1]).any()):
        b = int(torch.nonzero(need > block_table.shape[1])[0, 0])
        raise ValueError(f"block_table is too short for sequence {b}: it needs {int(need[b])} "
                         f"pages, the table has {block_table.shape[1]} columns")
    cols = torch.arange(block_table.shape[1], device=block_table.device)[None, :]
    used = cols < need[:, None]
    bad = used & ((block_table < 0) | (block_table >= num_pages))
    if bool(bad.any()):
        b = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"block_table row {b} names a page outside [0, {num_pages})")


# Quantized caches (kvonce.paged.quant): format -> (kernel code, cache dtype).
QUANT_FORMATS = {"fp8_e4m3": (1, torch.float8_e4m3fn), "int8": (2, torch.int8),
                  "int4": (3, torch.uint8)}
_QUANT_BY_DTYPE = {torch.float8_e4m3fn: "fp8_e4m3", torch.int8: "int8"}


def resolve_kv_format(k_cache, kv_format) -> str | None:
    """The cache's format: None for fp16/bf16/fp32 caches; fp8/int8 recognised from the dtype,
    uint8 only with ``kv_format="int4"``."""
    if kv_format is None:
        if k_cache.dtype == torch.uint8:
            raise ValueError("a uint8 cache needs kv_format='int4' (two 4-bit values a byte)")
        return _QUANT_BY_DTYPE.get(k_cache.dtype)
    if kv_format not in QUANT_FORMATS:
        raise ValueError(f"kv_format must be None or one of {tuple(QUANT_FORMATS)}, "
                         f"got {kv_format!r}")
    if k_cache.dtype != QUANT_FORMATS[kv_format][1]:
        raise TypeError(f"kv_format={kv_format!r} needs a {QUANT_FORMATS[kv_format][1]} cache, "
                        f"got {k_cache.dtype}")
    return kv_format


def validate_quantized_cache(k_cache, v_cache, cache_seqlens, block_table, fmt: str) -> None:
    """``validate_cache`` for a quantized cache (its dtype is the format's): decode and append."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        V.check_tensor(name, t, ndim=4, dtypes=(QUANT_FORMATS[fmt][1],))
    _check_layout(k_cache, v_cache, cache_seqlens, block_table)


def check_scale(name: str, scale, fmt: str, cache_shape, head_dim: int) -> None:
    """A quantized cache's scale tensor: dtype and shape per ``kvonce.paged.quant``'s table
    (decode and append)."""
    if scale is None:
        raise ValueError(f"a {fmt} cache needs {name}")
    nheads_k = cache_shape[2]
    if fmt == "fp8_e4m3":
        V.check_tensor(name, scale, dtypes=(torch.float32,))
        ok = scale.shape in ((), (nheads_k,))
        want = f"float32 [{nheads_k}] (per KV head) or 0-dim"
    elif fmt == "int8":
        V.check_tensor(name, scale, dtypes=(torch.float32, torch.float16))
        ok = scale.shape == cache_shape[:3]
        want = f"float32/fp16 {list(cache_shape[:3])} (per token and KV head)"
    else:
        V.check_tensor(name, scale, dtypes=(torch.float16, torch.float32))
        ok = scale.shape == (*cache_shape[:3], 2) and scale.stride(-1) == 1
        want = (f"fp16/float32 {[*cache_shape[:3], 2]} ((scale, offset) per token and KV head, "
                "last dim contiguous)")
    if not ok:
        raise ValueError(f"{name} must be {want}, got {tuple(scale.shape)}")


def check_scales(k_scale, v_scale, fmt: str, cache_shape, head_dim: int) -> None:
    """``check_scale`` of both, and one dtype for the two (a launch reads them alike)."""
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        check_scale(name, scale, fmt, cache_shape, head_dim)
    if k_scale.dtype != v_scale.dtype:
        raise ValueError(f"k_scale and v_scale must share a dtype, got {k_scale.dtype} and "
                         f"{v_scale.dtype}")


def launch_layout(q, k_cache, v_cache, block_table, return_lse: bool, k_scale=None,
                  v_scale=None, *extra) -> tuple:
    """The key of a launch bound once per stride layout (decode with scales, prefill): strides
    of q, the caches and the table, ``return_lse``, and each scale's (and each ``extra``
    tensor's: the outlier channels' side cache) shape, strides and dtype. Never tensor values,
    so a plan looks it up on every run without a host sync."""
    return (q.stride(), k_cache.stride(), v_cache.stride(), block_table.stride(), return_lse,
            *(None if t is None else (t.shape, t.stride(), t.dtype)
              for t in (k_scale, v_scale, *extra)))
