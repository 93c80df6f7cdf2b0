"""A fixed per-(layer, KV head) transform of keys before they are quantized, so that keys with
outlier channels quantize as well as keys without (issue 26, docs/notes.md "Keys with outlier
channels").

Real keys carry a few channels with large offsets of fixed sign and a per-token scale spends its
range on them. ``KeyTransform`` stores, per KV head, a centre ``c`` and a smoothing ``s`` (``d``
float32 each) and a fixed orthonormal Hadamard matrix ``H``:

    stored key  k' = ((k - c) / s) @ H          (then quantized in any ``kv_format``)
    query       q' = (q * s) @ H                (per call, before the kernel)
    q' . k'   = q . k - q . c

so the scores of one query row move by the same ``q . c`` for every key: the softmax, and so the
attention output, are those of the untransformed keys (up to quantization), and the LSE is
``lse(q', k') + softmax_scale * q . c``. Values are not transformed. Nothing is stored per key
(the byte ratio of every format is unchanged), and since ``c, s`` are fixed when the cache is
created (like fp8's per-head scale), pages shared by several sequences are quantized once.

Measured on synthetic keys through this library path (scripts/key_transform_accuracy.py, CPU,
``alpha = 0.75``): each format's output error on keys with fixed-sign offsets and post-RoPE
offsets at 1k positions is 0.98-1.16x its error on random keys (today's formats: 4.4-25x); on
zero-mean scaled channels and post-RoPE offsets over 8k positions 1.1-1.8x (today: 2.2-19x).
``c`` must be calibrated over the position range the cache will hold.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from .. import _validate as V


@functools.lru_cache(maxsize=8)
def _hadamard_cpu(d: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / d ** 0.5).float()


def hadamard(d: int, device=None) -> torch.Tensor:
    """Sylvester Hadamard matrix ``[d, d]`` float32 scaled to be orthonormal (``H @ H.T == I``,
    symmetric); ``d`` a power of two."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two head dim, got {d}")
    return _hadamard_cpu(d).to(device)


@dataclasses.dataclass(frozen=True, eq=False)
class KeyTransform:
    """``centre``, ``smooth``: float32 ``[nheads_k, d]`` (``smooth > 0``); ``rotate``: apply the
    fixed Hadamard (``d`` a power of two). Build one with ``calibrate_key_transform``."""

    centre: torch.Tensor
    smooth: torch.Tensor
    rotate: bool = True

    def __post_init__(self):
        for name in ("centre", "smooth"):
            t = getattr(self, name)
            V.check_tensor(name, t, ndim=2, dtypes=(torch.float32,))
        if self.centre.shape != self.smooth.shape:
            raise ValueError(f"centre {tuple(self.centre.shape)} and smooth "
                             f"{tuple(self.smooth.shape)} must both be [nheads_k, d]")
        if self.centre.device != self.smooth.device:
            raise ValueError("centre and smooth must be on one device")
        if self.rotate:
            hadamard(self.centre.shape[1])  # raises for a head dim that is no power of two
        # (Values are not checked here: smooth > 0 is calibrate_key_transform's promise; reading
        # a CUDA tensor would sync.)

    @property
    def nheads_k(self) -> int:
        return self.centre.shape[0]

    @property
    def head_dim(self) -> int:
        return self.centre.shape[1]

    def _check(self, x: torch.Tensor, name: str, heads_multiple: bool) -> None:
        V.check_tensor(name, x, dtypes=V.ATTN_DTYPES)
        if x.dim() < 2 or x.shape[-1] != self.head_dim:
            raise ValueError(f"{name} must be [..., nheads, {self.head_dim}], got "
                             f"{tuple(x.shape)}")
        h = x.shape[-2]
        if (h % self.nheads_k != 0) if heads_multiple else (h != self.nheads_k):
            want = f"a multiple of {self.nheads_k}" if heads_multiple else str(self.nheads_k)
            raise ValueError(f"{name} has {h} heads, the transform {self.nheads_k} KV heads: "
                             f"expected {want}")
        if x.device != self.centre.device:
            raise ValueError(f"{name} is on {x.device}, the transform on {self.centre.device}")

    def _rotated(self, x: torch.Tensor) -> torch.Tensor:
        return x @ hadamard(self.head_dim, x.device) if self.rotate else x

    def keys(self, k: torch.Tensor) -> torch.Tensor:
        """``k [..., nheads_k, d]`` -> float32 ``((k - c) / s) @ H``: what ``quantize_kv`` and
        ``append_paged_kv`` store in place of ``k``."""
        self._check(k, "k", heads_multiple=False)
        return self._rotated((k.float() - self.centre) / self.smooth)

    def queries(self, q: torch.Tensor) -> torch.Tensor:
        """``q [..., nheads, d]`` (q head ``i`` reads KV head ``i // (nheads / nheads_k)``) ->
        ``(q * s) @ H`` in q's dtype, computed in float32."""
        self._check(q, "q", heads_multiple=True)
        group = q.shape[-2] // self.nheads_k
        s = self.smooth.repeat_interleave(group, dim=0)
        return self._rotated(q.float() * s).to(q.dtype)

    def lse_offset(self, q: torch.Tensor, softmax_scale: float) -> torch.Tensor:
        """``softmax_scale * q . c`` float32 ``[..., nheads]``: add it to the LSE of the transformed
        query against transformed keys to get the LSE against the original keys."""
        self._check(q, "q", heads_multiple=True)
        group = q.shape[-2] // self.nheads_k
        c = self.centre.repeat_interleave(group, dim=0)
        return (q.float() * c).sum(-1) * softmax_scale


def calibrate_key_transform(keys: torch.Tensor, *, alpha: float = 0.75, rotate: bool = True,
                            rope_pairs: bool = True) -> KeyTransform:
    """A ``KeyTransform`` from calibration keys ``[n, nheads_k, d]`` (post-RoPE, as the cache will
    hold them, drawn over the whole position range it will see; leave attention-sink tokens out).

    ``c`` is the keys' mean per (KV head, channel); ``s = m ** alpha`` with ``m`` the largest
    ``|k - c|`` per channel, shared by channels ``i`` and ``i + d/2`` when ``rope_pairs`` (RoPE
    turns each such pair, moving an offset between them), normalized to geometric mean 1.
    ``alpha`` 0 turns smoothing off, 1 divides each channel by its range (0.5-0.75 measured best).
    Both vectors are rounded to fp16 and kept in float32 (the stored precision of the study).
    """
    V.check_tensor("keys", keys, ndim=3, dtypes=V.ATTN_DTYPES)
    if keys.shape[0] == 0:
        raise ValueError("keys must hold at least one calibration key")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    d = keys.shape[-1]
    if rope_pairs and d % 2:
        raise ValueError(f"rope_pairs needs an even head dim, got {d}")
    kf = keys.float()
    centre = kf.mean(0).half().float()
    amax = (kf - centre).abs().amax(0)
    if rope_pairs:
        amax = torch.maximum(amax[:, : d // 2], amax[:, d // 2:]).repeat(1, 2)
    s = amax.clamp(min=1e-3) ** alpha
    s = (s / s.log().mean(-1, keepdim=True).exp()).half().float()
    return KeyTransform(centre.contiguous(), s.contiguous(), rotate)
