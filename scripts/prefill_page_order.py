"""Is a prefill row's page-16 gap the page lookups and boxes, or where the pages lie? Variants
``PAGE:ORDER[:OPTION...]`` of `bench prefill`'s inputs: ORDER ``random`` is the bench's block
table (a random permutation of the pool's pages), ``sequential`` a copy with every sequence's
pages back to back in order (page p of sequence b at ``first_page[b] + p``: the same keys, so
the outputs equal the random order's). Options (probes of ``gluon_prefill``): ``bN`` caps the
TMA boxes at N rows (``BOX_ROWS``: page 256 with ``b16`` issues page 16's copies over page
256's layout), ``one`` looks a tile's pages up once (``PROBE_TILE_LOOKUP``; right only with
``sequential``), ``first`` once a sequence (its first page's id, the others taken as
following it; right only with ``sequential``), ``rt`` takes the page size as a kernel
argument (``PROBE_RUNTIME_PAGE``: one binary for a box size's every page size), ``sN`` lays
the block table's rows N entries apart (Triton specializes an int argument divisible by 16:
``stride_btb``), ``ofP`` takes page size P's inputs (of that order) regrouped into pages of
PAGE rows over the same memory (``16:sequential:of256``: page 256's bytes, addresses, keys,
queries and lengths, looked up as page 16: only the block table differs). All variants
timed in alternated rounds, eager (``do_bench``) and CUDA-graph (``do_bench_cudagraph``)
medians, TFLOP/s, and whether each output equals the first output of the same keys:

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


def _data(variant):
    """Whose keys a variant reads: its page size's, or ``ofP``'s."""
    page, _, *options = variant.split(":")
    return next((o[2:] for o in options if o.startswith("of")), page)


def _caches(inp):
    return inp.k_cache, inp.v_cache, inp.block_table


def regroup(k, v, table, page_size):
    """Caches and block table of one page size as ``page_size``-row pages over the same memory
    (``page_size`` divides the pages): the same keys at the same addresses."""
    ratio = k.shape[1] // page_size
    sub = torch.arange(ratio, dtype=table.dtype, device=table.device)
    table = (table[:, :, None] * ratio + sub).flatten(1)
    return (k.view(-1, page_size, *k.shape[2:]), v.view(-1, page_size, *v.shape[2:]), table)


def ab_rows(case, calls, outs, rounds, data) -> list:
    """Table rows ``[row, variant, TFLOP/s eager, TFLOP/s graphs, output = its first]`` of
    ``calls`` (variant -> a no-argument run) timed in ``rounds`` alternated rounds (``do_bench``,
    L2 flushed, and ``do_bench_cudagraph`` medians), each output compared with the first
    variant's of the same ``data(variant)``."""
    times = {variant: ([], []) for variant in calls}
    for _ in range(rounds):
        for variant, fn in calls.items():
            times[variant][0].append(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                             return_mode="median"))
            times[variant][1].append(triton.testing.do_bench_cudagraph(
                fn, rep=100, return_mode="median"))
    rows = []
    for variant in calls:
        first = next(v for v in calls if data(v) == data(variant))
        eager, graph = (statistics.median(t) for t in times[variant])
        rows.append([case.label, variant, f"{case.flops() / eager / 1e9:.1f}",
                     f"{case.flops() / graph / 1e9:.1f}", torch.equal(outs[variant], outs[first])])
    return rows


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
            source = next((o[2:] for o in options if o.startswith("of")), None)
            if source is not None:   # the same bytes at the same addresses as page `source`'s
                if source not in inputs:
                    src = make_inputs(case, int(source))
                    inputs[source] = (src, sequential(src))
                k, v, table = regroup(*(inputs[source][1] if order == "sequential"
                                        else _caches(inputs[source][0])), int(page))
                inp = inputs[source][0]   # its queries and lengths too: only the table differs
            stride = next((int(o[1:]) for o in options
                           if o[0] == "s" and o[1:].isdigit()), None)
            if stride is not None:   # the same table, its rows ``stride`` entries apart
                wide = table.new_zeros(table.shape[0], stride)
                wide[:, :table.shape[1]] = table
                table = wide[:, :table.shape[1]]
            a = (inp.q, k, v, inp.cu_seqlens_q, inp.cache_seqlens, table)
            gluon_prefill.BOX_ROWS = next((int(o[1:]) for o in options
                                           if o[0] == "b" and o[1:].isdigit()), None)
            gluon_prefill.PROBE_TILE_LOOKUP = ("sequence" if "first" in options
                                               else "one" in options)
            gluon_prefill.PROBE_RUNTIME_PAGE = "rt" in options
            plan = kvonce.PagedPrefillPlan(*a, max_seqlen_q=max(case.q_lens))
            # The plan makes its launch (which reads the knobs) at its first run: run it before
            # the knobs go back (before 2026-11-30's thirty-eighth session they went back first,
            # and every knob variant ran the default kernel).
            outs[variant] = plan.run(*a)
            launch = next(iter(plan._launches.values()))._gluon
            c = launch._constexprs
            runtime_page = (gluon_prefill.PROBE_RUNTIME_PAGE and c["SCALAR_PAGES"]
                            and not c["TILE_LOOKUP"])
            if (launch.box != min(int(page), 128, gluon_prefill.BOX_ROWS or 128)
                    or (c["PAGE_SIZE"] == 0) != runtime_page):
                raise SystemExit(f"{variant}: the launch does not carry the variant's probes")
            gluon_prefill.BOX_ROWS, gluon_prefill.PROBE_TILE_LOOKUP = None, False
            gluon_prefill.PROBE_RUNTIME_PAGE = False
            calls[variant] = (lambda plan=plan, a=a: plan.run(*a))
        rows += ab_rows(case, calls, outs, args.rounds, _data)
        print(tabulate(rows[-len(calls):]), flush=True)
    print(tabulate(rows, headers=["row", "page:order[:options]", "TFLOP/s eager", "TFLOP/s graphs",
                                  "output = its keys' first"]))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
