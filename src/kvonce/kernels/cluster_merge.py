"""Two CTAs of a cluster exchanging a split's partial through distributed shared memory (Hopper,
sm_90): inline-PTX helpers for plain Triton kernels launched as 2-CTA clusters (``_launch.launch``
with ``cluster=2``).

Triton 3.6 has no data path between the CTAs of a cluster (Gluon's cross-CTA ``convert_layout``
fails to lower, its cross-CTA reductions assert; scripts/gluon_cluster_probe.py), and gives a
kernel no address of its shared memory. So the exchange buffer is a static ``.shared`` variable
declared in inline PTX (``exchange_base``), beside Triton's dynamic shared memory: each CTA
stores its partial there (``store_shared``), the cluster synchronizes (``cluster_sync``), and
each reads the other's through ``mapa`` (``load_peer``). Both CTAs have the same layouts, so a
thread reads exactly the elements it stored, from the peer.

The declaration must run once a thread (a scalar argument): a second copy of it would fail in
ptxas (a duplicate name), never silently give two buffers.
"""
import triton
import triton.language as tl

# Bytes of the exchange buffer: a [16, 128] float32 partial and 16 LSEs, with room to spare.
EXCHANGE_BYTES = tl.constexpr(8448)


@triton.jit
def exchange_base(anchor):
    """The exchange buffer's shared-memory address (int32); ``anchor``: any int32 scalar."""
    return tl.inline_asm_elementwise(
        ".shared .align 16 .b8 kvonce_cluster_exchange[8448];\n"
        "mov.u32 $0, kvonce_cluster_exchange;\n"
        "add.u32 $0, $0, $1;",
        "=r,r", [anchor * 0], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def store_shared(addr, x):
    """``x`` (float32) at this CTA's shared addresses ``addr`` (int32, ``x``'s shape)."""
    return tl.inline_asm_elementwise(
        "st.shared.f32 [$1], $2;\nmov.u32 $0, 0;", "=r,r,r", [addr, x], dtype=tl.int32,
        is_pure=False, pack=1)


@triton.jit
def cluster_sync(anchor):
    """Every thread of both CTAs arrives and waits (``barrier.cluster``, release / acquire:
    shared-memory stores before it are visible to the peer's loads after it). ``anchor``: any
    int32 scalar (one barrier a thread)."""
    return tl.inline_asm_elementwise(
        "barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\nmov.u32 $0, $1;",
        "=r,r", [anchor * 0], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def load_peer(addr):
    """The other CTA's float32 values at its shared addresses ``addr`` (int32)."""
    return tl.inline_asm_elementwise(
        "{\n.reg .u32 rank, peer;\nmov.u32 rank, %cluster_ctarank;\nxor.b32 rank, rank, 1;\n"
        "mapa.shared::cluster.u32 peer, $1, rank;\nld.shared::cluster.f32 $0, [peer];\n}",
        "=r,r", [addr], dtype=tl.float32, is_pure=False, pack=1)
