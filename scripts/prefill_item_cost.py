"""What a Gluon prefill work item costs beyond its key tiles: CUDA-graph times of causal and
non-causal prefills whose items hold few or many key tiles (the same 16k query tokens as 1-32
sequences, and chunks over longer histories), fitted as ``time = a * tiles + b * masked + c *
items`` per SM (tiles: every key tile an item computes; masked: tiles past ``full``, the
diagonal band and sequence ends; items: 128-row work items), and the fit's residuals.

    PYTHONPATH=src python scripts/prefill_item_cost.py [--pages 16,256] [--block-n 128]
"""
import argparse

import numpy as np
import torch
import triton.testing
from tabulate import tabulate

import kvonce
from kvonce.bench.prefill import NHEADS, NHEADS_K, Case, make_inputs
from kvonce.kernels.configs import device_info

BLOCK_M = 128


def counts(case: Case, causal: bool, block_n: int) -> tuple[int, int, int]:
    """(key tiles, masked tiles, items) of the Gluon prefill's work (``_tile``'s arithmetic)."""
    block_q = BLOCK_M // (NHEADS // NHEADS_K)
    tiles = masked = items = 0
    for q_len, seqlen in zip(case.q_lens, case.k_lens):
        for tok0 in range(0, q_len, block_q):
            if causal:
                diag = seqlen - q_len
                last_tok = min(tok0 + block_q, q_len) - 1
                hi = max(min(seqlen, diag + last_tok + 1), 0)
                all_see = min(hi, diag + tok0 + 1)
            else:
                hi = all_see = seqlen
            full = max(all_see, 0) // block_n * block_n
            n = -(-hi // block_n)
            tiles += n
            masked += n - full // block_n
            items += 1
    return tiles * NHEADS_K, masked * NHEADS_K, items * NHEADS_K


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", default="16,256")
    ap.add_argument("--block-n", type=int, default=128)
    args = ap.parse_args()
    cases = [Case(f"{b}x{n}", ((b, n, n),)) for b, n in
             ((32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384))]
    cases += [Case(f"{b}x512/{k}", ((b, 512, k),)) for b, k in
              ((64, 1024), (64, 2048), (64, 4096), (32, 8192))]
    sms = device_info(torch.device("cuda"))[1]
    for page in (int(p) for p in args.pages.split(",")):
        rows, xs, ys = [], [], []
        for case in cases:
            inp = make_inputs(case, page)
            a = (inp.q, inp.k_cache, inp.v_cache, inp.cu_seqlens_q, inp.cache_seqlens,
                 inp.block_table)
            for causal in (True, False):
                plan = kvonce.PagedPrefillPlan(*a, max_seqlen_q=max(case.q_lens), causal=causal)
                ms = triton.testing.do_bench_cudagraph(lambda: plan.run(*a), rep=100,
                                                       return_mode="median")
                tiles, masked, items = counts(case, causal, args.block_n)
                flops = case.flops() if causal else 4 * 128 * NHEADS * sum(
                    q * k for q, k in zip(case.q_lens, case.k_lens))
                xs.append([tiles / sms, masked / sms, items / sms])
                ys.append(ms * 1e3)
                rows.append([case.label, causal, tiles, masked, items, round(ms * 1e3, 1),
                             round(flops / ms / 1e9, 1)])
            del inp, plan
            torch.cuda.empty_cache()
        coef, *_ = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)
        fit = np.array(xs) @ coef
        for row, f in zip(rows, fit):
            row.append(round(float(f), 1))
        print(f"page {page}: us per SM-tile {coef[0]:.3f}, per masked tile {coef[1]:+.3f}, "
              f"per item {coef[2]:+.3f} (an item = {coef[2] / coef[0]:.2f} tiles)")
        print(tabulate(rows, headers=["case", "causal", "tiles", "masked", "items", "us",
                                      "TFLOP/s", "fit us"]), flush=True)
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
