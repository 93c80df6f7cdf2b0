"""Launch configurations, from a table (no live autotuning on the hot path).

Each family has one frozen config dataclass and one ``get_<family>_config`` that reads the table by
GPU compute capability and head dim. Unknown GPUs fall back to a conservative row with a logged
warning. The Hopper rows come from ``python -m kvonce bench zigzag --sweep`` on the lent H100
(see docs/benchmarks.md); rerun it to regenerate them.
"""
from __future__ import annotations

import dataclasses
import logging
import os

log = logging.getLogger("kvonce")

# fp32 inputs (reference-precision users, tests) take each family's fallback row: the tuned rows
# are sized for 16-bit tiles, whose shared memory doubles past Hopper's 227 KB in fp32 (the
# forward's 128 x 128 x 3-stage row would need 384 KB for K/V alone). Not timed: fp32 attention
# runs IEEE fp32 dots by default (PyTorch's "highest" precision), far from tensor-core speed.
FP32_NOTE = "fp32 inputs take the family's fallback (small) tiles"


def op_fields(config) -> tuple:
    """A config's fields in declaration order, as custom-op arguments (an op cannot take a
    dataclass). Not ``dataclasses.astuple``: it deep-copies every field, which Dynamo in torch 2.8
    refuses to trace (``copy.deepcopy``), breaking torch.compile of the public functions."""
    return tuple(getattr(config, f.name) for f in dataclasses.fields(config))


@dataclasses.dataclass(frozen=True)
class DualGroupFwdConfig:
    """Launch config of ``_fused_dual_group_fwd_kernel_varlen``.

    block_m: query rows per group per program (the program holds 2 * block_m rows of state).
    block_n: keys per tile. kv_cache_modifier: "" or ".cg" on K/V loads.
    int64_kv_offsets: force int64 K/V offsets (by default only when they can pass 2^31).
    tma: unmasked K/V tiles of contiguous K/V through TMA tensor descriptors (Hopper); the zigzag
    buffer and masked tiles keep pointer loads.
    one_group: each program holds one group's M-block (one online-softmax state; twice the
    programs, shared K/V tiles read once per group) instead of one M-block of each group.
    """
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    kv_cache_modifier: str = ""
    int64_kv_offsets: bool = False
    tma: bool = False
    one_group: bool = False


# (capability major, minor) -> head dim -> config. Filled from measurements only.
# Contiguous K/V. H100 SXM, triton 3.6, bf16, Llama-3-8B zigzag shapes (scripts/fwd_sweep.py,
# 2026-11-24, docs/notes.md): one group's 128-row block per program with 128-key TMA tiles and 3
# stages, 0 spills: 532-562 TFLOP/s at 1 x 8192 (ranks 0/3/7) and 473-493 on the mixed batch,
# against 477-510 and 396-462 for the dual-group 128 x 64 / 3 stages program (22 spills) measured
# in the same run. d=32..96 reuse the d=128 row; the d=256 row is correctness-tested on the H100
# but not timed.
_DUAL_GROUP_FWD_TABLE: dict[tuple[int, int], dict[int, DualGroupFwdConfig]] = {
    (9, 0): {hd: DualGroupFwdConfig(128, 128, 8, 3, tma=True, one_group=True)
             for hd in (32, 64, 128)}   # 96 is no power of two: no TMA, the earlier row
    | {96: DualGroupFwdConfig(128, 64, 8, 3), 256: DualGroupFwdConfig(64, 32, 8, 2)},
}
# The zigzag all-gather buffer (read in place). H100 sweeps 2026-11-22 (pointer loads):
# 128x64 tiles, 8 warps, 3 stages beat 64x64/4 warps (9.6 vs 15.0 ms at the Llama-3-8B shape,
# rank 0), 128x128/8w/2s (11.2 ms, 222 spilled registers) and 128x32/8w/3s (11.5 ms); .cg off.
# 2026-11-24: one group per program (128 x 128, 3 stages) was faster at 1 x 8192 (9.20-9.62 vs
# 9.14-9.94 ms) but slower on the mixed batch (1.92-2.03 vs 1.54-1.85 ms). 2026-11-25: one group
# with TMA for the sequences whose chunk length is a multiple of 128 (each key tile inside one
# chunk; the others keep pointer loads): scripts/zigzag_fwd_buffer.py, docs/notes.md.
_DUAL_GROUP_FWD_ZIGZAG_TABLE: dict[tuple[int, int], dict[int, DualGroupFwdConfig]] = {
    (9, 0): {hd: DualGroupFwdConfig(128, 128, 8, 3, tma=True, one_group=True)
             for hd in (32, 64, 128)}   # 96 is no power of two: no TMA, the earlier row
    | {96: DualGroupFwdConfig(128, 64, 8, 3), 256: DualGroupFwdConfig(64, 32, 8, 2)},
}

# Small tiles for the Triton interpreter (CPU): few masked keys wasted per tile, quick steps.
_INTERPRETER_CONFIG = DualGroupFwdConfig(32, 32, 4, 1)
_FALLBACK = {hd: DualGroupFwdConfig(64, 32 if hd > 128 else 64, 4, 2) for hd in (32, 64, 96, 128, 256)}
_warned: set = set()


def _table_row(table: dict, capability, head_dim: int):
    """The table's config for ``head_dim`` (or its power-of-two padding) at ``capability``; None
    when the GPU or the head dim has no tuned row."""
    head_dim = int(head_dim)  # a SymInt when a backward is traced with dynamic shapes
    row = table.get(tuple(capability))
    if row is None:
        return None
    return row.get(head_dim, row.get(1 << (head_dim - 1).bit_length()))


def _warn_untuned(warned: set, family: str, capability, tune: str, head_dim=None) -> None:
    """Log once per (GPU, head dim) that ``family`` runs a conservative fallback config, naming
    what the table lacks."""
    key = (capability, head_dim)
    if key not in warned:
        warned.add(key)
        what = "" if head_dim is None else f" at head dim {int(head_dim)}"
        log.warning("kvonce: no tuned %s config for compute capability %s%s; using a conservative "
                    "fallback%s", family, capability, what, tune)


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_device_infos: dict = {}


def device_info(device) -> tuple[tuple[int, int] | None, int]:
    """(compute capability, SM count) of a ``torch.device``; (None, 1) off CUDA (the interpreter).
    Memoized in a plain dict, which torch.compile traces (it warns on functools.lru_cache)."""
    info = _device_infos.get(device)
    if info is None:
        if device.type != "cuda":
            info = (None, 1)
        else:
            import torch

            props = torch.cuda.get_device_properties(device)
            info = ((props.major, props.minor), props.multi_processor_count)
        _device_infos[device] = info
    return info


def get_dual_group_fwd_config(capability: tuple[int, int] | None, head_dim: int, *,
                              zigzag_buffer: bool = False,
                              element_size: int = 2) -> DualGroupFwdConfig:
    """Config for ``head_dim`` on a GPU of ``capability`` (None: the Triton interpreter);
    ``zigzag_buffer``: K/V read in place from the zigzag all-gather buffer. fp32 inputs
    (``element_size`` 4) take the small fallback tiles (``FP32_NOTE``)."""
    if capability is None or interpreter_active():
        return _INTERPRETER_CONFIG
    if element_size > 2:
        return _fallback_for(_FALLBACK, head_dim)
    table = _DUAL_GROUP_FWD_ZIGZAG_TABLE if zigzag_buffer else _DUAL_GROUP_FWD_TABLE
    config = _table_row(table, capability, head_dim)
    if config is not None:
        return config
    _warn_untuned(_warned, "dual-group", capability,
                  " (tune with `python -m kvonce bench zigzag --sweep`)", head_dim)
    return _fallback_for(_FALLBACK, head_dim)


def _fallback_for(fallbacks: dict, head_dim: int):
    """A fallback table's row for ``head_dim`` or its power-of-two padding (128's otherwise)."""
    head_dim = int(head_dim)
    padded = 1 << (head_dim - 1).bit_length()
    return fallbacks.get(head_dim, fallbacks[padded if padded in fallbacks else 128])


# ---------------------------------------------------------------------------------------------
# Paged decode (kernels/paged_decode.py)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PagedDecodeConfig:
    """Launch config of ``_paged_decode_kernel``.

    block_n: keys per K/V tile (any power of two; a tile may span several pages or part of one).
    min_keys_per_split: the auto split count keeps at least this many keys per split.
    programs_per_sm: the auto split count aims at this many programs per SM (single pass from
        there up).
    slow_programs_per_sm: a single pass with this many programs per SM measured slow: two
        splits there (``decode.choose_num_splits``).
    slow_band_splits: the split count in the slow band (at most one split per
        ``min_keys_per_split`` keys, at least 2).
    one_pass_programs_per_sm: inside the slow band, a half-open band (lo, hi) where a single
        pass measured faster after all (the quantized rows at three programs an SM: 5 to 6
        programs an SM fill a second wave; (0, 0): none).
    kv_cache_modifier: "" or ".cg" on K/V loads (each K/V element is read exactly once).
    kv_eviction: "" or "evict_first" on K/V loads (streamed once: no reuse to keep in L2).
    max_merged_splits: up to this split count the last split to finish merges in the decode
        launch (one launch); past it a combine kernel does. In CUDA-graph time the in-launch
        merge measured 1-4% slower at 2-8 splits and 10-40% slower from 16 up (its program walks
        the splits one by one; H100, docs/notes.md), but it saves a launch (~10 us of host
        time), so it is kept for the smallest counts.
    short_split_block_n: when nonzero, the key tile of split launches whose splits are shorter
        than ``SHORT_SPLIT_KEYS`` keys.
    splits_round_up: the auto split count rounds ``programs_per_sm * num_sms / programs`` up
        (at least that many programs) instead of down (at most that many).
    mha_num_stages: when nonzero, the stage count where each KV head serves one q head (MHA).
    resident_programs_per_sm: when nonzero, the programs of this config's one pass an SM holds
        at once (registers, shared memory): a batch whose one pass leaves its last wave of
        these ragged is cut (``paged.splits.triton_batch_cut``). 0: no cut.
    max_registers: when nonzero, the registers per thread ptxas may use (Triton's ``maxnreg``).
        The int4 kernel at (128, 4, 2) takes 255, two programs an SM; capped at 168 it fits
        three and spills 20-32 B (compiled for sm_90a on the CPU, scripts/decode_kernel_stats.py).
        The int4 rows set it (measured on the H100).
    swap_ab: the dots with the keys on the MMA's M side (Sᵀ = K·qᵀ, Oᵀ += Vᵀ·Pᵀ): sm_90a then
        compiles m64n16 wgmma where the packed rows (M = 16) get mma.sync; fp8 K x fp8 q would
        need no K conversion there. Plain, fp8 and int8 caches (int4's nibble-plane loop ignores
        it).
        Interpreter-tested only; no row sets it: not measured on a GPU. Compiled for sm_90a
        (scripts/decode_kernel_stats.py --swap-ab): fp8/int8 at (64, 4, 2) and (128, 8, 2) take
        166-179 registers and no spill; at (128, 4, 2) the register-held A tiles spill 124-208 B.
    f16_math: bf16 queries against an fp8, int8 or int4 cache run both dots in fp16 (each q
        row scaled by a power of two into fp16's range, ``paged_decode._f16_rows``: no precision
        lost), so the tiles take fp16's packed converters (fp8's one cvt, int8's prmt + sub,
        int4's lop3 + sub) instead of bf16's bit moves. int8 only with ``v_pairs`` (whose loop
        keeps each tile's probabilities times V scales under 1, so bf16-range V scales neither
        overflow fp16 nor fall among its subnormals); int4 in its nibble-plane loop (compiled
        for sm_90a: 731 instructions a tile a warp against 984 with bf16 dots; not measured on
        a GPU). Other formats and query dtypes ignore it.
    int64_kv_offsets: address K/V (and a quantized cache's scales) in int64 even where every
        offset fits int32 (by default int32 there: 626 IMADs a kernel instead of 1047 for fp8,
        compiled for sm_90a). The plain d128 row runs int32 (compiled for sm_90a, bf16 q, GQA
        32/8: the loop takes 399 instead of 622 instructions a tile a warp at (128, 4, 2), 344
        instead of 417 at (64, 4, 2); measured on the H200, 2026-11-29, graphs: GQA 12/2 -4 to
        -5%, 32/8 -0.1 to -2.9%, MHA 12/12 outside the one-pass band -0.5 to -1.6%) except
        MHA's one pass with carried page ids (``paged.decode._launch_shape_config``: +4 to
        +12% there). The other plain rows (d32-96, d256, the fallback) set it: tuned with
        int64, not measured in int32. The interpreter row leaves it off.
    outlier_max_registers: when nonzero, ``max_registers`` for the launches with dense-and-sparse
        keys (``kvonce.KeyOutliers``: one more dot a tile). Their fp8 / int8 kernels take
        195-200 registers, two programs an SM where the split counts aim at three; at 168 fp8
        spills nothing and int8 16-28 B (compiled for sm_90a, scripts/decode_kernel_stats.py
        --outliers 8).
    v_pairs: an fp8 or int8 cache's V tile is read as 16-bit channel pairs and dotted as its
        even and odd channels (``kernels/paged_decode_pairs.py``), where the MMA operand load
        transposes it instead of gathering bytes. fp16 compute only (fp16 q, or bf16 q with
        ``f16_math``). On in the fp8 and int8 rows (measured). int4 ignores it: at head dim 128
        with fp16 or bf16 q it always runs the nibble-plane loop, which reads V as 16-bit units
        (``paged_decode_int4._attend_paged_int4``).
    prefetch_pages: the next key tile's block-table entries are loaded an iteration ahead and
        carried in registers, so that no K/V address waits on a load issued just before it:
        int4's nibble-plane loop, the fp8/int8 channel-pair loop and the plain-cache loop;
        the others (byte-gathered quantized tiles, int4's per-element tile, swap_ab) ignore it.
        With two stages Triton's pipeliner issues a tile's copies in the iteration before and, left to
        itself, loads their page ids there too, a few dozen instructions before the addresses.
        At 3 stages the carry is what gives K/V a second shared-memory slot: without it the
        pipeliner spends the third stage on copying the page ids and K/V keep one slot (TTGIR,
        docs/notes.md). Launches with dense-and-sparse keys never prefetch (int4+8 measured
        5-35% slower).
    merge_splits_at_once: 1, 2 or 4 splits' partials loaded before any is folded when the
        last split merges in the launch (``max_merged_splits``; ``paged_combine
        ._combine_splits``, same order and bytes). One at a time each split costs an L2 round
        trip (int4's 49 splits at GQA 1 x 131072: ~20 us of tail, estimated from the SASS).
        Measured there (int4, 64 splits merged in the launch, H100, graphs): 4 at once 99.6 us
        against 106.6 one at a time and 94.2 with the combine kernel (MHA 143.0 / 148.0 /
        140.8). The Hopper d128 plain row takes 2 (its launches merge 2-4 splits).
    wide_merge_at_once: ``(GROUP, n)`` pairs: ``merge_splits_at_once`` for the auto split
        count's ``wide_block_n`` launches that merge in the launch, at GROUP q heads a KV head
        (one 16-row M-block) and run more than two programs an SM. ptxas's register count
        there moves with GROUP (the ``rows // GROUP`` index math) and with how many partials
        load at once; a count above 168 fits two programs an SM where the wide-tile rule counts
        three (``tests/test_decode_pipelining.py`` pins every group 1-8).
    head_pairs: int4's nibble-plane loop (head dim 128, fp16 / bf16 q, an even KV head count,
        no dense-and-sparse keys) serves two adjacent KV heads a program, so that on token-major
        pages each key's bytes of the pair (2 x 64, one 128-byte line) come in one request: one
        KV head's 64-byte row is half a line, and token-major int4 made 2.6x the L2 requests of
        head-major pages for the same DRAM bytes (ncu, H100, 2026-11-27). Each row's q sits in
        its head's half of a 128-byte operand (zeros in the other), so one scores dot covers the
        pair; the V planes come out 64 wide and each row keeps its head's half
        (``paged_decode_int4._attend_paged_int4``). The split count and M-blocks count the pairs.
        Set in the int4 row for token-major pages (``"int4/token-major"``, measured below).
    one_wave: ``(block_n, num_stages)`` for launches of at most one program an SM that fill
        the SMs (``paged.splits.one_wave_splits``: q_len 1 with one 16-row M-block, splits of
        512-2048 keys merged in the launch): such a launch takes the split count that fills
        one wave and this deeper ring with carried page ids (``prefetch_pages``, which gives K
        and V their second shared-memory slot at 3 stages). One program an SM then keeps two
        128-key K/V tiles in flight where the row's split launches kept one at two or three
        programs an SM and paid the merge's L2 round trips. Empty: never.
    one_pass_prefetch: where the auto split count takes a single pass in the one-pass band
        (``one_pass_programs_per_sm``), the launch also carries its page ids
        (``prefetch_pages``). The plain loop then holds 144 registers, three programs an SM, so
        the band's 5 to 6 programs an SM run as two full waves instead of one and a ragged one
        at five an SM.
    wide_block_n: when nonzero, the key tile of launches whose waves at that tile's
        occupancy fill (``paged.decode.WIDE_TILE_PROGRAMS_PER_SM``, ``WIDE_TILE_WAVE_FILL``)
        and whose splits hold at least ``FALLBACK_MIN_KEYS`` keys: a longer tile puts more
        bytes in flight per program and spends fewer instructions a key, but fits fewer
        programs an SM, so it loses where the shorter tile's launch fits one wave and its own
        runs a ragged second.
    gluon: launches that ``kernels.gluon_decode.paged_fits`` (an fp8 e4m3 or int8 cache, fp16 or
        bf16 q, head dim 128, token-major contiguous pages of a multiple of 16 keys, GQA group x
        q_len <= 16, no dense-and-sparse keys, sm_90) with at least ``GLUON_MIN_KEYS`` keys a
        sequence take the warp-specialized Gluon decode (a TMA loader warp, two CTAs an SM) and its
        own split count (``paged.splits.gluon_num_splits``); the row's other fields then apply to
        the launches it does not fit. Set in the fp8 and int8 rows: 1.07-1.12x and 1.08-1.21x the
        Triton kernel at the ``bench quant`` shapes (H200, 2026-11-29, graphs).
    """
    block_n: int
    num_warps: int
    num_stages: int
    min_keys_per_split: int = 512
    programs_per_sm: float = 3.0
    slow_programs_per_sm: tuple[float, float] = (5.0, 6.5)
    slow_band_splits: int = 2
    one_pass_programs_per_sm: tuple[float, float] = (0.0, 0.0)
    kv_cache_modifier: str = ""
    kv_eviction: str = ""
    max_merged_splits: int = 4
    short_split_block_n: int = 0
    splits_round_up: bool = False
    mha_num_stages: int = 0
    max_registers: int = 0
    swap_ab: bool = False
    f16_math: bool = False
    int64_kv_offsets: bool = False
    v_pairs: bool = False
    outlier_max_registers: int = 0
    prefetch_pages: bool = False
    merge_splits_at_once: int = 1
    head_pairs: bool = False
    one_pass_prefetch: bool = False
    wide_block_n: int = 0
    gluon: bool = False
    resident_programs_per_sm: int = 0
    wide_merge_at_once: tuple[tuple[int, int], ...] = ()
    one_wave: tuple[int, ...] = ()


# (capability major, minor) -> head dim -> config. The Hopper d=128 row comes from
# `python -m kvonce bench decode --sweep` on the lent H100, 2026-11-22 (docs/notes.md): 64-key
# tiles, 4 warps, 2 stages led or tied in CUDA-graph time at every swept shape of MHA 12/12 and
# GQA 32/8 (2.7-2.9 TB/s); 3-4 stages lost 5-20%, 8 warps 10-20%. d=32/64/96 reuse it and d=256
# halves the tile to keep the K/V stages' shared memory: NOT swept (no sweep was run there).
# d128 in the slow band (5 to 6.5 programs an SM), forced split counts 1 / 2 / 3 / 4, graphs,
# us, fp16 q, H100, 2026-11-27, sixth session: 12/12 56 x 2048 280.9 / 261.1 / 254.7 / 255.2,
# 64 x 2048 313.2 / 291.6 / 288.8 / 286.2, 70 x 2048 321.1 / 313.1 / 312.2 / 314.8, 64 x 8192
# 1187.0 / 1108.6 / 1086.4 / 1073.5; 32/8 88 x 2048 295.3 / 278.4 / 273.0 / 272.1, 96 x 4096
# 607.5 / 567.6 / 560.0 / 555.5, 104 x 8192 1222.2 / 1180.3 / 1164.6 / 1171.1; 12/2 416 x 2048
# 327.7 / 315.3 / 317.5 / 321.1: three splits there.
# 2026-11-27, twelfth session (scripts/config_ab.py, H100, graphs, us, fp16 q; bf16 within 1%):
# one pass with the page ids carried (`one_pass_prefetch`: 144 registers, three programs an SM,
# so 5 to 6 programs an SM run as two full waves) against the slow band's three splits: 12/12
# 56 x 2048 239.5 / 242.1, 64 x 2048 268.5 / 276.2, 64 x 8192 1057.9 / 1076.1, 64 x 1024 138.2 /
# 145.3 (two splits there); 32/8 88 x 2048 249.0 / 261.7, 96 x 4096 531.4 / 548.6. It lost at 6.4
# programs an SM (12/12 70 x 2048 329.6 against 299.6: a third wave) and at 4.4 (48 x 2048 218.2
# against 207.1 in one pass at five an SM; 32/8 64 x 1024 at 3.9: 106.6 against 94.1): the
# one-pass band is 5 to 6. 128-key tiles where their waves fill (`wide_block_n`; H200,
# 2026-11-29, fifteenth session): paged.decode.WIDE_TILE_PROGRAMS_PER_SM.
_PAGED_DECODE_TABLE: dict[tuple[int, int], dict[int, PagedDecodeConfig]] = {
    (9, 0): {
        32: PagedDecodeConfig(64, 4, 2, int64_kv_offsets=True),
        64: PagedDecodeConfig(64, 4, 2, int64_kv_offsets=True),
        96: PagedDecodeConfig(64, 4, 2, int64_kv_offsets=True),
        # resident_programs_per_sm 4: GQA 32/8 x 8192 keys, one pass (H200, graphs, fp16,
        # 2026-11-30): batch 66 (528 programs) 490.8 us, 68 526.6 (+7% for +3% work)
        # merge_splits_at_once 2: the last split's two partials loaded before either is folded
        # (H200, graphs, 2026-11-30; outputs bitwise equal): GQA 32/8 16 x 4096 (3 splits)
        # 75.5 -> 68.5 us, 12/2 64 x 1024 (2) 23.1 -> 22.7, 32 x 2048 (4) 23.6 -> 23.1, MHA
        # 8 x 8192 (4) 98.3 -> 97.9; bf16 alike. 4 at once: 76.1, 22.9, 22.9, 97.6. Mostly a
        # register count: the 128-key tile's merging kernel held 176 one at a time (2
        # programs an SM), 168 two at a time (3; tests/test_decode_pipelining.py pins it).
        # wide_merge_at_once 4 at GROUP 3 and 6 (2 there: 168 registers with 8 B of spill,
        # 180; 4: 144, 147): GQA 12/2 48 x 4096 / 64 x 4096 / 96 x 2048 / 40 x 8192 60.5 /
        # 77.4 / 60.7 / 106.2 -> 54.3 / 69.7 / 54.1 / 85.5 us, 24/8 16 x 4096 68.9 -> 68.4
        # (H200, graphs, fp16, 2026-11-30; bf16 alike at 12/2; outputs bitwise equal)
        # one_wave (128-key tiles, 3 stages, carried page ids, one program an SM), H200,
        # graphs, us, scripts/config_ab.py, fp16, 2026-12-01, forty-fifth session; the rule's
        # launch then against it at the same count: GQA 12/2 64 x 1024 (1 split against 2)
        # 20.5 / 22.7, 64 x 512 9.3 / 11.2, 64 x 2048 (1 against 3) 35.8 / 38.4, 32 x 1024 at
        # 2 splits 10.6 / 13.0; 32/8 16 x 1024 21.1 / 22.5, 16 x 2048 35.9 / 38.2; MHA 11 x 1024
        # 21.8 / 22.3, 11 x 2048 37.2 / 38.2. Past one program an SM it lost (it fits one an SM):
        # 12/2 80 x 1024 32.2 against 27.3, 128 x 512 23.4 / 20.6, 32/8 24 x 1024 33.6 / 30.1.
        128: PagedDecodeConfig(64, 4, 2, slow_band_splits=3,
                               one_pass_programs_per_sm=(5.0, 6.0), one_pass_prefetch=True,
                               wide_block_n=128, resident_programs_per_sm=4,
                               merge_splits_at_once=2, wide_merge_at_once=((3, 4), (6, 4)),
                               one_wave=(128, 3)),
        256: PagedDecodeConfig(32, 4, 2, int64_kv_offsets=True),
    },
}
# Interpreter: small tiles so that lengths of a few pages still cross tile and page borders.
_PAGED_DECODE_INTERPRETER = PagedDecodeConfig(16, 4, 1, min_keys_per_split=16,
                                             programs_per_sm=1.0)
_PAGED_DECODE_FALLBACK = PagedDecodeConfig(32, 4, 2, int64_kv_offsets=True)
_paged_warned: set = set()


# Quantized caches, (capability, kv_format) -> head dim -> config. From
# scripts/quant_decode_sweep.py on the lent H100 (docs/notes.md), GQA 32/8 d128 at (16, 4096),
# (64, 8192), (1, 131072). 2026-11-23: int8 led with 128-key tiles, 4 warps, 2 stages at all three
# (64 x 8192: 465 us vs 806 with 64-key tiles). 2026-11-25, after the kernels began converting
# in the MMA operand layout: fp8 and int8 best at (128, 4, 2) at all three (3 stages 1-2% slower
# for fp8, 5-40% for int8); int4's split dots best at (128, 4, 2) at 16 x 4096 (81 vs 95 us for
# 64-key tiles) and within 5% of the best (128, 4, 4) at 64 x 8192 (614 vs 585 us; its old
# 64-key row took 982). Yet at 1 x 131072 (49 splits) 64-key tiles won: 166 vs 208 us
# (16 x 4096 runs 3 splits, merged in the launch). A rule from those points
# only, not understood. 2026-11-26, the split knobs and stages at GQA 32/8 and MHA 12/12 x
# (16 x 4096, 64 x 8192, 1 x 131072), graphs (scripts/quant_decode_sweep.py --heads, docs/notes.md):
# - fp8: 2 programs per SM, rounded up, splits of at least 2048 keys: 1 x 131072 GQA 123 us
#   (33 splits) against 146 (49); MHA 16 x 4096 needs the rounding up (2 splits, 92 us; rounding
#   down gives 1 split, 109) and GQA 16 x 4096 the 2048 keys (`bench quant`: 2 splits 60 us,
#   3 splits 74).
# - int8: splits of at least 2048 keys: GQA 16 x 4096 74 us (2 splits) against 90 (3); the long
#   rows keep 3 programs per SM (1 x 131072 GQA 125 us at 49 splits, 131 at 33).
# - int4: every split merged in the launch (1 x 131072 GQA 150 us against 167 through the combine
#   kernel with 64-key tiles); MHA at 3 stages: 108 / 710 / 203 us against 164 / 900 / 317 at 2,
#   while GQA keeps 2 (3 stages: 94 against 80 us at 16 x 4096, 168 against 150 at 1 x 131072);
#   two splits from 3.5 programs per SM: GQA 64 x 8192 531 us against 602 in one pass (the
#   kernel holds 255 registers, two programs an SM: more, shorter programs balance the tail).
# - int4 under bf16 queries (the "bf16" rows): 64-key tiles, 2 stages, where the splits are short
#   (< SHORT_SPLIT_KEYS): 102 / 188 / 131 / 244 us against 119 / 228 / 170 / 326 with the fp16
#   row at 16 x 4096 and 1 x 131072 GQA / MHA (its nibble converter costs ~700 more instructions
#   a tile and spills 4 B at 128 keys); 128-key tiles at 64 x 8192 (GQA, 2 splits of 4096 keys:
#   616 us against 693 with 64). A rule fitted to those six rows. Replaced 2026-11-26 (later
#   session; the sweep at 64 x 8192 and 1 x 131072, GQA 32/8 and MHA 12/12, bf16 graphs): 128-key
#   tiles everywhere, 3 stages, the register cap at 168 (three programs an SM, 20-32 B of spill):
#   618 / 152 / 747 / 203 us against 616 / 190 / 944 / 247 for the 64-key rule. Under fp16
#   queries the same cap measured 537 -> 616 at GQA 64 x 8192 and within 3% elsewhere: not taken.
# - int32 offsets for quantized caches (2026-11-26, fourth session, graphs, fp16 q, int32 against
#   int64 in one run; 64 x 8192 and 1 x 131072, GQA / MHA): int4 521 / 148 / 704 / 200 us against
#   540 / 152 / 718 / 206, int8 443 / 124 / 674 / 172 against 450 / 125 / 669 / 174; fp8 415 / 124 /
#   622 / 170 against 421 / 123 / 591 / 171: MHA 64 x 8192 5% slower (not understood), so the fp8
#   row keeps int64.
# - fp8 V as channel pairs (`v_pairs`, same session, graphs, us, fp16 / bf16 q, default row
#   against pairs; GQA 64 x 8192, GQA 1 x 131072, MHA 64 x 8192, MHA 1 x 131072): 421 / 123 / 591 /
#   173 against 444 / 118 / 571 / 168 (fp16), 422 / 124 / 589 / 174 against 433 / 118 / 571 / 164
#   (bf16). The pairs kernel holds 168 registers (177 before): three programs an SM, and GQA
#   64 x 8192's 512 programs (3.9 an SM) ran 1.3 waves in one pass; two splits there (the slow
#   band from 3.5 programs an SM, as int4's) gave 400 us (fp16 and bf16). Two splits everywhere
#   (programs_per_sm 4) cost the 1 x 131072 rows 10-15%.
# - 2026-11-27 (graphs, us; GQA 32/8 then MHA 12/12 at 16 x 4096, 64 x 8192, 1 x 131072):
#   int8 V as channel pairs, fp16 q: 70.6 / 461 / 121 / 92 / 592 / 169 against 74 / 448 / 124 /
#   122 / 674 / 171 byte-gathered; GQA 64 x 8192's 512 programs then run best as two splits
#   from 3.5 programs an SM (417 us). bf16 q x int8 through fp16 dots (`f16_math`, pairs): 71 /
#   418 / 122 / 92 / 593 / 169 against 76 / 477 / 125 / 124 / 689 / 174 with bf16 dots. fp8
#   with int32 offsets (the pairs kernel): 68.1 / 398 / 119 / 89 / 567 / 164 against 68.9 / 400 /
#   119 / 90 / 571 / 168 with int64 (the 5% loss above is gone). fp8's pairs kernel holds 168
#   registers, three programs an SM, so it takes int8's 3 programs per SM (rounded down):
#   1 x 131072 GQA 116.4 us (49 splits) against 118.4 (33), MHA 161.9 against 163.2.
# Other head dims use the fp16 row.
# int4 at 168 registers (3 programs an SM; uncapped the kernel takes 255), 2026-11-27, graphs,
# H100, fp16 q: with dense-and-sparse keys (quant_decode_sweep.py --formats int4 --outliers 8)
# GQA 64 x 8192 557 us against 622 uncapped, 1 x 131072 156 vs 232; MHA 743 vs 905, 207 vs 313.
# Then, with the group scales as 32-bit pairs (scripts/int4_scale_pairs_ab.py, since removed),
# the plain cache too: 403 / 122 / 579 / 163 us against 469 / 180 / 758 / 262 uncapped (speed
# over the fp16 cache 1.80 / 1.61 / 1.92 / 1.75; before the pairs, 168 had lost at GQA 64 x 8192).
# V as 16-bit units with its group scales on V (`v_pairs`, fp16 q; kernels/paged_decode_int4.py
# `_attend_paged_int4_vpairs`), same call, graphs, us, GQA 64 x 8192 / 1 x 131072, MHA 64 x 8192 /
# 1 x 131072: 362.7 / 109.8 / 492.0 / 144.3 against 405.9 / 122.8 / 582.5 / 163.5 (H100,
# 2026-11-27; fp16 cache 725 / 197 / 1113 / 285). bf16 q, the same rows, later call: 366.4 /
# 115.7 / 550.5 / 161.4 against 446.6 / 135.3 / 664.0 / 186.1 byte-gathered (3 stages; 2 stages
# with units 365.6 / 117.0 / 549.1 / 161.1; fp16 cache 726 / 198 / 1110 / 285).
# Page ids an iteration ahead (`prefetch_pages`) at 3 stages, 2026-11-27, fifth session, H100,
# graphs, same rows: fp16 q 315.6 / 108.5 / 491.6 / 146.9 against 364.4 / 109.2 / 500.2 / 145.9
# at 3 stages without it (2 stages without: 362.4 / 109.2 / 500.9 / 144.5; 2 stages with it:
# 370.7 / 112.5 / 490.7 / 147.1); bf16 q 341.4 / 113.4 / 517.4 / 155.2 against 364.8 / 114.5 /
# 553.5 / 159.3. With 8 outlier channels (fp16 q) the prefetch lost (383.4 / 153.9 / 579.3 /
# 209.0 against 404.6 / 117.9 / 549.5 / 158.5), 3 stages alone won (390.4 / 115.5 / 549.6 /
# 158.8 against 401.6 / 118.1 / 547.1 / 158.4): those launches take 3 stages, no prefetch.
# The combine kernel past 4 splits (the default `max_merged_splits`; 64 was chosen on
# 2026-11-26 when the kernel ran 150-167 us at 1 x 131072), 2026-11-27, sixth session, H100,
# graphs, us, 64 against 4, GQA 32/8 then MHA 12/12 at 1 x 32768 / 1 x 65536 / 1 x 131072:
# fp16 q 54.2 / 73.0 / 108.8 against 40.6 / 59.7 / 95.4, 58.9 / 87.7 / 147.0 against 52.0 /
# 81.3 / 140.2; bf16 q 55.8 / 75.6 / 114.3 against 42.7 / 63.2 / 103.2, 60.5 / 90.9 / 155.6
# against 54.7 / 86.8 / 152.9; 8 outlier channels 56.1 / - / 114.9 against 41.9 / - / 102.6.
# 16 x 4096, 8 x 8192, 4 x 16384 (at most 4 splits) within 2%. Loading 4 splits before
# folding them in the launch (`merge_splits_at_once` 4) gave 99.6 / 143.0 at 1 x 131072.
# The quantized rows' one-pass band (one pass, not two splits, from 5 to 6 programs an SM, inside
# the slow band from 3.5 to 6.5): forced split counts, same session, graphs, us, MHA 12/12 x 4096
# keys, 1 / 2 splits: at 5.1 programs an SM (batch 56) fp8 260.5 / 273.7, int8 276.4 / 290.7, int4
# 241.7 / 242.6; at 5.8 (batch 64) fp8 289.9 / 297.4, int8 302.6 / 310.1, int4 247.6 / 265.2 (and at
# 64 x 8192: fp8 563.1 / 568.5, int8 584.7 / 591.3, int4 468.3 / 484.6); at 6.4 (batch 70) one pass
# lost (fp8 354.7 / 338.5), and at 3.6-4.4 two splits won (fp8 202.9 / 220.0 at 3.6).
# int4 with one (scale, offset) per key (2026-11-27, eighth session; the format since then): this
# row as it was, same machine and call, main against the branch, graphs, fp16 q, us, GQA 16 x 4096 /
# 64 x 8192 / 1 x 131072 then MHA the same: H100 57.6 / 314.9 / 94.6, 77.4 / 465.7 / 140.2
# against 56.0 / 316.8 / 93.1, 73.6 / 446.8 / 134.0; H200 51.6 / 308.4 / 89.2, 73.2 / 456.0 /
# 131.3 against 46.2 / 260.3 / 76.1, 61.9 / 349.8 / 111.1 (bf16 q on the H200: 55.7 / 335.0 /
# 97.6, 77.5 / 502.0 / 144.8 against 46.3 / 258.7 / 76.0, 62.3 / 354.5 / 110.9). The loop (sm_90a,
# (128, 4, 3)) is 731 instructions a tile a warp against 889 and 44 KB of shared memory against
# 74, but on the H100 it then waits on DRAM (ncu, GQA 64 x 8192: long scoreboard 1.70 cycles an
# issued instruction against 0.45, 0.41 issued a cycle a scheduler, DRAM 61%). Four programs an
# SM at 128 registers and 2 stages (spilling 76-112 B): GQA 64 x 8192 275.4 us (H100) / 240.9
# (H200), 1 x 131072 90.6 / 76.6, but MHA 64 x 8192 467.9 / 422.2 (its split count follows
# programs_per_sm): not this row yet. bf16 q through fp16 rows (`f16_math`, now int4's too).
_QUANT_SPLITS = dict(slow_programs_per_sm=(3.5, 6.5), one_pass_programs_per_sm=(5.0, 6.0))
# The plan's default turns `gluon` on (the Gluon decode's swapped operands, kernels/
# gluon_decode.py) where the launch has 0.7 of a wave of two CTAs an SM or more
# (paged/decode.py _default_config, paged/splits.py gluon_int4_pays): 1-10% faster there (H200,
# 2026-11-29, nineteenth session), slower below; a caller's row keeps the Triton kernel.
_INT4 = PagedDecodeConfig(128, 4, 3, **_QUANT_SPLITS,
                          max_registers=168,
                          outlier_max_registers=168, prefetch_pages=True, f16_math=True)
# int4 head pairs (`head_pairs`) on token-major pages, 2026-11-27, ninth and tenth sessions, H100,
# graphs, us, the row above against pairs at 232 registers and 2 programs an SM (the pair loop
# holds 232 registers with 20 B of spill; at 168 it spills 716 B), GQA 32/8 then MHA 12/12 at
# 16 x 4096 / 64 x 8192 / 1 x 131072 (scripts/gpu_issue26.sh STEPS=headpair): fp16 q -7 / -24 /
# -11%, +1 / +3 / -16% (64 x 8192 GQA 241.2 us); bf16 q 55.7 / 315.8 / 93.2, 74.5 / 460.8 /
# 134.8 against 50.7 / 230.8 / 80.9, 75.8 / 433.3 / 109.7. On head-major pages (each KV head's
# rows already whole lines) the pairs lost at 5 of 6 rows (bf16: 46.8 / 249.0 / 73.6, 61.4 /
# 322.2 / 98.6 against 50.3 / 223.5 / 77.9, 68.5 / 404.1 / 103.6): that layout keeps the row.
# H200, same session, fp16 / bf16 q, one-head row against pairs (GQA 32/8 then MHA 12/12 at
# 16 x 4096 / 32 x 8192 / 64 x 8192 / 1 x 131072): fp16 45.6 / 127.3 / 259.6 / 76.5, 62.0 /
# 181.6 / 346.7 / 110.4 against 43.1 / 116.5 / 212.3 / 67.8, 67.2 / 230.4 / 430.3 / 97.6; bf16
# alike. MHA 64 x 8192's 384 pair programs ran 1.45 waves: two splits from 2.3 programs an SM
# (the slow band's start) took it to 321.8 us (bf16 335.7 against 353.8 one-head). MHA
# 16 x 4096 and 32 x 8192 (0.73 waves; two splits 68.7 and 213.8 us) keep the one-head row: the
# plan takes the pairs only where their launch fills its waves (paged/decode.py,
# PAIR_WAVE_FILL).
_INT4_PAIRS = dataclasses.replace(_INT4, head_pairs=True, max_registers=232, programs_per_sm=2.0,
                                  slow_programs_per_sm=(2.3, 6.5))
_PAGED_DECODE_QUANT_TABLE: dict[tuple[tuple[int, int], str], dict[int, PagedDecodeConfig]] = {
    ((9, 0), "int8"): {128: PagedDecodeConfig(128, 4, 2, min_keys_per_split=2048, v_pairs=True,
                                              f16_math=True, gluon=True,
                                              **_QUANT_SPLITS,
                                              outlier_max_registers=168)},
    ((9, 0), "fp8_e4m3"): {128: PagedDecodeConfig(128, 4, 2, min_keys_per_split=2048,
                                                  f16_math=True, v_pairs=True, gluon=True,
                                                  **_QUANT_SPLITS,
                                                  outlier_max_registers=168)},
    ((9, 0), "int4"): {128: _INT4},
    # bf16 q: the same row (V units: P·V in fp16, the scores dot in bf16).
    ((9, 0), "int4/bf16"): {128: _INT4},
    # Token-major pages (a key's KV heads adjacent, 64 bytes each): two KV heads a program.
    ((9, 0), "int4/token-major"): {128: _INT4_PAIRS},
}
SHORT_SPLIT_KEYS = 4096


def get_paged_decode_config(capability: tuple[int, int] | None, head_dim: int,
                            kv_format: str | None = None,
                            element_size: int = 2, bf16: bool = False,
                            token_major: bool = False) -> PagedDecodeConfig:
    """Config for ``head_dim`` (and a quantized cache's ``kv_format``) on a GPU of
    ``capability`` (None: the Triton interpreter); fp32 queries (``element_size`` 4) take the
    fallback (``FP32_NOTE``). A quantized cache takes, where the table has one, its format's
    ``"<format>/token-major"`` row for ``token_major`` pages (a key's KV heads adjacent in
    memory; int4: head pairs, which the caller uses only where they can run, see
    ``PagedDecodePlan``), else its ``"<format>/bf16"`` row for ``bf16`` queries (their tile
    converters differ from fp16's), else its format's row."""
    if capability is None or interpreter_active():
        return _PAGED_DECODE_INTERPRETER
    if element_size > 2:
        return _PAGED_DECODE_FALLBACK
    if kv_format is not None:
        keys = ([f"{kv_format}/token-major"] if token_major else []) + (
            [f"{kv_format}/bf16"] if bf16 else []) + [kv_format]
        for key in keys:
            row = _PAGED_DECODE_QUANT_TABLE.get((tuple(capability), key), {})
            if head_dim in row:
                return row[head_dim]
    config = _table_row(_PAGED_DECODE_TABLE, capability, head_dim)
    if config is not None:
        return config
    _warn_untuned(_paged_warned, "paged-decode", capability,
                  " (tune with `python -m kvonce bench decode --sweep`)", head_dim)
    return _PAGED_DECODE_FALLBACK


# ---------------------------------------------------------------------------------------------
# Shared-prefix decode, chunk-first phase (kernels/prefix_decode.py)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PrefixDecodeConfig:
    """Launch config of ``_prefix_chunk_kernel`` (one program per tree node x KV head x M-block of
    the node's packed rows x key chunk).

    block_m: the most packed rows per program (the launch takes the next power of two of the
        largest node's rows, at least 16, at most this). block_n: keys per K/V tile.
    num_warps: with ``block_m`` rows; smaller row blocks run 4 warps.
    programs_per_sm: the shared runs are cut into key chunks until the node programs reach about
        this many per SM (a single 32k-token run is otherwise one program per KV head and
        M-block); no chunk shorter than ``min_keys_per_split`` keys, at most
        ``max_splits_per_node`` chunks per node (each chunk adds a float32 partial per row).
    int64_kv_offsets: address K/V in int64 even where every offset fits int32 (int32 there
        otherwise). The GPU rows set it: tuned with int64; int32 is not yet measured here
        (the plain decode's d128 row gained 0-5% from it on the H200, 2026-11-29). The cascade's
        suffix decode follows its own decode config's flag.
    """
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: float = 2.0
    min_keys_per_split: int = 512
    max_splits_per_node: int = 32
    kv_cache_modifier: str = ""
    kv_eviction: str = ""
    int64_kv_offsets: bool = False


# Hopper d=128 from `python -m kvonce bench prefix --sweep` on the lent H100, 2026-11-23
# (docs/notes.md): 128 rows x 128-key tiles, 8 warps, 3 stages was the fastest or within 2% of it
# at the four large rows (GQA 32/8 (64, 32768, 256): 168 us vs 231 with 64-key tiles, 308 with
# 32; 64-row blocks 280-322). d=32/64/96 reuse it and d=256 halves the tiles for shared memory:
# NOT swept.
_PREFIX_DECODE_TABLE: dict[tuple[int, int], dict[int, PrefixDecodeConfig]] = {
    (9, 0): {hd: PrefixDecodeConfig(128, 128, 8, 3, int64_kv_offsets=True)
             for hd in (32, 64, 96, 128)}
    | {256: PrefixDecodeConfig(64, 32, 4, 2, int64_kv_offsets=True)},
}
# Interpreter: 32-row blocks and 16-key tiles, so that tiny trees still take several M-blocks and
# cross tile and page borders.
_PREFIX_DECODE_INTERPRETER = PrefixDecodeConfig(32, 16, 4, 1, programs_per_sm=1.0,
                                                min_keys_per_split=16, max_splits_per_node=8)
_PREFIX_DECODE_FALLBACK = PrefixDecodeConfig(64, 32, 4, 2, int64_kv_offsets=True)
_prefix_warned: set = set()


def get_prefix_decode_config(capability: tuple[int, int] | None, head_dim: int,
                             element_size: int = 2) -> PrefixDecodeConfig:
    """Config for ``head_dim`` on a GPU of ``capability`` (None: the Triton interpreter); fp32
    queries (``element_size`` 4) take the fallback (``FP32_NOTE``)."""
    if capability is None or interpreter_active():
        return _PREFIX_DECODE_INTERPRETER
    if element_size > 2:
        return _PREFIX_DECODE_FALLBACK
    config = _table_row(_PREFIX_DECODE_TABLE, capability, head_dim)
    if config is not None:
        return config
    _warn_untuned(_prefix_warned, "shared-prefix decode", capability,
                  " (tune with `python -m kvonce bench prefix`)", head_dim)
    return _PREFIX_DECODE_FALLBACK


# ---------------------------------------------------------------------------------------------
# Dual-group backward (kernels/dual_group_bwd.py)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DualGroupBwdConfig:
    """Launch configs of the backward's two kernels.

    dq_*: ``_dual_group_bwd_dq_kernel`` (query rows per group per program x keys per tile; the
    program holds both groups' q, dO and dQ). dkdv_*: ``_dual_group_bwd_dkdv_kernel`` (query rows
    per step x keys per program; the program holds K, V, dK, dV of its key block).
    atomic_dq: dQ from fp32 atomics in the dK/dV kernel (5 matmuls per tile pair instead of 7;
    the dQ kernel then only computes delta) instead of from the dQ kernel.
    dq_one_group: the dQ kernel's programs hold one group's M-block (one dQ accumulator; twice the
    programs, shared K/V tiles read once per group), as the forward's ``one_group``.
    gluon: the warp-specialized Hopper kernel (``kernels/gluon_bwd.py``: one CTA per 128 keys, K/V
        in shared memory, dQ reduce-added by TMA) where it covers the call (sm90, fp16/bf16, head
        dim 64/128, contiguous K/V; ``gluon_bwd.unsupported_reason``); the two kernels above
        elsewhere. Its dQ sum order varies run to run (not bitwise reproducible).
    """
    dq_block_m: int
    dq_block_n: int
    dq_num_warps: int
    dq_num_stages: int
    dkdv_block_m: int
    dkdv_block_n: int
    dkdv_num_warps: int
    dkdv_num_stages: int
    int64_kv_offsets: bool = False
    atomic_dq: bool = False
    dq_one_group: bool = False
    gluon: bool = False


# H100, triton 3.6, bf16, Llama-3-8B zigzag shape (world 8, rank 3, 32/8 heads; sweeps
# 2026-11-23 with scripts/bwd_sweep.py, docs/notes.md): dQ 128 rows x 32 keys, 8 warps, 3 stages
# (11.4 ms); dK/dV 64 rows x 128 keys, 8 warps, ONE stage (18.3 ms; 2 stages 22.6, 3 stages
# slower still, 128 rows 3x slower: spills). Atomic dQ from the dK/dV kernel lost (35.4 vs
# 29.9 ms: the atomics cost more than the two matmuls they save). d=32..96 reuse the d=128 row
# (not timed); d=256 halves the tiles (correctness-tested, not timed).
# gluon=True (2026-11-25, bench zigzag --backward and scripts/gluon_bwd_sweep.py on the H100,
# docs/benchmarks.md): the Gluon kernel with TUNED_SCHEDULE measured 522-547 TFLOP/s at 1 x 8192
# and 467-489 on the mixed batch against 320-363 and 323-324 for the two Triton kernels in the
# same runs, errors equal; it covers d64/d128 (other head dims take the Triton kernels above).
_DUAL_GROUP_BWD_TABLE: dict[tuple[int, int], dict[int, DualGroupBwdConfig]] = {
    (9, 0): {hd: DualGroupBwdConfig(128, 32, 8, 3, 64, 128, 8, 1, gluon=True)
             for hd in (32, 64, 96, 128)}
    | {256: DualGroupBwdConfig(64, 32, 8, 2, 32, 64, 8, 1)},
}
_BWD_INTERPRETER_CONFIG = DualGroupBwdConfig(32, 32, 4, 1, 32, 32, 4, 1)
_BWD_FALLBACK = {hd: DualGroupBwdConfig(64, 32, 4, 2, 32, 64, 4, 2) for hd in (32, 64, 96, 128)}
_BWD_FALLBACK[256] = DualGroupBwdConfig(32, 32, 4, 1, 32, 32, 4, 1)
_bwd_warned: set = set()


def get_dual_group_bwd_config(capability: tuple[int, int] | None, head_dim: int,
                              element_size: int = 2) -> DualGroupBwdConfig:
    """Backward config for ``head_dim`` on a GPU of ``capability`` (None: the interpreter).
    fp32 inputs (``element_size`` 4, for tests) take small tiles: the fp16/bf16 rows' shared
    memory would double past the limit. ``KVONCE_GLUON_BWD`` in the environment overrides the
    table's ``gluon``: "1" on (where the Gluon kernel covers the call), "0" off (the two Triton
    kernels: bitwise reproducible dQ, or a comparison)."""
    config = _dual_group_bwd_row(capability, head_dim, element_size)
    force = os.environ.get("KVONCE_GLUON_BWD")
    if force in ("0", "1") and capability is not None:
        config = dataclasses.replace(config, gluon=force == "1")
    return config


def _dual_group_bwd_row(capability, head_dim: int, element_size: int) -> DualGroupBwdConfig:
    if capability is None or interpreter_active():
        return _BWD_INTERPRETER_CONFIG
    if element_size > 2:
        return _BWD_INTERPRETER_CONFIG
    config = _table_row(_DUAL_GROUP_BWD_TABLE, capability, head_dim)
    if config is not None:
        return config
    _warn_untuned(_bwd_warned, "dual-group backward", capability, "", head_dim)
    return _fallback_for(_BWD_FALLBACK, head_dim)


# ---------------------------------------------------------------------------------------------
# Varlen paged attention: prefill, chunked prefill and decode rows (kernels/paged_prefill.py)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PagedPrefillConfig:
    """Launch config of ``_paged_prefill_kernel``.

    block_m: packed rows (tokens x GQA group) per program; raised to one token's group when the
        group is larger. block_n: keys per K/V tile (any power of two; a tile may span pages).
    kv_cache_modifier / kv_eviction: as ``PagedDecodeConfig``'s (K/V tiles are re-read by every
        M tile of a sequence here, so the defaults keep them cacheable).
    last_tiles_first: programs take the tiles in reverse order (the last sequence's last tiles,
        which see the most keys under a causal mask, start first: a shorter tail).
    int64_kv_offsets: force int64 K/V element offsets (by default only when a cache's elements
        can pass 2^31).
    prefetch_pages: plain caches look the next key tile's pages up one iteration ahead.
    tma: unmasked tiles of a plain cache through TMA descriptors when pages hold whole key tiles
        (``page_size % block_n == 0``); other caches ignore it.
    pack_gqa: the rows of a tile are tokens x the GQA group (each K/V tile read once for all
        the group's heads); False: one q head per program, rows are tokens (BLOCK_M tokens a
        tile, as the contiguous forward's one-group tiles: a shorter causal band per token, each
        K/V tile read by GROUP programs, from L2). Measured 2026-11-26: no faster (366-465
        TFLOP/s against 388-513 packed).
    gluon: the warp-specialized Gluon kernel (kernels/gluon_prefill.py: a TMA loader warp
        bringing K/V page by page, two consumer warpgroups) where it applies
        (``gluon_prefill.unsupported_reason``: Hopper, plain fp16/bf16 caches, d 64/128,
        GQA groups up to 128), with ``gluon_block_n`` keys a tile and ``gluon_stages`` ring
        slots; the Triton kernel (with the fields above) elsewhere.
    gluon_persistent: the Gluon kernel as one CTA an SM walking the work items (its loader
        fills the next item's first slots, and its consumers look the next item's tile and Q
        up, while they finish one) instead of one CTA an item.
    """
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    kv_cache_modifier: str = ""
    kv_eviction: str = ""
    last_tiles_first: bool = False
    int64_kv_offsets: bool = False
    prefetch_pages: bool = False
    tma: bool = False
    pack_gqa: bool = True
    gluon: bool = False
    gluon_block_n: int = 128
    gluon_stages: int = 3
    gluon_persistent: bool = False


# Hopper (H100, triton 3.6, bf16, 32/8 heads, d128; scripts/prefill_sweep.py, 2026-11-24,
# docs/notes.md): 128 x 64 tiles, 3 stages, last tiles first, page ids looked up a tile ahead,
# int32 offsets, TMA for unmasked tiles where pages hold whole tiles (page >= 64): 357-363 TFLOP/s
# on 8 x 2048 prefill at page 16 and 402 at page 256, 445-451 / 499 on 64 x 512-token chunks over
# 8k; against 329/348 (page 16) for the first row (128 x 64, 2 stages, int64, no prefetch) and
# 392/519 (page 256) for 128 x 128 tiles with TMA, measured in the same runs. d=32..96 reuse the
# d=128 row (not timed); d=256 halves the tiles for shared memory (untimed).
# 2026-11-26: the Gluon kernel where it applies (128-key tiles, 3 stages; prefill 8 x 2048
# 449 / 463 TFLOP/s at pages 16 / 256 against 359 / 402 for the Triton row, chunked 578 / 580
# against 445 / 488, same run; scripts/prefill_sweep.py, docs/notes.md), this Triton row elsewhere.
# Later the same day, persistent (one CTA an SM, the next item's tile and Q looked up under the
# last P V): prefill 8 x 2048 455 / 500 eager, 424 / 455 graphs (pages 16 / 256) against 423-440
# / 436-452 and 409-414 / 424-443 one CTA an item in the same run; chunked and mixed 1-5% slower
# eager, -2..+2% in graphs (scripts/prefill_sweep.py --graph).
_PAGED_PREFILL_TABLE: dict[tuple[int, int], dict[int, PagedPrefillConfig]] = {
    (9, 0): {hd: PagedPrefillConfig(128, 64, 8, 3, last_tiles_first=True, prefetch_pages=True,
                                    tma=True, gluon=True, gluon_persistent=True)
             for hd in (32, 64, 96, 128)}
    | {256: PagedPrefillConfig(64, 32, 8, 2)},
}
# Interpreter: 32-row tiles and 16-key tiles, so that small cases still take several M tiles per
# sequence and cross tile and page borders.
_PAGED_PREFILL_INTERPRETER = PagedPrefillConfig(32, 16, 4, 1)
_PAGED_PREFILL_FALLBACK = PagedPrefillConfig(64, 32, 4, 2)
_prefill_warned: set = set()


def get_paged_prefill_config(capability: tuple[int, int] | None, head_dim: int,
                             kv_format: str | None = None,
                             element_size: int = 2) -> PagedPrefillConfig:
    """Config for ``head_dim`` (and a quantized cache's ``kv_format``: same rows for now) on a GPU
    of ``capability`` (None: the Triton interpreter); fp32 queries (``element_size`` 4) take the
    fallback (``FP32_NOTE``)."""
    if capability is None or interpreter_active():
        return _PAGED_PREFILL_INTERPRETER
    if element_size > 2:
        return _PAGED_PREFILL_FALLBACK
    config = _table_row(_PAGED_PREFILL_TABLE, capability, head_dim)
    if config is not None:
        return config
    _warn_untuned(_prefill_warned, "paged-prefill", capability, "", head_dim)
    return _PAGED_PREFILL_FALLBACK
