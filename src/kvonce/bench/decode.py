"""Benchmark: paged KV-cache decode (CUDA only).

    python -m kvonce bench decode [--md docs/benchmarks.md] [--plot PATH] [--sweep] [--quick]

The documents' table: (batch, seqlen) from (256, 256) to (1, 131072), head dim 128, fp16, page
size 16 with pages in random order, for 12 q / 12 KV heads (MHA), 12 / 2 (GQA 6) and Llama-3-8B's
32 / 8 (GQA 4). Columns (each a ``triton.testing.do_bench`` median, ms):
- ``torch_simple``: reference.paged_attention_ref (float32 per-sequence loop; small batches only)
- ``sdpa_dense``: F.scaled_dot_product_attention (enable_gqa) on a dense cache gathered beforehand
- ``kv_single``: kvonce.paged_attention(num_splits=1); ``kv_auto``: num_splits=0 (split-K auto),
  each call validating and planning; ``kv_plan``: ``PagedDecodePlan.run`` with the plan made
  beforehand (as FlashInfer's ``plan`` is); ``kv_graph``: that call captured in a CUDA graph
  (``do_bench_cudagraph``: the kernels without the Python launch path)
- ``flashinfer``: BatchDecodeWithPagedKVCacheWrapper, when ``import flashinfer`` works
Bandwidth counts the K/V bytes that must be read once (2 * batch * seqlen * nheads_k * headdim *
2 B); TB/s = 1e12 B/s; ``%bw`` is against the read bandwidth measured in the same run (a large
fp16 sum). Correctness comes first: every kvonce output is compared with SDPA's (relative error).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys

import torch

from ..kernels.configs import PagedDecodeConfig
from ..paged.decode import PagedDecodePlan, paged_attention
from ..reference import paged_attention_ref
from . import report

SHAPES = ((256, 256), (128, 512), (64, 1024), (32, 2048), (16, 4096), (8, 8192), (4, 16384),
          (2, 32768), (1, 65536), (1, 131072))
HEADS = ((12, 12, "MHA 12/12"), (12, 2, "GQA 12/2"), (32, 8, "GQA 32/8"))
HEAD_DIM = 128
PAGE = 16


@dataclasses.dataclass
class Case:
    batch: int
    seqlen: int
    nheads: int
    nheads_k: int
    label: str

    @property
    def kv_bytes(self) -> int:
        return 2 * self.batch * self.seqlen * self.nheads_k * HEAD_DIM * 2


def make_inputs(case: Case, dtype=torch.float16, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per_seq = case.seqlen // PAGE
    num_pages = case.batch * pages_per_seq
    shape = (num_pages, PAGE, case.nheads_k, HEAD_DIM)
    k_cache = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
    v_cache = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
    perm = torch.randperm(num_pages, generator=g, device="cuda").to(torch.int32)
    block_table = perm.view(case.batch, pages_per_seq).contiguous()
    seqlens = torch.full((case.batch,), case.seqlen, dtype=torch.int32, device="cuda")
    q = torch.randn((case.batch, 1, case.nheads, HEAD_DIM), generator=g, device="cuda", dtype=dtype)
    return q, k_cache, v_cache, seqlens, block_table


def read_bandwidth() -> float:
    """Read bandwidth (B/s) of a 4 GiB fp16 sum: the floor every row is measured against."""
    import triton.testing

    x = torch.randn(2 << 30, dtype=torch.float16, device="cuda")
    ms = triton.testing.do_bench(lambda: x.sum(), warmup=25, rep=200, return_mode="median")
    bw = x.numel() * 2 / (ms * 1e-3)
    del x
    torch.cuda.empty_cache()
    return bw


def _flashinfer_runner(q, k_cache, v_cache, seqlens, block_table, case: Case):
    """A closure running FlashInfer's paged decode on the same pages, or None if absent."""
    try:
        import flashinfer
    except Exception:  # absent or broken: reported as absent
        return None
    batch, pages = block_table.shape
    indptr = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * pages
    indices = block_table.reshape(-1)
    last = torch.full((batch,), PAGE, dtype=torch.int32, device="cuda")
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    # The CUDA-core decode kernel aborts for group size 6 (prepare_flashinfer.sh): tensor cores
    # there.
    tc = case.nheads // case.nheads_k == 6
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
    wrapper.plan(indptr, indices, last, case.nheads, case.nheads_k, HEAD_DIM, PAGE,
                 q_data_type=q.dtype, kv_data_type=k_cache.dtype)
    q3 = q[:, 0].contiguous()
    return lambda: wrapper.run(q3, (k_cache, v_cache))


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def run_case(case: Case, bw: float, *, peers: bool, config=None, graph_peers: bool = False) -> dict:
    import triton.testing

    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    q, k_cache, v_cache, seqlens, block_table = make_inputs(case)
    # Dense copy for SDPA, gathered outside the timing: [batch, nheads_k, seqlen, d].
    dense_k = k_cache[block_table.long()].reshape(case.batch, case.seqlen, case.nheads_k, HEAD_DIM)
    dense_v = v_cache[block_table.long()].reshape(case.batch, case.seqlen, case.nheads_k, HEAD_DIM)
    dense_k, dense_v = dense_k.transpose(1, 2).contiguous(), dense_v.transpose(1, 2).contiguous()
    qt = q.transpose(1, 2)
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qt, dense_k, dense_v,
                                                                    enable_gqa=True)
    single = lambda: paged_attention(q, k_cache, v_cache, seqlens, block_table, num_splits=1,
                                     config=config)
    auto = lambda: paged_attention(q, k_cache, v_cache, seqlens, block_table, num_splits=0,
                                   config=config)
    plan = PagedDecodePlan(q, k_cache, v_cache, seqlens, block_table, config=config)
    planned = lambda: plan.run(q, k_cache, v_cache, seqlens, block_table)
    ref = sdpa().transpose(1, 2).float()
    row = {"heads": case.label, "batch": case.batch, "seqlen": case.seqlen}
    # the plan's launch: its split count (after the launch-shape rule re-cuts it) and key tile
    row["splits"], row["block_n"] = plan.num_splits, plan.config.block_n
    row["err_single"] = rel_err(single(), ref)
    row["err_auto"] = max(rel_err(auto(), ref), rel_err(planned(), ref))
    times = {}
    if peers and case.batch <= 4:
        times["torch_simple"] = bench(lambda: paged_attention_ref(q, k_cache, v_cache, seqlens,
                                                                  block_table))
    times["sdpa_dense"] = bench(sdpa)
    graphed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    if graph_peers:
        # Peers captured in a CUDA graph too, so the graph column compares like with like.
        times["sdpa_graph"] = graphed(sdpa)
    times["kv_single"] = bench(single)
    times["kv_auto"] = bench(auto)
    times["kv_plan"] = bench(planned)
    # The planned call captured in a CUDA graph: kernel time without the Python launch path.
    times["kv_graph"] = triton.testing.do_bench_cudagraph(planned, rep=100, return_mode="median")
    if peers:
        fi = _flashinfer_runner(q, k_cache, v_cache, seqlens, block_table, case)
        if fi is not None:
            row["err_fi"] = rel_err(fi()[:, None], ref)
            times["flashinfer"] = bench(fi)
            if graph_peers:
                try:
                    times["fi_graph"] = graphed(fi)
                except Exception as exc:  # capture refused: reported, not hidden
                    print(f"FlashInfer graph capture failed: {type(exc).__name__}: {exc}"[:200])
    for name in ("torch_simple", "sdpa_dense", "kv_single", "kv_auto", "kv_plan", "kv_graph",
                 "flashinfer", "sdpa_graph", "fi_graph"):
        if name in times:
            ms = times[name]
            row[f"{name}_us"] = round(ms * 1e3, 1)
            row[f"{name}_TBs"] = round(case.kv_bytes / (ms * 1e-3) / 1e12, 3)
        else:
            row[f"{name}_us"] = row[f"{name}_TBs"] = "-"
    ms = times["kv_plan"]
    row["plan_%bw"] = round(100 * case.kv_bytes / (ms * 1e-3) / bw, 1)
    del q, k_cache, v_cache, dense_k, dense_v
    torch.cuda.empty_cache()
    return row


# int64 offsets as the shipped plain rows (configs: int64_kv_offsets); the int32 form is a row of
# its own
SWEEP_CONFIGS = [
    PagedDecodeConfig(64, 4, 2, int64_kv_offsets=True),
    PagedDecodeConfig(64, 4, 2, int64_kv_offsets=True, kv_cache_modifier=".cg"),
    PagedDecodeConfig(64, 4, 2, int64_kv_offsets=True, kv_eviction="evict_first"),
    PagedDecodeConfig(64, 2, 2, int64_kv_offsets=True),
    PagedDecodeConfig(32, 4, 2, int64_kv_offsets=True),
    PagedDecodeConfig(64, 4, 2, int64_kv_offsets=True, programs_per_sm=5.8),
    PagedDecodeConfig(64, 4, 2),
]
SWEEP_SHAPES = ((16, 4096), (4, 16384), (1, 131072))


def sweep(bw: float) -> list[dict]:
    rows = []
    for nheads, nheads_k, label in HEADS:
        for batch, seqlen in SWEEP_SHAPES:
            case = Case(batch, seqlen, nheads, nheads_k, label)
            for cfg in SWEEP_CONFIGS:
                r = run_case(case, bw, peers=False, config=cfg)
                rows.append({"heads": label, "batch": batch, "seqlen": seqlen,
                             "cfg": f"n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} "
                                    f"mk{cfg.min_keys_per_split} pps{cfg.programs_per_sm} "
                                    f"{cfg.kv_cache_modifier}{cfg.kv_eviction}"
                                    f"{'' if cfg.int64_kv_offsets else ' i32'}",
                             "splits": r["splits"], "single_TBs": r["kv_single_TBs"],
                             "auto_TBs": r["kv_auto_TBs"], "plan_TBs": r["kv_plan_TBs"],
                             "graph_TBs": r["kv_graph_TBs"],
                             "err": max(r["err_single"], r["err_auto"])})
                print(" ".join(str(v) for v in rows[-1].values()), flush=True)
    return rows


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m kvonce bench decode")
    p.add_argument("--md", default="docs/benchmarks.md", help="append the table here ('' = no)")
    p.add_argument("--plot", default="docs/bench_decode.png", help="PNG plot path ('' = no)")
    p.add_argument("--json", default="", help="also dump the rows as JSON here")
    p.add_argument("--sweep", action="store_true", help="config sweep on a subset instead")
    p.add_argument("--quick", action="store_true", help="three shapes only")
    p.add_argument("--no-peers", action="store_true", help="skip torch_simple and FlashInfer")
    p.add_argument("--graph-peers", action="store_true",
                   help="also time SDPA and FlashInfer captured in CUDA graphs")
    p.add_argument("--shapes", default="", help="only these BATCHxSEQLEN, comma-separated")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench decode needs a CUDA GPU")
    bw = read_bandwidth()
    print(f"{report.environment()}; measured read bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    if args.sweep:
        rows = sweep(bw)
        print(report.format_rows(rows))
        if args.json:
            json.dump(rows, open(args.json, "w"), indent=1)
        return
    shapes = SHAPES[::4] if args.quick else SHAPES
    if args.shapes:
        wanted = {tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")}
        shapes = [sh for sh in shapes if tuple(sh) in wanted]
    rows = []
    for nheads, nheads_k, label in HEADS:
        for batch, seqlen in shapes:
            rows.append(run_case(Case(batch, seqlen, nheads, nheads_k, label), bw,
                                 peers=not args.no_peers, graph_peers=args.graph_peers))
            print(rows[-1], flush=True)
    bad = [r for r in rows if max(r["err_single"], r["err_auto"]) > 2e-3]
    if bad:
        print(f"CORRECTNESS: {len(bad)} rows over 2e-3 relative error vs SDPA", flush=True)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    keys = ["heads", "batch", "seqlen", "splits", "block_n", "torch_simple_us", "sdpa_dense_us",
            "sdpa_dense_TBs", "kv_single_us", "kv_single_TBs", "kv_auto_us", "kv_auto_TBs",
            "kv_plan_us", "kv_plan_TBs", "plan_%bw", "kv_graph_us", "kv_graph_TBs",
            "flashinfer_us", "flashinfer_TBs"]
    if args.graph_peers:
        keys += ["sdpa_graph_us", "sdpa_graph_TBs", "fi_graph_us", "fi_graph_TBs"]
    table = [{k: r[k] for k in keys} for r in rows]
    print(report.format_rows(table))
    command = "python -m kvonce bench decode " + " ".join(argv)
    if args.md:
        report.append_markdown(args.md, f"Paged decode (read bw {bw / 1e12:.2f} TB/s)", table,
                               command=command.strip(), dtype="fp16",
                               date=datetime.date.today().isoformat())
    if args.plot:
        plot_rows = [dict(r, case=f"{r['heads']} {r['batch']}x{r['seqlen']}") for r in rows]
        cols = [c for c in ("sdpa_dense_TBs", "kv_auto_TBs", "kv_plan_TBs", "kv_graph_TBs",
                            "flashinfer_TBs")
                if all(isinstance(r[c], float) for r in rows)]
        report.bar_plot(args.plot, plot_rows, "case", cols, "TB/s of K/V read")


if __name__ == "__main__":
    main(sys.argv[1:])
