"""The split-K count of a paged decode: from shapes and the SM count only (used by the plain
decode, the Gluon fp8 decode and the shared-prefix cascade's suffix decode)."""
from __future__ import annotations

import math

from ..kernels.configs import PagedDecodeConfig

__all__ = ["choose_num_splits", "busy_splits", "gluon_num_splits", "gluon_int4_pays",
           "gluon_batch_cut", "triton_batch_cut", "GLUON_MIN_KEYS", "MAX_SPLITS",
           "FALLBACK_MIN_KEYS", "one_wave_splits", "is_one_wave"]

MAX_SPLITS = 256
# The shortest split any row falls back to (the plain rows' ``min_keys_per_split``) where a
# row's own, longer floor would starve the launch (``choose_num_splits``).
FALLBACK_MIN_KEYS = 512


def choose_num_splits(batch: int, nheads_k: int, max_keys: int, num_sms: int,
                      config: PagedDecodeConfig) -> int:
    """Split count from shapes only (never tensor values: CUDA-graph capturable).

    ``base = batch * nheads_k`` programs of one split each. The CUDA-graph sweep over split counts
    at the documents' 30 shapes (H100, docs/notes.md) was best near ``config.programs_per_sm *
    num_sms`` programs (384-396 on 132 SMs) and 8-12% slower at every shape with 5 to 6.5 programs
    per SM (768 on 132 SMs), and splits under 512 keys lost to fewer, longer ones
    (``config.min_keys_per_split``). So: below that target, ``target // base`` splits (but no split
    shorter than ``config.min_keys_per_split`` keys of the longest possible sequence,
    ``max_pages * page_size``, and at most ``MAX_SPLITS``; ``config.splits_round_up``: the
    smallest count reaching the target instead); from it up, a single pass, or
    ``config.slow_band_splits`` (2 unless a row sets more) where one pass would land in the slow
    band (outside its one-pass band). Then no more splits than hold keys (``busy_splits``).

    A row's floor longer than ``FALLBACK_MIN_KEYS`` (fp8 and int8: 2048 keys, set at GQA 32/8
    16 x 4096) holds only while it leaves the launch at least half its target; below that the
    floor is ``FALLBACK_MIN_KEYS``. With few KV heads it starved the GPU: fp8 at GQA 12/2
    8 x 8192 ran 4 splits, 64 programs on 132 SMs, 1.75x slower than 16 splits (H100, graphs,
    2026-11-27, docs/notes.md: 17 shapes, fp8 and int8; the floor held where the launch had
    256 programs or more and lost 7-45% where it had 192 or fewer).
    """
    base = max(1, batch * nheads_k)
    target = int(config.programs_per_sm * num_sms)
    cap = max(1, max_keys // config.min_keys_per_split)
    if 2 * base * cap < target:
        cap = max(cap, max_keys // FALLBACK_MIN_KEYS)
    if base >= target:
        lo, hi = config.slow_programs_per_sm
        one_lo, one_hi = config.one_pass_programs_per_sm
        slow = lo * num_sms <= base <= hi * num_sms
        if slow and not one_lo * num_sms <= base < one_hi * num_sms:
            return max(2, min(config.slow_band_splits, cap))
        return 1
    splits = -(-target // base) if config.splits_round_up else target // base
    return busy_splits(max_keys, int(max(1, min(splits, cap, MAX_SPLITS))), config.block_n)


# The one-wave launch (``PagedDecodeConfig.one_wave``): measured at 0.97-1.0 of the SMs busy
# and 512-2048 keys a split (H200, 2026-12-01; configs.py has the table). 0.73 busy (GQA 12/2
# 48 x 1024) won too, but that row's 50 MB of K/V stays in L2 between graph replays
# (scripts/cold_l2_decode.py): not taken as evidence. Longer splits: not measured.
ONE_WAVE_FILL = 0.9
ONE_WAVE_KEYS = (512, 2048)


def is_one_wave(base: int, num_splits: int, max_keys: int, num_sms: int,
                config: PagedDecodeConfig) -> bool:
    """Whether ``base`` programs a split at ``num_splits`` splits of a ``max_keys``-key sequence
    run as the row's one-wave launch (``config.one_wave``): at most one program an SM and at
    least ``ONE_WAVE_FILL`` of the SMs, splits of ``ONE_WAVE_KEYS`` keys merged in the launch.
    The caller counts programs at one 16-row M-block (q_len 1)."""
    programs = base * num_splits
    split_keys = -(-max_keys // max(num_splits, 1))
    return (bool(config.one_wave) and 1 <= num_splits <= max(1, config.max_merged_splits)
            and ONE_WAVE_FILL * num_sms <= programs <= num_sms
            and ONE_WAVE_KEYS[0] <= split_keys <= ONE_WAVE_KEYS[1])


def one_wave_splits(base: int, max_keys: int, num_sms: int, config: PagedDecodeConfig) -> int:
    """The split count of the row's one-wave launch for ``base`` programs a split (the most
    splits that fit one program an SM, none shorter than ``config.min_keys_per_split``, every
    one holding keys), or 0 where that launch does not fill the SMs (``is_one_wave``)."""
    if not config.one_wave or base > num_sms:
        return 0
    cap = max(1, max_keys // config.min_keys_per_split)
    splits = min(num_sms // base, cap, max(1, config.max_merged_splits))
    splits = busy_splits(max_keys, splits, config.one_wave[0])
    return splits if is_one_wave(base, splits, max_keys, num_sms, config) else 0


# A batch cut of the Triton decode's one pass (``triton_batch_cut``). H200, graphs, x 8192 keys,
# us, one process, rounds alternated (2026-11-30), fp16 q: no cut / cut overlapped / cut in
# turn: GQA 32/8 68 535.6 / 519.9 / 530.5, 72 560.6 / 549.7 / 556.6; MHA 12/12 45 527.4 / 514.6
# / 525.6, 50 576.1 / 581.3 / 582.5 (+0.9%: its tail of 6 sequences); 66 (no cut) even. bf16 q:
# 538.6 / 519.7 / 529.1, 559.0 / 548.6 / 556.4, 529.4 / 513.7 / 523.7, 575.2 / 575.7 / 579.8. On.
TRITON_BATCH_CUT = True
TRITON_WAVE_FILL = 0.8         # the one pass's last wave at least this full: no cut
# ... nor past a tail of this fraction of a wave: the measured wins had tails of 2-9% of a
# wave (12-48 programs of 528), the loss 14% (MHA 12/12 50: 72 programs)
TRITON_CUT_MAX_TAIL = 0.1


def triton_batch_cut(batch: int, nheads_k: int, max_keys: int, num_sms: int,
                     config: PagedDecodeConfig) -> tuple[int, int]:
    """``(whole, tail_splits)`` for the Triton decode where ``choose_num_splits`` runs one pass
    of the row's own launch (the caller's check): its first ``whole`` sequences in that pass,
    whole waves of ``config.resident_programs_per_sm`` programs an SM, the other ``batch -
    whole`` at ``tail_splits`` splits (``choose_num_splits`` for them), a programmatic
    dependent of the first (``kvonce.paged.batch_cut``); ``(0, 0)``: no cut (``TRITON_BATCH_CUT``
    off, a row without ``resident_programs_per_sm``, the pass's last wave at least
    ``TRITON_WAVE_FILL`` full, under one wave, a tail over ``TRITON_CUT_MAX_TAIL`` of a wave,
    or a tail of one split).

    Why: a one pass just past a whole number of waves runs a last, mostly empty wave at the
    cost of a full one (H200, graphs, fp16, GQA 32/8 x 8192 keys: batch 66, 528 programs, 490.8
    us; 68 526.6, +7% for +3% work). The Gluon decode's cut gained 2-7% there (``gluon_batch_cut``).
    Shapes only: CUDA-graph capturable."""
    resident = config.resident_programs_per_sm
    if not TRITON_BATCH_CUT or not resident:
        return 0, 0
    wave = resident * num_sms
    nheads_k = max(1, nheads_k)
    waves = batch * nheads_k / wave
    if waves < 1 or waves / math.ceil(waves) >= TRITON_WAVE_FILL:
        return 0, 0
    whole = math.floor(waves) * wave // nheads_k
    if not 0 < whole < batch or (batch - whole) * nheads_k > TRITON_CUT_MAX_TAIL * wave:
        return 0, 0
    tail_splits = busy_splits(max_keys, choose_num_splits(batch - whole, nheads_k, max_keys,
                                                          num_sms, config), config.block_n)
    return (whole, tail_splits) if tail_splits > 1 else (0, 0)


# The Gluon decode (kernels/gluon_decode.py, two CTAs an SM, 128-key tiles): a launch from
# this many CTAs an SM runs one pass (or the few splits that fill its waves best); below it
# about one CTA an SM where that fills the SMs, else whole waves of two.
GLUON_CTAS_PER_SM = 2
GLUON_ONE_PASS_FROM = 0.9      # of a full wave of GLUON_CTAS_PER_SM CTAs an SM
GLUON_WAVE_FILL = 0.8          # the last wave's fill a split count must reach (1 to 3 splits)
GLUON_SM_FILL = 0.9            # short launches: one CTA an SM where the SMs are this full
GLUON_SHORT_WAVE_FILL = 0.9    # else the fewest splits whose last wave of two is this full
# int4 (``two_ctas_an_sm``): the most splits within one wave of two CTAs an SM, int8's rule until
# 2026-11-30 (int8's loop then hid its memory only at two CTAs an SM: 84.8 us at 32 splits
# against 99.5 at 16, GQA 32/8 1 x 131072, 2026-11-29; fp8 took about one CTA an SM, rounded
# up). The plan runs int4 on the Gluon decode only from 0.7 of a wave (``gluon_int4_pays``), one
# pass there; its split launches were not measured under the short rule below.
# Launches with fewer keys a sequence (block-table capacity) keep the Triton kernel: the Gluon
# decode was measured from 2048 keys up only (H200, graphs, at this rule's splits: 32/8 64 x 2048
# 1.10x the Triton plan, 12/12 16 x 2048 1.07x, 32/8 4 x 4096 1.22x).
GLUON_MIN_KEYS = 2048


# int4 on the Gluon decode (swapped operands, kernels/gluon_decode.py) against the Triton int4
# row (H200, graphs, 2026-11-29, nineteenth session, fp16 q; bf16 alike), us, GQA 32/8 at
# 16 / 24 / 32 / 48 / 64 x 8192 and 128 x 4096 (128 to 1024 CTAs): 65.3 / 90.0 / 98.9 / 164.6 /
# 192.2 / 201.7 against 62.3 / 96.3 / 107.6 / 166.7 / 199.7 / 213.6; MHA 12/12 (192 to 1536
# CTAs) 90.0 / 138.7 / 155.9 / 238.8 / 277.2 / 287.4 against 96.0 / 154.5 / 160.3 / 257.3 /
# 296.4 / 289.6; split launches lost (1 x 131072: 71.5 against 61.7, MHA 88.9 / 85.6).
GLUON_INT4_FROM = 0.7          # of a wave of GLUON_CTAS_PER_SM CTAs an SM (192 / 264 = 0.73)
GLUON_INT4_MAX_ROWS = 8        # packed q rows (GQA group x q_len): the swapped dots' N


def gluon_int4_pays(base: int, rows: int, num_sms: int) -> bool:
    """Whether an int4 launch of ``base = batch * nheads_k`` CTAs a split and ``rows`` packed q
    rows (GQA group x q_len) runs faster on the Gluon decode than on the Triton int4 row: its
    swapped operands (rows <= ``GLUON_INT4_MAX_ROWS``) and at least ``GLUON_INT4_FROM`` of a wave
    of two CTAs an SM (the measurements above)."""
    return (rows <= GLUON_INT4_MAX_ROWS
            and base >= GLUON_INT4_FROM * GLUON_CTAS_PER_SM * num_sms)


def gluon_num_splits(base: int, max_keys: int, num_sms: int,
                     two_ctas_an_sm: bool = False, tile_keys: int = 128) -> int:
    """Split count of the Gluon decode (``base = batch * nheads_k`` CTAs a split), from
    shapes only. Long launches (from ``GLUON_ONE_PASS_FROM`` of a wave of two CTAs an SM): one
    pass, unless its last wave is ragged: then the fewest splits (up to 3) whose last wave is at
    least ``GLUON_WAVE_FILL`` full (H200, 2026-11-29, graphs, fp8: 512 and 768 CTAs one pass 4%
    and 2% ahead of two splits, 264 5%; 288 CTAs one pass 193 us, 2 splits 166, 3 splits 163;
    352: 205 / 189 / 190).

    Short launches, fp8 and int8: the most splits that keep one CTA an SM (at most ``num_sms``
    CTAs) where they fill ``GLUON_SM_FILL`` of the SMs; else the fewest whose last wave of two
    CTAs an SM is ``GLUON_SHORT_WAVE_FILL`` full (the fullest within the cap if none is). A
    launch of 133 to 264 CTAs leaves some SMs two CTAs and the rest one: those SMs' CTAs set
    its time. Measured on the H200 (2026-11-30, twenty-seventh session, graphs, head-major
    pages, forced splits, us fp8 / int8; docs/notes.md): GQA 32/8 1 x 131072 16 splits (128
    CTAs) 79.5 / 80.7 against 33 (264) 81.4 / 84.1; 3 x 65536 5 (120) 111.0 / 112.4 against 6
    (144) 116.7 / 130.8; 6 x 32768 5 (240) 111.9 / 116.3 against 3 (144) 115.8 / 130.9; 12 x
    16384 5 (480) 113.2 / 117.2 against 2 (192) 114.7 / 120.3; 16 x 8192 1 pass 77.2 / 78.7
    against 2 81.2 / 83.5; MHA 12/12 12 x 16384 5 (720) 155.2 / 161.7 against 1 (144) 162.5 /
    190.7. The rule's one loss: GQA 24 x 8192 (192 CTAs) fp8 at 4 splits 114.3 against one
    pass 112.9 (int8 117.6 against 119.8). ``two_ctas_an_sm`` (int4): the most splits within
    one wave of two CTAs an SM instead.

    No split shorter than ``FALLBACK_MIN_KEYS`` keys, none empty at ``tile_keys``-key tiles
    (``busy_splits``; a CTA taking a group of KV heads, ``gluon_decode.kv_head_group``, cuts its
    keys in ``128 / heads``-key tiles: 4 head groups take 33 splits, a CTA every SM)."""
    base = max(1, base)
    cap = max(1, min(MAX_SPLITS, max_keys // FALLBACK_MIN_KEYS))
    wave = GLUON_CTAS_PER_SM * num_sms

    def wave_fill(splits: int) -> float:
        waves = base * splits / wave
        return waves / math.ceil(waves)

    if base >= GLUON_ONE_PASS_FROM * wave:
        fills = []
        for splits in range(1, min(3, cap) + 1):
            fills.append(wave_fill(splits))
            if fills[-1] >= GLUON_WAVE_FILL:
                return splits
        return 1 + fills.index(max(fills))
    if two_ctas_an_sm:
        return busy_splits(max_keys, min(cap, max(1, wave // base)), tile_keys)
    one_cta = busy_splits(max_keys, min(cap, num_sms // base), tile_keys)
    if one_cta and base * one_cta >= GLUON_SM_FILL * num_sms:
        return one_cta
    best = 1
    for splits in range(1, cap + 1):
        # only counts that leave no split empty (9 splits of 8192 keys in 128-key tiles run as 8)
        if busy_splits(max_keys, splits, tile_keys) != splits:
            continue
        if wave_fill(splits) >= GLUON_SHORT_WAVE_FILL:
            return splits
        if wave_fill(splits) > wave_fill(best):
            best = splits
    return best


# A batch cut (``gluon_batch_cut``) where one pass of the Gluon decode leaves its last wave
# ragged (kvonce.paged.batch_cut). H200, graphs, x 8192 keys, us without -> with the cut (two
# launches one after the other; one process, rounds alternated, 2026-11-30): GQA 32/8 fp8 68
# 279.5 -> 274.8, 70 296.8 -> 279.8, 72 303.5 -> 291.3; int8 296.5 -> 285.8, 305.9 -> 291.1,
# 318.3 -> 302.5; MHA 12/12 23 fp8 148.2 -> 143.2, int8 156.6 -> 149.4; 45 271.0 -> 268.3,
# 283.7 -> 280.9; 64 (no cut) even. With the tail a programmatic dependent of the head
# (batch_cut.OVERLAP), in another process: fp8 GQA 68 270.7 (no cut) -> 266.4 (in turn) ->
# 259.5 (overlapped), 70 290.2 -> 271.9 -> 269.8, 72 296.0 -> 282.9 -> 274.8 (66: 251.6, so 68
# and 72 cost their work's share: 259.2 and 274.5); int8 and MHA alike. On.
GLUON_BATCH_CUT = True
# int4 (the rule's ``two_ctas_an_sm``), us without -> with the cut (H200, graphs, 2026-11-30):
# GQA 32/8 48 x 2048 51.4 -> 44.0, 68 x 8192 190.7 -> 176.6; MHA 12/12 45 x 8192 179.0 -> 171.2.
GLUON_INT4_BATCH_CUT = True
# A cut where the last wave is full loses, even with the overlap: 64 x 8192 with its last 4 /
# 8 / 16 sequences split (2-8 splits), fp8 and int8, GQA 32/8 and MHA 12/12: 1.0-14% slower
# (fp8 GQA 251.3 us -> 256.4 at 4 sequences in 4 splits; 2026-11-30, knobs since removed).


def gluon_batch_cut(batch: int, ctas_per_seq: int, max_keys: int, num_sms: int,
                    two_ctas_an_sm: bool = False, tile_keys: int = 128) -> tuple[int, int]:
    """``(whole, tail_splits)``: the Gluon decode's first ``whole`` sequences in one pass (whole
    waves of ``GLUON_CTAS_PER_SM`` CTAs an SM), the other ``batch - whole`` at ``tail_splits``
    splits (``gluon_num_splits``' short-launch rule for them), two launches, the second
    overlapping the first's end (``kvonce.paged.batch_cut``); ``(0, 0)``: no cut
    (``GLUON_BATCH_CUT`` off, an int4 launch with ``GLUON_INT4_BATCH_CUT`` off, the one pass's
    last wave at least ``GLUON_WAVE_FILL`` full, or under one wave).

    Why: past a whole number of waves the rule above pays either a mostly empty last wave or a
    split count that doubles every sequence's CTAs. H200, graphs, GQA 32/8 x 8192 keys, us
    (twenty-ninth session): batch 66 (528 CTAs, two whole waves) fp8 250.8, int8 260.8; batch
    68 at 2 splits 273.7 / 282.3 (+9% / +8% for +3% work), 72 at 2 splits 297.0 / 312.1.
    Predicted with the cut (the 66-sequence pass, then the tail as a short launch of ~7 us
    fixed cost and its bytes at ~4.3 TB/s): batch 68 ~266 us (-3%), 72 ~281 (-5%).
    Shapes only: CUDA-graph capturable."""
    wave = GLUON_CTAS_PER_SM * num_sms
    ctas_per_seq = max(1, ctas_per_seq)
    waves = batch * ctas_per_seq / wave
    if (not GLUON_BATCH_CUT or (two_ctas_an_sm and not GLUON_INT4_BATCH_CUT) or waves < 1
            or waves / math.ceil(waves) >= GLUON_WAVE_FILL):
        return 0, 0
    whole = math.floor(waves) * wave // ctas_per_seq
    if not 0 < whole < batch:
        return 0, 0
    tail_splits = gluon_num_splits((batch - whole) * ctas_per_seq, max_keys, num_sms,
                                   two_ctas_an_sm, tile_keys)
    return (whole, tail_splits) if tail_splits > 1 else (0, 0)


def busy_splits(max_keys: int, num_splits: int, block_n: int) -> int:
    """How many of ``num_splits`` splits hold keys of a ``max_keys``-key sequence: the kernel cuts
    it into ranges of ``ceil(ceil(max_keys / num_splits) / block_n) * block_n`` keys (whole
    tiles), so a count that does not divide evenly leaves the last splits empty (66 splits of
    131072 keys at 128-key tiles: 64 ranges of 2048, two programs with nothing to do and two
    partials for the combine to read). With the returned count no split is empty at
    ``max_keys`` (nor at any ``block_n`` smaller than this one)."""
    if num_splits <= 1 or max_keys <= 0:
        return num_splits
    split_len = -(-(-(-max_keys // num_splits)) // block_n) * block_n
    return -(-max_keys // split_len)
