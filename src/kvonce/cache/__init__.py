"""Paged KV-cache bookkeeping: quantized formats (``quant``)."""
from .quant import KV_FORMATS, dequantize_kv, quantize_kv

__all__ = ["KV_FORMATS", "quantize_kv", "dequantize_kv"]
