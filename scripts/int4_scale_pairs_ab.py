"""A/B of the int4 decode's group-scale loads (CUDA, CUDA-graph timing): each key's four fp16
scales as two 32-bit loads (``SCALE_PAIRS``, aligned scales: the shipped path) against four
fp16 loads (the same cache's scales copied to an odd fp16 offset, where the launch falls back to
them: the path before 2026-11-27). Same plan, same data, same run; the 16-bit cache beside.

    PYTHONPATH=src python scripts/int4_scale_pairs_ab.py [--dtype fp16,bf16] [--outliers 0,8]
        [--heads 32/8,12/12] [--shapes 64x8192,1x131072] [--repeat N] [--max-registers N]

GQA 32/8 and MHA 12/12, d128, page 16, random page order, q_len 1, at 64 x 8192 and 1 x 131072
(``bench quant``'s rows). Prints us and the speed over the 16-bit cache; ``--repeat N`` times
the two forms N times each, alternating, and prints each time.
"""
import argparse
import dataclasses

import torch
import triton.testing

import kvonce
from kvonce.kernels.configs import get_paged_decode_config


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return 1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=60, return_mode="median")


def odd_offset(t):
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    return view


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp16,bf16")
    ap.add_argument("--outliers", default="0,8")
    ap.add_argument("--heads", default="32/8,12/12")
    ap.add_argument("--shapes", default="64x8192,1x131072")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--max-registers", type=int, default=-1,
                    help="the int4 plan's max_registers (-1: its config row's)")
    args = ap.parse_args()
    print("| q | heads | batch x len | outliers | 16-bit us | int4 fp16 scale loads us | "
          "int4 32-bit pairs us | x before | x after | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dname in args.dtype.split(","):
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dname]
        for hq, hk in (tuple(map(int, h.split("/"))) for h in args.heads.split(",")):
            for batch, length in (tuple(map(int, x.split("x"))) for x in args.shapes.split(",")):
                torch.manual_seed(0)
                pages = batch * length // 16
                q = torch.randn(batch, 1, hq, 128, device="cuda", dtype=dtype)
                k = torch.randn(pages, 16, hk, 128, device="cuda", dtype=dtype)
                v = torch.randn_like(k)
                table = torch.randperm(pages, device="cuda").reshape(batch, -1).to(torch.int32)
                lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
                dense = kvonce.PagedDecodePlan(q, k, v, lens, table)
                dense_us = graph_us(lambda: dense.run(q, k, v, lens, table))
                for n in (int(x) for x in args.outliers.split(",")):
                    ko, keys = None, k
                    if n:
                        ko = kvonce.new_key_outliers(kvonce.calibrate_outlier_channels(
                            k.reshape(-1, hk, 128)[:2048], n=n), pages, 16)
                        keys, sparse = ko.split(k)
                        ko.values.copy_(sparse)
                    kq, ks = kvonce.quantize_kv(keys, "int4")
                    vq, vs = kvonce.quantize_kv(v, "int4")
                    ks_odd, vs_odd = odd_offset(ks), odd_offset(vs)
                    config = get_paged_decode_config(torch.cuda.get_device_capability(), 128,
                                                     "int4", 2, bf16=dtype == torch.bfloat16)
                    if args.max_registers >= 0:
                        config = dataclasses.replace(config, max_registers=args.max_registers)
                    plan = kvonce.PagedDecodePlan(q, kq, vq, lens, table, k_scale=ks,
                                                  v_scale=vs, kv_format="int4", config=config)
                    run = lambda a, b: plan.run(q, kq, vq, lens, table, k_scale=a,  # noqa: E731
                                                v_scale=b, key_outliers=ko)
                    diff = (run(ks, vs).float() - run(ks_odd, vs_odd).float()).abs().max().item()
                    for _ in range(args.repeat):
                        before = graph_us(lambda: run(ks_odd, vs_odd))
                        after = graph_us(lambda: run(ks, vs))
                        print(f"| {dname} | {hq}/{hk} | {batch} x {length} | {n} | "
                              f"{dense_us:.1f} | {before:.1f} | {after:.1f} | "
                              f"{dense_us / before:.2f} | {dense_us / after:.2f} | {diff:.1e} |",
                              flush=True)


if __name__ == "__main__":
    main()
