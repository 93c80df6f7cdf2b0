"""Smoke test of scripts/quant_outliers.py (issue 26 section 2's accuracy study): every scheme runs
on tiny synthetic keys, today's format reproduces kvonce.quantize_kv's error, centring with the
true offset removes a fixed-sign offset's damage, and dense-and-sparse keeps outlier channels."""
import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "quant_outliers.py"
spec = importlib.util.spec_from_file_location("quant_outliers", SCRIPT)
qo = importlib.util.module_from_spec(spec)
sys.modules["quant_outliers"] = qo
spec.loader.exec_module(qo)

SMALL = dict(batch=2, length=32, heads=4, heads_k=2, d=128)


def test_every_scheme_runs_on_tiny_cases():
    cases = [qo.make_case("rope-8k", 0, **SMALL)]
    lines = []
    errs = qo.run_table(cases, out=lines.append)
    assert len(lines) > 2 + len(qo.FORMATS)
    for (case, fmt, name), (err, kbytes) in errs.items():
        if err is None:  # scheme not defined for this format (every scheme has an int4 variant)
            assert fmt != "int4", name
            continue
        assert torch.isfinite(torch.tensor(err)) and kbytes > 0, (case, fmt, name)


def test_centring_removes_a_fixed_offset():
    case = qo.make_case("offset", 0, **SMALL)
    for fmt in qo.FORMATS:
        today, _ = qo.evaluate(case, fmt, qo.s_today)
        centred, _ = qo.evaluate(case, fmt, qo.s_centre("calib"))
        assert centred < today / 3, (fmt, today, centred)


def test_dense_sparse_keeps_outlier_channels_exactly():
    case = qo.make_case("offset", 0, **SMALL)
    _, k_hat, kbytes = qo.s_dense_sparse(4, False)("int8", case)
    assert kbytes == qo.BASE_BYTES["int8"] + 8
    assert torch.equal(k_hat[..., list(qo.OUTLIER_CH)], case.k[..., list(qo.OUTLIER_CH)])


def test_dense_sparse_int8_sparse_channels():
    """``sparse_int8``: the kept channels as int8 with one scale per token over them (n + 2
    bytes), within half a step of that token's own scale; the dense channels as with fp16 ones."""
    case = qo.make_case("offset", 0, **SMALL)
    ch = list(qo.OUTLIER_CH)
    _, fp16_sparse, _ = qo.s_dense_sparse(4, False)("int8", case)
    _, k_hat, kbytes = qo.s_dense_sparse(4, False, sparse_int8=True)("int8", case)
    assert kbytes == qo.BASE_BYTES["int8"] + 4 + 2
    dense = [c for c in range(case.k.shape[-1]) if c not in ch]
    assert torch.equal(k_hat[..., dense], fp16_sparse[..., dense])
    kept = case.k[..., ch]
    step = kept.abs().amax(-1, keepdim=True) / 127
    err = (k_hat[..., ch] - kept).abs()
    assert not torch.equal(k_hat[..., ch], kept)
    assert bool((err <= step * 0.5 + 1e-3 * step + 1e-6).all()), (err / step).max()


def test_rope_keeps_norms_and_pair_ties():
    x = torch.randn(3, 5, 2, 128)
    y = qo.rope(x, torch.arange(5) * 100)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    stat = torch.arange(128.0).expand(2, 128)
    tied = qo.tie_pairs(stat, True)
    assert torch.equal(tied[:, :64], tied[:, 64:])
