"""Launch-config sweep of the quantized paged decode (CUDA), CUDA-graph timing.

    PYTHONPATH=src python scripts/quant_decode_sweep.py [--formats int8,int4] [--quick]
        [--shapes 1x131072] [--heads 32/8,12/12] [--layout nhd|hnd]
        [--grid 64,4,2 128,4,2 128,4,2,6,64] [--splits 0,16,32]
(a grid entry: block_n, num_warps, num_stages[, programs_per_sm[, max_merged_splits[,
max_registers[, swap_ab[, f16_math[, int64_kv_offsets[, v_pairs[, slow_lo[, round_up[,
outlier_max_registers[, prefetch_pages[, merge_splits_at_once[, head_pairs[, gluon]]]]]]]]]]]]]]];
-1 keeps the row's value; slow_lo x sets slow_programs_per_sm to (x, 6.5)). ``gluon`` 1: the Gluon
decode (kernels/gluon_decode.py, its own split count) where the launch fits it (the other fields
then do not apply to it; ``--int8-ring`` brings int8's scales by TMA, ``--swap-ab`` picks the
swapped-operand consumers); every entry runs the Triton
kernel otherwise. ``--splits``: each entry also at these split counts (0: the plan's).
``--outliers N``: every quantized cache as dense-and-sparse keys (``KeyOutliers``, N fp16 channels per KV head from the first 2048 keys),
its launches with ``key_outliers=``.

GQA 32/8 (or ``--heads``: q/kv head pairs), d128, page 16 (``--page``), random page order, q_len 1, fp16
queries (``--dtype bf16``: bf16 queries and source cache; "fp16" below is then bf16), the issue's
three shapes. ``--layout hnd``: every cache and per-token scale stored head-major (the same
logical tensors, ``kvonce.bench.quant.stored``), the fp16 baseline's too.
For each format and shape: every (block_n, num_warps, num_stages) in the grid (over the format's
own config row: its split knobs stay unless the entry sets them) through
``PagedDecodePlan(config=...)`` (split count auto), replayed in a CUDA graph (do_bench median);
prints the best configs and their speedup over the fp16 cache with its own tuned config.
"""
import argparse
import dataclasses
import itertools

import torch
import triton.testing

import kvonce
from decode_ncu_case import paged_case
from kvonce.bench.quant import stored
from kvonce.kernels.configs import get_paged_decode_config

SHAPES = [(16, 4096), (64, 8192), (1, 131072)]


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return 1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=60, return_mode="median")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--formats", default="fp8_e4m3,int8,int4")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--shapes", default="", help="only these BATCHxLEN, comma-separated")
    p.add_argument("--heads", default="32/8", help="q/kv head counts, comma-separated")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"), help="queries and cache")
    p.add_argument("--int8-ring", type=int, default=1, choices=(0, 1),
                   help="gluon=1 entries bring head-major int8 scales by TMA "
                        "(INT8_SCALES_BY_TMA, 1 shipped) or 0: a load a key")
    p.add_argument("--int8-v-biased", type=int, default=0, choices=(0, 1),
                   help="gluon=1 entries convert int8 V to 1152 + x, the bias off at the end "
                        "(INT8_V_BIASED: measured even on the H200, off by default)")
    p.add_argument("--swap-ab", type=int, default=-1, choices=(-1, 0, 1),
                   help="gluon=1 entries run the swapped-operand consumers where the packed rows "
                        "fit 8: 1 every format, 0 none, -1 the shipped GLUON_SWAP_FORMATS (int4)")
    p.add_argument("--int4-tile", type=int, default=0, choices=(0, 128, 256),
                   help="int4's swapped consumers' tile keys (INT4_SWAPPED_TILE_KEYS: 128 "
                        "shipped, 256 compiled 2026-11-29); 0 keeps the module's")
    p.add_argument("--int4-stages", type=int, default=0,
                   help="with --int4-tile 256: its ring stages (INT4_SWAPPED_STAGES; 0: two)")
    p.add_argument("--splits", default="0",
                   help="split counts each grid entry runs at, comma-separated (0: the plan's)")
    p.add_argument("--layout", default="nhd", choices=("nhd", "hnd"), help="page storage")
    p.add_argument("--page", type=int, default=16,
                   help="keys a page (the Gluon decode's TMA boxes: a page's rows at most 128)")
    p.add_argument("--all", action="store_true", help="also print every grid entry's time")
    p.add_argument("--outliers", type=int, default=0, help="KeyOutliers with N channels")
    p.add_argument("--grid", nargs="*", default=[],
                   help="only these BLOCK_N,WARPS,STAGES[,PROGRAMS_PER_SM[,MAX_MERGED_SPLITS"
                        "[,MAX_REGISTERS[,SWAP_AB[,F16_MATH[,INT64[,V_PAIRS]]]]]]]")
    args = p.parse_args()
    grid = list(itertools.product((32, 64, 128), (4, 8), (2, 3, 4)))
    if args.quick:
        grid = list(itertools.product((128, 256), (4, 8), (2, 3)))
    if args.grid:
        grid = [tuple(float(x) if "." in x else int(x) for x in g.split(","))
                for g in args.grid]
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in sh.split("x")) for sh in args.shapes.split(",")]
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")]
    splits_list = [int(x) for x in args.splits.split(",")]
    from kvonce.kernels import gluon_decode
    gluon_decode.INT8_SCALES_BY_TMA = bool(args.int8_ring)
    gluon_decode.INT8_V_BIASED = bool(args.int8_v_biased)
    if args.int4_tile:
        gluon_decode.INT4_SWAPPED_TILE_KEYS = args.int4_tile
    gluon_decode.INT4_SWAPPED_STAGES = args.int4_stages
    if args.swap_ab >= 0:
        gluon_decode.GLUON_SWAP_FORMATS = (1, 2, 3) if args.swap_ab else ()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    print("| heads | batch x len | format | best (block_n, warps, stages) | us | 2nd | 3rd | default us |"
          " fp16 us | speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (hq, hk), (batch, length) in itertools.product(heads, shapes):
        q, k, v, table, seqlens, _ = paged_case(hq, hk, batch, length, dtype=dtype,
                                                page=args.page)
        k, v = stored(k, args.layout), stored(v, args.layout)
        pages = k.shape[0]
        plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table)
        fp16_us = graph_us(lambda: plan.run(q, k, v, seqlens, table))
        for fmt in args.formats.split(","):
            ko, keys = None, k
            if args.outliers:
                ko = kvonce.new_key_outliers(kvonce.calibrate_outlier_channels(
                    k.reshape(-1, hk, 128)[:2048], n=args.outliers), pages, args.page)
                keys, sparse = ko.split(k)
                ko.values.copy_(sparse)
            kq, ks, vq, vs = (stored(t, args.layout) for t in (*kvonce.quantize_kv(keys, fmt),
                                                                 *kvonce.quantize_kv(v, fmt)))
            # Grid entries override the format's own row (its split knobs and f16_math kept).
            fmt_cfg = get_paged_decode_config(torch.cuda.get_device_capability(), 128, fmt, 2,
                                              bf16=dtype == torch.bfloat16)
            res = []
            for spec, n_splits in itertools.product(grid, splits_list):
                bn, w, st = spec[:3]
                # the Triton kernel's knobs: the fp8 row's Gluon launch off
                cfg = dataclasses.replace(fmt_cfg, block_n=bn, num_warps=w, num_stages=st,
                                          gluon=False)
                # optional fields; -1 keeps the row's value
                fields = ("programs_per_sm", "max_merged_splits", "max_registers", "swap_ab",
                          "f16_math", "int64_kv_offsets", "v_pairs", "slow_programs_per_sm",
                          "splits_round_up", "outlier_max_registers", "prefetch_pages",
                          "merge_splits_at_once", "head_pairs", "gluon")
                kinds = (float, int, int, bool, bool, bool, bool, lambda x: (x, 6.5), bool, int,
                         bool, int, bool, bool)
                for name, kind, value in zip(fields, kinds, spec[3:]):
                    if value >= 0:
                        cfg = dataclasses.replace(cfg, **{name: kind(value)})
                try:
                    pl = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks,
                                                v_scale=vs, config=cfg, num_splits=n_splits,
                                                kv_format="int4" if fmt == "int4" else None)
                    us = graph_us(lambda: pl.run(q, kq, vq, seqlens, table, k_scale=ks,
                                                 v_scale=vs, key_outliers=ko))
                except Exception as exc:  # noqa: BLE001 (out of shared memory etc.)
                    print(f"  {fmt} {spec}: {type(exc).__name__}"[:120])
                    continue
                res.append((us, tuple(spec) + ((f"s{n_splits}",) if n_splits else ())))
            if args.all:
                print(f"  {hq}/{hk} {batch}x{length} {fmt}: "
                      + ", ".join(f"{c} {u:.1f}" for u, c in res), flush=True)
            res.sort()
            pl = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                        kv_format="int4" if fmt == "int4" else None)
            default_us = graph_us(lambda: pl.run(q, kq, vq, seqlens, table, k_scale=ks,
                                                 v_scale=vs, key_outliers=ko))
            top = [f"{c} {u:.1f}" for u, c in res[1:3]]
            print(f"| {hq}/{hk} | {batch} x {length} | {fmt} | {res[0][1]} | {res[0][0]:.1f} | "
                  f"{' | '.join(top)} | {default_us:.1f} | {fp16_us:.1f} | "
                  f"{fp16_us / res[0][0]:.2f} |", flush=True)
        del k, v


if __name__ == "__main__":
    main()
