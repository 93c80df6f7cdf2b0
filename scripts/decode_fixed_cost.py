"""Where a short decode launch's fixed cost sits: the decode kernel, the split combine, or the
gaps between them (CUDA, issue 26).

    PYTHONPATH=src python scripts/decode_fixed_cost.py [--formats plain,fp8_e4m3,int8,int4]
        [--heads 32/8] [--lengths 32768,65536,131072,262144] [--layout hnd] [--calls 20]
        [--splits 0] [--set gluon=0] [--combine-pdl 0|1] [--one-cta-stages N] [--batches 1]

Per format and length (batch 1, d128, page 16, random page order, fp16 queries): the plan's
call captured ``--calls`` times back to back in one CUDA graph (as ``bench quant``'s
``do_bench_cudagraph``: no L2 flush), the replay timed with CUDA events (median of 20), and one
replay under ``torch.profiler`` for each kernel's GPU time: ``call`` the replay over the calls,
``decode`` / ``combine`` the kernels' mean durations, ``gaps`` the rest (launch to launch). Per
format, the line through the two longest lengths: its ``rate`` (TB/s of the bytes a call reads,
``kvonce.bench.quant.bytes_read``) and its intercept at zero keys, for the call and for the
decode kernel alone: the cost no length amortizes. ``--splits N``: every launch at N splits
(``PagedDecodePlan(num_splits=N)``; 0, the default: the plan's own). ``--set field=value[,..]``:
the plan's config with those fields changed (``decode_ncu_case.parse_set``; ``gluon=0``: the
Triton rows of fp8 / int8). ``--batches B1,B2,..``: every length at each batch size (the line
then runs through the last two points in bytes; at 64 x 8192 it shows a second wave's tail).
"""
import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import kvonce  # noqa: E402
from decode_ncu_case import paged_case, parse_set  # noqa: E402
from kvonce.bench.quant import Case, bytes_read, stored  # noqa: E402


def timed_graph(fn, calls: int):
    """``(graph, us a call)``: ``fn`` captured ``calls`` times, replays' median over 20."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end) / calls)
    return graph, statistics.median(times)


def kernel_us(graph, calls: int) -> dict:
    """Mean GPU us a call of each kernel name in one profiled replay."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    sums = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            sums[ev.name] = sums.get(ev.name, 0.0) + ev.device_time / calls
    return sums


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--formats", default="plain,fp8_e4m3,int8,int4")
    p.add_argument("--heads", default="32/8")
    p.add_argument("--lengths", default="32768,65536,131072,262144")
    p.add_argument("--batches", default="1", help="batch sizes, comma-separated")
    p.add_argument("--layout", default="hnd")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--splits", type=int, default=0, help="forced split count (0: the plan's)")
    p.add_argument("--set", default="", help="config fields changed, field=value[,...]")
    p.add_argument("--combine-pdl", type=int, choices=(0, 1), default=None,
                   help="every family of paged_combine.COMBINE_PDL (default: the module's)")
    p.add_argument("--one-cta-stages", type=int, default=0,
                   help="gluon_decode.GLUON_ONE_CTA_VARIANT at that many stages (0: the module's)")
    args = p.parse_args()
    if args.one_cta_stages:
        from kvonce.kernels import gluon_decode
        gluon_decode.GLUON_ONE_CTA_VARIANT = dict(stages=args.one_cta_stages, ctas_per_sm=1,
                                                  ring_merge=False)
    if args.combine_pdl is not None:
        from kvonce.kernels import paged_combine
        paged_combine.set_combine_pdl(args.combine_pdl)
    hq, hk = (int(x) for x in args.heads.split("/"))
    lengths = [int(x) for x in args.lengths.split(",")]
    shapes = [(b, n) for b in (int(x) for x in args.batches.split(",")) for n in lengths]
    print("| format | batch | length | splits | call us | decode us | combine us | gaps us | "
          "TB/s (call) |")
    print("|---" * 9 + "|")
    fits = []
    for fmt in args.formats.split(","):
        points = []
        for batch, length in shapes:
            q, k, v, table, seqlens, _ = paged_case(hq, hk, batch, length)
            k, v = stored(k, args.layout), stored(v, args.layout)
            kw = {}
            if fmt != "plain":
                (k, ks), (v, vs) = (kvonce.quantize_kv(t, fmt) for t in (k, v))
                k, v, ks, vs = (stored(t, args.layout) for t in (k, v, ks, vs))
                kw = dict(k_scale=ks, v_scale=vs)
            kv_format = "int4" if fmt == "int4" else None
            plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table, num_splits=args.splits,
                                          kv_format=kv_format, **kw)
            if args.set:
                config = dataclasses.replace(plan.config, **parse_set(args.set, plan.config))
                plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table, num_splits=args.splits,
                                              kv_format=kv_format, config=config, **kw)
            graph, call = timed_graph(lambda: plan.run(q, k, v, seqlens, table, **kw),
                                      args.calls)
            per_kernel = kernel_us(graph, args.calls)
            combine = sum(t for name, t in per_kernel.items() if "combine" in name)
            decode = sum(t for name, t in per_kernel.items() if "combine" not in name)
            nbytes = bytes_read(Case(batch, length, hq, hk, ""),
                                None if fmt == "plain" else fmt)
            points.append((nbytes, call, decode))
            print(f"| {fmt} | {batch} | {length} | {plan.num_splits} | {call:.1f} | {decode:.1f} | "
                  f"{combine:.1f} | {call - decode - combine:.1f} | {nbytes / call / 1e6:.2f} |",
                  flush=True)
            del graph, plan, k, v, kw
            torch.cuda.empty_cache()
        if len(points) < 2:
            continue
        (b0, c0, d0), (b1, c1, d1) = points[-2:]
        rate_call = (b1 - b0) / (c1 - c0) / 1e6
        rate_dec = (b1 - b0) / (d1 - d0) / 1e6
        fits.append((fmt, rate_call, c1 - (b1 / 1e6) / rate_call, rate_dec,
                     d1 - (b1 / 1e6) / rate_dec))
    print("\n| format | rate TB/s (call) | intercept us (call) | rate TB/s (decode) | "
          "intercept us (decode) |")
    print("|---" * 5 + "|")
    for fmt, rc, ic, rd, idc in fits:
        print(f"| {fmt} | {rc:.2f} | {ic:.1f} | {rd:.2f} | {idc:.1f} |")


if __name__ == "__main__":
    main()
