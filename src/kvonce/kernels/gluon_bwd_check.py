"""``make kernel-check`` (scripts/kernel_check.py) for the Gluon backward (``gluon_bwd.py``): the
variants compiled for sm_90a on the CPU, with the SASS counts each must show."""
from __future__ import annotations

import dataclasses

from triton.experimental.gluon import language as gl

from .gluon_bwd import _gluon_bwd_kernel
from .gluon_bwd_sched import DEFAULT_SCHEDULE, ORDERS, TUNED_SCHEDULE, VARIANTS, GluonBwdSchedule


def _check_signature(dtype: str, head_dim: int, dkv: str, kv_end_scalar: bool) -> dict:
    gl_dtype = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    tile = gl.NVMMASharedLayout.get_default_for([64, head_dim], gl_dtype)
    dq = gl.NVMMASharedLayout.get_default_for([64, head_dim], gl.float32)
    desc = f"tensordesc<{dtype}[64, {head_dim}],{tile!r}>"
    kv = gl.NVMMASharedLayout.get_default_for([128, head_dim], gl_dtype)
    kv_desc = f"tensordesc<{dtype}[128, {head_dim}],{kv!r}>"
    dq_desc = f"tensordesc<fp32[64, {head_dim}],{dq!r}>"
    end = "i32" if kv_end_scalar else "*i32"
    sig = {name: desc for name in ("q0_desc", "q1_desc", "do0_desc", "do1_desc")}
    sig.update(k_desc=kv_desc, v_desc=kv_desc)
    init = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    sig.update(dqa_desc=dq_desc, dqa_row1="i32", init_desc=f"tensordesc<fp32[1, 64],{init!r}>",
               DK=f"*{dkv}", DV=f"*{dkv}",
               cu_seqlens_q0="*i32", cu_seqlens_q1="*i32", cu_seqlens_k="*i32", kv_end0=end,
               kv_end1=end, sm_scale="fp32")
    sig.update({name: "i32" for name in ("stride_dkn", "stride_dkh",
                                         "stride_dvn", "stride_dvh", "kv_group",
                                         "n_blocks", "batch")})
    sig.update(Work="*i32")
    sig.update({name: "i32" for name in ("n_chunks", "rank_rows", "chunk_blocks",
                                         "n_segments")})
    for name in ("HEAD_DIM", "IS_CAUSAL", "KV_END_SCALAR", "ORDER", "ROTATE", "QDO_STAGES",
                 "DQ_STAGES", "KV_ZIGZAG", "LOCAL_ORDER"):
        sig[name] = "constexpr"
    return sig


def _check_spec(variant, dtype, head_dim, causal, dkv="fp32", kv_end_scalar=False,
                sched=DEFAULT_SCHEDULE, zigzag=False, local_order=False):
    # Per step and warpgroup: Sᵀ and dPᵀ D/16 m64n64k16 each, dV and dK 4 m64nDk16 each (K = 64
    # rows), dQ 8 m64n(D/2)k16 (K = 128 keys); one reduce-add instruction; setmaxnreg in the
    # 12-warp prologue and each partition (triton 3.6's AllocateWarpGroups).
    hgmma = 2 * (head_dim // 16) + 2 * 4 + 8
    return (variant, _gluon_bwd_kernel, _check_signature(dtype, head_dim, dkv, kv_end_scalar),
            dict(HEAD_DIM=head_dim, IS_CAUSAL=causal, KV_END_SCALAR=kv_end_scalar,
                 ORDER=ORDERS[sched.order], ROTATE=sched.rotate_heads,
                 QDO_STAGES=sched.qdo_stages, DQ_STAGES=sched.dq_stages, KV_ZIGZAG=zigzag,
                 LOCAL_ORDER=local_order),
            dict(num_warps=8), dict(HGMMA=hgmma, UTMAREDG=1, USETMAXREG=10))


GLUON_CHECK_SPECS = [
    _check_spec("d128-bf16-causal", "bf16", 128, True),
    _check_spec("d128-fp16-noncausal-scalar-end", "fp16", 128, False, dkv="fp16",
                kv_end_scalar=True),
    _check_spec("d64-bf16-causal", "bf16", 64, True, dkv="bf16"),
] + [  # the schedules scripts/gluon_bwd_sweep.py times, one per compiled kernel (fuse_prep
    #       and the default change no Gluon code)
    _check_spec(f"d128-bf16-causal-{name}", "bf16", 128, True, sched=sched)
    for sched, name in {dataclasses.replace(sched, fuse_prep=False): name.removesuffix("-fuse")
                        for name, sched in reversed(VARIANTS.items())}.items()
    if sched != DEFAULT_SCHEDULE
] + [
    _check_spec("d128-fp16-noncausal-scalar-end-lpt-rot-dq2", "fp16", 128, False, dkv="fp16",
                kv_end_scalar=True,
                sched=GluonBwdSchedule(order="lpt", rotate_heads=True, dq_stages=2)),
    _check_spec("d64-bf16-causal-l2-qdo3", "bf16", 64, True, dkv="bf16",
                sched=GluonBwdSchedule(order="l2", qdo_stages=3)),
] + [  # the context-parallel path: the zigzag all-gather buffer, both groups in local order,
    #     chunk-count kv_end ints (zigzag/cp.py, fused.py), the schedule varlen.py runs
    _check_spec("d128-bf16-causal-zigzag-local-l2-rot", "bf16", 128, True, kv_end_scalar=True,
                sched=TUNED_SCHEDULE, zigzag=True, local_order=True),
    _check_spec("d64-bf16-causal-zigzag-local-l2-rot", "bf16", 64, True, kv_end_scalar=True,
                sched=TUNED_SCHEDULE, zigzag=True, local_order=True),
    _check_spec("d128-fp16-causal-zigzag-local-lpt-rot-qdo3", "fp16", 128, True,
                kv_end_scalar=True, zigzag=True, local_order=True,
                sched=GluonBwdSchedule(order="lpt", rotate_heads=True, qdo_stages=3)),
    _check_spec("d128-bf16-causal-zigzag-local", "bf16", 128, True, kv_end_scalar=True,
                zigzag=True, local_order=True),
    # the zigzag buffer with per-sequence key-count ends and two group tensors, and the local
    # order on contiguous K/V (launch_dual_group_bwd takes either flag alone)
    _check_spec("d128-bf16-causal-zigzag-l2-rot", "bf16", 128, True, sched=TUNED_SCHEDULE,
                zigzag=True),
    _check_spec("d128-bf16-noncausal-local-l2-rot", "bf16", 128, False, kv_end_scalar=True,
                sched=TUNED_SCHEDULE, local_order=True),
]
