"""Decode graph times with the K/V left in L2 by the last call (warm) and without (cold):

    PYTHONPATH=src python scripts/decode_l2_warmth.py [--cases plain:12/2:64x1024,...]
        [--copies 4] [--rounds 3]

``bench decode --graph-peers`` replays one call back to back on one cache, so a call may find
part of its K/V in L2 from the call before (50 MB of L2 against GQA 12/2's 67 MB). A serving
step reads a different cache in every layer, so no call finds its own keys there. Columns, CUDA
graph medians in us (``do_bench_cudagraph``), dense SDPA (``enable_gqa``, keys gathered) and the
paged plan on the same keys:
- ``warm``: one call replayed on one cache (``bench decode``'s measure)
- ``cold``: ``--copies`` calls in one graph, each on its own copy of the caches, the time / copies
  (a call's keys were last read ``copies - 1`` calls ago: >= 3 x 67 MB since, L2 50 MB)
- ``seq``: the plan on pages in sequential order (block table ``arange``), warm
Outputs of every plan are checked against SDPA (max abs difference, fp16).
"""
import argparse
import sys

import torch
from tabulate import tabulate

import kvonce

sys.path.insert(0, "scripts")
from decode_ncu_case import graph_us, paged_case, parse_case  # noqa: E402

CASES = ("plain:12/2:128x512,plain:12/2:64x1024,plain:12/2:48x1024,plain:12/2:8x8192,"
         "plain:32/8:64x1024,plain:12/12:64x1024")


def dense(x: torch.Tensor, table: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """Paged ``[pages, page, hk, d]`` gathered to SDPA's ``[batch, hk, length, d]``."""
    hk, d = x.shape[2], x.shape[3]
    return x[table.long()].reshape(batch, length, hk, d).transpose(1, 2).contiguous()


def rotating_us(fns) -> float:
    """One graph running every closure of ``fns`` in turn: its median time / ``len(fns)``."""
    def all_calls():
        for fn in fns:
            fn()
    return graph_us(all_calls) / len(fns)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=CASES)
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rows = []
    for case in args.cases.split(","):
        _, hq, hk, batch, length = parse_case(case)
        q, k, v, table, seqlens, _ = paged_case(hq, hk, batch, length)
        qt = q.transpose(1, 2)
        sdpa_fns, plan_fns, plans = [], [], []
        for i in range(args.copies):
            ki, vi = (k, v) if i == 0 else (k.clone(), v.clone())
            dk, dv = dense(ki, table, batch, length), dense(vi, table, batch, length)
            sdpa_fns.append(lambda dk=dk, dv=dv: torch.nn.functional.scaled_dot_product_attention(
                qt, dk, dv, enable_gqa=True))
            plan = kvonce.PagedDecodePlan(q, ki, vi, seqlens, table)
            plans.append(plan)
            plan_fns.append(lambda plan=plan, ki=ki, vi=vi: plan.run(q, ki, vi, seqlens, table))
        ref = sdpa_fns[0]().transpose(1, 2).float()
        diff = max((fn().float() - ref).abs().max().item() for fn in plan_fns)
        # sequential pages: page j of sequence b at b * pages_per_seq + j, same values
        seq_table = torch.arange(table.numel(), device="cuda", dtype=torch.int32).view_as(table)
        ks, vs = (torch.empty_like(x) for x in (k, v))
        ks[seq_table.long()], vs[seq_table.long()] = k[table.long()], v[table.long()]
        seq_plan = kvonce.PagedDecodePlan(q, ks, vs, seqlens, seq_table)
        seq_fn = lambda: seq_plan.run(q, ks, vs, seqlens, seq_table)
        diff = max(diff, (seq_fn().float() - ref).abs().max().item())
        names = ("sdpa warm", "sdpa cold", "plan warm", "plan cold", "plan seq warm")
        timers = (lambda: graph_us(sdpa_fns[0]), lambda: rotating_us(sdpa_fns),
                  lambda: graph_us(plan_fns[0]), lambda: rotating_us(plan_fns),
                  lambda: graph_us(seq_fn))
        times = [[] for _ in timers]
        for _ in range(args.rounds):
            for i, timer in enumerate(timers):
                times[i].append(timer())
        med = dict(zip(names, (sorted(t)[len(t) // 2] for t in times)))
        rows.append([case, plans[0].num_splits]
                    + [f"{med[n]:.1f}" for n in names]
                    + [f"{med['sdpa warm'] / med['plan warm']:.3f}",
                       f"{med['sdpa cold'] / med['plan cold']:.3f}", f"{diff:.1e}"])
        print(rows[-1], flush=True)
        del sdpa_fns, plan_fns, plans, seq_plan, seq_fn, q, k, v, ks, vs
        torch.cuda.empty_cache()
    print(tabulate(rows, headers=["case", "splits", *names, "warm ratio", "cold ratio",
                                  "maxdiff"], tablefmt="github"))


if __name__ == "__main__":
    main()
