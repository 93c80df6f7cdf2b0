"""cuDNN x2 peer of ``bench zigzag``: PyTorch's cuDNN attention, one group at a time (CUDA only).

What Transformer Engine runs on Hopper is cuDNN's fused attention, one varlen (THD) call per zigzag
group with a bottom-right causal mask. PyTorch's dense cuDNN op
(``aten._scaled_dot_product_cudnn_attention``: ``[B, H, S, D]``, ``is_causal`` = TOP-LEFT causal,
returns the logsumexp) cannot take that mask in one call, so per group and per sequence, with the
group's ``len_q`` query rows being the last ``len_q`` of its ``len_k`` keys:

* a non-causal RECTANGLE: q vs the first ``len_k - len_q`` keys,
* a causal SQUARE: q vs the last ``len_q`` keys (top-left causal = bottom-right when square),

merged by their logsumexps (``o = lerp(o_sq, o_rect, sigmoid(lse_rect - lse_sq))``,
``lse = logaddexp``), written into the group's token-major ``[total_q, H, D]`` output. A group with
``len_k == len_q`` (rank 0's early group) is one causal call. The backward calls
``aten._scaled_dot_product_cudnn_attention_backward`` once per part with the MERGED output and
logsumexp (the ring-attention identity: each part then gets the exact gradient of the whole
attention restricted to its keys), adds the two dQ, and, for "+sum", adds every part's dK/dV into
one float32 dK/dV of the contiguous K/V (as the FA2 x2 peer's ``index_add_``; the parts' key ranges
are contiguous rows there, so a slice ``add_``).

Counted in the cuDNN times: the cuDNN calls, the merge (7 small elementwise kernels per merged
sequence, incl. its float32 math and the write into the token-major output, which is where the
``[1, H, S, D]`` -> ``[S, H, D]`` transpose happens), the dQ add / copies and the dK/dV sum. The
issue's cuDNN numbers (single calls, no merge) exclude such glue: ``cudnn calls ms`` (forward)
times the cuDNN calls alone for that comparison. Not counted: the K/V views (no copies: q, K/V
and dO enter as ``[1, H, S, D]`` views of the token-major tensors, the layout cuDNN's BSHD mode
reads), nor, in the GQA fallback below, the K/V head expansion (done once at setup).

GQA: cuDNN attends ``Hk < H`` heads natively (PyTorch passes them through since pytorch#150337,
2025). The peer tests that once per case against expanded K/V; if the op rejects or mismatches
it, K/V are expanded with ``repeat_interleave`` at setup (not timed) and the backward sums each
dK/dV over the head group (timed); a line says so.

Launches: one cuDNN call per part and sequence (32 calls for the 8-sequence batch) where TE makes
one per group; eager timing then measures the host. By default the cuDNN callables are timed as
CUDA graph replays (captured once, checked against the eager result; eager if capture fails, said
so in the ``cudnn timing`` column); ``--cudnn-eager`` times them eagerly.

``PYTHONPATH=src python -m kvonce.bench.peers_cudnn probe``: on the GPU, what this torch's cuDNN
path accepts: native GQA, what ``is_causal`` means when ``S_q < S_k``,
``attn_mask=causal_lower_right(S_q, S_k)``, the varlen op. The split + merge + backward identity
is tested in float64 on CPU by tests/test_bench_peers_cudnn.py (math attention in place of cuDNN).
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Callable

import torch

__all__ = ["cudnn_attention", "cudnn_attention_backward", "merge_partials", "CudnnX2", "build",
           "why", "worst", "forward_columns", "backward_columns", "probe"]

NO_RESULT = "-"


# ---------------------------------------------------------------------------------------------
# One cuDNN call
# ---------------------------------------------------------------------------------------------

def cudnn_attention(q, k, v, causal: bool, scale: float):
    """``aten._scaled_dot_product_cudnn_attention``: q ``[B, H, Sq, D]``, k/v ``[B, Hk, Sk, D]``
    (any strides with a unit last one; ``is_causal`` is top-left). Returns ``(out [B, H, Sq, D]``
    in q's memory layout, ``lse`` float32 ``[B, H, Sq, 1]``, ``aux)`` with aux what the backward
    needs back (philox seed/offset, the logsumexp's own rank).

    Schema (read from torch 2.13; the GPU's 2.11 is exercised by ``probe``): ``(query, key,
    value, attn_bias?, compute_log_sumexp, dropout_p=0, is_causal=False,
    return_debug_mask=False, *, scale=None) -> (output, logsumexp, cum_seq_q, cum_seq_k, max_q,
    max_k, philox_seed, philox_offset, debug_attn_mask)``."""
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale)
    out, lse = res[0], res[1]
    ndim = lse.dim()
    if ndim == 3:
        lse = lse.unsqueeze(-1)
    return out, lse, (res[6], res[7], ndim)


def cudnn_attention_backward(dout, q, k, v, out, lse, aux, causal: bool, scale: float):
    """``aten._scaled_dot_product_cudnn_attention_backward`` of one dense call: ``(dq, dk, dv)``
    shaped like q, k, v. Schema: ``(grad_out, query, key, value, out, logsumexp, philox_seed,
    philox_offset, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *,
    scale)``; dense calls pass no bias / cum_seq (None) and max_q/max_k = S_q/S_k."""
    seed, offset, ndim = aux
    if ndim == 3:
        lse = lse.squeeze(-1)
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, out, lse, seed, offset, None, None, None, q.shape[2], k.shape[2], 0.0,
        causal, scale=scale)


def merge_partials(out, o1, lse1, o2, lse2):
    """Write the softmax-weighted mix of two partial attentions over disjoint key sets into
    ``out`` (``[B, H, S, D]``, any strides) and return the merged logsumexp ``[B, H, S, 1]``.

    ``o_i`` are normalised within their keys, ``lse_i`` their logsumexps; the whole attention is
    ``w o1 + (1 - w) o2`` with ``w = exp(lse1) / (exp(lse1) + exp(lse2)) = sigmoid(lse1 - lse2)``.
    Math in float32 (float64 for float64 inputs); every row must see a key in each part."""
    acc = torch.float64 if o1.dtype == torch.float64 else torch.float32
    w1 = torch.sigmoid(lse1 - lse2)
    lse = torch.logaddexp(lse1, lse2)
    out.copy_(torch.lerp(o2.to(acc), o1.to(acc), w1.to(acc)))
    return lse


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    """``[S, H, D]`` token-major rows -> ``[1, H, S, D]`` view (strides ``S*H*D, D, H*D, 1``)."""
    return x.unsqueeze(0).transpose(1, 2)


def _reduce_heads(x: torch.Tensor, nheads_k: int) -> torch.Tensor:
    """``[1, H, S, D]`` gradient of expanded K/V -> ``[1, Hk, S, D]`` (sum over each head group)."""
    return x.unflatten(1, (nheads_k, x.shape[1] // nheads_k)).sum(2)


def why(exc: BaseException) -> str:
    """An exception in one line: type and the first line of its message (torch's can be long)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"


def worst(errs) -> str:
    """The largest error, formatted; "nan" if any is NaN (``max`` alone can hide one)."""
    errs = list(errs)
    return "nan" if any(e != e for e in errs) else f"{max(errs):.1e}"


def _rel(a, b) -> float:
    b = b.to(torch.float64)
    return ((a.to(torch.float64) - b).norm() / b.norm().clamp_min(1e-300)).item()


# ---------------------------------------------------------------------------------------------
# The peer: both groups, every sequence
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Part:
    k: torch.Tensor         # [1, Hk or H, n, D]
    v: torch.Tensor
    causal: bool
    kv_row0: int            # first row of these keys in the contiguous K/V (the dK/dV sum)
    n: int


@dataclasses.dataclass
class _Seq:
    group: int
    q0: int                 # rows [q0, q1) of the group's q
    q1: int
    q: torch.Tensor         # [1, H, len_q, D] view
    parts: list[_Part]      # [rectangle, square] or [square]


class CudnnX2:
    """Per-group cuDNN attention of one rank's two zigzag groups, from the bench's ``setup``
    dict (``chunk_q``, ``chunk_cu``, ``k_groups``, ``v_groups``, ``slices``, ``kv``).

    ``attn`` / ``attn_bwd`` default to the cuDNN ops (tests/test_bench_peers_cudnn.py swaps in math versions);
    ``expand_kv`` repeats K/V heads up to H at setup (the GQA fallback)."""

    def __init__(self, s: dict, scale: float, *, attn: Callable = cudnn_attention,
                 attn_bwd: Callable = cudnn_attention_backward, expand_kv: bool = False):
        self.scale, self.attn, self.attn_bwd, self.expand_kv = scale, attn, attn_bwd, expand_kv
        self.q = list(s["chunk_q"])
        self.kv_shape = tuple(s["kv"].shape[1:])
        self.nheads_k = self.kv_shape[1]
        ratio = self.q[0].shape[1] // self.nheads_k
        self.seqs: list[_Seq] = []
        for g in (0, 1):
            cu_q = [int(x) for x in s["chunk_cu"][g].tolist()]
            ranges, cu_k_t = s["slices"][g]
            cu_k = [int(x) for x in cu_k_t.tolist()]
            k_g, v_g = s["k_groups"][g], s["v_groups"][g]

            def view(x, a, b):
                x = _bhsd(x[a:b])
                return x.repeat_interleave(ratio, dim=1) if expand_kv and ratio > 1 else x

            for b in range(len(cu_q) - 1):
                len_q, k0, k1 = cu_q[b + 1] - cu_q[b], cu_k[b], cu_k[b + 1]
                if len_q == 0:
                    continue
                if k1 - k0 < len_q:
                    raise ValueError(f"group {g} sequence {b}: {k1 - k0} keys < {len_q} rows")
                split = k1 - len_q  # the square's first key
                parts = []
                if split > k0:
                    parts.append(_Part(view(k_g, k0, split), view(v_g, k0, split), False,
                                       ranges[b][0], split - k0))
                parts.append(_Part(view(k_g, split, k1), view(v_g, split, k1), True,
                                   ranges[b][0] + split - k0, len_q))
                self.seqs.append(_Seq(g, cu_q[b], cu_q[b + 1],
                                      _bhsd(self.q[g][cu_q[b]:cu_q[b + 1]]), parts))

    def calls(self):
        """The cuDNN forward calls alone (no merge, outputs dropped): the issue's measure."""
        return [[self.attn(sq.q, p.k, p.v, p.causal, self.scale) for p in sq.parts]
                for sq in self.seqs]

    def forward(self):
        """``(outs, saved)``: outs the two groups' ``[total_q, H, D]`` outputs; saved per sequence
        ``(out view [1, H, len_q, D], merged lse [1, H, len_q, 1], per-part aux)``."""
        outs = [torch.empty_like(q) for q in self.q]
        saved = []
        for sq in self.seqs:
            res = [self.attn(sq.q, p.k, p.v, p.causal, self.scale) for p in sq.parts]
            o_view = _bhsd(outs[sq.group][sq.q0:sq.q1])
            if len(res) == 1:
                o_view.copy_(res[0][0])
                lse = res[0][1]
            else:
                lse = merge_partials(o_view, res[0][0], res[0][1], res[1][0], res[1][1])
            saved.append((o_view, lse, [r[2] for r in res]))
        return outs, saved

    def grads(self, douts):
        """Forward, then backward with the dK/dV sum: ``(dq0, dq1, dk, dv)``."""
        return self.backward(douts, self.forward())

    def lse_tokens(self, saved) -> list[torch.Tensor]:
        """The merged logsumexps as two float32 ``[H, total_q]`` (FA2's varlen layout)."""
        per_group: list[list[torch.Tensor]] = [[], []]
        for sq, (_, lse, _) in zip(self.seqs, saved):
            per_group[sq.group].append(lse[0, :, :, 0])
        return [torch.cat(x, dim=1) for x in per_group]

    def backward(self, douts, fwd, sum_dkv: bool = True):
        """From ``forward()``'s result and the two groups' dO ``[total_q, H, D]``:
        ``(dq0, dq1, dk, dv)`` with dk, dv float32 of the contiguous K/V (``sum_dkv``), else
        ``(dq0, dq1, parts)`` with each part's own ``(dk, dv)`` left as cuDNN returns them."""
        _, saved = fwd
        dqs = [torch.empty_like(q) for q in self.q]
        acc = torch.float64 if self.q[0].dtype == torch.float64 else torch.float32
        dkv = (torch.zeros((2, *self.kv_shape), dtype=acc, device=self.q[0].device)
               if sum_dkv else None)
        parts_grads = []
        for sq, (o_view, lse, auxs) in zip(self.seqs, saved):
            do = _bhsd(douts[sq.group][sq.q0:sq.q1])
            grads = [self.attn_bwd(do, sq.q, p.k, p.v, o_view, lse, aux, p.causal, self.scale)
                     for p, aux in zip(sq.parts, auxs)]
            dq_view = _bhsd(dqs[sq.group][sq.q0:sq.q1])
            if len(grads) == 1:
                dq_view.copy_(grads[0][0])
            else:
                torch.add(grads[0][0], grads[1][0], out=dq_view)
            for p, (_, dk, dv) in zip(sq.parts, grads):
                if self.expand_kv and dk.shape[1] != self.nheads_k:
                    dk, dv = _reduce_heads(dk, self.nheads_k), _reduce_heads(dv, self.nheads_k)
                if dkv is None:
                    parts_grads.append((dk, dv))
                    continue
                dkv[0, p.kv_row0:p.kv_row0 + p.n].add_(dk[0].transpose(0, 1))
                dkv[1, p.kv_row0:p.kv_row0 + p.n].add_(dv[0].transpose(0, 1))
        if dkv is None:
            return dqs[0], dqs[1], parts_grads
        return dqs[0], dqs[1], dkv[0], dkv[1]


def _gqa_native_ok(s: dict, scale: float, backward: bool) -> str:
    """"" when cuDNN takes ``Hk < H`` K/V as is (checked on the first part of the first sequence
    against expanded K/V), else the reason for the fallback. Raises when the expanded call fails
    too (cuDNN attention unavailable)."""
    native = CudnnX2(s, scale)
    if native.nheads_k == native.q[0].shape[1]:
        return ""
    sq, ratio = native.seqs[0], native.q[0].shape[1] // native.nheads_k
    p = sq.parts[0]
    ke, ve = p.k.repeat_interleave(ratio, 1), p.v.repeat_interleave(ratio, 1)
    o_e, lse_e, aux_e = cudnn_attention(sq.q, ke, ve, p.causal, scale)
    if backward:
        do = torch.randn_like(o_e)
        g_e = cudnn_attention_backward(do, sq.q, ke, ve, o_e, lse_e, aux_e, p.causal, scale)
    try:
        o_n, lse_n, aux_n = cudnn_attention(sq.q, p.k, p.v, p.causal, scale)
        err = max(_rel(o_n, o_e), _rel(lse_n, lse_e))
        if backward:
            g_n = cudnn_attention_backward(do, sq.q, p.k, p.v, o_e, lse_e, aux_n, p.causal, scale)
            err = max(err, _rel(g_n[0], g_e[0]), _rel(g_n[1], _reduce_heads(g_e[1], p.k.shape[1])),
                      _rel(g_n[2], _reduce_heads(g_e[2], p.k.shape[1])))
    except Exception as exc:  # noqa: BLE001 (any rejection means: expand)
        return f"native GQA rejected ({why(exc)})"
    return "" if err < 2e-2 else f"native GQA differs from expanded K/V (rel err {err:.1e})"


def build(s: dict, scale: float, *, backward: bool = False) -> CudnnX2 | None:
    """The peer for one case, or None after printing why not (never raises)."""
    try:
        reason = _gqa_native_ok(s, scale, backward)
        if reason:
            print(f"  cuDNN x2: {reason}; K/V heads expanded at setup (not timed), dK/dV summed "
                  "over head groups in the backward (timed)", flush=True)
        return CudnnX2(s, scale, expand_kv=bool(reason))
    except Exception as exc:  # noqa: BLE001 (a peer never kills the run)
        print(f"  cuDNN x2 unavailable: {why(exc)}", flush=True)
        return None


# ---------------------------------------------------------------------------------------------
# Timing (CUDA graph replay by default) and the bench's columns
# ---------------------------------------------------------------------------------------------

def _tensors(x):
    if torch.is_tensor(x):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _capture(fn, tol: float):
    """``fn`` captured in a CUDA graph: returns ``replay`` after checking one replay's tensors
    against an eager call's (relative norm error under ``tol``)."""
    eager = [t.clone() for t in _tensors(fn())]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fn()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(_tensors(static), eager):
        if a.is_floating_point() and a.numel() > 0:  # not the philox seed/offset
            err = _rel(a, b)
            if not err < tol:
                raise RuntimeError(f"graph replay differs from eager (rel err {err:.1e})")
    return graph.replay, graph


def _time(fns: dict, time_ms, graph: bool) -> tuple[dict, str]:
    """name -> ms for each callable (``NO_RESULT`` after a printed failure), and the mode."""
    mode = "graph" if graph else "eager"
    out = {}
    for name, (fn, tol) in fns.items():
        try:
            if mode == "graph":
                try:
                    replay, keep = _capture(fn, tol)
                    out[name] = time_ms(replay)
                    del keep
                    continue
                except Exception as exc:  # noqa: BLE001
                    print(f"  cuDNN x2 {name}: CUDA graph capture failed ({why(exc)}); "
                          "timing eagerly", flush=True)
                    mode = "eager"
            out[name] = time_ms(fn)
        except Exception as exc:  # noqa: BLE001
            print(f"  cuDNN x2 {name} failed: {why(exc)}", flush=True)
            out[name] = NO_RESULT
    torch.cuda.empty_cache()
    return out, mode


def forward_columns(peer: CudnnX2 | None, fa2_results, time_ms, *, graph: bool = True) -> dict:
    """The forward table's cuDNN columns: error vs FA2 x2 (worst of both groups' outputs and
    LSE), ``cudnn x2 ms`` (calls + merge), ``cudnn calls ms`` (calls alone), timing mode."""
    cols = {"cudnn err": NO_RESULT, "cudnn x2 ms": NO_RESULT, "cudnn calls ms": NO_RESULT,
            "cudnn timing": NO_RESULT}
    if peer is None:
        return cols
    try:
        outs, saved = peer.forward()
        lses = peer.lse_tokens(saved)
        errs = []
        for g, (o_ref, l_ref) in enumerate(fa2_results):
            errs += [_rel(outs[g], o_ref), _rel(lses[g], l_ref.float())]
        if any(torch.isnan(o).any().item() for o in outs):
            errs.append(float("nan"))
        cols["cudnn err"] = worst(errs)
        del outs, saved, lses
    except Exception as exc:  # noqa: BLE001
        print(f"  cuDNN x2 forward failed: {why(exc)}", flush=True)
        return cols
    t, mode = _time({"cudnn x2 ms": (lambda: peer.forward()[0], 1e-3),
                     "cudnn calls ms": (peer.calls, 1e-3)}, time_ms, graph)
    cols.update(t)
    cols["cudnn timing"] = mode
    return cols


def backward_columns(peer: CudnnX2 | None, douts, time_ms, *, graph: bool = True) -> dict:
    """Times of the cuDNN x2 forward, backward (without / with the dK/dV sum) and forward +
    backward + sum (``NO_RESULT`` where unavailable)."""
    names = ("cudnn x2 fwd ms", "cudnn x2 bwd ms", "cudnn x2 bwd+sum ms",
             "cudnn x2 fwd+bwd+sum ms")
    cols = dict.fromkeys(names, NO_RESULT)
    cols["cudnn timing"] = NO_RESULT
    if peer is None:
        return cols
    try:
        saved = peer.forward()
    except Exception as exc:  # noqa: BLE001
        print(f"  cuDNN x2 forward failed: {why(exc)}", flush=True)
        return cols
    t, mode = _time({
        names[0]: (lambda: peer.forward()[0], 1e-3),
        names[1]: (lambda: peer.backward(douts, saved, sum_dkv=False), 2e-2),
        names[2]: (lambda: peer.backward(douts, saved), 2e-2),
        names[3]: (lambda: peer.grads(douts), 2e-2),
    }, time_ms, graph)
    cols.update(t)
    cols["cudnn timing"] = mode
    return cols


# ---------------------------------------------------------------------------------------------
# GPU probe of this torch's cuDNN path
# ---------------------------------------------------------------------------------------------

def _try(label: str, fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        print(f"  {label}: rejected ({why(exc)})")
        return None


def probe(dtype: torch.dtype = torch.bfloat16) -> None:
    """Print what this torch's cuDNN attention accepts, on Llama-like shapes (H 32, Hk 8, d 128):
    native GQA (forward, backward), the alignment of ``is_causal`` when ``S_q < S_k``,
    ``attn_mask=causal_lower_right`` under ``sdpa_kernel(CUDNN_ATTENTION)`` (matches? how fast
    against the rectangle + square split), and the varlen op ``aten._cudnn_attention_forward``.
    References: FA2's varlen forward (bottom-right causal) on the same tensors."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    from .report import time_ms

    dev = "cuda"
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}")
    h, hk, d = 32, 8, 128
    scale = d ** -0.5
    for len_q, len_k in ((1024, 4096), (2048, 2048 * 8)):
        print(f"S_q {len_q}, S_k {len_k} (bottom-right causal wanted):")
        torch.manual_seed(0)
        q = torch.randn(len_q, h, d, dtype=dtype, device=dev)
        k = torch.randn(len_k, hk, d, dtype=dtype, device=dev)
        v = torch.randn(len_k, hk, d, dtype=dtype, device=dev)
        cu_q = torch.tensor([0, len_q], dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0, len_k], dtype=torch.int32, device=dev)
        ref = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, len_q, len_k, 0.0, True, False, scale=scale)[0]
        qb, kb, vb = _bhsd(q), _bhsd(k), _bhsd(v)
        rep = h // hk
        ke, ve = kb.repeat_interleave(rep, 1), vb.repeat_interleave(rep, 1)
        # top-left causal on [S_q, S_k] = causal on the first S_q keys
        top_left = _try("cuDNN attention", lambda: cudnn_attention(
            qb, ke[:, :, :len_q], ve[:, :, :len_q], True, scale)[0])
        if top_left is None:
            continue

        s = {"chunk_q": [q, q], "chunk_cu": [cu_q, cu_q], "k_groups": [k, k],
             "v_groups": [v, v], "slices": [([(0, len_k)], cu_k)] * 2,
             "kv": torch.stack([k, v])}
        reason = _try("cuDNN attention", lambda: _gqa_native_ok(s, scale, True))
        print(f"  native GQA (fwd + bwd vs expanded K/V): {'yes' if reason == '' else reason}")
        peer = CudnnX2(s, scale, expand_kv=reason != "")
        split = _try("rectangle + square", lambda: peer.forward()[0][0])
        if split is not None:
            print(f"  rectangle + square: rel err vs FA2 {_rel(split, ref):.1e}, "
                  f"{time_ms(lambda: peer.forward()) / 2:.3f} ms (incl. merge), "
                  f"{time_ms(peer.calls) / 2:.3f} ms calls alone")

        def verdict(out):
            return (f"rel err vs bottom-right {_rel(out, ref):.1e}, "
                    f"vs top-left {_rel(out, top_left.transpose(1, 2)[0]):.1e}")

        for gqa_label, kk, vv, gqa in (("GQA", kb, vb, True), ("expanded K/V", ke, ve, False)):
            def causal_flag(kk=kk, vv=vv, gqa=gqa):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qb, kk, vv, is_causal=True, scale=scale,
                                                          enable_gqa=gqa)
            out = _try(f"sdpa(is_causal=True), {gqa_label}", causal_flag)
            if out is not None:
                print(f"  sdpa cuDNN is_causal=True, {gqa_label}: "
                      f"{verdict(out.transpose(1, 2)[0])}")

            def lower_right(kk=kk, vv=vv, gqa=gqa):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(
                        qb, kk, vv, attn_mask=causal_lower_right(len_q, len_k), scale=scale,
                        enable_gqa=gqa)
            out = _try(f"sdpa(attn_mask=causal_lower_right), {gqa_label}", lower_right)
            if out is not None:
                print(f"  sdpa cuDNN attn_mask=causal_lower_right, {gqa_label}: accepted, "
                      f"{verdict(out.transpose(1, 2)[0])}, {time_ms(lower_right):.3f} ms "
                      "(torch materializes the mask when flash is off: a dense bias)")

        def varlen():
            res = torch.ops.aten._cudnn_attention_forward(
                q, k, v, None, cu_q, cu_k, len_q, len_k, True, 0.0, True, False, scale=scale)
            return res[0]
        if hasattr(torch.ops.aten, "_cudnn_attention_forward"):
            out = _try("aten._cudnn_attention_forward (varlen THD, GQA, causal)", varlen)
            if out is not None:
                print(f"  aten._cudnn_attention_forward varlen, GQA, causal: "
                      f"{verdict(out.reshape(len_q, h, d))}, {time_ms(varlen):.3f} ms")
        else:
            print("  aten._cudnn_attention_forward: not in this torch")

        def fa2():
            return torch.ops.aten._flash_attention_forward(
                q, k, v, cu_q, cu_k, len_q, len_k, 0.0, True, False, scale=scale)
        print(f"  FA2 varlen (bottom-right): {time_ms(fa2):.3f} ms")


def main(argv: list[str]) -> None:
    if argv[:1] == ["probe"]:
        if not torch.cuda.is_available():
            raise SystemExit("probe needs a CUDA GPU")
        probe(torch.float16 if argv[1:2] == ["fp16"] else torch.bfloat16)
        return
    raise SystemExit("usage: python -m kvonce.bench.peers_cudnn probe [fp16]")


if __name__ == "__main__":
    main(sys.argv[1:])
