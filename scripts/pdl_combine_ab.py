"""A/B of the split-K combine as a programmatic dependent launch (``PagedDecodeConfig.pdl_combine``)
on the rows that run decode + combine (CUDA), CUDA-graph medians, alternating rounds.

    PYTHONPATH=src python scripts/pdl_combine_ab.py [--rounds 3]

Per row: the same plan with ``pdl_combine`` off and on (same split count), outputs compared bit
for bit, then graph time of each, the rounds interleaved so clock drift hits both alike.
"""
import argparse
import dataclasses

import torch
import triton.testing

import kvonce
from kvonce.kernels.configs import get_paged_decode_config

ROWS = [  # (q heads, kv heads, batch, length, format)
    (32, 8, 1, 131072, None), (32, 8, 1, 65536, None), (12, 2, 1, 131072, None),
    (12, 2, 1, 65536, None), (12, 2, 8, 8192, None), (12, 12, 1, 131072, None),
    (12, 12, 2, 32768, None),
    (32, 8, 1, 131072, "fp8_e4m3"), (12, 12, 1, 131072, "fp8_e4m3"),
    (32, 8, 1, 131072, "int8"), (12, 12, 1, 131072, "int8"),
    (32, 8, 1, 131072, "int4"), (12, 12, 1, 131072, "int4"),
]


def graph(fn):
    """``fn`` captured in a CUDA graph, and the tensor it returned there (rewritten by replays)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print("| heads | batch x len | cache | splits | off us | on us | on / off | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for hq, hk, batch, length, fmt in ROWS:
        torch.manual_seed(0)
        pages = batch * length // 16
        q = torch.randn(batch, 1, hq, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(pages, 16, hk, 128, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        table = torch.randperm(pages, device="cuda").reshape(batch, -1).to(torch.int32)
        seqlens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
        extra = {}
        if fmt is not None:
            k, ks = kvonce.quantize_kv(k, fmt)
            v, vs = kvonce.quantize_kv(v, fmt)
            extra = dict(k_scale=ks, v_scale=vs)
        base = get_paged_decode_config(torch.cuda.get_device_capability(), 128, fmt)
        outs, graphs, plans = [], [], []
        for pdl in (False, True):
            cfg = dataclasses.replace(base, pdl_combine=pdl)
            plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table, config=cfg,
                                          kv_format="int4" if fmt == "int4" else None, **extra)
            g, out = graph(lambda plan=plan: plan.run(q, k, v, seqlens, table, **extra))
            graphs.append(g)
            plans.append(plan)
            outs.append(out)
        for g in graphs:
            g.replay()
        torch.cuda.synchronize()
        same = torch.equal(outs[0], outs[1]) and not outs[1].isnan().any().item()
        times = [[], []]
        for _ in range(args.rounds):
            for i, g in enumerate(graphs):
                times[i].append(1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=60,
                                                              return_mode="median"))
        off, on = min(times[0]), min(times[1])
        print(f"| {hq}/{hk} | {batch} x {length} | {fmt or 'fp16'} | {plans[1].num_splits} | "
              f"{off:.1f} | {on:.1f} | {on / off:.3f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
