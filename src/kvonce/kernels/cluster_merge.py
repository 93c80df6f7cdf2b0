"""Two CTAs of a cluster exchanging a split's partial through distributed shared memory (Hopper,
sm_90): inline-PTX helpers for plain Triton kernels launched as 2-CTA clusters (``_launch.launch``
with ``cluster=2``).

Triton 3.6 has no data path between the CTAs of a cluster (Gluon's cross-CTA ``convert_layout``
fails to lower, its cross-CTA reductions assert; scripts/gluon_cluster_probe.py), and gives a
kernel no address of its shared memory. So the exchange buffer is a static ``.shared`` variable
declared in inline PTX (``exchange_base``), beside Triton's dynamic shared memory. Both CTAs
have the same layouts, so a thread's elements sit at the same addresses in both buffers. Two
forms:

- ``sync``: each CTA stores its partial in its own buffer (``store_shared``), the cluster
  synchronizes (``cluster_sync``), each reads the other's through ``mapa`` (``load_peer``), and
  the cluster synchronizes again so that neither exits while the other reads. Each
  ``barrier.cluster`` arrive with release semantics compiles to a ``MEMBAR.ALL.GPU`` on sm_90a.
- ``push``: CTA 0's buffer holds an mbarrier, initialized at the kernel's start and made visible
  to CTA 1 by a relaxed cluster arrive (``start_push``) whose wait CTA 1 passes before pushing
  (``cluster_wait``). CTA 1 sends its partial into CTA 0's buffer with ``st.async``, each 4
  bytes announced on the mbarrier first (``push``, so replicated elements count too), arrives
  once a thread (``arrive_pushed``); CTA 0 waits for the mbarrier's phase (``wait_pushed``:
  every thread of CTA 1 arrived and every byte landed) and reads its own buffer
  (``load_shared``). Both then pass a relaxed cluster barrier (``cluster_sync_relaxed``), so that
  CTA 1 exits only once CTA 0 has its bytes (a CTA must not exit with its shared-memory traffic
  in flight) while CTA 0, the last to arrive, does not wait there. No fence: compiled for
  sm_90a, no ``MEMBAR``.

The declaration must run once a thread (a scalar argument): a second copy of it would fail in
ptxas (a duplicate name), never silently give two buffers.
"""
import triton
import triton.language as tl

# Bytes of the exchange buffer: a [16, 128] float32 partial and 16 LSEs, then (push) the
# mbarrier at MBARRIER. The inline PTX below spells these out (8448; the declaration's 9216 =
# MBARRIER + the mbarrier's 8, rounded up to 1024): asm strings are literals. The static buffer
# sits below Triton's dynamic shared memory, which starts where it ends; Triton's swizzled tiles
# assume a 1024-byte aligned base, so a size off 1024 costs bank conflicts in every loop
# (declared at 8464: GQA 12/2 64 x 1024 25.4 -> 27.5 us with the buffer alone, H200).
EXCHANGE_BYTES = tl.constexpr(8448)
MBARRIER = tl.constexpr(8448)


@triton.jit
def exchange_base(anchor):
    """The exchange buffer's shared-memory address (int32); ``anchor``: any int32 scalar."""
    return tl.inline_asm_elementwise(
        ".shared .align 1024 .b8 kvonce_cluster_exchange[9216];\n"
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
def load_shared(addr):
    """This CTA's float32 values at its shared addresses ``addr`` (int32)."""
    return tl.inline_asm_elementwise(
        "ld.shared.f32 $0, [$1];", "=r,r", [addr], dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def cluster_sync(anchor):
    """Every thread of both CTAs arrives and waits (``barrier.cluster``, release / acquire:
    shared-memory stores before it are visible to the peer's loads after it). ``anchor``: any
    int32 scalar (one barrier a thread)."""
    return tl.inline_asm_elementwise(
        "barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\nmov.u32 $0, $1;",
        "=r,r", [anchor * 0], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cluster_sync_relaxed(anchor):
    """Every thread of both CTAs arrives (relaxed: no memory ordering, so no fence) and waits.
    ``anchor``: any int32 scalar (one barrier a thread)."""
    return tl.inline_asm_elementwise(
        "barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\nmov.u32 $0, $1;",
        "=r,r", [anchor * 0], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def load_peer(addr):
    """The other CTA's float32 values at its shared addresses ``addr`` (int32)."""
    return tl.inline_asm_elementwise(
        "{\n.reg .u32 rank, peer;\nmov.u32 rank, %cluster_ctarank;\nxor.b32 rank, rank, 1;\n"
        "mapa.shared::cluster.u32 peer, $1, rank;\nld.shared::cluster.f32 $0, [peer];\n}",
        "=r,r", [addr], dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def start_push(base):
    """At the kernel's start, every thread: thread 0 initializes this CTA's mbarrier for one
    arrival a thread of the CTA, and the cluster's barrier gets a relaxed arrival (its wait,
    ``cluster_wait``, makes the initialized mbarrier visible to the other CTA)."""
    return tl.inline_asm_elementwise(
        "{\n.reg .pred first;\n.reg .u32 t, n, bar;\nmov.u32 t, %tid.x;\nmov.u32 n, %ntid.x;\n"
        "setp.eq.u32 first, t, 0;\nadd.u32 bar, $1, 8448;\n"
        "@first mbarrier.init.shared::cta.b64 [bar], n;\n"
        "fence.mbarrier_init.release.cluster;\nbarrier.cluster.arrive.relaxed.aligned;\n"
        "mov.u32 $0, 0;\n}",
        "=r,r", [base], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cluster_arrive_relaxed(anchor):
    """Every thread: a relaxed arrival on the cluster's barrier (``cluster_wait`` waits for
    it); 0. ``anchor``: any int32 scalar."""
    return tl.inline_asm_elementwise(
        "barrier.cluster.arrive.relaxed.aligned;\nmov.u32 $0, 0;", "=r,r", [anchor * 0],
        dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cluster_wait(base):
    """Every thread: wait for the cluster barrier's arrivals (``start_push``'s)."""
    return tl.inline_asm_elementwise(
        "barrier.cluster.wait.aligned;\nmov.u32 $0, $1;", "=r,r", [base], dtype=tl.int32,
        is_pure=False, pack=1)


@triton.jit
def push(addr, x, base, sender):
    """Where ``sender`` (int32, 1 or 0; ``x``'s shape): ``x`` (float32) into CTA 0's buffer at
    ``addr`` by ``st.async``, its 4 bytes announced on CTA 0's mbarrier first."""
    return tl.inline_asm_elementwise(
        "{\n.reg .pred p;\n.reg .u32 to, bar, rbar;\nsetp.ne.u32 p, $3, 0;\n"
        "add.u32 bar, $4, 8448;\nmapa.shared::cluster.u32 to, $1, 0;\n"
        "mapa.shared::cluster.u32 rbar, bar, 0;\n"
        "@p mbarrier.expect_tx.relaxed.cluster.shared::cluster.b64 [rbar], 4;\n"
        "@p st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [to], $2, [rbar];\n"
        "mov.u32 $0, 0;\n}",
        "=r,r,r,r,r", [addr, x, sender, base], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def push4(addr, x, base, sender):
    """``push`` four elements at a time (a thread's elements come in fours): one ``expect_tx``
    of 16 bytes on CTA 0's mbarrier for four ``st.async``."""
    return tl.inline_asm_elementwise(
        "{\n.reg .pred p;\n.reg .u32 bar, rbar, t0, t1, t2, t3;\nsetp.ne.u32 p, $12, 0;\n"
        "add.u32 bar, $16, 8448;\nmapa.shared::cluster.u32 rbar, bar, 0;\n"
        "mapa.shared::cluster.u32 t0, $4, 0;\nmapa.shared::cluster.u32 t1, $5, 0;\n"
        "mapa.shared::cluster.u32 t2, $6, 0;\nmapa.shared::cluster.u32 t3, $7, 0;\n"
        "@p mbarrier.expect_tx.relaxed.cluster.shared::cluster.b64 [rbar], 16;\n"
        "@p st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [t0], $8, [rbar];\n"
        "@p st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [t1], $9, [rbar];\n"
        "@p st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [t2], $10, [rbar];\n"
        "@p st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [t3], $11, [rbar];\n"
        "mov.u32 $0, 0;\nmov.u32 $1, 0;\nmov.u32 $2, 0;\nmov.u32 $3, 0;\n}",
        "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r", [addr, x, sender, base], dtype=tl.int32,
        is_pure=False, pack=4)


@triton.jit
def start_bulk(base):
    """``start_push`` for a single bulk copy: thread 0 initializes this CTA's mbarrier for one
    arrival and makes it (its own) with the copy's 8448 bytes expected, so the phase completes
    when they land; then the relaxed cluster arrive."""
    return tl.inline_asm_elementwise(
        "{\n.reg .pred first;\n.reg .u32 t, bar;\n.reg .b64 state;\nmov.u32 t, %tid.x;\n"
        "setp.eq.u32 first, t, 0;\nadd.u32 bar, $1, 8448;\n"
        "@first mbarrier.init.shared::cta.b64 [bar], 1;\n"
        "@first mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64 state, [bar], 8448;\n"
        "fence.mbarrier_init.release.cluster;\nbarrier.cluster.arrive.relaxed.aligned;\n"
        "mov.u32 $0, 0;\n}",
        "=r,r", [base], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def fence_proxy_async(anchor):
    """This thread's shared-memory stores made visible to the async proxy (a bulk copy that
    reads them); ``anchor``: any int32 scalar."""
    return tl.inline_asm_elementwise(
        "fence.proxy.async.shared::cta;\nmov.u32 $0, $1;", "=r,r", [anchor * 0],
        dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def send_bulk(base, sender):
    """Where ``sender`` (int32 scalar), thread 0: this CTA's first 8448 buffer bytes copied
    into CTA 0's buffer by one ``cp.async.bulk``, completing on CTA 0's mbarrier, and waited
    for until read (the CTA may then reuse or leave its buffer)."""
    return tl.inline_asm_elementwise(
        "{\n.reg .pred p;\n.reg .u32 t, to, bar, rbar;\nmov.u32 t, %tid.x;\n"
        "setp.ne.u32 p, $2, 0;\n@p setp.eq.u32 p, t, 0;\nadd.u32 bar, $1, 8448;\n"
        "mapa.shared::cluster.u32 to, $1, 0;\nmapa.shared::cluster.u32 rbar, bar, 0;\n"
        "@p cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes "
        "[to], [$1], 8448, [rbar];\n@p cp.async.bulk.commit_group;\n"
        "@p cp.async.bulk.wait_group.read 0;\nmov.u32 $0, 0;\n}",
        "=r,r,r", [base, sender], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def arrive_pushed(base, sender):
    """Where ``sender`` (int32 scalar): this thread's one arrival on CTA 0's mbarrier, after
    its ``push``es."""
    return tl.inline_asm_elementwise(
        "{\n.reg .pred p;\n.reg .u32 bar, rbar;\nsetp.ne.u32 p, $2, 0;\nadd.u32 bar, $1, 8448;\n"
        "mapa.shared::cluster.u32 rbar, bar, 0;\n"
        "@p mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [rbar];\n"
        "mov.u32 $0, 0;\n}",
        "=r,r,r", [base, sender], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def wait_pushed(base, receiver):
    """Where ``receiver`` (int32 scalar): wait until this CTA's mbarrier completes its first
    phase (every thread of CTA 1 arrived, every pushed byte landed)."""
    return tl.inline_asm_elementwise(
        "{\n.reg .pred p, done;\n.reg .u32 bar;\nsetp.ne.u32 p, $2, 0;\nadd.u32 bar, $1, 8448;\n"
        "@!p bra DONE${:uid};\nWAIT${:uid}:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [bar], 0;\n"
        "@!done bra WAIT${:uid};\nDONE${:uid}:\nmov.u32 $0, 0;\n}",
        "=r,r,r", [base, receiver], dtype=tl.int32, is_pure=False, pack=1)
