"""The paged package's one allocator of outputs and scratch buffers.

Every output and scratch buffer of decode, merge and the shared-prefix cascade comes from
``allocator.empty``, looked up at each call (modules import ``allocator``, never its ``empty``):
tests swap in a NaN-filling version (tests/conftest.py's ``poison_empty``) to prove that each
element is written.
"""
import types

import torch

allocator = types.SimpleNamespace(empty=torch.empty)
