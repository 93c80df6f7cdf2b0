"""Benchmark: varlen paged prefill, chunked prefill and mixed batches (CUDA only).

    python -m kvonce bench prefill [--md docs/benchmarks.md] [--plot PATH] [--json PATH]
                                   [--rows prefill,chunked,mixed,decode] [--pages 16,256]
                                   [--quick] [--no-peers] [--fi-backend auto|fa2|fa3]

bf16, 32 q / 8 KV heads (Llama-3-8B), head dim 128, causal (bottom-right), page sizes 16 and 256
with pages in random order (bench/decode.py's layout). Rows (``--rows`` names them):
- ``prefill``: "prefill 8x2048", 8 prompts of 2048 new tokens, no history (cache_seqlens 2048)
- ``chunked``: "chunked 64x512/8k", 64 chunks of 512 tokens at the end of 8192-token sequences
  (cache_seqlens 8192, the chunk included: 7680 tokens of history)
- ``mixed``: "mixed 256 dec + 2x2048", 256 decode rows (q_len 1, 2048 cached tokens each, the new
  one included) first, then 2 prompts of 2048 new tokens with no history, in one call
- ``decode``: "decode-only 64x8192", 64 decode rows over 8192 cached tokens each: the varlen
  kernel against ``PagedDecodePlan.run`` (q ``[64, 1, 32, 128]``) on the same cache
``--quick``: page size 16, rows prefill, mixed, decode. Columns (``_ms``: a ``do_bench`` median,
L2 flushed, or a ``do_bench_cudagraph`` median; ``_TF``: the TFLOP/s of that time):
- ``kv``: ``PagedPrefillPlan.run`` (plan made beforehand); ``kv_graph``: that call captured in a
  CUDA graph (``do_bench_cudagraph``: the kernels without the Python launch path)
- ``dec``, ``dec_graph``: ``PagedDecodePlan.run`` (split-K auto), decode-only rows only
- ``fa2``, ``fa2_graph``: PyTorch's FA2 varlen forward (``aten._flash_attention_forward``) on K/V
  gathered into contiguous ``[total_k, 8, 128]`` beforehand (the same math without page lookups;
  GQA native, causal bottom-right); page size does not apply to it (timed again in each row)
- ``fi``, ``fi_graph``: FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` (NHD, ``plan``
  beforehand, ``run(q, (k_cache, v_cache))``), when ``import flashinfer`` works; ``--fi-backend``
  picks its backend (``auto``: fa3 on Hopper)
A peer that fails (import, plan, launch, capture) prints its exception and gets ``-``.
FLOPs (column ``GFLOP``): ``4 * 128 * 32 * pairs``, pairs the (query row, key) pairs the
bottom-right causal mask leaves visible (kvonce.flops); 1 TFLOP/s = 1e12 FLOP/s. Floors:
``ms@500TF`` the FLOPs at 500 TFLOP/s (2/3 of the H100's measured bf16 matmul ceiling, 744
TFLOP/s, docs/benchmarks.md); ``ms@bw`` the K/V bytes (``2 * sum(cache_seqlens) * 8 * 128 * 2
B``) read once at the read bandwidth measured in the same run (a large fp16 sum, as in bench
decode). Correctness comes first: kvonce's output is compared
with FA2's, FlashInfer's and (decode-only) the decode plan's: ``err_*`` are relative error norms
``|a - b| / |b|``; over 1e-2 prints a CORRECTNESS line.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import itertools
import json
import shlex
import sys
from typing import Callable, NamedTuple

import torch

from ..flops import attention_flops, visible_pairs
from ..paged.decode import PagedDecodePlan
from ..paged.prefill import PagedPrefillPlan
from . import report
from .decode import read_bandwidth, rel_err

NHEADS, NHEADS_K, HEAD_DIM = 32, 8, 128
PAGES = (16, 256)
FLOP_FLOOR = 500e12  # FLOP/s of the ms@500TF column
ERR_LIMIT = 1e-2     # bf16 outputs of two implementations
WORKSPACE_BYTES = 256 << 20  # FlashInfer's float workspace (it recommends 128 MB)


@dataclasses.dataclass(frozen=True)
class Case:
    label: str
    groups: tuple[tuple[int, int, int], ...]  # (sequences, q_len, cache_seqlen), in batch order

    @property
    def q_lens(self) -> list[int]:
        return [q for n, q, _ in self.groups for _ in range(n)]

    @property
    def k_lens(self) -> list[int]:
        return [k for n, _, k in self.groups for _ in range(n)]

    def flops(self, nheads: int = NHEADS, head_dim: int = HEAD_DIM) -> int:
        pairs = visible_pairs(torch.tensor(self.q_lens), torch.tensor(self.k_lens), True).sum()
        return attention_flops(nheads, head_dim, int(pairs))

    def kv_bytes(self, nheads_k: int = NHEADS_K, head_dim: int = HEAD_DIM) -> int:
        return 2 * sum(self.k_lens) * nheads_k * head_dim * 2


CASES = {
    "prefill": Case("prefill 8x2048", ((8, 2048, 2048),)),
    "chunked": Case("chunked 64x512/8k", ((64, 512, 8192),)),
    "mixed": Case("mixed 256 dec + 2x2048", ((256, 1, 2048), (2, 2048, 2048))),
    "decode": Case("decode-only 64x8192", ((64, 1, 8192),)),
}
QUICK_ROWS = ("prefill", "mixed", "decode")


class Inputs(NamedTuple):
    q: torch.Tensor              # [total_q, nheads, d]
    k_cache: torch.Tensor        # [num_pages, page_size, nheads_k, d]
    v_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor   # int32 [batch + 1]
    cache_seqlens: torch.Tensor  # int32 [batch]
    block_table: torch.Tensor    # int32 [batch, max_pages], unused entries 0
    pages: list[int]             # pages of each sequence


def make_inputs(case: Case, page_size: int, *, dtype=torch.bfloat16, device="cuda",
                nheads: int = NHEADS, nheads_k: int = NHEADS_K, head_dim: int = HEAD_DIM,
                seed: int = 0) -> Inputs:
    """Every sequence's pages taken from one random permutation of the cache's pages."""
    q_lens, k_lens = case.q_lens, case.k_lens
    pages = [-(-n // page_size) for n in k_lens]
    perm = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(seed))
    table = torch.zeros((len(pages), max(pages)), dtype=torch.int32)
    for b, (start, n) in enumerate(zip(itertools.accumulate([0] + pages), pages)):
        table[b, :n] = perm[start:start + n]
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (sum(pages), page_size, nheads_k, head_dim)
    k_cache = torch.randn(shape, generator=g, device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=g, device=device, dtype=dtype)
    q = torch.randn((sum(q_lens), nheads, head_dim), generator=g, device=device, dtype=dtype)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    seqlens = torch.tensor(k_lens, dtype=torch.int32, device=device)
    return Inputs(q, k_cache, v_cache, cu, seqlens, table.to(device), pages)


def dense_kv(inp: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K, V gathered into contiguous ``[total_k, nheads_k, d]`` (sequence after sequence) and
    int32 ``cu_seqlens_k [batch + 1]``: FA2's varlen layout of the same keys."""
    page_size, dev = inp.k_cache.shape[1], inp.k_cache.device
    lens = inp.cache_seqlens.long()
    cu_k = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=dev)
    cu_k[1:] = lens.cumsum(0)
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens)
    pos = torch.arange(seq.numel(), device=dev) - cu_k[seq].long()
    slot = inp.block_table[seq, pos // page_size].long() * page_size + pos % page_size
    flat = lambda c: c.reshape(-1, *c.shape[2:])[slot]  # noqa: E731
    return flat(inp.k_cache), flat(inp.v_cache), cu_k


def flashinfer_pages(inp: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's page metadata, int32: ``paged_kv_indptr [batch + 1]``, ``paged_kv_indices``
    (each sequence's pages in order), ``paged_kv_last_page_len [batch]`` (1..page_size)."""
    page_size, dev = inp.k_cache.shape[1], inp.k_cache.device
    pages = torch.tensor(inp.pages, dtype=torch.int32, device=dev)
    indptr = torch.zeros(pages.numel() + 1, dtype=torch.int32, device=dev)
    indptr[1:] = pages.cumsum(0)
    used = torch.arange(inp.block_table.shape[1], device=dev)[None, :] < pages[:, None]
    last = inp.cache_seqlens - (pages - 1) * page_size
    return indptr, inp.block_table[used].contiguous(), last.to(torch.int32)


def _peer(name: str, build: Callable[[], Callable]) -> tuple[Callable | None, object]:
    """``build()``'s runner and the output of its first call (which compiles and surfaces launch
    errors), or ``(None, None)`` with the exception printed: one broken peer never stops the run.
    """
    try:
        fn = build()
        out = fn()
        torch.cuda.synchronize()
        return fn, out
    except Exception as exc:  # reported as '-', not hidden
        print(f"{name} unavailable: {type(exc).__name__}: {exc}"[:400], flush=True)
        return None, None


def _fa2(inp: Inputs, case: Case) -> Callable:
    k, v, cu_k = dense_kv(inp)
    max_q, max_k, scale = max(case.q_lens), max(case.k_lens), HEAD_DIM ** -0.5
    # aten::_flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
    #   dropout_p, is_causal, return_debug_mask, *, scale=None, ...) -> (output, logsumexp, ...)
    op = torch.ops.aten._flash_attention_forward
    return lambda: op(inp.q, k, v, inp.cu_seqlens_q, cu_k, max_q, max_k, 0.0, True, False,
                      scale=scale)[0]


def _flashinfer(inp: Inputs, backend: str) -> Callable:
    import flashinfer

    indptr, indices, last = flashinfer_pages(inp)
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
    wrapper.plan(inp.cu_seqlens_q, indptr, indices, last, NHEADS, NHEADS_K, HEAD_DIM,
                 inp.k_cache.shape[1], causal=True, q_data_type=inp.q.dtype,
                 kv_data_type=inp.k_cache.dtype)
    return lambda: wrapper.run(inp.q, (inp.k_cache, inp.v_cache))


def _time(name: str, fn: Callable, graph: bool) -> float | None:
    import triton.testing

    try:
        if graph:
            return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    except Exception as exc:  # e.g. capture refused: reported, not hidden
        print(f"{name}{' graph' if graph else ''} failed: {type(exc).__name__}: {exc}"[:400],
              flush=True)
        return None


def run_case(case: Case, page_size: int, bw: float, *, peers: bool, fi_backend: str) -> dict:
    inp = make_inputs(case, page_size)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.cu_seqlens_q, inp.cache_seqlens,
            inp.block_table)
    # Validation mode once (reads the values on the host): the inputs are what the row claims.
    plan = PagedPrefillPlan(*args, max_seqlen_q=max(case.q_lens), check_block_table=True)
    runners = {"kv": lambda: plan.run(*args)}
    out = runners["kv"]()
    outs = {}  # the first output of each other runner, compared with kvonce's before timing
    if max(case.q_lens) == 1:  # decode-only: the decode plan on the same cache and queries
        q4 = inp.q.view(len(case.q_lens), 1, NHEADS, HEAD_DIM)
        dargs = (q4, inp.k_cache, inp.v_cache, inp.cache_seqlens, inp.block_table)
        dplan = PagedDecodePlan(*dargs)
        decode = lambda: dplan.run(*dargs)  # noqa: E731
        runners["dec"], outs["dec"] = _peer("PagedDecodePlan.run", lambda: decode)
    if peers:
        runners["fa2"], outs["fa2"] = _peer("FA2 (aten._flash_attention_forward)",
                                            lambda: _fa2(inp, case))
        runners["fi"], outs["fi"] = _peer("FlashInfer BatchPrefillWithPagedKVCacheWrapper",
                                          lambda: _flashinfer(inp, fi_backend))
    errs = {name: rel_err(out, theirs.reshape(out.shape)) for name, theirs in outs.items()
            if theirs is not None}
    flops, kv_bytes = case.flops(), case.kv_bytes()
    row = {"row": case.label, "page": page_size, "GFLOP": round(flops / 1e9, 1),
           "ms@500TF": round(flops / FLOP_FLOOR * 1e3, 4), "ms@bw": round(kv_bytes / bw * 1e3, 4)}
    for name in ("kv", "dec", "fa2", "fi"):
        for graph in (False, True):
            col = name + ("_graph" if graph else "")
            fn = runners.get(name)
            ms = None if fn is None else _time(col, fn, graph)
            row[f"{col}_ms"] = "-" if ms is None else round(ms, 4)
            if name != "dec":
                row[f"{col}_TF"] = "-" if ms is None else round(flops / (ms * 1e-3) / 1e12, 1)
    for name in ("fa2", "fi", "dec"):
        row[f"err_{name}"] = f"{errs[name]:.1e}" if name in errs else "-"
    return row


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m kvonce bench prefill",
                                description="varlen paged prefill vs FA2 and FlashInfer")
    p.add_argument("--md", default="docs/benchmarks.md", help="append the table here ('' = no)")
    p.add_argument("--plot", default="docs/bench_prefill.png", help="PNG plot path ('' = no)")
    p.add_argument("--json", default="", help="also dump the rows as JSON here")
    p.add_argument("--rows", default="", help=f"only these rows, comma-separated: "
                   f"{','.join(CASES)} (default all; --quick: {','.join(QUICK_ROWS)})")
    p.add_argument("--pages", default=",".join(map(str, PAGES)),
                   help="page sizes, comma-separated (--quick: 16)")
    p.add_argument("--quick", action="store_true", help="page size 16 and three rows only")
    p.add_argument("--no-peers", action="store_true", help="skip FA2 and FlashInfer")
    p.add_argument("--fi-backend", default="auto", choices=("auto", "fa2", "fa3"),
                   help="FlashInfer's backend (auto: fa3 on Hopper)")
    args = p.parse_args(argv)
    names = args.rows.split(",") if args.rows else list(QUICK_ROWS if args.quick else CASES)
    if any(n not in CASES for n in names):
        p.error(f"--rows: unknown row in {args.rows!r}; rows are {','.join(CASES)}")
    pages = (16,) if args.quick else tuple(int(x) for x in args.pages.split(","))
    if not torch.cuda.is_available():
        raise SystemExit("bench prefill needs a CUDA GPU")
    bw = read_bandwidth()
    print(f"{report.environment()}; measured read bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    with torch.no_grad():
        for name in names:
            for page_size in pages:
                rows.append(run_case(CASES[name], page_size, bw, peers=not args.no_peers,
                                     fi_backend=args.fi_backend))
                print(rows[-1], flush=True)
                gc.collect()  # the row's caches, dense copies, plans and graphs
                torch.cuda.empty_cache()
    bad = [r for r in rows for k in ("err_fa2", "err_fi", "err_dec")
           if r[k] != "-" and not float(r[k]) <= ERR_LIMIT]
    if bad:
        print(f"CORRECTNESS: {len(bad)} comparisons over {ERR_LIMIT} relative error", flush=True)
    print(report.format_rows(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.md:
        command = f"python -m kvonce bench prefill {shlex.join(argv)}".strip()
        report.append_markdown(args.md, f"Varlen paged prefill, {NHEADS}/{NHEADS_K} heads, "
                               f"d{HEAD_DIM} (read bw {bw / 1e12:.2f} TB/s)", rows,
                               command=command, dtype="bf16",
                               date=datetime.date.today().isoformat())
    if args.plot:
        cols = [c for c in ("kv_TF", "kv_graph_TF", "fa2_TF", "fi_TF")
                if all(isinstance(r[c], float) for r in rows)]
        plot_rows = [dict(r, case=f"{r['row']} p{r['page']}") for r in rows]
        report.bar_plot(args.plot, plot_rows, "case", cols, "TFLOP/s (visible pairs)")


if __name__ == "__main__":
    main(sys.argv[1:])
