"""Device selection: CUDA when present (real sizes, fp16 + bf16), else the Triton interpreter on
CPU (small sizes, fp16 + fp32: the interpreter's bf16 tl.dot is wrong in triton 3.6)."""
import datetime
import faulthandler
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _tiers import (FAST, pytest_collection_modifyitems, pytest_report_header,  # noqa: F401
                    pytest_runtest_logreport)

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before any @triton.jit function is created (i.e. before kvonce is imported).
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"
DTYPES = (torch.float16, torch.bfloat16) if HAS_CUDA else (torch.float16, torch.float32)


# The HF tests need transformers and psutil, which the test extra installs. Where they are not
# installed at all and KVONCE_ALLOW_NO_HF=1 says that is fine, those tests skip; anything else (a
# broken install, a missing dependency of transformers, a release without continuous batching)
# fails them, so CI cannot go green by skipping them (a 5.17 install missing httpx once showed
# "2 skipped").
ALLOW_NO_HF = os.environ.get("KVONCE_ALLOW_NO_HF") == "1"


def require_hf(*modules: str, attrs: tuple[str, ...] = ()) -> None:
    """Import ``modules`` (and ``transformers.<attr>`` for each of ``attrs``) for an HF test, or
    skip / fail it as above."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            top = name.partition(".")[0]
            if ALLOW_NO_HF and importlib.util.find_spec(top) is None:
                pytest.skip(f"{top} is not installed (KVONCE_ALLOW_NO_HF=1)")
            pytest.fail(f"import {name} failed: {exc!r}. The test extra installs transformers "
                        "and psutil (pip install -e '.[test]'); KVONCE_ALLOW_NO_HF=1 skips these "
                        "tests where they are not installed at all", pytrace=False)
    if attrs:
        import transformers

        missing = [a for a in attrs if not hasattr(transformers, a)]
        if missing:
            pytest.fail(f"transformers {transformers.__version__} has no {', '.join(missing)} "
                        "(continuous batching); the test extra asks for a supported release",
                        pytrace=False)


@pytest.fixture
def hf_continuous_batching():
    """transformers' continuous batching (``generate_batch``) for the test, or skip / fail."""
    require_hf("transformers", "transformers.generation.continuous_batching.continuous_api",
               "transformers.generation.continuous_batching.cache", "psutil",
               attrs=("ContinuousBatchingConfig",))


def hypothesis_examples(cpu: int, gpu: int) -> int:
    """``max_examples`` for a hypothesis test: ``cpu`` under the interpreter; on a GPU ``gpu``,
    or 4 in the fast tier (``make gpu-test``: one draw of each kind, not a search)."""
    if not HAS_CUDA:
        return cpu
    return min(gpu, 4) if FAST else gpu


class _PoisonEmpty:
    """``with poison_empty: out = kvonce_call(...)``: while the block runs, ``torch.empty`` /
    ``torch.empty_like`` and ``kvonce.paged._alloc.allocator.empty`` (the paged package's one
    allocator of outputs and scratch, bound to ``torch.empty`` at import, so patching
    ``torch.empty`` alone misses it) return NaN-filled floating tensors, so any output element a
    kernel forgets to write fails the comparison. Wrap only the kvonce calls under test:
    references and torch internals outside the block allocate normally. Reusable and nestable."""

    def __init__(self):
        self._saved = []

    @staticmethod
    def _nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    def __enter__(self):
        import torch._dynamo.trace_rules as trace_rules

        from kvonce.paged._alloc import allocator

        # dynamo builds its table of torch functions once, on first use: built inside the block
        # it would record the stand-in, and every later torch.compile in the process fails on
        # torch.empty (test_ops.py did once). Make sure it exists first (cached after that).
        trace_rules.get_torch_obj_rule_map()
        self._saved.append((torch.empty, torch.empty_like, allocator.empty))
        empty, empty_like = torch.empty, torch.empty_like
        torch.empty = lambda *a, **k: self._nan(empty(*a, **k))
        torch.empty_like = lambda *a, **k: self._nan(empty_like(*a, **k))
        allocator.empty = torch.empty
        return self

    def __exit__(self, *exc):
        from kvonce.paged._alloc import allocator

        torch.empty, torch.empty_like, allocator.empty = self._saved.pop()


poison_empty = _PoisonEmpty()


# Long enough for the slowest rank under the interpreter on a loaded CPU (imports before the
# rendezvous, a reference between collectives), short enough that a hang fails the test.
PROCESS_GROUP_TIMEOUT = datetime.timedelta(minutes=5)


def _rank_main(rank, fn, world, backend, store, args):
    # A C++ abort (SIGABRT, SIGSEGV) prints every thread's Python stack, so a crash says where.
    faulthandler.enable(all_threads=True)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=PROCESS_GROUP_TIMEOUT)
    try:
        fn(rank, world, backend, *args)
    finally:
        dist.destroy_process_group()
    # Every assertion has run and passed. Leave without the interpreter's teardown: CI once saw a
    # gloo rank die there with "terminate called without an active exception" (a C++ thread still
    # joinable at static destruction), which is torch's teardown, not the code under test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_process_group(fn, world: int, backend: str, *args) -> None:
    """Run ``fn(rank, world, backend, *args)`` in ``world`` spawned processes joined in one
    process group. The rendezvous is a FileStore in a fresh private directory (mkdtemp: mode
    0700, a new name), removed after the join: no TCP port picked by one process and bound by
    another later (another process could take it between), and no store file another process
    or an earlier failed run could create, hold or leave behind. A group one of whose ranks is
    killed by a signal (a C++ abort in the backend, no Python exception) runs once more."""
    for attempt in (1, 2):
        rdzv_dir = tempfile.mkdtemp(prefix="kvonce_rdzv_")
        try:
            mp.spawn(_rank_main, args=(fn, world, backend, os.path.join(rdzv_dir, "store"), args),
                     nprocs=world, join=True)
            return
        except mp.ProcessExitedException as e:
            # A rank killed by a signal raised no Python exception: nothing of ours failed an
            # assertion. Run the whole group once more (every assertion again); a second death,
            # or any raised exception, fails the test.
            if attempt == 2 or not e.signal_name:
                raise
            warnings.warn(f"rank {e.error_index} died by {e.signal_name}; running the group again")
        finally:
            shutil.rmtree(rdzv_dir, ignore_errors=True)
