"""Accuracy of the quantized KV formats: relative error of the decode output (and of the LSE)
against the fp16 cache, on random keys and on keys with per-channel outliers (a few channels
10-30x larger, as real LLM keys have). Pure PyTorch (kvonce.reference + kvonce.paged.quant: the
kernels match ``dequantize_kv`` to fp32 rounding, tests/test_decode_quant.py), so it runs on CPU.

    PYTHONPATH=src python scripts/quant_accuracy.py [--rotate]

int8 and int4 with their scales in fp16 (quantize_kv's default) and in float32. ``--rotate``
also measures each format after a fixed orthonormal Hadamard rotation of K and q
(``q.k = (qH).(kH)``; V unrotated), the rotation issue 20 proposes for outlier channels.
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


def hadamard(d: int) -> torch.Tensor:
    """Sylvester Hadamard matrix scaled to be orthonormal (``H @ H.T == I``), d a power of 2."""
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / d ** 0.5


def main(argv):
    rotations = (False, True) if "--rotate" in argv else (False,)
    print("| keys | format | K/q rotation | out rel err vs fp16 cache | max abs lse err |")
    print("|---|---|---|---|---|")
    for outliers in (False, True):
        q, k, v, seqlens, table = case(outliers)
        ref, ref_lse = paged_attention_ref(q, k, v, seqlens, table)
        for rotate in rotations:
            h = hadamard(k.shape[-1])
            kr = (k.float() @ h).half() if rotate else k
            qr = (q.float() @ h).half() if rotate else q
            for fmt, sd in (("fp8_e4m3", None), ("int8", torch.float16), ("int8", torch.float32),
                            ("int4", torch.float16), ("int4", torch.float32)):
                kq, ks = kvonce.quantize_kv(kr, fmt, scale_dtype=sd)
                vq, vs = kvonce.quantize_kv(v, fmt, scale_dtype=sd)
                out, lse = paged_attention_ref(qr, kvonce.dequantize_kv(kq, ks, fmt),
                                               kvonce.dequantize_kv(vq, vs, fmt), seqlens, table)
                rel = ((out - ref).norm() / ref.norm()).item()
                label = fmt if sd is None else f"{fmt}, {str(sd)[6:]} scales"
                print(f"| {'per-channel outliers' if outliers else 'random'} | {label} | "
                      f"{'Hadamard' if rotate else 'none'} | {rel:.2e} | "
                      f"{(lse - ref_lse).abs().max().item():.2e} |")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
