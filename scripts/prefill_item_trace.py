"""Where a Gluon prefill work item's time goes: each consumer warpgroup stamps its SM's clock at
the steps of every item (``gluon_prefill.PROBE_TRACE``), and this prints the median cycles of
each step, the loop's cycles a key tile, and what an item costs beyond its tiles at that rate.

Steps: ``q``: the item's Q into shared memory (two warpgroup barriers); ``tile0``: the first
tile's Q Kᵀ and softmax (no overlap); ``loop``: tiles 1 .. n-1 (Q Kᵀ of tile j under P V of
tile j - 1), a tile, and of that the cycles waiting for K (``k_ready``) and V (``v_ready``) to
land; ``last``: the last P V, the next item's lookup and Q gather under it (of it: the last
V's wait, the P V's issue, and from its start to the next Q gather's issue);
``out``: the epilogue (O through shared memory to global, the LSE); ``gap``: to the next
item's first stamp. Between a CTA's two consumer warpgroups: ``WG1 lag`` (warpgroup 1's item
start less warpgroup 0's, the same item), and of the time both are past their first item, the
share in which both are switching items at once (``both switch``, a warpgroup's switch: the end
of its loop to the end of its next item's first tile; ``one switch``: exactly one is).
The loop's tile by step (as a warp reaches each in program order, so an instruction's
latency shows where its result is first used): ``issue`` (K wait, Q Kᵀ issue, V wait, P V
issue), ``QK wait`` (for tile j's scores), ``softmax``, ``PV wait`` (for tile j - 1's P V),
``rescale`` (O by alpha, P to 16 bits). The softmaxes of the loop's first tiles (1 ..
``TRACE_TILES``, each warpgroup's start and end stamps): ``softmax overlap``, the share of a
warpgroup's softmax time in which the other warpgroup is in the same tile's or another tile's
softmax; ``softmax alone`` and ``softmax shared``, the median softmax of the tiles that
overlapped the other's not at all and by more than half.

    PYTHONPATH=src python scripts/prefill_item_trace.py [--rows prefill,chunked] [--pages 16,256]
        [--noncausal]
"""
import argparse
import statistics

import torch
from tabulate import tabulate

import kvonce
from kvonce.bench.prefill import CASES, make_inputs
from kvonce.kernels import gluon_prefill

STEPS = ("q", "tile0", "loop/tile", "k wait/tile", "v wait/tile", "last", "of it: V wait",
         "PV issue", "to lookup", "out", "gap", "item", "tiles", "item - tiles*loop",
         "WG1 lag", "both switch", "one switch", "issue/tile", "QK wait/tile",
         "softmax/tile", "PV wait/tile", "rescale/tile", "softmax overlap", "softmax alone",
         "softmax shared")
LOOP_STEPS = ("issue/tile", "QK wait/tile", "softmax/tile", "PV wait/tile", "rescale/tile")


def trace_case(case, page: int, causal: bool):
    inp = make_inputs(case, page)
    a = (inp.q, inp.k_cache, inp.v_cache, inp.cu_seqlens_q, inp.cache_seqlens, inp.block_table)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.full((sms, gluon_prefill.TRACE_ROUNDS.value, 2, gluon_prefill.TRACE_EVENTS.value),
                     -1, dtype=torch.int64, device="cuda")
    gluon_prefill.PROBE_TRACE = buf
    try:
        plan = kvonce.PagedPrefillPlan(*a, max_seqlen_q=max(case.q_lens), causal=causal)
        for _ in range(5):
            plan.run(*a)
        buf.fill_(-1)
        plan.run(*a)
        torch.cuda.synchronize()
    finally:
        gluon_prefill.PROBE_TRACE = None
    return summarize(buf.cpu())


def summarize(t):
    """The STEPS' medians of a trace buffer ``[programs, TRACE_ROUNDS, 2, TRACE_EVENTS]``."""
    steps = {k: [] for k in STEPS}
    for cta in range(t.shape[0]):
        for part in range(2):
            rows = [r for r in range(t.shape[1]) if t[cta, r, part, 0] >= 0]
            for r in rows:
                e = t[cta, r, part].tolist()
                n = e[6]
                steps["q"].append(e[1] - e[0])
                steps["tile0"].append(e[2] - e[1])
                if n > 1:
                    steps["loop/tile"].append((e[3] - e[2]) / (n - 1))
                    steps["k wait/tile"].append(e[7] / (n - 1))
                    steps["v wait/tile"].append(e[8] / (n - 1))
                    for slot, name in enumerate(LOOP_STEPS, 12):
                        steps[name].append(e[slot] / (n - 1))
                steps["last"].append(e[4] - e[3])
                if e[9] >= 0:   # the last P V's stamps (an item with key tiles)
                    steps["of it: V wait"].append(e[10] - e[3])
                    steps["PV issue"].append(e[11] - e[10])
                    steps["to lookup"].append(e[9] - e[3])
                steps["out"].append(e[5] - e[4])
                if r + 1 in rows:
                    nxt = t[cta, r + 1, part, 0].item()
                    steps["gap"].append(nxt - e[5])
                    steps["item"].append(nxt - e[0])
                    steps["tiles"].append(n)
    lags, both, one, span = [], 0, 0, 0
    for cta in range(t.shape[0]):
        rows = [r for r in range(t.shape[1]) if t[cta, r, 0, 0] >= 0 and t[cta, r, 1, 0] >= 0]
        windows = []   # each warpgroup's switch windows: loop end -> next item's tile 0 end
        for part in range(2):
            windows.append([(t[cta, r, part, 3].item(), t[cta, r + 1, part, 2].item())
                            for r in rows if r + 1 in rows])
        lags += [t[cta, r, 1, 0].item() - t[cta, r, 0, 0].item() for r in rows]
        if len(rows) < 2:
            continue
        lo = max(t[cta, rows[0], p, 2].item() for p in range(2))
        hi = min(t[cta, rows[-1], p, 3].item() for p in range(2))
        if hi <= lo:   # an item without key tiles at either end (its stamps 2, 3 unwritten)
            continue
        marks = sorted({lo, hi} | {x for w in windows for a, b in w for x in (a, b)
                                   if lo <= x <= hi})
        for a, b in zip(marks, marks[1:]):
            mid = (a + b) / 2
            inside = sum(any(x <= mid < y for x, y in w) for w in windows)
            both += (b - a) * (inside == 2)
            one += (b - a) * (inside == 1)
        span += hi - lo
    steps["WG1 lag"] = lags
    overlap, total, alone, shared = 0, 0, [], []
    for cta in range(t.shape[0]):
        for r in range(t.shape[1]):
            spans = []   # each warpgroup's softmax intervals in this item
            for part in range(2):
                e = t[cta, r, part].tolist()
                if e[0] < 0 or e[6] < 2:
                    break
                k = min(e[6] - 1, gluon_prefill.TRACE_TILES.value)
                spans.append([(e[17 + 2 * i], e[18 + 2 * i]) for i in range(k)])
            if len(spans) < 2:
                continue
            for part in range(2):
                for a, b in spans[part]:
                    o = sum(max(0, min(b, d) - max(a, c)) for c, d in spans[1 - part])
                    overlap += o
                    total += b - a
                    if o == 0:
                        alone.append(b - a)
                    elif 2 * o > b - a:
                        shared.append(b - a)
    steps["softmax overlap"] = [overlap / total] if total else []
    steps["softmax alone"] = alone
    steps["softmax shared"] = shared
    steps["both switch"] = [both / span] if span else []
    steps["one switch"] = [one / span] if span else []
    loop = statistics.median(steps["loop/tile"])
    steps["item - tiles*loop"] = [i - n * loop for i, n in zip(steps["item"], steps["tiles"])]
    return [round(statistics.median(steps[k]),
                  3 if k.endswith("switch") or k.endswith("overlap") else 1)
            if steps[k] else "-" for k in STEPS]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="prefill,chunked")
    ap.add_argument("--pages", default="16,256")
    ap.add_argument("--noncausal", action="store_true")
    args = ap.parse_args()
    out = []
    for name in args.rows.split(","):
        for page in (int(p) for p in args.pages.split(",")):
            for causal in (True, False) if args.noncausal else (True,):
                out.append([CASES[name].label, page, causal,
                            *trace_case(CASES[name], page, causal)])
                print(tabulate(out[-1:]), flush=True)
    print(tabulate(out, headers=["row", "page", "causal", *STEPS]))
    print("median cycles (%clock64) a consumer warpgroup and item; "
          f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
