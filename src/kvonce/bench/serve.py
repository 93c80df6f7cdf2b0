"""Benchmark: HF transformers continuous batching (``generate_batch``), ``paged|kvonce`` against
``paged|sdpa`` in one process (CUDA; ``--device cpu`` is a tiny smoke run of the harness).

    python -m kvonce bench serve [--max-batch-tokens 512,2048] [--cuda-graph] [--quick]
                                 [--prompts 256] [--new-tokens 128] [--logit-prompts 16]
                                 [--md PATH] [--json PATH]
    TRITON_INTERPRET=1 python -m kvonce bench serve --device cpu

Model: a randomly initialised Llama (no weights are downloaded), bf16: hidden 2048, 16 layers,
MLP 8192, vocab 32000, untied head, 32 q / 8 KV heads of head dim 64 (``--head-dim 128``: 16 / 4
heads, same parameter count), 1.10e9 parameters. ``--device cpu``: 2 layers, hidden 64, 2 / 1
heads of 32, vocab 256, fp32, 4 prompts of 16..63 tokens, 4 new tokens, page size 16.
Workload: ``--prompts`` random prompts (seeded), lengths uniform in 64..511, each generating
exactly ``--new-tokens`` greedy tokens (``do_sample=False``; no EOS in the model config and
``eos_token_id=-1`` in the generation config, so no request stops early). A backend whose
requests fail or come back short ends the bench with exit status 1 and the first error.
Both backends get the same explicit ``ContinuousBatchingConfig``: page size ``--page-size``
(default 256, transformers' default), ``num_blocks = prompts * ceil((max prompt + new tokens) /
page size)`` (every request fits at once), the ``max_batch_tokens`` of the row, decode fast path
off (``max_blocks_per_request=0``: kvonce takes the varlen path only), no async batching, no
block sharing, CUDA graphs only with ``--cuda-graph``. Each backend runs a warm-up
``generate_batch`` (8 prompts, 8 tokens: Triton compiles) before its timed call.

Columns, one timed ``generate_batch(record_timestamps=True)`` per (max_batch_tokens, backend):
- ``tok_s``: generated tokens / ``wall``; ``wall``: ``time.perf_counter`` around the call, after a
  ``torch.cuda.synchronize``; it includes the manager's setup (cache allocation, graph capture)
  and teardown, as the baseline below does
- ``gen_tok_s``: generated tokens / (last token's timestamp - first request's ``created_time``):
  the generation loop alone
- ``ttft``: ``timestamps[0] - created_time`` per request (every request is queued at the start,
  so this includes waiting for a slot); ``itl``: ``(timestamps[-1] - timestamps[0]) / (n - 1)``
  per request; medians and p90 over requests (linear interpolation), ms
- ``backend``: ``sdpa`` (transformers' ``paged|sdpa``), ``kvonce`` (``paged|kvonce``), and with
  ``--gathered`` ``kvonce-gathered``: ``paged|kvonce`` with its ``PagedAttentionCache.update``
  wrapper removed, so transformers >= 5.24 gathers every sequence's K/V into a contiguous copy per
  layer and kvonce runs its fallback over it (what the in-place path saves)
- ``path``: which of the adapter's paths the backend's attention calls took (``in-place``,
  ``gathered``; counted in Python, so under CUDA graphs only the captured calls count)
- ``x_sdpa``: tok_s / paged|sdpa's tok_s at the same max_batch_tokens
- ``same``: fraction of requests whose greedy tokens equal paged|sdpa's; ``prefix``: mean
  fraction of tokens before the first difference (bf16 sums in another order may flip a near-tie
  argmax, after which the sequences diverge; printed, not a failure). A random Llama's logits
  are near-flat, so in bf16 these say little; the teacher-forced columns below are the check.

Teacher-forced logits (``--logit-prompts N``, default 16: all 4 at ``--device cpu``; 0: off),
every backend's row, the same reference for all (serve_logits.py has the route): the first
``N`` prompts with the tokens paged|sdpa generated for them in the first timed call (prompt +
``--new-tokens`` tokens) are fed through each backend by one more ``generate_batch`` after its
timed call, same config but no CUDA graphs (a Python hook on transformers' sampling step
replaces each argmax by the token to feed and keeps the fp32 logits). That is the serving path:
prompts prefilled (chunked where longer than the batch's room), then decode rows, in varlen
batches that mix both. Compared positions: the last prompt position and every decode row (the
``N * new_tokens`` positions that predict the fed tokens). Reference: the same weights upcast
to float32 (float64 on cpu), plain ``sdpa`` attention over the whole sequence, no paging.
- ``logit_rel_err``: ||l - l_ref|| / ||l_ref|| over positions x vocab; ``logit_max_abs``:
  max |l - l_ref|; ``top1_agree``: fraction of positions where argmax l = argmax l_ref (bf16
  logits may tie); ``kl``: mean over positions of KL(softmax(l_ref) || softmax(l)), nats.
  paged|sdpa's row is transformers' own error at this dtype, the yardstick for kvonce's.
Baseline before kvonce (docs: /work/shared/research/hf-continuous-batching.md section 7; H100,
transformers 5.17, this model and workload, no graphs): paged|sdpa 1596 tok/s at
max_batch_tokens=2048 and 1024 tok/s at 512 (single runs).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import json
import math
import sys
import time

import torch

from . import report, serve_logits

IMPLS = ("paged|sdpa", "paged|kvonce")


@contextlib.contextmanager
def adapter_paths(gathered: bool):
    """Count the ``paged|kvonce`` adapter's calls per path for the block (yields the counts);
    ``gathered``: with its ``PagedAttentionCache.update`` wrapper removed (transformers >= 5.24
    then hands the fallback a gathered copy)."""
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    from ..integrations import hf_paged

    counts = {"in-place": 0, "gathered": 0}
    saved = (hf_paged.paged_prefill, hf_paged.flash_attn_varlen_func, PagedAttentionCache.update)

    def counting(path, fn):
        def call(*args, **kwargs):
            counts[path] += 1
            return fn(*args, **kwargs)
        return call

    hf_paged.paged_prefill = counting("in-place", saved[0])
    hf_paged.flash_attn_varlen_func = counting("gathered", saved[1])
    if gathered:
        original = getattr(saved[2], "_kvonce_original", None)
        if original is None:
            raise SystemExit("bench serve --gathered: this transformers has no PagedAttentionCache"
                             ".update wrapper to remove (the fallback is reached on >= 5.24)")
        PagedAttentionCache.update = original
    try:
        yield counts
    finally:
        hf_paged.paged_prefill, hf_paged.flash_attn_varlen_func, PagedAttentionCache.update = saved


def path_name(counts: dict) -> str:
    taken = [name for name, n in counts.items() if n]
    return "+".join(taken) if taken else "-"


def build_model(device: str, head_dim: int):
    """A randomly initialised Llama (seed 0): ~1.1B parameters in bf16 on cuda, tiny fp32 on cpu."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if device == "cpu":
        dims = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=32)
        dtype = torch.float32
    else:
        heads = 2048 // head_dim
        dims = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=heads,
                    num_key_value_heads=heads // 4, head_dim=head_dim)
        dtype = torch.bfloat16
    # no special token ids: LlamaConfig's default EOS (2) could end a request early
    cfg = LlamaConfig(**dims, max_position_embeddings=4096, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(cfg, dtype=dtype, attn_implementation=IMPLS[0])
    return model.eval()


def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """``n`` random prompts, lengths uniform in ``lo..hi`` (inclusive), token ids 1..vocab-1."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(1, vocab, (length,), generator=g).tolist() for length in lengths]


def cb_config(*, page_size: int, num_blocks: int, max_batch_tokens: int, cuda_graph: bool):
    """The same explicit ``ContinuousBatchingConfig`` for every backend (transformers' defaults
    are keyed on the attention name). 5.23 calls the page size ``page_size`` (``block_size`` a
    deprecated alias) and may switch to flash attention on its own; 5.17 has ``block_size``."""
    from transformers import ContinuousBatchingConfig

    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    kwargs = dict(num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
                  use_cuda_graph=cuda_graph, use_async_batching=False,
                  max_blocks_per_request=0, allow_block_sharing=False)
    kwargs["page_size" if "page_size" in fields else "block_size"] = page_size
    if "auto_switch_to_flash" in fields:
        kwargs["auto_switch_to_flash"] = False
    return ContinuousBatchingConfig(**kwargs)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def generate(model, impl: str, prompts, new_tokens: int, cb, *, device: str, progress: bool):
    """One ``generate_batch`` call: (outputs in prompt order, wall seconds)."""
    from transformers import GenerationConfig

    model.set_attn_implementation(impl)
    # eos -1: "no EOS", what transformers sets itself (with a warning) when none is given
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                           pad_token_id=0)
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb,
                                   record_timestamps=True, progress_bar=progress)
    _sync(device)
    wall = time.perf_counter() - t0
    return list(out.values()), wall


def _quantile(xs: list[float], q: float) -> float:
    return torch.tensor(xs, dtype=torch.float64).quantile(q).item() if xs else float("nan")


def latency_stats(outputs, wall: float) -> dict:
    """Throughput and per-request latencies (ms) from ``record_timestamps=True`` outputs."""
    tokens = sum(len(o.generated_tokens) for o in outputs)
    ttft = [(o.timestamps[0] - o.created_time) * 1e3 for o in outputs if o.timestamps]
    itl = [(o.timestamps[-1] - o.timestamps[0]) * 1e3 / (len(o.timestamps) - 1)
           for o in outputs if o.timestamps and len(o.timestamps) > 1]
    stamped = [o for o in outputs if o.timestamps]
    span = (max(o.timestamps[-1] for o in stamped) - min(o.created_time for o in stamped)
            if stamped else float("nan"))
    return {"tokens": tokens, "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 1),
            "gen_tok_s": round(tokens / span, 1),
            "ttft_med_ms": round(_quantile(ttft, 0.5), 1),
            "ttft_p90_ms": round(_quantile(ttft, 0.9), 1),
            "itl_med_ms": round(_quantile(itl, 0.5), 2),
            "itl_p90_ms": round(_quantile(itl, 0.9), 2)}


def agreement(got, ref) -> tuple[float, float]:
    """(fraction of identical token lists, mean fraction of tokens before the first difference)."""
    same, prefix = 0, 0.0
    for a, b in zip(got, ref):
        a, b = list(a.generated_tokens), list(b.generated_tokens)
        same += a == b
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix += n / max(len(a), len(b), 1)
    return same / max(len(ref), 1), prefix / max(len(ref), 1)


def check_outputs(impl: str, outputs, n_prompts: int, new_tokens: int) -> None:
    """Exit non-zero (SystemExit with the first error) unless every request came back with
    exactly ``new_tokens`` tokens and no error: a row of failed requests is no measurement."""
    failed = [o for o in outputs if o.error is not None]
    short = [o.request_id for o in outputs if len(o.generated_tokens) != new_tokens]
    if failed or short or len(outputs) != n_prompts:
        first = f"; first error ({failed[0].request_id}): {failed[0].error}" if failed else ""
        raise SystemExit(f"bench serve: {impl}: {len(outputs)}/{n_prompts} outputs, "
                         f"{len(failed)} failed, {len(short)} not of {new_tokens} tokens{first}")


LOGIT_COLUMNS = ("logit_rel_err", "logit_max_abs", "top1_agree", "kl")


def forced_logits(model, impl: str, forced, new_tokens: int, cb, *, device: str):
    """``forced = (prompts, tokens)`` fed through ``impl`` by ``generate_batch`` (``cb``: no CUDA
    graphs): the logits at each fed token's position, ``[new_tokens, vocab]`` per prompt."""
    prompts, tokens = forced
    with serve_logits.teacher_forcing(dict(zip(map(tuple, prompts), tokens))) as captured:
        outputs, _ = generate(model, impl, prompts, new_tokens, cb, device=device,
                              progress=False)
    check_outputs(impl, outputs, len(prompts), new_tokens)
    return serve_logits.check_forced(impl, outputs, prompts, tokens, captured)


def printable(rows: list[dict]) -> list[dict]:
    """The rows with the small logit errors in scientific notation (the table prints 3 decimals)."""
    sci = ("logit_rel_err", "logit_max_abs", "kl")
    return [{k: f"{v:.2e}" if k in sci and isinstance(v, float) else v for k, v in r.items()}
            for r in rows]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m kvonce bench serve")
    p.add_argument("--max-batch-tokens", default=None,
                   help="comma-separated max_batch_tokens values, a row per backend each "
                        "(default 512,2048; cpu: 32)")
    p.add_argument("--prompts", type=int, default=None, help="number of prompts (default 256)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per prompt "
                   "(default 128)")
    p.add_argument("--quick", action="store_true", help="32 prompts, 32 new tokens")
    p.add_argument("--cuda-graph", action="store_true",
                   help="transformers' CUDA graphs on (use_cuda_graph=True) for both backends")
    p.add_argument("--page-size", type=int, default=None, help="KV page size (default 256)")
    p.add_argument("--head-dim", type=int, choices=(64, 128), default=64,
                   help="64: 32/8 heads; 128: 16/4 heads (same parameter count)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a tiny model and workload to smoke-test the harness")
    p.add_argument("--gathered", action="store_true",
                   help="also a kvonce-gathered row: the adapter's fallback over transformers' "
                        "gathered K/V (transformers >= 5.24)")
    p.add_argument("--logit-prompts", type=int, default=16,
                   help="teacher-forced logits against a float32 (cpu: float64) reference "
                        "over this many prompts (default 16; 0: off)")
    p.add_argument("--md", default="", help="append the table here ('' = no)")
    p.add_argument("--json", default="", help="also dump the rows as JSON here")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench serve needs a CUDA GPU (or --device cpu for a smoke run)")
    try:
        import transformers
        from transformers import ContinuousBatchingConfig  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"bench serve needs transformers with continuous batching: {exc}")
    from ..integrations import hf as kv_hf

    kv_hf.register()
    cpu = args.device == "cpu"
    n_prompts = args.prompts or (4 if cpu else 32 if args.quick else 256)
    new_tokens = args.new_tokens or (4 if cpu else 32 if args.quick else 128)
    page = args.page_size or (16 if cpu else 256)
    lo, hi = (16, 63) if cpu else (64, 511)
    batch_tokens = [int(x) for x in (args.max_batch_tokens or ("32" if cpu else "512,2048"))
                    .split(",")]
    # tqdm is transformers' own bar (generate_batch(progress_bar=True)); none when tqdm is absent
    progress = not args.no_progress and importlib.util.find_spec("tqdm") is not None

    model = build_model(args.device, args.head_dim)
    vocab = model.config.vocab_size
    prompts = make_prompts(n_prompts, lo, hi, vocab, seed=args.seed)
    num_blocks = n_prompts * math.ceil((max(map(len, prompts)) + new_tokens) / page)
    n_params = sum(t.numel() for t in model.parameters())
    size = f"{n_params / 1e9:.2f}B" if n_params >= 1e8 else f"{n_params / 1e6:.2f}M"
    dtype = str(model.dtype).removeprefix("torch.")
    print(f"{report.environment()}, transformers {transformers.__version__}; Llama "
          f"{size} params, {dtype}, head dim {model.config.head_dim}; "
          f"{n_prompts} prompts of {lo}..{hi} tokens, {new_tokens} new tokens, page {page}, "
          f"{num_blocks} pages, CUDA graphs {'on' if args.cuda_graph else 'off'}", flush=True)

    warm = prompts[:2] if cpu else prompts[:8]
    n_forced = min(max(args.logit_prompts, 0), n_prompts)
    forced = ref_logits = None  # (prompts, tokens) to feed, and the reference's logits on them
    rows = []
    for mbt in batch_tokens:
        cb = cb_config(page_size=page, num_blocks=num_blocks, max_batch_tokens=mbt,
                       cuda_graph=args.cuda_graph)
        cb_eager = cb_config(page_size=page, num_blocks=num_blocks, max_batch_tokens=mbt,
                             cuda_graph=False)
        results, sdpa_row = {}, None
        backends = [(impl, False) for impl in IMPLS] + ([("paged|kvonce", True)]
                                                        if args.gathered else [])
        for impl, gathered in backends:
            # the backend without "paged|": a "|" would split a markdown table cell
            backend = impl.removeprefix("paged|") + ("-gathered" if gathered else "")
            with adapter_paths(gathered) as counts:
                generate(model, impl, warm, 1 if cpu else 8, cb, device=args.device,
                         progress=False)
                print(f"{backend}, max_batch_tokens={mbt}:", flush=True)
                outputs, wall = generate(model, impl, prompts, new_tokens, cb,
                                         device=args.device, progress=progress)
                check_outputs(impl, outputs, n_prompts, new_tokens)
                if n_forced and forced is None:
                    forced = (prompts[:n_forced],
                              [list(o.generated_tokens) for o in outputs[:n_forced]])
                    ref_logits = serve_logits.reference_logits(
                        model, *forced, torch.float64 if cpu else torch.float32)
                if forced is not None:
                    tf = forced_logits(model, impl, forced, new_tokens, cb_eager,
                                       device=args.device)
            results[backend] = outputs
            row = {"backend": backend, "max_batch_tokens": mbt,
                   "graphs": "on" if args.cuda_graph else "off",
                   "path": "-" if impl == "paged|sdpa" else path_name(counts),
                   **latency_stats(outputs, wall)}
            row["x_sdpa"] = row["same"] = row["prefix"] = "-"
            row.update(dict.fromkeys(LOGIT_COLUMNS, "-") if forced is None
                       else serve_logits.compare(tf, ref_logits))
            if impl == "paged|sdpa":
                sdpa_row = row
            elif sdpa_row is not None:
                row["x_sdpa"] = round(row["tok_s"] / sdpa_row["tok_s"], 3)
                same, prefix = agreement(outputs, results["sdpa"])
                row["same"], row["prefix"] = round(same, 3), round(prefix, 3)
                print(f"greedy tokens vs paged|sdpa: {same:.1%} of requests identical, "
                      f"{prefix:.1%} of tokens before the first difference", flush=True)
            rows.append(row)
            print(row, flush=True)
    print(report.format_rows(printable(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.md:
        report.append_markdown(
            args.md, f"Continuous batching (generate_batch), random Llama of {size} params"
                     f", head dim {model.config.head_dim}, "
                     f"{n_prompts} prompts {lo}..{hi} + {new_tokens} new, page {page}, "
                     f"transformers {transformers.__version__}", printable(rows),
            command=("python -m kvonce bench serve " + " ".join(argv)).strip(), dtype=dtype,
            date=datetime.date.today().isoformat())


if __name__ == "__main__":
    main(sys.argv[1:])
