"""Sweep the dual-group backward's two launch configs at the Llama-3-8B zigzag shapes (CUDA).

    PYTHONPATH=src python scripts/bwd_sweep.py [--only r3] [--dq 64,64,8,3 ...] [--dkdv 64,128,8,3 ...]
    ncu --kernel-name regex:dkdv --launch-skip 1 --launch-count 1 --section ... \
        python3 scripts/bwd_sweep.py --once --dkdv 64,128,8,1,a   # one config, run twice untimed

Times the whole backward (dQ kernel, then dK/dV kernel) per (dq config, dkdv config) pair with
``triton.testing.do_bench`` medians; reports registers/spills are not available through the
wrapper, so a config that fails to compile is reported and skipped.
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton.testing

from kvonce import fused_zigzag_llama3_flash_attn_varlen_backward as backward
from kvonce import fused_zigzag_llama3_flash_attn_varlen_forward as forward
from kvonce.bench.zigzag import _fused_args, cases, setup
from kvonce.kernels.configs import DualGroupBwdConfig


def _cfgs(specs):
    """"64,128,8,2" -> (64, 128, 8, 2); a trailing ",a" (dK/dV specs) -> atomic dQ, ",o" (dQ
    specs) -> one group per dQ program."""
    return [tuple(int(x) for x in s.split(",") if x.isdigit())
            + (("a",) if s.endswith(",a") else ()) + (("o",) if s.endswith(",o") else ())
            for s in specs]


def _config(dq, dkdv) -> DualGroupBwdConfig:
    atomic = dkdv[-1] == "a"
    return DualGroupBwdConfig(*dq[:4], *dkdv[:4], atomic_dq=atomic, dq_one_group=dq[-1] == "o")


def _kernel_times(fn) -> str:
    """Per-kernel CUDA time of one call (torch.profiler), e.g. 'dq 12.1 ms, dkdv 22.0 ms'."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    parts = []
    for e in prof.key_averages():
        if e.device_time_total > 50:
            parts.append(f"{e.key[:40]} {e.device_time_total / 1e3:.2f} ms")
    return "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="1x8192 w8 r3")
    ap.add_argument("--dq", nargs="*", default=["128,32,8,3", "128,32,8,2", "128,32,4,3",
                                                "64,32,4,3"])
    ap.add_argument("--dkdv", nargs="*", default=["64,128,8,2", "128,128,8,2", "64,128,8,1",
                                                  "64,128,8,2,a", "64,128,8,3,a", "32,128,8,2,a",
                                                  "128,128,8,2,a", "64,64,4,2,a"])
    ap.add_argument("--once", action="store_true",
                    help="run each config twice, untimed (under Nsight Compute), then stop")
    args = ap.parse_args()
    for case in cases("bf16"):
        if not any(o in case.name for o in args.only.split(",")) or "llama" not in case.name:
            continue
        torch.manual_seed(0)
        s = setup(case, torch.bfloat16)
        tensors, meta = _fused_args(case, s)
        out0, out1, lse0, lse1 = forward(*tensors, *meta)
        dout0, dout1 = torch.randn_like(out0), torch.randn_like(out1)
        flops = 2.5 * s["flops"]
        results = []
        for dq, dkdv in itertools.product(_cfgs(args.dq), _cfgs(args.dkdv)):
            if dkdv[-1] == "a" and dq != _cfgs(args.dq)[0]:
                continue  # with atomics the dQ kernel only computes delta: one config is enough
            cfg = _config(dq, dkdv)

            def fn(cfg=cfg):
                return backward(dout0, dout1, *tensors, out0, out1, lse0, lse1, *meta, config=cfg)
            if args.once:
                fn()
                fn()
                torch.cuda.synchronize()
                print(f"{case.name} {cfg}: ran twice", flush=True)
                continue
            try:
                fn()
                ms = triton.testing.do_bench(fn, warmup=5, rep=300, return_mode="median")
            except Exception as exc:  # out of resources: report and go on
                print(f"{case.name} {cfg}: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
                continue
            results.append((ms, cfg))
            print(f"{case.name} dq={dq} dkdv={dkdv}: {ms:.2f} ms {flops / ms / 1e9:.0f} TFLOP/s",
                  flush=True)
        if args.once:
            return
        results.sort(key=lambda r: r[0])
        print("best:", results[:3])
        for ms, cfg in results[:1] + [r for r in results if r[1].atomic_dq][:1]:
            print(f"  {cfg}: {_kernel_times(lambda: backward(dout0, dout1, *tensors, out0, out1, lse0, lse1, *meta, config=cfg))}")


if __name__ == "__main__":
    main()
