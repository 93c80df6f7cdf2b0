"""``make kernel-check`` (scripts/kernel_check.py) for the Gluon paged prefill
(``gluon_prefill.py``): the variants compiled for sm_90a on the CPU, with the SASS counts each
must show."""
from __future__ import annotations

from triton.experimental.gluon import language as gl

from . import gluon_prefill
from .gluon_prefill import _gluon_prefill_kernel


def _check_signature(dtype: str, head_dim: int, box: int, v_pages: bool = False) -> dict:
    gl_dtype = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    kv = gl.NVMMASharedLayout.get_default_for([box, head_dim], gl_dtype)
    v_desc = f"tensordesc<{dtype}[{box}, {head_dim}],{kv!r}>"
    if v_pages:   # V by pages: box [head_dim / 64, box, 64]
        block = [head_dim // 64, box, 64]
        v_layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
        v_desc = f"tensordesc<{dtype}[{', '.join(map(str, block))}],{v_layout!r}>"
    sig = dict(Q=f"*{dtype}", k_desc=f"tensordesc<{dtype}[{box}, {head_dim}],{kv!r}>",
               v_desc=v_desc, Out=f"*{dtype}",
               Lse="*fp32", cu_seqlens_q="*i32", cache_seqlens="*i32", block_table="*i32",
               sm_scale="fp32")
    sig.update({name: "i32" for name in ("batch", "num_tiles", "num_items", "num_programs",
                                         "stride_qt", "stride_qh", "stride_ot", "stride_oh",
                                         "stride_lh", "stride_btb", "page_shift")})
    sig["trace"] = "*i64"
    for name in ("GROUP", "IS_CAUSAL", "PAGE_SIZE", "BLOCK_N", "HEAD_DIM", "STORE_LSE",
                 "LAST_FIRST", "STAGES", "SCALAR_PAGES", "TILE_LOOKUP", "TRACE",
                 "SOFTMAX_FORM", "KV_PAIRED", "LOADER_PAD", "PAD_CHAINS"):
        sig[name] = "constexpr"
    return sig


def _check_spec(variant, dtype, head_dim, page_size, group=4, causal=True, block_n=128,
                stages=3, scalar_pages=None, tile_lookup=False, box=None, trace=False,
                softmax_form=0, row_tree=None, row_sum_mma=None, v_pages=None, kv_paired=None,
                loader_pad=0, pad_chains=1):
    # Per tile and consumer warpgroup: S = Q Kᵀ D/16 m64nBLOCK_Nk16, O += P V BLOCK_N/16
    # m64nDk16; each twice in the code (the loop's pair, the first tile's S and the last tile's
    # P V), and two warpgroups.
    box = box or min(page_size, block_n)
    if row_sum_mma is None:   # P's row sums by the tensor core where the launch takes them
        row_sum_mma = gluon_prefill.row_sum_mma(box) and softmax_form % 8 == 0 and not trace
    if row_sum_mma:
        softmax_form |= 64
    hgmma = 4 * (head_dim // 16 + block_n // 16)
    if softmax_form // 64 % 2:   # and P @ ones, BLOCK_N/16 m64n8k16 with each P V
        hgmma += 4 * (block_n // 16)
    if scalar_pages is None:   # the launch's rule: scalar page ids where a tile has boxes
        scalar_pages = gluon_prefill.SCALAR_PAGES and block_n > box
    # and V by pages, K and V paired, where the launch takes them
    if v_pages is None:
        v_pages = gluon_prefill.V_PAGES and scalar_pages and head_dim > 64
    if row_tree is None:   # the softmax's row reductions as the launch takes them
        row_tree = gluon_prefill.ROW_TREE
    if kv_paired is None:
        kv_paired = gluon_prefill.KV_PAIRED and scalar_pages and not tile_lookup and page_size > 0
    return (variant, _gluon_prefill_kernel, _check_signature(dtype, head_dim, box, v_pages),
            dict(GROUP=group, IS_CAUSAL=causal, PAGE_SIZE=page_size, BLOCK_N=block_n,
                 HEAD_DIM=head_dim, STORE_LSE=True, LAST_FIRST=True, STAGES=stages,
                 SCALAR_PAGES=scalar_pages, TILE_LOOKUP=tile_lookup, TRACE=trace,
                 SOFTMAX_FORM=softmax_form + 8 * row_tree, KV_PAIRED=kv_paired,
                 LOADER_PAD=loader_pad, PAD_CHAINS=pad_chains),
            dict(num_warps=4), dict(HGMMA=hgmma))


GLUON_CHECK_SPECS = [
    # the launch's forms (V by pages, K and V paired where a tile has several boxes)
    _check_spec("d128-bf16-page16-gqa4-causal", "bf16", 128, 16),
    _check_spec("d128-bf16-page256-gqa4-causal", "bf16", 128, 256),
    _check_spec("d128-fp16-page16-mha-noncausal", "fp16", 128, 16, group=1, causal=False),
    _check_spec("d128-bf16-page16-gqa4-causal-2stages", "bf16", 128, 16, stages=2),
    _check_spec("d64-bf16-page32-gqa8-causal", "bf16", 64, 32, group=8),
    _check_spec("d128-bf16-page16-gqa6-causal", "bf16", 128, 16, group=6),
    _check_spec("d128-bf16-page32-gqa4-causal-bn64", "bf16", 128, 32, block_n=64),
    _check_spec("d128-fp16-page32-mha-noncausal", "fp16", 128, 32, group=1, causal=False),
    # the item-step trace probe (``PROBE_TRACE``)
    _check_spec("d128-bf16-page16-gqa4-causal-trace", "bf16", 128, 16, trace=True),
    # the loader's page ids as a tile-ahead vector (``SCALAR_PAGES`` False)
    _check_spec("d128-bf16-page16-gqa4-causal-vectorpages", "bf16", 128, 16,
                scalar_pages=False),
    # V as K (``V_PAGES`` False), K's copies and V's apart (``KV_PAIRED`` False)
    _check_spec("d128-bf16-page16-gqa4-causal-vask-unpaired", "bf16", 128, 16, v_pages=False,
                kv_paired=False),
    _check_spec("d128-fp16-page16-mha-noncausal-unpaired", "fp16", 128, 16, group=1,
                causal=False, kv_paired=False),
    # the loader padded with 40 xorshift rounds a tile (``PROBE_LOADER_PAD``)
    _check_spec("d128-bf16-page16-gqa4-causal-pad", "bf16", 128, 16, loader_pad=40),
    _check_spec("d128-bf16-page16-gqa4-causal-pad4", "bf16", 128, 16, loader_pad=40,
                pad_chains=4),
    _check_spec("d128-bf16-page16-gqa4-causal-padlanes", "bf16", 128, 16, loader_pad=40,
                pad_chains=32),
    # FA4's conditional rescale (``LAZY_RESCALE``, SOFTMAX_FORM + 4)
    _check_spec("d128-bf16-page16-gqa4-causal-lazy", "bf16", 128, 16, softmax_form=4),
    _check_spec("d64-fp16-page32-mha-noncausal-lazy", "fp16", 64, 32, group=1, causal=False,
                softmax_form=4),
    # the row reductions as one chain a row (``ROW_TREE`` False)
    _check_spec("d128-bf16-page16-gqa4-causal-rowchain", "bf16", 128, 16, row_tree=False),
    _check_spec("d64-fp16-page32-mha-noncausal-rowchain", "fp16", 64, 32, group=1,
                causal=False, row_tree=False),
    # P's row sums by the tensor core (``ROW_SUM_MMA``, SOFTMAX_FORM + 64; the launch's form
    # where a tile has 16-row boxes) and by FADDs there
    _check_spec("d128-bf16-page16-gqa4-causal-sumfadd", "bf16", 128, 16, row_sum_mma=False),
    _check_spec("d64-fp16-page32-mha-noncausal-summma", "fp16", 64, 32, group=1, causal=False,
                softmax_form=64),
    # the softmax probes (``PROBE_SOFTMAX``, SOFTMAX_FORM + 1 / + 2: no exponentials, no
    # rescale)
    _check_spec("d128-bf16-page16-gqa4-causal-noexp", "bf16", 128, 16, softmax_form=1),
    _check_spec("d128-bf16-page16-gqa4-causal-norescale", "bf16", 128, 16, softmax_form=2),
    # the probe of one block-table lookup a tile (``PROBE_TILE_LOOKUP``)
    _check_spec("d128-bf16-page16-gqa4-causal-tilelookup", "bf16", 128, 16, tile_lookup=True),
    # the probe of the page size as an argument (``PROBE_RUNTIME_PAGE``: PAGE_SIZE 0), 16-row boxes
    _check_spec("d128-bf16-runtimepage-box16-gqa4-causal", "bf16", 128, 0, box=16),
]
