"""kvonce: Triton attention kernels that load each K/V tile once for every query row that needs it."""
from .varlen import fused_zigzag_llama3_flash_attn_varlen_forward

__all__ = ["fused_zigzag_llama3_flash_attn_varlen_forward"]
__version__ = "0.1.0"
