"""When a public entry point calls its ``torch.ops.kvonce`` custom op, and helpers for that path.

Every public entry point has two ways to its kernels: the custom op (what torch.compile records,
what dispatch modes see, with a fake implementation for fake and meta tensors) and a direct call
of the same implementation (eager calls: the op dispatch alone costs 16-55 us of host time,
docs/notes.md). ``use_op`` decides; the other helpers serve the op path only.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

__all__ = ["use_op", "values_readable", "require_values", "like_inputs"]

_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
_is_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_function_mode_enabled = torch._C._is_torch_function_mode_enabled
_profiler_enabled = torch._C._autograd._profiler_enabled


def use_op(*tensors) -> bool:
    """True when a call must go through its custom op rather than the direct launch.

    Parameters
    ----------
    *tensors : the call's tensor arguments (``None`` entries are skipped).

    Returns
    -------
    True when any of these holds, each a case the direct path would get wrong:

    - ``torch.compiler.is_compiling()``: Dynamo must record one opaque node (checked first, so
      Dynamo folds it to a constant and traces nothing else here).
    - a ``TorchDispatchMode`` is active (``torch._C._len_torch_dispatch_stack()``, which counts
      infrastructure modes too): FakeTensorMode, FlopCounterMode, recording and profiling modes,
      ``make_fx`` must see the ``kvonce::`` op, and fake tensors must never reach Triton.
    - a ``TorchFunctionMode`` is active (``torch._C._is_torch_function_mode_enabled()``):
      ``make_fx`` and function-level tracers; also true inside ``with torch.device(...)``, whose
      calls then pay the op dispatch.
    - the autograd profiler is on (``torch.profiler.profile``, ``record_function`` users): it
      records ops through the dispatcher, so a direct launch would leave no ``kvonce::`` event
      in its trace.
    - a tensor is not a plain ``torch.Tensor`` / ``nn.Parameter`` (FakeTensor, DTensor, any
      subclass: its ``__torch_dispatch__`` must see the op) or lives on the ``meta`` device (the
      op's fake implementation serves the Meta key; Triton cannot launch on it).

    Cost (2-core CPU host, torch 2.13): ~0.15 us with no tensors, +0.05 us a tensor (0.40 us for
    five; the three mode queries and the type test are ~0.05 us each), against 16-55 us for the op.
    """
    if (_is_compiling() or _dispatch_stack_len() or _function_mode_enabled()
            or _profiler_enabled()):
        return True
    for t in tensors:
        if t is not None and ((type(t) is not _Tensor and type(t) is not _Parameter)
                              or t.is_meta):
            return True
    return False


def values_readable(*tensors) -> bool:
    """Every tensor (``None`` skipped) is a plain tensor off the meta device: its values can be
    read on the host. False for FakeTensors (no values), meta tensors and other subclasses."""
    for t in tensors:
        if t is not None and ((type(t) is not _Tensor and type(t) is not _Parameter)
                              or t.is_meta):
            return False
    return True


def require_values(what: str, **tensors) -> None:
    """Raise ``ValueError`` unless every tensor's values can be read on the host (``what`` names
    the feature that reads them, e.g. ``"check_block_table=True"``)."""
    for name, t in tensors.items():
        if not values_readable(t):
            raise ValueError(
                f"{what} reads {name} on the host, but {name} is a {type(t).__name__} on "
                f"{t.device} (fake, meta and subclass tensors have no values to read: "
                "FakeTensorMode, make_fx, AOT tracing): do it eagerly on real tensors")


def like_inputs(ref: torch.Tensor, *tensors):
    """``tensors`` (a plan's own scratch and metadata) made usable beside ``ref`` on the op path:
    when ``ref`` is a FakeTensor (FakeTensorMode, ``make_fx(tracing_mode="fake")``), each real
    tensor is replaced by its fake counterpart in ``ref``'s mode (static shapes, memoized by the
    mode), since a fake mode refuses real tensor arguments; otherwise returned as they are."""
    if not isinstance(ref, FakeTensor):
        return tensors
    mode = ref.fake_mode
    return tuple(t if t is None or isinstance(t, FakeTensor)
                 else mode.from_tensor(t, static_shapes=True) for t in tensors)
