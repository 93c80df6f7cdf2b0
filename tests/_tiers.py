"""Test tiers and shards.

The fast GPU tier keeps, of each test function, the fewest cases that still take every value of
every behaviour parameter once ("each-choice" coverage: every dtype, head dim, GQA ratio, page
size, split count, format, compile backend... once, not every combination), preferring cheap
cases. Parameters that only pick an instance of the same behaviour (``INSTANCE_PARAMS``: which
rank of which world, a seed, a batch) are not covered value by value. A test function without
parameters is one behaviour and always runs.

``KVONCE_TEST_TIER=fast`` selects it (``make gpu-test``); unset, every collected case runs
(``make gpu-test-full``, and the CPU suite in CI). The cost of a case comes from
``tests/gpu_durations.json`` (seconds per test id on the lent H100 / H200, merged by
``scripts/gpu_test_parts.py --update-durations``), 1 s where it has none, so the tier follows the
measured suite instead of a hand-kept list that goes stale.

``KVONCE_TEST_SHARD=i/n`` keeps shard ``i`` (0-based) of ``n`` of the selected cases, balanced by
the same costs (largest first onto the least loaded shard), so ``n`` pytest processes share one
GPU; every process computes the same assignment. Most of the GPU suite's time is Triton
compiling and float64 references on the host, which parallel processes overlap.

Hooks are re-exported by conftest.py.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

TIER = os.environ.get("KVONCE_TEST_TIER", "full")
if TIER not in ("fast", "full"):
    raise ValueError(f"KVONCE_TEST_TIER must be 'fast' or 'full', got {TIER!r}")
FAST = TIER == "fast"
DURATIONS_FILE = Path(__file__).with_name("gpu_durations.json")
_DEFAULT_COST = 1.0
# Parameters that choose an instance, not a behaviour (see the module docstring).
INSTANCE_PARAMS = frozenset({"world", "rank", "seed", "batch", "new_len"})
_SHARD = os.environ.get("KVONCE_TEST_SHARD")
# Modules whose cases hold up to ~33 GB of GPU memory each (float64 references of the world-8
# zigzag backward; 4 shards of the full suite ran out of the H100's 80 GB, 2026-11-23): all in
# shard 0, so no two of them run at once.
HEAVY_MODULES = frozenset({"test_dual_group_backward.py"})


def _load_durations() -> dict[str, float]:
    try:
        return json.loads(DURATIONS_FILE.read_text())
    except (OSError, ValueError):
        return {}


def _choices(item) -> frozenset:
    """The (parameter, value) pairs a case exercises; values by their id in the test's name."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return frozenset()
    return frozenset((name, repr(value)) for name, value in callspec.params.items()
                     if name not in INSTANCE_PARAMS)


def each_choice(items: list, cost) -> list:
    """Greedy weighted set cover: until every (parameter, value) pair of ``items`` is taken,
    keep the case with the most new pairs per second of cost. Keeps collection order."""
    uncovered = set().union(*(_choices(i) for i in items))
    if not uncovered:  # no parameters, or instance parameters only: the cheapest case
        parametrized = [i for i in range(len(items)) if getattr(items[i], "callspec", None)]
        if len(parametrized) < len(items) or not parametrized:
            return list(items)
        return [min(items, key=cost)]
    kept = set()
    while uncovered:
        best = max((i for i in range(len(items)) if i not in kept),
                   key=lambda i: (len(_choices(items[i]) & uncovered) / max(cost(items[i]), 1e-3),
                                  -i))
        kept.add(best)
        uncovered -= _choices(items[best])
    return [items[i] for i in sorted(kept)]


def select_fast_tier(items: list) -> tuple[list, list]:
    """(kept, deselected) for the fast tier."""
    durations = _load_durations()
    cost = lambda item: durations.get(item.nodeid, _DEFAULT_COST)  # noqa: E731
    by_function: dict = {}
    for item in items:
        by_function.setdefault((item.fspath, item.originalname), []).append(item)
    kept = set()
    for group in by_function.values():
        kept.update(id(i) for i in each_choice(group, cost))
    return ([i for i in items if id(i) in kept], [i for i in items if id(i) not in kept])


def shard_of(items: list, index: int, count: int) -> list:
    """Shard ``index`` of ``count``: ``HEAVY_MODULES`` in shard 0, the rest
    longest-processing-time-first onto the least loaded shard (ties to the lowest index);
    collection order kept within the shard."""
    durations = _load_durations()
    load = [0.0] * count
    owner = {}
    heavy = lambda i: Path(str(i.fspath)).name in HEAVY_MODULES  # noqa: E731
    for item in sorted(items, key=lambda i: (not heavy(i), -durations.get(i.nodeid,
                                                                          _DEFAULT_COST))):
        target = 0 if heavy(item) else min(range(count), key=lambda s: (load[s], s))
        load[target] += durations.get(item.nodeid, _DEFAULT_COST)
        owner[id(item)] = target
    return [i for i in items if owner[id(i)] == index]


def _parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise ValueError(f"KVONCE_TEST_SHARD must be 'i/n' with 0 <= i < n, got {text!r}")
    return index, count


def pytest_collection_modifyitems(config, items):
    kept = select_fast_tier(items)[0] if FAST else list(items)
    if _SHARD:
        kept = shard_of(kept, *_parse_shard(_SHARD))
    if len(kept) < len(items):
        chosen = {id(i) for i in kept}
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in chosen])
        items[:] = kept


def pytest_report_header(config):
    return f"kvonce test tier: {TIER}" + (f", shard {_SHARD}" if _SHARD else "")


# Per-test durations (setup + call + teardown), one JSON line per test as it finishes, so a run
# cut off by a time limit still leaves what it measured: ``KVONCE_DURATIONS_OUT=path``.
_DURATIONS_OUT = os.environ.get("KVONCE_DURATIONS_OUT")
_spent: dict[str, list] = {}


def pytest_runtest_logreport(report):
    if not _DURATIONS_OUT:
        return
    spent = _spent.setdefault(report.nodeid, [0.0, "passed"])
    spent[0] += report.duration
    if report.outcome != "passed" and spent[1] == "passed":
        spent[1] = report.outcome
    if report.when == "teardown":
        seconds, outcome = _spent.pop(report.nodeid)
        with open(_DURATIONS_OUT, "a") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "seconds": round(seconds, 3),
                                "outcome": outcome}) + "\n")
