"""`python -m kvonce bench serve` end to end at its CPU smoke size: a tiny fp32 Llama through
transformers' generate_batch with paged|sdpa and paged|kvonce (the kvonce kernels under the
Triton interpreter), rows written as JSON, kvonce's greedy tokens equal to sdpa's, and the
teacher-forced logits (the same tokens fed through every backend) against a float64 reference:
fp32 rounding on the unperturbed kernel, an error in step with a 0.1% perturbation of it."""
import inspect
import json

import pytest
import torch

from kvonce.bench import serve, serve_logits


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke size; the GPU runs the bench")
def test_serve_bench_cpu_smoke(hf_continuous_batching, tmp_path):
    """Rows for sdpa and kvonce (in place), and where transformers' layers gather K/V before the
    attention function (>= 5.24), kvonce-gathered (the fallback) too: tokens equal sdpa's."""
    from transformers.models.llama.modeling_llama import LlamaAttention

    gathers = "cache" in inspect.signature(LlamaAttention.forward).parameters
    out = tmp_path / "serve.json"
    serve.main(["--device", "cpu", "--quick", "--no-progress", "--json", str(out)]
               + (["--gathered"] if gathers else []))
    rows = json.loads(out.read_text())
    assert [r["backend"] for r in rows] == ["sdpa", "kvonce"] + (["kvonce-gathered"] if gathers
                                                                 else [])
    assert [r["path"] for r in rows] == ["-", "in-place"] + (["gathered"] if gathers else [])
    assert all(r["tokens"] > 0 and r["tok_s"] > 0 for r in rows)
    assert all(r["same"] == 1.0 and r["prefix"] == 1.0 for r in rows[1:])
    # teacher-forced logits against float64 plain sdpa: fp32 rounding (~2e-7) on every backend
    for r in rows:
        assert r["logit_rel_err"] < 1e-5 and r["logit_max_abs"] < 1e-4, r
        assert r["top1_agree"] == 1.0 and 0 <= r["kl"] < 1e-10, r


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke size; the GPU runs the bench")
def test_serve_bench_logits_catch_a_perturbed_kernel(hf_continuous_batching, monkeypatch,
                                                     tmp_path):
    """kvonce's attention output scaled by 1 + 1e-3 in every layer: its logits error grows
    from fp32 rounding to ~1e-3 x a model factor (0.6 here), sdpa's row does not move, and the
    greedy tokens still all agree (what the teacher-forced columns are for)."""
    from kvonce.integrations import hf_paged

    kernel = hf_paged.paged_prefill
    monkeypatch.setattr(hf_paged, "paged_prefill", lambda *a, **k: kernel(*a, **k) * (1 + 1e-3))
    out = tmp_path / "serve.json"
    serve.main(["--device", "cpu", "--no-progress", "--json", str(out)])
    sdpa, kvonce = json.loads(out.read_text())
    assert kvonce["path"] == "in-place" and kvonce["same"] == 1.0
    assert sdpa["logit_rel_err"] < 1e-5
    assert 1e-4 < kvonce["logit_rel_err"] < 1e-2, kvonce
    assert kvonce["logit_max_abs"] > 100 * sdpa["logit_max_abs"] and kvonce["kl"] > 1e-10


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU sizes")
@pytest.mark.parametrize("impl", ["paged|sdpa", "paged|kvonce"])
def test_teacher_forcing_feeds_tokens_the_model_would_not_pick(hf_continuous_batching, impl):
    """Random continuations (not the model's argmax) forced through generate_batch with chunked
    prefill (prompts longer than max_batch_tokens) and decode rows: every request returns the
    forced tokens and one logits row per token, and those logits match float64 plain sdpa on
    the same sequences."""
    from kvonce.integrations import hf as kv_hf

    kv_hf.register()
    model = serve.build_model("cpu", 64)
    prompts = serve.make_prompts(3, 20, 50, model.config.vocab_size, seed=1)
    g = torch.Generator().manual_seed(2)
    tokens = [torch.randint(1, model.config.vocab_size, (6,), generator=g).tolist()
              for _ in prompts]
    cb = serve.cb_config(page_size=16, num_blocks=32, max_batch_tokens=16, cuda_graph=False)
    got = serve.forced_logits(model, impl, (prompts, tokens), 6, cb, device="cpu")
    assert [x.shape for x in got] == [(6, model.config.vocab_size)] * 3
    ref = serve_logits.reference_logits(model, prompts, tokens, torch.float64)
    err = serve_logits.compare(got, ref)
    assert err["logit_rel_err"] < 1e-5 and err["top1_agree"] == 1.0, err
    # the forced tokens are not what greedy decoding picks
    assert any(t != x.argmax(-1).tolist() for t, x in zip(tokens, got))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke size; the GPU runs the bench")
def test_serve_bench_exits_nonzero_when_requests_fail(hf_continuous_batching, monkeypatch,
                                                      tmp_path):
    """A backend whose every attention call raises: transformers marks its requests failed and
    returns them; the bench exits with the error instead of a row of 0 tokens and nan."""
    from kvonce.integrations import hf_paged

    def broken(*args, **kwargs):
        raise RuntimeError("kernel broken on purpose")

    monkeypatch.setattr(hf_paged, "paged_prefill", broken)
    monkeypatch.setattr(hf_paged, "flash_attn_varlen_func", broken)
    monkeypatch.setattr(serve, "IMPLS", ("paged|kvonce",))
    out = tmp_path / "serve.json"
    with pytest.raises(SystemExit, match=r"paged\|kvonce: 4/4 outputs, 4 failed.*kernel broken"):
        serve.main(["--device", "cpu", "--no-progress", "--json", str(out)])
    assert not out.exists()


def test_serve_bench_needs_a_gpu_or_cpu_flag(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="CUDA GPU"):
        serve.main(["--quick"])
