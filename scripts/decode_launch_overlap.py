"""Whether a decode call overlaps the call before it in a CUDA graph (programmatic dependent
launch, or any early start), dense SDPA against the paged plan:

    PYTHONPATH=src python scripts/decode_launch_overlap.py [--cases plain:12/2:64x1024,...]

``bench decode --graph-peers`` replays one call back to back. If a kernel is launched as a
programmatic dependent of the one before (PDL), its start overlaps that kernel's tail, and back
to back it reads faster than any call does after an unrelated kernel. Columns, CUDA-graph medians
in us (``do_bench_cudagraph``):
- ``alone``: the call back to back (``bench decode``'s measure)
- ``after tiny``: each call after a one-element ``add_`` (a plain launch that neither triggers
  nor waits), that kernel's own back-to-back time subtracted
- ``tiny``: the ``add_`` alone
"""
import argparse
import sys

import torch
from tabulate import tabulate

import kvonce

sys.path.insert(0, "scripts")
from decode_ncu_case import graph_us, paged_case, parse_case  # noqa: E402

CASES = "plain:12/2:128x512,plain:12/2:64x1024,plain:12/2:8x8192,plain:32/8:64x1024"


def dense(x: torch.Tensor, table: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """Paged ``[pages, page, hk, d]`` gathered to SDPA's ``[batch, hk, length, d]``."""
    hk, d = x.shape[2], x.shape[3]
    return x[table.long()].reshape(batch, length, hk, d).transpose(1, 2).contiguous()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=CASES)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    scalar = torch.zeros(1, device="cuda")
    tiny = lambda: scalar.add_(1)
    rows = []
    for case in args.cases.split(","):
        _, hq, hk, batch, length = parse_case(case)
        q, k, v, table, seqlens, _ = paged_case(hq, hk, batch, length)
        qt = q.transpose(1, 2)
        dk, dv = dense(k, table, batch, length), dense(v, table, batch, length)
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qt, dk, dv,
                                                                        enable_gqa=True)
        plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table)
        planned = lambda: plan.run(q, k, v, seqlens, table)
        timers = {"tiny": lambda: graph_us(tiny)}
        for name, fn in (("sdpa", sdpa), ("plan", planned)):
            timers[f"{name} alone"] = lambda fn=fn: graph_us(fn)
            timers[f"{name} after tiny"] = lambda fn=fn: graph_us(lambda: (tiny(), fn()))
        times = {name: [] for name in timers}
        for _ in range(args.rounds):
            for name, timer in timers.items():
                times[name].append(timer())
        med = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
        row = [case, plan.num_splits, f"{med['tiny']:.1f}"]
        for name in ("sdpa", "plan"):
            row += [f"{med[name + ' alone']:.1f}",
                    f"{med[name + ' after tiny'] - med['tiny']:.1f}"]
        row.append(f"{med['sdpa alone'] / med['plan alone']:.3f}")
        row.append(f"{(med['sdpa after tiny']) / (med['plan after tiny']):.3f}")
        rows.append(row)
        print(row, flush=True)
        del plan, planned, sdpa, q, k, v, dk, dv
        torch.cuda.empty_cache()
    print(tabulate(rows, headers=["case", "splits", "tiny", "sdpa alone", "sdpa after tiny",
                                  "plan alone", "plan after tiny", "ratio alone",
                                  "ratio with tiny"], tablefmt="github"))


if __name__ == "__main__":
    main()
