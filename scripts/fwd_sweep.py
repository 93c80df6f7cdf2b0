"""Sweep the dual-group forward's launch configs at the Llama-3-8B zigzag shapes (CUDA): the
same as ``python -m kvonce bench zigzag --sweep`` (kept for the commands in docs/notes.md).

    PYTHONPATH=src python scripts/fwd_sweep.py [--only r0,r3] [--cfg 128,64,8,3 128,64,8,3,o,t ...]

A spec is ``block_m,block_n,num_warps,num_stages`` plus flags: ``o`` one group per program
(``config.one_group``), ``t`` TMA descriptors for unmasked K/V tiles (``config.tma``).
"""
from __future__ import annotations

import argparse

from kvonce.bench.zigzag import SWEEP_SPECS, sweep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="1x8192,mixed")
    ap.add_argument("--cfg", nargs="*", default=list(SWEEP_SPECS))
    args = ap.parse_args()
    args.dtype = "bf16"
    sweep(args, args.cfg)


if __name__ == "__main__":
    main()
