"""Backward of the fused dual-group varlen attention and of the zigzag replacement, against
float64 autograd through reference.py.

Gradients of ``fused_zigzag_llama3_flash_attn_varlen_func`` (autograd), of its functional
backward and of ``zigzag.fused_zigzag_backward`` are compared with float64 autograd through
``dual_group_attention_ref`` on the same inputs (upcast). The error metric is the relative norm
error, per sequence and over the whole tensor. fp32 inputs: a fixed bound (the kernel's fp32
rounding); fp16/bf16: a fixed bound and at most twice the larger error of two baselines: the same
gradients computed by PyTorch in the inputs' dtype (``compute_dtype=dtype``: flash-attn's
"upcast=False" reference), and float64 math with flash-attn's row term ``rowsum(dO * O)`` taken
from the output rounded to that dtype (the output the backward is given). Structural zeros (rows
that see no key, keys no row sees, rows of ``k`` past ``cu_seqlens_k[-1]``) must be exactly 0,
and every kvonce call runs under ``poison_empty`` (NaN-filled outputs).

CPU (Triton interpreter): tiny shapes, fp16/fp32. CUDA: the spec's shapes, fp16/bf16.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import DEVICE, DTYPES, HAS_CUDA, hypothesis_examples, poison_empty
from hypothesis import given, settings
from hypothesis import strategies as st

from kvonce import fused_zigzag_llama3_flash_attn_varlen_backward as fused_backward
from kvonce import fused_zigzag_llama3_flash_attn_varlen_forward as fused_forward
from kvonce import fused_zigzag_llama3_flash_attn_varlen_func as fused_func
from kvonce.kernels.configs import (get_dual_group_bwd_config, get_dual_group_fwd_config,
                                    interpreter_active)
from kvonce.reference import dual_group_attention_ref
from kvonce.zigzag import (fused_zigzag_backward,
                           replace_execute_grouped_attention_with_fused_varlen,
                           split_q_by_zigzag_chunk_index)

pytestmark = pytest.mark.skipif(not HAS_CUDA and not interpreter_active(),
                                reason="needs a CUDA GPU or TRITON_INTERPRET=1")
F64 = torch.float64
# fp32 inputs: the kernel's own fp32 rounding only (at most 5.3e-7 measured under the interpreter).
FP32_LIMIT = 1e-5
# fp16/bf16 inputs: a hard bound, and at most LOW_RATIO x the error of a careful low-precision
# computation (``low_precision_baselines``; + slack for segments where both sit at the rounding
# floor).
LOW_LIMIT = 2e-2
LOW_RATIO, LOW_SLACK = 2.0, 1e-4
# An fp32 -> bf16 cast: round to nearest (half an ulp, 2^-8 relative) on the GPU; the Triton 3.6
# interpreter truncates (a whole ulp, 2^-7).
BF16_CAST_RTOL = 2.0 ** -8 if HAS_CUDA else 2.0 ** -7


def cu_of(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=DEVICE)


def randn(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def cpu_gpu(cpu, gpu):
    return gpu if HAS_CUDA else cpu


def ends_of(kv, batch):
    return [int(x) for x in kv.tolist()] if torch.is_tensor(kv) else [kv] * batch


# ------------------------------------------------------------------------------ comparison helpers
def rel_errors(got, ref, baselines, cu):
    """Relative norm errors of ``got`` vs ``ref`` over the whole tensor and per sequence ``cu``
    slice along dim 0, with the largest error of the ``baselines`` (None: none) on the same slice:
    ``[(where, err, baseline_err)]``. A sequence's denominator is floored at a tenth of the
    tensor's norm scaled to its size (gradients that are ~0 in exact math, e.g. dq of a row that
    sees one key, would make a pure relative error meaningless)."""
    got, ref = got.double(), ref.double()
    baselines = [b.double() for b in baselines or ()]
    total = ref.norm().item()
    n = max(ref.numel(), 1)
    items = [("all", slice(None))]
    if cu is not None:
        cu = [int(x) for x in cu.tolist()]
        items += [(f"seq {b}", slice(cu[b], cu[b + 1])) for b in range(len(cu) - 1)
                  if cu[b + 1] > cu[b]]
    out = []
    for where, sl in items:
        r = ref[sl]
        denom = max(r.norm().item(), 0.1 * total * (r.numel() / n) ** 0.5, 1e-30)
        err = (got[sl] - r).norm().item() / denom
        base_err = max(((b[sl] - r).norm().item() / denom for b in baselines), default=None)
        out.append((where, err, base_err))
    return out


def check_grad(name, got, ref, *, in_dtype, baselines=None, cu=None, zero_rows=None):
    """``got`` vs the float64 ``ref``: no NaN, exact zeros on ``zero_rows`` (bool mask of dim 0),
    relative error within the bound for ``in_dtype`` and (low-precision inputs) at most
    ``LOW_RATIO`` x the larger error of the ``baselines`` (``low_precision_baselines``), for the
    tensor and each sequence."""
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    nan = torch.isnan(got)
    assert not nan.any(), (f"{name}: {int(nan.sum())} NaN of {got.numel()} (rows "
                           f"{nan.flatten(1).any(1).nonzero().flatten()[:10].tolist()}...)")
    if zero_rows is not None and zero_rows.any():
        bad = got[zero_rows] != 0
        assert not bad.any(), (f"{name}: {int(bad.sum())} entries nonzero in rows that must be "
                               f"exactly 0, max |x| = {got[zero_rows].abs().max().item():.3e}")
    if ref.numel() == 0 or ref.norm() == 0:
        # All zero in exact math but not structurally (say dq of rows that see one key each):
        # rounding only, far below the O(1) values of a wrong gradient.
        worst = got.abs().max().item() if got.numel() else 0.0
        assert worst < 1e-3, f"{name}: reference is all zero, got max |x| = {worst:.3e}"
        return
    for where, err, base_err in rel_errors(got, ref, baselines, cu):
        if in_dtype == torch.float32:
            assert err < FP32_LIMIT, f"{name} ({where}): relative error {err:.3e} >= {FP32_LIMIT}"
            continue
        assert err < LOW_LIMIT, f"{name} ({where}): relative error {err:.3e} >= {LOW_LIMIT}"
        if base_err is not None:
            assert err <= LOW_RATIO * base_err + LOW_SLACK, (
                f"{name} ({where}): relative error {err:.3e} > {LOW_RATIO} x the "
                f"{str(in_dtype).replace('torch.', '')} baseline error {base_err:.3e}")


def _grads(outs, leaves, douts):
    """autograd.grad of ``outs`` wrt ``leaves`` (zeros for leaves nothing depends on)."""
    pairs = [(o, d) for o, d in zip(outs, douts) if o.requires_grad]
    if not pairs:
        return [torch.zeros_like(x) for x in leaves]
    grads = torch.autograd.grad([o for o, _ in pairs], leaves, [d for _, d in pairs],
                                allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)]


def _fa_style_grads(leaves, outs, lses, douts, dtype):
    """Float64 gradients as flash-attn's backward forms them from a ``dtype`` output: the row term
    ``delta = rowsum(dO * O)`` taken from ``O`` rounded to ``dtype`` (the output the backward is
    given), everything else exact, the result rounded to ``dtype``. Since d lse / d s = P, the
    changed ``dS = P (dP - delta_hat)`` is the gradient of ``sum(out * dO) + sum(c * lse)`` with
    ``c = delta - delta_hat`` held constant."""
    terms, grads_out = list(outs), list(douts)
    for out, lse, dout in zip(outs, lses, douts):
        o = out.detach()
        c = ((o - o.to(dtype).to(o.dtype)) * dout).sum(-1).t()  # [nheads, total_q]
        terms.append((torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)) * c).sum())
        grads_out.append(torch.ones((), dtype=o.dtype, device=o.device))
    return [g.to(dtype) for g in _grads(terms, leaves, grads_out)]


def ref_grads(q0, q1, k, v, cu0, cu1, cuk, kv0, kv1, dout0, dout1, *, compute_dtype, causal=True,
              softmax_scale=None, fa_style_dtype=None):
    """``(outs, grads)``: outputs and ``[dq0, dq1, dk, dv]`` of ``dual_group_attention_ref`` in
    ``compute_dtype`` (inputs cast to it). With ``fa_style_dtype``, ``grads`` are instead
    ``_fa_style_grads`` for an output in that dtype."""
    leaves = [t.detach().to(compute_dtype).requires_grad_() for t in (q0, q1, k, v)]
    outs = dual_group_attention_ref(*leaves, cu0, cu1, cuk, kv0, kv1, softmax_scale=softmax_scale,
                                    causal=causal, compute_dtype=compute_dtype)
    douts = (dout0.to(compute_dtype), dout1.to(compute_dtype))
    if fa_style_dtype is not None:
        grads = _fa_style_grads(leaves, outs[:2], outs[2:], douts, fa_style_dtype)
    else:
        grads = _grads(outs[:2], leaves, douts)
    return [o.detach() for o in outs], grads


def low_precision_baselines(*args, dtype, **kw):
    """Per gradient, the errors a careful low-precision computation makes, as ``[dq0, dq1, dk,
    dv]`` lists of candidate tensors (None for fp32 inputs): PyTorch's own math in ``dtype``
    (flash-attn's "upcast=False" reference) and flash-attn's formula fed a ``dtype`` output."""
    if dtype == torch.float32:
        return [None] * 4
    _, low = ref_grads(*args, compute_dtype=dtype, **kw)
    _, fa = ref_grads(*args, compute_dtype=F64, fa_style_dtype=dtype, **kw)
    return [[a, b] for a, b in zip(low, fa)]


def func_args(q0, q1, k, v, lens_q0, lens_q1, lens_k, kv0, kv1):
    return (q0, q1, k, v, cu_of(lens_q0), cu_of(lens_q1), cu_of(lens_k), max(lens_q0, default=0),
            max(lens_q1, default=0), max(lens_k, default=0), kv0, kv1)


def unseen_keys(lens_q0, lens_q1, lens_k, kv0, kv1, rows):
    """Bool ``[rows]``: rows of k/v that no query row sees (including rows past cu_k[-1]). With or
    without causal, group g of sequence b sees exactly its first ``min(kv_g, len_k)`` keys when it
    has a row (its last row sees them all)."""
    seen = torch.zeros(rows, dtype=torch.bool, device=DEVICE)
    cuk = [int(x) for x in cu_of(lens_k).tolist()]
    for lens_q, kv in ((lens_q0, kv0), (lens_q1, kv1)):
        for b, end in enumerate(ends_of(kv, len(lens_k))):
            if lens_q[b] > 0:
                seen[cuk[b]: cuk[b] + max(0, min(end, lens_k[b]))] = True
    return ~seen


def check_dual_group_grads(q0, q1, k, v, lens_q0, lens_q1, lens_k, kv0, kv1, *, causal=True,
                           softmax_scale=None, dout0=None, dout1=None, leaves=None,
                           grads_of=None):
    """Gradients of ``fused_func`` (``.backward`` with a random dout) vs float64 autograd through
    the reference on the same inputs. ``leaves``/``grads_of`` let a caller take q/k/v as views of
    other leaves (``grads_of(leaf_grads) -> [dq0, dq1, dk, dv]``). Returns our gradients."""
    dtype = q0.dtype
    args = func_args(q0, q1, k, v, lens_q0, lens_q1, lens_k, kv0, kv1)
    cu0, cu1, cuk = args[4:7]
    if dout0 is None:
        dout0, dout1 = randn(*q0.shape, dtype=dtype), randn(*q1.shape, dtype=dtype)
    ref_outs, ref = ref_grads(q0, q1, k, v, cu0, cu1, cuk, kv0, kv1, dout0, dout1,
                              compute_dtype=F64, causal=causal, softmax_scale=softmax_scale)
    base = low_precision_baselines(q0, q1, k, v, cu0, cu1, cuk, kv0, kv1, dout0, dout1,
                                   dtype=dtype, causal=causal, softmax_scale=softmax_scale)
    if leaves is None:
        leaves = [t.detach().clone().requires_grad_() for t in (q0, q1, k, v)]
        inputs = leaves
    else:
        inputs = (q0, q1, k, v)
    for t in leaves:
        t.grad = None
    with poison_empty:
        out0, out1 = fused_func(*inputs, *args[4:], softmax_scale=softmax_scale, causal=causal)
        torch.autograd.backward([out0, out1], [dout0, dout1])
    assert out0.dtype == dtype and out1.dtype == dtype
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]
    if grads_of is not None:
        grads = grads_of(grads)
    for name, o, r in (("out0", out0, ref_outs[0]), ("out1", out1, ref_outs[1])):
        check_grad(name, o.detach(), r, in_dtype=dtype)
    zero_q = [torch.isinf(ref_outs[2]).all(0), torch.isinf(ref_outs[3]).all(0)]
    zero_k = unseen_keys(lens_q0, lens_q1, lens_k, kv0, kv1, k.shape[0])
    for i, (name, cu, zero) in enumerate((("dq0", cu0, zero_q[0]), ("dq1", cu1, zero_q[1]),
                                          ("dk", cuk, zero_k), ("dv", cuk, zero_k))):
        assert grads[i].dtype == dtype, f"{name}: dtype {grads[i].dtype}, expected {dtype}"
        check_grad(name, grads[i], ref[i], in_dtype=dtype, baselines=base[i], cu=cu,
                   zero_rows=zero)
    return grads


# ------------------------------------------------------------------------------ autograd vs float64
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_lens_as_tensor", [False, True])
def test_multi_sequence_grads(dtype, kv_lens_as_tensor):
    """The forward tests' multi-sequence case (CPU: lengths / 10): q0 30/80/50, q1 70/120/90,
    k 400/800/600, max_kv_len 100 and 800 (per sequence: 800/700/600)."""
    s = cpu_gpu(10, 1)
    lens_q0, lens_q1, lens_k = [30 // s, 80 // s, 50 // s], [70 // s, 120 // s, 90 // s], \
        [400 // s, 800 // s, 600 // s]
    heads, heads_k, hd = cpu_gpu((2, 1, 64), (32, 8, 128))
    q0, q1 = (randn(sum(lens), heads, hd, dtype=dtype) for lens in (lens_q0, lens_q1))
    k, v = (randn(sum(lens_k), heads_k, hd, dtype=dtype) for _ in range(2))
    kv0, kv1 = 100 // s, 800 // s
    if kv_lens_as_tensor:
        kv0 = torch.full((3,), 100 // s, dtype=torch.int32, device=DEVICE)
        kv1 = torch.tensor([800 // s, 700 // s, 600 // s], dtype=torch.int32, device=DEVICE)
    check_dual_group_grads(q0, q1, k, v, lens_q0, lens_q1, lens_k, kv0, kv1)


@pytest.mark.parametrize("heads,heads_k", [(2, 2), (4, 2), (4, 1), (8, 1)])
def test_gqa_grads(heads, heads_k):
    """GQA ratios 1, 2, 4, 8: dk/dv sum over the q heads of a group."""
    lens_q0, lens_q1, lens_k = cpu_gpu(([17, 40], [33, 9], [70, 100]),
                                       ([170, 400], [330, 90], [700, 1000]))
    scale = cpu_gpu(1, 4)
    hd = cpu_gpu(32, 128)
    dt = DTYPES[0]
    q0, q1 = (randn(sum(lens), heads * scale, hd, dtype=dt) for lens in (lens_q0, lens_q1))
    k, v = (randn(sum(lens_k), heads_k * scale, hd, dtype=dt) for _ in range(2))
    check_dual_group_grads(q0, q1, k, v, lens_q0, lens_q1, lens_k, 45 * cpu_gpu(1, 10), 1000)


HEAD_DIMS = cpu_gpu((32, 64, 96, 128), (32, 64, 96, 128, 256))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_head_dims_grads(head_dim, dtype):
    lens_q0, lens_q1, lens_k = cpu_gpu(([5, 20], [20, 9], [30, 45]),
                                       ([130, 370], [370, 200], [500, 770]))
    heads, heads_k = cpu_gpu((2, 1), (16, 4))
    q0, q1 = (randn(sum(lens), heads, head_dim, dtype=dtype) for lens in (lens_q0, lens_q1))
    k, v = (randn(sum(lens_k), heads_k, head_dim, dtype=dtype) for _ in range(2))
    check_dual_group_grads(q0, q1, k, v, lens_q0, lens_q1, lens_k, cpu_gpu(20, 300), 10_000)


@pytest.mark.parametrize("causal", [True, False])
def test_causal_and_not_grads(causal):
    """Non-default softmax_scale, a one-row sequence, max_kv_len past the sequence length."""
    lens_q0, lens_q1, lens_k = cpu_gpu(([20, 1], [3, 33], [45, 40]),
                                       ([400, 1], [3, 640], [900, 650]))
    heads, heads_k, hd = cpu_gpu((2, 2, 64), (8, 8, 128))
    dt = DTYPES[0]
    q0, q1 = randn(sum(lens_q0), heads, hd, dtype=dt), randn(sum(lens_q1), heads, hd, dtype=dt)
    k, v = (randn(sum(lens_k), heads_k, hd, dtype=dt) for _ in range(2))
    check_dual_group_grads(q0, q1, k, v, lens_q0, lens_q1, lens_k, cpu_gpu(30, 600), 1000,
                           causal=causal, softmax_scale=0.3)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_sequences_unseen_rows_and_extra_key_rows(causal, dtype):
    """Zero-length q0/q1/k sequences, a group with max_kv_len 0, causal rows above the diagonal
    (more rows than visible keys), max_kv_len past the length, and 7 rows of k/v past
    cu_seqlens_k[-1]: dq of rows that see nothing, dk/dv of keys nobody sees and of the extra
    rows are exactly 0 (never NaN)."""
    lens_q0, lens_q1, lens_k = [0, 12, 50, 7], [5, 0, 40, 7], [30, 0, 20, 0]
    q0, q1 = randn(sum(lens_q0), 2, 32, dtype=dtype), randn(sum(lens_q1), 2, 32, dtype=dtype)
    k, v = (randn(sum(lens_k) + 7, 2, 32, dtype=dtype) for _ in range(2))
    kv0 = torch.tensor([10, 5, 0, 3], dtype=torch.int32, device=DEVICE)
    dq0, dq1, dk, dv = check_dual_group_grads(q0, q1, k, v, lens_q0, lens_q1, lens_k, kv0, 25,
                                              causal=causal)
    assert torch.all(dq0[12:62] == 0), "dq0 of sequence 2 (max_kv_len 0) must be exactly 0"
    if causal:  # group 1 of sequence 2: 40 rows, 20 keys -> its first 20 rows see nothing
        assert torch.all(dq1[5:25] == 0)
    assert torch.all(dk[50:] == 0) and torch.all(dv[50:] == 0), "rows past cu_seqlens_k[-1]"
    assert torch.all(dk[25:30] == 0), "keys 25..29 of sequence 0: group 0 sees 10, group 1 25"


def test_all_rows_see_nothing():
    """Every group sees no key (max_kv_len 0): all gradients exactly 0."""
    dt = DTYPES[0]
    q0, q1 = randn(9, 2, 32, dtype=dt), randn(4, 2, 32, dtype=dt)
    k, v = (randn(20, 1, 32, dtype=dt) for _ in range(2))
    grads = check_dual_group_grads(q0, q1, k, v, [9], [4], [20], 0, 0)
    assert all(torch.all(g == 0) for g in grads)


def test_strided_inputs_and_dout():
    """k/v as views of a packed kv buffer (token stride 2 * nheads_k * d), q with strided heads,
    and douts whose strides differ from out's (head-major transposed back; a slice of a wider
    tensor): gradients land in the packed leaves."""
    lens_q, lens_k = cpu_gpu(([20, 45], [60, 90]), ([200, 450], [600, 900]))
    heads, heads_k, hd = cpu_gpu((2, 1, 64), (8, 2, 128))
    dt = DTYPES[0]
    kv = randn(sum(lens_k), 2, heads_k, hd, dtype=dt).requires_grad_()
    qq = randn(sum(lens_q), 2 * heads, hd, dtype=dt).requires_grad_()
    q1_leaf = randn(sum(lens_q), heads, hd, dtype=dt).requires_grad_()
    q0, q1, k, v = qq[:, ::2], q1_leaf, kv[:, 0], kv[:, 1]
    dout0 = randn(heads, sum(lens_q), hd, dtype=dt).transpose(0, 1)  # strides (hd, total*hd, 1)
    dout1 = randn(sum(lens_q), heads, 2 * hd, dtype=dt)[..., hd:]  # a slice of a wider tensor
    assert dout0.stride() != (heads * hd, hd, 1) and dout1.stride() != (heads * hd, hd, 1)

    def grads_of(g):
        dqq, dq1, dkv = g
        assert torch.all(dqq[:, 1::2] == 0), "gradient leaked into the q heads not used"
        return [dqq[:, ::2], dq1, dkv[:, 0], dkv[:, 1]]

    check_dual_group_grads(q0, q1, k, v, lens_q, lens_q, lens_k, cpu_gpu(30, 300), 1000,
                           dout0=dout0, dout1=dout1, leaves=[qq, q1_leaf, kv], grads_of=grads_of)


def test_grads_of_some_inputs_only():
    """Only q1 and v require grad: those gradients equal the ones of the full call."""
    lens_q0, lens_q1, lens_k = [17, 20], [13, 9], [40, 33]
    dt = DTYPES[0]
    q0, q1 = randn(sum(lens_q0), 2, 32, dtype=dt), randn(sum(lens_q1), 2, 32, dtype=dt)
    k, v = (randn(sum(lens_k), 1, 32, dtype=dt) for _ in range(2))
    dout0, dout1 = randn(*q0.shape, dtype=dt), randn(*q1.shape, dtype=dt)
    full = check_dual_group_grads(q0, q1, k, v, lens_q0, lens_q1, lens_k, 20, 40, dout0=dout0,
                                  dout1=dout1)
    q1_ = q1.clone().requires_grad_()
    v_ = v.clone().requires_grad_()
    with poison_empty:
        out0, out1 = fused_func(q0, q1_, k, v_, *func_args(q0, q1, k, v, lens_q0, lens_q1, lens_k,
                                                            20, 40)[4:])
        torch.autograd.backward([out0, out1], [dout0, dout1])
    torch.testing.assert_close(q1_.grad, full[1], atol=0, rtol=0)
    torch.testing.assert_close(v_.grad, full[3], atol=0, rtol=0)


@settings(max_examples=hypothesis_examples(4, 25), deadline=None)
@given(data=st.data())
def test_random_varlen_grads(data):
    batch = data.draw(st.integers(1, 3), label="batch")
    n = cpu_gpu(40, 400)
    lens_q0 = data.draw(st.lists(st.integers(0, n), min_size=batch, max_size=batch), label="q0")
    lens_q1 = data.draw(st.lists(st.integers(0, n), min_size=batch, max_size=batch), label="q1")
    lens_k = data.draw(st.lists(st.integers(0, 2 * n), min_size=batch, max_size=batch), label="k")
    kv0 = data.draw(st.lists(st.integers(0, 2 * n + 10), min_size=batch, max_size=batch),
                    label="kv0")
    kv1 = data.draw(st.integers(0, 2 * n + 10), label="kv1")
    causal = data.draw(st.booleans(), label="causal")
    heads_k = data.draw(st.sampled_from([1, 2]), label="heads_k")
    scale = data.draw(st.sampled_from([None, 0.05, 0.5]), label="softmax_scale")
    dt = DTYPES[0]
    q0, q1 = randn(sum(lens_q0), 2, 64, dtype=dt), randn(sum(lens_q1), 2, 64, dtype=dt)
    k, v = (randn(sum(lens_k), heads_k, 64, dtype=dt) for _ in range(2))
    check_dual_group_grads(q0, q1, k, v, lens_q0, lens_q1, lens_k,
                           torch.tensor(kv0, dtype=torch.int32, device=DEVICE), kv1, causal=causal,
                           softmax_scale=scale)


# ------------------------------------------------------------------------------ functional backward
def _small_case(dtype, heads=2, heads_k=1, hd=32):
    lens_q0, lens_q1, lens_k = cpu_gpu(([9, 30], [20, 14], [50, 41]),
                                       ([900, 300], [200, 1400], [5000, 4100]))
    q0, q1 = (randn(sum(lens), heads, hd, dtype=dtype) for lens in (lens_q0, lens_q1))
    k, v = (randn(sum(lens_k) + 3, heads_k, hd, dtype=dtype) for _ in range(2))
    kv0 = torch.tensor(cpu_gpu([12, 41], [1200, 4100]), dtype=torch.int32, device=DEVICE)
    return func_args(q0, q1, k, v, lens_q0, lens_q1, lens_k, kv0, cpu_gpu(50, 5000))


@pytest.mark.parametrize("dtype", DTYPES)
def test_return_lse(dtype):
    """return_lse gives the forward's (out0, out1, lse0, lse1); lse float32, not differentiable."""
    args = _small_case(dtype)
    leaves = [t.clone().requires_grad_() for t in args[:4]]
    with poison_empty:
        out0, out1, lse0, lse1 = fused_func(*leaves, *args[4:], return_lse=True)
        fwd = fused_forward(*args)
    for name, got, want in zip(("out0", "out1", "lse0", "lse1"), (out0, out1, lse0, lse1), fwd):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        torch.testing.assert_close(got.detach(), want, atol=0, rtol=0, equal_nan=False,
                                   msg=lambda m: f"{name}: {m}")
    assert lse0.dtype == torch.float32 and not lse0.requires_grad and not lse1.requires_grad
    assert out0.requires_grad and out1.requires_grad
    assert len(fused_func(*args)) == 2


def _same(name, got, want):
    """Same kernels on the same inputs: exact under the interpreter; on the GPU a float32 atomic
    accumulation may order its adds differently, so allow the dtype's default tolerance."""
    assert not torch.isnan(got).any(), f"{name}: NaN"
    tol = dict(atol=0, rtol=0) if not HAS_CUDA else {}
    torch.testing.assert_close(got, want, msg=lambda m: f"{name}: {m}", **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_functional_backward_matches_autograd(dtype):
    args = _small_case(dtype)
    q0, q1, k, v = args[:4]
    leaves = [t.clone().requires_grad_() for t in args[:4]]
    dout0, dout1 = randn(*q0.shape, dtype=dtype), randn(*q1.shape, dtype=dtype)
    with poison_empty:
        out0, out1, lse0, lse1 = fused_func(*leaves, *args[4:], return_lse=True)
        torch.autograd.backward([out0, out1], [dout0, dout1])
        dq0, dq1, dk, dv = fused_backward(dout0, dout1, q0, q1, k, v, out0.detach(),
                                          out1.detach(), lse0, lse1, *args[4:])
    assert dq0.dtype == dtype and dq1.dtype == dtype
    assert dk.dtype == torch.float32 and dv.dtype == torch.float32, "dkv_dtype defaults to float32"
    assert dk.shape == k.shape and dv.shape == v.shape and dq0.shape == q0.shape
    for name, got, leaf in (("dq0", dq0, leaves[0]), ("dq1", dq1, leaves[1]),
                            ("dk", dk.to(dtype), leaves[2]), ("dv", dv.to(dtype), leaves[3])):
        _same(name, got, leaf.grad)
    # And the float32 dk/dv against float64.
    cu0, cu1, cuk, kv0, kv1 = args[4], args[5], args[6], args[10], args[11]
    _, ref = ref_grads(q0, q1, k, v, cu0, cu1, cuk, kv0, kv1, dout0, dout1, compute_dtype=F64)
    base = low_precision_baselines(q0, q1, k, v, cu0, cu1, cuk, kv0, kv1, dout0, dout1, dtype=dtype)
    for name, got, r, b in (("dk fp32", dk, ref[2], base[2]), ("dv fp32", dv, ref[3], base[3])):
        check_grad(name, got, r, in_dtype=dtype, baselines=b, cu=cuk)
    assert torch.all(dk[-3:] == 0) and torch.all(dv[-3:] == 0), "rows past cu_seqlens_k[-1]"


@pytest.mark.parametrize("dkv_dtype", [torch.float16, torch.bfloat16])
def test_functional_backward_dkv_dtype(dkv_dtype):
    """dkv_dtype=float16/bfloat16 returns dk/dv in it: the float32 accumulation rounded once
    (within one ulp of the float32 result); on the GPU, at least as accurate vs float64."""
    dtype = DTYPES[0]
    args = _small_case(dtype)
    q0, q1, k, v = args[:4]
    dout0, dout1 = randn(*q0.shape, dtype=dtype), randn(*q1.shape, dtype=dtype)
    with poison_empty:
        out0, out1, lse0, lse1 = fused_func(*args, return_lse=True)
        bwd = lambda **kw: fused_backward(dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1,
                                          *args[4:], **kw)
        dq0_32, dq1_32, dk32, dv32 = bwd(dkv_dtype=torch.float32)
        dq0, dq1, dk, dv = bwd(dkv_dtype=dkv_dtype)
    assert dk.dtype == dkv_dtype and dv.dtype == dkv_dtype
    assert dq0.dtype == dtype and dq1.dtype == dtype
    _same("dq0", dq0, dq0_32)
    _same("dq1", dq1, dq1_32)
    ulp = BF16_CAST_RTOL if dkv_dtype == torch.bfloat16 else 2.0 ** -11
    for name, low, full in (("dk", dk, dk32), ("dv", dv, dv32)):
        assert not torch.isnan(low).any(), f"{name}: NaN"
        torch.testing.assert_close(low.float(), full, atol=1e-6, rtol=ulp,
                                   msg=lambda m: f"{name} {dkv_dtype} vs float32: {m}")
    if HAS_CUDA:
        cu0, cu1, cuk, kv0, kv1 = args[4], args[5], args[6], args[10], args[11]
        _, ref = ref_grads(q0, q1, k, v, cu0, cu1, cuk, kv0, kv1, dout0, dout1, compute_dtype=F64)
        for name, low, full, r in (("dk", dk, dk32, ref[2]), ("dv", dv, dv32, ref[3])):
            e32 = rel_errors(full, r, None, None)[0][1]
            elow = rel_errors(low, r, None, None)[0][1]
            assert e32 <= elow, (f"{name}: float32 dkv error {e32:.3e} > {dkv_dtype} error "
                                 f"{elow:.3e}")


@pytest.mark.parametrize("atomic_dq,int64_kv_offsets,dq_one_group,gluon",
                         [(False, False, False, False), (True, False, False, False),
                          (False, True, False, False), (False, False, True, False),
                          (True, False, True, False), (False, False, False, True)])
def test_functional_backward_config_variants(atomic_dq, int64_kv_offsets, dq_one_group, gluon,
                                             monkeypatch):
    """dQ from the dQ kernel (both groups per program, or one) or from fp32 atomics in the dK/dV
    kernel, int32 or int64 K/V offsets, the Hopper Gluon kernel (``gluon``: on an sm90 GPU; the
    two Triton kernels elsewhere): every variant matches float64 (and the structural zeros
    hold)."""
    dtype = DTYPES[0]
    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    # the Gluon kernel covers head dims 64 and 128 (GQA 2 here); elsewhere the Triton kernels run
    args = _small_case(dtype, heads=4, heads_k=2, hd=cpu_gpu(32, 128)) if gluon else \
        _small_case(dtype)
    q0, q1, k, v = args[:4]
    cu0, cu1, cuk, kv0, kv1 = args[4], args[5], args[6], args[10], args[11]
    gluon_calls = []
    if gluon and cap is not None and cap[0] == 9:
        from kvonce.kernels import gluon_bwd

        real = gluon_bwd.launch_gluon_bwd
        monkeypatch.setattr(gluon_bwd, "launch_gluon_bwd",
                            lambda *a, **kw: gluon_calls.append(1) or real(*a, **kw))
    cfg = dataclasses.replace(get_dual_group_bwd_config(cap, q0.shape[2]), atomic_dq=atomic_dq,
                              int64_kv_offsets=int64_kv_offsets, dq_one_group=dq_one_group,
                              gluon=gluon)
    dout0, dout1 = randn(*q0.shape, dtype=dtype), randn(*q1.shape, dtype=dtype)
    with poison_empty:
        out0, out1, lse0, lse1 = fused_forward(*args)
        grads = fused_backward(dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1, *args[4:],
                               config=cfg)
    ref_outs, ref = ref_grads(q0, q1, k, v, cu0, cu1, cuk, kv0, kv1, dout0, dout1,
                              compute_dtype=F64)
    base = low_precision_baselines(q0, q1, k, v, cu0, cu1, cuk, kv0, kv1, dout0, dout1, dtype=dtype)
    zero_k = unseen_keys([int(x) for x in (cu0[1:] - cu0[:-1]).tolist()],
                         [int(x) for x in (cu1[1:] - cu1[:-1]).tolist()],
                         [int(x) for x in (cuk[1:] - cuk[:-1]).tolist()], kv0, kv1, k.shape[0])
    zero_q = [torch.isinf(ref_outs[2]).all(0), torch.isinf(ref_outs[3]).all(0), zero_k, zero_k]
    for i, (name, cu) in enumerate((("dq0", cu0), ("dq1", cu1), ("dk", cuk), ("dv", cuk))):
        check_grad(name, grads[i], ref[i], in_dtype=dtype, baselines=base[i], cu=cu,
                   zero_rows=zero_q[i])
    if gluon and cap is not None and cap[0] == 9:
        assert gluon_calls == [1], "the Gluon backward did not run on this sm90 GPU"


# ------------------------------------------------------------------------------ zigzag twin
def zigzag_rank_inputs(global_lens, world, rank, heads, heads_k, hd, dtype):
    """Global q/k/v, the rank's local q and the all-gathered zigzag K/V buffer (as the forward
    tests build them)."""
    total = sum(global_lens)
    Q, K, V = (randn(total, h, hd, dtype=dtype) for h in (heads, heads_k, heads_k))

    def local_of(x, r):
        parts, off = [], 0
        for n in global_lens:
            c = n // (2 * world)
            late = 2 * world - 1 - r
            parts += [x[off + r * c: off + (r + 1) * c], x[off + late * c: off + (late + 1) * c]]
            off += n
        return torch.cat(parts)

    kv_buffer = torch.stack([torch.cat([local_of(K, r) for r in range(world)]),
                             torch.cat([local_of(V, r) for r in range(world)])])
    return Q, K, V, local_of, kv_buffer


def zigzag_ref_grads(Q, K, V, global_lens, world, rank, dout_local, local_of, compute_dtype, *,
                     softmax_scale=None, fa_style_dtype=None):
    """Autograd of global causal attention in ``compute_dtype`` with dout nonzero only on rank
    ``rank``'s rows: ``dq`` in local order and ``dkv`` in the gathered buffer layout
    (``_fa_style_grads`` with ``fa_style_dtype``).

    Only the rank's own query rows are computed (the others' dout is 0, so they add nothing):
    chunk ``i`` of sequence ``b`` (global rows ``[i c_b, (i + 1) c_b)``) against the sequence's
    first ``(i + 1) c_b`` keys, causal (the GPU's 16k-token sequences would need 16k x 16k
    scores per head)."""
    total = sum(global_lens)
    chunks = [n // (2 * world) for n in global_lens]
    groups = (rank, 2 * world - 1 - rank)
    idx, off = ([], []), 0
    for n, c in zip(global_lens, chunks):
        for g, i in enumerate(groups):
            idx[g].append(torch.arange(off + i * c, off + (i + 1) * c, device=DEVICE))
        off += n
    idx = [torch.cat(x) for x in idx]
    rows = local_of(torch.arange(total, device=DEVICE), rank)  # global row of each local row
    dout_global = torch.zeros((total, *dout_local.shape[1:]), dtype=compute_dtype, device=DEVICE)
    dout_global[rows] = dout_local.to(compute_dtype)
    leaves = [t.detach().to(compute_dtype).requires_grad_() for t in (Q, K, V)]
    cu_g = cu_of(chunks)
    ends = [torch.tensor([(i + 1) * c for c in chunks], dtype=torch.int32, device=DEVICE)
            for i in groups]
    outs = dual_group_attention_ref(leaves[0][idx[0]], leaves[0][idx[1]], leaves[1], leaves[2],
                                    cu_g, cu_g, cu_of(global_lens), *ends, causal=True,
                                    softmax_scale=softmax_scale, compute_dtype=compute_dtype)
    douts = [dout_global[idx[0]], dout_global[idx[1]]]
    if fa_style_dtype is not None:
        dQ, dK, dV = _fa_style_grads(leaves, outs[:2], outs[2:], douts, fa_style_dtype)
    else:
        dQ, dK, dV = _grads(outs[:2], leaves, douts)
    dkv = torch.stack([torch.cat([local_of(dK, r) for r in range(world)]),
                       torch.cat([local_of(dV, r) for r in range(world)])])
    return dQ[rows], dkv


ZIGZAG_VARIANTS = ("default", "max_seqlen_q", "atomic_dq", "softmax_scale", "dq_one_group")
# CPU time: all variants on world 4, the default elsewhere; the GPU runs every rank. DTYPES[0]
# throughout, the other dtype on a few cases.
ZIGZAG_CASES = cpu_gpu(
    [(1, 0, "default", 0), (2, 1, "default", 0), (8, 5, "default", 0), (4, 2, "default", 1)]
    + [(4, r, variant, 0) for r in (0, 3) for variant in ZIGZAG_VARIANTS],
    [(w, r, variant, 0) for w in (1, 2, 4, 8) for r in range(w) for variant in ZIGZAG_VARIANTS]
    + [(8, r, "default", 1) for r in range(8)])


@pytest.mark.parametrize("world,rank,variant,dtype_index", ZIGZAG_CASES)
def test_zigzag_backward_every_rank(world, rank, variant, dtype_index):
    """Chunks 5, 33, 0, 17 tokens (CPU; GPU 100, 1030, 0, 257): dq and dkv of this rank equal
    float64 autograd of global causal attention with dout only on this rank's rows; buffer rows
    this rank's queries never see (later chunks of each sequence) are exactly 0. Variants: the
    exact max_seqlen_q (max c_b) instead of the default bound; dQ by atomics; softmax_scale 0.3;
    the dQ kernel with one group per program."""
    dtype = DTYPES[dtype_index]
    chunks = cpu_gpu((5, 33, 0, 17), (100, 1030, 0, 257))
    heads, heads_k, hd = cpu_gpu((4, 2, 32), (32, 8, 128))
    global_lens = [2 * world * c for c in chunks]
    Q, K, V, local_of, kv_buffer = zigzag_rank_inputs(global_lens, world, rank, heads, heads_k, hd,
                                                      dtype)
    cu_local = cu_of([n // world for n in global_lens])
    q = local_of(Q, rank)
    c0, c1 = rank, 2 * world - 1 - rank
    chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(q, cu_local, world, rank)
    scale = 0.3 if variant == "softmax_scale" else None
    with poison_empty:
        out, lse, _ = replace_execute_grouped_attention_with_fused_varlen(
            chunk_q, chunk_cu, chunk_idx, kv_buffer, None, heads, hd, scale, 0.0, True, (-1, -1),
            None, False, world, cu_local, c0, c1)
    dout = randn(*q.shape, dtype=dtype)
    kw = dict(softmax_scale=scale)
    if variant == "max_seqlen_q":
        kw["max_seqlen_q"] = max(chunks)
    elif variant in ("atomic_dq", "dq_one_group"):
        # Variants of the two Triton kernels: gluon off (on sm90 the row's Gluon kernel, which
        # the default variant runs, would ignore them).
        cap = torch.cuda.get_device_capability() if HAS_CUDA else None
        kw["config"] = dataclasses.replace(get_dual_group_bwd_config(cap, hd), gluon=False,
                                           **{variant: True})
    with poison_empty:
        dq, dkv = fused_zigzag_backward(dout, q, out, lse, kv_buffer, cu_local, world, c0, c1,
                                        **kw)
    assert dq.dtype == dtype and dq.shape == q.shape
    assert dkv.dtype == torch.float32 and dkv.shape == kv_buffer.shape

    ref_args = (Q, K, V, global_lens, world, rank, dout, local_of)
    ref_dq, ref_dkv = zigzag_ref_grads(*ref_args, F64, softmax_scale=scale)
    base_dq = base_dkv = None
    if dtype != torch.float32:
        low = zigzag_ref_grads(*ref_args, dtype, softmax_scale=scale)
        fa = zigzag_ref_grads(*ref_args, F64, softmax_scale=scale, fa_style_dtype=dtype)
        base_dq, base_dkv = [low[0], fa[0]], [low[1], fa[1]]
    # Keys rank r's rows see: positions < (2 * world - rank) * c of each sequence.
    seen = torch.zeros(sum(global_lens), dtype=torch.bool, device=DEVICE)
    off = 0
    for n, c in zip(global_lens, chunks):
        seen[off: off + (2 * world - rank) * c] = True
        off += n
    unseen_buf = ~torch.cat([local_of(seen, r) for r in range(world)])
    check_grad("dq", dq, ref_dq, in_dtype=dtype, baselines=base_dq, cu=cu_local)
    cu_buf = cu_of([n // world for _ in range(world) for n in global_lens])  # rank, sequence
    for i, name in enumerate(("dk", "dv")):
        check_grad(name, dkv[i], ref_dkv[i], in_dtype=dtype,
                   baselines=None if base_dkv is None else [b[i] for b in base_dkv], cu=cu_buf,
                   zero_rows=unseen_buf)


def test_zigzag_backward_dkv_dtype():
    world, rank, chunks = 2, 0, (5, 17)
    dtype = DTYPES[0]
    global_lens = [2 * world * c for c in chunks]
    Q, K, V, local_of, kv_buffer = zigzag_rank_inputs(global_lens, world, rank, 2, 1, 32, dtype)
    cu_local = cu_of([n // world for n in global_lens])
    q = local_of(Q, rank)
    chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(q, cu_local, world, rank)
    dout = randn(*q.shape, dtype=dtype)
    with poison_empty:
        out, lse, _ = replace_execute_grouped_attention_with_fused_varlen(
            chunk_q, chunk_cu, chunk_idx, kv_buffer, None, 2, 32, 0.2, 0.0, True, (-1, -1), None,
            False, world, cu_local, 0, 3)
        dq32, dkv32 = fused_zigzag_backward(dout, q, out, lse, kv_buffer, cu_local, world, 0, 3,
                                            0.2)
        dq16, dkv16 = fused_zigzag_backward(dout, q, out, lse, kv_buffer, cu_local, world, 0, 3,
                                            0.2, dkv_dtype=torch.bfloat16)
    assert dkv16.dtype == torch.bfloat16 and dq16.dtype == dtype
    _same("dq", dq16, dq32)
    torch.testing.assert_close(dkv16.float(), dkv32, atol=1e-6, rtol=BF16_CAST_RTOL)
    # softmax_scale 0.2 reached the kernel: gradients differ from the default scale's.
    with poison_empty:
        dq_default, _ = fused_zigzag_backward(dout, q, out, lse, kv_buffer, cu_local, world, 0, 3)
    assert not torch.equal(dq_default, dq32)


# ------------------------------------------------------------------------------ bad inputs
def _bwd_good():
    dt = DTYPES[0]
    args = _small_case(dt)
    q0, q1, k, v = args[:4]
    out0, out1, lse0, lse1 = fused_forward(*args)
    return dict(dout0=randn(*q0.shape, dtype=dt), dout1=randn(*q1.shape, dtype=dt), q0=q0, q1=q1,
                k=k, v=v, out0=out0, out1=out1, lse0=lse0, lse1=lse1,
                cu_seqlens_q0=args[4], cu_seqlens_q1=args[5], cu_seqlens_k=args[6],
                max_seqlen_q0=args[7], max_seqlen_q1=args[8], max_seqlen_k=args[9],
                max_kv_len_q0=args[10], max_kv_len_q1=args[11])


BWD_BAD_INPUTS = {
    "dout0 rows": (lambda a: dict(dout0=a["dout0"][1:]), ValueError, "dout0"),
    "dout1 heads": (lambda a: dict(dout1=a["dout1"][:, :1]), ValueError, "dout1"),
    "dout0 dtype": (lambda a: dict(dout0=a["dout0"].double()), TypeError, "dout0"),
    "out1 shape": (lambda a: dict(out1=a["out1"][:-1]), ValueError, "out1"),
    "lse0 transposed": (lambda a: dict(lse0=a["lse0"].t()), ValueError, "lse0"),
    "lse1 columns": (lambda a: dict(lse1=a["lse1"][:, 1:]), ValueError, "lse1"),
    "lse0 dtype": (lambda a: dict(lse0=a["lse0"].to(a["q0"].dtype if a["q0"].dtype != torch.float32
                                                      else torch.float16)), TypeError, "lse0"),
    "dkv_dtype float64": (lambda a: dict(dkv_dtype=torch.float64), (TypeError, ValueError),
                          "dkv_dtype"),
    "dkv_dtype int32": (lambda a: dict(dkv_dtype=torch.int32), (TypeError, ValueError),
                        "dkv_dtype"),
    "q0 forward checks": (lambda a: dict(cu_seqlens_k=a["cu_seqlens_k"].long()), TypeError,
                          "cu_seqlens_k"),
}


@pytest.mark.parametrize("case", list(BWD_BAD_INPUTS))
def test_backward_bad_inputs_raise(case):
    change, exc, match = BWD_BAD_INPUTS[case]
    args = _bwd_good()
    args.update(change(args))
    with pytest.raises(exc, match=match):
        fused_backward(**args)


ZIGZAG_BAD_INPUTS = {
    "dout rows": (dict(dout="short"), ValueError, "dout"),
    "lse shape": (dict(lse="transposed"), ValueError, "lse"),
    "lse dtype": (dict(lse="half"), TypeError, "lse"),
    "dkv_dtype": (dict(dkv_dtype=torch.float64), (TypeError, ValueError), "dkv_dtype"),
    "kv_buffer tokens": (dict(kv_buffer="odd"), ValueError, "kv_buffer"),
}


@pytest.mark.parametrize("case", list(ZIGZAG_BAD_INPUTS))
def test_zigzag_backward_bad_inputs_raise(case):
    change, exc, match = ZIGZAG_BAD_INPUTS[case]
    dt = DTYPES[0]
    world, total = 2, 20
    q, out, dout = (randn(total, 2, 32, dtype=dt) for _ in range(3))
    args = dict(dout=dout, q=q, out=out, lse=torch.zeros(2, total, device=DEVICE),
                kv_buffer=randn(2, world * total, 1, 32, dtype=dt), cu_seqlens_q=cu_of([8, 12]),
                world_size=world, chunk_idx_0=0, chunk_idx_1=3)
    for name, how in change.items():
        if how == "short":
            how = args[name][1:]
        elif how == "transposed":
            how = args[name].t()
        elif how == "half":
            how = args[name].half()
        elif how == "odd":
            how = args[name][:, 1:]
        args[name] = how
    with pytest.raises(exc, match=match):
        fused_zigzag_backward(**args)


# ------------------------------------------------------------------------------ ops and compile
BACKENDS = ["aot_eager", "inductor"] if HAS_CUDA else ["aot_eager"]


def _compile_inputs(kv_lens_as_tensor):
    torch.manual_seed(2)
    dt = torch.float16
    lens_q, lens_k = [5, 11], [20, 33]
    q0, q1 = randn(sum(lens_q), 4, 32, dtype=dt), randn(sum(lens_q), 4, 32, dtype=dt)
    k, v = (randn(sum(lens_k), 2, 32, dtype=dt) for _ in range(2))
    kv = (9, 40)
    if kv_lens_as_tensor:
        kv = (torch.tensor([7, 30], dtype=torch.int32, device=DEVICE),
              torch.tensor([20, 33], dtype=torch.int32, device=DEVICE))
    return func_args(q0, q1, k, v, lens_q, lens_q, lens_k, *kv)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_lens_as_tensor", [False, True])
def test_compile_forward_backward(backend, kv_lens_as_tensor):
    """torch.compile(fullgraph=True) of forward + loss; .backward() runs the compiled (AOT) joint
    graph's backward: the gradients equal eager ones."""
    args = _compile_inputs(kv_lens_as_tensor)
    w0, w1 = torch.randn(args[0].shape, device=DEVICE), torch.randn(args[1].shape, device=DEVICE)

    def step(q0, q1, k, v, w0, w1):
        out0, out1 = fused_func(q0, q1, k, v, *args[4:], softmax_scale=0.2)
        return (out0.float() * w0).sum() + (out1.float() * w1).sum()

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in args[:4]]
        loss = fn(*leaves, w0, w1)
        loss.backward()
        return [loss.detach()] + [t.grad for t in leaves]

    eager = grads(step)
    torch._dynamo.reset()
    got = grads(torch.compile(step, fullgraph=True, backend=backend))
    for name, g, e in zip(("loss", "dq0", "dq1", "dk", "dv"), got, eager):
        assert g is not None, f"{name}: no gradient from the compiled graph"
        _same(name, g, e)


def _op_args(name):
    """``(op, args)`` for opcheck of ``torch.ops.kvonce.<name>`` on small inputs (schemas in
    varlen.py and zigzag/fused.py): tensors, int32 key ranges, sizes, then the config's fields."""
    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    bwd_cfg = dataclasses.astuple(get_dual_group_bwd_config(cap, 32))
    if name == "dual_group_bwd_zigzag":
        world, rank, dt = 2, 0, torch.float16
        global_lens = [2 * world * c for c in (4, 6)]
        Q, K, V, local_of, kv_buffer = zigzag_rank_inputs(global_lens, world, rank, 4, 2, 32, dt)
        cu_local = cu_of([n // world for n in global_lens])
        q = local_of(Q, rank)
        chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(q, cu_local, world, rank)
        out, lse, _ = replace_execute_grouped_attention_with_fused_varlen(
            chunk_q, chunk_cu, chunk_idx, kv_buffer, None, 4, 32, None, 0.0, True, (-1, -1), None,
            False, world, cu_local, 0, 3)
        return torch.ops.kvonce.dual_group_bwd_zigzag, (
            randn(*q.shape, dtype=dt), q, out, lse, kv_buffer, cu_local, 0, 3, world, 6,
            32 ** -0.5, True, torch.float32, *bwd_cfg)
    args = _compile_inputs(True)
    q0, q1, k, v, cu0, cu1, cuk, mq0, mq1, mk, kv0, kv1 = args
    if name == "dual_group_fwd":
        fwd_cfg = dataclasses.astuple(get_dual_group_fwd_config(cap, 32))
        leaves = [t.clone().requires_grad_() for t in (q0, q1, k, v)]
        return torch.ops.kvonce.dual_group_fwd, (*leaves, cu0, cu1, cuk, kv0, kv1, max(mq0, mq1),
                                                 mk, 0.2, True, *fwd_cfg)
    out0, out1, lse0, lse1 = fused_forward(*args, softmax_scale=0.2)
    return torch.ops.kvonce.dual_group_bwd, (
        randn(*q0.shape, dtype=q0.dtype), randn(*q1.shape, dtype=q0.dtype), q0, q1, k, v, out0,
        out1, lse0, lse1, cu0, cu1, cuk, kv0, kv1, max(mq0, mq1), mk, 0.2, True, torch.bfloat16,
        *bwd_cfg)


@pytest.mark.parametrize("name", ["dual_group_bwd", "dual_group_bwd_zigzag", "dual_group_fwd"])
def test_opcheck(name):
    """Schema, fake shapes/dtypes (dkv_dtype bfloat16 here), autograd registration (the forward
    op's inputs require grad), AOT dispatch (forward and backward through the op)."""
    op, args = _op_args(name)
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_takes_the_triton_kernels(deterministic, monkeypatch):
    """``deterministic=True`` (flash-attn's switch) reaches the backward as ``gluon=False``, from
    the autograd function and from the functional backward, whatever the config table says; on
    an sm90 GPU two deterministic backwards are bitwise equal."""
    import kvonce.varlen as varlen

    gluon_row = lambda cap, hd, es=2: dataclasses.replace(  # noqa: E731
        get_dual_group_bwd_config(cap, hd, es), gluon=True)
    monkeypatch.setattr(varlen, "get_dual_group_bwd_config", gluon_row)
    seen = []
    real = varlen._dual_group_bwd_impl

    def recording(*args):
        seen.append(args[-1].gluon)
        return real(*args)

    monkeypatch.setattr(varlen, "_dual_group_bwd_impl", recording)
    dtype = DTYPES[0]
    args = _small_case(dtype, heads=4, heads_k=2, hd=cpu_gpu(32, 128))
    leaves = [t.clone().requires_grad_() for t in args[:4]]
    dout0, dout1 = randn(*args[0].shape, dtype=dtype), randn(*args[1].shape, dtype=dtype)
    out0, out1, lse0, lse1 = fused_func(*leaves, *args[4:], return_lse=True,
                                        deterministic=deterministic)
    torch.autograd.backward([out0, out1], [dout0, dout1])
    runs = [fused_backward(dout0, dout1, *args[:4], out0.detach(), out1.detach(), lse0, lse1,
                           *args[4:], deterministic=deterministic) for _ in range(2)]
    assert seen == [not deterministic] * 3
    if deterministic:
        for a, b in zip(*runs):
            assert torch.equal(a, b), "two deterministic backwards differ"
