"""Why `bench prefill`'s prefill 8 x 2048 row runs slower in CUDA graphs than eagerly (H200,
2026-12-01: page 16 463 / 445 TFLOP/s, page 256 491 / 459; chunked, 12x longer, even): is it the
clock under back-to-back launches? Times the plan's run (a) eagerly (``do_bench``: an L2 flush,
~0.1 ms of memset, before each run), (b) in a graph of back-to-back runs, (c) in a graph of runs
each after a ``torch.cuda._sleep`` gap of GAP us, less a graph of the gaps alone; and the SM
clock (nvidia-smi, sampled while (b) and (c) replay), with (b)'s power and the reasons the
driver gives for holding the clock down (its clock event reasons: power cap, thermal, ...).

    cd scripts && PYTHONPATH=../src:. python prefill_graph_gap.py [--rows prefill] [--pages 16,256]
        [--peers]   (FlashInfer's BatchPrefillWithPagedKVCacheWrapper too, .peers/fi on the path)
"""
import argparse
import collections
import statistics
import subprocess
import threading
import time

import torch
import triton
from decode_fixed_cost import timed_graph
from tabulate import tabulate


def graph_ms(fn, reps: int) -> float:
    """Median ms a call of ``fn`` over graphs of ``reps`` calls."""
    return timed_graph(fn, reps)[1] / 1e3


# nvidia-smi's clock event reasons (``clocks_event_reasons.active``; older drivers:
# ``clocks_throttle_reasons.active``), the bits that say why the SM clock is below its maximum
REASONS = {0x1: "idle", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x40: "sw_thermal",
           0x80: "hw_thermal", 0x100: "hw_power_brake"}


def _smi(fields: list) -> list | None:
    """One nvidia-smi sample of ``fields`` (strings), or None where the query fails."""
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True)
    values = [v.strip() for v in out.stdout.split(",")]
    return values if out.returncode == 0 and len(values) == len(fields) else None


def _query_fields() -> list:
    """The SM clock and power, and the clock event reasons where this driver names them."""
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        if _smi(["clocks.sm", "power.draw", reasons]) is not None:
            return ["clocks.sm", "power.draw", reasons]
    return ["clocks.sm", "power.draw"]


def sm_clock_while(fn) -> tuple:
    """``fn()``'s result and what nvidia-smi saw while it ran, over the samples whose clock
    reasons do not say idle (the graphs' capture and syncs between replays): the median SM clock
    (MHz), the median power (W), and the reasons the clock was held down in most samples."""
    fields = _query_fields()
    samples, done = [], threading.Event()

    def poll():
        while not done.is_set():
            values = _smi(fields)
            if values is not None:
                mask = int(values[2], 16) if len(values) == 3 else 0
                samples.append((float(values[0]), float(values[1]), mask))
            time.sleep(0.02)

    t = threading.Thread(target=poll)
    t.start()
    try:
        result = fn()
    finally:
        done.set()
        t.join()
    busy = [x for x in samples if not x[2] & 0x1] or samples
    mhz = statistics.median(x[0] for x in busy) if busy else float("nan")
    watts = statistics.median(x[1] for x in busy) if busy else float("nan")
    counts = collections.Counter(x[2] & ~0x1 for x in busy)
    mask = counts.most_common(1)[0][0] if counts else 0
    why = "+".join(name for bit, name in REASONS.items() if mask & bit) or "-"
    if len(fields) == 2:
        why = "n/a"
    return result, mhz, watts, f"{why} ({len(busy)}/{len(samples)})"


def measure(label: str, run, gaps: list) -> list:
    """``run``'s ms eagerly, in back-to-back graphs (with the clock and power), and after each
    gap of ``gaps`` us (with the clock)."""
    eager = triton.testing.do_bench(run)
    reps = max(20, int(50 / max(eager, 0.05)))   # graphs of ~50 ms, replayed 24 times
    # ~2 s of replays each, so the clock samples see the steady state
    rounds = max(1, int(2000 / (eager * reps * 24)))
    back, mhz, watts, why = sm_clock_while(
        lambda: [graph_ms(run, reps) for _ in range(rounds)][-1])
    row = [label, eager, back, mhz, watts, why]
    for gap in gaps:
        cycles = int(gap * 1.98e3)   # at ~1980 MHz

        def gapped():
            torch.cuda._sleep(cycles)
            run()
        both, mhz_g, _, _ = sm_clock_while(
            lambda: [graph_ms(gapped, reps) for _ in range(rounds)][-1])
        alone = graph_ms(lambda: torch.cuda._sleep(cycles), reps)
        row += [both - alone, mhz_g]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="prefill")
    ap.add_argument("--pages", default="16,256")
    ap.add_argument("--gaps", default="50,200")
    ap.add_argument("--peers", action="store_true")
    args = ap.parse_args()
    import kvonce
    from kvonce.bench.prefill import CASES, _flashinfer, make_inputs

    gaps = [int(g) for g in args.gaps.split(",")]
    rows = []
    for name in args.rows.split(","):
        case = CASES[name]
        for page in map(int, args.pages.split(",")):
            inp = make_inputs(case, page)
            a = (inp.q, inp.k_cache, inp.v_cache, inp.cu_seqlens_q, inp.cache_seqlens,
                 inp.block_table)
            plan = kvonce.PagedPrefillPlan(*a, max_seqlen_q=max(case.q_lens))
            rows.append(measure(f"{name} p{page} kvonce", lambda: plan.run(*a), gaps))
            if args.peers:
                rows.append(measure(f"{name} p{page} FlashInfer", _flashinfer(inp, "auto"),
                                    gaps))
    heads = ["row", "eager ms", "graph ms", "graph MHz", "graph W", "held by (busy samples)"]
    for gap in gaps:
        heads += [f"gap {gap}us: ms", "MHz"]
    print(tabulate(rows, headers=heads, floatfmt=".4g"))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
