"""Benchmark: shared-prefix paged decode (CUDA only, except ``--plan-only``).

    python -m kvonce bench prefix [--md docs/benchmarks.md] [--json PATH] [--no-peers]
                                  [--cases 0,3] [--plan-only] [--sweep]

The issue's table (issue 12): ``N`` sequences sharing a ``prefix``-token prompt, each with ``own``
tokens of its own, q_len 1, head dim 128, fp16, page size 16, pages in random physical order
(the shared pages once, referenced by every row of the block table):
(64, 32768, 256), (128, 16384, 128), (256, 8192, 64) at GQA 32/8, (128, 32768, 256) at MHA
32/32, and the in-L2 cases (64, 4096, 256), (16, 4096, 256), (64, 1024, 256), (128, 2048, 64) at
GQA 32/8.

Columns (medians of ``triton.testing.do_bench``, us; ``_graph``: ``do_bench_cudagraph``, the
call captured in a CUDA graph):
- ``plain``: ``PagedDecodePlan.run`` without a shared prefix (the plan made beforehand)
- ``auto``: ``PagedDecodePlan(..., shared_prefix="auto")``: what the plan picks
  (``cascade`` column: ``uses_cascade``); ``forced``: ``cascade=True``
- ``fi_plain``: FlashInfer ``BatchDecodeWithPagedKVCacheWrapper``; ``fi_casc``:
  ``MultiLevelCascadeAttentionWrapper`` with two levels (the shared pages, then each sequence's
  own), when ``import flashinfer`` works (each peer in its own try: a failure is reported)
- ``floor``: the unique K/V bytes (shared pages once + every sequence's own) / 3.0 TB/s (1e12 B/s);
  ``flop_floor``: 4 * N * nheads * (prefix + own) * 128 FLOP / 989 TFLOP/s (H100 SXM dense fp16)
- ``x_plain``: plain_graph / auto_graph; ``x_fi``: fi_casc_graph / auto_graph
Correctness first: every output is compared with kvonce's plain decode (relative error).
``--plan-only`` (no GPU needed) prints the tree, the layout and the cost model's decision per case
with the H100 constants (132 SMs, the Hopper config row), and its estimates (``est_*``: the
model's seconds for plain decode and the cascade, own pages included). ``--sweep`` times the
forced cascade (CUDA graph) for each of ``SWEEP_CONFIGS`` (chunk-first launch configs and
key-chunking targets) on the chosen cases: what ``configs._PREFIX_DECODE_TABLE`` is to be filled
from.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys

import torch

from ..kernels.configs import (PrefixDecodeConfig, get_paged_decode_config,
                               get_prefix_decode_config)
from ..paged import prefix as P
from ..paged.decode import PagedDecodePlan, choose_num_splits
from ..paged.prefix_tree import find_shared_prefixes, nodes_from_groups
from . import report

HEAD_DIM = 128
PAGE = 16
HBM_BYTES_PER_S = 3.0e12
H100_FLOPS = 989e12
H100 = ((9, 0), 132)  # capability, SMs: --plan-only


@dataclasses.dataclass
class Case:
    n: int
    prefix: int
    own: int
    nheads: int
    nheads_k: int

    @property
    def label(self) -> str:
        kind = "MHA" if self.nheads == self.nheads_k else "GQA"
        return f"{kind} {self.nheads}/{self.nheads_k}"

    @property
    def unique_bytes(self) -> int:
        return (self.prefix + self.n * self.own) * self.nheads_k * HEAD_DIM * 2 * 2

    @property
    def flops(self) -> float:
        return 4.0 * self.n * self.nheads * (self.prefix + self.own) * HEAD_DIM


CASES = (Case(64, 32768, 256, 32, 8), Case(128, 16384, 128, 32, 8), Case(256, 8192, 64, 32, 8),
         Case(128, 32768, 256, 32, 32), Case(64, 4096, 256, 32, 8), Case(16, 4096, 256, 32, 8),
         Case(64, 1024, 256, 32, 8), Case(128, 2048, 64, 32, 8))


def block_table(case: Case, device="cpu", seed: int = 0):
    """``[n, prefix/16 + own/16]`` int32: the shared pages (one random set, the same ids in every
    row), then each sequence's own; all page ids a random permutation. And the lengths."""
    shared, own = case.prefix // PAGE, -(-case.own // PAGE)
    num_pages = shared + case.n * own
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    table = torch.cat([perm[:shared].expand(case.n, shared), perm[shared:].view(case.n, own)],
                      dim=1).contiguous()
    seqlens = torch.full((case.n,), case.prefix + case.own, dtype=torch.int32)
    return table.to(device), seqlens.to(device), num_pages


def make_inputs(case: Case, dtype=torch.float16, seed: int = 0):
    table, seqlens, num_pages = block_table(case, "cuda", seed)
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (num_pages, PAGE, case.nheads_k, HEAD_DIM)
    k_cache = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
    v_cache = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
    q = torch.randn((case.n, 1, case.nheads, HEAD_DIM), generator=g, device="cuda", dtype=dtype)
    return q, k_cache, v_cache, seqlens, table


def plan_summary(case: Case, capability=H100[0], num_sms=H100[1]) -> dict:
    """The tree, layout and cost-model estimates of a case, on the CPU (``--plan-only``)."""
    table, seqlens, _ = block_table(case)
    nodes = nodes_from_groups(find_shared_prefixes(table, seqlens, PAGE), case.n, table.shape[1])
    config = get_prefix_decode_config(capability, HEAD_DIM)
    dec = get_paged_decode_config(capability, HEAD_DIM)
    model = P.DEFAULT_COST_MODEL
    width = P._suffix_width(P._prefix_pages(nodes, case.n), table.shape[1])
    suffix_splits = choose_num_splits(case.n, case.nheads_k, width * PAGE, num_sms, dec)
    shape = (case.n, 1, case.nheads, case.nheads_k, HEAD_DIM)
    kept = P._select_nodes(nodes, shape=shape, page_size=PAGE, kv_elem=2,
                           suffix_splits=suffix_splits, num_sms=num_sms, config=config,
                           model=model, force=False)
    lay = P._layout(nodes, rows_per_member=case.nheads // case.nheads_k, nheads_k=case.nheads_k,
                    page_size=PAGE, num_sms=num_sms, config=config)
    est = [P._node_gain(n, n.lo, m_rows=len(n.members) * case.nheads // case.nheads_k,
                        mblocks=lay.mblocks[i], block_m=lay.block_m, splits=lay.splits[i],
                        kv_bytes_per_key=2 * case.nheads_k * HEAD_DIM * 2, head_dim=HEAD_DIM,
                        nheads_k=case.nheads_k, page_size=PAGE, model=model)
           for i, n in enumerate(nodes)]
    # Both paths read every sequence's own pages once; the cascade adds launches and the suffix
    # partials' round trip (as _select_nodes counts them).
    own = case.n * case.own * 2 * case.nheads_k * HEAD_DIM * 2 / model.hbm_bytes_per_s
    fixed = (model.extra_launches * model.launch_s
             + case.n * case.nheads * suffix_splits * (HEAD_DIM + 1) * 8 / model.hbm_bytes_per_s)
    return {"heads": case.label, "N": case.n, "prefix": case.prefix, "own": case.own,
            "nodes": len(nodes), "kept": len(kept), "block_m": lay.block_m,
            "mblocks": lay.mblocks, "splits": lay.splits, "suffix_splits": suffix_splits,
            "node_programs": sum(m * s for m, s in zip(lay.mblocks, lay.splits)) * case.nheads_k,
            "est_plain_us": round((sum(e[0] for e in est) + own) * 1e6, 1),
            "est_cascade_us": round((sum(e[1] for e in est) + own + fixed) * 1e6, 1),
            "floor_us": round(case.unique_bytes / HBM_BYTES_PER_S * 1e6, 1)}


def _flashinfer_plain(q, k_cache, v_cache, table, case: Case):
    import flashinfer

    n, pages = table.shape
    indptr = torch.arange(0, n + 1, device="cuda", dtype=torch.int32) * pages
    last = torch.full((n,), PAGE, dtype=torch.int32, device="cuda")
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    wrapper.plan(indptr, table.reshape(-1), last, case.nheads, case.nheads_k, HEAD_DIM, PAGE,
                 q_data_type=q.dtype, kv_data_type=k_cache.dtype)
    q3 = q[:, 0].contiguous()
    return lambda: wrapper.run(q3, (k_cache, v_cache))


def _flashinfer_cascade(q, k_cache, v_cache, table, case: Case):
    """Two levels: the shared pages for all N queries, then each sequence's own pages."""
    import flashinfer

    n = case.n
    shared, own = case.prefix // PAGE, table.shape[1] - case.prefix // PAGE
    i32 = dict(dtype=torch.int32, device="cuda")
    qo = [torch.tensor([0, n], **i32), torch.arange(n + 1, **i32)]
    kv_indptr = [torch.tensor([0, shared], **i32), torch.arange(n + 1, **i32) * own]
    kv_indices = [table[0, :shared].contiguous(), table[:, shared:].reshape(-1).contiguous()]
    last = [torch.tensor([PAGE], **i32), torch.full((n,), PAGE, **i32)]
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
    wrapper.plan(qo, kv_indptr, kv_indices, last, case.nheads, case.nheads_k, HEAD_DIM, PAGE,
                 q_data_type=q.dtype, kv_data_type=k_cache.dtype)
    q3 = q[:, 0].contiguous()
    return lambda: wrapper.run(q3, (k_cache, v_cache))


SWEEP_CONFIGS = [
    PrefixDecodeConfig(128, 128, 8, 3, int64_kv_offsets=True),  # the Hopper row
    PrefixDecodeConfig(128, 128, 8, 3),  # the row in int32 offsets
    PrefixDecodeConfig(128, 64, 8, 3),
    PrefixDecodeConfig(128, 64, 8, 2),
    PrefixDecodeConfig(128, 32, 8, 3),
    PrefixDecodeConfig(128, 128, 8, 2),
    PrefixDecodeConfig(64, 64, 4, 3),
    PrefixDecodeConfig(64, 64, 4, 2),
    PrefixDecodeConfig(128, 64, 8, 3, programs_per_sm=1.0),
    PrefixDecodeConfig(128, 64, 8, 3, programs_per_sm=4.0, min_keys_per_split=256),
    PrefixDecodeConfig(128, 64, 8, 3, min_keys_per_split=1024),
    PrefixDecodeConfig(128, 128, 8, 3),
    PrefixDecodeConfig(64, 128, 4, 2),
    PrefixDecodeConfig(128, 64, 4, 3),
    PrefixDecodeConfig(128, 32, 4, 3),
]


def sweep(cases) -> list[dict]:
    import triton.testing

    rows = []
    for case in cases:
        args = make_inputs(case)
        base = PagedDecodePlan(*args)
        ref = base.run(*args).float()
        plain_us = triton.testing.do_bench_cudagraph(lambda: base.run(*args), rep=100,
                                                     return_mode="median") * 1e3
        for cfg in SWEEP_CONFIGS:
            c = P.plan_cascade(base, *args, "auto", cascade=True, config=cfg)
            err = rel_err(c.run(*args), ref)
            us = triton.testing.do_bench_cudagraph(lambda: c.run(*args), rep=100,
                                                   return_mode="median") * 1e3
            rows.append({"heads": case.label, "N": case.n, "prefix": case.prefix,
                         "own": case.own, "cfg": f"m{cfg.block_m} n{cfg.block_n} "
                         f"w{cfg.num_warps} s{cfg.num_stages} pps{cfg.programs_per_sm} "
                         f"mk{cfg.min_keys_per_split}"
                         f"{' i64' if cfg.int64_kv_offsets else ''}",
                         "splits": max(c.layout.splits),
                         "graph_us": round(us, 1), "plain_graph_us": round(plain_us, 1),
                         "x_plain": round(plain_us / us, 2), "err": err})
            print(rows[-1], flush=True)
        del args, base
        torch.cuda.empty_cache()
    return rows


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def run_case(case: Case, *, peers: bool) -> dict:
    import triton.testing

    eager = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    graph = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    q, k_cache, v_cache, seqlens, table = make_inputs(case)
    args = (q, k_cache, v_cache, seqlens, table)
    plain = PagedDecodePlan(*args)
    auto = PagedDecodePlan(*args, shared_prefix="auto")
    forced = PagedDecodePlan(*args, shared_prefix="auto", cascade=True)
    runs = {"plain": lambda: plain.run(*args), "auto": lambda: auto.run(*args),
            "forced": lambda: forced.run(*args)}
    ref = runs["plain"]().float()
    row = {"heads": case.label, "N": case.n, "prefix": case.prefix, "own": case.own,
           "cascade": auto.uses_cascade}
    c = forced._cascade
    # forced plan's layout: key chunks x M-blocks of its largest node / suffix splits
    row["splits"] = (f"{max(c.layout.splits)}x{max(c.layout.mblocks)}mb/{c.suffix_splits}"
                     if c else "-")
    row["err"] = max(rel_err(runs[k](), ref) for k in ("auto", "forced"))
    if peers:
        for name, make in (("fi_plain", _flashinfer_plain), ("fi_casc", _flashinfer_cascade)):
            try:
                fn = make(q, k_cache, v_cache, table, case)
                row[f"err_{name}"] = rel_err(fn()[:, None], ref)
                runs[name] = fn
            except Exception as exc:  # absent or failing: reported, not hidden
                print(f"{name}: {type(exc).__name__}: {exc}"[:300], flush=True)
    row["floor_us"] = round(case.unique_bytes / HBM_BYTES_PER_S * 1e6, 1)
    row["flop_floor_us"] = round(case.flops / H100_FLOPS * 1e6, 1)
    for name in ("plain", "auto", "forced", "fi_plain", "fi_casc"):
        for mode, bench in (("", eager), ("_graph", graph)):
            key = f"{name}{mode}_us"
            row[key] = "-"
            if name in runs:
                try:
                    row[key] = round(bench(runs[name]) * 1e3, 1)
                except Exception as exc:  # e.g. a peer that refuses graph capture
                    print(f"{key}: {type(exc).__name__}: {exc}"[:300], flush=True)
    ratio = lambda a, b: round(a / b, 2) if isinstance(a, float) and isinstance(b, float) else "-"
    row["x_plain"] = ratio(row["plain_graph_us"], row["auto_graph_us"])
    row["x_fi"] = ratio(row["fi_casc_graph_us"], row["auto_graph_us"])
    del args, q, k_cache, v_cache, plain, auto, forced, runs
    torch.cuda.empty_cache()
    return row


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m kvonce bench prefix")
    p.add_argument("--md", default="docs/benchmarks.md", help="append the table here ('' = no)")
    p.add_argument("--json", default="", help="also dump the rows as JSON here")
    p.add_argument("--no-peers", action="store_true", help="skip FlashInfer")
    p.add_argument("--cases", default="", help="only these case indices, comma-separated")
    p.add_argument("--plan-only", action="store_true",
                   help="print the tree, layout and cost-model decision per case (CPU)")
    p.add_argument("--sweep", action="store_true",
                   help="time the forced cascade per chunk-first config (SWEEP_CONFIGS)")
    args = p.parse_args(argv)
    cases = CASES
    if args.cases:
        cases = [CASES[int(i)] for i in args.cases.split(",")]
    if args.plan_only:
        print(report.format_rows([plan_summary(c) for c in cases]))
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench prefix needs a CUDA GPU (--plan-only does not)")
    print(report.environment(), flush=True)
    if args.sweep:
        rows = sweep(cases)
        print(report.format_rows(rows))
        if args.json:
            json.dump(rows, open(args.json, "w"), indent=1)
        return
    rows = []
    for case in cases:
        rows.append(run_case(case, peers=not args.no_peers))
        print(rows[-1], flush=True)
    bad = [r for r in rows if r["err"] > 2e-3]
    if bad:
        print(f"CORRECTNESS: {len(bad)} rows over 2e-3 relative error vs plain decode", flush=True)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    print(report.format_rows(rows))
    if args.md:
        report.append_markdown(args.md, "Shared-prefix decode (floor: unique K/V bytes / 3.0 TB/s)",
                               rows, command=("python -m kvonce bench prefix " + " ".join(argv))
                               .strip(), dtype="fp16", date=datetime.date.today().isoformat())


if __name__ == "__main__":
    main(sys.argv[1:])
