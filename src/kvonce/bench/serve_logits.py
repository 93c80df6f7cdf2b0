"""Teacher-forced logits for ``bench serve``: the same tokens fed through each backend's paged
cache, its logits at every generated position compared with a float32/float64 reference.

Route through continuous batching: an ordinary greedy ``generate_batch`` (no CUDA graphs), with
transformers' ``ModelRunner._sample`` wrapped (:func:`teacher_forcing`). The wrapper receives the
fp32 logits of each request that gets a new token in this step (rows in batch order, the first
``k`` of ``inputs_and_outputs.requests_in_batch`` with ``has_new_token``), copies each row, and
makes the row's argmax the token to force (the reference sequence's token at that step) before
handing it on. So every request is prefilled with its prompt (in chunks when the prompt exceeds
what is left of ``max_batch_tokens``, beside other requests' decode rows) and then decodes the
forced tokens one row at a time, in varlen batches mixed with other requests' prefill chunks:
the serving path itself, fed identical tokens on every backend. The compared positions are the
last prompt position and every decode row; the other prefill positions reach the logits through
their K/V in the next layers (continuous batching computes logits only where a token is sampled).

Reference: the model's weights upcast (float32 on CUDA, float64 on CPU), transformers' plain
``sdpa`` attention (no paging, no cache) over ``prompt + forced[:-1]``, logits at the same
positions.
"""
from __future__ import annotations

import contextlib
import copy

import torch


@contextlib.contextmanager
def teacher_forcing(forced: dict[tuple, list[int]]):
    """While the block runs, a greedy ``generate_batch`` request whose prompt is a key of
    ``forced`` gets that list's tokens as its generated tokens instead of its own argmax.
    Yields ``{prompt: [logits [vocab] fp32, one per step]}``: the logits the model produced at
    each generated position, before forcing. Needs eager steps (no CUDA graphs, no compile):
    the wrapper is Python that runs once per step."""
    from transformers.generation.continuous_batching.model_runner import ModelRunner

    original = ModelRunner._sample
    captured: dict[tuple, list[torch.Tensor]] = {prompt: [] for prompt in forced}

    def _sample(self, scores, output_ids, *args, **kwargs):
        states = [fs.state for fs in self.inputs_and_outputs.requests_in_batch if fs.has_new_token]
        scores = scores.clone()
        for row, state in enumerate(states):
            key = tuple(state.initial_tokens)
            tokens = forced.get(key)
            step = state.generated_len()
            if tokens is None or step >= len(tokens):
                continue
            captured[key].append(scores[0, row].clone())
            scores[0, row] = float("-inf")
            scores[0, row, tokens[step]] = 0.0
        return original(self, scores, output_ids, *args, **kwargs)

    ModelRunner._sample = _sample
    try:
        yield captured
    finally:
        ModelRunner._sample = original


def check_forced(impl: str, outputs, prompts, continuations, captured) -> list[torch.Tensor]:
    """The captured logits as ``[steps, vocab]`` per prompt, after checking that every request
    came back with exactly its forced tokens and one logits row per token (else SystemExit: the
    wrapper did not reach this transformers' sampling step, and there is no measurement)."""
    by_prompt = {tuple(o.prompt_ids): list(o.generated_tokens) for o in outputs}
    got = []
    for prompt, tokens in zip(prompts, continuations):
        rows = captured[tuple(prompt)]
        if by_prompt.get(tuple(prompt)) != list(tokens) or len(rows) != len(tokens):
            raise SystemExit(f"bench serve: {impl}: teacher forcing did not take (a request came "
                             f"back with {by_prompt.get(tuple(prompt))!r} for forced {tokens!r}, "
                             f"{len(rows)} logits rows); is ModelRunner._sample still where "
                             "transformers samples?")
        got.append(torch.stack(rows))
    return got


@torch.no_grad()
def reference_logits(model, prompts, continuations, dtype: torch.dtype) -> list[torch.Tensor]:
    """``[steps, vocab]`` per prompt from a copy of ``model`` in ``dtype`` with plain ``sdpa``
    over ``prompt + continuation[:-1]``: the logits at the positions that predict the
    continuation's tokens."""
    ref = copy.deepcopy(model).to(dtype)
    ref.set_attn_implementation("sdpa")
    out = []
    for prompt, tokens in zip(prompts, continuations):
        ids = torch.tensor([list(prompt) + list(tokens)[:-1]], device=model.device)
        logits = ref(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1:]
        out.append(logits)
    del ref
    return out


@torch.no_grad()
def compare(got: list[torch.Tensor], ref: list[torch.Tensor]) -> dict:
    """Logits of a backend against the reference, over every compared position (float64):
    ``logit_rel_err`` ||l - l_ref|| / ||l_ref|| (Frobenius over positions x vocab),
    ``logit_max_abs`` max |l - l_ref|, ``top1_agree`` fraction of positions whose argmax equals
    the reference's, ``kl`` mean over positions of KL(softmax(l_ref) || softmax(l)) in nats."""
    g = torch.cat([x.to(ref[0].device) for x in got]).double()
    r = torch.cat(ref).double()
    d = g - r
    lr, lg = r.log_softmax(-1), g.log_softmax(-1)
    kl = (lr.exp() * (lr - lg)).sum(-1).mean()
    return {"logit_rel_err": (d.norm() / r.norm()).item(),
            "logit_max_abs": d.abs().max().item(),
            "top1_agree": (g.argmax(-1) == r.argmax(-1)).double().mean().item(),
            "kl": kl.item()}
