"""One paged-decode plan run three times, for a profiler (ncu skips the first run):

    ncu -k regex:"paged_decode_kernel|combine_splits" --launch-skip 2 --launch-count 2 \
        --metrics ... python scripts/decode_ncu_case.py FORMAT HQ HK BATCH LEN [nhd|hnd]

``DECODE_CASE_SET=field=value[,field=value]`` runs the plan's launch (its split count) with
those config fields changed (``config_ab.py``'s ``--set``); ``DECODE_CASE_KNOB=MODULE:ATTR=LITERAL[
& ...]`` sets module attributes first (``config_ab.py``'s ``--knob``); ``DECODE_CASE_SPLITS=N``
forces the split count (0 or unset: the plan's). FORMAT is plain, fp8_e4m3, int8 or
int4; d128, page 16, random page order, fp16 q; pages (and
per-token scales) token-major, or head-major with ``hnd``. FORMAT ``sdpa`` runs PyTorch's dense
SDPA (``enable_gqa``) on the plain case's keys gathered to ``[batch, heads_k, len, d]``.
"""
import dataclasses
import os
import sys

import torch

import kvonce
from kvonce.bench.quant import stored


def paged_case(hq: int, hk: int, batch: int, length: int, fmt: str = "plain",
               dtype: torch.dtype = torch.float16, page: int = 16):
    """``q, k, v, table, seqlens, scales``: ``dtype`` q (and source cache), d128, ``page``-key
    pages in random order, seed 0; K/V in ``fmt`` ("plain" or a ``quantize_kv`` format),
    ``scales`` the run's keywords."""
    torch.manual_seed(0)
    pages = batch * length // page
    q = torch.randn(batch, 1, hq, 128, device="cuda", dtype=dtype)
    k = torch.randn(pages, page, hk, 128, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    table = torch.randperm(pages, device="cuda").reshape(batch, -1).to(torch.int32)
    seqlens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    kw = {}
    if fmt != "plain":
        k, ks = kvonce.quantize_kv(k, fmt)
        v, vs = kvonce.quantize_kv(v, fmt)
        kw = dict(k_scale=ks, v_scale=vs)
    return q, k, v, table, seqlens, kw


def parse_case(case: str) -> tuple[str, int, int, int, int]:
    """``FORMAT:HQ/HK:BATCHxLEN`` (an item of the A/B scripts' ``--cases``) as ``(fmt, hq, hk,
    batch, length)``."""
    fmt, heads, shape = case.split(":")
    hq, hk = (int(x) for x in heads.split("/"))
    batch, length = (int(x) for x in shape.split("x"))
    return fmt, hq, hk, batch, length


def parse_set(text: str, base) -> dict:
    """``field=value[,field=value]`` as changes to config ``base`` (ints, floats, 0/1 for
    booleans), for ``dataclasses.replace``."""
    fields = {f.name for f in dataclasses.fields(base)}
    changes = {}
    for item in text.split(","):
        name, value = item.split("=")
        assert name in fields, name
        kind = type(getattr(base, name))
        changes[name] = bool(int(value)) if kind is bool else kind(value)
    return changes


def graph_us(fn) -> float:
    """``fn``'s CUDA-graph time in us: ``do_bench_cudagraph``'s median over 100 ms."""
    import triton.testing

    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def main(fmt: str, hq: int, hk: int, batch: int, length: int, layout: str = "nhd") -> None:
    if fmt == "sdpa":
        q, k, v, table, seqlens, kw = paged_case(hq, hk, batch, length)
        dense = [x[table.long()].reshape(batch, length, hk, 128).transpose(1, 2).contiguous()
                 for x in (k, v)]
        for _ in range(3):
            torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), *dense,
                                                             enable_gqa=True)
        torch.cuda.synchronize()
        return
    if os.environ.get("DECODE_CASE_KNOB"):
        from config_ab import parse_knobs

        for mod, attr, value in parse_knobs(os.environ["DECODE_CASE_KNOB"]):
            setattr(mod, attr, value)
    q, k, v, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt)
    k, v = stored(k, layout), stored(v, layout)
    kw = {name: stored(t, layout) for name, t in kw.items()}
    plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table, **kw,
                                  kv_format="int4" if fmt == "int4" else None,
                                  num_splits=int(os.environ.get("DECODE_CASE_SPLITS") or 0))
    if os.environ.get("DECODE_CASE_SET"):  # the plan's launch with config fields changed
        plan = kvonce.PagedDecodePlan(
            q, k, v, seqlens, table, **kw, kv_format="int4" if fmt == "int4" else None,
            num_splits=plan.num_splits, config=dataclasses.replace(
                plan.config, **parse_set(os.environ["DECODE_CASE_SET"], plan.config)))
    for _ in range(3):
        plan.run(q, k, v, seqlens, table, **kw)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1], *(int(x) for x in sys.argv[2:6]), *sys.argv[6:7])
