"""Paged KV-cache decode: validation, split choice, allocation, launch.

``paged_attention`` runs the GQA-packed flash-decoding kernel (kernels/paged_decode.py) over a
paged cache in flash-attn's ``flash_attn_with_kvcache`` layout; ``append_paged_kv`` writes new
tokens into their pages; ``merge_attention_states`` is the LSE-weighted merge the split-K combine
uses too; ``flash_attn_with_kvcache`` is a drop-in wrapper with flash-attn's argument names.

Nothing on the hot path reads tensor values on the host: the split count comes from shapes and the
SM count, sequence lengths are read by the kernel, so a call is CUDA-graph capturable.
"""
from __future__ import annotations

import torch

from . import _validate as V
from ._dispatch import like_inputs, require_values, use_op
from .kernels.configs import (PagedDecodeConfig, device_info, get_paged_decode_config,
                              interpreter_active)
from .kernels.paged_decode import PagedDecodeLaunch, decode_row_blocks, launch_merge_states

__all__ = ["paged_attention", "PagedDecodePlan", "merge_attention_states",
           "flash_attn_with_kvcache", "choose_num_splits"]

PAGE_SIZES = tuple(1 << i for i in range(4, 9))  # 16 .. 256
MAX_SPLITS = 256

# Every output and scratch buffer comes from here (tests swap in a NaN-filling version to prove
# that each element is written).
_empty = torch.empty


def choose_num_splits(batch: int, nheads_k: int, max_keys: int, num_sms: int,
                      config: PagedDecodeConfig) -> int:
    """Split count from shapes only (never tensor values: CUDA-graph capturable).

    ``base = batch * nheads_k`` programs of one split each. The CUDA-graph sweep over split counts
    at the documents' 30 shapes (H100, docs/notes.md) was best near ``config.programs_per_sm *
    num_sms`` programs (384-396 on 132 SMs) and 8-12% slower at every shape with 5 to 6.5 programs
    per SM (768 on 132 SMs), and splits under 512 keys lost to fewer, longer ones
    (``config.min_keys_per_split``). So: below that target, ``target // base`` splits (but no split
    shorter than ``config.min_keys_per_split`` keys of the longest possible sequence,
    ``max_pages * page_size``, and at most ``MAX_SPLITS``); from it up, a single pass, or two
    splits where one pass would land in the slow band.
    """
    base = max(1, batch * nheads_k)
    target = int(config.programs_per_sm * num_sms)
    if base >= target:
        lo, hi = config.slow_programs_per_sm
        return 2 if lo * num_sms <= base <= hi * num_sms else 1
    cap = max(1, max_keys // config.min_keys_per_split)
    return int(max(1, min(target // base, cap, MAX_SPLITS)))


def _check_device_ok(device: torch.device) -> None:
    # meta tensors always take the custom op (_dispatch.use_op), whose fake implementation serves
    # them: nothing launches.
    if device.type not in ("cuda", "meta") and not interpreter_active():
        raise ValueError(f"inputs are on {device}: the Triton kernel needs a CUDA device "
                         "(or TRITON_INTERPRET=1 for the CPU interpreter)")


def _validate_cache(k_cache, v_cache, cache_seqlens, block_table) -> tuple[int, int]:
    """Checks shared by attend and append; returns (page_size, batch)."""
    V.check_tensor("k_cache", k_cache, ndim=4, dtypes=V.ATTN_DTYPES)
    V.check_tensor("v_cache", v_cache, ndim=4, dtypes=V.ATTN_DTYPES)
    V.check_tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=(torch.int32,))
    V.check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,))
    V.check_same_dtype(k_cache=k_cache, v_cache=v_cache)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, "
                         f"got {tuple(v_cache.shape)}")
    page_size = k_cache.shape[1]
    if page_size not in PAGE_SIZES:
        raise ValueError(f"k_cache: page size (dim 1) must be a power of two in 16..256, "
                         f"got {page_size}")
    V.check_head_dim("k_cache", k_cache.shape[3])
    batch = block_table.shape[0]
    if cache_seqlens.shape[0] != batch:
        raise ValueError(f"cache_seqlens must have shape [{batch}] (block_table's batch), "
                         f"got {tuple(cache_seqlens.shape)}")
    if block_table.numel() > 0 and block_table.stride(1) != 1:
        raise ValueError(f"block_table must have a contiguous last dim, got strides "
                         f"{tuple(block_table.stride())}")
    V.check_last_dim_contiguous(k_cache=k_cache, v_cache=v_cache)
    return page_size, batch


def _check_block_table_values(cache_seqlens, block_table, num_pages: int, page_size: int,
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


# Quantized caches (kvonce.cache.quant): format -> (kernel code, cache dtype).
_QUANT_FORMATS = {"fp8_e4m3": (1, torch.float8_e4m3fn), "int8": (2, torch.int8),
                  "int4": (3, torch.uint8)}
_QUANT_BY_DTYPE = {torch.float8_e4m3fn: "fp8_e4m3", torch.int8: "int8"}


def resolve_kv_format(k_cache, kv_format) -> str | None:
    """The cache's format: None for fp16/bf16/fp32 caches; fp8/int8 recognised from the dtype,
    uint8 only with ``kv_format="int4"``."""
    if kv_format is None:
        if k_cache.dtype == torch.uint8:
            raise ValueError("a uint8 cache needs kv_format='int4' (two 4-bit values a byte)")
        return _QUANT_BY_DTYPE.get(k_cache.dtype)
    if kv_format not in _QUANT_FORMATS:
        raise ValueError(f"kv_format must be None or one of {tuple(_QUANT_FORMATS)}, "
                         f"got {kv_format!r}")
    if k_cache.dtype != _QUANT_FORMATS[kv_format][1]:
        raise TypeError(f"kv_format={kv_format!r} needs a {_QUANT_FORMATS[kv_format][1]} cache, "
                        f"got {k_cache.dtype}")
    return kv_format


def _validate_quantized_cache(k_cache, v_cache, cache_seqlens, block_table, fmt: str) -> None:
    """``_validate_cache`` for a quantized cache (its dtype is the format's): decode and append."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        V.check_tensor(name, t, ndim=4, dtypes=(_QUANT_FORMATS[fmt][1],))
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


def _check_scale(name: str, scale, fmt: str, cache_shape, head_dim: int) -> None:
    """A quantized cache's scale tensor: dtype and shape per ``kvonce.cache.quant``'s table
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
        V.check_tensor(name, scale, dtypes=(torch.float16,))
        ok = scale.shape == (*cache_shape[:3], head_dim // 32) and scale.stride(-1) == 1
        want = (f"fp16 {[*cache_shape[:3], head_dim // 32]} (per 32 channels per token, "
                "last dim contiguous)")
    if not ok:
        raise ValueError(f"{name} must be {want}, got {tuple(scale.shape)}")


def _validate_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                        kv_format: str) -> None:
    """The checks of ``_validate_attention`` for a quantized cache, plus its scales'."""
    V.check_tensor("q", q, ndim=4, dtypes=V.ATTN_DTYPES)
    _validate_quantized_cache(k_cache, v_cache, cache_seqlens, block_table, kv_format)
    head_dim = q.shape[3]
    stored = head_dim // 2 if kv_format == "int4" else head_dim
    if k_cache.shape[3] != stored or (kv_format == "int4" and head_dim % 32 != 0):
        raise ValueError(f"k_cache's last dim must be {stored} for q's head dim {head_dim} "
                         f"({kv_format}), got {k_cache.shape[3]}")
    V.check_head_dim("q", head_dim)
    if q.shape[0] != block_table.shape[0]:
        raise ValueError(f"q, cache_seqlens and block_table must share the batch: "
                         f"{q.shape[0]}, {cache_seqlens.shape[0]}, {block_table.shape[0]}")
    if q.shape[1] < 1:
        raise ValueError(f"q must have q_len >= 1 (dim 1), got shape {tuple(q.shape)}")
    V.check_gqa(q.shape[2], k_cache.shape[2])
    V.check_last_dim_contiguous(q=q)
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        _check_scale(name, scale, kv_format, k_cache.shape, head_dim)
    V.check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        block_table=block_table, k_scale=k_scale, v_scale=v_scale)
    _check_device_ok(q.device)


def _validate_attention(q, k_cache, v_cache, cache_seqlens, block_table, num_splits) -> None:
    V.check_tensor("q", q, ndim=4, dtypes=V.ATTN_DTYPES)
    _validate_cache(k_cache, v_cache, cache_seqlens, block_table)
    V.check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        block_table=block_table)
    V.check_same_dtype(k_cache=k_cache, q=q)
    if q.shape[0] != block_table.shape[0]:
        raise ValueError(f"q has batch {q.shape[0]} but block_table has "
                         f"{block_table.shape[0]} rows")
    if q.shape[1] < 1:
        raise ValueError(f"q must have q_len >= 1 (dim 1), got shape {tuple(q.shape)}")
    if q.shape[3] != k_cache.shape[3]:
        raise ValueError(f"head dim mismatch: q has {q.shape[3]}, k_cache has {k_cache.shape[3]}")
    V.check_gqa(q.shape[2], k_cache.shape[2])
    V.check_last_dim_contiguous(q=q)
    V.check_nonnegative_int("num_splits", num_splits)
    _check_device_ok(q.device)


class PagedDecodePlan:
    """Split count, launch config and split-K scratch for one decode step, reused by every layer.

    ``PagedDecodePlan(q, k_cache, v_cache, cache_seqlens, block_table, ...)`` validates the
    example tensors fully (arguments as in ``paged_attention``) and sizes everything from their
    shapes. ``run(...)`` then takes tensors of the same shapes, dtype and device (per layer, per
    step: values may change freely), checks only that cheaply, and launches: no host sync, no
    per-call validation cost, CUDA-graph capturable. The scratch is reused by every ``run``, so
    one plan serves one stream.

    Eager ``run`` launches the kernels directly through Triton's C launcher (the launch is bound
    once per stride layout: ``kernels/_launch.py``); under ``torch.compile``, a dispatch or
    function mode, or with fake/meta/subclass tensors (``kvonce._dispatch.use_op``) it calls the
    ``torch.ops.kvonce.paged_decode`` / ``paged_decode_split`` custom ops, which run the same
    kernels (the op dispatch costs ~16 us of host time per call, docs/notes.md). A plan made from
    real tensors also runs fake ones of the same shapes (its scratch is converted to the inputs'
    fake mode); meta inputs need a plan made from meta tensors.

    ``shared_prefix="auto"`` (the tree read from the block table on the host, here) or
    ``[(seq_ids, num_pages), ...]`` plans the shared-prefix cascade (``kvonce.prefix``; plain
    fp16/bf16/fp32 caches) where ``cascade`` ("auto": a cost model; True / False) says so;
    ``uses_cascade`` tells which; ``run`` returns the same either way.
    """

    def __init__(self, q, k_cache, v_cache, cache_seqlens, block_table, *,
                 softmax_scale: float | None = None, causal: bool = True, num_splits: int = 0,
                 check_block_table: bool = False, config: PagedDecodeConfig | None = None,
                 kv_format: str | None = None, k_scale=None, v_scale=None,
                 shared_prefix=None, cascade="auto", _scratch_per_call: bool = False):
        self.kv_format = resolve_kv_format(k_cache, kv_format)
        if shared_prefix is not None and self.kv_format is not None:
            raise NotImplementedError("shared_prefix with a quantized cache: not yet")
        if self.kv_format is None:
            if k_scale is not None or v_scale is not None:
                raise ValueError("k_scale/v_scale are for quantized caches (fp8/int8/int4)")
            _validate_attention(q, k_cache, v_cache, cache_seqlens, block_table, num_splits)
        else:
            _validate_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                                self.kv_format)
            V.check_nonnegative_int("num_splits", num_splits)
        self._kv_code = 0 if self.kv_format is None else _QUANT_FORMATS[self.kv_format][0]
        self._kv_dtype = k_cache.dtype
        page_size = k_cache.shape[1]
        if check_block_table:
            _check_block_table_values(cache_seqlens, block_table, k_cache.shape[0], page_size)
        batch, q_len, nheads, head_dim = q.shape
        capability, num_sms = device_info(q.device)
        self.config = config or get_paged_decode_config(capability, head_dim, self.kv_format)
        # Shared-prefix cascade (kvonce.prefix): None unless asked for and paying; a forced
        # num_splits applies to its suffix decode.
        self._cascade = None
        if shared_prefix is not None:
            from .prefix import plan_cascade  # (kvonce.prefix imports this module)

            self._cascade = plan_cascade(self, q, k_cache, v_cache, cache_seqlens, block_table,
                                         shared_prefix, cascade=cascade, num_splits=num_splits,
                                         check=check_block_table)
        self.uses_cascade = self._cascade is not None
        if num_splits == 0:
            num_splits = choose_num_splits(batch, k_cache.shape[2],
                                           block_table.shape[1] * page_size, num_sms, self.config)
        self.num_splits = num_splits
        self.causal = causal
        self.softmax_scale = head_dim ** -0.5 if softmax_scale is None else float(softmax_scale)
        self._q_shape, self._kv_tail = q.shape, k_cache.shape[1:]
        self._dtype, self._device, self._batch = q.dtype, q.device, batch
        self._nheads_k = k_cache.shape[2]
        self._scratch_per_call = _scratch_per_call
        self._split_scratch = (None, None, None)
        if num_splits > 1 and not _scratch_per_call:
            self._split_scratch = self._new_scratch()
        # Launches bound to one stride layout, made at the first eager run (never while
        # torch.compile traces): (strides of q, k_cache, v_cache, block_table, return_lse) ->
        # PagedDecodeLaunch.
        self._launches: dict = {}

    def _check_like_plan(self, q, k_cache, v_cache, cache_seqlens, block_table) -> None:
        if (q.shape != self._q_shape or k_cache.shape[1:] != self._kv_tail
                or v_cache.shape != k_cache.shape or q.dtype != self._dtype
                or k_cache.dtype != self._kv_dtype or v_cache.dtype != self._kv_dtype
                or q.device != self._device or block_table.shape[0] != self._batch
                or cache_seqlens.shape != (self._batch,) or q.stride(-1) != 1
                or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1
                or (block_table.numel() > 0 and block_table.stride(1) != 1)):
            raise ValueError(
                f"PagedDecodePlan.run: inputs differ from the plan (q {tuple(q.shape)} "
                f"{q.dtype} on {q.device}, k_cache {tuple(k_cache.shape)}; planned q "
                f"{tuple(self._q_shape)} {self._dtype} on {self._device}, k_cache [*, "
                f"{', '.join(map(str, self._kv_tail))}], unit last-dim strides): make a new plan")

    def run(self, q, k_cache, v_cache, cache_seqlens, block_table, *, k_scale=None, v_scale=None,
            return_lse: bool = False):
        """Attention for tensors shaped like the planned ones; returns like ``paged_attention``.
        A quantized cache takes this layer's ``k_scale``/``v_scale`` (shapes as planned)."""
        if self._cascade is not None:
            return self._cascade.run(q, k_cache, v_cache, cache_seqlens, block_table,
                                     return_lse=return_lse)
        if self._kv_code:
            return self._run_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale,
                                       v_scale, return_lse)
        if use_op(q, k_cache, v_cache, cache_seqlens, block_table):
            self._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)
            out, lse = self._run_op(q, k_cache, v_cache, cache_seqlens, block_table)
            return (out, lse) if return_lse else out
        layout = (q.stride(), k_cache.stride(), v_cache.stride(), block_table.stride(), return_lse)
        launch = self._launches.get(layout)
        if launch is None or q.shape != self._q_shape or k_cache.dtype is not self._kv_dtype:
            launch = self._bind(q, k_cache, v_cache, cache_seqlens, block_table, layout)
        elif (k_cache.shape[1:] != self._kv_tail or v_cache.shape != k_cache.shape
              or q.dtype is not self._dtype or v_cache.dtype is not self._dtype
              or block_table.shape[0] != self._batch or cache_seqlens.shape[0] != self._batch
              or q.device != self._device):
            self._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)  # raises
        out = _empty(self._q_shape, dtype=self._dtype, device=self._device)
        lse = None
        if return_lse:
            batch, q_len, nheads, _ = self._q_shape
            lse = _empty((batch, nheads, q_len), dtype=torch.float32, device=self._device)
        launch(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, *self._scratch())
        return (out, lse) if return_lse else out

    def _run_quantized(self, q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                       return_lse):
        """Eager quantized decode: full checks on the first call of a stride layout (scales
        included), then launches only."""
        if use_op(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale):
            _validate_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                                self.kv_format)
            self._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)
            out, lse = self._run_op(q, k_cache, v_cache, cache_seqlens, block_table, k_scale,
                                    v_scale)
            return (out, lse) if return_lse else out
        layout = (q.stride(), k_cache.stride(), v_cache.stride(), block_table.stride(),
                  return_lse, None if k_scale is None else (k_scale.shape, k_scale.stride(),
                                                            k_scale.dtype),
                  None if v_scale is None else (v_scale.shape, v_scale.stride(), v_scale.dtype))
        launch = self._launches.get(layout)
        if (launch is None or q.shape != self._q_shape or k_cache.shape[1:] != self._kv_tail
                or k_cache.dtype is not self._kv_dtype or q.dtype is not self._dtype):
            _validate_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                                self.kv_format)
            self._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)
            launch = PagedDecodeLaunch(q, k_cache, v_cache, block_table,
                                       softmax_scale=self.softmax_scale, causal=self.causal,
                                       num_splits=self.num_splits, config=self.config,
                                       store_lse=return_lse, kv_format=self._kv_code,
                                       k_scale=k_scale, v_scale=v_scale)
            self._launches[layout] = launch
        out = _empty(self._q_shape, dtype=self._dtype, device=self._device)
        lse = None
        if return_lse:
            batch, q_len, nheads, _ = self._q_shape
            lse = _empty((batch, nheads, q_len), dtype=torch.float32, device=self._device)
        launch(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, *self._scratch(),
               k_scale, v_scale)
        return (out, lse) if return_lse else out

    def _scratch(self):
        """Split-K partials and arrival counts: the plan's own, or fresh ones for the plans of
        one-shot calls (which may run on several streams at once)."""
        if not self._scratch_per_call or self.num_splits == 1:
            return self._split_scratch
        return self._new_scratch()

    def _new_scratch(self):
        batch, q_len, nheads, head_dim = self._q_shape
        s = self.num_splits
        arrivals = torch.zeros((batch, self._nheads_k, decode_row_blocks(nheads, self._nheads_k,
                                                                          q_len)[1]),
                               dtype=torch.int32, device=self._device)
        return (_empty((batch, q_len, nheads, s, head_dim), dtype=torch.float32,
                       device=self._device),
                _empty((batch, q_len, nheads, s), dtype=torch.float32, device=self._device),
                arrivals)

    def _bind(self, q, k_cache, v_cache, cache_seqlens, block_table, layout):
        """Full check, then the launch for this stride layout (kept for later runs)."""
        self._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)
        launch = PagedDecodeLaunch(q, k_cache, v_cache, block_table,
                                   softmax_scale=self.softmax_scale, causal=self.causal,
                                   num_splits=self.num_splits, config=self.config,
                                   store_lse=layout[-1])
        self._launches[layout] = launch
        return launch

    def _run_op(self, q, k_cache, v_cache, cache_seqlens, block_table, k_scale=None,
                v_scale=None):
        c = self.config
        launch_fields = (self.softmax_scale, self.causal, c.block_n, c.num_warps, c.num_stages,
                         c.kv_cache_modifier, c.kv_eviction, c.max_merged_splits, k_scale,
                         v_scale, self._kv_code)
        if self.num_splits == 1:
            return torch.ops.kvonce.paged_decode(q, k_cache, v_cache, cache_seqlens, block_table,
                                                 *launch_fields)
        return torch.ops.kvonce.paged_decode_split(q, k_cache, v_cache, cache_seqlens,
                                                   block_table, *like_inputs(q, *self._scratch()),
                                                   *launch_fields)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    num_splits: int = 0,
    return_lse: bool = False,
    check_block_table: bool = False,
    config: PagedDecodeConfig | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_format: str | None = None,
):
    """Attention of the newest ``q_len`` tokens of each sequence over its paged KV cache.

    Parameters
    ----------
    q : ``[batch, q_len, nheads, headdim]`` fp16/bf16 (fp32 for testing), last dim contiguous.
    k_cache, v_cache : ``[num_pages, page_size, nheads_k, headdim]``, ``page_size`` a power of two
        in 16..256, ``nheads % nheads_k == 0`` (GQA: q head ``h`` reads KV head
        ``h // (nheads // nheads_k)``).
    cache_seqlens : int32 ``[batch]``: sequence ``b`` has ``cache_seqlens[b]`` keys, the new
        tokens' included; position ``p`` is
        ``cache[block_table[b, p // page_size], p % page_size]``.
    block_table : int32 ``[batch, max_pages]``; pages in any order.
    softmax_scale : defaults to ``headdim ** -0.5``.
    causal : bottom-right: with ``L = cache_seqlens[b]``, row ``t`` sees key
        ``j <= t + L - q_len``::

            q_len=2, L=5:  1 1 1 1 0
                           1 1 1 1 1

    num_splits : 0 picks the split-K count from shapes and the SM count (never from tensor values:
        the call is CUDA-graph capturable); a positive value forces it (1 = single pass).
    return_lse : also return the LSE.
    check_block_table : validation mode, off by default: checks that every sequence's pages are in
        the table and name existing pages. It reads tensor values (a host sync; not capturable).
    config : launch-config override for experiments (kernels/configs.py).
    k_scale, v_scale, kv_format : a quantized cache (``kvonce.cache.quant`` layouts, dequantized in
        registers): fp8 e4m3 and int8 caches are recognised from their dtype, a uint8 cache needs
        ``kv_format="int4"``; scales as ``quantize_kv`` returns them.

    Returns
    -------
    out : ``[batch, q_len, nheads, headdim]``, q's dtype.
    lse : float32 ``[batch, nheads, q_len]``, natural log (only with ``return_lse``; flash-attn's
        ``softmax_lse`` layout). A row that sees no key gets ``out = 0``, ``lse = -inf``.

    For many layers of one step, ``PagedDecodePlan`` does the checks and the split choice once.
    """
    signature = None
    if not (check_block_table or torch.compiler.is_compiling()):
        signature = V.call_signature(q, k_cache, v_cache, cache_seqlens, block_table,
                                     softmax_scale, causal, num_splits, config, k_scale, v_scale,
                                     kv_format)
    plan = _one_shot_plans.get(signature)
    if plan is None:
        plan = PagedDecodePlan(q, k_cache, v_cache, cache_seqlens, block_table,
                               softmax_scale=softmax_scale, causal=causal, num_splits=num_splits,
                               check_block_table=check_block_table, config=config,
                               kv_format=kv_format, k_scale=k_scale, v_scale=v_scale,
                               _scratch_per_call=True)
        _one_shot_plans.add(signature, plan)
    if plan.kv_format is not None:
        return plan.run(q, k_cache, v_cache, cache_seqlens, block_table, k_scale=k_scale,
                        v_scale=v_scale, return_lse=return_lse)
    return plan.run(q, k_cache, v_cache, cache_seqlens, block_table, return_lse=return_lse)


# One-shot calls reuse the plan of an earlier call with the same signature: everything the checks
# and the split choice read (shapes, strides, dtypes, devices, scalars), never tensor values. A
# hit has passed the checks before, so it skips them (host time: docs/notes.md). These plans own
# no scratch (split-K partials are allocated per call), so calls on different streams never
# share a buffer.
_one_shot_plans = V.PassedChecks()


def merge_attention_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor,
                           lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LSE-weighted merge of two partial attention results over disjoint key sets.

    Parameters
    ----------
    o_a, o_b : ``[n, nheads, headdim]`` (fp16/bf16/fp32, same dtype), each normalized over its keys.
    lse_a, lse_b : float32 ``[n, nheads]``, natural log (FlashInfer's ``merge_state`` layout).

    Returns
    -------
    o : ``[n, nheads, headdim]``, o_a's dtype; lse : float32 ``[n, nheads]``.
    A side with ``lse = -inf`` weighs exactly zero (the other side is returned as it is); both
    ``-inf`` gives ``(0, -inf)``. The split-K combine runs the same ``_merge_chunk`` code.
    """
    V.check_tensor("o_a", o_a, ndim=3, dtypes=V.ATTN_DTYPES)
    V.check_tensor("o_b", o_b, ndim=3, dtypes=V.ATTN_DTYPES)
    V.check_tensor("lse_a", lse_a, ndim=2, dtypes=(torch.float32,))
    V.check_tensor("lse_b", lse_b, ndim=2, dtypes=(torch.float32,))
    V.check_same_dtype(o_a=o_a, o_b=o_b)
    device = V.check_same_device(o_a=o_a, lse_a=lse_a, o_b=o_b, lse_b=lse_b)
    if o_b.shape != o_a.shape:
        raise ValueError(f"o_b must have o_a's shape {tuple(o_a.shape)}, got {tuple(o_b.shape)}")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if t.shape != o_a.shape[:2]:
            raise ValueError(f"{name} must have shape {tuple(o_a.shape[:2])} ([n, nheads]), "
                             f"got {tuple(t.shape)}")
    V.check_last_dim_contiguous(o_a=o_a, o_b=o_b)
    _check_device_ok(device)
    if use_op(o_a, lse_a, o_b, lse_b):
        return torch.ops.kvonce.merge_attention_states(o_a, lse_a, o_b, lse_b)
    return _merge_attention_states_impl(o_a, lse_a, o_b, lse_b)


_UNSUPPORTED_DEFAULTS = {
    "rotary_cos": None, "rotary_sin": None, "cache_batch_idx": None, "cache_leftpad": None,
    "window_size": (-1, -1), "softcap": 0.0, "alibi_slopes": None,
}


def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
    cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
    window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
    return_softmax_lse=False,
):
    """flash-attn's ``flash_attn_with_kvcache`` for the paged subset kvonce implements.

    Same names, defaults (``causal=False``) and semantics: with ``k, v`` given, they are written at
    ``cache_seqlens ..`` first and attention sees ``cache_seqlens + new_len`` keys
    (``cache_seqlens`` itself is not advanced); ``cache_seqlens`` may be an int. ``block_table``
    is required (paged cache). ``rotary_cos/sin``, ``cache_batch_idx``, ``cache_leftpad``, a
    sliding ``window_size``, ``softcap`` and ``alibi_slopes`` raise NotImplementedError naming
    them.

    Returns ``out [batch, q_len, nheads, headdim]``, and ``softmax_lse`` float32
    ``[batch, nheads, q_len]`` with ``return_softmax_lse``.
    """
    given = {"rotary_cos": rotary_cos, "rotary_sin": rotary_sin,
             "cache_batch_idx": cache_batch_idx, "cache_leftpad": cache_leftpad,
             "window_size": tuple(window_size) if window_size is not None else None,
             "softcap": softcap, "alibi_slopes": alibi_slopes}
    bad = [name for name, val in given.items() if val != _UNSUPPORTED_DEFAULTS[name]
           and not (name == "window_size" and val is None)]
    if block_table is None:
        bad.append("block_table=None (dense, non-paged cache)")
    if cache_seqlens is None:
        bad.append("cache_seqlens=None")
    if bad:
        raise NotImplementedError("kvonce.flash_attn_with_kvcache does not support: "
                                  + ", ".join(bad))
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together")
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    seqlens = cache_seqlens
    if k is not None:
        from .cache.append import append_paged_kv  # (cache.append imports this module)

        append_paged_kv(k, v, k_cache, v_cache, cache_seqlens, block_table)
        seqlens = cache_seqlens + k.shape[1]  # a device op: no sync
    return paged_attention(q, k_cache, v_cache, seqlens, block_table, softmax_scale=softmax_scale,
                           causal=causal, num_splits=num_splits, return_lse=return_softmax_lse)


# ------------------------------------------------------------------------------------------------
# torch.library custom ops: what torch.compile records, opaque to Inductor (which would otherwise
# re-compile our Triton code and fail), with fake implementations giving shapes and dtypes only.
# The public functions above check their arguments and call these ops where _dispatch.use_op says
# (compiling, a dispatch or function mode active, fake/meta/subclass tensors); plain eager calls
# run the same implementations without the op dispatch (~16 us of host time per call). FLOP
# formulas for FlopCounterMode: kvonce/flops.py.
# ------------------------------------------------------------------------------------------------

def _decode_outputs(q: torch.Tensor, alloc) -> tuple[torch.Tensor, torch.Tensor]:
    batch, q_len, nheads, _ = q.shape
    return (alloc(q.shape, dtype=q.dtype, device=q.device),
            alloc((batch, nheads, q_len), dtype=torch.float32, device=q.device))


def _paged_decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, o_part, lse_part,
                       arrivals, softmax_scale, causal, block_n, num_warps, num_stages,
                       kv_cache_modifier, kv_eviction, max_merged_splits, k_scale, v_scale,
                       kv_format):
    config = PagedDecodeConfig(block_n, num_warps, num_stages, kv_cache_modifier=kv_cache_modifier,
                               kv_eviction=kv_eviction, max_merged_splits=max_merged_splits)
    out, lse = _decode_outputs(q, _empty)
    num_splits = 1 if o_part is None else o_part.shape[3]
    PagedDecodeLaunch(q, k_cache, v_cache, block_table, softmax_scale=softmax_scale,
                      causal=causal, num_splits=num_splits, config=config, store_lse=True,
                      kv_format=kv_format, k_scale=k_scale, v_scale=v_scale)(
        q, k_cache, v_cache, cache_seqlens, block_table, out, lse, o_part, lse_part, arrivals,
        k_scale, v_scale)
    return out, lse


@torch.library.custom_op("kvonce::paged_decode", mutates_args=())
def _paged_decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     cache_seqlens: torch.Tensor, block_table: torch.Tensor, softmax_scale: float,
                     causal: bool, block_n: int, num_warps: int, num_stages: int,
                     kv_cache_modifier: str, kv_eviction: str, max_merged_splits: int,
                     k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                     kv_format: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-pass paged decode (``PagedDecodePlan.run`` with ``num_splits == 1``): ``(out
    [batch, q_len, nheads, d], lse float32 [batch, nheads, q_len])``; the config's launch fields
    are passed one by one (a dataclass cannot be an op argument). A quantized cache comes with
    its scales and its kernel format code (``_QUANT_FORMATS``)."""
    return _paged_decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, None, None, None,
                              softmax_scale, causal, block_n, num_warps, num_stages,
                              kv_cache_modifier, kv_eviction, max_merged_splits, k_scale,
                              v_scale, kv_format)


@_paged_decode_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, *launch_fields):
    return _decode_outputs(q, torch.empty)


@torch.library.custom_op("kvonce::paged_decode_split",
                         mutates_args=("o_part", "lse_part", "arrivals"))
def _paged_decode_split_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           cache_seqlens: torch.Tensor, block_table: torch.Tensor,
                           o_part: torch.Tensor, lse_part: torch.Tensor, arrivals: torch.Tensor,
                           softmax_scale: float,
                           causal: bool, block_n: int, num_warps: int, num_stages: int,
                           kv_cache_modifier: str, kv_eviction: str, max_merged_splits: int,
                           k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None, kv_format: int = 0
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K paged decode and its merge (in the same launch up to ``max_merged_splits``
    splits, else a combine launch); ``o_part`` float32 ``[batch, q_len,
    nheads, S, d]``, ``lse_part`` float32 ``[batch, q_len, nheads, S]`` and the int32 zeros
    ``arrivals [batch, nheads_k, M-blocks]`` are the plan's scratch (written, so declared
    mutated; the arrival counts end at zero again)."""
    return _paged_decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, o_part, lse_part,
                              arrivals, softmax_scale, causal, block_n, num_warps, num_stages,
                              kv_cache_modifier, kv_eviction, max_merged_splits, k_scale,
                              v_scale, kv_format)


@_paged_decode_split_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, o_part, lse_part, arrivals,
      *launch_fields):
    return _decode_outputs(q, torch.empty)


def _merge_attention_states_impl(o_a, lse_a, o_b, lse_b):
    out = _empty(o_a.shape, dtype=o_a.dtype, device=o_a.device)
    lse = _empty(o_a.shape[:2], dtype=torch.float32, device=o_a.device)
    launch_merge_states(o_a, lse_a, o_b, lse_b, out, lse)
    return out, lse


@torch.library.custom_op("kvonce::merge_attention_states", mutates_args=())
def _merge_attention_states_op(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor,
                               lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``merge_attention_states`` after its checks."""
    return _merge_attention_states_impl(o_a, lse_a, o_b, lse_b)


@_merge_attention_states_op.register_fake
def _(o_a, lse_a, o_b, lse_b):
    return torch.empty_like(o_a), torch.empty_like(lse_a)
