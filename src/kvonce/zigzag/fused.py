"""kvonce's zigzag fast path: both groups of a rank in one launch, straight from the gathered K/V.

``replace_execute_grouped_attention_with_fused_varlen`` takes the arguments of
``execute_grouped_attention`` (plus the rank's two chunk indices) and returns the same
``(out, lse, chunk_info)``, but:
- it reads ``kv_buffer`` where the all-gather left it (no rearranging copy, no per-group slices);
- each K/V tile is loaded once for both query groups;
- it writes both groups' outputs and LSE directly in local order (no scatter);
- its metadata (per-sequence key ranges, output offsets) is computed on the device: no host sync,
  no Python loop over sequences.
"""
from __future__ import annotations

import dataclasses

import torch

from .. import _validate as V
from .._dispatch import use_op
from ..kernels.configs import (DualGroupBwdConfig, DualGroupFwdConfig, get_dual_group_bwd_config,
                              get_dual_group_fwd_config, op_fields)
from ..kernels.dual_group_fwd import launch_dual_group_fwd
from ..varlen import (_capability, _rows_contiguous, bwd_launcher, validate_backward_inputs,
                      validate_dual_group_inputs)
from .grouped import check_unsupported_features

__all__ = ["replace_execute_grouped_attention_with_fused_varlen", "fused_zigzag_backward"]


def replace_execute_grouped_attention_with_fused_varlen(
    chunk_q_list, chunk_cu_seqlens_q_list, chunk_indices_list, kv_buffer, kv_slices,
    nheads, head_dim, softmax_scale, dropout_p, causal, window_size, alibi_slopes, deterministic,
    world_size, cu_seqlens_k, chunk_idx_0, chunk_idx_1, *, max_seqlen_q: int | None = None,
    config=None,
):
    """Drop-in replacement for ``execute_grouped_attention`` (same arguments, then
    ``chunk_idx_0, chunk_idx_1``; same outputs).

    Parameters
    ----------
    chunk_q_list : ``[q0, q1]`` from ``split_q_by_zigzag_chunk_index``; group ``g`` holds chunk
        ``chunk_idx_g`` (``c_b`` rows) of every sequence ``b``.
    chunk_cu_seqlens_q_list : int32 ``[batch + 1]`` per group.
    chunk_indices_list, kv_slices : accepted for interface parity; the local row of group ``g``'s
        row ``i`` of sequence ``b`` is ``cu0[b] + cu1[b] + g * c_b + i`` (the layout
        ``split_q_by_zigzag_chunk_index`` produces), and key ranges are derived on the device.
    kv_buffer : ``[2, world_size * total_local, nheads_k, headdim]`` all-gathered K/V, rank-major.
    cu_seqlens_k : int32 ``[batch + 1]``, LOCAL. Group ``g`` of sequence ``b`` sees global keys
        ``[0, (chunk_idx_g + 1) * c_b)``, causal (bottom-right = global positions).
    max_seqlen_q : optional bound of ``c_b`` (sizes the grid). By default the group's total row
        count is used, which is exact for one sequence and only launches programs that exit at
        once for batches; pass it when you know it to trim those.

    Returns
    -------
    out : ``[total_local, nheads, headdim]`` in local order, ``lse`` float32 ``[nheads, total_local]``,
    ``chunk_info`` as ``execute_grouped_attention``.
    """
    if len(chunk_q_list) != 2 or len(chunk_cu_seqlens_q_list) != 2:
        raise ValueError("chunk_q_list and chunk_cu_seqlens_q_list must hold two groups")
    q0, q1 = chunk_q_list
    cu_q0, cu_q1 = chunk_cu_seqlens_q_list
    compiling = torch.compiler.is_compiling()
    signature = None if compiling else V.call_signature(
        q0, q1, cu_q0, cu_q1, kv_buffer, cu_seqlens_k, nheads, head_dim, softmax_scale, dropout_p,
        causal, window_size, alibi_slopes, world_size, chunk_idx_0, chunk_idx_1, max_seqlen_q,
        config)
    if _passed_checks.get(signature) is None:
        _check_arguments(q0, q1, cu_q0, cu_q1, kv_buffer, cu_seqlens_k, nheads, head_dim,
                         dropout_p, window_size, alibi_slopes, world_size, chunk_idx_0,
                         chunk_idx_1)
        _passed_checks.add(signature)

    scale = head_dim ** -0.5 if softmax_scale is None else float(softmax_scale)
    bound = max(q0.shape[0], q1.shape[0]) if max_seqlen_q is None else max_seqlen_q
    if config is None:
        config = get_dual_group_fwd_config(_capability(q0.device), head_dim, zigzag_buffer=True,
                                           element_size=q0.element_size())
    fields = (chunk_idx_0, chunk_idx_1, world_size, bound, scale, causal)
    if compiling or use_op(q0, q1, kv_buffer, cu_q0, cu_q1, cu_seqlens_k):
        out, lse = torch.ops.kvonce.dual_group_fwd_zigzag(
            q0, q1, kv_buffer, cu_q0, cu_q1, cu_seqlens_k, *fields, *op_fields(config))
    else:
        out, lse = _zigzag_fwd_impl(q0, q1, kv_buffer, cu_q0, cu_q1, cu_seqlens_k, *fields, config)
    chunk_info = {
        "chunk_indices_list": chunk_indices_list,
        "chunk_cu_seqlens_q_list": chunk_cu_seqlens_q_list,
        "kv_slices": kv_slices,
    }
    return out, lse, chunk_info


# Call signatures whose checks passed (shapes, strides, dtypes, devices, ints: never values).
_passed_checks = V.PassedChecks()


def _check_arguments(q0, q1, cu_q0, cu_q1, kv_buffer, cu_seqlens_k, nheads, head_dim, dropout_p,
                     window_size, alibi_slopes, world_size, chunk_idx_0, chunk_idx_1) -> None:
    check_unsupported_features(dropout_p, window_size, alibi_slopes)
    V.check_tensor("kv_buffer", kv_buffer, ndim=4, dtypes=V.ATTN_DTYPES)
    if kv_buffer.shape[0] != 2:
        raise ValueError(f"kv_buffer must be [2, tokens, nheads_k, headdim], got {tuple(kv_buffer.shape)}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if kv_buffer.shape[1] % world_size != 0:
        raise ValueError(f"kv_buffer has {kv_buffer.shape[1]} tokens, not a multiple of "
                         f"world_size={world_size}")
    for name, idx in (("chunk_idx_0", chunk_idx_0), ("chunk_idx_1", chunk_idx_1)):
        if not isinstance(idx, int) or not 0 <= idx < 2 * world_size:
            raise ValueError(f"{name} must be an int in [0, {2 * world_size}), got {idx!r}")
    if q0.shape[1] != nheads or q0.shape[2] != head_dim:
        raise ValueError(f"q0 has [nheads, headdim] = {tuple(q0.shape[1:])}, expected "
                         f"({nheads}, {head_dim})")
    validate_dual_group_inputs(q0, q1, kv_buffer[0], kv_buffer[1], cu_q0, cu_q1, cu_seqlens_k,
                               0, 0)


def _zigzag_fwd_impl(q0, q1, kv_buffer, cu_q0, cu_q1, cu_seqlens_k, chunk_idx_0, chunk_idx_1,
                     world_size, max_seqlen_q, softmax_scale, causal, config):
    """Both groups into one local-order ``out [total_local, nheads, d]`` and ``lse`` float32
    ``[nheads, total_local]``; key ranges and output rows are derived inside the kernel."""
    nheads, head_dim = q0.shape[1], q0.shape[2]
    total_q = q0.shape[0] + q1.shape[0]
    out = torch.empty((total_q, nheads, head_dim), dtype=q0.dtype, device=q0.device)
    lse = torch.empty((nheads, total_q), dtype=torch.float32, device=q0.device)
    launch_dual_group_fwd(
        q0, q1, kv_buffer[0], kv_buffer[1], out, out, lse, lse, cu_q0, cu_q1, cu_seqlens_k,
        chunk_idx_0 + 1, chunk_idx_1 + 1, cu_q0, cu_q1, max_seqlen_q=max_seqlen_q,
        softmax_scale=softmax_scale, causal=causal, config=config,
        zigzag_world_size=world_size, zigzag_rank_rows=kv_buffer.shape[1] // world_size,
        zigzag_local_order=True)
    return out, lse


# torch.library custom op (opaque to torch.compile; plain eager calls skip the dispatch, see
# _dispatch.use_op for when it is taken): one output for both groups, allocated inside, since an
# op may not take the same tensor twice as mutated.
@torch.library.custom_op("kvonce::dual_group_fwd_zigzag", mutates_args=())
def _zigzag_fwd_op(
    q0: torch.Tensor, q1: torch.Tensor, kv_buffer: torch.Tensor, cu_seqlens_q0: torch.Tensor,
    cu_seqlens_q1: torch.Tensor, cu_seqlens_k: torch.Tensor, chunk_idx_0: int, chunk_idx_1: int,
    world_size: int, max_seqlen_q: int, softmax_scale: float, causal: bool, block_m: int,
    block_n: int, num_warps: int, num_stages: int, kv_cache_modifier: str,
    int64_kv_offsets: bool, tma: bool, one_group: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``replace_execute_grouped_attention_with_fused_varlen`` after its checks: ``(out
    [total_local, nheads, d], lse float32 [nheads, total_local])`` in local order."""
    config = DualGroupFwdConfig(block_m, block_n, num_warps, num_stages, kv_cache_modifier,
                                int64_kv_offsets, tma, one_group)
    return _zigzag_fwd_impl(q0, q1, kv_buffer, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k,
                            chunk_idx_0, chunk_idx_1, world_size, max_seqlen_q, softmax_scale,
                            causal, config)


@_zigzag_fwd_op.register_fake
def _(q0, q1, kv_buffer, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, *scalars):
    total_q, nheads = q0.shape[0] + q1.shape[0], q0.shape[1]
    return (q0.new_empty((total_q, nheads, q0.shape[2])),
            q0.new_empty((nheads, total_q), dtype=torch.float32))


# ---------------------------------------------------------------------------------------------
# The backward twin
# ---------------------------------------------------------------------------------------------

def fused_zigzag_backward(
    dout: torch.Tensor, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    kv_buffer: torch.Tensor, cu_seqlens_q: torch.Tensor, world_size: int, chunk_idx_0: int,
    chunk_idx_1: int, softmax_scale: float | None = None, causal: bool = True, *,
    max_seqlen_q: int | None = None, dkv_dtype: torch.dtype = torch.float32,
    config: DualGroupBwdConfig | None = None, deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of ``replace_execute_grouped_attention_with_fused_varlen`` for one rank: both
    groups at once, reading the all-gathered K/V where it lies and writing dK/dV in the
    same rank-major layout (ready for a reduce-scatter, no rearranging copy).

    Parameters
    ----------
    dout, q, out : ``[total_local, nheads, d]`` in the rank's LOCAL order (sequence ``b`` holds
        chunk ``chunk_idx_0`` then chunk ``chunk_idx_1``, ``c_b`` rows each); any strides.
    lse : float32 ``[nheads, total_local]``, as the forward twin returns it.
    kv_buffer : ``[2, world_size * total_local, nheads_k, d]``, the all-gathered K/V, rank-major.
    cu_seqlens_q : int32 ``[batch + 1]``, LOCAL (each length ``2 * c_b``; K/V use the same).
    max_seqlen_q : bound of ``c_b`` (sizes the grids); default ``total_local // 2``.
    dkv_dtype : dtype of the returned dK/dV (accumulated in fp32 over both groups and the q heads
        of each KV head, cast once).
    config : launch-config override (``kernels/configs.py``); by default the GPU's row, which on
        Hopper at head dims 64/128 runs the warp-specialized Gluon kernel on the buffer in place
        (dQ reduce-added in fp32: its sum order varies run to run); elsewhere two Triton kernels.
    deterministic : take the two Triton kernels (bitwise reproducible), whatever the config says.

    Returns
    -------
    dq : ``[total_local, nheads, d]`` in local order, q's dtype.
    dkv : ``[2, world_size * total_local, nheads_k, d]`` in ``dkv_dtype``, kv_buffer's layout:
        this rank's queries' contribution to every key (0 where none of them looks).
    """
    dout, out = _rows_contiguous(dout), _rows_contiguous(out)
    compiling = torch.compiler.is_compiling()
    signature = None if compiling else V.call_signature(
        dout, q, out, lse, kv_buffer, cu_seqlens_q, world_size, chunk_idx_0, chunk_idx_1,
        softmax_scale, causal, max_seqlen_q, dkv_dtype, config)
    if _passed_checks_bwd.get(signature) is None:
        _check_arguments(q, q, cu_seqlens_q, cu_seqlens_q, kv_buffer, cu_seqlens_q, q.shape[1],
                         q.shape[2], 0.0, (-1, -1), None, world_size, chunk_idx_0, chunk_idx_1)
        validate_backward_inputs(dout, dout, q, q, out, out, lse, lse, dkv_dtype)
        if max_seqlen_q is not None:
            V.check_nonnegative_int("max_seqlen_q", max_seqlen_q)
        _passed_checks_bwd.add(signature)
    scale = q.shape[2] ** -0.5 if softmax_scale is None else float(softmax_scale)
    bound = q.shape[0] // 2 if max_seqlen_q is None else max_seqlen_q
    if config is None:
        config = get_dual_group_bwd_config(_capability(q.device), q.shape[2],
                                           q.element_size())
    if deterministic and config.gluon:
        config = dataclasses.replace(config, gluon=False)
    args = (dout, q, out, lse, kv_buffer, cu_seqlens_q, chunk_idx_0, chunk_idx_1, world_size,
            bound, scale, causal, dkv_dtype)
    if compiling or use_op(dout, q, out, lse, kv_buffer, cu_seqlens_q):
        return torch.ops.kvonce.dual_group_bwd_zigzag(*args, *op_fields(config))
    return _zigzag_bwd_impl(*args, config)


_passed_checks_bwd = V.PassedChecks()


def _zigzag_bwd_impl(dout, q, out, lse, kv_buffer, cu_seqlens_q, chunk_idx_0, chunk_idx_1,
                     world_size, max_seqlen_q, softmax_scale, causal, dkv_dtype, config):
    # Both groups of sequence b have c_b = len_b / 2 rows: cu // 2 is each group's cumulative
    # count, and the kernel finds local rows at cu0[b] + cu1[b] (+ c_b for group 1).
    cu_half = torch.div(cu_seqlens_q, 2, rounding_mode="floor")
    dq = torch.empty_like(q)
    dkv = torch.empty(kv_buffer.shape, dtype=dkv_dtype, device=kv_buffer.device)
    delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    launch = bwd_launcher(config, q, q, kv_buffer[0], kv_buffer[1], out, out, dout, dout, lse, lse,
                          dq, dq, dkv[0], dkv[1], zigzag_world_size=world_size, local_order=True)
    launch(
        q, q, kv_buffer[0], kv_buffer[1], out, out, dout, dout, lse, lse, delta, delta, dq, dq,
        dkv[0], dkv[1], cu_half, cu_half, cu_seqlens_q, chunk_idx_0 + 1, chunk_idx_1 + 1,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=2 * world_size * max_seqlen_q,
        softmax_scale=softmax_scale, causal=causal, config=config,
        zigzag_world_size=world_size, local_order=True)
    return dq, dkv


@torch.library.custom_op("kvonce::dual_group_bwd_zigzag", mutates_args=())
def _zigzag_bwd_op(
    dout: torch.Tensor, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    kv_buffer: torch.Tensor, cu_seqlens_q: torch.Tensor, chunk_idx_0: int, chunk_idx_1: int,
    world_size: int, max_seqlen_q: int, softmax_scale: float, causal: bool,
    dkv_dtype: torch.dtype, dq_block_m: int, dq_block_n: int, dq_num_warps: int,
    dq_num_stages: int, dkdv_block_m: int, dkdv_block_n: int, dkdv_num_warps: int,
    dkdv_num_stages: int, int64_kv_offsets: bool, atomic_dq: bool, dq_one_group: bool,
    gluon: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_zigzag_backward`` after its checks: ``(dq [total_local, nheads, d],
    dkv [2, world_size * total_local, nheads_k, d])``."""
    config = DualGroupBwdConfig(dq_block_m, dq_block_n, dq_num_warps, dq_num_stages,
                                dkdv_block_m, dkdv_block_n, dkdv_num_warps, dkdv_num_stages,
                                int64_kv_offsets, atomic_dq, dq_one_group, gluon)
    return _zigzag_bwd_impl(dout, q, out, lse, kv_buffer, cu_seqlens_q, chunk_idx_0, chunk_idx_1,
                            world_size, max_seqlen_q, softmax_scale, causal, dkv_dtype, config)


@_zigzag_bwd_op.register_fake
def _(dout, q, out, lse, kv_buffer, cu_seqlens_q, chunk_idx_0, chunk_idx_1, world_size,
      max_seqlen_q, softmax_scale, causal, dkv_dtype, *config):
    return torch.empty_like(q), kv_buffer.new_empty(kv_buffer.shape, dtype=dkv_dtype)
