"""Benchmark: paged decode over quantized KV caches, and the quantizing append (CUDA only).

    python -m kvonce bench quant [--shapes 16x4096,64x8192] [--heads 32/8,12/2] [--no-peers]
                                 [--rep MS] [--sustain S] [--settle S]
                                 [--dtype fp16|bf16] [--layout nhd|hnd] [--outliers N]
                                 [--md docs/benchmarks.md]
                                 [--json PATH] [--plot PATH]

Cases (issue 11): (batch, seqlen) in (16, 4096), (64, 8192), (1, 131072), at GQA 32/8 and MHA
12/12 (``--heads``: other q / KV head counts), head dim 128, page size 16 with pages in random
order, q_len 1, fp16 queries (``--dtype bf16``: bf16 queries and a bf16 source cache; "fp16"
below then reads "bf16"). Pages are
token-major (NHD: ``[pages, page, heads_k, d]`` storage) or, with ``--layout hnd``, head-major
(each page's rows of one KV head contiguous, TensorRT-LLM's layout and FlashInfer's "HND"): the
same logical tensors, every cache, scale and peer stored that way. One row per implementation:
- ``kvonce fp16 / fp8_e4m3 / int8 / int4``: ``PagedDecodePlan.run`` (plan made beforehand) over
  the cache in that format (``kvonce.quantize_kv`` of the same fp16 K/V; fp8 per KV head).
- ``kvonce fp8_e4m3+N / int8+N / int4+N`` (``--outliers N``): dense-and-sparse keys
  (``kvonce.KeyOutliers``): N channels per KV head (``calibrate_outlier_channels`` of the first
  pages' keys) in a side cache in q's dtype, the rest of each key quantized; append included.
- ``flashinfer fp16 / fp8``: ``BatchDecodeWithPagedKVCacheWrapper`` (NHD or HND, page 16,
  ``use_tensor_cores=True``), when ``import flashinfer`` works; fp8 with one scale per tensor
  (its API takes ``k_scale``/``v_scale`` floats; it multiplies the output by ``v_scale`` in a
  separate kernel, which its time includes).
Columns:
- ``graph_us``: the call captured in a CUDA graph (``do_bench_cudagraph`` median: kernels only);
  ``eager_us``: the eager call (``do_bench`` median, L2 flushed), host launch path included.
- ``GB/s``: bytes actually read per call (K/V data plus scales; GB = 1e9 B) over ``graph_us``.
- ``x_graph``, ``x_eager``: speedup over kvonce fp16 at the same shape.
- ``err_fp16``: ``||out - out_fp16|| / ||out_fp16||`` against kvonce's fp16-cache output (the
  format's error). ``err_ref``: against the float32 reference over the cache as stored (fp16, or
  dequantized to fp16 for a quantized format: the kernel's own error; CORRECTNESS is printed
  when it passes 2e-2). Correctness comes first: both are computed before any timing.
- ``app_graph_us``, ``app_eager_us``, ``app_ns_tok``: ``append_paged_kv`` of one new token per
  sequence into that cache (quantizing it: data and scales in one launch), graph and eager, and
  the graph time per appended token (ns).

Power. The lent H200 runs these decodes at its 700 W cap: under back-to-back calls its SM clock
falls from 1980 MHz to 1.4-1.85 GHz within a fraction of a second (nvidia-smi's clock event
reason "SW power cap", 2026-11-30, docs/notes.md). Memory-bound rows (fp16, fp8) keep their
time; int4, whose consumers nearly match the memory's pace, took 155.7 us a call at the start of
a run and 164-166 after 0.4-1.5 s (GQA 32/8 64 x 8192). So a row's time depends on what ran
before it. ``--sustain S``: before each timing, the call back to back for S seconds (the
sustained serving state); ``--settle S``: the GPU idle S seconds first (each timing from rest).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time

import torch

from . import report

SHAPES = ((16, 4096), (64, 8192), (1, 131072))
HEADS = ((32, 8, "GQA 32/8"), (12, 12, "MHA 12/12"))
HEAD_DIM = 128
PAGE = 16
FORMATS = (None, "fp8_e4m3", "int8", "int4")  # None: the fp16 cache
REF_TOL = 2e-2  # err_ref above this: a kernel bug, not format error
QUERY_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    seqlen: int
    nheads: int
    nheads_k: int
    label: str

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen


def bytes_read(case: Case, fmt: str | None, *, per_tensor_scale: bool = False,
               outliers: int = 0, int4_pair_bytes: int = 4, int8_scale_bytes: int = 2) -> int:
    """K/V bytes a decode call reads: data plus scales (both caches). fp16 2 B a value, fp8/int8
    1 B, int4 half a byte; scales: int8 one per (token, KV head) (``int8_scale_bytes``: 2 fp16,
    quantize_kv's default; 4 float32), int4 one (scale, offset) pair per (token, KV head)
    (``int4_pair_bytes``: 4 fp16, quantize_kv's default; 8 float32), fp8 one float32 per KV
    head (or per tensor); ``outliers`` 16-bit values per (token, KV head) in the side cache."""
    values = case.tokens * case.nheads_k * HEAD_DIM
    if fmt is None:
        data, scales = 2 * values, 0
    elif fmt == "fp8_e4m3":
        data, scales = values, 4 * (1 if per_tensor_scale else case.nheads_k)
    elif fmt == "int8":
        data, scales = values, int8_scale_bytes * case.tokens * case.nheads_k
    elif fmt == "int4":
        data, scales = values // 2, int4_pair_bytes * case.tokens * case.nheads_k
    else:
        raise ValueError(f"unknown format {fmt!r}")
    return 2 * (data + scales) + 2 * outliers * case.tokens * case.nheads_k


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"16x4096,64x8192"`` -> ``[(16, 4096), (64, 8192)]`` ('' = every declared shape)."""
    if not text:
        return list(SHAPES)
    shapes = []
    for item in text.split(","):
        try:
            batch, seqlen = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: expected BATCHxSEQLEN items, got {item!r}") from None
        if batch < 1 or seqlen < PAGE or seqlen % PAGE:
            raise SystemExit(f"--shapes: {item!r}: batch >= 1 and seqlen a multiple of {PAGE}")
        shapes.append((batch, seqlen))
    return shapes


def parse_heads(text: str) -> list[tuple[int, int, str]]:
    """``"32/8,12/2"`` -> ``[(32, 8, "GQA 32/8"), (12, 2, "GQA 12/2")]`` (q heads / KV heads;
    '' = the declared ``HEADS``)."""
    if not text:
        return list(HEADS)
    heads = []
    for item in text.split(","):
        try:
            nheads, nheads_k = (int(x) for x in item.split("/"))
        except ValueError:
            raise SystemExit(f"--heads: expected HQ/HK items, got {item!r}") from None
        if nheads_k < 1 or nheads < nheads_k or nheads % nheads_k:
            raise SystemExit(f"--heads: {item!r}: q heads a positive multiple of KV heads")
        kind = "MHA" if nheads == nheads_k else "GQA"
        heads.append((nheads, nheads_k, f"{kind} {nheads}/{nheads_k}"))
    return heads


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def stored(t, layout: str):
    """A page-indexed tensor ``[pages, page, heads_k, ...]`` in ``layout``'s storage: as it is
    ("nhd", token-major) or head-major ("hnd": the same logical tensor, dims 1 and 2 swapped in
    memory). Per-head scales (fewer than 3 dims) are returned as they are."""
    if layout == "nhd" or t.dim() < 3:
        return t
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def make_inputs(case: Case, seed: int = 0, dtype: torch.dtype = torch.float16,
                layout: str = "nhd"):
    """K/V caches in random page order (stored per ``layout``), the block table, lengths and
    queries, all in ``dtype``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per_seq = case.seqlen // PAGE
    num_pages = case.batch * pages_per_seq
    shape = (num_pages, PAGE, case.nheads_k, HEAD_DIM)
    k = stored(torch.randn(shape, generator=g, device="cuda", dtype=dtype), layout)
    v = stored(torch.randn(shape, generator=g, device="cuda", dtype=dtype), layout)
    perm = torch.randperm(num_pages, generator=g, device="cuda").to(torch.int32)
    table = perm.view(case.batch, pages_per_seq).contiguous()
    seqlens = torch.full((case.batch,), case.seqlen, dtype=torch.int32, device="cuda")
    q = torch.randn((case.batch, 1, case.nheads, HEAD_DIM), generator=g, device="cuda",
                    dtype=dtype)
    return q, k, v, seqlens, table


def in_power_state(timer, sustain_s: float = 0.0, settle_s: float = 0.0):
    """``timer`` (a function of the call) preceded by ``settle_s`` seconds of GPU idle, then
    ``sustain_s`` seconds of the call back to back (the power state: the module's docstring)."""
    def timed(fn):
        if settle_s:
            torch.cuda.synchronize()
            time.sleep(settle_s)
        end = time.perf_counter() + sustain_s
        while time.perf_counter() < end:
            fn()
        return timer(fn)
    return timed


def _timers(rep: int, sustain_s: float = 0.0, settle_s: float = 0.0):
    """The eager and graph timers (us), each ``in_power_state``."""
    import triton.testing

    def eager(fn):
        return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")

    def graph(fn):
        return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")

    return (in_power_state(eager, sustain_s, settle_s),
            in_power_state(graph, sustain_s, settle_s))


def _timed(row: dict, prefix: str, fn, eager, graph) -> None:
    """``row[prefix + "graph_us"]`` and ``row[prefix + "eager_us"]``; a failing capture or call is
    printed and left as '-' (the rest of the run goes on)."""
    for kind, timer in (("graph", graph), ("eager", eager)):
        try:
            row[f"{prefix}{kind}_us"] = timer(fn)
        except Exception as exc:  # reported, not hidden
            print(f"  {row['impl']} {prefix}{kind}: {type(exc).__name__}: {exc}"[:300],
                  flush=True)
            row[f"{prefix}{kind}_us"] = "-"


def kvonce_rows(case: Case, q, k, v, seqlens, table, eager, graph, layout: str = "nhd",
                outliers: int = 0) -> tuple[list[dict], torch.Tensor]:
    """kvonce's four cache formats (errors first, then decode and append times), with
    ``outliers`` the quantized ones again as dense-and-sparse keys, and the fp16 cache's output
    (the base of every ``err_fp16``)."""
    import kvonce
    from ..reference import paged_attention_ref

    rows = []
    # Appends write the last slot of every sequence (its page exists); the fp16 cache is the
    # other formats' source, so its slots are restored after timing.
    append_at = seqlens - 1
    pos = append_at.long()
    last_page = table.long()[torch.arange(case.batch, device=q.device), pos // PAGE]
    last_slot = pos % PAGE
    saved = (k[last_page, last_slot].clone(), v[last_page, last_slot].clone())
    k_new = torch.randn(case.batch, 1, case.nheads_k, HEAD_DIM, device=q.device,
                        dtype=q.dtype)
    v_new = torch.randn_like(k_new)
    base_out = None
    variants = [(fmt, 0) for fmt in FORMATS]
    if outliers:
        variants += [(fmt, outliers) for fmt in FORMATS if fmt is not None]
    for fmt, n_out in variants:
        name = fmt or _dtype_name(q.dtype)
        row = {"impl": f"kvonce {name}" + (f"+{n_out}" if n_out else ""), "fmt": fmt}
        ko, keys = None, k
        if n_out:  # channels from the first 2048 keys; the side cache in q's dtype
            channels = kvonce.calibrate_outlier_channels(k.reshape(-1, *k.shape[2:])[:2048],
                                                         n=n_out)
            ko = kvonce.new_key_outliers(channels, k.shape[0], PAGE)  # fp16 values
            keys, sparse = ko.split(k)
            ko = kvonce.KeyOutliers(channels, stored(sparse, layout))
        if fmt is None:
            kc, vc, ks, vs = k, v, None, None
        else:
            kc, ks = (stored(t, layout) for t in kvonce.quantize_kv(keys, fmt))
            vc, vs = (stored(t, layout) for t in kvonce.quantize_kv(v, fmt))
        kv_format = "int4" if fmt == "int4" else None
        plan = kvonce.PagedDecodePlan(q, kc, vc, seqlens, table, k_scale=ks, v_scale=vs,
                                      kv_format=kv_format)
        if fmt is None:
            run = lambda: plan.run(q, kc, vc, seqlens, table)
        else:
            run = lambda: plan.run(q, kc, vc, seqlens, table, k_scale=ks, v_scale=vs,
                                   key_outliers=ko)
        out = run()
        if fmt is None:
            base_out = out
            kd, vd = k, v
        else:
            kd = kvonce.dequantize_kv(kc, ks, fmt, q.dtype)
            if ko is not None:
                kd = ko.merge(kd, ko.values)
            vd = kvonce.dequantize_kv(vc, vs, fmt, q.dtype)
        ref, _ = paged_attention_ref(q, kd, vd, seqlens, table)
        del kd, vd
        row["err_fp16"] = rel_err(out, base_out)
        row["err_ref"] = rel_err(out, ref)
        row["bytes"] = bytes_read(case, fmt, outliers=n_out)
        _timed(row, "", run, eager, graph)
        append = lambda: kvonce.append_paged_kv(k_new, v_new, kc, vc, append_at, table,
                                                k_scale=ks, v_scale=vs, kv_format=kv_format,
                                                key_outliers=ko)
        _timed(row, "app_", append, eager, graph)
        if fmt is None:
            k[last_page, last_slot], v[last_page, last_slot] = saved
        rows.append(row)
        del plan, run, append, out
        if fmt is not None:
            del kc, vc, ks, vs
        torch.cuda.empty_cache()
    return rows, base_out


def flashinfer_rows(case: Case, q, k, v, seqlens, table, base_out, eager, graph,
                    layout: str = "nhd") -> list[dict]:
    """FlashInfer's fp16 and fp8 paged decode on the same pages (tensor-core path); [] if absent."""
    try:
        import flashinfer
    except Exception as exc:  # absent or broken: reported as absent
        print(f"  flashinfer unavailable: {type(exc).__name__}: {exc}"[:200], flush=True)
        return []
    import kvonce

    batch, pages = table.shape
    indptr = torch.arange(0, batch + 1, device=q.device, dtype=torch.int32) * pages
    indices = table.reshape(-1)
    last = torch.full((batch,), PAGE, dtype=torch.int32, device=q.device)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=q.device)
    q3 = q[:, 0].contiguous()
    rows = []
    for fmt in (None, "fp8_e4m3"):
        row = {"impl": f"flashinfer {'fp8' if fmt else _dtype_name(q.dtype)}", "fmt": fmt}
        try:
            if fmt is None:
                kc, vc, scales = k, v, {}
            else:  # FlashInfer takes one float scale per tensor
                k_amax = k.abs().amax().float()
                v_amax = v.abs().amax().float()
                kc, ks = kvonce.quantize_kv(k, fmt, scale=(k_amax / 448.0).reshape(()))
                vc, vs = kvonce.quantize_kv(v, fmt, scale=(v_amax / 448.0).reshape(()))
                kc, vc = stored(kc, layout), stored(vc, layout)
                scales = {"k_scale": float(ks), "v_scale": float(vs)}  # sync-ok: setup
            if layout == "hnd":  # FlashInfer takes HND pages as [pages, heads_k, page, d]
                kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, layout.upper(),
                                                                    use_tensor_cores=True)
            wrapper.plan(indptr, indices, last, case.nheads, case.nheads_k, HEAD_DIM, PAGE,
                         q_data_type=q.dtype, kv_data_type=kc.dtype)
            run = lambda: wrapper.run(q3, (kc, vc), **scales)
            out = run()[:, None]
            row["err_fp16"] = rel_err(out, base_out)
            row["err_ref"] = "-"
            row["bytes"] = bytes_read(case, fmt, per_tensor_scale=True)
        except Exception as exc:  # one failing peer does not stop the run
            print(f"  {row['impl']} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
            continue
        _timed(row, "", run, eager, graph)
        row["app_graph_us"] = row["app_eager_us"] = "-"
        rows.append(row)
        del run, wrapper
        torch.cuda.empty_cache()
    return rows


def summarize(case: Case, rows: list[dict]) -> list[dict]:
    """Table rows for one case from measured ones (``graph_us``, ``eager_us``, ``bytes``, errors,
    append times): GB/s, speedups over kvonce fp16 and ns per appended token; '-' where a
    measurement is missing."""
    num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
    base = next((r for r in rows if r["impl"].startswith("kvonce") and r["fmt"] is None), {})
    out = []
    for r in rows:
        g, e = r.get("graph_us", "-"), r.get("eager_us", "-")
        ratio = lambda a, b: round(a / b, 2) if num(a) and num(b) and b > 0 else "-"
        app_g = r.get("app_graph_us", "-")
        out.append({
            "heads": case.label, "batch x len": f"{case.batch} x {case.seqlen}",
            "impl": r["impl"],
            "graph_us": round(g, 1) if num(g) else "-",
            "eager_us": round(e, 1) if num(e) else "-",
            "GB/s": round(r["bytes"] / g / 1e3) if num(g) and g > 0 else "-",
            "x_graph": ratio(base.get("graph_us"), g),
            "x_eager": ratio(base.get("eager_us"), e),
            "err_fp16": f"{r['err_fp16']:.1e}" if num(r.get("err_fp16")) else "-",
            "err_ref": f"{r['err_ref']:.1e}" if num(r.get("err_ref")) else "-",
            "app_graph_us": round(app_g, 1) if num(app_g) else "-",
            "app_eager_us": round(r["app_eager_us"], 1) if num(r.get("app_eager_us")) else "-",
            "app_ns_tok": round(1e3 * app_g / case.batch, 1) if num(app_g) else "-",
        })
    return out


def correctness_failures(rows: list[dict]) -> list[str]:
    """kvonce rows whose output is further than REF_TOL from the reference over the cache as
    stored (a kernel error: format error is ``err_fp16``)."""
    return [f"{r['heads']} {r['batch x len']} {r['impl']}: err_ref {r['err_ref']}"
            for r in rows if r["err_ref"] != "-" and float(r["err_ref"]) > REF_TOL]


def _dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, d in QUERY_DTYPES.items() if d == dtype)


def run_case(case: Case, *, peers: bool, rep: int, dtype: torch.dtype = torch.float16,
             layout: str = "nhd", outliers: int = 0, sustain_s: float = 0.0,
             settle_s: float = 0.0) -> list[dict]:
    eager, graph = _timers(rep, sustain_s, settle_s)
    q, k, v, seqlens, table = make_inputs(case, dtype=dtype, layout=layout)
    measured, base_out = kvonce_rows(case, q, k, v, seqlens, table, eager, graph, layout,
                                     outliers)
    if peers:
        measured += flashinfer_rows(case, q, k, v, seqlens, table, base_out, eager, graph,
                                    layout)
    del q, k, v, base_out
    torch.cuda.empty_cache()
    return summarize(case, measured)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m kvonce bench quant")
    p.add_argument("--shapes", default="", help="only these BATCHxSEQLEN, comma-separated")
    p.add_argument("--heads", default="",
                   help="these HQ/HK head counts, comma-separated (default: 32/8 and 12/12)")
    p.add_argument("--no-peers", action="store_true", help="skip FlashInfer")
    p.add_argument("--rep", type=int, default=100, help="do_bench time per measurement (ms)")
    p.add_argument("--sustain", type=float, default=0.0,
                   help="seconds of back-to-back calls before each timing (power state)")
    p.add_argument("--settle", type=float, default=0.0,
                   help="seconds of GPU idle before each timing")
    p.add_argument("--dtype", default="fp16", choices=tuple(QUERY_DTYPES),
                   help="queries and the source cache")
    p.add_argument("--layout", default="nhd", choices=("nhd", "hnd"),
                   help="page storage: token-major (nhd) or head-major (hnd)")
    p.add_argument("--outliers", type=int, default=0,
                   help="also each quantized format with N outlier channels (KeyOutliers)")
    p.add_argument("--md", default="docs/benchmarks.md", help="append the table here ('' = no)")
    p.add_argument("--json", default="", help="also dump the rows as JSON here")
    p.add_argument("--plot", default="docs/bench_quant.png", help="PNG plot path ('' = no)")
    args = p.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    heads = parse_heads(args.heads)
    if not torch.cuda.is_available():
        raise SystemExit("bench quant needs a CUDA GPU")
    print(report.environment(), flush=True)
    rows = []
    for nheads, nheads_k, label in heads:
        for batch, seqlen in shapes:
            case = Case(batch, seqlen, nheads, nheads_k, label)
            case_rows = run_case(case, peers=not args.no_peers, rep=args.rep,
                                 dtype=QUERY_DTYPES[args.dtype], layout=args.layout,
                                 outliers=args.outliers, sustain_s=args.sustain,
                                 settle_s=args.settle)
            print(report.format_rows(case_rows), flush=True)
            rows += case_rows
    bad = correctness_failures(rows)
    if bad:
        print(f"CORRECTNESS: {len(bad)} rows over {REF_TOL} relative error vs the reference:\n  "
              + "\n  ".join(bad), flush=True)
    print(report.format_rows(rows, fmt="github"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    command = ("python -m kvonce bench quant " + " ".join(argv)).strip()
    if args.md:
        report.append_markdown(args.md, "Quantized paged decode and append", rows,
                               command=command,
                               dtype=f"{args.dtype} queries, {args.layout.upper()} pages",
                               date=datetime.date.today().isoformat())
    if args.plot:
        plot_rows = [dict(r, case=f"{r['heads']} {r['batch x len']} {r['impl']}") for r in rows
                     if isinstance(r["x_graph"], float)]
        if plot_rows:
            report.bar_plot(args.plot, plot_rows, "case", ["x_graph"],
                            "speedup over kvonce fp16 (CUDA graph)")


if __name__ == "__main__":
    main(sys.argv[1:])
