"""CUDA-graph time of the paged decode at forced split counts (the evidence behind the split
rule's bands, ``kvonce.paged.splits``):

    PYTHONPATH=src python scripts/forced_splits.py [--formats plain,fp8_e4m3,int8,int4]
        [--cases 12/12:64x8192,32/8:96x4096] [--splits 1,2,3,4] [--dtype fp16|bf16]
        [--configs "64/4/2 128/4/3 64/4/3/pf"]

d128, page 16, random page order, q_len 1. Per case and format: the auto count and its time,
then each forced count's (skipping splits shorter than 512 keys), in us. 2026-11-27 (sixth
session) tables in docs/benchmarks.md.
"""
import argparse
import dataclasses
import sys

import torch

import kvonce
from kvonce.kernels.configs import get_paged_decode_config

sys.path.insert(0, "scripts")
from decode_ncu_case import paged_case  # noqa: E402
from quant_decode_sweep import graph_us  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--formats", default="plain,fp8_e4m3,int8,int4")
    p.add_argument("--cases", default="32/8:64x8192,12/12:64x8192",
                   help="HQ/HK:BATCHxLEN, comma-separated")
    p.add_argument("--splits", default="1,2,3,4")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--configs", default="",
                   help="BLOCK_N/WARPS/STAGES[/pf] tile configs over the row's (plain format "
                        "only), space-separated; each gets its own line")
    args = p.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    counts = [int(s) for s in args.splits.split(",")]
    for case in args.cases.split(","):
        heads, shape = case.split(":")
        hq, hk = (int(x) for x in heads.split("/"))
        batch, length = (int(x) for x in shape.split("x"))
        for fmt in args.formats.split(","):
            q, kk, vv, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt, dtype)
            for cfg_text in (args.configs.split() if fmt == "plain" else []) or [""]:
                config = None
                if cfg_text:
                    block_n, warps, stages, *pf = cfg_text.split("/")
                    base = get_paged_decode_config(torch.cuda.get_device_capability(), 128)
                    config = dataclasses.replace(base, block_n=int(block_n),
                                                 num_warps=int(warps), num_stages=int(stages),
                                                 prefetch_pages=bool(pf))
                row = []
                for s in [0] + [c for c in counts if c == 1 or length // c >= 512]:
                    plan = kvonce.PagedDecodePlan(q, kk, vv, seqlens, table, num_splits=s, **kw,
                                                  kv_format="int4" if fmt == "int4" else None,
                                                  config=config)
                    us = graph_us(lambda: plan.run(q, kk, vv, seqlens, table, **kw))
                    row.append(f"{f'auto={plan.num_splits}' if s == 0 else s}:{us:.1f}")
                print(f"{hq}/{hk} {batch}x{length} ({batch * hk / 132:.1f} programs/SM) {fmt}"
                      f"{' ' + cfg_text if cfg_text else ''}: " + "  ".join(row), flush=True)


if __name__ == "__main__":
    main()
