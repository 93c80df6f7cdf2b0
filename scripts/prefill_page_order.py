"""Is a prefill row's page-16 gap the page lookups and boxes, or where the pages lie? The same
plan on `bench prefill`'s inputs (block table a random permutation of the pool's pages) and on
a copy with every sequence's pages back to back in sequence order (page p of sequence b at
``first_page[b] + p``; the same keys, so the outputs must be equal), eager (``do_bench``) and
CUDA-graph (``do_bench_cudagraph``) medians over alternated rounds, TFLOP/s:

    PYTHONPATH=src python scripts/prefill_page_order.py [--rows prefill] [--pages 16,256]
        [--rounds 3]
"""
import argparse
import itertools
import statistics

import torch
import triton.testing
from tabulate import tabulate

import kvonce
from kvonce.bench.prefill import CASES, make_inputs


def sequential(inp):
    """``inp``'s caches and block table with each sequence's pages in order, back to back."""
    table = torch.zeros_like(inp.block_table)
    k, v = torch.empty_like(inp.k_cache), torch.empty_like(inp.v_cache)
    for b, (start, n) in enumerate(zip(itertools.accumulate([0] + inp.pages), inp.pages)):
        order = torch.arange(start, start + n, dtype=torch.int32, device=table.device)
        table[b, :n] = order
        k[start:start + n] = inp.k_cache[inp.block_table[b, :n].long()]
        v[start:start + n] = inp.v_cache[inp.block_table[b, :n].long()]
    return k, v, table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="prefill")
    ap.add_argument("--pages", default="16,256")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name in args.rows.split(","):
        case = CASES[name]
        for page in (int(p) for p in args.pages.split(",")):
            inp = make_inputs(case, page)
            k_seq, v_seq, table_seq = sequential(inp)
            layouts = {"random": (inp.k_cache, inp.v_cache, inp.block_table),
                       "sequential": (k_seq, v_seq, table_seq)}
            calls, outs = {}, {}
            for order, (k, v, table) in layouts.items():
                a = (inp.q, k, v, inp.cu_seqlens_q, inp.cache_seqlens, table)
                plan = kvonce.PagedPrefillPlan(*a, max_seqlen_q=max(case.q_lens))
                outs[order] = plan.run(*a)
                calls[order] = (lambda plan=plan, a=a: plan.run(*a))
            equal = torch.equal(outs["random"], outs["sequential"])
            times = {order: ([], []) for order in calls}
            for _ in range(args.rounds):
                for order, fn in calls.items():
                    times[order][0].append(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                                   return_mode="median"))
                    times[order][1].append(triton.testing.do_bench_cudagraph(
                        fn, rep=100, return_mode="median"))
            for order in calls:
                eager, graph = (statistics.median(t) for t in times[order])
                rows.append([case.label, page, order, f"{case.flops() / eager / 1e9:.1f}",
                             f"{case.flops() / graph / 1e9:.1f}", equal])
            print(tabulate(rows[-2:]), flush=True)
    print(tabulate(rows, headers=["row", "page", "pages", "TFLOP/s eager", "TFLOP/s graphs",
                                  "outputs equal"]))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
