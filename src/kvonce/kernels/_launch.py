"""Launch a compiled Triton kernel through Triton's C launcher, skipping ``JITFunction.run``.

``kernel[grid](*args)`` costs the host about 12 us plus 0.3 us per argument on every call
(lent H100 host, triton 3.6: an empty kernel with 2 arguments 12 us, with 37 arguments 23 us):
it binds the arguments by name, derives their specialization (dtypes, 16-byte alignment of
pointers, integers equal to 1 or divisible by 16) and hashes it into a cache key, every time.
kvonce's launch wrappers know which of their arguments can change that specialization, so they
build the key themselves from what a plan fixes (shapes, strides, configs) plus one alignment
bit, and ``launch`` looks the compiled kernel up in a dict and calls its C launcher directly.

The first launch of a key goes through ``kernel[grid]`` (which compiles or finds the kernel in
Triton's own cache) and keeps the ``CompiledKernel`` it returns. Under the Triton interpreter,
while a Triton launch hook is installed (profilers), and on a Triton release the direct path was
not written and tested for (``CACHED_LAUNCH_VERSIONS``: ``CompiledKernel.run``'s argument list
and the specialization rules are private and change between releases), every launch takes
Triton's path.

The caller's contract: ``key`` must determine every specialization Triton would derive from the
runtime arguments: include each integer argument's value (or at least ``== 1`` and ``% 16``),
each tensor's dtype, and whether every pointer is 16-byte aligned (``aligned``).
"""
from __future__ import annotations

import weakref

import torch
import triton

from .configs import interpreter_active

_compiled: dict = {}

# Triton releases (major, minor) whose ``CompiledKernel.run`` argument list and specialization
# rules the direct path follows; tested on the lent H100 with triton 3.6.0 (tests/test_launch.py).
CACHED_LAUNCH_VERSIONS = ((3, 6),)


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


# Module state rather than a constant so a test can force Triton's own launch on a 3.6 GPU.
cached_launch_enabled = _release(triton.__version__) in CACHED_LAUNCH_VERSIONS


def _knob_hooks_active() -> bool:
    """A launch hook is installed (a profiler): launches must go through Triton to call it.
    Triton 3.6 keeps an always-present, usually empty ``HookChain``; older ones a callable or None.
    """
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None:
        return False
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def fp32_matmul_precision() -> str:
    """``"ieee"`` or ``"tf32"``: how PyTorch runs float32 matmuls on CUDA right now.

    ``"ieee"`` under PyTorch's default (``torch.get_float32_matmul_precision() == "highest"``,
    ``allow_tf32`` False), ``"tf32"`` once the user allows it ("high"/"medium", ``allow_tf32 =
    True``, or ``torch.backends.cuda.matmul.fp32_precision = "tf32"``). torch >= 2.9 reads the
    new per-backend setting: the legacy getters raise once the new API has been used."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return "ieee" if matmul.fp32_precision in ("ieee", "none") else "tf32"
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def dot_precision(dtype: torch.dtype) -> str | None:
    """The precision of ``dtype``'s dots if it depends on PyTorch's setting (float32), else None:
    part of the signature under which one-shot calls reuse a plan."""
    return fp32_matmul_precision() if dtype == torch.float32 else None


def dot_input_precision(dtype: torch.dtype) -> str:
    """The ``DOT_PRECISION`` constexpr (``tl.dot``'s ``input_precision``) of a kernel whose dot
    operands have ``dtype``: float32 dots follow PyTorch's setting (``fp32_matmul_precision``;
    Triton's ``tl.dot`` defaults to TF32, which would silently lower a user's fp32 to 10-bit
    mantissas, and ignores the compiler's ``default_dot_input_precision`` option); 16-bit dots
    ignore it and always get ``"tf32"`` (one compiled variant). A constexpr is part of the
    compiled kernel's identity (Triton's cache key and ``launch``'s), so one launch config never
    mixes the two."""
    return dot_precision(dtype) or "tf32"


def next_pow2(x: int) -> int:
    """``triton.next_power_of_2`` without its JIT-function call wrapper (~2.5 us a call)."""
    return 1 << max(0, x - 1).bit_length()


def alignment_key(*tensors):
    """The part of a launch's key that Triton's pointer specialization depends on: ``True``
    when every tensor's data pointer is 16-byte aligned (the common case: one OR over the
    pointers), else the tuple of each one's 16-byte alignment. Triton specializes each pointer
    on its own alignment, so a kernel compiled for one set of misaligned pointers may assume
    another pointer aligned: one bit for "some pointer is off" let a second call, off at a
    different pointer, reuse it (a misaligned vector load)."""
    bits = 0
    for t in tensors:
        bits |= t.data_ptr()
    if bits & 15 == 0:
        return True
    return tuple(t.data_ptr() & 15 == 0 for t in tensors)


def constexpr_tail(kernel, num_args: int, constexprs: dict) -> tuple:
    """The values of ``kernel``'s parameters after its first ``num_args``, in signature order:
    ``constexprs``' or, where a launch leaves a defaulted one out, its default (the compiled
    kernel's ``run`` takes every parameter positionally)."""
    return tuple(constexprs[p.name] if p.name in constexprs else p.default
                 for p in kernel.params[num_args:])


def launch(kernel, key, grid: tuple[int, int, int], args: tuple, constexprs: dict,
           num_warps: int, num_stages: int, device_index: int, maxnreg: int = 0,
           launch_pdl: bool = False):
    """``kernel[grid](*args, **constexprs, num_warps=..., num_stages=...)``, cheaply; ``maxnreg``
    (when nonzero) caps the registers per thread (ptxas ``-maxrregcount``), and belongs in ``key``.
    ``launch_pdl``: a programmatic dependent launch (Hopper; the kernel may start before the one
    before it on the stream ends, so it must ``gdc_wait`` before reading that one's output);
    it belongs in ``key`` too.

    ``args`` are the runtime arguments in signature order; ``constexprs`` the compile-time ones,
    which must come after them in the signature (true of every kvonce kernel). ``key`` must
    determine the specialization (module docstring). Returns the ``CompiledKernel`` (None under
    the interpreter): its ``n_regs`` and ``n_spills`` feed the config sweeps.
    """
    compiled = _compiled.get((kernel, key, device_index))
    if compiled is None or not cached_launch_enabled or _knob_hooks_active():
        options = {"maxnreg": maxnreg} if maxnreg else {}
        if launch_pdl:
            options["launch_pdl"] = True
        compiled = kernel[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages,
                                **options)
        if cached_launch_enabled and not interpreter_active() and not _knob_hooks_active():
            _compiled[(kernel, key, device_index)] = (compiled,
                                                      constexpr_tail(kernel, len(args), constexprs))
        return compiled
    ck, tail = compiled
    stream = torch._C._cuda_getCurrentRawStream(device_index)
    raw = _tensordesc_launchers.get(ck, _UNSEEN)
    if raw is _UNSEEN:
        raw = _tensordesc_launchers[ck] = tensordesc_launcher(ck)
    if raw is None or not direct_tensordesc_launch:
        ck.run(grid[0], grid[1], grid[2], stream, ck.function, ck.packed_metadata, None, None,
               None, *args, *tail)
    else:
        launcher, coop, pdl, positions = raw
        launcher(grid[0], grid[1], grid[2], stream, ck.function, coop, pdl, None, None,
                 ck.packed_metadata, None, None, None, *expand_descriptors(args, positions),
                 *tail)
    return ck


# TMA descriptor arguments (Gluon launches). Triton 3.6's launcher wraps the C launcher in a
# Python loop (``wrap_handle_tensordesc``) that walks every argument and encodes each host-side
# ``TensorDescriptor`` into a ``CUtensorMap`` on every launch. The plans keep their descriptors
# (``tma_descriptors.DescriptorCache``), so each one's encoding is kept too, under the
# descriptor object (weakly: a descriptor built for one call is not kept alive, and its encoding
# is not reused by another object), and the C launcher called directly. A descriptor must not
# change after its first launch (kvonce's never do). H200 host, 2026-11-30 (twenty-eighth
# session, scripts/quant_host_profile.py --ab 4, GQA 32/8 1 x 131072, host us a call, Triton's
# wrapper -> this): fp8 96.0, 97.1, 89.9, 87.9 -> 83.0, 77.8, 74.8, 75.4; int8 111.5, 110.0,
# 113.6, 111.5 -> 93.6, 93.3, 93.8, 94.4 (the fp16 Triton decode, no descriptors, even); the
# eager int8 row of ``bench quant`` 106.5 -> 82.8 us, its host path no longer over its kernel.
# Module state so that a test or a host profile can take Triton's wrapper instead.
direct_tensordesc_launch = True
_UNSEEN = object()
_tensordesc_launchers: dict = {}
_encoded: dict = {}
_ENCODED_CAPACITY = 1024


def tensordesc_launcher(ck):
    """``(C launcher, cooperative, pdl, ((position, metadata), ...))`` of a compiled kernel whose
    launcher encodes TMA descriptors (Triton 3.6's ``wrap_handle_tensordesc``; positions among
    the runtime arguments), or None: no descriptor arguments, scratch memory to allocate, or a
    launcher of another shape (then ``ck.run`` takes it)."""
    run = ck.run
    inner = getattr(run, "launch", None)
    code = getattr(inner, "__code__", None)
    if (code is None or getattr(inner, "__name__", "") != "inner" or not inner.__closure__
            or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)):
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in inner.__closure__)))
    if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= cells.keys():
        return None
    metas = cells["tensordesc_meta"]
    if not metas or any(m is None for m in metas):   # decomposed in the frontend: Triton's path
        return None
    positions = tuple(zip(sorted(cells["tensordesc_indices"]), metas))
    return cells["launcher"], run.launch_cooperative_grid, run.launch_pdl, positions


def expand_descriptors(args: tuple, positions: tuple) -> list:
    """``args`` with each TMA descriptor at ``positions`` replaced by its kernel parameters
    (``CUtensorMap``, shape, strides: Triton's ``make_tensordesc_arg``), each encoding kept
    under the descriptor object (``_encoded``: a weak reference, the metadata, the parameters)."""
    out, start = [], 0
    for pos, meta in positions:
        desc = args[pos]
        entry = _encoded.get(id(desc))
        if entry is None or entry[0]() is not desc or entry[1] is not meta:
            # imported here, on a miss only: not an import statement every launch
            from triton.backends.nvidia.driver import make_tensordesc_arg

            if len(_encoded) >= _ENCODED_CAPACITY:
                _encoded.clear()
            entry = _encoded[id(desc)] = (weakref.ref(desc), meta,
                                          make_tensordesc_arg(desc, meta))
        out += args[start:pos]
        out += entry[2]
        start = pos + 1
    out += args[start:]
    return out
