"""Sweep the dual-group forward's launch configs at the Llama-3-8B zigzag shapes (CUDA).

    PYTHONPATH=src python scripts/fwd_sweep.py [--only r0,r3] [--cfg 128,64,8,3 128,64,8,3,o,t ...]

A spec is ``block_m,block_n,num_warps,num_stages`` plus flags: ``o`` one group per program
(``config.one_group``), ``t`` TMA descriptors for unmasked K/V tiles (``config.tma``). Per case and
config: kernel time (``do_bench`` median) and TFLOP/s on the contiguous K/V, the in-place zigzag
path's time (the CP function's kernel), registers and spills of the compiled kernel, and the
largest relative error against the default config's outputs (so a config that computes something
else shows up).
"""
from __future__ import annotations

import argparse

import torch
import triton.testing

from kvonce.bench import report
from kvonce.bench.zigzag import cases, paths, setup
from kvonce.kernels.configs import DualGroupFwdConfig
from kvonce.varlen import dual_group_forward_into


def _config(spec: str) -> DualGroupFwdConfig:
    parts = spec.split(",")
    nums = [int(x) for x in parts if x.isdigit()]
    return DualGroupFwdConfig(*nums, tma="t" in parts, one_group="o" in parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="1x8192,mixed")
    ap.add_argument("--cfg", nargs="*", default=[
        "128,64,8,3", "128,64,8,3,o", "128,64,8,3,o,t", "128,128,8,2,o", "128,128,8,2,o,t",
        "128,128,8,3,o,t", "128,64,4,3,o", "64,64,4,3,o"])
    args = ap.parse_args()
    rows = []
    for case in cases("bf16"):
        if not any(o in case.name for o in args.only.split(",")) or "llama" not in case.name:
            continue
        torch.manual_seed(0)
        s = setup(case, torch.bfloat16)
        q0, q1 = s["chunk_q"]
        cu0, cu1 = s["chunk_cu"]
        kv_end = [(cu[1:] - cu[:-1]).to(torch.int32) for _, cu in s["slices"]]
        outs = [torch.empty_like(q0), torch.empty_like(q1)]
        lses = [torch.empty(case.nheads, q.shape[0], device=q.device) for q in (q0, q1)]
        base = None
        for spec in args.cfg:
            cfg = _config(spec)

            def fn(cfg=cfg):
                return dual_group_forward_into(
                    q0, q1, s["kv"][0], s["kv"][1], outs[0], outs[1], lses[0], lses[1], cu0, cu1,
                    s["cu"] * case.world_size, kv_end[0], kv_end[1], cu0[:-1], cu1[:-1],
                    max_seqlen_q=s["max_c"], softmax_scale=None, causal=True, config=cfg)
            try:
                handle = fn()
                torch.cuda.synchronize()
                got = [t.float().clone() for t in (*outs, *lses)]
                if base is None:
                    base = got
                err = max(((a - b).nan_to_num(0).norm() / b.nan_to_num(0).norm()).item()
                          for a, b in zip(got, base))
                ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
                e2e = triton.testing.do_bench(paths(case, s, cfg)["fused_e2e"], warmup=25,
                                              rep=200, return_mode="median")
                rows.append({"case": case.name, "config": spec, "ms": ms,
                             "TFLOP/s": s["flops"] / ms / 1e9, "zigzag e2e ms": e2e,
                             "regs": handle.n_regs if handle else -1,
                             "spills": handle.n_spills if handle else -1,
                             "err vs first": f"{err:.1e}"})
            except Exception as exc:  # out of resources and the like: report, go on
                rows.append({"case": case.name, "config": spec, "ms": float("nan"),
                             "TFLOP/s": 0.0, "zigzag e2e ms": float("nan"), "regs": -1,
                             "spills": -1, "err vs first": f"{type(exc).__name__}: {exc}"[:60]})
            print(report.format_rows(rows[-1:]), flush=True)
        del s
        torch.cuda.empty_cache()
    print(report.format_rows(rows))
    print(report.environment())


if __name__ == "__main__":
    main()
