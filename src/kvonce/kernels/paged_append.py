"""Appending new tokens' K/V to a paged cache: one program per (new token, sequence), quantizing
in registers for a quantized cache (``kvonce.paged.quant``'s formats), so data and scales are
stored by the same launch (no fp16 staging copy, no second pass).

Each program computes exactly ``quantize_kv``'s arithmetic, in float32 with IEEE-rounded division
(``div_rn``: Triton's ``/`` on fp32 is ``div.full.f32``, up to 2 ulp off, which would move
round-half ties), so the bytes equal ``quantize_kv``'s for the same tokens:

    KV_FORMAT 1 fp8 e4m3: y = clamp(x / scale[head], +-448), stored as fp8 (round to nearest even)
    KV_FORMAT 2 int8:     s = max(amax_d |x| / 127, 2^-24), rounded up to an fp16 scale
                          tensor's dtype; q = clamp(rint(x / s), +-127) against that s
    KV_FORMAT 3 int4:     s = max((max_d x - min_d x) / 15, 2^-24); z = min_d x + 8 s;
                          q = clamp(rint((x - z) / s), -8, 7) + 8; byte i: channel i low
                          nibble, channel i + d/2 high (i < d/2); scale row (s, z) in the
                          scale tensor's dtype (fp16 / float32), s and then z rounded to it
                          before q is computed against them

``rint`` is round half to even (``torch.round``), done on the fraction of ``|y|`` (exact):
``.to(tl.int8)`` truncates, ``libdevice.rint`` does not run under the interpreter, and
``floor(y + 0.5)`` alone is wrong where ``y + 0.5`` rounds (0.49999997 -> 1).

Dense-and-sparse keys (``N_OUT > 0``, ``kvonce.paged.outliers``): the program also stores each
head's ``N_OUT`` outlier channels of K into the side cache (``KeyOutliers.split``'s values:
fp16 saturated at +-65504) and quantizes K with those channels set to 0.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import alignment_key, launch, next_pow2
from .paged_decode import _scale_strides  # the decode kernel reads the same scale layouts

# Globals a @triton.jit function reads must be constexpr (compiled; the interpreter does not care).
FP8_MAX = tl.constexpr(448.0)
TINY = tl.constexpr(5.960464477539063e-08)  # 2^-24, quant.py's _TINY: the smallest scale


@triton.jit
def _rint(y):
    """fp32 ``y`` (``|y| < 2^22``) to the nearest integer, ties to even, as fp32; exact."""
    a = tl.abs(y)
    r = tl.floor(a)
    frac = a - r  # exact for a >= 0: the bits below the units
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    r = tl.where((frac > 0.5) | ((frac == 0.5) & odd), r + 1.0, r)
    return tl.where(y < 0, -r, r)


@triton.jit
def _round_to_e4m3_grid(y):
    """fp32 ``y`` (``|y| <= 448``) rounded to the nearest e4m3 value, ties to even, kept in fp32.

    Interpreter only: there ``.to(tl.float8e4nv)`` drops rounding carries and does not saturate
    (triton 3.6), but converts values already on the grid exactly. The grid: 3 mantissa bits for
    normals (``|y| >= 2^-6``), multiples of ``2^-9`` below. Compiled, the cast itself rounds
    (cvt.rn.satfinite) and this step is off."""
    bits = y.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # the exponent, subnormals' floor
    quantum = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inv_quantum = ((127 - e + 3) << 23).to(tl.float32, bitcast=True)
    r = _rint(tl.abs(y) * inv_quantum) * quantum  # powers of two: exact
    # y's sign bit on the rounded magnitude: tiny negatives become -0.0, as torch's cast makes
    # them (``-r`` is ``0 - r`` in Triton, +0.0 for r = 0).
    return (r.to(tl.int32, bitcast=True) | ((bits >> 31) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _store_token_row(x, Cache, Scale, dst, scale_dst, offs_h, h_ok, head_dim, stride_ch,
                     stride_sh, KV_FORMAT: tl.constexpr, FP8_ROUND: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store one token's K (or V) rows ``x`` float32 ``[BLOCK_H, BLOCK_D]`` (padding lanes 0) at
    ``Cache + dst`` (its page slot), quantized per ``KV_FORMAT``; int8/int4 also store their
    scales at ``Scale + scale_dst``, fp8 reads its per-head scales at ``Scale``."""
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = h_ok[:, None] & (offs_d[None, :] < head_dim)
    rows = dst + offs_h[:, None].to(tl.int64) * stride_ch
    if KV_FORMAT == 0:
        tl.store(Cache + rows + offs_d[None, :], x.to(Cache.dtype.element_ty), mask=d_ok)
    elif KV_FORMAT == 1:
        s = tl.load(Scale + offs_h * stride_sh, mask=h_ok, other=1.0)
        y = tl.math.div_rn(x, tl.broadcast_to(s[:, None], [BLOCK_H, BLOCK_D]))
        y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
        if FP8_ROUND:
            y = _round_to_e4m3_grid(y)
        tl.store(Cache + rows + offs_d[None, :], y.to(tl.float8e4nv), mask=d_ok)
    elif KV_FORMAT == 2:
        amax = tl.max(tl.abs(x), axis=1)
        s = tl.maximum(tl.math.div_rn(amax, tl.full([BLOCK_H], 127.0, tl.float32)), TINY)
        if Scale.dtype.element_ty == tl.float16:
            s = _round_up_to_f16(s)     # the scale as stored; the codes against it
        q = _rint(tl.math.div_rn(x, tl.broadcast_to(s[:, None], [BLOCK_H, BLOCK_D])))
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        tl.store(Cache + rows + offs_d[None, :], q.to(tl.int8), mask=d_ok)
        tl.store(Scale + scale_dst + offs_h * stride_sh, s.to(Scale.dtype.element_ty), mask=h_ok)
    else:
        # Padding lanes (channels past head_dim) stay out of the min and max; padding heads
        # (never stored) take 0 for both.
        lo = tl.where(h_ok, tl.min(tl.where(d_ok, x, float("inf")), axis=1), 0.0)
        hi = tl.where(h_ok, tl.max(tl.where(d_ok, x, float("-inf")), axis=1), 0.0)
        s = tl.maximum(tl.math.div_rn(hi - lo, tl.full([BLOCK_H], 15.0, tl.float32)), TINY)
        # The pair as stored (fp16: rounded to nearest even, as quantize_kv's .to), then the
        # codes against it.
        s = s.to(Scale.dtype.element_ty).to(tl.float32)
        offset = (lo + 8.0 * s).to(Scale.dtype.element_ty).to(tl.float32)
        y = tl.math.div_rn(x - offset[:, None],
                           tl.broadcast_to(s[:, None], [BLOCK_H, BLOCK_D]))
        q = (tl.minimum(tl.maximum(_rint(y), -8.0), 7.0) + 8.0).to(tl.int32)
        # Byte i: channel i (low nibble) and channel i + d / 2 (high): kvonce.paged.quant.
        offs_b = tl.arange(0, BLOCK_D // 2)
        lo_idx = tl.broadcast_to(offs_b[None, :], [BLOCK_H, BLOCK_D // 2])
        low = tl.gather(q, lo_idx, 1)
        high = tl.gather(q, tl.minimum(lo_idx + head_dim // 2, BLOCK_D - 1), 1)
        tl.store(Cache + rows + offs_b[None, :], (low | (high << 4)).to(tl.uint8),
                 mask=h_ok[:, None] & (offs_b[None, :] < head_dim // 2))
        s_ptrs = Scale + scale_dst + offs_h * stride_sh
        tl.store(s_ptrs, s.to(Scale.dtype.element_ty), mask=h_ok)
        tl.store(s_ptrs + 1, offset.to(Scale.dtype.element_ty), mask=h_ok)


@triton.jit
def _round_up_to_f16(s):
    """Positive float32 ``s`` rounded up to fp16 (``quantize_kv``'s ``_round_up_to``: the next
    fp16 at or above it, inf past the range), back in float32. Round to nearest, then one fp16
    step up (its bits + 1: positive values order as their bits) where that fell below."""
    r = s.to(tl.float16)
    up = (r.to(tl.int16, bitcast=True) + 1).to(tl.float16, bitcast=True)
    return tl.where(r.to(tl.float32) < s, up.to(tl.float32), r.to(tl.float32))


@triton.jit
def _store_outliers(k, KO, KOC, dst, offs_h, h_ok, stride_koh, N_OUT: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    """One token's K rows ``k`` float32 ``[BLOCK_H, BLOCK_D]``: each head's outlier channels
    (``KOC [nheads_k, N_OUT]``) stored at ``KO + dst`` in the side cache's dtype (fp16 saturated
    at +-65504, as ``KeyOutliers.split``), and ``k`` returned with them set to 0."""
    offs_o = tl.arange(0, N_OUT)
    chans = tl.load(KOC + offs_h[:, None] * N_OUT + offs_o[None, :], mask=h_ok[:, None],
                    other=0)
    values = tl.gather(k, chans, 1)
    if KO.dtype.element_ty == tl.float16:
        values = tl.minimum(tl.maximum(values, -65504.0), 65504.0)
    tl.store(KO + dst + offs_h[:, None].to(tl.int64) * stride_koh + offs_o[None, :],
             values.to(KO.dtype.element_ty), mask=h_ok[:, None])
    offs_d = tl.arange(0, BLOCK_D)
    hit = tl.max((offs_d[None, :, None] == chans[:, None, :]).to(tl.int32), axis=2)
    return tl.where(hit != 0, 0.0, k)


@triton.jit
def _append_paged_kv_kernel(
    K, V,              # new tokens [batch, new_len, nheads_k, HEAD_DIM], last dim contiguous
    KCache, VCache,    # [num_pages, PAGE_SIZE, nheads_k, HEAD_DIM (int4: HEAD_DIM // 2 bytes)],
                       # last dim contiguous
    KS, VS,            # quantized caches' scales (kvonce.paged.quant; any pointer when plain):
                       # fp8 [nheads_k] or 0-dim (read), int8 [num_pages, PAGE_SIZE, nheads_k],
                       # int4 float32 [num_pages, PAGE_SIZE, nheads_k, 2] (written)
    cache_seqlens,     # int32 [batch]: token i of sequence b goes to position cache_seqlens[b] + i
    block_table,       # int32 [batch, max_pages]
    nheads_k, head_dim,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_cp, stride_ct, stride_ch, stride_vcp, stride_vct, stride_vch,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    stride_btb,
    KO, KOC,           # N_OUT > 0: outlier values [num_pages, PAGE_SIZE, nheads_k, N_OUT]
                       # (written) and channels int32 [nheads_k, N_OUT]
    stride_kop, stride_kot, stride_koh,
    PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    KV_FORMAT: tl.constexpr, FP8_ROUND: tl.constexpr, N_OUT: tl.constexpr = 0,
):
    """One program per (new token, sequence): its K and V rows (all KV heads) into their page
    slot, quantized there for a quantized cache (module docstring). Positions come from
    ``cache_seqlens`` on the device (no host sync)."""
    tok = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    pos = tl.load(cache_seqlens + seq) + tok
    page = tl.load(block_table + seq * stride_btb + pos // PAGE_SIZE).to(tl.int64)
    slot = pos % PAGE_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = offs_h < nheads_k
    mask = h_ok[:, None] & (offs_d[None, :] < head_dim)
    k = tl.load(K + seq * stride_kb + tok * stride_kt + offs_h[:, None] * stride_kh
                + offs_d[None, :], mask=mask, other=0.0)
    v = tl.load(V + seq * stride_vb + tok * stride_vt + offs_h[:, None] * stride_vh
                + offs_d[None, :], mask=mask, other=0.0)
    if KV_FORMAT != 0:  # quantize_kv works in float32 (exact from fp16/bf16)
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    if N_OUT > 0:
        k = _store_outliers(k, KO, KOC, page * stride_kop + slot * stride_kot, offs_h, h_ok,
                            stride_koh, N_OUT, BLOCK_D)
    _store_token_row(k, KCache, KS, page * stride_cp + slot * stride_ct,
                     page * stride_ksp + slot * stride_kst, offs_h, h_ok, head_dim, stride_ch,
                     stride_ksh, KV_FORMAT, FP8_ROUND, BLOCK_H, BLOCK_D)
    _store_token_row(v, VCache, VS, page * stride_vcp + slot * stride_vct,
                     page * stride_vsp + slot * stride_vst, offs_h, h_ok, head_dim, stride_vch,
                     stride_vsh, KV_FORMAT, FP8_ROUND, BLOCK_H, BLOCK_D)


def launch_append_paged_kv(k, v, k_cache, v_cache, cache_seqlens, block_table, k_scale=None,
                           v_scale=None, kv_format: int = 0, fp8_round: bool = False,
                           outlier_values=None, outlier_channels=None) -> None:
    """Write ``k, v [batch, new_len, nheads_k, d]`` into their pages, quantized per
    ``kv_format`` (0 plain, 1 fp8 e4m3, 2 int8, 3 int4; decode's codes), scales as
    ``quantize_kv`` returns them; with ``outlier_values``/``outlier_channels`` (a
    ``KeyOutliers``' tensors) K's outlier channels into the side cache. Checks are the caller's.
    ``fp8_round``: the interpreter's rounding step (``_round_to_e4m3_grid``), for the CPU
    interpreter only."""
    batch, new_len, nheads_k, head_dim = k.shape
    if batch == 0 or new_len == 0:
        return
    if kv_format == 0:  # never dereferenced
        k_scale = v_scale = cache_seqlens
    ints = (nheads_k, head_dim, *k.stride()[:3], *v.stride()[:3], *k_cache.stride()[:3],
            *v_cache.stride()[:3], *_scale_strides(k_scale, kv_format),
            *_scale_strides(v_scale, kv_format), block_table.stride(0))
    if outlier_values is None:  # N_OUT = 0: never dereferenced
        outlier_values = outlier_channels = cache_seqlens
        ints += (0, 0, 0)
        n_out = 0
    else:
        ints += tuple(outlier_values.stride()[:3])
        n_out = outlier_values.shape[3]
    constexprs = dict(PAGE_SIZE=k_cache.shape[1], BLOCK_H=next_pow2(nheads_k),
                      BLOCK_D=max(32, next_pow2(head_dim)), KV_FORMAT=kv_format,
                      FP8_ROUND=bool(fp8_round and kv_format == 1), N_OUT=n_out)
    key = (k.dtype, k_cache.dtype, k_scale.dtype, v_scale.dtype, outlier_values.dtype, ints,
           tuple(constexprs.values()),
           alignment_key(k, v, k_cache, v_cache, k_scale, v_scale, cache_seqlens, block_table,
                       outlier_values, outlier_channels))
    launch(_append_paged_kv_kernel, key, (new_len, batch, 1),
           (k, v, k_cache, v_cache, k_scale, v_scale, cache_seqlens, block_table, *ints[:-3],
            outlier_values, outlier_channels, *ints[-3:]),
           constexprs, 4 if nheads_k * head_dim >= 1024 else 1, 1,
           k.device.index if k.device.type == "cuda" else -1)
