"""Accuracy of the quantized KV formats: relative error of the decode output (and of the LSE)
against the fp16 cache, on random keys and on keys with per-channel outliers (a few channels
10-30x larger, as real LLM keys have). Pure PyTorch (kvonce.reference + kvonce.paged.quant: the
kernels match ``dequantize_kv`` to fp32 rounding, tests/test_decode_quant.py), so it runs on CPU.

    PYTHONPATH=src python scripts/quant_accuracy.py
"""
import torch

import kvonce
from kvonce.reference import paged_attention_ref


def case(outliers: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    batch, length, page, heads, heads_k, d = 4, 1024, 16, 8, 2, 128
    pages = batch * length // page
    q = torch.randn(batch, 1, heads, d, generator=g).half()
    k = torch.randn(pages, page, heads_k, d, generator=g)
    v = torch.randn(pages, page, heads_k, d, generator=g)
    if outliers:
        for ch, mult in ((3, 30.0), (40, 20.0), (77, 10.0), (100, 15.0)):
            k[..., ch] *= mult
    table = torch.randperm(pages, generator=g).reshape(batch, -1).to(torch.int32)
    seqlens = torch.full((batch,), length, dtype=torch.int32)
    return q, k.half(), v.half(), seqlens, table


def main():
    print("| keys | format | out rel err vs fp16 cache | max abs lse err |")
    print("|---|---|---|---|")
    for outliers in (False, True):
        q, k, v, seqlens, table = case(outliers)
        ref, ref_lse = paged_attention_ref(q, k, v, seqlens, table)
        for fmt in ("fp8_e4m3", "int8", "int4"):
            kq, ks = kvonce.quantize_kv(k, fmt)
            vq, vs = kvonce.quantize_kv(v, fmt)
            out, lse = paged_attention_ref(q, kvonce.dequantize_kv(kq, ks, fmt),
                                           kvonce.dequantize_kv(vq, vs, fmt), seqlens, table)
            rel = ((out - ref).norm() / ref.norm()).item()
            print(f"| {'per-channel outliers' if outliers else 'random'} | {fmt} | {rel:.2e} | "
                  f"{(lse - ref_lse).abs().max().item():.2e} |")


if __name__ == "__main__":
    main()
