"""``make kernel-check`` (scripts/kernel_check.py) for the Gluon paged decode
(``gluon_decode.py``): the variants compiled for sm_90a on the CPU. kernel_check's SASS counts are
wgmma's (this kernel runs mma.sync: all 0); its steady loops are inspected here instead:

    .venv/bin/python -m kvonce.kernels.gluon_decode_check [--only SUBSTRING] [--keep DIR]

compiles every variant (through kernel_check's ``check_spec``) and prints, per variant, the
registers, spills and shared memory, and for each consumer key-tile loop (a backward branch's
range holding HMMA; the out-of-line mbarrier retry blocks, which sit past EXIT, are not loops)
its instructions per tile per warp (NOPs not counted), HMMA, BAR.SYNC, LDSM, the fp8 converts
(F2FP.F16.E4M3) and MUFU.EX2. Each consumer warp runs the loop body once per 128-key tile. Also
the SASS's setmaxnreg immediates and highest register; a variant fails here on a spill inside a
tile loop (one outside them, a value kept across a loop, is reported) and, for the two-CTA ones
(``maxnreg`` = ``TWO_CTA_MAXNREG``), on launch registers over 128 or shared memory over half an
SM (kernel_check itself fails spills only inside wgmma loops, and this
kernel has none).
"""
from __future__ import annotations

import collections
import re

from triton.experimental.gluon import language as gl

from .gluon_decode import TWO_CTA_MAXNREG, _gluon_decode_kernel, box_rows, scale_pair_layout


def _check_signature(box: int, kv_dtype: str = "u8", q_dtype: str = "fp16",
                     out_dtype: str = "fp32", row: int = 128, scale_pair: int = 0) -> dict:
    gl_dtype = {"u8": gl.uint8, "fp16": gl.float16, "bf16": gl.bfloat16}[kv_dtype]
    kv = gl.NVMMASharedLayout.get_default_for([box, row], gl_dtype)
    q = "bf16" if kv_dtype == "bf16" else q_dtype
    scales = "*fp32"
    if scale_pair:   # the scales by TMA, a box's a row (int4: (scale, offset) pairs)
        scales = f"tensordesc<fp32[1, {int(scale_pair * box)}],{scale_pair_layout()!r}>"
    sig = dict(Q=f"*{q}", k_desc=f"tensordesc<{kv_dtype}[{box}, {row}],{kv!r}>",
               v_desc=f"tensordesc<{kv_dtype}[{box}, {row}],{kv!r}>", KS=scales, VS=scales,
               k_raw=f"*{kv_dtype}", v_raw=f"*{kv_dtype}",
               Out=f"*{out_dtype}", Lse="*fp32", cache_seqlens="*i32", block_table="*i32",
               sm_scale="fp32")
    sig.update({name: "i32" for name in (
        "q_len", "num_splits", "stride_qb", "stride_qt", "stride_qh", "stride_ksh",
        "stride_vsh", "stride_ob", "stride_ot", "stride_oh", "stride_os", "stride_lb",
        "stride_lt", "stride_lh", "stride_ls", "stride_btb", "stride_ksp", "stride_kst",
        "stride_vsp", "stride_vst")})
    for name in ("GROUP", "IS_CAUSAL", "PAGE_SIZE", "STAGES", "THREAD_ARRIVE", "RING_MERGE"):
        sig[name] = "constexpr"
    return sig


def _check_spec(variant, group, page_size, stages=4, causal=False, thread_arrive=True,
                ring_merge=False, ctas_per_sm=1, kv_dtype="u8", tile_keys=0, kv_format=1,
                q_dtype="fp16", direct_lse=None, scale_ring=False, v_biased=False,
                swap_ab=False, probe=0, loaders=1, head_major=False, f16_pairs=False,
                f16_scales=False, heads=1, cp_async=False, defer_sums=False, pdl_trigger=False,
                pdl_exit_wait=False):
    options = dict(num_warps=4)
    if ctas_per_sm == 2:
        options["maxnreg"] = TWO_CTA_MAXNREG
    tile = tile_keys or (128 if kv_dtype == "u8" else 64)
    constexprs = dict(GROUP=group, IS_CAUSAL=causal, PAGE_SIZE=page_size, STAGES=stages,
                      THREAD_ARRIVE=thread_arrive, RING_MERGE=ring_merge, LOADERS=loaders,
                      PROBE=probe, HEAD_MAJOR=head_major, HEADS=heads, CP_ASYNC=cp_async,
                      DEFER_SUMS=defer_sums, PDL_TRIGGER=pdl_trigger,
                      PDL_EXIT_WAIT=pdl_exit_wait)
    if tile_keys:
        constexprs["TILE_KEYS"] = tile_keys
    if kv_format != 1 or direct_lse is not None:
        constexprs.update(TILE_KEYS=tile_keys, KV_FORMAT=kv_format)
    out_dtype = "fp32"
    if direct_lse is not None or scale_ring or kv_format == 3:
        # one split: the final out (q's dtype) and LSE stored directly
        constexprs["STORE_LSE"] = True if direct_lse is None else direct_lse
        out_dtype = q_dtype if direct_lse is not None else "fp32"
    if v_biased:   # int8 V as 1152 + x, the bias off each tile's dot start
        constexprs.update(TILE_KEYS=tile_keys, KV_FORMAT=kv_format, V_BIASED=True)
    if swap_ab:    # keys as the dots' M, q rows as N
        constexprs.update(TILE_KEYS=tile_keys, KV_FORMAT=kv_format, SCALE_RING=scale_ring,
                          STORE_LSE=True if direct_lse is None else direct_lse, SWAP_AB=True)
    if probe:      # the roofline probe (memory only 1, math only 2, no scales 3 / 4)
        constexprs.update(TILE_KEYS=tile_keys, KV_FORMAT=kv_format, PROBE=probe)
    if head_major:     # pages stored [num_pages, nheads_k, page_size, row]
        constexprs.update(TILE_KEYS=tile_keys, KV_FORMAT=kv_format, HEAD_MAJOR=True)
    if loaders != 1:   # loader warps, each its share of a tile's boxes
        constexprs.update(TILE_KEYS=tile_keys, KV_FORMAT=kv_format)
    box = min(box_rows(page_size), tile)
    if heads > 1:      # KV head groups: GROUP the group's q heads, a box a page of the group
        constexprs.update(TILE_KEYS=tile_keys, KV_FORMAT=kv_format, HEADS=heads,
                          GROUP=group * heads)
        box = heads * page_size
    scale_pair = 0
    if scale_ring or kv_format == 3:   # the scales by ring (int4's always)
        constexprs["SCALE_RING"] = True
        # int4's float32 (scale, offset) pairs two 32-bit units a key; fp16 pairs (f16_pairs,
        # quantize_kv's default) one
        scale_pair = 2 if kv_format == 3 and not f16_pairs else 1
        if f16_scales:   # int8's fp16 scales: two keys a 32-bit unit
            scale_pair = 0.5
    return (variant, _gluon_decode_kernel,
            _check_signature(box, kv_dtype, q_dtype, out_dtype, 64 if kv_format == 3 else 128,
                             scale_pair),
            constexprs, options,
            dict(HGMMA=0))


GLUON_CHECK_SPECS = [
    # One CTA an SM (the launch's .maxnreg 256; Triton's reduce scratch for the merge).
    _check_spec("fp8-page16-gqa4-4stages", 4, 16),
    _check_spec("fp8-page16-gqa4-3stages", 4, 16, stages=3),
    _check_spec("fp8-page16-mha-4stages", 1, 16),
    _check_spec("fp8-page16-mha-3stages", 1, 16, stages=3),
    _check_spec("fp8-page64-gqa4-4stages", 4, 64),
    _check_spec("fp8-page64-mha-3stages", 1, 64, stages=3),
    _check_spec("fp8-page16-gqa4-causal-4stages", 4, 16, causal=True),
    _check_spec("fp8-page16-gqa4-4stages-elected-arrive", 4, 16, thread_arrive=False),
    _check_spec("fp8-page16-gqa4-4stages-ring-merge", 4, 16, ring_merge=True),
    # Two CTAs an SM: .maxnreg 128 (consumers setmaxnreg 232), the merge through the K ring.
    _check_spec("fp8-page16-gqa4-3stages-2cta", 4, 16, stages=3, ring_merge=True, ctas_per_sm=2),
    _check_spec("fp8-page16-gqa4-2stages-2cta", 4, 16, stages=2, ring_merge=True, ctas_per_sm=2),
    _check_spec("fp8-page16-mha-3stages-2cta", 1, 16, stages=3, ring_merge=True, ctas_per_sm=2),
    _check_spec("fp8-page16-mha-2stages-2cta", 1, 16, stages=2, ring_merge=True, ctas_per_sm=2),
    _check_spec("fp8-page64-gqa4-3stages-2cta", 4, 64, stages=3, ring_merge=True, ctas_per_sm=2),
    _check_spec("fp8-page16-gqa4-causal-3stages-2cta", 4, 16, stages=3, causal=True,
                ring_merge=True, ctas_per_sm=2),
    # int8 (per-key scales, loaded by the consumers a tile at a time), the plan's 2-CTA form.
    _check_spec("int8-page16-gqa4-2stages-2cta", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, kv_format=2),
    _check_spec("int8-page16-mha-2stages-2cta", 1, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, kv_format=2),
    _check_spec("int8-page64-gqa4-causal-2stages-2cta", 4, 64, stages=2, causal=True,
                ring_merge=True, ctas_per_sm=2, kv_format=2),
    # bf16 q (rows scaled into fp16 once a CTA), fp8 and int8.
    _check_spec("fp8-bf16q-page16-gqa4-2stages-2cta", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, q_dtype="bf16"),
    _check_spec("int8-bf16q-page16-mha-causal-2stages-2cta", 1, 16, stages=2, causal=True,
                ring_merge=True, ctas_per_sm=2, kv_format=2, q_dtype="bf16"),
    # One split: out (fp16 / bf16) and LSE stored by the kernel, no combine.
    _check_spec("fp8-page16-gqa4-2stages-2cta-direct", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, direct_lse=True),
    _check_spec("fp8-bf16q-page16-mha-2stages-2cta-direct-nolse", 1, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, q_dtype="bf16", direct_lse=False),
    _check_spec("fp8-page16-mha-3stages-2cta-direct", 1, 16, stages=3, ring_merge=True,
                ctas_per_sm=2, direct_lse=True),
    _check_spec("int8-page16-gqa4-2stages-2cta-direct", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, kv_format=2, direct_lse=True),
    # int8 with its scales by TMA (head-major scale runs, INT8_SCALES_BY_TMA: the plan's).
    _check_spec("int8-ring-page16-gqa4-2stages-2cta", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, kv_format=2, scale_ring=True),
    _check_spec("int8-ring-bf16q-page64-mha-causal-2stages-2cta-direct", 1, 64, stages=2,
                causal=True, ring_merge=True, ctas_per_sm=2, kv_format=2, q_dtype="bf16",
                direct_lse=True, scale_ring=True),
    # int8 V biased (INT8_V_BIASED: correct on the H200, measured even, off).
    _check_spec("int8-vbias-ring-page16-gqa4-2stages-2cta", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, kv_format=2, scale_ring=True, v_biased=True),
    _check_spec("int8-vbias-ring-bf16q-page64-mha-causal-2stages-2cta-direct", 1, 64, stages=2,
                causal=True, ring_merge=True, ctas_per_sm=2, kv_format=2, q_dtype="bf16",
                direct_lse=True, scale_ring=True, v_biased=True),
    # Swapped operands (SWAP_AB; GLUON_SWAP_FORMATS: int4's routed, fp8's / int8's correct and
    # 1-2% slower on the H200).
    _check_spec("fp8-swap-page16-gqa4-2stages-2cta", 4, 16, stages=2, ctas_per_sm=2,
                swap_ab=True),
    _check_spec("int8-swap-vbias-ring-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ctas_per_sm=2, kv_format=2, scale_ring=True, v_biased=True, swap_ab=True),
    _check_spec("int8-swap-ring-bf16q-page16-mha-causal-2stages-2cta", 1, 16, stages=2,
                causal=True, ctas_per_sm=2, kv_format=2, q_dtype="bf16", scale_ring=True,
                swap_ab=True),
    _check_spec("int4-swap-page16-gqa4-4stages-2cta", 4, 16, stages=4, ctas_per_sm=2,
                kv_format=3, swap_ab=True),
    _check_spec("int4-swap-bf16q-page64-mha-causal-4stages-2cta-direct", 1, 64, stages=4,
                causal=True, ctas_per_sm=2, kv_format=3, q_dtype="bf16", direct_lse=True,
                swap_ab=True),
    # int4's fp16 (scale, offset) pairs (one 32-bit unit a key; quantize_kv's default), page 16
    # (64-byte scale boxes, padded rows) and 64, row-major and swapped consumers.
    _check_spec("int4f16-swap-hnd-page16-gqa4-4stages-2cta", 4, 16, stages=4, ctas_per_sm=2,
                kv_format=3, swap_ab=True, head_major=True, f16_pairs=True),
    _check_spec("int4f16-swap-bf16q-page64-mha-causal-4stages-2cta-direct", 1, 64, stages=4,
                causal=True, ctas_per_sm=2, kv_format=3, q_dtype="bf16", direct_lse=True,
                swap_ab=True, f16_pairs=True),
    _check_spec("int4f16-page16-gqa4-4stages-2cta", 4, 16, stages=4, ctas_per_sm=2,
                kv_format=3, f16_pairs=True),
    # int8's fp16 scales by ring (INT8_FP16_SCALE_RING: two keys a 32-bit unit; page 16: 32-byte
    # boxes, each heading a 128-byte ring row), row-major and swapped consumers.
    _check_spec("int8f16-ring-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, kv_format=2, scale_ring=True, head_major=True,
                f16_scales=True),
    _check_spec("int8f16-ring-bf16q-page32-mha-causal-2stages-2cta", 1, 32, stages=2,
                causal=True, ring_merge=True, ctas_per_sm=2, kv_format=2, q_dtype="bf16",
                scale_ring=True, f16_scales=True),
    _check_spec("int8f16-ring-page256-gqa4-2stages-2cta", 4, 256, stages=2,
                ring_merge=True, ctas_per_sm=2, kv_format=2, scale_ring=True, f16_scales=True),
    _check_spec("int8f16-swap-ring-page16-gqa4-2stages-2cta", 4, 16, stages=2, ctas_per_sm=2,
                kv_format=2, scale_ring=True, swap_ab=True, f16_scales=True),
    # int4 V biased (INT4_V_BIASED: one lop3 a V register, the bias off the dots' start).
    _check_spec("int4f16-swap-vbias-hnd-page16-gqa4-4stages-2cta", 4, 16, stages=4,
                ctas_per_sm=2, kv_format=3, swap_ab=True, head_major=True, f16_pairs=True,
                v_biased=True),
    # the shipped int4 and int8 routes: four loader warps (GLUON_LOADERS)
    _check_spec("int4f16-swap-vbias-4loaders-page16-mha-causal-4stages-2cta", 1, 16, stages=4,
                causal=True, ctas_per_sm=2, kv_format=3, swap_ab=True, f16_pairs=True,
                v_biased=True, loaders=4),
    _check_spec("int4f16-swap-vbias-4loaders-hnd-page16-gqa4-4stages-2cta", 4, 16, stages=4,
                ctas_per_sm=2, kv_format=3, swap_ab=True, head_major=True, f16_pairs=True,
                v_biased=True, loaders=4),
    _check_spec("probe-memory-int4f16-swap-4loaders-hnd-page16-gqa4-4stages-2cta", 4, 16,
                stages=4, ctas_per_sm=2, kv_format=3, swap_ab=True, head_major=True,
                f16_pairs=True, v_biased=True, probe=1, loaders=4),
    _check_spec("int8f16-ring-4loaders-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, kv_format=2, scale_ring=True, head_major=True,
                f16_scales=True, loaders=4),
    # the plan's fp8 / int8 split launches with the combine's early trigger (COMBINE_PDL)
    _check_spec("pdl-int8f16-ring-4loaders-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, kv_format=2, scale_ring=True, head_major=True,
                f16_scales=True, loaders=4, pdl_trigger=True),
    _check_spec("pdl-fp8-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, head_major=True, pdl_trigger=True),
    # a batch cut's tail (kvonce.paged.batch_cut: a programmatic dependent of the head, each
    # CTA waiting for the head's end before it exits) and its head (one split, the trigger)
    _check_spec("cuttail-pdl-fp8-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, head_major=True, pdl_trigger=True,
                pdl_exit_wait=True),
    _check_spec("cuttail-pdl-int8f16-ring-4loaders-hnd-page16-gqa4-2stages-2cta", 4, 16,
                stages=2, ring_merge=True, ctas_per_sm=2, kv_format=2, scale_ring=True,
                head_major=True, f16_scales=True, loaders=4, pdl_trigger=True,
                pdl_exit_wait=True),
    _check_spec("cuthead-pdl-fp8-hnd-page16-gqa4-2stages-2cta-direct", 4, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, head_major=True, direct_lse=True,
                pdl_trigger=True),
    # the short launches' one-CTA-an-SM variant (gluon_decode.GLUON_ONE_CTA_VARIANT): four
    # stages, the merge through its own scratch
    _check_spec("onecta-pdl-int8f16-ring-4loaders-hnd-page16-gqa4-4stages", 4, 16, stages=4,
                ctas_per_sm=1, kv_format=2, scale_ring=True, head_major=True, f16_scales=True,
                loaders=4, pdl_trigger=True),
    _check_spec("onecta-pdl-fp8-hnd-page16-gqa4-4stages", 4, 16, stages=4, ctas_per_sm=1,
                head_major=True, pdl_trigger=True),
    _check_spec("onecta-pdl-fp8-hnd-page16-mha-3stages", 1, 16, stages=3, ctas_per_sm=1,
                head_major=True, pdl_trigger=True),
    _check_spec("int4f16-swap-vbias-bf16q-page64-mha-causal-4stages-2cta-direct", 1, 64,
                stages=4, causal=True, ctas_per_sm=2, kv_format=3, q_dtype="bf16",
                direct_lse=True, swap_ab=True, f16_pairs=True, v_biased=True),
    _check_spec("int4f16-swap-t256-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ctas_per_sm=2, kv_format=3, swap_ab=True, tile_keys=256, head_major=True,
                f16_pairs=True),
    # Head-major pages (a page's keys of one KV head contiguous: one box a page and head).
    _check_spec("int4-swap-hnd-page16-gqa4-4stages-2cta", 4, 16, stages=4, ctas_per_sm=2,
                kv_format=3, swap_ab=True, head_major=True),
    _check_spec("fp8-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, head_major=True),
    _check_spec("int8-ring-hnd-page64-mha-causal-2stages-2cta", 1, 64, stages=2, causal=True,
                ring_merge=True, ctas_per_sm=2, kv_format=2, scale_ring=True, head_major=True),
    # Four loader warps, each a quarter of a tile's boxes, on other launch shapes.
    _check_spec("int4-swap-4loaders-page16-gqa4-4stages-2cta", 4, 16, stages=4, ctas_per_sm=2,
                kv_format=3, swap_ab=True, loaders=4),
    _check_spec("fp8-4loaders-page16-gqa4-2stages-2cta", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, loaders=4),
    _check_spec("int8-ring-4loaders-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, kv_format=2, scale_ring=True, loaders=4),
    _check_spec("int4-swap-4loaders-page16-gqa4-6stages-2cta", 4, 16, stages=6, ctas_per_sm=2,
                kv_format=3, swap_ab=True, loaders=4),
    _check_spec("int4-swap-4loaders-page256-gqa4-4stages-2cta", 4, 256, stages=4,
                ctas_per_sm=2, kv_format=3, swap_ab=True, loaders=4),
    # The roofline probe (ROOFLINE_PROBE: memory only, math only) on the shipped routes.
    _check_spec("probe-memory-int4-swap-page16-gqa4-4stages-2cta", 4, 16, stages=4,
                ctas_per_sm=2, kv_format=3, swap_ab=True, probe=1),
    _check_spec("probe-math-int4-swap-page16-gqa4-4stages-2cta", 4, 16, stages=4,
                ctas_per_sm=2, kv_format=3, swap_ab=True, probe=2),
    _check_spec("probe-memory-fp8-page16-gqa4-2stages-2cta", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, probe=1),
    _check_spec("probe-math-int8-ring-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, kv_format=2, scale_ring=True, probe=2),
    # ... and without the scales' copies (3: the kernel, 4: memory only).
    _check_spec("probe-noscales-int4-swap-hnd-page16-gqa4-4stages-2cta", 4, 16, stages=4,
                ctas_per_sm=2, kv_format=3, swap_ab=True, probe=3, head_major=True),
    _check_spec("probe-memory-noscales-int8-ring-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, kv_format=2, scale_ring=True, probe=4),
    # int4 swapped in 256-key tiles, two 32 KB stages (INT4_SWAPPED_TILE_KEYS: correct on the
    # H200, even with 128-key tiles at two stages; off).
    _check_spec("int4-swap-t256-page16-gqa4-2stages-2cta", 4, 16, stages=2, ctas_per_sm=2,
                kv_format=3, swap_ab=True, tile_keys=256),
    _check_spec("int4-swap-t256-page16-gqa4-3stages-2cta", 4, 16, stages=3, ctas_per_sm=2,
                kv_format=3, swap_ab=True, tile_keys=256),
    _check_spec("int4-swap-t256-bf16q-page256-mha-causal-2stages-2cta-direct", 1, 256,
                stages=2, causal=True, ctas_per_sm=2, kv_format=3, q_dtype="bf16",
                direct_lse=True, swap_ab=True, tile_keys=256),
    # int4 (64-byte rows, per-key (scale, offset) pairs by TMA; four 16 KB stages, the merge
    # through the reduce scratch): correct on the H200, 9-13% slower than the Triton row.
    _check_spec("int4-page16-gqa4-4stages-2cta", 4, 16, stages=4, ctas_per_sm=2, kv_format=3),
    _check_spec("int4-bf16q-page64-mha-causal-4stages-2cta-direct", 1, 64, stages=4,
                causal=True, ctas_per_sm=2, kv_format=3, q_dtype="bf16", direct_lse=True),
    # The 2-CTA registers with the reduce-scratch merge: 114812 B, 1.8 KB under half an SM with
    # the 1 KB reserve counted once (the occupancy API on the GPU decides).
    _check_spec("fp8-page16-gqa4-3stages-2cta-scratch-merge", 4, 16, stages=3, ctas_per_sm=2),
    # 16-bit caches (64-key tiles, 16 KB a slot; the merge through the reduce scratch).
    _check_spec("fp16-page16-gqa6-3stages-2cta", 6, 16, stages=3, ctas_per_sm=2,
                kv_dtype="fp16"),
    _check_spec("bf16-page16-mha-3stages-2cta", 1, 16, stages=3, ctas_per_sm=2,
                kv_dtype="bf16"),
    _check_spec("fp16-page256-gqa4-causal-4stages", 4, 256, causal=True, kv_dtype="fp16"),
    # KV head groups (HEADS: a CTA takes a group of KV heads, a TMA box a whole page of them;
    # GLUON_KV_HEAD_GROUPS), head-major pages, swapped consumers, each format.
    _check_spec("heads2-fp8-swap-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2, ctas_per_sm=2,
                swap_ab=True, head_major=True, heads=2),
    _check_spec("heads4-fp8-swap-bf16q-hnd-page16-mha-causal-2stages-2cta", 1, 16, stages=2,
                ctas_per_sm=2, swap_ab=True, head_major=True, heads=4, causal=True,
                q_dtype="bf16"),
    _check_spec("heads2-int8f16-swap-ring-4loaders-hnd-page16-gqa4-2stages-2cta", 4, 16,
                stages=2, ctas_per_sm=2, kv_format=2, scale_ring=True, swap_ab=True,
                head_major=True, f16_scales=True, loaders=4, heads=2),
    _check_spec("heads4-int8f16-swap-ring-4loaders-hnd-page16-mha-2stages-2cta", 1, 16,
                stages=2, ctas_per_sm=2, kv_format=2, scale_ring=True, swap_ab=True,
                head_major=True, f16_scales=True, loaders=4, heads=4),
    _check_spec("heads2-int4f16-swap-vbias-4loaders-hnd-page16-gqa4-4stages-2cta", 4, 16,
                stages=4, ctas_per_sm=2, kv_format=3, swap_ab=True, head_major=True,
                f16_pairs=True, v_biased=True, loaders=4, heads=2),
    _check_spec("heads4-int4f16-swap-vbias-4loaders-hnd-page16-mha-causal-4stages-2cta", 1, 16,
                stages=4, causal=True, ctas_per_sm=2, kv_format=3, swap_ab=True,
                head_major=True, f16_pairs=True, v_biased=True, loaders=4, heads=4),
    _check_spec("heads2-int4f16-swap-vbias-4loaders-hnd-page32-gqa4-4stages-2cta", 4, 32,
                stages=4, ctas_per_sm=2, kv_format=3, swap_ab=True, head_major=True,
                f16_pairs=True, v_biased=True, loaders=4, heads=2),
    _check_spec("probe-memory-heads2-fp8-swap-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ctas_per_sm=2, swap_ab=True, head_major=True, heads=2, probe=1),
    # cp.async loader warps (CP_ASYNC: 16 bytes a thread, no TMA), fp8.
    _check_spec("cpasync-fp8-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2, ring_merge=True,
                ctas_per_sm=2, head_major=True, cp_async=True),
    _check_spec("cpasync-4loaders-fp8-page16-mha-2stages-2cta", 1, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, loaders=4, cp_async=True),
    _check_spec("probe-memory-cpasync-fp8-hnd-page16-gqa4-2stages-2cta", 4, 16, stages=2,
                ring_merge=True, ctas_per_sm=2, head_major=True, cp_async=True, probe=1),
    # int4's rows' sums kept a thread's part a tile, the lanes' added once (DEFER_SUMS).
    _check_spec("defer-int4f16-swap-vbias-4loaders-hnd-page16-gqa4-4stages-2cta", 4, 16,
                stages=4, ctas_per_sm=2, kv_format=3, swap_ab=True, head_major=True,
                f16_pairs=True, v_biased=True, loaders=4, defer_sums=True),
    _check_spec("defer-int4f16-swap-vbias-4loaders-bf16q-page16-mha-causal-4stages-2cta", 1, 16,
                stages=4, causal=True, ctas_per_sm=2, kv_format=3, swap_ab=True,
                f16_pairs=True, v_biased=True, loaders=4, q_dtype="bf16", defer_sums=True),
]

SM_SMEM = 233472           # H100: shared memory an SM (228 KB)
CTA_RESERVED_SMEM = 1024   # reserved a CTA (cuobjdump -res-usage: SHARED:1024 static)


def two_cta_problems(options: dict, registers: int, shared: int) -> list[str]:
    """What keeps a ``maxnreg`` = ``TWO_CTA_MAXNREG`` variant from two CTAs an SM."""
    if options.get("maxnreg") != TWO_CTA_MAXNREG:
        return []
    problems = []
    if registers > TWO_CTA_MAXNREG:
        problems.append(f"launch registers {registers} > {TWO_CTA_MAXNREG}")
    if 2 * (shared + CTA_RESERVED_SMEM) > SM_SMEM:
        problems.append(f"2 x ({shared} + {CTA_RESERVED_SMEM}) B shared > {SM_SMEM}")
    return problems


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_SETMAXREG = re.compile(r"USETMAXREG\.(\w+)\S*\s+(?:UP\d+,\s*)?(0x[0-9a-f]+)")
_REG = re.compile(r"\bR(\d+)\b")


def register_summary(sass: str) -> str:
    """The setmaxnreg immediates (``dealloc`` / ``alloc`` register counts) and the highest
    register index the SASS names (+ 1: the registers the widest partition really uses)."""
    sets = sorted({(kind.split(".")[0].lower(), int(n, 16))
                   for kind, n in _SETMAXREG.findall(sass)})
    used = max((int(r) for r in _REG.findall(sass)), default=-1) + 1
    return (", ".join(f"{kind} {n}" for kind, n in sets) or "no setmaxnreg") + \
        f"; R0-R{used - 1} used"

_BRANCH_TARGET = re.compile(r"\bBRA\b.*0x([0-9a-f]+)\s*$")
_PRED = re.compile(r"^@!?U?P\w+\s+")


def _opcode(op: str) -> str:
    op = _PRED.sub("", op)
    return op.split()[0] if op else op


def tile_loops(sass: str) -> list[dict]:
    """The HMMA loops of ``cuobjdump -sass`` text (the consumers' key-tile loops): per loop its
    address range, instruction count without NOPs, and opcode counts."""
    code = [(int(m.group(1), 16), m.group(2).strip()) for m in _SASS_LINE.finditer(sass)]
    loops = []
    for addr, op in code:
        m = _BRANCH_TARGET.search(op)
        if not (m and int(m.group(1), 16) < addr):
            continue
        lo = int(m.group(1), 16)
        body = [_opcode(o) for a, o in code if lo <= a <= addr]
        if "EXIT" in body or not any(o.startswith("HMMA") for o in body):
            continue
        counts = collections.Counter(body)
        loops.append(dict(range=f"{lo:#06x}-{addr:#06x}",
                          instructions=sum(n for o, n in counts.items() if o != "NOP"),
                          counts=counts))
    return loops


def _sum(counts, prefix: str) -> int:
    return sum(n for o, n in counts.items() if o.startswith(prefix))


def loop_summary(loop: dict) -> str:
    c = loop["counts"]
    return (f"{loop['range']}: {loop['instructions']} instr/tile/warp, HMMA {_sum(c, 'HMMA')}, "
            f"BAR.SYNC {_sum(c, 'BAR.SYNC')}, LDSM {_sum(c, 'LDSM')}, "
            f"F2FP.E4M3 {_sum(c, 'F2FP.F16.E4M3')}, MUFU.EX2 {_sum(c, 'MUFU.EX2')}, "
            f"SHFL {_sum(c, 'SHFL')}, STS {_sum(c, 'STS')}, LDS {_sum(c, 'LDS.')}")


def main(argv=None) -> int:
    import argparse
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    import kernel_check

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only")
    parser.add_argument("--keep", type=Path)
    args = parser.parse_args(argv)
    keep = args.keep or Path(tempfile.mkdtemp(prefix="gluon_decode_check."))
    failed = 0
    for variant, kernel, sig, constexprs, options, expected in GLUON_CHECK_SPECS:
        if args.only and args.only not in variant:
            continue
        row = kernel_check.check_spec("gluon_decode_check", variant, kernel, sig, constexprs,
                                      options, expected, keep)
        sass = keep / f"gluon_decode_check.{kernel.__name__}.{variant}.sass"
        text = sass.read_text() if sass.exists() else ""
        loops = tile_loops(text)
        # Spills fail inside the key-tile loops (every tile pays them); outside (values kept
        # across a loop, stored once and loaded once a CTA) they are reported only.
        loop_spills = sum(_sum(lp["counts"], "STL") + _sum(lp["counts"], "LDL") for lp in loops)
        problems = list(row.problems)
        if row.spill_bytes and (loop_spills or not text) and not row.problems:
            problems.append(f"{row.spill_bytes} bytes spilled, {loop_spills} spill "
                            "instructions in the tile loops")
        if row.registers:
            problems += two_cta_problems(options, row.registers, row.shared)
        outside = " (outside the tile loops)" if row.spill_bytes and not loop_spills else ""
        print(f"{variant}: launch regs {row.registers} (maxnreg {options.get('maxnreg', '-')})"
              f", spill B {row.spill_bytes}{outside}, smem B {row.shared}, {row.seconds:.1f} s"
              + ("" if not problems else "  FAIL: " + "; ".join(problems)))
        failed += bool(problems)
        if text:
            print("    setmaxnreg: " + register_summary(text))
            for loop in loops:
                print("    loop " + loop_summary(loop))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
