"""The Gluon quantized decode's roofline probe (CUDA, sm_90): where each shipped route's time
goes, memory or math.

    PYTHONPATH=src python scripts/quant_decode_probe.py [--heads 32/8,12/12]
        [--shapes 64x8192,1x131072] [--formats fp8_e4m3,int8,int4] [--dtype fp16|bf16]

For each case, the plan's own launch (``PagedDecodePlan``, default config: the Gluon decode
where the plan routes it; ``--force-gluon`` also where it does not) timed three ways in CUDA
graphs (``do_bench`` medians): the kernel (``gluon_decode.ROOFLINE_PROBE`` 0), memory only (1:
the consumers wait for each tile's slots and free them, reading nothing) and math only (2: the
loader copies the ring's first round and then passes the slots on without copying), beside
the fp16 cache's plan at the same shape. A route whose time sits on its memory-only time is
held by the loader and the memory; one on its math-only time by its consumers. TB/s: the
bytes a call reads (``kvonce.bench.quant.bytes_read``) over the time. Outputs of the probes
are garbage (not checked); the kernel's are checked against the fp16 plan's.
"""
import argparse
import dataclasses
import itertools

import torch

import kvonce
from decode_ncu_case import paged_case
from quant_decode_sweep import graph_us
from kvonce.bench.quant import Case, bytes_read, stored
from kvonce.kernels import gluon_decode


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", default="32/8,12/12")
    p.add_argument("--shapes", default="64x8192,1x131072")
    p.add_argument("--formats", default="fp8_e4m3,int8,int4")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--layout", default="nhd",
                   help="page storage of every cache (kvonce.bench.quant.stored: nhd, hnd), "
                        "comma-separated")
    p.add_argument("--loaders", default="1",
                   help="loader warps, 1 or 4 (gluon_decode.GLUON_LOADERS, every format), "
                        "comma-separated")
    p.add_argument("--int4-stages", default="0",
                   help="int4's ring stages (gluon_decode.INT4_VARIANT; 0 the module's), "
                        "comma-separated")
    p.add_argument("--triton", action="store_true",
                   help="also time the format's Triton row (config gluon off)")
    p.add_argument("--probes", default="0,1,2",
                   help="ROOFLINE_PROBE values, 0 first (3, 4: without the scales' copies)")
    p.add_argument("--int4-tile", type=int, default=0,
                   help="int4's swapped tile keys (gluon_decode.INT4_SWAPPED_TILE_KEYS; 0 the "
                        "module's)")
    p.add_argument("--int4-v-unbiased", action="store_true",
                   help="int4 V as n, not 1024 + n, on the swapped consumers "
                        "(gluon_decode.INT4_V_BIASED off)")
    p.add_argument("--int8-fp16-key-loads", action="store_true",
                   help="int8's fp16 scales a key at a time (INT8_FP16_SCALE_RING off)")
    p.add_argument("--int4-pairs", default="fp16",
                   help="int4's (scale, offset) dtypes (quantize_kv's scale_dtype): fp16,fp32")
    p.add_argument("--int8-scales", default="fp16",
                   help="int8's scale dtypes (quantize_kv's scale_dtype): fp16,fp32")
    p.add_argument("--kv-head-groups", default="1",
                   help="the most KV heads a CTA (gluon_decode.GLUON_KV_HEAD_GROUPS, every "
                        "format; head-major pages), comma-separated")
    p.add_argument("--cp-async", default="0",
                   help="fp8's loaders by cp.async (gluon_decode.GLUON_CP_ASYNC_FORMATS): 0, 1 "
                        "or both, comma-separated")
    p.add_argument("--int4-defer-sums", type=int, choices=(0, 1), default=None,
                   help="int4's rows' sums a thread's part a tile (gluon_decode.INT4_DEFER_SUMS:"
                        " 1, shipped) or a tile's shuffles (0); default: the module's")
    p.add_argument("--force-gluon", action="store_true",
                   help="int4 on the Gluon decode where the plan would run Triton")
    args = p.parse_args()
    if args.int4_tile:
        gluon_decode.INT4_SWAPPED_TILE_KEYS = args.int4_tile
    gluon_decode.INT4_V_BIASED = not args.int4_v_unbiased
    if args.int4_defer_sums is not None:
        gluon_decode.INT4_DEFER_SUMS = bool(args.int4_defer_sums)
    gluon_decode.INT8_FP16_SCALE_RING = not args.int8_fp16_key_loads
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    loaders = [int(x) for x in args.loaders.split(",")]
    probes = [int(x) for x in args.probes.split(",")]
    int4_stages = [int(x) for x in args.int4_stages.split(",")]
    head_groups = [int(x) for x in args.kv_head_groups.split(",")]
    cp_modes = [int(x) for x in args.cp_async.split(",")]
    assert probes[0] == 0, "--probes: the kernel (0) first"
    names = {0: "kernel us", 1: "memory only", 2: "math only", 3: "no scales",
             4: "memory only, no scales"}
    print("| heads | batch x len | layout | format | loaders | route | "
          + " | ".join(names[pr] for pr in probes)
          + " | Triton row us | fp16 us | x fp16 | TB/s kernel / fp16 |")
    print("|---" * (10 + len(probes)) + "|")
    for (hq, hk), (batch, length), layout in itertools.product(heads, shapes,
                                                               args.layout.split(",")):
        q, k, v, table, seqlens, _ = paged_case(hq, hk, batch, length, dtype=dtype)
        k, v = stored(k, layout), stored(v, layout)
        case = Case(batch, length, hq, hk, "")
        base = kvonce.PagedDecodePlan(q, k, v, seqlens, table)
        ref = base.run(q, k, v, seqlens, table).float()
        fp16_us = graph_us(lambda: base.run(q, k, v, seqlens, table))
        fp16_tbs = bytes_read(case, None) / fp16_us / 1e6
        scale_dtypes = {"fp16": torch.float16, "fp32": torch.float32}
        scale_lists = {"int4": args.int4_pairs.split(","), "int8": args.int8_scales.split(",")}
        for fmt, n_loaders, n_stages, pairs, most, cp in itertools.product(
                args.formats.split(","), loaders, int4_stages,
                sorted(set(scale_lists["int4"] + scale_lists["int8"])), head_groups, cp_modes):
            if cp and fmt != "fp8_e4m3":
                continue
            if n_stages and fmt != "int4":
                continue
            if pairs not in scale_lists.get(fmt, [pairs]) or (
                    fmt not in scale_lists and pairs != "fp16"):
                continue
            sd = scale_dtypes[pairs] if fmt in scale_lists else None
            (kq, ks), (vq, vs) = (kvonce.quantize_kv(t, fmt, scale_dtype=sd) for t in (k, v))
            kq, ks, vq, vs = (stored(t, layout) for t in (kq, ks, vq, vs))
            kw = dict(k_scale=ks, v_scale=vs)
            times, route = [], "?"
            for probe in probes:
                gluon_decode.ROOFLINE_PROBE = probe
                saved = dict(gluon_decode.GLUON_LOADERS)
                gluon_decode.GLUON_LOADERS.update({code: n_loaders for code in saved})
                saved_stages = gluon_decode.INT4_VARIANT["stages"]
                gluon_decode.INT4_VARIANT["stages"] = n_stages or saved_stages
                saved_groups = gluon_decode.GLUON_KV_HEAD_GROUPS
                gluon_decode.GLUON_KV_HEAD_GROUPS = {1: most, 2: most, 3: most}
                gluon_decode.GLUON_CP_ASYNC_FORMATS = (1,) if cp else ()
                try:
                    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table,
                                                  kv_format="int4" if fmt == "int4" else None,
                                                  **kw)
                    if args.force_gluon and not plan.uses_gluon:
                        cfg = dataclasses.replace(plan.config, gluon=True)
                        plan = kvonce.PagedDecodePlan(
                            q, kq, vq, seqlens, table, config=cfg,
                            kv_format="int4" if fmt == "int4" else None, **kw)
                    code = {"fp8_e4m3": 1, "int8": 2, "int4": 3}[fmt]
                    group = gluon_decode.kv_head_group(q, kq, code, ks, vs)
                    route = (f"gluon, {plan.num_splits} splits, {group} heads a CTA"
                             + (", cp.async" if cp else "")
                             if plan.uses_gluon else f"triton, {plan.num_splits} splits")
                    if probe and not plan.uses_gluon:
                        times.append(float("nan"))
                        continue
                    if probe == 0:
                        err = (plan.run(q, kq, vq, seqlens, table, **kw).float() - ref).abs()
                        assert err.max().item() < 0.1, (fmt, n_loaders, err.max().item())
                    times.append(graph_us(lambda: plan.run(q, kq, vq, seqlens, table, **kw)))
                finally:
                    gluon_decode.ROOFLINE_PROBE = 0
                    gluon_decode.GLUON_LOADERS.update(saved)
                    gluon_decode.INT4_VARIANT["stages"] = saved_stages
                    gluon_decode.GLUON_KV_HEAD_GROUPS = saved_groups
                    gluon_decode.GLUON_CP_ASYNC_FORMATS = ()
            triton_us = float("nan")
            if args.triton:   # the format's Triton row on the same caches
                cfg = dataclasses.replace(plan.config, gluon=False)
                tri = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, config=cfg,
                                             kv_format="int4" if fmt == "int4" else None, **kw)
                triton_us = graph_us(lambda: tri.run(q, kq, vq, seqlens, table, **kw))
            nbytes = bytes_read(case, fmt, int4_pair_bytes=4 if pairs == "fp16" else 8,
                                int8_scale_bytes=2 if pairs == "fp16" else 4)
            stages = f", {n_stages} stages" if n_stages else ""
            label = {"int4": f"int4 ({pairs} pairs)", "int8": f"int8 ({pairs} scales)"}.get(
                fmt, fmt)
            print(f"| {hq}/{hk} | {batch} x {length} | {layout} | {label} | "
                  f"{n_loaders}{stages} | {route} | "
                  + " | ".join(f"{t:.1f}" for t in times)
                  + f" | {triton_us:.1f} | {fp16_us:.1f} | {fp16_us / times[0]:.2f} | "
                  f"{nbytes / times[0] / 1e6:.2f} / {fp16_tbs:.2f} |", flush=True)
        del k, v


if __name__ == "__main__":
    main()
