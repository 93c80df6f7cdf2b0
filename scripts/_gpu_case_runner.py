"""Runs a GPU check script's correctness cases each in a child process of the script itself and
reads back one result per case, so that a case that crashes or hangs the GPU is reported as that
case's failure and the other cases still run.

Why a child process: a missing mbarrier expect or a wrong phase in a Gluon kernel hangs the GPU
silently, and a crash must not lose the other cases' results. Used by
scripts/gluon_bwd_gpu_check.py and scripts/gluon_bwd_zigzag_check.py (and, through
gluon_bwd_gpu_check, by scripts/gluon_bwd_sweep.py); imported as a sibling module (the scripts run
as ``python3 scripts/NAME.py``, which puts scripts/ on sys.path).

The protocol between the two sides:

- child (the script run with ``--case N``): ``announce_running`` before each kernel call that may
  hang, ``start_hang_watchdog`` around it, ``print_result_line`` with the case's result (a dict
  with ``case`` and ``pass``) as the last JSON line on stdout. A watchdog that fires prints a HANG
  result line itself and ends the process.
- parent: ``run_case_subprocess`` per case (the last JSON line of the child's stdout, or a failing
  result whose ``error`` names the call that was running when the child timed out or died),
  ``results_in_order`` to run ``jobs`` cases at once and take their results in case order,
  ``run_cases`` to print them as they come too.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

# The Gluon call (compile included: ~seconds) inside one case; under ConSan the instrumented
# compile and run take ~1-2 min (2026-11-25, H100): the consan step sets GLUON_TIMEOUT_S=200.
GLUON_TIMEOUT_S = float(os.environ.get("GLUON_TIMEOUT_S", 45))
CASE_TIMEOUT_S = 240   # a whole case subprocess: Triton compiles and the float64 reference

RUNNING_PREFIX = "# running"   # a child's line naming the call it starts (not a JSON line)


def announce_running(label: str) -> None:
    """Child: name the call about to run, so that a timeout or crash can say whose it is."""
    print(f"{RUNNING_PREFIX} {label}", flush=True)


def print_result_line(result: dict) -> None:
    """Child: the case's result, the JSON line the parent reads."""
    print(json.dumps(result), flush=True)


def start_hang_watchdog(case: str, who: str) -> threading.Timer:
    """Child: a started timer that, unless cancelled within GLUON_TIMEOUT_S, prints a failing
    result for ``case`` naming ``who`` as a HANG and ends the process with status 3 (a hung kernel
    never returns, so the case cannot report it any other way). Cancel it when the call returns."""
    watchdog = threading.Timer(GLUON_TIMEOUT_S, lambda: (print(json.dumps(
        {"case": case, "pass": False, "error": f"HANG: {who} did not finish in "
                                               f"{GLUON_TIMEOUT_S} s"}), flush=True),
        os._exit(3)))
    watchdog.start()
    return watchdog


def _running_labels(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.startswith(RUNNING_PREFIX)]


def run_case_subprocess(cmd: list[str], case: str, env: dict, timeout_s: float,
                        timeout_error: str) -> dict:
    """Parent: run ``cmd`` (the script with ``--case N ...``) and return the last JSON line it
    printed (its result, or its watchdog's HANG report). Without one, a failing result for
    ``case``: ``timeout_error`` when it ran past ``timeout_s``, else its exit status and the end of
    its stderr; either naming the call it announced last."""
    cut = len(RUNNING_PREFIX) + 1
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        started = _running_labels(out)
        return {"case": case, "pass": False, "error": timeout_error
                + (f" during '{started[-1][cut:]}'" if started else "")}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    started = _running_labels(proc.stdout)
    if lines:
        return json.loads(lines[-1])   # a result, or the watchdog's HANG report
    return {"case": case, "pass": False,
            "error": (f"crashed during '{started[-1][cut:]}': " if started else "")
            + f"rc={proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"}


def results_in_order(run_one, indices, jobs: int):
    """Parent: ``(index, run_one(index))`` for each of ``indices``, in that order, with ``jobs``
    of them running at once (most of a case's time is Triton compiling on the host and the float64
    reference)."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_one, i) for i in indices]
        for i, future in zip(indices, futures):
            yield i, future.result()


def run_cases(run_one, indices, jobs: int, print_finished) -> list[dict]:
    """Parent: ``results_in_order``'s results, each printed as it comes: ``[index] PASS|FAIL
    case``, then the error, indented, for a case that timed out, hung or crashed, else
    ``print_finished(result)`` (the script's own lines for a case that finished)."""
    results = []
    for i, result in results_in_order(run_one, indices, jobs):
        results.append(result)
        print(f"[{i}] {'PASS' if result['pass'] else 'FAIL'} {result['case']}", flush=True)
        if "error" in result:
            print("    " + result["error"].replace("\n", "\n    "), flush=True)
        else:
            print_finished(result)
    return results
