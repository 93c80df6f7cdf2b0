"""A/B of Gluon prefill module knobs, alternated rounds in one process (`bench prefill`'s inputs,
random page order): each variant ``PAGE[:KNOB[+KNOB...]]`` sets those module attributes of
``gluon_prefill`` to True (``KNOB=VALUE``: to the Python literal VALUE) while its plan makes its
launch (the plan's first run), then back.
``--module`` swaps in another copy of the module first (e.g. a past commit's, written beside
it), so that knobs since removed can be measured again. TFLOP/s eager (``do_bench``) / CUDA
graphs (``do_bench_cudagraph``), medians over rounds; ``same``: the output equals the first
variant's of its page size.

    PYTHONPATH=src python scripts/prefill_knob_ab.py [--module kvonce.kernels.gluon_prefill]
        [--rows prefill] [--variants 16,16:PINGPONG,256,256:PINGPONG] [--rounds 3]
"""
import argparse
import ast
import importlib
import sys

import torch
from prefill_page_order import ab_rows
from tabulate import tabulate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", default="kvonce.kernels.gluon_prefill")
    ap.add_argument("--rows", default="prefill")
    ap.add_argument("--variants", default="16,256")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import kvonce
    import kvonce.kernels
    from kvonce.bench.prefill import CASES, make_inputs

    mod = importlib.import_module(args.module)
    sys.modules["kvonce.kernels.gluon_prefill"] = mod   # the launch's lazy import finds it
    kvonce.kernels.gluon_prefill = mod
    rows = []
    for name in args.rows.split(","):
        case = CASES[name]
        inputs, calls, outs = {}, {}, {}
        for variant in args.variants.split(","):
            page, *knobs = variant.split(":")
            knobs = [k for part in knobs for k in part.split("+") if k]   # "16:" repeats "16"
            if page not in inputs:
                inputs[page] = make_inputs(case, int(page))
            inp = inputs[page]
            a = (inp.q, inp.k_cache, inp.v_cache, inp.cu_seqlens_q, inp.cache_seqlens,
                 inp.block_table)
            values = {k.partition("=")[0]: ast.literal_eval(k.partition("=")[2] or "True")
                      for k in knobs}   # KNOB sets True, KNOB=VALUE sets VALUE
            saved = {k: getattr(mod, k) for k in values}
            for k, value in values.items():
                setattr(mod, k, value)
            plan = kvonce.PagedPrefillPlan(*a, max_seqlen_q=max(case.q_lens))
            outs[variant] = plan.run(*a)   # makes the launch, with the knobs set
            launch = next(iter(plan._launches.values()))._gluon
            if type(launch).__module__ != mod.__name__:
                raise SystemExit(f"{variant}: the launch is not {mod.__name__}'s")
            for k, v in saved.items():
                setattr(mod, k, v)
            calls[variant] = (lambda plan=plan, a=a: plan.run(*a))
        rows += ab_rows(case, calls, outs, args.rounds, lambda v: v.split(":")[0])
    print(tabulate(rows, headers=["row", "variant", "TFLOP/s eager", "TFLOP/s graphs", "same"]))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, module {args.module}")


if __name__ == "__main__":
    main()
