"""Where the host time of a quantized ``PagedDecodePlan.run`` goes (CUDA, issue 26): the eager
``bench quant`` rows of int8 at 1 x 131072 sit on the host (eager 80-110 us against 71 in graphs).

    PYTHONPATH=src python scripts/quant_host_profile.py [--formats plain,fp8_e4m3,int8]
        [--heads 32/8] [--shape 1x131072] [--layout hnd] [--calls 200] [--direct-tensordesc 0|1]
        [--ab PAIRS]

Per format: host us a call (the median of ``--calls`` calls, each timed alone after the GPU
drained; three times), a cProfile of as many calls (the top functions by own time), and the
number of TMA descriptor encodings ``kernels._launch`` keeps.
Diagnostic for docs/notes.md; not part of the test suite."""
import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
import kvonce  # noqa: E402
from decode_ncu_case import paged_case  # noqa: E402
from kvonce.bench.quant import stored  # noqa: E402
from kvonce.kernels import _launch  # noqa: E402


def host_us(fn, calls: int) -> float:
    """Median host time of one ``fn()`` with the GPU idle before it (no launch queue to wait
    on), in us."""
    for _ in range(20):
        fn()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--formats", default="plain,fp8_e4m3,int8")
    p.add_argument("--heads", default="32/8")
    p.add_argument("--shape", default="1x131072")
    p.add_argument("--layout", default="hnd")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--direct-tensordesc", type=int, choices=(0, 1), default=1,
                   help="kernels._launch.direct_tensordesc_launch (0: Triton's wrapper)")
    p.add_argument("--ab", type=int, default=0,
                   help="pairs of (Triton's wrapper, the direct launch) timed in turn")
    args = p.parse_args()
    _launch.direct_tensordesc_launch = bool(args.direct_tensordesc)
    hq, hk = (int(x) for x in args.heads.split("/"))
    batch, length = (int(x) for x in args.shape.split("x"))
    for fmt in args.formats.split(","):
        q, k, v, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt)
        k, v = stored(k, args.layout), stored(v, args.layout)
        kw = {name: stored(t, args.layout) for name, t in kw.items()}
        plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table, **kw,
                                      kv_format="int4" if fmt == "int4" else None)

        def call():
            plan.run(q, k, v, seqlens, table, **kw)

        us = [host_us(call, args.calls) for _ in range(3)]
        print(f"## {fmt} {args.heads} {args.shape} {args.layout}: splits {plan.num_splits}, "
              f"host us a call {' / '.join(f'{u:.1f}' for u in us)}")
        if args.ab:   # Triton's wrapper against the direct launch, alternating in this process
            pairs = []
            for _ in range(args.ab):
                pair = []
                for direct in (False, True):
                    _launch.direct_tensordesc_launch = direct
                    pair.append(host_us(call, args.calls))
                pairs.append(pair)
            _launch.direct_tensordesc_launch = bool(args.direct_tensordesc)
            print("   wrapper / direct: " + ", ".join(f"{a:.1f} / {b:.1f}" for a, b in pairs))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            call()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        print(f"{len(_launch._encoded)} descriptor encodings kept")


if __name__ == "__main__":
    main()
