"""CUDA-graph time of paged decode per split count and merge mode on the documents' 30 shapes
(diagnostic behind the split heuristic; docs/notes.md). Prints one line per shape: the auto
choice, then the best (S, mode) and its time; JSON of every timing to argv[1]."""
import dataclasses
import json
import sys

import torch
import triton.testing

from kvonce.bench.decode import HEADS, SHAPES, Case, make_inputs
from kvonce.paged import PagedDecodePlan
from kvonce.kernels.configs import get_paged_decode_config

cfg = get_paged_decode_config(torch.cuda.get_device_capability(), 128)
merged = dataclasses.replace(cfg, max_merged_splits=1 << 30)
combined = dataclasses.replace(cfg, max_merged_splits=0)
rows = []
for nheads, nheads_k, label in HEADS:
    for batch, seqlen in SHAPES:
        case = Case(batch, seqlen, nheads, nheads_k, label)
        args = make_inputs(case)
        auto = PagedDecodePlan(*args)
        t = lambda p: triton.testing.do_bench_cudagraph(lambda: p.run(*args), rep=30,
                                                        return_mode="median") * 1e3
        res = {"auto": (auto.num_splits, round(t(auto), 1))}
        for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256):
            if s > 1 and seqlen // s < 64:
                break
            for name, c in (("merged", merged), ("combine", combined)):
                if s == 1 and name == "combine":
                    continue
                res[f"{s}{name[0]}"] = round(t(PagedDecodePlan(*args, num_splits=s, config=c)), 1)
        best = min((v, k) for k, v in res.items() if k != "auto")
        gb = case.kv_bytes / 1e6  # bytes per us / 1e6 = TB/s
        print(f"{label} {batch}x{seqlen}: auto S={res['auto'][0]} {res['auto'][1]} us "
              f"({gb / res['auto'][1]:.2f} TB/s); best {best[1]} {best[0]} us "
              f"({gb / best[0]:.2f} TB/s)", flush=True)
        rows.append(dict(case=f"{label} {batch}x{seqlen}", **{k: v for k, v in res.items()}))
        del args
        torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
