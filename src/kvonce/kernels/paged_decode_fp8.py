"""The fp8 paged-decode loop with V read as channel pairs (``PagedDecodeConfig.fp8_v_pairs``).

Why. P·V's reduction runs over keys, but a cache row holds one key's channels: the MMA operand
wants two consecutive keys of one channel in a register, which for a 1-byte V tile Triton gathers
byte by byte (compiled for sm_90a, the unmasked loop of the (128, 4, 2) fp8 kernel spends 128
``LDS.U8``, ~100 byte-packing ``IMAD`` and most of its 143 ``IMAD.MOV`` of 992 instructions a tile
a warp on V; docs/notes.md). Read as 16-bit units instead, the tile ``[BLOCK_N, BLOCK_D / 2]``
(unit ``p`` of key ``n`` = channels ``2p`` and ``2p + 1``) is an ordinary 16-bit B operand, which
the MMA operand load transposes for free (``ldmatrix.trans``): each register then holds two keys'
units of one channel pair, and one ``prmt`` + one ``cvt.rn.f16x2.e4m3x2`` give the fp16 pair of
the even (or odd) channel. So the loop does two dots a tile, ``O_even += P V[:, 0::2]`` and
``O_odd += P V[:, 1::2]``, and the output is interleaved once at the end.

fp16 compute only: fp16 queries, or bf16 queries with ``f16_math`` (``paged_decode._f16_rows``).
Head dims with an even ``BLOCK_D == head_dim`` and V strides that are even (16-bit units).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from .dual_group_fwd import _softmax_step
from .paged_tiles import _tile_rows

# Inline PTX on the GPU; the interpreter runs no PTX and takes the plain-op form (bit-identical).
PACKED_CVT: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


def _pair_asm(selector: str) -> str:
    """PTX for two uint16 units in ``$1``: bytes (of key k, key k + 1) picked by ``selector`` into
    the low half, converted as e4m3 x 2 into ``$0`` (f16 x 2)."""
    return f"""{{
    .reg .b32 t;
    .reg .b16 lo, hi;
    prmt.b32 t, $1, 0, {selector};
    mov.b32 {{lo, hi}}, t;
    cvt.rn.f16x2.e4m3x2 $0, lo;
    }}"""


_PAIR_EVEN: tl.constexpr = tl.constexpr(_pair_asm("0x3320"))  # bytes 0, 2: channel 2p
_PAIR_ODD: tl.constexpr = tl.constexpr(_pair_asm("0x3331"))   # bytes 1, 3: channel 2p + 1


@triton.jit
def _fp8_pair_units_to_f16(units, ODD: tl.constexpr):
    """uint16 units of an fp8 V tile (low byte channel ``2p``, high byte ``2p + 1`` of one key)
    -> the fp16 value of channel ``2p`` (or, ODD, ``2p + 1``), exactly. On the GPU two units (two
    keys) at a time: a ``prmt`` puts the two keys' bytes of one channel side by side and one
    ``cvt.rn.f16x2.e4m3x2`` converts both."""
    if PACKED_CVT:
        if ODD:
            asm: tl.constexpr = _PAIR_ODD
        else:
            asm: tl.constexpr = _PAIR_EVEN
        y = tl.inline_asm_elementwise(asm, "=r,r", [units], dtype=tl.float16, is_pure=True,
                                      pack=2)
    else:
        if ODD:
            b = units >> 8
        else:
            b = units & 0xFF
        y = b.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return y


@triton.jit
def _attend_paged_fp8_pairs(acc_even, acc_odd, m_i, l_i, q, lo, hi, qk_scale, tok, diag, kv_end,
                            K, V, bt_row, stride_kp, stride_kt, stride_vp, stride_vt, offs_d,
                            MASKED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                            DOT_PRECISION: tl.constexpr, INT64_KV: tl.constexpr,
                            ROW_SCALE: tl.constexpr):
    """Key tiles ``[lo, hi)`` of an fp8 cache (K, V: this KV head's base pointers) into the
    state ``(acc_even, acc_odd [BLOCK_M, BLOCK_D / 2], m_i, l_i)``: the output's even and odd
    channels. q: fp16 ``[BLOCK_M, BLOCK_D]``; the rest as ``paged_decode._attend_paged``."""
    offs_p = tl.arange(0, BLOCK_D // 2)
    V16 = V.to(tl.pointer_type(tl.uint16))
    K8 = K.to(tl.pointer_type(tl.uint8))
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, in_range, page, slot = _tile_rows(bt_row, start_n, kv_end, PAGE_SIZE, BLOCK_N,
                                                  MASKED, INT64_KV)
        k_ptrs = K8 + (page * stride_kp + slot * stride_kt)[None, :] + offs_d[:, None]
        v_ptrs = (V16 + (page * (stride_vp // 2) + slot * (stride_vt // 2))[:, None]
                  + offs_p[None, :])
        if MASKED:
            k_raw = tl.load(k_ptrs, mask=in_range[None, :], other=0)
            units = tl.load(v_ptrs, mask=in_range[:, None], other=0)
        else:
            k_raw = tl.load(k_ptrs)
            units = tl.load(v_ptrs)
        k_t = k_raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        qk = tl.dot(q, k_t, input_precision=DOT_PRECISION)
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, qk_scale, tok, offs_n, diag, kv_end,
                                           MASKED, ROW_SCALE=ROW_SCALE)
        p = p.to(tl.float16)
        acc_even = acc_even * alpha[:, None] + tl.dot(p, _fp8_pair_units_to_f16(units, False),
                                                      input_precision=DOT_PRECISION)
        acc_odd = acc_odd * alpha[:, None] + tl.dot(p, _fp8_pair_units_to_f16(units, True),
                                                    input_precision=DOT_PRECISION)
    return acc_even, acc_odd, m_i, l_i
