"""kvonce: Triton attention kernels that load each K/V tile once for every query row that needs it."""
from .varlen import (fused_zigzag_llama3_flash_attn_varlen_backward,
                     fused_zigzag_llama3_flash_attn_varlen_forward,
                     fused_zigzag_llama3_flash_attn_varlen_func)
from .paged import (KeyOutliers, KeyTransform, PagedDecodePlan, PagedPrefillPlan, append_paged_kv,
                    calibrate_key_transform, dequantize_kv, find_shared_prefixes, flash_attn_varlen_func, flash_attn_with_kvcache,
                    calibrate_outlier_channels, merge_attention_states, new_key_outliers,
                    paged_attention, paged_prefill, quantize_kv)
from . import flops  # noqa: E402  (after the ops exist: registers their FlopCounterMode formulas)

__all__ = ["fused_zigzag_llama3_flash_attn_varlen_forward",
           "fused_zigzag_llama3_flash_attn_varlen_backward", "fused_zigzag_llama3_flash_attn_varlen_func",
           "paged_attention", "PagedDecodePlan", "append_paged_kv", "merge_attention_states", "flash_attn_with_kvcache",
           "quantize_kv", "dequantize_kv", "find_shared_prefixes", "paged_prefill", "PagedPrefillPlan",
           "flash_attn_varlen_func", "KeyTransform", "calibrate_key_transform", "KeyOutliers",
           "calibrate_outlier_channels", "new_key_outliers"]
__version__ = "0.1.0"
