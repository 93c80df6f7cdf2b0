"""Per-kernel time of one forced-cascade step (torch.profiler), CUDA.

    PYTHONPATH=src python scripts/prefix_profile.py [case index, default 0]
"""
import sys

import torch

from kvonce import PagedDecodePlan
from kvonce.bench.prefix import CASES, make_inputs


def main():
    case = CASES[int(sys.argv[1]) if len(sys.argv) > 1 else 0]
    args = make_inputs(case)
    plan = PagedDecodePlan(*args, shared_prefix="auto", cascade=True)
    for _ in range(5):
        plan.run(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            plan.run(*args)
        torch.cuda.synchronize()
    print(case)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))


if __name__ == "__main__":
    main()
