"""Paged decode over quantized caches (fp8 e4m3, int8, int4) against the reference on the
dequantized cache: the kernel's in-register dequantization must equal ``dequantize_kv``'s.

CPU (interpreter): all three formats, fp16/fp32 queries, small sizes. CUDA: fp16/bf16, real sizes.
"""
import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE, DTYPES, HAS_CUDA, poison_empty

import kvonce
from kvonce.kernels.quant_convert import (_fp8_bytes_to, _ints_to, _nibbles_to,
                                          _pair_units_to_f16)
from kvonce.reference import paged_attention_ref

FORMATS = ("fp8_e4m3", "int8", "int4")


def _case(batch, q_len, heads, heads_k, head_dim, page, lens, dtype, seed=0):
    torch.manual_seed(seed)
    pages_per_seq = max(1, -(-max(lens) // page))
    num_pages = batch * pages_per_seq + 3
    q = torch.randn(batch, q_len, heads, head_dim, device=DEVICE).to(dtype)
    k = torch.randn(num_pages, page, heads_k, head_dim, device=DEVICE).to(dtype)
    v = torch.randn(num_pages, page, heads_k, head_dim, device=DEVICE).to(dtype)
    k[..., 5] *= 20.0  # a channel of outliers, as real keys have
    table = torch.randperm(num_pages, device=DEVICE)[:batch * pages_per_seq]
    table = table.reshape(batch, pages_per_seq).to(torch.int32)
    return q, k, v, torch.tensor(lens, dtype=torch.int32, device=DEVICE), table


def _quantized(k, v, fmt, scale_dtype=None):
    kq, ks = kvonce.quantize_kv(k, fmt, scale_dtype=scale_dtype)
    vq, vs = kvonce.quantize_kv(v, fmt, scale_dtype=scale_dtype)
    return kq, ks, vq, vs, kvonce.dequantize_kv(kq, ks, fmt, torch.float32), \
        kvonce.dequantize_kv(vq, vs, fmt, torch.float32)


def _check(out, ref, dtype):
    assert not torch.isnan(out).any()
    rel = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()
    assert rel < (1e-4 if dtype == torch.float32 else 2e-2), f"relative error {rel:.3e}"


def _run_and_check(plan, q, kq, vq, seqlens, table, ks, vs, ref, ref_lse, flag, dtype,
                   out_scale=1.0, flag_value=True):
    """``plan.run`` on NaN-poisoned outputs against the reference (out and LSE), with the
    kernel constant ``flag`` at ``flag_value`` in the plan's launch and the custom op giving the
    same bytes. ``out_scale``: the output is compared times this (``ref`` given at that
    scale)."""
    with poison_empty:
        out, lse = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs, return_lse=True)
    assert [la._constexprs[flag] for la in plan._launches.values()] == [flag_value]
    assert out.dtype == q.dtype
    _check(out.float() * out_scale, ref, dtype)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - ref_lse[fin]).abs().max() < 1e-2
    assert plan._run_op(q, kq, vq, seqlens, table, ks, vs)[0].equal(out)


# (head dim 128 with 16-bit q takes int4's nibble-plane loop; 64, 96 and fp32 q its per-channel
# path)
SHAPES = ([(3, 1, 4, 2, 64, 16, [37, 0, 64]), (2, 3, 8, 2, 96, 32, [70, 5]),
           (2, 2, 4, 1, 128, 16, [150, 33])] if not HAS_CUDA else
          [(16, 1, 32, 8, 128, 16, [4096] * 15 + [17]), (4, 4, 12, 2, 128, 64, [900, 0, 3, 2048]),
           (2, 1, 8, 8, 96, 16, [513, 1000])])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", range(len(SHAPES)))
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES)  # each dtype has its own converters (fp16 bit tricks)
def test_quantized_decode_matches_dequantized_reference(fmt, shape, num_splits, dtype):
    batch, q_len, heads, heads_k, head_dim, page, lens = SHAPES[shape]
    q, k, v, seqlens, table = _case(batch, q_len, heads, heads_k, head_dim, page, lens, dtype)
    kq, ks, vq, vs, kd, vd = _quantized(k, v, fmt)
    ref, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    with poison_empty:
        out, lse = kvonce.paged_attention(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                          kv_format="int4" if fmt == "int4" else None,
                                          num_splits=num_splits, return_lse=True)
    _check(out, ref, dtype)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - ref_lse[fin]).abs().max() < 1e-2


@triton.jit
def _convert_bytes_kernel(B, Out, KIND: tl.constexpr, DTYPE: tl.constexpr):
    """Every byte of ``B [16, 128]`` through one of the decode kernels' converters into ``Out``
    (KIND 0: fp8 e4m3, 1: int8, 2: int4 low nibble, 3: int4 high nibble)."""
    offs = tl.arange(0, 16)[:, None] * 128 + tl.arange(0, 128)[None, :]
    if KIND == 1:
        b = tl.load(B.to(tl.pointer_type(tl.int8)) + offs)
        y = _ints_to(b, DTYPE)
    else:
        b = tl.load(B + offs)
        if KIND == 0:
            y = _fp8_bytes_to(b, DTYPE)
        else:
            y = _nibbles_to(b, KIND == 3, DTYPE)
    tl.store(Out + offs, y)


@pytest.mark.parametrize("kind", ["fp8", "int8", "int4_low", "int4_high"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_converters_are_exact_for_every_byte(kind, dtype):
    """The tile converters (packed inline asm on the GPU, plain ops under the interpreter) give
    exactly torch's value of every byte, sign of zero included. fp8's NaN bytes (0x7F, 0xFF),
    which quantize_kv writes only for a NaN input, are checked apart (``_check_fp8_nan_bytes``):
    NaN through the GPU's fp16 cvt, +-480 through the bf16 bit move (``_fp8_bytes_to``)."""
    codes = (torch.arange(16 * 128, device=DEVICE) % 256).to(torch.uint8).reshape(16, 128)
    out = torch.full((16, 128), float("nan"), device=DEVICE, dtype=dtype)
    k = ["fp8", "int8", "int4_low", "int4_high"].index(kind)
    _convert_bytes_kernel[(1,)](codes, out, KIND=k, DTYPE=getattr(tl, str(dtype)[6:]))
    if kind == "fp8":
        want = codes.view(torch.float8_e4m3fn).to(dtype)
    elif kind == "int8":
        want = codes.view(torch.int8).to(dtype)
    else:
        want = ((codes >> (4 if kind == "int4_high" else 0)) & 15).to(dtype) - 8
    keep = ~torch.isnan(want)
    assert keep.sum() == (16 * 128 - 16 if kind == "fp8" else 16 * 128)
    assert torch.equal(out[keep].float(), want[keep].float())
    assert torch.equal(torch.signbit(out[keep]), torch.signbit(want[keep]))
    if kind == "fp8":  # the NaN bytes: the GPU's fp16 cvt gives NaN, bit moves give +-480
        _check_fp8_nan_bytes(out[~keep], fp16_cvt=HAS_CUDA and dtype == torch.float16)


def _check_fp8_nan_bytes(got, fp16_cvt: bool):
    """What fp8's NaN bytes (0x7F, 0xFF) convert to: NaN through the hardware's e4m3 -> fp16
    cvt (PTX defines it so), +-480 through the bf16 bit move and under the interpreter (its
    conversion treats them as the next finite step) -- the README states both."""
    if fp16_cvt:
        assert torch.isnan(got).all()
    else:
        assert torch.equal(got.float().abs(), torch.full_like(got.float(), 480.0))


@triton.jit
def _convert_units_kernel(U, Even, Odd, KV_FORMAT: tl.constexpr):
    """Every uint16 unit of ``U [65536]`` (16 x 128 per program) through the channel-pair
    converter, even and odd channel."""
    offs = tl.program_id(0) * 2048 + tl.arange(0, 16)[:, None] * 128 + tl.arange(0, 128)[None, :]
    units = tl.load(U.to(tl.pointer_type(tl.uint16)) + offs)
    tl.store(Even + offs, _pair_units_to_f16(units, False, KV_FORMAT))
    tl.store(Odd + offs, _pair_units_to_f16(units, True, KV_FORMAT))


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
def test_channel_pair_converter_is_exact_for_every_unit(fmt):
    """``v_pairs``' converter (prmt + cvt or xor + prmt + sub on the GPU, plain ops in the
    interpreter) gives torch's fp16 of the low byte (even channel) and the high byte (odd
    channel) of every 16-bit unit, sign of zero included; fp8's NaN bytes as in the test above
    (NaN on the GPU, +-480 under the interpreter)."""
    codes = torch.arange(65536, device=DEVICE)
    pairs = torch.stack([codes % 256, codes // 256], -1).to(torch.uint8)  # little-endian units
    even = torch.full((65536,), float("nan"), device=DEVICE, dtype=torch.float16)
    odd = even.clone()
    _convert_units_kernel[(32,)](pairs.view(torch.int16), even, odd,
                                 KV_FORMAT=1 if fmt == "fp8_e4m3" else 2)
    view = torch.float8_e4m3fn if fmt == "fp8_e4m3" else torch.int8
    for got, byte in ((even, pairs[:, 0]), (odd, pairs[:, 1])):
        want = byte.contiguous().view(view).to(torch.float16)
        nan = torch.isnan(want)
        assert nan.sum() == (512 if fmt == "fp8_e4m3" else 0)
        assert torch.equal(got[~nan], want[~nan])
        assert torch.equal(torch.signbit(got[~nan]), torch.signbit(want[~nan]))
        if fmt == "fp8_e4m3":
            _check_fp8_nan_bytes(got[nan], fp16_cvt=HAS_CUDA)


@pytest.mark.parametrize("fmt", (None,) + FORMATS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_swapped_dots_match_the_reference(fmt, num_splits):
    """``PagedDecodeConfig.swap_ab`` (keys on the MMA's M side) computes the same attention, for
    every cache format (int4's split dots ignore the flag), GQA rows, q_len > 1 (causal band),
    an empty sequence and lengths off the tile grid; the custom op path carries the flag."""
    import dataclasses

    from kvonce.kernels.configs import get_paged_decode_config
    dtype = DTYPES[0]
    q, k, v, seqlens, table = _case(3, 2, 8, 2, 128, 16, [37, 0, 150], dtype)
    if fmt is None:
        kq, ks, vq, vs, kd, vd = k, None, v, None, k.float(), v.float()
    else:
        kq, ks, vq, vs, kd, vd = _quantized(k, v, fmt)
    ref, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    base = get_paged_decode_config(cap, 128, fmt, q.element_size())
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  kv_format="int4" if fmt == "int4" else None,
                                  config=dataclasses.replace(base, swap_ab=True),
                                  num_splits=num_splits)
    scales = {} if fmt is None else dict(k_scale=ks, v_scale=vs)
    with poison_empty:
        out, lse = plan.run(q, kq, vq, seqlens, table, return_lse=True, **scales)
    assert [la._constexprs["SWAP_AB"] for la in plan._launches.values()] == [True]
    _check(out, ref, dtype)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - ref_lse[fin]).abs().max() < 1e-2
    op_scales = () if fmt is None else (ks, vs)
    assert plan._run_op(q, kq, vq, seqlens, table, *op_scales)[0].equal(out)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
@pytest.mark.parametrize("magnitude,v_magnitude", [(1.0, 1.0), (1e6, 1.0), (1e-9, 1.0),
                                                   (1.0, 1e8), (1.0, 1e-6)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_bf16_queries_take_fp16_dots_without_loss(fmt, magnitude, v_magnitude, num_splits):
    """``PagedDecodeConfig.f16_math``: bf16 q against an fp8 or int8 cache runs both dots in
    fp16, each q row scaled by its own power of two. Rows far outside fp16's range (1e6
    overflows a plain cast to fp16, 1e-9 flushes to zero there), with the softmax scale keeping
    their scores O(1), and rows of unlike magnitude within one tile, still match the reference
    at bf16's accuracy. V of 1e8 (int8 scales near 1e6, past fp16's max: probabilities times
    those scales would overflow fp16 unscaled) stays finite and right, and V of 1e-6 (scales
    near 1e-7: probabilities times them would be fp16 subnormals, a few ulps) keeps its
    precision. The causal band, an empty sequence and lengths off the tile grid are in the case,
    and the custom op carries the flag. fp16 dots: this runs in the interpreter too."""
    import dataclasses

    from kvonce.kernels.configs import get_paged_decode_config
    q, k, v, seqlens, table = _case(3, 2, 8, 2, 128, 16, [37, 0, 150], torch.float32)
    heads = torch.tensor([1.0, 2.0 ** -7, 2.0 ** 5, 3.0] * 2, device=DEVICE)
    q = (q * heads[:, None] * magnitude).to(torch.bfloat16)
    scale = 128 ** -0.5 / magnitude
    # per-key V magnitudes spread over 2^-6 .. 1 of v_magnitude: unlike scales in one tile
    v = v * v_magnitude * 2.0 ** -torch.randint(0, 7, v.shape[:3] + (1,), device=DEVICE)
    # int8's V scales past fp16's range (and its subnormals) need float32 scales
    wide = torch.float32 if fmt == "int8" and v_magnitude != 1.0 else None
    kq, ks, vq, vs, kd, vd = _quantized(k.to(torch.bfloat16), v.to(torch.bfloat16), fmt, wide)
    ref, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table, softmax_scale=scale)
    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    base = get_paged_decode_config(cap, 128, fmt, 2, bf16=True)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  softmax_scale=scale, num_splits=num_splits,
                                  config=dataclasses.replace(base, f16_math=True, v_pairs=True))
    _run_and_check(plan, q, kq, vq, seqlens, table, ks, vs, ref / v_magnitude, ref_lse,
                   "F16_MATH", torch.bfloat16, out_scale=1 / v_magnitude)


@pytest.mark.parametrize("fmt", FORMATS)
def test_int32_and_int64_offsets_agree(fmt):
    """Quantized caches address K/V and scales in int32 where every offset fits (the default)
    and in int64 with ``int64_kv_offsets``: the same bytes out, split and unsplit."""
    import dataclasses

    from kvonce.kernels.configs import get_paged_decode_config
    dtype = DTYPES[0]
    q, k, v, seqlens, table = _case(3, 2, 8, 2, 128, 16, [37, 0, 150], dtype)
    kq, ks, vq, vs, kd, vd = _quantized(k, v, fmt)
    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    base = get_paged_decode_config(cap, 128, fmt, q.element_size())
    outs = []
    for wide in (False, True):
        for splits in (1, 3):
            plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                          kv_format="int4" if fmt == "int4" else None,
                                          num_splits=splits,
                                          config=dataclasses.replace(base, int64_kv_offsets=wide))
            outs.append(plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs))
            assert [la._constexprs["INT64_KV"] for la in plan._launches.values()] == [wide]
            assert plan._run_op(q, kq, vq, seqlens, table, ks, vs)[0].equal(outs[-1])
    assert outs[0].equal(outs[2]) and outs[1].equal(outs[3])
    ref, _ = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    _check(outs[0], ref, dtype)


def _misaligned(t, align):
    """``t``'s values, in ``t``'s strides (int4 scales come head-major), in a tensor one element
    past an ``align``-byte boundary: fp16 scales 2 bytes off 4 (``align=4``), a 1-byte cache 1
    byte off 2 (``align=2``)."""
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    buf = torch.empty(span + 1, dtype=t.dtype, device=t.device)
    view = buf[1:].as_strided(t.shape, t.stride())
    view.copy_(t)
    assert view.data_ptr() % align == t.element_size()
    return view


@pytest.mark.parametrize("num_splits", [1, 3])
def test_int4_scales_load_as_32_bit_pairs_where_aligned(num_splits):
    """int4's nibble-plane loop reads each key's float32 (scale, offset) as one 64-bit word
    (SCALE_PAIRS) where the scales are 8-byte aligned, and as two 32-bit loads where they sit
    4 bytes off (a 64-bit load there would be misaligned): both equal the reference (the same
    loop and arithmetic; only the loads differ)."""
    q, kq, ks, vq, vs, seqlens, table, ref, ref_lse, plan = _int4_plan_case(
        3, 2, 8, 2, [37, 0, 150], num_splits)
    _run_and_check(plan, q, kq, vq, seqlens, table, ks, vs, ref, ref_lse, "SCALE_PAIRS",
                   q.dtype)
    aligned = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    with poison_empty:
        unaligned = plan.run(q, kq, vq, seqlens, table, k_scale=_misaligned(ks, 8),
                             v_scale=_misaligned(vs, 8))
    _check(unaligned, ref, q.dtype)
    assert unaligned.equal(aligned)
    launch = next(iter(plan._launches.values()))
    assert launch._misaligned_constexprs[True, False]["V_PAIRS"]
    assert not launch._misaligned_constexprs[True, False]["SCALE_PAIRS"]


def _int4_units_config():
    """The int4 row's config (of this GPU, or the interpreter's): at head dim 128 with 16-bit q
    its nibble-plane loop reads V as 16-bit units (``v_pairs`` aside)."""
    from kvonce.kernels.configs import get_paged_decode_config
    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    return get_paged_decode_config(cap, 128, "int4")


def _int4_plan_case(batch, q_len, hq, hk, lengths, num_splits, head_pairs=False,
                    head_major=False):
    """A fresh int4 case at head dim 128, page 16 (fp16/fp32 q as DTYPES[0]): ``(q, kq, ks, vq,
    vs, seqlens, table, ref, ref_lse, plan)``, the plan on the int4 row's config (with
    ``head_pairs`` as given; ``head_major``: the caches and scales stored head-major)."""
    import dataclasses
    q, k, v, seqlens, table = _case(batch, q_len, hq, hk, 128, 16, lengths, DTYPES[0])
    kq, ks, vq, vs, kd, vd = _quantized(k, v, "int4")
    if head_major:
        kq, ks, vq, vs = (_head_major(t) for t in (kq, ks, vq, vs))
    ref, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  kv_format="int4", num_splits=num_splits,
                                  config=dataclasses.replace(_int4_units_config(),
                                                             head_pairs=head_pairs))
    return q, kq, ks, vq, vs, seqlens, table, ref, ref_lse, plan


# (batch, q_len, q heads, KV heads, lengths, splits, head-major): GQA 4 with an empty sequence,
# split (merged in the launch) and not; MHA; 40 rows a pair (three 16-row M-blocks); 6 splits
# (the combine kernel); head-major pages
HEAD_PAIR_CASES = [(3, 1, 8, 2, [37, 0, 150], 1, False), (3, 1, 8, 2, [37, 0, 150], 3, False),
                   (2, 1, 4, 4, [70, 33], 1, False), (2, 5, 8, 2, [37, 150], 2, False),
                   (1, 1, 8, 4, [300], 6, False), (2, 2, 6, 6, [150, 45], 1, True)]


@pytest.mark.parametrize("case", range(len(HEAD_PAIR_CASES)))
def test_int4_head_pairs_match_reference_and_one_head(case):
    """``head_pairs``: int4's nibble-plane loop serving two KV heads a program (their bytes one
    128-byte operand, each row's q in its head's half) gives the reference's output and LSE and
    the one-head launch's output to fp16 rounding; its grid counts the pairs."""
    batch, q_len, hq, hk, lengths, num_splits, head_major = HEAD_PAIR_CASES[case]
    q, kq, ks, vq, vs, seqlens, table, ref, ref_lse, plan = _int4_plan_case(
        batch, q_len, hq, hk, lengths, num_splits, head_pairs=True, head_major=head_major)
    _run_and_check(plan, q, kq, vq, seqlens, table, ks, vs, ref, ref_lse, "HEAD_PAIRS",
                   q.dtype)
    (launch,) = plan._launches.values()
    rows = hq // hk * 2 * q_len
    assert launch._grid == (plan.num_splits * -(-rows // 16), hk // 2, batch)
    assert launch._constexprs["GROUP"] == 2 * hq // hk
    one_head = _int4_plan_case(batch, q_len, hq, hk, lengths, num_splits,
                               head_major=head_major)[-1]
    out = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    _check(out.float(), one_head.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs).float(),
           q.dtype)


@pytest.mark.skipif(not HAS_CUDA, reason="the Hopper config rows (the interpreter has its own)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_int4_token_major_row_matches_the_reference(dtype):
    """The token-major int4 row (head pairs at 232 registers, 2 programs an SM; which plans take
    it: test_decode.py) matches the reference at 4 KV heads, split and not; the same cache
    stored head-major runs the default one-head row to the same output within rounding."""
    from kvonce.kernels.configs import get_paged_decode_config
    q, k, v, seqlens, table = _case(3, 1, 16, 4, 128, 16, [37, 0, 1500], dtype)
    kq, ks, vq, vs, kd, vd = _quantized(k, v, "int4")
    ref, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    row = get_paged_decode_config(torch.cuda.get_device_capability(), 128, "int4", 2,
                                  bf16=dtype == torch.bfloat16, token_major=True)
    assert row.head_pairs and row.max_registers == 232
    for num_splits in (1, 3):
        plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                      kv_format="int4", config=row, num_splits=num_splits)
        _run_and_check(plan, q, kq, vq, seqlens, table, ks, vs, ref, ref_lse, "HEAD_PAIRS",
                       dtype)
    hm = [_head_major(t) for t in (kq, ks, vq, vs)]
    plan_hm = kvonce.PagedDecodePlan(q, hm[0], hm[2], seqlens, table, k_scale=hm[1],
                                     v_scale=hm[3], kv_format="int4")
    assert not plan_hm.config.head_pairs
    _run_and_check(plan_hm, q, hm[0], hm[2], seqlens, table, hm[1], hm[3], ref, ref_lse,
                   "HEAD_PAIRS", dtype, flag_value=False)


def test_int4_head_pairs_fall_back_where_they_cannot_run():
    """An odd KV head count, or a call whose V sits at an odd byte (no 16-bit V units: no
    nibble-plane loop), runs one KV head a program under ``head_pairs``; scales 4 bytes off
    8 keep the pairs (two 32-bit loads a key). Each equals the reference."""
    q, kq, ks, vq, vs, seqlens, table, ref, ref_lse, plan = _int4_plan_case(
        2, 1, 6, 3, [37, 150], 1, head_pairs=True)
    _run_and_check(plan, q, kq, vq, seqlens, table, ks, vs, ref, ref_lse, "HEAD_PAIRS",
                   q.dtype, flag_value=False)
    q, kq, ks, vq, vs, seqlens, table, ref, ref_lse, plan = _int4_plan_case(
        2, 1, 8, 2, [37, 150], 3, head_pairs=True)
    with poison_empty:
        v_off = plan.run(q, kq, _misaligned(vq, 2), seqlens, table, k_scale=ks, v_scale=vs)
        scales_off = plan.run(q, kq, vq, seqlens, table, k_scale=_misaligned(ks, 8),
                              v_scale=_misaligned(vs, 8))
    _check(v_off.float(), ref, q.dtype)
    _check(scales_off.float(), ref, q.dtype)
    (launch,) = plan._launches.values()
    assert launch._head_pairs and not launch._one_head._head_pairs
    assert launch._misaligned_constexprs[True, False]["HEAD_PAIRS"]


def _v_pairs_case(case, num_splits=0):
    """``case`` ("fp8/fp16", "int8/bf16", ...): the quantized cache, the reference and a plan
    with ``v_pairs`` and ``f16_math`` on over its format's config row ("int4/bf16-dots":
    ``f16_math`` off); the tensors as a dict."""
    import dataclasses

    from kvonce.kernels.configs import get_paged_decode_config
    fmt, qdtype = case.split("/")
    fmt = {"fp8": "fp8_e4m3", "int8": "int8", "int4": "int4"}[fmt]
    dtype = torch.float16 if qdtype == "fp16" else torch.bfloat16
    f16_math = qdtype != "bf16-dots"
    q, k, v, seqlens, table = _case(3, 2, 8, 2, 128, 16, [37, 0, 150], torch.float32)
    q = q.to(dtype)
    kq, ks, vq, vs, kd, vd = _quantized(k.to(dtype), v.to(dtype), fmt)
    ref, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    base = get_paged_decode_config(cap, 128, fmt, 2, bf16=dtype == torch.bfloat16)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  num_splits=num_splits,
                                  kv_format="int4" if fmt == "int4" else None,
                                  config=dataclasses.replace(base, v_pairs=True, f16_math=f16_math))
    return dict(plan=plan, q=q, kq=kq, vq=vq, seqlens=seqlens, table=table, ks=ks, vs=vs,
                ref=ref, ref_lse=ref_lse)


# bf16 dots (int4 without f16_math) the interpreter computes wrongly (triton 3.6)
@pytest.mark.parametrize("case", ["fp8/fp16", "fp8/bf16", "int8/fp16", "int4/fp16", "int4/bf16"]
                         + (["int4/bf16-dots"] if HAS_CUDA else []))
@pytest.mark.parametrize("num_splits", [1, 3])
def test_v_as_channel_pairs_matches_the_reference(case, num_splits):
    """``PagedDecodeConfig.v_pairs``: V read as 16-bit channel pairs, dotted as its even and odd
    channels and interleaved at the end, gives the reference's output for fp8 (fp16 queries, and
    bf16 queries through ``f16_math``), int8 (its per-key scales on the scores and the
    probabilities) and int4 (fp16 queries, bf16 through fp16 rows, and on a GPU bf16 dots: four
    nibble planes of 16-bit units, the per-key scales on the probabilities, P·V in fp16): GQA
    rows, q_len > 1 (causal band), an empty sequence, lengths off the tile grid; the custom op
    carries the flag."""
    c = _v_pairs_case(case, num_splits)
    _run_and_check(c["plan"], c["q"], c["kq"], c["vq"], c["seqlens"], c["table"], c["ks"],
                   c["vs"], c["ref"], c["ref_lse"], "V_PAIRS", torch.bfloat16)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_calls_misaligned_at_different_pointers_compile_apart(fmt):
    """One plan called with its scales off (int4's float32 pairs 4 bytes off 8, int8's fp32 ones 4
    bytes off 16), then with V off 2 bytes (same shapes): each
    call compiles for its own pointers. With one "some pointer is off" bit in the launch key the
    second call reused the first's kernel, which Triton had specialized with V 16-byte aligned
    (the GPU faulted on the misaligned load); both equal the aligned call's reference. The
    launch cache exists only on a GPU: on the CPU this checks the two calls' values."""
    c = _v_pairs_case(f"{fmt}/fp16")
    plan = c["plan"]
    args = (c["q"], c["kq"], c["vq"], c["seqlens"], c["table"])
    align = 8 if fmt == "int4" else 16
    with poison_empty:
        scales_off = plan.run(*args, k_scale=_misaligned(c["ks"], align),
                              v_scale=_misaligned(c["vs"], align))
    _check(scales_off, c["ref"], torch.float16)
    with poison_empty:
        v_off = plan.run(c["q"], c["kq"], _misaligned(c["vq"], 2), c["seqlens"], c["table"],
                         k_scale=c["ks"], v_scale=c["vs"])
    _check(v_off, c["ref"], torch.float16)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_int4_past_16_rows_takes_16_row_blocks(num_splits):
    """Past 16 packed rows (GQA 8, q_len 5: 40 rows) int4 at head dim 128 runs its nibble-plane
    loop on three 16-row M-blocks (at 64 rows that loop faulted on the H100), the last one
    partly padding: the reference's output and LSE, split or not."""
    q, kq, ks, vq, vs, seqlens, table, ref, ref_lse, plan = _int4_plan_case(
        2, 5, 8, 1, [37, 150], num_splits)
    _run_and_check(plan, q, kq, vq, seqlens, table, ks, vs, ref, ref_lse, "V_PAIRS", DTYPES[0])
    (launch,) = plan._launches.values()
    assert launch._constexprs["BLOCK_M"] == 16
    assert launch._grid == (num_splits * 3, 1, 2)


def test_int4_queries_far_from_zero():
    """Queries with a common offset of 30 times their spread (scores in the hundreds; int4's
    per-key offsets times each row's sum of q carry most of them) give the reference's output
    and LSE to fp16's rounding. (Dotting K's nibbles as the stored bit patterns 1024 + n and
    taking each row's bias off after the dot, 64 instructions a tile fewer, missed the LSE here
    by 0.07: the bias's float32 rounding inside the dot.)"""
    q, k, v, seqlens, table = _case(2, 1, 8, 2, 128, 16, [150, 37], torch.float32)
    q = (q + 30.0).half()
    kq, ks, vq, vs, kd, vd = _quantized(k.half(), v.half(), "int4")
    ref, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  kv_format="int4", config=_int4_units_config())
    _run_and_check(plan, q, kq, vq, seqlens, table, ks, vs, ref, ref_lse, "V_PAIRS",
                   torch.float16)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_int4_values_near_fp16_max_do_not_overflow(num_splits):
    """int4's nibble-plane loop (fp16 queries) dots fp16 planes of ``n - 8`` with fp16
    probabilities times V's per-key scales: with a key's largest value at fp16's max (scale
    ~4367) no factor overflows fp16 (a plane of V itself would): finite output equal to the
    reference's."""
    q, k, v, seqlens, table = _case(3, 2, 8, 2, 128, 16, [37, 0, 150], torch.float32)
    v = v.clone()
    v[::2, :, :, 3] = 65504.0  # in every other page: the key's max at fp16's max
    v[1::2, :, :, 70] = -60000.0  # (the outputs, averages over pages, stay in range)
    kq, ks, vq, vs, kd, vd = _quantized(k.half(), v.half(), "int4")
    ref, _ = paged_attention_ref(q.half().float(), kd, vd, seqlens, table)
    plan = kvonce.PagedDecodePlan(q.half(), kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  kv_format="int4", num_splits=num_splits,
                                  config=_int4_units_config())
    with poison_empty:
        out = plan.run(q.half(), kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    assert [la._constexprs["V_PAIRS"] for la in plan._launches.values()] == [True]
    assert torch.isfinite(out).all()
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 2e-3, f"relative error {rel:.3e}"


# bf16 x int4 dots its scores in bf16, which the interpreter computes wrongly (triton 3.6)
@pytest.mark.parametrize("case", ["int4/fp16", "fp8/fp16", "int8/fp16", "plain/fp16"]
                         + (["int4/bf16", "fp8/bf16", "plain/bf16"] if HAS_CUDA else []))
@pytest.mark.parametrize("num_splits", [1, 3])
def test_page_prefetch_gives_the_same_bytes(case, num_splits):
    """``PagedDecodeConfig.prefetch_pages``: the key tiles' page ids looked up a tile ahead and
    carried (int4's V-units loop, the fp8/int8 channel-pair loop, the plain-cache loop) gives
    the bytes of the loop that looks them up in place, and the reference's output: GQA rows,
    q_len 2 (the causal band's masked tiles), sequences of 0, 37, 150 and 700 keys (up to six
    128-key tiles, so the carried pages cross several trips, and the look-ahead past the last
    tile reads nothing)."""
    import dataclasses

    from kvonce.kernels.configs import get_paged_decode_config
    fmt, qdtype = case.split("/")
    dtype = torch.float16 if qdtype == "fp16" else torch.bfloat16
    q, k, v, seqlens, table = _case(4, 2, 8, 2, 128, 16, [37, 0, 150, 700], torch.float32)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    if fmt == "int4":
        kq, ks, vq, vs, kd, vd = _quantized(k, v, "int4")
        base = dataclasses.replace(_int4_units_config(), block_n=128)
        kw = dict(k_scale=ks, v_scale=vs)
    elif fmt in ("fp8", "int8"):
        fmt = {"fp8": "fp8_e4m3", "int8": "int8"}[fmt]
        kq, ks, vq, vs, kd, vd = _quantized(k, v, fmt)
        base = dataclasses.replace(get_paged_decode_config(cap, 128, fmt, 2,
                                                           bf16=dtype == torch.bfloat16),
                                   block_n=128, v_pairs=True, f16_math=True)
        kw = dict(k_scale=ks, v_scale=vs)
    else:
        kq, vq, kd, vd, kw = k, v, k.float(), v.float(), {}
        base = get_paged_decode_config(cap, 128)
    ref, _ = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    outs = []
    for prefetch in (False, True):
        plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, num_splits=num_splits,
                                      kv_format="int4" if fmt == "int4" else None,
                                      config=dataclasses.replace(base, prefetch_pages=prefetch),
                                      **kw)
        with poison_empty:
            outs.append(plan.run(q, kq, vq, seqlens, table, **kw))
        assert [la._constexprs["PREFETCH_PAGES"] for la in plan._launches.values()] == [prefetch]
        if fmt != "plain":
            assert [la._constexprs["V_PAIRS"] for la in plan._launches.values()] == [True]
    _check(outs[1], ref, dtype)
    assert outs[1].equal(outs[0])


def test_page_prefetch_is_off_for_dense_and_sparse_keys():
    """A launch with outlier channels (``KeyOutliers``: one more side-tile load a key tile) does
    not look the pages up ahead even where its config row does: int4+8 ran 5-35% slower with
    it on the H100 (configs.py). Launch binding only: nothing runs."""
    import dataclasses

    from kvonce.kernels import paged_decode as pd
    q = torch.zeros(2, 1, 8, 128, dtype=torch.float16)
    cache, scale = kvonce.quantize_kv(torch.zeros(16, 16, 2, 128, dtype=torch.float16), "int4")
    table = torch.zeros(2, 8, dtype=torch.int32)
    values = torch.zeros(16, 16, 2, 8, dtype=torch.float16)
    config = dataclasses.replace(_int4_units_config(), prefetch_pages=True)
    for outliers, prefetch in ((None, True), (values, False)):
        launch = pd.PagedDecodeLaunch(q, cache, cache, table, softmax_scale=0.1, causal=True,
                                      num_splits=1, config=config, store_lse=False, kv_format=3,
                                      k_scale=scale, v_scale=scale, outlier_values=outliers)
        assert launch._constexprs["PREFETCH_PAGES"] is prefetch


# bf16 x int8 falls back to bf16 dots, which the interpreter computes wrongly (triton 3.6)
@pytest.mark.parametrize("case", ["fp8/fp16", "int8/fp16", "int4/fp16"]
                         + (["int8/bf16", "int4/bf16"] if HAS_CUDA else []))
def test_v_pairs_fall_back_where_v_is_not_aligned(case):
    """A V cache at an odd byte offset, where V's 16-bit channel-pair loads would be misaligned:
    the call takes the byte-gathered loop instead (bf16 x int8 then in bf16 dots) and still
    gives the reference's output; the aligned call keeps the pairs. (On the GPU the pairs' loads
    would be misaligned there; the interpreter reads them anyway: the CPU checks the values.)"""
    c = _v_pairs_case(case)
    plan = c["plan"]
    _run_and_check(plan, c["q"], c["kq"], c["vq"], c["seqlens"], c["table"], c["ks"], c["vs"],
                   c["ref"], c["ref_lse"], "V_PAIRS", torch.bfloat16)
    with poison_empty:
        out = plan.run(c["q"], c["kq"], _misaligned(c["vq"], 2), c["seqlens"], c["table"],
                       k_scale=c["ks"], v_scale=c["vs"])
    _check(out, c["ref"], torch.bfloat16)
    assert not any(la._misaligned_constexprs[False, True]["V_PAIRS"]
                   for la in plan._launches.values())


@pytest.mark.parametrize("pairs", [True, False])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_int8_keeps_small_values_precise_under_fp16_queries(pairs, num_splits):
    """int8 with fp16 queries, through the channel-pair loop and the byte-gathered one: V of 1e-4
    (scales near 3e-6) would put the probabilities times the scales among fp16's subnormals
    (1.2-1.5e-2 relative error, checked); the per-tile normalization keeps the output at fp16's
    accuracy (3.3e-4)."""
    import dataclasses

    from kvonce.kernels.configs import get_paged_decode_config
    q, k, v, seqlens, table = _case(3, 2, 8, 2, 128, 16, [37, 0, 150], torch.float32)
    q = (q * 3.0).half()  # peaked attention: most probabilities far below 1
    v = (v * 1e-4).half()
    kq, ks, vq, vs, kd, vd = _quantized(k.half(), v, "int8")
    ref, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    base = get_paged_decode_config(cap, 128, "int8", 2)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  num_splits=num_splits,
                                  config=dataclasses.replace(base, v_pairs=pairs))
    with poison_empty:
        out = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    assert [la._constexprs["V_PAIRS"] for la in plan._launches.values()] == [pairs]
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 2e-3, f"relative error {rel:.3e}"  # 3.3e-4; 1.2-1.5e-2 unnormalized


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_plan_serves_layers_with_their_own_scales(fmt):
    q, k, v, seqlens, table = _case(2, 1, 4, 2, 64, 16, [40, 17], DTYPES[0])
    plan = None
    for layer in range(2):
        kl, vl = k * (1 + layer), v * (2 - layer)  # other values, other scales
        kq, ks, vq, vs, kd, vd = _quantized(kl, vl, fmt)
        if plan is None:
            plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                          kv_format="int4" if fmt == "int4" else None)
        out = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
        _check(out, paged_attention_ref(q.float(), kd, vd, seqlens, table)[0], q.dtype)


def test_quantized_arguments_are_checked_before_launch():
    q, k, v, seqlens, table = _case(2, 1, 4, 2, 64, 16, [40, 17], DTYPES[0])
    kq, ks, vq, vs, _, _ = _quantized(k, v, "int8")
    with pytest.raises(ValueError, match="needs v_scale"):
        kvonce.paged_attention(q, kq, vq, seqlens, table, k_scale=ks)
    with pytest.raises(ValueError, match="k_scale must be"):
        kvonce.paged_attention(q, kq, vq, seqlens, table, k_scale=ks[:, :, :1], v_scale=vs)
    with pytest.raises(TypeError, match="needs a torch.uint8 cache"):
        kvonce.paged_attention(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                               kv_format="int4")
    k4, ks4 = kvonce.quantize_kv(k, "int4")
    v4, vs4 = kvonce.quantize_kv(v, "int4")
    with pytest.raises(ValueError, match="kv_format='int4'"):
        kvonce.paged_attention(q, k4, v4, seqlens, table, k_scale=ks4, v_scale=vs4)
    with pytest.raises(TypeError, match="k_scale"):
        kvonce.paged_attention(q, k4, v4, seqlens, table, k_scale=ks4.bfloat16(), v_scale=vs4,
                               kv_format="int4")
    with pytest.raises(ValueError, match="share a dtype"):   # fp16 pairs against float32 ones
        kvonce.paged_attention(q, k4, v4, seqlens, table, k_scale=ks4.float(), v_scale=vs4,
                               kv_format="int4")
    with pytest.raises(ValueError, match="quantized caches"):
        kvonce.paged_attention(q, k, v, seqlens, table, k_scale=ks, v_scale=vs)


# ------------------------------------------------------------------------------------------------
# The custom ops with a quantized cache, and torch.compile of a quantized plan's run
# ------------------------------------------------------------------------------------------------

def _op_args(fmt, split):
    import kvonce.paged.decode as decode
    from kvonce.paged.checks import QUANT_FORMATS
    q, k, v, seqlens, table = _case(2, 2, 4, 2, 64, 16, [37, 50], DTYPES[0])
    kq, ks, vq, vs, _, _ = _quantized(k, v, fmt)
    c = decode.get_paged_decode_config(
        torch.cuda.get_device_capability() if HAS_CUDA else None, 64)
    fields = (64 ** -0.5, True, c.block_n, c.num_warps, c.num_stages, c.kv_cache_modifier,
              c.kv_eviction, c.max_merged_splits, ks, vs, QUANT_FORMATS[fmt][0])
    if not split:
        return torch.ops.kvonce.paged_decode, (q, kq, vq, seqlens, table, *fields)
    s = 3
    scratch = (torch.empty((2, 2, 4, s, 64), dtype=torch.float32, device=DEVICE),
               torch.empty((2, 2, 4, s), dtype=torch.float32, device=DEVICE),
               torch.zeros((2, 2, 1), dtype=torch.int32, device=DEVICE))
    return torch.ops.kvonce.paged_decode_split, (q, kq, vq, seqlens, table, *scratch, *fields)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("split", [False, True])
def test_opcheck_quantized_decode(fmt, split):
    op, args = _op_args(fmt, split)
    utils = torch.library._OPCHECK_DEFAULT_UTILS
    if fmt == "fp8_e4m3":
        # opcheck's schema test compares inputs before and after with arithmetic that torch
        # 2.11 lacks for float8 ("mul_cuda" not implemented): every other check still runs.
        utils = tuple(u for u in utils if u != "test_schema")
    torch.library.opcheck(op, args, test_utils=utils)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_compile_quantized_plan_run(fmt, num_splits):
    q, k, v, seqlens, table = _case(2, 2, 4, 2, 64, 16, [37, 50], DTYPES[0])
    kq, ks, vq, vs, kd, vd = _quantized(k, v, fmt)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  kv_format="int4" if fmt == "int4" else None,
                                  num_splits=num_splits)

    def step(q, kq, vq, seqlens, table, ks, vs):
        return plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs, return_lse=True)

    eager = step(q, kq, vq, seqlens, table, ks, vs)
    compiled = torch.compile(step, fullgraph=True,
                             backend="inductor" if HAS_CUDA else "aot_eager")
    out, lse = compiled(q, kq, vq, seqlens, table, ks, vs)
    assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1])
    _check(out, paged_attention_ref(q.float(), kd, vd, seqlens, table)[0], q.dtype)


def _head_major(t):
    """The same ``[pages, page_size, nheads_k, ...]`` tensor stored head-major (HND: each
    page's rows of one KV head contiguous, as TensorRT-LLM and FlashInfer's "HND" keep them)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("fmt", FORMATS)
def test_head_major_pages_decode_and_append_alike(fmt):
    """Caches (and per-token scales) stored head-major are read and written through their
    strides: the same decode output, bit for bit, split and unsplit, and the same appended bytes
    and scales as the token-major cache."""
    dtype = DTYPES[0]
    q, k, v, seqlens, table = _case(3, 1, 8, 2, 128, 16, [37, 0, 150], dtype)
    kq, ks, vq, vs, _, _ = _quantized(k, v, fmt)
    per_token = ks.dim() > 1  # int8 / int4 scales follow the pages; fp8's are per head
    hnd = [_head_major(t) if t.dim() > 1 else t for t in (kq, ks, vq, vs)]
    assert hnd[0].stride(2) > hnd[0].stride(1)  # head-major indeed
    kind = "int4" if fmt == "int4" else None
    for splits in (1, 3):
        outs = []
        for kc, kss, vc, vss in ((kq, ks, vq, vs), hnd):
            plan = kvonce.PagedDecodePlan(q, kc, vc, seqlens, table, k_scale=kss, v_scale=vss,
                                          kv_format=kind, num_splits=splits)
            outs.append(plan.run(q, kc, vc, seqlens, table, k_scale=kss, v_scale=vss))
        assert not torch.isnan(outs[0]).any() and torch.equal(outs[0], outs[1])
    k_new = torch.randn(3, 2, 2, 128, device=DEVICE).to(dtype)
    v_new = torch.randn_like(k_new)
    at = torch.tensor([5, 0, 149], dtype=torch.int32, device=DEVICE)
    caches = [[t.clone() for t in (kq, ks, vq, vs)], [t.clone() for t in hnd]]
    for kc, kss, vc, vss in caches:
        kvonce.append_paged_kv(k_new, v_new, kc, vc, at, table, k_scale=kss, v_scale=vss,
                               kv_format=kind)
    bits = lambda t: t.contiguous().view(torch.uint8) if t.element_size() == 1 else t
    for a, b in zip(*caches):
        assert torch.equal(bits(a), bits(b))
    assert per_token or torch.equal(caches[1][1], ks)
    assert not torch.equal(caches[0][0], kq)  # the append wrote something
