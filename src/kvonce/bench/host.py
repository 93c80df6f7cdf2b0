"""Benchmark: host time per call of the public entry points (CUDA only).

    python -m kvonce bench host [--md docs/benchmarks.md] [--json PATH] [--rounds N] [--calls N]
                                [--shapes BATCHxSEQLEN:NHEADS/NHEADS_K,...]

What Python pays to enqueue one call (validation, allocation, launch), not what the GPU spends.
Each callable is warmed up (20 calls, then a sync); then, ``--rounds`` times (15): sync, call it
``--calls`` times (100) with no sync in between, and divide the host time (``perf_counter``) by
the calls. The shapes are small: the launch queue never fills, the GPU never holds the host back.
Decode rows: 12 q / 2 KV heads, batch 64, seqlen 1024 (``--shapes``: others), head dim 128,
fp16, page size 16, pages in random order (bench/decode.py's inputs); quantized-cache rows
(int8, fp8 e4m3, int4) on the same cache quantized, and fp8 with dense-and-sparse keys (8 fp16
outlier channels per KV head: decode, and the append that also writes the side cache). Varlen paged prefill rows
(``PagedPrefillPlan.run``, one-shot ``paged_prefill``): 16 decode rows over 1024 cached tokens and
one 256-token prompt in one call, 32 q / 8 KV heads (bench/prefill.py's inputs, fp16, page 16),
checked against reference.paged_prefill_ref. Dual-group rows (forward, backward, the zigzag
twins, the autograd function's forward + backward): one sequence of 1024 local tokens, world 4,
rank 0, 32 q / 8 KV heads. Context-parallel rows: ``zigzag_llama3_flash_attn_varlen_func``
with no process group (world 1), one sequence of 4096 tokens, forward and forward + backward.
Columns:
- ``name``, ``shape``: the callable and its shape
- ``host_us_median``, ``host_us_min``: host microseconds per call, median and min over the rounds
- ``gpu_us``: device time per call (us): the call captured in a CUDA graph and replayed
  (``do_bench_cudagraph`` median: kernels only, L2 not flushed; ``-`` if capture fails). A row
  with ``host_us`` above it is host-bound. (Not ``do_bench``: its event times include host time
  for calls slower to enqueue than to run, e.g. 78 us for merge's 2 us of kernels on an H100.)
- ``err``: relative error (norm), checked before timing: decode outputs (and FlashInfer's) vs
  F.scaled_dot_product_attention on a dense copy of the cache; merge vs
  reference.merge_attention_states_ref; append: the written cache slots vs the new K/V; the
  dual-group forward and the zigzag replacement vs reference.dual_group_attention_ref (float32
  loops, cheap at this shape), backward rows' dQ (and dK) vs autograd through it; the CP rows vs
  reference.varlen_attention_ref; ``-``: nothing to compare (the empty kernels)
Floors: empty ``@triton.jit`` kernels of 2 and 37 arguments launched on one program (Triton's own
launch path). FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper.run`` (planned beforehand) is the
peer; ``absent`` when ``import flashinfer`` fails.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from typing import Callable, NamedTuple

import torch
import triton
import triton.testing

from ..paged import (PagedDecodePlan, PagedPrefillPlan, append_paged_kv,
                     calibrate_outlier_channels, dequantize_kv, flash_attn_with_kvcache,
                     merge_attention_states, new_key_outliers, paged_attention, paged_prefill,
                     quantize_kv)
from ..reference import (dual_group_attention_ref, merge_attention_states_ref,
                         paged_attention_ref, paged_prefill_ref, varlen_attention_ref)
from ..varlen import (fused_zigzag_llama3_flash_attn_varlen_backward,
                      fused_zigzag_llama3_flash_attn_varlen_forward,
                      fused_zigzag_llama3_flash_attn_varlen_func)
from ..zigzag import (compute_kv_slices_for_groups, fused_zigzag_backward,
                      rearrange_kv_from_zigzag_to_contiguous,
                      replace_execute_grouped_attention_with_fused_varlen,
                      split_q_by_zigzag_chunk_index, zigzag_llama3_flash_attn_varlen_func)
from . import report
from .decode import HEAD_DIM, PAGE, Case, _flashinfer_runner, make_inputs, rel_err
from .prefill import Case as PrefillCase
from .prefill import make_inputs as make_prefill_inputs

WARMUP_CALLS = 20
ERR_LIMIT = 1e-2  # fp16 outputs vs float32 / SDPA references


class Entry(NamedTuple):
    """One row: ``fn`` is timed (None: absent); ``check`` maps its result to a relative error."""
    name: str
    shape: str
    fn: Callable[[], object] | None
    check: Callable[[object], float] | None


@triton.jit
def _empty_2(ptr, n):
    pass


@triton.jit
def _empty_37(p0, p1, p2, p3, p4, p5, p6, i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12,
              i13, i14, i15, i16, i17, i18, i19, i20, i21, i22, i23, i24, i25, i26, i27, i28, i29):
    # 7 pointers and 30 ints: about the runtime arguments of the paged decode kernel.
    pass


def _randn(*shape, dtype=torch.float16):
    return torch.randn(shape, device="cuda", dtype=dtype)


def _sdpa_ref(q, k_cache, v_cache, block_table, case: Case) -> torch.Tensor:
    """SDPA on the cache gathered into a dense copy: float32 ``[batch, 1, nheads, d]``."""
    dense = [c[block_table.long()].reshape(case.batch, case.seqlen, case.nheads_k, HEAD_DIM)
             .transpose(1, 2) for c in (k_cache, v_cache)]
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), *dense,
                                                           enable_gqa=True)
    return out.transpose(1, 2).float()


def decode_cases(case: Case) -> list[Entry]:
    """The decode entry points, merge and append on one decode shape, then FlashInfer's run."""
    q, k_cache, v_cache, seqlens, block_table = make_inputs(case)
    args = (q, k_cache, v_cache, seqlens, block_table)
    ref = _sdpa_ref(q, k_cache, v_cache, block_table, case)
    vs_sdpa = lambda out: rel_err(out, ref)  # noqa: E731
    single = PagedDecodePlan(*args, num_splits=1)
    one_launch = PagedDecodePlan(*args, num_splits=4)  # merged in the decode launch
    split = PagedDecodePlan(*args, num_splits=8)   # decode + combine launches
    shape = f"{case.batch}x{case.seqlen} {case.label}"
    rows = [
        Entry("PagedDecodePlan.run splits=1", shape, lambda: single.run(*args), vs_sdpa),
        Entry("PagedDecodePlan.run splits=4 (1 launch)", shape, lambda: one_launch.run(*args),
              vs_sdpa),
        Entry("PagedDecodePlan.run splits=8 (2 launches)", shape, lambda: split.run(*args),
              vs_sdpa),
        Entry("PagedDecodePlan.run splits=8 lse", shape,
              lambda: split.run(*args, return_lse=True), lambda r: vs_sdpa(r[0])),
        # The custom op torch.compile records, called directly: the op dispatch's share.
        Entry("torch.ops.kvonce.paged_decode splits=1", shape, lambda: single._run_op(*args),
              lambda r: vs_sdpa(r[0])),
        Entry("paged_attention", shape, lambda: paged_attention(*args), vs_sdpa),
        Entry("flash_attn_with_kvcache", shape,
              lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                              block_table=block_table, causal=True), vs_sdpa),
    ]
    # Merge: two partial states of batch * q_len rows.
    o_a, o_b = _randn(case.batch, case.nheads, HEAD_DIM), _randn(case.batch, case.nheads, HEAD_DIM)
    lse_a = _randn(case.batch, case.nheads, dtype=torch.float32)
    lse_b = _randn(case.batch, case.nheads, dtype=torch.float32)
    merged = merge_attention_states_ref(o_a, lse_a, o_b, lse_b)[0]
    rows.append(Entry("merge_attention_states", f"{case.batch}x{case.nheads}x{HEAD_DIM}",
                      lambda: merge_attention_states(o_a, lse_a, o_b, lse_b),
                      lambda r: rel_err(r[0], merged)))
    # Append: one token per sequence at position seqlen - 1 (inside the table), into copies of the
    # caches so that the rows above keep the cache their reference saw.
    k_app, v_app = k_cache.clone(), v_cache.clone()
    k_new, v_new = (_randn(case.batch, 1, case.nheads_k, HEAD_DIM) for _ in range(2))
    last = seqlens - 1
    page = block_table.long().gather(1, (last.long() // PAGE)[:, None])[:, 0]
    slot = last.long() % PAGE
    rows.append(Entry("append_paged_kv", f"{case.batch}x1 {case.label}",
                      lambda: append_paged_kv(k_new, v_new, k_app, v_app, last, block_table),
                      lambda _: max(rel_err(k_app[page, slot], k_new[:, 0]),
                                    rel_err(v_app[page, slot], v_new[:, 0]))))
    # Quantized cache (int8) and its quantizing append; the shared-prefix cascade (every
    # sequence's first half of pages shared, forced on so that its three launches are timed).
    kq, ks = quantize_kv(k_cache, "int8")
    vq, vs = quantize_kv(v_cache, "int8")
    qargs = (q, kq, vq, seqlens, block_table)
    quant = PagedDecodePlan(*qargs, k_scale=ks, v_scale=vs)
    quant_ref = paged_attention_ref(q.float(), dequantize_kv(kq, ks, "int8", torch.float32),
                                    dequantize_kv(vq, vs, "int8", torch.float32), seqlens,
                                    block_table)[0]
    rows.append(Entry("PagedDecodePlan.run int8 cache", shape,
                      lambda: quant.run(*qargs, k_scale=ks, v_scale=vs),
                      lambda r: rel_err(r, quant_ref)))
    rows += [_quantized_decode_row(fmt, q, k_cache, v_cache, seqlens, block_table, shape)
             for fmt in ("fp8_e4m3", "int4")]
    rows += _outlier_rows(q, k_cache, v_cache, seqlens, block_table, shape,
                          (k_new, v_new, last, page, slot), case)
    kq_app, ks_app, vq_app, vs_app = kq.clone(), ks.clone(), vq.clone(), vs.clone()
    rows.append(Entry("append_paged_kv int8 cache", f"{case.batch}x1 {case.label}",
                      lambda: append_paged_kv(k_new, v_new, kq_app, vq_app, last, block_table,
                                              k_scale=ks_app, v_scale=vs_app),
                      lambda _: rel_err(dequantize_kv(kq_app[page, slot], ks_app[page, slot],
                                                      "int8", torch.float32), k_new[:, 0])))
    shared_table = block_table.clone()
    half = block_table.shape[1] // 2
    shared_table[:, :half] = block_table[0, :half]
    sargs = (q, k_cache, v_cache, seqlens, shared_table)
    cascade = PagedDecodePlan(*sargs, shared_prefix="auto", cascade=True)
    plain_shared = PagedDecodePlan(*sargs)
    shared_ref = plain_shared.run(*sargs)
    rows.append(Entry("PagedDecodePlan.run shared_prefix (cascade)", shape,
                      lambda: cascade.run(*sargs), lambda r: rel_err(r, shared_ref)))
    fi = _flashinfer_runner(*args, case)
    rows.append(Entry("flashinfer BatchDecode...Wrapper.run", shape, fi,
                      lambda r: vs_sdpa(r[:, None])))
    return rows


def _quantized_decode_row(fmt: str, q, k_cache, v_cache, seqlens, block_table, shape) -> Entry:
    """``PagedDecodePlan.run`` on a cache quantized to ``fmt``, checked against the float32
    reference on the dequantized cache."""
    kq, ks = quantize_kv(k_cache, fmt)
    vq, vs = quantize_kv(v_cache, fmt)
    args = (q, kq, vq, seqlens, block_table)
    plan = PagedDecodePlan(*args, k_scale=ks, v_scale=vs, kv_format=fmt)
    ref = paged_attention_ref(q.float(), dequantize_kv(kq, ks, fmt, torch.float32),
                              dequantize_kv(vq, vs, fmt, torch.float32), seqlens, block_table)[0]
    return Entry(f"PagedDecodePlan.run {fmt} cache", shape,
                 lambda: plan.run(*args, k_scale=ks, v_scale=vs), lambda r: rel_err(r, ref))


def _outlier_rows(q, k_cache, v_cache, seqlens, block_table, shape, new, case) -> list[Entry]:
    """Dense-and-sparse keys (fp8 cache, 8 fp16 outlier channels per KV head): decode through the
    plan, and the quantizing append that also writes the side cache."""
    channels = calibrate_outlier_channels(k_cache.flatten(0, 1)[:2048], n=8)
    ko = new_key_outliers(channels, k_cache.shape[0], k_cache.shape[1])
    dense, sparse = ko.split(k_cache)
    ko.values.copy_(sparse)
    kq, ks = quantize_kv(dense, "fp8_e4m3")
    vq, vs = quantize_kv(v_cache, "fp8_e4m3")
    args = (q, kq, vq, seqlens, block_table)
    plan = PagedDecodePlan(*args, k_scale=ks, v_scale=vs)
    keys = ko.merge(dequantize_kv(kq, ks, "fp8_e4m3", torch.float32), ko.values)
    ref = paged_attention_ref(q.float(), keys, dequantize_kv(vq, vs, "fp8_e4m3", torch.float32),
                              seqlens, block_table)[0]
    k_new, v_new, last, page, slot = new
    app = (kq.clone(), vq.clone(), ks.clone(), vs.clone(),
           new_key_outliers(channels, k_cache.shape[0], k_cache.shape[1]))
    kept = app[4].split(k_new[:, 0])[1]
    return [
        Entry("PagedDecodePlan.run fp8_e4m3 cache + 8 outliers", shape,
              lambda: plan.run(*args, k_scale=ks, v_scale=vs, key_outliers=ko),
              lambda r: rel_err(r, ref)),
        Entry("append_paged_kv fp8_e4m3 cache + 8 outliers", f"{case.batch}x1 {case.label}",
              lambda: append_paged_kv(k_new, v_new, app[0], app[1], last, block_table,
                                      k_scale=app[2], v_scale=app[3], key_outliers=app[4]),
              lambda _: rel_err(app[4].values[page, slot], kept)),
    ]


def prefill_cases() -> list[Entry]:
    """Varlen paged prefill on a small mixed batch, against the float32 reference."""
    case = PrefillCase("16 dec/1024 + 1x256", ((16, 1, 1024), (1, 256, 256)))
    args = make_prefill_inputs(case, PAGE, dtype=torch.float16)[:6]
    ref = paged_prefill_ref(*args)[0]
    plan = PagedPrefillPlan(*args, max_seqlen_q=256)
    shape = f"{case.label} 32/8"
    vs_ref = lambda out: rel_err(out, ref)  # noqa: E731
    return [Entry("PagedPrefillPlan.run", shape, lambda: plan.run(*args), vs_ref),
            Entry("paged_prefill", shape, lambda: paged_prefill(*args, max_seqlen_q=256), vs_ref)]


def _grads(outputs, inputs, douts) -> tuple:
    return torch.autograd.grad(outputs, inputs, douts)


def zigzag_cases(world: int = 4, rank: int = 0, local: int = 1024, nheads: int = 32,
                 nheads_k: int = 8) -> list[Entry]:
    """The dual-group forward and the zigzag replacement on one rank's share of one sequence."""
    cu = torch.tensor([0, local], dtype=torch.int32, device="cuda")
    kv_buffer = _randn(2, world * local, nheads_k, HEAD_DIM)
    local_q = _randn(local, nheads, HEAD_DIM)
    chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(local_q, cu, world, rank)
    c0, c1 = rank, 2 * world - 1 - rank
    slices = compute_kv_slices_for_groups(cu, c0, c1, world, chunk_cu)
    kv = rearrange_kv_from_zigzag_to_contiguous(kv_buffer, world, cu)  # global order
    c = local // 2
    kv_end0, kv_end1 = (c0 + 1) * c, (c1 + 1) * c
    cu_k = cu * world
    (q0, q1), (cu0, cu1) = chunk_q, chunk_cu
    ref0, ref1, _, _ = dual_group_attention_ref(q0, q1, kv[0], kv[1], cu0, cu1, cu_k, kv_end0,
                                                kv_end1)
    zz_args = (chunk_q, chunk_cu, chunk_idx, kv_buffer, slices, nheads, HEAD_DIM, None, 0.0, True,
               (-1, -1), None, False, world, cu, c0, c1)
    shape = f"w{world} r{rank} 1x{local} {nheads}/{nheads_k}"
    fwd_args = (q0, q1, kv[0], kv[1], cu0, cu1, cu_k, c, c, world * local, kv_end0, kv_end1)
    out0, out1, lse0, lse1 = fused_zigzag_llama3_flash_attn_varlen_forward(*fwd_args)
    # Backward rows: gradients of the float32 reference for the same output gradients.
    dout0, dout1 = torch.randn_like(out0), torch.randn_like(out1)
    leaves = [t.detach().float().requires_grad_() for t in (q0, q1, kv[0], kv[1])]
    r0, r1, _, _ = dual_group_attention_ref(*leaves, cu0, cu1, cu_k, kv_end0, kv_end1)
    dq0_ref, dq1_ref, dk_ref, _ = _grads((r0, r1), leaves, (dout0.float(), dout1.float()))
    bwd_args = (dout0, dout1, q0, q1, kv[0], kv[1], out0, out1, lse0, lse1, cu0, cu1, cu_k, c, c,
                world * local, kv_end0, kv_end1)
    local_out, local_lse, _ = replace_execute_grouped_attention_with_fused_varlen(*zz_args)
    local_dout = torch.cat([dout0, dout1])  # local order of one sequence: group 0, then 1
    trainable = [t.detach().clone().requires_grad_() for t in (q0, q1, kv[0], kv[1])]

    def forward_backward():
        o0, o1 = fused_zigzag_llama3_flash_attn_varlen_func(*trainable, cu0, cu1, cu_k, c, c,
                                                            world * local, kv_end0, kv_end1)
        return _grads((o0, o1), trainable, (dout0, dout1))

    return [
        Entry("fused_zigzag_llama3_flash_attn_varlen_forward", shape,
              lambda: fused_zigzag_llama3_flash_attn_varlen_forward(*fwd_args),
              lambda r: max(rel_err(r[0], ref0), rel_err(r[1], ref1))),
        Entry("replace_execute_grouped_attention_with_fused_varlen", shape,
              lambda: replace_execute_grouped_attention_with_fused_varlen(*zz_args),
              lambda r: rel_err(r[0], torch.cat([ref0, ref1]))),  # local order: group 0, 1
        Entry("fused_zigzag_llama3_flash_attn_varlen_backward", shape,
              lambda: fused_zigzag_llama3_flash_attn_varlen_backward(*bwd_args),
              lambda r: max(rel_err(r[0], dq0_ref), rel_err(r[1], dq1_ref),
                            rel_err(r[2], dk_ref))),
        Entry("zigzag.fused_zigzag_backward", shape,
              lambda: fused_zigzag_backward(local_dout, local_q, local_out, local_lse, kv_buffer,
                                            cu, world, c0, c1),
              lambda r: rel_err(r[0], torch.cat([dq0_ref, dq1_ref]))),
        Entry("fused_..._varlen_func fwd + autograd bwd", shape, forward_backward,
              lambda r: max(rel_err(r[0], dq0_ref), rel_err(r[2], dk_ref))),
    ]


def cp_cases(tokens: int = 4096, nheads: int = 32, nheads_k: int = 8) -> list[Entry]:
    """``zigzag_llama3_flash_attn_varlen_func`` with no process group (world 1: its all-gather and
    reduce-scatter are skipped, the op pair and its checks are not), forward and forward +
    autograd backward, against the float32 reference."""
    cu = torch.tensor([0, tokens], dtype=torch.int32, device="cuda")
    q = _randn(tokens, nheads, HEAD_DIM)
    k, v = _randn(tokens, nheads_k, HEAD_DIM), _randn(tokens, nheads_k, HEAD_DIM)
    dout = torch.randn_like(q)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref, _ = varlen_attention_ref(*leaves, cu, cu, causal=True)
    dq_ref, dk_ref, _ = _grads(ref, leaves, dout.float())
    trainable = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    args = (cu, cu, tokens, tokens, nheads_k)
    shape = f"w1 1x{tokens} {nheads}/{nheads_k}"

    def forward_backward():
        out = zigzag_llama3_flash_attn_varlen_func(*trainable, *args)
        return _grads(out, trainable, dout)

    return [
        Entry("zigzag_llama3_flash_attn_varlen_func (CP, world 1)", shape,
              lambda: zigzag_llama3_flash_attn_varlen_func(q, k, v, *args),
              lambda r: rel_err(r, ref)),
        Entry("CP func fwd + autograd bwd (world 1)", shape, forward_backward,
              lambda r: max(rel_err(r[0], dq_ref), rel_err(r[1], dk_ref))),
    ]


def launch_floor_cases() -> list[Entry]:
    """Empty Triton kernels on one program: the cost of Triton's launch path alone."""
    x = torch.empty(16, device="cuda")
    ptrs, ints = (x,) * 7, tuple(range(2, 32))
    return [Entry("empty @triton.jit, 2 args", "grid (1,)", lambda: _empty_2[(1,)](x, 2), None),
            Entry("empty @triton.jit, 37 args", "grid (1,)",
                  lambda: _empty_37[(1,)](*ptrs, *ints), None)]


def parse_shape(text: str) -> Case:
    """``BATCHxSEQLEN:NHEADS/NHEADS_K`` -> Case."""
    dims, heads = text.split(":")
    batch, seqlen = (int(x) for x in dims.split("x"))
    nheads, nheads_k = (int(x) for x in heads.split("/"))
    return Case(batch, seqlen, nheads, nheads_k,
                f"{'MHA' if nheads == nheads_k else 'GQA'} {nheads}/{nheads_k}")


def cases(args) -> list[Entry]:
    """Every row, inputs built (and references computed) here, outside any timing."""
    rows = []
    for text in args.shapes.split(","):
        rows += decode_cases(parse_shape(text))
    return rows + prefill_cases() + zigzag_cases() + cp_cases() + launch_floor_cases()


def host_us(fn, rounds: int, calls: int) -> tuple[float, float]:
    """(median, min) over ``rounds`` of host microseconds per call, ``calls`` calls per round."""
    for _ in range(WARMUP_CALLS):
        fn()
    per_call = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per_call), min(per_call)


def gpu_us(entry: Entry) -> float | str:
    """Device microseconds per call, from CUDA-graph replays; '-' when capture fails."""
    try:
        ms = triton.testing.do_bench_cudagraph(entry.fn, rep=100, return_mode="median")
    except Exception as exc:  # capture refused: reported, not hidden
        print(f"{entry.name}: graph capture failed: {type(exc).__name__}: {exc}"[:200])
        return "-"
    return round(ms * 1e3, 1)


def measure(entry: Entry, rounds: int, calls: int) -> dict:
    row = {"name": entry.name, "shape": entry.shape}
    if entry.fn is None:
        return dict(row, host_us_median="absent", host_us_min="absent", gpu_us="absent",
                    err="absent")
    err = None if entry.check is None else entry.check(entry.fn())
    if err is not None and not err <= ERR_LIMIT:  # NaN too
        print(f"CORRECTNESS: {entry.name} {entry.shape}: relative error {err:.1e}", flush=True)
    med, low = host_us(entry.fn, rounds, calls)
    return dict(row, host_us_median=round(med, 1), host_us_min=round(low, 1),
                gpu_us=gpu_us(entry), err="-" if err is None else f"{err:.1e}")


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m kvonce bench host")
    p.add_argument("--md", default="docs/benchmarks.md", help="append the table here ('' = no)")
    p.add_argument("--json", default="", help="also dump the rows as JSON here")
    p.add_argument("--rounds", type=int, default=15, help="timed rounds per row")
    p.add_argument("--calls", type=int, default=100, help="calls per round (no sync between)")
    p.add_argument("--shapes", default="64x1024:12/2",
                   help="decode shapes BATCHxSEQLEN:NHEADS/NHEADS_K, comma-separated")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench host needs a CUDA GPU")
    torch.manual_seed(0)
    rows = []
    for entry in cases(args):
        rows.append(measure(entry, args.rounds, args.calls))
        print(rows[-1], flush=True)
    print(report.format_rows(rows))
    print(report.environment())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.md:
        command = "python -m kvonce bench host " + " ".join(argv)
        report.append_markdown(args.md, "Host time per call (us)", rows, command=command.strip(),
                               dtype="fp16", date=datetime.date.today().isoformat())


if __name__ == "__main__":
    main(sys.argv[1:])
