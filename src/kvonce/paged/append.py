"""``append_paged_kv``: new tokens' K/V into their pages, quantizing for a quantized cache, one
launch (kernels/paged_append.py)."""
from __future__ import annotations

import torch

from .. import _validate as V
from .._dispatch import use_op
from ..kernels.configs import interpreter_active
from ..kernels.paged_append import launch_append_paged_kv
from .checks import (QUANT_FORMATS, check_block_table_values, check_device_ok, check_scales,
                     resolve_kv_format, validate_cache, validate_quantized_cache)
from .quant import INT4_HEAD_DIM_MULTIPLE

__all__ = ["append_paged_kv"]


def append_paged_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_format: str | None = None,
    check_block_table: bool = False,
    key_transform=None,
    key_outliers=None,
) -> None:
    """Write new tokens' K/V into their pages, in place, quantizing them for a quantized cache.

    Parameters
    ----------
    k, v : ``[batch, new_len, nheads_k, headdim]``, last dim contiguous. A plain cache takes its
        own dtype (fp16/bf16/fp32); a quantized one any of fp16/bf16/fp32 (k and v alike).
    k_cache, v_cache : ``[num_pages, page_size, nheads_k, headdim]`` (int4: ``headdim // 2``
        bytes), ``kvonce.paged.quant``'s layouts: fp16/bf16/fp32 (plain), float8_e4m3fn, int8, or
        uint8 with ``kv_format="int4"``.
    cache_seqlens : int32 ``[batch]``; token ``i`` of sequence ``b`` goes to position
        ``cache_seqlens[b] + i``. Like flash-attn, ``cache_seqlens`` is left as it is (the caller
        advances it).
    block_table : int32 ``[batch, max_pages]``, pages in any order.
    k_scale, v_scale : a quantized cache's scales, as ``quantize_kv`` returns them. fp8: float32
        ``[nheads_k]`` or 0-dim, fixed when the cache was made, READ here. int8: fp16 or float32
        ``[num_pages, page_size, nheads_k]``; int4: fp16 or float32 ``[num_pages, page_size,
        nheads_k, 2]`` (scale, offset), last dim contiguous: WRITTEN here for the new tokens'
        slots. k_scale and v_scale share a dtype.
    kv_format : None (recognised from the cache dtype: fp8 and int8) or ``"fp8_e4m3"``,
        ``"int8"``, ``"int4"`` (needed for a uint8 cache).
    check_block_table : validation mode: the table has existing pages for every new position
        (reads tensor values: a host sync).
    key_transform : a ``kvonce.paged.KeyTransform``: the keys stored (and quantized) are
        ``key_transform.keys(k)`` (float32, cast to a plain cache's dtype); attention over the
        cache then takes the same transform (``paged_attention(..., key_transform=)``).
    key_outliers : a ``kvonce.paged.KeyOutliers`` (quantized caches): the new keys' outlier
        channels go to its side cache (``values``, at the tokens' positions), the rest of each
        key, those channels set to 0, is quantized into ``k_cache``; attention over the cache
        then takes the same object (``paged_attention(..., key_outliers=)``).

    The stored bytes and scales are ``quantize_kv``'s for the same tokens (fp8 with the cache's
    ``scale``; int8 and int4 in the scale tensors' dtype: ``quantize_kv(..., scale_dtype=)``).
    Positions are computed on the device (no host sync; CUDA-graph capturable); that the table
    has pages for them is the caller's contract. Every argument is checked before anything is
    written.
    """
    if key_outliers is not None:
        if key_transform is not None:
            raise ValueError("key_outliers and key_transform: use one (a rotated key spreads its "
                             "outlier channels over every channel)")
        V.check_tensor("k", k, ndim=4, dtypes=V.ATTN_DTYPES)
        key_outliers.check_cache(k_cache, resolve_kv_format(k_cache, kv_format), k.shape[-1], k)
    values = channels = None
    if key_outliers is not None:
        values, channels = key_outliers.values, key_outliers.channels
    if key_transform is not None:
        k = key_transform.keys(k)     # float32
        if k_cache.dtype in (torch.float16, torch.bfloat16, torch.float32):
            k = k.to(k_cache.dtype)   # a plain cache takes its own dtype
        else:
            v = v.float()             # k and v alike; the upcast is exact
    signature = None
    if not torch.compiler.is_compiling():
        signature = V.call_signature(k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale,
                                     v_scale, kv_format)
    passed = _passed_checks.get(signature)
    if passed is None:
        passed = (_validate_append(k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale,
                                   v_scale, kv_format),)
        _passed_checks.add(signature, passed)
    fmt = passed[0]
    batch, new_len = k.shape[0], k.shape[1]
    if check_block_table:
        check_block_table_values(cache_seqlens, block_table, k_cache.shape[0], k_cache.shape[1],
                                 new_len)
    if new_len == 0 or batch == 0:
        return
    code = 0 if fmt is None else QUANT_FORMATS[fmt][0]
    # The op (declaring the caches and scales mutated) where _dispatch.use_op says: compiling, a
    # dispatch or function mode, fake/meta/subclass tensors; plain eager calls launch directly.
    if use_op(k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, values,
              channels):
        torch.ops.kvonce.append_paged_kv(k, v, k_cache, v_cache, cache_seqlens, block_table,
                                         k_scale, v_scale, code, values, channels)
    else:
        _append_paged_kv_impl(k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale,
                              v_scale, code, values, channels)


# Signatures (shapes, strides, dtypes, devices, scalars: everything the checks read, never
# tensor values) of calls whose checks passed, with the cache format they found: a repeat skips
# the checks (~17-24 us of host time, ~8 us for the signature; CPU host, torch 2.13), as
# paged_attention's one-shot calls do.
_passed_checks = V.PassedChecks()


def _validate_append(k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                     kv_format) -> str | None:
    """Every check, before any launch; returns the cache's format (None: plain)."""
    V.check_tensor("k", k, ndim=4, dtypes=V.ATTN_DTYPES)
    V.check_tensor("v", v, ndim=4, dtypes=V.ATTN_DTYPES)
    V.check_tensor("k_cache", k_cache, ndim=4)
    fmt = resolve_kv_format(k_cache, kv_format)
    if fmt is None:
        if k_scale is not None or v_scale is not None:
            raise ValueError("k_scale/v_scale are for quantized caches (fp8/int8/int4), "
                             f"got a {k_cache.dtype} cache")
        validate_cache(k_cache, v_cache, cache_seqlens, block_table)
        V.check_same_dtype(k=k, v=v, k_cache=k_cache)
    else:
        validate_quantized_cache(k_cache, v_cache, cache_seqlens, block_table, fmt)
        V.check_same_dtype(k=k, v=v)
    V.check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        block_table=block_table)
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    head_dim = k.shape[3]
    stored = head_dim // 2 if fmt == "int4" else head_dim
    if (k.shape[0] != block_table.shape[0] or k.shape[2] != k_cache.shape[2]
            or k_cache.shape[3] != stored):
        want = k_cache.shape[3] * 2 if fmt == "int4" else k_cache.shape[3]
        raise ValueError(f"k must have shape [{block_table.shape[0]}, new_len, "
                         f"{k_cache.shape[2]}, {want}] for this cache, got {tuple(k.shape)}")
    if fmt == "int4" and head_dim % INT4_HEAD_DIM_MULTIPLE != 0:
        raise ValueError(f"int4 needs a head dim that is a multiple of {INT4_HEAD_DIM_MULTIPLE}, "
                         f"got {head_dim}")
    V.check_head_dim("k", head_dim)
    V.check_last_dim_contiguous(k=k, v=v)
    if fmt is not None:
        check_scales(k_scale, v_scale, fmt, k_cache.shape, head_dim)
        V.check_same_device(k=k, k_scale=k_scale, v_scale=v_scale)
    check_device_ok(k.device)
    return fmt


def _append_paged_kv_impl(k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                          kv_format: int, outlier_values=None, outlier_channels=None) -> None:
    # One launch; plain PyTorch needed two gathers and an indexed store per cache (99 us of host
    # time per call on the lent H100, docs/benchmarks.md 2026-11-23), and a quantized cache a
    # quantize_kv pass before them; the outlier channels go to their side cache in it too.
    launch_append_paged_kv(k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                           kv_format, fp8_round=kv_format == 1 and interpreter_active(),
                           outlier_values=outlier_values, outlier_channels=outlier_channels)


@torch.library.custom_op("kvonce::append_paged_kv",
                         mutates_args=("k_cache", "v_cache", "k_scale", "v_scale",
                                       "outlier_values"))
def _append_paged_kv_op(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                        block_table: torch.Tensor, k_scale: torch.Tensor | None,
                        v_scale: torch.Tensor | None, kv_format: int,
                        outlier_values: torch.Tensor | None,
                        outlier_channels: torch.Tensor | None) -> None:
    """``append_paged_kv`` after its checks: writes into ``k_cache`` and ``v_cache`` and, for
    int8/int4 caches (``kv_format`` 2/3, ``checks.QUANT_FORMATS``' codes), their scales (fp8's
    are only read, but one schema serves every format, so they are declared mutated), and a
    ``KeyOutliers``' side cache ``outlier_values`` (channels ``outlier_channels``; both None
    without one: no defaults, since torch 2.11's autograd wrapper indexes every declared
    mutated argument in the positional arguments)."""
    _append_paged_kv_impl(k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                          kv_format, outlier_values, outlier_channels)


@_append_paged_kv_op.register_fake
def _(k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, kv_format,
      outlier_values, outlier_channels):
    return None
