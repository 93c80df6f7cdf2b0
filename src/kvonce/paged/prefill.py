"""Varlen paged attention: prefill, chunked prefill and decode rows of many sequences in one call.

``paged_prefill`` runs kernels/paged_prefill.py over a paged cache (plain or quantized) for a
flat ``[total_q, nheads, d]`` batch of query rows; a ``PagedPrefillPlan`` validates once and is
reused by every layer of a step. Nothing on the hot path reads tensor values on the host: the grid
comes from shapes, the kernel finds its sequence in ``cu_seqlens_q`` itself, so ``run`` is
CUDA-graph capturable (for a fixed ``total_q`` and batch).
"""
from __future__ import annotations

import torch

from .. import _validate as V
from .._dispatch import require_values, use_op
from ..kernels.configs import (PagedPrefillConfig, device_info, get_paged_prefill_config,
                               op_fields)
from ..kernels._launch import dot_precision
from ..kernels.paged_prefill import PagedPrefillLaunch
from ._alloc import allocator
from .checks import (QUANT_FORMATS, check_block_table_values, check_device_ok, check_scales,
                     launch_layout, resolve_kv_format, validate_cache,
                     validate_quantized_cache)
from .decode import PagedDecodePlan
from .key_transform import KeyTransform
from .outliers import KeyOutliers

__all__ = ["paged_prefill", "PagedPrefillPlan"]


def _validate(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, max_seqlen_q,
              kv_format, k_scale, v_scale) -> None:
    """Every check that reads no tensor value (ranks, dtypes, shapes, devices, scales)."""
    V.check_tensor("q", q, ndim=3, dtypes=V.ATTN_DTYPES)
    head_dim = q.shape[2]
    if kv_format is None:
        if k_scale is not None or v_scale is not None:
            raise ValueError("k_scale/v_scale are for quantized caches (fp8/int8/int4)")
        validate_cache(k_cache, v_cache, cache_seqlens, block_table)
        V.check_same_dtype(k_cache=k_cache, q=q)
        if k_cache.shape[3] != head_dim:
            raise ValueError(f"head dim mismatch: q has {head_dim}, k_cache has "
                             f"{k_cache.shape[3]}")
    else:
        validate_quantized_cache(k_cache, v_cache, cache_seqlens, block_table, kv_format)
        stored = head_dim // 2 if kv_format == "int4" else head_dim
        if k_cache.shape[3] != stored or (kv_format == "int4" and head_dim % 32 != 0):
            raise ValueError(f"k_cache's last dim must be {stored} for q's head dim {head_dim} "
                             f"({kv_format}), got {k_cache.shape[3]}")
        check_scales(k_scale, v_scale, kv_format, k_cache.shape, head_dim)
    V.check_head_dim("q", head_dim)
    V.check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, batch=block_table.shape[0])
    V.check_gqa(q.shape[1], k_cache.shape[2])
    V.check_last_dim_contiguous(q=q)
    V.check_nonnegative_int("max_seqlen_q", max_seqlen_q)
    scales = {name: t for name, t in (("k_scale", k_scale), ("v_scale", v_scale))
              if t is not None}
    V.check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, cu_seqlens_q=cu_seqlens_q,
                        cache_seqlens=cache_seqlens, block_table=block_table, **scales)
    check_device_ok(q.device)


def _check_values(q, k_cache, cu_seqlens_q, cache_seqlens, block_table, max_seqlen_q) -> None:
    """Validation mode (host sync): ``cu_seqlens_q`` runs from 0 to ``total_q`` without going
    down, no sequence has more query rows than ``max_seqlen_q`` or than its cache holds, and the
    block table has existing pages for every cached position."""
    require_values("check_block_table=True", cu_seqlens_q=cu_seqlens_q)
    cu = cu_seqlens_q.long()
    q_lens = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or int(cu[-1]) != q.shape[0] or bool((q_lens < 0).any()):
        raise ValueError(f"cu_seqlens_q must rise from 0 to total_q = {q.shape[0]}, got "
                         f"cu_seqlens_q[0] = {int(cu[0])}, cu_seqlens_q[-1] = {int(cu[-1])}, "
                         f"smallest length {int(q_lens.min()) if q_lens.numel() else 0}")
    if bool((q_lens > max_seqlen_q).any()):
        raise ValueError(f"a sequence has {int(q_lens.max())} query rows, more than "
                         f"max_seqlen_q = {max_seqlen_q}")
    if bool((q_lens > cache_seqlens.long()).any()):
        b = int(torch.nonzero(q_lens > cache_seqlens.long())[0, 0])
        raise ValueError(f"sequence {b} has {int(q_lens[b])} query rows but cache_seqlens[{b}] = "
                         f"{int(cache_seqlens[b])}: its new tokens must be in the cache already")
    check_block_table_values(cache_seqlens, block_table, k_cache.shape[0], k_cache.shape[1])


class PagedPrefillPlan:
    """Checks and launch config of one varlen paged step, reused by every layer.

    ``PagedPrefillPlan(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, *,
    max_seqlen_q, ...)`` validates the example tensors fully (arguments as in
    ``paged_prefill``). ``run(...)`` then takes tensors of the same shapes (``total_q``, batch,
    cache page layout), dtypes and device, whose values may change freely, checks that cheaply and
    launches: no host sync, CUDA-graph capturable. Eager runs launch directly (the launch is bound
    once per stride layout); under ``torch.compile``, dispatch or function modes, or with
    fake/meta/subclass tensors (``kvonce._dispatch.use_op``) ``run`` calls the
    ``torch.ops.kvonce.paged_prefill`` custom op, which runs the same kernel. fp32 queries: the
    dots follow PyTorch's float32 matmul precision as it is when the plan is built (IEEE fp32
    under the default "highest", TF32 under "high"/"medium").
    """

    def __init__(self, q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, *,
                 max_seqlen_q: int, softmax_scale: float | None = None, causal: bool = True,
                 check_block_table: bool = False, config: PagedPrefillConfig | None = None,
                 kv_format: str | None = None, k_scale=None, v_scale=None):
        self.kv_format = resolve_kv_format(k_cache, kv_format)
        _validate(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, max_seqlen_q,
                  self.kv_format, k_scale, v_scale)
        if check_block_table:
            _check_values(q, k_cache, cu_seqlens_q, cache_seqlens, block_table, max_seqlen_q)
        self._kv_code = 0 if self.kv_format is None else QUANT_FORMATS[self.kv_format][0]
        head_dim = q.shape[2]
        self.config = config or get_paged_prefill_config(device_info(q.device)[0], head_dim,
                                                         self.kv_format, q.element_size())
        self.causal = causal
        self.max_seqlen_q = max_seqlen_q
        self.softmax_scale = head_dim ** -0.5 if softmax_scale is None else float(softmax_scale)
        self._q_shape, self._kv_tail, self._batch = q.shape, k_cache.shape[1:], block_table.shape[0]
        # A decode-only step (one row per sequence: total_q == batch and max_seqlen_q == 1, both
        # known without reading values) runs the decode kernel: 16-row tiles and split-K instead
        # of 128-row tiles holding GROUP real rows (1.10 vs 0.73 ms at 64 x 8192, H100,
        # docs/benchmarks.md 2026-11-24). Same math, same outputs.
        self._decode = None
        batch, (total_q, nheads, _) = block_table.shape[0], q.shape
        if total_q == batch > 0 and max_seqlen_q == 1 and config is None:
            self._decode = PagedDecodePlan(
                q.view(batch, 1, nheads, head_dim), k_cache, v_cache, cache_seqlens, block_table,
                softmax_scale=self.softmax_scale, causal=causal, kv_format=kv_format,
                k_scale=k_scale, v_scale=v_scale)
        self._dtype, self._kv_dtype, self._device = q.dtype, k_cache.dtype, q.device
        # Launches bound to one stride layout (q, caches, block table, scales, return_lse), made
        # at the first eager run of that layout, after the full checks.
        self._launches: dict = {}

    def _check_like_plan(self, q, k_cache, v_cache, cu_seqlens_q, cache_seqlens,
                         block_table) -> None:
        if (q.shape != self._q_shape or k_cache.shape[1:] != self._kv_tail
                or v_cache.shape != k_cache.shape or q.dtype != self._dtype
                or k_cache.dtype != self._kv_dtype or v_cache.dtype != self._kv_dtype
                or q.device != self._device or block_table.shape[0] != self._batch
                or cache_seqlens.shape != (self._batch,)
                or cu_seqlens_q.shape != (self._batch + 1,)):
            raise ValueError(
                f"PagedPrefillPlan.run: inputs differ from the plan (q {tuple(q.shape)} "
                f"{q.dtype} on {q.device}, k_cache {tuple(k_cache.shape)}, batch "
                f"{block_table.shape[0]}; planned q {tuple(self._q_shape)} {self._dtype} on "
                f"{self._device}, k_cache [*, {', '.join(map(str, self._kv_tail))}], batch "
                f"{self._batch}): make a new plan")

    def run(self, q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, *,
            k_scale=None, v_scale=None, return_lse: bool = False,
            key_transform: KeyTransform | None = None, key_outliers: KeyOutliers | None = None):
        """Attention for tensors shaped like the planned ones; returns like ``paged_prefill``.
        A quantized cache takes this layer's ``k_scale``/``v_scale`` (shapes as planned), and
        ``key_transform`` or ``key_outliers`` where its keys were stored through one
        (``paged_prefill``)."""
        if key_outliers is not None:
            if key_transform is not None:
                raise ValueError("key_outliers and key_transform: use one")
            return self._run(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table,
                             k_scale, v_scale, return_lse, key_outliers)
        if key_transform is None:
            return self._run(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table,
                             k_scale, v_scale, return_lse)
        out = self._run(key_transform.queries(q), k_cache, v_cache, cu_seqlens_q, cache_seqlens,
                        block_table, k_scale, v_scale, return_lse)
        if not return_lse:
            return out
        out, lse = out
        # q' . k' = q . k - q . c: the same shift for every key of a row ([total_q, h] -> the
        # LSE's [h, total_q]); -inf rows stay -inf.
        return out, lse + key_transform.lse_offset(q, self.softmax_scale).t()

    def _run(self, q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, k_scale,
             v_scale, return_lse, key_outliers=None):
        self._check_like_plan(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table)
        ko = key_outliers
        if ko is not None:
            ko.check_for(q, k_cache, self.kv_format)
        if self._decode is not None:  # its run takes the decode op where use_op says
            batch, nheads, head_dim = self._batch, q.shape[1], q.shape[2]
            res = self._decode.run(q.view(batch, 1, nheads, head_dim), k_cache, v_cache,
                                   cache_seqlens, block_table, k_scale=k_scale, v_scale=v_scale,
                                   return_lse=return_lse, key_outliers=ko)
            if not return_lse:
                return res.view(q.shape)
            out, lse = res  # lse [batch, nheads, 1] -> [nheads, total_q]
            return out.view(q.shape), lse.view(batch, nheads).t().contiguous()
        values, channels = (None, None) if ko is None else (ko.values, ko.channels)
        if use_op(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, k_scale,
                  v_scale, values, channels):
            out, lse = torch.ops.kvonce.paged_prefill(
                q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, self.softmax_scale,
                self.causal, *op_fields(self.config), k_scale, v_scale, self._kv_code, values,
                channels)
            return (out, lse) if return_lse else out
        layout = launch_layout(q, k_cache, v_cache, block_table, return_lse, k_scale, v_scale,
                               values, channels)
        launch = self._launches.get(layout)
        if launch is None:
            _validate(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table,
                      self.max_seqlen_q, self.kv_format, k_scale, v_scale)
            launch = PagedPrefillLaunch(q, k_cache, v_cache, block_table,
                                        softmax_scale=self.softmax_scale, causal=self.causal,
                                        config=self.config, store_lse=return_lse,
                                        kv_format=self._kv_code, k_scale=k_scale, v_scale=v_scale,
                                        outlier_values=values)
            self._launches[layout] = launch
        out, lse = _outputs(q, allocator.empty)
        launch(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, out,
               lse if return_lse else None, k_scale, v_scale, values, channels)
        return (out, lse) if return_lse else out


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    max_seqlen_q: int,
    softmax_scale: float | None = None,
    causal: bool = True,
    return_lse: bool = False,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_format: str | None = None,
    check_block_table: bool = False,
    config: PagedPrefillConfig | None = None,
    key_transform: KeyTransform | None = None,
    key_outliers: KeyOutliers | None = None,
):
    """Attention of each sequence's newest tokens over its paged KV cache, for a varlen batch
    that mixes prefill, chunked-prefill and decode rows (one launch).

    Parameters
    ----------
    q : ``[total_q, nheads, headdim]`` fp16/bf16, or fp32
        (computed in fp32: IEEE dots under PyTorch's default matmul precision, TF32 only when
        the user allows it), last dim contiguous;
        sequence ``b``'s rows are ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1]``.
    k_cache, v_cache : ``[num_pages, page_size, nheads_k, headdim]`` (quantized:
        ``kvonce.paged.quant``'s layouts), ``page_size`` a power of two in 16..256,
        ``nheads % nheads_k == 0`` (GQA: q head ``h`` reads KV head ``h // (nheads // nheads_k)``).
    cu_seqlens_q : int32 ``[batch + 1]``, from 0 to ``total_q``; ``q_len_b`` may be 0.
    cache_seqlens : int32 ``[batch]``: sequence ``b`` has ``cache_seqlens[b]`` keys, its
        ``q_len_b`` new tokens included (append them first: ``append_paged_kv``).
    block_table : int32 ``[batch, max_pages]``; position ``p`` of sequence ``b`` is
        ``cache[block_table[b, p // page_size], p % page_size]``.
    max_seqlen_q : the largest ``q_len_b`` (flash-attn's argument; checked only in validation
        mode, the launch does not need it).
    softmax_scale : defaults to ``headdim ** -0.5``.
    causal : bottom-right: with ``L = cache_seqlens[b]`` and ``n = q_len_b``, row ``i`` sees key
        ``j <= i + L - n`` (a chunk of 3 rows over a history of 4 cached tokens, L = 7)::

            keys:  0 1 2 3 4 5 6
            row 0  1 1 1 1 1 0 0
            row 1  1 1 1 1 1 1 0
            row 2  1 1 1 1 1 1 1

    return_lse : also return the LSE.
    k_scale, v_scale, kv_format : a quantized cache, as in ``paged_attention`` (fp8/int8 from the
        dtype, ``kv_format="int4"`` for a uint8 cache).
    check_block_table : validation mode (host sync, not capturable): ``cu_seqlens_q`` rises from 0
        to ``total_q``, ``q_len_b <= min(max_seqlen_q, cache_seqlens[b])``, and the table names
        existing pages for every cached position.
    config : launch-config override for experiments (kernels/configs.py).
    key_transform : a ``kvonce.paged.KeyTransform`` the cache's keys were stored through
        (``append_paged_kv(..., key_transform=)``: keys with outlier channels). ``q`` is
        transformed to match (``(q * s) @ H`` in q's dtype, two small PyTorch ops per call) and
        the LSE corrected by ``softmax_scale * q . c`` (``-inf`` rows stay ``-inf``); the output
        is that of the original keys.
    key_outliers : a ``kvonce.paged.KeyOutliers`` (quantized caches), as in ``paged_attention``.

    Returns
    -------
    out : ``[total_q, nheads, headdim]``, q's dtype.
    lse : float32 ``[nheads, total_q]``, natural log (only with ``return_lse``). A row that sees
        no key gets ``out = 0``, ``lse = -inf`` (never NaN).

    For many layers of one step, ``PagedPrefillPlan`` does the checks once.
    """
    signature = None
    if not (check_block_table or torch.compiler.is_compiling()):
        signature = V.call_signature(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens,
                                     block_table, max_seqlen_q, softmax_scale, causal, config,
                                     k_scale, v_scale, kv_format,
                                     dot_precision(getattr(q, "dtype", None)))
    plan = _one_shot_plans.get(signature)
    if plan is None:
        plan = PagedPrefillPlan(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table,
                                max_seqlen_q=max_seqlen_q, softmax_scale=softmax_scale,
                                causal=causal, check_block_table=check_block_table,
                                config=config, kv_format=kv_format, k_scale=k_scale,
                                v_scale=v_scale)
        _one_shot_plans.add(signature, plan)
    return plan.run(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table,
                    k_scale=k_scale, v_scale=v_scale, return_lse=return_lse,
                    key_transform=key_transform, key_outliers=key_outliers)


# One-shot calls reuse the plan of an earlier call with the same signature (shapes, strides,
# dtypes, devices, scalars; never values), as paged_attention does: a hit skips the checks. The
# plans own no scratch, so calls on different streams share nothing.
_one_shot_plans = V.PassedChecks()


# ------------------------------------------------------------------------------------------------
# torch.library custom op: what torch.compile records (opaque to Inductor), with a fake
# implementation for shapes; plain eager calls run the same launch without the op dispatch.
# FLOP formula: kvonce/flops.py.
# ------------------------------------------------------------------------------------------------

def _outputs(q: torch.Tensor, alloc) -> tuple[torch.Tensor, torch.Tensor]:
    total_q, nheads, _ = q.shape
    return (alloc(q.shape, dtype=q.dtype, device=q.device),
            alloc((nheads, total_q), dtype=torch.float32, device=q.device))


@torch.library.custom_op("kvonce::paged_prefill", mutates_args=())
def _paged_prefill_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      cu_seqlens_q: torch.Tensor, cache_seqlens: torch.Tensor,
                      block_table: torch.Tensor, softmax_scale: float, causal: bool,
                      block_m: int, block_n: int, num_warps: int, num_stages: int,
                      kv_cache_modifier: str, kv_eviction: str, last_tiles_first: bool,
                      int64_kv_offsets: bool, prefetch_pages: bool, tma: bool, pack_gqa: bool,
                      gluon: bool, gluon_block_n: int, gluon_stages: int,
                      gluon_persistent: bool,
                      k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                      kv_format: int = 0, outlier_values: torch.Tensor | None = None,
                      outlier_channels: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [total_q, nheads, d], lse float32 [nheads, total_q])`` of ``paged_prefill``; the
    config's fields one by one (an op cannot take a dataclass), a quantized cache's scales and
    its kernel format code (``QUANT_FORMATS``), and dense-and-sparse keys' side cache and
    channels (``KeyOutliers``)."""
    config = PagedPrefillConfig(block_m, block_n, num_warps, num_stages,
                                kv_cache_modifier=kv_cache_modifier, kv_eviction=kv_eviction,
                                last_tiles_first=last_tiles_first,
                                int64_kv_offsets=int64_kv_offsets,
                                prefetch_pages=prefetch_pages, tma=tma, pack_gqa=pack_gqa,
                                gluon=gluon, gluon_block_n=gluon_block_n,
                                gluon_stages=gluon_stages,
                                gluon_persistent=gluon_persistent)
    out, lse = _outputs(q, allocator.empty)
    PagedPrefillLaunch(q, k_cache, v_cache, block_table, softmax_scale=softmax_scale,
                       causal=causal, config=config, store_lse=True, kv_format=kv_format,
                       k_scale=k_scale, v_scale=v_scale, outlier_values=outlier_values)(
        q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, out, lse, k_scale,
        v_scale, outlier_values, outlier_channels)
    return out, lse


@_paged_prefill_op.register_fake
def _(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table, *launch_fields):
    return _outputs(q, torch.empty)
