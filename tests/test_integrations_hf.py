"""HF transformers adapter: one training step of a tiny Llama (GQA) on a packed batch of unequal
sequences, sharded over 2 processes (gloo on CPU under the interpreter, NCCL on 2 GPUs), gives the
loss and parameter gradients of the same model on one process (eager attention, one sequence at a
time)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from conftest import HAS_CUDA, require_hf, spawn_process_group

SEQ_LENS = [8, 12, 4]  # multiples of 2 * world (world 2)


def _model():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=61, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=64,
        attn_implementation="eager")
    return transformers.LlamaForCausalLM(config).float()


def _batch(device):
    """Packed input ids, per-sequence position ids and next-token labels (-100 at each end)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 61, (sum(SEQ_LENS),), generator=g)
    pos = torch.cat([torch.arange(n) for n in SEQ_LENS])
    labels = torch.full_like(ids, -100)
    start = 0
    for n in SEQ_LENS:
        labels[start:start + n - 1] = ids[start + 1:start + n]
        start += n
    cu = torch.tensor([0] + torch.tensor(SEQ_LENS).cumsum(0).tolist(), dtype=torch.int32)
    return ids.to(device), pos.to(device), labels.to(device), cu.to(device)


def _loss(logits, labels):
    return torch.nn.functional.cross_entropy(logits.float(), labels, ignore_index=-100,
                                             reduction="sum")


def reference_step(model, device):
    """Loss and gradients on one process, each sequence on its own (no packing)."""
    ids, pos, labels, cu = _batch(device)
    total = 0.0
    for b in range(len(SEQ_LENS)):
        s, e = int(cu[b]), int(cu[b + 1])
        logits = model(ids[None, s:e], position_ids=pos[None, s:e]).logits[0]
        loss = _loss(logits, labels[s:e])
        loss.backward()
        total += loss.item()
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}


def cp_step(model, device, world, rank, group=None):
    import kvonce.integrations.hf as kv_hf
    from kvonce.zigzag import zigzag_shard

    kv_hf.register()
    model.set_attn_implementation(kv_hf.NAME)
    ids, pos, labels, cu = _batch(device)
    kv_hf.update_zigzag_params(cu, group, check_lengths=True)
    ids_l, pos_l, labels_l = (zigzag_shard(t, cu, world, rank) for t in (ids, pos, labels))
    logits = model(ids_l[None], position_ids=pos_l[None]).logits[0]
    loss = _loss(logits, labels_l)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    if world > 1:
        loss = loss.detach().clone()
        dist.all_reduce(loss, group=group)
        for g in grads.values():
            dist.all_reduce(g, group=group)
    return float(loss), grads


def _compare(ref, got, limit):
    ref_loss, ref_grads = ref
    loss, grads = got
    assert abs(loss - ref_loss) <= limit * abs(ref_loss), f"loss {loss} vs {ref_loss}"
    for name, g in ref_grads.items():
        err = ((grads[name] - g).norm() / g.norm().clamp_min(1e-30)).item()
        assert err < limit, f"grad of {name}: relative error {err:.3e}"


def _worker(rank, world, backend):
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    base = _model().to(device)
    ref = reference_step(copy.deepcopy(base), device)
    # fp32 throughout; on the GPU the kernels' fp32 dots run in TF32 (10-bit mantissa).
    _compare(ref, cp_step(base, device, world, rank), 1e-4 if backend == "gloo" else 1e-2)


@pytest.mark.skipif(HAS_CUDA and torch.cuda.device_count() < 2,
                    reason="on a GPU machine this runs on 2 GPUs with NCCL")
def test_llama_training_step_two_processes():
    require_hf("transformers")
    spawn_process_group(_worker, 2, "nccl" if HAS_CUDA else "gloo")


def test_update_params_check_lengths():
    """Validation mode (world 1 here: lengths must be even); off by default."""
    import kvonce.integrations.hf as kv_hf

    cu = torch.tensor([0, 8, 11], dtype=torch.int32)
    with pytest.raises(ValueError, match="sequence 1 has global length 3, not a multiple of 2"):
        kv_hf.update_zigzag_params(cu, check_lengths=True)
    kv_hf.update_zigzag_params(cu)
    kv_hf._params = None


def test_update_params_required():
    import kvonce.integrations.hf as kv_hf

    kv_hf._params = None
    q = torch.zeros(1, 2, 4, 32)
    with pytest.raises(RuntimeError, match="update_zigzag_params"):
        kv_hf.kvonce_zigzag_attention(None, q, q[:, :1], q[:, :1], None)
