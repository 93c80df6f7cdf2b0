"""The original zigzag llama3 grouped attention (two varlen calls), kvonce's own code: the baseline.

``execute_grouped_attention`` rearranges the gathered K/V into contiguous order, slices it per group
and per sequence, calls a varlen attention once per group (so the K/V each group shares is read
twice) and scatters outputs and LSE back to local order.

Its varlen attention is pluggable (``varlen_attention_backend``): flash-attn's when installed, else
PyTorch's built-in FA2 varlen kernel on CUDA, else ``reference.varlen_attention_ref`` on CPU.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..reference import varlen_attention_ref
from .layout import rearrange_kv_from_zigzag_to_contiguous

__all__ = ["execute_grouped_attention", "varlen_attention_backend", "check_unsupported_features"]

# (q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal) -> (out [T, H, D], lse [H, T] fp32)
VarlenFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _flash_attn_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal):
    from flash_attn import flash_attn_varlen_func

    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, 0.0,
                                         softmax_scale=softmax_scale, causal=causal,
                                         return_attn_probs=True)
    return out, lse


def _torch_fa2_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal):
    """PyTorch's bundled FA2 varlen forward (``aten._flash_attention_forward``); LSE comes back in
    flash-attn's varlen layout ``[nheads, total_q]``."""
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=softmax_scale)
    return out, lse


def _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal):
    out, lse = varlen_attention_ref(q, k, v, cu_q, cu_k, softmax_scale=softmax_scale, causal=causal)
    return out.to(q.dtype), lse


def varlen_attention_backend(device: torch.device) -> tuple[str, VarlenFn]:
    """``(name, fn)`` of the varlen attention the baseline calls on ``device``."""
    if device.type == "cuda":
        try:
            import flash_attn  # noqa: F401
            return "flash_attn", _flash_attn_varlen
        except ImportError:
            return "torch_fa2", _torch_fa2_varlen
    return "reference", _reference_varlen


def check_unsupported_features(dropout_p, window_size, alibi_slopes) -> None:
    """kvonce's zigzag paths compute plain (optionally causal) softmax attention."""
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p must be 0.0, got {dropout_p}")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError(f"window_size must be (-1, -1), got {tuple(window_size)}")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes are not supported")


def execute_grouped_attention(
    chunk_q_list, chunk_cu_seqlens_q_list, chunk_indices_list, kv_buffer, kv_slices,
    nheads, head_dim, softmax_scale, dropout_p, causal, window_size, alibi_slopes, deterministic,
    world_size, cu_seqlens_k, *, attention_fn: VarlenFn | None = None,
):
    """Original two-call grouped attention of one rank.

    Parameters
    ----------
    chunk_q_list, chunk_cu_seqlens_q_list, chunk_indices_list : from
        ``split_q_by_zigzag_chunk_index`` (``q_g [total_g, nheads, headdim]``).
    kv_buffer : ``[2, world_size * total_local, nheads_k, headdim]``, the all-gathered K/V.
    kv_slices : from ``compute_kv_slices_for_groups`` (global contiguous key ranges per sequence).
    cu_seqlens_k : int32 ``[batch + 1]``, LOCAL (global / world_size).
    attention_fn : override the varlen attention (default: ``varlen_attention_backend``).

    Returns
    -------
    out : ``[total_local, nheads, headdim]`` in local (zigzag) order
    lse : float32 ``[nheads, total_local]``
    chunk_info : dict with the chunk indices, cu_seqlens and kv_slices (for a backward pass)
    """
    check_unsupported_features(dropout_p, window_size, alibi_slopes)
    fn = attention_fn or varlen_attention_backend(kv_buffer.device)[1]
    kv = rearrange_kv_from_zigzag_to_contiguous(kv_buffer, world_size, cu_seqlens_k)
    total_q = sum(q.shape[0] for q in chunk_q_list)
    out = torch.empty((total_q, nheads, head_dim), dtype=chunk_q_list[0].dtype,
                      device=chunk_q_list[0].device)
    lse = torch.empty((nheads, total_q), dtype=torch.float32, device=out.device)
    for q_g, cu_q, index, (ranges, cu_k) in zip(chunk_q_list, chunk_cu_seqlens_q_list,
                                                chunk_indices_list, kv_slices):
        if q_g.shape[0] == 0:
            continue
        k_g = torch.cat([kv[0, s:e] for s, e in ranges])
        v_g = torch.cat([kv[1, s:e] for s, e in ranges])
        # The original reads the maxima back to the host for the varlen call (a sync per group).
        max_q = int((cu_q[1:] - cu_q[:-1]).max().item())  # sync-ok: baseline, as the original
        max_k = max((e - s for s, e in ranges), default=0)
        out_g, lse_g = fn(q_g, k_g, v_g, cu_q, cu_k, max_q, max_k, softmax_scale, causal)
        out[index] = out_g
        lse[:, index] = lse_g.float()
    chunk_info = {
        "chunk_indices_list": chunk_indices_list,
        "chunk_cu_seqlens_q_list": chunk_cu_seqlens_q_list,
        "kv_slices": kv_slices,
    }
    return out, lse, chunk_info
