"""Is a decode row's gap the kernel's or the page order's? The same plan over the same page
pool with the block table in random order (as every bench) and in sequential order (page p of
sequence b at ``b * pages_per_seq + p``: each KV head's rows of a sequence one strided run, as
in a dense cache; the two read different pages of the pool, so only their times compare),
CUDA-graph time (``do_bench_cudagraph`` medians, rounds alternated), dense SDPA beside for the
plain rows:

    PYTHONPATH=src python scripts/page_order_ab.py [--cases plain:12/2:128x512,int4:32/8:1x131072]
        [--layout nhd|hnd] [--scale-layout nhd|hnd] [--rounds 2] [--page 16]

d128, page 16 (``--page``), fp16 q, seed 0 (``decode_ncu_case.paged_case``).
"""
import argparse
import sys

import torch
from tabulate import tabulate

import kvonce

sys.path.insert(0, "scripts")
from decode_ncu_case import graph_us, paged_case, parse_case  # noqa: E402
from kvonce.bench.quant import stored  # noqa: E402

CASES = ("plain:12/2:128x512,plain:12/2:64x1024,plain:12/2:8x8192,plain:12/2:1x131072,"
         "plain:32/8:64x1024,plain:12/12:64x1024,fp8_e4m3:32/8:64x8192,fp8_e4m3:32/8:1x131072,"
         "int8:32/8:1x131072,int4:32/8:64x8192,int4:32/8:1x131072")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=CASES, help="FORMAT:HQ/HK:BATCHxLEN, comma-separated")
    p.add_argument("--layout", default="nhd", choices=("nhd", "hnd"))
    p.add_argument("--scale-layout", default="", choices=("", "nhd", "hnd"),
                   help="per-token scales stored this way ('' = as --layout)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--page", type=int, default=16, help="keys a page")
    args = p.parse_args()
    rows = []
    for case in args.cases.split(","):
        fmt, hq, hk, batch, length = parse_case(case)
        q, k, v, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt, page=args.page)
        k, v = stored(k, args.layout), stored(v, args.layout)
        kw = {name: stored(t, args.scale_layout or args.layout) for name, t in kw.items()}
        kv_format = "int4" if fmt == "int4" else None
        tables = {"random": table,
                  "sequential": torch.arange(table.numel(), device="cuda", dtype=torch.int32)
                  .view_as(table).contiguous()}
        runs = {}
        for order, t in tables.items():
            plan = kvonce.PagedDecodePlan(q, k, v, seqlens, t, **kw, kv_format=kv_format)
            runs[order] = (lambda plan=plan, t=t: plan.run(q, k, v, seqlens, t, **kw))
            runs[order]()
        if fmt == "plain":
            # The dense copy of the same logical cache: [batch, heads_k, len, d].
            dk = k[table.long()].reshape(batch, length, hk, 128).transpose(1, 2).contiguous()
            dv = v[table.long()].reshape(batch, length, hk, 128).transpose(1, 2).contiguous()
            qt = q.transpose(1, 2)
            runs["sdpa dense"] = lambda: torch.nn.functional.scaled_dot_product_attention(
                qt, dk, dv, enable_gqa=True)
        times = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, fn in runs.items():
                times[name].append(graph_us(fn))
        best = {name: min(ts) for name, ts in times.items()}
        row = {"case": case, "random us": best["random"], "sequential us": best["sequential"],
               "random / sequential": best["random"] / best["sequential"]}
        if "sdpa dense" in best:
            row["sdpa dense us"] = best["sdpa dense"]
            row["sdpa / random"] = best["sdpa dense"] / best["random"]
            row["sdpa / sequential"] = best["sdpa dense"] / best["sequential"]
        rows.append(row)
        print(row, flush=True)
        del q, k, v, kw, runs
        torch.cuda.empty_cache()
    print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".3g"))


if __name__ == "__main__":
    main()
