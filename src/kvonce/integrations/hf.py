"""HF transformers adapter: kvonce's zigzag context-parallel attention as an attention function.

    import kvonce.integrations.hf as kv_hf
    kv_hf.register()                                   # adds "kvonce_zigzag" to AttentionInterface
    model.set_attn_implementation("kvonce_zigzag")     # or from_pretrained(..., attn_implementation=)
    # every step, for its packed batch (one row of concatenated sequences, sharded by zigzag_shard):
    kv_hf.update_zigzag_params(cu_seqlens_global, group)
    logits = model(input_ids_local[None], position_ids=position_ids_local[None]).logits

Each rank feeds its zigzag shard of the packed batch (``kvonce.zigzag.zigzag_shard`` of input ids,
GLOBAL position ids and labels); the attention layers all-gather K/V and compute both chunk groups
in one pass (``zigzag_llama3_flash_attn_varlen_func``). transformers builds no attention mask for an
implementation it does not know, so none is materialized.
"""
from __future__ import annotations

import dataclasses

import torch

from ..zigzag import zigzag_llama3_flash_attn_varlen_func
from ..zigzag.cp import _check_zigzag_lengths

NAME = "kvonce_zigzag"


@dataclasses.dataclass
class ZigzagParams:
    """The packed batch of the current step: global and local cumulative lengths, the local bound,
    the process group and the KV-head stride (None: all KV heads in one step)."""
    cu_seqlens_global: torch.Tensor
    cu_seqlens_local: torch.Tensor
    max_seqlen_local: int
    group: object
    heads_k_stride: int | None


_params: ZigzagParams | None = None


def update_zigzag_params(cu_seqlens_global: torch.Tensor, group=None, *,
                         max_seqlen_global: int | None = None,
                         heads_k_stride: int | None = None,
                         check_lengths: bool = False) -> ZigzagParams:
    """Set the packed batch every attention layer of this step uses.

    ``cu_seqlens_global``: int32 ``[batch + 1]`` on the model's device, every length a multiple of
    ``2 * world_size`` (other lengths give wrong results silently). ``max_seqlen_global``: the
    longest sequence; when omitted it is read from the tensor (one host sync per step, here, never
    in the layers). ``check_lengths``: validation mode (a host sync, off by default), raises
    ValueError naming the first sequence whose length is not a multiple of ``2 * world_size``.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
    if check_lengths:
        _check_zigzag_lengths(cu_seqlens_global, world)
    if max_seqlen_global is None:
        lengths = cu_seqlens_global[1:] - cu_seqlens_global[:-1]
        max_seqlen_global = int(lengths.max()) if lengths.numel() else 0  # sync-ok: once a step
    global _params
    _params = ZigzagParams(cu_seqlens_global,
                           torch.div(cu_seqlens_global, world, rounding_mode="floor"),
                           max_seqlen_global // world, group, heads_k_stride)
    return _params


def kvonce_zigzag_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                            scaling: float | None = None, **kwargs):
    """transformers attention function: ``query [1, nheads, T, d]``, ``key/value [1, nheads_k, T,
    d]`` (this rank's zigzag tokens of the packed row) -> ``(out [1, T, nheads, d], None)``."""
    if _params is None:
        raise RuntimeError("call kvonce.integrations.hf.update_zigzag_params(cu_seqlens, group) "
                           "for the step's packed batch first")
    if query.shape[0] != 1:
        raise ValueError(f"{NAME} takes one packed row of sequences (batch 1), got batch "
                         f"{query.shape[0]}")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, d] views
    stride = _params.heads_k_stride or k.shape[1]
    out = zigzag_llama3_flash_attn_varlen_func(
        q, k, v, _params.cu_seqlens_local, _params.cu_seqlens_global, _params.max_seqlen_local,
        _params.max_seqlen_local * 2, stride, softmax_scale=scaling, dropout_p=dropout,
        group=_params.group)
    return out.unsqueeze(0), None


def register() -> None:
    """Register ``"kvonce_zigzag"`` and, for continuous batching (``generate_batch``),
    ``"paged|kvonce"`` (``kvonce.integrations.hf_paged``) with transformers' ``AttentionInterface``."""
    from transformers import AttentionInterface

    from . import hf_paged

    AttentionInterface.register(NAME, kvonce_zigzag_attention)
    hf_paged.register()
