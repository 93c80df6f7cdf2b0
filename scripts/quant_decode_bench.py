"""Quantized paged decode vs the fp16 cache at the same batch (CUDA), CUDA-graph timing.

    PYTHONPATH=src python scripts/quant_decode_bench.py

GQA 32/8, d128, page 16, random page order, q_len 1; kvonce's PagedDecodePlan.run per format,
replayed in a CUDA graph (``triton.testing.do_bench`` median). Prints us, the cache bytes read per
call (K/V data + scales) over the time, and the speedup over fp16 at the same batch; plus the
relative error of each format's output against the fp16 cache's.
"""
import torch
import triton.testing

import kvonce

SHAPES = [(16, 4096), (64, 8192), (1, 131072)]


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return 1e3 * triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median")


def main():
    print("| batch x len | format | us | GB/s read | speedup vs fp16 | rel err vs fp16 |")
    print("|---|---|---|---|---|---|")
    for batch, length in SHAPES:
        torch.manual_seed(0)
        pages = batch * length // 16
        q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(pages, 16, 8, 128, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        table = torch.randperm(pages, device="cuda").reshape(batch, -1).to(torch.int32)
        seqlens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
        base = None
        for fmt in (None, "fp8_e4m3", "int8", "int4"):
            if fmt is None:
                kq, vq, ks, vs = k, v, None, None
                nbytes = 2 * k.numel() * 2
            else:
                kq, ks = kvonce.quantize_kv(k, fmt)
                vq, vs = kvonce.quantize_kv(v, fmt)
                nbytes = 2 * (kq.numel() * kq.element_size() + ks.numel() * ks.element_size())
            plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                          kv_format="int4" if fmt == "int4" else None)
            run = (lambda: plan.run(q, kq, vq, seqlens, table)) if fmt is None else (
                lambda: plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs))
            out = run()
            us = graph_us(run)
            if fmt is None:
                base, base_out = us, out
            err = ((out.float() - base_out.float()).norm() / base_out.float().norm()).item()
            print(f"| {batch} x {length} | {fmt or 'fp16'} | {us:.1f} | {nbytes / us / 1e3:.0f} | "
                  f"{base / us:.2f} | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
