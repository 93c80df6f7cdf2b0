"""paged|kvonce: kvonce's varlen paged attention under transformers' continuous batching (CPU,
Triton interpreter), against transformers' own paged|sdpa."""
import dataclasses

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

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


def _has_continuous_batching():
    try:
        from transformers import ContinuousBatchingConfig  # noqa: F401
        from transformers.generation.continuous_batching.continuous_api import (  # noqa: F401
            ContinuousBatchingManager)
        import psutil  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _has_continuous_batching(),
                    reason="transformers without continuous batching (ContinuousBatchingConfig, "
                           "generate_batch) or psutil missing")
@pytest.mark.parametrize("dtype,graphs", [(torch.float32, False)] + (
    [(torch.bfloat16, False), (torch.bfloat16, True)] if HAS_CUDA else []))
def test_generate_batch_matches_paged_sdpa(dtype, graphs):
    """Greedy tokens of a tiny random Llama equal paged|sdpa's (fp32 on CPU; bf16 with and
    without transformers' CUDA graphs on the GPU). The lm head is initialised 10x wider than
    the default, so that bf16 rounding does not decide near-tied logits."""
    from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM

    import kvonce.integrations.hf as kv_hf

    kv_hf.register()
    cfg = LlamaConfig(vocab_size=61, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      max_position_embeddings=128)
    torch.manual_seed(0)
    ref_model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        ref_model.lm_head.weight.mul_(10.0)
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

    def run(impl):
        model = LlamaForCausalLM(cfg)
        model.load_state_dict(ref_model.state_dict())
        model.set_attn_implementation(impl)
        model.to(device=DEVICE, dtype=dtype).eval()
        cb = ContinuousBatchingConfig(**cb_kwargs)
        with torch.no_grad():
            out = model.generate_batch(prompts, generation_config=gen,
                                       continuous_batching_config=cb, warmup=False)
        by_prompt = {tuple(o.prompt_ids): list(o.generated_tokens) for o in out.values()}
        return [by_prompt[tuple(p)] for p in prompts]

    ref = run("paged|sdpa")
    got = run("paged|kvonce")
    assert all(len(t) == 8 for t in ref)
    assert got == ref
