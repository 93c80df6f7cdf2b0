"""Is a prefill row's page-16 gap the page lookups and boxes, or where the pages lie? Variants
``PAGE:ORDER[:OPTION...]`` of `bench prefill`'s inputs: ORDER ``random`` is the bench's block
table (a random permutation of the pool's pages), ``sequential`` a copy with every sequence's
pages back to back in order (page p of sequence b at ``first_page[b] + p``: the same keys, so
the outputs equal the random order's). Options (probes of ``gluon_prefill``): ``bN`` caps the
TMA boxes at N rows (``BOX_ROWS``: page 256 with ``b16`` issues page 16's copies over page
256's layout), ``one`` looks a tile's pages up once (``PROBE_TILE_LOOKUP``; right only with
``sequential``). All variants timed in alternated rounds, eager (``do_bench``) and CUDA-graph
(``do_bench_cudagraph``) medians, TFLOP/s, and whether each output equals its page size's
first variant's:

    PYTHONPATH=src python scripts/prefill_page_order.py [--rows prefill]
        [--variants 16:random,16:sequential,256:random,256:sequential] [--rounds 3]
"""
import argparse
import itertools
import statistics

import torch
import triton.testing
from tabulate import tabulate

import kvonce
from kvonce.bench.prefill import CASES, make_inputs
from kvonce.kernels import gluon_prefill


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
    ap.add_argument("--variants", default="16:random,16:sequential,256:random,256:sequential")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name in args.rows.split(","):
        case = CASES[name]
        inputs, calls, outs = {}, {}, {}
        for variant in args.variants.split(","):
            page, order, *options = variant.split(":")
            if page not in inputs:
                inp = make_inputs(case, int(page))
                inputs[page] = (inp, sequential(inp))
            inp, seq = inputs[page]
            k, v, table = ((inp.k_cache, inp.v_cache, inp.block_table) if order == "random"
                           else seq)
            a = (inp.q, k, v, inp.cu_seqlens_q, inp.cache_seqlens, table)
            gluon_prefill.BOX_ROWS = next((int(o[1:]) for o in options if o[0] == "b"), None)
            gluon_prefill.PROBE_TILE_LOOKUP = "one" in options
            plan = kvonce.PagedPrefillPlan(*a, max_seqlen_q=max(case.q_lens))
            gluon_prefill.BOX_ROWS, gluon_prefill.PROBE_TILE_LOOKUP = None, False
            outs[variant] = plan.run(*a)
            calls[variant] = (lambda plan=plan, a=a: plan.run(*a))
        times = {variant: ([], []) for variant in calls}
        for _ in range(args.rounds):
            for variant, fn in calls.items():
                times[variant][0].append(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                                 return_mode="median"))
                times[variant][1].append(triton.testing.do_bench_cudagraph(
                    fn, rep=100, return_mode="median"))
        for variant in calls:
            first = next(v for v in calls if v.split(":")[0] == variant.split(":")[0])
            eager, graph = (statistics.median(t) for t in times[variant])
            rows.append([case.label, variant, f"{case.flops() / eager / 1e9:.1f}",
                         f"{case.flops() / graph / 1e9:.1f}",
                         torch.equal(outs[variant], outs[first])])
        print(tabulate(rows[-len(calls):]), flush=True)
    print(tabulate(rows, headers=["row", "page:order[:options]", "TFLOP/s eager", "TFLOP/s graphs",
                                  "output = the page's first"]))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
