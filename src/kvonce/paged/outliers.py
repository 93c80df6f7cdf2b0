"""Dense-and-sparse keys: a quantized cache whose keys keep a few outlier channels per KV head at
the queries' precision (issue 26 section 2; KVQuant's dense-and-sparse with a fixed channel set).

Real keys carry a few channels far larger than the rest (fixed-sign offsets before RoPE, which
RoPE turns with position over low-frequency rotary pairs), and a per-token (int8, int4) or
per-head (fp8) scale then spends its range on them. ``KeyOutliers`` keeps ``n`` (8 or 16)
channels per KV head out of the quantized keys:

    stored key   quantize_kv(k with those channels set to 0)     (any kv_format; V unchanged)
    side cache   values[page, slot, kv_head, :] = k[kv_head, channels[kv_head]]   (fp16)
    score        q . dequantize(stored) + q[channels] . values

The values are fp16 by default, for bf16 queries too: bf16's 8 significant bits put an
outlier's rounding (|k| / 512) above int8's error on the other channels (measured: int8 2.0x its
random-key error with bf16 values, docs/notes.md), fp16's 11 do not. fp16 holds |k| <= 65504
(larger values saturate there, as fp8 saturates at 448 times its scale). Values in q's own dtype
(bf16, fp32) are allowed too.

The kernels add the second term as one more small dot per key tile (``kernels/paged_outliers``).
The channels are fixed per (layer, KV head) when the cache is created (``calibrate_outlier_
channels`` on calibration keys), so pages shared by several sequences are stored once. Bytes per
token and KV head: ``2n`` more (fp16/bf16 values; n = 8: fp8 K+V 256 -> 272 B, 1.88x under a
16-bit cache's 512; int8 280, 1.83x; int4 160, 3.20x). Measured accuracy: docs/notes.md,
"Dense-and-sparse keys".
"""
from __future__ import annotations

import dataclasses

import torch

from .. import _validate as V

OUTLIER_COUNTS = (8, 16)  # 16-byte runs of fp16 values a key: the kernels' loads stay wide
VALUE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _is_real(t: torch.Tensor) -> bool:
    """A tensor whose values can be read here (not fake, meta or a tracing proxy)."""
    return (type(t) is torch.Tensor and t.device.type != "meta"
            and not torch.compiler.is_compiling())


@dataclasses.dataclass(frozen=True, eq=False)
class KeyOutliers:
    """The outlier channels of one layer's quantized key cache and their values.

    ``channels``: int32 ``[nheads_k, n]``, ``n`` 8 or 16, each row's channels distinct and in
    ``[0, head_dim)`` (checked here, where the values are on hand: not per call).
    ``values``: ``[num_pages, page_size, nheads_k, n]`` fp16 (any queries), or the queries'
    dtype (bf16, fp32), last dim contiguous, every stride a multiple of 8 and the data 16-byte
    aligned (a fresh tensor is): the side cache, written by ``append_paged_kv(...,
    key_outliers=)``.
    Build one with ``new_key_outliers``; pass it to ``append_paged_kv``, ``paged_attention``,
    ``PagedDecodePlan.run``, ``paged_prefill`` and ``PagedPrefillPlan.run``.
    """

    channels: torch.Tensor
    values: torch.Tensor

    def __post_init__(self):
        V.check_tensor("channels", self.channels, ndim=2, dtypes=(torch.int32,))
        V.check_tensor("values", self.values, ndim=4, dtypes=VALUE_DTYPES)
        heads_k, n = self.channels.shape
        if n not in OUTLIER_COUNTS:
            raise ValueError(f"KeyOutliers keeps 8 or 16 channels per KV head, got {n}")
        if not self.channels.is_contiguous():
            raise ValueError("KeyOutliers.channels must be contiguous")
        if self.values.shape[2:] != (heads_k, n):
            raise ValueError(f"KeyOutliers.values must be [num_pages, page_size, {heads_k}, {n}] "
                             f"for channels {tuple(self.channels.shape)}, got "
                             f"{tuple(self.values.shape)}")
        if (self.values.stride(-1) != 1 or any(s % 8 for s in self.values.stride()[:3])
                or (_is_real(self.values) and self.values.data_ptr() % 16)):
            raise ValueError("KeyOutliers.values must have a contiguous last dim, strides that "
                             "are multiples of 8 and 16-byte aligned data (a fresh tensor has)")
        V.check_same_device(channels=self.channels, values=self.values)
        top = -1
        if _is_real(self.channels) and self.channels.numel():
            c = self.channels.cpu()  # sync-ok: once, when the cache is made (not per call)
            if int(c.min()) < 0:
                raise ValueError("KeyOutliers.channels must be >= 0")
            if (c.sort(dim=1).values.diff(dim=1) == 0).any():
                raise ValueError("KeyOutliers.channels: each KV head's channels must be distinct")
            top = int(c.max())
        object.__setattr__(self, "max_channel", top)

    @property
    def num_channels(self) -> int:
        return self.channels.shape[1]

    def split(self, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys ``k [..., nheads_k, d]`` -> ``(dense, sparse)``: ``dense`` is ``k`` with the
        outlier channels set to 0 (k's dtype; quantize it as a key), ``sparse [..., nheads_k,
        n]`` their values in the side cache's dtype (rounded to nearest; into fp16, saturated at
        +-65504, not inf)."""
        index = self.channels.long().expand(*k.shape[:-1], -1)
        dense = k.scatter(-1, index, 0)
        sparse = k.gather(-1, index)
        if self.values.dtype == torch.float16 and k.dtype != torch.float16:
            sparse = sparse.float().clamp(-65504.0, 65504.0)
        return dense, sparse.to(self.values.dtype)

    def merge(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """The inverse of ``split`` (in ``dense``'s dtype): keys as the kernels see them, e.g.
        ``merge(dequantize_kv(k_cache, k_scale, fmt), values)`` for a reference."""
        index = self.channels.long().expand(*dense.shape[:-1], -1)
        return dense.scatter(-1, index, sparse.to(dense.dtype))

    def check_cache(self, k_cache: torch.Tensor, kv_format, head_dim: int,
                    like: torch.Tensor) -> None:
        """The checks of an append or attention call over ``k_cache``: a quantized cache, the
        side cache's pages and heads matching it, channels below ``head_dim``, and the tensors
        on ``like``'s device."""
        if kv_format is None:
            raise ValueError("key_outliers is for quantized caches (fp8/int8/int4): a 16-bit "
                             "cache keeps every channel already")
        if self.values.shape[:3] != k_cache.shape[:3]:
            raise ValueError(f"key_outliers.values must be [{', '.join(map(str, k_cache.shape[:3]))}"
                             f", n] like k_cache's pages, got {tuple(self.values.shape)}")
        if self.max_channel >= head_dim:
            raise ValueError(f"key_outliers.channels must be < head dim {head_dim}, got "
                             f"{self.max_channel}")
        V.check_same_device(like=like, channels=self.channels, values=self.values)

    def check_for(self, q: torch.Tensor, k_cache: torch.Tensor, kv_format) -> None:
        """``check_cache`` for attention with queries ``q [..., nheads, head_dim]``, and the
        values' dtype (fp16 or q's)."""
        self.check_cache(k_cache, kv_format, q.shape[-1], q)
        if self.values.dtype not in (torch.float16, q.dtype):
            raise ValueError(f"key_outliers.values must be float16 or q's dtype {q.dtype}, got "
                             f"{self.values.dtype}")


def new_key_outliers(channels: torch.Tensor, num_pages: int, page_size: int,
                     dtype: torch.dtype = torch.float16) -> KeyOutliers:
    """An empty side cache for ``channels`` (int32 ``[nheads_k, n]``) on its device:
    ``values`` zeros ``[num_pages, page_size, nheads_k, n]`` in ``dtype`` (fp16, or the
    queries' dtype)."""
    heads_k, n = channels.shape
    values = torch.zeros(num_pages, page_size, heads_k, n, dtype=dtype, device=channels.device)
    return KeyOutliers(channels, values)


def calibrate_outlier_channels(keys: torch.Tensor, n: int = 8) -> torch.Tensor:
    """The ``n`` channels of largest magnitude per KV head over calibration keys ``keys [...,
    nheads_k, d]`` (post-RoPE keys over the position range the cache will hold): int32
    ``[nheads_k, n]``, ascending. RoPE turns an offset between the two channels of a rotary
    pair, so both stand out and both are kept (n = 8: four pairs; 4 channels missed half of
    each pair in the study and lost 4.2x)."""
    V.check_tensor("keys", keys, dtypes=V.ATTN_DTYPES)
    if keys.dim() < 2:
        raise ValueError(f"keys must be [..., nheads_k, d], got shape {tuple(keys.shape)}")
    d = keys.shape[-1]
    if n not in OUTLIER_COUNTS or n > d:
        raise ValueError(f"n must be 8 or 16 (and at most the head dim {d}), got {n}")
    amax = keys.float().abs().reshape(-1, keys.shape[-2], d).amax(0)
    return amax.topk(n, dim=-1).indices.sort(dim=-1).values.to(torch.int32).contiguous()
