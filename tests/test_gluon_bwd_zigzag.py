"""The Gluon backward's context-parallel path on the CPU (``kernels/gluon_bwd_maps.py``,
``gluon_bwd_sched.py``, ``gluon_bwd.launch_gluon_bwd``).

1. The index maps: the very source of the ``@gluon.jit`` helpers (``_tile``, ``_first_key``,
   ``_key_rows``, ``_group``, ``_m_range``) run in Python with a stand-in for ``gl``, over every
   CTA of random zigzag batches (world sizes, ranks, chunk sizes that are and are not multiples
   of 128, empty sequences), against the layout's own map (``zigzag_to_contiguous_index``) and
   the Triton backward's ``_seq_keys`` / ``_group_rows`` / ``_group_kv_end`` semantics: every
   key of every sequence is held by exactly one CTA at its buffer row, each group's rows and
   visible keys are the Triton twin's.
2. The plain-Triton helpers under the interpreter: per-rank dK/dV tail zeroing, the zigzag
   q-step counts (against the emulated kernel's).
3. ``launch_gluon_bwd``'s host side for the zigzag buffer and the local order, the Gluon kernel
   replaced by a recorder (as tests/test_gluon_bwd_helpers.py does for contiguous K/V).
"""
import random
import types

import pytest
import torch
from conftest import DEVICE, DTYPES
from test_gluon_bwd_helpers import record_kernel_launches

from kvonce.kernels import gluon_bwd_maps as maps
from kvonce.kernels.gluon_bwd_sched import _zero_key_tail_kernel, block_steps
from kvonce.zigzag.layout import zigzag_to_contiguous_index


# ------------------------------------------------------------------ the maps' source in Python
class _Ptr:
    """A pointer into a host list (``gl.load(p + i)``)."""

    def __init__(self, data, off=0):
        self.data, self.off = data, off

    def __add__(self, i):
        return _Ptr(self.data, self.off + int(i))


class _Gl:
    """What the map helpers call of ``gl``, on Python ints (all values there are >= 0, so
    Python's ``//`` and ``%`` agree with the GPU's truncating ones)."""
    pid = (0, 0, 0)

    @staticmethod
    def load(p):
        return p.data[p.off]

    @staticmethod
    def where(c, a, b):
        return a if c else b

    minimum, maximum = staticmethod(min), staticmethod(max)

    @classmethod
    def program_id(cls, axis):
        return cls.pid[axis]


def _python(jit_fn, names=("_tile", "_first_key", "_key_rows", "_group", "_m_range")):
    """The helper's own code object with ``gl`` and the tile constants swapped for Python."""
    env = dict(jit_fn.fn.__globals__, gl=_Gl, BLOCK_M=64, BLOCK_N=128)
    fn = types.FunctionType(jit_fn.fn.__code__, env)
    for name in names:   # helpers calling helpers call the Python versions
        if name in env and hasattr(env[name], "fn") and env[name] is not jit_fn:
            env[name] = types.FunctionType(env[name].fn.__code__, env)
    return fn


TILE, FIRST_KEY, KEY_ROWS, GROUP, M_RANGE = (
    _python(getattr(maps, n)) for n in ("_tile", "_first_key", "_key_rows", "_group",
                                        "_m_range"))


def _zigzag_batch(rng, world):
    """Local lengths (2c each, some c a multiple of 128, some not, one empty), and the rank's
    chunk indices."""
    chunks = [rng.choice([0, 1, 3, 64, 100, 128, 130, 256, 300, 384]) for _ in range(rng.randint(1, 4))]
    return [2 * c for c in chunks]


def _cu(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_key_maps_cover_the_zigzag_buffer(seed):
    """Every CTA's keys [n0, min(n0 + 128, lim)) at rows kv_row + .. are the layout's rows of
    those keys; every key of every sequence is held by exactly one CTA; no CTA holds a key past
    its chunk."""
    rng = random.Random(seed)
    world = rng.choice([1, 2, 3, 4, 8])
    lens = _zigzag_batch(rng, world)
    cu_k = _cu(lens)
    total = cu_k[-1] + rng.choice([0, 5])          # rows of no sequence past cu_k[-1]
    rank_rows = total
    max_c = max(lens) // 2
    chunk_blocks = -(-max_c // 128)
    n_blocks = 2 * world * chunk_blocks
    index = zigzag_to_contiguous_index(torch.tensor(cu_k, dtype=torch.int32), world,
                                       total).tolist()
    held = {}
    for seq in range(len(lens)):
        for blk in range(n_blocks):
            _Gl.pid = (0, seq, blk)
            kv_head, s, b = TILE(None, n_blocks, len(lens), 0)
            assert (s, b) == (seq, blk)
            n0, empty = FIRST_KEY(_Ptr(cu_k), seq, blk, chunk_blocks, True)
            if empty:                                  # the CTA exits
                continue
            kv_row, lim = KEY_ROWS(_Ptr(cu_k), seq, n0, 2 * world, rank_rows, True)
            assert n0 < lim
            c = lens[seq] // 2
            j = n0 // c
            assert lim == (j + 1) * c and lim <= 2 * world * c
            for i in range(min(128, lim - n0)):
                key = (seq, n0 + i)
                assert key not in held, f"key {key} held twice"
                held[key] = kv_row + i
    expected = {(seq, p): index[world * cu_k[seq] + p]
                for seq in range(len(lens)) for p in range(2 * world * (lens[seq] // 2))}
    assert held == expected


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("local_order", [False, True])
def test_group_rows_and_ends_match_the_triton_twin(seed, local_order):
    """_group's (row, len_q, end) against dual_group_bwd's _group_rows / _group_kv_end
    (KV_END_IN_CHUNKS = local_order) and vis_end = min(end, the block's chunk end)."""
    rng = random.Random(100 + seed)
    world = rng.choice([1, 2, 4, 8])
    lens = _zigzag_batch(rng, world)
    batch = len(lens)
    cu_k = _cu(lens)
    c = [n // 2 for n in lens]
    if local_order:    # both groups: c rows of each sequence, kv_end in chunks
        cu0 = cu1 = _cu(c)
        ranks = rng.randrange(world)
        e0, e1 = ranks + 1, 2 * world - ranks
        ends = (e0, e1)
        table = maps.local_order_rows(torch.tensor(cu0, dtype=torch.int32),
                                      torch.tensor(cu1, dtype=torch.int32))
        q0_arg = q1_arg = _Ptr(table.flatten().tolist())
    else:
        lq0 = [rng.randint(0, 200) for _ in lens]
        lq1 = [rng.randint(0, 200) for _ in lens]
        cu0, cu1 = _cu(lq0), _cu(lq1)
        ends = ([rng.randint(-5, 2 * world * x + 5) for x in c],
                [rng.randint(-5, 2 * world * x + 5) for x in c])
        q0_arg, q1_arg = _Ptr(cu0), _Ptr(cu1)
    scalar = local_order
    end_args = ends if scalar else (_Ptr(ends[0]), _Ptr(ends[1]))
    for seq in range(batch):
        len_k = 2 * world * c[seq]
        start0, start1 = cu0[seq], cu1[seq]
        len0, len1 = cu0[seq + 1] - start0, cu1[seq + 1] - start1
        rows = (start0 + start1, start0 + start1 + len0) if local_order else (start0, start1)
        for n0 in sorted({0, 1, 127, 128, c[seq], len_k - 1} & set(range(max(len_k, 1)))):
            if c[seq] == 0:
                continue
            lim = (n0 // c[seq] + 1) * c[seq]
            for g in (0, 1):
                row, len_q, end, vis_end = GROUP(g, seq, q0_arg, q1_arg, _Ptr(cu_k), *end_args,
                                                 2 * world, n0, batch, scalar, True,
                                                 local_order)
                e = ends[g] if scalar else ends[g][seq]
                if local_order:
                    e *= c[seq]
                e = min(max(e, 0), len_k)
                assert (row, len_q, end) == (rows[g], (len0, len1)[g], e)
                assert vis_end == min(e, lim)
                diag, lo, hi = M_RANGE(len_q, end, n0, True)
                assert diag == e - len_q and lo % 64 == 0 and hi == (len_q if n0 < e else 0)


def test_contiguous_maps_unchanged():
    """Without the flags the maps are the contiguous kernel's: n0 = 128 blk, rows from
    cu_seqlens_k, lim the sequence's key count, vis_end = end."""
    cu_k = [0, 300, 301]
    for blk in range(4):
        n0, empty = FIRST_KEY(_Ptr(cu_k), 0, blk, 1, False)
        assert n0 == 128 * blk and empty == (blk == 3)
        assert KEY_ROWS(_Ptr(cu_k), 0, n0, 2, 0, False) == (n0, 300)
    row, len_q, end, vis_end = GROUP(1, 0, _Ptr([0, 10]), _Ptr([0, 20]), _Ptr(cu_k),
                                     _Ptr([500]), _Ptr([250]), 2, 0, 1, False, False, False)
    assert (row, len_q, end, vis_end) == (0, 20, 250, 250)


# ------------------------------------------------------------------ plain-Triton helpers
@pytest.mark.parametrize("world", [1, 3])
def test_zero_key_tail_per_rank(world):
    rank_rows, heads, d = 50, 2, 16
    cu_k = torch.tensor([0, 12, 40], dtype=torch.int32, device=DEVICE)
    dk = torch.ones(world * rank_rows, heads, d, device=DEVICE)
    dv = torch.ones(world * rank_rows, heads, d, device=DEVICE)
    _zero_key_tail_kernel[(2, heads, world)](dk, dv, cu_k, 2, rank_rows, *dk.stride()[:2],
                                             *dv.stride()[:2], BLOCK=16, HEAD_DIM=d)
    for t in (dk, dv):
        for r in range(world):
            base = r * rank_rows
            assert (t[base:base + 40] == 1).all() and (t[base + 40:base + rank_rows] == 0).all()


def _steps_emulated(lens, cu0, cu1, end0, end1, world, chunk_blocks, causal, in_chunks):
    """The step count of every zigzag CTA from the emulated maps (one q head, both groups)."""
    cu_k = _cu(lens)
    n_blocks = 2 * world * chunk_blocks
    scalar = isinstance(end0, int)
    ends = (end0, end1) if scalar else (_Ptr(end0), _Ptr(end1))
    out = []
    for seq in range(len(lens)):
        for blk in range(n_blocks):
            n0, empty = FIRST_KEY(_Ptr(cu_k), seq, blk, chunk_blocks, True)
            if empty:
                out.append(-1)
                continue
            total = 0
            for g in (0, 1):
                _, len_q, end, _ = GROUP(g, seq, _Ptr(cu0), _Ptr(cu1), _Ptr(cu_k), *ends,
                                         2 * world, n0, len(lens), scalar, True, False)
                if in_chunks:   # GROUP multiplies only with LOCAL_ORDER: emulate the table-less
                    e = (end0 if scalar else end0[seq]) if g == 0 else (
                        end1 if scalar else end1[seq])
                    end = min(max(e * (lens[seq] // 2), 0), 2 * world * (lens[seq] // 2))
                _, lo, hi = M_RANGE(len_q, end, n0, causal)
                total += max(-(-(hi - lo) // 64), 0)
            out.append(total)
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("in_chunks", [False, True])
def test_block_steps_zigzag(causal, in_chunks):
    world = 2
    lens = [2 * 300, 0, 2 * 128, 2 * 64]
    c = [n // 2 for n in lens]
    cu0 = cu1 = _cu(c)
    if in_chunks:
        end0, end1 = 2, 3
    else:
        end0, end1 = [150, 0, 256, 100], [4 * x for x in c]
    chunk_blocks = -(-max(c) // 128)
    n_blocks = 2 * world * chunk_blocks
    t = lambda x: torch.tensor(x, dtype=torch.int32, device=DEVICE)  # noqa: E731
    steps = block_steps(t(cu0), t(cu1), t(_cu(lens)), end0 if in_chunks else t(end0),
                        end1 if in_chunks else t(end1), n_blocks=n_blocks, causal=causal,
                        zigzag_world_size=world, chunk_blocks=chunk_blocks,
                        kv_end_in_chunks=in_chunks)
    ref = _steps_emulated(lens, cu0, cu1, end0, end1, world, chunk_blocks, causal, in_chunks)
    assert steps.tolist() == ref


# ------------------------------------------------------------------ the launch's host side
@pytest.mark.parametrize("name", ["default", "l2-rot", "lpt-rot-qdo3-fuse"])
def test_launch_host_side_zigzag_local_order(name, monkeypatch):
    """fused.py's call (q, q, buffer, ..., local_order=True, kv_end chunk counts) binds to the
    kernel with KV_ZIGZAG and LOCAL_ORDER on, the zigzag grid, n_chunks / rank_rows /
    chunk_blocks / n_segments, the local-order row table and one accumulator (dqa_row1 = 0);
    dq comes out 0 (no CTA ran) and each rank's buffer rows past its sequences are zeroed."""
    gluon_bwd = pytest.importorskip("kvonce.kernels.gluon_bwd")
    from kvonce.kernels.gluon_bwd_sched import VARIANTS

    calls = record_kernel_launches(gluon_bwd, monkeypatch)
    monkeypatch.setattr(gluon_bwd, "_desc", lambda t, rows, d: ("desc", rows, t.shape[0]))
    real_reason = gluon_bwd.unsupported_reason
    monkeypatch.setattr(gluon_bwd, "unsupported_reason", lambda *a, **k: None)
    dtype = DTYPES[0]
    # d 64 on a GPU, where unsupported_reason gets past "needs a Hopper GPU" to the head dim.
    world, h, hk, d = 4, 4, 2, 32 if str(DEVICE) == "cpu" else 64
    local = [2 * 200, 2 * 64]                 # c = 200 (not a multiple of 128), 64
    total = sum(local) + 6                    # 6 rows of no sequence per rank
    cu = torch.tensor(_cu(local), dtype=torch.int32, device=DEVICE)
    cu_half = torch.div(cu, 2, rounding_mode="floor")
    q = torch.randn(total, h, d, dtype=dtype, device=DEVICE)
    buf = torch.randn(world * total, hk, d, dtype=dtype, device=DEVICE)
    lse = torch.zeros(h, total, device=DEVICE)
    delta = torch.empty_like(lse)
    dq = torch.full_like(q, float("nan"))
    dk = torch.full(buf.shape, float("nan"), device=DEVICE)
    dv = torch.full(buf.shape, float("nan"), device=DEVICE)
    sched = VARIANTS[name]
    args = (q, q, buf, buf, q, q, q, q, lse, lse, delta, delta, dq, dq, dk, dv, cu_half,
            cu_half, cu, 2, 7)
    assert real_reason(*args[:10], dq, dq, dk, dv, zigzag_world_size=world,
                       local_order=True) in (None, "needs a Hopper (sm90) GPU")
    gluon_bwd.launch_gluon_bwd(*args, max_seqlen_q=200, max_seqlen_k=2 * world * 200,
                               softmax_scale=0.1, causal=True, zigzag_world_size=world,
                               local_order=True, schedule=sched)
    (grid, bound), = calls
    chunk_blocks = 2                          # cdiv(200, 128)
    n_blocks = 2 * world * chunk_blocks
    assert grid == ((hk, 2, n_blocks) if sched.order == "grid" else (hk * 2 * n_blocks,))
    assert bound["KV_ZIGZAG"] and bound["LOCAL_ORDER"] and bound["KV_END_SCALAR"]
    assert (bound["n_chunks"], bound["rank_rows"], bound["chunk_blocks"]) == (
        2 * world, total, chunk_blocks)
    assert bound["n_segments"] == 2 * (h // hk) and bound["n_blocks"] == n_blocks
    assert bound["dqa_row1"] == 0 and bound["dqa_desc"][2] == total   # one accumulator
    assert bound["k_desc"] == ("desc", 128, world * total)
    table = bound["cu_seqlens_q0"]
    assert table.tolist() == [[[0, 200], [400, 64]], [[200, 200], [464, 64]]]
    if sched.order == "lpt":
        work = bound["Work"].tolist()
        assert sorted(work) == list(range(2 * n_blocks))
        # the blocks past their chunk (sequence 1's second block of each chunk) come last
        assert set(work[-2 * world:]) == {n_blocks + 2 * j + 1 for j in range(2 * world)}
    assert (dq == 0).all()
    for t in (dk, dv):
        for r in range(world):
            rows = t[r * total:(r + 1) * total]
            assert torch.isnan(rows[:total - 6]).all() and (rows[total - 6:] == 0).all()


def test_unsupported_reason_cp_arguments():
    gluon_bwd = pytest.importorskip("kvonce.kernels.gluon_bwd")
    q = torch.zeros(8, 2, 64, device=DEVICE)
    other = torch.zeros(8, 2, 64, device=DEVICE)
    buf = torch.zeros(12, 1, 64, device=DEVICE)
    lse = torch.zeros(2, 8, device=DEVICE)
    base = (q, q, buf, buf, q, q, q, q, lse, lse)
    reason = gluon_bwd.unsupported_reason
    assert "multiple of zigzag_world_size" in reason(*base, q, q, buf, buf, zigzag_world_size=5,
                                                     local_order=True)
    assert "q0 and q1" in reason(q, other, *base[2:], q, q, buf, buf, local_order=True)
    assert "dq0 and dq1" in reason(*base, q, other, buf, buf, local_order=True)
    assert "only with local_order" in reason(*base, q, q[:], buf, buf)
    # the structural checks pass; what remains is the device
    for kw in (dict(zigzag_world_size=4, local_order=True), dict(zigzag_world_size=3),
               dict(local_order=True)):
        r = reason(*base, q, q, buf, buf, **kw) if kw.get("local_order") else reason(
            q, other, *base[2:], q, other, buf, buf, **kw)
        assert r is None or "GPU" in r or "dtype" in r or "float16" in r, r
