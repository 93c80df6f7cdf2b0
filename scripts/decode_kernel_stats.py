"""Compile the paged decode kernel for sm_90a on the CPU, as one real launch specializes it, and
print what decides its speed before a GPU sees it: registers and spills (ptxas -v), the SASS
instruction count and mix, and the shared-memory tiles of the TTGIR (a 1-byte ``i8`` tile feeding
the dot means the conversion runs in the MMA operand layout; a 16-bit one means a round trip).

    .venv/bin/python scripts/decode_kernel_stats.py [--format int4] [--dtype fp16,bf16]
        [--heads 32/8] [--splits 3] [--config 128,4,2] [--maxnreg N] [--swap-ab] [--no-f16-math]
        [--v-pairs | --no-v-pairs] [--outliers N] [--head-pairs] [--int64-offsets 0|1]
        [--shape BATCHxLEN] [--masked-stages N]
        [--keep DIR]

``--config block_n,num_warps,num_stages`` overrides the format's Hopper row (otherwise the row as
the table holds it for that dtype; the plan's MHA stage count and short-split tile are not
applied). No GPU: ``triton.compile`` with ``GPUTarget("cuda", 90, 32)`` and the wheel's ptxas /
cuobjdump (scripts/kernel_check.py's ``_tool``); pointers and the integer arguments that are
multiples of 16 get Triton's divisibility hint and those equal to 1 become constants, as a launch
would give them.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

POINTER_TYPES = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.uint8: "*u8",
                 torch.int8: "*i8", torch.int32: "*i32", torch.float32: "*fp32",
                 torch.float8_e4m3fn: "*fp8e4nv"}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
FORMAT_CODES = {"plain": 0, "fp8_e4m3": 1, "int8": 2, "int4": 3}
_SASS_LINE = re.compile(r"^\s+/\*[0-9a-f]{4,5}\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9_]+)")
_SASS_INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,6})\*/\s+(.*?);")
_BACK_BRANCH = re.compile(r"\bBRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)")


def compile_decode(fmt: str, dtype: torch.dtype, nheads: int, nheads_k: int, splits: int,
                   config, maxnreg: int = 0, outliers: int = 0,
                   outlier_dtype: torch.dtype = torch.float16, batch: int = 2,
                   length: int = 4096):
    """The compiled ``_paged_decode_kernel`` of a launch with these shapes (CPU tensors stand in:
    only shapes, strides and dtypes reach the specialization; ``batch`` 1 makes the integers
    equal to 1 constants, as the launch does)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import kvonce
    from kvonce.kernels import paged_decode as pd

    q = torch.zeros(batch, 1, nheads, 128, dtype=dtype)
    cache = torch.zeros(batch * length // 16, 16, nheads_k, 128, dtype=dtype)
    scale = None
    if fmt != "plain":
        cache, scale = kvonce.quantize_kv(cache, fmt)
    table = torch.zeros(batch, length // 16, dtype=torch.int32)
    values = (torch.zeros(*cache.shape[:3], outliers, dtype=outlier_dtype) if outliers
              else None)
    launch = pd.PagedDecodeLaunch(q, cache, cache, table, softmax_scale=0.1, causal=True,
                                  num_splits=splits, config=config, store_lse=False,
                                  kv_format=FORMAT_CODES[fmt],
                                  k_scale=None if fmt == "plain" else scale,
                                  v_scale=None if fmt == "plain" else scale,
                                  outlier_values=values)
    f32, i32 = torch.empty(1, dtype=torch.float32), torch.empty(1, dtype=torch.int32)
    # The pointers as PagedDecodeLaunch.__call__ passes them (their dtypes are part of the
    # signature): the float32 partials with splits, else the output itself (q's dtype) for the
    # partials, the LSE (store_lse off) and the arrival counts' place taken by cache_seqlens; a
    # plain cache's scales are cache_seqlens too.
    if fmt == "plain":
        scale = i32
    dst_o, dst_l, final_l, arrivals = (f32, f32, q, i32) if splits > 1 else (q, q, q, i32)
    tensors = [q, cache, cache, scale, scale, dst_o, dst_l, i32, table, q, final_l, arrivals,
               values if outliers else i32, i32]
    values = tensors + [launch._scale, *launch._ints]
    names = pd._paged_decode_kernel.arg_names
    signature, attrs, ones = {}, {}, {}
    for i, (name, value) in enumerate(zip(names, values)):
        if isinstance(value, int) and value == 1:  # a launch specializes integers equal to 1
            signature[name] = "constexpr"
            ones[name] = 1
        elif isinstance(value, torch.Tensor):
            signature[name] = POINTER_TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if value and value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    signature.update({name: "constexpr" for name in names[len(values):]})
    source = ASTSource(pd._paged_decode_kernel, signature=signature,
                       constexprs=dict(launch._constexprs) | ones, attrs=attrs)
    warps, stages = launch._warps
    options = {"num_warps": warps, "num_stages": stages}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def sass_loops(sass: str) -> list[tuple[int, int]]:
    """``(instructions, CTA barriers)`` of each loop body in the SASS, in address order: the
    span from a backward branch's target to the branch. For the decode kernel the first is the
    unmasked key-tile loop (one tile a trip, per warp), the second the masked one, the last
    the in-launch merge's."""
    instrs = [(int(m.group(1), 16), m.group(2)) for m in map(_SASS_INSTR.match, sass.splitlines())
              if m]
    index = {addr: i for i, (addr, _) in enumerate(instrs)}
    loops = []
    for i, (addr, text) in enumerate(instrs):
        m = _BACK_BRANCH.search(text)
        if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in index:
            body = [t for _, t in instrs[index[int(m.group(1), 16)]:i + 1]]
            loops.append((len(body), sum("BAR.SYNC" in t for t in body)))
    return loops


def stats(compiled, keep: Path | None, stem: str) -> dict:
    """Registers, spills, SASS count and mix, TTGIR shared-memory tiles of one compiled kernel."""
    from kernel_check import _REGS, _SPILLS, ptxas_and_sass

    ptxas, sass = ptxas_and_sass(compiled, stem, keep)
    regs = _REGS.search(ptxas.stderr)
    spills = _SPILLS.search(ptxas.stderr)
    ops = collections.Counter(m.group(1) for m in map(_SASS_LINE.match, sass.splitlines()) if m)
    tiles = collections.Counter(re.findall(r"memdesc<(?:\d+x)*\d+x(\w+), #shared",
                                           compiled.asm["ttgir"]))
    return {"regs": int(regs.group(1)) if regs else None,
            "spill": tuple(map(int, spills.groups())) if spills else None,
            "sass": sum(ops.values()), "ops": ops, "tiles": dict(tiles),
            # Triton's dynamic shared memory and any static (an inline PTX declaration's)
            "shared": compiled.metadata.shared + static_smem(ptxas.stderr),
            "loops": sass_loops(sass)}


def static_smem(ptxas_log: str) -> int:
    """Bytes of static shared memory ptxas -v reports (0 if none)."""
    m = re.search(r"(\d+) bytes smem", ptxas_log)
    return int(m.group(1)) if m else 0


def main() -> None:
    from kvonce.kernels.configs import get_paged_decode_config

    ap = argparse.ArgumentParser()
    ap.add_argument("--format", default="int4", choices=tuple(FORMAT_CODES))
    ap.add_argument("--dtype", default="fp16,bf16")
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--splits", type=int, default=3)
    ap.add_argument("--shape", default="2x4096", help="BATCHxLEN of the launch (the specialization"
                    " of integers equal to 1 follows the batch)")
    ap.add_argument("--config", default="", help="block_n,num_warps,num_stages")
    ap.add_argument("--maxnreg", type=int, default=-1,
                    help="cap the registers (ptxas; 0: none; default: the row's max_registers)")
    ap.add_argument("--swap-ab", action="store_true", help="PagedDecodeConfig.swap_ab")
    ap.add_argument("--no-f16-math", action="store_true",
                    help="PagedDecodeConfig.f16_math off (bf16 q x fp8: bf16 dots)")
    ap.add_argument("--v-pairs", action="store_true", help="PagedDecodeConfig.v_pairs")
    ap.add_argument("--no-v-pairs", action="store_true", help="PagedDecodeConfig.v_pairs off")
    ap.add_argument("--outliers", type=int, default=0,
                    help="dense-and-sparse keys: N fp16 outlier channels (KeyOutliers)")
    ap.add_argument("--prefetch-pages", action="store_true",
                    help="PagedDecodeConfig.prefetch_pages")
    ap.add_argument("--no-prefetch-pages", action="store_true",
                    help="PagedDecodeConfig.prefetch_pages off")
    ap.add_argument("--merge-at-once", type=int, default=0,
                    help="PagedDecodeConfig.merge_splits_at_once (0: the row's)")
    ap.add_argument("--head-pairs", action="store_true", help="PagedDecodeConfig.head_pairs")
    ap.add_argument("--int64-offsets", type=int, default=-1,
                    help="PagedDecodeConfig.int64_kv_offsets 0 / 1 (default: the row's)")
    ap.add_argument("--masked-stages", type=int, default=0,
                    help="paged_decode.MASKED_LOOP_STAGES (0: the launch's stages)")
    ap.add_argument("--keep", default="", help="write the PTX, TTGIR and SASS here")
    args = ap.parse_args()
    from kvonce.kernels import paged_decode
    paged_decode.MASKED_LOOP_STAGES = args.masked_stages
    nheads, nheads_k = (int(x) for x in args.heads.split("/"))
    keep = Path(args.keep) if args.keep else None
    print("| dtype | config | regs | spill st/ld B | SASS | loop instr / BAR a tile a warp "
          "(unmasked, masked) | shared B | smem tiles | top ops |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.dtype.split(","):
        dtype = DTYPES[name]
        # The shipped row (as a plan on the H100 would pick it), the interpreter switch aside.
        from kvonce.kernels import configs
        active, configs.interpreter_active = configs.interpreter_active, lambda: False
        try:
            config = get_paged_decode_config((9, 0), 128,
                                             None if args.format == "plain" else args.format, 2,
                                             bf16=dtype == torch.bfloat16)
        finally:
            configs.interpreter_active = active
        if args.config:
            bn, w, st = (int(x) for x in args.config.split(","))
            config = dataclasses.replace(config, block_n=bn, num_warps=w, num_stages=st)
        config = dataclasses.replace(config, swap_ab=args.swap_ab or config.swap_ab,
                                     f16_math=config.f16_math and not args.no_f16_math,
                                     v_pairs=(args.v_pairs or config.v_pairs)
                                     and not args.no_v_pairs,
                                     prefetch_pages=(args.prefetch_pages
                                                     or config.prefetch_pages)
                                     and not args.no_prefetch_pages,
                                     merge_splits_at_once=args.merge_at_once
                                     or config.merge_splits_at_once,
                                     head_pairs=args.head_pairs or config.head_pairs,
                                     int64_kv_offsets=config.int64_kv_offsets
                                     if args.int64_offsets < 0 else bool(args.int64_offsets))
        maxnreg = args.maxnreg
        if maxnreg < 0:  # the row's own cap (and the outlier launches')
            maxnreg = (config.outlier_max_registers if args.outliers
                       and config.outlier_max_registers else config.max_registers)
        batch, length = (int(x) for x in args.shape.split("x"))
        compiled = compile_decode(args.format, dtype, nheads, nheads_k, args.splits, config,
                                  maxnreg, args.outliers, batch=batch, length=length)
        s = stats(compiled, keep,
                  f"decode.{args.format}.{name}.{config.block_n}x{config.num_warps}w"
                  f"{config.num_stages}s")
        top = " ".join(f"{op} {n}" for op, n in s["ops"].most_common(7))
        top += f" HGMMA {s['ops'].get('HGMMA', 0)} HMMA {s['ops'].get('HMMA', 0)}"
        print(f"| {name} | ({config.block_n}, {config.num_warps}, {config.num_stages}) | "
              f"{s['regs']} | {s['spill']} | {s['sass']} | "
              f"{', '.join(f'{n} / {b}' for n, b in s['loops'][:2])} | {s['shared']} | "
              f"{s['tiles']} | {top} |",
              flush=True)


if __name__ == "__main__":
    main()
