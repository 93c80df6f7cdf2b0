"""Quantized KV formats (``kvonce.paged.quant``): round-trip error bounds, layouts, scales, checks."""
import pytest
import torch
from conftest import DEVICE

from kvonce.paged.quant import dequantize_kv, quantize_kv


def _keys(*shape, outliers=False):
    x = torch.randn(*shape, device=DEVICE)
    if outliers:  # a few channels 10-30x larger, as real LLM keys have
        x[..., 3] *= 30.0
        x[..., 17] *= 10.0
    return x.half()


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("outliers", [False, True])
def test_int8_per_token_bound(outliers, scale_dtype):
    x = _keys(3, 16, 2, 64, outliers=outliers)
    x_q, s = quantize_kv(x, "int8", scale_dtype=scale_dtype)
    assert x_q.dtype == torch.int8 and x_q.shape == x.shape
    assert s.dtype == scale_dtype and s.shape == x.shape[:-1]
    err = (dequantize_kv(x_q, s, "int8", torch.float32) - x.float()).abs()
    # Half a step of the stored scale, which is amax / 127 rounded up (fp16: by at most 2^-10)
    amax = x.float().abs().amax(-1)
    assert (s.float() >= amax / 127).all()
    assert (s.float() <= amax / 127 * (1 + (2 ** -10 if scale_dtype == torch.float16 else 1e-6))
            ).all()
    assert (err <= s.float()[..., None] * (0.5 + 1e-5)).all()
    assert x_q.abs().amax(-1).eq(127).sum() > 0.9 * amax.numel()   # the levels used to the end


def test_int8_fp16_scales_round_up_to_the_stored_scale():
    """fp16 scales are amax / 127 rounded UP (next fp16) and the codes are computed against them:
    no code clamps, so even keys whose scales fall below fp16's normal range (amax < ~0.008,
    where a nearest rounding could move a scale by half its subnormal step) and a key a hair
    past an fp16 value stay within half a level; keys past fp16's range read inf, never a finite
    wrong value; the default is fp16."""
    rows = torch.randn(6, 64)
    rows[0] *= 1e-5                                    # scale ~ 1e-7: 2 subnormal steps
    rows[1] *= 3e-4                                    # subnormal scale
    rows[2, 0] = 127.0 * (1 + 2 ** -11)                # amax / 127 just past 1.0: rounds up
    rows[3] = 0.0                                      # the smallest scale, 2^-24
    rows[4, 1] = 127.0 * 65504.0 * 2                   # past fp16: inf scale
    x = rows.view(6, 1, 64).to(DEVICE)
    x_q, s = quantize_kv(x, "int8")
    assert s.dtype == torch.float16
    sf = s.float()[:, 0]
    assert (sf[:5] >= x.abs().amax(-1)[:5, 0] / 127).all()
    assert sf[2].item() == 1.0 + 2 ** -10 and sf[3].item() == 2 ** -24
    back = dequantize_kv(x_q, s, "int8", torch.float32)
    err = (back - x)[:4].abs()
    assert (err <= sf[:4, None, None] * (0.5 + 1e-6)).all()
    assert (x_q[:3].abs().amax(-1) <= 127).all() and back[3].eq(0).all()
    assert sf[4].isinf() and not torch.isfinite(back[4]).all()
    # the same bytes as a float32 quantization against the stored scales
    want = torch.clamp(torch.round(x[:4] / sf[:4, None, None]), -127, 127).to(torch.int8)
    assert torch.equal(x_q[:4], want)


# int4's (scale, offset) pair dtypes and their relative rounding (fp16: half an ulp, 2^-11).
INT4_PAIRS = [(torch.float16, 2.0 ** -11), (torch.float32, 1e-6)]


@pytest.mark.parametrize("pair_dtype,rel", INT4_PAIRS)
@pytest.mark.parametrize("outliers", [False, True])
def test_int4_per_key_bound_and_layout(outliers, pair_dtype, rel):
    x = _keys(2, 16, 2, 128, outliers=outliers)
    x_q, s = quantize_kv(x, "int4", scale_dtype=pair_dtype)
    assert x_q.dtype == torch.uint8 and x_q.shape == (2, 16, 2, 64)
    assert s.dtype == pair_dtype and s.shape == (2, 16, 2, 2)
    scale, offset = s.float().unbind(-1)
    xf = x.float()
    assert torch.allclose(scale, (xf.amax(-1) - xf.amin(-1)) / 15, rtol=rel, atol=0)
    # the offset from the scale as stored, then rounded itself
    assert torch.allclose(offset, xf.amin(-1) + 8 * scale, rtol=rel, atol=1e-6)
    back = dequantize_kv(x_q, s, "int4", torch.float32)
    # Half a step of the stored scale, plus the offset's rounding (a clamped extreme), plus
    # float32 rounding.
    bound = scale[..., None] * (0.5 + 1e-5) + offset.abs()[..., None] * rel + xf.abs() * 1e-6
    assert ((back - xf).abs() <= bound).all()
    # Nibble order: channel i low, i + d/2 high, q + 8 (d = 64: byte 0 holds channels 0 and 32).
    y = torch.zeros(1, 1, 64, device=DEVICE, dtype=torch.float16)
    y[..., 0], y[..., 32], y[..., 1] = 7.0, -8.0, 7.0
    y_q, y_s = quantize_kv(y, "int4", scale_dtype=pair_dtype)
    assert y_s.tolist() == [[[1.0, 0.0]]]
    assert y_q[0, 0, 0].item() == 15 and y_q[0, 0, 1].item() == (15 | (8 << 4))
    assert y_q[0, 0, 2:].eq(8 | (8 << 4)).all()


@pytest.mark.parametrize("pair_dtype,rel", INT4_PAIRS)
def test_int4_offset_rows(pair_dtype, rel):
    """Rows far from 0 (a common offset larger than their spread: the minimum, not a symmetric
    range, sets the levels) and constant rows dequantize within half a step (plus, fp16 pairs,
    the offset's own rounding: 2^-11 of it, where the codes clamp)."""
    x = torch.randn(4, 2, 64, device=DEVICE) * 0.1 + 100.0
    x[0, 1] = -3.0  # constant
    x_q, s = quantize_kv(x, "int4", scale_dtype=pair_dtype)
    back = dequantize_kv(x_q, s, "int4", torch.float32)
    s = s.float()
    bound = s[..., :1] * 0.51 + s[..., 1:].abs() * rel + x.abs() * 1e-6
    assert ((back - x).abs() <= bound).all()
    assert (back[0, 1] + 3.0).abs().max() < 1e-5


def test_int4_fp16_pairs_error_matches_float32():
    """fp16 pairs cost int4 nothing measurable on keys of unit scale: the output of a
    dequantized row stays within 1% of the float32 pairs' error, both well under the level."""
    x = _keys(4, 64, 2, 128, outliers=False)
    errs = []
    for pair_dtype in (torch.float16, torch.float32):
        x_q, s = quantize_kv(x, "int4", scale_dtype=pair_dtype)
        errs.append((dequantize_kv(x_q, s, "int4", torch.float32) - x.float()).pow(2).mean())
    assert errs[0] <= errs[1] * 1.01, errs


@pytest.mark.parametrize("fmt,dt", [("int4", torch.bfloat16), ("int8", torch.bfloat16),
                                    ("int8", torch.float64), ("fp8_e4m3", torch.float32)])
def test_scale_dtype_is_fp16_or_float32_for_the_integer_formats(fmt, dt):
    with pytest.raises(ValueError, match="scale_dtype"):
        quantize_kv(_keys(1, 16, 1, 64), fmt, scale_dtype=dt)


def test_fp8_per_head_scale_and_given_scale():
    x = _keys(4, 16, 3, 64)
    x_q, s = quantize_kv(x, "fp8_e4m3")
    assert x_q.dtype == torch.float8_e4m3fn and s.shape == (3,) and s.dtype == torch.float32
    back = dequantize_kv(x_q, s, "fp8_e4m3", torch.float32)
    # e4m3: 3 mantissa bits, relative error <= 2^-4 in the normal range, plus the subnormal step.
    err = (back - x.float()).abs()
    assert (err <= x.float().abs() * 2 ** -4 + s[:, None] * 2 ** -9).all()
    # New tokens with the cache's fixed scale (values past the range saturate, never inf/NaN).
    new = _keys(1, 1, 3, 64) * 100
    new_q, same = quantize_kv(new, "fp8_e4m3", scale=s)
    assert same is s and torch.isfinite(new_q.float()).all()
    per_tensor = torch.tensor(0.05, device=DEVICE)
    t_q, _ = quantize_kv(x, "fp8_e4m3", scale=per_tensor)
    assert torch.isfinite(dequantize_kv(t_q, per_tensor, "fp8_e4m3")).all()


@pytest.mark.parametrize("kv_format", ["fp8_e4m3", "int8", "int4"])
def test_zeros_stay_zero(kv_format):
    x = torch.zeros(2, 4, 2, 64, device=DEVICE, dtype=torch.bfloat16)
    x_q, s = quantize_kv(x, kv_format)
    scale = s[..., 0] if kv_format == "int4" else s  # int4: (scale, minimum)
    assert (scale > 0).all() and torch.isfinite(s.float()).all()
    assert dequantize_kv(x_q, s, kv_format, torch.float32).eq(0).all()


def test_bad_arguments_raise():
    x = _keys(2, 2, 64)
    with pytest.raises(ValueError, match="kv_format"):
        quantize_kv(x, "int2")
    with pytest.raises(ValueError, match="per token"):
        quantize_kv(x, "int8", scale=torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="fp8 scale"):
        quantize_kv(x, "fp8_e4m3", scale=torch.ones(3, device=DEVICE))
    with pytest.raises(TypeError, match="scale"):
        quantize_kv(x, "fp8_e4m3", scale=torch.ones(2, device=DEVICE, dtype=torch.float16))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_kv(_keys(2, 2, 48), "int4")
    with pytest.raises(TypeError, match="x_q"):
        dequantize_kv(torch.zeros(2, 2, 32, dtype=torch.int8, device=DEVICE),
                      torch.ones(2, 2, 1, device=DEVICE), "int4")


def test_int4_scales_of_a_paged_cache_are_stored_head_major():
    """``quantize_kv`` of a 4-D (paged) int4 cache returns its scales stored head-major (memory
    ``[pages, heads_k, page, 2]``, the ``transpose(1, 2)`` view): the same values as the
    per-token computation, the same logical shape; 3-D inputs (new tokens) stay contiguous.
    int8's likewise (memory ``[pages, heads_k, page]``)."""
    x = torch.randn(5, 16, 3, 64)
    data, scales = quantize_kv(x, "int4")
    assert scales.shape == (5, 16, 3, 2)
    assert scales.stride() == (3 * 16 * 2, 2, 16 * 2, 1)
    flat_data, flat_scales = quantize_kv(x.reshape(80, 3, 64), "int4")
    assert flat_scales.is_contiguous()
    assert torch.equal(scales.reshape(80, 3, 2), flat_scales)
    assert torch.equal(data.reshape(80, 3, 32), flat_data)
    data8, scales8 = quantize_kv(x, "int8")
    assert scales8.shape == (5, 16, 3) and scales8.stride() == (3 * 16, 1, 16)
    flat_data8, flat_scales8 = quantize_kv(x.reshape(80, 3, 64), "int8")
    assert flat_scales8.is_contiguous()
    assert torch.equal(scales8.reshape(80, 3), flat_scales8)
    assert torch.equal(data8.reshape(80, 3, 64), flat_data8)
