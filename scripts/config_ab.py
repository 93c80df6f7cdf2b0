"""A decode plan's own config against the same config with some fields changed, same data, same
split count, CUDA-graph time (``do_bench_cudagraph`` medians, rounds alternated):

    PYTHONPATH=src python scripts/config_ab.py --set prefetch_pages=1 [--set block_n=128 ...]
        [--knob "kvonce.kernels.gluon_decode:GLUON_ONE_CTA_VARIANT={'stages': 4, ...}" ...]
        [--cases plain:12/2:128x512,int4:32/8:1x131072] [--splits 0,2] [--rounds 3]
        [--dtype fp16|bf16]

Each ``--set`` is one B column (``field=value[,field=value]``; ints, floats, 0/1 for booleans).
Each ``--knob`` is one too: module attributes (``MODULE:ATTR=LITERAL``, several joined by
`` & ``) set around every run of that column's plan (its launches bind at the first run, some
read their module's switches at each call) and restored after, the plan's config unchanged
and its split count the row's (``--splits``; 0: the rule's under the knobs, so a knob of the
split rule, such as ``kvonce.paged.splits:GLUON_BATCH_CUT=True``, takes effect). A knob
column may also change the config: ``KNOBS @ field=value[,field=value]`` (applied to the row's
config at that split count).
All columns run in one process, their rounds alternated: the same inputs and allocations for
A and B, and no drift between processes (``knob_run.py`` runs one setting a process).
``--splits``: a row per split count, all columns at that count (0: the plan's own; a forced
count runs the tile the rule takes at that count since 2026-12-01; before, the row's bare config,
e.g. 64-key tiles at GQA 12/2 64 x 1024 where the plan's 2 splits take 128).
d128, page 16, random page order, q_len 1, seed 0 (``decode_ncu_case.paged_case``; ``--layout
hnd``: head-major pages, as ``bench quant`` stores them); outputs of
every B checked against A (max abs difference printed).
"""
import argparse
import ast
import contextlib
import dataclasses
import importlib
import sys

import torch
from tabulate import tabulate

import kvonce
from kvonce.bench.quant import stored

sys.path.insert(0, "scripts")
from decode_ncu_case import graph_us, paged_case, parse_case, parse_set  # noqa: E402

CASES = ("plain:12/2:128x512,plain:12/2:64x1024,plain:12/2:8x8192,plain:12/2:1x65536,"
         "plain:32/8:64x1024,plain:12/12:64x1024,fp8_e4m3:32/8:1x131072,int8:32/8:1x131072,"
         "int4:32/8:1x131072,int4:32/8:64x8192")


def parse_knobs(text: str) -> list:
    """``MODULE:ATTR=LITERAL[ & MODULE:ATTR=LITERAL]`` as ``[(module, attr, value)]``."""
    knobs = []
    for item in text.split(" & "):
        target, value = item.split("=", 1)
        module, attr = target.strip().split(":")
        mod = importlib.import_module(module)
        if not hasattr(mod, attr):
            raise SystemExit(f"config_ab: {module} has no attribute {attr}")
        knobs.append((mod, attr, ast.literal_eval(value)))
    return knobs


@contextlib.contextmanager
def knobs_set(knobs: list):
    """The module attributes ``knobs`` set for the block, the old values back after."""
    old = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in knobs]
    try:
        for mod, attr, value in knobs:
            setattr(mod, attr, value)
        yield
    finally:
        for mod, attr, value in old:
            setattr(mod, attr, value)


def shape_of(plan) -> str:
    """A plan's split count and batch cut, as the table shows them."""
    cut = getattr(plan, "batch_cut", 0)
    return f"{plan.num_splits} splits" + (f" after {cut} whole" if cut else "")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=CASES, help="FORMAT:HQ/HK:BATCHxLEN, comma-separated")
    p.add_argument("--set", action="append", default=[], help="field=value[,field=value]")
    p.add_argument("--knob", action="append", default=[],
                   help="MODULE:ATTR=LITERAL[ & MODULE:ATTR=LITERAL]")
    p.add_argument("--splits", default="0", help="comma-separated split counts (0: auto)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--layout", default="nhd", choices=("nhd", "hnd"),
                   help="page storage (hnd: caches and per-key scales head-major, bench quant's)")
    args = p.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    rows = []
    for case in args.cases.split(","):
        fmt, hq, hk, batch, length = parse_case(case)
        q, kk, vv, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt, dtype)
        if args.layout == "hnd":
            kk, vv = stored(kk, "hnd"), stored(vv, "hnd")
            kw = {name: stored(t, "hnd") for name, t in kw.items()}
        kv_format = "int4" if fmt == "int4" else None
        for splits in (int(x) for x in args.splits.split(",")):
            plan_a = kvonce.PagedDecodePlan(q, kk, vv, seqlens, table, **kw,
                                            kv_format=kv_format, num_splits=splits)
            columns = [(plan_a, [])] + [
                (kvonce.PagedDecodePlan(q, kk, vv, seqlens, table, **kw, kv_format=kv_format,
                                        num_splits=plan_a.num_splits,
                                        config=dataclasses.replace(
                                            plan_a.config, **parse_set(s, plan_a.config))), [])
                for s in args.set]
            for text in args.knob:
                text, _, changes = text.partition(" @ ")
                knobs = parse_knobs(text)
                with knobs_set(knobs):   # the row's split count (0: the rule's, knobs set)
                    plan = kvonce.PagedDecodePlan(q, kk, vv, seqlens, table, **kw,
                                                  kv_format=kv_format, num_splits=splits)
                    if changes:
                        plan = kvonce.PagedDecodePlan(
                            q, kk, vv, seqlens, table, **kw, kv_format=kv_format,
                            num_splits=plan.num_splits, config=dataclasses.replace(
                                plan.config, **parse_set(changes, plan.config)))
                columns.append((plan, knobs))

            def run(column):
                plan, knobs = column
                with knobs_set(knobs):
                    return plan.run(q, kk, vv, seqlens, table, **kw)

            outs = [run(c).float() for c in columns]
            diffs = [f"{(o - outs[0]).abs().max().item():.1e}" for o in outs[1:]]
            times = [[] for _ in columns]
            for _ in range(args.rounds):
                for i, column in enumerate(columns):
                    times[i].append(graph_us(lambda column=column: run(column)))
            med = [sorted(t)[len(t) // 2] for t in times]
            rows.append([case, f"{'auto=' if splits == 0 else ''}{plan_a.num_splits}",
                         f"{med[0]:.1f}"]
                        + [f"{m:.1f} ({m / med[0]:.3f}; {shape_of(plan)})"
                           for m, (plan, _) in zip(med[1:], columns[1:])] + diffs)
            print(rows[-1], flush=True)
            del columns, outs
        del q, kk, vv, table, seqlens, kw
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, {args.dtype} q, graph us (B / A)")
    names = args.set + args.knob
    print(tabulate(rows, headers=["case", "splits", "A (plan)"] + names
                   + [f"maxdiff {s}" for s in names], tablefmt="github"))


if __name__ == "__main__":
    main()
