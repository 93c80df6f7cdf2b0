"""Does page 16's prefill gap need back-to-back calls? Each variant ``PAGE[:bN]`` (``bN``: TMA
boxes of N rows, ``gluon_prefill.BOX_ROWS``) of `bench prefill`'s row timed three ways, in
alternated rounds: back to back (CUDA events around ``--calls`` calls, no L2 flush: the graph
bench's pattern), spaced (each call alone between events, after a ``torch.cuda._sleep`` that lets
the GPU idle), and spaced after a 256 MB L2 flush (do_bench's pattern). Microseconds a call,
medians over rounds; ``--hold`` adds the SM clock and board power under each variant:

    PYTHONPATH=src python scripts/prefill_sustained.py [--row prefill] [--variants 16,256:b16,256]
        [--hold SECONDS]
"""
import argparse
import statistics
import subprocess
import threading
import time

import torch
from tabulate import tabulate

import kvonce
from kvonce.bench.prefill import CASES, make_inputs
from kvonce.kernels import gluon_prefill


def _timed(fn, before=None):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if before is not None:
        before()
    start.record()
    fn()
    end.record()
    return start, end


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", default="prefill")
    ap.add_argument("--variants", default="16,256:b16,256")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hold", type=float, default=0.0,
                    help="then run each variant back to back this many seconds, with the SM "
                         "clock and board power (nvidia-smi) sampled meanwhile")
    args = ap.parse_args()
    case = CASES[args.row]
    calls, inputs = {}, {}
    for variant in args.variants.split(","):
        page, *options = variant.split(":")
        inp = inputs.setdefault(page, make_inputs(case, int(page)))
        a = (inp.q, inp.k_cache, inp.v_cache, inp.cu_seqlens_q, inp.cache_seqlens,
             inp.block_table)
        gluon_prefill.BOX_ROWS = next((int(o[1:]) for o in options if o[0] == "b"), None)
        plan = kvonce.PagedPrefillPlan(*a, max_seqlen_q=max(case.q_lens))
        calls[variant] = lambda plan=plan, a=a: plan.run(*a)
        # The first run makes the launch, which reads BOX_ROWS: before it goes back (until
        # 2026-11-30's thirty-eighth session it went back first: every bN variant ran the
        # plan's own boxes).
        calls[variant]()
        if next(iter(plan._launches.values()))._gluon.box != min(int(page), 128,
                                                                 gluon_prefill.BOX_ROWS or 128):
            raise SystemExit(f"{variant}: the launch does not have the variant's boxes")
        gluon_prefill.BOX_ROWS = None
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    modes = {"back to back": [], "spaced": [], "spaced, L2 flushed": []}
    times = {v: {m: [] for m in modes} for v in calls}
    for _ in range(args.rounds):
        for variant, fn in calls.items():
            torch.cuda.synchronize()
            start, end = _timed(lambda fn=fn: [fn() for _ in range(args.calls)])
            torch.cuda.synchronize()
            times[variant]["back to back"].append(start.elapsed_time(end) * 1e3 / args.calls)
            for mode, before in (("spaced", lambda: torch.cuda._sleep(1_000_000)),
                                 ("spaced, L2 flushed", lambda: (torch.cuda._sleep(1_000_000),
                                                                 flush.zero_()))):
                events = [_timed(fn, before) for _ in range(20)]
                torch.cuda.synchronize()
                times[variant][mode].append(statistics.median(
                    s.elapsed_time(e) * 1e3 for s, e in events))
    rows = [[variant, *(f"{statistics.median(times[variant][m]):.1f}" for m in modes)]
            for variant in calls]
    print(tabulate(rows, headers=["page[:box]", *(f"{m} (us)" for m in modes)]))
    if args.hold:
        print(tabulate([[variant, *hold(fn, args.hold)] for variant, fn in calls.items()],
                       headers=["page[:box]", "us a call", "SM MHz", "board W"]))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")


def hold(fn, seconds):
    """``fn`` back to back for ``seconds`` (after as long again to reach a steady clock): its
    microseconds a call and the median SM clock and board power sampled meanwhile."""
    query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"]
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            out = subprocess.run(query, capture_output=True, text=True).stdout.split(",")
            samples.append((float(out[0]), float(out[1])))

    for phase in ("warm", "timed"):
        if phase == "timed":
            thread = threading.Thread(target=sample)
            thread.start()
        begin, n = time.perf_counter(), 0
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        while time.perf_counter() - begin < seconds:
            for _ in range(20):
                fn()
            n += 20
            torch.cuda.synchronize()
        end.record()
        torch.cuda.synchronize()
    stop.set()
    thread.join()
    return (f"{start.elapsed_time(end) * 1e3 / n:.1f}",
            f"{statistics.median(c for c, _ in samples):.0f}",
            f"{statistics.median(w for _, w in samples):.0f}")


if __name__ == "__main__":
    main()
