"""Dual-group varlen attention: validation, allocation, launch.

``fused_zigzag_llama3_flash_attn_varlen_forward`` computes two varlen attentions that share one
K/V in a single launch: every K/V tile is read from memory once and applied to both query groups.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from . import _validate as V
from ._dispatch import use_op
from .kernels.configs import (DualGroupBwdConfig, DualGroupFwdConfig, device_info,
                              get_dual_group_bwd_config, get_dual_group_fwd_config,
                              interpreter_active, op_fields)
from .kernels.dual_group_bwd import launch_dual_group_bwd
from .kernels.dual_group_fwd import launch_dual_group_fwd

__all__ = ["fused_zigzag_llama3_flash_attn_varlen_forward",
           "fused_zigzag_llama3_flash_attn_varlen_backward",
           "fused_zigzag_llama3_flash_attn_varlen_func", "dual_group_forward_into"]


def _capability(device: torch.device):
    return device_info(device)[0]


def _per_sequence(x, batch: int, device: torch.device) -> torch.Tensor:
    """An int (same for all sequences) or an int32 tensor [batch] -> int32 tensor [batch].
    ``torch.full`` on the device is a fill kernel, not a host sync."""
    if isinstance(x, int):
        return torch.full((batch,), x, dtype=torch.int32, device=device)
    return x


def _tensor_or_none(x):
    """A per-sequence ``max_kv_len`` tensor, or None for an int (``use_op`` skips None)."""
    return None if isinstance(x, int) else x


# Call signatures whose checks passed (shapes, strides, dtypes, devices, ints: never values):
# a repeat skips the checks (docs/notes.md).
_passed_checks = V.PassedChecks()


def validate_dual_group_inputs(q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
                               max_kv_len_q0, max_kv_len_q1) -> int:
    """All checks of the public entry point; returns batch. Raises before any launch."""
    for name, t in (("q0", q0), ("q1", q1), ("k", k), ("v", v)):
        V.check_tensor(name, t, ndim=3, dtypes=V.ATTN_DTYPES)
    device = V.check_same_device(q0=q0, q1=q1, k=k, v=v, cu_seqlens_q0=cu_seqlens_q0,
                                 cu_seqlens_q1=cu_seqlens_q1, cu_seqlens_k=cu_seqlens_k)
    V.check_same_dtype(q0=q0, q1=q1, k=k, v=v)
    batch = V.check_cu_seqlens("cu_seqlens_q0", cu_seqlens_q0)
    V.check_cu_seqlens("cu_seqlens_q1", cu_seqlens_q1, batch)
    V.check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, batch)
    if q1.shape[1:] != q0.shape[1:]:
        raise ValueError(f"q1 must have q0's [nheads, headdim] = {tuple(q0.shape[1:])}, "
                         f"got {tuple(q1.shape[1:])}")
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[2] != q0.shape[2]:
        raise ValueError(f"head dim mismatch: q0 has {q0.shape[2]}, k has {k.shape[2]}")
    V.check_head_dim("q0", q0.shape[2])
    V.check_gqa(q0.shape[1], k.shape[1])
    V.check_last_dim_contiguous(q0=q0, q1=q1, k=k, v=v)
    V.check_int_or_per_sequence("max_kv_len_q0", max_kv_len_q0, batch, device)
    V.check_int_or_per_sequence("max_kv_len_q1", max_kv_len_q1, batch, device)
    # meta tensors always take the custom op (_dispatch.use_op), whose fake implementation
    # serves them: nothing launches.
    if device.type not in ("cuda", "meta") and not interpreter_active():
        raise ValueError(f"inputs are on {device}: the Triton kernel needs a CUDA device "
                         "(or TRITON_INTERPRET=1 for the CPU interpreter)")
    return batch


def dual_group_forward_into(
    q0, q1, k, v, out0, out1, lse0, lse1,
    cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, out_start0, out_start1,
    *, max_seqlen_q: int, softmax_scale: float | None, causal: bool,
    config: DualGroupFwdConfig | None = None, zigzag_world_size: int = 0, zigzag_rank_rows: int = 0,
):
    """Internal entry: launch into caller-provided outputs (used by the zigzag fast path to write
    both groups straight into the local-order output). ``kv_end*`` and ``out_start*`` are int32
    ``[batch]``; ``max_seqlen_q`` bounds both groups' lengths (it sizes the grid). Returns the
    compiled-kernel handle (for diagnostics)."""
    head_dim = q0.shape[2]
    scale = head_dim ** -0.5 if softmax_scale is None else float(softmax_scale)
    if config is None:
        config = get_dual_group_fwd_config(_capability(q0.device), head_dim,
                                           element_size=q0.element_size())
    return launch_dual_group_fwd(
        q0, q1, k, v, out0, out1, lse0, lse1,
        cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, out_start0, out_start1,
        max_seqlen_q=max_seqlen_q, softmax_scale=scale, causal=causal, config=config,
        zigzag_world_size=zigzag_world_size, zigzag_rank_rows=zigzag_rank_rows)


def fused_zigzag_llama3_flash_attn_varlen_forward(
    q0: torch.Tensor,
    q1: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q0: torch.Tensor,
    cu_seqlens_q1: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q0: int,
    max_seqlen_q1: int,
    max_seqlen_k: int,
    max_kv_len_q0: int | torch.Tensor,
    max_kv_len_q1: int | torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = True,
    *,
    config: DualGroupFwdConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two varlen attentions over one shared K/V, each K/V tile read once (one launch).

    Parameters
    ----------
    q0 : ``[total_q0, nheads, headdim]`` fp16/bf16, or fp32
        (computed in fp32: IEEE dots under PyTorch's default matmul precision, TF32 only when
        the user allows it)
    q1 : ``[total_q1, nheads, headdim]``
    k, v : ``[total_k, nheads_k, headdim]``, ``nheads % nheads_k == 0`` (GQA: q head ``h`` reads
        kv head ``h // (nheads // nheads_k)``). Last dims contiguous; other strides are free.
    cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k : int32 ``[batch + 1]`` on the inputs' device.
    max_seqlen_q0, max_seqlen_q1 : upper bounds of the groups' sequence lengths (size the grid).
    max_seqlen_k : upper bound of the key lengths (unused by the forward; the backward's grid).
    max_kv_len_q0, max_kv_len_q1 : keys group ``g`` may see in each sequence: an int for every
        sequence, or an int32 tensor ``[batch]`` (needed when sequences differ in length, as in
        zigzag). Sequence ``b``'s group ``g`` sees ``k[cu_k[b] : cu_k[b] + min(max_kv_len_qg[b],
        len_k[b])]``.
    softmax_scale : defaults to ``headdim ** -0.5``.
    causal : bottom-right aligned within each group's visible range: with ``Lq`` rows and ``Lk``
        visible keys, row ``i`` sees key ``j`` iff ``j <= i + Lk - Lq``::

            Lq=2, Lk=5:  1 1 1 1 0
                         1 1 1 1 1

    Returns
    -------
    out0 : ``[total_q0, nheads, headdim]``, q0's dtype
    out1 : ``[total_q1, nheads, headdim]``
    lse0 : float32 ``[nheads, total_q0]``, natural log (computed in base 2 inside the kernel)
    lse1 : float32 ``[nheads, total_q1]``
    A row that sees no key gets ``out = 0`` and ``lse = -inf``.
    """
    return _dual_group_forward(q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
                               max_seqlen_q0, max_seqlen_q1, max_seqlen_k, max_kv_len_q0,
                               max_kv_len_q1, softmax_scale, causal, config, False)


def _dual_group_forward(q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, max_seqlen_q0,
                        max_seqlen_q1, max_seqlen_k, max_kv_len_q0, max_kv_len_q1, softmax_scale,
                        causal, config, differentiable: bool, deterministic: bool = False):
    """Checks, then the op (for autograd, and where ``_dispatch.use_op`` says: compiling, a
    dispatch or function mode, fake/meta/subclass tensors) or its implementation (plain eager)."""
    compiling = torch.compiler.is_compiling()
    signature = None if compiling else V.call_signature(
        q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, max_seqlen_q0, max_seqlen_q1,
        max_seqlen_k, max_kv_len_q0, max_kv_len_q1, config)
    if _passed_checks.get(signature) is None:
        validate_dual_group_inputs(q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
                                   max_kv_len_q0, max_kv_len_q1)
        for name, x in (("max_seqlen_q0", max_seqlen_q0), ("max_seqlen_q1", max_seqlen_q1),
                        ("max_seqlen_k", max_seqlen_k)):
            V.check_nonnegative_int(name, x)
        _passed_checks.add(signature)
    batch = cu_seqlens_q0.shape[0] - 1
    device = q0.device
    if config is None:
        config = get_dual_group_fwd_config(_capability(device), q0.shape[2],
                                           element_size=q0.element_size())
    scale = q0.shape[2] ** -0.5 if softmax_scale is None else float(softmax_scale)
    max_seqlen_q = max(max_seqlen_q0, max_seqlen_q1)
    kv_end0, kv_end1 = max_kv_len_q0, max_kv_len_q1
    routed = compiling or differentiable or use_op(
        q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, _tensor_or_none(kv_end0),
        _tensor_or_none(kv_end1))
    if routed or isinstance(kv_end0, int) != isinstance(kv_end1, int):
        # Both ints go to the kernel as ints; otherwise both as int32 [batch] tensors.
        kv_end0 = _per_sequence(kv_end0, batch, device)
        kv_end1 = _per_sequence(kv_end1, batch, device)
    if routed:
        return torch.ops.kvonce.dual_group_fwd(
            q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
            max_seqlen_q, max_seqlen_k, scale, causal, *op_fields(config), deterministic)
    return _dual_group_fwd_impl(q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
                                kv_end0, kv_end1, max_seqlen_q, scale, causal, config)


def _dual_group_fwd_impl(q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
                         max_seqlen_q, softmax_scale, causal, config):
    nheads = q0.shape[1]
    out0 = torch.empty_like(q0)
    out1 = torch.empty_like(q1)
    lse0 = torch.empty((nheads, q0.shape[0]), dtype=torch.float32, device=q0.device)
    lse1 = torch.empty((nheads, q1.shape[0]), dtype=torch.float32, device=q0.device)
    # cu_seqlens_q* double as the output row offsets: their first batch entries are the starts.
    launch_dual_group_fwd(
        q0, q1, k, v, out0, out1, lse0, lse1, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
        kv_end0, kv_end1, cu_seqlens_q0, cu_seqlens_q1, max_seqlen_q=max_seqlen_q,
        softmax_scale=softmax_scale, causal=causal, config=config)
    return out0, out1, lse0, lse1


# torch.library custom op: what torch.compile records (opaque to Inductor, fake shapes below).
# The public function checks its arguments and calls it for autograd and where _dispatch.use_op
# says (compiling, dispatch/function modes, fake or meta tensors); plain eager calls run the
# implementation directly (the op dispatch costs ~16 us of host time, docs/notes.md).
@torch.library.custom_op("kvonce::dual_group_fwd", mutates_args=())
def _dual_group_fwd_op(
    q0: torch.Tensor, q1: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cu_seqlens_q0: torch.Tensor, cu_seqlens_q1: torch.Tensor, cu_seqlens_k: torch.Tensor,
    kv_end0: torch.Tensor, kv_end1: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
    softmax_scale: float, causal: bool, block_m: int, block_n: int, num_warps: int,
    num_stages: int, kv_cache_modifier: str, int64_kv_offsets: bool, tma: bool, one_group: bool,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fused_zigzag_llama3_flash_attn_varlen_forward`` after its checks, with int32 ``[batch]``
    key ranges and the config's fields one by one: ``(out0, out1, lse0, lse1)``. Differentiable
    in q0, q1, k, v (``register_autograd`` below; ``max_seqlen_k`` sizes the backward's grid;
    ``deterministic`` is the backward's, unused here)."""
    config = DualGroupFwdConfig(block_m, block_n, num_warps, num_stages, kv_cache_modifier,
                                int64_kv_offsets, tma, one_group)
    return _dual_group_fwd_impl(q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
                                kv_end0, kv_end1, max_seqlen_q, softmax_scale, causal, config)


@_dual_group_fwd_op.register_fake
def _(q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, *scalars):
    nheads = q0.shape[1]
    return (torch.empty_like(q0), torch.empty_like(q1),
            q0.new_empty((nheads, q0.shape[0]), dtype=torch.float32),
            q1.new_empty((nheads, q1.shape[0]), dtype=torch.float32))


# ---------------------------------------------------------------------------------------------
# Backward and autograd
# ---------------------------------------------------------------------------------------------

DKV_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The kernels read whole rows: a last dim with another stride (an expanded gradient, say)
    is copied once; every other stride is honoured as it is."""
    return t if t.numel() == 0 or t.stride(-1) == 1 else t.contiguous()


def validate_backward_inputs(dout0, dout1, q0, q1, out0, out1, lse0, lse1, dkv_dtype) -> None:
    """The backward's own checks (after the forward's): gradients and saved outputs shaped like
    the queries, LSE float32 ``[nheads, total_q]``, a float ``dkv_dtype``."""
    for g, (dout, q, out, lse) in enumerate(((dout0, q0, out0, lse0), (dout1, q1, out1, lse1))):
        for name, t in ((f"dout{g}", dout), (f"out{g}", out)):
            V.check_tensor(name, t, ndim=3, dtypes=V.ATTN_DTYPES)
            if t.shape != q.shape:
                raise ValueError(f"{name} must have q{g}'s shape {tuple(q.shape)}, got "
                                 f"{tuple(t.shape)}")
        V.check_same_dtype(**{f"q{g}": q, f"dout{g}": dout, f"out{g}": out})
        V.check_tensor(f"lse{g}", lse, ndim=2, dtypes=(torch.float32,))
        if lse.shape != (q.shape[1], q.shape[0]):
            raise ValueError(f"lse{g} must be float32 [nheads, total_q{g}] = "
                             f"{[q.shape[1], q.shape[0]]}, got {tuple(lse.shape)}")
        V.check_same_device(**{f"q{g}": q, f"dout{g}": dout, f"out{g}": out, f"lse{g}": lse})
    if dkv_dtype not in DKV_DTYPES:
        raise TypeError(f"dkv_dtype must be one of float32, float16, bfloat16, got {dkv_dtype!r}")


def fused_zigzag_llama3_flash_attn_varlen_backward(
    dout0: torch.Tensor, dout1: torch.Tensor,
    q0: torch.Tensor, q1: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out0: torch.Tensor, out1: torch.Tensor, lse0: torch.Tensor, lse1: torch.Tensor,
    cu_seqlens_q0: torch.Tensor, cu_seqlens_q1: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q0: int, max_seqlen_q1: int, max_seqlen_k: int,
    max_kv_len_q0: int | torch.Tensor, max_kv_len_q1: int | torch.Tensor,
    softmax_scale: float | None = None, causal: bool = True, *,
    dkv_dtype: torch.dtype = torch.float32,
    config: DualGroupBwdConfig | None = None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of ``fused_zigzag_llama3_flash_attn_varlen_forward`` (flash-attn's
    ``_flash_attn_varlen_backward`` role): two kernels, each K/V tile loaded once for both groups.

    Parameters
    ----------
    dout0, dout1 : gradients of ``out0 [total_q0, nheads, d]``, ``out1 [total_q1, nheads, d]``
        (any strides; a non-contiguous last dim is copied once).
    q0, q1, k, v, cu_seqlens_*, max_kv_len_*, softmax_scale, causal : the forward's.
    out0, out1, lse0, lse1 : the forward's outputs (lse float32 ``[nheads, total_qg]``).
    max_seqlen_q0, max_seqlen_q1 : bounds of the groups' lengths (size the dQ grid).
    max_seqlen_k : bound of the key lengths (sizes the dK/dV grid; a smaller value is slower,
        never wrong).
    dkv_dtype : dtype of the returned dK/dV. They are accumulated in fp32 over both groups and
        every q head of a KV head, and cast once.
    config : launch-config override (``kernels/configs.py``); by default the GPU's row, which on
        Hopper at head dims 64/128 runs the warp-specialized Gluon kernel (dQ reduce-added in
        fp32: its sum order varies run to run).
    deterministic : take the two Triton kernels (bitwise reproducible), whatever the config says.

    Returns
    -------
    dq0 ``[total_q0, nheads, d]``, dq1 ``[total_q1, nheads, d]`` in q's dtype; dk, dv
    ``[total_k, nheads_k, d]`` in ``dkv_dtype``. Rows that saw no key get dq = 0; keys no row
    sees, and rows of no sequence (past ``cu_seqlens_k[-1]``), get dk = dv = 0.
    """
    dout0, dout1 = _rows_contiguous(dout0), _rows_contiguous(dout1)
    out0, out1 = _rows_contiguous(out0), _rows_contiguous(out1)
    compiling = torch.compiler.is_compiling()
    signature = None if compiling else V.call_signature(
        dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1, cu_seqlens_q0, cu_seqlens_q1,
        cu_seqlens_k, max_seqlen_q0, max_seqlen_q1, max_seqlen_k, max_kv_len_q0, max_kv_len_q1,
        dkv_dtype, config)
    if _passed_checks.get(signature) is None:
        validate_dual_group_inputs(q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
                                   max_kv_len_q0, max_kv_len_q1)
        validate_backward_inputs(dout0, dout1, q0, q1, out0, out1, lse0, lse1, dkv_dtype)
        for name, x in (("max_seqlen_q0", max_seqlen_q0), ("max_seqlen_q1", max_seqlen_q1),
                        ("max_seqlen_k", max_seqlen_k)):
            V.check_nonnegative_int(name, x)
        _passed_checks.add(signature)
    batch = cu_seqlens_q0.shape[0] - 1
    if config is None:
        config = get_dual_group_bwd_config(_capability(q0.device), q0.shape[2],
                                           q0.element_size())
    if deterministic and config.gluon:
        config = dataclasses.replace(config, gluon=False)
    scale = q0.shape[2] ** -0.5 if softmax_scale is None else float(softmax_scale)
    kv_end0, kv_end1 = max_kv_len_q0, max_kv_len_q1
    routed = compiling or use_op(
        dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1, cu_seqlens_q0, cu_seqlens_q1,
        cu_seqlens_k, _tensor_or_none(kv_end0), _tensor_or_none(kv_end1))
    if routed or isinstance(kv_end0, int) != isinstance(kv_end1, int):
        kv_end0 = _per_sequence(kv_end0, batch, q0.device)
        kv_end1 = _per_sequence(kv_end1, batch, q0.device)
    args = (dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1, cu_seqlens_q0, cu_seqlens_q1,
            cu_seqlens_k, kv_end0, kv_end1, max(max_seqlen_q0, max_seqlen_q1), max_seqlen_k,
            scale, causal, dkv_dtype)
    if routed:
        return torch.ops.kvonce.dual_group_bwd(*args, *op_fields(config))
    return _dual_group_bwd_impl(*args, config)


def bwd_launcher(config: DualGroupBwdConfig, q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1,
                 dq0, dq1, dk, dv, *, zigzag_world_size: int = 0, local_order: bool = False):
    """The dual-group backward's launch function for these tensors (``launch_dual_group_bwd``'s
    signature): with ``config.gluon``, the warp-specialized Hopper Gluon kernel
    (``gluon_bwd.launch_gluon_bwd``, tuned schedule) wherever ``gluon_bwd.supports`` covers the
    call; otherwise the two Triton kernels (``launch_dual_group_bwd``). ``zigzag_world_size`` and
    ``local_order`` describe the tensors as ``launch_dual_group_bwd`` takes them (the zigzag
    all-gather buffer, both groups in one local-order tensor) and are passed on to ``supports``;
    the caller passes them to the launch as well. One choice for the contiguous path
    (``_dual_group_bwd_impl``), the zigzag fast path (``zigzag/fused.py``) and context
    parallelism (``zigzag/cp.py``)."""
    if not config.gluon:
        return launch_dual_group_bwd
    from .kernels import gluon_bwd  # Hopper Gluon: imported only where asked for

    if not gluon_bwd.supports(q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, dq0, dq1, dk,
                              dv, zigzag_world_size=zigzag_world_size, local_order=local_order,
                              int64_kv_offsets=config.int64_kv_offsets):
        return launch_dual_group_bwd
    from .kernels.gluon_bwd_sched import TUNED_SCHEDULE

    return functools.partial(gluon_bwd.launch_gluon_bwd, schedule=TUNED_SCHEDULE)


def _dual_group_bwd_impl(dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1, cu_seqlens_q0,
                         cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal, dkv_dtype, config):
    nheads = q0.shape[1]
    dq0, dq1 = torch.empty_like(q0), torch.empty_like(q1)
    dk = torch.empty(k.shape, dtype=dkv_dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=dkv_dtype, device=v.device)
    # delta = rowsum(dO * O), filled by the dQ kernel for the dK/dV kernel.
    delta0 = torch.empty((nheads, q0.shape[0]), dtype=torch.float32, device=q0.device)
    delta1 = torch.empty((nheads, q1.shape[0]), dtype=torch.float32, device=q0.device)
    tensors = (q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, delta0, delta1, dq0, dq1, dk,
               dv, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1)
    launch = bwd_launcher(config, q0, q1, k, v, out0, out1, dout0, dout1, lse0, lse1, dq0, dq1,
                          dk, dv)
    launch(*tensors, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
           softmax_scale=softmax_scale, causal=causal, config=config)
    return dq0, dq1, dk, dv


@torch.library.custom_op("kvonce::dual_group_bwd", mutates_args=())
def _dual_group_bwd_op(
    dout0: torch.Tensor, dout1: torch.Tensor, q0: torch.Tensor, q1: torch.Tensor,
    k: torch.Tensor, v: torch.Tensor, out0: torch.Tensor, out1: torch.Tensor,
    lse0: torch.Tensor, lse1: torch.Tensor, cu_seqlens_q0: torch.Tensor,
    cu_seqlens_q1: torch.Tensor, cu_seqlens_k: torch.Tensor, kv_end0: torch.Tensor,
    kv_end1: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
    causal: bool, dkv_dtype: torch.dtype, dq_block_m: int, dq_block_n: int, dq_num_warps: int,
    dq_num_stages: int, dkdv_block_m: int, dkdv_block_n: int, dkdv_num_warps: int,
    dkdv_num_stages: int, int64_kv_offsets: bool, atomic_dq: bool, dq_one_group: bool,
    gluon: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fused_zigzag_llama3_flash_attn_varlen_backward`` after its checks, with int32 ``[batch]``
    key ranges and the config's fields one by one: ``(dq0, dq1, dk, dv)``."""
    config = DualGroupBwdConfig(dq_block_m, dq_block_n, dq_num_warps, dq_num_stages,
                                dkdv_block_m, dkdv_block_n, dkdv_num_warps, dkdv_num_stages,
                                int64_kv_offsets, atomic_dq, dq_one_group, gluon)
    return _dual_group_bwd_impl(dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1,
                                cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1,
                                max_seqlen_q, max_seqlen_k, softmax_scale, causal, dkv_dtype,
                                config)


@_dual_group_bwd_op.register_fake
def _(dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1, cu_seqlens_q0, cu_seqlens_q1,
      cu_seqlens_k, kv_end0, kv_end1, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      dkv_dtype, *config):
    return (torch.empty_like(q0), torch.empty_like(q1), k.new_empty(k.shape, dtype=dkv_dtype),
            v.new_empty(v.shape, dtype=dkv_dtype))


def _fwd_setup_context(ctx, inputs, output):
    (q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, kv_end0, kv_end1, max_seqlen_q,
     max_seqlen_k, softmax_scale, causal, *config_fields) = inputs
    out0, out1, lse0, lse1 = output
    ctx.save_for_backward(q0, q1, k, v, out0, out1, lse0, lse1, cu_seqlens_q0, cu_seqlens_q1,
                          cu_seqlens_k, kv_end0, kv_end1)
    ctx.sizes = (max_seqlen_q, max_seqlen_k, softmax_scale, causal)
    n_fields = len(dataclasses.fields(DualGroupFwdConfig))
    ctx.deterministic = bool(config_fields[n_fields]) if len(config_fields) > n_fields else False
    ctx.num_inputs = len(inputs)
    ctx.mark_non_differentiable(lse0, lse1)


def _fwd_backward(ctx, dout0, dout1, _dlse0, _dlse1):
    q0, q1, k, v, out0, out1, lse0, lse1, cu0, cu1, cuk, kv_end0, kv_end1 = ctx.saved_tensors
    config = get_dual_group_bwd_config(_capability(q0.device), q0.shape[2],
                                           q0.element_size())
    if ctx.deterministic:
        config = dataclasses.replace(config, gluon=False)
    dq0, dq1, dk, dv = torch.ops.kvonce.dual_group_bwd(
        _rows_contiguous(dout0), _rows_contiguous(dout1), q0, q1, k, v, out0, out1, lse0, lse1,
        cu0, cu1, cuk, kv_end0, kv_end1, *ctx.sizes, k.dtype, *op_fields(config))
    return (dq0, dq1, dk, dv) + (None,) * (ctx.num_inputs - 4)


torch.library.register_autograd("kvonce::dual_group_fwd", _fwd_backward,
                                setup_context=_fwd_setup_context)


def fused_zigzag_llama3_flash_attn_varlen_func(
    q0: torch.Tensor,
    q1: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q0: torch.Tensor,
    cu_seqlens_q1: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q0: int,
    max_seqlen_q1: int,
    max_seqlen_k: int,
    max_kv_len_q0: int | torch.Tensor,
    max_kv_len_q1: int | torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = True,
    *,
    return_lse: bool = False,
    deterministic: bool = False,
):
    """``fused_zigzag_llama3_flash_attn_varlen_forward``, differentiable in q0, q1, k and v.

    Same arguments and semantics (see the forward; ``max_seqlen_k`` must bound the key lengths:
    it sizes the backward's grid). Returns ``(out0, out1)``, or ``(out0, out1, lse0, lse1)`` with
    ``return_lse`` (lse float32 ``[nheads, total_qg]``, not differentiable). The backward is
    ``fused_zigzag_llama3_flash_attn_varlen_backward``'s kernels, with dK/dV accumulated in fp32
    and returned in k's dtype. Works under ``torch.compile(fullgraph=True)`` (one custom op each
    way). ``deterministic``: the backward takes the two Triton kernels, bitwise reproducible run
    to run (flash-attn's switch); by default Hopper runs the Gluon kernel, whose fp32 dQ sum order
    varies.
    """
    differentiable = torch.is_grad_enabled() and any(
        t.requires_grad for t in (q0, q1, k, v) if isinstance(t, torch.Tensor))
    out0, out1, lse0, lse1 = _dual_group_forward(
        q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, max_seqlen_q0, max_seqlen_q1,
        max_seqlen_k, max_kv_len_q0, max_kv_len_q1, softmax_scale, causal, None, differentiable,
        deterministic)
    return (out0, out1, lse0, lse1) if return_lse else (out0, out1)
