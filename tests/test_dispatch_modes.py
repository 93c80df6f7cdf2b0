"""Custom ops visible to dispatch modes (kvonce._dispatch.use_op) and their FLOP formulas
(kvonce.flops).

Every public entry point, called under FakeTensorMode, on meta tensors, under a recording
TorchDispatchMode, under FlopCounterMode and under make_fx, goes through its ``torch.ops.kvonce``
op (fake tensors never reach Triton; the recorded call gives the direct path's numbers; the FLOP
count equals one computed here from the lengths by counting mask entries); a plain eager call
still takes the direct launch. Small shapes, CPU under the Triton interpreter or CUDA.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import triton
import triton.runtime.interpreter  # (not imported by triton itself off the interpreter)
from conftest import DEVICE, DTYPES, HAS_CUDA
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import kvonce
from kvonce import flops
from kvonce._dispatch import use_op
from kvonce.kernels import _launch
from kvonce.kernels.configs import get_dual_group_bwd_config, interpreter_active
from kvonce.reference import dual_group_attention_ref, paged_attention_ref
from kvonce.varlen import _capability
from kvonce.zigzag import (fused_zigzag_backward,
                           replace_execute_grouped_attention_with_fused_varlen,
                           split_q_by_zigzag_chunk_index, zigzag_llama3_flash_attn_varlen_func)

pytestmark = pytest.mark.skipif(not HAS_CUDA and not interpreter_active(),
                                reason="needs a CUDA GPU or TRITON_INTERPRET=1")
H, HK, D, PAGE = 4, 2, 32, 16
KVONCE_OPS = ("dual_group_fwd", "dual_group_bwd", "dual_group_fwd_zigzag", "dual_group_bwd_zigzag",
              "zigzag_cp_fwd", "zigzag_cp_bwd", "paged_decode", "paged_decode_split",
              "prefix_decode", "merge_attention_states", "append_paged_kv", "paged_prefill")


# ------------------------------------------------------------------------------------------------
# Inputs and independent FLOP counts
# ------------------------------------------------------------------------------------------------

class Rand:
    """Seeded inputs on DEVICE (drawn on the CPU: the same values on every device)."""

    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, *shape, dtype):
        return torch.randn(*shape, generator=self.g).to(device=DEVICE, dtype=dtype)


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def cu_of(lens):
    return i32([0, *torch.tensor(lens).cumsum(0).tolist()])


def mask_pairs(len_q: int, len_k: int, causal: bool = True) -> int:
    """Visible (row, key) pairs counted from the reference's bottom-right mask."""
    rows, cols = torch.arange(len_q)[:, None], torch.arange(len_k)[None, :]
    visible = cols <= rows + len_k - len_q if causal else torch.ones(len_q, len_k, dtype=bool)
    return int(visible.sum())


def fwd_flops(pairs: int) -> int:
    return 4 * D * H * pairs


# Dual group: both groups' lengths, per-sequence key ends.
LQ, LK, END0, END1 = [5, 11], [20, 33], [7, 30], [20, 33]
DUAL_PAIRS = sum(mask_pairs(q, min(e, k)) for ends in (END0, END1)
                 for q, e, k in zip(LQ, ends, LK))
DUAL_PAIRS_INT_NONCAUSAL = sum(mask_pairs(q, min(e, k), False) for e in (9, 40)
                               for q, k in zip(LQ, LK))
# Zigzag: rank 1 of world 2 holds chunks 1 and 2; local lengths 2 * c_b.
WORLD, RANK, LOCAL = 2, 1, [8, 12]
IDX = (RANK, 2 * WORLD - 1 - RANK)
ZIGZAG_PAIRS = sum(mask_pairs(n // 2, (i + 1) * (n // 2)) for n in LOCAL for i in IDX)
CP_PAIRS = sum(mask_pairs(n // 2, (i + 1) * (n // 2)) for n in LOCAL for i in (0, 1))  # world 1
# Paged decode.
LENS, Q_LEN = [37, 50], 2
DECODE_PAIRS = sum(mask_pairs(Q_LEN, n) for n in LENS)
CASCADE_LENS = [40, 45, 20]  # sequences 0 and 1 share their first two pages


def dual_inputs(dtype, grad=False):
    r = Rand(2)
    q0, q1 = r(sum(LQ), H, D, dtype=dtype), r(sum(LQ), H, D, dtype=dtype)
    k, v = r(sum(LK), HK, D, dtype=dtype), r(sum(LK), HK, D, dtype=dtype)
    if grad:
        q0, q1, k, v = (t.requires_grad_() for t in (q0, q1, k, v))
    return q0, q1, k, v, cu_of(LQ), cu_of(LQ), cu_of(LK), i32(END0), i32(END1)


def dual_forward(q0, q1, k, v, cu0, cu1, cuk, end0, end1):
    return kvonce.fused_zigzag_llama3_flash_attn_varlen_forward(
        q0, q1, k, v, cu0, cu1, cuk, max(LQ), max(LQ), max(LK), end0, end1)


def dual_forward_int_ends(q0, q1, k, v, cu0, cu1, cuk, end0, end1):
    return kvonce.fused_zigzag_llama3_flash_attn_varlen_forward(
        q0, q1, k, v, cu0, cu1, cuk, max(LQ), max(LQ), max(LK), 9, 40, causal=False)


def bwd_config(q):
    """The default backward config without dQ atomics: bitwise reproducible on a GPU too."""
    config = get_dual_group_bwd_config(_capability(q.device), q.shape[-1], q.element_size())
    return dataclasses.replace(config, atomic_dq=False)


def dual_bwd_inputs(dtype):
    args = dual_inputs(dtype)
    out0, out1, lse0, lse1 = dual_forward(*args)
    r = Rand(3)
    q0, q1, k, v, *meta = args
    return (r(*out0.shape, dtype=dtype), r(*out1.shape, dtype=dtype), q0, q1, k, v, out0, out1,
            lse0, lse1, *meta)


def dual_backward(dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1, cu0, cu1, cuk, e0, e1):
    return kvonce.fused_zigzag_llama3_flash_attn_varlen_backward(
        dout0, dout1, q0, q1, k, v, out0, out1, lse0, lse1, cu0, cu1, cuk, max(LQ), max(LQ),
        max(LK), e0, e1, config=bwd_config(q0))


def dual_func_grads(q0, q1, k, v, cu0, cu1, cuk, end0, end1):
    out0, out1 = kvonce.fused_zigzag_llama3_flash_attn_varlen_func(
        q0, q1, k, v, cu0, cu1, cuk, max(LQ), max(LQ), max(LK), end0, end1)
    return (out0, out1, *torch.autograd.grad(out0.sum() + out1.sum(), (q0, q1, k, v)))


def zigzag_inputs(dtype):
    r = Rand(4)
    cu_local = cu_of(LOCAL)
    q = r(sum(LOCAL), H, D, dtype=dtype)
    (q0, q1), (cu0, cu1), _ = split_q_by_zigzag_chunk_index(q, cu_local, WORLD, RANK)
    kv_buffer = r(2, WORLD * sum(LOCAL), HK, D, dtype=dtype)
    return q0, q1, kv_buffer, cu0, cu1, cu_local


def zigzag_forward(q0, q1, kv_buffer, cu0, cu1, cu_local):
    out, lse, _ = replace_execute_grouped_attention_with_fused_varlen(
        [q0, q1], [cu0, cu1], None, kv_buffer, None, H, D, None, 0.0, True, (-1, -1), None, False,
        WORLD, cu_local, *IDX)
    return out, lse


def zigzag_bwd_inputs(dtype):
    r = Rand(5)
    q0, q1, kv_buffer, cu0, cu1, cu_local = zigzag_inputs(dtype)
    out, lse = zigzag_forward(q0, q1, kv_buffer, cu0, cu1, cu_local)
    q = r(*out.shape, dtype=dtype)  # any local-order q: the backward's own inputs
    return r(*out.shape, dtype=dtype), q, out, lse, kv_buffer, cu_local


def zigzag_backward(dout, q, out, lse, kv_buffer, cu_local):
    return fused_zigzag_backward(dout, q, out, lse, kv_buffer, cu_local, WORLD, *IDX,
                                 config=bwd_config(q))


def paged_inputs(dtype, lens=LENS, q_len=Q_LEN, seed=6, shared_pages=0):
    """A paged cache with pages in random order (sequences 0 and 1 sharing their first
    ``shared_pages`` pages), room for a few more tokens per sequence."""
    r = Rand(seed)
    per_seq = max(lens) // PAGE + 2
    num_pages = len(lens) * per_seq
    table = torch.randperm(num_pages, generator=r.g).to(torch.int32).view(len(lens), per_seq)
    table[1, :shared_pages] = table[0, :shared_pages]
    return (r(len(lens), q_len, H, D, dtype=dtype), r(num_pages, PAGE, HK, D, dtype=dtype),
            r(num_pages, PAGE, HK, D, dtype=dtype), i32(lens), table.to(DEVICE))


def int8_paged_inputs(dtype):
    q, k_cache, v_cache, seqlens, table = paged_inputs(dtype)
    (kq, ks), (vq, vs) = kvonce.quantize_kv(k_cache, "int8"), kvonce.quantize_kv(v_cache, "int8")
    return q, kq, vq, seqlens, table, ks, vs


def new_tokens(dtype, seed=7, new_len=3):
    r = Rand(seed)
    return r(len(LENS), new_len, HK, D, dtype=dtype), r(len(LENS), new_len, HK, D, dtype=dtype)


def plan_run(num_splits, causal=True):
    def call(q, k_cache, v_cache, seqlens, table):
        plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, num_splits=num_splits,
                                      causal=causal)
        return plan.run(q, k_cache, v_cache, seqlens, table, return_lse=True)
    return call


def plan_run_int8(q, k_cache, v_cache, seqlens, table, k_scale, v_scale):
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, k_scale=k_scale,
                                  v_scale=v_scale, num_splits=1)
    return plan.run(q, k_cache, v_cache, seqlens, table, k_scale=k_scale, v_scale=v_scale,
                    return_lse=True)


def flash_attn_append_and_attend(q, k_cache, v_cache, seqlens, table, k_new, v_new):
    out, lse = kvonce.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=seqlens, block_table=table,
        causal=True, num_splits=1, return_softmax_lse=True)
    return out, lse, k_cache, v_cache


def merge_inputs(dtype):
    r = Rand(8)
    lse_b = r(6, H, dtype=torch.float32)
    lse_b[0] = float("-inf")
    return r(6, H, D, dtype=dtype), r(6, H, dtype=torch.float32), r(6, H, D, dtype=dtype), lse_b


def append(k_new, v_new, k_cache, v_cache, seqlens, table):
    kvonce.append_paged_kv(k_new, v_new, k_cache, v_cache, seqlens, table)
    return k_cache, v_cache


def append_int8(k_new, v_new, k_cache, v_cache, seqlens, table, k_scale, v_scale):
    kvonce.append_paged_kv(k_new, v_new, k_cache, v_cache, seqlens, table, k_scale=k_scale,
                           v_scale=v_scale)
    return k_cache, v_cache, k_scale, v_scale


SHARED_GROUPS = [(torch.tensor([0, 1], dtype=torch.int32), 2)]  # real CPU ids, made once


def cascade_run(q, k_cache, v_cache, seqlens, table):
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table,
                                  shared_prefix=SHARED_GROUPS, cascade=True)
    assert plan.uses_cascade
    return plan.run(q, k_cache, v_cache, seqlens, table, return_lse=True)


PREFILL_Q_LENS = [3, 1]  # a chunk over a history and a decode row


def prefill_inputs(dtype):
    q, k_cache, v_cache, seqlens, table = paged_inputs(dtype)
    return q.flatten(0, 1), k_cache, v_cache, cu_of(PREFILL_Q_LENS), seqlens, table


def paged_prefill(q, k_cache, v_cache, cu, seqlens, table):
    return kvonce.paged_prefill(q, k_cache, v_cache, cu, seqlens, table,
                                max_seqlen_q=max(PREFILL_Q_LENS), return_lse=True)


def cp_inputs(dtype, grad=False):
    r = Rand(9)
    q, k, v = (r(sum(LOCAL), n, D, dtype=dtype) for n in (H, HK, HK))
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v, cu_of(LOCAL), cu_of(LOCAL)  # world 1: local == global


def _cp_forward(q, k, v, cu_q, cu_k, deterministic: bool):
    out, lse, _ = zigzag_llama3_flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LOCAL),
                                                       max(LOCAL), 1, return_attn_probs=True,
                                                       deterministic=deterministic)
    return out, lse


def _cp_grads(q, k, v, cu_q, cu_k, deterministic: bool):
    out, _ = _cp_forward(q, k, v, cu_q, cu_k, deterministic)
    return (out, *torch.autograd.grad(out.sum(), (q, k, v)))


# (make_fx binds the traced function's whole signature: no extra parameters on these.)
def cp_forward(q, k, v, cu_q, cu_k):
    return _cp_forward(q, k, v, cu_q, cu_k, False)


def cp_grads(q, k, v, cu_q, cu_k):
    return _cp_grads(q, k, v, cu_q, cu_k, False)


def cp_grads_deterministic(q, k, v, cu_q, cu_k):
    return _cp_grads(q, k, v, cu_q, cu_k, True)


@dataclasses.dataclass(frozen=True)
class Case:
    make: Callable          # dtype -> fresh real input tensors (same values every call)
    call: Callable          # the public entry point on those tensors -> its outputs
    ops: tuple[str, ...]    # the kvonce ops it must dispatch
    flops: int              # expected FlopCounterMode total
    fast: bool = True       # a plain eager call takes the direct path


CASES = {
    "dual_forward": Case(dual_inputs, dual_forward, ("dual_group_fwd",), fwd_flops(DUAL_PAIRS)),
    "dual_forward_int_ends": Case(dual_inputs, dual_forward_int_ends, ("dual_group_fwd",),
                                  fwd_flops(DUAL_PAIRS_INT_NONCAUSAL)),
    "dual_backward": Case(dual_bwd_inputs, dual_backward, ("dual_group_bwd",),
                          fwd_flops(DUAL_PAIRS) * 5 // 2),
    "dual_func_autograd": Case(lambda dt: dual_inputs(dt, grad=True), dual_func_grads,
                               ("dual_group_fwd", "dual_group_bwd"),
                               fwd_flops(DUAL_PAIRS) * 7 // 2, fast=False),
    "zigzag_forward": Case(zigzag_inputs, zigzag_forward, ("dual_group_fwd_zigzag",),
                           fwd_flops(ZIGZAG_PAIRS)),
    "zigzag_backward": Case(zigzag_bwd_inputs, zigzag_backward, ("dual_group_bwd_zigzag",),
                            fwd_flops(ZIGZAG_PAIRS) * 5 // 2),
    "plan_run_split": Case(paged_inputs, plan_run(3), ("paged_decode_split",),
                           fwd_flops(DECODE_PAIRS)),
    "plan_run_single_noncausal": Case(paged_inputs, plan_run(1, causal=False), ("paged_decode",),
                                      fwd_flops(Q_LEN * sum(LENS))),
    "plan_run_int8": Case(int8_paged_inputs, plan_run_int8, ("paged_decode",),
                          fwd_flops(DECODE_PAIRS)),
    "paged_attention": Case(
        paged_inputs, lambda *t: kvonce.paged_attention(*t, num_splits=2, return_lse=True),
        ("paged_decode_split",), fwd_flops(DECODE_PAIRS)),
    "flash_attn_with_kvcache": Case(
        lambda dt: (*paged_inputs(dt), *new_tokens(dt)), flash_attn_append_and_attend,
        ("append_paged_kv", "paged_decode"), fwd_flops(sum(mask_pairs(Q_LEN, n + 3)
                                                           for n in LENS))),
    "merge_attention_states": Case(merge_inputs, kvonce.merge_attention_states,
                                   ("merge_attention_states",), 0),
    "append_paged_kv": Case(lambda dt: (*new_tokens(dt), *paged_inputs(dt)[1:]), append,
                            ("append_paged_kv",), 0),
    "append_paged_kv_int8": Case(
        lambda dt: (*new_tokens(dt), *int8_paged_inputs(dt)[1:]), append_int8,
        ("append_paged_kv",), 0),
    "cascade_run": Case(
        lambda dt: paged_inputs(dt, lens=CASCADE_LENS, q_len=1, shared_pages=2), cascade_run,
        ("prefix_decode",), fwd_flops(sum(mask_pairs(1, n) for n in CASCADE_LENS))),
    "paged_prefill": Case(prefill_inputs, paged_prefill, ("paged_prefill",),
                          fwd_flops(sum(mask_pairs(n, L) for n, L in zip(PREFILL_Q_LENS, LENS)))),
    "cp_forward": Case(cp_inputs, cp_forward, ("zigzag_cp_fwd",), fwd_flops(CP_PAIRS),
                       fast=False),
    "cp_autograd": Case(lambda dt: cp_inputs(dt, grad=True), cp_grads,
                        ("zigzag_cp_fwd", "zigzag_cp_bwd"), fwd_flops(CP_PAIRS) * 7 // 2,
                        fast=False),
    # deterministic=True is a trailing op input the flop formulas must take.
    "cp_autograd_deterministic": Case(
        lambda dt: cp_inputs(dt, grad=True), cp_grads_deterministic,
        ("zigzag_cp_fwd", "zigzag_cp_bwd"), fwd_flops(CP_PAIRS) * 7 // 2, fast=False),
}
FAST_CASES = [name for name, case in CASES.items() if case.fast]
_fast_results: dict = {}


def fast_result(name: str, dtype: torch.dtype):
    """The case's outputs from a plain eager call (computed once per case and dtype)."""
    if (name, dtype) not in _fast_results:
        _fast_results[name, dtype] = CASES[name].call(*CASES[name].make(dtype))
    return _fast_results[name, dtype]


def tensors_of(out) -> list:
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in tensors_of(o)]


def assert_like(got, want, *, device_type: str | None = None, fake: bool = False):
    """Same structure, shapes and dtypes (on ``device_type`` / fake tensors when given)."""
    got, want = tensors_of(got), tensors_of(want)
    assert [(tuple(t.shape), t.dtype) for t in got] == [(tuple(t.shape), t.dtype) for t in want]
    for t in got:
        assert not fake or isinstance(t, FakeTensor), f"{type(t).__name__} is not fake"
        assert device_type is None or t.device.type == device_type


class Recorder(TorchDispatchMode):
    """Records every op it sees (with its arguments), then runs it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args))
        return func(*args, **(kwargs or {}))

    def kvonce_ops(self) -> set[str]:
        return {f._schema.name.split("::")[1] for f, _ in self.calls
                if f._schema.name.startswith("kvonce::")}

    def only_call(self, name: str):
        """(func, args) of the single call of ``kvonce::name``."""
        (call,) = [(f, a) for f, a in self.calls if f._schema.name == f"kvonce::{name}"]
        return call


def forbid_launches(monkeypatch):
    """From here on, any Triton launch (interpreted, JIT or kvonce's cached C launcher) raises."""
    def refuse(*args, **kwargs):
        raise AssertionError("a Triton kernel was launched")
    monkeypatch.setattr(triton.runtime.jit.JITFunction, "run", refuse)
    # Every interpreted launch runs a GridExecutor (triton 3.4-3.6; InterpretedFunction.run is
    # newer than 3.4).
    monkeypatch.setattr(triton.runtime.interpreter.GridExecutor, "__call__", refuse)
    monkeypatch.setattr(_launch, "_compiled", {})


# ------------------------------------------------------------------------------------------------
# Every entry point under each mode
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_fake_tensor_mode_shapes_and_no_launch(name, dtype, monkeypatch):
    case = CASES[name]
    want = fast_result(name, dtype)
    mode = FakeTensorMode()
    fake = [mode.from_tensor(t) for t in case.make(dtype)]
    forbid_launches(monkeypatch)
    with mode, Recorder() as rec:
        got = case.call(*fake)
    assert_like(got, want, fake=True)
    assert set(case.ops) <= rec.kvonce_ops()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_meta_tensors_shapes(name, dtype, monkeypatch):
    case = CASES[name]
    want = fast_result(name, dtype)
    meta = [t.detach().to("meta").requires_grad_(t.requires_grad) for t in case.make(dtype)]
    forbid_launches(monkeypatch)
    assert_like(case.call(*meta), want, device_type="meta")


@pytest.mark.parametrize("name", sorted(CASES))
def test_recording_mode_dispatches_the_op_with_the_same_numbers(name):
    case, dtype = CASES[name], DTYPES[0]
    inputs = case.make(dtype)  # (outside the mode: some inputs come from a forward)
    with Recorder() as rec:
        got = case.call(*inputs)
    assert set(case.ops) <= rec.kvonce_ops()
    for g, w in zip(tensors_of(got), tensors_of(fast_result(name, dtype)), strict=True):
        assert not torch.isnan(g).any()
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_append_op_schema_declares_cache_and_scale_writes():
    case = CASES["append_paged_kv_int8"]
    inputs = case.make(DTYPES[0])
    with Recorder() as rec:
        case.call(*inputs)
    func, _ = rec.only_call("append_paged_kv")
    written = {a.name for a in func._schema.arguments
               if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"k_cache", "v_cache", "k_scale", "v_scale", "outlier_values"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flop_counter_mode_counts_visible_pairs(name):
    case = CASES[name]
    inputs = case.make(DTYPES[0])
    with FlopCounterMode(display=False) as counter:
        case.call(*inputs)
    assert counter.get_total_flops() == case.flops


@pytest.mark.parametrize("name", sorted(CASES))
def test_flop_counts_of_fake_inputs_bound_the_exact_count(name):
    """No values to read: the formulas fall back to an upper bound from shapes."""
    case = CASES[name]
    mode = FakeTensorMode()
    fake = [mode.from_tensor(t) for t in case.make(DTYPES[0])]
    with mode, FlopCounterMode(display=False) as counter:
        case.call(*fake)
    assert counter.get_total_flops() >= case.flops
    assert (counter.get_total_flops() == 0) == (case.flops == 0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_make_fx_traces_the_op(name):
    case = CASES[name]
    graph = make_fx(case.call)(*case.make(DTYPES[0])).graph
    targets = {n.target._schema.name for n in graph.nodes
               if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}
    assert {f"kvonce::{op}" for op in case.ops} <= targets


@pytest.mark.parametrize("name", FAST_CASES)
def test_plain_eager_call_skips_the_op(name, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the custom op was dispatched on the plain eager path")
    case = CASES[name]
    inputs, want = case.make(DTYPES[0]), fast_result(name, DTYPES[0])
    for op in KVONCE_OPS:
        monkeypatch.setattr(torch.ops.kvonce, op, refuse)
    for g, w in zip(tensors_of(case.call(*inputs)), tensors_of(want), strict=True):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------
# The predicate, plans made from real tensors, host reads on fake/meta tensors
# ------------------------------------------------------------------------------------------------

def test_use_op_predicate():
    t = torch.zeros(2)
    assert not use_op() and not use_op(t, None, torch.nn.Parameter(torch.zeros(1)))
    assert use_op(t, torch.zeros(2, device="meta"))
    mode = FakeTensorMode()
    assert use_op(mode.from_tensor(t))  # fake, no mode active
    with mode:
        assert use_op(t)
    with FlopCounterMode(display=False):
        assert use_op(t)
    with torch.device("cpu"):  # a torch function mode
        assert use_op(t)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert use_op(t)
    assert not use_op(t)


@pytest.mark.parametrize("name", ["plan_run_split", "append_paged_kv", "dual_forward"])
def test_profiler_trace_shows_the_op(name):
    """torch.profiler records ops through the dispatcher: under it the call takes the op, so its
    ``kvonce::`` event is in the trace (and the numbers are the fast path's)."""
    case, dtype = CASES[name], DTYPES[0]
    inputs = case.make(dtype)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = case.call(*inputs)
    events = {e.name for e in prof.events()}
    assert {f"kvonce::{op}" for op in case.ops} <= events, sorted(events)[:20]
    for g, w in zip(tensors_of(got), tensors_of(fast_result(name, dtype)), strict=True):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["plan_run_split", "cascade_run"])
def test_plan_from_real_tensors_runs_fake_inputs(name, monkeypatch):
    """A plan's own scratch and metadata are real: on the op path they join the inputs' fake
    mode (FakeTensorMode refuses real tensors)."""
    case, dtype = CASES[name], DTYPES[0]
    real = case.make(dtype)
    kwargs = dict(shared_prefix=SHARED_GROUPS, cascade=True) if name == "cascade_run" else \
        dict(num_splits=3)
    plan = kvonce.PagedDecodePlan(*real, **kwargs)
    want = fast_result(name, dtype)  # (launches: before they are forbidden)
    mode = FakeTensorMode()
    fake = [mode.from_tensor(t) for t in real]
    forbid_launches(monkeypatch)
    with mode:
        got = plan.run(*fake, return_lse=True)
    assert_like(got, want, fake=True)


def test_host_reads_raise_clearly_on_fake_and_meta():
    q, k_cache, v_cache, seqlens, table = paged_inputs(DTYPES[0])
    k_new, v_new = new_tokens(DTYPES[0])
    mode = FakeTensorMode()
    to_meta = lambda t: t.to("meta")  # noqa: E731
    for convert, ctx in ((mode.from_tensor, mode), (to_meta, contextlib.nullcontext())):
        args = [convert(t) for t in (q, k_cache, v_cache, seqlens, table)]
        new = [convert(t) for t in (k_new, v_new)]
        with ctx:
            with pytest.raises(ValueError, match="check_block_table=True reads cache_seqlens"):
                kvonce.paged_attention(*args, check_block_table=True)
            with pytest.raises(ValueError, match="check_block_table=True reads cache_seqlens"):
                kvonce.append_paged_kv(*new, *args[1:], check_block_table=True)
            with pytest.raises(ValueError, match="shared_prefix='auto'.* reads block_table"):
                kvonce.PagedDecodePlan(*args, shared_prefix="auto")


# ------------------------------------------------------------------------------------------------
# The formulas themselves
# ------------------------------------------------------------------------------------------------

def test_visible_pairs_equals_mask_counts():
    for len_q in range(0, 7):
        for len_k in range(0, 9):
            for causal in (True, False):
                assert int(flops.visible_pairs(len_q, len_k, causal)) == \
                    mask_pairs(len_q, len_k, causal), (len_q, len_k, causal)


@pytest.mark.parametrize("name", ["plan_run_single_noncausal", "dual_forward_int_ends"])
def test_noncausal_counts_match_pytorch_matmul_formulas(name):
    """Plain-PyTorch cross-check: FlopCounterMode's own matmul formulas on the float32 reference
    (one QK^T and one PV matmul per sequence over its visible keys; exact when non-causal).
    (SDPA is no help here: on the CPU it runs an op that has no registered formula.)"""
    case = CASES[name]
    inputs = case.make(DTYPES[0])
    with FlopCounterMode(display=False) as ours:
        case.call(*inputs)
    with FlopCounterMode(display=False) as ref:
        if name == "plan_run_single_noncausal":
            paged_attention_ref(*inputs, causal=False)
        else:
            dual_group_attention_ref(*inputs[:7], 9, 40, causal=False)
    assert ours.get_total_flops() == ref.get_total_flops() > 0


def test_cp_formula_takes_rank_and_world_from_the_group(monkeypatch):
    """Rank 1 of world 2 holds chunks 1 and 2 (the formula functions called directly)."""
    q, k, v, cu, _ = cp_inputs(DTYPES[0])
    monkeypatch.setattr(flops, "_cp_world_rank", lambda group_name: (2, 1))
    fwd = flops.zigzag_cp_fwd_flops(q, k, v, cu, 1, max(LOCAL) // 2, D ** -0.5, True, "g", False)
    assert fwd == fwd_flops(ZIGZAG_PAIRS)
    bwd = flops.zigzag_cp_bwd_flops(q, q, k, v, q, None, None, cu, 1, max(LOCAL) // 2,
                                    D ** -0.5, True, "g")
    assert bwd == fwd * 5 // 2


@pytest.fixture
def gloo_world_one(tmp_path):
    if dist.is_initialized():
        pytest.skip("torch.distributed is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_cp_op_in_a_process_group_under_modes(gloo_world_one):
    """A world-1 gloo group: the op carries its name, the formula resolves it (rank 0 of 1)."""
    case = CASES["cp_autograd"]
    inputs = case.make(DTYPES[0])
    with FlopCounterMode(display=False) as counter, Recorder() as rec:
        got = case.call(*inputs)
    assert counter.get_total_flops() == case.flops
    _, args = rec.only_call("zigzag_cp_fwd")
    assert args[8] == dist.group.WORLD.group_name != ""
    for g, w in zip(tensors_of(got), tensors_of(fast_result("cp_autograd", DTYPES[0])),
                    strict=True):
        torch.testing.assert_close(g, w, atol=0, rtol=0)
