"""SM clock and power while `bench prefill`'s 8 x 2048 row (bf16, 32/8 heads) is timed eager
(``do_bench``: L2 flushed between calls), as CUDA-graph replay (back to back), then eager again:
whether a time gap between the two is the GPU's power cap (docs/notes.md). CUDA only.

    PYTHONPATH=src python scripts/prefill_clocks.py [--page 16] [--rep-ms 4000]
"""
from __future__ import annotations

import argparse
import datetime
import subprocess
import tempfile
import time

import triton.testing

from kvonce import PagedPrefillPlan
from kvonce.bench import report
from kvonce.bench.prefill import CASES, make_inputs


def _sample(line: str) -> tuple[float, float, float]:
    """(epoch seconds, SM MHz, W) of one nvidia-smi line (its timestamp is local time)."""
    stamp, mhz, watts = (x.strip() for x in line.split(","))
    when = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
    return when, float(mhz), float(watts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--page", type=int, default=256)
    ap.add_argument("--rep-ms", type=int, default=4000)
    args = ap.parse_args()
    case = CASES["prefill"]
    inp = make_inputs(case, args.page)
    a = (inp.q, inp.k_cache, inp.v_cache, inp.cu_seqlens_q, inp.cache_seqlens, inp.block_table)
    plan = PagedPrefillPlan(*a, max_seqlen_q=max(case.q_lens))
    fn = lambda: plan.run(*a)  # noqa: E731
    eager = lambda: triton.testing.do_bench(fn, warmup=200, rep=args.rep_ms,  # noqa: E731
                                            return_mode="median")
    graph = lambda: triton.testing.do_bench_cudagraph(fn, rep=args.rep_ms,  # noqa: E731
                                                      return_mode="median")
    with tempfile.NamedTemporaryFile("w+", suffix=".csv") as log:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw",
                                "--format=csv,noheader,nounits", "-lms", "100"], stdout=log,
                               text=True)
        phases = []
        time.sleep(0.5)
        for name, bench in (("eager", eager), ("graph", graph), ("eager again", eager)):
            t0 = time.time()
            ms = bench()
            phases.append((name, ms, t0, time.time()))
        smi.terminate()
        smi.wait()
        samples = [_sample(line) for line in open(log.name) if line.count(",") == 2]
    rows = []
    for name, ms, t0, t1 in phases:
        sel = [(c, w) for ts, c, w in samples if t0 + 0.5 < ts < t1]   # past each warmup
        rows.append({"timing": name, "ms": round(ms, 4),
                     "TFLOP/s": round(case.flops() / ms / 1e9, 1),
                     "sm_MHz_mean": round(sum(c for c, _ in sel) / len(sel)) if sel else "-",
                     "power_W_mean": round(sum(w for _, w in sel) / len(sel)) if sel else "-"})
    print(report.format_rows(rows))
    print(report.environment())


if __name__ == "__main__":
    main()
