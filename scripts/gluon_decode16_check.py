"""GPU check of the Gluon paged decode on 16-bit (fp16 / bf16) caches (``kvonce/kernels/
gluon_decode.py`` with a float16/bfloat16 descriptor: 64-key tiles, no scales): correctness
against ``kvonce.reference.paged_attention_ref``, then its speed against the Triton plan and
dense SDPA at the decode rows. Hopper only (TMA, sm_90a); a prototype, not wired.

    PYTHONPATH=src python scripts/gluon_decode16_check.py [--skip-correctness] [--skip-bench]
        [--shapes 12/2:64x1024:1/2,...] [--variants 2cta-3st,2cta-2st,1cta-4st]

(a) Correctness, fp16 and bf16, each variant: random page order, lengths off the tile and
page grid (1, 17, 100, 1000, 4097 keys and an empty sequence), pages 16 and 64, 1 and 3 splits,
GQA 12/2, 32/8 and MHA 4/4; the slots past each sequence's end in its last page hold NaN,
which must never reach the output; out within 2e-2 (fp16) / 4e-2 (bf16) abs of the float32
reference, LSE within 1e-2; an empty sequence gives out 0, LSE -inf.

(b) Speed (fp16, page 16, random page order, q_len 1): CUDA-graph medians
(``do_bench_cudagraph``) of the Triton plan (``PagedDecodePlan.run``), dense SDPA on the same
keys gathered to ``[batch, heads_k, len, d]`` (``enable_gqa``), and each Gluon variant (decode +
combine) at the plan's split count and the listed ones, with each variant's CTAs an SM from the
driver.
"""
from __future__ import annotations

import argparse
import sys
import traceback

import torch

sys.path.insert(0, "scripts")
from gluon_decode_check import graph_us, occupancy  # noqa: E402

VARIANTS = {
    "2cta-3st": dict(stages=3, ctas_per_sm=2),
    "2cta-2st": dict(stages=2, ctas_per_sm=2),
    "1cta-4st": dict(stages=4),
}
SHAPES = ("12/2:128x512,12/2:64x1024:1/2,12/2:8x8192:16/32,12/2:1x65536:128,"
          "12/12:128x512,12/12:64x1024:1/2,32/8:64x1024:1/2,32/8:8x8192")
FAILURES: list[str] = []


def make_case(seqlens, hq, hk, page, dtype, seed=0, q_len=1):
    """q, caches (random page order, NaN past each sequence's end in its pages), table."""
    g = torch.Generator().manual_seed(seed)
    pages_per = [max(1, -(-s // page)) for s in seqlens]
    width = max(pages_per)
    total = sum(pages_per) + 1
    k = torch.randn(total, page, hk, 128, generator=g).to(dtype)
    v = torch.randn(total, page, hk, 128, generator=g).to(dtype)
    perm = torch.randperm(total, generator=g)
    table = torch.full((len(seqlens), width), int(perm[-1]), dtype=torch.int32)
    at = 0
    for b, (s, n) in enumerate(zip(seqlens, pages_per)):
        ids = perm[at:at + n]
        at += n
        table[b, :n] = ids.to(torch.int32)
        last = int(ids[-1])
        used = s - (n - 1) * page
        if used < page:       # the slots past the end hold NaN
            k[last, used:] = float("nan")
            v[last, used:] = float("nan")
    q = torch.randn(len(seqlens), q_len, hq, 128, generator=g).to(dtype)
    dev = "cuda"
    return (q.to(dev), k.to(dev), v.to(dev), torch.tensor(seqlens, dtype=torch.int32,
                                                          device=dev), table.to(dev))


def launch(q, k, v, seqlens, table, splits, variant, causal=True):
    from kvonce.kernels.gluon_decode import GluonDecodeLaunch

    batch, q_len, nheads, d = q.shape
    o_part = torch.empty(batch, q_len, nheads, splits, d, dtype=torch.float32, device=q.device)
    l_part = torch.empty(batch, q_len, nheads, splits, dtype=torch.float32, device=q.device)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, nheads, q_len), float("nan"), dtype=torch.float32, device=q.device)
    return GluonDecodeLaunch(q, k, v, None, None, seqlens, table, o_part, l_part, out, lse,
                             softmax_scale=d ** -0.5, num_splits=splits, causal=causal,
                             **VARIANTS[variant])


def correctness(variants) -> None:
    from kvonce.reference import paged_attention_ref

    lens = [1, 17, 100, 1000, 4097, 0]
    for dtype, tol in ((torch.float16, 2e-2), (torch.bfloat16, 4e-2)):
        for hq, hk in ((12, 2), (32, 8), (4, 4)):
            for page in (16, 64):
                q, k, v, seqlens, table = make_case(lens, hq, hk, page, dtype)
                ref, ref_lse = paged_attention_ref(q, k, v, seqlens, table)   # lse [b, h, t]
                for variant in variants:
                    for splits in (1, 3):
                        lo = launch(q, k, v, seqlens, table, splits, variant)
                        out, lse = lo()
                        torch.cuda.synchronize()
                        err = (out.float() - ref).abs().max().item()
                        fin = torch.isfinite(ref_lse)
                        lerr = (lse[fin] - ref_lse[fin]).abs().max().item()
                        empty_ok = bool((out[-1] == 0).all()) and bool(
                            torch.isneginf(lse[-1]).all())
                        ok = (err < tol and lerr < 1e-2 and empty_ok
                              and bool(torch.isfinite(out).all()))
                        print(f"  {dtype} {hq}/{hk} page {page} {variant} splits {splits}: "
                              f"max |out - ref| {err:.2e}, lse {lerr:.2e}, empty seq "
                              f"{'ok' if empty_ok else 'WRONG'}{'' if ok else '  FAIL'}",
                              flush=True)
                        if not ok:
                            FAILURES.append(f"{dtype} {hq}/{hk} {page} {variant} {splits}")


def bench(shapes, variants) -> None:
    from kvonce.paged.decode import PagedDecodePlan
    from decode_ncu_case import paged_case

    rows = []
    for item in shapes.split(","):
        heads, shape, *extra = item.split(":")
        hq, hk = (int(x) for x in heads.split("/"))
        batch, length = (int(x) for x in shape.split("x"))
        sweep = [int(x) for x in extra[0].split("/")] if extra else []
        q, k, v, table, seqlens, _ = paged_case(hq, hk, batch, length)
        plan = PagedDecodePlan(q, k, v, seqlens, table)
        run = lambda: plan.run(q, k, v, seqlens, table)
        ref = run().clone()
        t_plan = graph_us(run)
        dk, dv = (x[table.long()].reshape(batch, length, hk, 128).transpose(1, 2).contiguous()
                  for x in (k, v))
        qt = q.transpose(1, 2)
        t_sdpa = graph_us(lambda: torch.nn.functional.scaled_dot_product_attention(
            qt, dk, dv, enable_gqa=True))
        row = {"shape": f"{hq}/{hk} {batch}x{length}", "plan": f"{t_plan:.1f} ({plan.num_splits})",
               "sdpa": f"{t_sdpa:.1f}"}
        best = None
        for splits in [plan.num_splits] + [s for s in sweep if s != plan.num_splits]:
            for variant in variants:
                lo = launch(q, k, v, seqlens, table, splits, variant)
                out, _ = lo()
                torch.cuda.synchronize()
                err = (out.float() - ref.float()).abs().max().item()
                t = graph_us(lo)
                per_sm = occupancy(lo.decode())["ctas_per_sm"]
                row[f"{variant} @{splits}"] = f"{t:.1f} ({per_sm}/SM, err {err:.0e})"
                if best is None or t < best[0]:
                    best = (t, f"{variant} @{splits}")
        row["best gluon / plan"] = f"{t_plan / best[0]:.2f} ({best[1]})"
        row["sdpa / best gluon"] = f"{t_sdpa / best[0]:.2f}"
        print(row, flush=True)
        rows.append(row)
        del q, k, v, dk, dv, plan
        torch.cuda.empty_cache()
    for r in rows:
        print(" | ".join(f"{key}: {val}" for key, val in r.items()))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--skip-correctness", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args()
    variants = args.variants.split(",")
    print(torch.cuda.get_device_name(), flush=True)
    for name, fn, fargs in (("correctness", correctness, (variants,)),
                            ("bench", bench, (args.shapes, variants))):
        if getattr(args, f"skip_{name}"):
            continue
        try:
            fn(*fargs)
        except Exception:  # noqa: BLE001  (report, go on)
            FAILURES.append(name)
            traceback.print_exc()
    print("all checks passed" if not FAILURES else f"FAILED: {FAILURES}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
