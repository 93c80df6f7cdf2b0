"""DescriptorCache's keys (CPU: the non-owning alias is CUDA's and runs in the GPU test
tests/test_gluon_decode.py::test_gluon_decode_follows_the_caches_it_is_given)."""
from types import SimpleNamespace

import torch

from kvonce.kernels import tma_descriptors
from kvonce.kernels.tma_descriptors import DescriptorCache


def _counting(builds):
    def build(t):      # a descriptor over a view of t (the Gluon decode's: a dtype view)
        builds.append(t)
        return SimpleNamespace(base=t.view(torch.uint8))
    return build


def test_descriptors_are_kept_by_address_dtype_shape_and_strides(monkeypatch):
    monkeypatch.setattr(tma_descriptors, "non_owning_alias", lambda t: ("alias", t.data_ptr()))
    builds = []
    build = _counting(builds)
    cache = DescriptorCache(capacity=4)
    a, b = torch.zeros(4, 8), torch.zeros(4, 8)
    first = cache.get(build, a)
    assert first.base == ("alias", a.data_ptr())
    assert cache.get(build, a) is first and len(builds) == 1
    assert cache.get(build, a.view(8, 4)) is not first          # another shape
    assert cache.get(build, a[1:]) is not first                 # another address
    assert cache.get(build, b) is not first and len(builds) == 4
    assert len(cache) == 4
    cache.get(build, a.view(2, 16))                            # full: cleared, then kept
    assert len(cache) == 1 and len(builds) == 5
    assert cache.get(build, a) is not first and len(builds) == 6


def test_a_descriptor_over_a_copy_is_not_kept(monkeypatch):
    monkeypatch.setattr(tma_descriptors, "non_owning_alias", lambda t: ("alias", t.data_ptr()))
    builds = []

    def build(t):
        builds.append(t)
        return SimpleNamespace(base=t.t().contiguous())   # other memory: a copy

    cache = DescriptorCache()
    a = torch.zeros(4, 8)
    d = cache.get(build, a)
    assert isinstance(d.base, torch.Tensor) and d.base.data_ptr() != a.data_ptr()
    cache.get(build, a)
    assert len(builds) == 2 and len(cache) == 0
