"""Real-model check of the quantized KV caches: a small randomly initialised HF transformers Llama
(GQA) generating greedily with kvonce's paged decode over an fp16 / fp8_e4m3 / int8 / int4 cache.

    PYTHONPATH=src python scripts/quant_hf_check.py                 # CUDA: fp16 model, 64 tokens
    PYTHONPATH=src python scripts/quant_hf_check.py --device cpu --tiny   # CPU, Triton interpreter

The attention of every layer is a function registered with transformers' ``AttentionInterface``
("kvonce_paged"): on the prefill step it computes causal SDPA over the prompt and appends the
prompt's K/V to the layer's paged cache (``kvonce.append_paged_kv``: quantized there for a
quantized cache); on each decode step it appends the new token and calls
``kvonce.paged_attention`` over the (quantized) paged cache. Pages are in random order. fp8's
per-KV-head scale is fixed when a layer's cache is created, from the prompt's keys / values
(``amax / 448``); later tokens past that saturate, as with any fixed fp8 scale.

Reported per cache format, against the run on a plain cache (the model's dtype: fp16 on CUDA,
fp32 on CPU): the fraction of generated tokens equal to the plain run's, the first step where
they differ, and the max / mean relative logit error ``||l - l_plain|| / ||l_plain||`` over all
steps, with both runs fed the plain run's tokens (teacher forcing, so the contexts stay aligned).
The plain kvonce run itself is compared with HF's own SDPA generation (DynamicCache), which it
should match to rounding.

``--outliers X``: keys with outlier channels, as trained LLMs have them (issue 26 section 2): the
model gets a k_proj bias (zero elsewhere) of fixed-sign offsets, X times the keys' typical
magnitude, in the two lowest-frequency rotary pairs of every KV head; added before RoPE, so the
cache holds them rotated, as a real model's would. ``--key-transform``: each quantized format
also runs with a ``kvonce.KeyTransform`` per layer, calibrated from that layer's prompt keys
(``calibrate_key_transform``), on append and attention.
"""
from __future__ import annotations

import argparse
import os
import sys

ATTN_NAME = "kvonce_paged"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu runs the kernels under the Triton interpreter (TRITON_INTERPRET=1)")
    p.add_argument("--tiny", action="store_true",
                   help="2 layers, hidden 128, 4 / 2 heads of 32, 16-token prompts, 8 new tokens")
    p.add_argument("--tokens", type=int, default=None, help="new tokens (default 64, tiny 8)")
    p.add_argument("--prompt-len", type=int, default=None, help="default 128, tiny 16")
    p.add_argument("--batch", type=int, default=None, help="prompts (default 4, tiny 2)")
    p.add_argument("--formats", default="fp8_e4m3,int8,int4",
                   help="quantized formats to check, comma-separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--outliers", type=float, default=0.0,
                   help="k_proj bias offsets this many times the keys' typical magnitude "
                        "in the two lowest-frequency rotary pairs (0: none)")
    p.add_argument("--key-transform", action="store_true",
                   help="also run each format with a KeyTransform per layer")
    p.add_argument("--key-outliers", type=int, default=0,
                   help="also run each format with dense-and-sparse keys: this many channels "
                        "per KV head (calibrated per layer from the prompt) in a KeyOutliers")
    return p.parse_args(argv)


def build_model(args, torch):
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.tiny:
        shape = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    else:
        shape = dict(num_hidden_layers=4, hidden_size=512, intermediate_size=1536,
                     num_attention_heads=8, num_key_value_heads=2, head_dim=128)
    config = LlamaConfig(vocab_size=1000, max_position_embeddings=4096,
                         attention_bias=args.outliers > 0, **shape)
    torch.manual_seed(args.seed)
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    model = LlamaForCausalLM(config).eval()
    if args.outliers > 0:
        add_key_outliers(torch, model, args.outliers, args.seed)
    return model.to(device=args.device, dtype=dtype)


def add_key_outliers(torch, model, times: float, seed: int) -> None:
    """Zero every attention bias, then give k_proj a bias of fixed-sign offsets in the two
    lowest-frequency rotary pairs of each KV head (channels ``d/2 - 2, d/2 - 1`` and their
    partners ``d - 2, d - 1`` in HF's rotate-half layout), ``times`` the keys' typical
    magnitude (the k_proj weights' row norm times the hidden states' RMS, ~1)."""
    cfg = model.config
    d, hk = cfg.head_dim, cfg.num_key_value_heads
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
                if proj.bias is not None:
                    proj.bias.zero_()
            typical = attn.k_proj.weight.norm(dim=1).mean().item()
            bias = attn.k_proj.bias.view(hk, d)
            for ch in (d // 2 - 2, d // 2 - 1, d - 2, d - 1):
                sign = torch.where(torch.rand(hk, generator=g) < 0.5, -1.0, 1.0)
                bias[:, ch] = sign * times * typical


class PagedKV:
    """Per-layer paged caches of one generation (one format), shared page table and lengths.

    ``cache_seqlens`` holds the tokens already in every layer's cache; each layer appends the
    step's tokens at that position, and ``advance`` moves it once the whole model has run."""

    def __init__(self, torch, kvonce, kv_format, batch, max_len, nheads_k, head_dim, dtype,
                 device, page_size=16, seed=0, key_transform=False, key_outliers=0):
        self.torch, self.kvonce = torch, kvonce
        self.key_transform = key_transform
        self.key_outliers = key_outliers
        self.transforms: dict[int, object] = {}
        self.outliers: dict[int, object] = {}
        self.kv_format, self.dtype, self.device = kv_format, dtype, device
        self.page_size, self.nheads_k, self.head_dim = page_size, nheads_k, head_dim
        pages_per_seq = -(-max_len // page_size)
        self.num_pages = batch * pages_per_seq
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(self.num_pages, generator=g).to(torch.int32)
        self.block_table = perm.view(batch, pages_per_seq).to(device)
        self.cache_seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
        self.layers: dict[int, tuple] = {}

    def _new_layer(self, k, v):
        """Empty caches (and scales) for one layer; fp8's scales from the prompt's K/V."""
        torch, fmt = self.torch, self.kv_format
        shape = (self.num_pages, self.page_size, self.nheads_k, self.head_dim)
        if fmt is None:
            return (torch.zeros(shape, dtype=self.dtype, device=self.device),
                    torch.zeros(shape, dtype=self.dtype, device=self.device), None, None)
        if fmt == "fp8_e4m3":
            return (torch.zeros(shape, dtype=torch.float8_e4m3fn, device=self.device),
                    torch.zeros(shape, dtype=torch.float8_e4m3fn, device=self.device),
                    self.kvonce.quantize_kv(k, fmt)[1], self.kvonce.quantize_kv(v, fmt)[1])
        if fmt == "int8":
            data = lambda: torch.zeros(shape, dtype=torch.int8, device=self.device)
            scale = lambda: torch.zeros(shape[:3], dtype=torch.float32, device=self.device)
        else:
            data = lambda: torch.zeros((*shape[:3], self.head_dim // 2), dtype=torch.uint8,
                                       device=self.device)
            scale = lambda: torch.zeros((*shape[:3], 2), dtype=torch.float32,
                                        device=self.device)  # (scale, offset) per token
        return data(), data(), scale(), scale()

    def attention(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  **kwargs):
        """transformers attention function: ``query [b, h, T, d]``, ``key/value [b, hk, T, d]``
        (this step's tokens only: the model runs without HF's cache) -> ``([b, T, h, d], None)``."""
        torch, kvonce = self.torch, self.kvonce
        k = key.transpose(1, 2).contiguous()
        v = value.transpose(1, 2).contiguous()
        layer = module.layer_idx
        if layer not in self.layers:
            k_stored = k
            if self.key_transform:  # from this layer's prompt keys [b * T, hk, d]
                self.transforms[layer] = kvonce.calibrate_key_transform(
                    k.reshape(-1, *k.shape[2:]))
                k_stored = self.transforms[layer].keys(k)  # fp8's scale: of the stored keys
            if self.key_outliers:  # channels from this layer's prompt keys
                channels = kvonce.calibrate_outlier_channels(k.reshape(-1, *k.shape[2:]),
                                                             n=self.key_outliers)
                self.outliers[layer] = kvonce.new_key_outliers(channels, self.num_pages,
                                                               self.page_size)  # fp16
                k_stored = self.outliers[layer].split(k)[0]
            self.layers[layer] = self._new_layer(k_stored, v)
        k_cache, v_cache, k_scale, v_scale = self.layers[layer]
        kt = self.transforms.get(layer)
        ko = self.outliers.get(layer)
        kv_format = "int4" if self.kv_format == "int4" else None
        kvonce.append_paged_kv(k, v, k_cache, v_cache, self.cache_seqlens, self.block_table,
                               k_scale=k_scale, v_scale=v_scale, kv_format=kv_format,
                               key_transform=kt, key_outliers=ko)
        new = query.shape[2]
        if new > 1:  # prefill: the prompt attends to itself (the cache holds it for later)
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, is_causal=True, scale=scaling, enable_gqa=True)
            return out.transpose(1, 2), None
        q = query.transpose(1, 2).contiguous()
        out = kvonce.paged_attention(q, k_cache, v_cache, self.cache_seqlens + new,
                                     self.block_table, softmax_scale=scaling, k_scale=k_scale,
                                     v_scale=v_scale, kv_format=kv_format, key_transform=kt,
                                     key_outliers=ko)
        return out, None

    def advance(self, n: int) -> None:
        self.cache_seqlens += n


_active: PagedKV | None = None


def _kvonce_paged_attention(module, query, key, value, attention_mask, **kwargs):
    return _active.attention(module, query, key, value, attention_mask, **kwargs)


def greedy(torch, model, prompt, steps, step_fn, forced=None):
    """Greedy decoding: ``(tokens [batch, steps], logits float32 [steps, batch, vocab])``;
    token ``i`` is the argmax after the prompt and ``i`` earlier tokens. With ``forced``, those
    tokens are fed instead of the argmaxes (teacher forcing)."""
    logits = step_fn(prompt, 0)
    tokens, all_logits = [], []
    pos = prompt.shape[1]
    for i in range(steps):
        last = logits[:, -1].float()
        all_logits.append(last)
        tokens.append(last.argmax(-1))
        feed = tokens[-1] if forced is None else forced[:, i]
        if i + 1 < steps:
            logits = step_fn(feed[:, None], pos)
            pos += 1
    return torch.stack(tokens, 1), torch.stack(all_logits)


def kvonce_step_fn(torch, kvonce, model, kv_format, batch, max_len, seed, key_transform=False,
                   key_outliers=0):
    """A step function running ``model`` with kvonce's paged attention over a fresh cache."""
    global _active
    cfg = model.config
    _active = PagedKV(torch, kvonce, kv_format, batch, max_len, cfg.num_key_value_heads,
                      cfg.head_dim, model.dtype, model.device, seed=seed,
                      key_transform=key_transform, key_outliers=key_outliers)
    model.set_attn_implementation(ATTN_NAME)
    state = _active

    def step(ids, pos):
        positions = torch.arange(pos, pos + ids.shape[1], device=ids.device)[None].expand_as(ids)
        with torch.no_grad():
            logits = model(ids, position_ids=positions, use_cache=False).logits
        state.advance(ids.shape[1])
        return logits
    return step


def hf_sdpa_step_fn(torch, model):
    """A step function running ``model`` with HF's SDPA attention and its DynamicCache."""
    from transformers import DynamicCache

    model.set_attn_implementation("sdpa")
    cache = DynamicCache(config=model.config)

    def step(ids, pos):
        positions = torch.arange(pos, pos + ids.shape[1], device=ids.device)[None].expand_as(ids)
        with torch.no_grad():
            return model(ids, position_ids=positions, past_key_values=cache,
                         use_cache=True).logits
    return step


def compare(tokens, ref_tokens, logits, ref_logits):
    """Token agreement of a free run with the reference run's tokens, and the relative logit
    error of a teacher-forced run (``logits``, fed the reference's tokens) against the
    reference's ``ref_logits`` (same context at every step)."""
    equal = tokens == ref_tokens
    differs = (~equal).any(0).nonzero()
    first = int(differs[0]) if differs.numel() else None
    rel = (logits - ref_logits).norm(dim=-1) / ref_logits.norm(dim=-1)  # [steps, batch]
    return {"tokens equal": f"{equal.float().mean().item():.3f}",
            "first divergence (step)": "none" if first is None else str(first),
            "max rel logit err": f"{rel.max().item():.2e}",
            "mean rel logit err": f"{rel.mean().item():.2e}"}


def main(argv):
    args = parse_args(argv)
    if args.device == "cpu":
        # Before triton is imported: the kernels run under the interpreter.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from transformers import AttentionInterface

    import kvonce

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a CUDA GPU (or use --device cpu --tiny)")
    steps = args.tokens or (8 if args.tiny else 64)
    prompt_len = args.prompt_len or (16 if args.tiny else 128)
    batch = args.batch or (2 if args.tiny else 4)
    formats = [f for f in args.formats.split(",") if f]
    AttentionInterface.register(ATTN_NAME, _kvonce_paged_attention)
    model = build_model(args, torch)
    cfg = model.config
    print(f"Llama {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, heads "
          f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} x {cfg.head_dim}, vocab "
          f"{cfg.vocab_size}, {model.dtype} on {args.device}; batch {batch}, prompt "
          f"{prompt_len}, {steps} new tokens, page 16 in random order; key outliers "
          f"{args.outliers or 'none'}", flush=True)
    g = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=g).to(args.device)
    max_len = prompt_len + steps
    run = lambda fmt, forced=None, kt=False, ko=0: greedy(
        torch, model, prompt, steps,
        kvonce_step_fn(torch, kvonce, model, fmt, batch, max_len, args.seed, kt, ko), forced)

    plain_tokens, plain_logits = run(None)
    rows = []
    hf_tokens, _ = greedy(torch, model, prompt, steps, hf_sdpa_step_fn(torch, model))
    _, hf_forced = greedy(torch, model, prompt, steps, hf_sdpa_step_fn(torch, model),
                          forced=plain_tokens)
    plain_name = f"kvonce plain ({str(model.dtype).replace('torch.', '')}) cache"
    rows.append({"run": plain_name, "vs": "HF SDPA + DynamicCache",
                 **compare(plain_tokens, hf_tokens, plain_logits, hf_forced)})
    for fmt in formats:
        tokens, _ = run(fmt)
        _, forced = run(fmt, forced=plain_tokens)
        rows.append({"run": f"kvonce {fmt} cache", "vs": plain_name,
                     **compare(tokens, plain_tokens, forced, plain_logits)})
        if args.key_transform:
            tokens, _ = run(fmt, kt=True)
            _, forced = run(fmt, forced=plain_tokens, kt=True)
            rows.append({"run": f"kvonce {fmt} cache + key transform", "vs": plain_name,
                         **compare(tokens, plain_tokens, forced, plain_logits)})
        if args.key_outliers:
            tokens, _ = run(fmt, ko=args.key_outliers)
            _, forced = run(fmt, forced=plain_tokens, ko=args.key_outliers)
            rows.append({"run": f"kvonce {fmt} cache + {args.key_outliers} outlier channels",
                         "vs": plain_name,
                         **compare(tokens, plain_tokens, forced, plain_logits)})
    headers = list(rows[0])
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for r in rows:
        print("| " + " | ".join(r[h] for h in headers) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
