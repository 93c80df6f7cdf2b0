"""CUDA-graph time of paged decode per launch config (auto split counts) on the shapes that trail
FlashInfer or dense SDPA in docs/benchmarks.md (2026-11-23); a diagnostic for configs.py.

    PYTHONPATH=src python scripts/decode_config_sweep.py [VARIANT ...]

prints graph TB/s per variant (default: all of them; "/pf" ones look the page ids up a tile
ahead, ``prefetch_pages``)."""
import dataclasses
import sys

import torch
import triton.testing

from kvonce.bench.decode import Case, make_inputs
from kvonce.paged import PagedDecodePlan
from kvonce.kernels.configs import get_paged_decode_config

base = get_paged_decode_config(torch.cuda.get_device_capability(), 128)
variants = {"64/4w/2s": base,
            "64/4w/3s": dataclasses.replace(base, num_stages=3),
            "32/4w/3s": dataclasses.replace(base, block_n=32, num_stages=3),
            "32/4w/4s": dataclasses.replace(base, block_n=32, num_stages=4),
            "128/4w/2s": dataclasses.replace(base, block_n=128),
            "128/8w/2s": dataclasses.replace(base, block_n=128, num_warps=8),
            "64/8w/3s": dataclasses.replace(base, num_warps=8, num_stages=3),
            "64/2w/2s": dataclasses.replace(base, num_warps=2),
            "64/4w/2s/pf": dataclasses.replace(base, prefetch_pages=True),
            "64/4w/3s/pf": dataclasses.replace(base, num_stages=3, prefetch_pages=True),
            "128/4w/2s/pf": dataclasses.replace(base, block_n=128, prefetch_pages=True)}
if sys.argv[1:]:
    variants = {name: variants[name] for name in sys.argv[1:]}
shapes = [(12, 12, 128, 512), (12, 12, 64, 1024), (12, 12, 8, 8192), (12, 12, 1, 131072),
          (12, 2, 256, 256), (12, 2, 64, 1024), (12, 2, 8, 8192), (12, 2, 1, 65536),
          (12, 2, 1, 131072), (32, 8, 32, 2048), (32, 8, 16, 4096)]
for nheads, nheads_k, batch, seqlen in shapes:
    case = Case(batch, seqlen, nheads, nheads_k, f"{nheads}/{nheads_k}")
    args = make_inputs(case)
    out = []
    for name, cfg in variants.items():
        try:
            plan = PagedDecodePlan(*args, config=cfg)
            us = triton.testing.do_bench_cudagraph(lambda: plan.run(*args), rep=30,
                                                   return_mode="median") * 1e3
            out.append(f"{name} {case.kv_bytes / us / 1e6:.2f}")
        except Exception as exc:  # out of resources: reported
            out.append(f"{name} {type(exc).__name__}")
    print(f"{case.label} {batch}x{seqlen} S={plan.num_splits}: " + " | ".join(out), flush=True)
    del args
    torch.cuda.empty_cache()
