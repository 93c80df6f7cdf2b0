"""What one scale per key would save int4 decode: the shipped int4 loop (four 32-channel group
scales per key, K and V) against a variant with ONE float32 scale (``token``; and one offset,
``token-asym``) per key for K and for V, the
same bytes otherwise (channel c the low nibble of byte c, c < 64, else the high nibble of byte
c - 64). A study, not a format: the variant replaces ``_attend_paged_int4_vpairs`` in this process
only, and reads its scale from the first 4 bytes of each key's int4 scale row.

Why: with a per-key V scale the probabilities take it (``p * s_v``, one tile), so V's nibble planes
go from the bytes to the MMA operand with nothing but the lop3 convert between (no per-group
scaling in a blocked layout, no fp16 planes staged in shared memory); with a per-key K scale the
two nibble planes of K are one accumulated dot and one column scale instead of four dots and four.

    .venv/bin/python scripts/int4_token_scales_ab.py --compile          # CPU: sm_90a SASS
    PYTHONPATH=src python scripts/int4_token_scales_ab.py --variant group|token \
        [--heads 32/8,12/12] [--shapes 16x4096,64x8192,1x131072] [--dtype fp16]   # GPU

``--compile``: the unmasked loop's instructions and CTA barriers a tile a warp, registers, spills,
shared memory, for both variants (each in its own process: the swap must precede the first compile).
GPU: per shape, the variant's output against ``paged_attention_ref`` on the dequantized cache it
reads (relative error), then CUDA-graph times of the fp16 cache and of the int4 cache through
``PagedDecodePlan`` (the int4 row's config: splits, stages, prefetch), and the speedup. Run both
variants on the same warm machine and compare their speedups.

Accuracy cost (pure PyTorch, random keys as scripts/quant_accuracy.py, decode output relative
error against the fp16 cache, seeds 0 / 1): groups of 32 for K and V (today) 1.39e-1 / 1.38e-1;
per-key K and V 1.70e-1 / 1.70e-1; per-key asymmetric K and V (16 levels over [min, max])
1.44e-1 / 1.45e-1.
"""
from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from kvonce.kernels import paged_decode as pd  # noqa: E402
from kvonce.kernels.dual_group_fwd import _softmax_step  # noqa: E402
from kvonce.kernels.paged_tiles import _tile_pages, _tile_rows_ahead  # noqa: E402
from kvonce.kernels.quant_convert import _int4_units_to_f16, _nibbles_to  # noqa: E402

VARIANTS = ("group", "token", "token-asym")
# The variant's per-key offsets on or off, fixed before anything compiles.
ASYM = tl.constexpr(any(a.endswith("token-asym") for a in sys.argv))


@triton.jit
def _key_scale(CS, rows, in_range, MASKED: tl.constexpr):
    """Each key's float32 scale: the first 4 bytes of its int4 scale row (``CS + rows``, fp16
    units, 4-byte aligned)."""
    C32 = CS.to(tl.pointer_type(tl.float32))
    if MASKED:
        return tl.load(C32 + rows // 2, mask=in_range, other=0.0)
    return tl.load(C32 + rows // 2)


@triton.jit
def _key_scale_offset(CS, rows, in_range, MASKED: tl.constexpr):
    """Each key's float32 scale and offset (ASYM): its 8-byte int4 scale row as one load."""
    C64 = CS.to(tl.pointer_type(tl.uint64))
    if MASKED:
        pair = tl.load(C64 + rows // 4, mask=in_range, other=0)
    else:
        pair = tl.load(C64 + rows // 4)
    s = (pair & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
    z = (pair >> 32).to(tl.uint32).to(tl.float32, bitcast=True)
    return s, z


@triton.jit
def _token_scale_probabilities(q_low, q_high, q_sum, m_i, l_i, offs_n, in_range, page, slot,
                               qk_scale, tok, diag, kv_end, K, KS, stride_kp, stride_kt,
                               stride_ksp, stride_kst, MASKED: tl.constexpr,
                               DOT_PRECISION: tl.constexpr, ASYM: tl.constexpr):
    k_rows = page * stride_kp + slot * stride_kt
    offs_b = tl.arange(0, 64)
    if MASKED:
        kb = tl.load(K + k_rows[None, :] + offs_b[:, None], mask=in_range[None, :], other=0x88)
    else:
        kb = tl.load(K + k_rows[None, :] + offs_b[:, None])
    s_rows = page * stride_ksp + slot * stride_kst
    if ASYM:
        s_k, z_k = _key_scale_offset(KS, s_rows, in_range, MASKED)
    else:
        s_k = _key_scale(KS, s_rows, in_range, MASKED)
    qk = tl.dot(q_low, _nibbles_to(kb, False, tl.float16), input_precision=DOT_PRECISION)
    qk = tl.dot(q_high, _nibbles_to(kb, True, tl.float16), qk, input_precision=DOT_PRECISION)
    qk = qk * s_k[None, :]
    if ASYM:  # key n is s_n (nibble - 8) + z_n: q.k gains z_n times the row's sum of q
        qk += q_sum[:, None] * z_k[None, :]
    return _softmax_step(qk, m_i, l_i, qk_scale, tok, offs_n, diag, kv_end, MASKED)


@triton.jit
def _attend_paged_int4_token_scales(
        acc, m_i, l_i, q, lo, hi, qk_scale, tok, diag, kv_end, K, V, KS, VS, bt_row, stride_kp,
        stride_kt, stride_vp, stride_vt, stride_ksp, stride_kst, stride_vsp, stride_vst,
        MASKED: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, INT64_KV: tl.constexpr = True,
        q_out=0.0, KO=0, stride_kop=0, stride_kot=0, out_scale=1.0, N_OUT: tl.constexpr = 0,
        SCALE_PAIRS: tl.constexpr = False, PREFETCH_PAGES: tl.constexpr = False):
    """``_attend_paged_int4_vpairs``'s contract with one scale per key (fp16 q, no outliers);
    ASYM: and one offset per key (K and V)."""
    tl.static_assert(N_OUT == 0)
    q_sum = tl.sum(q.to(tl.float32), 1)
    # ASYM: p times V's offsets, summed over keys after the loop (no cross-warp sum a tile)
    acc_offset = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    q_low, q_high = tl.split(tl.permute(tl.reshape(q, [BLOCK_M, 2, 64]), (0, 2, 1)))
    a4 = tl.permute(tl.reshape(acc, [BLOCK_M, 2, 32, 2]), (0, 2, 3, 1))  # (m, col, parity, plane)
    a_low, a_high = tl.split(a4)
    even_low, odd_low = tl.split(a_low)
    even_high, odd_high = tl.split(a_high)
    V16 = V.to(tl.pointer_type(tl.uint16))
    offs_u = tl.arange(0, 32)
    page_next = _tile_pages(bt_row, lo, kv_end, PAGE_SIZE, BLOCK_N, INT64_KV) \
        if PREFETCH_PAGES else 0
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, in_range, page, slot, page_next = _tile_rows_ahead(
            bt_row, start_n, kv_end, page_next, PAGE_SIZE, BLOCK_N, MASKED, INT64_KV,
            PREFETCH_PAGES)
        p, alpha, m_i, l_i = _token_scale_probabilities(
            q_low, q_high, q_sum, m_i, l_i, offs_n, in_range, page, slot, qk_scale, tok, diag,
            kv_end, K, KS, stride_kp, stride_kt, stride_ksp, stride_kst, MASKED, DOT_PRECISION,
            ASYM)
        vs_rows = page * stride_vsp + slot * stride_vst
        if ASYM:
            s_v, z_v = _key_scale_offset(VS, vs_rows, in_range, MASKED)
            acc_offset = acc_offset * alpha[:, None] + p * z_v[None, :]
        else:
            s_v = _key_scale(VS, vs_rows, in_range, MASKED)
        v_units = page * (stride_vp // 2) + slot * (stride_vt // 2)
        if MASKED:
            units = tl.load(V16 + v_units[:, None] + offs_u[None, :], mask=in_range[:, None],
                            other=0x8888)
        else:
            units = tl.load(V16 + v_units[:, None] + offs_u[None, :])
        p16 = (p * s_v[None, :]).to(tl.float16)
        even_low = tl.dot(p16, _int4_units_to_f16(units, False, False), even_low * alpha[:, None],
                          input_precision=DOT_PRECISION)
        odd_low = tl.dot(p16, _int4_units_to_f16(units, True, False), odd_low * alpha[:, None],
                         input_precision=DOT_PRECISION)
        even_high = tl.dot(p16, _int4_units_to_f16(units, False, True),
                           even_high * alpha[:, None], input_precision=DOT_PRECISION)
        odd_high = tl.dot(p16, _int4_units_to_f16(units, True, True), odd_high * alpha[:, None],
                          input_precision=DOT_PRECISION)
    a4 = tl.join(tl.join(even_low, odd_low), tl.join(even_high, odd_high))
    acc = tl.reshape(tl.permute(a4, (0, 3, 1, 2)), [BLOCK_M, 128])
    if ASYM:
        acc += tl.sum(acc_offset, 1)[:, None]
    return acc, m_i, l_i


def quantize_per_key(x: torch.Tensor, asym: bool = False):
    """``x [..., nheads_k, 128]`` -> (bytes as the int4 format lays them out, the int4 scale
    tensor holding each key's float32 scale in its first 4 bytes and, ``asym``, its float32
    offset in the next 4, the dequantized float32 x). Symmetric: ``s = amax / 7``, nibble
    ``round(x / s) + 8``. ``asym``: 16 levels over [min, max], ``s = (max - min) / 15``, nibble
    ``round((x - min) / s)``, x = s (nibble - 8) + z with ``z = min + 8 s``."""
    xf = x.float()
    scale = torch.zeros(*x.shape[:-1], 4, dtype=torch.float16, device=x.device)
    if asym:
        lo = xf.amin(-1)
        s = torch.clamp((xf.amax(-1) - lo) / 15.0, min=2.0 ** -24)
        n = torch.clamp(torch.round((xf - lo[..., None]) / s[..., None]), 0, 15).to(torch.int16)
        z = lo + 8.0 * s
        scale.view(torch.float32)[..., 1] = z
    else:
        s = torch.clamp(xf.abs().amax(-1) / 7.0, min=2.0 ** -24)
        n = torch.clamp(torch.round(xf / s[..., None]), -7, 7).to(torch.int16) + 8
        z = torch.zeros_like(s)
    packed = (n[..., :64] | (n[..., 64:] << 4)).to(torch.uint8)
    scale.view(torch.float32)[..., 0] = s
    return packed, scale, (n - 8).float() * s[..., None] + z[..., None]


def compile_stats(variant: str) -> None:
    import dataclasses

    import decode_kernel_stats as dks
    from kvonce.kernels import configs

    configs.interpreter_active = lambda: False
    row = configs.get_paged_decode_config((9, 0), 128, "int4", 2, bf16=False)
    for stages, prefetch in ((row.num_stages, row.prefetch_pages), (2, True), (2, False)):
        cfg = dataclasses.replace(row, num_stages=stages, prefetch_pages=prefetch)
        s = dks.stats(dks.compile_decode("int4", torch.float16, 32, 8, 3, cfg, cfg.max_registers),
                      None, f"int4.{variant}")
        print(f"| {variant} | ({cfg.block_n}, {cfg.num_warps}, {stages}) prefetch {prefetch} | "
              f"{s['regs']} | {s['spill']} | {s['loops'][0][0]} / {s['loops'][0][1]} | "
              f"{s['shared']} |", flush=True)


def gpu_ab(args) -> None:
    import kvonce
    from kvonce.reference import paged_attention_ref
    from quant_decode_sweep import graph_us, random_case

    dtype = torch.float16
    print("| variant | heads | batch x len | rel err vs ref | fp16 us | int4 us | speedup |")
    print("|---|---|---|---|---|---|---|")
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    for (hq, hk), (batch, length) in itertools.product(heads, shapes):
        q, k, v, seqlens, table = random_case(hq, hk, batch, length, dtype)
        plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table)
        fp16_us = graph_us(lambda: plan.run(q, k, v, seqlens, table))
        if args.variant != "group":
            kq, ks, k_deq = quantize_per_key(k, ASYM)
            vq, vs, v_deq = quantize_per_key(v, ASYM)
        else:
            kq, ks = kvonce.quantize_kv(k, "int4")
            vq, vs = kvonce.quantize_kv(v, "int4")
            k_deq = kvonce.dequantize_kv(kq, ks, "int4", torch.float32)
            v_deq = kvonce.dequantize_kv(vq, vs, "int4", torch.float32)
        pl = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                    kv_format="int4")
        out = pl.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
        ref = paged_attention_ref(q.float(), k_deq, v_deq, seqlens, table)[0]
        err = ((out.float() - ref).norm() / ref.norm()).item()
        us = graph_us(lambda: pl.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs))
        print(f"| {args.variant} | {hq}/{hk} | {batch} x {length} | {err:.2e} | {fp16_us:.1f} | "
              f"{us:.1f} | {fp16_us / us:.2f} |", flush=True)
        del k, v, kq, vq


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="CPU: both variants' SASS stats")
    ap.add_argument("--variant", default="token", choices=VARIANTS)
    ap.add_argument("--heads", default="32/8,12/12")
    ap.add_argument("--shapes", default="16x4096,64x8192,1x131072")
    args = ap.parse_args()
    if args.variant != "group":  # before anything compiles
        pd._attend_paged_int4_vpairs = _attend_paged_int4_token_scales
    if args.compile and "--variant" not in sys.argv:
        print("| variant | config | regs | spill st/ld B | loop instr / BAR a tile a warp | "
              "shared B |")
        print("|---|---|---|---|---|---|")
        for variant in VARIANTS:
            subprocess.run([sys.executable, __file__, "--compile", "--variant", variant],
                           check=True)
    elif args.compile:
        compile_stats(args.variant)
    else:
        gpu_ab(args)


if __name__ == "__main__":
    main()
