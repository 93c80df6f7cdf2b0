"""Fused dual-group varlen forward and the zigzag replacement, against reference.py.

Runs under the Triton interpreter on CPU (small shapes, fp16/fp32) and on CUDA at the spec's real
shapes (fp16/bf16). Each kvonce call runs under ``poison_empty`` (NaN-filled outputs), so an
unwritten element fails.
"""
import pytest
import torch
from conftest import DEVICE, DTYPES, HAS_CUDA, hypothesis_examples, poison_empty
from hypothesis import given, settings
from hypothesis import strategies as st

from kvonce import fused_zigzag_llama3_flash_attn_varlen_forward as fused_forward
from kvonce.reference import dual_group_attention_ref, varlen_attention_ref
from kvonce.zigzag import (
    compute_kv_slices_for_groups,
    execute_grouped_attention,
    rearrange_kv_from_zigzag_to_contiguous,
    replace_execute_grouped_attention_with_fused_varlen,
    split_q_by_zigzag_chunk_index,
)


def cu_of(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=DEVICE)


def randn(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def assert_close(name, out, ref, *, lse=False):
    """Relative-norm error vs the float32 reference, plus the spec's elementwise 1e-2 atol/rtol.
    LSE: the same -inf entries, finite ones within 1e-2."""
    assert not torch.isnan(out).any(), f"{name}: NaN in output (unwritten or 0/0)"
    if lse:
        assert torch.equal(torch.isinf(out), torch.isinf(ref)), f"{name}: -inf rows differ"
        fin = torch.isfinite(ref)
        err = (out[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0
        assert err < 1e-2, f"{name}: max |lse - ref| = {err:.3e}"
        return
    # fp32 inputs: only the kernel's fp32 (tf32-free in the interpreter) rounding; fp16/bf16: the
    # output's own rounding (2^-11 / 2^-8) plus low-precision P @ V.
    limit = 1e-4 if out.dtype == torch.float32 else 2e-2
    out, ref = out.float(), ref.float()
    rel = ((out - ref).norm() / ref.norm().clamp_min(1e-6)).item()
    assert rel < limit or ref.norm() == 0, f"{name}: relative error {rel:.3e}"
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2, msg=lambda m: f"{name}: {m}")


def check_against_reference(q0, q1, k, v, lens_q0, lens_q1, lens_k, kv0, kv1, *, causal=True,
                            softmax_scale=None):
    cu0, cu1, cuk = cu_of(lens_q0), cu_of(lens_q1), cu_of(lens_k)
    with poison_empty:
        out = fused_forward(q0, q1, k, v, cu0, cu1, cuk, max(lens_q0, default=0),
                            max(lens_q1, default=0), max(lens_k, default=0), kv0, kv1,
                            softmax_scale=softmax_scale, causal=causal)
    ref = dual_group_attention_ref(q0, q1, k, v, cu0, cu1, cuk, kv0, kv1,
                                   softmax_scale=softmax_scale, causal=causal)
    for name, o, r in zip(("out0", "out1", "lse0", "lse1"), out, ref):
        assert_close(name, o, r, lse=name.startswith("lse"))
    assert out[0].dtype == q0.dtype and out[2].dtype == torch.float32
    return out, ref


# ---------------------------------------------------------------- the spec's cases
@pytest.mark.parametrize("dtype", DTYPES)
def test_single_sequence_spec(dtype):
    """World 4, rank 0, 256 local tokens, 8 heads, head dim 64, against two reference calls."""
    world, rank, local, heads, hd = 4, 0, 256, 8, 64
    half = local // 2
    q = randn(local, heads, hd, dtype=dtype)
    k, v = randn(local * world, heads, hd, dtype=dtype), randn(local * world, heads, hd, dtype=dtype)
    chunk = local * world // (2 * world)
    kv0, kv1 = (rank + 1) * chunk, (2 * world - rank) * chunk
    with poison_empty:
        out0, out1, lse0, lse1 = fused_forward(q[:half], q[half:], k, v, cu_of([half]),
                                               cu_of([half]), cu_of([local * world]), half, half,
                                               local * world, kv0, kv1)
    for g, (o, lse, end, qg) in enumerate(((out0, lse0, kv0, q[:half]), (out1, lse1, kv1, q[half:]))):
        ref_o, ref_lse = varlen_attention_ref(qg, k[:end], v[:end], cu_of([half]), cu_of([end]))
        assert_close(f"out{g}", o, ref_o)
        assert_close(f"lse{g}", lse, ref_lse, lse=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_lens_as_tensor", [False, True])
def test_multi_sequence_spec(dtype, kv_lens_as_tensor):
    """q0 30/80/50, q1 70/120/90, k 400/800/600, max_kv_len 100 and 800: per sequence, both groups."""
    lens_q0, lens_q1, lens_k = [30, 80, 50], [70, 120, 90], [400, 800, 600]
    q0, q1 = randn(sum(lens_q0), 8, 64, dtype=dtype), randn(sum(lens_q1), 8, 64, dtype=dtype)
    k, v = randn(sum(lens_k), 8, 64, dtype=dtype), randn(sum(lens_k), 8, 64, dtype=dtype)
    kv0, kv1 = 100, 800
    if kv_lens_as_tensor:
        kv0 = torch.full((3,), 100, dtype=torch.int32, device=DEVICE)
        kv1 = torch.tensor([800, 700, 600], dtype=torch.int32, device=DEVICE)
    out, _ = check_against_reference(q0, q1, k, v, lens_q0, lens_q1, lens_k, kv0, kv1)
    # And sequence by sequence, as the spec does.
    cu0, cu1, cuk = cu_of(lens_q0), cu_of(lens_q1), cu_of(lens_k)
    for b in range(3):
        kb = k[cuk[b]:cuk[b + 1]]
        vb = v[cuk[b]:cuk[b + 1]]
        end0 = min(100, lens_k[b])
        r0, _ = varlen_attention_ref(q0[cu0[b]:cu0[b + 1]], kb[:end0], vb[:end0],
                                     cu_of([lens_q0[b]]), cu_of([end0]))
        assert_close(f"seq {b} out0", out[0][cu0[b]:cu0[b + 1]], r0)
        end1 = min(int(kv1[b]) if torch.is_tensor(kv1) else kv1, lens_k[b])
        r1, _ = varlen_attention_ref(q1[cu1[b]:cu1[b + 1]], kb[:end1], vb[:end1],
                                     cu_of([lens_q1[b]]), cu_of([end1]))
        assert_close(f"seq {b} out1", out[1][cu1[b]:cu1[b + 1]], r1)


# ---------------------------------------------------------------- the zigzag integration
def zigzag_rank_inputs(global_lens, world, rank, heads, heads_k, hd, dtype):
    """Global q/k/v, the rank's local q and the all-gathered zigzag K/V buffer."""
    total = sum(global_lens)
    Q, K, V = (randn(total, h, hd, dtype=dtype) for h in (heads, heads_k, heads_k))

    def local_of(x, r):
        parts, off = [], 0
        for n in global_lens:
            c = n // (2 * world)
            parts += [x[off + r * c: off + (r + 1) * c], x[off + (2 * world - 1 - r) * c: off + (2 * world - r) * c]]
            off += n
        return torch.cat(parts)

    kv_buffer = torch.stack([torch.cat([local_of(K, r) for r in range(world)]),
                             torch.cat([local_of(V, r) for r in range(world)])])
    return Q, K, V, local_of, kv_buffer


ZIGZAG_CASES = [(w, r) for w in (1, 2, 4, 8) for r in range(w)]


@pytest.mark.parametrize("world,rank", ZIGZAG_CASES)
def test_replacement_matches_original_every_rank(world, rank):
    """Batches of unequal lengths (chunks 5, 33, 0, 17 tokens: shorter than a tile, straddling
    tiles, empty): the replacement equals execute_grouped_attention and global causal attention."""
    dtype = DTYPES[0]
    chunks = (5, 33, 0, 17) if not HAS_CUDA else (100, 1030, 0, 257)
    global_lens = [2 * world * c for c in chunks]
    heads, heads_k, hd = 4, 2, 64
    Q, K, V, local_of, kv_buffer = zigzag_rank_inputs(global_lens, world, rank, heads, heads_k, hd, dtype)
    local_lens = [n // world for n in global_lens]
    cu_local = cu_of(local_lens)
    q = local_of(Q, rank)
    chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(q, cu_local, world, rank)
    c0, c1 = rank, 2 * world - 1 - rank
    slices = compute_kv_slices_for_groups(cu_local, c0, c1, world, chunk_cu)
    args = (chunk_q, chunk_cu, chunk_idx, kv_buffer, slices, heads, hd, None, 0.0, True, (-1, -1),
            None, False, world, cu_local)
    with poison_empty:
        out_orig, lse_orig, _ = execute_grouped_attention(*args)
        out, lse, info = replace_execute_grouped_attention_with_fused_varlen(*args, c0, c1)
    assert_close("out vs original", out, out_orig)
    assert_close("lse vs original", lse, lse_orig, lse=True)
    ref_o, ref_lse = varlen_attention_ref(Q, K, V, cu_of(global_lens), cu_of(global_lens))
    assert_close("out vs global", out, local_of(ref_o, rank))
    assert_close("lse vs global", lse, local_of(ref_lse.t(), rank).t(), lse=True)
    assert info["kv_slices"] is slices


def test_rearrange_matches_global_order():
    world, global_lens = 4, [8 * 3, 0, 8 * 7]
    Q, K, V, local_of, kv_buffer = zigzag_rank_inputs(global_lens, world, 0, 1, 1, 32, torch.float32)
    with poison_empty:
        kv = rearrange_kv_from_zigzag_to_contiguous(kv_buffer, world,
                                                    cu_of([n // world for n in global_lens]))
    assert torch.equal(kv[0], K) and torch.equal(kv[1], V)


# ---------------------------------------------------------------- GQA, head dims, causal, edges
@pytest.mark.parametrize("heads,heads_k", [(4, 4), (4, 2), (6, 2), (4, 1)])
def test_gqa(heads, heads_k):
    lens_q0, lens_q1, lens_k = [17, 40], [33, 9], [70, 100]
    dt = DTYPES[0]
    q0, q1 = randn(sum(lens_q0), heads, 64, dtype=dt), randn(sum(lens_q1), heads, 64, dtype=dt)
    k, v = randn(sum(lens_k), heads_k, 64, dtype=dt), randn(sum(lens_k), heads_k, 64, dtype=dt)
    check_against_reference(q0, q1, k, v, lens_q0, lens_q1, lens_k, 45, 100)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_head_dims(head_dim, dtype):
    lens_q0, lens_q1, lens_k = [13, 37], [37, 20], [50, 77]
    q0, q1 = randn(sum(lens_q0), 2, head_dim, dtype=dtype), randn(sum(lens_q1), 2, head_dim, dtype=dtype)
    k, v = randn(sum(lens_k), 1, head_dim, dtype=dtype), randn(sum(lens_k), 1, head_dim, dtype=dtype)
    check_against_reference(q0, q1, k, v, lens_q0, lens_q1, lens_k, 30, 77)


@pytest.mark.parametrize("causal", [True, False])
def test_causal_and_not(causal):
    lens_q0, lens_q1, lens_k = [40, 1], [3, 64], [90, 65]
    dt = DTYPES[0]
    q0, q1 = randn(sum(lens_q0), 2, 64, dtype=dt), randn(sum(lens_q1), 2, 64, dtype=dt)
    k, v = randn(sum(lens_k), 2, 64, dtype=dt), randn(sum(lens_k), 2, 64, dtype=dt)
    check_against_reference(q0, q1, k, v, lens_q0, lens_q1, lens_k, 60, 1000, causal=causal,
                            softmax_scale=0.3)


def test_empty_sequences_and_rows_that_see_nothing():
    """Zero-length q0/q1/k sequences, a group with no visible keys (kv_end 0) and causal rows above
    the diagonal (len_q > visible keys) give out = 0 and lse = -inf, never NaN."""
    lens_q0, lens_q1, lens_k = [0, 12, 50, 7], [5, 0, 40, 7], [30, 0, 20, 0]
    dt = DTYPES[0]
    q0, q1 = randn(sum(lens_q0), 2, 32, dtype=dt), randn(sum(lens_q1), 2, 32, dtype=dt)
    k, v = randn(sum(lens_k), 2, 32, dtype=dt), randn(sum(lens_k), 2, 32, dtype=dt)
    kv0 = torch.tensor([10, 5, 0, 3], dtype=torch.int32, device=DEVICE)
    (out0, out1, lse0, lse1), _ = check_against_reference(q0, q1, k, v, lens_q0, lens_q1, lens_k, kv0, 25)
    # group 0 of sequence 2 sees nothing: rows 12..61 of q0
    assert torch.all(out0[12:62] == 0) and torch.all(lse0[:, 12:62] == float("-inf"))
    # group 1 of sequence 2: 40 rows, 20 keys -> the first 20 rows see nothing
    assert torch.all(out1[5:25] == 0) and torch.all(torch.isfinite(lse1[:, 25:45]))


def test_strided_inputs():
    """Non-contiguous head/token strides (a slice of a packed qkv) are read in place."""
    lens_q, lens_k = [20, 45], [60, 90]
    dt = DTYPES[0]
    qkv = randn(sum(lens_k), 3, 4, 64, dtype=dt)
    k, v = qkv[:, 1], qkv[:, 2]
    q_all = randn(sum(lens_q), 8, 64, dtype=dt)[:, ::2]  # heads strided
    check_against_reference(q_all, q_all, k, v, lens_q, lens_q, lens_k, 30, 90)


@settings(max_examples=hypothesis_examples(6, 30), deadline=None)
@given(data=st.data())
def test_random_varlen(data):
    batch = data.draw(st.integers(1, 3), label="batch")
    lens_q0 = data.draw(st.lists(st.integers(0, 45), min_size=batch, max_size=batch), label="q0")
    lens_q1 = data.draw(st.lists(st.integers(0, 45), min_size=batch, max_size=batch), label="q1")
    lens_k = data.draw(st.lists(st.integers(0, 90), min_size=batch, max_size=batch), label="k")
    kv0 = data.draw(st.lists(st.integers(0, 100), min_size=batch, max_size=batch), label="kv0")
    kv1 = data.draw(st.integers(0, 100), label="kv1")
    causal = data.draw(st.booleans(), label="causal")
    heads_k = data.draw(st.sampled_from([1, 2]), label="heads_k")
    dt = DTYPES[0]
    q0, q1 = randn(sum(lens_q0), 2, 64, dtype=dt), randn(sum(lens_q1), 2, 64, dtype=dt)
    k, v = randn(sum(lens_k), heads_k, 64, dtype=dt), randn(sum(lens_k), heads_k, 64, dtype=dt)
    check_against_reference(q0, q1, k, v, lens_q0, lens_q1, lens_k,
                            torch.tensor(kv0, dtype=torch.int32, device=DEVICE), kv1, causal=causal)


# ---------------------------------------------------------------- bad inputs
def _good():
    dt = DTYPES[0]
    return dict(q0=randn(10, 4, 64, dtype=dt), q1=randn(10, 4, 64, dtype=dt),
                k=randn(20, 2, 64, dtype=dt), v=randn(20, 2, 64, dtype=dt),
                cu_seqlens_q0=cu_of([10]), cu_seqlens_q1=cu_of([10]), cu_seqlens_k=cu_of([20]),
                max_seqlen_q0=10, max_seqlen_q1=10, max_seqlen_k=20, max_kv_len_q0=10, max_kv_len_q1=20)


BAD_INPUTS = {
    "batch mismatch": (dict(cu_seqlens_q1=cu_of([5, 5])), ValueError, "cu_seqlens_q1"),
    "int64 cu_seqlens": (dict(cu_seqlens_k=cu_of([20]).long()), TypeError, "cu_seqlens_k"),
    "head dim mismatch": (dict(k=None, v=None), ValueError, "head dim mismatch"),
    "gqa ratio": (dict(q0="heads3", q1="heads3"), ValueError, "multiple of nheads_k"),
    "dtype mismatch": (dict(v="float64"), TypeError, "v"),
    "int dtype": (dict(q0="int"), TypeError, "q0"),
    "kv_len tensor shape": (dict(max_kv_len_q0=torch.zeros(3, dtype=torch.int32)), ValueError,
                            "max_kv_len_q0"),
    "negative kv_len": (dict(max_kv_len_q1=-1), ValueError, "max_kv_len_q1"),
    "unsupported head dim": (dict(q0="hd48", q1="hd48", k="hd48", v="hd48"), ValueError, "head dim"),
    "2-d q": (dict(q0="2d"), ValueError, "q0"),
    "non-contiguous last dim": (dict(k="strided"), ValueError, "k must have a contiguous last dim"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_raise(case):
    change, exc, match = BAD_INPUTS[case]
    args = _good()
    for name, how in change.items():
        t = args[name]
        if how is None:
            how = randn(20, 2, 32, dtype=t.dtype)
        elif how == "heads3":
            how = randn(10, 3, 64, dtype=t.dtype)
        elif how == "float64":
            how = t.double()
        elif how == "int":
            how = t.to(torch.int32)
        elif how == "hd48":
            how = randn(t.shape[0], t.shape[1], 48, dtype=t.dtype)
        elif how == "2d":
            how = t[:, 0]
        elif how == "strided":
            how = randn(20, 2, 128, dtype=t.dtype)[..., ::2]
        args[name] = how
    with pytest.raises(exc, match=match):
        fused_forward(**args)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CPU tensor to mix")
def test_device_mismatch_raises():
    args = _good()
    args["cu_seqlens_k"] = args["cu_seqlens_k"].cpu()
    with pytest.raises(ValueError, match="cu_seqlens_k is on cpu"):
        fused_forward(**args)


def test_unsupported_zigzag_features_raise():
    args = _good()
    with pytest.raises(NotImplementedError, match="dropout_p"):
        replace_execute_grouped_attention_with_fused_varlen(
            [args["q0"], args["q1"]], [args["cu_seqlens_q0"]] * 2, [None, None],
            torch.stack([args["k"], args["v"]]), None, 4, 64, None, 0.1, True, (-1, -1), None,
            False, 1, args["cu_seqlens_k"], 0, 1)


def test_int64_offset_path():
    """The int64 K/V offset variant (taken automatically for buffers past 2^31 elements) computes
    the same as the default int32 one."""
    import dataclasses

    from kvonce.kernels.configs import get_dual_group_fwd_config

    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    cfg = dataclasses.replace(get_dual_group_fwd_config(cap, 64), int64_kv_offsets=True)
    lens_q0, lens_q1, lens_k = [20, 45], [30, 9], [60, 90]
    dt = DTYPES[0]
    q0, q1 = randn(sum(lens_q0), 2, 64, dtype=dt), randn(sum(lens_q1), 2, 64, dtype=dt)
    k, v = randn(sum(lens_k), 1, 64, dtype=dt), randn(sum(lens_k), 1, 64, dtype=dt)
    cu0, cu1, cuk = cu_of(lens_q0), cu_of(lens_q1), cu_of(lens_k)
    with poison_empty:
        out = fused_forward(q0, q1, k, v, cu0, cu1, cuk, 45, 30, 90, 40, 90, config=cfg)
    ref = dual_group_attention_ref(q0, q1, k, v, cu0, cu1, cuk, 40, 90)
    for name, o, r in zip(("out0", "out1", "lse0", "lse1"), out, ref):
        assert_close(name, o, r, lse=name.startswith("lse"))


@pytest.mark.skipif(not HAS_CUDA, reason="TMA descriptors need a Hopper GPU")
def test_tma_kv_loads_match_pointer_loads():
    """config.tma (unmasked tiles through TMA descriptors) gives bit-identical outputs to pointer
    loads with the same tiles, on unequal lengths where masked tiles border other sequences."""
    from kvonce.kernels.configs import DualGroupFwdConfig

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0")
    lens_q0, lens_q1, lens_k = [300, 0, 1000], [300, 77, 1000], [1200, 400, 4100]
    q0, q1 = randn(sum(lens_q0), 8, 128, dtype=torch.bfloat16), randn(sum(lens_q1), 8, 128, dtype=torch.bfloat16)
    k, v = randn(sum(lens_k), 2, 128, dtype=torch.bfloat16), randn(sum(lens_k), 2, 128, dtype=torch.bfloat16)
    ends0 = torch.tensor([600, 400, 2050], dtype=torch.int32, device=DEVICE)
    ends1 = torch.tensor([1200, 400, 4100], dtype=torch.int32, device=DEVICE)
    args = (q0, q1, k, v, cu_of(lens_q0), cu_of(lens_q1), cu_of(lens_k), 1000, 1000, 4100, ends0, ends1)
    with poison_empty:
        plain = fused_forward(*args, config=DualGroupFwdConfig(128, 64, 8, 3))
        tma = fused_forward(*args, config=DualGroupFwdConfig(128, 64, 8, 3, tma=True))
    for a, b in zip(plain, tma):
        assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [True, False])
def test_one_group_per_program(causal):
    """config.one_group (a program per group's M-block, one softmax state) matches the reference
    on empty sequences, rows that see nothing, GQA and a group longer than the other."""
    from kvonce.kernels.configs import DualGroupFwdConfig, get_dual_group_fwd_config

    base = get_dual_group_fwd_config(torch.cuda.get_device_capability() if HAS_CUDA else None, 64)
    config = DualGroupFwdConfig(base.block_m, base.block_n, base.num_warps, base.num_stages,
                                one_group=True)
    lens_q0, lens_q1, lens_k = [0, 12, 50, 7], [5, 0, 70, 7], [30, 0, 90, 0]
    dt = DTYPES[0]
    q0, q1 = randn(sum(lens_q0), 4, 64, dtype=dt), randn(sum(lens_q1), 4, 64, dtype=dt)
    k, v = randn(sum(lens_k), 2, 64, dtype=dt), randn(sum(lens_k), 2, 64, dtype=dt)
    kv0 = torch.tensor([10, 5, 40, 3], dtype=torch.int32, device=DEVICE)
    cu0, cu1, cuk = cu_of(lens_q0), cu_of(lens_q1), cu_of(lens_k)
    with poison_empty:
        out = fused_forward(q0, q1, k, v, cu0, cu1, cuk, 50, 70, 90, kv0, 90, causal=causal,
                            config=config)
    ref = dual_group_attention_ref(q0, q1, k, v, cu0, cu1, cuk, kv0, 90, causal=causal)
    for name, o, r in zip(("out0", "out1", "lse0", "lse1"), out, ref):
        assert_close(name, o, r, lse=name.startswith("lse"))


def _replacement_args(global_lens, world, rank, heads, heads_k, hd, dtype):
    """Global Q/K/V, ``local_of``, the rank's LOCAL cu_seqlens and the arguments of
    ``replace_execute_grouped_attention_with_fused_varlen`` (chunk indices included, causal)."""
    Q, K, V, local_of, kv_buffer = zigzag_rank_inputs(global_lens, world, rank, heads, heads_k, hd, dtype)
    cu_local = cu_of([n // world for n in global_lens])
    chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(local_of(Q, rank), cu_local, world, rank)
    c0, c1 = rank, 2 * world - 1 - rank
    slices = compute_kv_slices_for_groups(cu_local, c0, c1, world, chunk_cu)
    args = (chunk_q, chunk_cu, chunk_idx, kv_buffer, slices, heads, hd, None, 0.0, True, (-1, -1),
            None, False, world, cu_local, c0, c1)
    return Q, K, V, local_of, cu_local, args


@pytest.mark.parametrize("world,rank", [(2, 0), (4, 3)])
def test_one_group_per_program_zigzag_local_order(world, rank):
    """The zigzag replacement (local-order outputs, KV read from the gathered buffer) with
    config.one_group equals the default config's result."""
    from kvonce.kernels.configs import DualGroupFwdConfig, get_dual_group_fwd_config

    base = get_dual_group_fwd_config(torch.cuda.get_device_capability() if HAS_CUDA else None, 64)
    config = DualGroupFwdConfig(base.block_m, base.block_n, base.num_warps, base.num_stages,
                                one_group=True)
    dtype = DTYPES[0]
    global_lens = [2 * world * c for c in (5, 33, 0, 17)]
    heads, heads_k, hd = 4, 2, 64
    Q, K, V, local_of, cu_local, args = _replacement_args(global_lens, world, rank, heads, heads_k,
                                                         hd, dtype)
    with poison_empty:
        out, lse, _ = replace_execute_grouped_attention_with_fused_varlen(*args, config=config)
    ref_o, ref_lse = varlen_attention_ref(Q, K, V, cu_of(global_lens), cu_of(global_lens))
    assert_close("out vs global", out, local_of(ref_o, rank))
    assert_close("lse vs global", lse, local_of(ref_lse.t(), rank).t(), lse=True)



@pytest.mark.parametrize("world,rank", [(4, 0), (4, 3), (8, 5)])
def test_tma_on_the_zigzag_buffer_matches_pointer_loads(world, rank, monkeypatch):
    """On the zigzag all-gather buffer, one group per program with config.tma takes TMA for the
    sequences whose chunk length is a multiple of the key tile (each tile inside one chunk) and
    ``off_grid_config`` (two groups per program, pointer loads) for the others: bit-identical,
    sequence by sequence, to those programs with pointer loads, and equal to global causal
    attention. Chunks on the tile grid, off it, and empty. On the CPU the interpreter runs the
    descriptors (``_tma_ok`` forced on; it asks for a CUDA device)."""
    import kvonce.kernels.dual_group_fwd as fwd
    from kvonce.kernels.configs import DualGroupFwdConfig

    if HAS_CUDA:
        if torch.cuda.get_device_capability()[0] < 9:
            pytest.skip("TMA needs compute capability 9.0")
        dtype, tile, chunks, heads, heads_k, hd = torch.bfloat16, (128, 128, 8, 3), (256, 100, 0, 128, 64, 257, 384), 8, 2, 128
    else:
        real = fwd._tma_ok
        monkeypatch.setattr(fwd, "_tma_ok", lambda config, k, v, *rest: (
            config.tma and config.one_group or real(config, k, v, *rest)))
        # 128-key tiles as on the GPU: the off-grid launch's 64-key tiles differ from the split's
        # tile, and chunk 64 (on the 64 grid, off the 128 one) must go to the off-grid launch.
        dtype, tile, chunks, heads, heads_k, hd = DTYPES[0], (16, 128, 4, 1), (128, 10, 0, 64, 33), 4, 2, 32
    global_lens = [2 * world * c for c in chunks]
    Q, K, V, local_of, cu_local, args = _replacement_args(global_lens, world, rank, heads, heads_k,
                                                         hd, dtype)
    config = DualGroupFwdConfig(*tile, tma=True, one_group=True)
    with poison_empty:
        on_grid = replace_execute_grouped_attention_with_fused_varlen(
            *args, config=DualGroupFwdConfig(*tile, one_group=True))[:2]
        off_grid = replace_execute_grouped_attention_with_fused_varlen(
            *args, config=fwd.off_grid_config(config))[:2]
        tma = replace_execute_grouped_attention_with_fused_varlen(*args, config=config)[:2]
    bounds = cu_local.tolist()
    for b, c in enumerate(chunks):
        rows = slice(bounds[b], bounds[b + 1])
        want = on_grid if c % config.block_n == 0 else off_grid
        assert torch.equal(tma[0][rows], want[0][rows]), f"out of sequence {b} (chunk {c})"
        assert torch.equal(tma[1][:, rows], want[1][:, rows]), f"lse of sequence {b} (chunk {c})"
    ref_o, ref_lse = varlen_attention_ref(Q, K, V, cu_of(global_lens), cu_of(global_lens))
    assert_close("out vs global", tma[0], local_of(ref_o, rank))
    assert_close("lse vs global", tma[1], local_of(ref_lse.t(), rank).t(), lse=True)
