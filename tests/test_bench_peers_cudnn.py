"""The cuDNN x2 peer of `bench zigzag` (kvonce/bench/peers_cudnn.py): its split of each group's
bottom-right causal range into a non-causal rectangle and a causal square, the LSE merge and the
per-part backward, with PyTorch math attention in float64 standing in for cuDNN (CPU), against
bottom-right references. Proves the peer's bookkeeping; cuDNN itself runs only on the GPU bench."""
import pytest
import torch

from kvonce.bench.peers_cudnn import CudnnX2, _reduce_heads, _rel
from kvonce.bench.zigzag import Case, _fused_args, dual_group_grads_f64, setup
from kvonce.reference import varlen_attention_ref


def _math_scores(q, k, causal, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:  # top-left, as cuDNN's is_causal
        lq, lk = s.shape[-2:]
        hidden = torch.ones(lq, lk, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(hidden, -torch.inf)
    return s


def math_attention(q, k, v, causal, scale):
    """Stand-in for ``cudnn_attention`` (same shapes and conventions): the output from PyTorch's
    math SDPA, the logsumexp from plain torch."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    ratio = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(ratio, 1), v.repeat_interleave(ratio, 1)
    with sdpa_kernel(SDPBackend.MATH):
        out = scaled_dot_product_attention(q, kk, vv, is_causal=causal, scale=scale)
    lse = torch.logsumexp(_math_scores(q, kk, causal, scale), dim=-1, keepdim=True)
    return out, lse, None


def math_attention_backward(dout, q, k, v, out, lse, aux, causal, scale):
    """Stand-in for ``cudnn_attention_backward``: the flash-style backward from ``out`` and
    ``lse`` (D = rowsum(dO o O), P = exp(S - lse), dS = P (dP - D))."""
    ratio = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(ratio, 1), v.repeat_interleave(ratio, 1)
    p = torch.exp(_math_scores(q, kk, causal, scale) - lse)
    dv = torch.matmul(p.transpose(-1, -2), dout)
    ds = p * (torch.matmul(dout, vv.transpose(-1, -2)) - (dout * out).sum(-1, keepdim=True))
    dq = torch.matmul(ds, kk) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale
    if ratio > 1:
        dk, dv = _reduce_heads(dk, k.shape[1]), _reduce_heads(dv, k.shape[1])
    return dq, dk, dv


CASES = [(world, lens, h, hk, rank, expand)
         for world, lens, h, hk in ((2, (16,), 4, 2), (4, (24, 8, 16), 4, 1), (2, (8, 12), 2, 2))
         for rank in range(world) for expand in (False, True)]


@pytest.mark.parametrize("world,lens,h,hk,rank,expand", CASES)
def test_split_merge_backward_match_float64(world, lens, h, hk, rank, expand):
    """Small zigzag cases (GQA and not, one and several sequences, every rank, native and expanded
    K/V): outputs and LSE against reference.varlen_attention_ref (bottom-right causal), gradients
    (summed and per part) against dual_group_grads_f64, all in float64."""
    case = Case("cpu", world, rank, lens, h, hk, 16)
    torch.manual_seed(rank)
    s = setup(case, torch.float64, device="cpu")
    scale = case.head_dim ** -0.5
    peer = CudnnX2(s, scale, attn=math_attention, attn_bwd=math_attention_backward,
                   expand_kv=expand)
    outs, saved = peer.forward()
    lses = peer.lse_tokens(saved)
    errs = {}
    for g in (0, 1):
        o_ref, l_ref = varlen_attention_ref(
            s["chunk_q"][g], s["k_groups"][g], s["v_groups"][g], s["chunk_cu"][g],
            s["slices"][g][1], softmax_scale=scale, causal=True, compute_dtype=torch.float64)
        errs[f"out{g}"], errs[f"lse{g}"] = _rel(outs[g], o_ref), _rel(lses[g], l_ref)
    douts = [torch.randn_like(q) for q in s["chunk_q"]]
    tensors, meta = _fused_args(case, s)
    ref = dual_group_grads_f64(*douts, *tensors, *meta[:3], *meta[6:], softmax_scale=scale)
    for name, a, b in zip(("dq0", "dq1", "dk", "dv"), peer.backward(douts, (outs, saved)), ref):
        errs[name] = _rel(a, b)
    parts = peer.backward(douts, (outs, saved), sum_dkv=False)
    errs["dq0 parts"], errs["dq1 parts"] = _rel(parts[0], ref[0]), _rel(parts[1], ref[1])
    assert max(errs.values()) < 1e-10, errs
