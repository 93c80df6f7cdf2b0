"""Which backward kernels the zigzag paths launch: ``varlen.bwd_launcher``, the one choice
between the Hopper Gluon kernel (``gluon_bwd.launch_gluon_bwd``) and the two Triton kernels
(``launch_dual_group_bwd``), from ``zigzag.fused_zigzag_backward`` and from the context-parallel
backward (``kvonce::zigzag_cp_bwd``, world 1 without torch.distributed), with and without
``deterministic``.

The Gluon kernel runs on sm90 only: here ``gluon_bwd.supports`` is patched to say yes and
``launch_gluon_bwd`` is replaced by a recorder that runs the Triton backward with the same
arguments, so every route runs (on the CPU interpreter too) and its results can be compared
bitwise with the plain Triton route's.
"""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from conftest import DEVICE, DTYPES, HAS_CUDA
from test_dual_group_backward import cu_of, randn, zigzag_rank_inputs

from kvonce import varlen
from kvonce.kernels.configs import get_dual_group_bwd_config, interpreter_active
from kvonce.kernels.dual_group_bwd import launch_dual_group_bwd
from kvonce.zigzag import (fused_zigzag_backward,
                           replace_execute_grouped_attention_with_fused_varlen,
                           split_q_by_zigzag_chunk_index, zigzag_llama3_flash_attn_varlen_func)
from kvonce.zigzag import cp

pytestmark = pytest.mark.skipif(not HAS_CUDA and not interpreter_active(),
                                reason="needs a CUDA GPU or TRITON_INTERPRET=1")
HEADS, HEADS_K, HD = 4, 2, 32


def _capability():
    return torch.cuda.get_device_capability() if HAS_CUDA else None


def _gluon_row(*_args, **_kwargs):
    """The backward config row with ``gluon`` on (Hopper's, whatever the device)."""
    return dataclasses.replace(get_dual_group_bwd_config(_capability(), HD), gluon=True)


@dataclasses.dataclass
class Launches:
    supports: list  # the keyword arguments each gluon_bwd.supports call got
    gluon: list  # the keyword arguments of each launch_gluon_bwd call
    triton: list  # the keyword arguments of each launch_dual_group_bwd call bwd_launcher chose


@pytest.fixture
def launches(monkeypatch) -> Launches:
    """``gluon_bwd.supports`` says yes (and records its keywords); ``launch_gluon_bwd`` records
    its keywords and runs the Triton backward on the same arguments; the Triton launch that
    ``bwd_launcher`` returns records its keywords too."""
    gluon_bwd = pytest.importorskip("kvonce.kernels.gluon_bwd")
    seen = Launches([], [], [])

    def supports(*args, **kwargs):
        seen.supports.append(kwargs)
        return True

    def gluon(*args, schedule, **kwargs):
        seen.gluon.append(dict(kwargs, schedule=schedule))
        launch_dual_group_bwd(*args, **kwargs)

    def triton(*args, **kwargs):
        seen.triton.append(kwargs)
        launch_dual_group_bwd(*args, **kwargs)

    monkeypatch.setattr(gluon_bwd, "supports", supports)
    monkeypatch.setattr(gluon_bwd, "launch_gluon_bwd", gluon)
    monkeypatch.setattr(varlen, "launch_dual_group_bwd", triton)
    return seen


def _zigzag_case(world: int, rank: int, dtype):
    """This rank's local q, out, lse, dout and the gathered K/V (chunks 5, 0 and 9 tokens)."""
    torch.manual_seed(0)
    global_lens = [2 * world * c for c in (5, 0, 9)]
    *_, kv_buffer = zigzag_rank_inputs(global_lens, world, rank, HEADS, HEADS_K, HD, dtype)
    cu_local = cu_of([n // world for n in global_lens])
    q = randn(cu_local[-1].item(), HEADS, HD, dtype=dtype)
    c0, c1 = rank, 2 * world - 1 - rank
    chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(q, cu_local, world, rank)
    out, lse, _ = replace_execute_grouped_attention_with_fused_varlen(
        chunk_q, chunk_cu, chunk_idx, kv_buffer, None, HEADS, HD, None, 0.0, True, (-1, -1),
        None, False, world, cu_local, c0, c1)
    return randn(*q.shape, dtype=dtype), q, out, lse, kv_buffer, cu_local, world, c0, c1


@pytest.mark.parametrize("world,rank", [(2, 1), (4, 0)])
def test_fused_zigzag_backward_routes(world, rank, launches):
    """A config row with ``gluon``: the Gluon launch, on the zigzag buffer in the local order
    (``zigzag_world_size=world, local_order=True``, the tuned schedule), where ``supports`` says
    yes; ``deterministic=True``: the Triton launch, ``supports`` not even asked. Both give the
    bitwise result of a ``gluon=False`` config (the recorder runs the Triton kernels)."""
    from kvonce.kernels.gluon_bwd_sched import TUNED_SCHEDULE

    args = _zigzag_case(world, rank, DTYPES[0])
    config = _gluon_row()
    dq, dkv = fused_zigzag_backward(*args, config=config)
    zigzag = dict(zigzag_world_size=world, local_order=True)
    assert launches.supports == [dict(zigzag, int64_kv_offsets=False)]
    assert len(launches.gluon) == 1 and not launches.triton
    assert {k: launches.gluon[0][k] for k in (*zigzag, "schedule")} == dict(
        zigzag, schedule=TUNED_SCHEDULE)
    assert launches.gluon[0]["config"] == config

    dq_det, dkv_det = fused_zigzag_backward(*args, config=config, deterministic=True)
    assert len(launches.supports) == 1 and len(launches.gluon) == 1
    assert len(launches.triton) == 1
    assert {k: launches.triton[0][k] for k in zigzag} == zigzag
    assert launches.triton[0]["config"] == dataclasses.replace(config, gluon=False)

    dq_triton, dkv_triton = fused_zigzag_backward(
        *args, config=dataclasses.replace(config, gluon=False))
    assert len(launches.triton) == 2 and len(launches.supports) == 1
    for got in ((dq, dkv), (dq_det, dkv_det)):
        assert torch.equal(got[0], dq_triton) and torch.equal(got[1], dkv_triton)


def test_fused_zigzag_backward_gluon_unsupported_takes_triton(monkeypatch):
    """Where ``supports`` says no (here: always; on a GPU e.g. head dim 32), a ``gluon`` row runs
    the Triton kernels, with the zigzag keywords given to ``supports``."""
    gluon_bwd = pytest.importorskip("kvonce.kernels.gluon_bwd")
    asked = []
    monkeypatch.setattr(gluon_bwd, "supports", lambda *a, **kw: asked.append(kw) or False)
    monkeypatch.setattr(gluon_bwd, "launch_gluon_bwd", None)  # would fail if called
    args = _zigzag_case(2, 0, DTYPES[0])
    dq, dkv = fused_zigzag_backward(*args, config=_gluon_row())
    assert asked == [dict(zigzag_world_size=2, local_order=True, int64_kv_offsets=False)]
    dq_triton, dkv_triton = fused_zigzag_backward(
        *args, config=dataclasses.replace(_gluon_row(), gluon=False))
    assert torch.equal(dq, dq_triton) and torch.equal(dkv, dkv_triton)


def test_bwd_launcher_choice(monkeypatch):
    """``bwd_launcher``: the Triton launch for ``gluon=False`` (``supports`` not asked) and where
    ``supports`` says no; the Gluon launch with the tuned schedule where it says yes, the zigzag
    keywords and ``int64_kv_offsets`` passed to ``supports``."""
    gluon_bwd = pytest.importorskip("kvonce.kernels.gluon_bwd")
    from kvonce.kernels.gluon_bwd_sched import TUNED_SCHEDULE

    answer, asked = [True], []
    monkeypatch.setattr(gluon_bwd, "supports",
                        lambda *a, **kw: asked.append((len(a), kw)) or answer[0])
    t = torch.zeros(1, 1, HD, device=DEVICE)
    tensors = (t,) * 14
    config = _gluon_row()
    off = dataclasses.replace(config, gluon=False)
    assert varlen.bwd_launcher(off, *tensors) is launch_dual_group_bwd and not asked

    launch = varlen.bwd_launcher(dataclasses.replace(config, int64_kv_offsets=True), *tensors,
                                 zigzag_world_size=3, local_order=True)
    assert isinstance(launch, functools.partial)
    assert launch.func is gluon_bwd.launch_gluon_bwd
    assert launch.keywords == {"schedule": TUNED_SCHEDULE}
    assert asked == [(14, dict(zigzag_world_size=3, local_order=True, int64_kv_offsets=True))]

    answer[0] = False
    assert varlen.bwd_launcher(config, *tensors) is launch_dual_group_bwd
    assert asked[-1] == (14, dict(zigzag_world_size=0, local_order=False,
                                  int64_kv_offsets=False))


# ------------------------------------------------------------------------ context parallel
def _cp_case(dtype):
    """World 1 (no process group): local = global tokens, chunks of 3, 0 and 5 tokens."""
    torch.manual_seed(0)
    lens = [2 * c for c in (3, 0, 5)]
    cu = cu_of(lens)
    q, k, v, dout = (randn(sum(lens), n, HD, dtype=dtype)
                     for n in (HEADS, HEADS_K, HEADS_K, HEADS))
    return (q, k, v, cu), dout


def _cp_grads(inputs, dout, **kwargs):
    q, k, v, cu = inputs
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = zigzag_llama3_flash_attn_varlen_func(*leaves, cu, cu, max(cu.diff().tolist()),
                                               max(cu.diff().tolist()), 1, **kwargs)
    out.backward(dout)
    return [t.grad for t in leaves]


@pytest.mark.parametrize("deterministic", [False, True])
def test_cp_backward_routes(deterministic, launches, monkeypatch):
    """``zigzag_llama3_flash_attn_varlen_func(..., deterministic=)`` reaches the CP backward
    (through ``kvonce::zigzag_cp_fwd``'s saved arguments and ``kvonce::zigzag_cp_bwd``): with a
    ``gluon`` row, one Gluon launch per KV-head stride (zigzag buffer, local order, world 1),
    or with ``deterministic`` one Triton launch per stride; gradients bitwise equal to a
    ``gluon=False`` row's (the recorder runs the Triton kernels)."""
    inputs, dout = _cp_case(DTYPES[0])
    monkeypatch.setattr(cp, "get_dual_group_bwd_config",
                        lambda *a: dataclasses.replace(_gluon_row(), gluon=False))
    reference = _cp_grads(inputs, dout)
    assert len(launches.triton) == HEADS_K and not launches.supports
    launches.triton.clear()
    monkeypatch.setattr(cp, "get_dual_group_bwd_config", _gluon_row)
    seen_impl = []
    real_impl = cp._cp_bwd_impl
    monkeypatch.setattr(cp, "_cp_bwd_impl", lambda *a: seen_impl.append(a[-1]) or real_impl(*a))
    grads = _cp_grads(inputs, dout, deterministic=deterministic)
    assert seen_impl == [deterministic]
    zigzag = dict(zigzag_world_size=1, local_order=True)
    if deterministic:
        assert not launches.supports and not launches.gluon
        assert len(launches.triton) == HEADS_K
        assert all(not kw["config"].gluon for kw in launches.triton)
        routed = launches.triton
    else:
        assert launches.supports == [dict(zigzag, int64_kv_offsets=False)] * HEADS_K
        assert len(launches.gluon) == HEADS_K and not launches.triton
        routed = launches.gluon
    assert all({k: kw[k] for k in zigzag} == zigzag for kw in routed)
    for name, a, b in zip(("dq", "dk", "dv"), grads, reference):
        assert torch.equal(a, b), f"{name} differs from the gluon=False row's"


@pytest.mark.parametrize("deterministic", [False, True])
def test_opcheck_cp_ops_deterministic(deterministic):
    """The CP ops' schemas with the ``deterministic`` input (a trailing default), their fake
    implementations and the registered autograd (which passes it on to the backward op)."""
    torch.manual_seed(0)
    cu = cu_of([10, 6])
    q, k, v = (torch.randn(16, n, 32, device=DEVICE) for n in (4, 2, 2))
    torch.library.opcheck(torch.ops.kvonce.zigzag_cp_fwd,
                          (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), cu, 1, 5,
                           0.2, True, "", False, deterministic))
    out, lse, kept = torch.ops.kvonce.zigzag_cp_fwd(q, k, v, cu, 1, 5, 0.2, True, "", False,
                                                    deterministic)
    torch.library.opcheck(torch.ops.kvonce.zigzag_cp_bwd,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(),
                           out.detach(), lse, kept.detach(), cu, 1, 5, 0.2, True, "",
                           deterministic))


def test_cp_deterministic_saved_for_the_backward(monkeypatch):
    """``_setup_context`` keeps ``deterministic`` with the other arguments; the backward op gets
    it last (the forward called without it: False)."""
    calls = []
    real = cp._cp_bwd_impl
    monkeypatch.setattr(cp, "_cp_bwd_impl", lambda *a: calls.append(a[-1]) or real(*a))
    cu = cu_of([10, 6])
    q, k, v = (torch.randn(16, n, 32, device=DEVICE, requires_grad=True) for n in (4, 2, 2))
    for extra in ((), (False,), (True,)):
        out, _, _ = torch.ops.kvonce.zigzag_cp_fwd(q, k, v, cu, 1, 5, 0.2, True, "", False,
                                                   *extra)
        out.sum().backward()
    assert calls == [False, False, True]

