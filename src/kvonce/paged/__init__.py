"""The paged KV cache: checks, quantized formats, decode, varlen prefill (prefill, chunked prefill
and decode rows in one launch), the shared-prefix cascade, append, and
flash-attn's ``flash_attn_with_kvcache`` name on top.

Modules import downward only, never in a circle (module: what it imports from the package)::

    _alloc, checks, quant, splits, prefix_tree,
    key_transform, outliers                       none (kernels/, _validate, _dispatch only)
    merge                                         _alloc, checks
    prefix                                        _alloc, splits, prefix_tree
    decode                                        _alloc, checks, splits, prefix
    prefill                                       _alloc, checks, decode, key_transform,
                                                  outliers
    append                                        checks, quant, outliers
    flash_attn                                    append, decode, prefill, key_transform
                                                  (and kvonce.varlen)
"""
from .append import append_paged_kv
from .decode import PagedDecodePlan, choose_num_splits, paged_attention
from .flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
from .key_transform import KeyTransform, calibrate_key_transform
from .merge import merge_attention_states
from .outliers import KeyOutliers, calibrate_outlier_channels, new_key_outliers
from .prefill import PagedPrefillPlan, paged_prefill
from .prefix import CascadeCostModel, CascadePlan, plan_cascade
from .prefix_tree import PrefixNode, find_shared_prefixes
from .quant import KV_FORMATS, dequantize_kv, quantize_kv

__all__ = ["paged_attention", "PagedDecodePlan", "choose_num_splits", "append_paged_kv",
           "merge_attention_states", "flash_attn_with_kvcache", "quantize_kv", "dequantize_kv",
           "KV_FORMATS", "find_shared_prefixes", "PrefixNode", "CascadeCostModel", "CascadePlan",
           "plan_cascade", "paged_prefill", "PagedPrefillPlan",
           "flash_attn_varlen_func", "KeyTransform", "calibrate_key_transform", "KeyOutliers",
           "calibrate_outlier_channels", "new_key_outliers"]
