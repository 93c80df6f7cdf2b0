"""Correctness and timing of the Gluon backward's schedules (kernels/gluon_bwd_sched.VARIANTS) on
an H100, in one command of a few minutes:

    PYTHONPATH=src python scripts/gluon_bwd_sweep.py [--variants NAME ...] [--cases 1 3 6 7 9]
                                                     [--no-check] [--jobs 4]

1. Correctness: each of ``--cases`` (indices into gluon_bwd_gpu_check.CASES) in its own
   subprocess with the hang watchdog, checking every variant there against float64 and the
   Triton backward (gluon_bwd_gpu_check's PASS rule). A variant that fails or hangs anywhere is
   not timed.
2. Timing (do_bench median, bf16, causal; backward = 2.5x the forward FLOPs): the Llama-3-8B
   context-parallel cases (world 8, 32/8 heads, d128: 1x8192 at ranks 0, 3, 7; 8 mixed
   sequences at rank 3), the Triton two-kernel backward and every variant in the same process;
   each variant's dq0/dq1/dk/dv are compared with the default schedule's on the same inputs
   (relative difference: only the dQ reduce order differs, so ~1e-3 in bf16 at most).
The table of ms and TFLOP/s is printed last.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _gpu_case_runner as runner  # noqa: E402
import gluon_bwd_gpu_check as check  # noqa: E402

BENCH_CASES = ("llama3-8B 1x8192 w8 r0", "llama3-8B 1x8192 w8 r3", "llama3-8B 1x8192 w8 r7",
               "llama3-8B 8 mixed w8 r3")
# small causal, GQA off-grid, varlen + empty sequence, rows that see no key, d64 GQA 4/1
DEFAULT_CASES = (1, 3, 6, 7, 9)


def correctness(cases, variants, jobs) -> dict[str, bool]:
    """Every variant's PASS over ``cases`` (False where any case failed, hung or crashed)."""
    ok = {v: True for v in variants}

    def run_one(i: int) -> dict:
        return check._run_one(i, dict(os.environ), runner.CASE_TIMEOUT_S, tuple(variants))

    for i, row in runner.results_in_order(run_one, cases, jobs):
        if "error" in row:
            print(f"[{i}] FAIL {row['case']}: {row['error']}", flush=True)
            ok = {v: False for v in variants}   # which variant broke it: see the error
            continue
        for v, r in row["variants"].items():
            errs = " ".join(f"{n} {r[n]['gluon_vs_f64']:.1e}"
                            for n in ("dq0", "dq1", "dk", "dv"))
            print(f"[{i}] {'PASS' if r['pass'] else 'FAIL'} {row['case']} [{v}]  {errs}",
                  flush=True)
            ok[v] &= r["pass"]
    return ok


def bench(variants) -> list[dict]:
    import torch
    import triton

    from kvonce import fused_zigzag_llama3_flash_attn_varlen_forward as forward
    from kvonce.bench import zigzag as zb
    from kvonce.kernels.configs import get_dual_group_bwd_config
    from kvonce.kernels.dual_group_bwd import launch_dual_group_bwd
    from kvonce.kernels.gluon_bwd import launch_gluon_bwd
    from kvonce.kernels.gluon_bwd_sched import VARIANTS

    rows = []
    for case in zb.cases("bf16"):
        if case.name not in BENCH_CASES:
            continue
        torch.manual_seed(0)
        s = zb.setup(case, torch.bfloat16)
        (q0, q1, k, v), meta = zb._fused_args(case, s)
        cu0, cu1, cuk, mq0, mq1, mk, end0, end1 = meta
        scale = case.head_dim ** -0.5
        out0, out1, lse0, lse1 = forward(q0, q1, k, v, *meta, softmax_scale=scale)
        do0, do1 = torch.randn_like(out0), torch.randn_like(out1)
        config = get_dual_group_bwd_config(torch.cuda.get_device_capability(), case.head_dim, 2)
        flops = zb.BWD_FLOP_FACTOR * s["flops"]

        def buffers():
            return dict(dq0=torch.empty_like(q0), dq1=torch.empty_like(q1),
                        dk=torch.empty(k.shape, dtype=torch.float32, device=k.device),
                        dv=torch.empty(v.shape, dtype=torch.float32, device=v.device),
                        delta0=torch.empty_like(lse0), delta1=torch.empty_like(lse1))

        def call(launch, bufs, **extra):
            return lambda: launch(q0, q1, k, v, out0, out1, do0, do1, lse0, lse1,
                                  bufs["delta0"], bufs["delta1"], bufs["dq0"], bufs["dq1"],
                                  bufs["dk"], bufs["dv"], cu0, cu1, cuk, end0, end1,
                                  max_seqlen_q=max(mq0, mq1), max_seqlen_k=mk,
                                  softmax_scale=scale, causal=True, **extra)

        row = {"case": case.name, "ms": {}, "diff": {}}
        paths = [("triton", launch_dual_group_bwd, dict(config=config))]
        paths += [(name, launch_gluon_bwd, dict(schedule=VARIANTS[name])) for name in variants]
        reference = None
        for name, launch, extra in paths:
            bufs = buffers()
            fn = call(launch, bufs, **extra)
            try:
                fn()
                torch.cuda.synchronize()
                outs = [bufs[n].float() for n in ("dq0", "dq1", "dk", "dv")]
                if name == "default":
                    reference = outs
                if reference is not None and name != "triton":
                    row["diff"][name] = max(check._rel(o, r) for o, r in zip(outs, reference))
                row["ms"][name] = triton.testing.do_bench(fn, warmup=50, rep=300,
                                                          return_mode="median")
            except Exception as exc:  # report and go on to the next path
                print(f"{case.name} {name}: {type(exc).__name__}: {exc}", flush=True)
            del bufs
        print({"case": case.name, **{n: round(ms, 3) for n, ms in row["ms"].items()}},
              flush=True)
        row["tflops"] = {n: flops / ms / 1e9 for n, ms in row["ms"].items()}
        rows.append(row)
    return rows


def main() -> int:
    from kvonce.kernels.gluon_bwd_sched import VARIANTS

    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS),
                        help=f"schedules to check and time (default: all of {list(VARIANTS)})")
    parser.add_argument("--cases", type=int, nargs="*", default=list(DEFAULT_CASES),
                        help="gluon_bwd_gpu_check.CASES indices for the correctness check")
    parser.add_argument("--no-check", action="store_true", help="time without checking first")
    parser.add_argument("--jobs", type=int, default=4)
    args = parser.parse_args()
    variants = list(dict.fromkeys(["default", *args.variants]))   # the baseline first
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    ok = {v: True for v in variants} if args.no_check else correctness(args.cases, variants,
                                                                        args.jobs)
    timed = [v for v in variants if ok[v]]
    skipped = [v for v in variants if not ok[v]]
    if skipped:
        print(f"not timed (failed the check): {skipped}", flush=True)
    rows = bench(timed) if timed else []
    print("\n| variant | correctness | " + " | ".join(c.replace("llama3-8B ", "")
                                                    for c in BENCH_CASES) + " |")
    print("|---|---|" + "---|" * len(BENCH_CASES))
    by_case = {r["case"]: r for r in rows}
    for name in ["triton", *variants]:
        cells = []
        for c in BENCH_CASES:
            r = by_case.get(c)
            if r is None or name not in r["ms"]:
                cells.append("-")
                continue
            cell = f"{r['ms'][name]:.2f} ms ({r['tflops'][name]:.0f})"
            if name in r["diff"] and name != "default":
                cell += f" d={r['diff'][name]:.0e}"
            cells.append(cell)
        status = "ref" if name == "triton" else ("PASS" if ok[name] else "FAIL")
        print(f"| {name} | {status} | " + " | ".join(cells) + " |")
    print("\n(ms, TFLOP/s at 2.5x the forward FLOPs; d = max relative difference of dq0/dq1/dk/dv"
          " from the default schedule's on the same inputs)")
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
