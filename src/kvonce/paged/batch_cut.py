"""A decode launch cut in two along the batch (``splits.gluon_batch_cut``): the first ``whole``
sequences in one pass, the rest split, each part its own launch over batch slices of the same
tensors (views: no copy), the tail's split-K partials in the first ``batch - whole`` rows of the
plan's scratch. Any launch pair of ``_decode_launch``'s kind (the Triton or the Gluon decode)."""
from __future__ import annotations

# The tail launched as a programmatic dependent of the head (Hopper): its programs take the SMs
# the head's last wave leaves idle instead of starting after the head's end. H200, graphs, fp8
# GQA 32/8 x 8192 keys, us (2026-11-30): batch 68 266.4 -> 259.5, 72 282.9 -> 274.8.
OVERLAP = True


def overlaps(head, tail, device) -> bool:
    """Whether a cut's ``tail`` launches as a programmatic dependent of its ``head``: ``OVERLAP``
    on, both launches of one kernel family (the Gluon or the Triton decode: each takes the
    pair's ``trigger_next`` / ``follows``) and PDL on ``device`` (``pdl_supported``)."""
    from ..kernels.gluon_decode import PagedGluonDecodeLaunch
    from ..kernels.paged_combine import pdl_supported
    from ..kernels.paged_decode import PagedDecodeLaunch

    return (OVERLAP and type(head) is type(tail)
            and isinstance(head, (PagedGluonDecodeLaunch, PagedDecodeLaunch))
            and pdl_supported(device))


class BatchCutLaunch:
    """``head`` (sequences ``[0, whole)``, one split: it stores ``out`` / ``lse`` itself) then
    ``tail`` (sequences ``[whole, batch)``, its splits and combine), called as one launch:
    ``(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, o_part, lse_part, arrivals,
    k_scale, v_scale, outlier_values, outlier_channels)`` with the whole batch's tensors
    (``o_part [batch, q_len, nheads, S, d]``, ``lse_part``, ``arrivals``: the plan's scratch,
    rows ``[0, batch - whole)`` used). Per-key scales and the caches are indexed through the
    block table, so they pass whole.

    Host path: the head takes the whole tensors (its grid covers the first ``whole`` sequences
    and its strides are theirs), the tail views of the per-call ones from ``whole`` on, and the
    scratch's views are kept while the same scratch comes back (the plan's, every call): five
    views a call instead of thirteen (~12-24 -> ~7-9 us of CPU time on the build machine)."""

    def __init__(self, head, tail, whole: int):
        self.head, self.tail, self.whole = head, tail, whole
        self._scratch_of = None     # (o_part, lse_part, arrivals) the views below are of
        self._scratch = None

    def _tail_scratch(self, o_part, lse_part, arrivals, rest: int):
        src = self._scratch_of
        if src is None or src[0] is not o_part or src[1] is not lse_part or src[2] is not arrivals:
            self._scratch_of = (o_part, lse_part, arrivals)
            self._scratch = (o_part[:rest], lse_part[:rest],
                             None if arrivals is None else arrivals[:rest])
        return self._scratch

    def __call__(self, q, k_cache, v_cache, cache_seqlens, block_table, out, lse, o_part,
                 lse_part, arrivals, k_scale=None, v_scale=None, outlier_values=None,
                 outlier_channels=None):
        w = self.whole
        self.head(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, None, None, None,
                  k_scale, v_scale, outlier_values, outlier_channels)
        self.tail(q[w:], k_cache, v_cache, cache_seqlens[w:], block_table[w:], out[w:],
                  None if lse is None else lse[w:],
                  *self._tail_scratch(o_part, lse_part, arrivals, q.shape[0] - w),
                  k_scale, v_scale, outlier_values, outlier_channels)
