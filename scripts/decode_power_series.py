"""A decode call's time over seconds of back-to-back calls (CUDA, sm_90): the GPU's power state.

    PYTHONPATH=src python scripts/decode_power_series.py [--heads 32/8] [--shapes 64x8192]
        [--formats fp16,fp8_e4m3,int8,int4] [--layout hnd] [--seconds 3] [--rest 2]

For each case the plan's call (``PagedDecodePlan``, CUDA-graph replays) runs back to back for
``--seconds`` after ``--rest`` seconds idle; batches of 20 calls are timed with CUDA events and
the time a call is printed at points along the run (t: seconds since its start), with the mean of
the second half. The lent H200 holds these decodes at its 700 W cap (clocks_event_reasons "SW
power cap"; run nvidia-smi beside: scripts/gpu_issue26.sh's ``power`` step): a row whose time
rises along the run is paced by its SM clock, one that stays flat by the memory.
"""
import argparse
import itertools
import time

import torch

import kvonce
from decode_ncu_case import paged_case
from kvonce.bench.quant import stored
from kvonce.kernels import gluon_decode


def series(fn, seconds: float, batch: int = 20) -> list[tuple[float, float]]:
    """(t since start, us a call) for batches of ``batch`` back-to-back calls over ``seconds``."""
    out, t0 = [], time.perf_counter()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    while time.perf_counter() - t0 < seconds:
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        out.append((time.perf_counter() - t0, 1e3 * start.elapsed_time(end) / batch))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", default="32/8")
    p.add_argument("--shapes", default="64x8192")
    p.add_argument("--formats", default="fp16,fp8_e4m3,int8,int4")
    p.add_argument("--layout", default="hnd", choices=("nhd", "hnd"))
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rest", type=float, default=2.0)
    p.add_argument("--loaders", default="",
                   help="the Gluon decode's loader warps (1 or 4: gluon_decode.GLUON_LOADERS for "
                        "every format), comma-separated; default the module's")
    args = p.parse_args()
    points = (0, 1, 2, 4, 8, 16, 32, 64)   # batches, then every eighth of the run
    for hk_pair, shape in itertools.product(args.heads.split(","), args.shapes.split(",")):
        hq, hk = (int(x) for x in hk_pair.split("/"))
        batch, length = (int(x) for x in shape.split("x"))
        q, k, v, table, seqlens, _ = paged_case(hq, hk, batch, length, dtype=torch.float16)
        k, v = stored(k, args.layout), stored(v, args.layout)
        loaders = [int(n) for n in args.loaders.split(",")] if args.loaders else [0]
        for fmt, n_loaders in itertools.product(args.formats.split(","), loaders):
            if fmt == "fp16":
                kq, vq, kw = k, v, {}
            else:
                (kq, ks), (vq, vs) = (kvonce.quantize_kv(t, fmt) for t in (k, v))
                kq, ks, vq, vs = (stored(t, args.layout) for t in (kq, ks, vq, vs))
                kw = dict(k_scale=ks, v_scale=vs)
            saved = dict(gluon_decode.GLUON_LOADERS)
            if n_loaders:
                gluon_decode.GLUON_LOADERS.update({code: n_loaders for code in saved})
            try:
                plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table,
                                              kv_format="int4" if fmt == "int4" else None, **kw)
            finally:
                gluon_decode.GLUON_LOADERS.update(saved)
            fn = lambda: plan.run(q, kq, vq, seqlens, table, **kw)  # noqa: E731
            fn()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            torch.cuda.synchronize()
            time.sleep(args.rest)
            s = series(graph.replay, args.seconds)
            picks = sorted({i for i in points if i < len(s)}
                           | {len(s) * j // 8 for j in range(1, 8)} | {len(s) - 1})
            late = [us for _, us in s[len(s) // 2:]]
            label = f"{fmt}, {n_loaders} loaders" if n_loaders else fmt
            print(f"{hq}/{hk} {batch}x{length} {label:9s} "
                  + " ".join(f"{s[i][0]:.2f}s:{s[i][1]:.1f}" for i in picks)
                  + f" | second half mean {sum(late) / len(late):.1f}", flush=True)
        del k, v


if __name__ == "__main__":
    main()
