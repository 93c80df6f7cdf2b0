"""The Gluon quantized decode's TMA loads under each L2 promotion (CUDA, sm_90): Triton encodes
every tensor descriptor with ``CU_TENSOR_MAP_L2_PROMOTION_L2_128B`` (driver.c,
``fill_tma_descriptor``); this re-encodes them (``cuTensorMapEncodeTiled`` through ctypes, the
same arguments) with 64-byte, 256-byte or no promotion and times the plan's decode in CUDA
graphs against the 16-bit cache's, as ``bench quant`` does (page 16, head-major pages).

    PYTHONPATH=src:scripts python scripts/tma_l2_promotion.py [--promotions 128,256,none]
        [--formats fp8_e4m3,int8,int4] [--heads 32/8,12/12] [--shapes 64x8192,1x131072]

A measurement, not the library's launch path: it patches ``triton.runtime.driver.active.utils.
fill_tma_descriptor`` for the run. First it checks that its own encoding with 128-byte promotion
gives Triton's bytes exactly.
"""
import argparse
import ctypes
import itertools

import torch
import triton

import kvonce
from decode_ncu_case import paged_case
from quant_decode_sweep import graph_us
from kvonce.bench.quant import stored

PROMOTIONS = {"none": 0, "64": 1, "128": 2, "256": 3}


def _encoder():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    return fn


def encode(fn, promotion, global_address, swizzle, elem_size, elem_type, block_size, shape,
           strides, padding) -> bytes:
    """``fill_tma_descriptor``'s encoding (driver.c) with ``promotion``: the 128 bytes."""
    rank = len(block_size)
    box = (ctypes.c_uint32 * 5)(*[0] * 5)
    dims = (ctypes.c_uint64 * 5)(*[0] * 5)
    byte_strides = (ctypes.c_uint64 * 5)(*[0] * 5)
    for i in range(rank):
        box[rank - i - 1] = block_size[i]
        dims[rank - i - 1] = shape[i]
    for i in range(rank - 1):
        byte_strides[rank - i - 2] = elem_size * strides[i]
    ones = (ctypes.c_uint32 * 5)(1, 1, 1, 1, 1)
    out = (ctypes.c_uint8 * 256)()
    base = ctypes.addressof(out)
    aligned = (base + 127) // 128 * 128
    fill = 1 if padding == 1 else 0
    res = fn(ctypes.c_void_p(aligned), ctypes.c_int(elem_type), ctypes.c_uint32(rank),
             ctypes.c_void_p(global_address), dims, byte_strides, box, ones, ctypes.c_int(0),
             ctypes.c_int(swizzle), ctypes.c_int(promotion), ctypes.c_int(fill))
    if res != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed: {res}")
    return ctypes.string_at(aligned, 128)


def patch(promotion: int):
    """``fill_tma_descriptor`` re-encoded with ``promotion``; returns the undo."""
    utils = triton.runtime.driver.active.utils
    orig = utils.fill_tma_descriptor
    fn = _encoder()

    def fill(*args):
        obj = orig(*args)
        want = encode(fn, promotion, *args)
        ctypes.memmove(id(obj) + 128, want, 128)     # PyCUtensorMapObject's tensorMap
        return obj

    # the encoding matches Triton's where the promotion does
    probe_args = None

    def check(*args):
        nonlocal probe_args
        obj = orig(*args)
        mine = encode(fn, PROMOTIONS["128"], *args)
        theirs = ctypes.string_at(id(obj) + 128, 128)
        if mine != theirs:
            raise RuntimeError("this encoding differs from Triton's at 128-byte promotion")
        probe_args = args
        return obj

    utils.fill_tma_descriptor = check if promotion == PROMOTIONS["128"] else fill

    def undo():
        utils.fill_tma_descriptor = orig
    return undo


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--promotions", default="128,256,64,none")
    p.add_argument("--formats", default="fp8_e4m3,int8,int4")
    p.add_argument("--heads", default="32/8,12/12")
    p.add_argument("--shapes", default="64x8192,1x131072")
    args = p.parse_args()
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    promos = args.promotions.split(",")
    print("| heads | batch x len | format | route | 16-bit us | "
          + " | ".join(f"L2 {pr} us" for pr in promos) + " | best x 16-bit |")
    print("|---" * (6 + len(promos)) + "|")
    for (hq, hk), (batch, length) in itertools.product(heads, shapes):
        q, k, v, table, seqlens, _ = paged_case(hq, hk, batch, length)
        k, v = stored(k, "hnd"), stored(v, "hnd")
        base = kvonce.PagedDecodePlan(q, k, v, seqlens, table)
        ref = base.run(q, k, v, seqlens, table).float()
        fp16_us = graph_us(lambda: base.run(q, k, v, seqlens, table))
        for fmt in args.formats.split(","):
            (kq, ks), (vq, vs) = (kvonce.quantize_kv(t, fmt) for t in (k, v))
            kq, ks, vq, vs = (stored(t, "hnd") for t in (kq, ks, vq, vs))
            kw = dict(k_scale=ks, v_scale=vs, kv_format="int4" if fmt == "int4" else None)
            times = []
            for pr in promos:
                undo = patch(PROMOTIONS[pr])
                try:
                    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, **kw)
                    run_kw = dict(k_scale=ks, v_scale=vs)
                    err = (plan.run(q, kq, vq, seqlens, table, **run_kw).float() - ref).abs()
                    assert err.max().item() < 0.1, (fmt, pr, err.max().item())
                    times.append(graph_us(lambda: plan.run(q, kq, vq, seqlens, table,
                                                           **run_kw)))
                finally:
                    undo()
            route = f"{'gluon' if plan.uses_gluon else 'triton'}, {plan.num_splits} splits"
            print(f"| {hq}/{hk} | {batch} x {length} | {fmt} | {route} | {fp16_us:.1f} | "
                  + " | ".join(f"{t:.1f}" for t in times)
                  + f" | {fp16_us / min(times):.2f} |", flush=True)
        del k, v


if __name__ == "__main__":
    main()
