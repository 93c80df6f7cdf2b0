"""paged|kvonce: kvonce's varlen paged attention under transformers' continuous batching (CPU,
Triton interpreter), against transformers' own paged|sdpa, with the path each call took (in
place over transformers' pages, or the gathered fallback) counted at the two kernels."""
import dataclasses
import inspect
import types

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

from kvonce.integrations import hf_paged
from kvonce.integrations.hf_paged import block_table_from_read_index


def test_block_table_from_read_index_hand_built():
    ps = 16
    # seq 0: 20 tokens on pages 7, 3; seq 1: padding (length 0); seq 2: 33 tokens on pages 2, 9, 5
    runs = [[7 * ps + i for i in range(16)] + [3 * ps + i for i in range(4)],
            [],
            [2 * ps + i for i in range(16)] + [9 * ps + i for i in range(16)] + [5 * ps]]
    read_index = torch.tensor([s for r in runs for s in r], dtype=torch.int64)
    cu = torch.tensor([0, 20, 20, 53], dtype=torch.int32)
    bt = block_table_from_read_index(read_index, cu, 33, ps)
    assert bt.dtype == torch.int32 and bt.is_contiguous()
    assert bt.tolist() == [[7, 3, 0], [0, 0, 0], [2, 9, 5]]
    # a wider table (padded max_seqlen_k) only adds unread zero columns
    assert block_table_from_read_index(read_index, cu, 64, ps).tolist() == \
        [[7, 3, 0, 0], [0, 0, 0, 0], [2, 9, 5, 0]]
    assert block_table_from_read_index(read_index[:0], cu[:1], 0, ps).shape == (0, 1)


@pytest.fixture
def path_counts(monkeypatch):
    """Calls into the two kernels as ``hf_paged`` sees them: ``paged_prefill`` (the in-place
    path) and ``flash_attn_varlen_func`` (the gathered fallback), counted while the test runs."""
    counts = {"in_place": 0, "gathered": 0}
    for attr, path in (("paged_prefill", "in_place"), ("flash_attn_varlen_func", "gathered")):
        def counted(*args, _fn=getattr(hf_paged, attr), _path=path, **kwargs):
            counts[_path] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(hf_paged, attr, counted)
    return counts


def test_gathered_fallback_matches_reference(path_counts):
    """The fallback alone, on what transformers >= 5.24 passes when no cache arrives: every
    sequence's past+new K/V gathered into one contiguous copy (padded past ``cu_seq_lens_k[-1]``
    with NaN rows it must not read), the q rows the newest of each sequence; a prefill, a
    chunk after a past and a decode row in one batch, GQA 4/2."""
    from kvonce.reference import varlen_attention_ref

    g = torch.Generator().manual_seed(0)
    past, new = [10, 0, 20], [3, 7, 1]
    heads, heads_k, d, scale = 4, 2, 32, 0.3
    total_q, total_k = sum(new), sum(past) + sum(new)
    q = torch.randn(1, heads, total_q, d, generator=g).to(DEVICE)
    k, v = (torch.randn(1, heads_k, total_k + 5, d, generator=g).to(DEVICE) for _ in range(2))
    k[:, :, total_k:] = float("nan")
    v[:, :, total_k:] = float("nan")
    cu_q = torch.tensor([0, 3, 10, 11], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 13, 20, 41], dtype=torch.int32, device=DEVICE)
    kwargs = dict(cu_seq_lens_q=cu_q, max_length_q=7, cu_seq_lens_k=cu_k, max_length_k=21,
                  read_index=[torch.arange(total_k, device=DEVICE)],
                  write_index=[torch.arange(total_q, device=DEVICE)],
                  block_table=None, position_ids=None)
    module = types.SimpleNamespace(layer_idx=0, sliding_window=None)
    out, weights = hf_paged.kvonce_paged_attention(module, q, k, v, None, scaling=scale, **kwargs)
    assert weights is None and out.shape == (1, total_q, heads, d)
    assert path_counts == {"in_place": 0, "gathered": 1}
    ref, _ = varlen_attention_ref(q[0].transpose(0, 1), k[0].transpose(0, 1),
                                  v[0].transpose(0, 1), cu_q, cu_k, softmax_scale=scale)
    err = ((out[0] - ref).norm() / ref.norm()).item()
    assert err < 1e-5, f"relative error {err:.3e}"
    # the same call with the k arguments still keyed by layer type (not narrowed by update)
    kwargs.update(cu_seq_lens_k={"full_attention": cu_k}, max_length_k={"full_attention": 21})
    out2, _ = hf_paged.kvonce_paged_attention(module, q, k, v, None, scaling=scale, **kwargs)
    assert torch.equal(out2, out)
    with pytest.raises(ValueError, match="continuous batching"):
        hf_paged.kvonce_paged_attention(module, q, k, v, None, scaling=scale)


def _generate(impl, dtype, graphs):
    """Greedy tokens of a tiny random Llama (fixed weights, lm head 10x wider than the default
    so that bf16 rounding does not decide near-tied logits) for 4 prompts through
    ``generate_batch`` with attention implementation ``impl``, in prompt order."""
    from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=61, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      max_position_embeddings=128)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 61, (n,), generator=g).tolist() for n in (5, 13, 20, 9)]
    gen = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)

    # 5.23 names the page size page_size (block_size kept as a deprecated alias) and has
    # auto_switch_to_flash; 5.17 has only block_size and never switches to flash on its own
    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    cb_kwargs = dict(num_blocks=16, max_batch_tokens=16, use_cuda_graph=graphs,
                     use_async_batching=False, max_blocks_per_request=0,
                     allow_block_sharing=False)
    cb_kwargs["page_size" if "page_size" in fields else "block_size"] = 16
    if "auto_switch_to_flash" in fields:
        cb_kwargs["auto_switch_to_flash"] = False

    model.set_attn_implementation(impl)
    model.to(device=DEVICE, dtype=dtype).eval()
    with torch.no_grad():
        out = model.generate_batch(prompts, generation_config=gen,
                                   continuous_batching_config=ContinuousBatchingConfig(**cb_kwargs),
                                   warmup=False)
    by_prompt = {tuple(o.prompt_ids): list(o.generated_tokens) for o in out.values()}
    tokens = [by_prompt[tuple(p)] for p in prompts]
    assert all(len(t) == 8 for t in tokens), f"{impl}: {tokens}"
    return tokens


@pytest.mark.parametrize("dtype,graphs", [(torch.float32, False)] + (
    [(torch.bfloat16, False), (torch.bfloat16, True)] if HAS_CUDA else []))
def test_generate_batch_in_place_matches_paged_sdpa(hf_continuous_batching, path_counts, dtype,
                                                    graphs):
    """Greedy tokens equal paged|sdpa's (fp32 on CPU; bf16 with and without transformers' CUDA
    graphs on the GPU), and every kvonce call read transformers' pages in place: a quiet slide
    onto the gathered fallback fails this on any supported release."""
    import kvonce.integrations.hf as kv_hf

    kv_hf.register()
    ref = _generate("paged|sdpa", dtype, graphs)
    assert path_counts == {"in_place": 0, "gathered": 0}
    got = _generate("paged|kvonce", dtype, graphs)
    assert got == ref
    assert path_counts["in_place"] > 0 and path_counts["gathered"] == 0, path_counts


@pytest.mark.parametrize("dtype,graphs", [(torch.float32, False)] + (
    [(torch.bfloat16, False), (torch.bfloat16, True)] if HAS_CUDA else []))
def test_generate_batch_gathered_fallback_matches_paged_sdpa(hf_continuous_batching, path_counts,
                                                            monkeypatch, dtype, graphs):
    """Without kvonce's ``PagedAttentionCache.update`` wrapper, transformers >= 5.24 gives the
    attention function no cache: every call takes the gathered fallback, and the greedy tokens
    still equal paged|sdpa's (fp32 on CPU; bf16 with and without CUDA graphs on the GPU)."""
    import transformers
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    from transformers.models.llama.modeling_llama import LlamaAttention

    import kvonce.integrations.hf as kv_hf

    if "cache" not in inspect.signature(LlamaAttention.forward).parameters:
        pytest.skip(f"transformers {transformers.__version__}: the attention layer takes no "
                    "`cache`, so continuous batching's cache reaches the attention function "
                    "and kvonce writes the pages itself; the gathered fallback is unreachable "
                    "through generate_batch here (test_gathered_fallback_matches_reference "
                    "checks it)")
    kv_hf.register()
    update = PagedAttentionCache.update
    monkeypatch.setattr(PagedAttentionCache, "update", getattr(update, "_kvonce_original", update))
    ref = _generate("paged|sdpa", dtype, graphs)
    got = _generate("paged|kvonce", dtype, graphs)
    assert got == ref
    assert path_counts["gathered"] > 0 and path_counts["in_place"] == 0, path_counts


def test_register_patches_update_once(hf_continuous_batching):
    """The update wrapper is installed where ``update`` takes the attention kwargs, once, is not
    marked ``torch.compiler.disable`` like the original, and hands a kvonce model's layer the
    cache with its K/V untouched."""
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    import kvonce.integrations.hf as kv_hf

    kv_hf.register()
    update = PagedAttentionCache.update
    kv_hf.register()
    assert PagedAttentionCache.update is update
    original = getattr(update, "_kvonce_original", update)
    if "kwargs" not in inspect.signature(original).parameters:  # 5.17
        assert not getattr(update, "_kvonce_wrapped", False)
    else:
        assert update._kvonce_wrapped and not hasattr(update, "_torchdynamo_disable")
        cache = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="kvonce"))
        k, v, kwargs = torch.zeros(1, 1, 2, 4), torch.ones(1, 1, 2, 4), {"write_index": None}
        out_k, out_v = update(cache, k, v, 0, kwargs=kwargs)
        assert out_k is k and out_v is v and kwargs["cache"] is cache
