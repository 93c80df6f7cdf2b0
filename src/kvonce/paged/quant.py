"""Quantized KV-cache formats: the definitions every kernel and test agrees on.

| ``kv_format`` | data | scales |
| --- | --- | --- |
| ``"fp8_e4m3"`` | ``float8_e4m3fn [..., nheads_k, d]`` | float32 ``[nheads_k]`` per KV head, or 0-dim per tensor: fixed when the cache is created |
| ``"int8"`` | ``int8 [..., nheads_k, d]``, symmetric | fp16 (or float32) ``[..., nheads_k]``: one per (token, KV head) |
| ``"int4"`` | ``uint8 [..., nheads_k, d // 2]``, asymmetric | fp16 (or float32) ``[..., nheads_k, 2]``: (scale, offset) per (token, KV head) |

- fp8: ``x_q = fp8(x / scale)`` (saturating at +-448); ``x = x_q * scale``. Without a given
  scale, ``amax(|x|) / 448`` per KV head over every other dim (the scale a cache is created with).
- int8: ``scale = max(amax(|x|) / 127, 2^-24)`` over ``d`` per (token, head) in float32, rounded
  UP to the scale's dtype (``scale_dtype``: fp16, the default since 2026-11-29, issue 26, 2 bytes
  a key where float32 took 4), ``x_q = round(x / scale)`` against that stored scale. Rounding up
  keeps ``|x / scale| <= 127`` (no clamp), so the error stays within half a level of the stored
  scale, which is at most ``2^-10`` coarser than float32's (below fp16's normal range, keys with
  ``amax < ~0.008``, up to one subnormal step, ``2^-24``, coarser). Keys with ``amax`` over ~8.3e6 read
  inf / NaN under fp16 scales (never a finite wrong value). float32 scales (the format before)
  are still read by every kernel. fp16 scales made the Gluon int8 decode 1.2-1.4% faster (H200,
  head-major pages, 64 x 8192, docs/notes.md).
- int4: asymmetric per (token, KV head), 16 levels over ``[min, max]`` of its ``d`` values, in
  float32: ``scale = max((max - min) / 15, 2^-24)`` rounded to the pair's dtype, ``offset =
  min + 8 * scale`` (that rounded scale) rounded to it, ``q = round((x - offset) / scale)``
  (the rounded pair) clamped to ``[-8, 7]``, stored as ``q + 8`` in 4 bits; ``x = q * scale +
  offset``. The pair is fp16 (``scale_dtype``, the default since 2026-11-29, issue 26: 4
  bytes a key where float32 took 8, 136 bytes a (token, KV head) for K and V against 144);
  quantizing against the rounded pair keeps the error within half a level plus
  ``2^-11 |offset|`` (a clamped extreme). fp16 holds pairs of keys whose ``|min|``, ``|max|``
  stay under ~65000; beyond that the pair reads inf and the key inf or NaN (never a finite wrong
  value). float32 pairs (the format before) are still read by every kernel. Channel ``i`` in
  the low nibble of byte ``i``, channel ``i + d / 2`` in its high nibble (``i < d / 2``), so
  a decode kernel dots each nibble plane as stored. One scale and offset per key put K's on
  the scores' columns (``scale * (q . x_q) + offset * sum(q)``) and V's on the
  probabilities: nothing per channel between the bytes and the dot. Before
  2026-11-27 (issue 26): symmetric per 32 channels, four fp16 scales a key (8 bytes, as a
  float32 pair); the int4 decode loop compiles 18% shorter with one pair, runs from 0.6%
  slower to 5% faster on the H100 and 10-29% faster on an H200 (graphs, docs/notes.md), and
  the output error on random keys rose 1.39e-1 -> 1.44e-1 (scripts/quant_accuracy.py). Keys
  with outlier channels need ``KeyTransform`` or ``KeyOutliers`` in either form
  (docs/notes.md).
- An all-zero row (int8, int4) gets the smallest positive scale (never 0 or NaN) and dequantizes
  to 0.
- Storage: the kernels read data and scales through their strides. ``quantize_kv`` of a 4-D
  (paged) ``x [pages, page, nheads_k, d]`` returns int4's and int8's scales stored head-major
  (memory ``[pages, nheads_k, page, 2]`` / ``[pages, nheads_k, page]``, returned as its
  ``transpose(1, 2)`` view: same shape and values, ``is_contiguous()`` False) whatever ``x``'s
  own layout: each KV head's scales of a page are then one run (64 / 32 bytes at page 16 in
  fp16) where token-major storage puts them ``nheads_k * 4`` / ``nheads_k * 2`` bytes apart.
  Measured with token-major int4 pages and float32 pairs (H100, graphs, 2026-11-27,
  docs/notes.md): GQA 32/8 64 x 8192 230 -> 216 us, 1 x 131072 68.7 -> 65.6, MHA 12/12
  1 x 131072 99.9 -> 92.9; int8's one float per key measured no different either way in the
  Triton kernel (404 / 405 us). The Gluon decode
  (kernels/gluon_decode.py) brings head-major int8 runs by TMA with each K tile (``SCALE_RING``:
  2-3% faster than a load a key on the H200, 2026-11-29) and reads other strides a key at a
  time; its int4 form (swapped operands, where ``paged.splits.gluon_int4_pays``) takes only
  head-major pairs (token-major ones keep the Triton kernel).
"""
from __future__ import annotations

import torch

from .. import _validate as V

KV_FORMATS = ("fp8_e4m3", "int8", "int4")
FP8_MAX = 448.0
INT4_HEAD_DIM_MULTIPLE = 32  # the kernels' nibble planes (d / 2 bytes) in 16-byte runs
_TINY = 2.0 ** -24  # the smallest scale (fp16's smallest subnormal): never 0, never NaN


def _const(value: float, like: torch.Tensor) -> torch.Tensor:
    """A 0-dim float32 tensor on ``like``'s device. Dividing by it is an IEEE division everywhere;
    dividing a CUDA tensor by a Python number multiplies by its reciprocal instead (1 ulp off at
    times), which made the GPU's scales differ from the CPU's and from the kernels'."""
    return torch.full((), value, dtype=torch.float32, device=like.device)


def _check_format(kv_format) -> None:
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format must be one of {KV_FORMATS}, got {kv_format!r}")


SCALE_DTYPES = (torch.float16, torch.float32)   # int8's scales and int4's pairs


def _round_up_to(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Positive float32 ``s`` rounded up to ``dtype`` (the next representable value at or above
    it: inf past fp16's range), back in float32."""
    r = s.to(dtype)
    r = torch.where(r.float() < s, torch.nextafter(r, torch.full_like(r, float("inf"))), r)
    return r.float()


def quantize_kv(x: torch.Tensor, kv_format: str, *, scale: torch.Tensor | None = None,
                scale_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize K or V ``x [..., nheads_k, d]`` (fp16/bf16/fp32): whole caches or new tokens.

    Returns ``(x_q, x_scale)`` as in the module table. ``scale``: only for ``"fp8_e4m3"`` (float32
    ``[nheads_k]`` or 0-dim), to quantize new tokens with the cache's fixed scale; int8/int4 scales
    are per token and always computed here. ``scale_dtype``: int8's scales' and int4's (scale,
    offset) pairs' dtype, ``torch.float16`` (None: the default) or ``torch.float32``.
    """
    _check_format(kv_format)
    if scale_dtype is not None and (kv_format == "fp8_e4m3"
                                    or scale_dtype not in SCALE_DTYPES):
        raise ValueError(f"scale_dtype is int8's scales' and int4's (scale, offset) pairs' "
                         f"dtype, one of {SCALE_DTYPES}; got {scale_dtype} for {kv_format}")
    V.check_tensor("x", x, dtypes=V.ATTN_DTYPES)
    if x.dim() < 2:
        raise ValueError(f"x must be [..., nheads_k, d], got shape {tuple(x.shape)}")
    nheads_k, d = x.shape[-2], x.shape[-1]
    xf = x.float()
    if kv_format == "fp8_e4m3":
        if scale is None:
            amax = xf.abs().transpose(0, -2).reshape(nheads_k, -1).amax(dim=1)
            scale = torch.clamp(amax / _const(FP8_MAX, x), min=_TINY)
        else:
            V.check_tensor("scale", scale, dtypes=(torch.float32,))
            if scale.shape not in ((), (nheads_k,)):
                raise ValueError(f"fp8 scale must be float32 [nheads_k] = [{nheads_k}] or 0-dim, "
                                 f"got {tuple(scale.shape)}")
        per_head = scale if scale.dim() == 0 else scale[:, None]
        x_q = torch.clamp(xf / per_head, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return x_q, scale
    if scale is not None:
        raise ValueError(f"{kv_format} scales are per token and computed here: pass scale=None")
    stored_dtype = scale_dtype or torch.float16
    if kv_format == "int8":
        s = torch.clamp(xf.abs().amax(dim=-1) / _const(127.0, x), min=_TINY)
        s = _round_up_to(s, stored_dtype)              # the scale as stored
        x_q = torch.clamp(torch.round(xf / s[..., None]), -127, 127).to(torch.int8)
        s = s.to(stored_dtype)
        if x.dim() == 4:   # a paged cache's scales stored head-major ("Storage")
            s = s.transpose(1, 2).contiguous().transpose(1, 2)
        return x_q, s
    if d % INT4_HEAD_DIM_MULTIPLE != 0:
        raise ValueError(f"int4 needs a head dim that is a multiple of {INT4_HEAD_DIM_MULTIPLE}, "
                         f"got {d}")
    pair_dtype = stored_dtype
    lo = xf.amin(dim=-1)
    s = torch.clamp((xf.amax(dim=-1) - lo) / _const(15.0, x), min=_TINY)
    s = s.to(pair_dtype).float()                       # the pair as stored
    offset = (lo + 8.0 * s).to(pair_dtype).float()
    q = torch.clamp(torch.round((xf - offset[..., None]) / s[..., None]), -8, 7)
    q = q.to(torch.int16) + 8
    packed = (q[..., : d // 2] | (q[..., d // 2:] << 4)).to(torch.uint8)
    scales = torch.stack([s, offset], dim=-1).to(pair_dtype)
    if x.dim() == 4:
        # A paged cache's scales stored head-major (module docstring, "Storage")
        scales = scales.transpose(1, 2).contiguous().transpose(1, 2)
    return packed, scales


def dequantize_kv(x_q: torch.Tensor, x_scale: torch.Tensor, kv_format: str,
                  dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Inverse of ``quantize_kv``: ``x [..., nheads_k, d]`` in ``dtype`` (computed in float32)."""
    _check_format(kv_format)
    if kv_format == "fp8_e4m3":
        V.check_tensor("x_q", x_q, dtypes=(torch.float8_e4m3fn,))
        per_head = x_scale if x_scale.dim() == 0 else x_scale[:, None]
        return (x_q.float() * per_head).to(dtype)
    if kv_format == "int8":
        V.check_tensor("x_q", x_q, dtypes=(torch.int8,))
        return (x_q.float() * x_scale.float()[..., None]).to(dtype)
    V.check_tensor("x_q", x_q, dtypes=(torch.uint8,))
    b = x_q.to(torch.int16)
    q = torch.cat([b & 15, b >> 4], dim=-1) - 8  # channels i, then i + d / 2
    s, offset = x_scale.float().unbind(-1)
    return (q.float() * s[..., None] + offset[..., None]).to(dtype)
