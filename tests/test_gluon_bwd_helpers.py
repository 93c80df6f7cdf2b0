"""The plain-Triton helpers of the Gluon backward (``kernels/gluon_bwd_sched.py``): the Δ
preprocess (with and without zeroing the dQ accumulator), the dK/dV tail zeroing, the per-CTA
q-step counts and the longest-first work list, against plain PyTorch / Python. Small shapes; on
the CPU under the Triton interpreter (fp16 + fp32), on a GPU in fp16 + bf16."""
import pytest
import torch
from conftest import DEVICE, DTYPES

from kvonce.kernels.gluon_bwd_sched import (GluonBwdSchedule, _delta_kernel,
                                            _zero_key_tail_kernel, block_steps, lpt_work)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_dqa", [False, True])
def test_delta_kernel(dtype, zero_dqa):
    torch.manual_seed(0)
    rows, heads, d, row0, scale = 70, 3, 32, 5, 0.125
    out = torch.randn(rows, heads, d, dtype=dtype, device=DEVICE)
    dout = torch.randn(rows, heads, d, dtype=dtype, device=DEVICE)
    lse = torch.randn(heads, rows + 2, device=DEVICE)                    # row stride > rows
    lse[1, 7] = float("-inf")                                             # a row that saw no key
    delta = torch.full((heads, rows + 3), float("nan"), device=DEVICE)
    init = torch.full((2 * heads, row0 + rows + 6), float("nan"), device=DEVICE)
    dqa = torch.full((row0 + rows + 4, heads, d), float("nan"), device=DEVICE)
    _delta_kernel[(heads, 3)](out, dout, lse, delta, init, dqa, rows, row0, scale,
                              *out.stride()[:2], *dout.stride()[:2], lse.stride(0),
                              delta.stride(0), init.stride(0), *dqa.stride()[:2], BLOCK=32,
                              HEAD_DIM=d, ZERO_DQA=zero_dqa)
    ref = (out.float() * dout.float()).sum(-1).t()
    torch.testing.assert_close(delta[:, :rows], ref, rtol=1e-5, atol=1e-4)
    assert torch.isnan(delta[:, rows:]).all()
    # The accumulator inits at columns row0 + r: -LSE / scale (-inf for LSE -inf) and -Δ.
    ref_lse = -lse[:, :rows] / scale
    ref_lse[1, 7] = float("-inf")
    torch.testing.assert_close(init[0::2, row0:row0 + rows], ref_lse)
    torch.testing.assert_close(init[1::2, row0:row0 + rows], -ref, rtol=1e-5, atol=1e-4)
    assert torch.isnan(init[:, :row0]).all() and torch.isnan(init[:, row0 + rows:]).all()
    if zero_dqa:
        assert (dqa[row0:row0 + rows] == 0).all()
        assert torch.isnan(dqa[:row0]).all() and torch.isnan(dqa[row0 + rows:]).all()
    else:
        assert torch.isnan(dqa).all()


@pytest.mark.parametrize("dtype", [torch.float32, DTYPES[0]])
def test_zero_key_tail_kernel(dtype):
    total_k, heads, d = 150, 2, 16
    cu_k = torch.tensor([0, 40, 97], dtype=torch.int32, device=DEVICE)
    dk = torch.ones(total_k, heads, d, dtype=dtype, device=DEVICE)
    dv = torch.ones(total_k, heads, d, dtype=dtype, device=DEVICE)
    _zero_key_tail_kernel[(2, heads)](dk, dv, cu_k, 2, total_k, *dk.stride()[:2],
                                      *dv.stride()[:2], BLOCK=16, HEAD_DIM=d)
    for t in (dk, dv):
        assert (t[:97] == 1).all() and (t[97:] == 0).all()


def _steps_ref(lq0, lq1, lk, e0, e1, n_blocks, causal, bm=64, bn=128):
    """The Gluon kernel's ``_m_range`` step count per (sequence, key block), in Python."""
    out = []
    for b in range(len(lk)):
        for blk in range(n_blocks):
            n0 = blk * bn
            if n0 >= lk[b]:
                out.append(-1)
                continue
            total = 0
            for len_q, end in ((lq0[b], e0[b]), (lq1[b], e1[b])):
                end = min(max(end, 0), lk[b])
                lo = (max(n0 - (end - len_q), 0) // bm) * bm if causal else 0
                hi = len_q if n0 < end else 0
                total += max(-(-(hi - lo) // bm), 0)
            out.append(total)
    return out


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                        device=DEVICE)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scalar_end", [False, True])
def test_block_steps_and_lpt_work(causal, scalar_end):
    lq0, lq1 = [64, 0, 97, 130, 300], [50, 0, 97, 3, 300]
    lk = [200, 0, 250, 389, 1100]
    e0, e1 = [100, 0, 120, 389, 700], [200, 0, 250, 389, 1100]
    if scalar_end:
        lq0, lq1, lk = [128, 256, 70], [128, 256, 70], [640, 640, 640]
        e0, e1 = [300] * 3, [640] * 3
    n_blocks = -(-max(lk) // 128)
    end0 = e0[0] if scalar_end else torch.tensor(e0, dtype=torch.int32, device=DEVICE)
    end1 = e1[0] if scalar_end else torch.tensor(e1, dtype=torch.int32, device=DEVICE)
    args = (_cu(lq0), _cu(lq1), _cu(lk), end0, end1)
    steps = block_steps(*args, n_blocks=n_blocks, causal=causal)
    ref = _steps_ref(lq0, lq1, lk, e0, e1, n_blocks, causal)
    assert steps.tolist() == ref
    work = lpt_work(*args, n_blocks=n_blocks, causal=causal)
    assert work.dtype == torch.int32
    assert sorted(work.tolist()) == list(range(len(ref)))
    ordered = [ref[i] for i in work.tolist()]
    assert ordered == sorted(ref, reverse=True)
    # stable: equal counts keep (sequence, block) order
    for a, b in zip(work.tolist(), work.tolist()[1:]):
        if ref[a] == ref[b]:
            assert a < b


def test_schedule_validation():
    assert GluonBwdSchedule() == GluonBwdSchedule(order="grid", rotate_heads=False,
                                                  qdo_stages=2, dq_stages=1, fuse_prep=False)
    with pytest.raises(ValueError, match="order"):
        GluonBwdSchedule(order="random")
    with pytest.raises(ValueError, match="qdo_stages"):
        GluonBwdSchedule(qdo_stages=4)



def record_kernel_launches(gluon_bwd, monkeypatch) -> list:
    """Replace the Gluon kernel by a recorder: each launch appends ``(grid, bound arguments)``
    (every argument bound to the kernel's signature, so a wrong argument list fails here)."""
    import inspect

    calls = []
    sig = inspect.signature(gluon_bwd._gluon_bwd_kernel.fn)

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                kwargs.pop("num_warps")
                calls.append((grid, sig.bind(*args, **kwargs).arguments))
            return launch

    monkeypatch.setattr(gluon_bwd, "_gluon_bwd_kernel", Recorder())
    return calls


@pytest.mark.parametrize("name", ["default", "l2", "lpt-rot-qdo3-fuse"])
def test_launch_host_side_binds_the_kernel(name, monkeypatch):
    """launch_gluon_bwd's host side (pre/post kernels, work list, grid, the kernel's arguments)
    with the Gluon kernel replaced by a recorder: every argument binds to the kernel's
    signature, the grid has the schedule's shape, and with fuse_prep the Δ kernel zeroed the
    accumulator (dq* come out 0: no CTA ran)."""
    gluon_bwd = pytest.importorskip("kvonce.kernels.gluon_bwd")
    from kvonce.kernels.gluon_bwd_sched import VARIANTS

    calls = record_kernel_launches(gluon_bwd, monkeypatch)
    monkeypatch.setattr(gluon_bwd, "unsupported_reason", lambda *a, **k: None)
    monkeypatch.setattr(gluon_bwd, "_desc", lambda t, rows, d: ("desc", rows))
    dtype = DTYPES[0]
    h, hk, d = 4, 2, 32
    lq0, lq1, lk = [64, 30], [50, 70], [200, 300]
    q0 = torch.randn(sum(lq0), h, d, dtype=dtype, device=DEVICE)
    q1 = torch.randn(sum(lq1), h, d, dtype=dtype, device=DEVICE)
    k = torch.randn(sum(lk) + 5, hk, d, dtype=dtype, device=DEVICE)
    lse0 = torch.zeros(h, q0.shape[0], device=DEVICE)
    lse1 = torch.zeros(h, q1.shape[0], device=DEVICE)
    dq0, dq1 = torch.full_like(q0, float("nan")), torch.full_like(q1, float("nan"))
    dk = torch.full(k.shape, float("nan"), device=DEVICE)
    dv = torch.full(k.shape, float("nan"), device=DEVICE)
    end0 = torch.tensor([100, 300], dtype=torch.int32, device=DEVICE)
    sched = VARIANTS[name]
    gluon_bwd.launch_gluon_bwd(
        q0, q1, k, k, q0, q1, q0, q1, lse0, lse1, torch.empty_like(lse0),
        torch.empty_like(lse1), dq0, dq1, dk, dv, _cu(lq0), _cu(lq1), _cu(lk), end0, end0,
        max_seqlen_q=70, max_seqlen_k=300, softmax_scale=0.1, causal=True,
        schedule=None if name == "default" else sched)
    (grid, bound), = calls
    n_blocks = 3
    assert grid == ((hk, 2, n_blocks) if sched.order == "grid" else (hk * 2 * n_blocks,))
    assert bound["ORDER"] == {"grid": 0, "l2": 1, "lpt": 2}[sched.order]
    assert bound["QDO_STAGES"] == sched.qdo_stages and bound["ROTATE"] == sched.rotate_heads
    assert bound["n_blocks"] == n_blocks and bound["batch"] == 2
    if sched.order == "lpt":
        assert sorted(bound["Work"].tolist()) == list(range(2 * n_blocks))
    assert (dq0 == 0).all() and (dq1 == 0).all()          # the accumulator was zero either way
    assert (dk[sum(lk):] == 0).all() and torch.isnan(dk[:sum(lk)]).all()
