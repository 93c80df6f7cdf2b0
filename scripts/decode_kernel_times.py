"""Where a paged decode call's time goes: each kernel's device time (torch.profiler over CUDA-graph
replays) beside the replay's median, for the default plan.

    PYTHONPATH=src python scripts/decode_kernel_times.py [--cases 32/8:1x131072:int4,...]
        [--layout nhd|hnd]

d128, page 16, random page order, q_len 1, fp16 q (``decode_ncu_case.paged_case``). Per case:
the split count, the graph median (us), each kernel's mean device time a call (us) and the rest
(launch gaps and the graph's own cost).
"""
import argparse
import collections
import sys

import torch

import kvonce

sys.path.insert(0, "scripts")
from decode_ncu_case import paged_case  # noqa: E402
from quant_decode_sweep import graph_us  # noqa: E402

from kvonce.bench.quant import stored  # noqa: E402

CASES = ("32/8:1x131072:plain,32/8:1x131072:fp8_e4m3,32/8:1x131072:int8,32/8:1x131072:int4,"
         "12/12:1x131072:plain,12/12:1x131072:fp8_e4m3,12/12:1x131072:int8,"
         "12/12:1x131072:int4,32/8:64x8192:int4,32/8:64x8192:fp8_e4m3")


def kernel_times(fn, calls: int = 20) -> dict:
    """Mean device time a call (us) of each kernel ``fn`` launches, over ``calls`` graph
    replays."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            g.replay()
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:40]] += event.device_time / calls
    return dict(totals)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=CASES)
    p.add_argument("--layout", default="nhd", choices=("nhd", "hnd"))
    args = p.parse_args()
    print("| heads | shape | cache | splits | graph us | kernels (us a call) | rest us |")
    print("|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        heads, shape, fmt = case.split(":")
        hq, hk = map(int, heads.split("/"))
        batch, length = map(int, shape.split("x"))
        q, k, v, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt)
        k, v = stored(k, args.layout), stored(v, args.layout)
        kw = {name: stored(t, args.layout) for name, t in kw.items()}
        plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table, **kw,
                                      kv_format="int4" if fmt == "int4" else None)
        fn = lambda: plan.run(q, k, v, seqlens, table, **kw)  # noqa: E731
        us = graph_us(fn)
        times = kernel_times(fn)
        listed = ", ".join(f"{name} {t:.1f}" for name, t in sorted(times.items(),
                                                                   key=lambda x: -x[1]))
        print(f"| {heads} | {shape} | {fmt} | {plan.num_splits} | {us:.1f} | {listed} | "
              f"{us - sum(times.values()):.1f} |", flush=True)
        del q, k, v, kw, plan


if __name__ == "__main__":
    main()
