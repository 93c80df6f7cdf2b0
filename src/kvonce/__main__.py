"""``python -m kvonce demo`` and ``python -m kvonce bench <family>``."""
from __future__ import annotations

import importlib
import sys

BENCH_FAMILIES = ("zigzag", "decode", "host", "cp", "quant", "prefix", "prefill", "serve")

USAGE = """usage: python -m kvonce demo
       python -m kvonce bench {zigzag,decode,host,cp,quant,prefix,prefill,serve} [options]   (CUDA GPU; --help for options)"""


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    if argv[0] == "demo":
        from .demo import main as demo_main

        demo_main(argv[1:])
    elif argv[0] == "bench" and len(argv) > 1 and argv[1] in BENCH_FAMILIES:
        importlib.import_module(f"kvonce.bench.{argv[1]}").main(argv[2:])
    else:
        raise SystemExit(USAGE)


if __name__ == "__main__":
    main(sys.argv[1:])
