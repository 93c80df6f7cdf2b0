"""Issue 26's targets, row by row, from the markdown tables the benchmarks write
(``bench decode --graph-peers``, ``bench quant``, ``bench prefill``; any of them, any order):

    python scripts/issue26_targets.py OUT/bench_decode.md OUT/bench_quant_fp16.md \\
        OUT/bench_prefill.md

Targets (CUDA-graph times unless named): decode, every row at least 95% of dense SDPA's speed
and at least FlashInfer's; quantized decode, fp8 and int8 at least 1.9x kvonce's own fp16 cache,
int4 at least 3.3x, kvonce fp8 faster than FlashInfer fp8 on every row; prefill, kvonce at least
FlashInfer on every row (eager and graphs) and "prefill 8x2048" at 450 TFLOP/s or more.
"""
from __future__ import annotations

import sys

from tabulate import tabulate

QUANT_TARGETS = {"fp8_e4m3": 1.9, "int8": 1.9, "int4": 3.3}


def tables(path: str) -> list[list[dict]]:
    """The GitHub-style tables of a markdown file, each as a list of {header: cell} rows."""
    found, rows, header = [], None, None
    for line in open(path):
        if not line.startswith("|"):
            if rows:
                found.append(rows)
            rows, header = None, None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header, rows = cells, []
        elif not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells)))
    if rows:
        found.append(rows)
    return found


def num(cell: str) -> float | None:
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None


def decode_checks(rows: list[dict]) -> list[list]:
    out = []
    for r in rows:
        kv, sdpa, fi = (num(r.get(c)) for c in ("kv_graph_us", "sdpa_graph_us", "fi_graph_us"))
        case = f"decode {r['heads']} {r['batch']} x {r['seqlen']}"
        if kv and sdpa:
            out.append([case, ">= 95% of dense SDPA", f"{100 * sdpa / kv:.1f}%", sdpa / kv >= 0.95])
        if kv and fi:
            out.append([case, ">= FlashInfer", f"{fi / kv:.3f}x", fi >= kv])
    return out


def quant_checks(rows: list[dict]) -> list[list]:
    out, by_case = [], {}
    for r in rows:
        by_case.setdefault((r["heads"], r["batch x len"]), {})[r["impl"]] = r
    for (heads, shape), impls in by_case.items():
        case = f"quant {heads} {shape}"
        for fmt, target in QUANT_TARGETS.items():
            r = impls.get(f"kvonce {fmt}")
            if r is not None:
                x = num(r["x_graph"])
                out.append([case, f"{fmt} >= {target}x fp16", f"{x:.2f}x", x >= target])
        ours, theirs = impls.get("kvonce fp8_e4m3"), impls.get("flashinfer fp8")
        if ours and theirs and num(theirs["graph_us"]):
            ratio = num(theirs["graph_us"]) / num(ours["graph_us"])
            out.append([case, "fp8 faster than FlashInfer fp8", f"{ratio:.2f}x", ratio > 1])
    return out


def prefill_checks(rows: list[dict]) -> list[list]:
    out = []
    for r in rows:
        case = f"prefill {r['row']} page {r['page']}"
        for col in ("", "_graph"):
            kv, fi = num(r.get(f"kv{col}_ms")), num(r.get(f"fi{col}_ms"))
            timing = "graphs" if col else "eager"
            if kv and fi:
                out.append([case, f">= FlashInfer ({timing})", f"{fi / kv:.3f}x", fi >= kv])
            tf = num(r.get(f"kv{col}_TF"))
            if r["row"].startswith("prefill 8x2048") and tf:
                out.append([case, f">= 450 TFLOP/s ({timing})", f"{tf:.1f}", tf >= 450])
    return out


def main(paths: list[str]) -> int:
    checks = []
    for path in paths:
        for rows in tables(path):
            head = rows[0].keys() if rows else ()
            if "kv_graph_us" in head and "sdpa_graph_us" in head:
                checks += decode_checks(rows)
            elif "impl" in head and "x_graph" in head:
                checks += quant_checks(rows)
            elif "row" in head and "kv_ms" in head:
                checks += prefill_checks(rows)
    print(tabulate([c[:3] + ["yes" if c[3] else "NO"] for c in checks],
                   headers=["case", "target", "measured", "met"], tablefmt="github"))
    met = sum(c[3] for c in checks)
    print(f"\n{met} of {len(checks)} met")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
