"""A decode plan's own config against the same config with some fields changed, same data, same
split count, CUDA-graph time (``do_bench_cudagraph`` medians, rounds alternated):

    PYTHONPATH=src python scripts/config_ab.py --set prefetch_pages=1 [--set block_n=128 ...]
        [--cases plain:12/2:128x512,int4:32/8:1x131072] [--splits 0,2] [--rounds 3]
        [--dtype fp16|bf16]

Each ``--set`` is one B column (``field=value[,field=value]``; ints, floats, 0/1 for booleans).
``--splits``: a row per split count, all columns at that count (0: the plan's own).
d128, page 16, random page order, q_len 1, seed 0 (``decode_ncu_case.paged_case``); outputs of
every B checked against A (max abs difference printed).
"""
import argparse
import dataclasses
import sys

import torch
from tabulate import tabulate

import kvonce

sys.path.insert(0, "scripts")
from decode_ncu_case import graph_us, paged_case, parse_case, parse_set  # noqa: E402

CASES = ("plain:12/2:128x512,plain:12/2:64x1024,plain:12/2:8x8192,plain:12/2:1x65536,"
         "plain:32/8:64x1024,plain:12/12:64x1024,fp8_e4m3:32/8:1x131072,int8:32/8:1x131072,"
         "int4:32/8:1x131072,int4:32/8:64x8192")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=CASES, help="FORMAT:HQ/HK:BATCHxLEN, comma-separated")
    p.add_argument("--set", action="append", default=[], help="field=value[,field=value]")
    p.add_argument("--splits", default="0", help="comma-separated split counts (0: auto)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    args = p.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    rows = []
    for case in args.cases.split(","):
        fmt, hq, hk, batch, length = parse_case(case)
        q, kk, vv, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt, dtype)
        kv_format = "int4" if fmt == "int4" else None
        for splits in (int(x) for x in args.splits.split(",")):
            plan_a = kvonce.PagedDecodePlan(q, kk, vv, seqlens, table, **kw,
                                            kv_format=kv_format, num_splits=splits)
            plans = [plan_a] + [
                kvonce.PagedDecodePlan(q, kk, vv, seqlens, table, **kw, kv_format=kv_format,
                                       num_splits=plan_a.num_splits,
                                       config=dataclasses.replace(plan_a.config,
                                                                  **parse_set(s, plan_a.config)))
                for s in args.set]
            outs = [plan.run(q, kk, vv, seqlens, table, **kw).float() for plan in plans]
            diffs = [f"{(o - outs[0]).abs().max().item():.1e}" for o in outs[1:]]
            times = [[] for _ in plans]
            for _ in range(args.rounds):
                for i, plan in enumerate(plans):
                    times[i].append(graph_us(lambda: plan.run(q, kk, vv, seqlens, table, **kw)))
            med = [sorted(t)[len(t) // 2] for t in times]
            rows.append([case, f"{'auto=' if splits == 0 else ''}{plan_a.num_splits}",
                         f"{med[0]:.1f}"]
                        + [f"{m:.1f} ({m / med[0]:.3f})" for m in med[1:]] + diffs)
            print(rows[-1], flush=True)
            del plans, outs
        del q, kk, vv, table, seqlens, kw
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, {args.dtype} q, graph us (B / A)")
    print(tabulate(rows, headers=["case", "splits", "A (plan)"] + args.set
                   + [f"maxdiff {s}" for s in args.set], tablefmt="github"))


if __name__ == "__main__":
    main()
