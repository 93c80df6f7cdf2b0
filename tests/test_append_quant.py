"""``append_paged_kv`` into quantized caches (fp8 e4m3, int8, int4): one launch that quantizes in
registers must store exactly ``quantize_kv``'s bytes and scales for the same tokens.

Bytes are compared exactly (as uint8), scales exactly: the kernel does quantize_kv's float32
arithmetic with IEEE division and round-half-even, so no tie or ulp difference is allowed. fp8
runs on CPU too: the interpreter's fp32 -> fp8 cast is wrong, so the kernel rounds to the e4m3
grid first there (kernels/paged_append.py), and the fp8 load it needs for the attention check works.

CPU (interpreter): small shapes, fp16/fp32/bf16 tokens. CUDA: larger shapes, fp16/bf16, plus
Inductor and a CUDA-graph replay.
"""
import pytest
import torch
from conftest import DEVICE, DTYPES, HAS_CUDA, poison_empty

import kvonce
from kvonce.reference import paged_attention_ref

FORMATS = ("fp8_e4m3", "int8", "int4")
TOKEN_DTYPES = DTYPES if HAS_CUDA else (*DTYPES, torch.bfloat16)
BACKENDS = ["aot_eager", "inductor"] if HAS_CUDA else ["aot_eager"]

# (batch, new_len, nheads_k, head_dim, page_size, cache_seqlens): tokens cross page boundaries
# (13 + 5 > 16, 31 + 3 > 32), sequences start empty or mid-page, pages are in random order.
SHAPES = ([(3, 5, 1, 64, 16, [0, 13, 30]), (2, 1, 4, 128, 16, [15, 47]),
           (4, 3, 3, 64, 32, [31, 1, 62, 5])] if not HAS_CUDA else
          [(8, 1, 8, 128, 16, [4095, 17, 0, 300, 15, 16, 1000, 2047]),
           (16, 4, 8, 128, 16, list(range(0, 1600, 100))),
           (5, 5, 2, 64, 64, [63, 1, 128, 0, 700]), (3, 2, 12, 128, 16, [0, 31, 2])])


def _pages(batch, max_len, page, extra=3, seed=0):
    """A block table of ``batch`` rows with room for ``max_len`` positions, pages in random
    order, plus ``extra`` pages no sequence uses."""
    pages_per_seq = -(-max_len // page)
    num_pages = batch * pages_per_seq + extra
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(num_pages, generator=g)[:batch * pages_per_seq]
    return num_pages, table.view(batch, pages_per_seq).to(torch.int32).to(DEVICE)


def _empty_cache(fmt, num_pages, page, nheads_k, head_dim, scale_dtype=None, fp8_scale=None):
    """A cache full of random bytes (so an unwritten or wrongly written slot shows) and its
    scales: random for int8/int4 (written by append), ``fp8_scale`` for fp8 (read)."""
    stored = head_dim // 2 if fmt == "int4" else head_dim
    dtype = {"fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8, "int4": torch.uint8}[fmt]
    shape = (num_pages, page, nheads_k, stored)
    caches = [torch.randint(0, 256, shape, dtype=torch.uint8, device=DEVICE) for _ in range(2)]
    if fmt == "fp8_e4m3":
        caches = [c & 0x77 for c in caches]  # finite e4m3 bit patterns (no NaN encodings)
    caches = [c.view(dtype) for c in caches]
    if fmt == "fp8_e4m3":
        return (*caches, fp8_scale, fp8_scale.clone() * 0.5)
    if fmt == "int8":
        sshape, sdtype = (num_pages, page, nheads_k), scale_dtype or torch.float16
    else:
        sshape, sdtype = (num_pages, page, nheads_k, 2), scale_dtype or torch.float16
    return (*caches, *(torch.rand(sshape, device=DEVICE).to(sdtype) for _ in range(2)))


def _expected(x, cache, scale, fmt, seqlens, table):
    """``cache`` and ``scale`` with the tokens ``x [batch, new_len, ...]`` stored by plain
    indexing of ``quantize_kv``'s output (what the kernel must produce, byte for byte)."""
    cache, scale = cache.clone(), scale.clone()
    xq, xs = kvonce.quantize_kv(x, fmt, scale=scale if fmt == "fp8_e4m3" else None,
                                scale_dtype=None if fmt == "fp8_e4m3" else scale.dtype)
    page_size = cache.shape[1]
    pos = seqlens.long()[:, None] + torch.arange(x.shape[1], device=DEVICE)[None, :]
    pages = table.long().gather(1, pos // page_size)
    slots = pos % page_size
    cache.view(torch.uint8)[pages, slots] = xq.view(torch.uint8)
    if fmt != "fp8_e4m3":
        scale[pages, slots] = xs.to(scale.dtype)
    return cache, scale


def _assert_bytes_equal(got, want, what):
    g, w = got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
    bad = int((g != w).sum())
    assert bad == 0, f"{what}: {bad} of {g.numel()} bytes differ"


def _tokens(batch, new_len, nheads_k, head_dim, dtype, seed):
    torch.manual_seed(seed)
    k = torch.randn(batch, new_len, nheads_k, head_dim, device=DEVICE)
    v = torch.randn(batch, new_len, nheads_k, head_dim, device=DEVICE) * 0.3
    k[..., 5] *= 20.0  # a channel of outliers, as real keys have
    k[0, 0, 0, 7:15] = torch.tensor([0.5, -1.5, 2.5, -0.0, 0.0, 1e-3, -3e-3, 0.25], device=DEVICE)
    return k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("fmt", [*FORMATS, "int8_f32_scales", "int4_f32_scales",
                                 "fp8_per_tensor"])
@pytest.mark.parametrize("shape", range(len(SHAPES)))
@pytest.mark.parametrize("dtype", TOKEN_DTYPES)
def test_append_stores_quantize_kv_bytes(fmt, shape, dtype):
    """Data and scales equal quantize_kv's for the appended tokens; every other byte (other
    pages, other slots, other scales) is untouched."""
    batch, new_len, nheads_k, head_dim, page, lens = SHAPES[shape]
    scale_dtype = {"int8_f32_scales": torch.float32,
                   "int4_f32_scales": torch.float32}.get(fmt)
    fp8_scale = None
    if fmt.startswith("fp8"):
        fp8_scale = (torch.tensor(0.021, device=DEVICE) if fmt == "fp8_per_tensor" else
                     torch.linspace(0.004, 0.03, nheads_k, device=DEVICE))
    fmt = {"int8_f32_scales": "int8", "int4_f32_scales": "int4",
           "fp8_per_tensor": "fp8_e4m3"}.get(fmt, fmt)
    num_pages, table = _pages(batch, max(lens) + new_len, page, seed=shape)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    k, v = _tokens(batch, new_len, nheads_k, head_dim, dtype, seed=shape)
    kc, vc, ks, vs = _empty_cache(fmt, num_pages, page, nheads_k, head_dim, scale_dtype,
                                  fp8_scale)
    want_k, want_ks = _expected(k, kc, ks, fmt, seqlens, table)
    want_v, want_vs = _expected(v, vc, vs, fmt, seqlens, table)
    kvonce.append_paged_kv(k, v, kc, vc, seqlens, table, k_scale=ks, v_scale=vs,
                           kv_format="int4" if fmt == "int4" else None)
    _assert_bytes_equal(kc, want_k, "k_cache")
    _assert_bytes_equal(vc, want_v, "v_cache")
    _assert_bytes_equal(ks, want_ks, "k_scale")
    _assert_bytes_equal(vs, want_vs, "v_scale")


def test_fp8_rounding_ties_carries_and_saturation():
    """Every e4m3 value, the midpoints between neighbours (ties: to even, with mantissa carries
    into the exponent), values a hair either side, subnormals, -0.0 and values past +-448
    (saturate): the interpreter's rounding step (CPU) and the hardware cast (GPU) alike."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].sort().values
    mids = (grid[1:] + grid[:-1]) / 2
    vals = torch.cat([grid, mids, mids * (1 + 2 ** -20), mids * (1 - 2 ** -20),
                      torch.tensor([460.0, 464.0, 500.0, -1e4, -0.0, 1e-9, -1e-9, 2.0 ** -10])])
    vals = torch.cat([vals, torch.zeros(-vals.numel() % 64)]).to(DEVICE)
    x = vals.view(1, -1, 1, 64)
    num_pages, table = _pages(1, x.shape[1], 16, extra=0)
    one = torch.ones(1, device=DEVICE)
    kc, vc, ks, vs = _empty_cache("fp8_e4m3", num_pages, 16, 1, 64, fp8_scale=one)
    seqlens = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    want, _ = _expected(x, kc, ks, "fp8_e4m3", seqlens, table)
    kvonce.append_paged_kv(x, x, kc, vc, seqlens, table, k_scale=ks, v_scale=vs)
    _assert_bytes_equal(kc, want, "k_cache")


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_integer_rounding_ties(fmt):
    """Scale exactly 1 (int8: amax 127 in every row; int4: minimum -8 and maximum 7), values on
    every half step: round half to even, as torch.round; 0.49999997 (where floor(x + 0.5)
    rounds up) stays 0."""
    if fmt == "int8":
        values = torch.cat([torch.tensor([0.49999997, -0.49999997, 1.4999999, -2.5000002]),
                            torch.arange(-126.5, 127.0, 1.0)])
        ends = [127.0]
    else:  # minimum -8, maximum 7: offset 0, x - offset is x itself, the ties stay ties
        values = torch.cat([torch.tensor([0.49999997, -0.49999997, 1.4999999, -2.5000002]),
                            torch.arange(-7.5, 7.0, 1.0)])
        ends = [7.0, -8.0]
    width = 128 - len(ends)
    values = torch.cat([values, torch.zeros(-values.numel() % width)])
    rows = torch.cat([torch.tensor(ends).expand(values.numel() // width, -1),
                      values.view(-1, width)], dim=1)
    x = rows.reshape(1, -1, 1, 128).to(DEVICE)
    num_pages, table = _pages(1, x.shape[1], 16, extra=0)
    kc, vc, ks, vs = _empty_cache(fmt, num_pages, 16, 1, 128)
    seqlens = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    want, want_s = _expected(x, kc, ks, fmt, seqlens, table)
    kvonce.append_paged_kv(x, x, kc, vc, seqlens, table, k_scale=ks, v_scale=vs,
                           kv_format="int4" if fmt == "int4" else None)
    _assert_bytes_equal(kc, want, "k_cache")
    _assert_bytes_equal(ks, want_s, "k_scale")
    unit = want_s[..., 0] if fmt == "int4" else want_s
    assert float(unit.float().max()) == 1.0  # the case really has unit scales (and ties)


ATTEND = ((3, 4, 2, 64, 16, [0, 19, 7]) if not HAS_CUDA else
          (8, 32, 8, 128, 16, [0, 1000, 17, 4000, 16, 333, 2048, 5]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_on_append_then_attend_equals_quantizing_the_whole_cache(fmt):
    """A cache filled by several appends (a prompt chunk, then 1-2 tokens a step, unequal
    lengths) holds the bytes of quantize_kv over the whole dense K/V, and decode over it equals
    the reference over the dequantized whole-cache quantization."""
    batch, nheads, nheads_k, head_dim, page, starts = ATTEND
    steps = (5, 1, 2, 1)
    lens = [s + sum(steps) for s in starts]
    num_pages, table = _pages(batch, max(lens), page)
    torch.manual_seed(1)
    dtype = DTYPES[0]
    k = torch.randn(batch, max(lens), nheads_k, head_dim, device=DEVICE)
    k[..., 3] *= 25.0
    v = torch.randn(batch, max(lens), nheads_k, head_dim, device=DEVICE)
    k, v = k.to(dtype), v.to(dtype)
    ref_scale = {}
    if fmt == "fp8_e4m3":  # fixed at cache creation: from the whole cache, as a server would
        ref_scale = {"k": kvonce.quantize_kv(k, fmt)[1], "v": kvonce.quantize_kv(v, fmt)[1]}
    # The whole-cache quantization, laid into the same pages.
    kc_ref, vc_ref, ks_ref, vs_ref = _empty_cache(fmt, num_pages, page, nheads_k, head_dim,
                                                  fp8_scale=ref_scale.get("k"))
    if fmt == "fp8_e4m3":
        vs_ref = ref_scale["v"]
    zeros = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    kc_ref, ks_ref = _expected(k, kc_ref, ks_ref, fmt, zeros, table)
    vc_ref, vs_ref = _expected(v, vc_ref, vs_ref, fmt, zeros, table)
    # The appended cache: positions before each start already there (copied), the rest appended.
    kc, vc, ks, vs = (t.clone() for t in (kc_ref, vc_ref, ks_ref, vs_ref))
    seqlens = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    for b, s in enumerate(starts):  # scramble the slots the appends must write
        for p in range(s, lens[b]):
            pg, sl = int(table[b, p // page]), p % page
            kc.view(torch.uint8)[pg, sl] ^= 0x11
            vc.view(torch.uint8)[pg, sl] ^= 0x22
            if fmt != "fp8_e4m3":
                ks[pg, sl] = 7.0
                vs[pg, sl] = 7.0
    rows = torch.arange(batch, device=DEVICE)[:, None]
    gather = lambda x, n: x[rows, seqlens.long()[:, None] + torch.arange(n, device=DEVICE)]
    for n in steps:
        with poison_empty:
            kvonce.append_paged_kv(gather(k, n), gather(v, n), kc, vc, seqlens, table,
                                   k_scale=ks, v_scale=vs,
                                   kv_format="int4" if fmt == "int4" else None)
        seqlens += n
    assert seqlens.tolist() == lens
    for got, want, what in ((kc, kc_ref, "k_cache"), (vc, vc_ref, "v_cache"), (ks, ks_ref, "k_scale"),
                            (vs, vs_ref, "v_scale")):
        _assert_bytes_equal(got, want, what)
    q = torch.randn(batch, 1, nheads, head_dim, device=DEVICE).to(dtype)
    with poison_empty:
        out = kvonce.paged_attention(q, kc, vc, seqlens, table, k_scale=ks, v_scale=vs,
                                     kv_format="int4" if fmt == "int4" else None)
    kd = kvonce.dequantize_kv(kc_ref, ks_ref, fmt, torch.float32)
    vd = kvonce.dequantize_kv(vc_ref, vs_ref, fmt, torch.float32)
    ref, _ = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    assert not torch.isnan(out).any()
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 2e-2, f"relative error {rel:.3e} against the dequantized whole cache"


def _int8_case():
    num_pages, table = _pages(2, 40, 16)
    seqlens = torch.tensor([3, 20], dtype=torch.int32, device=DEVICE)
    k, v = _tokens(2, 2, 2, 64, DTYPES[0], seed=5)
    return k, v, (*_empty_cache("int8", num_pages, 16, 2, 64),), seqlens, table


def test_bad_arguments_raise_before_any_write():
    k, v, (kc, vc, ks, vs), seqlens, table = _int8_case()
    k4c, v4c, k4s, v4s = _empty_cache("int4", kc.shape[0], 16, 2, 64)
    one = torch.ones(2, device=DEVICE)
    k8c, v8c, _, _ = _empty_cache("fp8_e4m3", kc.shape[0], 16, 2, 64, fp8_scale=one)
    plain = torch.zeros(kc.shape, dtype=DTYPES[0], device=DEVICE)
    snapshot = [t.clone() for t in (kc, vc, ks, vs, k4c, v4c, k4s, v4s, k8c, v8c, plain)]
    cases = [
        (ValueError, "needs v_scale", dict(k_scale=ks)),
        (ValueError, "needs k_scale", dict(v_scale=vs)),
        (ValueError, "k_scale must be float32/fp16", dict(k_scale=ks[:, :, :1], v_scale=vs)),
        (TypeError, "v_scale must be one of", dict(k_scale=ks, v_scale=vs.double())),
        (TypeError, "k_scale must be a torch.Tensor", dict(k_scale=1.0, v_scale=vs)),
        (TypeError, "needs a torch.uint8 cache", dict(k_scale=ks, v_scale=vs, kv_format="int4")),
        (ValueError, "kv_format must be None or one of", dict(k_scale=ks, v_scale=vs,
                                                              kv_format="int2")),
        (TypeError, "k must be one of", dict(k=k.to(torch.int32), k_scale=ks, v_scale=vs)),
        (TypeError, "v has dtype", dict(v=v.float(), k_scale=ks, v_scale=vs)),
        (ValueError, "k must have shape", dict(k=k[:, :, :1], v=v[:, :, :1], k_scale=ks,
                                               v_scale=vs)),
        (TypeError, "v_cache must be one of", dict(v_cache=v4c, k_scale=ks, v_scale=vs)),
        # int4
        (ValueError, "kv_format='int4'", dict(k_cache=k4c, v_cache=v4c, k_scale=k4s,
                                              v_scale=v4s)),
        (TypeError, "k_scale must be one of", dict(k_cache=k4c, v_cache=v4c,
                                                   k_scale=k4s.bfloat16(), v_scale=v4s,
                                                   kv_format="int4")),
        (ValueError, "v_scale must be fp16/float32", dict(k_cache=k4c, v_cache=v4c, k_scale=k4s,
                                                          v_scale=v4s[..., :1], kv_format="int4")),
        (ValueError, "share a dtype", dict(k_cache=k4c, v_cache=v4c, k_scale=k4s.float(),
                                           v_scale=v4s, kv_format="int4")),
        (ValueError, "share a dtype", dict(k_scale=ks.float(), v_scale=vs)),
        (ValueError, "k must have shape", dict(k=torch.cat([k, k], -1), v=torch.cat([v, v], -1),
                                               k_cache=k4c, v_cache=v4c, k_scale=k4s,
                                               v_scale=v4s, kv_format="int4")),
        # fp8
        (ValueError, "k_scale must be float32", dict(k_cache=k8c, v_cache=v8c,
                                                     k_scale=torch.ones(3, device=DEVICE),
                                                     v_scale=one)),
        (TypeError, "v_scale must be one of", dict(k_cache=k8c, v_cache=v8c, k_scale=one,
                                                   v_scale=one.half())),
        (TypeError, "needs a torch.int8 cache", dict(k_cache=k8c, v_cache=v8c, k_scale=one,
                                                     v_scale=one, kv_format="int8")),
        # a plain cache takes no scales and its own dtype
        (ValueError, "for quantized caches", dict(k_cache=plain, v_cache=plain, k_scale=ks,
                                                  v_scale=vs)),
        (TypeError, "k_cache has dtype", dict(k=k.float(), v=v.float(), k_cache=plain,
                                              v_cache=plain)),
    ]
    if HAS_CUDA:
        cases.append((ValueError, "k_scale is on cpu", dict(k_scale=ks.cpu(), v_scale=vs)))
    for exc, match, over in cases:
        args = dict(k=k, v=v, k_cache=kc, v_cache=vc, cache_seqlens=seqlens, block_table=table)
        args.update(over)
        positional = [args.pop(n) for n in ("k", "v", "k_cache", "v_cache", "cache_seqlens",
                                             "block_table")]
        with pytest.raises(exc, match=match):
            kvonce.append_paged_kv(*positional, **args)
    for before, after in zip(snapshot, (kc, vc, ks, vs, k4c, v4c, k4s, v4s, k8c, v8c, plain)):
        _assert_bytes_equal(after, before, "a cache after a refused call")


def test_check_block_table_raises_before_any_write():
    k, v, (kc, vc, ks, vs), seqlens, table = _int8_case()
    before = kc.clone()
    with pytest.raises(ValueError, match="too short"):
        kvonce.append_paged_kv(k, v, kc, vc, seqlens, table[:, :1].contiguous(), k_scale=ks,
                               v_scale=vs, check_block_table=True)
    _assert_bytes_equal(kc, before, "k_cache after a refused call")


def _op_args(fmt):
    num_pages, table = _pages(2, 40, 16)
    seqlens = torch.tensor([3, 20], dtype=torch.int32, device=DEVICE)
    k, v = _tokens(2, 3, 2, 64, DTYPES[0], seed=6)
    one = torch.full((2,), 0.02, device=DEVICE)
    kc, vc, ks, vs = _empty_cache(fmt, num_pages, 16, 2, 64, fp8_scale=one)
    code = {"fp8_e4m3": 1, "int8": 2, "int4": 3}[fmt]
    return (k, v, kc, vc, seqlens, table, ks, vs, code, None, None)  # no KeyOutliers


@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck_quantized(fmt):
    utils = ("test_schema", "test_autograd_registration", "test_faketensor",
             "test_aot_dispatch_dynamic")
    if fmt == "fp8_e4m3":
        # test_schema compares every argument before and after with torch.allclose, which has
        # no float8 kernel (torch 2.13: "mul_cpu_reduced_float" not implemented); the schema and
        # its declared mutations are the same op's, checked with the int8 and int4 caches.
        utils = utils[1:]
    torch.library.opcheck(torch.ops.kvonce.append_paged_kv, _op_args(fmt), test_utils=utils)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int4"] if not HAS_CUDA else FORMATS)
def test_compile_equals_eager(fmt, backend):
    k, v, kc, vc, seqlens, table, ks, vs = _op_args(fmt)[:8]
    kv_format = "int4" if fmt == "int4" else None

    def step(k, v, kc, vc, seqlens, table, ks, vs):
        kvonce.append_paged_kv(k, v, kc, vc, seqlens, table, k_scale=ks, v_scale=vs,
                               kv_format=kv_format)
        kvonce.append_paged_kv(v, k, kc, vc, seqlens + 3, table, k_scale=ks, v_scale=vs,
                               kv_format=kv_format)

    states = [[t.clone() for t in (kc, vc, ks, vs)] for _ in range(2)]
    step(k, v, states[0][0], states[0][1], seqlens, table, states[0][2], states[0][3])
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    compiled(k, v, states[1][0], states[1][1], seqlens, table, states[1][2], states[1][3])
    for eager, comp, what in zip(states[0], states[1], ("k_cache", "v_cache", "k_scale",
                                                        "v_scale")):
        _assert_bytes_equal(comp, eager, f"compiled {what}")
    assert not torch.equal(states[0][0].view(torch.uint8), kc.view(torch.uint8))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (CUDA graphs)")
@pytest.mark.parametrize("fmt", FORMATS)
def test_append_in_cuda_graph(fmt):
    """Captured once, replayed with new tokens and new positions (read on the device)."""
    k, v, kc, vc, seqlens, table, ks, vs = _op_args(fmt)[:8]
    kv_format = "int4" if fmt == "int4" else None
    run = lambda: kvonce.append_paged_kv(k, v, kc, vc, seqlens, table, k_scale=ks, v_scale=vs,
                                         kv_format=kv_format)
    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for step in range(2):
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
        seqlens.copy_(torch.tensor([7 + step, 30 + 3 * step], dtype=torch.int32, device=DEVICE))
        want_k, want_ks = _expected(k, kc, ks, fmt, seqlens, table)
        want_v, want_vs = _expected(v, vc, vs, fmt, seqlens, table)
        graph.replay()
        torch.cuda.synchronize()
        for got, want, what in ((kc, want_k, "k_cache"), (vc, want_v, "v_cache"),
                                (ks, want_ks, "k_scale"), (vs, want_vs, "v_scale")):
            _assert_bytes_equal(got, want, what)
