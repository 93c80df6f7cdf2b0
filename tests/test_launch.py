"""kernels/_launch.py: the direct launch (Triton 3.6's C launcher, cached per specialization key)
and its two ways back to Triton's own launch: a Triton release it was not written for, and an
installed launch hook (profilers). The GPU tests run the same calls both ways and compare bit for
bit; under the interpreter every launch is Triton's anyway, so only the version rule runs there.
"""
from __future__ import annotations

import pytest
import torch
import triton
from conftest import HAS_CUDA
from test_decode import make_paged

import kvonce.kernels._launch as L
from kvonce import PagedDecodePlan, append_paged_kv, fused_zigzag_llama3_flash_attn_varlen_forward

gpu_only = pytest.mark.skipif(not HAS_CUDA, reason="the direct launch exists only on a CUDA GPU")


@pytest.mark.parametrize("version, release", [("3.6.0", (3, 6)), ("3.6.1+git0a1b2c3", (3, 6)),
                                              ("3.10.0", (3, 10)), ("3.7.0rc1", (3, 7)),
                                              ("3.4.0", (3, 4))])
def test_release_parsing(version, release):
    assert L._release(version) == release


def test_cached_launch_only_on_tested_releases():
    expected = L._release(triton.__version__) in L.CACHED_LAUNCH_VERSIONS
    assert L.cached_launch_enabled == expected
    assert L._release("3.5.1") not in L.CACHED_LAUNCH_VERSIONS


def _decode_and_append():
    """One decode plan run, one append, one dual-group forward: every launch wrapper kind."""
    dtype = torch.float16
    lens = [300, 17, 1024]
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=16, nheads_k=2, head_dim=128,
                                                  dtype=dtype)
    q = torch.randn(len(lens), 1, 8, 128, dtype=dtype, device="cuda")
    plan = PagedDecodePlan(q, k_cache, v_cache, seqlens, table, num_splits=2)
    k_new = torch.randn(len(lens), 1, 2, 128, dtype=dtype, device="cuda")
    append_paged_kv(k_new, k_new.clone(), k_cache, v_cache, seqlens, table)
    decoded = plan.run(q, k_cache, v_cache, seqlens + 1, table)
    cu = torch.tensor([0, 192, 320], dtype=torch.int32, device="cuda")
    q0, q1 = (torch.randn(320, 8, 128, dtype=dtype, device="cuda") for _ in range(2))
    k, v = (torch.randn(320, 2, 128, dtype=dtype, device="cuda") for _ in range(2))
    fused = fused_zigzag_llama3_flash_attn_varlen_forward(q0, q1, k, v, cu, cu, cu, 192, 192, 192,
                                                          64, 192)
    return (decoded, k_cache.clone(), *fused)


def _same_inputs(fn):
    torch.manual_seed(0)
    return fn()


@gpu_only
def test_triton_launch_when_the_release_is_untested(monkeypatch):
    """``cached_launch_enabled = False`` (what a release outside CACHED_LAUNCH_VERSIONS gets):
    every launch goes through ``kernel[grid]``, nothing is cached, results are bit-identical."""
    direct = _same_inputs(_decode_and_append)
    monkeypatch.setattr(L, "cached_launch_enabled", False)
    monkeypatch.setattr(L, "_compiled", {})
    via_triton = _same_inputs(_decode_and_append)
    assert L._compiled == {}
    for a, b in zip(direct, via_triton):
        assert torch.equal(a, b)


@gpu_only
def test_launch_hook_sends_every_launch_through_triton():
    """A profiler's launch hook must see kvonce's launches: with one installed, launches that
    were cached before go through Triton (the hook is called) and give the same results."""
    if not hasattr(getattr(triton, "knobs", None), "runtime"):
        pytest.skip(f"triton {triton.__version__} has no triton.knobs launch hooks")
    direct = _same_inputs(_decode_and_append)  # warm: every key cached
    assert L._compiled
    seen = []
    hook = lambda metadata: seen.append(metadata)  # noqa: E731
    hooks = triton.knobs.runtime.launch_enter_hook
    hooks.add(hook)
    try:
        assert L._knob_hooks_active()
        hooked = _same_inputs(_decode_and_append)
    finally:
        hooks.remove(hook)
    assert not L._knob_hooks_active()
    assert len(seen) >= 3  # decode (and its merge), append, dual-group forward
    for a, b in zip(direct, hooked):
        assert torch.equal(a, b)


def _decode_signature():
    """``_paged_decode_kernel``'s parameters (the interpreter's wrapper has no ``params``)."""
    import inspect

    from kvonce.kernels.paged_decode import _paged_decode_kernel

    return list(inspect.signature(_paged_decode_kernel.fn).parameters.values())


def test_constexpr_tail_fills_defaults_in_signature_order():
    """The cached launch passes every parameter after the runtime ones positionally: a launch
    that leaves a defaulted constexpr out (the cascade's suffix launch and the decode kernel's
    SWAP_AB, 2026-11-26) gets its default, in signature order, instead of a KeyError."""
    import inspect
    from types import SimpleNamespace

    from kvonce.kernels._launch import constexpr_tail

    sig = _decode_signature()
    kernel = SimpleNamespace(params=[
        SimpleNamespace(name=p.name, default=None if p.default is inspect.Parameter.empty
                        else p.default) for p in sig])
    first = next(i for i, p in enumerate(sig) if "constexpr" in str(p.annotation))
    names = [p.name for p in sig[first:]]
    assert "SWAP_AB" in names
    given = {name: f"value of {name}" for name in names if name != "SWAP_AB"}
    tail = constexpr_tail(kernel, first, given)
    assert len(tail) == len(names)
    for name, value in zip(names, tail):
        assert value == (False if name == "SWAP_AB" else f"value of {name}")


def test_cascade_suffix_launch_names_every_decode_constexpr():
    """The cascade's suffix launch of the decode kernel spells out each of its constexprs."""
    import inspect

    from kvonce.kernels import prefix_decode

    source = inspect.getsource(prefix_decode.CascadeLaunch.__init__)
    suffix = source[source.index("# 2. sequence-first"):source.index("# 3. combine")]
    names = [p.name for p in _decode_signature() if "constexpr" in str(p.annotation)]
    assert "SWAP_AB" in names
    missing = [name for name in names if f"{name}=" not in suffix]
    assert not missing, missing


def test_alignment_key_names_each_misaligned_pointer():
    """All pointers 16-byte aligned: the key is True (one OR over the pointers). Otherwise it
    names which ones are aligned, so a kernel Triton specialized for one misaligned set (some
    other pointer assumed aligned) is never reused for a call misaligned elsewhere."""
    buf = torch.empty(64, dtype=torch.uint8)
    a, b = buf[:16], buf[16:32]  # storage offsets 0 and 16
    off_a, off_b = buf[1:17], buf[17:33]
    assert a.data_ptr() % 16 == 0  # torch's CPU allocator aligns to 64
    assert L.alignment_key(a, b) is True
    first, second = L.alignment_key(off_a, b), L.alignment_key(a, off_b)
    assert first == (False, True) and second == (True, False) and first != second


def test_combine_pdl_reaches_the_launch_options(monkeypatch):
    """``paged_combine.COMBINE_PDL`` turns on ``combine_pdl`` per decode family (Hopper only,
    never under the interpreter, which has no ``griddepcontrol``); ``set_combine_pdl`` sets
    every family; ``combine_launch_shape(pdl=True)`` sets the combine's ``PDL_WAIT``;
    ``launch(..., launch_pdl=True)`` compiles with Triton's ``launch_pdl`` option, which the
    cached launch then reuses."""
    from kvonce.kernels import paged_combine

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(paged_combine, "interpreter_active", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setattr(paged_combine, "COMBINE_PDL",
                        {"triton": False, "gluon": True, "prefix": False})
    assert paged_combine.combine_pdl(cuda, "gluon")
    assert not paged_combine.combine_pdl(cuda, "triton")
    assert not paged_combine.combine_pdl(cuda, "prefix")
    paged_combine.set_combine_pdl(True)
    assert all(paged_combine.combine_pdl(cuda, f) for f in ("triton", "gluon", "prefix"))
    assert not paged_combine.combine_pdl(torch.device("cpu"), "gluon")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    assert not paged_combine.combine_pdl(cuda, "gluon")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setattr(paged_combine, "interpreter_active", lambda: True)
    assert not paged_combine.combine_pdl(cuda, "gluon")
    paged_combine.set_combine_pdl(False)
    monkeypatch.setattr(paged_combine, "interpreter_active", lambda: False)
    assert not paged_combine.combine_pdl(cuda, "gluon")
    assert paged_combine.combine_launch_shape(8, 1, 2, 16, 128)[1]["PDL_WAIT"] is False
    assert paged_combine.combine_launch_shape(8, 1, 2, 16, 128, pdl=True)[1]["PDL_WAIT"] is True

    seen = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append(kw)

    monkeypatch.setattr(L, "cached_launch_enabled", False)
    L.launch(Kernel(), "k", (1, 1, 1), (), {"A": 1}, 4, 3, 0, launch_pdl=True)
    L.launch(Kernel(), "k", (1, 1, 1), (), {"A": 1}, 4, 3, 0)
    assert seen[0]["launch_pdl"] is True and "launch_pdl" not in seen[1]


def test_tma_descriptor_launch_matches_tritons_wrapper(monkeypatch):
    """The direct path for launches with TMA descriptors (``tensordesc_launcher`` +
    ``expand_descriptors``) hands the C launcher exactly what Triton 3.6's
    ``wrap_handle_tensordesc`` does, encodes a kept descriptor once, re-encodes a different
    object (even one equal to it, even at a reused id) and does not keep a descriptor alive."""
    import gc
    import types
    import weakref

    driver = pytest.importorskip("triton.backends.nvidia.driver")
    from triton.tools.tensor_descriptor import TensorDescriptor

    encodings = []

    def fake_encode(desc, meta):   # stands in for cuTensorMapEncodeTiled (needs a GPU)
        encodings.append(desc)
        return [("map", desc.base.data_ptr(), meta["swizzle"]), *desc.shape, *desc.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", fake_encode)
    monkeypatch.setattr(L, "_encoded", {})
    seen = []
    signature = {"a": "*fp16", "kd": "tensordesc<fp8[16, 128]>", "n": "i32",
                 "vd": "tensordesc<fp8[16, 128]>", "m": "i32", "C": "constexpr"}
    metas = [{"swizzle": 3}, {"swizzle": 2}]
    inner = driver.wrap_handle_tensordesc(lambda *a: seen.append(a), signature, metas)
    run = types.SimpleNamespace(launch=inner, launch_cooperative_grid=False, launch_pdl=True,
                                global_scratch_size=0, profile_scratch_size=0)
    launcher, coop, pdl, positions = L.tensordesc_launcher(types.SimpleNamespace(run=run))
    assert (coop, pdl) == (False, True)
    assert positions == ((1, metas[0]), (3, metas[1]))

    def desc(t):
        return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], [16, 128])

    k, v = torch.zeros(64, 128, dtype=torch.uint8), torch.zeros(32, 128, dtype=torch.uint8)
    kd, vd = desc(k), desc(v)
    base = (1, 2, 3, 4, 5, False, True, None, None, "meta", None, None, None)
    args = ("a", kd, 7, vd, 9)
    inner(*base, *args, None)                                   # Triton's own wrapper
    launcher(*base, *L.expand_descriptors(args, positions), None)   # the direct path
    assert seen[0] == seen[1]
    assert len(encodings) == 4
    L.expand_descriptors(args, positions)
    assert len(encodings) == 4                                   # kept: encoded once
    L.expand_descriptors(("a", desc(k), 7, vd, 9), positions)
    assert len(encodings) == 5                                   # another object: encoded
    ref = weakref.ref(kd)
    del kd, args
    encodings.clear()
    gc.collect()
    assert ref() is None                                         # not kept alive
    kd2 = desc(v)                                                # may reuse the freed id
    out = L.expand_descriptors(("a", kd2, 7, vd, 9), positions)
    assert out[1] == ("map", v.data_ptr(), 3) and encodings == [kd2]


def test_tma_descriptor_launch_declines_other_launchers():
    """No descriptor arguments, scratch to allocate, or a launcher Triton did not wrap: None
    (``launch`` then calls ``ck.run``)."""
    import types

    driver = pytest.importorskip("triton.backends.nvidia.driver")

    def plain_launcher(*a):
        return a

    def run(launch, scratch=0):
        return types.SimpleNamespace(run=types.SimpleNamespace(
            launch=launch, launch_cooperative_grid=False, launch_pdl=False,
            global_scratch_size=scratch, profile_scratch_size=0))

    assert L.tensordesc_launcher(run(plain_launcher)) is None
    no_desc = driver.wrap_handle_tensordesc(plain_launcher, {"a": "*fp16"}, None)
    assert L.tensordesc_launcher(run(no_desc)) is None
    sig = {"d": "tensordesc<fp8[16, 128]>"}
    wrapped = driver.wrap_handle_tensordesc(plain_launcher, sig, [{"swizzle": 3}])
    assert L.tensordesc_launcher(run(wrapped)) is not None
    assert L.tensordesc_launcher(run(wrapped, scratch=128)) is None
    decomposed = driver.wrap_handle_tensordesc(plain_launcher, sig, None)
    assert L.tensordesc_launcher(run(decomposed)) is None
