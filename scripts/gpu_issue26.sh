#!/usr/bin/env bash
# Issue 26's GPU steps (STEPS="quanttest quantbench splits hf prefill"; default all), logs in $OUT:
#   gluontests  tests/test_gluon_decode.py alone (every route of the Gluon decode; ~190 cases)
#   quanttest   the quantized decode / append / format / key-transform tests,
#               prefill's quant tests
#   quantbench  python -m kvonce bench quant (FlashInfer beside when .peers/fi travels: carry it)
#   splits      scripts/quant_decode_sweep.py at 1 x 131072: the split count's knobs per format
#               (programs_per_sm, max_merged_splits) and int4's 64- vs 128-key tiles
#   knobs       scripts/quant_decode_sweep.py on the split kernel's swap_ab (fp8, int8) and
#               max_registers (int4) knobs, fp16 and bf16 queries (DTYPES)
#   pairs       scripts/quant_decode_sweep.py: V as channel pairs (v_pairs) for int8, alone and
#               with two splits from 3.5 programs an SM (the fp8 row's rule), and fp8's pairs with
#               int32 offsets; fp16 (int8, fp8) and bf16 (fp8) queries (DTYPES), the six shapes
#   hf          scripts/quant_hf_check.py with outlier keys, with and without KeyTransform
#   gluon       tests/test_gluon_prefill.py, then scripts/prefill_sweep.py: the Gluon prefill
#               kernel (g) against the shipped Triton row, pages 16 and 256
#   verify      what the 2026-11-26 later session left unrun on a GPU: the cascade's launch fix
#               (dispatch modes, prefix decode) and the Gluon prefill's padded groups
#   trace       the Gluon prefill's item trace (prefill_item_trace.py: the steps of a work item,
#               the last P V's V wait and issue, the loop's steps a tile, the two warpgroups'
#               overlap), then the trace probe's test
#   probes35    the thirty-fifth session's probes timed for real (prefill_page_order.py made
#               their launches after putting the knobs back until 2026-11-30's thirty-eighth
#               session): 16-row boxes and the page size as an argument at pages 16 / 256,
#               one lookup a tile on sequential pages
#   vpages      V by pages (gluon_prefill.V_PAGES, 2026-11-30, thirty-ninth session; run and
#               turned on 2026-12-01): its tests (20 cases, bytes equal to V as K), then
#               prefill_knob_ab.py at page 16 (loader 283 -> 242 instructions, 32 -> 24 copies
#               a tile; the consumers' loops unchanged) against page 16 and page 256, prefill
#               and chunked rows
#   lazy        FA4's conditional rescale (gluon_prefill.LAZY_RESCALE, built 2026-12-01 in the
#               fortieth session, run in the forty-first: prefill -1 to -4%, chunked +2%; off):
#               its tests against the reference (with and without 12x key spikes), then the A/B
#               at pages 16 and 256 ("same" is False by design: other rounding)
#   rowtree     the softmax's row max and sum as trees (gluon_prefill.ROW_TREE, on since
#               2026-12-01, forty-second session: prefill +0.3-1.1%, chunked -1 to +0.3%; the
#               masked path's planned stalls 1281 -> 1165): the chain form's tests against the
#               reference, then the A/B against it at pages 16 and 256 ("same" False: the sums'
#               order)
#   sdpancu     GQA 12/2 64 x 1024 against dense SDPA (0.861 on 2026-12-01): forced split counts
#               against the plan's own, then ncu of the plan, its one pass and SDPA's kernel
#   summma      P's row sums by the tensor core (gluon_prefill.ROW_SUM_MMA; on at 16-row boxes
#               since 2026-12-01, forty-third session: page 16 +0.2 to +2.3% in graphs, pages
#               128 / 256 -0.5 to -1.5%): its 24 tests against the reference, then the A/B
#               against the FADD form at page 16 and against it forced on at page 256
#   loaders     the loader's instructions (2026-12-01, fortieth session: 240 more a tile cost
#               page 16 8%, as four chains 5%): KV_PAIRED's tests (on since the forty-first
#               session, +0.3-1.4%), then an A/B against it off, and with the pad probe as
#               uniform instructions and as a chain a lane (forty-first: the lane form cost
#               2-5% more than the uniform one)
#   graphgap    scripts/prefill_graph_gap.py (2026-12-01, forty-first session: back-to-back
#               graph replays run at the 700 W cap, the SM clock 1755-1770 MHz for prefill and
#               1560-1620 for chunked; with 100 us gaps 1875-1890 MHz and prefill page 16 0.638
#               -> 0.598 ms): the plan's time eagerly, in graphs, in graphs with gaps, and the
#               clock and power nvidia-smi sees
#   softmax     the prefill softmax's probes (2026-11-30, thirty-ninth session): the item trace
#               with the two warpgroups' softmax overlap (slots 17-32), and PROBE_SOFTMAX's
#               no_exp / no_rescale against the kernel at pages 16 / 256 (timing only)
#   pftests     the paged prefill tests (Gluon and Triton kernels, HF continuous batching)
#   pfbench     python -m kvonce bench prefill (FlashInfer beside when .peers/fi travels)
#   prefetch    3 stages with the page ids carried a tile ahead (prefetch_pages): without the
#               carry K/V keep one shared-memory slot whatever num_stages says (the third stage
#               goes to the page ids; TTGIR compiled for sm_90a); fp8 and int8 (DTYPES), then
#               plain decode (scripts/decode_config_sweep.py)
#   pf2         fp8 and int8 at 2 stages with carried page ids (the 3-stage form lost, 2026-11-27
#               sixth session; fp8's stalls are mostly long scoreboard), fp16 and bf16 (DTYPES)
#   tail        the ~10 us a launch that int4 spends outside its tiles at 1 x L (2026-11-27 tenth
#               session: forced 64 splits, 80.8 us at 131072 keys and 136.3 at 262144; fp8 ~4,
#               plain ~6): graph time against length at fixed splits, then ncu's SM active
#               cycles (min / avg / max against elapsed: a tail or a ramp) for int4, fp8, plain
#   ring        int4 (per-key format) K/V ring depth: 4 stages (3 shared-memory slots, 63.5 KB a
#               program, still 3 programs an SM; sm_90a: the same 730-instruction loop, no new
#               spill) against the row's 3 (2 slots); 2 stages at 128 registers with the split
#               count left at the row's programs_per_sm (4 programs fit, 3 assumed) and with 4
#               assumed; 256-key tiles at 8 warps, 3 stages (2 programs an SM at 90 KB, 144 KB
#               of ring an SM against 108; 29 instructions a key against 23); fp16 and bf16
#               queries (DTYPES), GQA 32/8 and MHA 12/12
#   headpair    int4 head pairs (PagedDecodeConfig.head_pairs, 2026-11-27 ninth session): the
#               int4 tests, then the row against pairs at 232 registers and 2 programs an SM,
#               token-major pages (where they won at fp16) and head-major, fp16 and bf16
#               queries (DTYPES)
#   prefill     scripts/prefill_sweep.py: one q head per program ('h') against GQA packing, pages
#               16 and 256, 128x128 / 128x64 tiles, TMA where pages hold whole tiles
#   decodebench python -m kvonce bench decode --graph-peers (FlashInfer beside when .peers/fi
#               travels): the decode table's rows against dense SDPA and FlashInfer
#   int32plain  scripts/config_ab.py: the plain rows with int32 offsets (int64_kv_offsets=0;
#               2026-11-29: 399 instead of 622 instructions a tile a warp at (128, 4, 2),
#               compiled), auto splits, bf16 and fp16 queries (DTYPES)
#   h200plain   scripts/config_ab.py on the plain d128 row's H100 choices, on the H200
#               (2026-11-29, fourteenth session: 128-key tiles won 1.5-3.7% on 8 of 12 cases and
#               lost 13.6% at 32/8 64 x 8192; carried page ids won 5.5% at 12/12 128 x 512 and
#               lost 29% at 32/8 64 x 8192): block_n 128, carried page ids, both, 3 stages with
#               carried ids, fp16 (DTYPES), MHA 12/12, GQA 32/8 and 12/2 across the launch sizes
#   gqa12       scripts/config_ab.py on GQA 12/2 64 x 1024, 128 x 512, 1 x 131072 (the decode
#               rows under 95% of dense SDPA): 3 stages, 8 warps, both, carried page ids, split
#               counts (sm_90a, plain fp16 12/2, two splits, 128-key tiles: 4 warps 2 / 3 stages
#               179 / 168 registers, 398 / 494 instructions a tile a warp; 8 warps 64 / 114
#               registers, 387 / 475; no spill; 72-73 KB of shared memory)
#   occ         ncu on the plain row at 32/8 40 x 2048 and 56 x 2048, 64- and 128-key tiles:
#               registers, occupancy limits, waves, active warps (the wide-tile rule's premise)
#   h200quant   scripts/quant_decode_sweep.py on the H200 (the quant rows were tuned on the
#               H100; on the H200 every quant ratio fell, the loops no longer follow the memory):
#               fp8 / int8 at 2 and 3 stages with carried page ids, 2 and 4 programs an SM;
#               int4 at 2 / 3 / 4 stages, 2 and 4 programs an SM; four programs an SM that
#               fit (128 registers: sm_90a, fp8 64 B of spill and 609 instructions a tile a
#               warp against 604, int8 120 B and 902 against 872, int4 24 B and 762 against
#               734; 40-45 KB of shared memory a program); GQA 32/8 and MHA 12/12,
#               64 x 8192 and 1 x 131072, fp16 (DTYPES)
#   gluondec    scripts/gluon_decode_check.py (the Gluon fp8 decode, wired 2026-11-29; TMA loader warp: 2-11%
#               slower than the Triton row on the H100, where fp8 read ~2.8 TB/s; on the H200
#               the Triton row reads 3.6-4.1 TB/s of fp8 bytes against the fp16 row's 4.1-4.5)
#   gluonint8   the Gluon decode's int8 and bf16 q routes (shipped 2026-11-29, seventeenth session:
#               int8 1.09-1.21x the Triton row at 64 x 8192, 1.12x / 1.11x at 1 x 131072 with a
#               wave of two CTAs an SM; their tests: gluontests): quant_decode_sweep.py
#               with the row (Triton) against gluon=1, int8 and fp8, GQA 32/8 and MHA 12/12,
#               64 x 8192 and 1 x 131072, DTYPES (say "fp16 bf16"); then int8 with its scales
#               a key at a time (--int8-ring 0; by TMA shipped 2026-11-29, eighteenth session)
#   gluonint4   the Gluon decode's int4 form (KV_FORMAT 3, 64-byte rows in four 16 KB stages, the
#               (scale, offset) pairs by TMA with the K tile; swapped operands shipped where
#               gluon_int4_pays, 2026-11-29 nineteenth session; its tests: gluontests):
#               quant_decode_sweep.py, the int4 rows
#               (Triton) against gluon=1 at the plan's splits and at 16 / 32 / 64 for
#               1 x 131072, GQA 32/8 and MHA 12/12, DTYPES
#   ringvs      int8 on the Gluon decode: its scales a key at a time against by TMA (DTYPES)
#   vbias       int8 V as 1152 + x on the Gluon decode (INT8_V_BIASED: correct, measured even,
#               off): its tests, then the sweep against the shipped int8 route (DTYPES)
#   swap        the Gluon decode's swapped-operand consumers (GLUON_SWAP_FORMATS: int4's shipped,
#               fp8's / int8's 1-2% slower): their tests, then fp8 / int8 (V_BIASED off, on)
#               against the shipped routes, int4 swapped or not (--swap-ab) (DTYPES);
#               STEP_TESTS=0 skips vbias's and swap's tests (run them at once, in parallel:
#               ROUTES="vbias swap" bash scripts/gluon_routes_test.sh)
#   gluonncu    ncu on the Gluon decode (fp8, int8, int4 swapped) and the Triton int4 row at GQA
#               32/8 64 x 8192 and 1 x 131072: issue rate and the stall reasons a warp an issue
#               (the nineteenth session found the loops latency-bound: fewer instructions did
#               not pay), DRAM throughput; what to hide next
#   t256        int4's swapped consumers in 256-key tiles (INT4_SWAPPED_TILE_KEYS, 2026-11-29
#               nineteenth session: 455 instructions a 128 keys a warp against 515, a chain of
#               64 keys a warp; its 33 tests passed on the H200, GQA 64 x 8192 even with 128-key
#               tiles at two stages): their tests (the "t256" route), then int4 at 128 / 256
#               against the Triton row (two and three 32 KB stages), GQA 32/8 and MHA 12/12,
#               from 16 x 8192 to 1 x 131072
#   probe       scripts/quant_decode_probe.py (2026-11-29, twentieth session): the Gluon routes'
#               kernel, memory-only and math-only times and the Triton row, per LAYOUTS
#               ("nhd hnd"; quantbench takes LAYOUTS too)
#   pages       the loader's TMA boxes (a page's rows: 16 x 64 bytes for int4 at page 16): fp8,
#               int8, int4 on the Gluon decode and their Triton rows at pages of 16 / 64 / 256
#               keys, GQA 32/8 and MHA 12/12 64 x 8192 (the fp16 cache at the same page size)
#   prefix      the shared-prefix decode after 2026-11-29's fourteenth session (the chunk loop's
#               masked band under a branch, the suffix decode in int32 with the d128 row, the op
#               carrying the configs' flags: compiled and CPU-tested only): its GPU tests, then
#               python -m kvonce bench prefix (FlashInfer beside when .peers/fi travels), then
#               --sweep on cases 0, 3, 6: the row in int64 (shipped) against int32 (sm_90a, bf16
#               32/8: the chunk loop 789 -> 663 instructions a tile a warp, 4 B of spill gone)
#   f16pairs    int4's fp16 (scale, offset) pairs (2026-11-29, twenty-first session: quantize_kv's
#               new default, 136 bytes a (token, KV head) against 144): the int4 Gluon routes'
#               tests (fp16 and fp32 pairs) beside the Triton int4 tests (decode, append,
#               prefill, prefix), then the probe at both pair dtypes (kernel / memory only, the
#               Triton row), per LAYOUTS
#   host        python -m kvonce bench host at GQA 32/8 1 x 131072 and 64 x 8192 (2026-11-30,
#               twenty-third session: the Gluon decode's TMA descriptors kept between calls,
#               tma_descriptors.DescriptorCache; the quantized rows' host us against their GPU us)
#   runlength   what a fused int4 page layout could stream: the memory-only probe (four loaders)
#               of int4 at 64 x 8192 (1 KB runs a page and head, plus 64-byte scale runs) beside
#               fp8 at 64 x 4096 (2 KB runs, about int4's bytes) and 64 x 8192, head-major pages;
#               TB/s per run length says whether K, V and their pairs of a page and head in one
#               2176-byte run would lift int4's memory only (148 us GQA) enough for 3.3x
#   headgroups  KV head groups (gluon_decode.GLUON_KV_HEAD_GROUPS: a CTA a group of KV heads, a
#               TMA box a whole page of the group): their tests, then quant_decode_probe.py's
#               kernel and memory-only times against one head a CTA (HG_GROUPS, HG_SHAPES)
#   cpasync     fp8's loader warps by cp.async (gluon_decode.GLUON_CP_ASYNC_FORMATS): the tests,
#               then quant_decode_probe.py's kernel / memory-only times against TMA, 1 and 4
#               loader warps (CP_SHAPES)
#   defersums   int4's rows' sums a thread's part a tile (gluon_decode.INT4_DEFER_SUMS): the tests,
#               then quant_decode_probe.py's kernel / memory-only times without and with it
#   fixedcost   scripts/decode_fixed_cost.py: a short launch's decode kernel, combine and gaps at
#               1 x 32768-262144 (GQA 32/8, the plan's splits), then fp8 / int8 at FC_SPLITS
#               forced split counts (2026-11-30: fp8 streams at 4.27 TB/s against fp16's 4.41,
#               its fixed cost 7.4 us against 8.8; int8 10.4 at 32 splits), and both on
#               their Triton rows (gluon=0)
#   dramrate    ncu's DRAM bytes, DRAM throughput and L2 sectors / hit rate of the decode kernel
#               for the 16-bit Triton row against the Gluon fp8 / int8 at GQA 32/8 1 x 131072
#               and 64 x 8192 (head-major): does fp8 stream at 4.27 TB/s where fp16 streams at 4.41
#               because it reads more bytes than it uses, or because its requests drain slower?
#   gluon16rate the control for dramrate's question: the 16-bit Gluon decode (same warp-specialized
#               TMA ring, fp16 pages, 64-key tiles; scripts/gluon_decode16_check.py) against the
#               Triton 16-bit plan and dense SDPA at GQA 32/8 1 x 131072 and 1 x 262144 (the
#               rate: the difference over the added bytes). Gluon-16 under Triton-16's 4.41 TB/s
#               says the kernel's structure, not the format, holds fp8 / int8 at 4.27
#   gluon16     scripts/gluon_decode16_check.py whole (correctness, then its default decode rows,
#               GQA 12/2 64 x 1024 among them, against the Triton plan and dense SDPA): the
#               twentieth session's "stays unwired" ran every variant at two stages
#               (GluonDecodeLaunch ignored ``stages`` until 2026-11-30), so 1cta-4st and 2cta-3st
#               were never measured
#   int8splits  int8's Gluon split count at short launches (1 x 131072 to 8 x 16384, GQA 32/8 and
#               MHA 12/12, forced 2-33 splits and the plan's): 2026-11-30 (twenty-seventh
#               session) int8 at GQA 1 x 131072 ran 69.7 us at 16 splits (fp8's one CTA an SM)
#               against 72.7 at 32 and 75.5 at the plan's 32 (two CTAs an SM)
#   pdl         the split combine as a programmatic dependent launch, the decode launches
#               triggering it at their start (paged_combine.COMBINE_PDL; compiled for sm_90a
#               2026-11-30, first GPU run): the decode and prefix tests with it on
#               (scripts/pdl_run.py), then scripts/decode_fixed_cost.py --combine-pdl 0|1 at
#               GQA 32/8 and MHA 12/12 (fp16, fp8, int8; 131072 and 262144 keys)
#   onecta      the short launches' one-CTA-an-SM variant (gluon_decode.GLUON_ONE_CTA_VARIANT:
#               3 or 4 ring stages, the merge through its own scratch, no register cap; compiled
#               for sm_90a 2026-11-30, first GPU run): the Gluon and quant decode tests with it
#               on, then scripts/decode_fixed_cost.py --one-cta-stages 0|3|4 twice in turn at
#               GQA 32/8 and MHA 12/12 (fp8, int8; 65536 to 262144 keys). The twenty-eighth
#               session's smspread: a busy SM moved 18.0 B a cycle at one CTA an SM against
#               the Triton fp16 decode's 19.2; two stages keep one 32 KB tile in flight while
#               the consumers read the other
#   cutpdl      the Gluon decode's batch cut (on, 2026-11-30: paged.splits.GLUON_BATCH_CUT),
#               its tail a programmatic dependent of its head (batch_cut.OVERLAP): the tests,
#               then the plan against OVERLAP off and against no cut (config_ab, one process) at
#               GQA 32/8 68 / 70 / 72 x 8192, MHA 12/12 23 / 45 x 8192, 66 x 8192 (no cut)
#   masked      the masked loop unpipelined / 4 partials at once (registers at 12/2 merged launches)
#   groupmerge  the plan's partials at once by GROUP against the row's 2 (wide_merge_at_once)
#   gqa12long   split counts at GQA 12/2 1 x 131072, 64- and 128-key tiles
#   occupancy   ncu's occupancy limits of the plain decode's 64- and 128-key tiles
#   cutgate     the Triton cut's tail gate (TRITON_CUT_MAX_TAIL 0.1) against none, tails 0.12-0.76
#   tritoncut   the Triton decode's batch cut (TRITON_BATCH_CUT, on): tests, then config_ab at
#               GQA 32/8 68 / 72 / 80 x 8192, MHA 12/12 45 / 50 x 8192, 66 (control), fp16/bf16
#   smspread    the next question after dramrate (2026-11-30: the same bytes at 81% of DRAM peak
#               against fp16's 87.5%): is it a tail (SM active cycles min / avg / max against
#               the elapsed) or a lower rate on every SM (L2-to-SM bytes a second, the TMA
#               unit's); fp16 Triton, fp8 and int8 Gluon at GQA 32/8 1 x 131072 and 64 x 8192
#   power       scripts/decode_power_series.py (fp16, fp8, int8, int4 graph replays back to back for
#               3 s after 2 s idle; 2026-11-30: the H200 sits at its 700 W cap, SM clock
#               1.4-1.85 GHz, int4 155.7 -> 164-166 us) with nvidia-smi's clock and power beside
#   onewave     the one-wave decode launch (PagedDecodeConfig.one_wave, on since 2026-12-01,
#               forty-fifth session: 12/2 64 x 1024 22.7 -> 20.8 us, 0.952 of dense SDPA): its
#               GPU tests, then its edges, each a forced count at the 128-key / 3-stage /
#               carried-ids config against the plan's own launch: splits of 4096-8192 keys,
#               0.7-0.85 of the SMs on caches too large for L2, 8-64 splits through the combine
#               kernel (1 x 131072, 8 x 8192), and cache-hint knobs at the one-wave launch
set -u
export PYTHONPATH=src:.peers/fi PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws \
  FLASHINFER_CUDA_ARCH_LIST=9.0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-"quanttest quantbench splits hf prefill"}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
step() { echo "== $1 ($(date +%T))"; }
# a step runs when its whole name is in STEPS ("gluondec" alone does not run "gluon")
has() { [[ " $STEPS " == *" $1 "* ]]; }
# A prefill form's tests against the reference (test_gluon_prefill_forms, -k "prefill_forms
# and (SELECTION)"), then the A/B of VARIANTS (prefill_knob_ab.py's --variants) on the prefill
# and chunked rows, 3 rounds: forms_ab SELECTION VARIANTS [A/B TIMEOUT]
forms_ab() {
  timeout 260 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gluon_prefill.py \
    -k "prefill_forms and ($1)" 2>&1 | tail -4 | cut -c1-300
  (cd scripts && PYTHONPATH=../src:. timeout "${3:-270}" python3 prefill_knob_ab.py \
    --rows prefill,chunked --variants "$2" --rounds 3 2>&1 | tail -25)
}
if has gluontests; then
  step gluontests
  # every Gluon decode route (fp8, int8 a key at a time / by ring / token-major scales, int4),
  # the shipped ones first in each case's parametrization; ~190 cases
  timeout ${GLUON_TESTS_S:-540} python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/test_gluon_decode.py 2>&1 | tail -25 | cut -c1-400
fi
if has quanttest; then
  step quanttest
  timeout 360 python3 -m pytest -q -p no:cacheprovider tests/test_decode_quant.py \
    tests/test_append_quant.py tests/test_quant.py tests/test_key_transform.py 2>&1 | tail -3
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_paged_prefill.py \
    -k "quant or one_head_per_program" 2>&1 | tail -2
fi
if has quantbench; then
  step quantbench
  for dt in ${DTYPES:-fp16}; do
    for lay in ${LAYOUTS:-nhd}; do
      echo "- $dt $lay"
      timeout 420 python3 -m kvonce bench quant --shapes ${QUANT_SHAPES:-64x8192,1x131072} \
        --dtype $dt --layout $lay ${QUANT_ARGS:-} --md "$OUT/bench_quant_${dt}_$lay.md" \
        --plot '' 2>&1 \
        | grep "^|" | tail -26
    done
  done
fi
if has probe; then
  step probe
  # the Gluon decode's roofline probe: kernel, memory only, math only, the Triton row
  for lay in ${LAYOUTS:-nhd}; do
    (cd scripts && PYTHONPATH=../src:. timeout 280 python3 quant_decode_probe.py --layout $lay \
      --force-gluon --triton 2>&1 | grep "^|")
  done
fi
if has f16pairs; then
  step f16pairs
  ROUTES="int4 int4swap" ROUTE_S=320 OUT=$OUT bash scripts/gluon_routes_test.sh \
    > "$OUT/f16pairs_routes.txt" 2>&1 &
  timeout 320 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_decode_quant.py \
    tests/test_append_quant.py tests/test_quant.py > "$OUT/f16pairs_triton.log" 2>&1 &
  timeout 320 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_paged_prefill.py \
    tests/test_prefix_decode.py -k "int4 or quant" > "$OUT/f16pairs_prefill.log" 2>&1 &
  wait
  cat "$OUT/f16pairs_routes.txt"
  for f in triton prefill; do
    echo "- $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/f16pairs_$f.log" | head -8 \
      | cut -c1-300
  done
  for lay in ${LAYOUTS:-nhd}; do
    (cd scripts && PYTHONPATH=../src:. timeout 150 python3 quant_decode_probe.py --layout $lay \
      --formats int4 --int4-pairs fp16,fp32 --probes 0,1 --triton 2>&1 | grep "^|")
  done
fi
if has knobs; then
  step knobs
  for dt in ${DTYPES:-fp16}; do
    timeout 300 python3 scripts/quant_decode_sweep.py --dtype $dt --formats fp8_e4m3,int8 \
      --heads 32/8,12/12 --shapes ${KNOB_SHAPES:-64x8192,1x131072} --grid 128,4,2 \
      64,4,2,3,4,0,1 128,8,2,3,4,0,1 64,4,3,3,4,0,1 2>&1 | tail -12
    timeout 300 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int4 \
      --heads 32/8,12/12 --shapes ${KNOB_SHAPES:-64x8192,1x131072} --grid 128,4,2,3,64 \
      128,4,2,3,64,168 128,4,3,3,64,168 64,4,2,3,64,168 2>&1 | tail -8
  done
fi
if has pairs; then
  step pairs
  # grid fields: block_n,warps,stages,programs_per_sm,max_merged,max_regs,swap_ab,f16_math,
  # int64_kv_offsets,v_pairs (-1 keeps the row's value); the slow band is not a grid field, so
  # programs_per_sm 4 stands in for "two splits at 64 x 8192" there.
  for dt in ${DTYPES:-fp16 bf16}; do
    # int8 pairs need fp16 compute: bf16 queries keep the byte-gathered V (f16_math is fp8's)
    [[ $dt == fp16 ]] && timeout 200 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int8 --all \
      --heads 32/8,12/12 --shapes 16x4096,64x8192,1x131072 --grid 128,4,2 \
      128,4,2,-1,-1,-1,-1,-1,-1,1 128,4,2,4,-1,-1,-1,-1,-1,1 2>&1 | grep -v "^|---"
    timeout 200 python3 scripts/quant_decode_sweep.py --dtype $dt --formats fp8_e4m3 --all \
      --heads 32/8,12/12 --shapes 16x4096,64x8192,1x131072 --grid 128,4,2 \
      128,4,2,-1,-1,-1,-1,-1,0 2>&1 | grep -v "^|---"
  done
fi
if has prefetch; then
  step prefetch
  # the 14th grid field is prefetch_pages; the 6th max_registers (168: three programs an SM)
  PF=-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,1
  PF168=-1,-1,168,-1,-1,-1,-1,-1,-1,-1,1
  for dt in ${DTYPES:-fp16 bf16}; do
    timeout 240 python3 scripts/quant_decode_sweep.py --dtype $dt --formats fp8_e4m3,int8 \
      --all --heads 32/8,12/12 --shapes 64x8192,1x131072 --grid 128,4,2 128,4,2,-1,-1,168 \
      128,4,3,$PF 128,4,3,$PF168 2>&1 | grep -v "^|"
  done
  # int4 (its row: 3 stages, carried pages): the 1 x 131072 rows did not move with the carry;
  # its 49 splits are merged by the last program serially (max_merged_splits 64, chosen when
  # the kernel was 1.5x slower): against the combine kernel (4), against loading 4 splits
  # before folding them (merge_splits_at_once, the 15th field), and 2 / 4 programs an SM
  timeout 200 python3 scripts/quant_decode_sweep.py --formats int4 --all --heads 32/8,12/12 \
    --shapes 1x131072 --grid 128,4,3 128,4,3,-1,4 128,4,3,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,4 \
    128,4,3,2 128,4,3,4 2>&1 | grep -v "^|"
  timeout 240 python3 scripts/decode_config_sweep.py 64/4w/2s 64/4w/3s 64/4w/3s/pf 2>&1 | tail -12
fi
if has pf2; then
  step pf2
  for dt in ${DTYPES:-fp16 bf16}; do
    timeout 200 python3 scripts/quant_decode_sweep.py --dtype $dt --formats fp8_e4m3,int8 \
      --all --heads 32/8,12/12 --shapes 16x4096,64x8192,1x131072 --grid 128,4,2 \
      128,4,2,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,1 128,4,2 2>&1 | grep -v "^|"
  done
fi
if has ring; then
  step ring
  for dt in ${DTYPES:-fp16 bf16}; do
    timeout 270 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int4 --all \
      --heads 32/8,12/12 --shapes ${RING_SHAPES:-16x4096,64x8192,1x131072} --grid 128,4,3 \
      128,4,4 128,4,2,-1,-1,128 128,4,2,4,-1,128 256,8,3 2>&1 | grep -v "^|---"
  done
fi
if has headpair; then
  step headpair
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_decode_quant.py -k int4 2>&1 \
    | tail -2
  HP=2,-1,232,-1,-1,-1,-1,-1,-1,-1,-1,-1,1  # programs_per_sm .. head_pairs
  for layout in nhd hnd; do
    for dt in ${DTYPES:-fp16 bf16}; do
      echo "-- $layout $dt"
      timeout 150 python3 scripts/quant_decode_sweep.py --layout $layout --dtype $dt \
        --formats int4 --all --heads 32/8,12/12 --shapes 16x4096,64x8192,1x131072 \
        --grid 128,4,3 128,4,3,$HP 128,4,2,$HP 2>&1 | grep "^  "
    done
  done
fi
if has tail; then
  step tail
  timeout 200 python3 scripts/forced_splits.py --formats plain,fp8_e4m3,int4 --cases \
    32/8:1x32768,32/8:1x65536,32/8:1x131072,32/8:1x196608,32/8:1x262144 --splits 32,64 2>&1 \
    | tail -15
  M=gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__cycles_active.min,sm__cycles_active.avg
  M=$M,sm__cycles_active.max,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread
  # warps resident and issuing over the run: a program that idles its SM late shows as fewer
  # warps active on average at the same active cycles
  M=$M,sm__warps_active.avg.per_cycle_active,smsp__issue_active.avg.per_cycle_active
  M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_requests_srcunit_tex_op_read.sum
  M=$M,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
  M=$M,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
  for c in "int4 32 8 1 131072 nhd" "int4 32 8 1 262144 nhd" "int4 32 8 64 8192 nhd" \
      "int4 32 8 1 131072 hnd" "fp8_e4m3 32 8 1 131072 nhd" "plain 32 8 1 131072 nhd"; do
    echo "-- $c"
    (cd scripts && PYTHONPATH=../src:. timeout 120 ncu --clock-control none --kernel-name \
      regex:paged_decode --launch-skip 1 --launch-count 1 --metrics $M \
      python3 decode_ncu_case.py $c 2>&1 | grep -E "^\s+(gpu|sm|smsp|dram|lts|launch)__")
  done
fi
if has splits; then
  step splits
  timeout 300 python3 scripts/quant_decode_sweep.py --formats fp8_e4m3,int8,int4 \
    --shapes 1x131072 --grid 128,4,2 64,4,2 128,4,2,2 128,4,2,4 128,4,2,6 128,4,2,3,64 \
    64,4,2,4 64,4,2,3,64 2>&1 | tail -5
fi
if has hf; then
  step hf
  timeout 300 python3 scripts/quant_hf_check.py --outliers 30 --key-transform 2>&1 | grep "^|"
fi
if has gluon; then
  step gluon
  timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_gluon_prefill.py 2>&1 \
    | tail -15
  timeout 300 python3 scripts/prefill_sweep.py --rows prefill,chunked --pages 16,256 --cfg \
    128,64,8,3,r,p,t ${GLUON_CFGS:-128,128,8,2,r,g 128,64,8,2,r,g 128,64,8,3,r,g} 2>&1 \
    | tail -${GLUON_ROWS:-24}
fi
if has verify; then
  step verify
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_dispatch_modes.py \
    tests/test_prefix_decode.py tests/test_gluon_prefill.py -rf --tb=line 2>&1 | tail -12
fi
if has pftests; then
  step pftests
  timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_gluon_prefill.py \
    tests/test_paged_prefill.py tests/test_integrations_hf_paged.py tests/test_key_transform.py \
    tests/test_dispatch_modes.py tests/test_ops.py tests/test_bench_prefill.py 2>&1 | tail -6
fi
if has pfbench; then
  step pfbench
  timeout 300 python3 -m kvonce bench prefill --md "$OUT/bench_prefill.md" 2>&1 | grep "^|" \
    | tail -14
fi
if has prefill; then
  step prefill
  timeout 420 python3 scripts/prefill_sweep.py --rows prefill,chunked --pages 16,256 --cfg \
    128,64,8,3,r,p,t 128,64,8,3,r,p,t,h 128,128,8,3,r,p,t 128,128,8,3,r,p,t,h \
    128,128,8,2,r,p,t,h 2>&1 | tail -14
fi
if has decodebench; then
  step decodebench
  timeout 420 python3 -m kvonce bench decode --graph-peers \
    --shapes 128x512,64x1024,8x8192,2x32768,1x65536,1x131072 --md "$OUT/bench_decode.md" \
    --plot '' 2>&1 | grep "^|" | tail -40
fi
if has int32plain; then
  step int32plain
  for dt in ${DTYPES:-bf16 fp16}; do
    timeout 300 python3 scripts/config_ab.py --dtype $dt --set int64_kv_offsets=0 --cases \
      ${INT32_CASES:-plain:12/2:128x512,plain:12/2:64x1024,plain:12/2:8x8192,plain:12/2:1x65536,plain:32/8:64x1024,plain:12/12:64x1024,plain:32/8:64x8192,plain:12/12:64x8192} \
      2>&1 | grep "^|"
  done
fi
if has h200plain; then
  step h200plain
  for dt in ${DTYPES:-fp16}; do
    timeout 400 python3 scripts/config_ab.py --dtype $dt --set block_n=128 --set prefetch_pages=1 \
      --set block_n=128,prefetch_pages=1 --set num_stages=3,prefetch_pages=1 --cases \
      ${H200_CASES:-plain:12/12:128x512,plain:12/12:32x2048,plain:12/12:64x1024,plain:12/12:8x8192,plain:12/12:1x131072,plain:32/8:128x512,plain:32/8:64x1024,plain:32/8:64x8192,plain:32/8:8x8192,plain:32/8:1x131072,plain:12/2:128x512,plain:12/2:8x8192} \
      2>&1 | grep "^|"
    # the short GQA 12/2 rows (85-91% of dense SDPA at 64 x 1024 and 1 x 131072): split counts
    timeout 150 python3 scripts/config_ab.py --dtype $dt --splits 0,1,4 --set block_n=64 --set block_n=128 \
      --cases plain:12/2:64x1024,plain:12/2:128x512 2>&1 | grep -vi warn | tail -24
    timeout 150 python3 scripts/config_ab.py --dtype $dt --splits 0,132,264 --set block_n=64 --set block_n=128 \
      --cases plain:12/2:1x131072 2>&1 | grep -vi warn | tail -14
  done
fi
if has gqa12; then
  step gqa12
  # the two decode rows under 95% of dense SDPA after the wide-tile rule (2026-11-29, fifteenth
  # session, graphs: 12/2 64 x 1024 23.0 us against 19.8, 1 x 131072 41.0 against 38.2): the
  # 128-key tile's ring depth, warps, carried page ids, and the split count
  for dt in ${DTYPES:-fp16}; do
    timeout 200 python3 scripts/config_ab.py --dtype $dt --splits 0,1,4 --set num_stages=3 \
      --set num_warps=8 --set num_warps=8,num_stages=3 --set num_stages=3,prefetch_pages=1 \
      --cases plain:12/2:64x1024,plain:12/2:128x512 2>&1 | grep -vi warn | tail -24
    timeout 200 python3 scripts/config_ab.py --dtype $dt --splits 0,86,128,256 --set num_stages=3 \
      --set num_warps=8 --set num_warps=8,num_stages=3 --set num_stages=3,prefetch_pages=1 \
      --cases plain:12/2:1x131072 2>&1 | grep -vi warn | tail -14
  done
fi
if has occ; then
  step occ
  # the wide-tile rule assumes three 128-key programs an SM (the losses fit it); compiled, the
  # 128-key int32 loop holds 175 registers (two by registers alone): what the GPU runs, at a
  # launch where 128 keys won (32/8 40 x 2048) and one where they lost (56 x 2048)
  M=gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers
  M=$M,launch__occupancy_limit_shared_mem,launch__shared_mem_per_block_dynamic
  M=$M,sm__warps_active.avg.pct_of_peak_sustained_active,launch__waves_per_multiprocessor
  M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed
  for c in "plain 32 8 40 2048" "plain 32 8 56 2048"; do
    for set in block_n=64 block_n=128; do
      echo "-- $c $set"
      (cd scripts && DECODE_CASE_SET=$set PYTHONPATH=../src:. timeout 120 ncu --clock-control \
        none --kernel-name regex:paged_decode --launch-skip 1 --launch-count 1 --metrics $M \
        python3 decode_ncu_case.py $c 2>&1 | grep -E "^\s+(gpu|sm|dram|launch)__")
    done
  done
fi
if has h200quant; then
  step h200quant
  P=-1,-1,-1,-1,-1,-1,-1,-1,-1,-1
  for dt in ${DTYPES:-fp16}; do
    timeout 300 python3 scripts/quant_decode_sweep.py --dtype $dt --formats fp8_e4m3,int8 \
      --heads 32/8,12/12 --shapes 64x8192,1x131072 --all --grid 128,4,2 128,4,2,$P,1 \
      128,4,3,$P,1 128,4,2,4 128,4,2,4,-1,128 128,4,2,2 64,4,3,$P,1 2>&1 | grep -v Warn | tail -28
    timeout 240 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int4 \
      --heads 32/8,12/12 --shapes 64x8192,1x131072 --all --grid 128,4,3 128,4,2 128,4,4 \
      128,4,3,4 128,4,3,4,-1,128 128,4,3,2 2>&1 | grep -v Warn | tail -14
  done
fi
if has gluondec; then
  step gluondec
  timeout 400 python3 scripts/gluon_decode_check.py 2>&1 | tail -40
fi
if has gluonint8; then
  step gluonint8
  P=-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1
  for dt in ${DTYPES:-fp16}; do
    timeout 300 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int8,fp8_e4m3 \
      --heads 32/8,12/12 --shapes 64x8192,1x131072 --all --grid 128,4,2 128,4,2,$P,1 \
      2>&1 | grep -v Warn | tail -20
    # int8's scales a key at a time against the rows above (by TMA: INT8_SCALES_BY_TMA)
    timeout 200 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int8 --int8-ring 0 \
      --heads 32/8,12/12 --shapes 64x8192,1x131072 --all --grid 128,4,2,$P,1 \
      2>&1 | grep -v Warn | grep "^|"
  done
fi
if has gluonint4; then
  step gluonint4
  P=-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1
  for dt in ${DTYPES:-fp16}; do
    timeout 150 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int4 \
      --heads 32/8,12/12 --shapes 64x8192 --all --grid 128,4,3 128,4,3,$P,1 2>&1 \
      | grep -v Warn | tail -6
    timeout 150 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int4 \
      --heads 32/8,12/12 --shapes 1x131072 --all --grid 128,4,3,$P,1 --splits 0,16,32,64 \
      2>&1 | grep -v Warn | tail -6
  done
fi
if has ringvs; then
  step ringvs
  # int8 on the Gluon decode, its scales a key at a time (--int8-ring 0) against by TMA (1,
  # shipped; 2026-11-29 eighteenth session: its 16-key boxes' scale rows padded to 128 bytes)
  P=-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1
  for dt in ${DTYPES:-fp16}; do
    for ring in 0 1; do
      timeout 200 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int8 \
        --int8-ring $ring \
        --heads 32/8,12/12 --shapes 64x8192,1x131072 --all --grid 128,4,2,$P,1 \
        2>&1 | grep -v Warn | grep "^|"
    done
  done
fi
if has vbias; then
  step vbias
  # int8 V as 1152 + x on the Gluon decode (INT8_V_BIASED; compiled 2026-11-29 eighteenth
  # session: 573 instructions a tile a warp against 623, the masked tile 662 against 854): its
  # tests (the "int8 v-biased" route, ~34 cases), then the A/B against the shipped int8 route
  [[ ${STEP_TESTS:-1} == 1 ]] && \
    ROUTES=vbias ROUTE_S=${VBIAS_TEST_S:-200} bash scripts/gluon_routes_test.sh
  P=-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1
  for dt in ${DTYPES:-fp16}; do
    for vb in 0 1; do
      timeout 200 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int8 \
        --int8-v-biased $vb --heads 32/8,12/12 --shapes 64x8192,1x131072 --all \
        --grid 128,4,2,$P,1 2>&1 | grep -v Warn | grep "^|" | grep -v "^|--\|^| heads"
    done
    # fewer instructions a tile: does 1 x 131072 still want a wave of two CTAs an SM?
    timeout 200 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int8 \
      --int8-v-biased 1 --heads 32/8,12/12 --shapes 1x131072 --all --grid 128,4,2,$P,1 \
      --splits 0,11,16,22,32 2>&1 | grep -v Warn | grep -v "^|"
  done
fi
if has swap; then
  step swap
  # the swapped-operand consumers (GLUON_SWAP_FORMATS; compiled 2026-11-29 eighteenth session: fp8
  # 373 instructions a tile a warp against 453, int8 504 / 472 with V_BIASED against 623 / 573):
  # their tests (the "... swapped" routes, ~130 cases), then fp8 and int8 (V_BIASED 0 and 1)
  # against the shipped routes, GQA 32/8 and MHA 12/12 (rows 4 and 1), then int4 (516
  # instructions against the row-major form's 649) against the Triton int4 row
  [[ ${STEP_TESTS:-1} == 1 ]] && \
    ROUTES=swap ROUTE_S=${SWAP_TEST_S:-300} bash scripts/gluon_routes_test.sh
  P=-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1
  for dt in ${DTYPES:-fp16}; do
    for sw in "0 0" "1 0" "1 1"; do
      set -- $sw
      timeout 200 python3 scripts/quant_decode_sweep.py --dtype $dt --formats fp8_e4m3,int8 \
        --swap-ab $1 --int8-v-biased $2 --heads 32/8,12/12 --shapes 64x8192,1x131072 --all \
        --grid 128,4,2,$P,1 2>&1 | grep -v Warn | grep "^|" | grep -v "^|--\|^| heads"
    done
    for sw in 0 1; do
      timeout 150 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int4 \
        --swap-ab $sw --heads 32/8,12/12 --shapes 64x8192,1x131072 --all \
        --grid 128,4,3 128,4,3,$P,1 2>&1 | grep -v Warn | grep "^|" | grep -v "^|--\|^| heads"
    done
    # fewer instructions a tile: do int8 / int4 still want a wave of two CTAs an SM?
    timeout 200 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int8,int4 \
      --swap-ab 1 --heads 32/8,12/12 --shapes 1x131072 --all \
      --grid 128,4,2,$P,1 --splits 0,11,16,22,32 2>&1 | grep -v Warn | grep -v "^|"
  done
fi
if has gluonncu; then
  step gluonncu
  M=gpu__time_duration.sum,sm__cycles_active.avg,smsp__inst_executed.sum
  M=$M,smsp__issue_active.avg.per_cycle_active,sm__warps_active.avg.per_cycle_active
  M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed
  for r in long_scoreboard short_scoreboard barrier wait math_pipe_throttle mio_throttle \
      lg_throttle sleeping dispatch_stall no_instruction not_selected selected \
      branch_resolving membar; do
    M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
  done
  # "set" runs the plan's launch with config fields changed (decode_ncu_case.py)
  for c in "fp8_e4m3 32 8 64 8192" "int8 32 8 64 8192" "int4 32 8 64 8192" \
      "int4 32 8 64 8192 set=gluon=0" "fp8_e4m3 32 8 1 131072" "int4 32 8 1 131072" \
      "int4 32 8 1 131072 set=gluon=1"; do
    echo "-- $c"
    set -- $c
    SET=""; [[ ${6:-} == set=* ]] && SET=${6#set=}
    (cd scripts && DECODE_CASE_SET=$SET PYTHONPATH=../src:. timeout 150 ncu --clock-control \
      none --kernel-name regex:"gluon_decode|paged_decode" --launch-skip 1 --launch-count 1 \
      --metrics $M python3 decode_ncu_case.py $1 $2 $3 $4 $5 2>&1 \
      | grep -E "^\s+(gpu|sm|smsp|dram|launch)__|_kernel")
  done
fi
if has t256; then
  step t256
  [[ ${STEP_TESTS:-1} == 1 ]] && ROUTES=t256 ROUTE_S=${T256_TEST_S:-300} \
    bash scripts/gluon_routes_test.sh
  P=-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1
  for dt in ${DTYPES:-fp16}; do
    for t in "128 0" "256 2" "256 3"; do
      set -- $t
      # the Triton row (gluon 0) beside the Gluon one at this tile and ring depth, every shape
      echo "- tile $1, stages $2"
      timeout 200 python3 scripts/quant_decode_sweep.py --dtype $dt --formats int4 \
        --int4-tile $1 --int4-stages $2 --heads 32/8,12/12 \
        --shapes 16x8192,32x8192,64x8192,128x4096,8x16384,1x131072 --all \
        --grid 128,4,3,$P,0 128,4,3,$P,1 2>&1 | grep -v Warn | grep "^|" | grep -v "^|--"
    done
  done
fi
if has pages; then
  step pages
  P=-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1
  dt=${DTYPES:-fp16}
  for pg in 16 64 256; do
    echo "- page $pg"
    timeout 200 python3 scripts/quant_decode_sweep.py --dtype ${dt%% *} --page $pg \
      --formats fp8_e4m3,int8,int4 --heads 32/8,12/12 --shapes 64x8192 --all \
      --grid 128,4,3,$P,0 128,4,2,$P,0 128,4,2,$P,1 2>&1 | grep -v Warn | grep "^|" \
      | grep -v "^|--"
  done
fi
if has prefix; then
  step prefix
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_prefix_decode.py 2>&1 | tail -2
  # full logs in $OUT (the tables are tabulate's "simple" format, not "|" rows; 2026-11-29
  # fifteenth session: the ten cases with FlashInfer ran past 200 s)
  timeout ${PREFIX_BENCH_S:-300} python3 -m kvonce bench prefix --md "$OUT/bench_prefix.md" \
    > "$OUT/prefix_bench.log" 2>&1; tail -14 "$OUT/prefix_bench.log"
  timeout 200 python3 -m kvonce bench prefix --sweep --cases 0,3,6 > "$OUT/prefix_sweep.log" 2>&1
  grep -v "^{" "$OUT/prefix_sweep.log" | tail -50
fi
if has host; then
  step host
  timeout 280 python3 -m kvonce bench host --shapes 1x131072:32/8,64x8192:32/8 \
    > "$OUT/bench_host.log" 2>&1
  grep -E "^\||decode|int8|int4|fp8" "$OUT/bench_host.log" | head -40
fi
if has runlength; then
  step runlength
  (cd scripts && PYTHONPATH=../src:. timeout 150 python3 quant_decode_probe.py --layout hnd \
    --probes 0,1 --formats int4 --loaders 4 --shapes 64x8192 2>&1 | grep "^|")
  (cd scripts && PYTHONPATH=../src:. timeout 150 python3 quant_decode_probe.py --layout hnd \
    --probes 0,1 --formats fp8_e4m3 --shapes 64x4096,64x8192 2>&1 | grep "^|")
fi
if has power; then
  step power
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active \
    --format=csv -lms 200 > "$OUT/power_smi.csv" 2>&1 &
  smi=$!
  (cd scripts && PYTHONPATH=../src:. timeout 200 python3 decode_power_series.py \
    --shapes ${POWER_SHAPES:-64x8192,1x131072} 2>&1 | tee "$OUT/power.log")
  kill $smi
  awk -F, 'NR > 1 && $4 ~ /4$/ {n++; c += $2} END {if (n) printf "power capped: %d samples, '\
'mean SM clock %.0f MHz\n", n, c / n}' "$OUT/power_smi.csv"
fi
if has headgroups; then
  step headgroups
  timeout ${HG_TEST_S:-300} python3 -m pytest -q -p no:cacheprovider tests/test_gluon_decode.py \
    -k "${HG_TEST_K:-head_group}" > "$OUT/headgroups_tests.log" 2>&1
  tail -3 "$OUT/headgroups_tests.log"
  grep -E "^(FAILED|ERROR)" "$OUT/headgroups_tests.log" | head -20
  for fl in "fp8_e4m3 1" "int8,int4 4"; do
    set -- $fl
    (cd scripts && PYTHONPATH=../src:. timeout 200 python3 quant_decode_probe.py --layout hnd \
      --probes 0,1 --formats $1 --loaders $2 --kv-head-groups ${HG_GROUPS:-1,8} \
      --heads 32/8,12/12 --shapes ${HG_SHAPES:-64x8192,1x131072} 2>&1 | grep "^|")
  done
fi
if has cpasync; then
  step cpasync
  timeout ${CP_TEST_S:-200} python3 -m pytest -q -p no:cacheprovider tests/test_gluon_decode.py \
    -k "cp_async" > "$OUT/cpasync_tests.log" 2>&1
  tail -2 "$OUT/cpasync_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/cpasync_tests.log" | head
  (cd scripts && PYTHONPATH=../src:. timeout 250 python3 quant_decode_probe.py --layout hnd \
    --probes 0,1 --formats fp8_e4m3 --loaders 1,4 --cp-async 0,1 --heads 32/8,12/12 \
    --shapes ${CP_SHAPES:-64x8192,1x131072} 2>&1 | grep "^|")
fi
if has defersums; then
  step defersums
  timeout ${DS_TEST_S:-200} python3 -m pytest -q -p no:cacheprovider tests/test_gluon_decode.py \
    -k "int4 and swapped and biased" > "$OUT/defersums_tests.log" 2>&1
  tail -2 "$OUT/defersums_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/defersums_tests.log" | head
  for flag in "--int4-defer-sums 0" "--int4-defer-sums 1"; do
    (cd scripts && PYTHONPATH=../src:. timeout 150 python3 quant_decode_probe.py --layout hnd \
      --probes 0,1 --formats int4 --loaders 4 $flag --heads 32/8,12/12 \
      --shapes ${DS_SHAPES:-64x8192,24x8192} 2>&1 | grep "^|" | sed "s/^/$flag /")
  done
fi
if has fixedcost; then
  step fixedcost
  timeout 200 python3 scripts/decode_fixed_cost.py 2>&1 | grep "^|"
  for splits in ${FC_SPLITS:-16 32}; do
    echo "- fp8 / int8 at $splits splits"
    timeout 120 python3 scripts/decode_fixed_cost.py --formats fp8_e4m3,int8 --splits $splits \
      --lengths 131072,262144 2>&1 | grep "^|"
  done
  echo "- fp8 / int8 on their Triton rows (config gluon=0)"
  timeout 150 python3 scripts/decode_fixed_cost.py --formats fp8_e4m3,int8 --set gluon=0 \
    --lengths 131072,262144 2>&1 | grep "^|"
fi
if has int8splits; then
  step int8splits
  (cd scripts && PYTHONPATH=../src:. timeout ${I8S_S:-170} python3 quant_decode_sweep.py \
    --layout hnd --formats ${I8S_FORMATS:-int8} --heads ${I8S_HEADS:-32/8,12/12} \
    --shapes ${I8S_SHAPES:-1x131072,2x65536,4x32768,8x16384} --all \
    --splits ${I8S_SPLITS:-0,2,3,4,5,6,8,11,16,22,33} \
    --grid 128,4,2,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,1 2>&1 | grep -v Warn \
    | tee -a "$OUT/int8splits.log" | grep -E "^\||(int8|fp8_e4m3):")
fi
if has pdl; then
  step pdl
  timeout ${PDL_TEST_S:-240} python3 scripts/pdl_run.py 1 -m pytest -q -p no:cacheprovider \
    tests/test_decode.py tests/test_decode_quant.py tests/test_prefix_decode.py \
    tests/test_gluon_decode.py -k "${PDL_TEST_K:-split or graph or prefix or plan}" \
    > "$OUT/pdl_tests.log" 2>&1
  tail -2 "$OUT/pdl_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/pdl_tests.log" | head
  for heads in 32/8 12/12; do
    for f in 0 1; do
      echo "- $heads combine-pdl $f"
      timeout 80 python3 scripts/decode_fixed_cost.py --heads $heads \
        --formats plain,fp8_e4m3,int8 --lengths 131072,262144 --combine-pdl $f 2>&1 | grep "^|"
    done
  done
fi
if has onecta; then
  step onecta
  V="{'stages': 4, 'ctas_per_sm': 1, 'ring_merge': False}"
  timeout ${ONECTA_TEST_S:-200} python3 scripts/knob_run.py \
    "kvonce.kernels.gluon_decode:GLUON_ONE_CTA_VARIANT=$V" -m pytest -q -p no:cacheprovider \
    tests/test_gluon_decode.py tests/test_decode_quant.py \
    -k "${ONECTA_TEST_K:-split or graph or plan}" > "$OUT/onecta_tests.log" 2>&1
  tail -2 "$OUT/onecta_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/onecta_tests.log" | head
  for heads in 32/8 12/12; do
    for st in 0 3 4 0 3 4; do
      echo "- $heads one-cta-stages $st" >> "$OUT/onecta.log"
      timeout 80 python3 scripts/decode_fixed_cost.py --heads $heads --formats fp8_e4m3,int8 \
        --lengths 65536,131072,262144 --one-cta-stages $st 2>&1 | grep "^|" >> "$OUT/onecta.log"
    done
  done
  grep -E "^- |^\| (fp8_e4m3|int8) \| [0-9]" "$OUT/onecta.log" | cut -d"|" -f1-5
fi
batch_cut_tests() {   # tests/test_batch_cut.py (steps cutpdl, tritoncut)
  timeout ${BATCHCUT_TEST_S:-200} python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/test_batch_cut.py 2>&1 | tail -4 | cut -c1-300
}
if has cutpdl; then
  step cutpdl
  # the batch cut on (2026-11-30), its tail a programmatic dependent of its head
  # (batch_cut.OVERLAP): the plan against the two launches in turn and against no cut
  batch_cut_tests
  for fmt in fp8_e4m3 int8; do
    timeout 240 python3 scripts/config_ab.py --layout hnd --rounds 3 \
      --cases $fmt:32/8:68x8192,$fmt:32/8:70x8192,$fmt:32/8:72x8192,$fmt:12/12:23x8192,$fmt:12/12:45x8192,$fmt:32/8:66x8192 \
      --knob "kvonce.paged.batch_cut:OVERLAP=False" \
      --knob "kvonce.paged.splits:GLUON_BATCH_CUT=False" 2>&1 | grep "^\['" | cut -c1-200
  done
fi
if has tritoncut; then
  step tritoncut
  # the Triton decode's batch cut (splits.TRITON_BATCH_CUT, on): tests, then the plan
  # against the cut off (overlapped, and in turn), fp16 and bf16 q
  batch_cut_tests
  timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gluon_decode.py \
    -k "int4_default_plan" 2>&1 | tail -2 | cut -c1-300
  S=kvonce.paged.splits
  for dt in fp16 bf16; do
    timeout 240 python3 scripts/config_ab.py --layout hnd --rounds 3 --dtype $dt \
      --cases plain:32/8:68x8192,plain:32/8:72x8192,plain:32/8:80x8192,plain:12/12:45x8192,plain:12/12:50x8192,plain:32/8:66x8192 \
      --knob "$S:TRITON_BATCH_CUT=False" \
      --knob "kvonce.paged.batch_cut:OVERLAP=False" \
      2>&1 | grep "^\['" | cut -c1-300
  done
  # int4's Gluon cut (GLUON_INT4_BATCH_CUT, on)
  timeout 150 python3 scripts/config_ab.py --layout hnd --rounds 3 \
    --cases int4:32/8:48x2048,int4:32/8:68x8192,int4:12/12:45x8192 \
    --knob "$S:GLUON_INT4_BATCH_CUT=False" 2>&1 | grep "^\['" | cut -c1-300
fi
if has cutgate; then
  step cutgate
  # TRITON_CUT_MAX_TAIL (0.1 of a wave, set after MHA 50 x 8192 lost 0.9%) against no gate: tails
  # of 0.12-0.76 of a wave (GQA 32/8: 528 programs a wave, 8 a sequence; MHA: 12 a sequence)
  S=kvonce.paged.splits
  for dt in ${DTYPES:-fp16}; do
    timeout 280 python3 scripts/config_ab.py --layout hnd --rounds 3 --dtype $dt \
      --cases ${GATE_CASES:-plain:32/8:74x8192,plain:32/8:78x8192,plain:32/8:84x8192,plain:32/8:92x8192,plain:32/8:104x8192,plain:32/8:116x8192,plain:12/12:52x8192,plain:12/12:56x8192,plain:12/12:64x8192,plain:12/12:80x8192} \
      --knob "$S:TRITON_CUT_MAX_TAIL=1.0" 2>&1 | grep "^\['" | cut -c1-300
  done
fi
# ncu's metrics $1 of the second decode launch, fp16 Triton / fp8 / int8 Gluon, GQA 32/8 at
# 1 x 131072 and 64 x 8192, head-major pages (steps smspread, dramrate)
ncu_decode_cases() {
  for c in "plain 32 8 1 131072" "fp8_e4m3 32 8 1 131072" "int8 32 8 1 131072" \
      "plain 32 8 64 8192" "fp8_e4m3 32 8 64 8192" "int8 32 8 64 8192"; do
    echo "-- $c hnd"
    (cd scripts && PYTHONPATH=../src:. timeout 150 ncu --clock-control none --kernel-name \
      regex:"gluon_decode|paged_decode" --launch-skip 1 --launch-count 1 --metrics "$1" \
      python3 decode_ncu_case.py $c hnd 2>&1 | grep -E "^\s+[a-z0-9]+__|_kernel|ERROR")
  done
}
if has smspread; then
  step smspread
  M=gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max
  M=$M,sm__cycles_elapsed.avg,dram__throughput.avg.pct_of_peak_sustained_elapsed
  M=$M,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum
  ncu_decode_cases "$M"
fi
if has dramrate; then
  step dramrate
  M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
  M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_read.sum
  M=$M,lts__t_sector_hit_rate.pct,sm__cycles_active.avg
  ncu_decode_cases "$M"
fi
if has masked; then
  step masked
  # the masked band's loop unpipelined (paged_decode.MASKED_LOOP_STAGES=1, off) and 4 partials
  # at once, against the plan (compiled 2026-11-30: GQA 12/2 launches merged in the launch hold
  # 180 registers, 2 programs an SM at the 128-key tile; 168 unpipelined and 147 at 4 at once:
  # 3 an SM; unpipelined costs ~20 instructions a tile in the unmasked loop): 12/2 batches whose
  # merged launches run 320-384 programs, then rows already at 168 (the cost side); the tests
  # with it on first
  timeout 150 python3 scripts/knob_run.py "kvonce.kernels.paged_decode:MASKED_LOOP_STAGES=1" \
    -m pytest -q -p no:cacheprovider -x tests/test_decode.py -k "split or merge or mask" 2>&1 | tail -2
  for dt in ${DTYPES:-fp16 bf16}; do
    timeout 240 python3 scripts/config_ab.py --rounds 3 --dtype $dt \
      --cases ${MASKED_CASES:-plain:12/2:48x4096,plain:12/2:64x4096,plain:12/2:96x2048,plain:12/2:40x8192,plain:12/2:64x1024,plain:12/2:1x131072,plain:32/8:16x4096,plain:32/8:48x8192,plain:32/8:1x131072,plain:12/12:8x8192} \
      --knob "kvonce.kernels.paged_decode:MASKED_LOOP_STAGES=1" --set merge_splits_at_once=4 \
      2>&1 | grep "^|"
  done
fi
if has groupmerge; then
  step groupmerge
  # the plan's partials at once by GROUP (PagedDecodeConfig.wide_merge_at_once: 4 at GROUP 3
  # and 6, compiled 144 / 147 registers against 168 with spill / 180 at the row's 2): the
  # plan (A) against the row's 2 (B), the decode tests first
  timeout 120 python3 -m pytest -q -p no:cacheprovider -x tests/test_decode.py \
    -k "split or merge or wide" 2>&1 | tail -2
  for dt in ${DTYPES:-fp16}; do
    timeout 200 python3 scripts/config_ab.py --rounds 3 --dtype $dt \
      --cases ${GM_CASES:-plain:12/2:48x4096,plain:12/2:64x4096,plain:12/2:96x2048,plain:12/2:40x8192,plain:12/2:32x2048,plain:24/8:16x4096,plain:24/8:8x8192,plain:32/8:16x4096} \
      --set merge_splits_at_once=2 2>&1 | grep "^|"
  done
fi
if has gqa12long; then
  step gqa12long
  # GQA 12/2 1 x 131072 (93.9% of dense SDPA, 2026-11-30): the plan's 171 splits of 128 keys
  # (342 programs, 0.86 of a wave of 3 an SM) against whole waves (198: 396 programs; 132: 264 at
  # 2 an SM) and more splits, forced counts at the row's 64-key tile (A) and 128 keys (B)
  timeout 200 python3 scripts/config_ab.py --rounds 3 --cases plain:12/2:1x131072 \
    --splits 0,132,150,171,198,256 --set block_n=128 2>&1 | grep "^|"
fi
if has occupancy; then
  step occupancy
  # programs an SM the plain decode reaches (2026-11-30, compiled on the CPU at these launches:
  # the 64-key tile 80 registers / 38912 B, 5 an SM by both limits, where the Triton cut's row
  # measured 4; the 128-key tile 168 registers / 73728 B, 3 an SM, 176 when it merges 3 splits
  # one at a time): ncu's limits and the warps it keeps active
  M=gpu__time_duration.sum,launch__registers_per_thread,launch__shared_mem_per_block_dynamic
  M=$M,launch__shared_mem_per_block_static,launch__occupancy_limit_registers
  M=$M,launch__occupancy_limit_shared_mem,launch__occupancy_limit_warps,launch__grid_size
  M=$M,sm__warps_active.avg.pct_of_peak_sustained_active,sm__ctas_launched.sum
  for c in "plain 32 8 66 8192" "plain 32 8 1 131072" \
      "plain 32 8 16 4096" "plain 12 2 64 1024"; do
    echo "-- $c"
    (cd scripts && PYTHONPATH=../src:. timeout 120 ncu --clock-control none --kernel-name \
      regex:"paged_decode" --launch-skip 1 --launch-count 1 --metrics "$M" \
      python3 decode_ncu_case.py $c 2>&1 | grep -E "^\s+[a-z0-9]+__|_kernel|ERROR")
  done
fi
if has gluon16; then
  step gluon16
  timeout ${G16_S:-420} python3 scripts/gluon_decode16_check.py > "$OUT/gluon16.log" 2>&1
  grep -E "FAIL|Error|\| best" "$OUT/gluon16.log" | head -20; tail -12 "$OUT/gluon16.log"
fi
if has gluon16rate; then
  step gluon16rate
  timeout 300 python3 scripts/gluon_decode16_check.py --skip-correctness \
    --shapes "32/8:1x131072:16/32/49,32/8:1x262144:16/32/49" --variants 2cta-2st,1cta-4st \
    2>&1 | tail -3
fi
if has vpages; then
  step vpages
  timeout 300 python3 -m pytest -q -x tests/test_gluon_prefill.py -k "v_pages" 2>&1 | tail -2
  (cd scripts && PYTHONPATH=../src:. timeout 250 python3 prefill_knob_ab.py \
    --rows prefill,chunked --variants "16,16:V_PAGES,16:,16::V_PAGES,256" --rounds 3 \
    2>&1 | tail -12)
fi
if has lazy; then
  step lazy
  forms_ab lazy "16,16:LAZY_RESCALE,16:,16::LAZY_RESCALE,256,256:LAZY_RESCALE"
fi
if has rowtree; then
  step rowtree
  forms_ab chain "16,16:ROW_TREE=False,16:,16::ROW_TREE=False,256,256:ROW_TREE=False"
fi
if has sdpancu; then
  step sdpancu
  # GQA 12/2 64 x 1024 against dense SDPA (forty-fourth session: 22.6 against 19.5 us, 0.861;
  # the merge 1.8 us of it): first the forced split counts against the plan's own (a forced
  # count takes the rule's tile at that count since fd66ef5: 1 and 2 should read the wide tile),
  # then ncu of the plan (2 merged splits), its one pass and SDPA's kernel side by side
  timeout 120 python3 scripts/config_ab.py --cases plain:12/2:64x1024,plain:12/2:48x1024 \
    --splits 0,1,2 --set block_n=64 --rounds 3 2>&1 | tail -8
  M=gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread
  M=$M,launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_static
  M=$M,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
  M=$M,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct
  M=$M,sm__cycles_active.avg,sm__cycles_active.max,sm__warps_active.avg.per_cycle_active
  M=$M,smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active
  for r in long_scoreboard barrier wait short_scoreboard mio_throttle lg_throttle; do
    M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
  done
  for c in "plain 0" "plain 1" "sdpa 0"; do   # (format, forced split count; 0: the plan's)
    set -- $c
    echo "-- $1, splits $2"
    (cd scripts && DECODE_CASE_SPLITS=$2 PYTHONPATH=../src:. timeout 120 ncu \
      --clock-control none --kernel-name regex:"paged_decode|fprop|flash|fmha|attention|sdpa" \
      --launch-skip 2 --launch-count 1 --metrics $M \
      python3 decode_ncu_case.py $1 12 2 64 1024 2>&1 \
      | grep -E "^\s+(gpu|sm|smsp|dram|lts|launch)__|^\s+\S*(kernel|fprop|flash|sdpa)\S*")
  done
fi
if has summma; then
  step summma
  forms_ab summma "16,16:ROW_SUM_MMA=False,16:,16::ROW_SUM_MMA=False,256,256:ROW_SUM_MMA"
fi
if has loaders; then
  step loaders
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_gluon_prefill.py \
    -k "kv_paired" 2>&1 | tail -2
  v="16,16:KV_PAIRED=False,16:,16::KV_PAIRED=False"
  v="$v,16:PROBE_LOADER_PAD=40,16:PROBE_LOADER_PAD=40+PROBE_PAD_CHAINS=32"
  (cd scripts && PYTHONPATH=../src:. timeout 300 python3 prefill_knob_ab.py \
    --rows prefill,chunked --variants "$v" --rounds 3 2>&1 | tail -19)
fi
if has graphgap; then
  step graphgap
  (cd scripts && PYTHONPATH=../src:../.peers/fi:. timeout 220 python3 prefill_graph_gap.py \
    --rows prefill,chunked --pages ${PAGES:-16,256} --gaps ${GAPS:-100} --peers 2>&1 | tail -12)
fi
if has softmax; then
  step softmax
  (cd scripts && PYTHONPATH=../src:. timeout 150 python3 prefill_item_trace.py \
    --rows prefill --pages 16,256 2>&1 | tail -5)
  v="16,16:PROBE_SOFTMAX='no_exp',16:PROBE_SOFTMAX='no_rescale'"
  v="$v,256,256:PROBE_SOFTMAX='no_exp',256:PROBE_SOFTMAX='no_rescale'"
  (cd scripts && PYTHONPATH=../src:. timeout 300 python3 prefill_knob_ab.py --rows prefill \
    --variants "$v" --rounds 3 2>&1 | tail -9)
fi
if has probes35; then
  step probes35
  v=16:random,16:random:rt,256:random,256:random:b16,256:random:b16:rt
  v=$v,16:sequential,16:sequential:one
  (cd scripts && PYTHONPATH=../src:. timeout 400 python3 prefill_page_order.py --rows prefill \
    --variants "$v" --rounds 4 2>&1 | tail -10)
fi

if has trace; then
  step trace
  timeout 120 python3 -m pytest -q -x tests/test_gluon_prefill.py -k trace_probe 2>&1 | tail -2
  (cd scripts && PYTHONPATH=../src:. timeout 120 python3 prefill_item_trace.py \
    --rows prefill,chunked --pages 16,256 2>&1 | tail -7)
fi
if has onewave; then
  step onewave
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_decode.py \
    -k "one_wave or gpu_real_sizes" 2>&1 | tail -2
  deep=block_n=128,num_stages=3,prefetch_pages=1
  # row "splits 0": A the plan's launch; row "splits N": B the deep ring at N splits (N x base
  # programs about 128-132); compare A of row 0 with B of row N
  for c in "plain:12/2:64x4096,plain:32/8:16x4096,plain:12/12:11x8192,plain:12/2:48x2048 0,1" \
           "plain:12/2:56x2048,plain:12/2:104x1024 0,1" "plain:12/2:8x8192 0,8" \
           "plain:12/2:1x131072 0,64" "plain:32/8:1x131072 0,16" "plain:12/12:1x131072 0,11"; do
    set -- $c
    timeout 150 python3 scripts/config_ab.py --cases $1 --splits $2 --set $deep --rounds 3 \
      > "$OUT/onewave_${2//,/-}_${1//[:\/,]/_}.log" 2>&1
    grep "^|" "$OUT/onewave_${2//,/-}_${1//[:\/,]/_}.log" | cut -c1-200
  done
  # the rule against the old one where it takes 3 splits (not measured when it went on)
  timeout 150 python3 scripts/config_ab.py --cases plain:12/2:22x2048,plain:32/8:5x4096 \
    --splits 0 --knob "kvonce.paged.splits:ONE_WAVE_FILL=2.0" --rounds 3 2>&1 | grep "^|" \
    | cut -c1-200
  # cache hints at the rule's one-wave launches
  timeout 150 python3 scripts/config_ab.py --cases plain:12/2:64x1024,plain:32/8:16x2048 \
    --splits 0 --set kv_eviction=evict_first --set kv_cache_modifier=.cg --set num_warps=8 \
    --rounds 3 2>&1 | grep "^|" | cut -c1-240
fi
if ls "$OUT"/bench_*.md >/dev/null 2>&1; then
  step targets
  python3 scripts/issue26_targets.py "$OUT"/bench_*.md 2>&1 | grep -E "NO|met$"
fi
echo "== done ($(date +%T))"
