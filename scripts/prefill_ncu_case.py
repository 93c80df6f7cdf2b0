"""`bench prefill`'s plan run three times, for a profiler (ncu skips the first two):

    ncu -k regex:gluon_prefill --launch-skip 2 --launch-count 1 --section WarpStateStats \\
        python scripts/prefill_ncu_case.py [ROW] [PAGE]

ROW is a ``bench prefill`` case (``prefill``, ``chunked``, ``mixed``; default prefill), PAGE the
page size (default 16); bf16, 32/8 heads, d128, pages in random order, the plan's default config.
Module knobs go through ``scripts/knob_run.py``.
"""
import sys

import torch

import kvonce
from kvonce.bench.prefill import CASES, make_inputs


def main() -> None:
    row = sys.argv[1] if len(sys.argv) > 1 else "prefill"
    page = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    case = CASES[row]
    inp = make_inputs(case, page)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.cu_seqlens_q, inp.cache_seqlens,
            inp.block_table)
    plan = kvonce.PagedPrefillPlan(*args, max_seqlen_q=max(case.q_lens))
    for _ in range(3):
        plan.run(*args)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
