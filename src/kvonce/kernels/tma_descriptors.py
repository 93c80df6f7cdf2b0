"""TMA descriptors kept from one call to the next, without keeping their tensors' memory.

A Gluon launch passes its caches as host-side ``TensorDescriptor`` objects (Triton encodes each
into a ``CUtensorMap`` kernel parameter at launch). Building them in Python costs a few us each
(``__post_init__``'s checks, the layout object, the views), and a decode call builds four (K, V
and int8's / int4's scales): on the H200's host ~55-80 us a call for int8, more than the kernel's
72 us at 1 x 131072 (twenty-third session, docs/notes.md). A serving step passes the same caches
every call, so ``DescriptorCache`` keeps each descriptor under everything it encodes: the tensor's
address, dtype, shape and strides.

The descriptor's ``base`` is then swapped for a non-owning alias of the same memory (a tensor
made through ``__cuda_array_interface__``), so a kept descriptor never holds a freed cache's
memory. That is safe because the key determines the descriptor: a later tensor with the same
address, dtype, shape and strides gets a descriptor with the same bytes, whoever owns the memory
now, and an entry whose memory went away is only ever looked up by such a tensor.
"""
from __future__ import annotations

import torch

# numpy type strings of the bases the Gluon launches build descriptors over
_TYPESTR = {torch.uint8: "|u1", torch.int8: "|i1", torch.float16: "<f2",
            torch.float32: "<f4", torch.int32: "<i4"}


class _DeviceMemory:
    """``__cuda_array_interface__`` (version 3) of ``t``'s memory, owning nothing."""

    def __init__(self, t: torch.Tensor):
        self.__cuda_array_interface__ = {
            "data": (t.data_ptr(), False), "shape": tuple(t.shape), "typestr": _TYPESTR[t.dtype],
            "strides": tuple(s * t.element_size() for s in t.stride()), "version": 3}


def non_owning_alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s memory (same address, dtype, shape, strides) that does not keep it
    alive. Never read through it after ``t``'s memory is freed."""
    if t.dtype not in _TYPESTR:
        raise TypeError(f"non_owning_alias: no array-interface type for {t.dtype}")
    alias = torch.as_tensor(_DeviceMemory(t), device=t.device)
    if alias.data_ptr() != t.data_ptr() or alias.stride() != t.stride():
        raise RuntimeError(f"non_owning_alias: torch made an alias at {alias.data_ptr():#x} "
                           f"strides {alias.stride()} of a tensor at {t.data_ptr():#x} strides "
                           f"{t.stride()}")
    return alias


class DescriptorCache:
    """``get(build, t)``: ``build(t)`` (a ``TensorDescriptor`` over a view of ``t``), kept under
    ``(build's name, t's address, dtype, shape, strides)`` with its base a non-owning alias. At
    most ``capacity`` entries (cleared when full): four a layer of a 64-layer model by default."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._entries: dict = {}

    def get(self, build, t: torch.Tensor):
        key = (build.__name__, t.data_ptr(), t.dtype, t.shape, t.stride())
        desc = self._entries.get(key)
        if desc is None:
            if len(self._entries) >= self.capacity:
                self._entries.clear()
            desc = build(t)
            if desc.base.data_ptr() != t.data_ptr():
                return desc     # built over other memory (a copy): kept by nothing, not cached
            desc.base = non_owning_alias(desc.base)
            self._entries[key] = desc
        return desc

    def __len__(self) -> int:
        return len(self._entries)
