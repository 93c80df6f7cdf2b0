"""GPU check of the Gluon backward's context-parallel path (kernels/gluon_bwd.py with
``zigzag_world_size=W, local_order=True``: the zigzag all-gather buffer read and written in place,
both query groups in one tensor in the rank's local order) on an H100.

    PYTHONPATH=src python scripts/gluon_bwd_zigzag_check.py [--no-bench] [--only N ...]
                                                            [--schedules l2-rot default ...]

1. Correctness, one subprocess per case (a crash must not lose the others), a watchdog reporting
   a HANG when a Gluon call has not returned in 45 s. Each case builds a global batch, the rank's
   local q and the gathered buffer (as tests/test_dual_group_backward.py does), runs the forward
   twin (``replace_execute_grouped_attention_with_fused_varlen``), then the backward as
   ``zigzag/fused.py``'s ``_zigzag_bwd_impl`` calls it: ``launch_dual_group_bwd(q, q, buf[0],
   buf[1], ..., cu_half, cu_half, cu_local, c0 + 1, c1 + 1, zigzag_world_size=W,
   local_order=True)`` (the Triton backward) and ``launch_gluon_bwd`` with the same arguments,
   for each schedule of ``--schedules`` (names of ``gluon_bwd_sched.VARIANTS``; default: the
   tuned one, the grid order, lpt with its zigzag step counts). dq, dk, dv (dK/dV in the buffer's
   layout, fp32, NaN-prefilled) against float64 autograd of global causal attention restricted
   to the rank's rows; PASS when the Gluon error is at most 2x the Triton backward's + 1e-3 (and
   below 0.05), nothing is NaN, and the buffer rows no query of the rank sees are exactly 0.
2. Timing (do_bench median, bf16, the Llama-3-8B CP shape of ``bench zigzag``: world 8, 32/8
   heads, d128; 1x8192 local tokens at ranks 0, 3, 7 and the 8-sequence mixed batch at rank 3):
   the Triton backward on the buffer, the Gluon backward on the buffer and the Gluon backward on
   the contiguous K/V (the path varlen.py runs today), all with TUNED_SCHEDULE; ms and TFLOP/s
   (2.5x the forward's FLOPs), and buffer / contiguous. Issue 25's target: within 5%.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import _gpu_case_runner as runner

DEFAULT_SCHEDULES = ("l2-rot", "default", "lpt-rot")

# (name, dtype, world, rank, global lengths (each a multiple of 2 * world), nheads, nheads_k,
#  head_dim). Chunk sizes c = length / (2 world); not all multiples of 128.
CASES = [
    ("w2 r0 c128 mha", "bf16", 2, 0, [512], 2, 2, 128),
    ("w2 r1 c128 gqa 4/2", "bf16", 2, 1, [512], 4, 2, 128),
    ("w4 r1 c100 (not a multiple of 128)", "bf16", 4, 1, [800], 4, 2, 128),
    ("w4 r3 varlen c 64/200/0/130", "bf16", 4, 3, [512, 1600, 0, 1040], 4, 1, 128),
    ("w8 r0 c256 gqa 32/8", "bf16", 8, 0, [4096], 32, 8, 128),
    ("w8 r7 c256 gqa 32/8", "bf16", 8, 7, [4096], 32, 8, 128),
    ("w8 r3 varlen c 192/64/320", "fp16", 8, 3, [3072, 1024, 5120], 8, 2, 128),
    ("w4 r2 d64 c96 gqa 4/1", "bf16", 4, 2, [768, 1536], 4, 1, 64),
    ("w1 r0 c300 (one rank)", "fp16", 1, 0, [600], 2, 1, 128),
]


def _rel(x, ref) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _cu(lens, dev):
    import torch

    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=dev)


def _local_of(x, global_lens, world, r):
    """Rank r's local rows of a global-order tensor: chunk r then chunk 2W-1-r per sequence."""
    import torch

    parts, off = [], 0
    for n in global_lens:
        c = n // (2 * world)
        late = 2 * world - 1 - r
        parts += [x[off + r * c: off + (r + 1) * c], x[off + late * c: off + (late + 1) * c]]
        off += n
    return torch.cat(parts)


def _ref_grads(Q, K, V, global_lens, world, rank, dout_local, scale):
    """float64 autograd of global causal attention, dout nonzero only on rank ``rank``'s rows:
    ``dq`` in local order, ``dk, dv`` in the gathered buffer's layout (only the rank's query
    chunks are computed: the others' dout is 0)."""
    import torch

    from kvonce.reference import dual_group_attention_ref

    dev = Q.device
    chunks = [n // (2 * world) for n in global_lens]
    groups = (rank, 2 * world - 1 - rank)
    idx, off = ([], []), 0
    for n, c in zip(global_lens, chunks):
        for g, i in enumerate(groups):
            idx[g].append(torch.arange(off + i * c, off + (i + 1) * c, device=dev))
        off += n
    idx = [torch.cat(x) for x in idx]
    total = sum(global_lens)
    rows = _local_of(torch.arange(total, device=dev), global_lens, world, rank)
    dout_global = torch.zeros((total, *dout_local.shape[1:]), dtype=torch.float64, device=dev)
    dout_global[rows] = dout_local.double()
    leaves = [t.detach().double().requires_grad_() for t in (Q, K, V)]
    ends = [torch.tensor([(i + 1) * c for c in chunks], dtype=torch.int32, device=dev)
            for i in groups]
    cu_g = _cu(chunks, dev)
    o0, o1, _, _ = dual_group_attention_ref(leaves[0][idx[0]], leaves[0][idx[1]], leaves[1],
                                            leaves[2], cu_g, cu_g, _cu(global_lens, dev), *ends,
                                            causal=True, softmax_scale=scale,
                                            compute_dtype=torch.float64)
    dQ, dK, dV = torch.autograd.grad((o0, o1), leaves, (dout_global[idx[0]],
                                                        dout_global[idx[1]]), allow_unused=True)
    dQ, dK, dV = (torch.zeros_like(x) if g is None else g for g, x in zip((dQ, dK, dV), leaves))
    dkv = [torch.cat([_local_of(t, global_lens, world, r) for r in range(world)])
           for t in (dK, dV)]
    seen = torch.zeros(total, dtype=torch.bool, device=dev)
    off = 0
    for n, c in zip(global_lens, chunks):
        seen[off: off + (2 * world - rank) * c] = True
        off += n
    unseen = ~torch.cat([_local_of(seen, global_lens, world, r) for r in range(world)])
    return dQ[rows], dkv[0], dkv[1], unseen


def run_case(index: int, schedules: tuple[str, ...]) -> dict:
    import torch
    import triton

    from kvonce.kernels.configs import get_dual_group_bwd_config
    from kvonce.kernels.dual_group_bwd import launch_dual_group_bwd
    from kvonce.kernels.gluon_bwd import launch_gluon_bwd
    from kvonce.kernels.gluon_bwd_sched import VARIANTS
    from kvonce.zigzag import (replace_execute_grouped_attention_with_fused_varlen,
                               split_q_by_zigzag_chunk_index)

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    name, dt, world, rank, global_lens, h, hk, d = CASES[index]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    dev = "cuda"
    torch.manual_seed(index)
    total = sum(global_lens)
    Q, K, V = (torch.randn(total, n, d, dtype=dtype, device=dev) for n in (h, hk, hk))
    q = _local_of(Q, global_lens, world, rank)
    buf = torch.stack([torch.cat([_local_of(t, global_lens, world, r) for r in range(world)])
                       for t in (K, V)])
    cu_local = _cu([n // world for n in global_lens], dev)
    cu_half = torch.div(cu_local, 2, rounding_mode="floor")
    max_c = max(global_lens) // (2 * world)
    c0, c1 = rank, 2 * world - 1 - rank
    scale = d ** -0.5
    chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(q, cu_local, world, rank)
    out, lse, _ = replace_execute_grouped_attention_with_fused_varlen(
        chunk_q, chunk_cu, chunk_idx, buf, None, h, d, scale, 0.0, True, (-1, -1), None, False,
        world, cu_local, c0, c1)
    dout = torch.randn_like(out)
    ref_dq, ref_dk, ref_dv, unseen = _ref_grads(Q, K, V, global_lens, world, rank, dout, scale)

    def grads(launch, **extra):
        dq = torch.full_like(q, float("nan"))
        dk = torch.full(buf.shape[1:], float("nan"), dtype=torch.float32, device=dev)
        dv = torch.full(buf.shape[1:], float("nan"), dtype=torch.float32, device=dev)
        delta = torch.full(lse.shape, float("nan"), dtype=torch.float32, device=dev)
        launch(q, q, buf[0], buf[1], out, out, dout, dout, lse, lse, delta, delta, dq, dq, dk, dv,
               cu_half, cu_half, cu_local, c0 + 1, c1 + 1, max_seqlen_q=max_c,
               max_seqlen_k=2 * world * max_c, softmax_scale=scale, causal=True,
               zigzag_world_size=world, local_order=True, **extra)
        torch.cuda.synchronize()
        return dq, dk, dv

    config = get_dual_group_bwd_config(torch.cuda.get_device_capability(), d, 2)
    triton_ = grads(launch_dual_group_bwd, config=config)
    rows = {}
    for sched in schedules:
        runner.announce_running(f"{name} [{sched}]")
        watchdog = runner.start_hang_watchdog(name, f"launch_gluon_bwd [{sched}]")
        t0 = time.time()
        gluon = grads(launch_gluon_bwd, schedule=VARIANTS[sched])
        watchdog.cancel()
        row = {"gluon_first_call_s": round(time.time() - t0, 1)}
        ok = True
        for n, g, t, r in zip(("dq", "dk", "dv"), gluon, triton_, (ref_dq, ref_dk, ref_dv)):
            nan = bool(torch.isnan(g).any().item())
            e_g, e_t, e_gt = _rel(g, r), _rel(t, r), _rel(g, t)
            row[n] = dict(gluon_vs_f64=e_g, triton_vs_f64=e_t, gluon_vs_triton=e_gt, nan=nan)
            ok &= not nan and e_g <= 2 * e_t + 1e-3 and e_g < 0.05
        zeros = all(bool((t[unseen] == 0).all().item()) for t in gluon[1:])
        row["unseen_rows_zero"] = zeros
        row["pass"] = ok and zeros
        rows[sched] = row
    return {"case": name, "variants": rows, "pass": all(r["pass"] for r in rows.values())}


def _run_one(i: int, schedules, env) -> dict:
    cmd = [sys.executable, __file__, "--case", str(i), "--schedules", *schedules]
    return runner.run_case_subprocess(cmd, CASES[i][0], env,
                                      runner.CASE_TIMEOUT_S + 30 * len(schedules),
                                      "TIMEOUT (hang?)")


def correctness(only, schedules, jobs: int) -> list[dict]:
    env = dict(os.environ)
    indices = [i for i in range(len(CASES)) if only is None or i in only]

    def print_errors(row: dict) -> None:
        for sched, r in row["variants"].items():
            errs = "  ".join(f"{n} {r[n]['gluon_vs_f64']:.2e} (triton "
                             f"{r[n]['triton_vs_f64']:.2e}, nan={r[n]['nan']})"
                             for n in ("dq", "dk", "dv"))
            print(f"    [{sched}] {errs}  unseen rows 0: {r['unseen_rows_zero']}",
                  flush=True)

    return runner.run_cases(lambda i: _run_one(i, schedules, env), indices, jobs, print_errors)


def bench() -> list[dict]:
    import torch
    import triton

    from kvonce import fused_zigzag_llama3_flash_attn_varlen_forward as forward
    from kvonce.bench import zigzag as zb
    from kvonce.kernels.configs import get_dual_group_bwd_config
    from kvonce.kernels.dual_group_bwd import launch_dual_group_bwd
    from kvonce.kernels.gluon_bwd import launch_gluon_bwd
    from kvonce.kernels.gluon_bwd_sched import TUNED_SCHEDULE
    from kvonce.zigzag import replace_execute_grouped_attention_with_fused_varlen

    wanted = {"llama3-8B 1x8192 w8 r0", "llama3-8B 1x8192 w8 r3", "llama3-8B 1x8192 w8 r7",
              "llama3-8B 8 mixed w8 r3"}
    rows = []
    for case in zb.cases("bf16"):
        if case.name not in wanted:
            continue
        torch.manual_seed(0)
        s = zb.setup(case, torch.bfloat16)
        w, d = case.world_size, case.head_dim
        scale = d ** -0.5
        flops = zb.BWD_FLOP_FACTOR * s["flops"]
        config = get_dual_group_bwd_config(torch.cuda.get_device_capability(), d, 2)
        # The buffer path: local-order q / out / lse, the gathered K/V, as zigzag/fused.py.
        q, buf, cu = s["q"], s["kv_buffer"], s["cu"]
        out, lse, _ = replace_execute_grouped_attention_with_fused_varlen(
            s["chunk_q"], s["chunk_cu"], s["chunk_idx"], buf, s["slices"], case.nheads, d,
            scale, 0.0, True, (-1, -1), None, False, w, cu, s["c0"], s["c1"])
        dout = torch.randn_like(out)
        cu_half = torch.div(cu, 2, rounding_mode="floor")
        zz = dict(dq=torch.empty_like(q), delta=torch.empty_like(lse),
                  dk=torch.empty(buf.shape[1:], dtype=torch.float32, device=q.device),
                  dv=torch.empty(buf.shape[1:], dtype=torch.float32, device=q.device))

        def zigzag(launch, **extra):
            return lambda: launch(q, q, buf[0], buf[1], out, out, dout, dout, lse, lse,
                                  zz["delta"], zz["delta"], zz["dq"], zz["dq"], zz["dk"],
                                  zz["dv"], cu_half, cu_half, cu, s["c0"] + 1, s["c1"] + 1,
                                  max_seqlen_q=s["max_c"], max_seqlen_k=2 * w * s["max_c"],
                                  softmax_scale=scale, causal=True, zigzag_world_size=w,
                                  local_order=True, **extra)

        # The contiguous path (what varlen.py runs): per-group q, rearranged K/V.
        (q0, q1, k, v), meta = zb._fused_args(case, s)
        cu0, cu1, cuk, mq0, mq1, mk, end0, end1 = meta
        out0, out1, lse0, lse1 = forward(q0, q1, k, v, *meta, softmax_scale=scale)
        do0, do1 = torch.randn_like(out0), torch.randn_like(out1)
        ct = dict(dq0=torch.empty_like(q0), dq1=torch.empty_like(q1),
                  dk=torch.empty(k.shape, dtype=torch.float32, device=k.device),
                  dv=torch.empty(v.shape, dtype=torch.float32, device=v.device),
                  delta0=torch.empty_like(lse0), delta1=torch.empty_like(lse1))

        def contiguous():
            launch_gluon_bwd(q0, q1, k, v, out0, out1, do0, do1, lse0, lse1, ct["delta0"],
                             ct["delta1"], ct["dq0"], ct["dq1"], ct["dk"], ct["dv"], cu0, cu1,
                             cuk, end0, end1, max_seqlen_q=max(mq0, mq1), max_seqlen_k=mk,
                             softmax_scale=scale, causal=True, schedule=TUNED_SCHEDULE)

        row = {"case": case.name}
        for name, fn in (("triton buffer", zigzag(launch_dual_group_bwd, config=config)),
                         ("gluon buffer", zigzag(launch_gluon_bwd, schedule=TUNED_SCHEDULE)),
                         ("gluon contiguous", contiguous)):
            try:
                ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
                row[name] = (ms, flops / ms / 1e9)
            except Exception as exc:  # report and go on
                row[name] = (float("nan"), float("nan"))
                print(f"{case.name} {name}: {type(exc).__name__}: {exc}", flush=True)
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--only", type=int, nargs="*", help="correctness case indices")
    parser.add_argument("--schedules", nargs="*", default=list(DEFAULT_SCHEDULES),
                        help="gluon_bwd_sched.VARIANTS names each case checks")
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument("--jobs", type=int, default=4, help="correctness cases run at once")
    args = parser.parse_args()
    schedules = tuple(args.schedules)
    if args.case is not None:
        runner.print_result_line(run_case(args.case, schedules))
        return 0
    cases = correctness(args.only if args.only else None, schedules, args.jobs)
    crashed = [r["case"] for r in cases if "error" in r]
    if crashed and not args.no_bench:
        print(f"timing skipped: {len(crashed)} case(s) crashed or hung ({crashed})")
    timing = [] if (args.no_bench or crashed) else bench()
    print("\n| case | schedule | result | dq | dk | dv | (gluon rel. err. vs float64; triton) |")
    print("|---|---|---|---|---|---|---|")
    for r in cases:
        if "error" in r:
            print(f"| {r['case']} | - | FAIL | - | - | - | {r['error'][:60]} |")
            continue
        for sched, v in r["variants"].items():
            errs = [f"{v[n]['gluon_vs_f64']:.1e} ({v[n]['triton_vs_f64']:.1e})"
                    for n in ("dq", "dk", "dv")]
            print(f"| {r['case']} | {sched} | {'PASS' if v['pass'] else 'FAIL'} | "
                  + " | ".join(errs) + " | |")
    if timing:
        print("\n| bench case (bf16, causal, TUNED_SCHEDULE) | triton buffer ms (TFLOP/s) | "
              "gluon buffer ms (TFLOP/s) | gluon contiguous ms (TFLOP/s) | buffer / contiguous |")
        print("|---|---|---|---|---|")
        for r in timing:
            cells = [f"{r[n][0]:.2f} ({r[n][1]:.0f})" for n in
                     ("triton buffer", "gluon buffer", "gluon contiguous")]
            ratio = r["gluon buffer"][0] / r["gluon contiguous"][0]
            print(f"| {r['case']} | " + " | ".join(cells) + f" | {ratio:.3f} |")
    return 0 if all(r["pass"] for r in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
