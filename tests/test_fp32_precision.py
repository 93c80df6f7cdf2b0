"""fp32 inputs are computed in fp32: every kernel family follows PyTorch's float32 matmul setting.

Under PyTorch's default (``torch.get_float32_matmul_precision() == "highest"``) the dots are IEEE
fp32, within 1e-5 of float64; once the user allows TF32 ("high"), they are TF32 (on the GPU an
error far above IEEE's shows it; the CPU interpreter computes every dot in fp32, so there only
the option that reaches the compiler is checked). Families: the dual-group forward and backward,
paged decode (one pass and split-K), varlen paged prefill and the shared-prefix cascade.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import DEVICE, HAS_CUDA, poison_empty
from test_decode import make_paged

import kvonce
from kvonce.kernels import _launch
from kvonce.reference import (attention_ref, dual_group_attention_ref, paged_attention_ref,
                              paged_prefill_ref)

IEEE_TOL = 1e-5
# TF32 keeps 10 mantissa bits: relative errors of 1e-4..1e-3 on unit-variance data (2e-4 to
# 1.4e-3 measured on the H100 before fp32 followed PyTorch: docs/notes.md).
TF32_MIN, TF32_MAX = 5e-5, 1e-2


@contextlib.contextmanager
def matmul_precision(precision: str):
    """PyTorch's float32 matmul precision set for the block, restored after it."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


def rel_err(out, ref) -> float:
    assert not torch.isnan(out).any(), "output has NaNs (an element was not written)"
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def randn(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(DEVICE)


def paged(lens, *, page_size, nheads_k, head_dim, seed):
    """fp32 caches, pages in a random order, a block table per sequence (test_decode's)."""
    return make_paged(lens, page_size=page_size, nheads_k=nheads_k, head_dim=head_dim,
                      dtype=torch.float32, spare_pages=1, seed=seed)


# Each family: run(seed) -> [(name, kvonce result, float64 reference)]. Head dim 64 on the GPU
# (128 on the forward), 32 under the interpreter.
HEAD_DIM = 128 if HAS_CUDA else 32
LEN = 300 if HAS_CUDA else 40


def _dual_group_case(seed):
    nheads, nheads_k, d = 4, 2, HEAD_DIM
    lens_k = [LEN, LEN // 2 + 3]
    lens_q = [n // 2 for n in lens_k]
    cu_k = torch.tensor([0, lens_k[0], sum(lens_k)], dtype=torch.int32, device=DEVICE)
    cu_q = torch.tensor([0, lens_q[0], sum(lens_q)], dtype=torch.int32, device=DEVICE)
    q0 = randn(sum(lens_q), nheads, d, seed=seed)
    q1 = randn(sum(lens_q), nheads, d, seed=seed + 1)
    k = randn(sum(lens_k), nheads_k, d, seed=seed + 2)
    v = randn(sum(lens_k), nheads_k, d, seed=seed + 3)
    ends = (torch.tensor(lens_q, dtype=torch.int32, device=DEVICE),
            torch.tensor(lens_k, dtype=torch.int32, device=DEVICE))
    return q0, q1, k, v, cu_q, cu_k, max(lens_q), max(lens_k), ends


def dual_group_forward(seed):
    q0, q1, k, v, cu_q, cu_k, mq, mk, (e0, e1) = _dual_group_case(seed)
    with poison_empty:
        out0, out1, _, _ = kvonce.fused_zigzag_llama3_flash_attn_varlen_forward(
            q0, q1, k, v, cu_q, cu_q, cu_k, mq, mq, mk, e0, e1)
    r0, r1, _, _ = dual_group_attention_ref(q0, q1, k, v, cu_q, cu_q, cu_k, e0, e1,
                                            compute_dtype=torch.float64)
    return [("out0", out0, r0), ("out1", out1, r1)]


def dual_group_backward(seed):
    q0, q1, k, v, cu_q, cu_k, mq, mk, (e0, e1) = _dual_group_case(seed)
    do0, do1 = randn(*q0.shape, seed=seed + 7), randn(*q1.shape, seed=seed + 8)
    leaves = [t.clone().requires_grad_() for t in (q0, q1, k, v)]
    with poison_empty:
        out0, out1 = kvonce.fused_zigzag_llama3_flash_attn_varlen_func(
            *leaves, cu_q, cu_q, cu_k, mq, mq, mk, e0, e1)
    torch.autograd.backward((out0, out1), (do0, do1))
    ref_leaves = [t.double().requires_grad_() for t in (q0, q1, k, v)]
    r0, r1, _, _ = dual_group_attention_ref(*ref_leaves, cu_q, cu_q, cu_k, e0, e1,
                                            compute_dtype=torch.float64)
    torch.autograd.backward((r0, r1), (do0.double(), do1.double()))
    return [(f"d{n}", t.grad, r.grad) for n, t, r in zip(("q0", "q1", "k", "v"), leaves, ref_leaves)]


def _decode_case(seed, q_len=1):
    lens = [LEN, 17, LEN // 3]
    k_cache, v_cache, seqlens, table = paged(lens, page_size=16, nheads_k=2, head_dim=HEAD_DIM,
                                             seed=seed)
    q = randn(len(lens), q_len, 8, HEAD_DIM, seed=seed + 5)
    ref, _ = paged_attention_ref(q, k_cache, v_cache, seqlens, table,
                                 compute_dtype=torch.float64)
    return q, k_cache, v_cache, seqlens, table, ref


def paged_decode(seed):
    q, k_cache, v_cache, seqlens, table, ref = _decode_case(seed)
    with poison_empty:
        out = kvonce.paged_attention(q, k_cache, v_cache, seqlens, table, num_splits=1)
    return [("out", out, ref)]


def paged_decode_split_k(seed):
    q, k_cache, v_cache, seqlens, table, ref = _decode_case(seed, q_len=2)
    with poison_empty:
        out = kvonce.paged_attention(q, k_cache, v_cache, seqlens, table, num_splits=3)
    return [("out", out, ref)]


def paged_prefill(seed):
    lens = [(LEN // 2, LEN), (5, 40), (LEN // 4, LEN // 4)]  # chunked, decode-like, fresh prefill
    k_cache, v_cache, seqlens, table = paged([n for _, n in lens], page_size=16, nheads_k=2,
                                             head_dim=HEAD_DIM, seed=seed)
    q_lens = [n for n, _ in lens]
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                        device=DEVICE)
    q = randn(sum(q_lens), 8, HEAD_DIM, seed=seed + 5)
    with poison_empty:
        out = kvonce.paged_prefill(q, k_cache, v_cache, cu_q, seqlens, table,
                                   max_seqlen_q=max(q_lens))
    ref, _ = paged_prefill_ref(q, k_cache, v_cache, cu_q, seqlens, table,
                               compute_dtype=torch.float64)
    return [("out", out, ref)]


def shared_prefix_cascade(seed):
    page_size, prefix_pages = 16, (LEN // 16)
    lens = [prefix_pages * page_size + n for n in (5, 20, 37)]
    k_cache, v_cache, seqlens, table = paged(lens, page_size=page_size, nheads_k=2,
                                             head_dim=HEAD_DIM, seed=seed)
    table[1:, :prefix_pages] = table[0, :prefix_pages]  # the three share their first pages
    q = randn(len(lens), 1, 8, HEAD_DIM, seed=seed + 5)
    with poison_empty:
        plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table,
                                      shared_prefix=[(torch.tensor([0, 1, 2], dtype=torch.int32), prefix_pages)],
                                      cascade=True)
        out = plan.run(q, k_cache, v_cache, seqlens, table)
    assert plan.uses_cascade
    ref, _ = paged_attention_ref(q, k_cache, v_cache, seqlens, table,
                                 compute_dtype=torch.float64)
    return [("out", out, ref)]


FAMILIES = [dual_group_forward, dual_group_backward, paged_decode, paged_decode_split_k,
            paged_prefill, shared_prefix_cascade]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_fp32_is_ieee_by_default(family):
    """PyTorch's default ("highest"): every output within 1e-5 of float64."""
    assert torch.get_float32_matmul_precision() == "highest"
    for name, out, ref in family(seed=11):
        assert out.dtype == torch.float32
        err = rel_err(out, ref)
        assert err < IEEE_TOL, f"{name}: relative error {err:.2e} vs float64 (TF32-sized?)"


@pytest.mark.skipif(not HAS_CUDA, reason="the interpreter computes every dot in fp32: TF32 is "
                                         "visible only on a GPU (the CPU test below checks the "
                                         "option that reaches Triton)")
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_fp32_is_tf32_when_allowed(family):
    """With TF32 allowed ("high"), the same call runs TF32 dots: an error of TF32's size, not
    IEEE's (the two compiled kernels do not mix: the precision is part of the launch key)."""
    with matmul_precision("high"):
        results = family(seed=11)
    for name, out, ref in results:
        err = rel_err(out, ref)
        assert TF32_MIN < err < TF32_MAX, f"{name}: relative error {err:.2e}, not TF32's"
    for name, out, ref in family(seed=11):  # and back to IEEE after it
        assert rel_err(out, ref) < IEEE_TOL, f"{name} after the TF32 block"


def test_dot_precision_follows_pytorch():
    """The ``DOT_PRECISION`` constexpr kvonce gives its kernels, under each of PyTorch's
    settings; 16-bit inputs always get "tf32" (ignored by their dots: one compiled variant)."""
    assert _launch.dot_input_precision(torch.float16) == "tf32"
    assert _launch.dot_input_precision(torch.bfloat16) == "tf32"
    assert _launch.dot_input_precision(torch.float32) == "ieee"
    for precision, expected in (("high", "tf32"), ("medium", "tf32"), ("highest", "ieee")):
        with matmul_precision(precision):
            assert _launch.dot_input_precision(torch.float32) == expected, precision
            assert _launch.dot_input_precision(torch.float16) == "tf32", precision
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9's per-backend API
        saved = matmul.fp32_precision
        try:
            matmul.fp32_precision = "tf32"
            assert _launch.fp32_matmul_precision() == "tf32"
            matmul.fp32_precision = "ieee"
            assert _launch.fp32_matmul_precision() == "ieee"
        finally:
            matmul.fp32_precision = saved
            torch.set_float32_matmul_precision("highest")
    assert _launch.fp32_matmul_precision() == "ieee"


def test_every_dot_takes_the_precision():
    """Every ``tl.dot`` in kvonce's Triton kernels passes ``input_precision=DOT_PRECISION``
    (a dot without it would run TF32 on fp32 inputs whatever PyTorch says)."""
    import ast
    import pathlib

    import kvonce.kernels as kernels

    missing = []
    for path in sorted(pathlib.Path(kernels.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "dot" and getattr(node.func.value, "id", "") == "tl"):
                kw = {k.arg: k.value for k in node.keywords}
                if getattr(kw.get("input_precision"), "id", None) != "DOT_PRECISION":
                    missing.append(f"{path.name}:{node.lineno}")
    assert not missing, f"tl.dot without input_precision=DOT_PRECISION: {missing}"


def test_launches_pass_the_precision(monkeypatch):
    """Each family's launch hands its kernels the constexpr: record what they receive."""
    seen = []
    real = _launch.launch

    def recording(kernel, key, grid, args, constexprs, *rest, **options):
        seen.append((kernel.fn.__name__, constexprs.get("DOT_PRECISION")))
        return real(kernel, key, grid, args, constexprs, *rest, **options)

    for module in ("dual_group_fwd", "paged_decode", "paged_prefill", "prefix_decode"):
        monkeypatch.setattr(f"kvonce.kernels.{module}.launch", recording)
    with matmul_precision("high"):
        paged_decode(seed=1)
        paged_prefill(seed=1)
        shared_prefix_cascade(seed=1)
    tf32 = dict(seen)
    seen.clear()
    dual_group_forward(seed=1)
    paged_decode(seed=1)
    ieee = dict(seen)
    dots = {"_paged_decode_kernel", "_paged_prefill_kernel", "_prefix_chunk_kernel"}
    assert dots <= set(tf32) and all(tf32[name] == "tf32" for name in dots), tf32
    assert ieee["_fused_dual_group_fwd_kernel_varlen"] == "ieee", ieee
    assert ieee["_paged_decode_kernel"] == "ieee", ieee


def test_reference_float64_paths_agree_with_attention_ref():
    """The float64 paged references used above are the plain attention of the gathered keys."""
    q, k_cache, v_cache, seqlens, table, ref = _decode_case(3)
    b, n = 1, int(seqlens[1])
    pages = table[b, : -(-n // 16)].long()
    k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n]
    v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n]
    out, _ = attention_ref(q[b], k, v, compute_dtype=torch.float64)
    assert ref.dtype == torch.float64
    assert rel_err(ref[b], out) < 1e-12
