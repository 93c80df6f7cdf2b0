"""Zigzag llama3 context parallelism: the original two-call path and kvonce's fused replacement."""
from .fused import fused_zigzag_backward, replace_execute_grouped_attention_with_fused_varlen
from .cp import (zigzag_llama3_flash_attn_varlen_func,
                 zigzag_llama3_flash_attn_varlen_kvpacked_func,
                 zigzag_llama3_flash_attn_varlen_qkvpacked_func)
from .grouped import execute_grouped_attention, varlen_attention_backend
from .layout import (
    compute_kv_slices_for_groups,
    rearrange_kv_from_zigzag_to_contiguous,
    split_q_by_zigzag_chunk_index,
    zigzag_shard,
    zigzag_to_contiguous_index,
    zigzag_unshard,
)

__all__ = [
    "split_q_by_zigzag_chunk_index",
    "rearrange_kv_from_zigzag_to_contiguous",
    "zigzag_to_contiguous_index",
    "compute_kv_slices_for_groups",
    "execute_grouped_attention",
    "varlen_attention_backend",
    "replace_execute_grouped_attention_with_fused_varlen",
    "fused_zigzag_backward",
    "zigzag_shard",
    "zigzag_unshard",
    "zigzag_llama3_flash_attn_varlen_func",
    "zigzag_llama3_flash_attn_varlen_kvpacked_func",
    "zigzag_llama3_flash_attn_varlen_qkvpacked_func",
]
