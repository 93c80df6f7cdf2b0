"""Sweep the varlen paged prefill kernel's launch configs on `bench prefill`'s rows (CUDA).

    PYTHONPATH=src python scripts/prefill_sweep.py [--rows prefill,chunked,mixed] [--pages 16,256]
                                                   [--cfg 128,64,8,2 128,128,8,3,r ...]
                                                   [--graph] [--rounds 3]

A spec is ``block_m,block_n,num_warps,num_stages`` plus ``r`` for ``last_tiles_first`` and ``i``
for ``int64_kv_offsets``, ``p`` for ``prefetch_pages``, ``t`` for ``tma``, ``h`` for one q head
per program (``pack_gqa=False``), ``g`` for the Gluon kernel (``gluon``; block_n and num_stages
are then also its ``gluon_block_n``, ``gluon_stages``; ``P`` for ``gluon_persistent``; ``S`` for
the loader's page ids as scalar loads, ``gluon_prefill.SCALAR_PAGES``, set while the plan is
built; ``bN`` for TMA boxes of at most N rows, ``gluon_prefill.BOX_ROWS``, a probe). Per row,
page size and config: ``PagedPrefillPlan.run`` time (``do_bench`` median, eager; with ``--graph``
also CUDA-graph replay; with ``--rounds`` the median over rounds of every config in turn),
TFLOP/s, the relative error against the first config's output and the kernel that ran.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton.testing

from kvonce import PagedPrefillPlan
from kvonce.bench import report
from kvonce.bench.prefill import CASES, make_inputs
from kvonce.kernels import gluon_prefill
from kvonce.kernels.configs import PagedPrefillConfig


def _config(spec: str) -> PagedPrefillConfig:
    parts = spec.split(",")
    ints = [int(x) for x in parts if x.isdigit()]
    return PagedPrefillConfig(*ints, last_tiles_first="r" in parts, int64_kv_offsets="i" in parts,
                              prefetch_pages="p" in parts, tma="t" in parts,
                              pack_gqa="h" not in parts, gluon="g" in parts,
                              gluon_block_n=ints[1], gluon_stages=ints[3],
                              gluon_persistent="P" in parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="prefill,chunked,mixed")
    ap.add_argument("--pages", default="16")
    ap.add_argument("--cfg", nargs="*", default=[
        "128,128,8,3,r", "128,128,8,3,r,p", "128,64,8,2", "128,64,8,2,p", "128,64,8,3,r,p",
        "64,64,4,3,r,p", "128,128,8,2,r,p"])
    ap.add_argument("--graph", action="store_true",
                    help="also time CUDA-graph replay (do_bench_cudagraph median)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the configs this many times in turn (ABAB..) and report each "
                         "one's median: the GPU's clock falls as it heats under its power cap, "
                         "so configs timed in one pass favour the first (docs/notes.md)")
    args = ap.parse_args()
    rows = []
    for name in args.rows.split(","):
        case = CASES[name]
        for page in (int(p) for p in args.pages.split(",")):
            inp = make_inputs(case, page)
            a = (inp.q, inp.k_cache, inp.v_cache, inp.cu_seqlens_q, inp.cache_seqlens,
                 inp.block_table)
            base, plans = None, {}
            for spec in args.cfg:
                try:
                    gluon_prefill.SCALAR_PAGES = "S" in spec.split(",")
                    gluon_prefill.BOX_ROWS = next((int(x[1:]) for x in spec.split(",")
                                                   if x.startswith("b")), None)
                    plan = PagedPrefillPlan(*a, max_seqlen_q=max(case.q_lens),
                                            config=_config(spec))
                    out = plan.run(*a).float()
                    base = out if base is None else base
                    err = ((out - base).norm() / base.norm()).item()
                    gluon = any(getattr(launch, "_gluon", None) is not None
                                for launch in plan._launches.values())
                    plans[spec] = (plan, f"{err:.1e}", "gluon" if gluon else "triton")
                except Exception as exc:  # out of resources: report and go on
                    rows.append({"row": case.label, "page": page, "config": spec,
                                 "ms": float("nan"), "TFLOP/s": 0.0,
                                 "err": f"{type(exc).__name__}"})
            times = {spec: ([], []) for spec in plans}
            for _ in range(args.rounds):
                for spec, (plan, _, _) in plans.items():
                    fn = lambda: plan.run(*a)  # noqa: E731
                    times[spec][0].append(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                                  return_mode="median"))
                    if args.graph:
                        times[spec][1].append(triton.testing.do_bench_cudagraph(
                            fn, rep=100, return_mode="median"))
            for spec, (plan, err, kernel) in plans.items():
                ms = statistics.median(times[spec][0])
                row = {"row": case.label, "page": page, "config": spec, "ms": ms,
                       "TFLOP/s": case.flops() / ms / 1e9}
                if args.graph:
                    g_ms = statistics.median(times[spec][1])
                    row.update(graph_ms=g_ms, graph_TFLOPs=case.flops() / g_ms / 1e9)
                rows.append(dict(row, err=err, kernel=kernel))
                print(report.format_rows(rows[-1:]), flush=True)
            del inp, a, plans
            torch.cuda.empty_cache()
    print(report.format_rows(rows))
    print(report.environment())


if __name__ == "__main__":
    main()
