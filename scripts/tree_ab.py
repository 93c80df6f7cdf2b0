"""Paged decode from two source trees, same cases, CUDA-graph time: for a code change that
``config_ab.py`` (one tree, configs A/B) cannot express. kvonce's custom ops register once per
process, so each (tree, round) runs in its own process; rounds alternate the order.

    mkdir ab_base && git archive HEAD src/kvonce | tar -x --strip-components=1 -C ab_base
    # ab_base/kvonce: the tree to compare against (A); untracked, so it travels to the device
    PYTHONPATH=src python scripts/tree_ab.py --base ab_base \\
        [--cases plain:12/2:128x512,int4:32/8:1x131072] [--rounds 3] [--dtype bf16]

d128, page 16, random page order, q_len 1, seed 0 (``decode_ncu_case.paged_case``), the plan's
own splits; ``do_bench_cudagraph`` medians over the rounds. The two trees' outputs are compared
by their sum and absolute sum (a change meant to keep results bitwise shows equal columns).
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
CASES = ("plain:12/2:128x512,plain:12/2:64x1024,plain:32/8:64x1024,fp8_e4m3:32/8:1x131072,"
         "int8:32/8:64x8192,int4:32/8:1x131072")


def time_cases(cases: str, dtype_name: str) -> dict:
    """``{case: [graph us, output sum, output abs sum, splits]}`` with the kvonce on sys.path."""
    import torch

    import kvonce
    sys.path.insert(0, str(ROOT / "scripts"))
    from decode_ncu_case import graph_us, paged_case, parse_case

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    out = {}
    for case in cases.split(","):
        fmt, hq, hk, batch, length = parse_case(case)
        q, kk, vv, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt, dtype)
        plan = kvonce.PagedDecodePlan(q, kk, vv, seqlens, table, **kw,
                                      kv_format="int4" if fmt == "int4" else None)
        o = plan.run(q, kk, vv, seqlens, table, **kw).float()
        us = graph_us(lambda: plan.run(q, kk, vv, seqlens, table, **kw))
        out[case] = [us, o.sum().item(), o.abs().sum().item(), plan.num_splits]
        del q, kk, vv, table, seqlens, kw, plan, o
        torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--base", help="the A tree's directory holding kvonce/ (B is src/)")
    p.add_argument("--cases", default=CASES, help="FORMAT:HQ/HK:BATCHxLEN, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="bf16", choices=("fp16", "bf16"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("JSON" + json.dumps(time_cases(args.cases, args.dtype)), flush=True)
        return
    trees = {"A": str(Path(args.base).resolve()), "B": str(ROOT / "src")}
    results = {"A": [], "B": []}
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            proc = subprocess.run([sys.executable, __file__, "--child", "--cases", args.cases,
                                   "--dtype", args.dtype], cwd=ROOT, capture_output=True,
                                  text=True, env=dict(os.environ, PYTHONPATH=trees[name]))
            line = [x for x in proc.stdout.splitlines() if x.startswith("JSON")]
            if not line:
                sys.exit(f"tree {name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
            results[name].append(json.loads(line[0][4:]))
    rows = []
    for case in args.cases.split(","):
        med = {n: sorted(x[case][0] for x in results[n])[args.rounds // 2] for n in results}
        a, b = results["A"][0][case], results["B"][0][case]
        rows.append([case, a[3], f"{med['A']:.1f}", f"{med['B']:.1f}", f"{med['B'] / med['A']:.3f}",
                     f"{a[1]:.4g} / {a[2]:.5g}", f"{b[1]:.4g} / {b[2]:.5g}"])
    import torch
    print(f"{torch.cuda.get_device_name()}, {args.dtype} q, graph us, median of {args.rounds}")
    print(tabulate(rows, headers=["case", "splits", "A us", "B us", "B / A", "A sum / abs",
                                  "B sum / abs"], tablefmt="github"))


if __name__ == "__main__":
    main()
