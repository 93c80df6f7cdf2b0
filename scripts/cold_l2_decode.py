"""Decode against dense SDPA with the caches warm in L2 and cold: how much of a short row's time
is the benchmark's L2 (a 67 MB call replayed back to back keeps part of its data in H100's 50 MB
L2; a serving step reads each layer's cache once, after the other layers have gone through L2).

    PYTHONPATH=src python scripts/cold_l2_decode.py [--cases plain:12/2:128x512,...]
        [--copies 4] [--rounds 2]

Per case: ``--copies`` copies of the same paged cache (and of its dense form for SDPA), each in
its own memory; "warm" = each call on copy 0 (as `bench decode`), "cold" = the calls cycle
through the copies, so each call's data were last read ``copies - 1`` calls ago (pick
``copies * bytes`` well over the L2). CUDA-graph time a call (``do_bench_cudagraph`` of
``copies`` calls, medians of rounds), fp16 q, d128, page 16, random page order
(``decode_ncu_case.paged_case``).
"""
import argparse
import sys

import torch
import triton.testing
from tabulate import tabulate

import kvonce

sys.path.insert(0, "scripts")
from decode_ncu_case import paged_case, parse_case  # noqa: E402

CASES = ("plain:12/2:128x512,plain:12/2:64x1024,plain:12/2:8x8192,plain:12/2:1x65536,"
         "plain:32/8:128x512,plain:32/8:64x1024,plain:12/12:64x1024,plain:12/2:128x2048")


def per_call_us(calls) -> float:
    def fn():
        for call in calls:
            call()
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") / len(calls)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=CASES)
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    rows = []
    for case in args.cases.split(","):
        fmt, hq, hk, batch, length = parse_case(case)
        copies = [paged_case(hq, hk, batch, length, fmt) for _ in range(args.copies)]
        q, k0, v0, table0, seqlens, kw = copies[0]
        plan = kvonce.PagedDecodePlan(q, k0, v0, seqlens, table0, **kw)
        dense = [[x[table.long()].reshape(batch, length, hk, 128).transpose(1, 2).contiguous()
                  for x in (k, v)] for _, k, v, table, _, _ in copies]
        qt = q.transpose(1, 2)

        def kv_call(c):
            _, k, v, table, _, _ = c
            return lambda: plan.run(q, k, v, seqlens, table, **kw)

        def sdpa_call(d):
            return lambda: torch.nn.functional.scaled_dot_product_attention(qt, *d,
                                                                            enable_gqa=True)

        gb = 2 * batch * length * hk * 128 * q.element_size() / 1e9
        timings = {name: [] for name in ("kv warm", "kv cold", "sdpa warm", "sdpa cold")}
        for _ in range(args.rounds):
            timings["kv warm"].append(per_call_us([kv_call(copies[0])] * args.copies))
            timings["kv cold"].append(per_call_us([kv_call(c) for c in copies]))
            timings["sdpa warm"].append(per_call_us([sdpa_call(dense[0])] * args.copies))
            timings["sdpa cold"].append(per_call_us([sdpa_call(d) for d in dense]))
        med = {k: sorted(v)[len(v) // 2] for k, v in timings.items()}
        rows.append([case, f"{gb * 1e3:.0f}", plan.num_splits, f"{med['kv warm']:.1f}",
                     f"{med['sdpa warm']:.1f}", f"{med['sdpa warm'] / med['kv warm']:.3f}",
                     f"{med['kv cold']:.1f}", f"{med['sdpa cold']:.1f}",
                     f"{med['sdpa cold'] / med['kv cold']:.3f}",
                     f"{gb / med['kv cold'] * 1e3:.2f}"])
        print(rows[-1], flush=True)
        del copies, dense, plan
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, fp16 q, graph us a call, {args.copies} copies")
    print(tabulate(rows, headers=["case", "MB", "splits", "kv warm", "sdpa warm", "sdpa/kv warm",
                                  "kv cold", "sdpa cold", "sdpa/kv cold", "kv cold TB/s"],
                   tablefmt="github"))


if __name__ == "__main__":
    main()
