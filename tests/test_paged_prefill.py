"""Varlen paged attention (kvonce.paged.prefill) against the float32 reference.

Mixed batches of prefill, chunked-prefill and decode rows (q_len 0, 1, a chunk over a longer
history, a whole prompt) over paged caches with pages in random order. On CPU under the Triton
interpreter with fp16/fp32 and small shapes; on CUDA the same tests at larger sizes in fp16/bf16
(plus head dim 128 and CUDA-graph capture). Each kvonce call runs under ``poison_empty``, so an
output element the kernel fails to write shows up as a NaN.
"""
from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, DTYPES, HAS_CUDA, hypothesis_examples, poison_empty
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

import kvonce
from kvonce import flops
from kvonce.kernels.configs import get_paged_prefill_config, interpreter_active, op_fields
from kvonce.paged.checks import QUANT_FORMATS
from kvonce.reference import paged_prefill_ref, varlen_attention_ref

pytestmark = pytest.mark.skipif(not HAS_CUDA and not interpreter_active(),
                                reason="needs a CUDA GPU or TRITON_INTERPRET=1")
gpu_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (CUDA graphs)")
# Relative error bounds against the float32 reference (tf32 dots on the GPU for float32).
TOL = {torch.float32: 2e-3 if HAS_CUDA else 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}
# (q_len, cache_seqlen) per sequence: no rows, a decode row, a chunk over a longer history, a
# whole prompt, and a chunk that crosses several tiles mid-history.
MIXED = ([(0, 9), (1, 30), (13, 50), (40, 40), (5, 21)] if not HAS_CUDA else
         [(0, 900), (1, 3000), (300, 2100), (1000, 1000), (77, 213), (1, 1)])
HEAD_DIMS = (32, 64) if not HAS_CUDA else (64, 128)


def make_case(lens, *, nheads=4, nheads_k=2, head_dim=32, page_size=16, dtype=torch.float16,
              seed=0, spare_pages=1):
    """``(q, k_cache, v_cache, cu_seqlens_q, cache_seqlens, block_table)`` for ``lens`` =
    [(q_len, cache_seqlen), ...]: pages a random permutation, tables padded with a spare page."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page_size) + spare_pages for _, n in lens]
    num_pages = sum(need) + 2
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    table = torch.full((len(lens), max(need)), num_pages - 1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[start:start + n]
        start += n
    shape = (num_pages, page_size, nheads_k, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    q_lens = [n for n, _ in lens]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn((sum(q_lens), nheads, head_dim), generator=g).to(dtype)
    seqlens = torch.tensor([n for _, n in lens], dtype=torch.int32)
    return tuple(t.to(DEVICE) for t in (q, k_cache, v_cache, cu, seqlens, table))


def rel_err(out, ref) -> float:
    assert not torch.isnan(out).any(), "output has NaNs (an element was not written)"
    out, ref = out.float(), ref.float().to(out.device)
    return ((out - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def check_lse(lse, ref, tol=2e-3):
    assert not torch.isnan(lse).any(), "lse has NaNs (an element was not written)"
    ref = ref.to(lse.device)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)), "-inf rows differ"
    fin = torch.isfinite(ref)
    if fin.any():
        assert (lse[fin] - ref[fin]).abs().max().item() < tol


def max_q(cu) -> int:
    return int((cu[1:] - cu[:-1]).max())


# ------------------------------------------------------------------------------------------------
# Against the reference
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("nheads,nheads_k,head_dim,page_size", [
    (4, 4, HEAD_DIMS[0], 16),   # MHA
    (4, 2, HEAD_DIMS[1], 32),   # GQA 2
    (8, 2, HEAD_DIMS[0], 16),   # GQA 4
    (12, 2, HEAD_DIMS[0], 32),  # GQA 6: BLOCK_M is not a multiple of the group
])
def test_mixed_batch_against_reference(dtype, causal, nheads, nheads_k, head_dim, page_size):
    q, k, v, cu, seqlens, table = make_case(MIXED, nheads=nheads, nheads_k=nheads_k,
                                            head_dim=head_dim, page_size=page_size, dtype=dtype)
    ref, ref_lse = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table,
                                     causal=causal)
    with poison_empty:
        out, lse = kvonce.paged_prefill(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                        causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (nheads, q.shape[0]) and lse.dtype == torch.float32
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"relative error {err:.2e}"
    check_lse(lse, ref_lse)


def test_last_tiles_first_order():
    """config.last_tiles_first (programs take tiles in reverse) and prefetch_pages (page ids
    looked up a tile ahead) flipped from the default compute the same batch."""
    import dataclasses

    base = get_paged_prefill_config(torch.cuda.get_device_capability() if HAS_CUDA else None, 32)
    config = dataclasses.replace(base, last_tiles_first=not base.last_tiles_first,
                                 prefetch_pages=not base.prefetch_pages)
    q, k, v, cu, seqlens, table = make_case(MIXED, nheads=8, nheads_k=2, dtype=DTYPES[0])
    ref, ref_lse = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table)
    with poison_empty:
        out, lse = kvonce.paged_prefill(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                        return_lse=True, config=config)
    assert rel_err(out, ref) < TOL[DTYPES[0]]
    check_lse(lse, ref_lse)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("nheads,nheads_k", [(8, 2), (12, 2), (4, 4)])
def test_one_head_per_program(causal, nheads, nheads_k):
    """config.pack_gqa=False (one q head per program, rows are tokens) computes the same batch
    as the reference: GQA 4 and 6, MHA, causal and not, an empty sequence and lengths off the
    tile grid (MIXED)."""
    import dataclasses

    base = get_paged_prefill_config(torch.cuda.get_device_capability() if HAS_CUDA else None, 32)
    config = dataclasses.replace(base, pack_gqa=False)
    q, k, v, cu, seqlens, table = make_case(MIXED, nheads=nheads, nheads_k=nheads_k,
                                            dtype=DTYPES[0])
    ref, ref_lse = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table,
                                     causal=causal)
    with poison_empty:
        out, lse = kvonce.paged_prefill(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                        causal=causal, return_lse=True, config=config)
    assert rel_err(out, ref) < TOL[DTYPES[0]]
    check_lse(lse, ref_lse)


def test_single_sequence_with_strided_q():
    """batch 1 (a whole prompt) and q a strided view (as from a fused qkv projection)."""
    n = 37 if not HAS_CUDA else 1500
    q, k, v, cu, seqlens, table = make_case([(n, n)], nheads=8, nheads_k=2, dtype=DTYPES[0])
    qkv = torch.cat([q, q.neg()], dim=1)  # [n, 16, d]: q is the first 8 heads
    q_view = qkv[:, :8]
    ref, _ = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table)
    with poison_empty:
        out = kvonce.paged_prefill(q_view, k, v, cu, seqlens, table, max_seqlen_q=n)
    assert out.is_contiguous()
    assert rel_err(out, ref) < TOL[DTYPES[0]]


@settings(max_examples=hypothesis_examples(cpu=6, gpu=25), deadline=None)
@given(data=st.data())
def test_random_varlen_batches(data):
    """Random mixes of row counts (0 .. a whole prompt) and histories, GQA 1-6, both masks."""
    scale = 1 if not HAS_CUDA else 16
    batch = data.draw(st.integers(1, 4))
    lens = []
    for _ in range(batch):
        cached = data.draw(st.integers(0, 40 * scale))
        lens.append((data.draw(st.integers(0, cached)), cached))
    group = data.draw(st.sampled_from([1, 2, 3, 6]))
    causal = data.draw(st.booleans())
    q, k, v, cu, seqlens, table = make_case(lens, nheads=2 * group, nheads_k=2,
                                            dtype=DTYPES[0], seed=data.draw(st.integers(0, 99)))
    ref, ref_lse = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table,
                                     causal=causal)
    with poison_empty:
        out, lse = kvonce.paged_prefill(q, k, v, cu, seqlens, table, causal=causal,
                                        max_seqlen_q=max(n for n, _ in lens), return_lse=True)
    if q.shape[0]:
        assert rel_err(out, ref) < TOL[DTYPES[0]]
        check_lse(lse, ref_lse)


def test_softmax_scale_and_no_lse():
    q, k, v, cu, seqlens, table = make_case(MIXED[:3], dtype=DTYPES[0])
    ref, _ = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table,
                               softmax_scale=0.3)
    with poison_empty:
        out = kvonce.paged_prefill(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                   softmax_scale=0.3)
    assert isinstance(out, torch.Tensor)
    assert rel_err(out, ref) < TOL[DTYPES[0]]


def test_rows_that_see_no_key_get_zero_and_neg_inf():
    """More query rows than cached keys (outside the contract; validation mode rejects it): the
    first rows see nothing and get out 0, lse -inf, never NaN."""
    q, k, v, cu, seqlens, table = make_case([(5, 20), (4, 4)], dtype=DTYPES[0])
    seqlens = torch.tensor([20, 2], dtype=torch.int32, device=DEVICE)  # 4 rows over 2 keys
    ref, ref_lse = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table)
    with poison_empty:
        out, lse = kvonce.paged_prefill(q, k, v, cu, seqlens, table, max_seqlen_q=5,
                                        return_lse=True)
    assert torch.isneginf(lse[:, 5:7]).all() and torch.isfinite(lse[:, 7:]).all()
    assert (out[5:7] == 0).all()
    check_lse(lse, ref_lse)
    assert rel_err(out, ref) < TOL[DTYPES[0]]


def test_no_query_rows_at_all():
    q, k, v, cu, seqlens, table = make_case([(0, 5), (0, 17)], dtype=DTYPES[0])
    out, lse = kvonce.paged_prefill(q, k, v, cu, seqlens, table, max_seqlen_q=0,
                                    return_lse=True)
    assert out.shape == (0, 4, 32) and lse.shape == (4, 0)


@pytest.mark.parametrize("kernel", ["routed", "prefill"])
def test_decode_only_batch_equals_paged_attention(kernel):
    """One row per sequence: routed to the decode kernel by default (total_q == batch,
    max_seqlen_q == 1), or through the prefill kernel when a config is given."""
    lens = [(1, n) for n in (1, 17, 40, 33)]
    q, k, v, cu, seqlens, table = make_case(lens, nheads=8, nheads_k=2, dtype=DTYPES[0])
    config = None
    if kernel == "prefill":
        config = get_paged_prefill_config(torch.cuda.get_device_capability() if HAS_CUDA else None, 32)
    plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=1, config=config)
    assert (plan._decode is not None) == (kernel == "routed")
    with poison_empty:
        out, lse = plan.run(q, k, v, cu, seqlens, table, return_lse=True)
        want, want_lse = kvonce.paged_attention(q[:, None], k, v, seqlens, table, num_splits=1,
                                                return_lse=True)
    torch.testing.assert_close(out, want[:, 0], atol=2e-3, rtol=0)
    torch.testing.assert_close(lse, want_lse[:, :, 0].T, atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------------------
# Quantized caches: against the reference on the dequantized cache
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", tuple(QUANT_FORMATS))
@pytest.mark.parametrize("head_dim", [64, 128])  # int4: the per-element tile at both
def test_quantized_cache_matches_dequantized_reference(fmt, head_dim):
    dtype = DTYPES[0]
    q, k, v, cu, seqlens, table = make_case(MIXED, nheads=8, nheads_k=2, head_dim=head_dim,
                                            dtype=dtype)
    kq, ks = kvonce.quantize_kv(k, fmt)
    vq, vs = kvonce.quantize_kv(v, fmt)
    kd, vd = kvonce.dequantize_kv(kq, ks, fmt, torch.float32), \
        kvonce.dequantize_kv(vq, vs, fmt, torch.float32)
    ref, ref_lse = paged_prefill_ref(q.float(), kd, vd, cu, seqlens, table)
    with poison_empty:
        out, lse = kvonce.paged_prefill(q, kq, vq, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                        k_scale=ks, v_scale=vs, return_lse=True,
                                        kv_format="int4" if fmt == "int4" else None)
    err = rel_err(out, ref)
    assert err < (1e-4 if dtype == torch.float32 else 2e-2), f"relative error {err:.2e}"
    check_lse(lse, ref_lse, tol=1e-2)


# ------------------------------------------------------------------------------------------------
# Plan reuse, validation, the custom op, torch.compile, FLOPs, CUDA graphs
# ------------------------------------------------------------------------------------------------

def test_plan_serves_layers_and_new_lengths():
    q, k, v, cu, seqlens, table = make_case(MIXED, dtype=DTYPES[0], spare_pages=8)
    plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu))
    for layer in range(2):
        kl, vl, ql = k * (1 + layer), v * (2 - layer), q.flip(0)
        # Another step's lengths, same total_q and batch: rows move between sequences.
        q_lens = torch.tensor([3, 20, 1, 30, 5] if not HAS_CUDA else [0, 500, 400, 200, 200, 79])
        cu_l = cu if layer == 0 else torch.cat([q_lens.new_zeros(1), q_lens.cumsum(0)]).to(
            device=DEVICE, dtype=torch.int32)
        sl = seqlens if layer == 0 else torch.maximum(seqlens, q_lens.to(seqlens))
        with poison_empty:
            out = plan.run(ql, kl, vl, cu_l, sl, table)
        ref, _ = paged_prefill_ref(ql.float(), kl.float(), vl.float(), cu_l, sl, table)
        assert rel_err(out, ref) < TOL[DTYPES[0]]
    with pytest.raises(ValueError, match="differ from the plan"):
        plan.run(q[:-1], k, v, cu, seqlens, table)


def test_bad_inputs_raise_before_launch(monkeypatch):
    import kvonce.kernels.paged_prefill as kernel_module
    monkeypatch.setattr(kernel_module, "launch", lambda *a, **k: pytest.fail("launched"))
    q, k, v, cu, seqlens, table = make_case(MIXED[:3], nheads=4, nheads_k=2, dtype=DTYPES[0])
    max_q = max(n for n, _ in MIXED[:3])
    call = lambda *a, **kw: kvonce.paged_prefill(*a, **{"max_seqlen_q": max_q, **kw})  # noqa: E731
    with pytest.raises(ValueError, match="q must have 3 dims"):
        call(q[None], k, v, cu, seqlens, table)
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        call(q, k, v, cu.long(), seqlens, table)
    with pytest.raises(ValueError, match="cu_seqlens_q must have shape"):
        call(q, k, v, cu[:-1], seqlens, table)
    with pytest.raises(ValueError, match="multiple of nheads_k"):
        call(q[:, :3], k, v, cu, seqlens, table)
    with pytest.raises(ValueError, match="head dim mismatch"):
        call(q[..., :16].contiguous(), k, v, cu, seqlens, table)
    with pytest.raises(TypeError, match="k_cache"):
        call(q.float() if q.dtype != torch.float32 else q.half(), k, v, cu, seqlens, table)
    with pytest.raises(TypeError, match="max_seqlen_q"):
        call(q, k, v, cu, seqlens, table, max_seqlen_q=-1)
    with pytest.raises(ValueError, match="quantized caches"):
        call(q, k, v, cu, seqlens, table, k_scale=seqlens.float())
    kq, ks = kvonce.quantize_kv(k, "int8")
    vq, vs = kvonce.quantize_kv(v, "int8")
    with pytest.raises(ValueError, match="needs v_scale"):
        call(q, kq, vq, cu, seqlens, table, k_scale=ks)
    with pytest.raises(ValueError, match="k_scale must be"):
        call(q, kq, vq, cu, seqlens, table, k_scale=ks[:, :, :1], v_scale=vs)
    # Validation mode reads values: rows past the cache, past max_seqlen_q, pages out of range.
    with pytest.raises(ValueError, match="must be in the cache already"):
        short = seqlens.clone()
        short[2] = MIXED[2][0] - 1  # sequence 2's rows outnumber its cached keys
        call(q, k, v, cu, short, table, check_block_table=True)
    with pytest.raises(ValueError, match="more than max_seqlen_q"):
        call(q, k, v, cu, seqlens, table, max_seqlen_q=max_q - 1, check_block_table=True)
    with pytest.raises(ValueError, match="rise from 0"):
        call(q, k, v, cu.flip(0), seqlens, table, check_block_table=True)
    with pytest.raises(ValueError, match="names a page outside"):
        call(q, k, v, cu, seqlens, table + 1000, check_block_table=True)


def _op_args(kv_format=None):
    q, k, v, cu, seqlens, table = make_case(MIXED[:4], dtype=DTYPES[0])
    c = get_paged_prefill_config(torch.cuda.get_device_capability() if HAS_CUDA else None, 32)
    fields = (32 ** -0.5, True, *op_fields(c))
    if kv_format is None:
        return (q, k, v, cu, seqlens, table, *fields)
    kq, ks = kvonce.quantize_kv(k, kv_format)
    vq, vs = kvonce.quantize_kv(v, kv_format)
    return (q, kq, vq, cu, seqlens, table, *fields, ks, vs, QUANT_FORMATS[kv_format][0])


@pytest.mark.parametrize("kv_format", [None, "int8"])
def test_opcheck(kv_format):
    torch.library.opcheck(torch.ops.kvonce.paged_prefill, _op_args(kv_format))


def test_flop_counter_counts_visible_pairs():
    q, k, v, cu, seqlens, table = make_case(MIXED, dtype=DTYPES[0])
    with FlopCounterMode(display=False) as counter:
        kvonce.paged_prefill(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu))
    # Bottom-right causal, counted from the mask: row i of (n, L) sees min(L, i + L - n + 1) keys.
    pairs = sum(max(0, min(L, i + L - n + 1)) for n, L in MIXED for i in range(n))
    assert counter.get_total_flops() == flops.attention_flops(q.shape[1], q.shape[2], pairs)


def test_compile_fullgraph_equals_eager():
    q, k, v, cu, seqlens, table = make_case(MIXED, dtype=DTYPES[0])
    plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu))

    def step(q, k, v, cu, seqlens, table):
        return plan.run(q, k, v, cu, seqlens, table, return_lse=True)

    eager = step(q, k, v, cu, seqlens, table)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True,
                             backend="inductor" if HAS_CUDA else "aot_eager")
    out, lse = compiled(q, k, v, cu, seqlens, table)
    assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1])


@gpu_only
def test_cuda_graph_capture_of_plan_run():
    q, k, v, cu, seqlens, table = make_case(MIXED, dtype=torch.float16, spare_pages=70)
    plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu))
    static = [t.clone() for t in (q, cu, seqlens)]
    plan.run(static[0], k, v, static[1], static[2], table)  # binds the launch (compiles)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = plan.run(static[0], k, v, static[1], static[2], table)
    # New values, same shapes: another step's lengths and queries.
    static[0].copy_(torch.randn_like(q))
    static[1].copy_(torch.tensor([0, 0, 500, 900, 1100, 1378, 1379], dtype=torch.int32))
    static[2].copy_(seqlens + 1000)
    graph.replay()
    ref, _ = paged_prefill_ref(static[0].float(), k.float(), v.float(), static[1], static[2],
                               table)
    assert rel_err(out, ref) < TOL[torch.float16]


# ------------------------------------------------------------------------------------------------
# flash_attn_varlen_func: flash-attn 2's names, paged and contiguous K/V
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_varlen_func_paged_equals_paged_prefill(causal):
    q, k, v, cu, seqlens, table = make_case(MIXED, dtype=DTYPES[0])
    cu_k = torch.cat([seqlens.new_zeros(1), seqlens.cumsum(0)]).to(torch.int32)
    with poison_empty:
        out, lse, probs = kvonce.flash_attn_varlen_func(
            q, k, v, cu, cu_k, max_q(cu), int(seqlens.max()), causal=causal, block_table=table,
            return_attn_probs=True)
        want, want_lse = kvonce.paged_prefill(q, k, v, cu, seqlens, table, causal=causal,
                                              max_seqlen_q=max_q(cu), return_lse=True)
    assert probs is None
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_varlen_func_contiguous_against_reference(causal):
    g = torch.Generator().manual_seed(3)
    q_lens, k_lens = [5, 1, 0, 20], [9, 30, 4, 20]
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32)
    dtype = DTYPES[0]
    q = torch.randn(sum(q_lens), 4, 32, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(sum(k_lens), 2, 32, generator=g).to(dtype).to(DEVICE)
    v = torch.randn(sum(k_lens), 2, 32, generator=g).to(dtype).to(DEVICE)
    cu_q, cu_k = cu_q.to(DEVICE), cu_k.to(DEVICE)
    out, lse, _ = kvonce.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens),
                                                causal=causal, return_attn_probs=True)
    ref, ref_lse = varlen_attention_ref(q, k, v, cu_q, cu_k, causal=causal)
    assert rel_err(out, ref) < TOL[dtype]
    check_lse(lse, ref_lse)


def test_flash_attn_varlen_func_unsupported_arguments_raise():
    q, k, v, cu, seqlens, table = make_case(MIXED[:2], dtype=DTYPES[0])
    args = (q, k, v, cu, cu, 1, 30)
    for kwargs, name in ((dict(dropout_p=0.1), "dropout_p"), (dict(window_size=(4, 0)),
                         "window_size"), (dict(softcap=30.0), "softcap"),
                         (dict(alibi_slopes=torch.ones(4)), "alibi_slopes")):
        with pytest.raises(NotImplementedError, match=name):
            kvonce.flash_attn_varlen_func(*args, block_table=table, **kwargs)
    with pytest.raises(NotImplementedError, match="gradients with block_table"):
        kvonce.flash_attn_varlen_func(q.clone().requires_grad_(), *args[1:], block_table=table)


@pytest.mark.skipif(not HAS_CUDA, reason="TMA descriptors need a Hopper GPU")
@pytest.mark.parametrize("page_size", [64, 256])
def test_tma_pages_match_pointer_loads(page_size):
    """config.tma (unmasked tiles of pages holding whole key tiles through TMA descriptors) gives
    bit-identical outputs to pointer loads with the same tiles, on a mixed batch whose pages are
    in random order."""
    import dataclasses

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0")
    base = dataclasses.replace(get_paged_prefill_config(torch.cuda.get_device_capability(), 128),
                               block_n=64, gluon=False)   # the Triton kernel's TMA path
    q, k, v, cu, seqlens, table = make_case(MIXED, nheads=8, nheads_k=2, head_dim=128,
                                            page_size=page_size, dtype=torch.bfloat16)
    outs = []
    for tma in (False, True):
        with poison_empty:
            outs.append(kvonce.paged_prefill(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                             return_lse=True,
                                             config=dataclasses.replace(base, tma=tma)))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
