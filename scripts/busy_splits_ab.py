"""The default plan's split count before and after ``paged.splits.busy_splits`` (no split left
empty), on the rows where they differ: CUDA-graph medians, alternating rounds, d128, page 16,
random page order, q_len 1, fp16 q, token-major pages.

    PYTHONPATH=src python scripts/busy_splits_ab.py [--formats plain,fp8_e4m3,int8,int4]
"""
import argparse
import statistics
import sys
from unittest import mock

import kvonce
from kvonce.paged import splits

sys.path.insert(0, "scripts")
from decode_ncu_case import paged_case  # noqa: E402
from quant_decode_sweep import graph_us  # noqa: E402

CASES = ("32/8:1x131072,12/12:1x131072,32/8:1x65536,12/12:1x65536,32/8:1x32768,12/12:1x32768,"
         "32/8:2x32768,12/2:1x131072,12/2:4x16384")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--formats", default="plain,fp8_e4m3,int8,int4")
    p.add_argument("--cases", default=CASES)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print("| heads | shape | cache | splits before | after | before us | after us | after/before |")
    print("|---|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        heads, shape = case.split(":")
        hq, hk = map(int, heads.split("/"))
        batch, length = map(int, shape.split("x"))
        for fmt in args.formats.split(","):
            q, k, v, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt)
            fmt_kw = dict(kv_format="int4" if fmt == "int4" else None)
            after = kvonce.PagedDecodePlan(q, k, v, seqlens, table, **kw, **fmt_kw)
            with mock.patch.object(splits, "busy_splits", lambda keys, s, bn: s):
                before_count = kvonce.PagedDecodePlan(q, k, v, seqlens, table, **kw,
                                                      **fmt_kw).num_splits
            if before_count == after.num_splits:
                continue
            before = kvonce.PagedDecodePlan(q, k, v, seqlens, table, **kw, **fmt_kw,
                                            num_splits=before_count)
            assert before.config == after.config
            times = {"before": [], "after": []}
            for _ in range(args.rounds):
                for name, plan in (("before", before), ("after", after)):
                    times[name].append(graph_us(lambda: plan.run(q, k, v, seqlens, table, **kw)))
            b, a = (statistics.median(times[n]) for n in ("before", "after"))
            print(f"| {heads} | {shape} | {fmt} | {before_count} | {after.num_splits} | {b:.1f} | "
                  f"{a:.1f} | {a / b:.3f} |", flush=True)


if __name__ == "__main__":
    main()
