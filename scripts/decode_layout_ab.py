"""Token-major (NHD) against head-major (HND) pages in the paged decode, every cache format.

    PYTHONPATH=src python scripts/decode_layout_ab.py [--formats plain,fp8_e4m3,int8,int4]

The same logical caches ``[pages, page, heads_k, d]`` (and per-token scales) stored either way,
the kernels reading them through their strides; CUDA-graph medians, GQA 32/8 and MHA 12/12 at
64 x 8192 and 1 x 131072, d128, page 16, random page order, fp16 q. The head-major output is
checked against the token-major one first. (docs/benchmarks.md, 2026-11-27.) A third column
(int8, int4) keeps the data token-major and stores only the per-token scales head-major: which of
the two the head-major gain comes from.
"""
import argparse

import kvonce
from decode_ncu_case import paged_case
from kvonce.bench.quant import stored
from quant_decode_sweep import graph_us


def _storage(layout: str, is_scale: bool) -> str:
    if layout == "mix":
        return "hnd" if is_scale else "nhd"
    return layout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", default="plain,fp8_e4m3,int8,int4")
    formats = p.parse_args().formats.split(",")
    print("| heads | shape | format | NHD us | HND us | NHD/HND | GB | NHD TB/s | HND TB/s | "
          "NHD data + HND scales us |")
    for hq, hk in ((32, 8), (12, 12)):
        for batch, length in ((64, 8192), (1, 131072)):
            q, k, v, table, seqlens, _ = paged_case(hq, hk, batch, length)
            for fmt in formats:
                if fmt == "plain":
                    tensors = (k, None, v, None)
                else:
                    tensors = (*kvonce.quantize_kv(k, fmt), *kvonce.quantize_kv(v, fmt))
                nbytes = sum(t.numel() * t.element_size() for t in tensors
                             if t is not None and t.dim() > 1)
                times, outs = [], []
                per_token = fmt in ("int8", "int4")
                for layout in ("nhd", "hnd", "mix") if per_token else ("nhd", "hnd"):
                    # tensors alternate data, scales: "mix" stores only the scales head-major
                    kc, ks, vc, vs = (None if t is None else stored(t, _storage(layout, i % 2))
                                      for i, t in enumerate(tensors))
                    kw = dict(k_scale=ks, v_scale=vs) if ks is not None else {}
                    plan = kvonce.PagedDecodePlan(q, kc, vc, seqlens, table, **kw,
                                                  kv_format="int4" if fmt == "int4" else None)
                    run = lambda: plan.run(q, kc, vc, seqlens, table, **kw)
                    outs.append(run())
                    times.append(graph_us(run))
                assert all(o.equal(outs[0]) for o in outs), fmt
                nhd, hnd, *mix = times
                print(f"| {hq}/{hk} | {batch}x{length} | {fmt} | {nhd:.1f} | {hnd:.1f} | "
                      f"{nhd / hnd:.3f} | {nbytes / 1e9:.3f} | {nbytes / nhd / 1e6:.2f} | "
                      f"{nbytes / hnd / 1e6:.2f} | {f'{mix[0]:.1f}' if mix else '-'} |",
                      flush=True)


if __name__ == "__main__":
    main()
