"""Exact converters of quantized cache bytes to fp16/bf16 MMA operands, shared by the paged decode
loops (``paged_decode``, ``paged_decode_pairs``): packed inline PTX on the GPU, four (or two)
values an instruction sequence; the CPU interpreter runs no PTX, so there the same values come
from plain Triton ops (bit-identical: both are exact). Only casts, bitcasts and pure inline asm,
so Triton keeps the 1-byte tiles in shared memory and converts in the MMA operand layout.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

PACKED_CVT: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def _ints_to(x, dtype: tl.constexpr):
    """int8 values to ``dtype`` exactly. For fp16 through the bit pattern: ``0x6400`` is 1024.0,
    where the fp16 ulp is 1, so bits ``0x6400 + (x + 128)`` are ``1152 + x``. On the GPU four
    values at a time (``PACKED_CVT``): one ``xor`` biases the four bytes (x + 128), two ``prmt``
    put each biased byte under a 0x64 high byte (two fp16 per register), two ``sub.f16x2``
    subtract 1152: 5 instructions per 4 values, where the per-value form (sign-extend, 16-bit add,
    subtract) took about 2 per value (SASS; measured in docs/notes.md). int->float conversion
    proper is quarter rate on the SM, which is why neither uses it."""
    if dtype == tl.float16:
        if PACKED_CVT:
            y = tl.inline_asm_elementwise(
                """{
                .reg .b32 t, c;
                xor.b32 t, $2, 0x80808080;
                mov.b32 c, 0x64806480;
                prmt.b32 $0, t, 0x64646464, 0x4140;
                prmt.b32 $1, t, 0x64646464, 0x4342;
                sub.f16x2 $0, $0, c;
                sub.f16x2 $1, $1, c;
                }""",
                "=r,=r,r", [x], dtype=tl.float16, is_pure=True, pack=4)
        else:
            y = (x.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0
    else:
        # bf16: through fp32 (an int -> float cvt a value). A packed form through fp32 magic
        # numbers (xor, 4 prmt, 4 sub.f32, 2 cvt.rn.bf16x2.f32 per 4 values) measured 3-7% slower
        # on the H100 (docs/notes.md, 2026-11-26).
        y = x.to(tl.float32).to(dtype)
    return y


@triton.jit
def _fp8_bytes_to(b, dtype: tl.constexpr):
    """e4m3 bytes ``b`` (uint8) to ``dtype``, exactly. fp16: the hardware's packed
    ``cvt.rn.f16x2.e4m3x2``. bf16 has no such cvt (Triton goes through fp16: three cvt per two
    values), so on the GPU a bit move, four values at a time: each byte ``s eeee mmm`` becomes the
    bf16 ``s 000 eeee mmm 0000`` (prmt puts the byte in a half's high byte, and/shr move exponent
    and mantissa down four bits, the sign stays), whose value is the e4m3 value times 2^-120
    (bias 127 against 7; e4m3 subnormals land on bf16 subnormals), then one fma.bf16x2 by 2^120:
    5 instructions per 2 values. NaN bytes (0x7F / 0xFF, which ``quantize_kv`` writes only for a
    NaN input) read as +-480 there, not NaN."""
    if dtype == tl.bfloat16 and PACKED_CVT:
        y = tl.inline_asm_elementwise(
            """{
            .reg .b32 t, u, s, c, z;
            prmt.b32 t, $2, 0, 0x1404;
            prmt.b32 u, $2, 0, 0x3424;
            mov.b32 c, 0x7B807B80;
            mov.b32 z, 0x80008000;
            and.b32 s, t, 0x7F007F00;
            shr.b32 s, s, 4;
            and.b32 t, t, 0x80008000;
            or.b32 t, t, s;
            fma.rn.bf16x2 $0, t, c, z;
            and.b32 s, u, 0x7F007F00;
            shr.b32 s, s, 4;
            and.b32 u, u, 0x80008000;
            or.b32 u, u, s;
            fma.rn.bf16x2 $1, u, c, z;
            }""",
            "=r,=r,r", [b], dtype=tl.bfloat16, is_pure=True, pack=4)
    else:
        y = b.to(tl.float8e4nv, bitcast=True).to(dtype)
    return y


@triton.jit
def _nibbles_to(b, HIGH: tl.constexpr, dtype: tl.constexpr):
    """The low (or, HIGH, high) nibbles of int4 bytes ``b`` (uint8, each nibble q + 8) as the
    values q in ``dtype``, exactly. Bit patterns, not int->float conversions (quarter rate): fp16
    ``0x6400 + n`` is 1024 + n (ulp 1 there), bf16 ``0x4300 + n`` is 128 + n; minus 1032 / 136.
    Only integer ops, a bitcast and a subtract of a constant: Triton keeps the bytes in shared
    memory and runs this in the MMA operand layout."""
    if dtype == tl.float16 and PACKED_CVT:
        # Four bytes at a time: two prmt put bytes (0, 1) and (2, 3) under 0x64 high bytes
        # (f16x2 pairs in the bytes' order), one lop3 each keeps the low nibble (1024 + n) or
        # the high one (1024 + 16 n), and one sub.f16x2 (- 1032) or fma.f16x2 (/ 16 - 72)
        # gives n - 8: 6 instructions per 4 values, exact. One output per asm: a two-output asm
        # would not be hoisted to the MMA operand layout.
        if HIGH:
            y = tl.inline_asm_elementwise(
                """{
                .reg .b32 t, u, a, c;
                prmt.b32 t, $2, 0x64646464, 0x4140;
                prmt.b32 u, $2, 0x64646464, 0x4342;
                mov.b32 a, 0x2C002C00;
                mov.b32 c, 0xD480D480;
                and.b32 t, t, 0xFFF0FFF0;
                and.b32 u, u, 0xFFF0FFF0;
                fma.rn.f16x2 $0, t, a, c;
                fma.rn.f16x2 $1, u, a, c;
                }""",
                "=r,=r,r", [b], dtype=tl.float16, is_pure=True, pack=4)
        else:
            y = tl.inline_asm_elementwise(
                """{
                .reg .b32 t, u, c;
                prmt.b32 t, $2, 0x64646464, 0x4140;
                prmt.b32 u, $2, 0x64646464, 0x4342;
                mov.b32 c, 0x64086408;
                and.b32 t, t, 0xFF0FFF0F;
                and.b32 u, u, 0xFF0FFF0F;
                sub.f16x2 $0, t, c;
                sub.f16x2 $1, u, c;
                }""",
                "=r,=r,r", [b], dtype=tl.float16, is_pure=True, pack=4)
    else:
        if HIGH:
            n = b >> 4
        else:
            n = b & 15
        if dtype == tl.float16:
            y = (n.to(tl.int16) + 0x6400).to(tl.float16, bitcast=True) - 1032.0
        elif dtype == tl.bfloat16:
            y = (n.to(tl.int16) + 0x4300).to(tl.bfloat16, bitcast=True) - 136.0
        else:
            y = (n.to(tl.float32) - 8.0).to(dtype)
    return y


def _pair_asm(prologue: str, fill: str, selector: str, convert: str) -> str:
    """PTX for two uint16 units in ``$1`` (key k, key k + 1; each unit = channels 2p, 2p + 1 of
    its key): ``prologue`` into ``t``, a ``prmt`` picking one channel's two bytes of ``t`` (and
    bytes of ``fill``) by ``selector`` into ``u``, then ``convert`` from ``u`` into ``$0``
    (f16 x 2)."""
    return f"""{{
    .reg .b32 t, u, c;
    .reg .b16 lo, hi;
    {prologue}
    prmt.b32 u, t, {fill}, {selector};
    {convert}
    }}"""


# fp8: bytes (0, 2) or (1, 3) side by side in the low half, one cvt of the e4m3 pair.
_FP8_CVT = "mov.b32 {lo, hi}, u;\n    cvt.rn.f16x2.e4m3x2 $0, lo;"
_FP8_PAIR_EVEN: tl.constexpr = tl.constexpr(_pair_asm("mov.b32 t, $1;", "0", "0x3320", _FP8_CVT))
_FP8_PAIR_ODD: tl.constexpr = tl.constexpr(_pair_asm("mov.b32 t, $1;", "0", "0x3331", _FP8_CVT))
# int8 (``_ints_to``'s magic number): bias the bytes (xor), place each under a 0x64 high byte
# (fp16 1024 + x + 128), subtract 1152.
_INT8_BIAS = "xor.b32 t, $1, 0x80808080;"
_INT8_SUB = "mov.b32 c, 0x64806480;\n    sub.f16x2 $0, u, c;"
_INT8_PAIR_EVEN: tl.constexpr = tl.constexpr(
    _pair_asm(_INT8_BIAS, "0x64646464", "0x4240", _INT8_SUB))
_INT8_PAIR_ODD: tl.constexpr = tl.constexpr(
    _pair_asm(_INT8_BIAS, "0x64646464", "0x4341", _INT8_SUB))


@triton.jit
def _pair_units_to_f16(units, ODD: tl.constexpr, KV_FORMAT: tl.constexpr):
    """uint16 units of an fp8 (KV_FORMAT 1) or int8 (2) V tile (low byte channel ``2p``, high
    byte ``2p + 1`` of one key) -> the fp16 value of channel ``2p`` (or, ODD, ``2p + 1``),
    exactly. On the GPU two units (two keys) at a time: a ``prmt`` puts the two keys' bytes of
    one channel side by side and one cvt (fp8) or one subtract (int8, after an xor) converts
    both."""
    if PACKED_CVT:
        if KV_FORMAT == 1:
            if ODD:
                asm: tl.constexpr = _FP8_PAIR_ODD
            else:
                asm: tl.constexpr = _FP8_PAIR_EVEN
        else:
            if ODD:
                asm: tl.constexpr = _INT8_PAIR_ODD
            else:
                asm: tl.constexpr = _INT8_PAIR_EVEN
        y = tl.inline_asm_elementwise(asm, "=r,r", [units], dtype=tl.float16, is_pure=True,
                                      pack=2)
    else:
        if ODD:
            b = (units >> 8).to(tl.uint8)
        else:
            b = (units & 0xFF).to(tl.uint8)
        if KV_FORMAT == 1:
            y = b.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        else:
            y = _ints_to(b.to(tl.int8, bitcast=True), tl.float16)
    return y


# int4 V units (two bytes of one key: bytes 2u, 2u + 1 of its row), two units to a register
# (whichever two the layout packs). A nibble of each unit's even byte sits at bits 0-7 and 16-23,
# so one lop3 puts both under 0x64 high bytes (fp16 1024 + n, or 1024 + 16 n for the high nibble)
# with no byte moves; the odd bytes first shift down 8 (the low unit's odd byte into bits 0-7, the
# high unit's into 16-23; the rest is masked off). Each 16-bit lane only sees its own unit.
_I4_LOW = "sub.f16x2 $0, t, c;"
_I4_HIGH = "mov.b32 a, 0x2C002C00;\n    fma.rn.f16x2 $0, t, a, c;"


def _int4_unit_asm(odd: bool, high: bool) -> str:
    src = "s" if odd else "$1"
    shift = "shr.b32 s, $1, 8;" if odd else ""
    mask = "0x00F000F0" if high else "0x000F000F"
    bias = "0xD480D480" if high else "0x64086408"  # -72 after / 16, or 1032
    return f"""{{
    .reg .b32 s, t, a, c;
    {shift}
    lop3.b32 t, {src}, {mask}, 0x64006400, 0xEA;
    mov.b32 c, {bias};
    {_I4_HIGH if high else _I4_LOW}
    }}"""


_I4_UNIT_ASM = {(odd, high): tl.constexpr(_int4_unit_asm(odd, high))
                for odd in (False, True) for high in (False, True)}
_I4_EVEN_LOW: tl.constexpr = _I4_UNIT_ASM[(False, False)]
_I4_ODD_LOW: tl.constexpr = _I4_UNIT_ASM[(True, False)]
_I4_EVEN_HIGH: tl.constexpr = _I4_UNIT_ASM[(False, True)]
_I4_ODD_HIGH: tl.constexpr = _I4_UNIT_ASM[(True, True)]


@triton.jit
def _int4_units_to_f16(units, ODD: tl.constexpr, HIGH: tl.constexpr):
    """uint16 units of an int4 V chunk (low byte: channels of byte 2p, high byte: byte 2p + 1,
    each byte's nibbles q + 8) -> the fp16 value q of the even (or, ODD, odd) byte's low (or,
    HIGH, high) nibble, exactly. On the GPU two units (two keys) a register: a lop3 and a
    subtract (or fma), plus a shift for the odd byte."""
    if PACKED_CVT:
        if ODD:
            if HIGH:
                asm: tl.constexpr = _I4_ODD_HIGH
            else:
                asm: tl.constexpr = _I4_ODD_LOW
        else:
            if HIGH:
                asm: tl.constexpr = _I4_EVEN_HIGH
            else:
                asm: tl.constexpr = _I4_EVEN_LOW
        y = tl.inline_asm_elementwise(asm, "=r,r", [units], dtype=tl.float16, is_pure=True,
                                      pack=2)
    else:
        if ODD:
            b = units >> 8
        else:
            b = units & 0xFF
        if HIGH:
            n = (b >> 4) & 15
        else:
            n = b & 15
        y = (n.to(tl.int16) + 0x6400).to(tl.float16, bitcast=True) - 1032.0
    return y
