"""The plain-Triton helpers of the Gluon backward (``kernels/gluon_bwd_sched.py``): the Δ
preprocess (with and without zeroing the dQ accumulator), the accumulator inits at aligned
columns, the dK/dV tail zeroing, the per-CTA q-step counts and the longest-first work list,
against plain PyTorch / Python. Small shapes; on the CPU under the Triton interpreter (fp16 +
fp32), on a GPU in fp16 + bf16."""
import pytest
import torch
from conftest import DEVICE, DTYPES

from kvonce.kernels.gluon_bwd_maps import local_order_rows
from kvonce.kernels.gluon_bwd_sched import (GluonBwdSchedule, _delta_kernel, _init_kernel,
                                            _zero_key_tail_kernel, block_steps, init_column,
                                            lpt_work)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_dqa", [False, True])
def test_delta_kernel(dtype, zero_dqa):
    torch.manual_seed(0)
    rows, heads, d, row0 = 70, 3, 32, 5
    out = torch.randn(rows, heads, d, dtype=dtype, device=DEVICE)
    dout = torch.randn(rows, heads, d, dtype=dtype, device=DEVICE)
    delta = torch.full((heads, rows + 3), float("nan"), device=DEVICE)   # row stride > rows
    dqa = torch.full((row0 + rows + 4, heads, d), float("nan"), device=DEVICE)
    _delta_kernel[(heads, 3)](out, dout, delta, dqa, rows, row0, *out.stride()[:2],
                              *dout.stride()[:2], delta.stride(0), *dqa.stride()[:2], BLOCK=32,
                              HEAD_DIM=d, ZERO_DQA=zero_dqa)
    ref = (out.float() * dout.float()).sum(-1).t()
    torch.testing.assert_close(delta[:, :rows], ref, rtol=1e-5, atol=1e-4)
    assert torch.isnan(delta[:, rows:]).all()
    if zero_dqa:
        assert (dqa[row0:row0 + rows] == 0).all()
        assert torch.isnan(dqa[:row0]).all() and torch.isnan(dqa[row0 + rows:]).all()
    else:
        assert torch.isnan(dqa).all()


@pytest.mark.parametrize("local_order", [False, True])
def test_init_kernel_aligned_segments(local_order):
    """The Gluon kernel's accumulator inits: group g of sequence b at ``init_column`` (16-byte
    aligned, segments apart), -LSE / scale (-inf for LSE -inf) and -Δ of the group's rows;
    padding columns untouched."""
    torch.manual_seed(1)
    heads, scale = 3, 0.125
    lens0, lens1 = [5, 0, 70, 3], [9, 2, 0, 66]
    batch = len(lens0)
    cu0 = torch.tensor([0] + list(torch.tensor(lens0).cumsum(0)), dtype=torch.int32,
                       device=DEVICE)
    cu1 = torch.tensor([0] + list(torch.tensor(lens1).cumsum(0)), dtype=torch.int32,
                       device=DEVICE)
    rows0, rows1 = sum(lens0), sum(lens1)
    if local_order:
        rows = rows0 + rows1
        lse = torch.randn(heads, rows + 1, device=DEVICE)[:, :rows]   # row stride > rows
        lse[2, 4] = float("-inf")
        delta = torch.randn(heads, rows, device=DEVICE)
        table = local_order_rows(cu0, cu1)
        groups = [(lse, delta, table, 0), (lse, delta, table, 0)]
        starts = [[int(table[g, b, 0]) for b in range(batch)] for g in (0, 1)]
    else:
        lse = [torch.randn(heads, n + 1, device=DEVICE)[:, :n] for n in (rows0, rows1)]
        lse[0][2, 4] = float("-inf")
        delta = [torch.randn(heads, n, device=DEVICE) for n in (rows0, rows1)]
        groups = [(lse[0], delta[0], cu0, 0), (lse[1], delta[1], cu1, rows0)]
        starts = [cu0[:-1].tolist(), cu1[:-1].tolist()]
    cols = (rows0 + rows1 + 6 * batch + 4 + 3) // 4 * 4
    init = torch.full((2 * heads, cols), float("nan"), device=DEVICE)
    for g, (lse_g, delta_g, info, row0) in enumerate(groups):
        _init_kernel[(heads, batch, 3)](lse_g, delta_g, init, info, batch, g, row0, scale,
                                        lse_g.stride(0), delta_g.stride(0), init.stride(0),
                                        BLOCK=32, LOCAL_ORDER=local_order)
    written = torch.zeros(cols, dtype=torch.bool)
    last_end = 0
    order = sorted((2 * b + g if local_order else g * batch + b, g, b)
                   for g in (0, 1) for b in range(batch))
    for segment, g, b in order:
        n = (lens0, lens1)[g][b]
        lse_g, delta_g, _, row0 = groups[g]
        row = starts[g][b]
        col = init_column(row0 + row, segment)
        assert col % 4 == 0 and col >= last_end            # aligned; after the last segment
        last_end = col + n
        ref_lse = -lse_g[:, row:row + n] / scale
        ref_lse[torch.isinf(ref_lse)] = float("-inf")
        torch.testing.assert_close(init[0::2, col:col + n], ref_lse)
        torch.testing.assert_close(init[1::2, col:col + n], -delta_g[:, row:row + n])
        written[col:col + n] = True
    assert last_end <= cols
    assert torch.isnan(init[:, ~written]).all()            # padding never written
    assert (init[0::2][:, written] == float("-inf")).sum() == 1


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
