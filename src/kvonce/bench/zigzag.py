"""Benchmark: fused dual-group forward vs the two-call zigzag llama3 path (CUDA only).

    python -m kvonce bench zigzag [--dtype bf16] [--out docs] [--sweep] [--profile CASE]

Kernel level: ``fused_zigzag_llama3_flash_attn_varlen_forward`` on contiguous K/V vs two calls of
PyTorch's FA2 varlen forward on pre-sliced K/V. End to end: ``replace_execute_grouped_attention_
with_fused_varlen`` vs ``execute_grouped_attention`` (rearrange, slice, two FA2 calls, scatter).
Correctness is checked first (relative error vs the FA2 outputs). Times are
``triton.testing.do_bench`` medians in ms; TFLOP/s counts 4 * headdim FLOPs per visible
(query, key) pair (the causal work actually needed), 1 TFLOP/s = 1e12 FLOP/s.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os

import torch

from ..varlen import dual_group_forward_into, fused_zigzag_llama3_flash_attn_varlen_forward
from ..zigzag import (
    compute_kv_slices_for_groups,
    execute_grouped_attention,
    rearrange_kv_from_zigzag_to_contiguous,
    replace_execute_grouped_attention_with_fused_varlen,
    split_q_by_zigzag_chunk_index,
    varlen_attention_backend,
)
from . import report


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    world_size: int
    rank: int
    local_lens: tuple[int, ...]   # per-sequence LOCAL lengths (global / world_size)
    nheads: int
    nheads_k: int
    head_dim: int


def cases(dtype_name: str) -> list[Case]:
    out = []
    for seqlen, h, d in ((256, 8, 64), (512, 16, 64), (512, 32, 128)):
        for rank in (0, 3):
            out.append(Case(f"spec L{seqlen} H{h} d{d} w4 r{rank}", 4, rank, (seqlen,), h, h, d))
    mixed = (2048, 1536, 1024, 1024, 768, 768, 512, 512)  # sums to 8192
    for rank in (0, 3, 7):
        out.append(Case(f"llama3-8B 1x8192 w8 r{rank}", 8, rank, (8192,), 32, 8, 128))
        out.append(Case(f"llama3-8B 8 mixed w8 r{rank}", 8, rank, mixed, 32, 8, 128))
    return out


def _visible_pairs(len_q: int, len_k: int) -> int:
    """(query, key) pairs under a bottom-right causal mask."""
    return sum(max(0, min(len_k, i + len_k - len_q + 1)) for i in range(len_q))


def setup(case: Case, dtype: torch.dtype, device="cuda"):
    w, r = case.world_size, case.rank
    cu = torch.tensor([0] + list(_cumsum(case.local_lens)), dtype=torch.int32, device=device)
    total = sum(case.local_lens)
    q = torch.randn(total, case.nheads, case.head_dim, dtype=dtype, device=device)
    kv_buffer = torch.randn(2, w * total, case.nheads_k, case.head_dim, dtype=dtype, device=device)
    chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(q, cu, w, r)
    c0, c1 = r, 2 * w - 1 - r
    slices = compute_kv_slices_for_groups(cu, c0, c1, w, chunk_cu)
    kv = rearrange_kv_from_zigzag_to_contiguous(kv_buffer, w, cu)
    k_groups = [torch.cat([kv[0, s:e] for s, e in rg]) for rg, _ in slices]
    v_groups = [torch.cat([kv[1, s:e] for s, e in rg]) for rg, _ in slices]
    flops = 0
    for lq in case.local_lens:
        c = lq // 2
        flops += 4 * case.head_dim * case.nheads * (_visible_pairs(c, (c0 + 1) * c)
                                                   + _visible_pairs(c, (c1 + 1) * c))
    return dict(cu=cu, q=q, kv_buffer=kv_buffer, chunk_q=chunk_q, chunk_cu=chunk_cu,
                chunk_idx=chunk_idx, slices=slices, kv=kv, k_groups=k_groups, v_groups=v_groups,
                c0=c0, c1=c1, flops=flops, max_c=max(case.local_lens) // 2,
                max_k=[max((e - s for s, e in rg), default=0) for rg, _ in slices])


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def paths(case: Case, s: dict, config=None):
    """name -> zero-argument callable returning (out..., lse...) for correctness and timing."""
    w = case.world_size
    _, fa2 = varlen_attention_backend(s["q"].device)
    cu_kg = [cu for _, cu in s["slices"]]
    kv_end = [(cu_kg[g][1:] - cu_kg[g][:-1]).to(torch.int32) for g in (0, 1)]
    cu_k_global = s["cu"] * w
    common = (s["chunk_q"], s["chunk_cu"], s["chunk_idx"], s["kv_buffer"], s["slices"],
              case.nheads, case.head_dim, None, 0.0, True, (-1, -1), None, False, w, s["cu"])
    return {
        "fa2_two_calls": lambda: [fa2(s["chunk_q"][g], s["k_groups"][g], s["v_groups"][g],
                                      s["chunk_cu"][g], cu_kg[g], s["max_c"], s["max_k"][g],
                                      case.head_dim ** -0.5, True) for g in (0, 1)],
        "fused_kernel": lambda: fused_zigzag_llama3_flash_attn_varlen_forward(
            s["chunk_q"][0], s["chunk_q"][1], s["kv"][0], s["kv"][1], s["chunk_cu"][0],
            s["chunk_cu"][1], cu_k_global, s["max_c"], s["max_c"], s["max_c"] * 2 * w,
            kv_end[0], kv_end[1], config=config),
        "original_e2e": lambda: execute_grouped_attention(*common),
        "fused_e2e": lambda: replace_execute_grouped_attention_with_fused_varlen(
            *common, s["c0"], s["c1"], config=config),
    }


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def check(case: Case, s: dict, p: dict) -> float:
    """Worst relative error of the fused paths against FA2 (outputs and finite LSE)."""
    (o0, l0), (o1, l1) = p["fa2_two_calls"]()
    f0, f1, fl0, fl1 = p["fused_kernel"]()
    oe, le, _ = p["original_e2e"]()
    fe, lfe, _ = p["fused_e2e"]()
    errs = [_rel(f0, o0), _rel(f1, o1), _rel(fl0, l0), _rel(fl1, l1), _rel(fe, oe), _rel(lfe, le)]
    if any(torch.isnan(t).any().item() for t in (f0, f1, fe, lfe)):
        return float("nan")
    return max(errs)


def time_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def run(args) -> list[dict]:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    rows = []
    for case in cases(args.dtype):
        if args.only and not any(o in case.name for o in args.only.split(",")):
            continue
        torch.manual_seed(0)
        s = setup(case, dtype)
        p = paths(case, s)
        err = check(case, s, p)
        t = {name: time_ms(fn) for name, fn in p.items()}
        tf = lambda ms: s["flops"] / (ms * 1e-3) / 1e12  # noqa: E731
        rows.append({
            "case": case.name, "rel_err": f"{err:.1e}",
            "fa2 x2 ms": t["fa2_two_calls"], "fused ms": t["fused_kernel"],
            "kernel speedup": t["fa2_two_calls"] / t["fused_kernel"],
            "fa2 TFLOP/s": tf(t["fa2_two_calls"]), "fused TFLOP/s": tf(t["fused_kernel"]),
            "orig e2e ms": t["original_e2e"], "fused e2e ms": t["fused_e2e"],
            "e2e speedup": t["original_e2e"] / t["fused_e2e"],
        })
        print(report.format_rows(rows[-1:]), flush=True)
    return rows


def sweep(args) -> None:
    """Time the fused kernel over launch configs at the Llama shapes; prints the best per case."""
    from ..kernels.configs import DualGroupFwdConfig

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    configs = [DualGroupFwdConfig(bm, bn, nw, ns, cm)
               for bm, bn, nw, ns in ((128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2),
                                      (64, 64, 4, 3), (128, 32, 8, 3), (64, 128, 8, 3))
               for cm in ("", ".cg")]
    for case in cases(args.dtype):
        if args.only and not any(o in case.name for o in args.only.split(",")):
            continue
        s = setup(case, dtype)
        results = []
        q0, q1 = s["chunk_q"]
        cu0, cu1 = s["chunk_cu"]
        cu_kg = [cu for _, cu in s["slices"]]
        kv_end = [(c[1:] - c[:-1]).to(torch.int32) for c in cu_kg]
        outs = [torch.empty_like(q0), torch.empty_like(q1)]
        lses = [torch.empty(case.nheads, q.shape[0], device=q.device) for q in (q0, q1)]
        for cfg in configs:
            def fn(cfg=cfg):
                return dual_group_forward_into(
                    q0, q1, s["kv"][0], s["kv"][1], outs[0], outs[1], lses[0], lses[1], cu0, cu1,
                    s["cu"] * case.world_size, kv_end[0], kv_end[1], cu0[:-1], cu1[:-1],
                    max_seqlen_q=s["max_c"], softmax_scale=None, causal=True, config=cfg)
            try:
                handle = fn()
                t_e2e = time_ms(paths(case, s, cfg)["fused_e2e"])
                results.append((time_ms(fn), cfg, handle.n_regs, handle.n_spills, t_e2e))
            except Exception as exc:  # out of resources: report and go on
                print(f"  {cfg}: {type(exc).__name__}")
        results.sort(key=lambda x: x[0])
        for ms, cfg, regs, spills, t_e2e in results:
            print(f"{case.name}: kernel {ms:.3f} ms, in-place zigzag e2e {t_e2e:.3f} ms, "
                  f"{regs} regs {spills} spills  {cfg}")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvonce bench zigzag")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--out", default="docs", help="where benchmarks.md rows and the PNG go")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names to run")
    ap.add_argument("--sweep", action="store_true", help="tune the launch config table")
    ap.add_argument("--profile", default="", help="run each path of one case once (for ncu)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench zigzag needs a CUDA GPU")
    if args.sweep:
        sweep(args)
        return
    if args.profile:
        case = next(c for c in cases(args.dtype) if c.name == args.profile)
        s = setup(case, torch.bfloat16 if args.dtype == "bf16" else torch.float16)
        for name, fn in paths(case, s).items():
            torch.cuda.nvtx.range_push(name)
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        return
    rows = run(args)
    print()
    print(report.format_rows(rows))
    command = "python -m kvonce bench zigzag " + " ".join(argv)
    report.append_markdown(os.path.join(args.out, "benchmarks.md"), "Zigzag dual-group forward",
                           rows, command=command, dtype=args.dtype,
                           date=datetime.date.today().isoformat())
    report.bar_plot(os.path.join(args.out, "zigzag_speedup.png"), rows, "case",
                    ["kernel speedup", "e2e speedup"], "speedup over the two-call path (x)")
